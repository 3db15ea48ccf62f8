"""bench.failover's probes: one producer process per client, each writing a steady acks=all stream.

A probe produces one record per partition every `interval_ms` until told to stop, and reports
per record (sequence, partition, sent, acknowledged or -1, offset or -1), times on
CLOCK_MONOTONIC (shared by every process of the host). A record's value starts with the probe's
tag and its sequence (`VALUE`), so the read-back tells the probes apart and finds a record
stored twice. The clients and their settings (`PROBES`):

- `own`: our AsyncProducer, idempotent (its default), retry/reconnect backoff from the command
  line (10 ms unless told);
- `own-no-idempotence`: the same with `enable.idempotence=false`: the figure idempotence is for;
- `confluent`: confluent-kafka (librdkafka) with acks=all, linger.ms 1, retry.backoff.ms 20 and
  enable.idempotence=true (issue 18's settings, idempotent as the Java client's default);
- `kafka-python`: kafka-python 3 with its defaults (idempotent, acks=all since 3.0).

Control: the parent puts "status" (the probe answers ("acked", {partition: last ack time}))
or "stop" (it flushes and answers ("done", {"rows", "errors"})) on the probe's queue. With
`debug_path`, librdkafka logs `debug=metadata,broker,topic,msg` there, one line per event
prefixed by the wall-clock time it was served (poll() serves librdkafka's log queue, and the
probe polls at least every millisecond), to line up with the brokers' logs; kafka-python logs
its `kafka` loggers at DEBUG there, with the wall-clock time of each line.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time

from bench.broker import RECORD_VALUE_BYTES, kill_workers, spawn_context
from localcluster.tools.load import prepare_load_process

VALUE = struct.Struct(">Bq")  # probe tag, sequence
PROBES = ("own", "own-no-idempotence", "confluent", "kafka-python")
TAGS = {name: i + 1 for i, name in enumerate(PROBES)}
CONFLUENT_SETTINGS = {"acks": "all", "linger.ms": 1, "retry.backoff.ms": 20,
                      "enable.idempotence": True}  # fmt: skip
LIBRDKAFKA_DEBUG = "metadata,broker,topic,msg"
POLL_S = 0.001  # librdkafka's callbacks (acks, logs) are served at most this late


def value_of(tag: int, sequence: int) -> bytes:
    return VALUE.pack(tag, sequence) + b"p" * (RECORD_VALUE_BYTES - VALUE.size)


class _Tally:
    """Rows, the latest acknowledgement per partition, errors by name; callbacks fill it."""

    def __init__(self, partitions: int):
        self.rows: list[list] = []
        self.last_ack = dict.fromkeys(range(partitions), 0.0)
        self.errors: dict[str, int] = {}

    def row(self, sequence: int, partition: int) -> list:
        row = [sequence, partition, time.monotonic(), -1.0, -1]
        self.rows.append(row)
        return row

    def acked(self, row: list, offset: int) -> None:
        row[3], row[4] = time.monotonic(), offset
        self.last_ack[row[1]] = row[3]

    def failed(self, name: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1

    def outcome(self) -> dict:
        return {"rows": self.rows, "errors": self.errors}


def _listen(control, results, tally: _Tally, stop: threading.Event) -> None:
    """Answer the parent's "status"; on anything else set `stop` and return."""
    while True:
        message = control.get()
        if message == "status":
            results.put(("acked", dict(tally.last_ack)))
        else:
            stop.set()
            return


def _paced(partitions: int, interval_ms: float, stop: threading.Event, send, wait) -> None:
    """Call send(sequence, partition) for every partition each tick until `stop`; between
    ticks wait(seconds) (which serves the client's callbacks)."""
    interval_s, start, sequence, tick = interval_ms / 1000, time.monotonic(), 0, 0
    while not stop.is_set():
        for partition in range(partitions):
            send(sequence, partition)
            sequence += 1
        tick += 1
        while (delay := start + tick * interval_s - time.monotonic()) > 0 and not stop.is_set():
            wait(delay)


# -- the clients ------------------------------------------------------------------------------


def _run_own(tag, bootstrap, topic, partitions, interval_ms, settings, control, results, debug):
    from localcluster.client import AsyncProducer

    if debug:
        _debug_log("localcluster.client", debug)

    tally = _Tally(partitions)

    def done(future, row) -> None:
        if future.cancelled() or future.exception() is not None:
            tally.failed("cancelled" if future.cancelled() else type(future.exception()).__name__)
        else:
            tally.acked(row, future.result()[1])

    async def run() -> None:
        loop = asyncio.get_running_loop()
        stop, stopped = threading.Event(), asyncio.Event()
        listener = loop.run_in_executor(None, _listen, control, results, tally, stop)
        listener.add_done_callback(lambda _: stopped.set())
        async with AsyncProducer(
            bootstrap_servers=bootstrap, acks=-1, linger_ms=0, **settings
        ) as producer:
            interval_s, start, sequence, tick = interval_ms / 1000, time.monotonic(), 0, 0
            while not stop.is_set():
                for partition in range(partitions):
                    row = tally.row(sequence, partition)
                    future = await producer.send(
                        topic, value_of(tag, sequence), partition=partition
                    )
                    future.add_done_callback(lambda f, r=row: done(f, r))
                    sequence += 1
                tick += 1
                delay = start + tick * interval_s - time.monotonic()
                if delay > 0:
                    try:
                        await asyncio.wait_for(stopped.wait(), delay)
                    except TimeoutError:
                        pass
            await producer.flush(60)
        await listener

    prepare_load_process()
    asyncio.run(run())
    return tally.outcome()


def _debug_log(logger: str, path: str) -> None:
    """`logger` and its children at DEBUG into `path`, each line with its wall-clock time."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(created).6f %(name)s %(message)s"))
    logging.getLogger(logger).addHandler(handler)
    logging.getLogger(logger).setLevel(logging.DEBUG)


def _librdkafka_logger(path: str) -> logging.Logger:
    logger = logging.getLogger("bench.failover.librdkafka")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    return logger


def _run_confluent(
    tag, bootstrap, topic, partitions, interval_ms, settings, control, results, debug
):
    from confluent_kafka import Producer

    tally = _Tally(partitions)
    config = {"bootstrap.servers": bootstrap, **CONFLUENT_SETTINGS}
    if debug:
        config |= {"debug": LIBRDKAFKA_DEBUG, "logger": _librdkafka_logger(debug)}
    producer = Producer(config)

    def delivered(error, message, row) -> None:
        if error is not None:
            tally.failed(error.name())
        else:
            tally.acked(row, message.offset())

    def send(sequence: int, partition: int) -> None:
        row = tally.row(sequence, partition)
        while True:
            try:
                producer.produce(topic, value_of(tag, sequence), partition=partition,
                                 on_delivery=lambda e, m, r=row: delivered(e, m, r))  # fmt: skip
                return
            except BufferError:
                producer.poll(POLL_S)

    stop = threading.Event()
    threading.Thread(target=_listen, args=(control, results, tally, stop), daemon=True).start()
    _paced(partitions, interval_ms, stop, send, lambda s: producer.poll(min(s, POLL_S)))
    left = producer.flush(60)
    if left:
        tally.failed(f"{left} undelivered after flush")
    return tally.outcome()


def _run_kafka_python(
    tag, bootstrap, topic, partitions, interval_ms, settings, control, results, debug
):
    from kafka import KafkaProducer

    if debug:  # kafka-python logs through the logging module, from its sender thread
        _debug_log("kafka", debug)
    tally = _Tally(partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap.split(","))  # its defaults

    def send(sequence: int, partition: int) -> None:
        row = tally.row(sequence, partition)
        future = producer.send(topic, value_of(tag, sequence), partition=partition)
        future.add_callback(lambda metadata, r=row: tally.acked(r, metadata.offset))
        future.add_errback(lambda e: tally.failed(type(e).__name__))

    stop = threading.Event()
    threading.Thread(target=_listen, args=(control, results, tally, stop), daemon=True).start()
    _paced(partitions, interval_ms, stop, send, lambda s: stop.wait(s))
    producer.flush(60)
    producer.close(5)
    return tally.outcome()


RUNNERS = {"own": _run_own, "own-no-idempotence": _run_own, "confluent": _run_confluent,
           "kafka-python": _run_kafka_python}  # fmt: skip


def probe_worker(name, bootstrap, topic, partitions, interval_ms, settings, control, results,
                 debug) -> None:  # fmt: skip
    if name == "own-no-idempotence":
        settings = {**settings, "enable_idempotence": False}
    outcome = RUNNERS[name](TAGS[name], bootstrap, topic, partitions, interval_ms, settings,
                            control, results, debug)  # fmt: skip
    results.put(("done", outcome))


class Probe:
    """One probe process; `last_acks()`, `finish()` (its outcome), `kill()`."""

    def __init__(self, name: str, bootstrap: str, topic: str, partitions: int, interval_ms: float,
                 settings: dict, debug: str | None = None):  # fmt: skip
        assert name in PROBES, name
        ctx = spawn_context()
        self.name = name
        self.control, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=probe_worker, daemon=True, name=f"probe-{name}",
                                   args=(name, bootstrap, topic, partitions, interval_ms, settings,
                                         self.control, self.results, debug))  # fmt: skip
        self.process.start()

    def last_acks(self) -> dict[int, float]:
        self.control.put("status")
        kind, value = self.results.get(timeout=60)
        assert kind == "acked", kind
        return value

    def finish(self) -> dict:
        self.control.put("stop")
        while True:
            kind, value = self.results.get(timeout=120)
            if kind == "done":
                self.process.join(10)
                return value

    def kill(self) -> None:
        kill_workers([self.process])
