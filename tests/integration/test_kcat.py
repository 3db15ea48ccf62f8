"""kcat (Debian's, on librdkafka 2.0) against a real broker process: produce lines with keys
and explicit partitions, read them back identical, list the broker and its topics.

Every kcat runs under a timeout; subprocess.run kills it on timeout or any exception, and the
one Popen'd consumer is killed in a finally.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import threading

import pytest

from tests.brokers import BrokerSet
from tests.helpers import wait_until

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (Debian package kcat; `make test` installs it)"
)
TIMEOUT_S = 30


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    cluster = tmp_path_factory.mktemp("cluster")
    started = BrokerSet(cluster)
    try:
        # Topics are auto-created by kcat's Metadata request, with num.partitions partitions.
        yield started.start(1, num_partitions=3)
    finally:
        started.cleanup()


def kcat(broker, *args: str, input: str | None = None) -> str:
    result = subprocess.run([KCAT, "-b", broker.bootstrap, "-X", "log_level=3", *args], input=input,
                            capture_output=True, text=True, timeout=TIMEOUT_S)  # fmt: skip
    assert result.returncode == 0, (
        f"kcat {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    )
    return result.stdout


def produce_lines(
    broker, topic: str, partition: int, lines: list[str], key_delimiter: str | None = ":"
):
    args = ["-P", "-t", topic, "-p", str(partition)]
    if key_delimiter is not None:
        args += ["-K", key_delimiter]
    kcat(broker, *args, input="".join(line + "\n" for line in lines))


def consume_all(broker, topic: str) -> list[dict]:
    """Every message from the beginning of every partition, as kcat's JSON envelopes."""
    out = kcat(broker, "-C", "-t", topic, "-o", "beginning", "-e", "-J")
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_lines_with_keys_and_partitions_come_back_identical(broker):
    topic = "kcat-round-trip"
    sent = {
        0: [f"key-{i}:value {i} with spaces\tand a tab" for i in range(20)],
        1: ["k:v:with:colons", "unicode-key:ünïcødé ✓", ":no key, empty key", "last:x"],
        2: [f"p2-{i}:{'z' * (i * 37)}" for i in range(10)],
    }  # fmt: skip
    for partition, lines in sent.items():
        produce_lines(broker, topic, partition, lines)
    got = consume_all(broker, topic)
    assert {m["topic"] for m in got} == {topic}
    for partition, lines in sent.items():
        messages = sorted(
            (m for m in got if m["partition"] == partition), key=lambda m: m["offset"]
        )
        assert [m["offset"] for m in messages] == list(range(len(lines)))
        expected = [line.split(":", 1) for line in lines]
        assert [[m["key"] or "", m["payload"]] for m in messages] == expected, partition
    assert len(got) == sum(map(len, sent.values()))


def test_a_second_produce_appends_after_the_first(broker):
    topic = "kcat-append"
    produce_lines(broker, topic, 0, ["one", "two"], key_delimiter=None)
    produce_lines(broker, topic, 0, ["three"], key_delimiter=None)
    got = [
        (m["partition"], m["offset"], m["key"], m["payload"]) for m in consume_all(broker, topic)
    ]
    assert got == [(0, 0, None, "one"), (0, 1, None, "two"), (0, 2, None, "three")]


def test_a_formatted_read_from_an_offset(broker):
    topic = "kcat-format"
    produce_lines(broker, topic, 2, [f"k{i}:v{i}" for i in range(8)])
    out = kcat(broker, "-C", "-t", topic, "-p", "2", "-o", "5", "-e", "-f", "%p|%o|%k|%s\n")
    assert out.splitlines() == [f"2|{i}|k{i}|v{i}" for i in range(5, 8)]


def test_a_waiting_consumer_gets_lines_produced_later(broker):
    topic = "kcat-tail"
    produce_lines(broker, topic, 0, ["before"], key_delimiter=None)
    # -u: unbuffered, so each line shows as soon as kcat has it. A thread reads the pipe, so
    # no read here can block past its deadline, whatever kcat does.
    consumer = subprocess.Popen([KCAT, "-b", broker.bootstrap, "-X", "log_level=3", "-u", "-C",
                                 "-t", topic, "-p", "0", "-o", "beginning", "-c", "4", "-f", "%o %s\n"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(line) for line in consumer.stdout], daemon=True
    ).start()
    try:
        # The consumer is up and has read the first line: it is now fetching at the end.
        assert lines.get(timeout=TIMEOUT_S) == "0 before\n"
        produce_lines(broker, topic, 0, ["after-1", "after-2", "after-3"], key_delimiter=None)
        rest = [lines.get(timeout=TIMEOUT_S) for _ in range(3)]
        assert consumer.wait(TIMEOUT_S) == 0  # -c 4: it exits after the fourth message
    finally:
        consumer.kill()
        consumer.wait()
    assert rest == ["1 after-1\n", "2 after-2\n", "3 after-3\n"]


def test_metadata_lists_the_broker_and_the_topic(broker):
    topic = "kcat-listed"
    produce_lines(broker, topic, 1, ["a:b"])
    described = json.loads(kcat(broker, "-L", "-J", "-t", topic))
    assert [(b["id"], b["name"]) for b in described["brokers"]] == [(1, broker.bootstrap)]
    (listed,) = described["topics"]
    assert listed["topic"] == topic and "error" not in listed
    partitions = sorted(listed["partitions"], key=lambda p: p["partition"])
    assert [(p["partition"], p["leader"]) for p in partitions] == [(0, 1), (1, 1), (2, 1)]
    assert all([r["id"] for r in p["replicas"]] == [1] and [r["id"] for r in p["isrs"]] == [1]
               for p in partitions)  # fmt: skip
    # Without -t: every topic, this one included, and the plain-text form names the broker.
    everything = json.loads(kcat(broker, "-L", "-J"))
    assert topic in {t["topic"] for t in everything["topics"]}
    text = kcat(broker, "-L")
    assert (
        f"broker 1 at {broker.bootstrap}" in text and f'topic "{topic}" with 3 partitions' in text
    )


def test_metadata_for_a_new_topic_auto_creates_it(broker):
    """kcat -L uses a producer handle, whose Metadata requests allow auto-creation; the broker
    (auto.create.topics.enable, Kafka's default) creates the topic with num.partitions=3."""

    def listed():
        (topic,) = json.loads(kcat(broker, "-L", "-J", "-t", "never-produced-to"))["topics"]
        assert topic["topic"] == "never-produced-to"
        partitions = sorted((p["partition"], p["leader"]) for p in topic["partitions"])
        # The first answers may say LEADER_NOT_AVAILABLE (leader -1) while the topic is new.
        return (
            "error" not in topic
            and partitions
            and all(leader == 1 for _, leader in partitions)
            and partitions
        )

    assert wait_until(listed, timeout_s=10) == [(0, 1), (1, 1), (2, 1)]
