"""``Cancel``: a switch that ends the runs watching it."""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
from typing import TypeVar

__all__ = ["ALSO_CANCEL", "Cancel"]


_C = TypeVar("_C", bound="Cancel")


def above_stdio(fd: int) -> int:
    """``fd``, or, when it took one of the numbers 0-2 (a caller started with them
    closed), a close-on-exec copy of it above them, the original closed.  A caller's
    ``INHERIT`` passes its fds 0-2 on as they are, and one of the library's own long-lived
    fds (a wakeup pipe, a switch) must never be what a command gets there.

    Raises OSError (EMFILE): no fd above 2 is free; ``fd`` is closed then too.
    """
    if fd > 2:
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def pipe_above_stdio() -> tuple[int, int]:
    """``os.pipe()`` whose ends are both above fd 2 (see ``above_stdio``).

    Raises OSError: as ``os.pipe()`` (EMFILE); nothing is left open then.
    """
    r, w = os.pipe()
    try:
        r = above_stdio(r)
    except OSError:
        os.close(w)
        raise
    try:
        return r, above_stdio(w)
    except OSError:
        with contextlib.suppress(OSError):
            os.close(r)
        raise


class Cancel:
    """A cancel switch that one or many runs watch.

    ``cancel()`` is thread-safe, idempotent and safe to call from a signal
    handler: it sets a flag and writes one byte to a pipe whose read end every
    run watching this switch has in its poll set.  The byte is never consumed,
    so the switch stays set.
    """

    __slots__ = ("__weakref__", "_r", "_set", "_w")

    def __init__(self) -> None:
        self._r, self._w = pipe_above_stdio()
        os.set_blocking(self._w, False)
        self._set = False

    @classmethod
    def _already_set(cls: type[_C]) -> _C:  # noqa: PYI019 - typing.Self needs 3.11
        """A switch that is set and has no fds (``fileno()`` is -1): a run that sees it
        spawns nothing, and it can be had when the process has no fd left."""
        switch = cls.__new__(cls)
        switch._r = switch._w = -1
        switch._set = True
        return switch

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


def switch_or_none() -> Cancel | None:
    """A new switch, or None when the process has no two fds left for it (EMFILE): for a
    caller that can go on without one, its runs then failing or not as run() would."""
    try:
        return Cancel()
    except OSError:
        return None


# A second switch a run also watches, set only by boundedproc's own wrappers
# (run_async's task cancellation) so that a caller's shared Cancel is never set
# on their behalf.
ALSO_CANCEL: contextvars.ContextVar[Cancel | None] = contextvars.ContextVar(
    "boundedproc_also_cancel", default=None)
