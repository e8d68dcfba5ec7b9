"""Parse, run and grade one claim's check through ``boundedproc``.

``boundedproc`` is imported when a check is first run, not when ``grader`` is imported, so a
caller that only grades executions it already has never loads the runner's compiled core.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ._grade import (
    CHECKABLE_RUNG_THRESHOLD,
    CheckExecution,
    Evidence,
    Grade,
    Reason,
    UncheckableClaimError,
    Verdict,
    VerifiedEvidence,
    _trim,
    assert_gradeable_evidence,
    grade_for,
    note_for,
)

if TYPE_CHECKING:
    from boundedproc import Cancel

__all__ = ["verify_gradeable_evidence"]

_MIB = 1024 * 1024
_PARSE_MAX_OUTPUT = 64 * 1024  # of bash -n's refusal kept for the note, at the least


def _run_bash(
    argv: list[str],
    *,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    timeout: float | None,
    max_output: int | None,
    cancel: Cancel | None,
    user: int | str | None = None,
    tmpdir: bool = False,
    on_output: Callable[[int, bytes], None] | None = None,
) -> CheckExecution:
    from boundedproc import run

    result = run(
        argv,
        cwd=None if tmpdir else cwd,
        user=user,
        tmpdir=tmpdir,
        # The exact environment the caller named and nothing else: a check is graded on what it
        # could read, so an inherited variable would make the grade depend on this process.
        env=dict(env) if env is not None else {},
        env_mode="replace",
        timeout=timeout,
        max_output=max_output,
        text=True,
        cancel=cancel,
        on_output=on_output,
    )
    return CheckExecution.from_result(result)


def _stopped_parse_grade(evidence: Evidence, parse: CheckExecution) -> Grade | None:
    """The grade of a ``bash -n`` run that did not run to completion, or ``None`` if it did.

    A parse the runner stopped, could not start, or that a signal ended learned nothing about
    the check's grammar, so it is graded ``unrunnable`` rather than reported as a syntax error.
    """
    stopped = (
        parse.timed_out
        or parse.cancelled
        or not parse.spawned
        or parse.runner_error is not None
        or parse.escaped
        or parse.term_signal is not None
    )
    if not stopped:
        return None
    grade = grade_for(evidence, parse)
    if grade.verdict is Verdict.UNRUNNABLE:
        return grade
    # Only a signal nobody in this call sent is left (the OOM killer, an operator's kill): bash
    # never finished reading the check, which is a failure to run it, not a verdict on it.
    return Grade(
        Verdict.UNRUNNABLE,
        Reason.RUNNER_FAILURE,
        note_for(Reason.RUNNER_FAILURE, f"bash -n was ended by signal {parse.term_signal}"),
    )


def verify_gradeable_evidence(
    evidence: Evidence,
    *,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None = None,
    bash: str = "bash",
    timeout: float | None = 30.0,
    parse_timeout: float | None = None,
    max_output: int | None = _MIB,
    cancel: Cancel | None = None,
    user: int | str | None = None,
    tmpdir: bool = False,
    on_output: Callable[[int, bytes], None] | None = None,
) -> VerifiedEvidence:
    """Refuse, parse, run and grade a claim's check, as a blind grader would (SPEC 3.3).

    The check reaches bash as one argument (``[bash, "-n", "-c", check]``, then
    ``[bash, "-c", check]``) and is never quoted into a shell string. It runs in its own
    process group, which is killed when the run ends, under ``env`` alone
    (``env_mode="replace"``): ``None`` means an empty environment, in which bash falls back to
    its built-in ``PATH``.

    A check that bash really parsed and refused raises. A parse that did not run to completion
    (its deadline, a cancel, a missing bash, any runner failure, a signal) raises nothing: it is
    returned graded ``unrunnable``, because nothing was learned about the check's grammar. A
    check that cannot reach bash at all (a NUL byte, or a lone surrogate such as ``\\ud800``,
    which no bytes encode) is such a runner failure too: ``unrunnable``/``runner-failure``. A
    cancel that lands between the parse and the run is graded ``unrunnable``/``cancelled``.

    A claim below ``CHECKABLE_RUNG_THRESHOLD`` without a check is not run; it is returned with
    no execution, graded ``unrunnable``/``not-run``.

    Args:
        evidence: The claim's evidence.
        cwd: Directory the check runs in (a keyword with no default, so that a caller
            names it); ``None`` is this process's current directory, as with
            ``boundedproc.run``, and must be ``None`` with ``tmpdir``.
        env: The whole environment of the check; ``None`` for an empty one.
        bash: The bash program, looked up on ``PATH`` of ``env`` (or ``os.defpath``).
        timeout: Seconds the check may run; ``None`` for no deadline.
        parse_timeout: Seconds the ``bash -n`` parse may run; ``None`` uses ``timeout``. The
            parse and the run each have their own budget.
        max_output: Bytes of combined stdout and stderr kept; a check that prints more is
            graded ``unrunnable``/``output-truncated``. The ``bash -n`` parse keeps at least
            64 KiB of its refusal for the note; a longer refusal still raises, its message
            cut (it ran to completion: only its text is short).
        cancel: A ``boundedproc.Cancel`` that stops the parse or the run when it fires.
        user: Run the parse and the check as this user (a name or a uid; ``boundedproc.run``'s
            ``user=``). A user this machine does not have grades ``unrunnable``
            (``runner-failure``), since nothing ran.
        tmpdir: Run the parse and the check each in a fresh private directory, its cwd and
            ``TMPDIR``, removed after it (``boundedproc.run``'s ``tmpdir=``); ``cwd`` must then
            be ``None``.
        on_output: Called as ``on_output(stream, chunk)`` (``stream`` 1 for stdout, 2 for
            stderr) with the check's output as it is read, every chunk, kept or not
            (``boundedproc.run``'s ``on_output=``), in the thread that runs the check. Only the
            check's run streams: the ``bash -n`` parse prints nothing unless it refuses the
            check, and then its message is in the note. An exception it raises ends the run
            (its group killed) and propagates.

    Returns:
        The evidence, the execution that was graded (the parse's, when the parse was stopped)
        and its grade.

    Raises:
        ValueError: ``cwd`` is given with ``tmpdir``.
        UncheckableClaimError: The evidence is refused on its face (see
            ``assert_gradeable_evidence``), or bash ran ``-n`` and refused the check's syntax
            (reason ``invalid-shell-syntax``, with bash's own message in the note).
    """
    if cwd is not None and tmpdir:
        raise ValueError("give cwd= or tmpdir=True (a fresh directory for each run), not both")
    accepted = assert_gradeable_evidence(evidence)
    check = accepted.check
    if check is None:
        # Only reachable below the threshold, where a claim need not carry a check.
        assert accepted.rung < CHECKABLE_RUNG_THRESHOLD
        return VerifiedEvidence(accepted, None, grade_for(accepted, None))

    def run_bash(argv: list[str], budget: float | None, cap: int | None,
                 on_output: Callable[[int, bytes], None] | None = None) -> CheckExecution:
        return _run_bash(
            argv, cwd=cwd, env=env, timeout=budget, max_output=cap, cancel=cancel,
            user=user, tmpdir=tmpdir, on_output=on_output,
        )

    # The parse prints only bash's refusal, kept for the note whatever the check's own cap; a
    # refusal longer than that is still a refusal (SPEC 3.3 step 4), its message cut.
    parse_cap = None if max_output is None else max(max_output, _PARSE_MAX_OUTPUT)
    parse = run_bash([bash, "-n", "-c", check],
                     timeout if parse_timeout is None else parse_timeout, parse_cap)
    stopped = _stopped_parse_grade(accepted, parse)
    if stopped is not None:
        return VerifiedEvidence(accepted, parse, stopped)
    if parse.exit_code != 0:
        said = _trim(f"{parse.stdout}\n{parse.stderr}")
        raise UncheckableClaimError(
            accepted.rung,
            Reason.INVALID_SHELL_SYNTAX,
            note_for(Reason.INVALID_SHELL_SYNTAX, f"bash said: {said}" if said else None),
        )
    execution = run_bash([bash, "-c", check], timeout, max_output, on_output)
    return VerifiedEvidence(accepted, execution, grade_for(accepted, execution))
