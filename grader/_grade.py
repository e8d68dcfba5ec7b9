"""The verdict lattice: pure grading of a claim's evidence against one execution of its check.

Nothing here runs a process or imports ``boundedproc``, so a caller that only grades executions
it made itself (or that only records evidence) never loads the runner's compiled core.

Decisions taken where SPEC section 3 is silent, in one place:

- "Word character" (self-certification, step 1) means ASCII ``[A-Za-z0-9_]``, as upstream's
  JavaScript ``\\w`` (no ``u`` flag) does: an accented letter or an Arabic-Indic digit is not
  one, so ``cat x\\u0663`` with expect ``x`` is self-certifying.
- "Whitespace" (every trim, split and blank test) is JavaScript's ``\\s`` and
  ``String.prototype.trim()`` set: the Unicode space separators (Zs), U+0009-U+000D, U+2028,
  U+2029 and U+FEFF. U+0085 and U+001C-U+001F are not whitespace (Python's ``str.strip``,
  ``str.split`` and ``\\s`` say they are), nor is U+180E. One set serves SPEC 3.2's ``output``,
  step 1's blank check, constant emitter, first word and trimmed expectation, the blank
  expectation of steps 7 and 8, and SPEC 3.4's trimmed check and expectation and normalised
  title (``_trim``, ``_first_word``, ``_words``). So ``\\ufefftrue`` is a constant emitter and
  ``true\\u0085`` is not.
- ``UNRUNNABLE_SIGNATURES`` ignores ASCII case only, as upstream's ``/i`` does: no non-ASCII
  character folds onto an ASCII letter, so ``No \\u017fuch file`` (long s) and a Kelvin sign for
  ``k`` match no signature.
- "``expect`` is found" is ``expect in output`` with ``expect`` exactly as recorded (untrimmed);
  only self-certification compares the trimmed expectation, as the spec says.
- A ``verified`` reached through the refusal-control rule of step 7 carries no reason (no
  ``Reason`` names it) but has a note saying the check exited non-zero; a ``silent-check`` has a
  note and no reason. Plain ``verified`` (step 10) and every ``contradicted`` carry neither.
- Step 7 is applied in the spec's order, so an expectation that names a signature is
  ``contradicted`` on a non-zero exit even when the check printed it.
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from boundedproc import Result

__all__ = [
    "CHECKABLE_RUNG_THRESHOLD",
    "UNRUNNABLE_SIGNATURES",
    "CheckExecution",
    "Claim",
    "DuplicateMarker",
    "Evidence",
    "Grade",
    "Reason",
    "UncheckableClaimError",
    "Verdict",
    "VerifiedEvidence",
    "assert_gradeable_evidence",
    "claim_key",
    "grade_claims",
    "grade_for",
    "note_for",
    "verdict_for",
]

#: The rung at and above which a claim must carry a check and a single-line expectation.
CHECKABLE_RUNG_THRESHOLD = 4

# The status a deadline kill reports (coreutils `timeout`, and boundedproc's DEADLINE_EXIT_CODE).
# Kept as a literal so that grading never needs the runner; a test pins it to boundedproc's value.
_DEADLINE_EXIT_CODE = 124

_LONG_FIRST_WORD = 200

_SIGNATURE_TOKENS = (
    "No such file",
    "FileNotFoundError",
    "ModuleNotFoundError",
    "command not found",
    "ENOENT",
    "AbortError",
    "timed out",
    "ERR_CHILD_PROCESS_STDIO_MAXBUFFER",
    "Permission denied",
    "EACCES",
    "cannot create directory",
    "cannot open",
    "SyntaxError",
    "unexpected EOF while looking for matching",
    "syntax error near unexpected token",
)

#: What a check prints when it never reached what its claim is about (calibrated upstream on 272
#: graded runs). ASCII case-insensitive, as upstream's ``/i``: U+017F and U+212A do not fold onto
#: ``s`` and ``k``. It reads only the check's own output: conditions the runner knows about
#: (deadline, cancel, spawn failure, truncation, escape, resource limits) are fields of
#: ``CheckExecution`` and are never spelled into text for this pattern to find.
UNRUNNABLE_SIGNATURES: re.Pattern[str] = re.compile(
    "|".join(re.escape(token) for token in _SIGNATURE_TOKENS), re.ASCII | re.IGNORECASE
)

_RESOURCE_SIGNALS = frozenset(
    int(getattr(signal, name)) for name in ("SIGXCPU", "SIGXFSZ") if hasattr(signal, name)
)


class Verdict(str, enum.Enum):
    """What a grader may conclude about a claim from one execution of its check.

    ``verified``: the check ran and printed the expected value. ``silent-check``: it exited 0,
    an expectation was given, and it printed nothing. ``contradicted``: it ran and refuted the
    claim. ``unrunnable``: the check could not test the claim (an environment or runner verdict,
    never a claim verdict). ``uncheckable``: the recorded evidence cannot decide the claim.
    """

    VERIFIED = "verified"
    SILENT_CHECK = "silent-check"
    CONTRADICTED = "contradicted"
    UNRUNNABLE = "unrunnable"
    UNCHECKABLE = "uncheckable"

    def __str__(self) -> str:
        return self.value


class Reason(str, enum.Enum):
    """Why a verdict other than a plain ``verified`` or ``contradicted`` was given.

    Callers and tests branch on the reason; the note beside it is prose for people.
    """

    NO_CHECK = "no-check"
    NO_EXPECTATION = "no-expectation"
    CONSTANT_EMITTER = "constant-emitter"
    SELF_CERTIFYING = "self-certifying"
    MULTILINE_EXPECTATION = "multiline-expectation"
    LONG_FIRST_WORD = "long-first-word"
    INVALID_SHELL_SYNTAX = "invalid-shell-syntax"
    NOT_RUN = "not-run"
    RUNNER_FAILURE = "runner-failure"
    DEADLINE = "deadline"
    CANCELLED = "cancelled"
    OUTPUT_TRUNCATED = "output-truncated"
    ESCAPED = "escaped"
    RESOURCE_LIMIT = "resource-limit"
    UNREACHED_INPUT = "unreached-input"

    def __str__(self) -> str:
        return self.value


_NOTES: dict[Reason, str] = {
    Reason.NO_CHECK: (
        "a claim at this rung must record the shell command that re-establishes it, and none "
        "was recorded; without one the claim grades itself"
    ),
    Reason.CONSTANT_EMITTER: (
        "the check only prints text written into the command itself (or is `true`/`:`), so it "
        "succeeds whatever the artifact says; record a command that reads the artifact"
    ),
    Reason.LONG_FIRST_WORD: (
        "the check's first word is longer than 200 characters, the shape a multi-line script "
        "takes when it is recorded with literal \\n escapes; use real line breaks or put the "
        "script in a file and record a short command that runs it"
    ),
    Reason.SELF_CERTIFYING: (
        "the check's own text contains the expected value, so it can print that value without "
        "reading anything; record a command that computes the value from the artifact"
    ),
    Reason.NO_EXPECTATION: (
        "a claim at this rung must record the single-line value its check prints; an exit "
        "status alone reproduces no value"
    ),
    Reason.MULTILINE_EXPECTATION: (
        "the expected value spans more than one line, but grading looks for one contiguous "
        "substring; record one decisive single-line value"
    ),
    Reason.INVALID_SHELL_SYNTAX: (
        "bash -n refused the check, so it is not graded and says nothing about the claim "
        "(syntax that a shopt in the check itself enables, such as extglob, is refused too: "
        "bash -n runs nothing); record a command that bash accepts as written"
    ),
    Reason.NOT_RUN: "the check was not executed, so nothing was observed about the claim",
    Reason.RUNNER_FAILURE: (
        "the runner could not run the check as asked, so nothing was observed about the claim"
    ),
    Reason.DEADLINE: (
        "the check was stopped at its deadline before it finished; a time budget is not a "
        "verdict: raise the timeout or record a check that decides within it"
    ),
    Reason.CANCELLED: (
        "the run was cancelled by its caller before the check finished, so nothing was "
        "observed about the claim"
    ),
    Reason.OUTPUT_TRUNCATED: (
        "the check printed more than the output cap kept, so only a fragment was seen; raise "
        "the cap or record a check that prints only the decisive value"
    ),
    Reason.ESCAPED: (
        "a process started by the check left its process group and still held the output "
        "pipes when reading stopped, so the output may be incomplete"
    ),
    Reason.RESOURCE_LIMIT: (
        "the check was ended by a resource limit (SIGXCPU or SIGXFSZ), not by anything it "
        "found out about the claim"
    ),
    Reason.UNREACHED_INPUT: (
        "the check's output says it never reached what the claim is about, so this is a "
        "verdict on the environment and not on the claim"
    ),
}

_SILENT_CHECK_NOTE = (
    "the check exited 0 and printed nothing, so it could not show the expected value; make the "
    "check print the value it establishes"
)


def note_for(reason: Reason, detail: str | None = None) -> str:
    """This project's note for ``reason``, with run-specific ``detail`` appended when given.

    Args:
        reason: The reason to explain.
        detail: What this run showed (a runner error, a matched signature, bash's message).

    Returns:
        The note, ``"<explanation> (<detail>)"`` when ``detail`` is given.
    """
    base = _NOTES[reason]
    return f"{base} ({detail})" if detail else base


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a claim records to be graded by.

    Attributes:
        rung: How far the evidence reaches, 1 to 5. At ``CHECKABLE_RUNG_THRESHOLD`` (4) and
            above the claim must carry ``check`` and ``expect``.
        check: A bash command that re-establishes the claim from the grader's working directory.
        expect: The single-line value the check must print (a substring of its output).

    Raises:
        TypeError: ``rung`` is not an ``int`` or ``check``/``expect`` is neither ``str`` nor
            ``None``.
        ValueError: ``rung`` is outside 1 to 5.
    """

    rung: int
    check: str | None = None
    expect: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.rung, bool) or not isinstance(self.rung, int):
            raise TypeError(f"rung must be an int, not {type(self.rung).__name__}")
        if not 1 <= self.rung <= 5:
            raise ValueError(f"rung must be between 1 and 5, not {self.rung}")
        for name in ("check", "expect"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a str or None, not {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class Grade:
    """A verdict with the reason for it.

    Attributes:
        verdict: The lattice member.
        reason: Why a verdict other than a plain ``verified``/``contradicted`` was given.
        note: This project's explanation of the reason, for people; never parse it.
        duplicate_of: The id of an earlier claim of the same grading pass with the same check,
            expectation, normalised title and verdict (set by ``grade_claims``).
    """

    verdict: Verdict
    reason: Reason | None = None
    note: str | None = None
    duplicate_of: str | int | None = None


@dataclass(frozen=True, slots=True)
class CheckExecution:
    """One observed execution of a check, as ``grade_for`` reads it.

    Every runner-side condition is a field, so grading never depends on the words a runner
    happens to print.

    Attributes:
        exit_code: The status the run reported (124 after a deadline, 137 after a cancel).
        stdout: What the check printed on stdout (the kept part).
        stderr: What the check printed on stderr (the kept part).
        timed_out: The deadline ended the run.
        cancelled: The caller cancelled the run (before or after it started).
        output_truncated: Some output past the cap was discarded.
        runner_error: The runner's own text when it could not run the command as asked.
        spawned: The command was started.
        escaped: A process outside the check's group still held the output pipes.
        term_signal: The signal that ended the check, if one did.
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    cancelled: bool = False
    output_truncated: bool = False
    runner_error: str | None = None
    spawned: bool = True
    escaped: bool = False
    term_signal: int | None = None

    @classmethod
    def from_result(cls, result: Result[str] | Result[bytes]) -> CheckExecution:
        """Build the execution ``grade_for`` reads from a ``boundedproc.Result``.

        Output captured as bytes is decoded as UTF-8 with replacement characters; ``runner_error``
        is carried as a field and never appended to ``stderr``.

        Args:
            result: A result returned by ``boundedproc.run``.

        Returns:
            The execution, with every runner-side flag copied across.
        """

        def text(value: str | bytes) -> str:
            return value.decode("utf-8", "replace") if isinstance(value, bytes) else value

        return cls(
            exit_code=result.exit_code,
            stdout=text(result.stdout),
            stderr=text(result.stderr),
            timed_out=result.timed_out,
            cancelled=result.cancelled,
            output_truncated=result.output_truncated,
            runner_error=result.runner_error,
            spawned=result.spawned,
            escaped=result.escaped,
            term_signal=result.term_signal,
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim and the execution a grader made of its check, as ``grade_claims`` reads it.

    Attributes:
        id: Stable identity that a ``duplicate_of`` can point back to: a string, or an
            integer (a claims file's ``"id": 7``).
        title: The claim's own sentence; claims sharing a check but saying different things are
            not duplicates. ``None`` means the claim is never flagged as a duplicate.
        evidence: The recorded evidence.
        execution: The observed execution, or ``None`` when the check was not run.
    """

    id: str | int
    title: str | None
    evidence: Evidence
    execution: CheckExecution | None


@dataclass(frozen=True, slots=True)
class VerifiedEvidence:
    """The evidence, the execution that graded it and the grade.

    Attributes:
        evidence: The evidence as accepted by ``assert_gradeable_evidence``.
        execution: The execution graded: the check's run, or the parse when the parse did not
            run to completion. ``None`` only for a claim below the threshold that has no check.
        grade: The grade of that execution.
    """

    evidence: Evidence
    execution: CheckExecution | None
    grade: Grade


class UncheckableClaimError(Exception):
    """The recorded evidence cannot be graded at the rung it was recorded at.

    Args:
        rung: The rung whose evidence rule the claim failed.
        reason: Which refusal applied (a ``Reason`` or its string value).
        note: This project's explanation, the same words ``grade_for`` reports.
    """

    rung: int
    reason: Reason
    note: str

    def __init__(self, rung: int, reason: Reason | str, note: str) -> None:
        reason = Reason(reason)
        # Passing every argument to Exception keeps the error picklable (executors ship it back).
        super().__init__(rung, reason, note)
        self.rung = rung
        self.reason = reason
        self.note = note

    def __str__(self) -> str:
        return f"a claim at rung {self.rung} cannot be graded at that rung ({self.reason}): {self.note}"


_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_READS_SOMETHING_ELSE = re.compile(r"[|;&\n<`]|\$(?!['\"])")

# ECMAScript's WhiteSpace and LineTerminator code points (JavaScript's `\s` and `trim()`): the Zs
# separators, U+0009-U+000D, U+2028, U+2029 and U+FEFF. Listed rather than read from
# `unicodedata`, so the set does not move with Python's Unicode version.
_SPACE_CHARS = (
    "\t\n\x0b\x0c\r \u00a0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff"
)
_SPACE_CLASS = "[" + re.escape(_SPACE_CHARS) + "]"
_SPACE = re.compile(_SPACE_CLASS)
_SPACE_RUN = re.compile(_SPACE_CLASS + "+")


def _trim(text: str) -> str:
    """``text`` without leading and trailing whitespace, as JavaScript's ``trim()``."""
    return text.strip(_SPACE_CHARS)


def _first_word(text: str) -> tuple[str, str]:
    """Split at the first whitespace character: (first word, the rest after that character)."""
    match = _SPACE.search(text)
    if match is None:
        return text, ""
    return text[: match.start()], text[match.end() :]


def _words(text: str) -> list[str]:
    """The runs of non-whitespace in ``text``, in order."""
    trimmed = _trim(text)
    return _SPACE_RUN.split(trimmed) if trimmed else []


def _is_word(char: str) -> bool:
    return char in _WORD_CHARS


def _is_constant_emitter(check: str) -> bool:
    """Whether the whole check is ``true``/``:`` or an ``echo``/``printf`` that reads nothing.

    Narrow on purpose: it refuses only shapes that carry no information on their face. A
    command substitution, a variable, a pipe, a separator, a redirection from a file or a
    backtick in the arguments makes the check read something, so it is not refused.
    """
    command = _trim(check)
    if command in ("true", ":"):
        return True
    head, _ = _first_word(command)
    if head not in ("echo", "printf"):
        return False
    # The argument text with the character that ends the first word: a newline there
    # ("echo\ncat f") starts a second command as much as one further on does.
    return _READS_SOMETHING_ELSE.search(command[len(head):]) is None


def _is_self_certifying(check: str, expect: str | None) -> bool:
    """Whether the check's text contains the trimmed expectation at a word boundary.

    An occurrence does not count when a word character at an edge of the expectation touches a
    word character of the check, so expect ``6`` is not found in ``report6.mjs`` or ``grid8``.
    """
    wanted = _trim(expect or "")
    if not wanted:
        return False
    starts_in_word = _is_word(wanted[0])
    ends_in_word = _is_word(wanted[-1])
    at = check.find(wanted)
    while at != -1:
        end = at + len(wanted)
        glued_before = starts_in_word and at > 0 and _is_word(check[at - 1])
        glued_after = ends_in_word and end < len(check) and _is_word(check[end])
        if not glued_before and not glued_after:
            return True
        at = check.find(wanted, at + 1)
    return False


def _check_refusal(evidence: Evidence) -> Reason | None:
    """Step 1: the refusals that depend only on the check text (rung >= threshold)."""
    check = evidence.check
    if check is None or not _trim(check):
        return Reason.NO_CHECK
    if _is_constant_emitter(check):
        return Reason.CONSTANT_EMITTER
    if len(_first_word(_trim(check))[0]) > _LONG_FIRST_WORD:
        return Reason.LONG_FIRST_WORD
    if _is_self_certifying(check, evidence.expect):
        return Reason.SELF_CERTIFYING
    return None


def _expectation_refusal(evidence: Evidence) -> Reason | None:
    """Step 8: the refusals of the expectation itself (rung >= threshold)."""
    expect = evidence.expect
    if expect is None or not _trim(expect):
        return Reason.NO_EXPECTATION
    if "\n" in expect or "\r" in expect:
        return Reason.MULTILINE_EXPECTATION
    return None


def _names_signature(expect: str | None) -> bool:
    return expect is not None and UNRUNNABLE_SIGNATURES.search(expect) is not None


def _refutation(output: str, expect: str | None) -> Grade:
    """Output that failed to establish the claim: a refutation, unless it never reached its input.

    An expectation that itself names a signature switches the downgrade off, because a claim
    that predicted that error is refuted by output that does not establish it.
    """
    if _names_signature(expect):
        return Grade(Verdict.CONTRADICTED)
    hit = UNRUNNABLE_SIGNATURES.search(output)
    if hit is not None:
        return Grade(
            Verdict.UNRUNNABLE,
            Reason.UNREACHED_INPUT,
            note_for(Reason.UNREACHED_INPUT, f"it printed {hit.group()!r}"),
        )
    return Grade(Verdict.CONTRADICTED)


def _uncheckable(reason: Reason) -> Grade:
    return Grade(Verdict.UNCHECKABLE, reason, note_for(reason))


def _unrunnable(reason: Reason, detail: str | None = None) -> Grade:
    return Grade(Verdict.UNRUNNABLE, reason, note_for(reason, detail))


def grade_for(evidence: Evidence, execution: CheckExecution | None) -> Grade:
    """Grade one claim's evidence against one execution of its check (SPEC 3.2, in order).

    Refusals of the recorded check come first and hold whatever the execution was. Then every
    runner-side condition is read from its field before the exit status, because a run the
    grader could not fully observe says nothing about the claim. Only then is the output
    compared with the expectation.

    Args:
        evidence: The claim's recorded evidence.
        execution: The observed execution, or ``None`` when the check was not run.

    Returns:
        The grade. Every verdict other than a plain ``verified``/``contradicted`` has a reason.
    """
    checkable = evidence.rung >= CHECKABLE_RUNG_THRESHOLD
    if checkable:
        refused = _check_refusal(evidence)
        if refused is not None:
            return _uncheckable(refused)
    if execution is None:
        return _unrunnable(Reason.NOT_RUN)
    if execution.timed_out:
        return _unrunnable(Reason.DEADLINE)
    if execution.exit_code == _DEADLINE_EXIT_CODE:
        return _unrunnable(Reason.DEADLINE, "it exited with 124, the status of a deadline kill")
    if execution.cancelled:
        return _unrunnable(Reason.CANCELLED)
    if not execution.spawned or execution.runner_error is not None:
        return _unrunnable(Reason.RUNNER_FAILURE, execution.runner_error or "it was not started")
    if execution.output_truncated:
        return _unrunnable(Reason.OUTPUT_TRUNCATED)
    if execution.escaped:
        return _unrunnable(Reason.ESCAPED)
    if execution.term_signal is not None and execution.term_signal in _RESOURCE_SIGNALS:
        name = signal.Signals(execution.term_signal).name
        return _unrunnable(Reason.RESOURCE_LIMIT, f"it was ended by {name}")

    output = _trim(f"{execution.stdout}\n{execution.stderr}")
    expect = evidence.expect
    if execution.exit_code != 0:
        refuted = _refutation(output, expect)
        if refuted.verdict is Verdict.UNRUNNABLE or _names_signature(expect):
            return refuted
        if expect is not None and _trim(expect) and expect in output:
            # A refusal control: it exits non-zero and prints the refusal it promised.
            return Grade(
                Verdict.VERIFIED,
                note=(
                    f"the check exited with status {execution.exit_code} and printed the "
                    "expected value, read as a refusal control"
                ),
            )
        return refuted
    if checkable:
        refused = _expectation_refusal(evidence)
        if refused is not None:
            return _uncheckable(refused)
    if expect is not None and expect not in output:
        if output == "":
            return Grade(Verdict.SILENT_CHECK, note=_SILENT_CHECK_NOTE)
        return _refutation(output, expect)
    return Grade(Verdict.VERIFIED)


def verdict_for(evidence: Evidence, execution: CheckExecution | None) -> Verdict:
    """The verdict alone: ``grade_for(evidence, execution).verdict``.

    Args:
        evidence: The claim's recorded evidence.
        execution: The observed execution, or ``None`` when the check was not run.

    Returns:
        The lattice member ``grade_for`` gives.
    """
    return grade_for(evidence, execution).verdict


def assert_gradeable_evidence(evidence: Evidence) -> Evidence:
    """Refuse, at record time, the evidence ``grade_for`` would grade ``uncheckable`` on its face.

    At and above ``CHECKABLE_RUNG_THRESHOLD`` these are the refusals of steps 1 and 8 of
    ``grade_for``, in that order and with the same reason and note: no check, a constant
    emitter, a first word over 200 characters, a self-certifying check, no expectation, a
    multi-line expectation. Below the threshold nothing is refused.

    Args:
        evidence: The evidence to be recorded.

    Returns:
        ``evidence`` itself when it can be graded.

    Raises:
        UncheckableClaimError: The evidence cannot be graded at its rung.
    """
    if evidence.rung < CHECKABLE_RUNG_THRESHOLD:
        return evidence
    refused = _check_refusal(evidence) or _expectation_refusal(evidence)
    if refused is not None:
        raise UncheckableClaimError(evidence.rung, refused, note_for(refused))
    return evidence


def _normalise_title(title: str) -> str:
    folded = " ".join(_words(title)).lower()
    return folded.removesuffix(".md")


def claim_key(evidence: Evidence, title: str | None) -> tuple[str, str, str] | None:
    """The identity two claims share when they are one verification counted twice.

    Args:
        evidence: The claim's evidence.
        title: The claim's title.

    Returns:
        ``(trimmed check, trimmed expectation, normalised title)``, or ``None`` when the claim
        has no check or no title and so is never flagged. The title is trimmed, its inner
        whitespace collapsed, lowercased, and a trailing ``.md`` dropped.
    """
    check = _trim(evidence.check or "")
    normalised = _normalise_title(title or "")
    if not check or not normalised:
        return None
    return check, _trim(evidence.expect or ""), normalised


class DuplicateMarker:
    """Flags each later claim with the same key and verdict as an earlier one of the same pass.

    Feed it the claims in input order; ``mark`` sees only earlier claims, so a pass can be
    reported as it goes. The verdict never changes: the flag tells a reader how much evidence
    the pass really holds.
    """

    __slots__ = ("_first_seen",)

    def __init__(self) -> None:
        self._first_seen: dict[tuple[Hashable, Verdict], str | int] = {}

    def mark(self, claim_id: str | int, key: Hashable | None, grade: Grade) -> Grade:
        """Return ``grade``, with ``duplicate_of`` set when an earlier claim matches.

        Args:
            claim_id: The claim's id.
            key: Its ``claim_key`` (``None``: never flagged, never matched).
            grade: Its grade.

        Returns:
            The grade, flagged when the key and the verdict were seen before.
        """
        if key is None:
            return grade
        seen = (key, grade.verdict)
        if seen not in self._first_seen:  # the first: also when a later one has its id
            self._first_seen[seen] = claim_id
            return grade
        return Grade(grade.verdict, grade.reason, grade.note,
                     duplicate_of=self._first_seen[seen])


def grade_claims(claims: Iterable[Claim], *, executor: Executor | None = None) -> list[Grade]:
    """Grade a pass of claims that already carry their executions, and flag repeats (SPEC 3.4).

    Each claim is graded as ``grade_for`` does. A later claim with the same check, expectation
    and normalised title as an earlier one, and the same verdict, gets ``duplicate_of`` set to
    the first one's id; its verdict is unchanged. A claim without a check or a title is never
    flagged.

    Args:
        claims: The claims, in the order they are reported.
        executor: Where to run ``grade_for``; ``None`` grades in the calling thread. Any
            ``concurrent.futures.Executor`` works (the grades are the same). It moves only
            the cheap, pure ``grade_for``: to run the checks themselves on a pool or a Dask
            cluster, use ``python -m grader --executor`` or ``grader._cli.verify_claims``.

    Returns:
        One grade per claim, in input order.
    """
    items = list(claims)
    evidences = [claim.evidence for claim in items]
    executions = [claim.execution for claim in items]
    grader: Callable[[Evidence, CheckExecution | None], Grade] = grade_for
    if executor is None:
        grades = list(map(grader, evidences, executions))
    else:
        grades = list(executor.map(grader, evidences, executions))
    marker = DuplicateMarker()
    return [
        marker.mark(claim.id, claim_key(claim.evidence, claim.title), grade)
        for claim, grade in zip(items, grades, strict=True)
    ]
