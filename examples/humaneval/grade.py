"""Grade the bundled problems the way a code-eval harness would: one bounded run per candidate.

    python examples/humaneval/grade.py [--jobs N] [--timeout S] [--user USER --python PY]

Each problem of problems.jsonl (HumanEval's shape: prompt, candidate completion, test with a
``check(candidate)`` function, entry point) becomes one program, fed on stdin to ``python -I -``
in a fresh private directory (``tmpdir=True``) under resource limits. ``run_many`` runs them
``--jobs`` at a time, each as a ``Job`` with its own stdin; a problem passes when its program
exits 0 and the runner reports nothing wrong. Exit status: 0 when every problem was graded
(a failing candidate is a result, not an error), 2 when a process outlived its run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

from boundedproc import Job, Limits, Result, run_many

HERE = Path(__file__).resolve().parent
#: What the hostile candidate leaves behind, so the report can look for survivors.
SLEEPER = ["sleep", "86399"]


def program(problem: dict[str, str]) -> str:
    """The whole program for one problem: the prompt, the completion, the test, the call."""
    return (problem["prompt"] + problem["candidate"] + "\n\n" + problem["test"]
            + f"\n\ncheck({problem['entry_point']})\n")


def verdict(result: Result[str]) -> str:
    """``passed``, or ``failed: why`` read from the result's fields (never from its prose)."""
    if result.ok:
        return "passed"
    if result.timed_out:
        return "failed: timed out"
    if result.runner_error is not None:
        return f"failed: {result.runner_error}"
    if result.term_signal is not None:
        return f"failed: killed by signal {result.term_signal}"
    if result.output_truncated:
        return "failed: printed past the output cap"
    if result.escaped:
        return "failed: a process escaped with its output"
    last = (result.stderr.strip().splitlines() or [f"exit {result.exit_code}"])[-1]
    return f"failed: exit {result.exit_code}: {last}"


def survivors(token: str) -> list[int]:
    """Pids of processes running SLEEPER's command line with ``token`` in their environment:
    this pass's, not another's running beside it (Linux /proc; empty elsewhere)."""
    found = []
    wanted = ("\0".join(SLEEPER) + "\0").encode()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                if (Path("/proc", entry, "cmdline").read_bytes() == wanted
                        and token.encode() in Path("/proc", entry, "environ").read_bytes()
                        .split(b"\0")):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def main(argv: list[str] | None = None) -> int:
    """Grade problems.jsonl and print one line per problem; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2, help="candidates run at once")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per candidate")
    parser.add_argument("--user", help="run candidates as this user (as root; e.g. nobody)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter for the candidates (one --user can execute)")
    args = parser.parse_args(argv)

    problems = [json.loads(line) for line in (HERE / "problems.jsonl").read_text().splitlines()
                if line.strip()]
    # RLIMIT_NPROC counts every process of the candidate's user: only worth setting for a user
    # of its own (and not enforced for root at all, so --user is what makes it hold there).
    limits = Limits(cpu_seconds=2, memory_bytes=1 << 30,
                    max_processes=64 if args.user else None)
    jobs = (Job([args.python, "-I", "-"], stdin=program(p)) for p in problems)
    started = time.monotonic()
    passed = 0
    # Marks this pass's processes, so that survivors() counts only what this pass left.
    token = f"BP_EXAMPLE_PASS={secrets.token_hex(8)}"
    name, value = token.split("=")
    results = run_many(jobs, jobs=args.jobs, text=True, tmpdir=True, limits=limits,
                       timeout=args.timeout, env={"PATH": os.defpath, name: value},
                       env_mode="replace",
                       user=args.user, max_output=1 << 20)
    for problem, result in zip(problems, results):
        line = verdict(result)
        passed += line == "passed"
        print(f"{problem['task_id']:6} {problem['entry_point']:14} {line}"
              f"  ({result.duration:.2f} s; {problem['note']})")
    left = survivors(token)
    print(f"passed {passed} of {len(problems)} in {time.monotonic() - started:.2f} s; "
          f"processes left behind: {len(left)}")
    return 2 if left else 0


if __name__ == "__main__":
    sys.exit(main())
