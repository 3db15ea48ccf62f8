"""chaos's consumer-group checks on made-up members' event lines: each passes on a good run and
fails on the fault it exists to catch (a record never consumed, one consumed that the log does
not hold, a commit going backwards across members, an OffsetFetch that is not the last commit).
"""

from __future__ import annotations

from localcluster.tools.chaos_check import Ack, check_group
from localcluster.tools.chaos_consumer import Tail

START_MS = 1_000_000  # the wall-clock start of the faults in these made-up runs


def us(ms_from_start: int) -> int:
    return (START_MS + ms_from_start) * 1000


def record(t_ms, p, o, v):
    return {"e": "r", "t": us(t_ms), "p": p, "o": o, "v": v}


def commit(t_ms, offsets, error=None, partition_errors=None):
    return {"e": "c", "t": us(t_ms), "sent": us(t_ms) - 500, "error": error,
            "offsets": {str(p): o for p, o in offsets.items()},
            "partition_errors": {str(p): e for p, e in (partition_errors or {}).items()}}  # fmt: skip


def assign(t_ms, *partitions, kind="a"):
    return {"e": kind, "t": us(t_ms), "partitions": list(partitions)}


ACKS = [Ack("k0", 0, 0, 0, START_MS), Ack("k0", 1, 0, 1, START_MS), Ack("k1", 0, 1, 0, START_MS)]
LOG = {0: [(0, b"k0:000000000"), (1, b"k0:000000001")], 1: [(0, b"k1:000000000")]}


def good_run() -> dict[str, list[dict]]:
    """consumer-0 owns both partitions, consumes p0's first record, commits it, consumes the
    second and dies before committing it; consumer-1 gets p0 and re-reads the second record."""
    return {
        "consumer-0": [assign(0, 0, 1), record(10, 0, 0, "k0:000000000"), record(10, 1, 0, "k1:000000000"),
                       commit(11, {0: 1, 1: 1}), record(20, 0, 1, "k0:000000001")],
        "consumer-1": [assign(40, 0), record(50, 0, 1, "k0:000000001"), commit(51, {0: 2}),
                       {"e": "x", "t": us(60), "errors": 0}],
    }  # fmt: skip


def check(logs, committed=None, **kwargs):
    committed = {0: 2, 1: 1} if committed is None else committed
    kwargs.setdefault("log_records", LOG)
    return check_group(ACKS, logs, [0, 1], committed, since_ms=START_MS, **kwargs)


def test_a_good_run_passes_both_and_counts_what_was_read_twice():
    result = check(good_run())
    assert result["at_least_once"] and result["commits_never_backwards"], result
    assert result["consumed"] == 4 and result["consumed_distinct"] == 3 and result["missed"] == 0
    assert result["reconsumed"] == 1 and result["reconsumed_by_partition"] == {"0": 1, "1": 0}
    assert result["commits"] == 3 and result["commits_failed"] == 0
    assert result["last_commits"] == {"0": 2, "1": 1} and result["final_mismatches"] == []
    assert result["ownership"] == {"0": [["consumer-0", 0, None], ["consumer-1", 40, 60]],
                                   "1": [["consumer-0", 0, None]]}  # fmt: skip


def test_an_acknowledged_record_never_consumed_fails_the_first_check():
    logs = good_run()
    logs["consumer-1"] = [assign(40, 0), commit(51, {0: 2})]  # says it committed, never read it
    del logs["consumer-0"][-1]
    result = check(logs)
    assert not result["at_least_once"] and result["commits_never_backwards"]
    assert result["missed"] == 1
    assert result["missed_records"] == [{"value": "k0:000000001", "partition": 0, "offset": 1}]


def test_a_record_read_at_an_offset_that_holds_another_fails_the_first_check():
    logs = good_run()
    logs["consumer-1"][1] = record(50, 0, 1, "k9:000000007")
    result = check(logs)
    assert not result["at_least_once"]
    assert result["not_in_log"] == 1 and result["not_in_log_records"] == [[0, 1, "k9:000000007"]]


def test_records_deleted_below_the_log_start_before_the_group_read_them_are_not_missed():
    """Retention moved p0's log start to 2 before any member read p0: its two acknowledged
    records are counted as deleted before read; p1's unread record above its start is missed."""
    logs = {"consumer-0": [assign(0, 0, 1), commit(11, {0: 2, 1: 1})]}
    log = {0: [], 1: [(0, b"k1:000000000")]}
    result = check_group(ACKS, logs, [0, 1], {0: 2, 1: 1}, log_records=log, log_starts={0: 2, 1: 0},
                         since_ms=START_MS)  # fmt: skip
    assert result["deleted_before_read"] == 2 and result["missed"] == 1, result
    assert result["missed_records"] == [{"value": "k1:000000000", "partition": 1, "offset": 0}]
    assert not result["at_least_once"]
    logs["consumer-0"].insert(1, record(10, 1, 0, "k1:000000000"))
    result = check_group(ACKS, logs, [0, 1], {0: 2, 1: 1}, log_records=log, log_starts={0: 2, 1: 0},
                         since_ms=START_MS)  # fmt: skip
    assert result["at_least_once"] and result["missed"] == 0, result


def test_a_record_read_below_the_log_start_is_checked_against_what_was_acknowledged_there():
    log = {0: [], 1: [(0, b"k1:000000000")]}
    result = check(good_run(), log_starts={0: 2, 1: 0}, log_records=log)
    assert result["at_least_once"] and result["not_in_log"] == 0, result  # read before deletion
    assert result["deleted_before_read"] == 0
    logs = good_run()
    logs["consumer-1"][1] = record(50, 0, 1, "k9:000000007")  # not what was acknowledged at 0/1
    result = check(logs, log_starts={0: 2, 1: 0}, log_records=log)
    assert not result["at_least_once"] and result["not_in_log_records"] == [[0, 1, "k9:000000007"]]


def test_a_commit_going_backwards_across_members_fails_the_second_check():
    logs = good_run()
    logs["consumer-1"].insert(2, commit(52, {0: 1}))  # after consumer-1's own 2: back to 1
    logs["consumer-0"].append(commit(30, {0: 2}))  # answered before consumer-1's: order by time
    result = check(logs, committed={0: 1, 1: 1})
    assert result["at_least_once"] and not result["commits_never_backwards"]
    assert result["backwards"] == 1
    step = result["backwards_steps"][0]
    assert step == {"partition": 0, "from": 2, "from_consumer": "consumer-1", "from_ms": 51,
                    "to": 1, "to_consumer": "consumer-1", "to_ms": 52}  # fmt: skip


def test_failed_commits_are_not_steps_but_are_counted():
    logs = good_run()
    logs["consumer-1"].insert(2, commit(52, {0: 1}, error="NOT_COORDINATOR: moved"))
    logs["consumer-0"].append(
        commit(21, {0: 2, 1: 0}, partition_errors={1: "UNKNOWN_MEMBER_ID: x"})
    )
    result = check(logs)
    assert result["commits_never_backwards"], result
    assert result["commits_failed"] == 2
    assert result["commit_failures"] == {"NOT_COORDINATOR": 1, "UNKNOWN_MEMBER_ID": 1}


def test_an_offset_fetch_that_is_not_the_last_successful_commit_fails_the_second_check():
    result = check(good_run(), committed={0: 1, 1: 1})
    assert not result["commits_never_backwards"] and result["backwards"] == 0
    assert result["final_mismatches"] == [
        "p0: OffsetFetch answers 1, the last successful commit was 2 by consumer-1"
    ]
    logs = good_run()  # a commit answered with an error but written anyway is named
    logs["consumer-1"].append(commit(70, {0: 5}, error="REQUEST_TIMED_OUT: no answer"))
    text = check(logs, committed={0: 5, 1: 1})["final_mismatches"][0]
    assert text.endswith(
        "(a later commit of 5 by consumer-1 was answered REQUEST_TIMED_OUT: no answer)"
    )
    missing = check(good_run(), committed={0: 2})["final_mismatches"]
    assert missing == [
        "p1: OffsetFetch answers no offset, the last successful commit was 1 by consumer-0"
    ]


def test_no_offset_fetch_answer_fails_the_second_check_with_the_reason():
    result = check_group(ACKS, good_run(), [0, 1], None, fetch_error="COORDINATOR_NOT_AVAILABLE: x")
    assert not result["commits_never_backwards"]
    assert result["final_mismatches"] == [
        "the group's committed offsets could not be fetched: COORDINATOR_NOT_AVAILABLE: x"
    ]


def test_the_engine_reads_only_complete_lines_of_a_member_file(tmp_path):
    path = tmp_path / "consumer-0.jsonl"
    tail = Tail(path)
    assert tail.read() == []  # not written yet
    path.write_text('{"e":"s","t":1}\n{"e":"r","t":2,"p":0,"o":0,"v":"k0:0"}\n{"e":"c"')
    assert [e["e"] for e in tail.read()] == ["s", "r"]
    with open(path, "a") as f:
        f.write(',"t":3}\n')
    assert tail.read() == [{"e": "c", "t": 3}]
    assert tail.read() == []


def test_a_member_killed_and_restarted_owned_its_partitions_until_its_next_life():
    logs = {"consumer-0": [{"e": "s", "t": us(-5)}, assign(0, 0, 1), record(10, 0, 0, "k0:000000000"),
                           {"e": "s", "t": us(100)}, assign(150, 1), assign(150, 1, kind="v")]}  # fmt: skip
    assert check(logs, committed={})["ownership"] == {
        "0": [["consumer-0", 0, 100]],
        "1": [["consumer-0", 0, 100], ["consumer-0", 150, 150]],
    }
