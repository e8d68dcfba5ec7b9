"""``python -m grader CLAIMS.jsonl``: verify and grade a JSON-lines file of claims.

Decisions taken where SPEC section 4 is silent:

- Lines end at ``\\n`` only, as JSON Lines has it (a ``\\r`` before it is dropped): a raw
  ``\\r`` inside a line is JSON whitespace, not a line break, so it neither splits a claim nor
  shifts the line numbers of those after it. Blank lines are skipped. Keys other than ``id``,
  ``title``, ``rung``, ``check`` and ``expect`` are ignored, so a claims file may carry its own
  bookkeeping. A line that is not a JSON object (or is JSON this parser cannot hold: nested
  too deeply, an integer of thousands of digits), lacks an ``id`` (a non-empty string, or an
  integer, echoed as given: ``7`` and ``"7"`` are two ids) or an integer ``rung``
  from 1 to 5, has a non-string ``title``/``check``/``expect``, repeats an earlier ``id``, or is
  not UTF-8 is malformed: it is reported as ``line N: ...`` on stderr, not graded, and makes the
  exit status 2.
- Checks run in an empty environment (bash then uses its built-in ``PATH``), the same for every
  machine that grades the file, with ``--cwd`` (default: the claims file's directory) as their
  working directory. ``--env-file FILE`` and ``--pass-env NAME`` put variables into that
  environment, nothing else does: the files are read in order (a later one wins), then each
  ``--pass-env NAME`` copies this process's ``NAME`` over them. A ``--pass-env`` of a variable
  that is not set here passes nothing and says so on stderr. With ``--executor dask://`` the
  values are read here and sent with each claim, so a worker's own environment never leaks in.
- ``--env-file`` has the format of ``docker run --env-file``: one ``NAME=VALUE`` a line, the
  value being everything after the first ``=``, verbatim (no quotes are removed, no escapes or
  ``$`` expanded, trailing spaces kept; only the line end, ``\n`` or ``\r\n``, is dropped).
  Blank lines and lines whose first non-blank character is ``#`` are skipped (a ``#`` elsewhere
  belongs to the value). A line holding a bare ``NAME`` passes this process's value, as
  ``--pass-env`` does (nothing when unset). ``NAME`` must be a shell variable name
  (``[A-Za-z_][A-Za-z0-9_]*``; blanks before it are allowed); any other line (``export X=1``,
  ``X = 1``), or a file that is not UTF-8 or cannot be read, exits 2 with ``FILE:N: ...`` before
  anything is graded. A later line for the same name wins.
- ``--user USER`` (a name, or digits for a uid) runs every parse and check as that user, with
  its groups (``boundedproc.run(user=)``; the grader must be root to use another user). A
  name must exist where the checks run (a uid need not: it then runs with the gid of the same
  number); one that does not grades every claim ``unrunnable`` (``runner-failure``), as any
  runner failure does.
- ``--tmpdir`` runs every parse and check in a fresh private directory (its working directory
  and ``TMPDIR``, owned by ``--user``), removed after it, whatever the check left there
  (``boundedproc.run(tmpdir=True)``). The checks then have no ``--cwd``, so giving both is a
  usage error (exit 2).
- ``duration`` is the wall time of the whole verification of one claim (parse and run), in
  seconds; ``exit_code`` is that of the graded execution, ``null`` when nothing ran.
- A claim refused with ``UncheckableClaimError`` (on its face, or by ``bash -n``) is reported as
  ``uncheckable`` with that reason and note.
- Output lines are written in input order, each as soon as it and every claim before it are
  graded. ``--verbose`` also streams each check's own output (stdout and stderr, in the order
  it was read) to stderr as it comes, one line at a time, each line prefixed with ``[ID] ``;
  lines of checks running at once interleave, never mix within a line. Only the check's run
  streams, not its ``bash -n`` parse; a line is shown once its newline comes (or 64 KiB of it,
  or the run ends), decoded as UTF-8 with replacement; every byte read is shown, also past
  ``max_output``. With ``--executor dask://`` the output would be the workers', so the two
  flags together are a usage error (exit 2).
- Ctrl-C cancels the running checks (their groups are killed) and exits 130.
- ``--executor dask://HOST:PORT`` grades on a Dask cluster (see ``grader._executor``); ``--jobs``
  then does not apply, the cluster's worker threads decide how many checks run at once. A
  missing ``distributed`` or a scheduler that does not answer within ``--connect-timeout``
  exits 2 before anything is graded, and so does a task the cluster fails (a worker without
  this package, say): that says nothing about a claim, so no claim is graded from it. Ctrl-C is
  best effort there: tasks not yet started are cancelled and the grader exits 130 at once, but
  a check already running on a worker goes on until it ends or its ``--timeout`` kills its
  group. ``--cwd`` names a directory on the workers and is not checked here; a worker that
  lacks it grades its claims ``unrunnable`` (``runner-failure``).
"""

from __future__ import annotations

import argparse
import codecs
import errno
import importlib
import json
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ._executor import _INSTALL_DISTRIBUTED, ExecutorUnavailable, dask_executor, parse_executor
from ._grade import (
    DuplicateMarker,
    Evidence,
    Grade,
    UncheckableClaimError,
    Verdict,
    claim_key,
)
from ._verify import verify_gradeable_evidence

if TYPE_CHECKING:
    from boundedproc import Cancel

__all__ = [
    "ClaimLine",
    "ClaimOutcome",
    "EnvFileError",
    "GradedFile",
    "grade_file",
    "main",
    "outcome_json",
    "parse_claims",
    "read_env_file",
    "verify_claim",
    "verify_claims",
]

EXIT_OK = 0
EXIT_CONTRADICTED = 1
EXIT_BAD_INPUT = 2
#: The grader itself failed (a bug: its traceback is printed); no verdict is implied.  Not
#: Python's default 1, which reads as "some claim contradicted".
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class ClaimLine:
    """One well-formed claim of a claims file.

    Attributes:
        line: Its 1-based line number in the file.
        id: The claim's id (unique in the file).
        title: The claim's sentence, if given.
        evidence: Its rung, check and expectation.
    """

    line: int
    id: str | int
    title: str | None
    evidence: Evidence


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """The result of verifying one claim.

    Attributes:
        id: The claim's id.
        grade: Its grade (``duplicate_of`` set by ``verify_claims``).
        exit_code: The exit status of the graded execution; ``None`` when nothing ran.
        duration: Seconds spent verifying the claim (parse and run).
    """

    id: str | int
    grade: Grade
    exit_code: int | None
    duration: float


@dataclass(frozen=True, slots=True)
class GradedFile:
    """Everything ``grade_file`` found in a claims file.

    Attributes:
        outcomes: One outcome per well-formed claim, in file order.
        errors: One ``"line N: ..."`` message per malformed line.
    """

    outcomes: list[ClaimOutcome]
    errors: list[str]


def _parse_line(number: int, raw: bytes, seen: dict[str | int, int]) -> ClaimLine | str | None:
    """A claim, an error message without its ``line N:`` prefix, or ``None`` for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 ({exc.reason} at byte {exc.start})"
    if not text.strip():
        return None
    try:
        item: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at column {exc.colno})"
    except RecursionError:
        return "not readable JSON (nested too deeply for this parser)"
    except ValueError as exc:  # valid JSON Python refuses to hold, e.g. a 5,000-digit integer
        return f"not readable JSON ({exc})"
    if not isinstance(item, dict):
        return f"expected a JSON object, got {type(item).__name__}"
    claim_id = item.get("id")
    if isinstance(claim_id, bool) or not isinstance(claim_id, (str, int)) or claim_id == "":
        return "'id' must be a non-empty string or an integer"
    if claim_id in seen:
        return f"id {claim_id!r} is already used on line {seen[claim_id]}"
    rung = item.get("rung")
    if isinstance(rung, bool) or not isinstance(rung, int) or not 1 <= rung <= 5:
        return "'rung' must be an integer from 1 to 5"
    for name in ("title", "check", "expect"):
        value = item.get(name)
        if value is not None and not isinstance(value, str):
            return f"{name!r} must be a string or null"
    seen[claim_id] = number
    return ClaimLine(
        line=number,
        id=claim_id,
        title=item.get("title"),
        evidence=Evidence(rung=rung, check=item.get("check"), expect=item.get("expect")),
    )


def _lines(data: bytes) -> list[bytes]:
    """A claims file's lines: split at ``\\n`` only (a raw ``\\r`` is JSON whitespace)."""
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()  # the end of the last line, not a line of its own
    return lines


def parse_claims(lines: Iterable[bytes]) -> tuple[list[ClaimLine], list[str]]:
    """Parse the lines of a claims file.

    Args:
        lines: The file's lines as bytes, in order (line endings may be present).

    Returns:
        The well-formed claims in file order, and one ``"line N: ..."`` message per malformed
        line (see the module docstring for what is malformed).
    """
    claims: list[ClaimLine] = []
    errors: list[str] = []
    seen: dict[str | int, int] = {}
    for number, raw in enumerate(lines, start=1):
        parsed = _parse_line(number, raw.rstrip(b"\r\n"), seen)
        if isinstance(parsed, ClaimLine):
            claims.append(parsed)
        elif parsed is not None:
            errors.append(f"line {number}: {parsed}")
    return claims, errors


def verify_claim(
    claim: ClaimLine,
    *,
    cwd: str | None,
    timeout: float | None,
    bash: str = "bash",
    cancel: Cancel | None = None,
    env: Mapping[str, str] | None = None,
    user: int | str | None = None,
    tmpdir: bool = False,
    verbose: bool = False,
) -> ClaimOutcome:
    """Verify one claim with ``verify_gradeable_evidence`` and time it.

    Module-level and built from picklable values, so any ``concurrent.futures.Executor`` can run
    it. A refusal (``UncheckableClaimError``) becomes an ``uncheckable`` grade with its reason.

    Args:
        claim: The claim.
        cwd: Working directory of the check; ``None``: this process's (and with ``tmpdir``).
        timeout: Seconds for the parse and, separately, for the run.
        bash: The bash program.
        cancel: A ``boundedproc.Cancel`` shared by the whole pass (only for in-process executors).
        env: The check's whole environment; ``None`` for an empty one.
        user: Run the check as this user (``boundedproc.run``'s ``user=``).
        tmpdir: Run the check in a fresh private directory instead of ``cwd``.
        verbose: Stream the check's output, as it is read, to this process's ``sys.stderr``,
            each line prefixed with ``[ID] `` (see the module docstring).

    Returns:
        The claim's outcome (without ``duplicate_of``).
    """
    started = time.monotonic()
    options: dict[str, Any] = {}
    echo = _PrefixedEcho(claim.id) if verbose else None
    if echo is not None:
        options["on_output"] = echo
    try:
        verified = verify_gradeable_evidence(
            claim.evidence, cwd=cwd, bash=bash, timeout=timeout, cancel=cancel, env=env,
            user=user, tmpdir=tmpdir, **options,
        )
    except UncheckableClaimError as refused:
        grade = Grade(Verdict.UNCHECKABLE, refused.reason, refused.note)
        return ClaimOutcome(claim.id, grade, None, time.monotonic() - started)
    finally:
        if echo is not None:
            echo.close()
    execution = verified.execution
    return ClaimOutcome(
        claim.id,
        verified.grade,
        execution.exit_code if execution is not None else None,
        time.monotonic() - started,
    )


def verify_claims(
    claims: Sequence[ClaimLine],
    *,
    cwd: str | None,
    timeout: float | None = DEFAULT_TIMEOUT,
    jobs: int = 1,
    executor: Executor | None = None,
    bash: str = "bash",
    cancel: Cancel | None = None,
    on_done: Callable[[ClaimOutcome], None] | None = None,
    env: Mapping[str, str] | None = None,
    user: int | str | None = None,
    tmpdir: bool = False,
    verbose: bool = False,
) -> Generator[ClaimOutcome, None, None]:
    """Verify claims concurrently and yield their outcomes in input order, duplicates flagged.

    Each claim is submitted as ``verify_claim(claim, ...)``: a module-level function and plain
    dataclasses, so any ``concurrent.futures.Executor`` can run it, a process pool or a Dask
    cluster's ``Client.get_executor()`` included. Duplicates (SPEC 3.4) are flagged here, in
    input order, once the grades are back, so every executor gives the same outcomes.

    If the pass stops early (an exception, Ctrl-C, or the consumer closing the generator), it
    fires ``cancel`` and cancels every future not yet finished before returning: checks in this
    process have their groups killed; with another executor this is best effort, as a check
    already running there goes on until it ends or its ``timeout`` kills it.

    Args:
        claims: The claims.
        cwd: Working directory of every check (on the machine that runs it).
        timeout: Seconds for each parse and each run.
        jobs: Checks run at once when no ``executor`` is given (a thread pool; the runner
            releases the GIL while it waits).
        executor: Where to run ``verify_claim``; it is not shut down here.
        bash: The bash program.
        cancel: A ``boundedproc.Cancel`` for the checks. It is passed to them only when they run
            in this process (no ``executor``, or a ``ThreadPoolExecutor``): a ``Cancel`` is a
            pipe of this process, meaningless elsewhere. Other executors' checks run without it.
        on_done: Called in the calling thread as each claim finishes, in completion order
            (for a progress bar).
        env: The whole environment of every check; ``None`` for an empty one.
        user: Run every check as this user (it must exist where the checks run).
        tmpdir: Run every check in a fresh private directory; ``cwd`` must then be ``None``.
        verbose: Stream each check's output, line by line and prefixed with ``[ID] ``, to the
            ``sys.stderr`` of the process that runs it (see ``verify_claim``): this one's for
            the default pool or a thread pool, a worker's for a remote executor.

    Yields:
        One outcome per claim, in input order, as soon as it and all before it are done.

    Raises:
        ValueError: ``jobs`` is less than 1.
        Exception: Whatever the executor raises for a claim's task (a bug, or a remote worker
            that could not run it); the pass stops as described above.
    """
    from boundedproc._pool import IdlePool, NoThread

    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    own = executor is None
    # Our own pool: where no thread can be started (no process slot left), a check waits
    # for a busy thread, or with none runs here, in the calling thread, and its own spawn
    # reports the shortage in its result (an unrunnable check), where a ThreadPoolExecutor
    # raised out of the whole pass.
    pool: Executor = IdlePool(jobs, 2.0, "grader") if executor is None else executor
    in_process = own or isinstance(pool, (ThreadPoolExecutor, IdlePool))
    check_cancel = cancel if in_process else None
    futures: list[Future[ClaimOutcome]] = []
    try:
        for claim in claims:
            options: dict[str, Any] = dict(
                cwd=cwd, timeout=timeout, bash=bash, cancel=check_cancel, env=env, user=user,
                tmpdir=tmpdir, **({"verbose": True} if verbose else {}))
            try:
                future = pool.submit(verify_claim, claim, **options)
            except NoThread:
                future = Future()
                future.set_result(verify_claim(claim, **options))
            futures.append(future)
        index_of = {future: index for index, future in enumerate(futures)}
        finished: dict[int, ClaimOutcome] = {}
        marker = DuplicateMarker()
        next_index = 0
        for future in as_completed(futures):
            outcome = future.result()
            finished[index_of[future]] = outcome
            if on_done is not None:
                on_done(outcome)
            while next_index in finished:
                ready = finished.pop(next_index)
                key = claim_key(claims[next_index].evidence, claims[next_index].title)
                grade = marker.mark(ready.id, key, ready.grade)
                yield ClaimOutcome(ready.id, grade, ready.exit_code, ready.duration)
                next_index += 1
    except BaseException:
        # Interrupted, failed, or abandoned by the consumer (GeneratorExit): stop the checks
        # still running before waiting for the pool, so shutting down takes no check's budget,
        # and withdraw the ones not started, which is all a foreign executor lets us do.
        if cancel is not None:
            cancel.cancel()
        for pending in futures:
            pending.cancel()
        raise
    finally:
        if own:
            pool.shutdown(wait=True, cancel_futures=True)


def grade_file(
    path: str | os.PathLike[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    jobs: int = 1,
    executor: Executor | None = None,
    bash: str = "bash",
    env: Mapping[str, str] | None = None,
    user: int | str | None = None,
    tmpdir: bool = False,
) -> GradedFile:
    """Parse a claims file and verify every well-formed claim in it.

    Args:
        path: The JSON-lines claims file.
        cwd: Working directory of the checks; ``None`` for the directory holding ``path``
            (without ``tmpdir``).
        timeout: Seconds for each parse and each run.
        jobs: Checks run at once when no ``executor`` is given.
        executor: Where to run the checks (see ``verify_claims``).
        bash: The bash program.
        env: The whole environment of every check; ``None`` for an empty one.
        user: Run every check as this user.
        tmpdir: Run every check in a fresh private directory instead of ``cwd``.

    Returns:
        The outcomes in file order and the malformed-line messages.

    Raises:
        OSError: ``path`` cannot be read.
        ValueError: both ``cwd`` and ``tmpdir`` are given.
    """
    if tmpdir and cwd is not None:
        raise ValueError("tmpdir=True gives every check a fresh directory: it cannot go with cwd=")
    claims, errors = parse_claims(_lines(Path(path).read_bytes()))
    workdir: str | None = None
    if not tmpdir:
        workdir = os.fspath(cwd) if cwd is not None else str(Path(path).resolve().parent)
    outcomes = list(
        verify_claims(claims, cwd=workdir, timeout=timeout, jobs=jobs, executor=executor,
                      bash=bash, env=env, user=user, tmpdir=tmpdir)
    )
    return GradedFile(outcomes, errors)


def outcome_json(outcome: ClaimOutcome) -> str:
    """One output line: ``{id, verdict, reason, note, duplicate_of, exit_code, duration}``.

    Text is written as it is (UTF-8), unless the line holds a lone surrogate, which no UTF-8
    encodes (a claims file may spell one in an ``id``, as ``\\udcff``): that line is written
    with ASCII escapes instead, the same JSON for any reader, so the output never fails.

    Args:
        outcome: The claim's outcome.

    Returns:
        The JSON object, without a trailing newline.
    """
    grade = outcome.grade
    fields = {
        "id": outcome.id,
        "verdict": grade.verdict.value,
        "reason": grade.reason.value if grade.reason is not None else None,
        "note": grade.note,
        "duplicate_of": grade.duplicate_of,
        "exit_code": outcome.exit_code,
        "duration": round(outcome.duration, 3),
    }
    line = json.dumps(fields, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(fields)
    return line


def _summary(outcomes: Sequence[ClaimOutcome], malformed: int, elapsed: float) -> str:
    """The table printed to stderr at the end: claims per verdict, total, malformed, time."""
    counts = {verdict.value: 0 for verdict in Verdict}
    for outcome in outcomes:
        counts[outcome.grade.verdict.value] += 1
    rows = [*counts.items(), ("total", len(outcomes))]
    if malformed:
        rows.append(("malformed lines", malformed))
    width = max(len(label) for label, _ in rows)
    lines = [f"{'verdict':<{width}}  {'claims':>6}"]
    lines += [f"{label:<{width}}  {count:>6}" for label, count in rows]
    lines.append(f"graded in {elapsed:.2f} s")
    return "\n".join(lines)


_ECHO_LOCK = threading.Lock()  # one line at a time on stderr, whichever check's it is


class _PrefixedEcho:
    """``on_output`` for ``--verbose``: a check's output to ``sys.stderr``, ``[ID] `` per line.

    Each stream is decoded incrementally (a character split across reads stays whole) and cut
    into lines; a line is written whole, under one lock shared by every check, so lines of
    checks running at once never mix. A partial line waits for its newline, up to
    ``_ECHO_MAX_LINE`` characters, and is written by ``close`` when the run ends. A stderr that
    cannot be written to stops the echo, never the check.
    """

    _ECHO_MAX_LINE = 64 * 1024

    def __init__(self, claim_id: str | int) -> None:
        self._prefix = f"[{claim_id}] "
        self._decoders = {
            stream: codecs.getincrementaldecoder("utf-8")(errors="replace") for stream in (1, 2)
        }
        self._pending = {1: "", 2: ""}
        self._broken = False

    def __call__(self, stream: int, chunk: bytes) -> None:
        text = self._pending[stream] + self._decoders[stream].decode(chunk)
        *lines, rest = text.split("\n")
        while len(rest) >= self._ECHO_MAX_LINE:
            lines.append(rest[: self._ECHO_MAX_LINE])
            rest = rest[self._ECHO_MAX_LINE :]
        self._pending[stream] = rest
        self._write(lines)

    def close(self) -> None:
        """Write what is left of each stream as a last line."""
        lines = []
        for stream in (1, 2):
            rest = self._pending[stream] + self._decoders[stream].decode(b"", final=True)
            self._pending[stream] = ""
            if rest:
                lines.append(rest)
        self._write(lines)

    def _write(self, lines: list[str]) -> None:
        if not lines or self._broken:
            return
        text = "".join(f"{self._prefix}{line}\n" for line in lines)
        with _ECHO_LOCK:
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except (OSError, ValueError):  # closed, or its reader left: keep grading
                self._broken = True


class _Progress:
    """Progress on ``stream`` when it is a terminal, and nothing otherwise.

    A tqdm bar when tqdm is installed (the ``cli`` extra); without it, a plain
    ``graded N/M claims`` counter redrawn in place, since the runtime needs nothing but cffi.
    A terminal that reports no size (a fresh pty, as CI gives) gets a bar sized for 80 x 24:
    with its own size detection tqdm draws nothing at all there. A stream that cannot be written
    stops the progress, never the grading.
    """

    _FALLBACK_SIZE = (80, 24)

    def __init__(self, total: int, stream: IO[str]) -> None:
        self._bar: Any = None
        self._plain: IO[str] | None = None
        self._total = total
        self._done = 0
        if not total or not stream.isatty():
            return
        try:
            tqdm = importlib.import_module("tqdm").tqdm
        except ImportError:
            self._plain = stream
            self._draw()
            return
        columns, lines = _terminal_size(stream)
        sizing: dict[str, Any] = {"dynamic_ncols": True}
        if not (columns > 0 and lines > 0):
            # tqdm reads such a terminal as -1 x -1 and draws nothing, even when given ncols.
            sizing = {"ncols": columns or self._FALLBACK_SIZE[0],
                      "nrows": lines or self._FALLBACK_SIZE[1]}
        self._bar = tqdm(total=total, file=stream, unit="claim", **sizing)

    def update(self, outcome: ClaimOutcome) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.update(1)
        elif self._plain is not None:
            self._draw()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._plain is not None:
            self._write("\n")
            self._plain = None

    def hide(self) -> None:
        """Clear the progress line, for a line written to the same terminal; then show()."""
        if self._bar is not None:
            self._bar.clear()
        elif self._plain is not None:
            self._write("\r\x1b[K")  # to the line's start, and erase to its end

    def show(self) -> None:
        """Draw the progress again after hide()."""
        if self._bar is not None:
            self._bar.refresh()
        elif self._plain is not None:
            self._draw()

    def _draw(self) -> None:
        self._write(f"\rgraded {self._done}/{self._total} claims")

    def _write(self, text: str) -> None:
        if self._plain is None:
            return
        try:
            self._plain.write(text)
            self._plain.flush()
        except (OSError, ValueError):  # closed, or its reader left: keep grading
            self._plain = None


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, OSError, ValueError):  # closed, or not a file
        return False


def _terminal_size(stream: IO[str]) -> tuple[int, int]:
    """(columns, lines) that ``stream``'s terminal reports; 0 for what it does not report."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no fd (a test's stream), or not a tty
        return 0, 0
    return max(size.columns, 0), max(size.lines, 0)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class EnvFileError(ValueError):
    """An ``--env-file`` that cannot be used; the message is ``FILE:N: what`` or ``FILE: what``."""


def read_env_file(
    path: str | os.PathLike[str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Read an ``--env-file`` (the ``docker run --env-file`` format; see the module docstring).

    Args:
        path: The file.
        environ: Where a bare ``NAME`` line takes its value; ``None`` for ``os.environ``.

    Returns:
        The variables, in file order, a later line for a name winning.

    Raises:
        EnvFileError: The file cannot be read, is not UTF-8, or has a line that is not
            ``NAME=VALUE``, ``NAME``, blank or a comment.
    """
    source = os.environ if environ is None else environ
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise EnvFileError(f"{os.fspath(path)}: cannot read: {exc.strerror or exc}") from None
    found: dict[str, str] = {}
    for number, line_bytes in enumerate(raw.split(b"\n"), start=1):
        try:
            line = line_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EnvFileError(
                f"{os.fspath(path)}:{number}: not valid UTF-8 ({exc.reason} at byte {exc.start})"
            ) from None
        line = line.removesuffix("\r")
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        name, eq, value = stripped.partition("=")
        if not _ENV_NAME.match(name):
            raise EnvFileError(
                f"{os.fspath(path)}:{number}: expected NAME=VALUE with NAME a variable name "
                f"([A-Za-z_][A-Za-z0-9_]*), got {line!r}"
            )
        if eq:
            found[name] = value
        elif name in source:
            found[name] = source[name]
    return found


def _check_environment(args: argparse.Namespace) -> dict[str, str] | None:
    """The checks' environment from ``--env-file`` and ``--pass-env``; ``None`` for an empty one.

    Raises:
        EnvFileError: an ``--env-file`` cannot be used.
    """
    if not args.env_file and not args.pass_env:
        return None
    env: dict[str, str] = {}
    for path in args.env_file:
        env.update(read_env_file(path))
    for name in args.pass_env:
        if name in os.environ:
            env[name] = os.environ[name]
        else:
            print(f"grader: --pass-env {name}: not set here, not passed", file=sys.stderr)
    return env


def _env_name(text: str) -> str:
    if not _ENV_NAME.match(text):
        raise argparse.ArgumentTypeError(f"not a variable name: {text!r}")
    return text


def _user(text: str) -> int | str:
    from boundedproc._options import check_ident

    user = int(text) if text.isdigit() else text
    try:
        check_ident("--user", user)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--user must be ")) from exc
    return user


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _executor_address(text: str) -> str | None:
    try:
        return parse_executor(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _VersionAction(argparse.Action):
    """``--version``: prints the boundedproc version, importing boundedproc only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from boundedproc import __version__

        print(f"boundedproc {__version__}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        # As run: the console script by its name, python -m by the module.
        prog="python -m grader" if sys.argv[0].endswith("__main__.py") else None,
        description=(
            "Grade a JSON-lines file of claims. Each claim's shell check is parsed with "
            "`bash -n`, run bounded with `bash -c` (its whole process group is killed when it "
            "ends), and graded: verified, silent-check, contradicted, unrunnable or uncheckable."
        ),
        epilog=(
            'Each input line is a JSON object: {"id": str or int, "title": str, "rung": 1-5, '
            '"check": str, "expect": str}; title, check and expect may be omitted, other keys '
            "are ignored. Checks run in an empty environment but for --env-file and "
            "--pass-env. Output: one JSON line per claim "
            "with id, verdict, reason, note, duplicate_of, exit_code and duration, in input "
            "order. A summary goes to stderr. Exit status: 0 all graded and none contradicted, "
            "1 some claim contradicted, 2 bad input (a malformed line is reported as "
            "'line N: ...' and the other claims are still graded) or an executor that cannot "
            "be used, 130 interrupted. On a Dask cluster every worker needs this package "
            "installed and the working directory at the same path."
        ),
    )
    parser.add_argument("claims", metavar="CLAIMS.jsonl",
                        help="the claims file to grade; - reads the claims from stdin")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    parser.add_argument(
        "--cwd",
        metavar="DIR",
        help="working directory of the checks (default: the directory containing CLAIMS.jsonl; "
        "with -, the current directory)",
    )
    parser.add_argument(
        "--timeout",
        metavar="S",
        type=_positive_float,
        default=DEFAULT_TIMEOUT,
        help=(
            "seconds each check may run; its bash -n parse gets its own budget of the same "
            f"length (default: {DEFAULT_TIMEOUT:g})"
        ),
    )
    parser.add_argument(
        "--jobs",
        metavar="N",
        type=_positive_int,
        default=os.cpu_count() or 1,
        help="checks run at once with the local executor (default: the number of CPUs)",
    )
    parser.add_argument(
        "--executor",
        metavar="WHERE",
        type=_executor_address,
        default=None,
        help=(
            "where the checks run: 'local' (a thread pool of --jobs threads; the default) or "
            "'dask://HOST:PORT', the scheduler of a Dask cluster (needs the optional "
            f"'distributed' package: {_INSTALL_DISTRIBUTED})"
        ),
    )
    parser.add_argument(
        "--connect-timeout",
        metavar="S",
        type=_positive_float,
        default=DEFAULT_CONNECT_TIMEOUT,
        help=(
            "seconds to wait for the Dask scheduler before exiting 2 "
            f"(default: {DEFAULT_CONNECT_TIMEOUT:g})"
        ),
    )
    parser.add_argument(
        "--out", metavar="FILE", help="write the JSON lines to FILE instead of stdout"
    )
    parser.add_argument(
        "--pass-env",
        metavar="NAME",
        type=_env_name,
        action="append",
        default=[],
        help="give the checks this process's variable NAME (repeatable; e.g. --pass-env PATH)",
    )
    parser.add_argument(
        "--env-file",
        metavar="FILE",
        action="append",
        default=[],
        help=(
            "give the checks the variables of FILE: NAME=VALUE lines, taken verbatim, as "
            "docker run --env-file reads them (blank and #-comment lines skipped; a bare NAME "
            "passes this process's value). Repeatable; later files and --pass-env win"
        ),
    )
    parser.add_argument(
        "--user",
        metavar="USER",
        type=_user,
        default=None,
        help="run the checks as USER (a name or a uid) with its groups; needs root",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help=(
            "stream each check's output to stderr as it runs, each line prefixed with [ID] "
            "(not with --executor dask://)"
        ),
    )
    parser.add_argument(
        "--tmpdir",
        action="store_true",
        help=(
            "run each check in a fresh private directory (its cwd and TMPDIR), removed after "
            "it; excludes --cwd"
        ),
    )
    return parser


def _grade_pass(
    claims: Sequence[ClaimLine],
    malformed: int,
    *,
    args: argparse.Namespace,
    cwd: str | None,
    executor: Executor | None,
    env: Mapping[str, str] | None = None,
) -> int:
    """Grade the claims, write their lines and the summary; return the exit status."""
    out: IO[str]
    where = args.out if args.out is not None else "stdout"
    if args.out is not None:
        try:
            out = open(args.out, "w", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            print(f"grader: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
    elif sys.stdout is None:  # started with fd 1 closed
        print("grader: cannot write stdout: it is closed", file=sys.stderr)
        return EXIT_BAD_INPUT
    else:
        out = sys.stdout

    from boundedproc._cancel import switch_or_none

    cancel = switch_or_none()  # None without fds for it: the checks run without one
    started = time.monotonic()
    # A bar redrawn between the streamed lines would garble them.
    progress = _Progress(0 if args.verbose else len(claims), sys.stderr)
    outcomes: list[ClaimOutcome] = []
    results = verify_claims(
        claims,
        cwd=cwd,
        timeout=args.timeout,
        jobs=args.jobs,
        executor=executor,
        cancel=cancel,
        on_done=progress.update,
        env=env,
        user=args.user,
        tmpdir=args.tmpdir,
        verbose=args.verbose,
    )
    # The lines and the progress on one terminal (no --out): each line is written on a
    # cleared progress line, which is drawn again under it.
    shared_screen = out is sys.stdout and _isatty(out)
    try:
        for outcome in results:
            outcomes.append(outcome)
            line = outcome_json(outcome) + "\n"
            if shared_screen:
                progress.hide()
            try:
                out.write(line)
                out.flush()
            except OSError as exc:
                raise _OutputFailed(exc) from exc
            if shared_screen:
                progress.show()
    except _OutputFailed as failed:
        # Not a bug of the grader: the reader left (`| head`) or the disk is full.  The
        # checks still running end now, as on Ctrl-C, and no verdict is implied.
        if cancel is not None:
            cancel.cancel()
        results.close()
        progress.close()
        _stop_writing(out)
        why = failed.error.strerror or failed.error
        print(f"grader: cannot write {where}: {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # Locally every running check watches this Cancel: their groups are killed and reaped,
        # and closing the generator waits for the pool, so nothing outlives the interrupted
        # grader. On a cluster the unfinished tasks are cancelled (see the module docstring).
        if cancel is not None:
            cancel.cancel()
        results.close()
        progress.close()
        print("grader: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - reported: exit 3 (a bug here) or 2 (the executor)
        progress.close()
        if executor is None:  # a failure of this process's own grading is a bug
            traceback.print_exc()
            if cancel is not None:
                cancel.cancel()  # checks still running end now (as on Ctrl-C)
            results.close()
            print("grader: internal error, the pass stops (exit 3: no verdict)", file=sys.stderr)
            return EXIT_INTERNAL
        print(
            f"grader: the executor failed to grade a claim, so the pass stops "
            f"({type(exc).__name__}: {exc})",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    finally:
        if out is not sys.stdout:
            out.close()
    progress.close()
    print(_summary(outcomes, malformed, time.monotonic() - started), file=sys.stderr)
    if malformed:
        return EXIT_BAD_INPUT
    if any(outcome.grade.verdict is Verdict.CONTRADICTED for outcome in outcomes):
        return EXIT_CONTRADICTED
    return EXIT_OK


class _OutputFailed(Exception):
    """Writing a claim's line failed (``error``): the pass stops, exit 2."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def _stop_writing(out: IO[str]) -> None:
    """Drop what ``out`` still buffers: a stdout whose reader left would raise again at
    the interpreter's exit, with "Exception ignored" on stderr."""
    if out is sys.stdout:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, out.fileno())
        finally:
            os.close(devnull)
    else:
        try:
            out.close()
        except OSError:
            pass


def _stdin_bytes() -> bytes:
    """All of stdin, for the claims file ``-`` (OSError when there is no stdin to read)."""
    stream: IO[bytes] | None = getattr(sys.stdin, "buffer", None)  # None: fd 0 was closed
    if stream is None:
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))
    return stream.read()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; an exception it did not expect (a bug, or a core that cannot
    be loaded) prints its traceback and returns 3, never Python's default 1, which would
    read as "some claim contradicted".

    Args:
        argv: The arguments after the program name; ``None`` for ``sys.argv[1:]``.

    Returns:
        The exit status, as ``_main``'s.
    """
    if sys.stderr is None:
        # Started with fd 2 closed: Python has no sys.stderr, and print(file=None) would
        # put every message on stdout, among the verdicts. They have nowhere to go.
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the process's life
    try:
        return _main(argv)
    except KeyboardInterrupt:
        # Before any check started (a Ctrl-C while the runner is imported): nothing to
        # kill, and no traceback for what the user asked for.
        print("grader: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - reported: exit 3
        traceback.print_exc()
        print("grader: internal error (exit 3: no verdict)", file=sys.stderr)
        return EXIT_INTERNAL


def _main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: The arguments after the program name; ``None`` for ``sys.argv[1:]``.

    Returns:
        The exit status: 0, 1 (a claim was contradicted), 2 (bad input, or an executor that
        cannot be used), 3 (the grader failed: a bug, with its traceback) or 130
        (interrupted).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tmpdir and args.cwd is not None:
        parser.error("--tmpdir gives every check a fresh directory: it cannot go with --cwd")
    if args.verbose and args.executor is not None:
        parser.error("--verbose streams the output of checks run here: it cannot go with "
                     "--executor dask://")
    address: str | None = args.executor
    from_stdin = args.claims == "-"  # as most tools: a file named "-" is ./-
    claims_path = Path(args.claims)
    try:
        lines = _lines(_stdin_bytes() if from_stdin else claims_path.read_bytes())
    except OSError as exc:
        print(f"grader: cannot read {args.claims}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    cwd = (Path(args.cwd) if args.cwd is not None
           else Path.cwd() if from_stdin else claims_path.resolve().parent)
    # On a cluster the directory is the workers' and need not exist on this machine.
    if address is None and not args.tmpdir and not cwd.is_dir():
        print(f"grader: --cwd {cwd} is not a directory", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        env = _check_environment(args)
    except EnvFileError as exc:
        print(f"grader: --env-file {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    claims, errors = parse_claims(lines)
    for error in errors:
        print(error, file=sys.stderr)
    if not claims and not errors:
        # Exit 0 still (nothing contradicted), but an empty file is more often a mistake
        # (a wrong path, a generator that wrote nothing) than a claim set: say so.
        print(f"grader: no claims in {args.claims}", file=sys.stderr)

    with ExitStack() as stack:
        executor: Executor | None = None
        if address is not None:
            try:
                executor = stack.enter_context(
                    dask_executor(address, connect_timeout=args.connect_timeout)
                )
            except ExecutorUnavailable as exc:
                print(f"grader: {exc}", file=sys.stderr)
                return EXIT_BAD_INPUT
            except KeyboardInterrupt:
                print("grader: interrupted", file=sys.stderr)
                return EXIT_INTERRUPTED
        return _grade_pass(
            claims,
            len(errors),
            args=args,
            cwd=None if args.tmpdir else str(cwd.resolve()),
            executor=executor,
            env=env,
        )
