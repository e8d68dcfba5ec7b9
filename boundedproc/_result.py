"""The result of a run, and the exception ``Result.check`` raises."""

from __future__ import annotations

import shlex
import types
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar, Union, cast

Output = Union[bytes, str]  # noqa: UP007 - a runtime alias, kept for Python 3.10 docs

#: ``bytes`` for a run with ``text=False`` (the default), ``str`` with ``text=True``.
OutputT = TypeVar("OutputT", bytes, str)


@dataclass(frozen=True, slots=True)
class Result(Generic[OutputT]):
    """What one bounded run did.

    Attributes:
        args: The argument vector that was executed (for a shell command, the
            shell, ``-c`` and the command), bytes decoded with surrogateescape.
        exit_code: The leader's exit status; 124 after the deadline, 137 after a
            cancel or a kill for the output cap, ``128 + N`` for a signal N the
            runner did not send, 127 (or 126) when nothing could be started.
        stdout: The kept bytes of stdout (``str`` with ``text=True``).
        stderr: The kept bytes of stderr; empty with ``merge_stderr``.
        timed_out: The deadline ended the run.
        cancelled: The ``Cancel`` ended the run, or was set before the spawn.
        output_truncated: At least one byte past ``max_output`` was discarded.
        escaped: After the group was killed, a process outside it still held
            the output pipes when ``drain_grace`` ran out.
        spawned: The command was started (also when it was later killed).
        stdin_delivered: There was no payload, or all of it was written.
        runner_error: ``None`` when the command ran as asked, otherwise text
            starting with ``not spawned: ``, ``spawn failed: `` or
            ``stdin not delivered: ``.
        term_signal: The signal that ended the leader, if one did.
        pid: The leader's pid, ``None`` when nothing was spawned.
        duration: Seconds from the call to the return (monotonic clock).
        output_bytes: Bytes read from both streams, kept and discarded.
        user_time: User CPU seconds of every process of the run that was
            reaped (``wait4``; see below).
        system_time: System CPU seconds of the same processes.
        max_rss: The largest peak resident set, in bytes, of the processes
            ``user_time`` covers.  On Linux an uncontained leader's is at least
            the caller's resident size at spawn time: the child runs in the
            caller's address space until its exec (vfork), and the kernel
            carries that high-water mark over.
        stdout_omitted: Bytes of stdout read and not kept (see ``keep``).
        stderr_omitted: Bytes of stderr read and not kept.
        stdout_gap: Where in the kept stdout the omitted bytes were
            (``len(stdout)`` for ``keep="head"``, 0 for ``"tail"``; an index
            in the ``str`` with ``text=True``, whose head and tail are decoded
            apart); ``None`` when nothing was omitted.
        stderr_gap: The same for stderr.
        cleanup_error: ``None``, or why the run's ``tmpdir`` (``tmpdir=True``)
            could not be removed whole, as ``tmpdir not removed: ENAME (why):
            'path'``.  It is the runner's own housekeeping after the command
            ended, so it changes no other field, not ``runner_error`` and not
            ``ok``: the command ran as asked, and a grader must not call a
            check unrunnable because a scratch directory outlived it.

    ``user_time`` and ``system_time`` cover the whole run: the leader, the
    descendants it waited for, and, contained, every orphan the supervisor
    adopted and reaped.  An uncontained run sees only the leader and what it
    waited for (an orphan is reaped by init, out of our sight).
    """

    args: tuple[str, ...]
    exit_code: int
    stdout: OutputT
    stderr: OutputT
    timed_out: bool = False
    cancelled: bool = False
    output_truncated: bool = False
    escaped: bool = False
    spawned: bool = True
    stdin_delivered: bool = True
    runner_error: str | None = None
    term_signal: int | None = None
    pid: int | None = None
    duration: float = 0.0
    output_bytes: int = 0
    user_time: float = 0.0
    system_time: float = 0.0
    max_rss: int = 0
    stdout_omitted: int = 0
    stderr_omitted: int = 0
    stdout_gap: int | None = None
    stderr_gap: int | None = None
    cleanup_error: str | None = None

    @property
    def ok(self) -> bool:
        """Exit status 0 and no flag set: the command ran whole and succeeded."""
        return (
            self.exit_code == 0
            and self.spawned
            and self.stdin_delivered
            and self.runner_error is None
            and not (self.timed_out or self.cancelled or self.output_truncated or self.escaped)
        )

    def check(self) -> Result[OutputT]:
        """Return this result when ``ok``.

        Raises:
            ProcessFailed: when it is not ``ok``; ``.result`` is this result.
        """
        if not self.ok:
            raise ProcessFailed(self)
        return self


#: A result of either output type.
AnyResult = Union[Result[bytes], Result[str]]  # noqa: UP007 - a runtime alias


def _result_maker() -> Callable[..., Result[Any]]:
    """``Result(*values)`` (every field, in order), for the runner's one result a run.

    A frozen dataclass sets each field through ``object.__setattr__``: 3.2 us for
    Result's 23, against 0.3 us for a plain class (benchmarks/README.md, "The Python
    side of a run").  So the fields go into an unfrozen class with the same slots,
    and the object then becomes a Result (``__class__`` assignment, which CPython
    allows between classes of one layout).  Where that is refused, Result itself.
    """
    names = {f.name: f.type for f in fields(Result)}
    bases = Result.__orig_bases__  # type: ignore[attr-defined]  # Generic[OutputT]: the layout
    unfrozen: Any = dataclass(slots=True)(types.new_class(
        "_UnfrozenResult", bases, {}, lambda ns: ns.update(__annotations__=names,
                                                         __module__=__name__)))

    def make(*values: Any) -> Result[Any]:
        made = unfrozen(*values)
        made.__class__ = Result
        return cast("Result[Any]", made)

    probe: tuple[Any, ...] = tuple(range(len(names)))
    try:
        if make(*probe) == Result(*probe):
            return make
    except TypeError:  # pragma: no cover - another layout, or another Python
        pass
    return Result  # pragma: no cover


#: ``Result(*values)`` with every field, in Result's order, at a tenth of its cost.
make_result = _result_maker()


class ProcessFailed(Exception):
    """A run that was not ``ok``, raised by ``Result.check``."""

    def __init__(self, result: Result[bytes] | Result[str]) -> None:
        self.result = result
        super().__init__(describe(result, stderr_lines=5))

    def __reduce__(self) -> tuple[type[ProcessFailed], tuple[Result[bytes] | Result[str]]]:
        # Exception pickles its message as the argument; ours is made from the result.
        return type(self), (self.result,)


def describe(result: Result[bytes] | Result[str], stderr_lines: int = 0) -> str:
    """One line saying how a run ended, for messages and logs.

    The command is quoted with ``shlex.join`` (an argument byte that is not UTF-8 written
    as the escape of its surrogate, ``\\udce9``); with ``stderr_lines``, the last
    that many lines of its stderr (of its stdout when stderr is empty, as with
    ``merge_stderr``) follow on lines of their own, each cut to
    ``_LINE_MAX`` characters, with control characters escaped: the message
    stays readable whatever the command wrote.
    """
    cmd = shlex.join(result.args)
    if len(cmd) > 120:
        cmd = cmd[:117] + "..."
    if result.runner_error is not None:
        why = result.runner_error
    elif result.timed_out:
        why = "timed out"
    elif result.cancelled:
        why = "cancelled"
    elif result.output_truncated:
        why = f"output truncated (exit {result.exit_code})"
    elif result.escaped:
        why = f"escaped processes held its output (exit {result.exit_code})"
    elif result.term_signal:
        why = f"killed by signal {result.term_signal}"
    else:
        why = f"exit {result.exit_code}"
    line = f"{cmd}: {why}"
    if stderr_lines > 0:
        out = result.stderr or result.stdout
        # The last lines are in the last bytes: never split 16 MiB to show five of them.
        end = out[-stderr_lines * 4 * _LINE_MAX:]
        text = end.decode("utf-8", "replace") if isinstance(end, bytes) else end
        tail = text.rstrip("\n").splitlines()[-stderr_lines:]
        if tail:
            line += "\n" + "\n".join(f"  {_readable(t)}" for t in tail)
    # An argument that is not UTF-8 (b"caf\xe9") is in ``args`` with a lone surrogate,
    # which no UTF-8 stream or log file takes: written as its escape instead (\udce9).
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


#: The most characters of one output line ``describe`` shows.
_LINE_MAX = 200


def _readable(text: str) -> str:
    """One output line for a message: control characters escaped, cut to ``_LINE_MAX``."""
    shown = "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= _LINE_MAX else shown[:_LINE_MAX - 3] + "..."
