"""``run_async`` and ``run_many``: many bounded runs at once (SPEC section 6).

Both are thin layers over ``run()``: every command gets exactly the run()
contract (group kill, caps, structured ``Result``), and neither adds a way to
fail that ``run()`` does not have.

Threads, not the event loop's own fd watching
---------------------------------------------
The C core's loop (``bp_wait``) is blocking: it polls the pipes, the pidfd,
the deadline and the cancel fds itself and returns once the group is dead and
reaped.  ``run()`` releases the GIL for all of that, so a thread per in-flight
run costs a thread and nothing else: no Python code runs while the command
does.  Having the asyncio loop watch the fds instead would need the core split
into non-blocking steps (spawn, feed readiness, collect) with the deadline,
drain grace, group kill and reap logic re-driven from Python callbacks: a
second implementation of the hardest part of the contract, for a saving that
the measurement below shows to be small.  So ``run_async`` runs ``run()`` on a
dedicated pool of up to ``ASYNC_MAX_THREADS`` threads (asyncio's default
executor has ``min(32, cpus + 4)`` workers, which would serialise runs), and
task cancellation reaches the C loop through a private second cancel fd
(``_run.ALSO_CANCEL``), so the caller's own ``cancel=`` switch is never set on
their behalf.

Measured with ``python -m boundedproc._scale [N]`` on the 2-core development
machine (CPython 3.11, other work running: load average 3 to 12), N
concurrent runs of ``sleep 0.5`` in one ``asyncio.gather``:

=====  ==========================  ====================================
N      run_async (thread per run)  asyncio.create_subprocess_exec
=====  ==========================  ====================================
200    0.64-0.92 s, +200 threads,  0.71-1.07 s, +200 threads,
       +6.5 MiB RSS                +4 MiB RSS
1000   1.5-2.0 s, +512 threads     3.2-3.6 s
       (the cap), +21 MiB RSS
=====  ==========================  ====================================

The fd-watching alternative is no cheaper in threads on this Python: 3.11's
default child watcher (``ThreadedChildWatcher``) waits for every child on a
thread of its own.  A thread costs about 33 KiB of RSS here, plus a Cancel's
two pipe fds for the task-cancel switch.  Pool threads stay (idle, blocked on
a queue) after a burst, as asyncio's default executor's do.

Beyond ``ASYNC_MAX_THREADS`` concurrent calls, the extra runs wait in the
pool's queue before they spawn; their ``timeout`` counts from their own spawn,
as with ``run()``.  Wrap the await in ``asyncio.timeout`` for a bound that
includes the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib
import os
import sys
import threading
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from boundedproc._cancel import ALSO_CANCEL, Cancel
from boundedproc._command import Command
from boundedproc._result import Result
from boundedproc._run import run

__all__ = ["ASYNC_MAX_THREADS", "run_async", "run_many"]

#: Most threads ``run_async`` uses at once; more concurrent calls queue.
ASYNC_MAX_THREADS = 512

_pool_lock = threading.Lock()
_async_pool: ThreadPoolExecutor | None = None
_dry_switch: Cancel | None = None


def _forget_pool_after_fork() -> None:
    # A forked child has none of the parent's threads: start a fresh pool.
    global _async_pool, _pool_lock
    _async_pool = None
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def _async_executor() -> ThreadPoolExecutor:
    global _async_pool
    with _pool_lock:
        if _async_pool is None:
            _async_pool = ThreadPoolExecutor(max_workers=ASYNC_MAX_THREADS,
                                             thread_name_prefix="boundedproc-async")
        return _async_pool


def _one_shot(cmd: Any) -> Any:
    """``cmd``, with a one-shot iterable turned into a list, since it is read twice."""
    if isinstance(cmd, (str, bytes, bytearray, memoryview, Sequence)):
        return cmd
    if hasattr(cmd, "__iter__"):
        return list(cmd)
    return cmd  # not iterable: run() raises the TypeError


def _validate(cmd: Any, options: dict[str, Any]) -> Result:
    """Raise what ``run(cmd, **options)`` would raise for a caller bug; spawn nothing.

    It is ``run()`` itself, with the private second cancel switch already set:
    run() validates every parameter first (SPEC 2.2 step 1) and then, seeing a
    cancelled switch, returns a not-spawned result.  So the checks can never
    drift from run()'s own.  The returned result carries the executed ``args``.
    """
    global _dry_switch
    if _dry_switch is None:
        switch = Cancel()
        switch.cancel()
        _dry_switch = switch
    token = ALSO_CANCEL.set(_dry_switch)
    try:
        return run(cmd, **options)
    finally:
        ALSO_CANCEL.reset(token)


def _run_watching(switch: Cancel, cmd: Any, options: dict[str, Any]) -> Result:
    # Runs in a worker thread: executors do not copy contextvars, so the switch
    # is set here, in the context where run() executes.
    token = ALSO_CANCEL.set(switch)
    try:
        return run(cmd, **options)
    finally:
        ALSO_CANCEL.reset(token)


def _no_switch_result(dry: Result, err: OSError) -> Result:
    """The result for a run that could not get the fds of its cancel switch."""
    name = errno.errorcode.get(err.errno or 0, "EMFILE")
    return replace(
        dry, exit_code=127, cancelled=False, stdin_delivered=False,
        runner_error=f"spawn failed: {name} ({err.strerror}): cancel switch for "
                     f"{dry.args[0]!r}")


async def run_async(cmd: Command, **options: Any) -> Result:
    """``run()`` awaitable from asyncio; cancelling the task kills the run's group.

    The command runs on a worker thread of a dedicated pool (see the module
    docstring for why, and what it costs), so any number of ``run_async``
    calls can be awaited together, up to ``ASYNC_MAX_THREADS`` at once.

    Args:
        cmd: As for ``run()``: an argument vector, or a string with ``shell=``.
        **options: Every keyword of ``run()``, with the same meaning and
            defaults (``timeout=600``, ``max_output=16 MiB``, ...).  The
            caller's ``cancel=`` switch works as with ``run()``.

    Returns:
        The ``Result`` that ``run()`` returns.  As with ``run()``, what the
        command or the OS did is in it, never raised.

    Raises:
        TypeError, ValueError: The caller bugs ``run()`` raises, raised here
            before anything is spawned and before a thread is used.
        asyncio.CancelledError: The awaiting task was cancelled.  By then the
            run's whole group was killed and its leader reaped (a second
            cancel during that short wait does not abandon it).  The caller's
            own ``cancel=`` switch is left untouched.
    """
    cmd = _one_shot(cmd)
    dry = _validate(cmd, options)
    loop = asyncio.get_running_loop()
    try:
        switch = Cancel()
    except OSError as err:  # out of fds: run() would report the same, not raise
        return _no_switch_result(dry, err)
    future = loop.run_in_executor(_async_executor(), _run_watching, switch, cmd, options)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        switch.cancel()
        # The C loop sees the switch, kills the group and reaps it; wait for
        # that, through any further cancels, before letting the task go.
        while not future.done():
            # Another cancel, or the run's own error: keep waiting, then re-raise.
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.shield(future)
        if not future.cancelled():
            future.exception()  # retrieved: the task is cancelled either way
        raise


# ---- run_many -----------------------------------------------------------------------

class _Raise:
    """A slot of the input that raises, in order, instead of yielding."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _per_command(cmd: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The command and the options run() gets for it (shell= only for strings)."""
    cmd = _one_shot(cmd)
    if not isinstance(cmd, str) and options.get("shell"):
        options = {**options, "shell": False}
    return cmd, options


def run_many(cmds: Iterable[Command], jobs: int = 4, *, progress: bool = False,
             **options: Any) -> Generator[Result, None, None]:
    """Run many commands, at most ``jobs`` at once, yielding results in input order.

    ``cmds`` is read lazily: at most ``2 * jobs`` commands are taken from it
    ahead of the consumer (running, or finished and waiting their turn), so a
    generator of a million commands is never materialised and memory stays
    bounded by ``2 * jobs`` results.  What a command does (fails, hangs to its
    deadline, is missing, floods its output) is only its ``Result``: it never
    stops the others.

    Closing the iterator early (``break`` out of a ``for`` over it, ``close()``,
    or its garbage collection) cancels the runs in flight, waits until their
    groups are killed and reaped, and starts nothing more.  Hold the iterator
    in ``contextlib.closing`` when it may outlive a ``break``.

    Args:
        cmds: Commands; each is a string (run with ``shell=`` from
            ``options``) or an argument vector (always run without a shell,
            whatever ``shell=`` says, so strings and vectors can be mixed).
        jobs: Most commands running at once (>= 1).
        progress: Show a tqdm progress bar on stderr, advanced as results are
            yielded, when tqdm is importable (the ``cli`` extra); nothing
            otherwise.
        **options: Every keyword of ``run()``, applied to every command.  A
            ``cancel=`` switch given here cancels every run it reaches.

    Returns:
        An iterator of ``Result``, one per command, in input order.

    Raises:
        TypeError, ValueError: A caller bug in ``jobs`` or ``options``, raised
            by this call, before anything is spawned.  A caller bug in one
            command (a string without ``shell=``, an empty vector, a wrong
            type), or an exception raised by ``cmds`` itself, is raised by the
            iterator at that command's position: every earlier command's
            result is yielded first and no later command is started.
    """
    if isinstance(jobs, bool) or not isinstance(jobs, int):
        raise TypeError(f"jobs must be an int, not {type(jobs).__name__}")
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, not {jobs}")
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, not {type(progress).__name__}")
    if isinstance(cmds, (str, bytes)):
        raise TypeError("cmds must be an iterable of commands, not a single "
                        f"{type(cmds).__name__}")
    source = iter(cmds)  # TypeError now when it is not iterable
    # The shared options, checked once with a stand-in command of the right shape.
    _validate("true" if options.get("shell") else ["true"], options)
    total = len(cmds) if hasattr(cmds, "__len__") else None  # type: ignore[arg-type]
    return _many(source, jobs, progress, total, options)


def _progress_bar(total: int | None) -> Any:
    try:
        tqdm = importlib.import_module("tqdm").tqdm  # optional: the `cli` extra
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="cmd", dynamic_ncols=True)


def _many(source: Iterator[Command], jobs: int, progress: bool, total: int | None,
          options: dict[str, Any]) -> Generator[Result, None, None]:
    # Runs at the first next(): an iterator never started spawns, draws, holds nothing.
    bar = _progress_bar(total) if progress else None
    window = 2 * jobs
    switch = Cancel()  # one switch for every run of this call: set on early close
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="boundedproc-many")
    pending: deque[Future[Result] | _Raise] = deque()
    more = True

    def fill() -> None:
        nonlocal more
        while more and len(pending) < window:
            try:
                cmd = next(source)
            except StopIteration:
                more = False
                return
            except Exception as err:  # noqa: BLE001  the input failed: raise it in its turn
                pending.append(_Raise(err))
                more = False
                return
            try:
                cmd, opts = _per_command(cmd, options)
                _validate(cmd, opts)
            except (TypeError, ValueError) as err:
                pending.append(_Raise(err))
                more = False
                return
            pending.append(pool.submit(_run_watching, switch, cmd, opts))

    finished = False
    try:
        fill()
        while pending:
            head = pending.popleft()
            if isinstance(head, _Raise):
                raise head.error
            result = head.result()
            fill()  # keep the pool busy while the consumer handles this one
            if bar is not None:
                bar.update(1)
            yield result
        finished = True
    finally:
        if not finished:
            switch.cancel()  # in-flight runs end now; queued ones spawn nothing
            for item in pending:
                if isinstance(item, Future):
                    item.cancel()
        pool.shutdown(wait=True)  # every run's group is killed and reaped by now
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.close()


def _measure_async(n: int = 200, seconds: float = 0.5) -> None:
    """Print the numbers quoted in the module docstring, for run_async and for
    asyncio's own subprocess support (the event loop watching the pipes)."""
    import time

    def rss_kib() -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    async def ours() -> None:
        r = await run_async(["sleep", str(seconds)], timeout=30)
        assert r.ok, r

    async def asyncio_subprocess() -> None:
        pipe = asyncio.subprocess.PIPE
        proc = await asyncio.create_subprocess_exec(
            "sleep", str(seconds), stdin=asyncio.subprocess.DEVNULL, stdout=pipe, stderr=pipe,
            start_new_session=True)
        await proc.communicate()
        assert proc.returncode == 0

    async def main(name: str, one: Any) -> None:
        threads0 = peak_threads = threading.active_count()
        rss0 = peak_rss = rss_kib()
        started = time.monotonic()
        tasks = [asyncio.ensure_future(one()) for _ in range(n)]
        while not all(t.done() for t in tasks):
            peak_threads = max(peak_threads, threading.active_count())
            peak_rss = max(peak_rss, rss_kib())
            await asyncio.sleep(0.01)
        wall = time.monotonic() - started
        for t in tasks:
            t.result()
        print(f"{n} x sleep {seconds} via {name}: wall {wall:.2f} s, peak threads +"
              f"{peak_threads - threads0}, peak RSS +{(peak_rss - rss0) / 1024:.1f} MiB")

    asyncio.run(main("run_async", ours))
    asyncio.run(main("asyncio.create_subprocess_exec", asyncio_subprocess))


if __name__ == "__main__":
    _measure_async(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
