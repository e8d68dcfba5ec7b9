"""The options of a run: their defaults, their validation, and ``Limits``.

Everything here is a caller bug check (``TypeError``/``ValueError``, raised
before anything is spawned, SPEC 2.6) or a plain value; nothing here touches
the OS except ``Stream`` targets' ``fileno()``.
"""

from __future__ import annotations

import enum
import io
import math
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Union

from boundedproc import _native
from boundedproc._cancel import Cancel
from boundedproc._ids import ID_NONE

__all__ = [
    "CAPTURE",
    "DEFAULT_MAX_OUTPUT",
    "DEFAULT_TIMEOUT",
    "DEVNULL",
    "INHERIT",
    "Limits",
    "Options",
    "Stream",
]



def check_ident(name: str, ident: object) -> None:
    """``user=`` or ``group=`` (``name``): a name, or an id the kernel can set.

    Raises:
        TypeError: neither a str nor an int.
        ValueError: an empty name or one with NUL; an id outside 0 to 4294967294: uid_t
            and gid_t are 32 bits, and their all-ones value means "leave it as it is" to
            setresuid/setresgid, so a larger id would wrap (2**32 to 0: root).
    """
    if isinstance(ident, bool) or not isinstance(ident, (int, str)):
        raise TypeError(f"{name} must be a name, an id or None, not {type(ident).__name__}")
    if isinstance(ident, int) and not 0 <= ident < ID_NONE:
        raise ValueError(f"{name} must be an id from 0 to {ID_NONE - 1}, not {ident}")
    if isinstance(ident, str) and (not ident or "\0" in ident):
        raise ValueError(f"{name} must be a non-empty name without NUL, not {ident!r}")

DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024

#: The largest bound in nanoseconds the core takes (about 146 years): a
#: longer one means "no bound", since no run can reach it.
_MAX_NS = 2**62


class Stream(enum.Enum):
    """Where a standard stream of the child goes (besides an fd of yours)."""

    CAPTURE = "capture"
    """Read through a pipe, counted against ``max_output`` and kept per ``keep``."""
    DEVNULL = "devnull"
    """``/dev/null``."""
    INHERIT = "inherit"
    """The caller's own fd 0, 1 or 2: live, uncounted, uncapped."""

    def __repr__(self) -> str:
        return f"boundedproc.{self.name}"


CAPTURE = Stream.CAPTURE
DEVNULL = Stream.DEVNULL
INHERIT = Stream.INHERIT


class HasFileno(Protocol):
    """An object with an open file descriptor, such as an open file."""

    def fileno(self) -> int: ...


StdioTarget = Union[Stream, int, HasFileno]  # noqa: UP007 - a runtime alias
StdinSource = Union[bytes, bytearray, memoryview, str, None, Stream]  # noqa: UP007
OutputCallback = Callable[[int, bytes], None]
Keep = Literal["head", "tail", "head+tail"]

# subprocess's own constants, recognised to say what to use instead.
_SUBPROCESS_CONSTANTS = {-1: "subprocess.PIPE (use boundedproc.CAPTURE, the default)",
                         -2: "subprocess.STDOUT (use merge_stderr=True)",
                         -3: "subprocess.DEVNULL (use boundedproc.DEVNULL)"}


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits applied with ``setrlimit`` in the child before exec.

    Attributes:
        cpu_seconds: CPU time.  The soft limit is this, the hard limit one
            second above it, so the command gets SIGXCPU first (a soft limit
            equal to the hard one would deliver SIGKILL).
        memory_bytes: Address space (``RLIMIT_AS``).
        max_processes: Processes of the user (``RLIMIT_NPROC``).  The kernel
            counts every process of the command's real user and does not
            enforce the limit for root (or CAP_SYS_RESOURCE): as root, pass
            ``user=`` as well to make it hold.  The deadline and the group
            kill end a fork bomb either way.
        file_size_bytes: Largest file the command may write (``RLIMIT_FSIZE``,
            SIGXFSZ past it).
        open_files: Open file descriptors (``RLIMIT_NOFILE``).

    A limit the kernel refuses (above the hard limit without privilege, or
    above ``fs.nr_open`` for open files) gives a ``spawn failed:`` result.  A
    value of 2**63 or more (``math.inf`` too, in any field) is clamped to
    2**63 - 1: no limit in effect, though the command's ``getrlimit`` shows
    that number, not ``RLIM_INFINITY``.
    ``cpu_seconds`` is rounded up to whole seconds (at least 1: the kernel's
    unit), with the hard limit one second later.
    """

    cpu_seconds: float | None = None
    memory_bytes: int | None = None
    max_processes: int | None = None
    file_size_bytes: int | None = None
    open_files: int | None = None

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "memory_bytes", "max_processes", "file_size_bytes",
                     "open_files"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Limits.{name} must be a number or None, not {value!r}")
            if math.isnan(value) or value < 0:
                raise ValueError(f"Limits.{name} must be a number >= 0, not {value!r}")
            if name != "cpu_seconds" and not (isinstance(value, int) or math.isinf(value)):
                raise TypeError(f"Limits.{name} must be an int or None, not {value!r}")

    def native(self) -> tuple[list[int], list[int]]:
        """The soft and hard values per ``BP_RLIMIT_*`` index (-1: unchanged)."""
        top = 2**63 - 1
        soft = [-1] * _native.NRLIMITS
        hard = [-1] * _native.NRLIMITS
        if self.cpu_seconds is not None:
            cpu = top if self.cpu_seconds >= top else max(1, math.ceil(self.cpu_seconds))
            soft[_native.RLIMIT_CPU] = min(cpu, top - 1)
            hard[_native.RLIMIT_CPU] = min(cpu + 1, top)
        for index, value in (
            (_native.RLIMIT_AS, self.memory_bytes),
            (_native.RLIMIT_NPROC, self.max_processes),
            (_native.RLIMIT_FSIZE, self.file_size_bytes),
            (_native.RLIMIT_NOFILE, self.open_files),
        ):
            if value is not None:
                soft[index] = hard[index] = top if value >= top else int(value)
        return soft, hard


NO_LIMITS = ([-1] * _native.NRLIMITS, [-1] * _native.NRLIMITS)


def byte_cap(value: object) -> int | None:
    """``max_output`` validated: an int >= 0, or ``None`` (infinity too) for no cap.

    A NaN or negative cap is a ``ValueError`` whatever its type (SPEC 2.6); any
    other float, a bool or a string is a ``TypeError``.
    """
    if value is None:
        return None
    if isinstance(value, float):
        if math.isnan(value) or value < 0:
            raise ValueError(f"max_output must be >= 0, not {value!r}")
        if math.isinf(value):
            return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_output must be an int or None, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"max_output must be >= 0, not {value}")
    return value


def seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    """A validated bound in seconds; ``None`` (or infinity, where allowed) for none."""
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be a number, not None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    try:
        v = float(value)
    except OverflowError:  # an int beyond float's range: no run reaches it
        v = math.inf
    if math.isnan(v) or v < 0:
        raise ValueError(f"{name} must be >= 0 seconds, not {value!r}")
    if math.isinf(v):
        if allow_none:
            return None
        raise ValueError(f"{name} must be finite, not {value!r}")
    return v


def to_ns(value: float | None) -> int:
    """Nanoseconds for the core: -1 for none, and a bound past ``_MAX_NS`` is none too."""
    if value is None or value * 1e9 >= _MAX_NS:
        return -1
    return int(value * 1e9)


def grace_ns(value: float) -> int:
    """A grace in nanoseconds; one too long to represent is clamped (never reached)."""
    return _MAX_NS if value * 1e9 >= _MAX_NS else int(value * 1e9)


#: What a stream target that is no open fd becomes: the largest C int, which no
#: process can have open (Linux caps fds below it), so the core's copy of it
#: fails with EBADF and the run is a ``spawn failed: EBADF`` result.
NOT_AN_FD = 2**31 - 1

#: The stream target codes of ``DEVNULL`` and ``INHERIT`` in ``Options`` (``stdio_fd``).
DEVNULL_CODE, INHERIT_CODE = -2, -3


def stdio_fd(name: str, value: object) -> int:
    """The core's fd for a stream target: -1 for ``CAPTURE``, else the child's fd.

    ``DEVNULL`` is returned as ``-2`` and ``INHERIT`` as ``-3``; the caller
    turns them into fds (the caller's own 0-2, an open ``/dev/null``).  An fd
    past a C int, or a file object whose ``fileno()`` fails (a closed file),
    is ``NOT_AN_FD``: content, reported in the result like a closed fd.

    Raises:
        TypeError: a wrong type, one of subprocess's constants, or an object
            that has no fd at all (``fileno()`` raises ``io.UnsupportedOperation``:
            ``io.StringIO``, ``sys.stdout`` under pytest's capture), as
            ``subprocess`` refuses it.
        ValueError: a negative fd.
    """
    if value is CAPTURE:
        return -1
    if value is DEVNULL:
        return DEVNULL_CODE
    if value is INHERIT:
        return INHERIT_CODE
    if isinstance(value, bool):
        raise TypeError(f"{name} must be CAPTURE, DEVNULL, INHERIT, an fd or an object with "
                        f"fileno(), not {value!r}")
    if isinstance(value, int):
        if value in _SUBPROCESS_CONSTANTS:
            raise TypeError(f"{name}={value} is {_SUBPROCESS_CONSTANTS[value]}")
        if value < 0:
            raise ValueError(f"{name} must be a file descriptor >= 0, not {value}")
        return min(value, NOT_AN_FD)
    fileno = getattr(value, "fileno", None)
    if callable(fileno):
        try:
            fd = fileno()
        except io.UnsupportedOperation as err:  # io.StringIO, pytest's capsys: no fd at all
            raise TypeError(f"{name}: {type(value).__name__} has no file descriptor ({err}); "
                            "capture the output (the default) or pass on_output=") from None
        except (OSError, ValueError):  # a closed file object raises ValueError
            return NOT_AN_FD
        if isinstance(fd, bool) or not isinstance(fd, int) or fd < 0:
            raise ValueError(f"{name}: {value!r}.fileno() returned {fd!r}")
        return min(fd, NOT_AN_FD)
    raise TypeError(f"{name} must be CAPTURE, DEVNULL, INHERIT, an fd or an object with "
                    f"fileno(), not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class Options:
    """Every option of one run, validated; see ``run()`` for their meaning."""

    timeout: float | None
    max_output: int | None
    overflow_kill: bool
    payload: bytes
    stdin_fd: int  # -1: a pipe (payload then EOF); -2 DEVNULL; -3 INHERIT; else an fd
    stdout_fd: int
    stderr_fd: int
    cwd: bytes | None
    env: Mapping[str, str | None] | None
    env_mode: str
    merge_stderr: bool
    text: bool
    cancel: Cancel | None
    kill_grace: float
    drain_grace: float
    limits: Limits | None
    contain: bool | None
    on_output: OutputCallback | None
    keep: str
    user: int | str | None
    group: int | str | None
    tmpdir: bool
    check: bool
    first_signal: int = signal.SIGTERM
    new_session: bool = True
    kill_grace_never: bool = False  # escalate only after the leader exits (timeout(1))
    not_spawned: str | None = None  # content no process can get (Unencodable's text)
    # _run.prepare's memo, set once there: the containment it was made for and the fields
    # of a NativeSpec these options alone decide.  Not an option: never compared, and a
    # dataclasses.replace() starts without it.
    spec_tail: tuple[bool, tuple[Any, ...]] | None = field(
        default=None, init=False, repr=False, compare=False)


class Unencodable(ValueError):
    """A ``str`` that no bytes encode: a lone surrogate other than U+DC80-U+DCFF (which
    surrogateescape maps back to the bytes they stand for), as a JSON file can spell it.

    Content, not a caller bug: like a NUL byte it cannot reach a process, so ``run()``
    returns a ``not spawned: `` result with this text.  ``lossy`` is the value encoded with
    surrogatepass, for the result's ``args``.
    """

    def __init__(self, what: str, value: str, err: UnicodeEncodeError) -> None:
        super().__init__(f"{what} contains a lone surrogate (U+{ord(value[err.start]):04X}), "
                         "which no bytes encode")
        self.why = str(self)
        self.lossy = value.encode("utf-8", "surrogatepass")


def text_entry(value: str, what: str) -> bytes:
    """``value`` as UTF-8 with surrogateescape.

    Raises:
        Unencodable: ``value`` holds a lone surrogate no bytes encode.
    """
    try:
        return value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as err:
        raise Unencodable(what, value, err) from None


def entry(value: object, what: str) -> bytes:
    """An argv entry, path or env string as bytes (``str`` with surrogateescape).

    Raises:
        TypeError: not a str, bytes or path.
        Unencodable: a str no bytes encode.
    """
    if isinstance(value, str):
        return text_entry(value, what)
    if isinstance(value, bytes):
        return value
    if isinstance(value, os.PathLike):
        return os.fsencode(value)
    raise TypeError(f"{what} must be str, bytes or os.PathLike, not {type(value).__name__}")


def validate(
    *,
    timeout: object,
    max_output: object,
    on_overflow: object,
    stdin: object,
    cwd: object,
    env: object,
    env_mode: object,
    merge_stderr: object,
    text: object,
    cancel: object,
    kill_grace: object,
    drain_grace: object,
    limits: object,
    contain: object,
    on_output: object,
    keep: object,
    stdout: object,
    stderr: object,
    user: object,
    group: object,
    tmpdir: object,
    check: object,
) -> Options:
    """Check every option of ``run()`` and return them as ``Options``.

    Options made only of plain values (no payload, env, cancel, limits,
    callback or fd object) are remembered, keyed by each value and its type,
    so a loop of runs with the same options validates them once.  Options with
    ``contain=True`` are looked up only while containment is available: once
    the system has refused it, they raise again.

    Raises:
        TypeError: an option of the wrong type.
        ValueError: a value out of range, an unknown mode, or options that
            exclude each other.
    """
    key: tuple[object, ...] | None = None
    if (stdin is None and env is None and cancel is None and limits is None
            and on_output is None and (contain is not True or _native.CONTAIN_SUPPORTED)
            and type(stdout) is Stream and type(stderr) is Stream):
        plain = (timeout, max_output, on_overflow, cwd, env_mode, merge_stderr, text,
                 kill_grace, drain_grace, contain, keep, stdout, stderr, user, group, tmpdir,
                 check)
        types = tuple(map(type, plain))  # in the key: 1 and True and 1.0 are equal
        if _PLAIN.issuperset(types):
            key = (*plain, *types)
            known = _validated.get(key)
            if known is not None:
                return known
    options = _validate(timeout=timeout, max_output=max_output, on_overflow=on_overflow,
                        stdin=stdin, cwd=cwd, env=env, env_mode=env_mode,
                        merge_stderr=merge_stderr, text=text, cancel=cancel,
                        kill_grace=kill_grace, drain_grace=drain_grace, limits=limits,
                        contain=contain, on_output=on_output, keep=keep, stdout=stdout,
                        stderr=stderr, user=user, group=group, tmpdir=tmpdir, check=check)
    if key is not None:
        if len(_validated) >= 64:
            _validated.clear()
        _validated[key] = options
    return options


# Types whose values are immutable and hashable: enough to key a validated Options on.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, Stream})
_validated: dict[tuple[object, ...], Options] = {}


def _validate(*, timeout: object, max_output: object, on_overflow: object, stdin: object,
              cwd: object, env: object, env_mode: object, merge_stderr: object, text: object,
              cancel: object, kill_grace: object, drain_grace: object, limits: object,
              contain: object, on_output: object, keep: object, stdout: object,
              stderr: object, user: object, group: object, tmpdir: object,
              check: object) -> Options:
    timeout_s = seconds("timeout", timeout, allow_none=True)
    kill_grace_s = seconds("kill_grace", kill_grace, allow_none=False)
    drain_grace_s = seconds("drain_grace", drain_grace, allow_none=False)
    assert kill_grace_s is not None and drain_grace_s is not None
    max_output = byte_cap(max_output)
    if on_overflow not in ("truncate", "kill"):
        raise ValueError(f"on_overflow must be 'truncate' or 'kill', not {on_overflow!r}")
    if keep not in ("head", "tail", "head+tail"):
        raise ValueError(f"keep must be 'head', 'tail' or 'head+tail', not {keep!r}")
    if on_overflow == "kill" and keep != "head":
        raise ValueError(f"on_overflow='kill' keeps the head only; it cannot go with "
                         f"keep={keep!r}")
    if env_mode not in ("merge", "replace"):
        raise ValueError(f"env_mode must be 'merge' or 'replace', not {env_mode!r}")

    payload = b""
    stdin_fd = -1
    unencodable: str | None = None
    if stdin is None:
        pass
    elif isinstance(stdin, str):
        try:
            # With surrogateescape, as argv, env and cwd: a str that os.fsdecode() or
            # errors="surrogateescape" made gives back its bytes.
            payload = text_entry(stdin, "stdin")
        except Unencodable as err:
            unencodable = err.why
            # Never written (the run spawns nothing), but a payload there was: the result's
            # stdin_delivered is False, as for any payload of a run that did not start.
            payload = err.lossy
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        payload = bytes(stdin)
    elif stdin is DEVNULL:
        stdin_fd = DEVNULL_CODE
    elif stdin is INHERIT:
        stdin_fd = INHERIT_CODE
    elif isinstance(stdin, int) and not isinstance(stdin, bool) and stdin in _SUBPROCESS_CONSTANTS:
        raise TypeError(f"stdin={stdin} is {_SUBPROCESS_CONSTANTS[stdin]}")
    else:
        raise TypeError("stdin must be bytes, str, None, DEVNULL or INHERIT, "
                        f"not {type(stdin).__name__}")
    stdout_fd = stdio_fd("stdout", stdout)
    stderr_fd = stdio_fd("stderr", stderr)
    if merge_stderr and stderr is not CAPTURE:
        raise ValueError("merge_stderr=True sends stderr where stdout goes: "
                         "it cannot go with stderr=")

    try:
        cwd_b = None if cwd is None else entry(cwd, "cwd")
    except Unencodable as err:
        cwd_b, unencodable = err.lossy, unencodable or err.why
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping or None, not {type(env).__name__}")
    if cancel is not None and not isinstance(cancel, Cancel):
        raise TypeError(f"cancel must be a boundedproc.Cancel, not {type(cancel).__name__}")
    if cancel is not None and cancel.fileno() < 0:
        raise ValueError("cancel was closed")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a boundedproc.Limits, not {type(limits).__name__}")
    if contain is not None and not isinstance(contain, bool):
        raise TypeError(f"contain must be a bool or None, not {type(contain).__name__}")
    if contain and not _native.CONTAIN_SUPPORTED:
        raise ValueError(f"contain=True is not available: {_native.containment_status()}; "
                         "pass contain=None to contain where supported")
    if on_output is not None and not callable(on_output):
        raise TypeError(f"on_output must be callable or None, not {type(on_output).__name__}")
    for name, ident in (("user", user), ("group", group)):
        if ident is not None:
            check_ident(name, ident)
    for name, flag in (("merge_stderr", merge_stderr), ("text", text), ("tmpdir", tmpdir),
                       ("check", check)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, not {type(flag).__name__}")
    if tmpdir and cwd is not None:
        raise ValueError("tmpdir=True makes a fresh directory the cwd: it cannot go with cwd=")

    return Options(
        timeout=timeout_s,
        max_output=max_output,
        overflow_kill=on_overflow == "kill",
        payload=payload,
        stdin_fd=stdin_fd,
        stdout_fd=stdout_fd,
        stderr_fd=stderr_fd,
        cwd=cwd_b,
        env=env,
        env_mode=str(env_mode),
        merge_stderr=bool(merge_stderr),
        text=bool(text),
        cancel=cancel,
        kill_grace=kill_grace_s,
        drain_grace=drain_grace_s,
        limits=limits,
        contain=contain,
        on_output=on_output,
        keep=str(keep),
        user=user,  # type: ignore[arg-type]
        group=group,  # type: ignore[arg-type]
        tmpdir=bool(tmpdir),
        check=bool(check),
        not_spawned=unencodable,
    )
