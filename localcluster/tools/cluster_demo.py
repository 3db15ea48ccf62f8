"""`make demo`: a five-broker cluster, a leader killed with SIGKILL, nothing acknowledged lost.

Runs the real `localcluster` commands, each printed as you would type it, in a fresh cluster
dir under the system's temp dir: up -n 5, a topic with replication factor 3 and
min.insync.replicas=2, 1000 records produced with acks=all, kill -9 of the partition's
leader, the new leader and ISR, 1000 more records, every record consumed back and compared,
the old leader restarted and back in the ISR, down --purge.

Exit code 0 when every acknowledged record came back; 1 on a real failure (a command failed,
a record is missing). A cluster without a controller cannot fail over: the demo then says so
and skips to the end instead of failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from localcluster.tools.cluster_view import console as shared_console
from localcluster.waiting import wait_until

console = shared_console()
TOPIC = "demo"
RECORDS = 1000


class DemoFailure(Exception):
    pass


def step(title: str) -> None:
    console.print()
    console.print(f"[bold cyan]== {title}[/]")


def run(*args: str, input: str | None = None, show: bool = True, shown_input: str | None = None,
        timeout_s: float = 120) -> subprocess.CompletedProcess:  # fmt: skip
    command = "localcluster " + " ".join(args)
    console.print(
        f"[bold]$ {shown_input + ' | ' if shown_input else ''}{command}[/]", soft_wrap=True
    )
    env = dict(os.environ)
    if console.is_terminal:  # tables fit the terminal, indented; elsewhere: natural width
        env["COLUMNS"] = str(max(console.width - 2, 60))
    result = subprocess.run([sys.executable, "-m", "localcluster", *args], input=input,
                            capture_output=True, text=True, timeout=timeout_s, env=env)  # fmt: skip
    if show:
        for line in (result.stdout + result.stderr).rstrip("\n").splitlines():
            console.print(f"  {line}", markup=False, soft_wrap=True)
    if result.returncode != 0:
        raise DemoFailure(f"`{command}` failed with exit code {result.returncode}")
    return result


def quiet_json(*args: str):
    result = subprocess.run([sys.executable, "-m", "localcluster", *args, "--json"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    if result.returncode != 0:
        raise DemoFailure(f"`localcluster {' '.join(args)}` failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def partition() -> dict:
    return quiet_json("topic", "describe", TOPIC)["partitions"][0]


def produce(first: int, count: int) -> None:
    lines = "".join(f"record-{i}\n" for i in range(first, first + count))
    shown = f"seq -f 'record-%g' {first} {first + count - 1}"
    run("produce", TOPIC, "--acks", "all", input=lines, shown_input=shown)


def demo() -> None:
    step("1. Start five brokers (each its own process) and wait for the controller")
    run("up", "-n", "5", "--detach")

    step("2. A topic with 3 replicas that needs 2 in sync to accept acks=all writes")
    run("topic", "create", TOPIC, "--partitions", "1", "--replication-factor", "3",
        "--config", "min.insync.replicas=2")  # fmt: skip

    step(f"3. Produce {RECORDS} records with acks=all (acknowledged = on every ISR member)")
    produce(1, RECORDS)
    before = partition()
    leader = before["leader"]
    console.print(f"leader of {TOPIC}-0 is broker {leader}, ISR {before['isr']}")

    step(f"4. kill -9 the leader (broker {leader})")
    run("kill", f"leader:{TOPIC}:0", "--signal", "KILL")
    controller = quiet_json("status")["controller"]
    if controller is None:
        console.print("[yellow]no controller is running in this build, so nobody elects a new "
                      "leader; skipping to the end[/]")  # fmt: skip
        return
    after = wait_until(lambda: (p := partition())["leader"] not in (-1, leader) and p, 30, 0.2)
    if not after:
        raise DemoFailure(f"no new leader for {TOPIC}-0 within 30 s of killing broker {leader}")
    console.print(f"[green]new leader: broker {after['leader']} (leader epoch {after['leader_epoch']}), "
                  f"ISR {after['isr']}[/]")  # fmt: skip
    run("topic", "describe", TOPIC)

    step(
        f"5. Keep producing: {RECORDS} more records, ISR {after['isr']} still meets min.insync.replicas=2"
    )
    produce(RECORDS + 1, RECORDS)

    step("6. Consume everything back and compare with what was acknowledged")
    total = 2 * RECORDS
    result = run("consume", TOPIC, "--from-beginning", "--max-messages", str(total),
                 "--timeout-ms", "10000", show=False)  # fmt: skip
    got = result.stdout.split()
    expected = [f"record-{i}" for i in range(1, total + 1)]
    missing = sorted(set(expected) - set(got), key=lambda v: int(v.split("-")[1]))
    console.print(f"  consumed {len(got)} records; first {got[:1]}, last {got[-1:]}", markup=False)
    if missing:
        raise DemoFailure(f"{len(missing)} acknowledged records are missing, e.g. {missing[:5]}")
    console.print(f"[bold green]all {total} acknowledged records are there, in order: "
                  f"{got == expected}[/]")  # fmt: skip

    step(f"7. Restart broker {leader}: it catches up and rejoins the ISR")
    run("start", str(leader))
    back = wait_until(lambda: leader in (p := partition())["isr"] and p, 30, 0.2)
    if back:
        console.print(f"[green]ISR {back['isr']} (leader {back['leader']})[/]")
    else:
        console.print(f"[yellow]broker {leader} is not back in the ISR yet[/]")
    run("status")


def main() -> int:
    directory = Path(tempfile.mkdtemp(prefix="localcluster-demo-"))
    os.environ["LOCALCLUSTER_DIR"] = str(directory / "cluster")
    console.print(f"[bold]localcluster demo[/] (cluster dir {directory / 'cluster'})")
    code = 0
    try:
        demo()
    except DemoFailure as e:
        console.print(f"[bold red]demo failed: {e}[/]")
        code = 1
    except KeyboardInterrupt:
        code = 130
    finally:
        step("8. Stop the cluster and remove its data")
        try:
            run("down", "--purge")
        except (DemoFailure, subprocess.TimeoutExpired) as e:
            console.print(f"[red]{e}[/]")
            code = code or 1
        try:
            directory.rmdir()
        except OSError:
            pass
    return code


if __name__ == "__main__":
    sys.exit(main())
