"""BrokerProcess(source_tree=...): the broker runs from another checkout's code (its PYTHONPATH),
which is how bench.failover --broker-tree compares two commits' brokers under one client."""

from __future__ import annotations

import textwrap

from localcluster.broker.process import BrokerProcess


def test_a_broker_started_from_another_source_tree_runs_that_trees_code(tmp_path):
    tree = tmp_path / "tree"
    package = tree / "localcluster" / "broker"
    package.mkdir(parents=True)
    (tree / "localcluster" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    # Stands in for the other commit's broker: says where it runs from, then "ready", then exits.
    (package / "__main__.py").write_text(
        textwrap.dedent("""
        import os, sys
        import localcluster
        print("code from", os.path.dirname(localcluster.__file__), flush=True)
        print(f"broker {sys.argv[2]} ready on 127.0.0.1:1 (pid {os.getpid()})", flush=True)
    """)
    )
    cluster_dir = tmp_path / "cluster"
    cluster_dir.mkdir()
    broker = BrokerProcess(7, cluster_dir, {}, source_tree=tree)
    try:
        broker.start(timeout_s=30)
        assert broker.port == 1
        broker.process.wait(timeout=30)
    finally:
        broker.kill()
    output = "".join(broker.output)
    assert f"code from {tree / 'localcluster'}" in output
