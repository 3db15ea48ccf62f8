"""Producer state against a plain model over random operations (hypothesis), on a real Log.

Producers (a few ids, some starting near Int.MaxValue) send in-order batches, retries of recent
and old batches, gaps, old and new epochs, invalid sequences and plain (non-idempotent) batches,
one to three per request; followers append unchecked batches; the log is truncated (both ways),
rolled with a snapshot, trimmed by retention; producers expire; the broker restarts cleanly or
crashes, sometimes with its newest snapshot corrupted. The model keeps the log's batches, its
snapshot files (each producer's last batch) and every producer's last five batches, and rebuilds
after a restart or truncation as the design says: newest readable snapshot at or below the log
end, expired producers left out, then a replay of the log after it.

Checked after every step: the state, the map end offset and the snapshot files equal the
model's; every verdict equals the model's. At every restart: each producer whose last batch is
still in the log and has not expired has the same epoch and last batch as before it.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from localcluster.storage import BatchSpec, Log, LogConfig, Record, encode_batch
from localcluster.storage import record_batch as rb
from localcluster.storage.producer_snapshot import ProducerStateManager, list_snapshots
from localcluster.storage.producer_state import (
    INVALID_PRODUCER_EPOCH,
    INVALID_RECORD,
    OUT_OF_ORDER_SEQUENCE_NUMBER,
    DuplicateBatch,
    ProducerAppendInfo,
    RejectedAppend,
)

CONFIG = LogConfig(segment_bytes=600, segment_index_bytes=48, retention_bytes=600,
                   retention_ms=-1)  # fmt: skip
EXPIRATION_MS = 400
SEQ_SPACE = 2**31
PRODUCER_IDS = (1, 2, 3, 4)


@dataclass(frozen=True)
class MBatch:
    pid: int
    epoch: int
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    ts: int


@dataclass
class MProducer:
    epoch: int
    batches: list[MBatch] = field(default_factory=list)  # the last five of this epoch
    last_ts: int = -1

    def add(self, b: MBatch) -> MProducer:
        kept = self.batches if b.epoch == self.epoch else []
        return MProducer(b.epoch, (kept + [b])[-5:], b.ts)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


@dataclass
class Client:
    """What a producer thinks it has sent: its epoch, next sequence, and the batches sent."""

    epoch: int
    next_seq: int
    sent: list[tuple[int, int, int]] = field(default_factory=list)  # (epoch, seq, count)


def model_verdict(producers: dict[int, MProducer], batches: list[MBatch]):
    """("accepted", updates) | ("duplicate", batch) | ("rejected", code), said plainly."""
    if any(b.pid >= 0 and b.first_seq < 0 for b in batches):
        return "rejected", INVALID_RECORD
    updates: dict[int, MProducer] = {}
    for b in batches:
        if b.pid < 0:
            continue
        committed = producers.get(b.pid)
        if committed is not None and committed.epoch == b.epoch:
            for old in committed.batches:
                if (old.first_seq, old.last_seq) == (b.first_seq, b.last_seq):
                    return "duplicate", old
        current = updates.get(b.pid, committed) or MProducer(-1)
        if b.epoch < current.epoch:
            return "rejected", INVALID_PRODUCER_EPOCH
        if b.epoch != current.epoch:
            if b.first_seq != 0 and current.epoch != -1:
                return "rejected", OUT_OF_ORDER_SEQUENCE_NUMBER
        elif committed is not None and committed.epoch != -1:
            if b.first_seq != (current.last_seq + 1) % SEQ_SPACE:
                return "rejected", OUT_OF_ORDER_SEQUENCE_NUMBER
        updates[b.pid] = current.add(b)
    return "accepted", updates


def project(state) -> dict:
    """The implementation's state in the model's terms."""
    return {pid: (e.producer_epoch, [(b.first_seq, b.last_seq, b.first_offset, b.last_offset,
                                      b.timestamp) for b in e.batches], e.last_timestamp)
            for pid, e in state.producers.items()}  # fmt: skip


def project_model(producers: dict[int, MProducer]) -> dict:
    return {pid: (p.epoch, [(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.ts)
                            for b in p.batches], p.last_ts)
            for pid, p in producers.items()}  # fmt: skip


class ProducerStateMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.directory = tempfile.mkdtemp(prefix="producer-state-model-", dir="/dev/shm")
        self.now = 1000
        self.log = Log.open(self.directory, CONFIG)
        self.manager = ProducerStateManager.open(self.log, self.now, EXPIRATION_MS)
        self.batches: list[MBatch] = []  # what the log holds (pid -1 for plain batches)
        self.producers: dict[int, MProducer] = {}
        self.snapshots: dict[int, dict[int, MProducer]] = {}
        self.last_snapshot = 0
        self.map_end = 0
        self.lso = 0
        self.clients: dict[int, Client] = {}

    def teardown(self):
        if hasattr(self, "log"):
            try:
                self.log.close()
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)

    @property
    def leo(self) -> int:
        return self.log.log_end_offset

    # -- model of the file layer ----------------------------------------------------------------

    def model_take_snapshot(self, offset: int) -> None:
        self.map_end = offset
        if self.map_end > self.last_snapshot:
            self.snapshots[self.map_end] = {
                pid: replace(p, batches=p.batches[-1:]) for pid, p in self.producers.items()
            }
            self.last_snapshot = self.map_end

    def model_load(self, corrupted: int | None = None) -> None:
        lso, leo = self.log.log_start_offset, self.leo
        self.snapshots = {o: s for o, s in self.snapshots.items()
                          if lso <= o <= leo and o != corrupted}  # fmt: skip
        loaded = max(self.snapshots, default=None)
        if loaded is None:
            self.producers, start = {}, lso
        else:
            self.producers = {pid: p for pid, p in self.snapshots[loaded].items()
                              if self.now - p.last_ts < EXPIRATION_MS}  # fmt: skip
            start = loaded
        for b in self.batches:
            if b.last_offset >= start and b.pid >= 0:
                self.producers[b.pid] = self.producers.get(b.pid, MProducer(-1)).add(b)
        self.last_snapshot = start
        self.model_take_snapshot(leo)

    # -- producing ----------------------------------------------------------------------------

    @rule(data=st.data(), count=st.integers(1, 3))
    def produce(self, data, count):
        specs = []
        tentative = {pid: replace(c, sent=list(c.sent)) for pid, c in self.clients.items()}
        for _ in range(count):
            pid = data.draw(st.sampled_from((*PRODUCER_IDS, -1)), label="pid")
            n = data.draw(st.integers(1, 3), label="records")
            if pid < 0:
                specs.append((-1, -1, -1, n))
                continue
            start = data.draw(
                st.sampled_from([0, 0, 9, SEQ_SPACE - 3, SEQ_SPACE - 3]), label="first seq"
            )
            c = tentative.setdefault(pid, Client(epoch=0, next_seq=start))
            action = data.draw(st.sampled_from(["next"] * 5 + ["retry", "retry", "gap", "new epoch",
                                                "old epoch", "negative"]), label="action")  # fmt: skip
            epoch, seq = c.epoch, c.next_seq
            if action == "retry" and c.sent:
                epoch, seq, n = data.draw(st.sampled_from(c.sent[-8:]), label="retried")
            elif action == "gap":
                seq = (seq + data.draw(st.integers(1, 3), label="gap")) % SEQ_SPACE
            elif action == "new epoch":
                epoch, seq = epoch + 1, data.draw(st.sampled_from([0, 0, 0, 4]), label="seq")
            elif action == "old epoch":
                epoch = max(epoch - 1, 0)
            elif action == "negative":
                seq = -1
            event(f"produce: {action}")
            specs.append((pid, epoch, seq, n))
            if action != "negative":
                c.sent.append((epoch, seq, n))
            if action in ("next", "gap", "new epoch") and seq >= 0:
                c.epoch, c.next_seq = epoch, (seq + n) % SEQ_SPACE
        self.leader_append(specs, tentative)

    @rule(pid=st.sampled_from(PRODUCER_IDS), k=st.integers(2, 8))
    def produce_several(self, pid, k):
        # Uniform rule choice would keep logs short: this fills segments, so that rolls,
        # retention and replays across segments happen.
        for _ in range(k):
            c = self.clients.get(pid, Client(epoch=0, next_seq=0))
            tentative = {
                **self.clients,
                pid: replace(
                    c,
                    next_seq=(c.next_seq + 2) % SEQ_SPACE,
                    sent=[*c.sent, (c.epoch, c.next_seq, 2)],
                ),
            }
            self.leader_append([(pid, c.epoch, c.next_seq, 2)], tentative)

    def encode(self, pid, epoch, seq, n, base_offset=0, leader_epoch=-1) -> bytes:
        records = [Record(b"x" * (i + 1), timestamp=self.now) for i in range(n)]
        return encode_batch(records, BatchSpec(base_offset=base_offset, producer_id=pid,
                                               producer_epoch=epoch, base_sequence=seq,
                                               partition_leader_epoch=leader_epoch))  # fmt: skip

    def model_batches(self, specs, first_offset) -> list[MBatch]:
        out, offset = [], first_offset
        for pid, epoch, seq, n in specs:
            last = (seq + n - 1) % SEQ_SPACE if seq >= 0 else -1
            out.append(MBatch(pid, epoch, seq, last, offset, offset + n - 1, self.now))
            offset += n
        return out

    def leader_append(self, specs, tentative) -> None:
        data = b"".join(self.encode(*spec) for spec in specs)
        headers = [h for _, h in rb.iter_batches(data, check_crc=False)]
        verdict = self.manager.state.check_client_append(headers, self.leo)
        batches = self.model_batches(specs, self.leo)
        kind, detail = model_verdict(self.producers, batches)
        event(f"verdict: {kind}")
        if kind == "duplicate":
            assert verdict == DuplicateBatch(detail.pid, detail.first_offset, detail.last_offset,
                                             detail.ts)  # fmt: skip
        elif kind == "rejected":
            assert isinstance(verdict, RejectedAppend) and verdict.error_code == detail, verdict
        else:
            assert isinstance(verdict, ProducerAppendInfo), verdict
            self.log.append(data, leader_epoch=0)
            self.manager.state.apply(verdict)
            self.batches += batches
            self.producers.update(detail)
            self.map_end = self.leo
            self.clients = {pid: replace(c, sent=c.sent[-16:]) for pid, c in tentative.items()}

    @rule(pid=st.sampled_from(PRODUCER_IDS), epoch=st.integers(0, 3),
          seq=st.integers(0, 20), n=st.integers(1, 3), gap=st.sampled_from([0, 0, 2]))  # fmt: skip
    def follower_append(self, pid, epoch, seq, n, gap):
        base = self.leo + gap
        data = self.encode(pid, epoch, seq, n, base_offset=base, leader_epoch=0)
        self.log.append_as_follower(data)
        self.manager.state.replay([rb.read_header(data)])
        (b,) = self.model_batches([(pid, epoch, seq, n)], base)
        self.batches.append(b)
        self.producers[pid] = self.producers.get(pid, MProducer(-1)).add(b)
        self.map_end = self.leo

    # -- time, snapshots, truncation, retention -----------------------------------------------

    @rule(ms=st.sampled_from([1, 50, 200, 500]))
    def advance_time(self, ms):
        self.now += ms

    @rule()
    def remove_expired(self):
        removed = self.manager.state.remove_expired(self.now)
        expected = [
            pid for pid, p in self.producers.items() if self.now - p.last_ts >= EXPIRATION_MS
        ]
        assert sorted(removed) == sorted(expected)
        for pid in expected:
            del self.producers[pid]

    @rule()
    def roll_and_snapshot(self):
        self.log.roll()
        self.manager.take_snapshot(self.leo)
        self.model_take_snapshot(self.leo)

    @rule(back=st.integers(0, 12))
    def truncate_to(self, back):
        offset = max(self.leo - back, 0)
        self.log.truncate_to(offset)
        self.manager.truncate_to(offset, self.log, self.now)
        event("truncate_to cut" if self.leo < self.map_end else "truncate_to cut nothing")
        self.batches = [b for b in self.batches if b.last_offset < self.leo]
        if self.leo != self.map_end:
            self.model_load()

    @rule(ahead=st.integers(0, 5))
    def truncate_fully_and_start_at(self, ahead):
        offset = self.leo + ahead
        self.log.truncate_fully_and_start_at(offset)
        self.manager.truncate_fully_and_start_at(offset)
        self.batches, self.producers, self.snapshots = [], {}, {}
        self.map_end = self.last_snapshot = offset

    @rule()
    def retention(self):
        if not self.log.delete_old_segments(self.now):
            return
        lso = self.log.log_start_offset
        self.manager.truncate_head(lso)
        event("retention deleted segments")
        self.batches = [b for b in self.batches if b.first_offset >= lso]
        self.snapshots = {o: s for o, s in self.snapshots.items() if o >= lso}
        self.map_end = max(self.map_end, lso)
        self.last_snapshot = max(self.last_snapshot, lso)

    # -- restarts -----------------------------------------------------------------------------

    @precondition(lambda self: self.leo > 0)
    @rule(clean=st.booleans(), corruption=st.sampled_from([None, None, "garbage", "flip",
                                                           "truncate", "empty"]))  # fmt: skip
    def restart(self, clean, corruption):
        before = self.durable_view()
        event("restart: clean" if clean else "restart: crash")
        if clean:
            self.manager.take_snapshot(self.leo)
            self.model_take_snapshot(self.leo)
            self.log.close()
        # else: abandoned as after kill -9; its writes are in the page cache.
        corrupted = None
        offsets = list_snapshots(self.log.directory)
        if corruption and offsets:
            corrupted = offsets[-1]
            self.corrupt(self.manager.snapshot_path(corrupted), corruption)
            event(f"restart with a {corruption} snapshot")
        self.log = Log.open(self.directory, CONFIG)
        assert self.log.cuts == []
        self.manager = ProducerStateManager.open(self.log, self.now, EXPIRATION_MS)
        self.model_load(corrupted)
        after = self.durable_view()
        assert {pid: after.get(pid) for pid in before} == before

    def durable_view(self) -> dict:
        """Epoch and last batch of each producer that a restart must keep: its last batch is
        still in the log and it has not expired."""
        lso = self.log.log_start_offset
        return {pid: (e.producer_epoch, e.batches[-1], e.last_timestamp)
                for pid, e in self.manager.state.producers.items()
                if e.batches and e.batches[-1].last_offset >= lso
                and self.now - e.last_timestamp < EXPIRATION_MS}  # fmt: skip

    @staticmethod
    def corrupt(path, how: str) -> None:
        data = bytearray(path.read_bytes())
        if how == "garbage":
            data = bytearray(b"\x00\x01garbage" * 5)
        elif how == "flip":
            data[len(data) - 1] ^= 0x01
        elif how == "truncate":
            data = data[:-3]
        else:
            data = bytearray()
        path.write_bytes(bytes(data))

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def agrees_with_model(self):
        state = self.manager.state
        assert project(state) == project_model(self.producers)
        assert state.map_end_offset == self.map_end == self.leo
        assert list_snapshots(self.log.directory) == sorted(self.snapshots)
        event(f"producers: {len(self.producers)}, snapshots: {min(len(self.snapshots), 3)}+")


ProducerStateMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestProducerStateModel = ProducerStateMachine.TestCase
