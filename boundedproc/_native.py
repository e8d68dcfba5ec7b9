"""The one module that touches the compiled core.

It turns validated Python values into ``struct bp_spec``, drives the run
(``bp_start`` / ``bp_wait`` / ``bp_free``) and turns ``struct bp_result`` into
a plain frozen dataclass at once, so no cffi object escapes this module.
``Batch`` hands many specs to the core's own threads instead (``bp_batch_*``,
for ``run_many``) and turns each finished run into the same dataclass.
"""

from __future__ import annotations

import atexit
import errno as _errno
import mmap
import operator
import os
import select
import signal
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from boundedproc._cancel import pipe_above_stdio
from boundedproc._version import __version__


def _load_core() -> types.ModuleType:
    """Import the compiled core.

    Running from a source checkout (``python -m pytest`` puts it first on
    ``sys.path``) finds a ``boundedproc/`` without the compiled ``_bp``; then the
    extension of an installed copy of the same version is loaded instead.
    """
    try:
        from boundedproc import _bp

        return _bp
    except ImportError as first:
        import importlib.machinery
        import importlib.util

        here = os.path.dirname(os.path.abspath(__file__))
        for entry in sys.path:
            pkg = os.path.join(entry or ".", "boundedproc")
            if not os.path.isdir(pkg) or os.path.abspath(pkg) == here:
                continue
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(pkg, "_bp" + suffix)
                if os.path.exists(path):
                    spec = importlib.util.spec_from_file_location("boundedproc._bp", path)
                    if spec is None or spec.loader is None:
                        continue
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    sys.modules["boundedproc._bp"] = module
                    return module
        raise ImportError(
            "boundedproc's C core is not built: install the package (pip install .) "
            "or build it in place (python csrc/build_ffi.py)"
        ) from first


_bp = _load_core()
ffi = _bp.ffi
lib = _bp.lib

DEADLINE_EXIT_CODE: int = lib.BP_DEADLINE_EXIT_CODE
CANCEL_EXIT_CODE: int = lib.BP_CANCEL_EXIT_CODE
SPAWN_FAILURE_EXIT_CODE: int = lib.BP_SPAWN_FAILURE_EXIT_CODE

RLIMIT_CPU: int = lib.BP_RLIMIT_CPU
RLIMIT_AS: int = lib.BP_RLIMIT_AS
RLIMIT_NPROC: int = lib.BP_RLIMIT_NPROC
RLIMIT_FSIZE: int = lib.BP_RLIMIT_FSIZE
RLIMIT_NOFILE: int = lib.BP_RLIMIT_NOFILE
NRLIMITS: int = lib.BP_NRLIMITS

WATCH_AUTO: int = lib.BP_WATCH_AUTO
WATCH_THREAD: int = lib.BP_WATCH_THREAD


_STAGES = {
    lib.BP_STAGE_PIPE: "pipe",
    lib.BP_STAGE_FORK: "vfork",
    lib.BP_STAGE_SETSID: "setsid",
    lib.BP_STAGE_DUP: "dup2",
    lib.BP_STAGE_CHDIR: "chdir",
    lib.BP_STAGE_RLIMIT: "setrlimit",
    lib.BP_STAGE_EXEC: "execve",
    lib.BP_STAGE_ALLOC: "malloc",
    lib.BP_STAGE_POLL: "poll",
    lib.BP_STAGE_READ: "read",
    lib.BP_STAGE_WRITE: "write",
    lib.BP_STAGE_WAIT: "wait4",
    lib.BP_STAGE_KILL: "kill",
    lib.BP_STAGE_PIDFD: "pidfd_open",
    lib.BP_STAGE_THREAD: "pthread_create",
    lib.BP_STAGE_PRCTL: "prctl",
    lib.BP_STAGE_SUPERVISOR: "supervisor",
    lib.BP_STAGE_SETGROUPS: "setgroups",
    lib.BP_STAGE_SETGID: "setgid",
    lib.BP_STAGE_SETUID: "setuid",
    lib.BP_STAGE_MEMFD: "memfd_create",
    lib.BP_STAGE_SETPGID: "setpgid",
}


def core_version() -> str:
    """The version compiled into the C core (must equal the package's)."""
    return str(ffi.string(lib.bp_version()).decode("ascii"))


if core_version() != __version__:  # pragma: no cover - only on a stale build
    raise ImportError(
        f"boundedproc's compiled core is version {core_version()}, the package is "
        f"{__version__}: rebuild it (pip install .)"
    )


SUPERVISOR_PATH = os.path.join(os.path.dirname(os.path.abspath(str(_bp.__file__))), "_bp_supervisor")


def _under_valgrind() -> bool:
    """Whether valgrind runs this process: it preloads its own ``vgpreload_core`` into the
    process it runs (and takes it out of the environment of a child it does not follow).
    It stops the whole process at a supervisor's start, a ``clone`` it does not support
    (``CLONE_VM | CLONE_VFORK | CLONE_FS``: the supervisor shares the caller's cwd)."""
    return "/vgpreload_core" in os.environ.get("LD_PRELOAD", "")


def _refusal_at_import() -> str | None:
    """Why contained runs are not available in this process, or ``None`` when they are."""
    if not lib.bp_contain_supported():
        return "unsupported here: containment needs Linux with PR_SET_CHILD_SUBREAPER"
    if not os.access(SUPERVISOR_PATH, os.X_OK):
        return f"the supervisor program is missing: {SUPERVISOR_PATH}"
    if _under_valgrind():
        return ("unsupported under valgrind: it stops the process at the supervisor's start "
                "(clone with CLONE_FS)")
    return None


_REFUSAL: str | None = _refusal_at_import()

CONTAIN_SUPPORTED: bool = _REFUSAL is None
"""Whether contained runs are available: Linux with a subreaper, and the
supervisor program beside the core, in a process valgrind does not run.  It
turns False, with a warning, if the system refuses the supervisor outright
(see ``containment_status``)."""

# errnos that say "this system will not run a supervisor", as opposed to a
# shortage of this moment (EMFILE, EAGAIN, ENOMEM: that run's spawn failure).
_SYSTEMIC = {_errno.ENOSYS, _errno.EPERM, _errno.EINVAL, _errno.EACCES, _errno.ENOENT,
             _errno.ENOEXEC, _errno.ENOTDIR}


FD_CLOSED: int = lib.BP_FD_CLOSED
"""A ``bp_spec`` stdio fd meaning: the child gets that fd closed."""


def containment_status() -> str:
    """``"available"``, or why runs are not contained here (``contain=None``)."""
    return "available" if CONTAIN_SUPPORTED else str(_REFUSAL)

KEEP_MODES: dict[str, int] = {"head": lib.BP_KEEP_HEAD, "tail": lib.BP_KEEP_TAIL,
                              "head+tail": lib.BP_KEEP_HEAD_TAIL}
"""``keep=`` values as the core's ``BP_KEEP_*``."""


def contain_default() -> bool:
    """Whether ``contain=None`` means a contained run here, now."""
    return CONTAIN_SUPPORTED


class _Supervisor:
    """One started supervisor (``struct bp_sup``), owned by one thread's pool."""

    __slots__ = ("__weakref__", "pid", "ptr", "served")

    def __init__(self, ptr: object) -> None:
        self.ptr = ptr
        self.pid = int(lib.bp_sup_pid(ptr))  # for a failure's text: it never changes
        self.served = False  # a run ended on it: an idle one, taken up again

    def usable(self) -> bool:
        return self.ptr is not None and bool(lib.bp_sup_usable(self.ptr))

    def free(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            lib.bp_sup_free(ptr)

    def forget(self) -> None:
        ptr, self.ptr = self.ptr, None
        if ptr is not None:
            lib.bp_sup_forget(ptr)

    def __del__(self) -> None:
        self.free()


# One pool of idle supervisors per thread: a thread runs one command at a time
# (two, when a signal handler runs one while another is in flight), so a run
# never waits for a supervisor and an orphan is never attributed to another
# thread's run.  A thread's pool goes with the thread (threading.local), and
# its supervisors are freed (socket closed, reaped); a supervisor whose thread
# ends without that also exits on its parent-death signal.  A leader gets what a
# child of the calling thread would inherit now: the cwd, root and umask are
# shared with the supervisor (CLONE_FS), and an idle supervisor is usable only
# while this thread's ids, limits, affinity, scheduling and the rest of what a
# child inherits are what they were at its start (sup.c, struct bp_origin); after
# a change, the next run starts a new one.  A supervisor is never pinned to a CPU:
# it and its leaders have the thread's mask, and the kernel places them
# (bp_supervisor.h).
_pool = threading.local()
_every: weakref.WeakSet[_Supervisor] = weakref.WeakSet()
_MAX_IDLE = 2


def _forget_supervisors_after_fork() -> None:
    # The child has none of them as children: drop our copies of their sockets.
    global _pool
    for sup in list(_every):
        sup.forget()
    _pool = threading.local()


os.register_at_fork(after_in_child=_forget_supervisors_after_fork)


@dataclass(frozen=True, slots=True)
class _StartFailure:
    stage: int
    err: int


def _refuse(stage: int, err: int) -> None:
    global CONTAIN_SUPPORTED, _REFUSAL
    CONTAIN_SUPPORTED = False
    step = "execve" if stage == lib.BP_STAGE_SUPERVISOR else stage_name(stage)
    _REFUSAL = (f"refused by this system: the supervisor program {SUPERVISOR_PATH!r} failed "
                f"at {step} with {errno_name(err)}; runs with contain=None are not contained")
    warnings.warn(f"boundedproc: containment is off: {_REFUSAL}", RuntimeWarning, stacklevel=4)


def _supervisor_environment() -> tuple[Any, list[Any]]:
    """The caller's environment as of now (the snapshot a run's child gets with
    ``env=None``), as a ``char *[]`` for the supervisor's exec, and what it points
    to (to be kept alive until the exec is done).

    The supervisor needs none of it (each run's environment comes with the run)
    but what the loader and the sanitizers read; an environment too large for
    any exec (a caller that keeps a huge one for ``env_mode="replace"`` runs)
    would refuse every supervisor its exec (E2BIG), so the supervisor then gets
    only ``LD_*`` and ``*SAN_OPTIONS``."""
    from boundedproc._command import NotSpawned, environment

    env = environment([], "merge")
    assert not isinstance(env, NotSpawned)  # no entries of ours to refuse
    entries = env[0]
    if _too_big_to_exec(entries):
        entries = [e for e in entries
                   if e.startswith(b"LD_") or e.split(b"=", 1)[0].endswith(b"SAN_OPTIONS")]
    keep: list[Any] = []
    return _cenvp(entries, keep), keep


def _too_big_to_exec(entries: Sequence[bytes]) -> bool:
    """Whether execve would refuse these environment entries (E2BIG): one longer than
    the kernel takes (MAX_ARG_STRLEN, 128 KiB on Linux), or all of them, with their
    pointers, near the system's ARG_MAX."""
    try:
        arg_max = os.sysconf("SC_ARG_MAX")
    except (ValueError, OSError):
        arg_max = 1 << 21
    total = 0
    for e in entries:
        if len(e) >= 131072:
            return True
        total += len(e) + 1 + 8
    return total > arg_max - 65536  # room for the argv and the loader's auxv


def _acquire(explicit: bool) -> _Supervisor | _StartFailure | None:
    """An idle supervisor of this thread, or a new one.

    Returns ``None`` when the system refuses supervisors for good and the run
    did not ask for containment explicitly (it then runs uncontained), or the
    failure to report as this run's spawn failure.
    """
    idle: list[_Supervisor] | None = getattr(_pool, "idle", None)
    if idle is None:
        idle = _pool.idle = []
    while idle:
        sup = idle.pop()
        if sup.usable():
            return sup
        sup.free()
    out = ffi.new("struct bp_sup **")
    stage = ffi.new("int *")
    envp, _entries = _supervisor_environment()
    if lib.bp_sup_start(SUPERVISOR_PATH.encode(), envp, out, stage) < 0:
        return _sup_start_failed(stage[0], ffi.errno, explicit)
    sup = _Supervisor(out[0])
    _every.add(sup)
    return sup


def _sup_start_failed(stage: int, err: int, explicit: bool) -> _StartFailure | None:
    """A supervisor that would not start: this run's spawn failure, or ``None`` when the
    system refuses supervisors for good and the run may go uncontained (then containment
    is off from now on, with a warning)."""
    systemic = err in _SYSTEMIC and stage not in (lib.BP_STAGE_FORK, lib.BP_STAGE_PIPE)
    if systemic and not explicit:
        if CONTAIN_SUPPORTED:  # the first run to find it warns; runs of other threads, no more
            _refuse(stage, err)
        return None
    return _StartFailure(stage, err)


def _release(sup: _Supervisor) -> None:
    # The run just ended with it: only what the run found counts here (no system call);
    # _acquire looks again before the next run.
    sup.served = True
    idle: list[_Supervisor] | None = getattr(_pool, "idle", None)
    if (sup.ptr is not None and lib.bp_sup_reusable(sup.ptr) and idle is not None
            and len(idle) < _MAX_IDLE):
        idle.append(sup)
    else:
        sup.free()


def supervisor_pids() -> list[int]:
    """The pids of this thread's idle supervisors (for tests and diagnostics)."""
    idle: list[_Supervisor] = getattr(_pool, "idle", [])
    return [s.pid for s in idle if s.ptr is not None]


class RunControl:
    """A handle on a run in flight, for a caller that forwards signals to it.

    ``execute`` attaches the run while it is in flight; ``send_signal`` is to
    be called from the thread that runs it (a Python signal handler in the
    main thread, as the timeout command line does).
    """

    __slots__ = ("_run", "pid")

    def __init__(self) -> None:
        self._run: object | None = None
        self.pid: int | None = None

    def send_signal(self, sig: int) -> bool:
        """Send ``sig`` to the run's group; False when no run can be signalled now."""
        if self._run is None:
            return False
        return bool(lib.bp_signal(self._run, sig) == 0)

    def leader(self) -> int | None:
        """The leader's pid once known (a contained leader's comes after its start: it
        writes it into the page it shares with the supervisor just before its exec)."""
        pid = 0 if self._run is None else int(lib.bp_run_pid(self._run))
        return pid or None


def stage_name(stage: int) -> str:
    """The syscall a ``BP_STAGE_*`` value names."""
    return _STAGES.get(stage, f"stage {stage}")


def errno_name(err: int) -> str:
    """``ENOENT`` for 2, and so on."""
    return _errno.errorcode.get(err, f"errno {err}")


def spawn_failed(code: int, why: str, what: str) -> str:
    """The ``runner_error`` of a run the system refused ``what`` before its spawn:
    ``spawn failed: ENOENT (why): what``, the errno's name first (SPEC 9.1).  The one
    place Python builds this text; the core builds its own for the steps it takes."""
    return f"spawn failed: {errno_name(code)} ({why}): {what}"


def assert_never_state(condition: bool, what: str) -> None:
    """The one helper for the runner's own impossible states.

    Raises:
        RuntimeError: when ``condition`` is false; it means a bug in boundedproc.
    """
    if not condition:
        raise RuntimeError(f"boundedproc internal error: {what}")


@dataclass(slots=True)
class NativeSpec:
    """Validated, encoded inputs of one run; every field is ready for C.

    Never changed once made (``dataclasses.replace`` makes a new one); not
    frozen only because a frozen ``__init__`` costs microseconds a run.  The
    first ``PER_RUN`` fields are each run's own; ``_run.prepare`` passes the
    rest positionally from the spec of an earlier run with the same options.
    """

    argv: Sequence[bytes]
    exec_paths: Sequence[bytes]
    envp: Sequence[bytes] | None  # None: the caller's own environment
    cancel_fd2: int  # -1: none; a second switch (run_async's own)
    cwd: bytes | None
    stdin: bytes
    timeout_ns: int  # < 0: none
    max_output: int  # < 0: none
    overflow_kill: bool
    merge_stderr: bool
    cancel_fd: int  # -1: none
    kill_grace_ns: int
    drain_grace_ns: int
    rlimits_soft: Sequence[int]
    rlimits_hard: Sequence[int]
    exit_watch: int = WATCH_AUTO
    contain: bool = False  # start the command under the containment supervisor
    stdin_fd: int = -1  # -1: a pipe carrying ``stdin``; else the fd the child gets as 0
    stdout_fd: int = -1  # -1: captured; else the child's fd 1
    stderr_fd: int = -1  # -1: captured (or stdout's pipe with merge_stderr)
    first_signal: int = signal.SIGTERM  # sent at the end when kill_grace_ns != 0
    new_session: bool = True  # False: the leader stays in our group, signalled alone
    keep: int = 0  # BP_KEEP_*
    contain_explicit: bool = False  # contain=True: never fall back to uncontained
    uid: int = -1  # setresuid before exec; -1: unchanged
    gid: int = -1
    groups: Sequence[int] | None = None  # setgroups before exec; None: unchanged
    # Bit s-1 for signal s: ignored in the child, and its mask at exec. run() gives 0 and 0
    # (SPEC 2.2); boundedproc-timeout passes on what it inherited, as coreutils' does.
    sig_ignore: int = 0
    sig_mask: int = 0

    PER_RUN: ClassVar[int] = 4  # argv, exec_paths, envp, cancel_fd2


@dataclass(slots=True)
class NativeOutcome:
    """What the core reported, as plain Python values (never changed once made)."""

    spawned: bool
    pid: int
    exit_code: int
    term_signal: int
    timed_out: bool
    cancelled: bool
    output_truncated: bool
    escaped: bool
    stdin_delivered: bool
    stdin_written: int
    err_stage: int
    err_errno: int
    output_bytes: int
    stdout: bytes
    stderr: bytes
    user_time: float
    system_time: float
    max_rss: int
    exit_watch: int
    unkilled: int
    stdout_omitted: int
    stderr_omitted: int
    stdout_gap: int | None
    stderr_gap: int | None
    raw_exit_code: int = -1  # the leader's own status before SPEC 2.4's rules; -1 unknown
    runner_failure: str | None = None  # the supervisor's fate, when it failed the run


# --- waking the poll loop for signals ------------------------------------------------
#
# A signal with a Python handler (SIGINT's KeyboardInterrupt above all) must end a
# run promptly even when the kernel delivers it to another thread.  In the main
# thread the run borrows Python's wakeup fd: the C handler writes the signal number
# there, poll() wakes, bp_wait returns BP_AGAIN, and the handler runs at the next
# bytecode.  Bytes read back are forwarded to the wakeup fd that was set before
# (asyncio's, say), so no registered handler loses its wakeup.  The pipe is read
# only while a poll says it holds something: a read of the empty pipe raises
# BlockingIOError, which at every run's end cost a contained run() about 5% of the
# calling thread's CPU (benchmarks/README.md).

_wake_lock = threading.Lock()
_wake_pipe: tuple[int, int] | None = None
_wake_poll: Callable[[int], list[tuple[int, int]]] | None = None  # None: read to know


def _reset_wake_pipe_after_fork() -> None:
    global _wake_pipe, _wake_poll
    _wake_pipe = _wake_poll = None


os.register_at_fork(after_in_child=_reset_wake_pipe_after_fork)


def _get_wake_pipe() -> tuple[int, int]:
    global _wake_pipe, _wake_poll
    with _wake_lock:
        if _wake_pipe is None:
            r, w = pipe_above_stdio()
            os.set_blocking(r, False)
            os.set_blocking(w, False)
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(r, select.POLLIN)
                _wake_poll = poller.poll
            _wake_pipe = (r, w)
        return _wake_pipe


def _wake_pending() -> bool:
    """Whether the wakeup pipe holds a byte (True when it cannot tell)."""
    try:
        return _wake_poll is None or bool(_wake_poll(0))
    except RuntimeError:  # pragma: no cover - a poll of it in progress deeper in this stack
        return True


# The caller's own wakeup fd, as the last run that borrowed it found it (-1: none).
_callers_wakeup = -1


def _nested_in_a_run() -> bool:
    """Whether this run is nested in another one's wait: started by a signal handler (main
    thread) while an outer run, a caller up the stack, holds the wakeup fd.  Frame 0 is
    this, 1 is ``_Wakeup.__enter__``, 2 the run that is starting."""
    frame: types.FrameType | None = sys._getframe(3)
    while frame is not None:
        if frame.f_code in _WAITING_CODES:
            return True
        frame = frame.f_back
    return False


class _Wakeup:
    """Borrow the signal wakeup fd for the duration of a run (main thread only).

    A raise of a signal handler can land just after ``set_wakeup_fd`` set our pipe (before
    its return value, the caller's fd, was kept) or just before ``__exit__`` sets the
    caller's back: our pipe is left as the wakeup fd.  The next run finds it there, outside
    any run of ours, and sets back the caller's fd as the run before found it.
    """

    __slots__ = ("_old", "_r", "_w", "fd")

    def __init__(self) -> None:
        self.fd = -1
        self._old = -1
        self._r = -1
        self._w = -1

    def __enter__(self) -> _Wakeup:  # noqa: PYI034 - a private class, never subclassed
        if threading.current_thread() is threading.main_thread():
            r, w = _wake_pipe or _get_wake_pipe()
            try:
                old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            except ValueError:
                return self
            global _callers_wakeup
            if old != w:
                _callers_wakeup = old
            elif not _nested_in_a_run():
                old = _callers_wakeup  # ours, left there by a run cut short (above)
            self._old = old
            self.fd = self._r = r
            self._w = w
        return self

    def drain(self) -> None:
        if self._r < 0:
            return
        while _wake_pending():
            try:
                data = os.read(self._r, 512)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            # A run nested in a signal handler found our own pipe as the old
            # fd: forwarding to it would feed this loop forever.
            if self._old >= 0 and self._old != self._w:
                try:
                    os.write(self._old, data)
                except OSError:
                    pass

    def __exit__(self, *exc: object) -> None:
        if self._r < 0:
            return
        try:
            signal.set_wakeup_fd(self._old)
        except ValueError:  # pragma: no cover - the old fd was closed meanwhile
            signal.set_wakeup_fd(-1)
        self.drain()  # from here on no byte comes into our pipe


def _cstrings(items: Sequence[bytes], keep: list[object]) -> object:
    strings = [ffi.new("char[]", item) for item in items]
    arr = ffi.new("char *[]", [*strings, ffi.NULL])
    keep.append(strings)
    keep.append(arr)
    return arr


# The C copy of the last environment list seen (by identity: _command hands out the same,
# never mutated, list while os.environ does not change), kept with what it points to.
_last_envp: tuple[Sequence[bytes], object, list[object]] | None = None


def _cenvp(envp: Sequence[bytes], keep: list[object]) -> object:
    global _last_envp
    last = _last_envp
    if last is not None and last[0] is envp:
        keep.append(last)
        return last[1]
    held: list[object] = []
    arr = _cstrings(envp, held)
    _last_envp = (envp, arr, held)
    keep.append(_last_envp)
    return arr


def _bytes_page_offset() -> int:
    """Where in a page the data of a large fresh ``bytes`` starts (48 on glibc).

    The core lays its capture buffers out at this offset, so that it can move
    whole pages into the result's ``bytes`` instead of copying them; if a
    ``bytes`` lands elsewhere, the core simply copies.
    """
    probe = bytes(4 << 20)
    return int(ffi.cast("uintptr_t", ffi.from_buffer(probe))) % mmap.PAGESIZE


_BYTES_PAGE_OFFSET = _bytes_page_offset()


def _take(run: object, stream: int, length: int) -> bytes:
    if length == 0:
        return b""
    # The core copies straight into the final bytes object, releasing its own copy
    # as it goes, so a large capture is never resident twice.  The object is fresh
    # and referenced only here, so filling it in place is safe.
    out = bytes(length)
    rc = lib.bp_take_output(run, stream, ffi.from_buffer(out), length)
    assert_never_state(rc == 0, f"bp_take_output refused stream {stream} of {length} bytes")
    return out


# The plain values of a NativeSpec that go into its struct as they are (bools as 0/1).
_PLAIN_FIELDS = ("timeout_ns", "max_output", "overflow_kill", "merge_stderr", "cancel_fd",
                 "cancel_fd2", "kill_grace_ns", "drain_grace_ns", "exit_watch", "contain",
                 "uid", "gid", "stdin_fd", "stdout_fd", "stderr_fd", "first_signal",
                 "new_session", "keep", "sig_ignore", "sig_mask")
_plain_values = operator.attrgetter(*_PLAIN_FIELDS)
_SPEC_SIZE = ffi.sizeof("struct bp_spec")
_scalar_structs: dict[tuple[object, ...], bytes] = {}


def _scalars(spec: NativeSpec, report_chunks: bool) -> bytes:
    """The bytes of a ``struct bp_spec`` holding ``spec``'s plain values, every pointer NULL.

    Runs with the same options share one (``_cspec`` keys them on those values), so a run
    copies them in one ``memmove`` instead of setting two dozen fields one by one: the
    caller's own CPU a run is most of what ``run()`` costs beyond the floor (benchmarks/
    README.md, "The Python side of a run").
    """
    c = ffi.new("struct bp_spec *")
    for name, value in zip(_PLAIN_FIELDS, _plain_values(spec)):
        setattr(c, name, value)
    c.wake_fd = -1
    c.out_page_offset = _BYTES_PAGE_OFFSET
    c.ngroups = -1 if spec.groups is None else len(spec.groups)
    c.report_chunks = int(report_chunks)
    c.rlimits_soft = list(spec.rlimits_soft)
    c.rlimits_hard = list(spec.rlimits_hard)
    return bytes(ffi.buffer(c))


def _cspec(spec: NativeSpec, report_chunks: bool) -> tuple[Any, list[object]]:
    """``spec`` as a ``struct bp_spec``, and what it points to (keep it alive with it)."""
    key = (_plain_values(spec), None if spec.groups is None else len(spec.groups),
           report_chunks, *spec.rlimits_soft, *spec.rlimits_hard)
    scalars = _scalar_structs.get(key)
    if scalars is None:
        if len(_scalar_structs) >= 64:
            _scalar_structs.clear()
        scalars = _scalar_structs[key] = _scalars(spec, report_chunks)
    keep: list[object] = []
    c = ffi.new("struct bp_spec *")
    ffi.memmove(c, scalars, _SPEC_SIZE)
    c.argv = _cstrings(spec.argv, keep)
    c.exec_paths = _cstrings(spec.exec_paths, keep)
    if spec.envp is not None:
        c.envp = _cenvp(spec.envp, keep)
    if spec.cwd is not None:
        cwd = ffi.new("char[]", spec.cwd)
        keep.append(cwd)
        c.cwd = cwd
    if spec.stdin:
        data = ffi.from_buffer(spec.stdin)
        keep.append(data)
        c.stdin_data = data
        c.stdin_len = len(spec.stdin)
    if spec.groups is not None:
        groups = ffi.new("uint32_t[]", list(spec.groups) or [0])
        keep.append(groups)
        c.groups = groups
    return c, keep


def execute(spec: NativeSpec, *, on_output: Callable[[int, bytes], None] | None = None,
            control: RunControl | None = None) -> NativeOutcome:
    """Spawn and wait for one command.

    Args:
        spec: What to run.
        on_output: ``on_output(stream, chunk)`` for every chunk read, called
            here (the calling thread) right after each read, before the next.
        control: Attached to the run while it is in flight.

    Returns:
        The core's report, with the kept output.

    Raises:
        MemoryError: the core could not allocate its run handle or a buffer.
        OSError: poll() itself failed (never because of the command).
        KeyboardInterrupt: and any exception a signal handler or ``on_output``
            raises: the group has been killed and the leader reaped before it
            propagates.
    """
    c, _keep = _cspec(spec, on_output is not None)
    res = ffi.new("struct bp_result *")
    handle = ffi.new("struct bp_run **")
    if _wake_pipe is None and threading.current_thread() is threading.main_thread():
        try:
            _get_wake_pipe()  # made once; out of fds is this run's spawn failure
        except OSError as e:
            return _spawn_failure(_StartFailure(lib.BP_STAGE_PIPE, e.errno or _errno.EMFILE), spec)
    sup = _acquire(spec.contain_explicit) if spec.contain else None
    if isinstance(sup, _StartFailure):
        return _spawn_failure(sup, spec)
    try:
        outcome = _drive(c, res, handle, ffi.NULL if sup is None else sup.ptr,
                         0 if sup is None else sup.pid, on_output, control)
        if sup is not None and sup.served and outcome.runner_failure and not outcome.spawned:
            # An idle supervisor that died between runs (killed from outside, the OOM
            # killer) and was still taken up, its death not yet seen: nothing of the
            # command ran, so it runs once more, on a fresh one.
            _release(sup)
            sup = None
            fresh = _acquire(spec.contain_explicit)
            if isinstance(fresh, _StartFailure):
                return _spawn_failure(fresh, spec)
            sup = fresh
            # _drive called again, not through a nested helper: a traceback through a
            # helper's frame would keep the supervisor that the finally below lets go.
            outcome = _drive(c, res, handle, ffi.NULL if sup is None else sup.ptr,
                             0 if sup is None else sup.pid, on_output, control)
        return outcome
    finally:
        if sup is not None:
            _release(sup)
            # An exception's traceback keeps this frame (and it may sit in a reference
            # cycle until the garbage collector runs): not the supervisor with it, which a
            # thread that ends must free at once, so that it is reaped, not left a zombie.
            sup = None


def _spawn_failure(failure: _StartFailure, spec: NativeSpec) -> NativeOutcome:
    """The outcome of a run whose supervisor could not be started (EMFILE, EAGAIN)."""
    return NativeOutcome(
        spawned=False, pid=0, exit_code=SPAWN_FAILURE_EXIT_CODE, term_signal=0,
        timed_out=False, cancelled=False, output_truncated=False, escaped=False,
        # SPEC 2.3: "there was no payload, or all of it was written", as the core says
        # of a start that failed in it.
        stdin_delivered=not spec.stdin, stdin_written=0,
        # Our own pipes and fork fail for the caller's reasons and are told as such; any
        # other step belongs to the supervisor program, never to the command.
        err_stage=(failure.stage if failure.stage in (lib.BP_STAGE_PIPE, lib.BP_STAGE_FORK,
                                                      lib.BP_STAGE_ALLOC)
                   else lib.BP_STAGE_SUPERVISOR),
        err_errno=failure.err, output_bytes=0, stdout=b"", stderr=b"", user_time=0.0,
        system_time=0.0, max_rss=0, exit_watch=0, unkilled=0, stdout_omitted=0,
        stderr_omitted=0, stdout_gap=None, stderr_gap=None)


def _runner_failure(res: Any, sup_pid: int) -> str | None:
    """What happened to the supervisor that failed the run, in words."""
    how = res.runner_failed
    if how == lib.BP_RUNNER_OK:
        return None
    status = res.runner_status
    fate = ""
    if status is not None and status >= 0:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                fate = f", killed by {signal.Signals(sig).name}"
            except ValueError:
                fate = f", killed by signal {sig}"
        elif os.WIFEXITED(status):
            fate = f", exited with status {os.WEXITSTATUS(status)}"
    who = f"the containment supervisor (pid {sup_pid})" if sup_pid else "the containment supervisor"
    # Lost before the leader reached its exec (it then dies of its parent-death signal):
    # nothing of the command ran, and the result is a spawn failure (_run._runner_error).
    after = "; the run's group was killed" if res.spawned else "; the command never started"
    if how == lib.BP_RUNNER_UNRESPONSIVE:
        return f"{who} did not answer within the run's bound (stopped?) and was killed{after}"
    return f"{who} died during the run{fate}{after}"


_CHUNK, _DONE = lib.BP_CHUNK, lib.BP_DONE


def _drive(c: Any, res: Any, handle: Any, sup_ptr: Any, sup_pid: int,
           on_output: Callable[[int, bytes], None] | None,
           control: RunControl | None) -> NativeOutcome:
    """Start the run and drive it to the end on the supervisor ``sup_ptr`` (NULL:
    uncontained), whose ``_Supervisor`` and pool are the caller's."""
    with _Wakeup() as wake:
        c.wake_fd = wake.fd
        # Everything from bp_start on is inside the try: a KeyboardInterrupt
        # that lands between its return and the loop must still free (kill,
        # reap) the run; bp_start sets handle[0] before it spawns.
        try:
            if lib.bp_start(c, res, sup_ptr, handle) < 0:
                raise MemoryError("boundedproc: cannot allocate a run handle")
            run = handle[0]
            if control is not None:
                control._run = run
                control.pid = res.pid if res.spawned else None
            if on_output is not None:
                chunk = ffi.new("int *"), ffi.new("const unsigned char **"), ffi.new("size_t *")
            while True:
                rc = lib.bp_wait(run)
                if rc == _CHUNK and on_output is not None:
                    # The bytes are the core's until the next bp_wait: copy them
                    # out first.  An exception from the callback unwinds through
                    # the finally below, which kills and reaps the run.
                    assert_never_state(lib.bp_chunk(run, *chunk) == 0, "BP_CHUNK without a chunk")
                    on_output(chunk[0][0], ffi.buffer(chunk[1][0], chunk[2][0])[:])
                    continue
                if rc == _DONE:
                    break
                if rc < 0:
                    raise _wait_error(res)
                wake.drain()  # BP_AGAIN: pending handlers run at the next bytecode
            outcome = _outcome(run, res, sup_pid)
        finally:
            if control is not None:
                control._run = None
            lib.bp_free(handle[0])  # kills and reaps a run that an exception interrupted
    return outcome


def _wait_error(res: Any) -> BaseException:
    """What ``bp_wait`` failing (never because of the command) raises."""
    if res.err_stage == lib.BP_STAGE_ALLOC:
        return MemoryError("boundedproc: cannot grow an output buffer")
    return OSError(res.err_errno,
                   f"boundedproc: {stage_name(res.err_stage)} failed: {os.strerror(res.err_errno)}")


def _outcome(run: Any, res: Any, sup_pid: int) -> NativeOutcome:
    """A finished run's report, with its kept output taken out of the core."""
    stdout = _take(run, lib.BP_STDOUT, res.stdout_len)
    stderr = _take(run, lib.BP_STDERR, res.stderr_len)
    # One positional call in NativeOutcome's field order: a keyword call of 26 costs a
    # microsecond more a run (a test checks that each field lands where its name says).
    return NativeOutcome(
        bool(res.spawned),
        res.pid,
        res.exit_code,
        res.term_signal,
        bool(res.timed_out),
        bool(res.cancelled),
        bool(res.output_truncated),
        bool(res.escaped),
        bool(res.stdin_delivered),
        res.stdin_written,
        res.err_stage,
        res.err_errno,
        res.output_bytes,
        stdout,
        stderr,
        res.user_time,
        res.system_time,
        res.max_rss,
        res.exit_watch,
        res.unkilled,
        res.stdout_read - res.stdout_len,  # stdout_omitted
        res.stderr_read - res.stderr_len,  # stderr_omitted
        None if res.stdout_gap < 0 else res.stdout_gap,
        None if res.stderr_gap < 0 else res.stderr_gap,
        res.raw_exit_code,
        _runner_failure(res, sup_pid),
    )


# --- run_many's runs, driven by the core's own threads (csrc/batch.c) ----------------


@dataclass(slots=True)
class BatchDone:
    """One run of a ``Batch`` that is over, as ``Batch.next`` hands it back."""

    tag: int
    outcome: NativeOutcome | None  # None: an error, or not spawned (its switch was set)
    error: BaseException | None  # what run() would have raised for it
    duration: float  # seconds from a worker taking it up to its end


class Batch:
    """Runs specs on up to ``jobs`` threads of the core, with no Python between runs.

    One thread (``run_many``'s consumer) submits and takes back; each spec, its
    C struct and its ``bp_result`` stay referenced here until its run is taken
    back.  Each worker keeps its own supervisor, one run at a time (batch.c);
    once the batch is closed, workers are parked with them for the next batch.
    ``close`` waits for every worker to leave the batch, so every run in flight
    ends (or is killed, once its cancel switch is set) before it returns.
    """

    __slots__ = ("__weakref__", "_done", "_env", "_forked", "_inflight", "_ptr", "switch",
                 "window")

    def __init__(self, jobs: int, window: int) -> None:
        """``window``: the most runs submitted and not yet taken back (run_many's).

        Raises OSError or MemoryError (out of fds or memory): nothing was started.
        """
        # Set first: __del__ (close) runs also when this raises.
        self._ptr: Any = None
        self._inflight: dict[int, tuple[NativeSpec, Any, list[object], Any]] = {}
        # The switch its runs watch (run_many's), set by close() for the runs still in
        # flight: nobody will take their results.
        self.switch: Any = None
        out = ffi.new("struct bp_batch **")
        self._env = _supervisor_environment()
        if lib.bp_batch_new(jobs, SUPERVISOR_PATH.encode(), self._env[0], out) < 0:
            err = ffi.errno
            if err == _errno.ENOMEM:
                raise MemoryError("boundedproc: cannot allocate a batch")
            raise OSError(err, f"boundedproc: cannot make a batch: {os.strerror(err)}")
        self._ptr = out[0]
        self.window = window
        self._done = ffi.new("struct bp_batch_done[]", window)  # all of them in one call
        self._forked = False  # set in a forked child, where it is unusable
        _batches.add(self)

    def submit(self, tag: int, spec: NativeSpec) -> None:
        """Queue ``spec``'s run; ``tag`` names it in ``next``.

        Raises:
            OSError: not one worker thread could be started (nothing was queued).
        """
        ptr = self._live()
        c, keep = _cspec(spec, False)
        c.wake_fd = -1
        res = ffi.new("struct bp_result *")
        if lib.bp_batch_submit(ptr, c, res, tag) < 0:
            err = ffi.errno
            raise OSError(err, f"boundedproc: cannot start a run_many worker: {os.strerror(err)}")
        self._inflight[tag] = (spec, c, keep, res)

    def next(self) -> list[BatchDone]:
        """Wait for runs to end (Ctrl-C interrupts the wait) and take every one that has:
        each call into the core may wait for the GIL, so one call takes them all.  A run
        queued again (uncontained: this system refuses supervisors) is not among them."""
        ptr, done, room = self._live(), self._done, len(self._done)
        got = lib.bp_batch_next(ptr, -1, 0, done, room)  # no wait: no wakeup fd to borrow
        if got == 0:
            with _Wakeup() as wake:
                while (got := lib.bp_batch_next(ptr, wake.fd, 1, done, room)) == 0:
                    wake.drain()  # woken: pending handlers run at the next bytecode
        if got < 0:
            err = ffi.errno
            raise OSError(err, f"boundedproc: poll failed: {os.strerror(err)}")
        over = [self._over(done[i]) for i in range(got)]
        return [d for d in over if d is not None]

    def _over(self, done: Any) -> BatchDone | None:
        tag, kind, run = done.tag, done.rc, done.run
        spec, _c, _keep, res = self._inflight.pop(tag)
        duration = (done.end_ns - done.start_ns) / 1e9
        if kind == lib.BP_BATCH_DONE:
            try:
                return BatchDone(tag, _outcome(run, res, done.sup_pid), None, duration)
            except Exception as err:  # noqa: BLE001  (a MemoryError): that run's, in its turn
                return BatchDone(tag, None, err, duration)
            finally:
                if run != ffi.NULL:
                    lib.bp_free(run)
        if kind == lib.BP_BATCH_FAILED:
            return BatchDone(tag, None, _wait_error(res), duration)
        if kind == lib.BP_BATCH_NO_HANDLE:
            return BatchDone(tag, None, MemoryError("boundedproc: cannot allocate a run handle"),
                             duration)
        if kind == lib.BP_BATCH_NO_SUPERVISOR:
            failure = _sup_start_failed(done.stage, done.err, spec.contain_explicit)
            if failure is None:
                self.submit(tag, replace(spec, contain=False))
                return None
            return BatchDone(tag, _spawn_failure(failure, spec), None, duration)
        assert_never_state(kind == lib.BP_BATCH_CANCELLED, f"batch run ended with {kind}")
        return BatchDone(tag, None, None, duration)

    def usable(self) -> None:
        """Raises RuntimeError in a forked child: its runs and threads are the parent's."""
        self._live()

    def _live(self) -> Any:
        if self._forked:
            raise RuntimeError("boundedproc: a run_many iterator cannot go on in a forked child")
        assert_never_state(self._ptr is not None, "a closed batch was used")
        return self._ptr

    def close(self) -> None:
        """End the runs in flight (their switch set), wait for every worker to leave (each
        parks with its supervisor, or frees it) and free the rest."""
        if self._inflight and self.switch is not None and self._ptr is not None:
            self.switch.cancel()
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            lib.bp_batch_free(ptr)
        self._inflight.clear()

    def __del__(self) -> None:
        self.close()


_batches: weakref.WeakSet[Batch] = weakref.WeakSet()


def _forget_batches_after_fork() -> None:
    # The child has none of the workers: drop our copies of their supervisors' sockets.
    for batch in list(_batches):
        if batch._ptr is not None:
            lib.bp_batch_forget(batch._ptr)
        batch._ptr = None
        batch._forked = True


os.register_at_fork(after_in_child=_forget_batches_after_fork)


# At exit, the workers batch.c parked with their supervisors (for a next run_many call) end
# and free them, so that they are reaped here and not left to init as zombies.  Before a
# fork too, and their threads are joined: the forking caller is then single-threaded again
# (Python 3.12+ warns of a fork with threads, "may lead to deadlocks in the child").
atexit.register(lib.bp_batch_release_parked)
os.register_at_fork(before=lib.bp_batch_release_parked)


# The functions that wait inside a borrowed wakeup fd (_nested_in_a_run).
_WAITING_CODES = frozenset({_drive.__code__, Batch.next.__code__})
