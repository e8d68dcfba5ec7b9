"""Grading on a Dask cluster: a real `distributed.LocalCluster` gives the local results."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from conftest import importable_env

import grader._cli as cli
from grader import (
    CheckExecution,
    Claim,
    Evidence,
    Verdict,
    grade_claims,
)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CLAIMS_FILE = EXAMPLES / "claims.jsonl"




@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two worker processes with two threads each on loopback, no dashboard; closed after."""
    with pytest.MonkeyPatch.context() as patch:
        # The workers are fresh processes: they must import this checkout, not another install.
        patch.setenv("PYTHONPATH", importable_env()["PYTHONPATH"])
        local = distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=2,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
        )
    try:
        yield local
    finally:
        local.close()


@pytest.fixture(scope="module")
def client(cluster: Any) -> Iterator[Any]:
    """A client of the test cluster, not made the default one."""
    connected = distributed.Client(cluster, set_as_default=False)
    try:
        yield connected
    finally:
        connected.close()


def example_claims() -> list[cli.ClaimLine]:
    """The example claims, all well formed."""
    claims, errors = cli.parse_claims(CLAIMS_FILE.read_bytes().splitlines())
    assert errors == []
    return claims


def projection(outcomes: list[cli.ClaimOutcome]) -> list[tuple[Any, ...]]:
    """What must not depend on where a claim was graded: id, verdict, reason, duplicate, exit."""
    return [
        (o.id, o.grade.verdict, o.grade.reason, o.grade.duplicate_of, o.exit_code) for o in outcomes
    ]


def line_projection(stdout: str) -> list[tuple[Any, ...]]:
    """The same fields read from the command line's JSON output."""
    lines = [json.loads(line) for line in stdout.splitlines()]
    keys = ("id", "verdict", "reason", "duplicate_of", "exit_code")
    return [tuple(line[key] for key in keys) for line in lines]


def run_grader(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m grader ARGV` in a child process, with a generous bound."""
    return subprocess.run(
        [sys.executable, "-m", "grader", *argv],
        env=importable_env(),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_cluster_grades_the_example_claims_as_locally(client: Any, cluster: Any) -> None:
    """verify_claims on the cluster's executor equals the local pass, claim by claim."""
    claims = example_claims()
    local = list(cli.verify_claims(claims, cwd=str(EXAMPLES), timeout=30, jobs=2))
    with distributed.get_task_stream(client) as stream:
        remote = list(
            cli.verify_claims(
                claims, cwd=str(EXAMPLES), timeout=30, executor=client.get_executor(pure=False)
            )
        )
    assert projection(remote) == projection(local)
    # The example set is worth comparing: every verdict and a duplicate occur in it.
    assert {o.grade.verdict for o in local} == set(Verdict)
    assert any(o.grade.duplicate_of for o in local)
    # And the claims really travelled: one task per claim, each run by a worker of the cluster.
    assert len(stream.data) == len(claims)
    assert {task["worker"] for task in stream.data} <= set(cluster.scheduler_info["workers"])


def test_grade_claims_on_the_cluster_equals_grading_here(client: Any) -> None:
    """grade_claims with the cluster's executor gives the grades and duplicates it gives here."""
    six = Evidence(4, "grep -c PARETO results.txt", "6")
    claims = [
        Claim("a", "Six rows", six, CheckExecution(0, "6\n", "")),
        Claim("b", " six  rows", six, CheckExecution(0, "6\n", "")),
        Claim("c", "Six rows", six, CheckExecution(1, "", "grep: results.txt: No such file")),
        Claim("d", "Six rows", six, CheckExecution(124, "", "", timed_out=True)),
        Claim("e", "Six rows", six, None),
        Claim("f", "Seven rows", Evidence(4, "wc -l < grid.txt", "7"), CheckExecution(0, "8", "")),
        Claim("g", "Silent", Evidence(4, "grep -q x f", "6"), CheckExecution(0, "", "")),
        Claim("h", "Constant", Evidence(4, "echo 6", "6"), CheckExecution(0, "6\n", "")),
        Claim("i", "Low rung", Evidence(2), None),
    ]
    here = grade_claims(claims)
    there = grade_claims(claims, executor=client.get_executor())
    assert there == here
    # Same check, expectation, title and verdict: b repeats a; d and e (unrunnable) repeat c.
    assert [g.duplicate_of for g in there] == [None, "a", None, "c", "c", None, None, None, None]


def test_command_line_on_the_cluster_equals_the_local_run(cluster: Any) -> None:
    """`--executor dask://HOST:PORT` writes the lines and exit status of `--executor local`."""
    address = cluster.scheduler_address
    assert address.startswith("tcp://127.0.0.1:")
    on_cluster = run_grader(
        str(CLAIMS_FILE), "--executor", "dask://" + address.removeprefix("tcp://")
    )
    here = run_grader(str(CLAIMS_FILE), "--executor", "local", "--jobs", "2")
    assert here.returncode == 1, here.stderr
    assert on_cluster.returncode == here.returncode, on_cluster.stderr
    assert line_projection(on_cluster.stdout) == line_projection(here.stdout)
    assert "total" in on_cluster.stderr


def test_unreachable_scheduler_exits_two_with_a_clear_message() -> None:
    """A scheduler that does not answer: exit 2 within the connect bound, nothing graded."""
    with socket.socket() as held:
        # Bound but not listening: connecting is refused, and no one else can take the port.
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        started = time.monotonic()
        proc = run_grader(
            str(CLAIMS_FILE), "--executor", f"dask://127.0.0.1:{port}", "--connect-timeout", "1"
        )
        elapsed = time.monotonic() - started
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert f"cannot reach the Dask scheduler at tcp://127.0.0.1:{port} within 1 s" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert elapsed < 60  # bounded by the connect timeout, not by anything the checks do


def test_abandoned_pass_withdraws_the_cluster_tasks(client: Any) -> None:
    """Closing the pass early cancels its unfinished tasks on the cluster (best effort)."""
    slow = Evidence(4, "sleep 2; echo $((2 * 3))", "6")
    # 40 x 2 s on 4 worker threads: about 20 s of work if nothing were withdrawn.
    claims = [cli.ClaimLine(n, f"slow-{n}", None, slow) for n in range(1, 41)]
    outcomes = cli.verify_claims(
        claims, cwd=str(EXAMPLES), timeout=30, executor=client.get_executor(pure=False)
    )
    first = next(outcomes)
    assert first.grade.verdict is Verdict.VERIFIED
    outcomes.close()

    def tasks_on_scheduler(dask_scheduler: Any) -> int:
        return len(dask_scheduler.tasks)

    deadline = time.monotonic() + 10
    while client.run_on_scheduler(tasks_on_scheduler) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert client.run_on_scheduler(tasks_on_scheduler) == 0
