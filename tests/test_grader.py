"""Tests of the grader: the verdict lattice (SPEC 3.2), refusals, duplicates, and real runs."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
from conftest import SPEC_SIGNATURES

import boundedproc
import grader
from grader import (
    CHECKABLE_RUNG_THRESHOLD,
    UNRUNNABLE_SIGNATURES,
    CheckExecution,
    Claim,
    Evidence,
    Grade,
    Reason,
    UncheckableClaimError,
    Verdict,
    assert_gradeable_evidence,
    grade_claims,
    grade_for,
    verdict_for,
    verify_gradeable_evidence,
)


def ran(stdout: str = "", stderr: str = "", exit_code: int = 0, **flags: Any) -> CheckExecution:
    """A hand-built execution of a check."""
    return CheckExecution(exit_code=exit_code, stdout=stdout, stderr=stderr, **flags)


def ev(
    check: str | None = "grep -c PARETO results.txt", expect: str | None = "6", rung: int = 4
) -> Evidence:
    """Evidence at rung 4 by default, with a check that reads a file."""
    return Evidence(rung=rung, check=check, expect=expect)


# --- the public surface -------------------------------------------------------------------


def test_public_names_are_exactly_the_documented_ones() -> None:
    """`grader.__all__` lists the documented API and every name in it exists."""
    assert set(grader.__all__) == {
        "Verdict",
        "Reason",
        "Evidence",
        "Grade",
        "CheckExecution",
        "Claim",
        "VerifiedEvidence",
        "UncheckableClaimError",
        "UNRUNNABLE_SIGNATURES",
        "CHECKABLE_RUNG_THRESHOLD",
        "grade_for",
        "verdict_for",
        "assert_gradeable_evidence",
        "verify_gradeable_evidence",
        "grade_claims",
    }
    assert all(hasattr(grader, name) for name in grader.__all__)


def test_enum_values_are_the_spec_strings() -> None:
    """Verdict and Reason values are exactly the strings SPEC 3.1 names."""
    assert [v.value for v in Verdict] == [
        "verified",
        "silent-check",
        "contradicted",
        "unrunnable",
        "uncheckable",
    ]
    assert {r.value for r in Reason} == {
        "no-check",
        "no-expectation",
        "constant-emitter",
        "self-certifying",
        "multiline-expectation",
        "long-first-word",
        "invalid-shell-syntax",
        "not-run",
        "runner-failure",
        "deadline",
        "cancelled",
        "output-truncated",
        "escaped",
        "resource-limit",
        "unreached-input",
    }
    assert str(Verdict.SILENT_CHECK) == "silent-check" and Verdict("verified") is Verdict.VERIFIED


def test_threshold_is_four() -> None:
    """Checks and expectations are required from rung 4 up."""
    assert CHECKABLE_RUNG_THRESHOLD == 4


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"rung": 0}, ValueError),
        ({"rung": 6}, ValueError),
        ({"rung": "4"}, TypeError),
        ({"rung": True}, TypeError),
        ({"rung": 4, "check": 5}, TypeError),
        ({"rung": 4, "expect": b"6"}, TypeError),
    ],
)
def test_evidence_rejects_caller_bugs(kwargs: dict[str, Any], error: type[Exception]) -> None:
    """Evidence refuses a rung outside 1-5 or non-string check/expect at construction."""
    with pytest.raises(error):
        Evidence(**kwargs)


def test_results_are_frozen_and_slotted() -> None:
    """The dataclasses are frozen and have no per-instance dict."""
    grade = Grade(Verdict.VERIFIED)
    with pytest.raises(AttributeError):
        grade.verdict = Verdict.CONTRADICTED  # type: ignore[misc]
    assert not hasattr(ran(), "__dict__") and not hasattr(ev(), "__dict__")


# --- UNRUNNABLE_SIGNATURES -----------------------------------------------------------------

@pytest.mark.parametrize("token", SPEC_SIGNATURES)
def test_each_signature_matches_in_any_case(token: str) -> None:
    """Every calibrated token is matched, case-insensitively, inside other text."""
    assert UNRUNNABLE_SIGNATURES.search(f"prefix: {token.upper()} suffix")
    assert UNRUNNABLE_SIGNATURES.search(token.lower())


def test_signatures_do_not_match_ordinary_output() -> None:
    """Plain output and a runner's spawn-failure prefix alone are not signatures."""
    assert UNRUNNABLE_SIGNATURES.search("PARETO=6 cells=8") is None
    assert UNRUNNABLE_SIGNATURES.search("spawn failed: EAGAIN") is None


# --- step 1: refusals of the check ---------------------------------------------------------


@pytest.mark.parametrize("check", [None, "", "   \n\t"])
def test_step1_no_check(check: str | None) -> None:
    """At rung 4 an absent or blank check is uncheckable/no-check, whatever the execution."""
    for execution in (None, ran("6"), ran(timed_out=True, exit_code=124)):
        grade = grade_for(ev(check=check), execution)
        assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.NO_CHECK)
        assert grade.note


@pytest.mark.parametrize(
    "check",
    [
        "true",
        ":",
        "  true \n",
        "echo 6",
        "echo",
        "printf '%s\\n' 6",
        "echo $'6'",
        'echo $"six"',
        "echo 6 > out.txt",
    ],
)
def test_step1_constant_emitter(check: str) -> None:
    """`true`, `:` and an echo/printf that reads nothing are uncheckable/constant-emitter."""
    grade = grade_for(ev(check=check, expect="42"), ran("6"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.CONSTANT_EMITTER)


@pytest.mark.parametrize(
    "check",
    [
        'echo "roots=$(grep -c root out.txt)"',
        "echo $HOME",
        "echo ${COUNT}",
        "echo `cat n.txt`",
        "echo a | wc -c",
        "echo a; cat n.txt",
        "echo a && cat n.txt",
        "echo a\ncat n.txt",
        "echo\ncat n.txt",
        "printf\ncat n.txt",
        "echo\u2028a\ncat n.txt",
        "echo x < n.txt",
        "trueish",
        "echoes 6",
        "/bin/true && cat n.txt",
    ],
)
def test_step1_reading_checks_are_not_constant_emitters(check: str) -> None:
    """A check that reads something (substitution, variable, pipe, separator) is not refused."""
    assert grade_for(ev(check=check, expect="roots=3"), ran("roots=3")).verdict is Verdict.VERIFIED


def test_step1_command_substitution_verifies_end_to_end_grade() -> None:
    """`echo "roots=$(grep -c root out.txt)"` with its value printed is verified, no reason."""
    grade = grade_for(ev('echo "roots=$(grep -c root out.txt)"', "roots=3"), ran("roots=3\n"))
    assert grade == Grade(Verdict.VERIFIED)


def test_step1_long_first_word() -> None:
    """A first word over 200 characters is uncheckable/long-first-word; 200 exactly is not."""
    long_word = "python3\\n" + "x" * 200
    grade = grade_for(ev(check=f"  {long_word} arg"), ran("6"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.LONG_FIRST_WORD)
    assert grade_for(ev(check="x" * 200 + " data.txt"), ran("6")).verdict is Verdict.VERIFIED


@pytest.mark.parametrize(
    ("check", "expect"),
    [
        ("node report6.mjs --assert 6", "6"),
        ("python3 verify.py --want 'PARETO=6'", "PARETO=6"),
        ("grep -c x data.txt; test 6 -eq 6", " 6 "),
        ("./solve --print=6", "=6"),
        ("cat 6", "6"),
    ],
)
def test_step1_self_certifying(check: str, expect: str) -> None:
    """A check whose text holds the trimmed expectation at a word boundary is refused."""
    grade = grade_for(ev(check=check, expect=expect), ran(expect.strip()))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.SELF_CERTIFYING)


@pytest.mark.parametrize(
    ("check", "expect"),
    [
        ("grep -c PARETO results.txt", "6"),
        ("wc -l < grid8.txt", "8"),
        ("node report6.mjs", "6"),
        ("cat run_6/out.txt", "6"),
        ("cat 66.txt", "6"),
    ],
)
def test_step1_word_boundary_keeps_reading_checks(check: str, expect: str) -> None:
    """An expectation glued to a word character of the check does not count: it verifies."""
    assert grade_for(ev(check=check, expect=expect), ran(f"{expect}\n")) == Grade(Verdict.VERIFIED)


def test_step1_refusal_order() -> None:
    """No-check beats everything; a constant emitter is named before self-certification."""
    assert grade_for(ev(check="echo 6", expect="6"), None).reason is Reason.CONSTANT_EMITTER
    assert grade_for(ev(check=" ", expect=""), None).reason is Reason.NO_CHECK


def test_step1_holds_whatever_the_execution_was() -> None:
    """A refused check stays uncheckable even when the run timed out or printed the value."""
    for execution in (None, ran("6"), ran(exit_code=124, timed_out=True), ran(cancelled=True)):
        grade = grade_for(ev(check="node report6.mjs --assert 6"), execution)
        assert grade.reason is Reason.SELF_CERTIFYING


def test_step1_does_not_apply_below_threshold() -> None:
    """Below rung 4 a constant emitter or a missing check is not refused."""
    assert grade_for(ev(check="echo 6", rung=3), ran("6")).verdict is Verdict.VERIFIED
    assert grade_for(ev(check=None, expect=None, rung=2), None).reason is Reason.NOT_RUN


# --- steps 2 to 6: runner-side conditions, read from fields --------------------------------


def test_step2_no_execution_is_not_run() -> None:
    """No execution is unrunnable/not-run."""
    grade = grade_for(ev(), None)
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.NOT_RUN)


def test_step3_deadline_from_field() -> None:
    """`timed_out` is unrunnable/deadline even when the expectation was already printed."""
    grade = grade_for(ev(), ran("6", exit_code=124, timed_out=True))
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.DEADLINE)


def test_step3_exit_124_is_a_deadline() -> None:
    """Exit status 124 alone (a `timeout` inside the check) is unrunnable/deadline."""
    grade = grade_for(ev(), ran("", exit_code=124))
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.DEADLINE)


def test_step3_deadline_beats_cancel() -> None:
    """A run both timed out and cancelled is graded deadline (step 3 before step 4)."""
    assert grade_for(ev(), ran(exit_code=124, timed_out=True, cancelled=True)).reason is (
        Reason.DEADLINE
    )


def test_step4_cancelled_from_field() -> None:
    """`cancelled` is unrunnable/cancelled, never contradicted, with or without a spawn."""
    for execution in (
        ran(exit_code=137, cancelled=True, term_signal=9),
        ran(exit_code=137, cancelled=True, spawned=False),
        ran("6", exit_code=0, cancelled=True),
    ):
        grade = grade_for(ev(), execution)
        assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.CANCELLED)


@pytest.mark.parametrize(
    "execution",
    [
        ran(exit_code=127, spawned=False, runner_error="spawn failed: ENOENT: program 'bash'"),
        ran(exit_code=127, spawned=False, runner_error="spawn failed: EAGAIN: program 'bash'"),
        ran(exit_code=127, spawned=False, runner_error="not spawned: NUL byte in argument 2"),
        ran(exit_code=127, spawned=False, runner_error="spawn failed: E2BIG: program 'bash'"),
        ran(exit_code=0, stdout="6", runner_error="stdin not delivered: EPIPE"),
        ran(exit_code=127, spawned=False),
    ],
)
def test_step5_runner_failure_whatever_its_text(execution: CheckExecution) -> None:
    """Not spawned or any runner_error is unrunnable/runner-failure, signature or not."""
    grade = grade_for(ev(), execution)
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.RUNNER_FAILURE)
    if execution.runner_error:
        assert execution.runner_error in (grade.note or "")


def test_step6_output_truncated_even_with_value_printed() -> None:
    """A truncated capture is unrunnable/output-truncated, before any comparison."""
    for execution in (ran("6", output_truncated=True), ran("5", output_truncated=True)):
        grade = grade_for(ev(), execution)
        assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.OUTPUT_TRUNCATED)


def test_step6_escaped() -> None:
    """An escaped run is unrunnable/escaped; truncation is named first when both hold."""
    assert grade_for(ev(), ran("5", escaped=True)).reason is Reason.ESCAPED
    both = ran("5", escaped=True, output_truncated=True)
    assert grade_for(ev(), both).reason is Reason.OUTPUT_TRUNCATED


@pytest.mark.parametrize("signum", [signal.SIGXCPU, signal.SIGXFSZ])
def test_step6_resource_limit(signum: signal.Signals) -> None:
    """A check ended by SIGXCPU or SIGXFSZ is unrunnable/resource-limit."""
    grade = grade_for(ev(), ran(exit_code=128 + signum, term_signal=int(signum)))
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.RESOURCE_LIMIT)
    assert signum.name in (grade.note or "")


def test_runner_conditions_are_never_read_from_text() -> None:
    """Runner prose in stderr does not stand in for a field: no field, no runner verdict."""
    grade = grade_for(ev(), ran(stderr="cancelled by caller; spawn failed", exit_code=1))
    assert grade == Grade(Verdict.CONTRADICTED)


def test_other_signal_is_not_a_resource_limit() -> None:
    """A check killed by SIGSEGV is graded on its exit status like any other failure."""
    assert grade_for(ev(), ran(exit_code=139, term_signal=11)).verdict is Verdict.CONTRADICTED


# --- step 7: non-zero exit -----------------------------------------------------------------


def test_step7_missing_input_blames_the_environment() -> None:
    """A non-zero exit whose output names a signature is unrunnable/unreached-input."""
    stderr = "grep: results.txt: No such file or directory"
    grade = grade_for(ev(), ran(stderr=stderr, exit_code=2))
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.UNREACHED_INPUT)
    assert "No such file" in (grade.note or "")


def test_step7_signature_match_is_case_insensitive() -> None:
    """The output signature is matched whatever its case."""
    grade = grade_for(ev(), ran(stdout="error: PERMISSION DENIED", exit_code=1))
    assert grade.reason is Reason.UNREACHED_INPUT


def test_step7_expectation_naming_a_signature_keeps_contradicted() -> None:
    """An expectation that itself names a signature switches the downgrade off: contradicted."""
    evidence = ev(check="./guard /root/secret", expect="Permission denied")
    grade = grade_for(evidence, ran(stderr="guard: cannot open /root/secret", exit_code=1))
    assert grade == Grade(Verdict.CONTRADICTED)


def test_step7_refusal_control_verifies() -> None:
    """A non-zero exit that prints the promised refusal is verified (a refusal control)."""
    evidence = ev(check="./solver --budget 1 big.cnf", expect="refused: budget exceeded")
    grade = grade_for(evidence, ran(stderr="refused: budget exceeded\n", exit_code=3))
    assert grade.verdict is Verdict.VERIFIED and grade.reason is None


def test_step7_plain_failure_is_contradicted() -> None:
    """A non-zero exit without the expectation or a signature is a plain contradiction."""
    assert grade_for(ev(), ran("5", exit_code=1)) == Grade(Verdict.CONTRADICTED)
    assert grade_for(ev(), ran(exit_code=1)) == Grade(Verdict.CONTRADICTED)


def test_step7_blank_expectation_never_verifies_a_failure() -> None:
    """A non-zero exit with no or a blank expectation is contradicted, not verified."""
    for expect in (None, "", "  "):
        assert grade_for(ev(expect=expect, rung=3), ran("x", exit_code=1)).verdict is (
            Verdict.CONTRADICTED
        )


def test_step7_comes_before_the_expectation_refusals() -> None:
    """At rung 4 a failing check with no expectation is contradicted, not uncheckable."""
    assert grade_for(ev(expect=None), ran(exit_code=1)).verdict is Verdict.CONTRADICTED


# --- step 8: refusals of the expectation ---------------------------------------------------


@pytest.mark.parametrize(
    ("expect", "reason"),
    [
        (None, Reason.NO_EXPECTATION),
        ("", Reason.NO_EXPECTATION),
        ("  \t", Reason.NO_EXPECTATION),
        ("6\n7", Reason.MULTILINE_EXPECTATION),
        ("6\r", Reason.MULTILINE_EXPECTATION),
        ("\n6", Reason.MULTILINE_EXPECTATION),
    ],
)
def test_step8_expectation_refusals(expect: str | None, reason: Reason) -> None:
    """At rung 4 a passing check with a blank or multi-line expectation is uncheckable."""
    grade = grade_for(ev(expect=expect), ran("6\n7"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, reason)


def test_step8_does_not_apply_below_threshold() -> None:
    """Below rung 4 an exit status alone verifies."""
    assert grade_for(ev(expect=None, rung=3), ran("")) == Grade(Verdict.VERIFIED)


# --- step 9: expectation not found ---------------------------------------------------------


def test_step9_silent_check() -> None:
    """Exit 0, empty output, expectation given: silent-check (no reason needed)."""
    grade = grade_for(ev(), ran("  \n", "\n"))
    assert grade.verdict is Verdict.SILENT_CHECK and grade.reason is None


def test_step9_other_output_contradicts() -> None:
    """Exit 0 with output lacking the expectation and no signature is contradicted."""
    assert grade_for(ev(), ran("5\n")) == Grade(Verdict.CONTRADICTED)


def test_step9_signature_in_output_is_unreached_input() -> None:
    """A pipeline that exits 0 but printed a signature is unrunnable/unreached-input."""
    stderr = "sha256sum: data.bin: No such file or directory"
    grade = grade_for(ev("sha256sum data.bin | cut -c1-8", "deadbeef"), ran(stderr=stderr))
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.UNREACHED_INPUT)


def test_step9_expectation_naming_a_signature_keeps_contradicted() -> None:
    """Exit 0, expectation names a signature, output shows another one: contradicted."""
    evidence = ev(check="./probe missing.txt", expect="No such file")
    assert grade_for(evidence, ran(stderr="probe: Permission denied")) == Grade(
        Verdict.CONTRADICTED
    )


def test_zero_exit_with_signature_but_expectation_found_verifies() -> None:
    """Exit 0 with the expectation found verifies even when the output also holds a signature."""
    execution = ran("6\n", "cat: extra.txt: No such file or directory")
    assert grade_for(ev(), execution) == Grade(Verdict.VERIFIED)


def test_expectation_is_compared_as_recorded() -> None:
    """The expectation is a substring of the trimmed stdout+stderr, compared as recorded."""
    assert grade_for(ev(expect="PARETO=6"), ran("", "rows PARETO=6 done")).verdict is (
        Verdict.VERIFIED
    )
    assert grade_for(ev(expect="pareto=6"), ran("PARETO=6")).verdict is Verdict.CONTRADICTED


# --- step 10 and verdict_for ---------------------------------------------------------------


def test_step10_verified_has_no_reason_or_note() -> None:
    """A passing check that printed the expectation is a plain verified grade."""
    assert grade_for(ev(), ran("6\n")) == Grade(Verdict.VERIFIED)


def test_verdict_for_is_the_grade_verdict() -> None:
    """verdict_for returns grade_for's verdict."""
    for execution in (None, ran("6"), ran("5"), ran(""), ran(timed_out=True, exit_code=124)):
        assert verdict_for(ev(), execution) is grade_for(ev(), execution).verdict


# --- assert_gradeable_evidence and UncheckableClaimError -----------------------------------

REFUSED = [
    (ev(check=None), Reason.NO_CHECK),
    (ev(check="echo 6"), Reason.CONSTANT_EMITTER),
    (ev(check="x" * 201), Reason.LONG_FIRST_WORD),
    (ev(check="node report6.mjs --assert 6"), Reason.SELF_CERTIFYING),
    (ev(expect=None), Reason.NO_EXPECTATION),
    (ev(expect="6\n7"), Reason.MULTILINE_EXPECTATION),
]


@pytest.mark.parametrize(("evidence", "reason"), REFUSED)
def test_assert_raises_what_grade_for_gives(evidence: Evidence, reason: Reason) -> None:
    """assert_gradeable_evidence raises with the reason and note grade_for gives a passing run."""
    with pytest.raises(UncheckableClaimError) as info:
        assert_gradeable_evidence(evidence)
    grade = grade_for(evidence, ran("6"))
    assert info.value.reason is reason and grade.reason is reason
    assert info.value.note == grade.note and grade.verdict is Verdict.UNCHECKABLE
    assert info.value.rung == 4


def test_assert_returns_gradeable_evidence_itself() -> None:
    """Gradeable evidence, and anything below rung 4, is returned unchanged."""
    good = ev()
    assert assert_gradeable_evidence(good) is good
    low = Evidence(rung=3)
    assert assert_gradeable_evidence(low) is low


def test_uncheckable_error_round_trips_through_pickle() -> None:
    """The error keeps rung, reason and note across pickling (executors ship it back)."""
    error = UncheckableClaimError(5, "self-certifying", "why")
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.rung, copy.reason, copy.note) == (5, Reason.SELF_CERTIFYING, "why")
    assert "why" in str(copy) and "rung 5" in str(copy)


# --- CheckExecution.from_result -------------------------------------------------------------


def test_from_result_copies_every_field_and_decodes_bytes() -> None:
    """from_result copies each runner flag and decodes byte output as UTF-8 with replacement."""
    result = SimpleNamespace(
        exit_code=124,
        stdout=b"6\xff",
        stderr="err",
        timed_out=True,
        cancelled=False,
        output_truncated=True,
        runner_error=None,
        spawned=True,
        escaped=True,
        term_signal=9,
    )
    execution = CheckExecution.from_result(result)  # type: ignore[arg-type]
    assert execution == CheckExecution(
        exit_code=124,
        stdout="6\ufffd",
        stderr="err",
        timed_out=True,
        output_truncated=True,
        escaped=True,
        term_signal=9,
    )


# --- grade_claims --------------------------------------------------------------------------


def claim(
    cid: str, title: str | None, evidence: Evidence, execution: CheckExecution | None
) -> Claim:
    """A Claim, positionally."""
    return Claim(id=cid, title=title, evidence=evidence, execution=execution)


def test_grade_claims_grades_each_in_input_order() -> None:
    """Each claim is graded as grade_for does, in input order."""
    claims = [
        claim("a", "A", ev(), ran("6")),
        claim("b", "B", ev(), ran("5")),
        claim("c", "C", ev(), None),
        claim("d", "D", ev(check="echo 6"), ran("6")),
    ]
    assert grade_claims(claims) == [grade_for(c.evidence, c.execution) for c in claims]


def test_grade_claims_flags_later_duplicates() -> None:
    """Same check, expectation, normalised title and verdict: later claims point to the first."""
    claims = [
        claim("first", "Six Pareto rows.md", ev(), ran("6")),
        claim("second", "  six   PARETO rows ", ev(check=" grep -c PARETO results.txt "), ran("6")),
        claim("third", "six pareto rows.MD", ev(), ran("6")),
    ]
    grades = grade_claims(claims)
    assert [g.duplicate_of for g in grades] == [None, "first", "first"]
    assert all(g.verdict is Verdict.VERIFIED for g in grades)


def test_grade_claims_flags_a_later_duplicate_that_reuses_the_first_ones_id() -> None:
    """SPEC 3.4: "a later claim ... gets duplicate_of the first one's id", also when the
    later claim carries that same id (a report that numbers its claims twice)."""
    claims = [
        claim("a", "six rows", ev(), ran("6")),
        claim("b", "six rows", ev(), ran("6")),
        claim("a", "six rows", ev(), ran("6")),
    ]
    assert [g.duplicate_of for g in grade_claims(claims)] == [None, "a", "a"]


def test_grade_claims_does_not_flag_different_claims() -> None:
    """A different title, check, expectation or verdict is not a duplicate."""
    claims = [
        claim("a", "six rows", ev(), ran("6")),
        claim("b", "six other rows", ev(), ran("6")),
        claim("c", "six rows", ev(check="grep -c PARETO other.txt"), ran("6")),
        claim("d", "six rows", ev(expect="6 "), ran("6 rows")),
        claim("e", "six rows", ev(), ran("5")),
    ]
    grades = grade_claims(claims)
    assert [g.duplicate_of for g in grades] == [None, None, None, "a", None]
    assert grades[4].verdict is Verdict.CONTRADICTED


def test_grade_claims_never_flags_without_check_or_title() -> None:
    """Claims without a title, or without a check, are never flagged."""
    claims = [
        claim("a", None, ev(), ran("6")),
        claim("b", None, ev(), ran("6")),
        claim("c", "  ", ev(), ran("6")),
        claim("d", "t", ev(check=None, rung=2), None),
        claim("e", "t", ev(check=None, rung=2), None),
    ]
    assert all(g.duplicate_of is None for g in grade_claims(claims))


def test_grade_claims_with_an_executor_gives_the_same_grades() -> None:
    """Grading through a concurrent.futures executor gives the same grades in the same order."""
    claims = [claim(str(i), "t", ev(), ran(str(i % 8))) for i in range(40)]
    with ThreadPoolExecutor(4) as pool:
        assert grade_claims(claims, executor=pool) == grade_claims(claims)


# --- verify_gradeable_evidence through bash and boundedproc --------------------------------


def test_deadline_constant_matches_the_runner() -> None:
    """The deadline status grade_for knows is boundedproc's DEADLINE_EXIT_CODE."""
    from grader._grade import _DEADLINE_EXIT_CODE

    assert _DEADLINE_EXIT_CODE == boundedproc.DEADLINE_EXIT_CODE


def test_importing_grader_does_not_load_the_runner() -> None:
    """`import grader` leaves boundedproc unloaded until a check is run."""
    code = "import sys, grader; print('boundedproc' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """A directory holding results.txt with 6 PARETO rows out of 8."""
    rows = [f"row{i} PARETO" for i in range(6)] + ["row6 dominated", "row7 dominated"]
    (tmp_path / "results.txt").write_text("\n".join(rows) + "\n")
    return tmp_path


def gone(pid: int) -> bool:
    """Whether pid no longer runs (a zombie counts as dead)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, bound: float = 5.0) -> bool:
    """Poll, with a bound, until pid is gone."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


@pytest.fixture
def reap_pids() -> Iterator[list[int]]:
    """Pids a test saw; any still alive at teardown is killed, so a failing test leaks nothing."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_verify_passing_check_reads_a_real_file(results_dir: Path) -> None:
    """A check that counts rows in a real file and prints the expected count is verified."""
    verified = verify_gradeable_evidence(ev("grep -c PARETO results.txt", "6"), cwd=results_dir)
    assert verified.grade == Grade(Verdict.VERIFIED)
    assert verified.execution is not None and verified.execution.exit_code == 0
    assert verified.execution.stdout == "6\n"


def test_verify_contradicting_check_reads_a_real_file(results_dir: Path) -> None:
    """A check that prints another count than the expectation is contradicted."""
    verified = verify_gradeable_evidence(ev("grep -c PARETO results.txt", "7"), cwd=results_dir)
    assert verified.grade == Grade(Verdict.CONTRADICTED)


def test_verify_missing_input_is_unreached(results_dir: Path) -> None:
    """A check whose input file is missing is unrunnable/unreached-input, not contradicted."""
    verified = verify_gradeable_evidence(ev("grep -c PARETO missing.txt", "6"), cwd=results_dir)
    assert (verified.grade.verdict, verified.grade.reason) == (
        Verdict.UNRUNNABLE,
        Reason.UNREACHED_INPUT,
    )


def test_verify_check_reaches_bash_as_one_argument(tmp_path: Path) -> None:
    """Quotes and `$'...'` in a check reach bash verbatim as one argv entry."""
    check = "printf '%s\\n' \"a'b\\\"c\" $'d\\te' | wc -c"
    verified = verify_gradeable_evidence(ev(check, "10"), cwd=tmp_path)
    assert verified.grade == Grade(Verdict.VERIFIED), verified.execution


def test_verify_environment_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check sees only the env given (empty by default), nothing inherited."""
    monkeypatch.setenv("HOME", "/root")
    empty = verify_gradeable_evidence(ev('echo "home=[$HOME]"', "home=[]"), cwd=tmp_path)
    assert empty.grade.verdict is Verdict.VERIFIED
    named = verify_gradeable_evidence(
        ev('echo "g=$GREETING"', "g=hi"), cwd=tmp_path, env={"GREETING": "hi"}
    )
    assert named.grade.verdict is Verdict.VERIFIED


def test_verify_deadline_kills_the_group(tmp_path: Path, reap_pids: list[int]) -> None:
    """A check past its deadline is unrunnable/deadline and its backgrounded child is gone."""
    check = 'sleep 60 & echo "child=$!"; wait; echo "elapsed=$SECONDS"'
    started = time.monotonic()
    verified = verify_gradeable_evidence(ev(check, "elapsed=60"), cwd=tmp_path, timeout=0.5)
    assert time.monotonic() - started < 20
    execution = verified.execution
    assert execution is not None and execution.timed_out and execution.exit_code == 124
    assert (verified.grade.verdict, verified.grade.reason) == (Verdict.UNRUNNABLE, Reason.DEADLINE)
    match = re.search(r"child=(\d+)", execution.stdout)
    assert match, execution
    reap_pids.append(int(match.group(1)))
    assert wait_gone(int(match.group(1)))


def fake_bash(tmp_path: Path, parse_body: str) -> str:
    """A bash stand-in that runs `parse_body` for `-n` and real bash otherwise."""
    real = shutil.which("bash")
    assert real is not None
    script = tmp_path / "fakebash"
    script.write_text(f'#!/bin/sh\nif [ "$1" = -n ]; then {parse_body}; fi\nexec {real} "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_verify_parse_deadline_is_graded_not_raised(tmp_path: Path) -> None:
    """A bash -n parse stopped by its own deadline is unrunnable/deadline, not a syntax error."""
    bash = fake_bash(tmp_path, "exec /bin/sleep 60")
    verified = verify_gradeable_evidence(
        ev("grep -c PARETO results.txt", "6"), cwd=tmp_path, bash=bash, parse_timeout=0.3
    )
    assert (verified.grade.verdict, verified.grade.reason) == (Verdict.UNRUNNABLE, Reason.DEADLINE)
    assert verified.execution is not None and verified.execution.timed_out


def test_verify_parse_and_run_have_separate_budgets(results_dir: Path) -> None:
    """parse_timeout budgets the parse alone: a slow parse within it still lets the check run."""
    bash = fake_bash(results_dir, "/bin/sleep 0.5")
    verified = verify_gradeable_evidence(
        ev("grep -c PARETO results.txt", "6"),
        cwd=results_dir,
        bash=bash,
        timeout=0.3,
        parse_timeout=30,
    )
    assert verified.grade == Grade(Verdict.VERIFIED)


def test_verify_cancel_before_the_call(tmp_path: Path) -> None:
    """A Cancel fired before the call spawns nothing and grades unrunnable/cancelled."""
    cancel = boundedproc.Cancel()
    cancel.cancel()
    verified = verify_gradeable_evidence(ev(), cwd=tmp_path, cancel=cancel)
    assert (verified.grade.verdict, verified.grade.reason) == (Verdict.UNRUNNABLE, Reason.CANCELLED)
    assert verified.execution is not None and not verified.execution.spawned


def test_verify_cancel_mid_run(tmp_path: Path) -> None:
    """A Cancel fired while the check runs ends it promptly as unrunnable/cancelled."""
    cancel = boundedproc.Cancel()
    timer = threading.Timer(0.5, cancel.cancel)
    timer.start()
    try:
        started = time.monotonic()
        verified = verify_gradeable_evidence(
            ev('sleep 30; echo "slept=$((29 + 1))"', "slept=30"), cwd=tmp_path, cancel=cancel
        )
    finally:
        timer.cancel()
    assert time.monotonic() - started < 20
    assert (verified.grade.verdict, verified.grade.reason) == (Verdict.UNRUNNABLE, Reason.CANCELLED)
    assert verified.execution is not None and verified.execution.cancelled


def test_verify_cancel_between_parse_and_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Cancel landing after the parse and before the run is graded, never raised."""
    import grader._verify as verify_module

    cancel = boundedproc.Cancel()
    real_run_bash = verify_module._run_bash
    calls: list[list[str]] = []

    def cancel_after_parse(argv: list[str], **kwargs: Any) -> CheckExecution:
        calls.append(argv)
        execution = real_run_bash(argv, **kwargs)
        cancel.cancel()
        return execution

    monkeypatch.setattr(verify_module, "_run_bash", cancel_after_parse)
    verified = verify_gradeable_evidence(ev(), cwd=tmp_path, cancel=cancel)
    assert [argv[1] for argv in calls] == ["-n", "-c"]
    assert (verified.grade.verdict, verified.grade.reason) == (Verdict.UNRUNNABLE, Reason.CANCELLED)


def test_verify_truncated_output(tmp_path: Path) -> None:
    """A check printing past max_output is unrunnable/output-truncated even if it ends well."""
    check = "head -c 100000 /dev/zero | tr '\\0' x; echo; echo total=$((40 + 2))"
    verified = verify_gradeable_evidence(ev(check, "total=42"), cwd=tmp_path, max_output=1024)
    assert (verified.grade.verdict, verified.grade.reason) == (
        Verdict.UNRUNNABLE,
        Reason.OUTPUT_TRUNCATED,
    )
    assert verified.execution is not None and verified.execution.output_truncated


def test_verify_missing_bash_is_runner_failure(tmp_path: Path) -> None:
    """A missing bash is unrunnable/runner-failure, never reported as a syntax error."""
    verified = verify_gradeable_evidence(ev(), cwd=tmp_path, bash="/no/such/bash")
    assert (verified.grade.verdict, verified.grade.reason) == (
        Verdict.UNRUNNABLE,
        Reason.RUNNER_FAILURE,
    )
    execution = verified.execution
    assert execution is not None and not execution.spawned
    assert (execution.runner_error or "").startswith("spawn failed: ")


@pytest.mark.parametrize("check", ["cat results\ud800.txt", "wc -c < \udfff"])
def test_verify_unencodable_check_is_runner_failure(tmp_path: Path, check: str) -> None:
    """A check holding a lone surrogate (no bytes encode it) is graded runner-failure, not raised."""
    verified = verify_gradeable_evidence(ev(check, "6"), cwd=tmp_path)
    assert (verified.grade.verdict, verified.grade.reason) == (
        Verdict.UNRUNNABLE,
        Reason.RUNNER_FAILURE,
    )
    execution = verified.execution
    assert execution is not None and not execution.spawned
    assert (execution.runner_error or "").startswith("not spawned: ")


def test_verify_surrogate_escaped_bytes_still_reach_bash(tmp_path: Path) -> None:
    """A check holding surrogateescape'd bytes (U+DC80-U+DCFF) runs with those bytes."""
    (tmp_path / os.fsdecode(b"r\xff.txt")).write_bytes(b"PARETO\n" * 3)
    check = os.fsdecode(b"grep -c PARETO r\xff.txt")
    verified = verify_gradeable_evidence(ev(check, "3"), cwd=tmp_path)
    assert verified.grade.verdict is Verdict.VERIFIED


def test_verify_missing_cwd_is_runner_failure(tmp_path: Path) -> None:
    """A working directory that does not exist is unrunnable/runner-failure."""
    verified = verify_gradeable_evidence(ev(), cwd=tmp_path / "absent")
    assert verified.grade.reason is Reason.RUNNER_FAILURE


def test_verify_real_syntax_error_raises(tmp_path: Path) -> None:
    """A check bash -n refuses raises UncheckableClaimError invalid-shell-syntax, bash's words."""
    with pytest.raises(UncheckableClaimError) as info:
        verify_gradeable_evidence(ev("grep -c PARETO results.txt | (", "6"), cwd=tmp_path)
    assert info.value.reason is Reason.INVALID_SHELL_SYNTAX
    assert "syntax error" in info.value.note


@pytest.mark.parametrize("cap", [0, 5])
def test_verify_syntax_error_raises_even_when_its_message_is_cut(tmp_path: Path,
                                                                 cap: int) -> None:
    """SPEC 3.3 step 4: a parse that ran and exited non-zero raises; a bash message longer
    than max_output is still bash's verdict on the grammar (the parse ran to completion),
    not a stopped parse (step 3 lists deadline, cancel and runner failures only)."""
    with pytest.raises(UncheckableClaimError) as info:
        verify_gradeable_evidence(ev("grep -c PARETO results.txt | (", "6"), cwd=tmp_path,
                                  max_output=cap)
    assert info.value.reason is Reason.INVALID_SHELL_SYNTAX
    assert "syntax error" in info.value.note  # the parse keeps bash's words for the note


def test_verify_refuses_before_running_anything(tmp_path: Path) -> None:
    """Refused evidence raises before bash is looked for."""
    with pytest.raises(UncheckableClaimError) as info:
        verify_gradeable_evidence(ev("echo 6"), cwd=tmp_path, bash="/no/such/bash")
    assert info.value.reason is Reason.CONSTANT_EMITTER


def test_verify_below_threshold_without_check_is_not_run(tmp_path: Path) -> None:
    """A claim below rung 4 without a check is returned unrun: unrunnable/not-run."""
    verified = verify_gradeable_evidence(Evidence(rung=2), cwd=tmp_path)
    assert verified.execution is None and verified.grade.reason is Reason.NOT_RUN


def test_verify_runs_checks_concurrently(tmp_path: Path) -> None:
    """Threads verifying at once overlap: four 1 s checks take well under 4 s together."""
    evidence = ev('sleep 1; echo "n=$((1 + 1))"', "n=2")
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        grades = list(
            pool.map(lambda _: verify_gradeable_evidence(evidence, cwd=tmp_path).grade, range(4))
        )
    assert all(g.verdict is Verdict.VERIFIED for g in grades)
    assert time.monotonic() - started < 3.0


def test_verify_in_a_tmpdir_runs_the_check_in_a_fresh_directory() -> None:
    """tmpdir=True: the parse and the check each run in a fresh directory, their cwd and TMPDIR."""
    evidence = Evidence(rung=4, check='test "$PWD" = "$TMPDIR" && ls -A | wc -l', expect="0")
    verified = verify_gradeable_evidence(evidence, cwd=None, tmpdir=True, timeout=20)
    assert verified.grade.verdict is Verdict.VERIFIED, verified


def test_verify_takes_cwd_or_tmpdir_and_none_is_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cwd= and tmpdir=True exclude each other (ValueError); cwd=None without tmpdir is this
    process's current directory, as with run() (it was a ValueError)."""
    evidence = Evidence(rung=4, check="echo $((6*7))", expect="42")
    with pytest.raises(ValueError, match="tmpdir"):
        verify_gradeable_evidence(evidence, cwd=tmp_path, tmpdir=True)
    (tmp_path / "here.txt").write_text("42\n")
    monkeypatch.chdir(tmp_path)
    here = Evidence(rung=4, check="cat here.txt", expect="42")
    verified = verify_gradeable_evidence(here, cwd=None, timeout=20)
    assert verified.grade.verdict is Verdict.VERIFIED, verified


def test_verify_with_an_unknown_user_is_unrunnable(tmp_path: Path) -> None:
    """A user= this machine does not have grades unrunnable/runner-failure, not contradicted."""
    evidence = Evidence(rung=4, check="echo $((6*7))", expect="42")
    verified = verify_gradeable_evidence(evidence, cwd=tmp_path, user="bp-no-such-user-0")
    assert (verified.grade.verdict, verified.grade.reason) == (
        Verdict.UNRUNNABLE, Reason.RUNNER_FAILURE)
