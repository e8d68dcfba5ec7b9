"""``python -m boundedproc``: a process-group-safe ``timeout(1)``."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import math
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from boundedproc._options import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT
from boundedproc._result import AnyResult
from boundedproc._run import run
from boundedproc._version import __version__

# ASCII digits (\d would take any script's); a fraction only with a unit (no half byte).
_SIZE = re.compile(r"^\s*([0-9]+|[0-9]+\.[0-9]+(?=\s*[KMG]))\s*([KMG]?)(?:i?B)?\s*$",
                   re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text: str) -> int:
    """Bytes from ``"1048576"``, ``"512K"``, ``"16M"`` or ``"2G"`` (powers of 1024).

    Raises:
        argparse.ArgumentTypeError: when ``text`` is not a size.
    """
    match = _SIZE.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use bytes, or K, M, G)")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"seconds must be >= 0: {text!r}")
    return value


def _grace(text: str) -> float:
    value = _seconds(text)
    if math.isinf(value):  # a grace is waited out in full: it must end
        raise argparse.ArgumentTypeError(f"seconds must be finite: {text!r}")
    return value


USAGE_EXIT_CODE = 125  # as timeout(1) and env(1): 1, 2, ... stay the command's own


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors exiting 125 instead of 2."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(USAGE_EXIT_CODE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (usage errors exit 125)."""
    p = _Parser(
        # As run: the console script by its name, python -m by the module.
        prog="python -m boundedproc" if sys.argv[0].endswith("__main__.py") else None,
        description="Run CMD bounded in time and output; at the end its whole process "
        "group is killed, so nothing it started survives.  Exits with CMD's exit code "
        "(124 on the deadline, 137 when killed for the output cap or cancelled, "
        "127/126 when it could not be started; 125 for a usage error or output that "
        "could not be written, 141 when its reader left, as a SIGPIPE would end it).",
    )
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"seconds before the group is killed (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--max-output", type=parse_size, default=DEFAULT_MAX_OUTPUT, metavar="SIZE",
                   help="bytes of stdout+stderr kept, e.g. 1048576, 512K, 16M, 2G "
                   "(default 16M)")
    p.add_argument("--on-overflow", choices=("truncate", "kill"), default="truncate",
                   help="past the cap: discard the rest, or kill the group (default truncate)")
    p.add_argument("--shell", metavar="SH", default=None,
                   help="join the words after -- into one command for SH -c")
    p.add_argument("--kill-grace", type=_grace, default=0.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL (default 0: SIGKILL at once)")
    p.add_argument("--json", action="store_true",
                   help="print the Result as one JSON object instead of passing output through")
    p.add_argument("--version", action="version", version=f"boundedproc {__version__}")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    return p


def _text(value: str) -> str:
    """``value`` with the bytes surrogateescape kept in it shown as U+FFFD, as output is."""
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate no bytes gave: not ours to keep either
        raw = value.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace")


def result_json(result: AnyResult) -> str:
    """The result as one JSON object: every field, output decoded as UTF-8.

    Text that came from bytes that are not UTF-8 (an argument, a program name
    in ``runner_error``) has them replaced with U+FFFD too, so the object is
    always valid UTF-8.
    """
    data = {}
    for field in dataclasses.fields(result):
        value = getattr(result, field.name)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, str):
            value = _text(value)
        elif isinstance(value, tuple):
            value = [_text(v) if isinstance(v, str) else v for v in value]
        data[field.name] = value
    data["ok"] = result.ok
    return json.dumps(data, ensure_ascii=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    words = list(args.cmd)
    if words and words[0] == "--":
        words = words[1:]
    if not words:
        parser.error("no command given (put it after --)")
    cmd = " ".join(words) if args.shell else words
    live = None if args.json else _PassThrough(args.max_output)
    try:
        result = run(cmd, shell=args.shell or False, timeout=args.timeout,
                     max_output=args.max_output, on_overflow=args.on_overflow,
                     kill_grace=args.kill_grace, on_output=live)
    except KeyboardInterrupt:  # the run's group is killed and reaped by now
        # End by SIGINT, as coreutils timeout does after a Ctrl-C (and boundedproc-timeout):
        # a shell then stops its loop too; an exit 130 reads as "the command handled it".
        from boundedproc.timeout import _die_by

        _die_by(signal.SIGINT)
        return 130  # SIGINT could not end us
    except _WriteFailed as failed:  # the run was ended (as by Ctrl-C): its group is gone
        return _write_failed(failed)
    if args.json:
        try:
            _emit(1, (result_json(result) + "\n").encode("utf-8"))
        except _WriteFailed as failed:
            return _write_failed(failed)
    else:
        if live is not None and live.mid_line and (
                result.runner_error is not None or result.timed_out
                or result.output_truncated or result.escaped):
            _say("\n")  # the command's last line had no end: ours start their own
        if result.runner_error is not None:
            _say(f"boundedproc: {result.runner_error}\n")
        elif result.timed_out:
            _say(f"boundedproc: timed out after {args.timeout:g} s\n")
        if result.output_truncated:
            # Under --on-overflow kill the cap ended the run: say so beside its 137.
            killed = "; killed (--on-overflow kill)" if args.on_overflow == "kill" else ""
            _say(f"boundedproc: output truncated at {args.max_output} bytes "
                 f"({result.output_bytes} read){killed}\n")
        if result.escaped:
            _say("boundedproc: a process outside the group held the output open\n")
    return result.exit_code


class _WriteFailed(Exception):
    """Our own stdout (fd 1) or stderr (fd 2) refused a write of output."""

    def __init__(self, fd: int, err: OSError) -> None:
        super().__init__(fd, err)
        self.fd = fd
        self.err = err


def _emit(fd: int, data: bytes) -> None:
    """Write ``data`` to our stdout or stderr now (nowhere if that fd was closed).

    Raises:
        _WriteFailed: the write failed.
    """
    out = sys.stdout if fd == 1 else sys.stderr
    if out is None:  # that fd of ours was closed: nowhere to show it
        return
    try:
        out.buffer.write(data)
        out.buffer.flush()
    except OSError as err:
        raise _WriteFailed(fd, err) from None


def _say(text: str) -> None:
    """A note of ours on stderr; lost, never fatal, if stderr cannot take it."""
    try:
        _emit(2, text.encode("utf-8", "surrogateescape"))
    except _WriteFailed:
        _quiet(2)


def _write_failed(failed: _WriteFailed) -> int:
    """The status for output we could not write: 141 for a reader that left, else 125."""
    _quiet(failed.fd)
    if failed.err.errno == errno.EPIPE:  # as `cmd | head`: the end a SIGPIPE would give
        return 128 + signal.SIGPIPE
    _say(f"boundedproc: write error: {failed.err.strerror}\n")
    return USAGE_EXIT_CODE


class _PassThrough:
    """``on_output`` that writes the kept bytes to our own stdout and stderr as they come.

    The core keeps the first ``max_output`` bytes across both streams in
    arrival order (``keep="head"``), and so does this: what is shown live is
    exactly what the ``Result`` holds, and the cap holds for it too.

    ``mid_line``: the last byte shown on our stderr (or on stdout, where both are one
    file, a terminal) was not a newline, so a note of ours starts a line of its own.
    """

    def __init__(self, cap: int | None) -> None:
        self.left = cap
        self.mid_line = False
        self.streams = (1, 2) if _same_file(1, 2) else (2,)

    def __call__(self, stream: int, chunk: bytes) -> None:
        if self.left is not None:
            chunk = chunk[:self.left]
            self.left -= len(chunk)
        if chunk:
            _emit(stream, chunk)
            if stream in self.streams:
                self.mid_line = not chunk.endswith(b"\n")


def _same_file(a: int, b: int) -> bool:
    try:
        return os.path.samestat(os.fstat(a), os.fstat(b))
    except OSError:
        return False


def _quiet(fd: int) -> None:
    """Point our fd 1 or 2 at /dev/null, so that the interpreter's last flush cannot fail."""
    out = sys.stdout if fd == 1 else sys.stderr
    if out is None:
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, out.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
