"""A user's script of boundedproc's typed API: ``mypy --strict`` must find nothing in it.

Checked by tests/test_typing.py. Nothing here is run by pytest (the file name does not start
with ``test_``): it only has to type-check as a user would write it, with no cast and no ignore.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

from boundedproc import (
    CAPTURE,
    DEVNULL,
    Cancel,
    Job,
    Limits,
    ProcessFailed,
    Result,
    run,
    run_async,
    run_many,
)


def default_is_bytes() -> bytes:
    """Without ``text``, stdout and stderr are bytes: ``.decode()`` needs no narrowing."""
    r = run(["echo", "hi"], timeout=5)
    first_line: str = r.stdout.decode().splitlines()[0]
    err: bytes = r.stderr
    print(first_line, len(err), r.exit_code, r.ok, r.duration)
    return r.stdout


def text_is_str() -> str:
    """With ``text=True``, stdout and stderr are str."""
    r: Result[str] = run("echo hi; echo oops >&2", shell=True, text=True, timeout=5)
    words: list[str] = r.stdout.split()
    return r.stderr.strip() + " ".join(words)


def shell_by_path() -> str:
    """``shell=`` takes a path object as well as a name."""
    return run("echo $0", shell=Path("/bin/sh"), text=True).stdout


def text_false_is_bytes() -> bytes:
    """``text=False`` spelt out is the default: bytes."""
    return run(["true"], text=False).stdout


def options_as_a_user_writes_them(cancel: Cancel) -> None:
    """Every kind of option, live output and ``check=True``."""
    seen: list[tuple[int, bytes]] = []

    def on_output(stream: int, chunk: bytes) -> None:
        seen.append((stream, chunk))

    try:
        r = run(
            [sys.executable, "-c", "print('x')"],
            timeout=2.5,
            max_output=1 << 20,
            on_overflow="truncate",
            stdin=b"payload",
            cwd="/",
            env={"LC_ALL": "C", "DROP_ME": None},
            env_mode="merge",
            cancel=cancel,
            kill_grace=0.5,
            limits=Limits(cpu_seconds=5),
            on_output=on_output,
            keep="head+tail",
            stdout=CAPTURE,
            stderr=DEVNULL,
            check=True,
        )
    except ProcessFailed as failed:
        print(failed.result.exit_code, failed.result.runner_error)
        return
    gap: int | None = r.stdout_gap
    print(r.stdout_omitted, gap, r.check().stdout.hex(), len(seen))


def many_bytes() -> list[bytes]:
    """``run_many`` yields ``Result[bytes]`` by default; a ``Job`` overrides options."""
    cmds: list[list[str] | str | Job] = [["echo", "a"], Job(["cat"], stdin=b"b"), "echo c"]
    results: Iterator[Result[bytes]] = run_many(cmds, jobs=2, shell=True, timeout=10)
    return [r.stdout for r in results]


def many_text() -> list[str]:
    """``run_many(text=True)`` yields ``Result[str]``."""
    return [r.stdout.upper() for r in run_many([["echo", "a"]], text=True)]


async def in_asyncio() -> tuple[bytes, str]:
    """``run_async`` is typed like ``run``."""
    raw = await run_async(["echo", "a"], timeout=5)
    decoded = await run_async(["echo", "b"], text=True, max_output=4096)
    return raw.stdout, decoded.stdout


if __name__ == "__main__":
    print(default_is_bytes(), text_is_str(), text_false_is_bytes())
    with Cancel() as switch:
        options_as_a_user_writes_them(switch)
    print(many_bytes(), many_text(), asyncio.run(in_asyncio()))
