"""The network node of a simulated broker, and its faults: crash (kill -9), clean shutdown,
pause and resume.

A `BrokerHost` outlives crashes. A crash drops the `SimBroker` (every in-memory object) without
closing its logs (kill -9: what was written survives, as page cache does); a restart opens a
new `SimBroker` that recovers its logs and reads its checkpoints. A paused broker holds what
arrives and does nothing on its ticks until it resumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tests.sim import network as m
from tests.sim.broker import SimBroker, SimConfig


@dataclass
class BrokerHost:
    """The network node of one broker id: its current incarnation, or none while crashed."""

    broker_id: int
    config: SimConfig
    directory: Path
    sim: object  # the Simulator: clock, scheduler, network, zk, trace, observer
    incarnation: SimBroker | None = None
    paused: bool = False
    held: list = field(default_factory=list)  # messages that arrived while paused
    generation: int = 0

    @property
    def alive(self) -> bool:
        return self.incarnation is not None

    def start(self) -> None:
        assert self.incarnation is None
        self.generation += 1
        sim = self.sim
        broker = SimBroker(self.broker_id, self.config, self.directory, sim.clock,
                           lambda dst, msg: sim.network.send(self.broker_id, dst, msg),
                           sim.trace, sim.observer, self.generation * 1_000_000_000,
                           sim.new_uuid)  # fmt: skip
        self.incarnation = broker
        broker.session = sim.zk.register(self.broker_id)
        self.paused = False
        self.held.clear()
        self._schedule_tick(broker)

    def crash(self) -> None:
        """kill -9: drop every in-memory object; the files stay as they are."""
        self.incarnation = None
        self.paused = False
        self.held.clear()
        self.sim.zk.drop_session(self.broker_id)  # the kernel drops the session's lock

    def shutdown(self) -> None:
        """A clean shutdown: checkpoints written, logs closed (no recovery on restart)."""
        if self.incarnation is not None:
            self.incarnation.close()
        self.crash()

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        held, self.held = self.held, []
        for src, msg in held:
            if self.incarnation is None:
                break
            self._handle(src, msg)

    def _schedule_tick(self, broker: SimBroker) -> None:
        self.sim.scheduler.after(self.config.tick_ms, self._tick, broker)

    def _tick(self, broker: SimBroker) -> None:
        if self.incarnation is not broker:
            return  # an earlier incarnation's timer
        if not self.paused:
            broker.tick()
        self._schedule_tick(broker)

    def receive(self, src, msg) -> bool:
        if self.incarnation is None:
            return False
        if self.paused:
            self.held.append((src, msg))
            return True
        self._handle(src, msg)
        return True

    def _handle(self, src, msg) -> None:
        broker = self.incarnation
        if isinstance(msg, m.HeartbeatResponse):
            if msg.session == broker.session and msg.expired:
                broker.session = self.sim.zk.register(self.broker_id)  # re-register, as Kafka does
                self.sim.trace(f"b{self.broker_id} session expired; re-registered")
            return
        broker.handle(src, msg)
