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
two pipe fds for the task-cancel switch.  A pool thread that has no work for
``ASYNC_IDLE_SECONDS`` ends, and the supervisor it kept for contained runs
with it; work goes to the thread idle the shortest time, so after a burst a
steady trickle keeps a few threads warm and the rest end (``_pool.py``).

``run_many``: the core's own threads
------------------------------------
A plain command of ``run_many`` (one with neither ``on_output`` nor
``tmpdir``) runs on a thread of the C core (``csrc/batch.c``, driven by
``_native.Batch``): the iterating thread prepares each command exactly as
``run()`` does (``_run.prepare``), hands the spec over, and builds the
``Result`` when the run is back, so the GIL is taken once a command, not at
each step of every worker's run.  Each core thread keeps one supervisor, one
run at a time, looked at before each run and replaced when a run leaves it
unusable; it frees it before it ends, and it dies with the process.  A
command that needs Python in its thread (a callback, a directory to remove)
switches the rest of the call to Python workers that call ``run()``, after
every earlier result was yielded.  ``Result.duration`` of a core-thread run
counts from the thread taking it up to its end.

Beyond ``ASYNC_MAX_THREADS`` concurrent calls, the extra runs wait in the
pool's queue before they spawn; their ``timeout`` counts from their own spawn,
as with ``run()``.  Wrap the await in ``asyncio.timeout`` for a bound that
includes the wait.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import itertools
import os
import queue
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypedDict, overload

from boundedproc import _command, _native, _run
from boundedproc._cancel import ALSO_CANCEL, Cancel, switch_or_none
from boundedproc._command import Command, StrOrBytesPath
from boundedproc._options import (
    CAPTURE,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    Keep,
    Limits,
    Options,
    OutputCallback,
    StdinSource,
    StdioTarget,
    validate,
)
from boundedproc._pool import IdlePool, NoThread
from boundedproc._result import AnyResult, ProcessFailed, Result
from boundedproc._run import run, unknown_keyword

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["ASYNC_IDLE_SECONDS", "ASYNC_MAX_THREADS", "Job", "JobOptions", "run_async", "run_many"]

#: Most threads ``run_async`` uses at once; more concurrent calls queue.
ASYNC_MAX_THREADS = 512

#: Seconds a ``run_async`` thread waits for more work before it ends (with its supervisor).
#: Runs awaited back to back, or a few at a time, keep reusing the same threads; a thread
#: started again after a longer pause costs about a millisecond (thread and supervisor),
#: small beside a pause that long.
ASYNC_IDLE_SECONDS = 2.0

_pool_lock = threading.Lock()
_async_pool: IdlePool | None = None
_close_registered = False
_dry_switch: Cancel | None = None


_forks = 0  # how many forks this process is down from the one that imported us


def _forget_pool_after_fork() -> None:
    # A forked child has none of the parent's threads: start a fresh pool.
    global _async_pool, _pool_lock, _forks
    _async_pool = None
    _pool_lock = threading.Lock()
    _forks += 1


def _end_idle_before_fork() -> None:
    # A caller that forks between runs is not left multi-threaded by idle threads
    # (Python 3.12+ warns of a fork with threads; the child has none of them anyway).
    pool = _async_pool
    if pool is not None:
        pool.end_idle()


os.register_at_fork(before=_end_idle_before_fork, after_in_child=_forget_pool_after_fork)


def _close_async_pool() -> None:
    # At interpreter exit, before its threads are joined: the idle ones end now.  One
    # function registered once, closing whichever pool this process has (after a fork,
    # the child's own: it inherits the registration, not the parent's pool).
    pool = _async_pool
    if pool is not None:
        pool.shutdown(wait=False)


def _async_executor() -> IdlePool:
    global _async_pool, _close_registered
    with _pool_lock:
        if _async_pool is None:
            pool = IdlePool(ASYNC_MAX_THREADS, ASYNC_IDLE_SECONDS, "boundedproc-async")
            if not _close_registered:
                try:
                    # What concurrent.futures uses for the same purpose: called before
                    # non-daemon threads are joined (atexit runs after, too late).
                    threading._register_atexit(_close_async_pool)  # type: ignore[attr-defined]
                except RuntimeError:  # the interpreter is already shutting down
                    pool.shutdown(wait=False)
                _close_registered = True
            _async_pool = pool
        return _async_pool


def _one_shot(cmd: Any) -> Any:
    """``cmd``, with a one-shot iterable turned into a list, since it is read twice.

    A set or a mapping is kept as it is, for ``run()``'s ``TypeError`` (no order).
    """
    if isinstance(cmd, (str, bytes, bytearray, memoryview, Sequence, AbstractSet, Mapping)):
        return cmd
    if hasattr(cmd, "__iter__"):
        return list(cmd)
    return cmd  # not iterable: run() raises the TypeError


def _validate(cmd: Any, options: dict[str, Any]) -> AnyResult:
    """Raise what ``run(cmd, **options)`` would raise for a caller bug; spawn nothing.

    It is ``run()`` itself, with the private second cancel switch already set:
    run() validates every parameter first (SPEC 2.2 step 1) and then, seeing a
    cancelled switch, returns a not-spawned result.  So the checks can never
    drift from run()'s own.  The returned result carries the executed ``args``.
    """
    global _dry_switch
    if _dry_switch is None:
        _dry_switch = Cancel._already_set()  # no fds: it works when the process has none left
    token = ALSO_CANCEL.set(_dry_switch)
    try:
        # check=False: the dry result is not spawned, and check=True would raise it
        return run(cmd, **{**options, "check": False})
    finally:
        ALSO_CANCEL.reset(token)


def _run_watching(switch: Cancel, cmd: Any, options: dict[str, Any]) -> AnyResult:
    # Runs in a worker thread: executors do not copy contextvars, so the switch
    # is set here, in the context where run() executes.
    token = ALSO_CANCEL.set(switch)
    try:
        return run(cmd, **options)
    finally:
        ALSO_CANCEL.reset(token)


def _refusal(code: int, what: str, program: str) -> str:
    """The ``runner_error`` of a run refused ``what`` (errno ``code``) before its spawn."""
    return _native.spawn_failed(code, os.strerror(code), f"{what} for {program!r}")


def _refused(dry: AnyResult, code: int, what: str, check: bool) -> AnyResult:
    """The result of a run the system refused a resource before its spawn (the fds of
    its cancel switch, a thread): what run() returns when a spawn is refused so
    (SPEC 9.1: ``spawn failed: `` and the errno name, never an exception).

    ``dry`` is the run's not-spawned result from ``_validate`` (its args, text mode and
    stdin_delivered).  Raises ProcessFailed with ``check``, as run() would.
    """
    result = replace(dry, exit_code=_native.SPAWN_FAILURE_EXIT_CODE, cancelled=False,
                     runner_error=_refusal(code, what, dry.args[0]))
    if check:
        result.check()
    return result


@overload
async def run_async(
    cmd: Command, *, shell: bool | StrOrBytesPath = ..., timeout: float | None = ...,
    max_output: int | None = ..., on_overflow: Literal["truncate", "kill"] = ...,
    stdin: StdinSource = ..., cwd: StrOrBytesPath | None = ...,
    env: Mapping[str, str | None] | None = ..., env_mode: Literal["merge", "replace"] = ...,
    merge_stderr: bool = ..., text: Literal[False] = ..., cancel: Cancel | None = ...,
    kill_grace: float = ..., drain_grace: float = ..., limits: Limits | None = ...,
    contain: bool | None = ..., on_output: OutputCallback | None = ..., keep: Keep = ...,
    stdout: StdioTarget = ..., stderr: StdioTarget = ..., user: int | str | None = ...,
    group: int | str | None = ..., tmpdir: bool = ..., check: bool = ...,
) -> Result[bytes]: ...
@overload
async def run_async(
    cmd: Command, *, shell: bool | StrOrBytesPath = ..., timeout: float | None = ...,
    max_output: int | None = ..., on_overflow: Literal["truncate", "kill"] = ...,
    stdin: StdinSource = ..., cwd: StrOrBytesPath | None = ...,
    env: Mapping[str, str | None] | None = ..., env_mode: Literal["merge", "replace"] = ...,
    merge_stderr: bool = ..., text: Literal[True], cancel: Cancel | None = ...,
    kill_grace: float = ..., drain_grace: float = ..., limits: Limits | None = ...,
    contain: bool | None = ..., on_output: OutputCallback | None = ..., keep: Keep = ...,
    stdout: StdioTarget = ..., stderr: StdioTarget = ..., user: int | str | None = ...,
    group: int | str | None = ..., tmpdir: bool = ..., check: bool = ...,
) -> Result[str]: ...
@overload
async def run_async(
    cmd: Command, *, shell: bool | StrOrBytesPath = ..., timeout: float | None = ...,
    max_output: int | None = ..., on_overflow: Literal["truncate", "kill"] = ...,
    stdin: StdinSource = ..., cwd: StrOrBytesPath | None = ...,
    env: Mapping[str, str | None] | None = ..., env_mode: Literal["merge", "replace"] = ...,
    merge_stderr: bool = ..., text: bool, cancel: Cancel | None = ...,
    kill_grace: float = ..., drain_grace: float = ..., limits: Limits | None = ...,
    contain: bool | None = ..., on_output: OutputCallback | None = ..., keep: Keep = ...,
    stdout: StdioTarget = ..., stderr: StdioTarget = ..., user: int | str | None = ...,
    group: int | str | None = ..., tmpdir: bool = ..., check: bool = ...,
) -> Result[bytes] | Result[str]: ...
async def run_async(
    cmd: Command,
    *,
    shell: bool | StrOrBytesPath = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_output: int | None = DEFAULT_MAX_OUTPUT,
    on_overflow: Literal["truncate", "kill"] = "truncate",
    stdin: StdinSource = None,
    cwd: StrOrBytesPath | None = None,
    env: Mapping[str, str | None] | None = None,
    env_mode: Literal["merge", "replace"] = "merge",
    merge_stderr: bool = False,
    text: bool = False,
    cancel: Cancel | None = None,
    kill_grace: float = 0.0,
    drain_grace: float = 2.0,
    limits: Limits | None = None,
    contain: bool | None = None,
    on_output: OutputCallback | None = None,
    keep: Keep = "head",
    stdout: StdioTarget = CAPTURE,
    stderr: StdioTarget = CAPTURE,
    user: int | str | None = None,
    group: int | str | None = None,
    tmpdir: bool = False,
    check: bool = False,
    **unknown: object,
) -> Result[bytes] | Result[str]:
    """``run()`` awaitable from asyncio; cancelling the task kills the run's group.

    The command runs on a worker thread of a dedicated pool (see the module
    docstring for why, and what it costs), so any number of ``run_async``
    calls can be awaited together, up to ``ASYNC_MAX_THREADS`` at once.
    Every keyword is ``run()``'s, with the same meaning and default (its
    docstring says more on each).

    Args:
        cmd: As for ``run()``: an argument vector, or a string with ``shell=``.
        shell: As for ``run()``: ``True`` runs a string ``cmd`` with
            ``/bin/sh -c``, a program name or path runs it with that shell.
            Default ``False``.
        timeout: Seconds from the spawn to the deadline; ``None`` for none.
            Default 600.
        max_output: Bytes kept across stdout and stderr together; ``None`` for
            no cap. Default 16 MiB.
        on_overflow: Past the cap, ``"truncate"`` (the default) or ``"kill"``.
        stdin: A payload (``str`` is UTF-8 encoded, as argv), ``None`` (the default:
            EOF at once), ``DEVNULL`` or ``INHERIT``.
        cwd: Directory the child starts in; ``None`` (the default) for the
            caller's.
        env: Variables for the child; a ``None`` value removes one (merge).
        env_mode: ``"merge"`` (the default) applies ``env`` over the caller's
            environment, ``"replace"`` gives the child ``env`` alone.
        merge_stderr: Send the child's stderr where its stdout goes. Default
            ``False``.
        text: Decode stdout and stderr as UTF-8 (``errors="replace"``):
            ``Result[str]`` instead of ``Result[bytes]``. Default ``False``.
        cancel: A switch that ends the run when set, as with ``run()``;
            cancelling the awaiting task does not set it.
        kill_grace: Seconds between SIGTERM and SIGKILL; default 0 (SIGKILL at
            once).
        drain_grace: Seconds to keep reading the pipes after the leader is
            reaped. Default 2.
        limits: Resource limits for the child (``setrlimit`` before exec);
            ``None`` for none.
        contain: Kill also the descendants that left the group, and the run if
            the caller dies; ``None`` (the default) means on where supported.
        on_output: Called as ``on_output(stream, chunk)`` for every chunk
            read, in the worker thread that runs the command.
        keep: Which bytes ``max_output`` keeps: ``"head"`` (the default),
            ``"tail"`` or ``"head+tail"``.
        stdout: ``CAPTURE`` (the default), ``DEVNULL``, ``INHERIT``, an fd or
            an object with ``fileno()``.
        stderr: The same for stderr.
        user: Run as this user (a name or a uid), with its groups.
        group: Run with this group (a name or a gid) instead of the user's.
        tmpdir: Run in a fresh private directory (also ``TMPDIR``), removed
            after the run. Default ``False``.
        check: Raise ``ProcessFailed`` from the await when the result is not
            ``ok``.

    Returns:
        The ``Result`` that ``run()`` returns: ``Result[bytes]``, or
        ``Result[str]`` with ``text=True``.  As with ``run()``, what the
        command or the OS did is in it, never raised.

    Raises:
        TypeError, ValueError: The caller bugs ``run()`` raises, raised here
            before anything is spawned and before a thread is used.
        asyncio.CancelledError: The awaiting task was cancelled.  By then the
            run's whole group was killed and its leader reaped (a second
            cancel during that short wait does not abandon it).  The caller's
            own ``cancel=`` switch is left untouched.
    """
    if unknown:
        raise unknown_keyword(unknown, "run_async")
    options: dict[str, Any] = dict(
        shell=shell, timeout=timeout, max_output=max_output, on_overflow=on_overflow,
        stdin=stdin, cwd=cwd, env=env, env_mode=env_mode, merge_stderr=merge_stderr, text=text,
        cancel=cancel, kill_grace=kill_grace, drain_grace=drain_grace, limits=limits,
        contain=contain, on_output=on_output, keep=keep, stdout=stdout, stderr=stderr,
        user=user, group=group, tmpdir=tmpdir, check=check, **unknown)
    import asyncio  # here, not at the top: only a caller in a loop, which has it, pays for it

    cmd = _one_shot(cmd)
    dry = _validate(cmd, options)
    loop = asyncio.get_running_loop()
    try:
        switch = Cancel()
    except OSError as err:  # out of fds: run() would report the same, not raise
        return _refused(dry, err.errno or errno.EMFILE, "cancel switch", check)
    try:
        submitted = _async_executor().submit(_run_watching, switch, cmd, options)
    except NoThread:  # out of process slots: run() would report the same, not raise
        switch.close()
        return _refused(dry, errno.EAGAIN, "a thread", check)
    except BaseException:
        switch.cancel()  # a raise inside submit (a signal handler's): a run queued ends at once
        raise
    try:
        return await _await_run(asyncio.wrap_future(submitted, loop=loop), switch)
    except BaseException:
        # Any other end of this call (a handler's raise between the submit and the await,
        # or the run's own error) ends the run too, rather than leave it going unobserved.
        switch.cancel()
        raise
    finally:
        if submitted.done():
            # Now, not by the collector: a cancelled run's switch sits in the reference
            # cycle of its CancelledError.  Only this thread sets it, so no cancel() can
            # write to the fd numbers after they are closed and reused.
            switch.close()


async def _await_run(future: Any, switch: Cancel) -> AnyResult:
    """Await a run_async's run: a cancel of the awaiting task kills the run's group and
    waits until it is reaped (SPEC 6) before ``CancelledError`` goes on."""
    import asyncio  # loaded by now: run_async's caller is in a loop

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


class JobOptions(TypedDict, total=False):
    """The options a ``Job`` may set: every keyword of ``run()`` but ``text``.

    ``text`` is shared by every result of one ``run_many`` (pass it there), so
    that all of them have one output type.
    """

    shell: bool | StrOrBytesPath
    timeout: float | None
    max_output: int | None
    on_overflow: Literal["truncate", "kill"]
    stdin: StdinSource
    cwd: StrOrBytesPath | None
    env: Mapping[str, str | None] | None
    env_mode: Literal["merge", "replace"]
    merge_stderr: bool
    cancel: Cancel | None
    kill_grace: float
    drain_grace: float
    limits: Limits | None
    contain: bool | None
    on_output: OutputCallback | None
    keep: Keep
    stdout: StdioTarget
    stderr: StdioTarget
    user: int | str | None
    group: int | str | None
    tmpdir: bool
    check: bool


@dataclass(frozen=True, slots=True, init=False)
class Job:
    """One command for ``run_many`` with options of its own.

    ``Job(cmd, cwd=d, stdin=data, timeout=5)``: the options given here
    override ``run_many``'s shared ones for this run only; the ones not given
    are the shared ones.  They are checked when ``run_many`` takes the job
    from its input, as the shared ones would be: a bad one is raised there
    (``TypeError``/``ValueError``), in the job's turn, never skipped.

    Attributes:
        cmd: As for ``run()``: an argument vector, or a string with ``shell=``
            (its own, or ``run_many``'s).
        options: The overriding keywords, read-only.
    """

    cmd: Command
    options: Mapping[str, Any]

    def __init__(self, cmd: Command, **options: Unpack[JobOptions]) -> None:
        object.__setattr__(self, "cmd", cmd)
        object.__setattr__(self, "options", types.MappingProxyType(dict(options)))

    def __repr__(self) -> str:
        given = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"Job({self.cmd!r}{given})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_job, (self.cmd, dict(self.options)))


_JOB_KEYWORDS = frozenset(JobOptions.__annotations__)


def _job(cmd: Command, options: dict[str, Any]) -> Job:
    """Unpickle a ``Job`` (its read-only options mapping cannot be pickled as is)."""
    return Job(cmd, **options)


def _per_command(item: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The command and the options run() gets for one input item.

    A ``Job``'s own options override the shared ones, its own ``shell=``
    included (``Job(vector, shell=False)`` under a shared ``shell=``).

    Raises:
        TypeError: a ``Job`` that sets ``text``.
    """
    own: Mapping[str, Any] = {}
    if isinstance(item, Job):
        own = item.options
        if "text" in own:
            raise TypeError("Job(text=...): text is shared by every result of one run_many; "
                            "pass it to run_many")
        unknown = own.keys() - _JOB_KEYWORDS
        if unknown:
            raise unknown_keyword(dict.fromkeys(unknown), "Job")
        item = item.cmd
    return _one_shot(item), {**options, **own}


@overload
def run_many(
    cmds: Iterable[Command | Job], jobs: int = ..., *, progress: bool = ...,
    shell: bool | StrOrBytesPath = ..., timeout: float | None = ...,
    max_output: int | None = ..., on_overflow: Literal["truncate", "kill"] = ...,
    stdin: StdinSource = ..., cwd: StrOrBytesPath | None = ...,
    env: Mapping[str, str | None] | None = ..., env_mode: Literal["merge", "replace"] = ...,
    merge_stderr: bool = ..., text: Literal[False] = ..., cancel: Cancel | None = ...,
    kill_grace: float = ..., drain_grace: float = ..., limits: Limits | None = ...,
    contain: bool | None = ..., on_output: OutputCallback | None = ..., keep: Keep = ...,
    stdout: StdioTarget = ..., stderr: StdioTarget = ..., user: int | str | None = ...,
    group: int | str | None = ..., tmpdir: bool = ..., check: bool = ...,
) -> Generator[Result[bytes], None, None]: ...
@overload
def run_many(
    cmds: Iterable[Command | Job], jobs: int = ..., *, progress: bool = ...,
    shell: bool | StrOrBytesPath = ..., timeout: float | None = ...,
    max_output: int | None = ..., on_overflow: Literal["truncate", "kill"] = ...,
    stdin: StdinSource = ..., cwd: StrOrBytesPath | None = ...,
    env: Mapping[str, str | None] | None = ..., env_mode: Literal["merge", "replace"] = ...,
    merge_stderr: bool = ..., text: Literal[True], cancel: Cancel | None = ...,
    kill_grace: float = ..., drain_grace: float = ..., limits: Limits | None = ...,
    contain: bool | None = ..., on_output: OutputCallback | None = ..., keep: Keep = ...,
    stdout: StdioTarget = ..., stderr: StdioTarget = ..., user: int | str | None = ...,
    group: int | str | None = ..., tmpdir: bool = ..., check: bool = ...,
) -> Generator[Result[str], None, None]: ...
@overload
def run_many(
    cmds: Iterable[Command | Job], jobs: int = ..., *, progress: bool = ...,
    shell: bool | StrOrBytesPath = ..., timeout: float | None = ...,
    max_output: int | None = ..., on_overflow: Literal["truncate", "kill"] = ...,
    stdin: StdinSource = ..., cwd: StrOrBytesPath | None = ...,
    env: Mapping[str, str | None] | None = ..., env_mode: Literal["merge", "replace"] = ...,
    merge_stderr: bool = ..., text: bool, cancel: Cancel | None = ...,
    kill_grace: float = ..., drain_grace: float = ..., limits: Limits | None = ...,
    contain: bool | None = ..., on_output: OutputCallback | None = ..., keep: Keep = ...,
    stdout: StdioTarget = ..., stderr: StdioTarget = ..., user: int | str | None = ...,
    group: int | str | None = ..., tmpdir: bool = ..., check: bool = ...,
) -> Generator[Result[bytes] | Result[str], None, None]: ...
def run_many(
    cmds: Iterable[Command | Job],
    jobs: int = 4,
    *,
    progress: bool = False,
    shell: bool | StrOrBytesPath = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_output: int | None = DEFAULT_MAX_OUTPUT,
    on_overflow: Literal["truncate", "kill"] = "truncate",
    stdin: StdinSource = None,
    cwd: StrOrBytesPath | None = None,
    env: Mapping[str, str | None] | None = None,
    env_mode: Literal["merge", "replace"] = "merge",
    merge_stderr: bool = False,
    text: bool = False,
    cancel: Cancel | None = None,
    kill_grace: float = 0.0,
    drain_grace: float = 2.0,
    limits: Limits | None = None,
    contain: bool | None = None,
    on_output: OutputCallback | None = None,
    keep: Keep = "head",
    stdout: StdioTarget = CAPTURE,
    stderr: StdioTarget = CAPTURE,
    user: int | str | None = None,
    group: int | str | None = None,
    tmpdir: bool = False,
    check: bool = False,
    **unknown: object,
) -> Generator[Result[bytes], None, None] | Generator[Result[str], None, None]:
    """Run many commands, at most ``jobs`` at once, yielding results in input order.

    ``cmds`` is read lazily: at most ``8 * jobs`` commands are taken from it
    ahead of the consumer (running, queued, or finished and waiting their
    turn), so a generator of a million commands is never materialised and
    memory stays bounded by ``8 * jobs`` results.  What a command does (fails,
    hangs to its deadline, is missing, floods its output) is only its
    ``Result``: it never stops the others.  A finished run may wait up to 2 ms
    for others to end before the iterator hears of it (fewer wakeups at scale).

    Closing the iterator early (``break`` out of a ``for`` over it, ``close()``,
    or its garbage collection) cancels the runs in flight, waits until their
    groups are killed and reaped, and starts nothing more.  Hold the iterator
    in ``contextlib.closing`` when it may outlive a ``break``.

    The keywords after ``progress`` are ``run()``'s, with its meanings and
    defaults (its docstring says more on each), shared by every command that
    does not override them in a ``Job``.

    Args:
        cmds: Commands; each is a string (run with ``shell=``), an argument
            vector, or a ``Job`` whose options override the shared ones for
            that run (its cwd, stdin, env, timeout, shell, ...).  As in
            ``run()``, a vector with a truthy ``shell=`` is a caller bug
            (``ValueError`` in its turn): to mix strings and vectors, pass
            ``shell=`` for the strings and each vector as
            ``Job(vector, shell=False)``.
        jobs: Most commands running at once (>= 1).
        progress: Show a tqdm progress bar on stderr, advanced as results are
            yielded, when tqdm is importable (the ``cli`` extra); nothing
            otherwise.
        shell: As for ``run()``: ``True`` runs each string with ``/bin/sh
            -c``, a program name or path with that shell. Default ``False``.
        timeout: Seconds from the spawn to the deadline; ``None`` for none.
            Default 600.
        max_output: Bytes kept across stdout and stderr together; ``None`` for
            no cap. Default 16 MiB.
        on_overflow: Past the cap, ``"truncate"`` (the default) or ``"kill"``.
        stdin: A payload (``str`` is UTF-8 encoded, as argv), ``None`` (the default:
            EOF at once), ``DEVNULL`` or ``INHERIT``.
        cwd: Directory the child starts in; ``None`` (the default) for the
            caller's.
        env: Variables for the child; a ``None`` value removes one (merge).
        env_mode: ``"merge"`` (the default) applies ``env`` over the caller's
            environment, ``"replace"`` gives the child ``env`` alone.
        merge_stderr: Send the child's stderr where its stdout goes. Default
            ``False``.
        text: Decode stdout and stderr as UTF-8 (``errors="replace"``):
            ``Result[str]`` instead of ``Result[bytes]``. Default ``False``.
        cancel: A switch that cancels every run it reaches once set (a run
            whose switch is already set spawns nothing).
        kill_grace: Seconds between SIGTERM and SIGKILL; default 0 (SIGKILL at
            once).
        drain_grace: Seconds to keep reading the pipes after the leader is
            reaped. Default 2.
        limits: Resource limits for the child (``setrlimit`` before exec);
            ``None`` for none.
        contain: Kill also the descendants that left the group, and the run if
            the caller dies; ``None`` (the default) means on where supported.
        on_output: Called as ``on_output(stream, chunk)`` for every chunk
            read, in the worker thread that runs the command (a ``Job`` may
            give its own).
        keep: Which bytes ``max_output`` keeps: ``"head"`` (the default),
            ``"tail"`` or ``"head+tail"``.
        stdout: ``CAPTURE`` (the default), ``DEVNULL``, ``INHERIT``, an fd or
            an object with ``fileno()``.
        stderr: The same for stderr.
        user: Run as this user (a name or a uid), with its groups.
        group: Run with this group (a name or a gid) instead of the user's.
        tmpdir: Run in a fresh private directory (also ``TMPDIR``), removed
            after the run. Default ``False``.
        check: Raise a failed run's ``ProcessFailed`` from the iterator in its
            turn.

    Returns:
        An iterator of ``Result``, one per command, in input order:
        ``Result[bytes]``, or ``Result[str]`` with ``text=True`` (a ``Job``
        cannot change ``text``, so every result has the same type).

    Raises:
        TypeError, ValueError: A caller bug in ``jobs`` or the shared
            options, raised by this call, before anything is spawned.  A
            caller bug in one command or in a ``Job``'s options (a string
            without ``shell=``, an empty vector, a wrong type, a misspelt or
            bad option), or an exception raised by ``cmds`` itself, is raised
            by the iterator at that command's position: every earlier
            command's result is yielded first and no later command is started.
    """
    if unknown:
        raise unknown_keyword(unknown, "run_many")
    options: dict[str, Any] = dict(
        shell=shell, timeout=timeout, max_output=max_output, on_overflow=on_overflow,
        stdin=stdin, cwd=cwd, env=env, env_mode=env_mode, merge_stderr=merge_stderr, text=text,
        cancel=cancel, kill_grace=kill_grace, drain_grace=drain_grace, limits=limits,
        contain=contain, on_output=on_output, keep=keep, stdout=stdout, stderr=stderr,
        user=user, group=group, tmpdir=tmpdir, check=check, **unknown)
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
    _validate("true" if shell else ["true"], options)
    total = len(cmds) if hasattr(cmds, "__len__") else None  # type: ignore[arg-type]
    return _many(source, jobs, progress, total, options)


def _progress_bar(total: int | None) -> Any:
    try:
        tqdm = importlib.import_module("tqdm").tqdm  # optional: the `cli` extra
    except ImportError:
        return None
    return tqdm(total=total, file=sys.stderr, unit="cmd", dynamic_ncols=True)


class _Slot:
    """One command's place in ``run_many``'s window: its result (or the exception
    its run raised) once ``done`` is released by the worker that ran it."""

    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Lock()
        self.done.acquire()
        self.result: AnyResult | None = None
        self.error: BaseException | None = None

    def refused(self, cmd: Any, options: dict[str, Any], code: int, what: str) -> None:
        """Done, not spawned: the system refused ``what`` (errno ``code``) first."""
        try:
            self.result = _refused(_validate(cmd, options), code, what, options["check"])
        except ProcessFailed as err:  # raised by the iterator in its turn, as run() would
            self.error = err
        self.done.release()

    def take(self) -> AnyResult:
        """Wait for the run (Ctrl-C can interrupt the wait) and return its result."""
        self.done.acquire()
        self.done.release()  # taken: a second take() does not block
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


# A command for a run_many worker (its slot, the command, run()'s options); None: stop.
_Task = tuple[_Slot, Any, dict[str, Any]] | None


# The runner_error of a run refused for want of fds or of process slots (SPEC 2.1's stable
# prefix): RLIMIT_NPROC counts the call's threads, supervisors and commands together.
_OUT_OF_ROOM = ("spawn failed: EMFILE", "spawn failed: ENFILE", "spawn failed: EAGAIN")


class _FdShare:
    """The Python workers of one ``run_many`` call, sharing the process's fds.

    Out of fds is the call's own doing while its other runs hold theirs (a low
    ``RLIMIT_NOFILE`` and many jobs): a run that finds it so waits until another
    run of the call ends (or 20 ms passed) and tries again, within its own
    ``timeout`` and cancel switches, instead of coming back a spawn failure that
    a grader grades unrunnable.  With no other run of the call under way it is
    tried once more (the last one may have just ended), then EMFILE is its
    result.  The same for out of process slots (EAGAIN) while its other commands run.
    As the core's workers do (batch.c, ``wait_for_fds``)."""

    __slots__ = ("cv", "running", "waiting")

    def __init__(self) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.running = 0
        self.waiting = 0

    def run(self, cmd: Any, options: dict[str, Any]) -> AnyResult:
        with self.cv:
            self.running += 1
        try:
            started = time.monotonic()
            tries_alone = 0
            # check=True is applied once the run is final, not to an EMFILE to try again.
            unchecked = {**options, "check": False} if options["check"] else options
            while True:
                result: AnyResult = run(cmd, **unchecked)
                if result.spawned or not (result.runner_error or "").startswith(_OUT_OF_ROOM):
                    break
                with self.cv:
                    others = self.running - self.waiting - 1
                    if others <= 0:
                        tries_alone += 1
                        if tries_alone > 1:
                            break
                    else:
                        self.waiting += 1
                        self.cv.wait(0.02)
                        self.waiting -= 1
                if self._timed_out(started, options):
                    break
                # Cancelled meanwhile: the next run() says so (not spawned, cancelled), as
                # for any run whose switch was set before its spawn.
        finally:
            with self.cv:
                self.running -= 1
                if self.waiting:
                    self.cv.notify_all()  # its fds are free
        if options["check"]:
            result.check()
        return result

    @staticmethod
    def _timed_out(started: float, options: dict[str, Any]) -> bool:
        """Whether a run waiting for fds is to keep its EMFILE: past its timeout."""
        timeout = options.get("timeout", DEFAULT_TIMEOUT)
        return timeout is not None and time.monotonic() - started >= timeout


def _work(tasks: queue.SimpleQueue[_Task], switch: Cancel | None, fds: _FdShare) -> None:
    """A ``run_many`` worker: run the tasks it is given until it gets ``None``.

    The call's switch is set once for the thread (executors do not copy
    contextvars, and a thread of ours has nothing else to run)."""
    ALSO_CANCEL.set(switch)
    while True:
        task = tasks.get()
        if task is None:
            return
        slot, cmd, options = task
        try:
            slot.result = fds.run(cmd, options)
        except BaseException as err:  # noqa: BLE001  raised by the consumer, in its turn
            slot.error = err
        finally:
            slot.done.release()


def _many(source: Iterator[Command | Job], jobs: int, progress: bool, total: int | None,
          options: dict[str, Any]) -> Generator[Any, None, None]:
    # Runs at the first next(): an iterator never started spawns, draws, holds nothing.
    bar = _progress_bar(total) if progress else None
    # No more workers than RLIMIT_NOFILE leaves room for: each holds a supervisor, and
    # past that room the supervisors would leave no fd for any run (batch.c).  The read-
    # ahead window follows the workers there are, not the jobs asked for (jobs=10**9
    # must not draw 8 * 10**9 commands), and the core takes an int.
    jobs = _native.lib.bp_jobs_within_fd_limit(min(jobs, _MAX_JOBS))
    try:
        batch = _new_batch(jobs, WINDOW_PER_JOB * jobs) if _batchable(options) else None
        if batch is not None:
            rest = yield from _many_batch(batch, source, bar, options)
            if rest is _NO_REST:
                return
            source = itertools.chain([rest], source)
        yield from _many_threads(source, jobs, bar, options)
    finally:
        if bar is not None:
            with contextlib.suppress(Exception):
                bar.close()


def _batchable(options: Mapping[str, Any]) -> bool:
    """Whether a command with these (merged) options can run on a core thread: one
    with ``on_output`` or ``tmpdir`` needs Python in the thread that runs it."""
    return options.get("on_output") is None and not options.get("tmpdir")


def _new_batch(jobs: int, window: int) -> _native.Batch | None:
    """A batch of ``jobs`` core threads holding at most ``window`` runs, or None (out of
    fds or memory: the Python workers then run everything, and report such a shortage
    run by run)."""
    try:
        if threading.current_thread() is threading.main_thread():
            _native._get_wake_pipe()  # made once: the consumer's wait wakes on Ctrl-C
        return _native.Batch(jobs, window)
    except (OSError, MemoryError):
        return None


_MAX_JOBS = 2**31 - 1  # the core's int

# Commands taken from the input ahead of the consumer, per job: running, queued, or
# finished and waiting their turn.  Results are yielded in input order, so one slow
# command holds the finished ones behind it in the window; with 2 a job, the workers
# often idled behind such a head at scale.  With 4, the consumer, told of up to
# 2 * jobs finished runs at once (csrc/batch.c), found about 4 left queued, and the
# workers ran dry while it built those results: the CPUs idled 2-3% of a B9 run
# (floor.c: under 1%).  With 8 they idle about 1%, and the consumer is woken less
# (benchmarks/README.md, "How far run_many reads ahead").  It is also the bound on the
# results held in memory.
WINDOW_PER_JOB = 8

_NO_REST = object()
_STOP = object()


def _draw(source: Iterator[Any], pending: deque[Any]) -> Any:
    """The next input item, or ``_STOP``: at the end of the input, or when drawing
    raised (the error then waits in ``pending``, to be raised in its turn)."""
    try:
        return next(source)
    except StopIteration:
        return _STOP
    except Exception as err:  # noqa: BLE001  the input failed: raise it in its turn
        pending.append(_Raise(err))
        return _STOP


class _BatchSlot:
    """One command of ``_many_batch``: prepared in the consumer, run on a core thread,
    its ``Result`` (or what run() would have raised) built when its run is back."""

    __slots__ = ("error", "prepared", "result", "started")

    def __init__(self, cmd: Any, shell: Any, options: Options, switch: Cancel | None) -> None:
        """Raises TypeError, ValueError: what run() raises for a caller bug."""
        self.started = time.monotonic()
        self.result: AnyResult | None = None
        self.error: BaseException | None = None
        token = ALSO_CANCEL.set(switch)
        try:
            self.prepared = _run.prepare(cmd, shell, options)
        finally:
            ALSO_CANCEL.reset(token)
        if self.prepared.spec is None:
            self._set(_run._not_spawned(self.prepared, self.started))

    def _set(self, result: AnyResult) -> None:
        self.result = result
        if self.prepared.options.check:
            try:
                result.check()
            except ProcessFailed as err:  # raised by the iterator in its turn, as run() would
                self.error = err

    def refused(self, code: int, what: str) -> None:
        """Not spawned: the system refused ``what`` (errno ``code``) before the spawn."""
        why = _refusal(code, what, _command.text_arg(self.prepared.args[0]))
        self._set(_run._not_spawned(replace(self.prepared, spec=None, runner_error=why),
                                    self.started))

    def finish(self, done: _native.BatchDone) -> None:
        if done.error is not None:
            self.error = done.error
        elif done.outcome is None:  # its switch was set before its turn
            self._set(_run._not_spawned(replace(self.prepared, spec=None, cancelled=True),
                                        self.started))
        else:
            self._set(_run._to_result(done.outcome, self.prepared, self.started,
                                      duration=done.duration))

    def take(self, batch: _native.Batch, running: dict[int, _BatchSlot]) -> AnyResult:
        """Its result, waiting for runs to end (any order) until its own has.

        Raises RuntimeError in a forked child, even for a result that was already in:
        the iterator is its parent's (``Batch.usable``)."""
        batch.usable()
        while self.result is None and self.error is None:
            for done in batch.next():
                running.pop(done.tag).finish(done)
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _in_order(pending: deque[Any], fill: Callable[[], None], take: Callable[[Any], AnyResult],
              bar: Any) -> Generator[AnyResult, None, None]:
    """Yield each pending command's result in input order (``take`` waits for it),
    drawing more input as places in the window free up; raise an input's or a
    command's caller bug in its turn."""
    fill()
    while pending:
        head = pending.popleft()
        if isinstance(head, _Raise):
            raise head.error
        result = take(head)
        fill()  # keep the workers busy while the consumer handles this one
        if bar is not None:
            bar.update(1)
        yield result


def _many_batch(batch: _native.Batch, source: Iterator[Any], bar: Any,
                options: dict[str, Any]) -> Generator[Any, None, Any]:
    """``run_many`` on the core's threads (csrc/batch.c): Python prepares each command
    and builds its result in the consumer; nothing runs in Python between its runs.

    Returns the first item that needs a Python worker (``_batchable``), after every
    earlier result was yielded, or ``_NO_REST``.
    """
    window = batch.window  # the batch is sized for it
    # One switch for every run of this call, set on early close (by batch.close(), so
    # that a raise in the cleanup before it cannot leave the runs going).  None while the
    # process has no fds for it (EMFILE): asked for again before each command, which is
    # refused (a spawn failure) until it exists, so that no run goes that an early close
    # or a Ctrl-C could not end.
    switch = batch.switch = switch_or_none()
    pending: deque[_BatchSlot | _Raise] = deque()
    running: dict[int, _BatchSlot] = {}
    tags = itertools.count()
    rest: Any = _NO_REST
    more = True

    # The shared options, for every item that is not a Job.  validate() hands back one
    # cached Options for plain values (no env, stdin, cancel, limits, ...), and those
    # cannot change during the call: once it has handed back the same object twice, it
    # is kept instead of validated again for each command.  Other options (an env dict
    # the caller may edit meanwhile) are validated for each command, as run() would.
    base = {name: value for name, value in options.items() if name != "shell"}
    shared: Options | None = None
    last: Options | None = None

    def validated_shared() -> Options:
        nonlocal shared, last
        if shared is not None:
            return shared
        got = validate(**base)
        if got is last:
            shared = got
        last = got
        return got

    def fill() -> None:
        nonlocal more, rest, switch
        while more and len(pending) < window:
            item = _draw(source, pending)
            if item is _STOP:
                more = False
                return
            if switch is None:
                switch = batch.switch = switch_or_none()
            try:
                if isinstance(item, Job):
                    cmd, opts = _per_command(item, options)
                    if not _batchable(opts):
                        rest, more = item, False  # for the Python workers, after these
                        return
                    shell = opts.pop("shell")
                    slot = _BatchSlot(cmd, shell, validate(**opts), switch)
                else:  # the shared options, which _many found batchable
                    cmd = _one_shot(item)
                    slot = _BatchSlot(cmd, options["shell"], validated_shared(), switch)
            except (TypeError, ValueError) as err:
                pending.append(_Raise(err))
                more = False
                return
            pending.append(slot)
            if slot.result is not None or slot.prepared.spec is None:
                continue  # done already: not to be spawned
            if switch is None:
                slot.refused(errno.EMFILE, "the run_many cancel switch")
                continue
            tag = next(tags)  # started at once: the source may be slow to give the next
            try:
                batch.submit(tag, slot.prepared.spec)
            except OSError as err:  # not one worker thread: out of process slots
                slot.refused(err.errno or errno.EAGAIN, "a run_many worker thread")
            else:
                running[tag] = slot

    owner = _forks
    try:
        yield from _in_order(pending, fill, lambda slot: slot.take(batch, running), bar)
        return rest
    finally:
        if _forks == owner:  # a forked child's copy of the switch is the parent's
            # In-flight runs end now (their switch set), queued ones spawn nothing, and
            # the close waits for every worker: every run's group is killed and reaped.
            batch.close()
        if switch is not None:
            switch.close()


class _Workers:
    """A ``run_many`` call's Python workers, and the one place that ends them.

    ``close()`` sets the call's switch when the call was cut short (in-flight runs end now,
    queued ones spawn nothing), gives every worker its stop, waits for them, and closes the
    switch.  A raise inside it (a second Ctrl-C) leaves the rest to ``__del__``, which the
    generator's frame going away runs, as ``Batch`` does for the core's threads: the workers
    were otherwise never told to stop, and waited for good.
    """

    __slots__ = ("__weakref__", "consumer", "cut_short", "owner", "switch", "tasks", "threads")

    def __init__(self, tasks: queue.SimpleQueue[_Task], switch: Cancel | None) -> None:
        self.tasks = tasks
        self.switch = switch
        self.threads: list[threading.Thread] = []
        self.cut_short = True  # until the call's consumer took every result
        self.owner = _forks
        self.consumer = threading.get_ident()  # the thread that took a result last
        _open_crews.add(self)
        _close_abandoned_at_exit()

    def close(self) -> None:
        """End the workers (idempotent); a forked child's copy only lets go of its fds."""
        ours = _forks == self.owner  # a forked child's switch and workers are the parent's
        if self.cut_short and ours and self.switch is not None:
            self.switch.cancel()
        for _ in self.threads:
            self.tasks.put(None)  # again after a raise: a stop too many is never taken
        # A generator left open to the interpreter's exit is closed by its last collection,
        # when daemon threads no longer run Python: 3.13 parks them for good, and a join
        # would never return. Their runs were ended by the switch (the core kills and reaps
        # without Python), and the supervisors of contained ones see this process go.
        if ours and not sys.is_finalizing():
            for worker in self.threads:
                # A start cut short by a raise may not have begun the thread (join refuses
                # it); begun, it takes its stop and ends.
                with contextlib.suppress(RuntimeError):
                    worker.join()  # every run's group is killed and reaped by now
        self.threads.clear()
        switch, self.switch = self.switch, None
        if switch is not None:
            switch.close()
        _open_crews.discard(self)

    def __del__(self) -> None:
        self.close()


# The calls whose Python workers have not been ended, for _close_abandoned.
_open_crews: weakref.WeakSet[_Workers] = weakref.WeakSet()
_abandoned_registered = False


def _close_abandoned() -> None:
    """At interpreter exit, before non-daemon threads are joined: end the calls left open
    by the main thread or by a thread that has ended (``it = run_many(...); next(it)`` at a
    script's end).  Their workers are daemon threads, which stop running Python once the
    interpreter finalizes: a run of theirs was then killed (the switch, the supervisor) but
    its ``tmpdir`` never removed.  Ended here, each worker's run is cancelled and cleans
    up as after any cancel.  A call that a running thread still consumes is left to it."""
    running = {t.ident for t in threading.enumerate()} - {threading.main_thread().ident}
    for crew in list(_open_crews):
        if crew.owner == _forks and crew.consumer not in running:
            with contextlib.suppress(Exception):
                crew.close()


def _close_abandoned_at_exit() -> None:
    global _abandoned_registered
    if not _abandoned_registered:
        _abandoned_registered = True  # once: a forked child inherits the registration
        with contextlib.suppress(RuntimeError):  # already shutting down: nothing to add
            threading._register_atexit(_close_abandoned)  # type: ignore[attr-defined]


def _many_threads(source: Iterator[Any], jobs: int, bar: Any,
                  options: dict[str, Any]) -> Generator[Any, None, None]:
    # Python workers that call run(): for commands with on_output or tmpdir, which
    # need Python in the thread that runs them.
    #
    # Its own workers, not a ThreadPoolExecutor: a command costs a queue put and get
    # and a lock, not a Future with its condition variable, and every microsecond of
    # Python here holds the GIL that the other workers' runs need (B9).
    window = WINDOW_PER_JOB * jobs  # jobs: already within the fd limit (_many)
    # One switch for every run of this call, set on early close; None while the process
    # has no fds for it (EMFILE): asked for again before each command, which is refused
    # until it exists (as in _many_batch).
    switch = switch_or_none()
    tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
    fds = _FdShare()
    crew = _Workers(tasks, switch)
    workers = crew.threads
    pending: deque[_Slot | _Raise] = deque()
    more = True

    def fill() -> None:
        nonlocal more, switch
        while more and len(pending) < window:
            cmd = _draw(source, pending)
            if cmd is _STOP:
                more = False
                return
            if switch is None:
                switch = crew.switch = switch_or_none()
            try:
                job = isinstance(cmd, Job)
                cmd, opts = _per_command(cmd, options)
                if job:
                    _validate(cmd, opts)  # options of its own: every check run() makes
                else:
                    # The shared options were checked once: a plain command can only be
                    # a caller bug in its own shape (a string without a shell, ...).
                    with contextlib.suppress(_command.UnencodableArgv):  # content: a result
                        _command.argv_of(cmd, opts["shell"])
            except (TypeError, ValueError) as err:
                pending.append(_Raise(err))
                more = False
                return
            slot = _Slot()
            pending.append(slot)
            if switch is None:  # no worker starts without it: every one watches it
                slot.refused(cmd, opts, errno.EMFILE, "the run_many cancel switch")
                continue
            if len(workers) < jobs:
                worker = threading.Thread(target=_work, args=(tasks, switch, fds), daemon=True,
                                          name=f"boundedproc-many-{len(workers)}")
                # Listed before its start: a raise inside start() (a Ctrl-C, once the thread
                # runs) must still give it its stop, or another worker waits for good.
                workers.append(worker)
                try:
                    worker.start()
                except RuntimeError:  # out of process slots: a worker already started takes it
                    workers.pop()
                    if not workers:
                        slot.refused(cmd, opts, errno.EAGAIN, "a run_many worker thread")
                        continue
            tasks.put((slot, cmd, opts))

    def take(slot: _Slot) -> AnyResult:
        if _forks != crew.owner:  # its workers are the parent's: the slot would never be done
            raise RuntimeError("boundedproc: a run_many iterator cannot go on in a forked child")
        crew.consumer = threading.get_ident()
        return slot.take()

    try:
        yield from _in_order(pending, fill, take, bar)
        crew.cut_short = False
    finally:
        crew.close()


def _measure_async(n: int = 200, seconds: float = 0.5) -> None:
    """Print the numbers quoted in the module docstring, for run_async and for
    asyncio's own subprocess support (the event loop watching the pipes)."""
    import asyncio

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
