"""The broker's state-change log (Kafka's state-change.log): one JSON object per line for each
state change of its replica core (replication/ready.py: leading, following, truncated, ISR
changed, ...) and of the controller it runs (elected), with epochs and offsets as fields and
the human-readable sentence (replication/state_changes.py) as `message`.

    {"time_ms": 1764590000123, "broker": 1, "event": "leading", "topic": "t", "partition": 0,
     "leader_epoch": 3, "isr": [1, 2], "log_start_offset": 0, "log_end_offset": 42,
     "high_watermark": 40, "message": "leading t-0 in epoch 3, ISR [1, 2], ..."}

The file is `state-change.log` in the broker's directory once `open_file` is called (the
broker server does); the sentence also goes to the broker's ordinary log. `localcluster chaos`
(tools/chaos_check.py) reads the JSON back with `read_events`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import re
import time
from pathlib import Path

from localcluster.replication.state_changes import describe

log = logging.getLogger("localcluster.broker.replica_manager")
_json_log = logging.getLogger("localcluster.state_change")
_json_log.propagate = False  # JSON lines go to state-change.log only
FILE_NAME = "state-change.log"
SUMMARIZED_OVER = 10  # state changes of one request logged one by one in the broker's log
_broker_id = -1


def open_file(path: Path, broker_id: int) -> None:
    """Append the JSON lines to `path` from now on (instead of any file before)."""
    global _broker_id
    close_file()
    _broker_id = broker_id
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    _json_log.addHandler(handler)
    _json_log.setLevel(logging.INFO)


def close_file() -> None:
    for handler in list(_json_log.handlers):
        _json_log.removeHandler(handler)
        handler.close()


def event_name(change) -> str:
    """Leading -> "leading", IsrChanged -> "isr_changed"."""
    return _event_name(type(change))


@functools.cache
def _event_name(kind: type) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", kind.__name__).lower()


@functools.cache
def _field_names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def fields(change) -> dict:
    """The change's fields as JSON values; a topic partition as topic and partition."""
    out = {}
    for name in _field_names(type(change)):
        value = getattr(change, name)
        if name == "tp":
            out["topic"], out["partition"] = value
        elif dataclasses.is_dataclass(value):
            out[name] = dataclasses.asdict(value)
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def write_event(event: str, values: dict, message: str) -> None:
    write_events([(event, values, message)])


def write_events(events: list[tuple[str, dict, str]]) -> None:
    """(event, fields, message) of each, one JSON line each, in one write: a LeaderAndIsr of
    thousands of partitions cost a logging record per line, a quarter of its handling."""
    if not (events and _json_log.handlers):
        return
    time_ms = int(time.time() * 1000)
    lines = [json.dumps({"time_ms": time_ms, "broker": _broker_id, "event": event, **values, "message": message},
                        separators=(", ", ": ")) for event, values, message in events]  # fmt: skip
    _json_log.info("%s", "\n".join(lines))


def log_state_change(change) -> None:
    level, message = describe(change)
    log.log(level, "%s", message)
    write_event(event_name(change), fields(change), message)


def log_state_changes(changes, source: str) -> None:
    """The state changes one request made (a LeaderAndIsr of 6,000 partitions makes 6,000):
    each goes to the state-change log. The broker's log gets each one when there are at most
    SUMMARIZED_OVER of them at INFO, else one line per kind of change (how many, and the first
    as an example) with each one at DEBUG; a warning always gets its own line."""
    described = [(change, *describe(change)) for change in changes]
    write_events(
        [(event_name(change), fields(change), message) for change, _, message in described]
    )
    quiet = [(change, message) for change, level, message in described if level <= logging.INFO]
    for _, level, message in described:
        if level > logging.INFO or len(quiet) <= SUMMARIZED_OVER:
            log.log(level, "%s", message)
    if len(quiet) <= SUMMARIZED_OVER:
        return
    kinds: dict[str, list[str]] = {}
    for change, message in quiet:
        kinds.setdefault(event_name(change), []).append(message)
    for kind, messages in kinds.items():
        log.info("%s: %s partition(s) %s, e.g. %s; each one is in %s", source,
                 f"{len(messages):,}", kind.replace("_", " "), messages[0], FILE_NAME)  # fmt: skip
    if log.isEnabledFor(logging.DEBUG):
        for _, message in quiet:
            log.debug("%s", message)


def read_events(path: Path) -> list[dict]:
    """The JSON lines of a state-change log; a torn or foreign line is skipped."""
    out = []
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "event" in record:
            out.append(record)
    return out
