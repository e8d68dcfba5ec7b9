"""run_many on the core's own threads (csrc/batch.c, ``_native.Batch``).

A plain command of ``run_many`` runs on a thread of the C core with a supervisor
that thread keeps; Python only prepares it and builds its result.  These tests
pin what that path must keep of ``run()``'s contract: containment run after
run, supervisors replaced when they die, fork safety, the caller's death, and
the switch to Python workers for a command that needs Python (``on_output``,
``tmpdir``).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import (
    TAKE_FDS,
    alive,
    as_nobody,
    batch_threads,
    fork_with_threads,
    importable_env,
    pids_in,
    wait_dead,
    wait_for,
    wait_for_pids,
)

from boundedproc import Job, _native, run_many

PY = sys.executable

pytestmark = pytest.mark.skipif(not _native.CONTAIN_SUPPORTED,
                                reason="containment needs Linux with a subreaper")

# Each prints the supervisor's pid ($PPID of a contained leader) and then the pid
# of a process it leaves behind.
CATALOG = [
    "echo $PPID; setsid sleep 30 & echo $!",
    "echo $PPID; (sleep 30 & echo $!) ; true",
    ("echo $PPID; f=$(mktemp); (setsid sh -c \"sleep 30 & echo \\$! > $f; wait\" &);"
     " while [ ! -s $f ]; do sleep 0.005; done; cat $f; rm -f $f"),
    "echo $PPID; sleep 30 & echo $!",
]


def python_threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def core_workers() -> int:
    """The batch worker threads of this process."""
    return len(batch_threads())


def test_plain_commands_run_on_core_threads_not_python_ones() -> None:
    """No Python worker thread exists while plain commands run; the batch's threads are
    the process's own (named bp-batch) and are gone once parked for PARK_NS after the
    iterator is done (batch.c)."""
    before_py = python_threads()
    assert core_workers() == 0
    seen_py: set[str] = set()
    seen_os = 0
    for r in run_many([["sh", "-c", "sleep 0.2; echo $$"]] * 6, jobs=3):
        assert r.ok, r
        seen_py |= python_threads()
        seen_os = max(seen_os, core_workers())
    assert seen_py == before_py
    assert seen_os == 3  # the core's workers, one a job
    deadline = time.monotonic() + 5
    while core_workers() > 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert core_workers() == 0


@pytest.mark.parametrize("jobs", [1, 8])
def test_catalog_200_runs_reuse_supervisors_and_leave_nothing(jobs: int) -> None:
    """200 contained runs of the catalog: each escapee dead when its result is yielded,
    one supervisor per worker reused throughout, none of them left afterwards."""
    sups: set[int] = set()
    errors: list[str] = []
    cmds = [["sh", "-c", CATALOG[i % len(CATALOG)]] for i in range(200)]
    for r in run_many(cmds, jobs=jobs, timeout=10):
        pids = pids_in(r.stdout)
        if r.exit_code != 0 or len(pids) != 2:
            errors.append(f"{r.args}: {r.exit_code} {r.stdout!r} {r.runner_error}")
            continue
        sups.add(pids[0])
        if alive(pids[1]):
            # What the result said of it, and whether it was only slow to die.
            errors.append(f"{r.args}: escapee {pids[1]} alive after its run (escaped="
                          f"{r.escaped}, runner_error={r.runner_error!r}, duration="
                          f"{r.duration:.3f}); "
                          f"{'dead' if wait_dead([pids[1]], 1.0) == [] else 'alive'} 1 s later")
    assert errors == []
    assert 1 <= len(sups) <= jobs
    assert wait_dead(sups) == []  # the workers freed them


def test_supervisor_sigkilled_between_runs_is_replaced(tmp_path: Path) -> None:
    """jobs=1: the first run reports its supervisor, which is SIGKILLed while the worker
    waits for the next command; the next runs start a new one and succeed."""
    f = tmp_path / "sup"

    def source() -> Iterator[list[str]]:
        yield ["sh", "-c", f"echo $PPID > {f}.tmp; mv {f}.tmp {f}"]
        (sup,) = wait_for_pids(f)
        time.sleep(0.1)  # the first run is over: the worker is idle
        os.kill(sup, signal.SIGKILL)
        time.sleep(0.1)
        yield ["sh", "-c", "echo $PPID"]
        yield ["echo", "again"]

    first, second, third = run_many(source(), jobs=1)
    assert first.ok and second.ok and third.ok, (first, second, third)
    (old,) = wait_for_pids(f)
    (new,) = pids_in(second.stdout)
    assert new != old
    assert third.stdout == b"again\n"


def test_supervisor_killed_during_a_run_fails_that_run_only() -> None:
    """A command that SIGKILLs its supervisor mid-run: that result says runner failed and
    its group is dead; the runs after it on the same worker succeed."""
    cmds = [["echo", "before"],
            ["sh", "-c", "echo $$; sleep 30 & echo $!; sleep 0.1; kill -9 $PPID; wait"],
            ["echo", "after"], ["sh", "-c", "echo $PPID"]]
    before, killed, after, last = run_many(cmds, jobs=1, timeout=10)
    assert before.ok and after.ok and last.ok, (before, after, last)
    assert killed.runner_error is not None and killed.runner_error.startswith("runner failed")
    assert killed.exit_code != 0 and killed.spawned
    assert wait_dead(pids_in(killed.stdout), within=1.5) == []


@fork_with_threads
def test_fork_while_a_batch_runs() -> None:
    """os.fork() while run_many has runs in flight: the child runs contained commands on
    fresh supervisors and cannot go on with the parent's iterator; the parent's iterator
    and supervisors are untouched."""
    it = run_many([["sh", "-c", "sleep 0.3; echo $PPID"]] * 8, jobs=2, timeout=10)
    first = next(it)
    assert first.ok
    parent_sups = set(pids_in(first.stdout))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            res = list(run_many([["sh", "-c", "echo $PPID; setsid sleep 30 & echo $!"]] * 4,
                                jobs=2))
            ok = all(x.ok for x in res)
            pids = [pids_in(x.stdout) for x in res]
            sups = sorted({p[0] for p in pids})
            escaped = [p[1] for p in pids if alive(p[1])]
            try:
                next(it)
                went_on = "yes"
            except RuntimeError as err:
                went_on = str(err)
            os.write(w, json.dumps({"ok": ok, "sups": sups, "escaped": escaped,
                                    "went_on": went_on}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = json.loads(os.read(r, 65536))
    os.close(r)
    os.waitpid(pid, 0)
    assert data["ok"] and data["escaped"] == []
    assert not set(data["sups"]) & parent_sups
    assert "forked child" in data["went_on"]
    rest = list(it)
    assert len(rest) == 7 and all(x.ok for x in rest), rest
    assert all(alive(p) for p in parent_sups) or rest  # used again by the parent's runs
    assert {p for x in rest for p in pids_in(x.stdout)} & parent_sups


CALLER = """
from boundedproc import run_many
cmds = [["sh", "-c", "setsid sleep 60 & echo $! > {f}.{{i}}.tmp; echo $$ >> {f}.{{i}}.tmp; "
         "mv {f}.{{i}}.tmp {f}.{{i}}; sleep 60"]]
for r in run_many([["sh", "-c", c[2].replace("{{i}}", str(i))] for i, c in enumerate(cmds * 3)],
                  jobs=3, timeout=120):
    print(r, flush=True)
"""


def test_caller_sigkill_kills_every_run_in_flight(tmp_path: Path, reaper: list[int]) -> None:
    """The caller of run_many SIGKILLed with 3 runs in flight on the core's threads: every
    leader and every setsid escapee dies within about a second."""
    f = tmp_path / "pids"
    code = CALLER.format(f=f)
    caller = subprocess.Popen([PY, "-c", code], env=importable_env(),
                              stdout=subprocess.DEVNULL)
    try:
        pids = [p for i in range(3) for p in wait_for_pids(Path(f"{f}.{i}"))]
        reaper.extend(pids)
        assert len(pids) == 6 and all(alive(p) for p in pids)
        caller.kill()
        caller.wait(10)
        assert wait_dead(pids, within=3.0) == []
    finally:
        caller.kill()


def test_many_calls_leave_no_process_or_thread_behind() -> None:
    """100 run_many calls of 2 runs each: the process's children and threads return to
    where they were (each call takes up the workers the one before parked; the last ones
    free their supervisors and end once parked for PARK_NS)."""
    me = psutil.Process()
    start_children = len(me.children(recursive=True))
    start_threads = me.num_threads()
    for _ in range(100):
        assert all(r.ok for r in run_many([["true"], ["true"]], jobs=2))
    deadline = time.monotonic() + 5
    while (len(me.children(recursive=True)) > start_children
           or me.num_threads() > start_threads) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(me.children(recursive=True)) <= start_children
    assert me.num_threads() <= start_threads


PARK_S = 2.0  # batch.c's PARK_NS
# A contained leader's parent is its supervisor.  Each run lasts long enough that every
# worker of a call takes one up, however late the scheduler wakes it.
SUPERVISOR = ["sh", "-c", "echo $PPID; sleep 0.2"]


def supervisors_of(jobs: int, n: int = 6, **kw: object) -> set[int]:
    results = list(run_many([SUPERVISOR] * n, jobs=jobs, **kw))
    assert all(r.ok for r in results), results
    return {p for r in results for p in pids_in(r.stdout)}


def test_a_run_many_call_takes_up_the_supervisors_the_call_before_left() -> None:
    """A call of a few commands does not start a supervisor for each of its jobs: the
    next call's workers are the ones the last call parked, supervisors and all."""
    first = supervisors_of(3)
    assert 1 <= len(first) <= 3
    assert supervisors_of(3) == first
    assert supervisors_of(2) <= first


def test_parked_workers_end_after_their_idle_time() -> None:
    """Parked workers wait PARK_NS to be taken up, then end and free their supervisors."""
    time.sleep(PARK_S + 0.5)  # the workers earlier tests parked are gone
    before = core_workers()  # 0, unless an earlier test left an iterator open
    sups = supervisors_of(3)
    assert core_workers() == before + 3 and all(alive(p) for p in sups)  # parked
    assert wait_dead(sups, within=PARK_S + 3) == []
    assert wait_for(lambda: core_workers() == before, 3)


def test_a_parked_supervisor_killed_from_outside_is_not_taken_up() -> None:
    """A parked worker's supervisor SIGKILLed: the next call finds it dead (its socket at
    EOF) and starts another; every run succeeds."""
    first = supervisors_of(2)
    victim = min(first)
    os.kill(victim, signal.SIGKILL)
    assert wait_dead([victim]) == []
    second = supervisors_of(2)
    assert victim not in second
    assert second & first  # the other one was taken up


def test_parked_supervisors_killed_just_before_the_next_call_cost_no_run() -> None:
    """Parked workers' supervisors SIGKILLed from outside right before the next call
    takes them up (their deaths not yet seen): the runs handed to them never started,
    and came back spawn failures; each now runs again on a fresh supervisor."""
    bad = []
    for _ in range(20):
        supervisors = supervisors_of(2, n=2)
        for sup in supervisors:
            os.kill(sup, signal.SIGKILL)
        results = list(run_many([["echo", "again"]] * 2, jobs=2))
        bad += [r.runner_error for r in results if not (r.ok and r.stdout == b"again\n")]
    assert bad == []


@fork_with_threads
def test_a_forked_child_never_takes_up_its_parents_parked_workers() -> None:
    """os.fork() after workers were parked: they end before the fork (their supervisors
    reaped by the parent, not left to init), the child's run_many starts its own
    supervisors (none of the parent's), and the parent's next call starts new ones."""
    parked = supervisors_of(2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            got = sorted(supervisors_of(2))
            os.write(w, json.dumps(got).encode())
        finally:
            os._exit(0)
    os.close(w)
    child = set(json.loads(os.read(r, 65536)))
    os.close(r)
    os.waitpid(pid, 0)
    assert child and not child & parked
    assert not any(psutil.pid_exists(p) for p in parked)  # ended and reaped before the fork
    again = supervisors_of(2)
    assert again and not again & parked


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_parked_worker_is_not_taken_up_by_a_caller_whose_cpu_mask_changed() -> None:
    """A parked worker's supervisor hands its commands the mask it started with: a caller
    whose mask changed since gets new workers, and its commands get its new mask."""
    parked = supervisors_of(2)
    old = os.sched_getaffinity(0)
    one = min(old)
    os.sched_setaffinity(0, {one})
    try:
        mask = "echo $PPID; grep Cpus_allowed_list /proc/self/status"
        results = list(run_many([["sh", "-c", mask]] * 4, jobs=2))
    finally:
        os.sched_setaffinity(0, old)
    assert all(r.ok for r in results), results
    assert not {pids_in(r.stdout)[0] for r in results} & parked
    assert all(r.stdout.split()[-1] == str(one).encode() for r in results), results


def test_a_parked_worker_outlives_the_thread_whose_call_parked_it() -> None:
    """Workers parked by a call in a thread that then ended serve the next call of
    another thread (a supervisor's parent-death signal is its worker's, not the caller's)."""
    got: list[set[int]] = []
    t = threading.Thread(target=lambda: got.append(supervisors_of(2)))
    t.start()
    t.join(30)
    (parked,) = got
    time.sleep(0.2)
    assert all(alive(p) for p in parked)
    assert supervisors_of(2) == parked


# A child subreaper that runs SUBJECT and reports which of the supervisors SUBJECT printed
# it had to reap itself: a supervisor left alive at SUBJECT's exit is reparented to it.
SUBREAPER = """
import ctypes, json, os, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
out = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True,
                     timeout=60, check=True)
sups = set(json.loads(out.stdout))
adopted = set()
until = time.monotonic() + 2
while time.monotonic() < until:
    try:
        pid, _ = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid:
        adopted.add(pid)
    else:
        time.sleep(0.02)
print(json.dumps({"sups": sorted(sups), "adopted": sorted(adopted & sups)}))
"""
SUBJECT = """
import json
from boundedproc import run_many
rs = list(run_many([["sh", "-c", "echo $PPID"]] * 4, jobs=2))
print(json.dumps(sorted({int(r.stdout) for r in rs})))
"""


def test_parked_supervisors_are_reaped_before_the_process_exits() -> None:
    """At exit, parked workers end and free their supervisors: none is left to be reaped
    by init (or by whatever child subreaper is above the process)."""
    out = subprocess.run([PY, "-c", SUBREAPER, SUBJECT], capture_output=True, text=True,
                         timeout=120, env=importable_env(), check=False)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["sups"] and data["adopted"] == [], data


def test_a_job_that_needs_python_switches_to_python_workers() -> None:
    """Plain commands, then a Job with on_output, then plain ones: every result in input
    order; the callback runs in a Python worker thread, never the consumer's."""
    callers: list[str] = []

    def on_output(stream: int, chunk: bytes) -> None:
        callers.append(threading.current_thread().name)

    cmds: list[object] = [["echo", str(i)] for i in range(5)]
    cmds.insert(3, Job(["echo", "job"], on_output=on_output))
    results = list(run_many(cmds, jobs=2))  # type: ignore[arg-type]
    assert [r.stdout for r in results] == [b"0\n", b"1\n", b"2\n", b"job\n", b"3\n", b"4\n"]
    assert callers and threading.current_thread().name not in callers
    assert all(name.startswith("boundedproc-many") for name in callers)


def test_cancelled_before_its_turn_spawns_nothing() -> None:
    """A caller's switch set while commands wait for a worker: those are not spawned."""
    from boundedproc import Cancel

    switch = Cancel()
    results = []
    for r in run_many([["sleep", "0.3"]] * 6, jobs=1, cancel=switch):
        results.append(r)
        switch.cancel()
    assert results[0].ok
    assert all(r.cancelled and r.exit_code == 137 for r in results[1:])
    assert not results[-1].spawned and results[-1].runner_error is None


def test_supervisor_refused_under_run_many(tmp_path: Path) -> None:
    """The supervisor program cannot be executed: with contain=True each run is a spawn
    failure naming it; with contain=None it warns once and the runs go uncontained."""
    blocked = tmp_path / "_bp_supervisor"
    blocked.write_bytes(b"not a program")
    blocked.chmod(0o644)
    script = textwrap.dedent(f"""
        import json, warnings
        from boundedproc import _native, run_many
        _native.SUPERVISOR_PATH = {str(blocked)!r}
        explicit = [[r.spawned, r.exit_code, r.runner_error]
                    for r in run_many([["echo", "hi"]] * 3, jobs=2, contain=True)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            default = [[r.ok, r.stdout.decode()]
                       for r in run_many([["echo", "hi"]] * 3, jobs=2)]
        print(json.dumps({{"explicit": explicit, "default": default,
                          "warned": [str(w.message) for w in caught]}}))
    """)
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60,
                         env=importable_env(), check=False)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for spawned, code, error in data["explicit"]:
        assert (spawned, code) == (False, 127)
        assert error.startswith("spawn failed: EACCES") and "supervisor program" in error
    assert data["default"] == [[True, "hi\n"]] * 3
    assert len(data["warned"]) == 1 and "containment is off" in data["warned"][0]


@fork_with_threads
@pytest.mark.parametrize("python_workers", [False, True])
def test_a_forked_child_closing_the_iterator_leaves_the_parents_runs(python_workers: bool) -> None:
    """The child of os.fork() closes its copy of a run_many iterator (as its exit's clean-up
    would): the parent's runs in flight are not cancelled (the switch's pipe is shared)."""
    extra = {"on_output": lambda stream, chunk: None} if python_workers else {}
    it = run_many([["sh", "-c", "sleep 0.4; echo done"]] * 6, jobs=3, timeout=10, **extra)
    first = next(it)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only closes its copy
        try:
            it.close()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    rest = list(it)
    assert [r.stdout for r in [first, *rest]] == [b"done\n"] * 6, rest
    assert not any(r.cancelled for r in rest)


def test_supervisor_refused_warns_once_with_python_workers(tmp_path: Path) -> None:
    """The same refusal met by several Python workers at once (on_output): one warning."""
    blocked = tmp_path / "_bp_supervisor"
    blocked.write_bytes(b"not a program")
    blocked.chmod(0o644)
    script = textwrap.dedent(f"""
        import json, warnings
        from boundedproc import _native, run_many
        _native.SUPERVISOR_PATH = {str(blocked)!r}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = [r.ok for r in run_many([["sleep", "0.1"]] * 8, jobs=4,
                                         on_output=lambda s, c: None)]
        print(json.dumps({{"ok": ok, "warned": len(caught)}}))
    """)
    out = subprocess.run([PY, "-c", script], capture_output=True, text=True, timeout=60,
                         env=importable_env(), check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"ok": [True] * 8, "warned": 1}


@pytest.mark.parametrize("contain", [True, False])
def test_core_threads_block_signals_but_their_commands_do_not(contain: bool) -> None:
    """The core's threads block every signal; a command they start has an empty mask and
    no ignored signal, contained or not."""
    cmd = ["grep", "-E", "^(SigBlk|SigIgn):", "/proc/self/status"]
    for r in run_many([cmd] * 4, jobs=2, contain=contain):
        assert r.ok, r
        assert r.stdout == b"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n", r.stdout


@fork_with_threads
def test_a_forked_child_cannot_go_on_with_python_workers() -> None:
    """The Python workers' path (on_output): a forked child that asks its copy of the
    parent's iterator for the next result gets RuntimeError at once instead of waiting
    forever for workers that exist only in the parent."""
    it = run_many([["sh", "-c", "sleep 0.3; echo x"]] * 6, jobs=2,
                  on_output=lambda stream, chunk: None)
    assert next(it).ok
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            try:
                next(it)
                os.write(w, b"went on")
            except RuntimeError as err:
                os.write(w, str(err).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], 10)
        got = os.read(r, 4096).decode() if ready else "no answer in 10 s"
    finally:
        os.close(r)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert "forked child" in got, got
    assert [x.stdout for x in it] == [b"x\n"] * 5


# A fresh interpreter under RLIMIT_NOFILE at `limit`, with hog_fds(): another thread of
# the caller's that, `after` seconds in, takes every fd but `spare`, for `hold` seconds
# (None: to the end). The scripts below follow it.
FD_HOG = TAKE_FDS + """
import json, os, resource, sys, threading, time
held = []
def hog_fds(limit, after, spare, hold):
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    def hog():
        time.sleep(after)
        held.extend(take_fds(spare))
        if hold is not None:
            time.sleep(hold)
            for fd in held:
                os.close(fd)
    threading.Thread(target=hog).start()
"""

LOW_NOFILE = FD_HOG + """
from boundedproc import run_many
limit, jobs, contain, hog = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
tmpdir = sys.argv[5] == "python"  # tmpdir=True runs on Python workers calling run()
if hog == "hog":
    hog_fds(limit, after=0.1, spare=0, hold=0.3)
else:
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
n, cmd = (24, ["sleep", "0.3"]) if hog == "hog" else (64, ["sleep", "0.1"])
t0 = time.monotonic()
rs = list(run_many([cmd] * n, jobs=jobs, contain=contain, timeout=30, tmpdir=tmpdir))
print(json.dumps({"bad": [r.runner_error for r in rs if not r.ok], "held": len(held),
                  "took": time.monotonic() - t0}))
"""


def _script_json(script: str, *args: object) -> Any:
    """Run a script in a fresh interpreter; what it printed, as JSON."""
    done = subprocess.run([PY, "-c", script, *map(str, args)], env=importable_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _low_nofile(*args: object) -> dict[str, object]:
    got: dict[str, object] = _script_json(LOW_NOFILE, *args)
    return got


@pytest.mark.parametrize("workers", ["core", "python"])
@pytest.mark.parametrize("contain", [True, False])
def test_a_low_fd_limit_runs_every_job_instead_of_failing_them(contain: bool,
                                                               workers: str) -> None:
    """Under `ulimit -n 64`, run_many(jobs=32) failed 53 of 64 `sleep`s with EMFILE
    (uncontained, jobs=8 failed 33; with tmpdir=True, on Python workers, 47 and 46): the
    call's own runs held the fds, each failed run freed its worker for the next, which
    failed at once too. The workers are now capped by what RLIMIT_NOFILE leaves room for,
    and a run out of fds waits for another run of the call to end."""
    got = _low_nofile(64, 32, int(contain), "-", workers)
    assert got["bad"] == [], got


@pytest.mark.parametrize("workers", ["core", "python"])
@pytest.mark.parametrize("contain", [True, False])
def test_fds_the_caller_takes_mid_batch_delay_runs_instead_of_failing_them(
        contain: bool, workers: str) -> None:
    """Another thread of the caller's takes every fd for 0.3 s while run_many's runs go on:
    the runs that start meanwhile find EMFILE, wait for a run of the batch to end, and try
    again (batch.c, wait_for_fds; _scale.py, _FdShare), instead of coming back spawn
    failures."""
    got = _low_nofile(64, 4, int(contain), "hog", workers)
    assert got["held"] > 0, got  # the thread did take fds while the runs went on
    assert got["bad"] == [], got


MOSTLY_OPEN = """
import json, os, resource, sys
from boundedproc import run_many
free, contain, tmpdir = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "python"
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = [os.open("/dev/null", os.O_RDONLY)
        for _ in range(1024 - free - (len(os.listdir("/proc/self/fd")) - 1))]
rs = list(run_many([["echo", str(i)] for i in range(20)], jobs=4, contain=contain,
                   timeout=30, tmpdir=tmpdir))
print(json.dumps({"bad": [r.runner_error for r in rs if not r.ok],
                  "out": [r.stdout.strip() for r in rs] == [str(i).encode() for i in range(20)]}))
"""


@pytest.mark.parametrize("workers", ["core", "python"])
@pytest.mark.parametrize("contain", [True, False])
def test_a_limit_mostly_open_already_runs_every_job_instead_of_failing_them(
        contain: bool, workers: str) -> None:
    """1,010 of 1,024 fds open before the call: run_many(jobs=4) failed most of 20 `echo`s
    with EMFILE (the workers were capped only when jobs alone came near the limit, so four
    supervisors took the fds every run needed). The open fds are counted now."""
    got = _script_json(MOSTLY_OPEN, 14, int(contain), workers)
    assert got == {"bad": [], "out": True}, got


FEW_PROCESS_SLOTS = """
from collections import Counter
def tasks_of(uid):  # RLIMIT_NPROC counts the user's tasks: threads and processes
    n = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return n
now = tasks_of(os.getuid())
resource.setrlimit(resource.RLIMIT_NPROC, (now + 10, now + 10))
rs = list(boundedproc.run_many([["echo", str(i)] for i in range(20)], jobs=4, timeout=30,
                               tmpdir=TMPDIR))
out = dict(bad=dict(Counter(r.runner_error for r in rs if not r.ok)),
           out=[r.stdout.strip() for r in rs] == [str(i).encode() for i in range(20)])
"""


@pytest.mark.parametrize("workers", ["core", "python"])
def test_few_process_slots_delay_runs_instead_of_failing_them(workers: str) -> None:
    """As nobody with 10 process slots left, run_many(jobs=4) failed 17 of 20 `echo`s with
    `spawn failed: EAGAIN` (7 on Python workers), where run() ran them one by one: its four
    threads and supervisors take 8 slots (RLIMIT_NPROC counts threads), and two commands
    at a time fit in the rest. A run out of process slots now waits for another run of the
    call to end, as a run out of fds does."""
    got = as_nobody(FEW_PROCESS_SLOTS.replace("TMPDIR", str(workers == "python")), cwd="/tmp")
    assert got == {"bad": {}, "out": True}, got


EMFILE_ALONE = """
import json, os, resource, time
from boundedproc import run_many
open_now = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + 3, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
t0 = time.monotonic()
rs = list(run_many([["true"]] * 3, jobs=2, contain=False, timeout=30))
print(json.dumps({"errors": [r.runner_error for r in rs], "spawned": [r.spawned for r in rs],
                  "took": time.monotonic() - t0}))
"""


def test_a_run_no_fd_is_ever_freed_for_is_a_spawn_failure_at_once() -> None:
    """With no other run of the batch holding fds, EMFILE is the run's result (SPEC 2.1: a
    spawn failure, exit 127), at once: the wait for fds never outlasts the runs it waits for."""
    got = _script_json(EMFILE_ALONE)
    assert got["spawned"] == [False] * 3, got
    assert all(e.startswith("spawn failed: EMFILE") for e in got["errors"]), got
    assert got["took"] < 5, got


CANCEL_WHILE_WAITING_FOR_FDS = FD_HOG + """
from boundedproc import Cancel, run_many
opts = {"on_output": lambda stream, chunk: None} if sys.argv[1] == "python" else {}
switch = Cancel()
hog_fds(96, after=0.15, spare=2, hold=None)
threading.Timer(2.5, switch.cancel).start()
rs = list(run_many([["sh", "-c", "sleep 1"]] * 12, jobs=4, cancel=switch, timeout=30, **opts))
print(json.dumps([[r.cancelled, r.spawned, r.runner_error] for r in rs]))
"""


@pytest.mark.parametrize("workers", ["core", "python"])
def test_a_run_cancelled_while_it_waits_for_fds_is_cancelled(workers: str) -> None:
    """A run waiting for fds when its switch is set comes back cancelled and not spawned,
    as a run cancelled before its spawn does, never `spawn failed: EMFILE` (the Python
    workers kept the EMFILE)."""
    got = _script_json(CANCEL_WHILE_WAITING_FOR_FDS, workers)
    assert not any(error and "EMFILE" in error for _, _, error in got), got
    assert any(cancelled and not spawned for cancelled, spawned, _ in got), got


EMFILE_AT_START = TAKE_FDS + """
import json, os, sys, time
import psutil
from boundedproc import run_many
opts = {"on_output": lambda stream, chunk: None} if sys.argv[1] == "python" else {}
held = take_fds()

def source():
    for fd in held:  # fds come back once the call has started (another thread's files)
        os.close(fd)
    held.clear()
    yield ["echo", "first"]
    yield from [["sleep", "30"]] * 4

for r in run_many(source(), jobs=4, timeout=60, **opts):
    first = r
    time.sleep(0.3)  # the sleeps are in flight
    t0 = time.monotonic()
    break
took = time.monotonic() - t0
left = [p.pid for p in psutil.Process().children(recursive=True) if p.name() == "sleep"]
print(json.dumps({"first": first.stdout.decode(), "took": took, "left": left}))
"""


@pytest.mark.parametrize("workers", ["core", "python"])
def test_an_early_close_ends_runs_started_after_a_call_began_without_fds(workers: str) -> None:
    """run_many began while the process had no fd left (so no fds for the call's cancel
    switch), and fds came back as the source was read: the runs started then went on
    past an early close (11.7 s for `sleep 12`s) and past a Ctrl-C. The switch is now asked
    for again before each command, and a command is refused until it exists."""
    got = _script_json(EMFILE_AT_START, workers)
    assert got["first"] == "first\n", got
    assert got["took"] < 5 and got["left"] == [], got


# run_many with Python workers (on_output=) while a raise lands inside Thread.start() of its
# second worker, once the thread is running (a Ctrl-C or a pytest-timeout alarm there).
RAISE_IN_WORKER_START = """
import json, threading, time
from boundedproc import run_many
real_start = threading.Thread.start
started = []

def start(self):
    real_start(self)
    if self.name.startswith("boundedproc-many-"):
        started.append(self.name)
        if len(started) == 2:
            time.sleep(0.1)  # the first worker is in its run, the second waits for a task
            raise KeyboardInterrupt

threading.Thread.start = start
t = time.monotonic()
try:
    list(run_many([["sleep", "5"]] * 6, jobs=4, timeout=10, on_output=lambda s, c: None))
    raised = False
except KeyboardInterrupt:
    raised = True
took = time.monotonic() - t
deadline = time.monotonic() + 5
while (left := [w.name for w in threading.enumerate() if w.name.startswith("boundedproc-many-")]):
    if time.monotonic() > deadline:
        break
    time.sleep(0.01)
print(json.dumps({"raised": raised, "took": took, "started": started, "left": left}))
"""


def test_a_raise_inside_a_python_workers_start_does_not_hang_run_many() -> None:
    """The second worker had started but was not yet listed when the raise came, so the
    cleanup queued one stop for each listed worker, the unlisted one took one of them, and a
    listed worker waited for a stop that never came: the caller hung in join() for good, or
    (when the listed one took the stop) a worker was left waiting for good."""
    out = subprocess.run([sys.executable, "-c", RAISE_IN_WORKER_START], capture_output=True,
                         text=True, timeout=60, env=importable_env(), check=False)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["raised"] and len(got["started"]) == 2, got
    assert got["took"] < 10 and got["left"] == [], got


# run_many (on core threads, or Python workers), closed early, while a second raise (a second Ctrl-C) lands in
# its cleanup before the call's switch is set.
RAISE_IN_CLEANUP = """
import gc, json, os, sys, threading, time
from boundedproc import _cancel, run_many
real_cancel = _cancel.Cancel.cancel
raised = []

def cancel(self):
    if not raised:
        raised.append(1)
        raise KeyboardInterrupt  # as a handler's, before the switch is set
    real_cancel(self)

_cancel.Cancel.cancel = cancel
folder = sys.argv[1]
cmds = [["true"]] + [["sh", "-c", f"echo $$ > {folder}/{i}; exec sleep 30"] for i in range(3)]
extra = {"on_output": lambda stream, chunk: None} if sys.argv[2] == "python" else {}
gen = run_many(cmds, jobs=4, timeout=30, **extra)
next(gen)
while len(os.listdir(folder)) < 3:
    time.sleep(0.01)
t = time.monotonic()
try:
    gen.close()
except KeyboardInterrupt:
    pass
del gen
gc.collect()
time.sleep(0.2)  # a stopped worker's thread is gone within this
threads = [t.name for t in threading.enumerate() if t.name.startswith("boundedproc-many")]
print(json.dumps({"raised": bool(raised), "took": time.monotonic() - t, "threads": threads,
                  "pids": [int(open(f"{folder}/{name}").read()) for name in os.listdir(folder)]}))
"""


@pytest.mark.parametrize("workers", ["core", "python"])
def test_a_raise_in_run_manys_cleanup_still_ends_its_runs(tmp_path: Path, workers: str) -> None:
    """The cleanup of a run_many closed early sets the call's switch, then waits for its
    workers.  A second raise that landed before the switch was set skipped both: the runs
    went on, and the close waited for as long as they ran (their timeout); with Python
    workers (an on_output), the workers were never told to stop, and waited for good.  The
    workers' owner (the batch, or the Python workers' own) now sets the switch itself when
    it is closed, or collected, with runs in flight."""
    out = subprocess.run([sys.executable, "-c", RAISE_IN_CLEANUP, str(tmp_path), workers],
                         capture_output=True, text=True, timeout=90, env=importable_env(),
                         check=False)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    try:
        assert got["raised"] and len(got["pids"]) == 3, got
        assert got["took"] < 5, got
        assert wait_dead(got["pids"], within=2) == [], got
        assert got["threads"] == [], got
    finally:
        for pid in got["pids"]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
