"""connect(spec): which backend a spec selects, and the errors for specs that select none."""

from __future__ import annotations

import time

import pytest

from localcluster.coord import ConnectionLossError, CoordinationClient, connect
from localcluster.coord.file_backend import DEFAULT_SESSION_TIMEOUT_MS, FileClient
from localcluster.coord.kazoo_backend import KazooCoordinationClient, translate
from localcluster.coord.zookeeper_server import free_port


def test_a_directory_selects_the_file_backend(tmp_path):
    client = connect(tmp_path / "cluster" / "coord")
    try:
        assert isinstance(client, FileClient) and isinstance(client, CoordinationClient)
        assert client.session_timeout_ms == DEFAULT_SESSION_TIMEOUT_MS
        assert client.client_id == (client.session_id, b"") and client.session_id > 0
        assert client.get_children("/") == []
    finally:
        client.stop()
    with connect(str(tmp_path / "cluster" / "coord"), session_timeout_ms=900) as again:
        assert again.session_timeout_ms == 900


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ("", "store directory or zookeeper://"),
        (None, "store directory or zookeeper://"),
        ("http://127.0.0.1:2181", "unknown scheme"),
        ("zookeeper://", "names no ZooKeeper host"),
    ],
)
def test_specs_that_select_no_backend(spec, complaint):
    with pytest.raises(ValueError, match=complaint):
        connect(spec)


def test_a_file_is_not_a_store(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        connect(str(not_a_directory))


def test_zookeeper_spec_selects_kazoo_and_reports_an_unreachable_server():
    started = time.monotonic()
    with pytest.raises(ConnectionLossError, match="could not connect to ZooKeeper"):
        connect(f"zookeeper://127.0.0.1:{free_port()}", connect_timeout_s=1.0)
    assert time.monotonic() - started < 10
    client = KazooCoordinationClient("127.0.0.1:1,127.0.0.1:2", session_timeout_ms=4000)
    assert client.session_timeout_ms == 4000 and client.kazoo.hosts == [
        ("127.0.0.1", 1),
        ("127.0.0.1", 2),
    ]


def test_kazoo_errors_translate_to_ours():
    from kazoo import exceptions

    from localcluster.coord import BadVersionError, NoNodeError, SessionExpiredError

    assert isinstance(translate(exceptions.NoNodeError(), "/x"), NoNodeError)
    assert "/x" in str(translate(exceptions.NoNodeError(), "/x"))
    assert isinstance(translate(exceptions.BadVersionError()), BadVersionError)
    assert isinstance(translate(exceptions.ConnectionClosedError()), SessionExpiredError)
    unrelated = KeyError("k")
    assert translate(unrelated) is unrelated
