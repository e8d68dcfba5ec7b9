"""The result of a run, and the exception ``Result.check`` raises."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

Output = Union[bytes, str]  # noqa: UP007 - a runtime alias, kept for Python 3.10 docs


@dataclass(frozen=True, slots=True)
class Result:
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
        user_time: The leader's user CPU seconds (``wait4``).
        system_time: The leader's system CPU seconds (``wait4``).
        max_rss: The leader's peak resident set, in bytes, as ``wait4`` reports
            it.  On Linux it is at least the caller's resident size at spawn
            time: the child runs in the caller's address space until its exec
            (vfork/clone), and the kernel carries that high-water mark over.
    """

    args: tuple[str, ...]
    exit_code: int
    stdout: Output
    stderr: Output
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

    def check(self) -> Result:
        """Return this result when ``ok``.

        Raises:
            ProcessFailed: when it is not ``ok``; ``.result`` is this result.
        """
        if not self.ok:
            raise ProcessFailed(self)
        return self


class ProcessFailed(Exception):
    """A run that was not ``ok``, raised by ``Result.check``."""

    def __init__(self, result: Result) -> None:
        self.result = result
        super().__init__(describe(result))


def describe(result: Result) -> str:
    """One line saying how a run ended, for messages and logs."""
    cmd = " ".join(result.args)
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
    return f"{cmd!r}: {why}"
