"""Where a broker's Unix socket goes: in the cluster dir, or a short dir when that is too deep."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from localcluster import cluster
from localcluster.broker.server import UNIX_PATH_MAX, short_socket_dir, socket_path


@pytest.fixture
def tmpdir_env(monkeypatch):
    def use(path: Path) -> None:
        monkeypatch.setenv("TMPDIR", str(path))
        monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again

    yield use
    tempfile.tempdir = None


def test_a_short_cluster_dir_keeps_its_sockets(tmp_path):
    assert socket_path(tmp_path, 3) == tmp_path.resolve() / "broker-3.sock"


def test_a_deep_cluster_dir_puts_them_under_tmpdir(tmp_path, tmpdir_env):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    short_tmp = Path(tempfile.mkdtemp(prefix="lc", dir="/tmp"))
    try:
        tmpdir_env(short_tmp)
        path = socket_path(deep, 1)
        assert path.parent == short_socket_dir(deep) and path.parent.parent == short_tmp
        assert len(str(path)) <= UNIX_PATH_MAX
    finally:
        shutil.rmtree(short_tmp)


def test_a_deep_tmpdir_as_well_puts_them_under_tmp(tmp_path, tmpdir_env):
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    tmpdir_env(deep)  # xdist's tmp dirs under a TMPDIR of the test's own were this deep
    path = socket_path(deep, 12345)
    try:
        assert path.parent.parent == Path("/tmp") and len(str(path)) <= UNIX_PATH_MAX
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the kernel takes it
        assert str(path.parent) in cluster.purge(deep, None)  # and down --purge removes it
        assert not path.parent.exists()
    finally:
        path.unlink(missing_ok=True)
        if path.parent.exists():
            path.parent.rmdir()
