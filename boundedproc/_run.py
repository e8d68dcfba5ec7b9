"""``run()``: validate in Python, then hand the run to the C core.

A run goes through three pieces, each in its own module: the options
(``_options``: validation, defaults, ``Limits``), the command (``_command``:
argument vector, program candidates, environment snapshot), and the spawn
(``_native``: the one module that talks to the core).  This module puts them
together and turns the core's outcome into a ``Result``.
"""

from __future__ import annotations

import errno
import operator
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, overload

from boundedproc import _command, _ids, _native, _tmpdir
from boundedproc._cancel import ALSO_CANCEL, Cancel, above_stdio
from boundedproc._command import Command, StrOrBytesPath, text_arg
from boundedproc._options import (
    CAPTURE,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_TIMEOUT,
    DEVNULL_CODE,
    INHERIT_CODE,
    NO_LIMITS,
    NOT_AN_FD,
    Keep,
    Limits,
    Options,
    OutputCallback,
    StdinSource,
    StdioTarget,
    Unencodable,
    grace_ns,
    to_ns,
    validate,
)
from boundedproc._result import AnyResult, Result, make_result

__all__ = ["DEFAULT_MAX_OUTPUT", "DEFAULT_TIMEOUT", "Cancel", "Limits", "run"]

_DEVNULL_FD: int | None = None


def _devnull() -> int:
    """One close-on-exec ``/dev/null`` fd per process, opened on first use."""
    global _DEVNULL_FD
    if _DEVNULL_FD is None:
        _DEVNULL_FD = above_stdio(os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC))
    return _DEVNULL_FD


def _child_fd(code: int, inherit: int) -> int:
    """The fd the core gives the child for a validated stream target code."""
    if code == DEVNULL_CODE:
        return _devnull()
    if code == INHERIT_CODE:
        try:
            os.fstat(inherit)
        except OSError:  # the caller's own is closed: so is the child's
            return _native.FD_CLOSED
        return inherit
    return code


@dataclass(slots=True)
class Prepared:
    """A run ready for the core: the spec, and what the result needs to be built.

    Never changed once made (``dataclasses.replace`` makes a new one); not frozen only
    because a frozen ``__init__`` costs a microsecond a run.

    ``ids`` are the resolved ``user=``/``group=`` (``_ids.NO_CHANGE`` without
    them); ``runner_error`` is a whole ``spawn failed: ...`` text for a run
    refused before the core (an unknown user, a tmpdir that cannot be made).
    """

    args: list[bytes]
    options: Options
    spec: _native.NativeSpec | None
    not_spawned: str | None = None
    cancelled: bool = False
    ids: _ids.Ids = _ids.NO_CHANGE
    runner_error: str | None = None


def prepare(cmd: object, shell: object, options: Options) -> Prepared:
    """The command and the spec of a run, or why it cannot be spawned.

    Raises:
        TypeError, ValueError: a caller bug in ``cmd``, ``shell`` or ``env``.
    """
    unencodable: str | None = options.not_spawned
    try:
        args = _command.argv_of(cmd, shell)
    except _command.UnencodableArgv as err:
        args, unencodable = err.argv, err.why
    try:
        items = _command.env_items(options.env)
    except Unencodable as err:
        items, unencodable = [], unencodable or err.why
    also_cancel = ALSO_CANCEL.get()
    if (options.cancel is not None and options.cancel.cancelled) or (
            also_cancel is not None and also_cancel.cancelled):
        return Prepared(args, options, None, "cancelled before spawn", cancelled=True)
    if unencodable is not None:
        return Prepared(args, options, None, unencodable)
    bad = _command.check_content(args, options.cwd)
    if bad is not None:
        return Prepared(args, options, None, bad.why)
    env = _command.environment(items, options.env_mode)
    if isinstance(env, _command.NotSpawned):
        return Prepared(args, options, None, env.why)
    envp, child_path = env
    ids = _ids.resolve(options.user, options.group)
    if isinstance(ids, _ids.Unresolved):
        return Prepared(args, options, None, runner_error=ids.runner_error)
    contain = _native.contain_default() if options.contain is None else options.contain
    cancel_fd2 = -1 if also_cancel is None else also_cancel.fileno()
    paths = _command.exec_paths(args[0], child_path)
    memo = options.spec_tail
    if memo is not None and memo[0] is contain:
        return Prepared(args, options, _native.NativeSpec(args, paths, envp, cancel_fd2, *memo[1]),
                        ids=ids)
    soft, hard = options.limits.native() if options.limits is not None else NO_LIMITS
    spec = _native.NativeSpec(
        argv=args,
        exec_paths=paths,
        envp=envp,
        cwd=options.cwd,
        stdin=options.payload,
        timeout_ns=to_ns(options.timeout),
        max_output=-1 if options.max_output is None else min(options.max_output, 2**63 - 1),
        overflow_kill=options.overflow_kill,
        merge_stderr=options.merge_stderr,
        cancel_fd=-1 if options.cancel is None else options.cancel.fileno(),
        cancel_fd2=cancel_fd2,
        kill_grace_ns=-1 if options.kill_grace_never else grace_ns(options.kill_grace),
        drain_grace_ns=grace_ns(options.drain_grace),
        rlimits_soft=soft,
        rlimits_hard=hard,
        contain=contain,
        contain_explicit=options.contain is True,
        stdin_fd=_child_fd(options.stdin_fd, 0),
        stdout_fd=_child_fd(options.stdout_fd, 1),
        stderr_fd=_child_fd(options.stderr_fd, 2),
        first_signal=options.first_signal,
        new_session=options.new_session,
        uid=-1 if ids.uid is None else ids.uid,
        gid=-1 if ids.gid is None else ids.gid,
        groups=None if ids.groups is None else tuple(ids.groups),
        keep=_native.KEEP_MODES[options.keep],
    )
    # The fields after NativeSpec.PER_RUN come from the options alone, unless they name a
    # user or group (looked up at each run) or an inherited stream (checked open at each
    # run): kept on the options, the next run with the same (validate remembers plain
    # options) passes them as they are.  Building them anew was most of prepare()'s time.
    if ids is _ids.NO_CHANGE and INHERIT_CODE not in (options.stdin_fd, options.stdout_fd,
                                                      options.stderr_fd):
        object.__setattr__(options, "spec_tail", (contain, _spec_tail(spec)))
    return Prepared(args, options, spec, ids=ids)


_spec_tail = operator.attrgetter(
    *[f.name for f in fields(_native.NativeSpec)][_native.NativeSpec.PER_RUN:])


def execute(prepared: Prepared, started: float,
            control: _native.RunControl | None = None) -> tuple[AnyResult, _native.NativeOutcome | None]:
    """Run a prepared command and build its result (and the core's raw outcome)."""
    opts = prepared.options
    if prepared.spec is None:
        return _not_spawned(prepared, started), None
    if opts.tmpdir:
        return _execute_in_tmpdir(prepared, prepared.spec, started, control)
    out = _native.execute(prepared.spec, on_output=opts.on_output, control=control)
    return _to_result(out, prepared, started), out


def _execute_in_tmpdir(prepared: Prepared, spec: _native.NativeSpec, started: float,
                       control: _native.RunControl | None,
                       ) -> tuple[AnyResult, _native.NativeOutcome | None]:
    """``execute`` in a fresh private directory, the child's cwd and ``TMPDIR``.

    The directory is removed after the run, and also when the run raises
    (Ctrl-C, ``on_output``), before the exception propagates.  A removal that
    fails is ``Result.cleanup_error``, never raised, and changes no other field.
    """
    try:
        path = _tmpdir.create(prepared.ids.uid, prepared.ids.gid)
    except OSError as err:
        code = err.errno or 0
        # tempfile.tempdir, not gettempdir(): where tempfile found no usable directory
        # (no fd left for its probes, which _tmpdir.create reports as EMFILE or ENFILE;
        # or none writable, ENOENT) gettempdir() would raise again; the text then names
        # no directory.
        where = tempfile.tempdir
        why = _native.spawn_failed(code, err.strerror or os.strerror(code),
                                   "tmpdir" if where is None else f"tmpdir under {where!r}")
        return _not_spawned(replace(prepared, runner_error=why), started), None
    entry = b"TMPDIR=" + os.fsencode(path)
    envp = [e for e in (spec.envp if spec.envp is not None else [])
            if not e.startswith(b"TMPDIR=")]
    spec = replace(spec, cwd=os.fsencode(path), envp=[*envp, entry])
    try:
        out = _native.execute(spec, on_output=prepared.options.on_output, control=control)
    except BaseException:
        _tmpdir.remove(path)  # nothing to report it in: the exception is the news
        raise
    cleanup_error = _tmpdir.remove(path)
    result = _to_result(out, replace(prepared, spec=spec), started)
    if cleanup_error is not None:
        result = replace(result, cleanup_error=cleanup_error)
    return result, out


@overload
def run(
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
def run(
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
def run(
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
def run(
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
        timeout: Seconds from the spawn to the deadline; ``None`` (or infinity,
            or a bound too large to represent) for none.
        max_output: Bytes kept across stdout and stderr together, in arrival
            order; ``None`` for no cap.
        on_overflow: Past the cap, ``"truncate"`` reads and discards the rest,
            ``"kill"`` kills the group at once (exit 137; ``keep="head"`` only).
        stdin: A payload written to the child's stdin (``str`` is UTF-8
            encoded with surrogateescape, as ``cmd``), ``None`` for an empty
            stdin (EOF at once), ``DEVNULL`` or ``INHERIT`` (the caller's fd 0,
            for a command that reads the terminal).
        cwd: Directory the child starts in.
        env: Variables for the child; a ``None`` value removes one (merge).
        env_mode: ``"merge"`` applies ``env`` over the caller's environment,
            ``"replace"`` gives the child ``env`` alone.
        merge_stderr: Send the child's stderr where its stdout goes, in order.
        text: Decode stdout and stderr as UTF-8 with ``errors="replace"``.
        cancel: A switch that ends the run when set; a run whose switch is
            already set spawns nothing and reports ``cancelled``.
        kill_grace: Seconds between SIGTERM and SIGKILL; ends early once the
            group is empty.
        drain_grace: Seconds to keep reading the pipes after the leader is
            reaped; if something outside the group still holds them then,
            reading stops and ``escaped`` is set.  Processes the run's end
            killed (on their way out, or gone while the kernel releases
            their files) are waited for, for at most 0.5 s more: they are
            no escapees (README, "boundedproc.run").  If nothing holds
            them, what they still buffer is read to the end, past
            ``drain_grace`` if need be (a slow ``on_output``): no byte is
            lost for want of time.
        limits: Resource limits for the child (``setrlimit`` before exec).
        contain: Kill, at the end, also the descendants that left the group
            (``setsid``, double fork, daemonising), and every process of the
            run if the caller dies, even by SIGKILL.  A supervisor process, a
            child subreaper reused from run to run, sits between the caller
            and the command for this; the caller itself never becomes a
            subreaper.  ``None`` (the default) means on where supported
            (Linux); ``True`` where unsupported raises ``ValueError``.
        on_output: Called in the calling thread as ``on_output(stream, chunk)``
            (``stream`` 1 or 2) for every chunk read from a captured stream,
            kept or not, in arrival order; a chunk is one read, at most
            256 KiB.  An exception it raises ends the run as Ctrl-C does, then
            propagates.
        keep: Which bytes ``max_output`` keeps across both streams in arrival
            order: the first (``"head"``), the last (``"tail"``), or the first
            half and the last half (``"head+tail"``).
        stdout: ``CAPTURE`` (the default), ``DEVNULL``, ``INHERIT`` (the
            caller's fd 1: live, uncounted, uncapped), an fd or an object with
            ``fileno()``.
        stderr: The same for stderr.
        user: Run as this user (a name or a uid): ``setgroups`` to its groups
            (``os.getgrouplist``: the caller's own are dropped), ``setgid`` to
            its group and ``setuid`` before exec.  A name the machine does not
            have is a ``spawn failed: ENOENT (no such user): user 'bob'``
            result; a uid without a ``passwd`` entry needs ``group=``.
        group: Run with this group (a name or a gid) instead of the user's;
            alone, it also becomes the only supplementary group.
        tmpdir: Run in a fresh private directory under
            ``tempfile.gettempdir()`` (mode 0700, owned by ``user``), also the
            child's ``TMPDIR``, removed with everything in it after the run,
            also after a kill or an exception, and also when the command made
            its contents read-only or unlistable (removed as the caller; a
            symlink is never followed, a mount point never entered).  A
            removal that fails is ``Result.cleanup_error``, never raised.
        check: Raise ``ProcessFailed`` when the result is not ``ok``.

    Returns:
        A ``Result``.  Everything about the command's content or the OS (a NUL
        byte, a missing program or cwd, E2BIG, EAGAIN, a file that cannot be
        executed, stdin not read) is reported in it, never raised.  ``run``
        returns within ``timeout + kill_grace + drain_grace`` plus a few
        milliseconds, whatever the command does.

    Raises:
        TypeError: an argument of the wrong type, or an unknown keyword (one of
            ``subprocess.run``'s is named with the boundedproc equivalent).
        ValueError: a string command without a shell, a vector with a shell,
            an empty vector, a negative or NaN bound, an unknown mode.
        ProcessFailed: with ``check=True``, when the result is not ``ok``.
        KeyboardInterrupt: Ctrl-C during the run, after the group was killed
            and the leader reaped.
        MemoryError: the runner could not allocate what it needs.
    """
    started = time.monotonic()
    if unknown:
        raise unknown_keyword(unknown)
    options = validate(
        timeout=timeout, max_output=max_output, on_overflow=on_overflow, stdin=stdin, cwd=cwd,
        env=env, env_mode=env_mode, merge_stderr=merge_stderr, text=text, cancel=cancel,
        kill_grace=kill_grace, drain_grace=drain_grace, limits=limits, contain=contain,
        on_output=on_output, keep=keep, stdout=stdout, stderr=stderr, user=user, group=group,
        tmpdir=tmpdir, check=check)
    result, _ = execute(prepare(cmd, shell, options), started)
    if options.check:
        result.check()
    return result


_SUBPROCESS_KEYWORDS = {
    "input": "stdin= (a payload: bytes or str)",
    "capture_output": "nothing: output is captured by default (stdout=CAPTURE)",
    "universal_newlines": "text=True",
    "encoding": "text=True (always UTF-8 with errors='replace')",
    "errors": "text=True (always UTF-8 with errors='replace')",
    "start_new_session": "nothing: every run leads a new session",
    "preexec_fn": "nothing: no Python code runs in the child (see limits=, user=, group=)",
    "close_fds": "nothing: the child always gets fds 0-2 only",
    "executable": "cmd[0] (looked up on the child's PATH)",
    "bufsize": "nothing: output is read as it arrives",
    "pass_fds": "nothing: the child gets fds 0-2 only",
    "process_group": "nothing: every run leads its own group",
    "extra_groups": "user= (its groups are set) or group=",
}


def unknown_keyword(unknown: Mapping[str, object], function: str = "run") -> TypeError:
    """The error for keywords ``function`` does not take (subprocess's named with ours)."""
    name = min(unknown)
    hint = _SUBPROCESS_KEYWORDS.get(name)
    if hint is not None:
        return TypeError(f"{function}() got subprocess's keyword {name!r}: boundedproc uses {hint}")
    return TypeError(f"{function}() got an unexpected keyword argument {name!r}")


def _kept(data: bytes, gap: int | None, text: bool) -> tuple[Any, int | None]:
    """A stream and its gap as a result holds them: ``str`` decoded as UTF-8 (errors
    replaced) with ``text=True``, else the bytes.  With ``text=True`` the bytes before
    the gap and those after it (``keep="head+tail"``) are decoded apart, never as if they
    were adjacent (a character cut at the head's end and one cut at the tail's start made
    a third the command never printed), and the gap is an index in the ``str``."""
    if not text:
        return data, gap
    if gap is None:
        return data.decode("utf-8", "replace"), None
    head = data[:gap].decode("utf-8", "replace")
    return head + data[gap:].decode("utf-8", "replace"), len(head)


def _make(text: bool, stdout: bytes, stderr: bytes, **fields: Any) -> AnyResult:
    """A ``Result[str]`` or a ``Result[bytes]`` (see ``_kept``) of a run that kept nothing."""
    return Result(stdout=_kept(stdout, None, text)[0], stderr=_kept(stderr, None, text)[0],
                  **fields)


def _not_spawned(prepared: Prepared, started: float) -> AnyResult:
    return _make(
        prepared.options.text, b"", b"",
        args=tuple(text_arg(a) for a in prepared.args),
        exit_code=(_native.CANCEL_EXIT_CODE if prepared.cancelled
                   else _native.SPAWN_FAILURE_EXIT_CODE),
        cancelled=prepared.cancelled,
        spawned=False,
        stdin_delivered=not prepared.options.payload,
        runner_error=(None if prepared.cancelled
                      else prepared.runner_error or f"not spawned: {prepared.not_spawned}"),
        duration=time.monotonic() - started,
    )


def _unusable_stream(options: Options) -> str | None:
    """Which ``stdout=``/``stderr=`` target is no open fd (named for the error), if one is."""
    for name, fd in (("stdout", options.stdout_fd), ("stderr", options.stderr_fd)):
        if fd == NOT_AN_FD:
            return f"{name} (not an open fd)"
        if fd >= 0:
            try:
                os.fstat(fd)
            except OSError:
                return f"{name} fd {fd}"
    return None


def _runner_error(out: _native.NativeOutcome, args: Sequence[bytes], cwd: bytes | None,
                  options: Options) -> str | None:
    if out.runner_failure:  # the supervisor failed it: a spawn failure if nothing started
        return f"{'runner' if out.spawned else 'spawn'} failed: {out.runner_failure}"
    if out.err_stage:
        name = _native.errno_name(out.err_errno)
        stage = _native.stage_name(out.err_stage)
        why = os.strerror(out.err_errno)
        if stage == "chdir":
            target = f"cwd {text_arg(cwd or b'')!r} for {text_arg(args[0])!r}"
        elif stage == "dup2" and (stream := _unusable_stream(options)) is not None:
            target = f"{stream} for {text_arg(args[0])!r}"
        elif stage == "execve":
            target = f"program {text_arg(args[0])!r}"
        elif stage == "kill" and out.err_errno == errno.EPERM:
            target = (f"kill for {text_arg(args[0])!r}: its leader runs as another user (a "
                      "setuid program, sudo) and is left running")
        elif stage == "wait4" and out.err_errno == errno.EBUSY:
            target = (f"wait4 for {text_arg(args[0])!r}: its leader is traced (ptrace) by a "
                      "process the run could not kill, which alone may wait for it; it is "
                      "let go, its status unknown")
        elif stage == "supervisor":
            target = f"the supervisor program {_native.SUPERVISOR_PATH!r}"
            if out.err_errno == errno.EPROTO:
                target += (" is from another build of boundedproc (upgraded under this "
                           "process, or a stale build): restart, or reinstall")
        else:
            target = f"{stage} for {text_arg(args[0])!r}"
        prefix = "runner failed" if out.spawned else "spawn failed"
        return f"{prefix}: {name} ({why}): {target}"
    if out.spawned and not out.stdin_delivered:
        return (f"stdin not delivered: {out.stdin_written} of {len(options.payload)} bytes "
                "written before the command stopped reading")
    return None


def _to_result(out: _native.NativeOutcome, prepared: Prepared, started: float,
               duration: float | None = None) -> AnyResult:
    opts = prepared.options
    stdout, stdout_gap = _kept(out.stdout, out.stdout_gap, opts.text)
    stderr, stderr_gap = _kept(out.stderr, out.stderr_gap, opts.text)
    # Built here in one positional call (every field of Result, in its order), not through
    # _make: this runs once a command, and at scale the caller's CPU a run counts
    # (benchmarks/README.md, "The Python side of a run"); a test checks each field.
    return make_result(
        tuple([text_arg(a) for a in prepared.args]),  # args
        out.exit_code,
        stdout,
        stderr,
        out.timed_out,
        out.cancelled,
        out.output_truncated,
        out.escaped or out.unkilled > 0,  # escaped
        out.spawned,
        out.stdin_delivered,
        _runner_error(out, prepared.args, prepared.spec.cwd if prepared.spec else opts.cwd,
                      opts),  # runner_error
        out.term_signal or None,  # term_signal
        out.pid if out.spawned else None,  # pid
        time.monotonic() - started if duration is None else duration,  # duration
        out.output_bytes,
        out.user_time,
        out.system_time,
        out.max_rss,
        out.stdout_omitted,
        out.stderr_omitted,
        stdout_gap,
        stderr_gap,
        None,  # cleanup_error
    )
