"""Real broker processes for tests, always cleaned up.

`localcluster.broker.process.BrokerProcess` starts one broker in its own process group and
waits for its ready line; the `brokers` fixture kills every broker it started, by process
group, whatever the test did. Logs go to a fresh directory the test owns.

`pause(broker)` stops a broker (SIGSTOP; the test sends SIGCONT). A bare SIGSTOP can
land while the broker holds the file store's lock; then every client of the store, the test
included, blocks until the SIGCONT that the blocked test never sends (a CI run hung for an
hour this way). `pause` stops it as `localcluster kill -s SIGSTOP` does, holding the lock itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from localcluster import cluster
from localcluster.broker.process import BrokerProcess
from localcluster.broker.server import default_coordination, short_socket_dir

__all__ = ["BrokerProcess", "BrokerSet", "brokers", "pause", "remove_socket_dir"]


def pause(broker: BrokerProcess) -> None:
    """SIGSTOP the broker at a moment it holds no lock of its cluster's store."""
    connect = broker.settings.get("zookeeper.connect")
    coordination = (
        f"zookeeper://{connect}" if connect else str(default_coordination(broker.cluster_dir))
    )
    assert cluster.pause_client(coordination, broker.pid), f"broker {broker.broker_id} is gone"


class BrokerSet:
    """Starts brokers in one cluster dir and kills all of them at the end of a test."""

    def __init__(self, cluster_dir: Path):
        self.cluster_dir = cluster_dir
        self.started: list[BrokerProcess] = []

    def start(self, broker_id: int = 1, **settings: str) -> BrokerProcess:
        props = {k.replace("_", "."): str(v) for k, v in settings.items()}
        broker = BrokerProcess(broker_id, self.cluster_dir, props)
        self.started.append(broker)
        return broker.start()

    def restart(self, broker: BrokerProcess) -> BrokerProcess:
        assert not broker.is_alive()
        return broker.start()

    def cleanup(self) -> None:
        for broker in self.started:
            broker.kill()
        remove_socket_dir(self.cluster_dir)


def remove_socket_dir(cluster_dir: Path) -> None:
    """The brokers' sockets' dir under /tmp, used when the test's dir is too deep for AF_UNIX
    (under xdist it is): call it once the brokers are dead."""
    shutil.rmtree(short_socket_dir(cluster_dir), ignore_errors=True)


@pytest.fixture
def brokers(tmp_path):
    """`brokers.start(1)` starts broker 1 in a fresh cluster dir; all are killed afterwards."""
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    started = BrokerSet(cluster)
    try:
        yield started
    finally:
        started.cleanup()
