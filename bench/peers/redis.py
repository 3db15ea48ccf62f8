"""Redis as a peer: Debian's redis-server, one primary and two replicas (replicaof), in memory,
with pipelined XADDs each batch followed by `WAIT 2 <timeout>`.

Redis replicates asynchronously: the primary applies and answers a write, then streams it to
the replicas; `WAIT n` blocks the client until n replicas have acknowledged (applied) every
write the client made before it. A batch's records count as acknowledged-replicated when its
WAIT returns >= 2. A client blocked in WAIT has its next commands processed only after WAIT
returns, so batches are spread over several connections to keep several outstanding.

The driver writes RESP over sockets: each batch is one prebuilt write of N XADD commands and a
WAIT; the replies are counted, not parsed one by one (XADD answers bulk-string ids, so the only
line starting with ':' is the WAIT's integer, and errors are the lines starting with '-').
"""

from __future__ import annotations

import sys
import time
from collections import deque

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

BINARY = "redis-server"
REPLICAS = 2
STREAM = b"bench"
BATCH_RECORDS = 100
OUTSTANDING = 8
CONNECTIONS = 4
WAIT_TIMEOUT_MS = 10_000
SETUP_TIMEOUT_S = 30.0
SEMANTICS = (
    "A batch of XADDs counts once the WAIT 2 after it returns 2: both replicas have received and "
    "applied every record in memory (3 copies; --save '' --appendonly no, so nothing goes to disk, "
    "like a page cache). Replication is asynchronous (the primary answers each XADD before "
    "replicating; WAIT only waits) and nothing fails over here (no Sentinel): if the primary "
    "dies, a replica must be promoted by hand, and records not yet WAITed for may be lost."
)


def unavailable() -> str | None:
    if find_binary(BINARY) is None:
        return f"{BINARY} not installed: run `make system-deps`"
    return None


def command(*args: bytes | str | int) -> bytes:
    """One RESP command (an array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RedisConn(Conn):
    """A connection with a blocking `call()` for setup."""

    def _line(self, deadline: float) -> bytes:
        while (nl := self.inbuf.find(b"\r\n")) < 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerError("redis-server did not answer in time")
            self.inbuf += self.recv_blocking(left)
        line, self.inbuf = self.inbuf[:nl], self.inbuf[nl + 2 :]
        return line

    def _reply(self, deadline: float):
        line = self._line(deadline)
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            raise PeerError(f"redis-server: {rest.decode(errors='replace')}")
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return None
            while len(self.inbuf) < size + 2:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise PeerError("redis-server did not answer in time")
                self.inbuf += self.recv_blocking(left)
            data, self.inbuf = self.inbuf[:size], self.inbuf[size + 2 :]
            return data
        if kind == b"*":
            return [self._reply(deadline) for _ in range(int(rest))]
        raise PeerError(f"redis-server: unexpected reply {line[:80]!r}")

    def call(self, *args, timeout_s: float = 5.0):
        self.send(command(*args))
        return self._reply(time.monotonic() + timeout_s)


def info(conn: RedisConn, section: str) -> dict[str, str]:
    text = conn.call("INFO", section).decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class Load(Driver):
    """Batch i goes to connection i % connections; each connection answers in order."""

    def __init__(self, port: int, record_size: int, batch_records: int, connections: int):
        self.conns = [RedisConn(port) for _ in range(connections)]
        self._pending = {conn: deque() for conn in self.conns}  # batch ids in send order
        self.batch_records = batch_records
        xadd = command(b"XADD", STREAM, b"*", b"v", b"x" * record_size)
        self._batch = xadd * batch_records + command(b"WAIT", REPLICAS, WAIT_TIMEOUT_MS)

    def send_batch(self, batch_id: int) -> None:
        conn = self.conns[batch_id % len(self.conns)]
        self._pending[conn].append(batch_id)
        conn.send(self._batch)

    def on_data(self, conn: Conn, data: bytes):
        buf = conn.inbuf + data if conn.inbuf else data
        pending = self._pending[conn]
        pos = 0
        while pending:
            colon = buf.find(b"\r\n:", pos)  # the WAIT's integer reply ends this batch's replies
            if colon < 0:
                break
            nl = buf.find(b"\r\n", colon + 3)
            if nl < 0:
                break
            replicas = int(buf[colon + 3 : nl])
            failed = buf.count(b"\r\n-", pos, colon) + (buf[pos : pos + 1] == b"-")
            batch_id = pending.popleft()
            error = None
            if failed:
                at = buf.find(b"-", pos)  # the first error line (ids never start with '-')
                while at > pos and buf[at - 2 : at] != b"\r\n":
                    at = buf.find(b"-", at + 1)
                first = buf[at : buf.find(b"\r\n", at)].decode(errors="replace")
                error = f"{failed} XADD errors, first: {first}"
            elif replicas < REPLICAS:
                error = f"WAIT {REPLICAS} returned {replicas} after {WAIT_TIMEOUT_MS} ms"
            ok = self.batch_records - failed if replicas >= REPLICAS else 0
            pos = nl + 2
            yield batch_id, ok, error
        conn.inbuf = buf[pos:]

    def close(self) -> None:
        for conn in self.conns:
            conn.close()


def measure(record_size: int = 100, seconds: float = 5.0, rate: float = 0.0, workdir=None, *,
            batch_records: int = BATCH_RECORDS, outstanding: int = OUTSTANDING,
            connections: int = CONNECTIONS) -> dict:  # fmt: skip
    """Start a primary and two replicas, XADD + WAIT 2 for `seconds`, tear down."""
    binary = find_binary(BINARY)
    if binary is None:
        raise PeerError(unavailable())
    connections = max(1, min(connections, outstanding))
    with Servers("peer-redis-", workdir) as servers:
        ports = free_ports(1 + REPLICAS)
        names = ["primary"] + [f"replica{i + 1}" for i in range(REPLICAS)]

        def start(name: str, port: int) -> None:
            data_dir = servers.dir / name
            data_dir.mkdir()
            argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "no",
                    "--save", "", "--appendonly", "no", "--dir", str(data_dir), "--daemonize", "no",
                    "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"]  # fmt: skip
            if name != "primary":
                argv += ["--replicaof", "127.0.0.1", str(ports[0])]
            servers.start(name, argv)

        def connect():
            servers.check_alive()
            conn = RedisConn(ports[0])
            try:
                if conn.call("PING") == b"PONG":
                    return conn
            except PeerError:
                pass
            conn.close()
            return None

        # The primary first: a replica that finds no primary retries only a second later.
        start(names[0], ports[0])
        primary = wait_until(connect, SETUP_TIMEOUT_S, "the Redis primary to answer PING")
        for name, port in zip(names[1:], ports[1:], strict=True):
            start(name, port)
        try:

            def replicas_online():
                servers.check_alive()
                replication = info(primary, "replication")
                online = [k for k, v in replication.items()
                          if k.startswith("slave") and "state=online" in v]  # fmt: skip
                return (
                    replication.get("connected_slaves") == str(REPLICAS) and len(online) == REPLICAS
                )

            wait_until(replicas_online, SETUP_TIMEOUT_S, f"{REPLICAS} online replicas")

            def replicated_write():  # the whole path works: a write that WAIT sees on both
                primary.call("SET", "bench-ready", "1")
                return primary.call("WAIT", REPLICAS, 1000, timeout_s=5.0) >= REPLICAS

            wait_until(
                replicated_write, SETUP_TIMEOUT_S, f"a write acknowledged by WAIT {REPLICAS}"
            )
            version = info(primary, "server").get("redis_version", "?")
            load = Load(ports[0], record_size, batch_records, connections)
            try:
                cpu_before = [proc_cpu_seconds(pid) or 0.0 for pid in servers.pids]
                result = run_load(load, batch_records=batch_records, outstanding=outstanding,
                                  seconds=seconds, rate=rate, record_size=record_size)  # fmt: skip
                cpu_after = [proc_cpu_seconds(pid) or 0.0 for pid in servers.pids]
            finally:
                load.close()
            stream_length = primary.call("XLEN", STREAM)
        finally:
            primary.close()
        server_cpu = sum(
            after - before for before, after in zip(cpu_before, cpu_after, strict=True)
        )
        return {
            "system": f"Redis {version}",
            "setup": (f"1 primary + {REPLICAS} replicas (replicaof), in memory: --save '' --appendonly no "
                      f"({servers.dir}); XADD to one stream, WAIT {REPLICAS} after each batch, "
                      f"{connections} connections"),
            "semantics": SEMANTICS,
            **result,
            "load_processes": 1,
            "connections": connections,
            "stream_length": stream_length,
            "server_cpu_cores": server_cpu / result["seconds"],
            "server_pids": list(servers.pids),
            "temp_dir": str(servers.dir),
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    return cli(measure, "python -m bench.peers.redis", __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
