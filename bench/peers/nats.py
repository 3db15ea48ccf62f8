"""NATS JetStream as a peer: a 3-node cluster of Debian's nats-server, an R3 file stream, and
publishes counted by their JetStream acknowledgements (PubAck).

A PubAck is sent by the stream's leader once the message is committed by the stream's Raft
group: appended to the Raft log of a quorum, 2 of 3 (the leader's own copy counts). Those logs
and the stream's file store are written into the page cache; nats-server fsyncs them on a
background timer, not per message.

The driver is ~100 lines of the NATS text protocol over a socket (CONNECT, SUB, PUB with a
reply subject, MSG, PING/PONG): a batch of publishes is one write of prebuilt bytes, each with
the reply subject `<inbox>.<batch id>`, so that acknowledgements are counted per batch.
"""

from __future__ import annotations

import json
import re
import secrets
import sys
import time
import urllib.request
from collections import defaultdict

from bench.common import filesystem_of
from bench.peers.common import (
    Conn,
    Driver,
    PeerError,
    Servers,
    cli,
    find_binary,
    free_ports,
    proc_cpu_seconds,
    run_load,
    wait_until,
)

BINARY = "nats-server"
NODES = 3
STREAM = "bench"
SUBJECT = "bench"
BATCH_RECORDS = 100
OUTSTANDING = 4  # 400 publishes in flight; wider windows measured slower here, not faster
SETUP_TIMEOUT_S = 30.0
SEMANTICS = (
    "A record is acknowledged (PubAck) when the R3 stream's Raft group has committed it: 2 of 3 "
    "nodes (the leader included) have appended it to their Raft log, a file on disk written into "
    "the page cache (nats-server fsyncs on a background timer, not per message); the third node "
    "follows asynchronously. If the stream leader fails, the other two elect a new one by Raft "
    "and every acknowledged record survives."
)


def unavailable() -> str | None:
    if find_binary(BINARY) is None:
        return f"{BINARY} not installed: run `make system-deps`"
    return None


# -- the protocol -------------------------------------------------------------------------------

# nats-server 2.9 writes "MSG <subject> <sid> <reply> <size>" with an empty reply when there is
# none, i.e. two spaces before the size.
_ACK = re.compile(rb"MSG [^ \r\n]+\.(\d+) 1 +(\d+)\r\n")  # an acknowledgement to a load inbox
_ANY_MSG = re.compile(rb"MSG ([^ \r\n]+) (\d+) +(?:[^ \r\n]+ +)?(\d+)\r\n")


class NatsClient(Driver):
    """One connection: blocking `request()` for setup, then the pipelined load (Driver)."""

    def __init__(self, port: int, *, record_size: int = 100, batch_records: int = BATCH_RECORDS):
        self.conn = Conn(port)
        self.conns = [self.conn]
        line = self._read_line(5.0)
        if not line.startswith(b"INFO "):
            raise PeerError(f"nats-server on port {port} greeted with {line[:80]!r}")
        self.info = json.loads(line[5:])
        self.inbox = b"_INBOX." + secrets.token_hex(8).encode()
        options = {"verbose": False, "pedantic": False, "echo": False, "protocol": 1,
                   "name": "localcluster-bench", "lang": "python-raw"}  # fmt: skip
        self.conn.send(b"CONNECT " + json.dumps(options).encode() + b"\r\n"
                       b"SUB " + self.inbox + b".* 1\r\nPING\r\n")  # fmt: skip
        while (line := self._read_line(5.0)) != b"PONG":
            if line.startswith(b"-ERR"):
                raise PeerError(f"nats-server refused CONNECT: {line.decode(errors='replace')}")
        self._requests = 0
        self._payload = b"x" * record_size
        self.batch_records = batch_records
        self._ok: defaultdict[int, int] = defaultdict(int)
        self._failed: defaultdict[int, int] = defaultdict(int)
        self._first_error: dict[int, str] = {}

    def _read_line(self, timeout_s: float) -> bytes:
        deadline = time.monotonic() + timeout_s
        while (nl := self.conn.inbuf.find(b"\r\n")) < 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerError("nats-server did not answer in time")
            self.conn.inbuf += self.conn.recv_blocking(left)
        line, self.conn.inbuf = self.conn.inbuf[:nl], self.conn.inbuf[nl + 2 :]
        return line

    def request(self, subject: str, payload: bytes = b"", timeout_s: float = 5.0) -> dict:
        """A JetStream API request (blocking; setup only); the reply's JSON."""
        self._requests += 1
        reply = b"%s.%d" % (self.inbox, 10**12 + self._requests)  # never a load batch id
        self.conn.send(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), reply, len(payload), payload))
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._read_line(max(0.0, deadline - time.monotonic()))
            m = _ANY_MSG.fullmatch(line + b"\r\n")
            if m is None:
                if line == b"PING":
                    self.conn.send(b"PONG\r\n")
                elif line.startswith(b"-ERR"):
                    raise PeerError(f"nats-server: {line.decode(errors='replace')}")
                continue
            size = int(m[3])
            while len(self.conn.inbuf) < size + 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerError(f"no complete reply to {subject}")
                self.conn.inbuf += self.conn.recv_blocking(left)
            body, self.conn.inbuf = self.conn.inbuf[:size], self.conn.inbuf[size + 2 :]
            if m[1] == reply:
                return json.loads(body) if body else {}

    # -- Driver: the load --

    def send_batch(self, batch_id: int) -> None:
        one = b"PUB %s %s.%d %d\r\n%s\r\n" % (SUBJECT.encode(), self.inbox, batch_id,
                                             len(self._payload), self._payload)  # fmt: skip
        self.conn.send(one * self.batch_records)

    def on_data(self, conn: Conn, data: bytes):
        buf = conn.inbuf + data if conn.inbuf else data
        pos, end = 0, len(buf)
        ok, failed, first_error = self._ok, self._failed, self._first_error
        touched = set()
        match = _ACK.match
        while pos < end:
            m = match(buf, pos)
            if m is not None:
                start = m.end()
                stop = start + int(m[2])
                if stop + 2 > end:
                    break
                batch_id = int(m[1])
                if buf.find(b'"error"', start, stop) < 0:
                    ok[batch_id] += 1
                else:
                    failed[batch_id] += 1
                    first_error.setdefault(batch_id, buf[start:stop].decode(errors="replace"))
                touched.add(batch_id)
                pos = stop + 2
                continue
            nl = buf.find(b"\r\n", pos)
            if nl < 0:
                break
            line = buf[pos:nl]
            if line.startswith(b"MSG "):  # not ours (cannot happen: one subscription); skip it
                other = _ANY_MSG.match(buf, pos)
                stop = other.end() + int(other[3]) if other else nl
                if stop + 2 > end:
                    break
                pos = stop + 2
                continue
            if line == b"PING":
                conn.send(b"PONG\r\n")
            elif line.startswith(b"-ERR"):
                raise PeerError(f"nats-server: {line.decode(errors='replace')}")
            pos = nl + 2  # PONG, +OK, INFO updates
        conn.inbuf = buf[pos:]
        for batch_id in touched:
            if ok[batch_id] + failed[batch_id] >= self.batch_records:
                error = self._first_error.pop(batch_id, None)
                yield batch_id, ok.pop(batch_id), error
                failed.pop(batch_id, None)

    def close(self) -> None:
        self.conn.close()


# -- the cluster --------------------------------------------------------------------------------


def _config(name: str, port: int, http: int, cluster: int, routes: list[int], store: str) -> str:
    route_urls = "\n".join(f"    nats-route://127.0.0.1:{p}" for p in routes)
    return f"""server_name: {name}
listen: 127.0.0.1:{port}
http: 127.0.0.1:{http}
jetstream {{
  store_dir: "{store}"
}}
cluster {{
  name: bench
  listen: 127.0.0.1:{cluster}
  routes: [
{route_urls}
  ]
}}
"""


def _jsz(http_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/jsz", timeout=2) as response:
        return json.load(response)


def measure(record_size: int = 100, seconds: float = 5.0, rate: float = 0.0, workdir=None, *,
            batch_records: int = BATCH_RECORDS, outstanding: int = OUTSTANDING) -> dict:  # fmt: skip
    """Start a 3-node JetStream cluster, publish to an R3 file stream for `seconds`, tear down."""
    binary = find_binary(BINARY)
    if binary is None:
        raise PeerError(unavailable())
    with Servers("peer-nats-", workdir) as servers:
        ports = free_ports(3 * NODES)
        client, http, cluster = ports[:NODES], ports[NODES : 2 * NODES], ports[2 * NODES :]
        names = [f"n{i + 1}" for i in range(NODES)]
        for i, name in enumerate(names):
            store = servers.dir / name
            store.mkdir()
            conf = servers.dir / f"{name}.conf"
            conf.write_text(_config(name, client[i], http[i], cluster[i], cluster, str(store)))
            servers.start(name, [binary, "-c", str(conf)])

        def meta_leader():
            servers.check_alive()
            leaders = {_jsz(port).get("meta_cluster", {}).get("leader") for port in http}
            return len(leaders) == 1 and next(iter(leaders))  # all three agree on one leader

        wait_until(meta_leader, SETUP_TIMEOUT_S, "a JetStream meta leader")
        admin = NatsClient(client[0])
        try:
            config = {"name": STREAM, "subjects": [SUBJECT], "storage": "file",
                      "num_replicas": NODES, "retention": "limits", "discard": "old"}  # fmt: skip

            def create():
                servers.check_alive()
                reply = admin.request(
                    f"$JS.API.STREAM.CREATE.{STREAM}", json.dumps(config).encode()
                )
                if "error" in reply:
                    raise PeerError(f"stream create: {reply['error']}")
                return True

            wait_until(create, SETUP_TIMEOUT_S, f"the R{NODES} stream to be created", 0.1)

            def stream_leader():
                reply = admin.request(f"$JS.API.STREAM.INFO.{STREAM}")
                info = reply.get("cluster", {})
                replicas = info.get("replicas", [])
                current = len(replicas) == NODES - 1 and all(r.get("current") for r in replicas)
                return current and info.get("leader")

            leader = wait_until(
                stream_leader, SETUP_TIMEOUT_S, "a stream leader and current replicas"
            )
        finally:
            admin.close()
        version = admin.info.get("version", "?")
        # The load connects to the stream leader's server: the shortest path (a peer's best case).
        load = NatsClient(
            client[names.index(leader)], record_size=record_size, batch_records=batch_records
        )
        try:

            def published():  # the whole path works: one record acknowledged before timing
                return "error" not in load.request(SUBJECT, b"x" * record_size)

            wait_until(published, SETUP_TIMEOUT_S, "a first PubAck", 0.1)
            cpu_before = [proc_cpu_seconds(pid) or 0.0 for pid in servers.pids]
            result = run_load(load, batch_records=batch_records, outstanding=outstanding,
                              seconds=seconds, rate=rate, record_size=record_size)  # fmt: skip
            cpu_after = [proc_cpu_seconds(pid) or 0.0 for pid in servers.pids]
            stream_messages = None
            try:  # a cross-check: what the stream holds (every acked record + the first one)
                state = load.request(f"$JS.API.STREAM.INFO.{STREAM}").get("state", {})
                stream_messages = state.get("messages")
            except PeerError:
                pass
        finally:
            load.close()
        fs = filesystem_of(servers.dir)
        server_cpu = sum(
            after - before for before, after in zip(cpu_before, cpu_after, strict=True)
        )
        return {
            "system": f"NATS JetStream {version}",
            "setup": f"{NODES} nodes, R{NODES} file stream on {fs['type']} ({servers.dir})",
            "semantics": SEMANTICS,
            **result,
            "load_processes": 1,
            "stream_leader": leader,
            "stream_messages": stream_messages,
            "server_cpu_cores": server_cpu / result["seconds"],
            "server_pids": list(servers.pids),
            "temp_dir": str(servers.dir),
        }


def main(argv: list[str] | None = None) -> int:
    return cli(measure, "python -m bench.peers.nats", __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
