"""run_async and run_many (SPEC section 6), pinned against real processes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import os
import resource
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import (
    SIGINT_PRELUDE,
    UNDER_ASAN,
    batch_threads,
    fork_with_threads,
    importable_env,
    wait_dead,
    wait_for,
    wait_for_pids,
)

from boundedproc import CANCEL_EXIT_CODE, Cancel, Job, ProcessFailed, Result, _scale
from boundedproc._native import CONTAIN_SUPPORTED
from boundedproc._pool import IdlePool, NoThread
from boundedproc._scale import run_async, run_many

PY = sys.executable


# ---- helpers ---------------------------------------------------------------------

def is_unreaped_child(pid: int) -> bool:
    """True when pid is still a child of this process (alive or a zombie not yet reaped)."""
    try:
        return bool(psutil.Process(pid).ppid() == os.getpid())
    except psutil.NoSuchProcess:
        return False


def read_pids(folder: Path, pattern: str) -> list[int]:
    """The pids written into the files of `folder` matching `pattern`."""
    pids = []
    for f in folder.glob(pattern):
        text = f.read_text().strip()
        if text.isdigit():
            pids.append(int(text))
    return pids


async def wait_for_file(path: Path, within: float = 10.0) -> None:
    """Await until `path` exists and is not empty (bounded)."""
    deadline = time.monotonic() + within
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.02)


def intervals_max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that hold one instant in common."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda ev: (ev[0], ev[1]))
    live = best = 0
    for _, step in events:
        live += step
        best = max(best, live)
    return best


STAMPED = "import sys, time; print(time.time()); time.sleep(float(sys.argv[1])); print(time.time())"


# ---- run_many: order, bounds, laziness ----------------------------------------------

def test_run_many_yields_in_input_order_whatever_finishes_first() -> None:
    """Results come back in input order although later commands finish first."""
    delays = [0.6, 0.0, 0.3, 0.0, 0.45, 0.1, 0.0, 0.2]
    cmds = [f"sleep {d}; echo {i}" for i, d in enumerate(delays)]
    results = list(run_many(cmds, jobs=4, shell=True, timeout=30))
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(len(delays))]
    assert all(r.ok for r in results)


def test_run_many_never_runs_more_than_jobs_at_once() -> None:
    """No instant is inside more than `jobs` commands' lifetimes (as the commands record them)."""
    jobs = 3
    results = list(run_many(([PY, "-c", STAMPED, "0.15"] for _ in range(10)), jobs=jobs,
                            timeout=60))
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    intervals = [(float(a), float(b)) for a, b in (r.stdout.split() for r in results)]
    assert 1 <= intervals_max_overlap(intervals) <= jobs


def test_run_many_reads_input_lazily() -> None:
    """A million-command generator is read at most 8*jobs ahead of what was yielded."""
    jobs = 2
    taken = 0

    def commands() -> Iterator[list[str]]:
        nonlocal taken
        for _ in range(1_000_000):
            taken += 1
            yield ["true"]

    it = run_many(commands(), jobs=jobs, timeout=30)
    assert taken == 0  # nothing is read before the first next()
    for yielded in range(1, 6):
        assert next(it).ok
        assert taken <= yielded + 8 * jobs
    it.close()
    assert taken <= 5 + 8 * jobs


def test_run_many_keeps_its_workers_busy_behind_a_slow_head() -> None:
    """Results come in input order, so a slow first command holds every finished one
    behind it; the workers go on with up to 8*jobs - 1 commands meanwhile.  With 4*jobs
    (before) at most 7 of these 20 fast commands ran before the head ended, at jobs=2."""
    jobs = 2
    head = ["sh", "-c", "sleep 1.5; date +%s.%N"]
    fast = [["date", "+%s.%N"] for _ in range(20)]
    results = list(run_many([head, *fast], jobs=jobs, timeout=30))
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    head_end = float(results[0].stdout)
    ran_meanwhile = sum(float(r.stdout) < head_end for r in results[1:])
    assert ran_meanwhile == 8 * jobs - 1


@pytest.mark.skipif(UNDER_ASAN, reason="every child carries the ASan runtime: runs end too "
                    "far apart to be told together, which is what is counted here")
@pytest.mark.parametrize("contain", [None, False], ids=["contained", "uncontained"])
def test_run_many_wakes_its_consumer_less_than_once_a_run(contain: bool | None) -> None:
    """At scale the consuming thread is told of finished runs several at a time (csrc/batch.c,
    "Telling the caller"): a run that ends while others run and more are queued waits, up to
    2 ms, for company.  Counted as this thread's voluntary context switches over 400 runs at
    jobs=4: about 0.2 a run, where every run's end woke it before (about 0.9).  Uncontained,
    each leader's SIGCHLD also woke it (the workers blocked it, so it was queued for the
    process and delivered here, about 0.85 a run); the workers now leave it unblocked."""
    assert all(r.ok for r in run_many([["true"]] * 8, jobs=4, contain=contain))  # warm-up
    before = resource.getrusage(resource.RUSAGE_THREAD)
    for result in run_many((["true"] for _ in range(400)), jobs=4, timeout=30, contain=contain):
        assert result.ok
    after = resource.getrusage(resource.RUSAGE_THREAD)
    per_run = (after.ru_nvcsw - before.ru_nvcsw) / 400
    assert per_run < 0.6, per_run


def test_run_many_uncontained_with_a_sigchld_handler_of_the_callers() -> None:
    """The batch workers take SIGCHLD (so that, with no handler, the kernel drops it): a
    handler the caller installed still runs, in the main thread, and a worker whose poll it
    interrupts polls again; every run's result is right."""
    seen: list[int] = []
    old = signal.signal(signal.SIGCHLD, lambda *_: seen.append(threading.get_ident()))
    try:
        results = list(run_many([["sh", "-c", "echo $0", str(i)] for i in range(40)],
                                jobs=4, timeout=30, contain=False))
    finally:
        signal.signal(signal.SIGCHLD, old)
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(40)]
    assert all(r.ok for r in results)
    assert seen and set(seen) == {threading.main_thread().ident}


def test_run_many_does_not_hold_a_finished_run_behind_long_ones() -> None:
    """A run that ends while every other worker is busy with a long one, and more are
    queued, is told to the consumer within the deferral bound (2 ms), not when the next run
    ends: its result is yielded long before the sleeps end."""
    cmds = [["true"]] + [["sleep", "20"]] * 8
    started = time.monotonic()
    it = run_many(cmds, jobs=4, timeout=60)
    try:
        first = next(it)
        waited = time.monotonic() - started
    finally:
        it.close()  # cancels the sleeps
    assert first.ok
    assert waited < 5, waited


def test_run_many_one_failure_does_not_stop_the_rest() -> None:
    """A missing program, a non-zero exit, a deadline and a flood are results; the rest run."""
    cmds: list[Any] = [
        ["echo", "first"],
        ["/nonexistent/program"],
        ["/bin/sh", "-c", "exit 3"],
        ["sleep", "30"],
        [PY, "-c", "import sys; sys.stdout.write('x' * 100000)"],
        ["echo", "last"],
    ]
    results = list(run_many(cmds, jobs=2, timeout=1.5, max_output=1000))
    assert len(results) == len(cmds)
    first, missing, three, slow, flood, last = results
    assert first.ok and first.stdout == b"first\n"
    assert missing.exit_code == 127 and not missing.spawned
    assert missing.runner_error is not None and missing.runner_error.startswith("spawn failed: ")
    assert three.exit_code == 3 and three.args[:2] == ("/bin/sh", "-c")
    assert slow.timed_out and slow.exit_code == 124
    assert flood.output_truncated and len(flood.stdout) == 1000
    assert last.ok and last.stdout == b"last\n"


def test_run_many_mixes_strings_and_vectors_through_job() -> None:
    """A string runs with the shared shell; a vector runs without one as a Job(shell=False)."""
    results = list(run_many(["echo $((1 + 2))", Job(["echo", "$((1 + 2))"], shell=False)],
                            shell="sh", timeout=30))
    assert [r.stdout for r in results] == [b"3\n", b"$((1 + 2))\n"]
    assert results[0].args == ("sh", "-c", "echo $((1 + 2))")
    assert results[1].args == ("echo", "$((1 + 2))")


@pytest.mark.parametrize("shell", [True, "bash"])
def test_run_many_a_vector_with_a_shared_shell_is_a_caller_bug_in_its_turn(
        shell: bool | str, tmp_path: Path) -> None:
    """SPEC 2.1: a sequence with a truthy shell is a ValueError, in run_many too: the
    results before it are yielded, it raises in its turn, and it never runs."""
    marker = tmp_path / "ran"
    it = run_many(["echo first", ["touch", str(marker)], "echo never"], shell=shell,
                  jobs=2, timeout=30)
    assert next(it).stdout == b"first\n"
    with pytest.raises(ValueError, match="shell"):
        next(it)
    assert not marker.exists()


def test_run_many_passes_options_to_every_command() -> None:
    """Shared options (text, stdin, env) reach every run."""
    results = list(run_many([["cat"], ["sh", "-c", "cat; echo $BP_X"]], jobs=2, text=True,
                            stdin="in\n", env={"BP_X": "y"}, timeout=30))
    assert [r.stdout for r in results] == ["in\n", "in\ny\n"]


def test_run_many_reads_a_shared_env_dict_for_each_command() -> None:
    """The shared ``env=`` is read as each command is prepared, as run() reads it: an
    edit between commands reaches the later ones."""
    env = {"BP_N": "-"}

    def commands() -> Iterator[list[str]]:
        for i in range(5):
            env["BP_N"] = str(i)
            yield ["sh", "-c", "echo $BP_N"]

    results = list(run_many(commands(), jobs=1, env=env, text=True, timeout=30))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(5)]


def test_run_many_asks_a_shared_stdout_object_for_its_fd_at_each_command(
        tmp_path: Path) -> None:
    """Shared options made of plain values are validated once per call; an object with
    ``fileno()`` is not one of them, and is asked again for each command, as run() asks."""
    files = [open(tmp_path / f"out{i}", "wb") for i in range(4)]  # noqa: SIM115

    class Current:
        index = 0

        def fileno(self) -> int:
            return files[self.index].fileno()

    target = Current()

    def commands() -> Iterator[list[str]]:
        for i in range(4):
            target.index = i
            yield ["echo", str(i)]

    try:
        assert all(r.ok for r in run_many(commands(), jobs=1, stdout=target, timeout=30))
    finally:
        for f in files:
            f.close()
    assert [(tmp_path / f"out{i}").read_bytes() for i in range(4)] == [
        f"{i}\n".encode() for i in range(4)]


def test_run_many_vector_with_a_shared_shell_past_the_kept_options() -> None:
    """Past the second command the shared (plain) options are no longer validated again:
    a vector under a shared ``shell=`` is still refused in its turn."""
    cmds: list[str | list[str]] = ["echo $((1 + 2))"] * 5 + [["echo", "$((1 + 2))"]]
    it = run_many(cmds, shell="sh", jobs=2, timeout=30)
    assert [next(it).stdout for _ in range(5)] == [b"3\n"] * 5
    with pytest.raises(ValueError, match="shell"):
        next(it)


def test_run_many_rejects_bad_options_before_reading_input() -> None:
    """Bad jobs or options raise at the call, before the input is read or anything spawned."""
    taken = []

    def commands() -> Iterator[list[str]]:
        taken.append(1)
        yield ["true"]

    with pytest.raises(ValueError):
        run_many(commands(), timeout=-1)
    with pytest.raises(ValueError):
        run_many(commands(), on_overflow="explode")  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        run_many(commands(), no_such_option=1)  # type: ignore[call-overload]
    with pytest.raises(ValueError):
        run_many(commands(), jobs=0)
    with pytest.raises(TypeError):
        run_many(commands(), jobs=2.5)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        run_many("echo hi")
    assert taken == []


@pytest.mark.parametrize("unordered", [{"true", "x"}, {"true": 1}], ids=["set", "dict"])
def test_run_many_an_unordered_command_is_a_caller_bug_in_its_turn(unordered: object) -> None:
    """A set or a dict as a command is run()'s TypeError (which entry would be the program?),
    raised in its turn, plain or as a Job's command, never run in hash order."""
    for cmds in ([["true"], unordered], [["true"], Job(unordered)]):  # type: ignore[arg-type]
        it = run_many(cmds, jobs=2, timeout=30)
        assert next(it).ok
        with pytest.raises(TypeError, match="unordered"):
            next(it)


HUGE_JOBS = """
import json, resource, sys
from boundedproc import run_many
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
jobs, drawn = int(sys.argv[1]), 0
def endless():
    global drawn
    while True:
        drawn += 1
        yield ["true"]
it = run_many(endless(), jobs=jobs, timeout=30)
ok = all(next(it).ok for _ in range(50))
it.close()
two = [r.stdout for r in run_many([["echo", "a"], ["echo", "b"]], jobs=jobs)]
print(json.dumps({"ok": ok, "drawn": drawn, "two": two == [b"a\\n", b"b\\n"]}))
"""


@pytest.mark.parametrize("jobs", [2**31, 10**30])
def test_run_many_takes_jobs_past_any_int_and_reads_ahead_by_the_workers_it_has(
        jobs: int) -> None:
    """jobs=2**31 raised OverflowError at the first next() (the core takes an int), and a
    window of 8 * jobs commands would draw an endless source without end: jobs is capped by
    what the fd limit leaves room for (256 here: at most 32 workers), and the read-ahead by
    the workers there are."""
    done = subprocess.run([PY, "-c", HUGE_JOBS, str(jobs)], env=importable_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["ok"] and got["two"], got
    assert got["drawn"] <= 8 * 32 + 50, got


def test_run_many_bad_command_raises_at_its_position(tmp_path: Path) -> None:
    """A caller bug in one command raises in its turn: earlier results first, nothing later runs."""
    marker = tmp_path / "later-ran"
    taken = 0

    def commands() -> Iterator[Any]:
        nonlocal taken
        for cmd in (["echo", "a"], ["echo", "b"], "echo no shell", ["touch", str(marker)],
                    ["touch", str(marker)]):
            taken += 1
            yield cmd

    it = run_many(commands(), jobs=4, timeout=30)
    assert next(it).stdout == b"a\n"
    assert next(it).stdout == b"b\n"
    with pytest.raises(ValueError, match="shell"):
        next(it)
    assert taken == 3
    assert not marker.exists()
    with pytest.raises(StopIteration):
        next(it)


def test_run_many_input_error_raises_at_its_position() -> None:
    """An exception from the input iterator is raised after the results before it."""
    def commands() -> Iterator[list[str]]:
        yield ["echo", "a"]
        raise RuntimeError("input broke")

    it = run_many(commands(), timeout=30)
    assert next(it).stdout == b"a\n"
    with pytest.raises(RuntimeError, match="input broke"):
        next(it)


def test_run_many_early_break_leaves_no_process(tmp_path: Path, reaper: list[int]) -> None:
    """Breaking out after the first result kills and reaps every run in flight."""
    bg = "echo $$ > {d}/{i}.leader; sleep 60 & echo $! > {d}/{i}.bg; wait"
    # The first command waits until two others have started their background sleeps.
    first = (f"for n in $(seq 200); do [ -s {tmp_path}/1.bg ] && [ -s {tmp_path}/2.bg ] "
             "&& break; sleep 0.05; done; echo first")
    cmds = [first] + [bg.format(d=tmp_path, i=i) for i in range(1, 20)]
    try:
        for result in run_many(cmds, jobs=3, shell=True, timeout=60):
            assert result.stdout == b"first\n"
            break
    finally:
        pids = read_pids(tmp_path, "*.bg") + read_pids(tmp_path, "*.leader")
        reaper.extend(pids)
    assert len(read_pids(tmp_path, "*.bg")) >= 2
    leaders = read_pids(tmp_path, "*.leader")
    assert not [p for p in leaders if is_unreaped_child(p)]
    assert wait_dead(pids) == []
    assert len(leaders) <= 3 + 1  # at most the window's in-flight runs ever started


# The escapee holds the pipes after the leader's exit: the run drains them for drain_grace.
_HELD = ("setsid sh -c 'echo $$ > {f}.tmp; mv {f}.tmp {f}; exec sleep 977.5' & "
         "while [ ! -s {f} ]; do sleep 0.01; done; exit 0")


@pytest.mark.parametrize("worker", ["core", "python"])
def test_run_many_early_close_does_not_wait_out_a_drain(tmp_path: Path, reaper: list[int],
                                                        worker: str) -> None:
    """Closing run_many early ends the drain of a run in flight at once.

    Uncontained, an escapee holding the pipes keeps a run draining for drain_grace; the
    results of an early close are never seen, so waiting for them only delays the
    caller's Ctrl-C or break (it took the whole drain_grace: 30 s here).  run() itself
    aborts the same way.  worker="python": a Job with on_output runs in a Python worker.
    """
    pidfile = tmp_path / "escapee"
    cmds: list[Any] = ["true", _HELD.format(f=pidfile)]
    if worker == "python":
        cmds = [Job(cmd, on_output=lambda stream, data: None) for cmd in cmds]
    it = run_many(cmds, jobs=2, shell=True, contain=False, drain_grace=30, timeout=60)
    try:
        assert next(it).ok
        assert wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10)
        reaper.extend(read_pids(tmp_path, "escapee"))
        time.sleep(0.3)  # the leader has exited: its run is draining
        t = time.monotonic()
        it.close()
        took = time.monotonic() - t
    finally:
        reaper.extend(read_pids(tmp_path, "escapee"))
    assert took < 5, took


def test_run_async_cancel_does_not_wait_out_a_drain(tmp_path: Path, reaper: list[int]) -> None:
    """Cancelling run_async's task ends the drain of its run at once (as run_many's close)."""
    pidfile = tmp_path / "escapee"

    async def main() -> float:
        task = asyncio.ensure_future(run_async(_HELD.format(f=pidfile), shell=True,
                                               contain=False, drain_grace=30, timeout=60))
        await wait_for_file(pidfile)
        await asyncio.sleep(0.3)
        t = time.monotonic()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return time.monotonic() - t

    try:
        took = asyncio.run(main())
    finally:
        reaper.extend(read_pids(tmp_path, "escapee"))
    assert took < 5, took


def test_run_many_caller_cancel_reaches_every_run() -> None:
    """A cancel= switch given to run_many cancels the runs in flight and those after."""
    switch = Cancel()
    it = run_many((["sleep", "60"] for _ in range(6)), jobs=2, cancel=switch, timeout=120)
    switch.cancel()
    results = list(it)
    assert len(results) == 6
    assert all(r.cancelled and r.exit_code == CANCEL_EXIT_CODE for r in results)


def test_run_many_progress_uses_tqdm_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """progress=True drives a tqdm bar on stderr, advanced once per result, then closed."""
    bars: list[Any] = []

    class FakeBar:
        def __init__(self, total: Any = None, file: Any = None, **kw: Any) -> None:
            self.total, self.file, self.n, self.closed = total, file, 0, False
            bars.append(self)

        def update(self, n: int = 1) -> None:
            self.n += n

        def close(self) -> None:
            self.closed = True

    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    assert len(list(run_many([["true"]] * 5, progress=True, timeout=30))) == 5
    (bar,) = bars
    assert (bar.total, bar.n, bar.closed, bar.file) == (5, 5, True, sys.stderr)


def test_run_many_progress_without_tqdm_is_silent(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """progress=True without tqdm importable runs everything and prints nothing."""
    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes `import tqdm` raise ImportError
    assert all(r.ok for r in run_many(iter([["true"]] * 3), progress=True, timeout=30))
    assert capsys.readouterr() == ("", "")


# ---- run_async -------------------------------------------------------------------------

def test_run_async_returns_the_run_result() -> None:
    """run_async gives the same Result run() would: output, exit status, options applied."""
    async def main() -> tuple[Result[bytes], Result[str]]:
        a = await run_async(["sh", "-c", "cat; echo err >&2; exit 3"], stdin=b"in", timeout=30)
        b = await run_async("echo $0", shell="sh", text=True, timeout=30)
        return a, b

    a, b = asyncio.run(main())
    assert (a.exit_code, a.stdout, a.stderr, a.ok) == (3, b"in", b"err\n", False)
    assert a.spawned and a.pid is not None and not is_unreaped_child(a.pid)
    assert b.ok and b.stdout == "sh\n" and b.args == ("sh", "-c", "echo $0")


def test_run_async_raises_caller_bugs_before_spawning() -> None:
    """Caller bugs raise from run_async exactly as from run(); OS failures are results."""
    async def main() -> Result[bytes]:
        with pytest.raises(ValueError):
            await run_async("echo hi")  # a string without a shell
        with pytest.raises(ValueError):
            await run_async(["echo"], shell=True)
        with pytest.raises(ValueError):
            await run_async(["true"], timeout=float("nan"))
        with pytest.raises(TypeError):
            await run_async(["true"], cancel=object())  # type: ignore[call-overload]
        return await run_async(["/nonexistent/program"])

    missing = asyncio.run(main())
    assert missing.exit_code == 127 and missing.runner_error is not None


def test_run_async_calls_overlap() -> None:
    """Forty concurrent run_async calls are all alive at once (more than asyncio's executor)."""
    n = 40

    async def main(folder: str) -> list[Result[bytes]]:
        barrier = (f"touch {folder}/$0; i=0; while [ $(ls {folder} | wc -l) -lt {n} ]; do "
                   "i=$((i+1)); [ $i -gt 400 ] && exit 9; sleep 0.05; done; echo met")
        return list(await asyncio.gather(*(
            run_async(["sh", "-c", barrier, str(k)], timeout=60) for k in range(n))))

    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        results = asyncio.run(main(folder))
    assert [r.stdout for r in results] == [b"met\n"] * n


def test_cancelling_run_async_kills_and_reaps_the_group(tmp_path: Path,
                                                        reaper: list[int]) -> None:
    """Task cancel kills the background sleep, reaps the leader, then raises CancelledError."""
    mine = Cancel()

    async def main() -> tuple[int, int]:
        task = asyncio.ensure_future(run_async(
            ["sh", "-c", f"echo $$ > {tmp_path}/leader; sleep 60 & echo $! > {tmp_path}/bg; wait"],
            timeout=120, cancel=mine))
        await wait_for_file(tmp_path / "bg")
        leader = int((tmp_path / "leader").read_text())
        bg = int((tmp_path / "bg").read_text())
        reaper.extend([leader, bg])
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        # Reaped before CancelledError reached us: no longer a child, not even a zombie.
        assert not is_unreaped_child(leader)
        return leader, bg

    leader, bg = asyncio.run(main())
    assert wait_dead([bg, leader]) == []
    assert not mine.cancelled  # the caller's own switch was not used for the task cancel


def test_run_async_survives_a_second_cancel_while_killing(tmp_path: Path,
                                                          reaper: list[int]) -> None:
    """Cancelling twice still waits for the kill and reap before CancelledError propagates."""
    async def main() -> int:
        task = asyncio.ensure_future(run_async(
            ["sh", "-c", f"sleep 60 & echo $! > {tmp_path}/bg; wait"], timeout=120))
        await wait_for_file(tmp_path / "bg")
        bg = int((tmp_path / "bg").read_text())
        reaper.append(bg)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return bg

    bg = asyncio.run(main())
    assert wait_dead([bg]) == []


def test_run_async_timeout_context_becomes_timeout_error(tmp_path: Path,
                                                         reaper: list[int]) -> None:
    """asyncio.wait_for around run_async raises TimeoutError after the group is killed."""
    async def main() -> int:
        async def watched() -> Result[bytes]:
            return await run_async(["sh", "-c", f"sleep 60 & echo $! > {tmp_path}/bg; wait"],
                                   timeout=120)

        async def starter() -> None:
            await wait_for_file(tmp_path / "bg")

        task = asyncio.ensure_future(asyncio.wait_for(watched(), timeout=30))
        await starter()
        bg = int((tmp_path / "bg").read_text())
        reaper.append(bg)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(run_async(["sleep", "60"], timeout=120), timeout=0.3)
        return bg

    bg = asyncio.run(main())
    assert wait_dead([bg]) == []


def test_run_async_caller_cancel_still_works() -> None:
    """The caller's own cancel= ends a run_async run with a cancelled Result, not an exception."""
    switch = Cancel()

    async def main() -> Result[bytes]:
        task = asyncio.ensure_future(run_async(["sleep", "60"], cancel=switch, timeout=120))
        await asyncio.sleep(0.2)
        switch.cancel()
        return await task

    r = asyncio.run(main())
    assert r.cancelled and r.exit_code == CANCEL_EXIT_CODE


def test_run_async_many_at_once_all_succeed() -> None:
    """Two hundred concurrent run_async calls each return their own correct result."""
    async def main() -> list[Result[bytes]]:
        return list(await asyncio.gather(*(
            run_async(["echo", str(k)], timeout=60) for k in range(200))))

    results = asyncio.run(main())
    assert [r.stdout for r in results] == [f"{k}\n".encode() for k in range(200)]
    assert len({r.pid for r in results}) == 200


def _async_threads() -> int:
    return sum(t.name.startswith("boundedproc-async") for t in threading.enumerate())


def _batch_workers_children() -> set[int]:
    """The children of run_many's core threads, parked ones included: they come and go on
    their own (batch.c parks them for 2 s after their call)."""
    kids: set[int] = set()
    for tid in batch_threads():
        with contextlib.suppress(OSError):
            kids.update(int(p) for p in Path(f"/proc/self/task/{tid}/children").read_text().split())
    return kids


def _supervisors() -> int:
    """This process's supervisors but those of run_many's core threads."""
    count = 0
    batch = _batch_workers_children()
    for proc in psutil.Process().children():
        try:
            count += proc.name() == "_bp_supervisor" and proc.pid not in batch
        except psutil.NoSuchProcess:
            pass
    return count


def _end_async_pool() -> None:
    pool, _scale._async_pool = _scale._async_pool, None
    if pool is not None:
        pool.shutdown(wait=False)  # its idle threads end now, their supervisors with them
    assert wait_for(lambda: _async_threads() == 0, 10)


@pytest.fixture
def fresh_async_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """run_async's pool started anew for the test (none of its threads left from earlier
    tests), with idle threads ending after 0.3 s; ended again after the test."""
    _end_async_pool()
    monkeypatch.setattr(_scale, "ASYNC_IDLE_SECONDS", 0.3)
    yield
    _end_async_pool()


@pytest.mark.skipif(not CONTAIN_SUPPORTED, reason="no containment supervisor here")
def test_run_async_threads_and_their_supervisors_end_once_idle_after_a_burst(
        fresh_async_pool: None) -> None:
    """A burst of 16 contained runs starts 16 threads and 16 supervisors; idle, all end."""
    threads, supervisors = _async_threads(), _supervisors()
    n = 16
    during: list[tuple[int, int]] = []

    async def main() -> list[Result[bytes]]:
        runs = asyncio.gather(*(run_async(["sleep", "0.5"], timeout=30) for _ in range(n)))
        await asyncio.sleep(0.3)  # all running
        during.append((_async_threads(), _supervisors()))
        return list(await runs)

    assert all(r.ok for r in asyncio.run(main()))
    assert during == [(threads + n, supervisors + n)]
    assert wait_for(lambda: (_async_threads(), _supervisors()) == (threads, supervisors), 10), \
        f"left: {_async_threads() - threads} threads, {_supervisors() - supervisors} supervisors"


@pytest.mark.skipif(not CONTAIN_SUPPORTED, reason="no containment supervisor here")
def test_run_async_reuses_the_last_idle_threads_so_the_rest_end(fresh_async_pool: None) -> None:
    """After a burst of 8, two runs at a time for 1.5 s keep two threads, not all eight."""
    async def main() -> list[int]:
        await asyncio.gather(*(run_async(["sleep", "0.2"], timeout=30) for _ in range(8)))
        seen = [_async_threads()]
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            pair = await asyncio.gather(run_async(["true"], timeout=30),
                                        run_async(["true"], timeout=30))
            assert all(r.ok for r in pair)
        seen.append(_async_threads())
        return seen

    threads = _async_threads()
    after_burst, after_trickle = asyncio.run(main())
    assert after_burst == threads + 8
    assert after_trickle == threads + 2, "the trickle kept other threads warm"
    assert wait_for(lambda: _async_threads() == threads, 10)


def test_async_pool_queues_work_past_its_threads_and_hands_back_errors() -> None:
    """Past max_threads, work waits its turn in order; an exception reaches the future."""
    pool = IdlePool(2, 0.2, "test-pool")
    gate = threading.Event()
    order: list[int] = []

    def job(k: int) -> int:
        gate.wait(10)
        order.append(k)
        if k == 3:
            raise KeyError(k)
        return k * 10

    futures = [pool.submit(job, k) for k in range(6)]
    assert pool.threads() == 2
    gate.set()
    assert [f.result(10) for f in futures if f is not futures[3]] == [0, 10, 20, 40, 50]
    assert isinstance(futures[3].exception(10), KeyError)
    assert sorted(order) == [0, 1, 2, 3, 4, 5]
    assert wait_for(lambda: pool.threads() == 0, 10)
    pool.shutdown(wait=False)
    with pytest.raises(RuntimeError):
        pool.submit(job, 9)
    one = IdlePool(1, 0.2, "test-pool")  # one thread: the queue's order is the run order
    order.clear()
    assert [f.result(10) for f in [one.submit(job, k) for k in (5, 4, 0, 1)]] == [50, 40, 0, 10]
    assert order == [5, 4, 0, 1]
    one.shutdown()


@fork_with_threads
def test_run_async_in_a_forked_child_uses_a_pool_of_its_own(fresh_async_pool: None) -> None:
    """The child of os.fork() has none of the parent's pool threads: it starts its own."""
    assert asyncio.run(run_async(["true"], timeout=30)).ok  # the parent's pool: one idle thread
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            res = asyncio.run(run_async(["echo", "child"], timeout=30))
            os.write(w, res.stdout if res.ok else b"failed")
        finally:
            os._exit(0)
    os.close(w)
    ready = select.select([r], [], [], 30)[0]
    data = os.read(r, 100) if ready else b"no answer in 30 s"
    os.close(r)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert data == b"child\n"
    assert asyncio.run(run_async(["echo", "parent"], timeout=30)).stdout == b"parent\n"


# After its runs, a caller forks: at the fork, the process has no thread but the caller's
# (each after_in_parent hook counts /proc/self/task, and Python 3.12+ warns of a fork with
# threads): run_many's parked workers and run_async's idle threads end before a fork.
FORK_AFTER_RUNS = """
import asyncio, json, os, sys, warnings
from boundedproc import run_async, run_many
counts = []
os.register_at_fork(after_in_parent=lambda: counts.append(len(os.listdir("/proc/self/task"))))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        if sys.argv[1] == "run_async":
            async def main():
                return await asyncio.gather(*(run_async(["true"], timeout=30) for _ in range(3)))
            assert all(r.ok for r in asyncio.run(main()))
        else:
            contain = sys.argv[1] == "run_many"
            assert all(r.ok for r in run_many([["true"]] * 6, jobs=3, contain=contain))
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
print(json.dumps({"threads": counts, "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
@pytest.mark.parametrize("how", ["run_many", "run_many_uncontained", "run_async"])
def test_a_caller_that_forks_after_its_runs_is_single_threaded_again(how: str) -> None:
    """run_many's parked workers (and their supervisors) and run_async's idle threads
    end before os.fork(), and their threads are joined: the fork finds the caller's
    thread alone, and Python 3.12+ has no thread to warn about."""
    if how == "run_many" and not CONTAIN_SUPPORTED:
        pytest.skip("containment needs Linux with a subreaper")
    done = subprocess.run([PY, "-c", FORK_AFTER_RUNS, how], env=importable_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got == {"threads": [1, 1, 1], "warnings": []}


def test_async_pool_end_idle_joins_idle_threads_and_is_best_effort() -> None:
    """end_idle() (before a fork) ends and joins the idle threads, the pool goes on; with
    its lock held by the calling thread itself (a fork from a signal handler that
    interrupted submit()) it gives up instead of deadlocking; after shutdown() (which woke
    them already) it releases nothing twice."""
    pool = IdlePool(4, 30.0, "test-pool")
    assert [f.result(10) for f in [pool.submit(lambda k=k: k) for k in range(3)]] == [0, 1, 2]
    assert pool.threads() >= 1
    pool.end_idle()
    assert pool.threads() == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("test-pool")]
    assert pool.submit(lambda: 7).result(10) == 7  # a new thread
    pool._lock.acquire()  # as a signal handler inside submit() would find it
    try:
        began = time.monotonic()
        pool.end_idle()
        assert time.monotonic() - began < 5
    finally:
        pool._lock.release()
    pool.shutdown(wait=False)
    pool.end_idle()  # no "release unlocked lock"
    pool.shutdown()


def test_async_pool_without_a_new_thread_queues_for_a_busy_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that cannot start: the work waits for a busy thread of the pool; with no
    thread at all, submit raises NoThread (run_async turns it into an EAGAIN result)."""
    pool = IdlePool(4, 0.2, "test-pool")
    gate = threading.Event()
    first = pool.submit(lambda: gate.wait(10) and threading.current_thread().name)

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    second = pool.submit(lambda: threading.current_thread().name)
    assert pool.threads() == 1 and not second.done()
    gate.set()
    assert second.result(10) == first.result(10)  # the same thread ran both, in turn
    assert wait_for(lambda: pool.threads() == 0, 10)
    with pytest.raises(NoThread):
        pool.submit(lambda: None)
    pool.shutdown()


def test_async_pool_is_an_executor_whose_shutdown_cancels_and_joins() -> None:
    """shutdown(cancel_futures=True) cancels the queued work; wait=True joins the threads."""
    pool = IdlePool(1, 30.0, "test-pool")
    gate = threading.Event()
    first = pool.submit(lambda *, until: until.wait(10) and "first", until=gate)
    queued = [pool.submit(str, k) for k in range(3)]
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in queued)
    with pytest.raises(RuntimeError):
        pool.submit(str, 9)
    gate.set()
    pool.shutdown(wait=True)  # the busy thread ends after its work, not after 30 s idle
    assert first.result(0) == "first" and pool.threads() == 0


_EXIT_SCRIPT = """
import asyncio, sys, time
from boundedproc import _scale
from boundedproc._scale import run_async
_scale.ASYNC_IDLE_SECONDS = 60.0
loop = asyncio.new_event_loop()
print(loop.run_until_complete(run_async(["true"], timeout=30)).ok, flush=True)
task = loop.create_task(run_async(["sh", "-c", "sleep 0.5; echo ran > " + sys.argv[1]],
                                  contain=False, timeout=30))
loop.run_until_complete(asyncio.sleep(0.2))  # the second run is in flight; exit now
"""


def test_run_async_at_exit_idle_threads_end_and_runs_in_flight_finish(tmp_path: Path) -> None:
    """Exit does not wait out an idle thread's 60 s; a run in flight completes before it."""
    marker = tmp_path / "ran"
    started = time.monotonic()
    done = subprocess.run([PY, "-c", _EXIT_SCRIPT, str(marker)], check=False, capture_output=True,
                          text=True, timeout=50)
    took = time.monotonic() - started
    assert done.stdout == "True\n", done.stderr
    assert took < 20, f"exit waited {took:.1f} s for an idle thread"
    assert marker.read_text() == "ran\n", "the run in flight was abandoned at exit"


_OPEN_AT_EXIT = """
import sys
from boundedproc import Job, run_many
token = sys.argv[1]
# A Job with on_output takes the Python workers; the sleepers are in flight at exit.
g = run_many((Job(["echo", "x"], on_output=lambda s, c: None) if i == 0
              else ["sleep", f"{token}{i}"] for i in range(12)), jobs=4, timeout=30)
print(next(g).stdout.decode(), end="", flush=True)
"""


def test_run_many_left_open_at_exit_does_not_hang_it() -> None:
    """A run_many generator still open when the script ends is closed by the interpreter's
    last collection, when daemon threads run no more Python (3.13 parks them for good): the
    exit must not wait on them, and the runs in flight must still die (contained)."""
    token = f"93.{os.getpid() % 1000:03d}7"
    started = time.monotonic()
    try:
        done: subprocess.CompletedProcess[str] | None = subprocess.run(
            [PY, "-c", _OPEN_AT_EXIT, token], capture_output=True, text=True, timeout=20,
            check=False)
    except subprocess.TimeoutExpired:
        done = None
    took = time.monotonic() - started
    mine = [p.pid for p in psutil.process_iter(["cmdline"])
            if token in " ".join(p.info["cmdline"] or [])]
    left = wait_dead(mine, within=2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # ours: they carry this test's token
    assert done is not None, f"the script did not exit in 20 s (took {took:.1f} s)"
    assert done.returncode == 0 and done.stdout == "x\n", done.stderr
    assert left == [], "runs in flight outlived the exit"


def test_run_async_accepts_a_one_shot_iterable_command() -> None:
    """An argument vector given as a generator is read once and run as given."""
    r = asyncio.run(run_async((a for a in ["echo", "gen"]), timeout=30))  # type: ignore[call-overload]
    assert r.stdout == b"gen\n"


def test_run_many_accepts_generator_commands() -> None:
    """Commands that are themselves generators of arguments run as given."""
    cmds = ((a for a in ["echo", str(k)]) for k in range(3))
    results = run_many(cmds, timeout=30)  # type: ignore[arg-type]
    assert [r.stdout for r in results] == [b"0\n", b"1\n", b"2\n"]


def test_run_many_empty_input_yields_nothing() -> None:
    """No commands, no results, no error."""
    assert list(run_many(itertools.islice(iter([["true"]]), 0), timeout=30)) == []


# ---- Job: per-run options in run_many (SPEC 9.4) ----------------------------------------

def test_job_options_override_the_shared_ones_for_that_run_only(tmp_path: Path) -> None:
    """A Job's cwd and stdin apply to its run; the others keep the shared timeout and cwd."""
    own = tmp_path / "own"
    own.mkdir()
    results = list(run_many([
        Job(["pwd"], cwd=own),
        Job(["cat"], stdin=b"fed to job 2"),
        ["pwd"],
        ["sleep", "30"],
        Job(["sh", "-c", "sleep 0.6; echo late"], timeout=30),
    ], jobs=5, cwd=tmp_path, timeout=0.4))
    assert results[0].stdout == f"{own}\n".encode()
    assert results[1].stdout == b"fed to job 2"
    assert results[2].stdout == f"{tmp_path}\n".encode()
    assert results[3].timed_out and results[3].exit_code == 124
    assert results[4].ok and results[4].stdout == b"late\n"


def test_bad_option_in_job_three_of_five_raises_in_its_turn(tmp_path: Path) -> None:
    """Jobs 1-2 yield their results, job 3's ValueError is raised next, jobs 4-5 never start."""
    marks = [tmp_path / f"ran{k}" for k in range(5)]
    items: list[Job | list[str]] = [Job(["touch", str(marks[0])]), ["touch", str(marks[1])],
             Job(["touch", str(marks[2])], timeout=-1.0),
             ["touch", str(marks[3])], Job(["touch", str(marks[4])])]
    it = run_many(items, jobs=2, timeout=30)
    assert next(it).ok and next(it).ok
    with pytest.raises(ValueError, match="timeout"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert [m.exists() for m in marks] == [True, True, False, False, False]


def test_a_misspelt_job_option_is_a_type_error_in_its_turn() -> None:
    """An unknown keyword in a Job is run()'s TypeError, raised when the job is reached."""
    bad = Job(["true"], timout=3)  # type: ignore[call-arg]
    it = run_many([["true"], bad], timeout=30)
    assert next(it).ok
    with pytest.raises(TypeError, match="timout"):
        next(it)


def test_a_job_cannot_change_text() -> None:
    """text is shared by every result of one run_many: a Job setting it is a TypeError."""
    it = run_many([Job(["true"], text=True)], timeout=30)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="text"):
        next(it)


def test_per_job_on_output_sees_that_jobs_output() -> None:
    """A Job's own on_output is called with its chunks, in the worker thread, and no other's."""
    seen: list[tuple[int, bytes, str]] = []

    def record(stream: int, chunk: bytes) -> None:
        seen.append((stream, chunk, threading.current_thread().name))

    results = list(run_many([["echo", "other"], Job(["sh", "-c", "echo out; echo err >&2"],
                                                    on_output=record)], timeout=30))
    assert all(r.ok for r in results)
    assert b"".join(c for s, c, _ in seen if s == 1) == b"out\n"
    assert b"".join(c for s, c, _ in seen if s == 2) == b"err\n"
    assert all(name.startswith("boundedproc-many") for _, _, name in seen)


def test_job_shell_is_its_own_or_the_shared_one() -> None:
    """A Job runs with its own shell=, else the shared one (a vector Job under a shared
    shell is refused as run() refuses it)."""
    results = list(run_many([Job("echo $((6*7))"), Job(["echo", "v"], shell=False),
                             Job("echo own", shell="/bin/sh")], shell=True, timeout=30))
    assert [r.stdout for r in results] == [b"42\n", b"v\n", b"own\n"]
    with pytest.raises(ValueError, match="shell"):
        next(run_many([Job("echo no shell")], timeout=30))
    with pytest.raises(ValueError, match="shell"):
        next(run_many([Job(["echo", "v"])], shell=True, timeout=30))


def test_job_is_frozen_comparable_and_picklable() -> None:
    """A Job cannot be changed, equals one with the same command and options, survives pickle."""
    import pickle

    job = Job(["echo", "x"], cwd="/tmp", timeout=3)
    assert job == Job(["echo", "x"], cwd="/tmp", timeout=3) != Job(["echo", "x"])
    assert pickle.loads(pickle.dumps(job)) == job
    assert repr(job) == "Job(['echo', 'x'], cwd='/tmp', timeout=3)"
    with pytest.raises(AttributeError):
        job.cmd = ["true"]  # type: ignore[misc]
    with pytest.raises(TypeError):
        job.options["cwd"] = "/"  # type: ignore[index]


def test_run_many_and_run_async_take_exactly_runs_keywords() -> None:
    """run_many, run_async and Job spell out run()'s keywords, with run()'s defaults."""
    import inspect

    from boundedproc import run
    from boundedproc._scale import JobOptions

    def keywords(fn: Any) -> dict[str, Any]:
        return {name: p.default for name, p in inspect.signature(fn).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    mine = keywords(run)
    assert keywords(run_async) == mine
    assert keywords(run_many) == {"progress": False, **mine}
    assert set(JobOptions.__annotations__) == set(mine) - {"text"}


def test_check_true_in_run_many_and_run_async() -> None:
    """check=True raises the failed run's ProcessFailed in its turn, and only for it (the
    dry validation of each command never raises its own not-spawned result)."""
    it = run_many([["true"], ["sh", "-c", "exit 4"], ["true"]], jobs=2, check=True)
    assert next(it).ok
    with pytest.raises(ProcessFailed) as info:
        next(it)
    assert info.value.result.exit_code == 4
    assert asyncio.run(run_async(["true"], check=True)).ok
    with pytest.raises(ProcessFailed):
        asyncio.run(run_async(["false"], check=True))


def test_unknown_keyword_names_the_function() -> None:
    """A misspelt or subprocess-only keyword is reported as run_many's or run_async's."""
    with pytest.raises(TypeError, match=r"run_many\(\) got an unexpected keyword argument 'tiemout'"):
        run_many([["true"]], tiemout=1)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"run_async\(\) got subprocess's keyword 'input'"):
        asyncio.run(run_async(["true"], input=b"x"))  # type: ignore[call-overload]


def test_misspelt_job_option_is_the_jobs_error_in_its_turn() -> None:
    """A Job's misspelt keyword is raised as Job()'s when run_many reaches it."""
    it = run_many([["true"], Job(["true"], tiemout=1)], jobs=2)  # type: ignore[call-arg]
    assert next(it).ok
    with pytest.raises(TypeError, match=r"Job\(\) got an unexpected keyword argument 'tiemout'"):
        next(it)


def test_content_a_process_cannot_get_is_a_result_in_run_many() -> None:
    """A NUL byte or a lone surrogate in one command is that command's not-spawned result;
    the others run."""
    out = list(run_many([["echo", "a"], ["echo", "b\0"], ["echo", "\ud800"], ["echo", "c"]],
                        jobs=2))
    assert [r.stdout for r in out] == [b"a\n", b"", b"", b"c\n"]
    assert [r.spawned for r in out] == [True, False, False, True]
    assert all(r.runner_error.startswith("not spawned: ") for r in out[1:3])


def test_ctrl_c_while_run_many_waits(tmp_path: Path, reaper: list[int]) -> None:
    """SIGINT while the consumer waits for a result: KeyboardInterrupt, promptly, and every
    run in flight killed and reaped (its sleeps dead) before it propagates."""
    f = tmp_path / "pids"
    code = SIGINT_PRELUDE + textwrap.dedent(f"""
        from boundedproc import run_many
        cmds = [["sh", "-c", f"echo $$ > {f}.{{i}}.tmp; mv {f}.{{i}}.tmp {f}.{{i}}; sleep 60"]
                for i in range(4)]
        try:
            for r in run_many(cmds, jobs=2, timeout=60):
                print("unexpected result", r, flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    """)
    child = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pids = wait_for_pids(Path(f"{f}.0")) + wait_for_pids(Path(f"{f}.1"))
        reaper.extend(pids)
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=10)
    finally:
        child.kill()
    assert out.startswith("interrupted"), out
    assert wait_dead(pids) == []


def test_a_raise_between_run_asyncs_submit_and_its_await_ends_the_run(
        tmp_path: Path, reaper: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A raise that lands after run_async handed the run to its thread but before it awaited
    it (a signal handler's exception, here from asyncio.wrap_future) left the command
    running, unobserved, until its own timeout (and the interpreter's exit waited for it).
    The run now ends with the raise: cancelled before its spawn, or killed."""
    class Boom(Exception):
        pass

    def wrap_future(*args: object, **kw: object) -> None:
        raise Boom

    monkeypatch.setattr(asyncio, "wrap_future", wrap_future)
    pidfile = tmp_path / "pid"

    async def main() -> None:
        script = f"echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 60"
        await run_async(["sh", "-c", script], timeout=60)

    with pytest.raises(Boom):
        asyncio.run(main())
    deadline = time.monotonic() + 3
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if pidfile.exists():  # spawned before the switch was set: killed since
        pid = int(pidfile.read_text())
        reaper.append(pid)
        assert wait_dead([pid], within=5) == [], "the run went on after the raise"


def test_cancelled_run_asyncs_leave_no_fds_to_the_collector() -> None:
    """Each run_async's cancel switch (two pipe fds) was closed only by its __del__, and a
    cancelled run's switch is in a reference cycle (the CancelledError's traceback): with
    the collector off, as a busy caller may keep it, six cancels a round kept twelve fds."""
    async def round_of_cancels() -> None:
        together = asyncio.gather(*[run_async(["sleep", "10"], timeout=20) for _ in range(6)])
        await asyncio.sleep(0.2)
        together.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await together

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    asyncio.run(round_of_cancels())  # the pool's threads and supervisors are up
    gc.collect()
    gc.disable()
    try:
        before = fds()
        for _ in range(3):
            asyncio.run(round_of_cancels())
        grew = fds() - before
    finally:
        gc.enable()
    assert grew <= 2, grew  # an event loop's own self-pipe may linger; twelve a round did
