"""A claim grader: a verdict lattice over the structured results of ``boundedproc.run``.

A claim records evidence: a rung (1 to 5) and, from ``CHECKABLE_RUNG_THRESHOLD`` up, a bash
``check`` and the single-line value ``expect`` it must print. ``grade_for`` judges one execution
of a check; ``verify_gradeable_evidence`` parses, runs and grades a check with ``boundedproc``;
``grade_claims`` grades a pass of claims and flags repeats. ``python -m grader CLAIMS.jsonl``
grades a file of claims.

Runner-side conditions (deadline, cancel, spawn failure, truncation, escape, resource limits)
are read from fields, never from text, so an environment failure is never graded as a
refutation of the claim.
"""

from ._grade import (
    CHECKABLE_RUNG_THRESHOLD,
    UNRUNNABLE_SIGNATURES,
    CheckExecution,
    Claim,
    Evidence,
    Grade,
    Reason,
    UncheckableClaimError,
    Verdict,
    VerifiedEvidence,
    assert_gradeable_evidence,
    grade_claims,
    grade_for,
    verdict_for,
)
from ._verify import verify_gradeable_evidence

__all__ = [
    "CHECKABLE_RUNG_THRESHOLD",
    "UNRUNNABLE_SIGNATURES",
    "CheckExecution",
    "Claim",
    "Evidence",
    "Grade",
    "Reason",
    "UncheckableClaimError",
    "Verdict",
    "VerifiedEvidence",
    "assert_gradeable_evidence",
    "grade_claims",
    "grade_for",
    "verdict_for",
    "verify_gradeable_evidence",
]
