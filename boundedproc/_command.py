"""The command of a run: its argument vector, its program's candidates, its environment.

Caller bugs (a string without a shell, a vector with one, wrong types) raise;
content that cannot reach a process (a NUL byte, a bad variable name) comes
back as a ``NotSpawned`` reason, which ``run()`` turns into a result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Union

from boundedproc._options import Unencodable, entry, text_entry

__all__ = ["Command", "NotSpawned", "argv_of", "environment", "exec_paths", "text_arg"]

StrOrBytesPath = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
Command = Union[str, Sequence[StrOrBytesPath]]  # noqa: UP007 - string forward refs inside


@dataclass(frozen=True, slots=True)
class NotSpawned:
    """Why a command cannot reach a process (the text after ``not spawned: ``)."""

    why: str


def text_arg(value: bytes) -> str:
    """An argv entry as ``str``, undecodable bytes kept with surrogateescape."""
    return value.decode("utf-8", "surrogateescape")


def argv_of(cmd: object, shell: object) -> list[bytes]:
    """The argument vector to execute for ``cmd`` and ``shell``.

    Raises:
        TypeError: ``cmd`` or ``shell`` of the wrong type.
        ValueError: a string without a shell, a vector with one, an empty vector.
        UnencodableArgv: an entry no bytes encode (content: a result, not an error).
    """
    shell_prog: StrOrBytesPath | None
    if isinstance(shell, bool):
        shell_prog = "/bin/sh" if shell else None
    elif isinstance(shell, (str, bytes, os.PathLike)):
        shell_prog = shell or None  # "" names no shell
    else:
        raise TypeError("shell must be a bool or a program name or path, "
                        f"not {type(shell).__name__}")
    if isinstance(cmd, str):
        if shell_prog is None:
            raise ValueError("a string command needs shell=True or shell='bash'; "
                             "pass an argument vector to run without a shell")
        try:
            return [entry(shell_prog, "the shell"), b"-c",
                    text_entry(cmd, "the command string")]
        except Unencodable as err:
            raise UnencodableArgv(err, [shell_prog, "-c", cmd]) from None
    if isinstance(cmd, (bytes, bytearray, memoryview)):
        raise TypeError("cmd must be a str (with a shell) or a sequence of arguments, not bytes")
    if isinstance(cmd, (AbstractSet, Mapping)):
        # Iterable, but in no order the caller chose: the program would be whichever entry
        # the hash order puts first.
        raise TypeError("cmd must be a str (with a shell) or a sequence of arguments, "
                        f"not the unordered {type(cmd).__name__}")
    if isinstance(cmd, (list, tuple, Sequence)) or hasattr(cmd, "__iter__"):
        if shell_prog is not None:
            raise ValueError("an argument vector runs without a shell: "
                             "pass a string to run it with shell=")
        # str and bytes first, without naming the entry: the name is for an error only
        try:
            args = [a.encode("utf-8", "surrogateescape") if type(a) is str
                    else a if type(a) is bytes else entry(a, f"cmd[{i}]")
                    for i, a in enumerate(cmd)]
        except UnicodeEncodeError:
            entries = list(cmd)
            for i, a in enumerate(entries):
                try:
                    entry(a, f"cmd[{i}]")
                except Unencodable as err:
                    raise UnencodableArgv(err, entries) from None
            raise  # pragma: no cover - the loop finds what the comprehension hit
        if not args:
            raise ValueError("cmd is an empty argument vector")
        return args
    raise TypeError(f"cmd must be a str or a sequence, not {type(cmd).__name__}")


class UnencodableArgv(Unencodable):
    """An argument vector with an entry no bytes encode; ``argv`` is the vector as bytes
    (that entry encoded with surrogatepass), for the result's ``args``."""

    def __init__(self, err: Unencodable, entries: Sequence[object]) -> None:
        ValueError.__init__(self, err.why)
        self.why = err.why
        self.lossy = err.lossy
        self.argv = [a.encode("utf-8", "surrogatepass") if isinstance(a, str)
                     else entry(a, "cmd") for a in entries]


def check_content(args: Sequence[bytes], cwd: bytes | None) -> NotSpawned | None:
    """A reason when an argument or the cwd cannot reach a process (a NUL byte)."""
    for i, a in enumerate(args):
        if b"\0" in a:
            return NotSpawned(f"argument {i} contains a NUL byte")
    if cwd is not None and b"\0" in cwd:
        return NotSpawned("cwd contains a NUL byte")
    return None


def env_items(env: Mapping[str, str | None] | None) -> list[tuple[bytes, bytes | None]]:
    """``env``'s entries as bytes (``None``: remove).

    Raises:
        TypeError: a key or value of the wrong type.
    """
    items: list[tuple[bytes, bytes | None]] = []
    for k, v in (env or {}).items():
        kb = entry(k, "env key")
        items.append((kb, None if v is None else entry(v, f"env[{k!r}]")))
    return items


def environ_snapshot() -> dict[bytes, bytes]:
    """``os.environb`` as it is at one instant, while other threads may edit it.

    ``dict(os.environb)`` walks the keys and looks each up through Python code,
    so a key deleted meanwhile raises ``KeyError``; the mapping's own dict is
    copied in one C call instead (under the GIL, nothing runs in between).
    """
    data = getattr(os.environb, "_data", None)
    if type(data) is dict:
        return data.copy()
    while True:  # another Python's os module: retry the walk until it is not disturbed
        try:
            return dict(os.environb)
        except (KeyError, RuntimeError):
            continue


def environment(items: Sequence[tuple[bytes, bytes | None]],
                mode: str) -> tuple[list[bytes], bytes | None] | NotSpawned:
    """The child's whole environment (``KEY=VALUE`` entries) and its ``PATH``.

    It is always a snapshot the core owns: the caller's live ``environ`` is
    never handed to the child, since another thread may be editing it (Python
    reallocates the array under ``os.environ[...] = ...``).  The copy of
    ``os.environb`` is taken whole in one step (see ``environ_snapshot``).
    """
    global _last_environment
    merged: dict[bytes, bytes] = environ_snapshot() if mode == "merge" else {}
    plain = mode == "merge" and not items
    if plain:
        last = _last_environment
        if last is not None and last[0] == merged:
            return last[1], last[2]  # the same list object: the core reuses its C copy
    for kb, vb in items:
        if not kb or b"=" in kb or b"\0" in kb:
            return NotSpawned(f"environment variable name {text_arg(kb)!r} is empty or "
                              "contains '=' or a NUL byte")
        if vb is None:
            merged.pop(kb, None)
        elif b"\0" in vb:
            return NotSpawned(f"environment variable {text_arg(kb)!r} contains a NUL byte")
        else:
            merged[kb] = vb
    entries = [k + b"=" + v for k, v in merged.items()]
    if plain:
        _last_environment = (merged, entries, merged.get(b"PATH"))
    return entries, merged.get(b"PATH")


# The last caller's environment (env=None, merge) and its entries: while os.environ does
# not change, every run gets the same, never mutated, entries list.
_last_environment: tuple[dict[bytes, bytes], list[bytes], bytes | None] | None = None


def exec_paths(program: bytes, path: bytes | None) -> list[bytes]:
    """Candidates for execve, as execvp would try them (POSIX PATH rules)."""
    if b"/" in program:
        return [program]
    if not program:
        return []
    search = path if path is not None else os.defpath.encode()
    # An empty PATH entry means the current directory, as POSIX says.
    return [(d or b".") + b"/" + program for d in search.split(b":")]
