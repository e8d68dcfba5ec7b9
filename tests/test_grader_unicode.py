"""Tests of the grader on non-ASCII text: upstream's word characters, whitespace and case folding.

The model below is written from the three rules of issue 16, not from upstream's code: word
characters are ASCII ``[A-Za-z0-9_]``; whitespace is ECMAScript's (the Unicode space separators
Zs, U+0009-U+000D, U+2028, U+2029 and U+FEFF; never U+0085, U+001C-U+001F or U+180E); the
signatures fold case on ASCII letters only.
"""

from __future__ import annotations

import unicodedata

from conftest import SPEC_SIGNATURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grader import (
    CheckExecution,
    Claim,
    Evidence,
    Reason,
    Verdict,
    grade_claims,
    grade_for,
)

PROFILE = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def ran(stdout: str = "", stderr: str = "", exit_code: int = 0) -> CheckExecution:
    """A hand-built execution of a check."""
    return CheckExecution(exit_code=exit_code, stdout=stdout, stderr=stderr)


# --- the model of upstream's rules ----------------------------------------------------------

# ECMAScript's WhiteSpace and LineTerminator, derived from the Unicode database rather than
# listed, so the model does not share the grader's literal.
MODEL_SPACE = frozenset(
    [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) == "Zs"]
    + ["\t", "\n", "\v", "\f", "\r", "\u2028", "\u2029", "\ufeff"]
)

def model_trim(text: str) -> str:
    """JavaScript's ``String.prototype.trim``."""
    start, end = 0, len(text)
    while start < end and text[start] in MODEL_SPACE:
        start += 1
    while end > start and text[end - 1] in MODEL_SPACE:
        end -= 1
    return text[start:end]


def model_first_word(text: str) -> tuple[str, str]:
    """The text up to its first whitespace character, and what follows that character."""
    for at, char in enumerate(text):
        if char in MODEL_SPACE:
            return text[:at], text[at + 1 :]
    return text, ""


def model_words(text: str) -> list[str]:
    """The non-empty runs of non-whitespace, in order."""
    words, current = [], ""
    for char in text:
        if char in MODEL_SPACE:
            if current:
                words.append(current)
            current = ""
        else:
            current += char
    if current:
        words.append(current)
    return words


def model_is_word(char: str) -> bool:
    """A JavaScript ``\\w`` without the ``u`` flag."""
    return char == "_" or ("a" <= char <= "z") or ("A" <= char <= "Z") or ("0" <= char <= "9")


def model_ascii_lower(text: str) -> str:
    """Lowercase A-Z and nothing else, as a ``/i`` without ``u`` compares letters."""
    return "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in text)


def model_signature(text: str | None) -> bool:
    """Whether the text holds a signature, ASCII case ignored."""
    if text is None:
        return False
    folded = model_ascii_lower(text)
    return any(model_ascii_lower(token) in folded for token in SPEC_SIGNATURES)


def model_constant_emitter(check: str) -> bool:
    """``true``, ``:``, or an echo/printf whose arguments read nothing."""
    command = model_trim(check)
    if command in ("true", ":"):
        return True
    head, _ = model_first_word(command)
    if head not in ("echo", "printf"):
        return False
    arguments = command[len(head):]  # with the character that ends the first word
    for at, char in enumerate(arguments):
        if char in "|;&\n<`":
            return False
        if char == "$" and arguments[at + 1 : at + 2] not in ("'", '"'):
            return False
    return True


def model_self_certifying(check: str, expect: str | None) -> bool:
    """Some occurrence of the trimmed expectation has no word character glued to a word edge."""
    wanted = model_trim(expect or "")
    if not wanted:
        return False
    size = len(wanted)
    for at in range(len(check) - size + 1):
        if check[at : at + size] != wanted:
            continue
        before = check[at - 1] if at > 0 else ""
        after = check[at + size] if at + size < len(check) else ""
        if model_is_word(wanted[0]) and before and model_is_word(before):
            continue
        if model_is_word(wanted[-1]) and after and model_is_word(after):
            continue
        return True
    return False


def model_refutation(output: str, expect: str | None) -> tuple[Verdict, Reason | None]:
    """Steps 7 and 9's refutation: contradicted unless the output never reached its input."""
    if model_signature(expect):
        return Verdict.CONTRADICTED, None
    if model_signature(output):
        return Verdict.UNRUNNABLE, Reason.UNREACHED_INPUT
    return Verdict.CONTRADICTED, None


def model_grade(evidence: Evidence, execution: CheckExecution) -> tuple[Verdict, Reason | None]:
    """SPEC 3.2 for a plain execution (no runner flags, exit status other than 124)."""
    check, expect = evidence.check, evidence.expect
    checkable = evidence.rung >= 4
    if checkable:
        if check is None or model_trim(check) == "":
            return Verdict.UNCHECKABLE, Reason.NO_CHECK
        if model_constant_emitter(check):
            return Verdict.UNCHECKABLE, Reason.CONSTANT_EMITTER
        if len(model_first_word(model_trim(check))[0]) > 200:
            return Verdict.UNCHECKABLE, Reason.LONG_FIRST_WORD
        if model_self_certifying(check, expect):
            return Verdict.UNCHECKABLE, Reason.SELF_CERTIFYING
    output = model_trim(execution.stdout + "\n" + execution.stderr)
    if execution.exit_code != 0:
        if model_signature(expect):
            return Verdict.CONTRADICTED, None
        if model_signature(output):
            return Verdict.UNRUNNABLE, Reason.UNREACHED_INPUT
        if expect is not None and model_trim(expect) != "" and expect in output:
            return Verdict.VERIFIED, None
        return Verdict.CONTRADICTED, None
    if checkable:
        if expect is None or model_trim(expect) == "":
            return Verdict.UNCHECKABLE, Reason.NO_EXPECTATION
        if "\n" in expect or "\r" in expect:
            return Verdict.UNCHECKABLE, Reason.MULTILINE_EXPECTATION
    if expect is not None and expect not in output:
        if output == "":
            return Verdict.SILENT_CHECK, None
        return model_refutation(output, expect)
    return Verdict.VERIFIED, None


def model_key(evidence: Evidence, title: str | None) -> tuple[str, str, str] | None:
    """Trimmed check, trimmed expectation, and the title trimmed, collapsed, lowered, no .md."""
    check = model_trim(evidence.check or "")
    normalised = " ".join(model_words(title or "")).lower()
    normalised = normalised.removesuffix(".md")
    if not check or not normalised:
        return None
    return check, model_trim(evidence.expect or ""), normalised


def model_duplicates(claims: list[Claim]) -> list[str | None]:
    """The id of the first earlier claim with the same key and verdict, for each claim."""
    first: dict[tuple[tuple[str, str, str], Verdict], str] = {}
    flags: list[str | None] = []
    for claim in claims:
        key = model_key(claim.evidence, claim.title)
        assert claim.execution is not None
        if key is None:
            flags.append(None)
            continue
        verdict = model_grade(claim.evidence, claim.execution)[0]
        seen = first.setdefault((key, verdict), claim.id)
        flags.append(None if seen == claim.id else seen)
    return flags


def test_model_whitespace_is_ecmascripts() -> None:
    """The model's whitespace is the ECMAScript set: U+FEFF in, U+0085, U+180E and U+001C out."""
    assert "\ufeff" in MODEL_SPACE and "\u3000" in MODEL_SPACE and "\u2029" in MODEL_SPACE
    assert not {"\u0085", "\u180e", "\x1c", "\x1f", "\u200b"} & MODEL_SPACE
    assert len(MODEL_SPACE) == 25


# --- the examples ---------------------------------------------------------------------


def test_arabic_indic_digit_beside_expect_is_not_a_word_character() -> None:
    """`cat x\\u0663` with expect `x` is self-certifying: U+0663 is no word character."""
    grade = grade_for(Evidence(4, check="cat x\u0663", expect="x"), ran("x"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.SELF_CERTIFYING)


def test_accented_expect_edge_is_not_a_word_character() -> None:
    """Expect `\\u00e9` in `./run =\\u00e9_` is self-certifying: the `_` after it glues to nothing."""
    grade = grade_for(Evidence(4, check="./run =\u00e9_", expect="\u00e9"), ran("\u00e9"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.SELF_CERTIFYING)


def test_byte_order_mark_is_trimmed_so_true_is_a_constant_emitter() -> None:
    """`\\ufefftrue` trims to `true`: a constant emitter."""
    grade = grade_for(Evidence(4, check="\ufefftrue", expect="ok"), ran("ok"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.CONSTANT_EMITTER)


def test_next_line_is_not_trimmed_so_true_is_not_a_constant_emitter() -> None:
    """`true\\u0085` keeps its U+0085 (no JavaScript whitespace): not a constant emitter."""
    grade = grade_for(Evidence(4, check="true\u0085", expect="ok"), ran("ok"))
    assert (grade.verdict, grade.reason) == (Verdict.VERIFIED, None)


def test_long_s_does_not_fold_onto_s_in_the_signatures() -> None:
    """Output `8No \\u017fuch file` with exit 1 names no signature: contradicted."""
    grade = grade_for(Evidence(4, check="./count", expect="7"), ran("8No \u017fuch file", "", 1))
    assert (grade.verdict, grade.reason) == (Verdict.CONTRADICTED, None)


# --- more of the same rules, one named case each ------------------------------------------------


def test_kelvin_sign_does_not_fold_onto_k_in_the_signatures() -> None:
    """Output with U+212A for `k` in `token` names no signature: contradicted."""
    output = "syntax error near unexpected to\u212aen"
    grade = grade_for(Evidence(4, check="./count", expect="7"), ran("", output, 2))
    assert (grade.verdict, grade.reason) == (Verdict.CONTRADICTED, None)


def test_ascii_case_still_folds_in_the_signatures() -> None:
    """`NO SUCH FILE` still matches `No such file` (ASCII letters fold)."""
    grade = grade_for(Evidence(4, check="./count", expect="7"), ran("NO SUCH FILE", "", 1))
    assert (grade.verdict, grade.reason) == (Verdict.UNRUNNABLE, Reason.UNREACHED_INPUT)


def test_expect_with_long_s_is_no_signature() -> None:
    """An expectation `No \\u017fuch file` names no signature, so the refusal control verifies."""
    execution = ran("", "No \u017fuch file", 1)
    grade = grade_for(Evidence(4, check="./count", expect="No \u017fuch file"), execution)
    assert (grade.verdict, grade.reason) == (Verdict.VERIFIED, None)


def test_output_of_only_a_byte_order_mark_is_silent() -> None:
    """Stdout `\\ufeff` trims to nothing: a silent check."""
    grade = grade_for(Evidence(4, check="./count", expect="7"), ran("\ufeff"))
    assert grade.verdict is Verdict.SILENT_CHECK


def test_output_of_only_a_next_line_is_not_silent() -> None:
    """Stdout `\\u0085` is not whitespace, so the output is not empty: contradicted."""
    grade = grade_for(Evidence(4, check="./count", expect="7"), ran("\u0085"))
    assert (grade.verdict, grade.reason) == (Verdict.CONTRADICTED, None)


def test_check_of_only_a_byte_order_mark_is_blank() -> None:
    """A check of U+FEFF and U+3000 around a space is blank: no check."""
    grade = grade_for(Evidence(4, check="\ufeff \u3000", expect="7"), ran("7"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.NO_CHECK)


def test_expect_of_only_a_byte_order_mark_is_blank() -> None:
    """An expectation `\\ufeff` is blank: no expectation."""
    grade = grade_for(Evidence(4, check="./count", expect="\ufeff"), ran("\ufeff7"))
    assert (grade.verdict, grade.reason) == (Verdict.UNCHECKABLE, Reason.NO_EXPECTATION)


def test_echo_split_at_no_break_space_but_not_at_mongolian_vowel_separator() -> None:
    """`echo\\u00a0hi` is a constant emitter; `echo\\u180ehi` is one word, not `echo`."""
    refused = grade_for(Evidence(4, check="echo\u00a0hi", expect="7"), ran("7"))
    kept = grade_for(Evidence(4, check="echo\u180ehi", expect="7"), ran("7"))
    assert refused.reason is Reason.CONSTANT_EMITTER
    assert (kept.verdict, kept.reason) == (Verdict.VERIFIED, None)


def test_first_word_ends_at_ideographic_space_not_at_next_line() -> None:
    """A 201-character run ending at U+3000 is a long first word; one broken by U+0085 too."""
    short = grade_for(Evidence(4, check="a" * 200 + "\u3000b", expect="7"), ran("7"))
    long_ = grade_for(Evidence(4, check="a" * 100 + "\u0085" + "a" * 100, expect="7"), ran("7"))
    assert (short.verdict, short.reason) == (Verdict.VERIFIED, None)
    assert long_.reason is Reason.LONG_FIRST_WORD


def _claim(claim_id: str, title: str, check: str = "./count") -> Claim:
    return Claim(claim_id, title, Evidence(4, check=check, expect="7"), ran("7"))


def test_titles_collapse_byte_order_mark_and_ideographic_space() -> None:
    """Titles differing by U+FEFF, U+3000 and U+2028 runs are duplicates."""
    grades = grade_claims(
        [_claim("a", "Counts  PARETO.md"), _claim("b", "\ufeffcounts\u3000\u2028pareto.md\ufeff")]
    )
    assert [grade.duplicate_of for grade in grades] == [None, "a"]


def test_titles_do_not_collapse_next_line() -> None:
    """A title with U+0085 where another has a space is a different title: not a duplicate."""
    grades = grade_claims([_claim("a", "counts pareto"), _claim("b", "counts\u0085pareto")])
    assert [grade.duplicate_of for grade in grades] == [None, None]


def test_check_keys_trim_byte_order_mark_but_not_next_line() -> None:
    """Checks that differ by a trailing U+FEFF are one check; by a trailing U+0085, two."""
    grades = grade_claims(
        [
            _claim("a", "t", "./count"),
            _claim("b", "t", "./count\ufeff"),
            _claim("c", "t", "./count\u0085"),
        ]
    )
    assert [grade.duplicate_of for grade in grades] == [None, "a", None]


# --- properties: grade_for and grade_claims agree with the model --------------------------------

# Whitespace to one of JavaScript and Python or to neither (U+180E, U+200B), and ASCII's own.
SPACES = (
    "\u0085\u00a0\u1680\u180e"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000\ufeff\x1c\x1f\u200b \t\n"
)
LETTERS = (
    "\u017f\u212a"  # long s, Kelvin sign
    + "\u0660\u0663\u0669"  # Arabic-Indic digits
    + "\u00e9\u00c9\u00fc\u00f1"  # accented letters
    + "aeksxAESK06_\r.=|;&<$'\"`-/"
)

spaces = st.text(st.sampled_from(SPACES), max_size=3)
mixed = st.text(st.sampled_from(SPACES + LETTERS), max_size=12)


@st.composite
def signatures(draw: st.DrawFn) -> str:
    """A signature token, its letters in random case, some s/k swapped for U+017F/U+212A."""
    token = draw(st.sampled_from(SPEC_SIGNATURES))
    out = []
    for char in token:
        choice = draw(st.integers(0, 5))
        if char.lower() == "s" and choice == 0:
            out.append("\u017f")
        elif char.lower() == "k" and choice == 0:
            out.append("\u212a")
        elif choice == 1:
            out.append(char.swapcase())
        else:
            out.append(char)
    return "".join(out)


@st.composite
def checks(draw: st.DrawFn) -> str:
    """Checks around the shapes the rules tell apart: emitters, long words, plain commands."""
    head = draw(st.sampled_from(["true", ":", "echo", "printf", "cat", "./run", "grep -c"]))
    if draw(st.booleans()):
        head = draw(st.sampled_from(["a", "\u00e9", "\u0663"])) * draw(st.integers(195, 205))
    tail = draw(st.one_of(st.just(""), mixed))
    return draw(spaces) + head + draw(spaces) + tail + draw(spaces)


@st.composite
def cases(draw: st.DrawFn) -> tuple[Evidence, CheckExecution]:
    """Evidence and an execution whose texts mix ASCII with the characters the rules split on."""
    check = draw(st.one_of(checks(), mixed, st.none()))
    expect = draw(
        st.one_of(
            st.none(),
            mixed,
            signatures(),
            # A piece of the check, so occurrences and their neighbours are tried often.
            st.builds(lambda text, a, b: text[a : a + b], st.just(check or ""), st.integers(0, 15),
                      st.integers(1, 4)),
        )
    )
    if expect is not None and draw(st.booleans()):
        expect = draw(spaces) + expect + draw(spaces)
    stdout = draw(st.one_of(mixed, st.just(expect or ""), signatures(), spaces))
    if draw(st.booleans()):
        stdout = draw(spaces) + stdout + draw(spaces)
    stderr = draw(st.one_of(st.just(""), spaces, signatures(), mixed))
    exit_code = draw(st.sampled_from([0, 0, 1, 2]))
    rung = draw(st.integers(1, 5))
    return Evidence(rung, check=check, expect=expect), ran(stdout, stderr, exit_code)


@PROFILE
@given(cases())
def test_grade_for_matches_the_model(case: tuple[Evidence, CheckExecution]) -> None:
    """`grade_for`'s verdict and reason equal the model's on text mixing ASCII and non-ASCII."""
    evidence, execution = case
    grade = grade_for(evidence, execution)
    assert (grade.verdict, grade.reason) == model_grade(evidence, execution)


@PROFILE
@given(st.lists(st.tuples(st.sampled_from(["a b", "a.md", "x"]), spaces, spaces, spaces,
                          st.sampled_from(["./c", "./d"]), spaces, st.booleans()),
                max_size=8))
def test_grade_claims_duplicates_match_the_model(
    shapes: list[tuple[str, str, str, str, str, str, bool]],
) -> None:
    """The duplicate flags of `grade_claims` equal the model's when only whitespace differs."""
    claims = []
    for number, (title, lead, inner, tail, check, pad, upper) in enumerate(shapes):
        text = lead + title.replace(" ", inner or " ").replace(".", inner + ".") + tail
        text = text.upper() if upper else text
        evidence = Evidence(4, check=pad + check + pad, expect="7")
        claims.append(Claim(f"c{number}", text, evidence, ran("7")))
    assert [grade.duplicate_of for grade in grade_claims(claims)] == model_duplicates(claims)
