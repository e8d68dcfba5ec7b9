"""The bad-input catalog of SPEC section 8, through run() and then through the grader.

Every entry runs a command that tries to break the runner's promises and asserts the fields of
its Result, that the call stayed within its bound, and that no process of it survives. The same
entries are then graded at rung 4: each is ``unrunnable`` with its own reason (or, where the
runner delivered the output whole, graded on that content), never ``contradicted``. The
expectation is chosen so that what the check did print would contain it, so a flag, not missing
text, is what keeps each grade away from ``verified``/``contradicted``.
"""

from __future__ import annotations

import inspect
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import alive, group_members, pids_in, run_descendants, wait_dead

import boundedproc
from boundedproc import Limits, Result, run
from grader import (
    CheckExecution,
    Evidence,
    Reason,
    Verdict,
    grade_for,
    verify_gradeable_evidence,
)

PY = sys.executable
HAS_CONTAIN = "contain" in inspect.signature(run).parameters
needs_contain = pytest.mark.skipif(not HAS_CONTAIN, reason="run() has no `contain` keyword yet")
NO_CONTAIN: dict[str, Any] = {"contain": False} if HAS_CONTAIN else {}

# A recorded check that is not refused on its face (not a constant emitter, no expectation in
# its text): the grade then rests on the execution alone.
CHECK = "sh ./catalog-check.sh"

HUNDRED_MB = 100_000_000
LINE_100MB = f"head -c {HUNDRED_MB} /dev/zero | tr '\\0' x"

# A bounded fork bomb: a binary tree of depth 7 (255 processes), each node printing its pid and
# then becoming a sleeper. As root RLIMIT_NPROC is not enforced, so the tree is capped here to
# keep the machine usable; the deadline and the group kill must end it either way.
FORK_BOMB = r"""
echo bomb-started
b() { echo $BASHPID; if [ "$1" -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & fi; exec sleep 60; }
b 7
"""

# A `setsid` descendant that holds the pipes; the leader waits until it has left the group
# (its pid file exists), prints its pid, and exits.
ESCAPEE = ("setsid sh -c 'echo $$ > \"$0.tmp\" && mv \"$0.tmp\" \"$0\"; exec sleep 30' {f} & "
           "while [ ! -e {f} ]; do sleep 0.01; done; cat {f}; echo parent-done")

BINARY = (
    "import sys\n"
    "sys.stdout.buffer.write(bytes(range(256)) * 4 + b'\\xff\\xfe marker \\xc3\\x28 \\xed\\xa0\\x80')\n"
    "sys.stderr.buffer.write(b'\\x80\\x81 err-marker \\xf0\\x28\\x8c\\x28')\n"
)
BINARY_OUT = bytes(range(256)) * 4 + b"\xff\xfe marker \xc3\x28 \xed\xa0\x80"
BINARY_ERR = b"\x80\x81 err-marker \xf0\x28\x8c\x28"


class Watch:
    """What a catalog entry started: pids and groups to check, and to kill whatever happens."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.groups: list[int] = []
        self.children_before = {p.pid for p in run_descendants()}

    def add(self, result: Result, printed: bytes | str = b"") -> None:
        """Record the run's group and every pid its command printed."""
        if result.pid is not None:
            self.groups.append(result.pid)
        self.pids.extend(pids_in(printed))

    def new_children(self) -> list[int]:
        found = []
        for proc in run_descendants():
            if proc.pid in self.children_before:
                continue
            try:
                if proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc.pid)
            except psutil.NoSuchProcess:
                continue
        return found

    def assert_none_survive(self, within: float = 5.0) -> None:
        """Poll, with a bound, until the printed pids, the groups and new children are gone."""
        assert wait_dead(self.pids, within) == []
        deadline = time.monotonic() + within
        while True:
            left = [m for g in self.groups for m in group_members(g)] + self.new_children()
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert left == []

    def kill_all(self) -> None:
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in self.pids + self.new_children():
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


@pytest.fixture
def watch() -> Iterator[Watch]:
    """A Watch whose processes are all SIGKILLed after the test, pass or fail."""
    w = Watch()
    yield w
    w.kill_all()


def assert_not_started(r: Result, prefix: str, *fragments: str) -> None:
    """Nothing ran: 127, no pid, no output, and runner_error with prefix and fragments."""
    assert not r.spawned and r.pid is None
    assert r.exit_code == boundedproc.SPAWN_FAILURE_EXIT_CODE
    assert r.stdout == b"" and r.stderr == b"" and r.output_bytes == 0
    assert not (r.timed_out or r.cancelled or r.output_truncated or r.escaped)
    assert r.runner_error is not None and r.runner_error.startswith(prefix)
    for fragment in fragments:
        assert fragment in r.runner_error
    assert not r.ok


# ---- the catalog: each entry runs one bad input and asserts its Result ----------------------

def nul_in_argv(w: Watch, tmp: Path) -> Result:
    """A NUL byte in an argument: `not spawned:`, 127, and the command never ran."""
    marker = tmp / "ran"
    r = run(["sh", "-c", f"touch {marker}", "a\0b"], timeout=10)
    assert_not_started(r, "not spawned: ", "NUL")
    assert not marker.exists()
    return r


def nul_in_env(w: Watch, tmp: Path) -> Result:
    """A NUL byte in an environment value or name: `not spawned:`, and nothing ran."""
    marker = tmp / "ran"
    r = run(["sh", "-c", f"touch {marker}"], env={"BP_X": "a\0b"}, timeout=10)
    assert_not_started(r, "not spawned: ", "NUL")
    named = run(["sh", "-c", f"touch {marker}"], env={"BP\0X": "a"}, timeout=10)
    assert_not_started(named, "not spawned: ")
    assert not marker.exists()
    return r


def nul_in_cwd(w: Watch, tmp: Path) -> Result:
    """A NUL byte in cwd: `not spawned:`, and nothing ran."""
    marker = tmp / "ran"
    r = run(["sh", "-c", f"touch {marker}"], cwd=f"{tmp}\0sub", timeout=10)
    assert_not_started(r, "not spawned: ", "NUL")
    assert not marker.exists()
    return r


def line_of_100mb(w: Watch, tmp: Path) -> Result:
    """A 100 MB line under the default 16 MiB cap: the cap kept, every byte counted, exit 0."""
    r = run(["sh", "-c", LINE_100MB], timeout=120)
    w.add(r)
    assert r.spawned and r.runner_error is None
    assert r.exit_code == 0 and not r.timed_out and r.term_signal is None
    assert r.output_truncated and not r.ok
    assert r.output_bytes == HUNDRED_MB
    assert r.stdout == b"x" * (16 * 1024 * 1024)
    assert r.stderr == b""
    return r


def line_of_100mb_kill(w: Watch, tmp: Path) -> Result:
    """A 100 MB line under on_overflow='kill': killed at the cap, 137, SIGKILL, cap kept."""
    r = run(["sh", "-c", LINE_100MB], timeout=120, max_output=1 << 20, on_overflow="kill")
    w.add(r)
    assert r.output_truncated and r.exit_code == 137 and r.term_signal == signal.SIGKILL
    assert r.stdout == b"x" * (1 << 20)
    assert (1 << 20) < r.output_bytes < HUNDRED_MB
    assert not r.timed_out and r.runner_error is None
    return r


def binary_output(w: Watch, tmp: Path) -> Result:
    """Binary and invalid UTF-8 on both streams: kept byte-exact, no flag, exit 0."""
    r = run([PY, "-c", BINARY], timeout=30)
    w.add(r)
    assert r.ok
    assert r.stdout == BINARY_OUT and r.stderr == BINARY_ERR
    assert r.output_bytes == len(BINARY_OUT) + len(BINARY_ERR)
    return r


def binary_output_text(w: Watch, tmp: Path) -> Result:
    """With text=True invalid UTF-8 becomes U+FFFD, everything else is kept."""
    r = run([PY, "-c", BINARY], timeout=30, text=True)
    w.add(r)
    assert r.ok
    assert r.stdout == BINARY_OUT.decode("utf-8", "replace") and "\ufffd" in r.stdout
    assert r.stderr == BINARY_ERR.decode("utf-8", "replace")
    return r


def closed_stdin(w: Watch, tmp: Path) -> Result:
    """A child that closes stdin before reading a 1 MB payload: `stdin not delivered:`."""
    r = run(["sh", "-c", "exec 0<&-; echo done; exit 3"], stdin=b"p" * 1_000_000, timeout=30)
    w.add(r)
    assert r.spawned and r.exit_code == 3 and r.stdout == b"done\n"
    assert not r.stdin_delivered
    assert r.runner_error is not None and r.runner_error.startswith("stdin not delivered: ")
    assert not r.timed_out and not r.ok
    return r


def closed_stdin_python(w: Watch, tmp: Path) -> Result:
    """A Python child that os.close(0)s with a payload pending: reported, not raised."""
    code = "import os; os.close(0); print('closed', flush=True)"
    r = run([PY, "-c", code], stdin=b"q" * 1_000_000, timeout=30)
    w.add(r)
    assert r.exit_code == 0 and r.stdout == b"closed\n"
    assert not r.stdin_delivered and r.runner_error.startswith("stdin not delivered: ")
    return r


def closed_stdin_no_payload(w: Watch, tmp: Path) -> Result:
    """`exec 0<&-` with no payload: nothing was owed, so the run is ok."""
    r = run(["sh", "-c", "exec 0<&-; echo $((6*7))"], timeout=30)
    w.add(r)
    assert r.ok and r.stdout == b"42\n" and r.stdin_delivered
    return r


def unread_stdin(w: Watch, tmp: Path) -> Result:
    """A child that exits without reading a 1 MB payload keeps its status; not delivered."""
    r = run(["sh", "-c", "sleep 0.1; echo done"], stdin=b"u" * 1_000_000, timeout=30)
    w.add(r)
    assert r.spawned and r.exit_code == 0 and r.stdout == b"done\n"
    assert not r.stdin_delivered and r.runner_error.startswith("stdin not delivered: ")
    assert not r.timed_out
    return r


def unread_stdin_held_open(w: Watch, tmp: Path) -> Result:
    """A child that holds an unread stdin open never blocks the deadline."""
    r = run(["sh", "-c", "echo $$; echo done; exec sleep 30"], stdin=b"u" * 1_000_000,
            timeout=0.5)
    w.add(r, r.stdout)
    assert r.timed_out and r.exit_code == boundedproc.DEADLINE_EXIT_CODE
    assert not r.stdin_delivered
    assert r.duration < 0.5 + 2.0 + 5
    return r


def ignores_sigterm(w: Watch, tmp: Path) -> Result:
    """A group that ignores SIGTERM is SIGKILLed once kill_grace has passed."""
    script = "trap '' TERM; echo $$; (trap '' TERM; sleep 30) & echo $!; echo ready; wait"
    r = run(["sh", "-c", script], timeout=0.3, kill_grace=0.7)
    w.add(r, r.stdout)
    assert r.timed_out and r.exit_code == boundedproc.DEADLINE_EXIT_CODE
    assert r.term_signal == signal.SIGKILL
    assert r.duration >= 0.3 + 0.7 - 0.05
    assert r.duration < 0.3 + 0.7 + 2.0 + 5
    assert b"ready" in r.stdout and r.runner_error is None
    return r


def fork_bomb(w: Watch, tmp: Path) -> Result:
    """A fork bomb under max_processes and a 2 s deadline: ended, and every node is dead."""
    r = run(["bash", "-c", FORK_BOMB], timeout=2, limits=Limits(max_processes=64))
    w.add(r, r.stdout)
    assert r.spawned and r.timed_out and r.exit_code == boundedproc.DEADLINE_EXIT_CODE
    assert r.stdout.startswith(b"bomb-started\n")
    assert r.duration < 2 + 2.0 + 10
    return r


def fork_bomb_uncontained(w: Watch, tmp: Path) -> Result:
    """The same fork bomb without containment: the group kill alone leaves no node alive."""
    r = run(["bash", "-c", FORK_BOMB], timeout=2, limits=Limits(max_processes=64), **NO_CONTAIN)
    w.add(r, r.stdout)
    assert r.spawned and r.timed_out and r.exit_code == boundedproc.DEADLINE_EXIT_CODE
    assert r.stdout.startswith(b"bomb-started\n")
    return r


def setsid_escapee_uncontained(w: Watch, tmp: Path) -> Result:
    """contain=False: a `setsid` descendant holding the pipes sets escaped within drain_grace."""
    r = run(["sh", "-c", ESCAPEE.format(f=tmp / "pid")], timeout=20, drain_grace=0.5,
            **NO_CONTAIN)
    w.add(r, r.stdout)
    assert r.escaped and not r.timed_out and not r.ok
    assert r.exit_code == 0 and b"parent-done" in r.stdout
    assert r.duration < 10
    # It did escape: it is still running (the Watch kills it after the test).
    escapee = pids_in(r.stdout)[0]
    assert alive(escapee)
    w.pids.remove(escapee)
    os.kill(escapee, signal.SIGKILL)
    assert wait_dead([escapee]) == []
    return r


def setsid_escapee_contained(w: Watch, tmp: Path) -> Result:
    """Default containment: the `setsid` descendant is killed, so escaped stays False."""
    r = run(["sh", "-c", ESCAPEE.format(f=tmp / "pid")], timeout=20, drain_grace=0.5)
    w.add(r, r.stdout)
    assert not r.escaped and r.ok and b"parent-done" in r.stdout
    assert r.duration < 10
    return r


def job_control_background(w: Watch, tmp: Path) -> Result:
    """Default containment: a `set -m` job in a process group of its own, pipes closed, dies."""
    r = run(["bash", "-c", "set -m; sleep 60 >/dev/null 2>&1 & echo $!; echo $((6*7))"],
            timeout=20, drain_grace=0.5)
    w.add(r, r.stdout.split(b"\n")[0])  # the job's pid, not the 42
    assert r.ok and not r.escaped and r.stdout.endswith(b"\n42\n")
    return r


def missing_bash(w: Watch, tmp: Path) -> Result:
    """A shell that does not exist: `spawn failed: ENOENT` naming it, 127."""
    r = run("echo $((6*7))", shell="bp-no-such-bash", timeout=10)
    assert_not_started(r, "spawn failed: ", "ENOENT", "bp-no-such-bash")
    return r


def bash_not_on_path(w: Watch, tmp: Path) -> Result:
    """bash looked up on an empty PATH of the child's environment: ENOENT, 127."""
    r = run(["bash", "-c", "echo $((6*7))"], env={"PATH": str(tmp)}, env_mode="replace",
            timeout=10)
    assert_not_started(r, "spawn failed: ", "ENOENT", "bash")
    return r


def cwd_is_a_file(w: Watch, tmp: Path) -> Result:
    """A cwd that is a regular file: `spawn failed: ENOTDIR`, 127, nothing ran."""
    afile = tmp / "a-file"
    afile.write_text("not a directory\n")
    marker = tmp / "ran"
    r = run(["sh", "-c", f"touch {marker}"], cwd=afile, timeout=10)
    assert_not_started(r, "spawn failed: ", "ENOTDIR")
    assert not marker.exists()
    return r


def argv_over_arg_max(w: Watch, tmp: Path) -> Result:
    """Arguments totalling more than ARG_MAX: `spawn failed: E2BIG`, 127."""
    chunk = "y" * 100_000  # each under MAX_ARG_STRLEN; together over the limit
    count = os.sysconf("SC_ARG_MAX") // len(chunk) + 2
    r = run(["true", *[chunk] * count], timeout=10)
    assert_not_started(r, "spawn failed: ", "E2BIG")
    return r


def one_argument_over_the_limit(w: Watch, tmp: Path) -> Result:
    """One argument over MAX_ARG_STRLEN (128 KiB): `spawn failed: E2BIG`, 127."""
    r = run(["true", "y" * 200_000], timeout=10)
    assert_not_started(r, "spawn failed: ", "E2BIG")
    return r


@dataclass(frozen=True)
class Entry:
    """One catalog entry and how the grader must judge it."""

    scenario: Callable[[Watch, Path], Result]
    expect: str
    reason: Reason | None  # None: delivered whole, graded on content (verified)
    marks: tuple[Any, ...] = ()

    def param(self) -> Any:
        return pytest.param(self, id=self.scenario.__name__, marks=self.marks)


CATALOG = [
    Entry(nul_in_argv, "42", Reason.RUNNER_FAILURE),
    Entry(nul_in_env, "42", Reason.RUNNER_FAILURE),
    Entry(nul_in_cwd, "42", Reason.RUNNER_FAILURE),
    Entry(line_of_100mb, "xxxxxxxx", Reason.OUTPUT_TRUNCATED),
    Entry(line_of_100mb_kill, "xxxxxxxx", Reason.OUTPUT_TRUNCATED),
    Entry(binary_output, "marker", None),
    Entry(binary_output_text, "marker", None),
    Entry(closed_stdin, "done", Reason.RUNNER_FAILURE),
    Entry(closed_stdin_python, "closed", Reason.RUNNER_FAILURE),
    Entry(closed_stdin_no_payload, "42", None),
    Entry(unread_stdin, "done", Reason.RUNNER_FAILURE),
    Entry(unread_stdin_held_open, "done", Reason.DEADLINE),
    Entry(ignores_sigterm, "ready", Reason.DEADLINE),
    Entry(fork_bomb, "bomb-started", Reason.DEADLINE),
    Entry(fork_bomb_uncontained, "bomb-started", Reason.DEADLINE),
    Entry(setsid_escapee_uncontained, "parent-done", Reason.ESCAPED),
    Entry(setsid_escapee_contained, "parent-done", None, (needs_contain,)),
    Entry(job_control_background, "42", None, (needs_contain,)),
    Entry(missing_bash, "42", Reason.RUNNER_FAILURE),
    Entry(bash_not_on_path, "42", Reason.RUNNER_FAILURE),
    Entry(cwd_is_a_file, "42", Reason.RUNNER_FAILURE),
    Entry(argv_over_arg_max, "42", Reason.RUNNER_FAILURE),
    Entry(one_argument_over_the_limit, "42", Reason.RUNNER_FAILURE),
]


@pytest.mark.parametrize("entry", [e.param() for e in CATALOG])
def test_catalog_result(entry: Entry, watch: Watch, tmp_path: Path) -> None:
    """Each bad input of SPEC 8 gives its flag or runner_error, and no process of it survives."""
    entry.scenario(watch, tmp_path)
    watch.assert_none_survive()


@pytest.mark.parametrize("entry", [e.param() for e in CATALOG])
def test_catalog_through_grader(entry: Entry, watch: Watch, tmp_path: Path) -> None:
    """Graded at rung 4, each bad input is unrunnable with its reason, never contradicted."""
    result = entry.scenario(watch, tmp_path)
    watch.assert_none_survive()
    execution = CheckExecution.from_result(result)
    grade = grade_for(Evidence(rung=4, check=CHECK, expect=entry.expect), execution)
    assert grade.verdict is not Verdict.CONTRADICTED
    if entry.reason is None:
        assert grade.verdict is Verdict.VERIFIED
    else:
        assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, entry.reason)
        if entry.reason is not Reason.RUNNER_FAILURE:
            # The flag, not missing text, decided it: the fragment did hold the expectation.
            assert entry.expect in f"{execution.stdout}\n{execution.stderr}"


def test_catalog_has_every_section_8_input() -> None:
    """The catalog names an entry for each bad input SPEC section 8 lists."""
    names = {e.scenario.__name__ for e in CATALOG}
    for needed in ("nul_in_argv", "nul_in_env", "nul_in_cwd", "line_of_100mb", "binary_output",
                   "closed_stdin", "unread_stdin", "ignores_sigterm", "fork_bomb",
                   "setsid_escapee_uncontained", "setsid_escapee_contained", "missing_bash",
                   "cwd_is_a_file", "argv_over_arg_max"):
        assert needed in names


def test_not_spawned_without_payload_owes_no_stdin() -> None:
    """A NUL-byte refusal with no payload reports stdin_delivered, as a spawn failure does."""
    refused = run(["true", "a\0b"], timeout=10)
    failed = run(["/bp/no/such/program"], timeout=10)
    assert failed.stdin_delivered
    assert refused.stdin_delivered


def test_not_started_with_payload_is_not_delivered() -> None:
    """With a payload, a run that never started reports stdin_delivered=False."""
    assert not run(["true", "a\0b"], stdin=b"x", timeout=10).stdin_delivered
    assert not run(["/bp/no/such/program"], stdin=b"x", timeout=10).stdin_delivered


# ---- the same inputs through verify_gradeable_evidence: parse, run, grade -------------------

VERIFY_CASES = [
    pytest.param("cat data\0.txt", "42", {}, Reason.RUNNER_FAILURE, id="nul-in-check"),
    pytest.param("wc -c " + "y" * 200_000, "42", {}, Reason.RUNNER_FAILURE, id="e2big-check"),
    pytest.param(LINE_100MB, "xxxxxxxx", {}, Reason.OUTPUT_TRUNCATED, id="100mb-line"),
    pytest.param("trap '' TERM; echo $((6*7)); sleep 30", "42", {"timeout": 0.5},
                 Reason.DEADLINE, id="ignores-sigterm"),
    pytest.param("echo $((6*7))" + FORK_BOMB, "42", {"timeout": 2}, Reason.DEADLINE,
                 id="fork-bomb"),
    pytest.param("wc -c < /etc/hostname", "42", {"bash": "bp-no-such-bash"},
                 Reason.RUNNER_FAILURE, id="missing-bash"),
    pytest.param("wc -c < /etc/hostname", "42", {"cwd": "FILE"}, Reason.RUNNER_FAILURE,
                 id="cwd-is-a-file"),
    pytest.param("exec 0<&-; head -c 9 /dev/zero | tr '\\0' 7", "777", {}, None,
                 id="closed-stdin"),
]


@pytest.mark.parametrize(("check", "expect", "options", "reason"), VERIFY_CASES)
def test_verify_gradeable_evidence_catalog(check: str, expect: str, options: dict[str, Any],
                                           reason: Reason | None, tmp_path: Path) -> None:
    """verify_gradeable_evidence grades each bad input unrunnable with its reason, never raises."""
    afile = tmp_path / "a-file"
    afile.write_text("x\n")
    options = dict(options)
    cwd = afile if options.pop("cwd", None) == "FILE" else tmp_path
    before = {p.pid for p in run_descendants()}
    env = {"PATH": os.defpath}
    verified = verify_gradeable_evidence(Evidence(rung=4, check=check, expect=expect),
                                         cwd=cwd, env=env, **options)
    grade = verified.grade
    assert grade.verdict is not Verdict.CONTRADICTED
    if reason is None:
        assert grade.verdict is Verdict.VERIFIED
    else:
        assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, reason)
    deadline = time.monotonic() + 5
    while True:
        left = [p.pid for p in run_descendants()
                if p.pid not in before and alive(p.pid)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


@needs_contain
def test_verify_kills_a_setsid_escapee(tmp_path: Path, watch: Watch) -> None:
    """A check that leaves a `setsid` sleeper behind is graded on its output and the sleeper dies."""
    # A relative pid file (the check runs in tmp_path): a path in the check's text could hold
    # "42" (pytest-of-root/pytest-42/), and the check would be refused as self-certifying.
    check = ESCAPEE.format(f="pid").replace("echo parent-done", "echo $((6*7))")
    verified = verify_gradeable_evidence(Evidence(rung=4, check=check, expect="42"),
                                         cwd=tmp_path, env={"PATH": os.defpath}, timeout=20)
    assert verified.execution is not None
    escapee, answer = pids_in(verified.execution.stdout)
    watch.pids.append(escapee)
    assert answer == 42
    assert verified.grade.verdict is Verdict.VERIFIED
    watch.assert_none_survive()
