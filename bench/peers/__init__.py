"""Peer systems bench.suite measures beside localcluster's acks=all RF 3 commit path.

Each module (`nats`, `redis`) has `unavailable()` (None, or why the server cannot run) and
`measure(record_size, seconds, rate, workdir)`, which starts the peer's own 3-copy cluster in a
temporary directory, runs the load from this process, tears everything down (also on errors
and Ctrl-C) and returns a JSON-ready dict; `python -m bench.peers.<name>` prints it.
"""
