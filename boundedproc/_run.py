"""``run()``: validate in Python, then hand the run to the C core."""

from __future__ import annotations

import contextvars
import dataclasses
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, Union

from boundedproc import _native
from boundedproc._result import Result

__all__ = ["DEFAULT_MAX_OUTPUT", "DEFAULT_TIMEOUT", "Cancel", "Limits", "run"]

DEFAULT_TIMEOUT = 600.0
DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024

StrOrBytesPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
Command = Union[str, Sequence[StrOrBytesPath]]  # noqa: UP007 - string forward refs inside


_C = TypeVar("_C", bound="Cancel")


class Cancel:
    """A cancel switch that one or many runs watch.

    ``cancel()`` is thread-safe, idempotent and safe to call from a signal
    handler: it sets a flag and writes one byte to a pipe whose read end every
    run watching this switch has in its poll set.  The byte is never consumed,
    so the switch stays set.
    """

    __slots__ = ("__weakref__", "_r", "_set", "_w")

    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._set = False

    def cancel(self) -> None:
        """Cancel every run watching this switch, now and later."""
        if self._set:
            return
        self._set = True
        try:
            os.write(self._w, b"x")
        except OSError:  # the pipe is full (it cannot be) or already closed
            pass

    @property
    def cancelled(self) -> bool:
        """Whether ``cancel()`` was called."""
        return self._set

    def fileno(self) -> int:
        """The fd that becomes readable once cancelled (for event loops)."""
        return self._r

    def __reduce__(self) -> str | tuple[object, ...]:
        # Its fds mean nothing in another process, and a copy's __del__ would
        # close whatever holds those numbers there.
        raise TypeError("a Cancel belongs to one process and cannot be pickled")

    def close(self) -> None:
        """Release the switch's two fds now (else when it is garbage-collected).

        Runs watching it must be over; a closed switch must not be passed to
        a run again.
        """
        for name in ("_r", "_w"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                setattr(self, name, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __enter__(self: _C) -> _C:  # noqa: PYI019 - typing.Self needs 3.11
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Cancel(cancelled={self._set})"


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits applied with ``setrlimit`` in the child before exec.

    Attributes:
        cpu_seconds: CPU time.  The soft limit is this, the hard limit one
            second above it, so the command gets SIGXCPU first (a soft limit
            equal to the hard one would deliver SIGKILL).
        memory_bytes: Address space (``RLIMIT_AS``).
        max_processes: Processes of the user (``RLIMIT_NPROC``).  The kernel
            does not enforce it for root; the deadline and the group kill still
            end a fork bomb there.
        file_size_bytes: Largest file the command may write (``RLIMIT_FSIZE``,
            SIGXFSZ past it).
        open_files: Open file descriptors (``RLIMIT_NOFILE``).

    A limit the kernel refuses (above the hard limit without privilege, or
    above ``fs.nr_open`` for open files) gives a ``spawn failed:`` result.
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
            if name != "cpu_seconds" and not isinstance(value, int):
                raise TypeError(f"Limits.{name} must be an int or None, not {value!r}")
            if math.isnan(value) or value < 0 or math.isinf(value):
                raise ValueError(f"Limits.{name} must be a finite number >= 0, not {value!r}")

    def _native(self) -> tuple[list[int], list[int]]:
        soft = [-1] * _native.NRLIMITS
        hard = [-1] * _native.NRLIMITS
        if self.cpu_seconds is not None:
            cpu = max(1, math.ceil(self.cpu_seconds))
            soft[_native.RLIMIT_CPU], hard[_native.RLIMIT_CPU] = cpu, cpu + 1
        for index, value in (
            (_native.RLIMIT_AS, self.memory_bytes),
            (_native.RLIMIT_NPROC, self.max_processes),
            (_native.RLIMIT_FSIZE, self.file_size_bytes),
            (_native.RLIMIT_NOFILE, self.open_files),
        ):
            if value is not None:
                soft[index] = hard[index] = min(int(value), 2**63 - 1)
        return soft, hard


# A second switch a run also watches, set only by boundedproc's own wrappers
# (run_async's task cancellation) so that a caller's shared Cancel is never set
# on their behalf.
ALSO_CANCEL: contextvars.ContextVar[Cancel | None] = contextvars.ContextVar(
    "boundedproc_also_cancel", default=None)

_NO_LIMITS = ([-1] * _native.NRLIMITS, [-1] * _native.NRLIMITS)


def _seconds(name: str, value: object, *, allow_none: bool) -> float | None:
    if value is None:
        if allow_none:
            return None
        raise TypeError(f"{name} must be a number, not None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or v < 0:
        raise ValueError(f"{name} must be >= 0 seconds, not {value!r}")
    if math.isinf(v):
        if allow_none:
            return None
        raise ValueError(f"{name} must be finite, not {value!r}")
    return v


def _ns(seconds: float | None) -> int:
    if seconds is None:
        return -1
    return min(int(seconds * 1e9), 2**62)


def _entry(value: object, what: str) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    if isinstance(value, bytes):
        return value
    if isinstance(value, os.PathLike):
        return os.fsencode(value)
    raise TypeError(f"{what} must be str, bytes or os.PathLike, not {type(value).__name__}")


def _text_arg(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


def _not_spawned(args: Sequence[bytes], why: str, started: float, payload: bytes,
                 cancelled: bool = False) -> Result:
    return Result(
        args=tuple(_text_arg(a) for a in args),
        exit_code=_native.CANCEL_EXIT_CODE if cancelled else _native.SPAWN_FAILURE_EXIT_CODE,
        stdout=b"",
        stderr=b"",
        cancelled=cancelled,
        spawned=False,
        stdin_delivered=not payload,
        runner_error=None if cancelled else f"not spawned: {why}",
        duration=time.monotonic() - started,
    )


def _exec_paths(program: bytes, path: bytes | None) -> list[bytes]:
    """Candidates for execve, as execvp would try them (POSIX PATH rules)."""
    if b"/" in program:
        return [program]
    if not program:
        return []
    search = path if path is not None else os.defpath.encode()
    # An empty PATH entry means the current directory, as POSIX says.
    return [(d or b".") + b"/" + program for d in search.split(b":")]


def run(
    cmd: Command,
    *,
    shell: bool | str = False,
    timeout: float | None = DEFAULT_TIMEOUT,
    max_output: int | None = DEFAULT_MAX_OUTPUT,
    on_overflow: Literal["truncate", "kill"] = "truncate",
    stdin: bytes | str | None = None,
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
) -> Result:
    """Run a command to completion within bounds, killing its whole group.

    The child leads a new session and process group, starts with default
    signal dispositions, an empty signal mask, only fds 0-2, and a stdin pipe
    that carries ``stdin`` and is then closed (at once when there is none).
    The run ends at the first of: the leader exits, the deadline, ``cancel``,
    the output cap under ``on_overflow="kill"``, or a signal that raises in the
    caller (Ctrl-C).  Then the group gets SIGTERM and, ``kill_grace`` seconds
    later, SIGKILL (SIGKILL at once when ``kill_grace`` is 0), also when the
    leader exited on its own, so no process of the group outlives the call.

    Args:
        cmd: An argument vector (``cmd[0]`` is looked up on the ``PATH`` of the
            child's environment, ``os.defpath`` without one; no shell reads any
            entry), or a string for ``shell``.
        shell: ``True`` runs ``/bin/sh -c cmd``; a program name or path runs
            ``[shell, "-c", cmd]``.  Needs a string ``cmd``.
        timeout: Seconds from the spawn to the deadline; ``None`` (or infinity)
            for none.
        max_output: Bytes kept across stdout and stderr together, in arrival
            order; ``None`` for no cap.
        on_overflow: Past the cap, ``"truncate"`` reads and discards the rest,
            ``"kill"`` kills the group at once (exit 137).
        stdin: Payload written to the child's stdin (``str`` is UTF-8 encoded).
        cwd: Directory the child starts in.
        env: Variables for the child; a ``None`` value removes one (merge).
        env_mode: ``"merge"`` applies ``env`` over the caller's environment,
            ``"replace"`` gives the child ``env`` alone.
        merge_stderr: Send the child's stderr to the stdout pipe, in order.
        text: Decode stdout and stderr as UTF-8 with ``errors="replace"``.
        cancel: A switch that ends the run when set; a run whose switch is
            already set spawns nothing and reports ``cancelled``.
        kill_grace: Seconds between SIGTERM and SIGKILL; ends early once the
            group is empty.
        drain_grace: Seconds to keep reading the pipes after the leader is
            reaped; if something outside the group still holds them then,
            reading stops and ``escaped`` is set.
        limits: Resource limits for the child (``setrlimit`` before exec).
        contain: Kill, at the end, also the descendants that left the group
            (``setsid``, double fork, daemonising), and every process of the
            run if the caller dies, even by SIGKILL.  A small supervisor
            process, a child subreaper cloned into the caller's address space
            (no exec), sits between the caller and the command for this; the
            caller itself never becomes a subreaper.
            ``None`` (the default) means on where supported (Linux);
            ``True`` where unsupported raises ``ValueError``.

    Returns:
        A ``Result``.  Everything about the command's content or the OS (a NUL
        byte, a missing program or cwd, E2BIG, EAGAIN, a file that cannot be
        executed, stdin not read) is reported in it, never raised.  ``run``
        returns within ``timeout + kill_grace + drain_grace`` plus a few
        milliseconds, whatever the command does.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: a string command without a shell, a vector with a shell,
            an empty vector, a negative or NaN bound, an unknown mode.
        KeyboardInterrupt: Ctrl-C during the run, after the group was killed
            and the leader reaped.
        MemoryError: the runner could not allocate what it needs.
    """
    started = time.monotonic()

    # ---- caller bugs: raised before anything is spawned -------------------------
    if isinstance(shell, str):
        shell_prog: str | None = shell or None
    elif isinstance(shell, bool):
        shell_prog = "/bin/sh" if shell else None
    else:
        raise TypeError(f"shell must be a bool or a program name, not {type(shell).__name__}")
    if isinstance(cmd, str):
        if shell_prog is None:
            raise ValueError("a string command needs shell=True or shell='bash'; "
                             "pass an argument vector to run without a shell")
        raw_args = [shell_prog.encode("utf-8", "surrogateescape"), b"-c",
                    cmd.encode("utf-8", "surrogateescape")]
    elif isinstance(cmd, (bytes, bytearray, memoryview)):
        raise TypeError("cmd must be a str (with a shell) or a sequence of arguments, not bytes")
    elif isinstance(cmd, Sequence) or hasattr(cmd, "__iter__"):
        if shell_prog is not None:
            raise ValueError("an argument vector runs without a shell: "
                             "pass a string to run it with shell=")
        raw_args = [_entry(a, f"cmd[{i}]") for i, a in enumerate(cmd)]
        if not raw_args:
            raise ValueError("cmd is an empty argument vector")
    else:
        raise TypeError(f"cmd must be a str or a sequence, not {type(cmd).__name__}")

    timeout_s = _seconds("timeout", timeout, allow_none=True)
    kill_grace_s = _seconds("kill_grace", kill_grace, allow_none=False)
    drain_grace_s = _seconds("drain_grace", drain_grace, allow_none=False)
    if max_output is not None:
        if isinstance(max_output, bool) or not isinstance(max_output, int):
            raise TypeError(f"max_output must be an int or None, not {type(max_output).__name__}")
        if max_output < 0:
            raise ValueError(f"max_output must be >= 0, not {max_output}")
    if on_overflow not in ("truncate", "kill"):
        raise ValueError(f"on_overflow must be 'truncate' or 'kill', not {on_overflow!r}")
    if env_mode not in ("merge", "replace"):
        raise ValueError(f"env_mode must be 'merge' or 'replace', not {env_mode!r}")
    if stdin is None:
        payload = b""
    elif isinstance(stdin, str):
        payload = stdin.encode("utf-8")
    elif isinstance(stdin, (bytes, bytearray, memoryview)):
        payload = bytes(stdin)
    else:
        raise TypeError(f"stdin must be bytes, str or None, not {type(stdin).__name__}")
    cwd_b: bytes | None = None
    if cwd is not None:
        cwd_b = _entry(cwd, "cwd")
    if env is not None and not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping or None, not {type(env).__name__}")
    env_items: list[tuple[bytes, bytes | None]] = []
    for k, v in (env or {}).items():
        kb = _entry(k, "env key")
        vb = None if v is None else _entry(v, f"env[{k!r}]")
        env_items.append((kb, vb))
    if cancel is not None and not isinstance(cancel, Cancel):
        raise TypeError(f"cancel must be a boundedproc.Cancel, not {type(cancel).__name__}")
    if cancel is not None and cancel.fileno() < 0:
        raise ValueError("cancel was closed")
    if limits is not None and not isinstance(limits, Limits):
        raise TypeError(f"limits must be a boundedproc.Limits, not {type(limits).__name__}")
    if contain is not None and not isinstance(contain, bool):
        raise TypeError(f"contain must be a bool or None, not {type(contain).__name__}")
    if contain and not _native.CONTAIN_SUPPORTED:
        raise ValueError("contain=True needs Linux (x86_64 or aarch64) with "
                         "PR_SET_CHILD_SUBREAPER; pass contain=None to contain where supported")
    contained = _native.CONTAIN_SUPPORTED if contain is None else contain

    # ---- content that cannot reach a process: returned, not raised ------------
    also_cancel = ALSO_CANCEL.get()
    if (cancel is not None and cancel.cancelled) or (also_cancel is not None
                                                     and also_cancel.cancelled):
        return _not_spawned(raw_args, "cancelled before spawn", started, payload, cancelled=True)
    for i, a in enumerate(raw_args):
        if b"\0" in a:
            return _not_spawned(raw_args, f"argument {i} contains a NUL byte", started, payload)
    if cwd_b is not None and b"\0" in cwd_b:
        return _not_spawned(raw_args, "cwd contains a NUL byte", started, payload)

    envp: list[bytes] | None
    child_path: bytes | None
    if env_mode == "merge" and not env_items:
        envp = None  # the caller's environment, as it is
        child_path = os.environb.get(b"PATH")
    else:
        merged: dict[bytes, bytes] = dict(os.environb) if env_mode == "merge" else {}
        for kb, vb in env_items:
            if not kb or b"=" in kb or b"\0" in kb:
                return _not_spawned(
                    raw_args, f"environment variable name {_text_arg(kb)!r} is empty or "
                    "contains '=' or a NUL byte", started, payload)
            if vb is None:
                merged.pop(kb, None)
            elif b"\0" in vb:
                return _not_spawned(
                    raw_args, f"environment variable {_text_arg(kb)!r} contains a NUL byte",
                    started, payload)
            else:
                merged[kb] = vb
        envp = [k + b"=" + v for k, v in merged.items()]
        child_path = merged.get(b"PATH")

    soft, hard = limits._native() if limits is not None else _NO_LIMITS
    spec = _native.NativeSpec(
        argv=raw_args,
        exec_paths=_exec_paths(raw_args[0], child_path),
        envp=envp,
        cwd=cwd_b,
        stdin=payload,
        timeout_ns=_ns(timeout_s),
        max_output=-1 if max_output is None else min(max_output, 2**63 - 1),
        overflow_kill=on_overflow == "kill",
        merge_stderr=bool(merge_stderr),
        cancel_fd=-1 if cancel is None else cancel.fileno(),
        cancel_fd2=-1 if also_cancel is None else also_cancel.fileno(),
        kill_grace_ns=_ns(kill_grace_s),
        drain_grace_ns=_ns(drain_grace_s),
        rlimits_soft=soft,
        rlimits_hard=hard,
        contain=contained,
    )
    out = _native.execute(spec)
    if contain is None and contained and _native.containment_refused(out):
        # A sandbox that refuses the supervisor's clone, signalfd or prctl
        # (seccomp, gVisor): containment was only "where supported", so run
        # uncontained, now and from here on, rather than fail every run.
        _native.CONTAIN_SUPPORTED = False
        out = _native.execute(dataclasses.replace(spec, contain=False))
    return _to_result(out, raw_args, cwd_b, len(payload), text, started)


def _runner_error(out: _native.NativeOutcome, args: Sequence[bytes], cwd: bytes | None,
                  payload_len: int) -> str | None:
    if out.err_stage:
        name = _native.errno_name(out.err_errno)
        stage = _native.stage_name(out.err_stage)
        why = os.strerror(out.err_errno)
        if stage == "chdir":
            target = f"cwd {_text_arg(cwd or b'')!r}"
        elif stage == "execve":
            target = f"program {_text_arg(args[0])!r}"
        else:
            target = f"{stage} for {_text_arg(args[0])!r}"
        return f"spawn failed: {name} ({why}): {target}"
    if out.spawned and not out.stdin_delivered:
        return (f"stdin not delivered: {out.stdin_written} of {payload_len} bytes written "
                "before the command stopped reading")
    return None


def _to_result(out: _native.NativeOutcome, args: Sequence[bytes], cwd: bytes | None,
               payload_len: int, text: bool, started: float) -> Result:
    stdout: bytes | str = out.stdout
    stderr: bytes | str = out.stderr
    if text:
        stdout = out.stdout.decode("utf-8", "replace")
        stderr = out.stderr.decode("utf-8", "replace")
    return Result(
        args=tuple(_text_arg(a) for a in args),
        exit_code=out.exit_code,
        stdout=stdout,
        stderr=stderr,
        timed_out=out.timed_out,
        cancelled=out.cancelled,
        output_truncated=out.output_truncated,
        escaped=out.escaped or out.unkilled > 0,
        spawned=out.spawned,
        stdin_delivered=out.stdin_delivered,
        runner_error=_runner_error(out, args, cwd, payload_len),
        term_signal=out.term_signal or None,
        pid=out.pid if out.spawned else None,
        duration=time.monotonic() - started,
        output_bytes=out.output_bytes,
        user_time=out.user_time,
        system_time=out.system_time,
        max_rss=out.max_rss,
    )
