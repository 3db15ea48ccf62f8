"""Invariants checked after every step of a run, and the log views they compare.

- leader-not-in-isr: the leader recorded in the store is in the recorded ISR (TLA+ LeaderInIsr).
- strong-isr: below the HW of a leader that has taken up the recorded leadership, every
  member of the recorded ISR holds the same batches (bytes, offsets, epochs) (TLA+ StrongIsr).
- weak-isr: the same for every running broker that believes it leads, against the ISR it
  believes in (TLA+ WeakIsr; a deposed leader that has not heard yet included).
- acked-lost: every acknowledged record (acks=all, answered NONE) is at its offset in the log of
  a leader that has taken up the recorded leadership; no two acks name one offset.
- acked-duplicated: no acknowledged record is twice below the HW of a leader that has taken
  up the recorded leadership (a retried batch written again: what idempotence prevents).
  acked-duplicated-after-epoch-bump: the second copy carries a higher producer epoch. Kafka's
  idempotent producer (KIP-360) does this by design: on a sequence gap it cannot explain (a
  broker that took a later batch as a new producer's first, or lost a batch's metadata in a
  restart: its snapshot keeps each producer's last batch only) or a batch failed for good,
  the client bumps its epoch and sends its unresolved batches again from sequence 0, and the
  broker cannot tell them from new ones.
- hw-backwards: while a broker leads a partition in one epoch its HW never decreases
  (hw-backwards-after-restart: the broker restarted and was given the same epoch again).
- log-offsets: log_start_offset <= HW <= log_end_offset, and the Partition's offsets are the
  Log's.
- two-leaders: no two brokers ever lead a partition in the same epoch.
- commit-lost / commit-backwards: an acknowledged offset commit is never lost (nothing held for
  the partition) nor goes backwards (an older offset held): the loaded shard of the acting
  leader of the group's offsets partition holds at least the last acknowledged offset of each
  partition, and an OffsetFetch answers at least what was acknowledged before it was sent. Only
  acknowledged commits count: Kafka's ZooKeeper-era loader (and ours) replays the log to its
  end, so an offset appended but not yet committed is served after a load, and may vanish
  with the next leader change; that is not an acknowledged commit.
A log is read through `LogView`: batches decoded once and extended on appends (the simulator
bumps a log's `sim_truncations` whenever it truncates, which forces a full re-read).
"""

from __future__ import annotations

from dataclasses import dataclass

from localcluster.broker.group_host import OFFSETS_TOPIC
from localcluster.group import ShardState, partition_for
from localcluster.storage import iter_batches, iter_records


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class InvariantViolation(Exception):
    def __init__(self, violation: Violation):
        super().__init__(str(violation))
        self.violation = violation


class LogView:
    """A log's batches as (base_offset, next_offset, epoch, bytes), and its records by offset."""

    __slots__ = ("batches", "values", "end", "truncations", "start", "serial", "first_offsets",
                 "duplicates")  # fmt: skip
    _serials = 0

    def __init__(self):
        LogView._serials += 1
        self.serial = LogView._serials  # ids of dropped views are reused; serials are not
        self.batches: list[tuple[int, int, int, bytes]] = []
        self.values: dict[int, bytes | None] = {}
        self.first_offsets: dict[bytes, tuple[int, int]] = {}  # value -> first (offset, epoch)
        self.duplicates: list[tuple[int, bytes, int]] = []  # (offset, value, producer epoch)
        self.end = -1
        self.start = -1
        self.truncations = -1


def log_view(lg) -> LogView:
    attrs = lg.__dict__
    view: LogView | None = attrs.get("sim_view")
    truncations = attrs.get("sim_truncations", 0)
    segments = lg._segments
    end = segments[-1].next_offset
    if view is not None and view.end == end and view.truncations == truncations and (
            view.start == segments[0].base_offset):  # fmt: skip
        return view  # the common case: nothing changed since the last look
    if (view is None or view.truncations != truncations
            or view.start != lg.log_start_offset or view.end > lg.log_end_offset):  # fmt: skip
        view = LogView()
        view.truncations = truncations
        view.start = view.end = lg.log_start_offset
        lg.sim_view = view
    while view.end < lg.log_end_offset:
        data = lg.read(view.end, 1 << 30, None, True).tobytes()
        if not data:
            break
        for position, header in iter_batches(data, check_crc=False):
            raw = bytes(data[position : position + header.size])
            view.batches.append((header.base_offset, header.next_offset,
                                 header.partition_leader_epoch, raw))  # fmt: skip
            for record in iter_records(memoryview(raw)):
                view.values[record.offset] = record.value
                first = (record.offset, header.producer_epoch)
                if view.first_offsets.setdefault(record.value, first) != first:
                    view.duplicates.append((record.offset, record.value, header.producer_epoch))
            view.end = header.next_offset
    return view


def batches_below(view: LogView, offset: int, start: int = 0) -> list[tuple[int, int, int, bytes]]:
    """The batches in [start, offset) (retention may have deleted what lies below `start`)."""
    out = []
    for batch in view.batches:
        if batch[0] >= offset:
            break
        if batch[0] >= start:
            out.append(batch)
    return out


def describe(view: LogView) -> str:
    """offset:epoch:value for every record, for traces and golden output."""
    out = []
    epochs = {}
    for base, nxt, epoch, _ in view.batches:
        for o in range(base, nxt):
            epochs[o] = epoch
    for offset in sorted(view.values):
        value = view.values[offset]
        out.append(f"{offset}:e{epochs.get(offset, '?')}:{value.decode() if value else value}")
    return " ".join(out) or "(empty)"


class InvariantChecker:
    def __init__(self, sim):
        self.sim = sim
        self.max_hw: dict[tuple[int, tuple[str, int], int], tuple[int, int]] = {}
        self.leaders: dict[tuple[tuple[str, int], int], int] = {}  # (tp, epoch) -> broker
        self._acked_checked: dict[tuple[str, int], tuple] = {}
        self.acked_values: dict[tuple[str, int], set[bytes]] = {}
        self._isr_checked: dict[tuple, bool] = {}
        self.collect: list[Violation] | None = None  # a list: record violations, do not raise
        # Kinds traced instead of failing the run (known issues, reproduced by a scenario).
        self.tolerated: set[str] = set()
        self.tolerated_seen: list[Violation] = []
        self._known_seen: set[tuple] = set()
        self.committed: dict[str, dict[tuple[str, int], int]] = {}  # group -> last acked commits

    def _generation(self, broker_id: int) -> int:
        return self.sim.hosts[broker_id].generation

    def fail(self, kind: str, message: str) -> None:
        violation = Violation(kind, message)
        if self.collect is None:
            raise InvariantViolation(violation)
        if kind not in {v.kind for v in self.collect}:  # scripted scenarios: note it, go on
            self.collect.append(violation)
            self.sim.trace(f"VIOLATION {violation}")

    def known(self, kind: str, message: str, key=None) -> None:
        """A violation of a known issue: traced if tolerated (once per key), else failed."""
        key = (kind, message if key is None else key)
        if kind not in self.tolerated:
            self.fail(kind, message)
        elif key not in self._known_seen:
            self._known_seen.add(key)
            self.tolerated_seen.append(Violation(kind, message))
            self.sim.trace(f"KNOWN ISSUE {kind}: {message}")

    # -- events the brokers report ------------------------------------------------------------

    def on_leader(self, broker_id: int, tp, epoch: int) -> None:
        other = self.leaders.setdefault((tp, epoch), broker_id)
        if other != broker_id:
            self.fail(
                "two-leaders", f"{tp[0]}-{tp[1]} epoch {epoch}: b{other} and b{broker_id} both led"
            )

    def on_ack(self, tp, offset: int, value: bytes) -> None:
        acked = self.sim.acked.setdefault(tp, {})
        if acked.get(offset, value) != value:
            self.fail("acked-lost", f"{tp[0]}-{tp[1]} offset {offset} acknowledged twice: "
                      f"{acked[offset]!r} and then {value!r}")  # fmt: skip
        acked[offset] = value
        self.acked_values.setdefault(tp, set()).add(value)

    def on_commit_acked(self, group_id: str, tp, offset: int) -> None:
        acked = self.committed.setdefault(group_id, {})
        acked[tp] = max(acked.get(tp, -1), offset)

    def on_offsets_fetched(self, group_id: str, found: dict, floor: dict, broker_id) -> None:
        """An OffsetFetch answered NONE with `found`; `floor`: what was acked when it went out."""
        for tp, offset in sorted(floor.items()):
            value = found.get(tp, -1)
            if value < offset:
                self.fail(_commit_kind(value), f"group {group_id}: b{broker_id} answered "
                          f"{tp[0]}-{tp[1]}@{value} to an OffsetFetch, but {offset} was "
                          f"acknowledged before it was sent")  # fmt: skip

    # -- after every step -----------------------------------------------------------------------

    def check(self) -> None:
        sim = self.sim
        presumed = []  # (tp, broker, hosted) of every running broker that believes it leads
        for host in sim.hosts.values():
            broker = host.incarnation
            if broker is None:
                continue
            for tp, hosted in broker.partitions.items():
                self._check_offsets(broker.broker_id, tp, hosted)
                if hosted.state.is_leader and not host.paused:
                    presumed.append((tp, broker, hosted))
        for tp, (state, _) in sim.zk.states.items():
            if state.leader >= 0 and state.leader not in state.isr:
                self.fail(
                    "leader-not-in-isr",
                    f"{tp[0]}-{tp[1]}: leader b{state.leader} not in isr {list(state.isr)}",
                )
            leader = self.acting_leader(tp)
            if leader is None:
                continue
            self._check_strong_isr(tp, leader, state.isr)
            self._check_acked(tp, leader)
            self._check_duplicates(tp, leader)
        for tp, broker, hosted in presumed:  # WeakIsr: against the ISR each leader believes
            self._check_strong_isr(tp, (broker, hosted), sorted(hosted.state.isr), "weak-isr")
        if self.committed:
            self._check_commits()

    def _check_commits(self) -> None:
        partitions = self.sim.config.offsets_partitions
        for group_id, acked in self.committed.items():
            partition = partition_for(group_id, partitions)
            leader = self.acting_leader((OFFSETS_TOPIC, partition))
            shard = leader[0].groups.shards.get(partition) if leader else None
            if shard is None or shard.state is not ShardState.ACTIVE:
                continue  # no coordinator serves the group now
            group = shard.groups.get(group_id)
            for tp, offset in acked.items():
                held = group.offsets.get(tp) if group is not None else None
                value = -1 if held is None else held.committed_offset
                where = (f"group {group_id}: coordinator b{leader[0].broker_id} (epoch "
                         f"{shard.coordinator_epoch}) holds {tp[0]}-{tp[1]}@{value}")  # fmt: skip
                if value < offset:
                    self.fail(_commit_kind(value), f"{where}, but {offset} was acknowledged")

    def acting_leader(self, tp):
        """The recorded leader's hosted partition, if it has taken up the recorded epoch."""
        state = self.sim.zk.states.get(tp)
        if state is None or state[0].leader < 0:
            return None
        host = self.sim.hosts.get(state[0].leader)
        broker = host.incarnation if host else None
        hosted = broker.partitions.get(tp) if broker else None
        if (
            hosted is None
            or not hosted.state.is_leader
            or hosted.state.leader_epoch != state[0].leader_epoch
        ):
            return None
        return broker, hosted

    def _check_offsets(self, broker_id: int, tp, hosted) -> None:
        p, lg = hosted.state, hosted.log
        segments = lg._segments
        if (p.log_start_offset <= p.high_watermark <= p.log_end_offset
                and p.log_start_offset == segments[0].base_offset
                and p.log_end_offset == segments[-1].next_offset and not p.is_leader):  # fmt: skip
            return  # the common case, quickly
        if not (p.log_start_offset <= p.high_watermark <= p.log_end_offset):
            self.fail("log-offsets", f"b{broker_id} {tp[0]}-{tp[1]}: start {p.log_start_offset} "
                      f"hw {p.high_watermark} end {p.log_end_offset}")  # fmt: skip
        if (p.log_start_offset, p.log_end_offset) != (lg.log_start_offset, lg.log_end_offset):
            self.fail("log-offsets", f"b{broker_id} {tp[0]}-{tp[1]}: partition says "
                      f"[{p.log_start_offset}, {p.log_end_offset}), log says "
                      f"[{lg.log_start_offset}, {lg.log_end_offset})")  # fmt: skip
        if p.is_leader:
            key = (broker_id, tp, p.leader_epoch)
            last, generation = self.max_hw.get(key, (-1, 0))
            if p.high_watermark < last:
                restarted = generation != self._generation(broker_id)
                kind = "hw-backwards-after-restart" if restarted else "hw-backwards"
                message = (f"b{broker_id} {tp[0]}-{tp[1]} epoch {p.leader_epoch}: hw {last} -> "
                           f"{p.high_watermark}{' (it restarted in between)' * restarted}")  # fmt: skip
                self.known(kind, message)
            self.max_hw[key] = (p.high_watermark, self._generation(broker_id))

    def _check_strong_isr(self, tp, leader, isr, kind: str = "strong-isr") -> None:
        broker, hosted = leader
        hw = hosted.state.high_watermark
        lview = log_view(hosted.log)
        for member in isr:
            if member == broker.broker_id:
                continue
            host = self.sim.hosts.get(member)
            other = host.incarnation if host else None
            lg = other.logs.get(tp) if other else None
            if lg is None:
                continue  # crashed: checked again once it has opened its logs
            mview = log_view(lg)
            key = (tp, broker.broker_id, lview.serial, lview.end, hw, member, mview.serial,
                   mview.end)  # fmt: skip
            if self._isr_checked.get(key):
                continue
            start = max(lview.start, mview.start)
            if start > hw:
                continue  # both deleted everything below the HW that they could compare
            mine = batches_below(lview, hw, start)
            theirs = batches_below(mview, hw, start)
            if mview.end < hw or mine != theirs:
                at = next((b[0] for b, c in zip(mine, theirs, strict=False) if b != c), mview.end)
                self.fail(kind, f"{tp[0]}-{tp[1]}: leader b{broker.broker_id} (epoch "
                          f"{hosted.state.leader_epoch}, hw {hw}) and isr member b{member} "
                          f"(log end {mview.end}) differ below the hw, first at offset {at}: "
                          f"leader [{describe(lview)}] member [{describe(mview)}]")  # fmt: skip
            if len(self._isr_checked) > 100_000:
                self._isr_checked.clear()
            self._isr_checked[key] = True

    def _check_acked(self, tp, leader) -> None:
        broker, hosted = leader
        acked = self.sim.acked.get(tp)
        if not acked:
            return
        view = log_view(hosted.log)
        key = (broker.broker_id, view.serial, len(acked))
        if self._acked_checked.get(tp) == key:
            return  # the same log view (appends only since) and no new acks
        for offset, value in acked.items():
            if offset < view.start:
                continue  # deleted by retention, below the HW: not lost
            if view.values.get(offset, b"<missing>") != value:
                self.fail("acked-lost", f"{tp[0]}-{tp[1]}: acknowledged {value!r} at offset "
                          f"{offset}, but leader b{broker.broker_id} (epoch "
                          f"{hosted.state.leader_epoch}) has "
                          f"{view.values.get(offset, 'nothing')!r} there")  # fmt: skip
        self._acked_checked[tp] = key

    def _check_duplicates(self, tp, leader) -> None:
        broker, hosted = leader
        view, hw = log_view(hosted.log), hosted.state.high_watermark
        acked = self.acked_values.get(tp, ())
        for offset, value, epoch in view.duplicates:
            if offset >= hw or value not in acked:
                continue
            first, first_epoch = view.first_offsets[value]
            bumped = epoch > first_epoch >= 0
            message = (f"{tp[0]}-{tp[1]}: acknowledged {value!r} is in leader b{broker.broker_id}'s "
                       f"log at offsets {first} (producer epoch {first_epoch}) and {offset} "
                       f"(epoch {epoch}), below the hw {hw}")  # fmt: skip
            if bumped:
                self.known("acked-duplicated-after-epoch-bump", message, (tp, value))
            else:
                self.fail("acked-duplicated", message)


def _commit_kind(held: int) -> str:
    return "commit-lost" if held < 0 else "commit-backwards"


def truncated_for_test(lg, offset: int) -> None:
    """Cut a log behind the simulator's back (the checker's own tests)."""
    lg.truncate_to(offset)
    lg.sim_truncations = getattr(lg, "sim_truncations", 0) + 1
