"""Tests of `python -m grader`: parsing claims files, output lines, summary, exit status."""

from __future__ import annotations

import importlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import as_nobody, importable_env, python_module_argv, wait_for

import boundedproc
import grader._cli as cli
import grader._executor as executors
from grader import (
    CheckExecution,
    Evidence,
    Grade,
    Reason,
    UncheckableClaimError,
    Verdict,
    VerifiedEvidence,
)

REPO = Path(__file__).resolve().parent.parent
OUTPUT_KEYS = {"id", "verdict", "reason", "note", "duplicate_of", "exit_code", "duration"}


def write_claims(directory: Path, *lines: object, name: str = "claims.jsonl") -> Path:
    """Write claims (dicts as JSON, strings verbatim) one per line; return the file."""
    path = directory / name
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def claim(
    cid: str, check: str = "grep -c PARETO results.txt", expect: str = "6", **extra: Any
) -> dict[str, Any]:
    """A claim object as a claims file holds it (rung 4 unless overridden)."""
    return {"id": cid, "title": f"claim {cid}", "rung": 4, "check": check, "expect": expect} | extra


def output_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of the grader's output."""
    return [json.loads(line) for line in text.splitlines()]


class FakeVerify:
    """Stands in for verify_gradeable_evidence: grades by the check text, records its calls."""

    def __init__(self, delays: dict[str, float] | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.delays = delays or {}
        self.lock = threading.Lock()

    def __call__(self, evidence: Evidence, **kwargs: Any) -> VerifiedEvidence:
        with self.lock:
            self.calls.append({"check": evidence.check, **kwargs})
        time.sleep(self.delays.get(evidence.check or "", 0.0))
        check = evidence.check or ""
        if check.startswith("bad"):
            raise UncheckableClaimError(4, Reason.INVALID_SHELL_SYNTAX, "bash said no")
        if check.startswith("contra"):
            execution = CheckExecution(1, "", "")
            return VerifiedEvidence(evidence, execution, Grade(Verdict.CONTRADICTED))
        execution = CheckExecution(0, "6\n", "")
        return VerifiedEvidence(evidence, execution, Grade(Verdict.VERIFIED))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeVerify:
    """Replace the real verification in the command line with FakeVerify."""
    stand_in = FakeVerify()
    monkeypatch.setattr(cli, "verify_gradeable_evidence", stand_in)
    return stand_in


# --- parsing -------------------------------------------------------------------------------


def test_parse_claims_reads_well_formed_lines() -> None:
    """Claims are read in order with their line numbers; blank lines and unknown keys ignored."""
    lines = [
        json.dumps(claim("a", path="x.md")).encode(),
        b"   ",
        json.dumps({"id": "b", "rung": 2}).encode() + b"\r\n",
    ]
    claims, errors = cli.parse_claims(lines)
    assert errors == []
    assert [(c.line, c.id, c.title) for c in claims] == [(1, "a", "claim a"), (3, "b", None)]
    assert claims[0].evidence == Evidence(4, "grep -c PARETO results.txt", "6")
    assert claims[1].evidence == Evidence(2)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"rung": 4}', "'id' must be a non-empty string or an integer"),
        (b'{"id": "", "rung": 4}', "'id' must be a non-empty string or an integer"),
        (b'{"id": 7.5, "rung": 4}', "'id' must be a non-empty string or an integer"),
        (b'{"id": true, "rung": 4}', "'id' must be a non-empty string or an integer"),
        (b'{"id": ["a"], "rung": 4}', "'id' must be a non-empty string or an integer"),
        (b'{"id": "x"}', "'rung' must be an integer from 1 to 5"),
        (b'{"id": "x", "rung": "4"}', "'rung' must be an integer from 1 to 5"),
        (b'{"id": "x", "rung": 7}', "'rung' must be an integer from 1 to 5"),
        (b'{"id": "x", "rung": true}', "'rung' must be an integer from 1 to 5"),
        (b'{"id": "x", "rung": 4, "title": 3}', "'title' must be a string or null"),
        (b'{"id": "x", "rung": 4, "check": ["ls"]}', "'check' must be a string or null"),
        (b'{"id": "x", "rung": 4, "expect": 6}', "'expect' must be a string or null"),
        (b'{"id": "x\xff", "rung": 4}', "not valid UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"id": "x", "rung": 4, "notes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
         "nested too deeply"),
    ],
)
def test_parse_claims_reports_malformed_lines(line: bytes, message: str) -> None:
    """A malformed line is reported as `line N: ...` and the lines around it are still read."""
    good = json.dumps(claim("ok")).encode()
    claims, errors = cli.parse_claims([good, line, good.replace(b'"ok"', b'"ok2"')])
    assert [c.id for c in claims] == ["ok", "ok2"]
    assert len(errors) == 1 and errors[0].startswith("line 2: ") and message in errors[0]


def test_lines_end_at_newline_only(tmp_path: Path, fake: FakeVerify, capsys: Any) -> None:
    """A raw CR inside a JSON line is JSON whitespace: the claim is read and line numbers hold."""
    path = tmp_path / "claims.jsonl"
    path.write_bytes(b'{"id": "a",\r "rung": 2}\nnot json\r\n{"id": "b",\r"rung": 2}\n')
    assert cli.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert [line["id"] for line in output_lines(captured.out)] == ["a", "b"]
    assert [line for line in captured.err.splitlines() if line.startswith("line ")] == [
        "line 2: not valid JSON (Expecting value at column 1)"
    ]
    graded = cli.grade_file(path)
    assert [outcome.id for outcome in graded.outcomes] == ["a", "b"]
    assert graded.errors == ["line 2: not valid JSON (Expecting value at column 1)"]


def test_json_python_cannot_hold_is_a_malformed_line() -> None:
    """A 5,000-digit rung (a ValueError from json on Python with a digit limit) is line 2's error."""
    good = json.dumps(claim("ok")).encode()
    huge = b'{"id": "x", "rung": ' + b"9" * 5000 + b"}"
    claims, errors = cli.parse_claims([good, huge, good.replace(b'"ok"', b'"ok2"')])
    assert [c.id for c in claims] == ["ok", "ok2"]
    assert len(errors) == 1 and errors[0].startswith("line 2: ")


def test_parse_claims_rejects_a_repeated_id() -> None:
    """A second claim with an id already used is malformed and names the first line."""
    line = json.dumps(claim("dup")).encode()
    claims, errors = cli.parse_claims([line, line])
    assert len(claims) == 1 and errors == ["line 2: id 'dup' is already used on line 1"]


# --- the command line with verification stood in -------------------------------------------


def test_output_lines_and_exit_zero(tmp_path: Path, fake: FakeVerify, capsys: Any) -> None:
    """One JSON line per claim with exactly the spec's keys, in input order; exit 0."""
    path = write_claims(tmp_path, claim("a"), claim("b", check="grep -c x other.txt"))
    assert cli.main([str(path), "--jobs", "2"]) == 0
    lines = output_lines(capsys.readouterr().out)
    assert [line["id"] for line in lines] == ["a", "b"]
    assert all(set(line) == OUTPUT_KEYS for line in lines)
    assert lines[0] | {"duration": 0} == {
        "id": "a",
        "verdict": "verified",
        "reason": None,
        "note": None,
        "duplicate_of": None,
        "exit_code": 0,
        "duration": 0,
    }
    assert isinstance(lines[0]["duration"], float)


def test_exit_one_when_a_claim_is_contradicted(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """A contradicted claim makes the exit status 1."""
    path = write_claims(tmp_path, claim("a"), claim("c", check="contra"))
    assert cli.main([str(path)]) == 1
    assert [line["verdict"] for line in output_lines(capsys.readouterr().out)] == [
        "verified",
        "contradicted",
    ]


def test_malformed_line_exits_two_and_grades_the_rest(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """A malformed line is reported with its number, the others are graded, exit status 2."""
    path = write_claims(tmp_path, claim("a"), "{oops", claim("c", check="contra"))
    assert cli.main([str(path)]) == 2
    captured = capsys.readouterr()
    assert [line["id"] for line in output_lines(captured.out)] == ["a", "c"]
    assert "line 2: not valid JSON" in captured.err
    assert "malformed lines" in captured.err


def test_refused_claim_is_an_uncheckable_line(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """A claim whose verification raises UncheckableClaimError is reported uncheckable."""
    path = write_claims(tmp_path, claim("s", check="bad syntax ("))
    assert cli.main([str(path)]) == 0
    (line,) = output_lines(capsys.readouterr().out)
    assert (line["verdict"], line["reason"], line["note"], line["exit_code"]) == (
        "uncheckable",
        "invalid-shell-syntax",
        "bash said no",
        None,
    )


def test_duplicates_are_flagged_in_the_output(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """A later claim with the same check, expectation and title points to the first one."""
    first = claim("a", title="Six rows.md")
    again = claim("b", title="  six ROWS ")
    other = claim("c", title="Seven rows")
    path = write_claims(tmp_path, first, again, other)
    cli.main([str(path)])
    lines = output_lines(capsys.readouterr().out)
    assert [line["duplicate_of"] for line in lines] == [None, "a", None]


def test_integer_ids_are_graded_and_echoed_as_given(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """A claims file may number its claims (`"id": 7`): they are graded, and the output's id
    and duplicate_of are the same integers (they were malformed lines, exit 2); 7 and "7" are
    two ids, and an integer repeated is refused as a repeated string is."""
    first = {**claim("x", title="Six rows"), "id": 7}
    again = {**claim("x", title="six rows"), "id": 8}
    text = {**claim("x", title="Seven rows"), "id": "7"}
    path = write_claims(tmp_path, first, again, text)
    assert cli.main([str(path)]) == 0
    lines = output_lines(capsys.readouterr().out)
    assert [(line["id"], line["duplicate_of"]) for line in lines] == [(7, None), (8, 7), ("7", None)]
    _, errors = cli.parse_claims([json.dumps(first).encode(), json.dumps(first).encode()])
    assert errors == ["line 2: id 7 is already used on line 1"]


def test_lone_surrogates_never_crash_the_output(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """An id with a lone surrogate (valid JSON) is written escaped, to --out and to stdout."""
    line = '{"id": "s\\udcff\\ud800", "rung": 4, "check": "grep x f", "expect": "6"}'
    path = write_claims(tmp_path, line, claim("b"))
    out = tmp_path / "grades.jsonl"
    assert cli.main([str(path), "--out", str(out)]) == 0
    written = out.read_bytes().decode("utf-8")  # strict: nothing unencodable got through
    assert [item["id"] for item in output_lines(written)] == ["s\udcff\ud800", "b"]
    assert cli.main([str(path)]) == 0
    printed = capsys.readouterr().out
    printed.encode("utf-8")  # strict: raises if a lone surrogate reached stdout
    assert [item["id"] for item in output_lines(printed)] == ["s\udcff\ud800", "b"]
    readable = cli.outcome_json(cli.ClaimOutcome("caf\u00e9", Grade(Verdict.VERIFIED), 0, 0.0))
    assert '"caf\u00e9"' in readable  # text that encodes stays as it is


def test_summary_table_on_stderr(tmp_path: Path, fake: FakeVerify, capsys: Any) -> None:
    """The summary counts claims per verdict and gives the total and the time, on stderr."""
    path = write_claims(tmp_path, claim("a"), claim("b", check="contra"), claim("c", check="ok"))
    cli.main([str(path)])
    err = capsys.readouterr().err
    rows = {
        line.split()[0]: line.split()[-1] for line in err.splitlines() if line and line[0] != " "
    }
    assert rows["verified"] == "2" and rows["contradicted"] == "1"
    assert rows["silent-check"] == rows["unrunnable"] == rows["uncheckable"] == "0"
    assert rows["total"] == "3"
    assert "graded in" in err


def test_out_writes_the_file_not_stdout(tmp_path: Path, fake: FakeVerify, capsys: Any) -> None:
    """--out FILE receives the JSON lines and stdout stays empty."""
    path = write_claims(tmp_path, claim("a"))
    out = tmp_path / "grades.jsonl"
    assert cli.main([str(path), "--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert [line["id"] for line in output_lines(out.read_text())] == ["a"]


def test_cwd_defaults_to_the_claims_directory(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checks run in the claims file's directory unless --cwd names another; --timeout passes."""
    sub = tmp_path / "claims"
    sub.mkdir()
    path = write_claims(sub, claim("a"))
    monkeypatch.chdir(tmp_path)
    cli.main([os.path.relpath(path), "--timeout", "2.5"])
    cli.main([str(path), "--cwd", str(tmp_path)])
    assert [(Path(c["cwd"]), c["timeout"]) for c in fake.calls] == [
        (sub.resolve(), 2.5),
        (tmp_path.resolve(), cli.DEFAULT_TIMEOUT),
    ]


def test_output_keeps_input_order_whatever_finishes_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """With several jobs, lines come out in input order even when later claims finish first."""
    checks = [f"grep -c x f{i}.txt" for i in range(6)]
    stand_in = FakeVerify({check: 0.05 * (6 - i) for i, check in enumerate(checks)})
    monkeypatch.setattr(cli, "verify_gradeable_evidence", stand_in)
    path = write_claims(tmp_path, *(claim(str(i), check=c) for i, c in enumerate(checks)))
    assert cli.main([str(path), "--jobs", "6"]) == 0
    assert [line["id"] for line in output_lines(capsys.readouterr().out)] == list("012345")


@pytest.mark.parametrize(
    "argv",
    [
        ["--jobs", "0"],
        ["--jobs", "two"],
        ["--timeout", "-1"],
        ["--timeout", "nan"],
        ["--executor", "threads"],
        ["--executor", "dask://127.0.0.1"],
        ["--connect-timeout", "0"],
        ["--user", ""],
        ["--user", "4294967295"],  # (uid_t)-1: "unchanged" to the kernel, so root stayed root
        ["--user", "4294967296"],  # wraps to 0
        [],
    ],
)
def test_bad_arguments_exit_two(tmp_path: Path, argv: list[str], capsys: Any) -> None:
    """Invalid options, or no claims file, are usage errors: exit status 2."""
    path = write_claims(tmp_path, claim("a"))
    with pytest.raises(SystemExit) as info:
        cli.main(([str(path)] if argv else []) + argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_unreadable_file_or_cwd_exits_two(tmp_path: Path, fake: FakeVerify, capsys: Any) -> None:
    """A claims file that cannot be read, or a --cwd that is not a directory, exits 2."""
    assert cli.main([str(tmp_path / "absent.jsonl")]) == 2
    path = write_claims(tmp_path, claim("a"))
    assert cli.main([str(path), "--cwd", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot read" in err and "not a directory" in err
    assert fake.calls == []


def test_claims_from_stdin_run_in_the_current_directory(tmp_path: Path) -> None:
    """`python -m grader -` reads the claims from stdin; the checks run in the current
    directory (there is no claims file to take one from), and a closed stdin exits 2."""
    (tmp_path / "results.txt").write_text("PARETO\n" * 6)
    line = json.dumps(claim("a", check="grep -c PARETO results.txt", expect="6"))
    p = subprocess.run(python_module_argv("grader", "-"), input=f"{line}\n".encode(),
                       capture_output=True, cwd=tmp_path, env=importable_env(), timeout=120,
                       check=False)
    assert p.returncode == 0, p.stderr
    (grade,) = output_lines(p.stdout.decode())
    assert grade["id"] == "a" and grade["verdict"] == "verified", grade
    p = subprocess.run(python_module_argv("grader", "-"), stdin=subprocess.DEVNULL,
                       capture_output=True, cwd=tmp_path, env=importable_env(), timeout=120,
                       check=False)
    assert p.returncode == 0 and p.stdout == b"", p.stderr  # no claims: none contradicted
    assert b"grader: no claims in -" in p.stderr
    close_0 = "import os, sys; os.close(0); os.execv(sys.argv[1], sys.argv[1:])"
    closed = [sys.executable, "-c", close_0, *python_module_argv("grader", "-")]
    p = subprocess.run(closed, capture_output=True, cwd=tmp_path, env=importable_env(),
                       timeout=120, check=False)
    assert p.returncode == 2 and b"cannot read -" in p.stderr, p.stderr


def test_help_documents_the_defaults(capsys: Any) -> None:
    """--help names the default working directory, the output keys and the exit statuses."""
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "default: the directory containing CLAIMS.jsonl" in text
    assert "duplicate_of" in text and "2 bad input" in text and "1 some claim contradicted" in text


def test_empty_file_grades_nothing_and_exits_zero(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """A claims file with no claims writes nothing and exits 0."""
    path = write_claims(tmp_path, "", "  ")
    assert cli.main([str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "total" in captured.err


# --- progress bar --------------------------------------------------------------------------


class FakeTerminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal() -> None:
    """A tqdm bar is drawn on a terminal and nothing is written to a non-terminal."""
    pytest.importorskip("tqdm")
    outcome = cli.ClaimOutcome("a", Grade(Verdict.VERIFIED), 0, 0.0)
    for stream, drawn in ((FakeTerminal(), True), (io.StringIO(), False)):
        bar = cli._Progress(2, stream)
        bar.update(outcome)
        bar.update(outcome)
        bar.close()
        assert ("2/2" in stream.getvalue()) is drawn


def test_plain_progress_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without tqdm a terminal still shows progress, a plain counter; a non-terminal nothing."""
    real_import = importlib.import_module

    def no_tqdm(name: str, *args: Any) -> Any:
        if name == "tqdm":
            raise ImportError("No module named 'tqdm'")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_tqdm)
    outcome = cli.ClaimOutcome("a", Grade(Verdict.VERIFIED), 0, 0.0)
    for stream, drawn in ((FakeTerminal(), True), (io.StringIO(), False)):
        bar = cli._Progress(3, stream)
        for _ in range(3):
            bar.update(outcome)
        bar.close()
        assert ("3/3" in stream.getvalue()) is drawn
        assert stream.getvalue().endswith("\n") is drawn


def read_terminal(master: int, proc: subprocess.Popen[bytes], bound: float) -> bytes:
    """Everything written to a pty's other end until the process exits (bounded)."""
    import select

    received = b""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the other end closed it
                break
            if not chunk:
                break
            received += chunk
        elif proc.poll() is not None:
            break
    return received


def grade_on_a_pty(tmp_path: Path, no_tqdm: Path | None, claims: int, jobs: int,
                   stdout_too: bool) -> tuple[int, str, bytes]:
    """`python -m grader` on `claims` claims that verify, its stderr (and its stdout when
    `stdout_too`) a fresh pty's other end: its status, what the terminal got, and the piped
    stdout.  `no_tqdm`: a directory that hides tqdm, put first on PYTHONPATH."""
    import pty

    (tmp_path / "results.txt").write_text("PARETO\n")
    path = write_claims(tmp_path, *(claim(f"c{i}", expect="1") for i in range(claims)))
    env = importable_env()
    if no_tqdm is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(no_tqdm), env["PYTHONPATH"]])
    master, slave = pty.openpty()
    try:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "grader", str(path), "--jobs", str(jobs), "--timeout", "60"],
                env=env, stdin=subprocess.DEVNULL,
                stdout=slave if stdout_too else subprocess.PIPE, stderr=slave,
            )
        finally:
            os.close(slave)  # the grader holds the only other end: EOF when it exits
        try:
            shown = read_terminal(master, proc, 120).decode("utf-8", "replace")
            out, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(master)
    return proc.returncode, shown, out or b""


@pytest.mark.parametrize("with_tqdm", [True, False], ids=["tqdm", "no-tqdm"])
def test_progress_on_a_terminal_that_reports_no_size(
    tmp_path: Path, fake_tqdm_missing: Path, with_tqdm: bool
) -> None:
    """`python -m grader` with stderr on a fresh pty (0 columns, as in CI) shows progress."""
    if with_tqdm:
        pytest.importorskip("tqdm")
    status, shown, out = grade_on_a_pty(tmp_path, None if with_tqdm else fake_tqdm_missing,
                                        claims=2, jobs=1, stdout_too=False)
    assert status == 0, shown
    assert [line["verdict"] for line in output_lines(out.decode())] == ["verified"] * 2
    assert "2/2" in shown, shown
    assert "total" in shown


def screen_lines(text: str) -> list[str]:
    """The lines a terminal shows for `text`: a carriage return goes back to the line's start,
    later characters overwrite earlier ones, ESC [ K erases to the line's end."""
    lines: list[list[str]] = [[]]
    col = 0
    i = 0
    while i < len(text):
        ch = text[i]
        if text.startswith("\x1b[K", i):
            del lines[-1][col:]
            i += 3
            continue
        if ch == "\r":
            col = 0
        elif ch == "\n":
            lines.append([])
            col = 0
        else:
            row = lines[-1]
            if col < len(row):
                row[col] = ch
            else:
                row.append(ch)
            col += 1
        i += 1
    return ["".join(row).rstrip() for row in lines]


@pytest.mark.parametrize("with_tqdm", [True, False], ids=["tqdm", "no-tqdm"])
def test_progress_and_lines_on_one_terminal(
    tmp_path: Path, fake_tqdm_missing: Path, with_tqdm: bool
) -> None:
    """stdout and stderr on one terminal (no --out): each JSON line is a screen line of its
    own, never run into the progress counter or bar (`graded 2/4 claims{"id": ...`)."""
    if with_tqdm:
        pytest.importorskip("tqdm")
    status, shown, _ = grade_on_a_pty(tmp_path, None if with_tqdm else fake_tqdm_missing,
                                      claims=4, jobs=2, stdout_too=True)
    assert status == 0, shown
    lines = [line for line in screen_lines(shown) if '"id"' in line]
    assert len(lines) == 4, shown
    for line in lines:
        assert json.loads(line)["verdict"] == "verified", repr(shown)


@pytest.fixture
def fake_tqdm_missing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that, first on PYTHONPATH, makes `import tqdm` fail as if not installed."""
    directory = tmp_path_factory.mktemp("no-tqdm")
    (directory / "tqdm.py").write_text("raise ImportError(\"No module named 'tqdm'\")\n")
    return directory


# --- verify_claims -------------------------------------------------------------------------


class RecordingCancel:
    """Counts cancel() calls."""

    def __init__(self) -> None:
        self.calls = 0

    def cancel(self) -> None:
        self.calls += 1


def test_abandoned_pass_cancels_running_checks(fake: FakeVerify) -> None:
    """Closing the outcome generator early fires the shared Cancel before the pool shuts down."""
    claims, _ = cli.parse_claims([json.dumps(claim(str(i))).encode() for i in range(3)])
    cancel = RecordingCancel()
    outcomes = cli.verify_claims(claims, cwd=".", cancel=cancel)  # type: ignore[arg-type]
    next(outcomes)
    outcomes.close()
    assert cancel.calls == 1


def test_foreign_executor_is_used_and_left_open(fake: FakeVerify) -> None:
    """A caller's executor runs the checks and is not shut down by the pass."""
    claims, _ = cli.parse_claims([json.dumps(claim(str(i))).encode() for i in range(4)])
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(cli.verify_claims(claims, cwd=".", executor=pool))
        assert pool.submit(lambda: 7).result() == 7
    assert [o.id for o in outcomes] == ["0", "1", "2", "3"]


def test_foreign_executor_loses_its_unstarted_checks_when_the_pass_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Closing the pass early cancels the futures a caller's executor has not started yet."""
    stand_in = FakeVerify({"grep -c PARETO results.txt": 0.2})
    monkeypatch.setattr(cli, "verify_gradeable_evidence", stand_in)
    claims, _ = cli.parse_claims([json.dumps(claim(str(i))).encode() for i in range(6)])
    with ThreadPoolExecutor(1) as pool:
        outcomes = cli.verify_claims(claims, cwd=".", executor=pool)
        next(outcomes)
        outcomes.close()
    assert len(stand_in.calls) <= 2  # the first, and at most the one running when it closed


class InlineExecutor(Executor):
    """Runs each call at once in the calling thread: an executor that is not a thread pool."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_cancel_reaches_checks_only_in_this_process(fake: FakeVerify) -> None:
    """The Cancel goes to checks run by the own pool or a thread pool, never elsewhere."""
    claims, _ = cli.parse_claims([json.dumps(claim("a")).encode()])
    cancel = boundedproc.Cancel()
    with ThreadPoolExecutor(1) as pool:
        for executor in (None, pool, InlineExecutor()):
            list(cli.verify_claims(claims, cwd=".", executor=executor, cancel=cancel))
    assert [call["cancel"] for call in fake.calls] == [cancel, cancel, None]


# --- --executor ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("local", None),
        ("dask://127.0.0.1:8786", "tcp://127.0.0.1:8786"),
        ("dask://localhost:8786/", "tcp://localhost:8786"),
        ("dask://[::1]:8786", "tcp://[::1]:8786"),
    ],
)
def test_parse_executor_reads_local_and_dask(text: str, address: str | None) -> None:
    """`local` is the thread pool; `dask://HOST:PORT` becomes the scheduler's tcp address."""
    assert executors.parse_executor(text) == address


@pytest.mark.parametrize(
    "text",
    [
        "",
        "threads",
        "LOCAL",
        "dask://127.0.0.1",
        "dask://:8786",
        "dask://127.0.0.1:99999",
        "dask://127.0.0.1:port",
        "dask://127.0.0.1:8786/graders",
        "dask://user@127.0.0.1:8786",
        "tcp://127.0.0.1:8786",
    ],
)
def test_parse_executor_refuses_anything_else(text: str) -> None:
    """Any other value is a ValueError that names the two accepted forms."""
    with pytest.raises(ValueError, match="expected 'local' or 'dask://HOST:PORT'"):
        executors.parse_executor(text)


class FakeCluster:
    """Stands in for dask_executor: records how it was opened and lends a thread pool."""

    def __init__(self, pool: Executor | None = None) -> None:
        self.opened: list[tuple[str, float]] = []
        self.closed = False
        self.pool = pool

    @contextmanager
    def __call__(self, address: str, *, connect_timeout: float) -> Iterator[Executor]:
        self.opened.append((address, connect_timeout))
        pool = self.pool or ThreadPoolExecutor(2)
        try:
            yield pool
        finally:
            pool.shutdown()
            self.closed = True


def test_executor_dask_grades_there_and_closes_it(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """--executor dask://… opens the scheduler with --connect-timeout, grades, then closes it."""
    cluster = FakeCluster()
    monkeypatch.setattr(cli, "dask_executor", cluster)
    path = write_claims(tmp_path, claim("a"), claim("b", check="contra"))
    argv = [str(path), "--executor", "dask://127.0.0.1:8786", "--connect-timeout", "3"]
    assert cli.main(argv) == 1
    assert cluster.opened == [("tcp://127.0.0.1:8786", 3.0)] and cluster.closed
    lines = output_lines(capsys.readouterr().out)
    assert [(line["id"], line["verdict"]) for line in lines] == [
        ("a", "verified"),
        ("b", "contradicted"),
    ]


def test_executor_local_is_the_default(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--executor local grades in this process's thread pool and opens no cluster."""
    cluster = FakeCluster()
    monkeypatch.setattr(cli, "dask_executor", cluster)
    path = write_claims(tmp_path, claim("a"))
    assert cli.main([str(path), "--executor", "local", "--jobs", "2"]) == 0
    assert cluster.opened == [] and len(fake.calls) == 1


def test_cluster_cwd_is_the_workers_and_not_checked_here(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a cluster --cwd names a directory on the workers: absent here, it is still passed."""
    monkeypatch.setattr(cli, "dask_executor", FakeCluster())
    path = write_claims(tmp_path, claim("a"))
    elsewhere = tmp_path / "only-on-the-workers"
    assert (
        cli.main([str(path), "--executor", "dask://127.0.0.1:8786", "--cwd", str(elsewhere)]) == 0
    )
    assert [Path(call["cwd"]) for call in fake.calls] == [elsewhere.resolve()]


def test_dask_without_distributed_exits_two(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Asking for dask without `distributed` installed exits 2, says how to install it."""
    monkeypatch.setitem(sys.modules, "distributed", None)  # makes `import distributed` fail
    path = write_claims(tmp_path, claim("a"))
    assert cli.main([str(path), "--executor", "dask://127.0.0.1:8786"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and fake.calls == []
    assert "needs the optional 'distributed' package" in captured.err
    assert "pip install 'distributed>=2023.1', or from a checkout pip install '.[dask]'" in (
        captured.err)
    assert "boundedproc[dask]" not in captured.err  # the index's boundedproc is not this one


class FailingExecutor(Executor):
    """An executor whose every task fails, as a worker without the package would."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_exception(ModuleNotFoundError("No module named 'grader'"))
        return future


def test_executor_failure_stops_the_pass_with_exit_two(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A task the cluster fails grades no claim: the pass stops with a message and exit 2."""
    monkeypatch.setattr(cli, "dask_executor", FakeCluster(FailingExecutor()))
    path = write_claims(tmp_path, claim("a"), claim("b"))
    assert cli.main([str(path), "--executor", "dask://127.0.0.1:8786"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "the executor failed to grade a claim" in captured.err
    assert "ModuleNotFoundError: No module named 'grader'" in captured.err
    assert "Traceback" not in captured.err


def test_a_bug_in_the_grading_stops_the_pass_with_exit_three_not_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """An exception of the grader's own (a bug) prints its traceback and exits 3: never
    Python's default 1, which means "some claim contradicted"."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the grader")

    monkeypatch.setattr(cli, "verify_gradeable_evidence", broken)
    path = write_claims(tmp_path, claim("a"), claim("b"))
    assert cli.main([str(path), "--jobs", "2"]) == cli.EXIT_INTERNAL == 3
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "RuntimeError: a bug in the grader" in captured.err
    assert "internal error" in captured.err


def test_a_core_that_cannot_be_loaded_exits_three_not_one(tmp_path: Path) -> None:
    """A broken install (the C core missing, or built for another libc) is the grader's own
    failure: exit 3 with the ImportError, never 1, which the README's first command (and
    any CI script) reads as "some claim contradicted".  The packages are copied with a core
    that is no shared object, and Python runs without site-packages (-S), so that no other
    copy's core can stand in for it (the loader looks for one on sys.path)."""
    import shutil

    for module in (boundedproc, cli):
        src = Path(module.__file__ or "").resolve().parent
        shutil.copytree(src, tmp_path / src.name, ignore=shutil.ignore_patterns(
            "__pycache__", "*.so", "_bp_supervisor"))
    (tmp_path / "boundedproc" / "_bp.abi3.so").write_bytes(b"not a shared object")
    path = write_claims(tmp_path, claim("a", check="echo 6"))
    code = "import sys; from grader._cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": os.environ.get("PATH", os.defpath)})
    assert proc.returncode == cli.EXIT_INTERNAL == 3, proc.stderr
    assert "ImportError" in proc.stderr and "internal error" in proc.stderr
    assert proc.stdout == ""


def _claims_for_a_while(tmp_path: Path) -> Path:
    # Ids long enough that the output (about 100 KiB) cannot all go into a pipe's buffer
    # before its reader leaves: under load, `head -c 1` left only after 30 KiB had.
    return write_claims(tmp_path, *(claim(f"c{i}-" + "x" * 400, check="echo 6")
                                    for i in range(200)))


@pytest.mark.parametrize("shell_redirect", [">/dev/full", ">&-", "| head -c 1 >/dev/null"])
def test_stdout_that_cannot_be_written_exits_two_without_a_traceback(
        tmp_path: Path, shell_redirect: str) -> None:
    """A full disk, a closed stdout or a reader that left is not a bug of the grader: the
    pass stops with "cannot write stdout" and exit 2, no traceback, no check left running."""
    path = _claims_for_a_while(tmp_path)
    argv = " ".join(f"'{word}'" for word in [sys.executable, "-m", "grader", str(path)])
    script = f"{argv} 2>err {shell_redirect}; echo ${{PIPESTATUS[0]}} > rc"
    subprocess.run(["bash", "-c", script], cwd=tmp_path, env=importable_env(), timeout=120,
                   check=True)
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert re.search(r"^grader: cannot write stdout: .+$", err, re.MULTILINE), err
    assert "Traceback" not in err and "Exception ignored" not in err


def test_out_file_that_cannot_be_written_exits_two(tmp_path: Path) -> None:
    path = _claims_for_a_while(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "grader", str(path), "--out", "/dev/full"],
                          capture_output=True, text=True, env=importable_env(), timeout=120,
                          check=False)
    assert proc.returncode == 2, proc.stderr
    assert "grader: cannot write /dev/full: No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_free_process_slot_makes_checks_unrunnable_not_a_crash() -> None:
    """As nobody at RLIMIT_NPROC 1, no thread and no process can start: every check that
    has to run is unrunnable (a runner failure), and the pass itself completes."""
    out = as_nobody(
        """
lines = [json.dumps({"id": f"c{k}", "title": "root has one line", "rung": 4,
                     "check": "grep -c '^root:' /etc/passwd", "expect": "1"}).encode()
         for k in range(3)]
claims, errors = cli.parse_claims(lines)
resource.setrlimit(resource.RLIMIT_NPROC, (1, resource.getrlimit(resource.RLIMIT_NPROC)[1]))
try:
    outcomes = list(cli.verify_claims(claims, cwd="/", jobs=2, timeout=30))
    out = {"verdicts": sorted({(o.grade.verdict.value, o.grade.reason.value) for o in outcomes}),
           "n": len(outcomes)}
except Exception as err:
    out = {"raised": repr(err)}
""",
        imports="import grader._cli as cli",
    )
    assert out == {"verdicts": [["unrunnable", "runner-failure"]], "n": 3}


# --- real runs -----------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A directory with results.txt holding 6 PARETO rows."""
    (tmp_path / "results.txt").write_text("".join(f"r{i} PARETO\n" for i in range(6)) + "r6 -\n")
    return tmp_path


def test_real_run_grades_a_claims_file(data_dir: Path, capsys: Any) -> None:
    """Through bash: verified, contradicted, unreached input, syntax error; malformed exits 2."""
    path = write_claims(
        data_dir,
        claim("pass"),
        claim("wrong", expect="7"),
        claim("missing", check="grep -c PARETO absent.txt"),
        claim("syntax", check="grep -c PARETO results.txt | ("),
        '{"id": "broken"',
    )
    assert cli.main([str(path), "--timeout", "20"]) == 2
    captured = capsys.readouterr()
    got = {line["id"]: (line["verdict"], line["reason"]) for line in output_lines(captured.out)}
    assert got == {
        "pass": ("verified", None),
        "wrong": ("contradicted", None),
        "missing": ("unrunnable", "unreached-input"),
        "syntax": ("uncheckable", "invalid-shell-syntax"),
    }
    assert "line 5: not valid JSON" in captured.err


def test_real_run_exits_zero_when_nothing_is_contradicted(data_dir: Path, capsys: Any) -> None:
    """A file whose claims all verify exits 0 and reports each check's exit code."""
    path = write_claims(
        data_dir, claim("pass"), claim("rows", check="wc -l < results.txt", expect="7")
    )
    assert cli.main([str(path)]) == 0
    lines = output_lines(capsys.readouterr().out)
    assert [(line["verdict"], line["exit_code"]) for line in lines] == [("verified", 0)] * 2


def test_a_thread_pool_passed_in_grades_as_the_default_pool() -> None:
    """verify_claims on a caller's ThreadPoolExecutor gives the default pass's outcomes."""
    claims, errors = cli.parse_claims(
        (REPO / "examples" / "claims.jsonl").read_bytes().splitlines()
    )
    assert errors == []
    cwd = str(REPO / "examples")

    def fields(outcomes: list[cli.ClaimOutcome]) -> list[tuple[Any, ...]]:
        return [(o.id, o.grade, o.exit_code) for o in outcomes]

    default = list(cli.verify_claims(claims, cwd=cwd, jobs=2))
    with ThreadPoolExecutor(3) as pool:
        passed_in = list(cli.verify_claims(claims, cwd=cwd, executor=pool))
    assert fields(passed_in) == fields(default)
    assert any(o.grade.duplicate_of for o in passed_in)




def test_module_runs_the_example_claims(tmp_path: Path) -> None:
    """`python -m grader examples/claims.jsonl` reaches every verdict and exits 1 (a refutation)."""
    proc = subprocess.run(
        [sys.executable, "-m", "grader", str(REPO / "examples" / "claims.jsonl"), "--jobs", "2"],
        cwd=tmp_path,
        env=importable_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    lines = output_lines(proc.stdout)
    assert {line["verdict"] for line in lines} == {v.value for v in Verdict}
    assert any(line["duplicate_of"] for line in lines)
    assert "total" in proc.stderr


def gone(pid: int) -> bool:
    """Whether pid no longer runs (a zombie counts as dead)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def leftovers() -> Iterator[list[int]]:
    """Pids to kill at teardown if still alive, so a failing test leaves nothing behind."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_interrupt_kills_running_checks(tmp_path: Path, leftovers: list[int]) -> None:
    """SIGINT to the grader cancels running checks, leaves no process, and exits 130."""
    check = 'echo $$ >> pids.txt; sleep 60 & echo $! >> pids.txt; wait; echo "n=$((1 + 1))"'
    path = write_claims(tmp_path, claim("slow", check=check, expect="n=2"))
    proc = subprocess.Popen(
        python_module_argv("grader", str(path), "--timeout", "120"),
        env=importable_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    leftovers.append(proc.pid)
    pid_file = tmp_path / "pids.txt"
    try:
        assert wait_for(
            lambda: len(pid_file.read_text().split()) == 2 if pid_file.exists() else False, 30
        )
        pids = [int(p) for p in pid_file.read_text().split()]
        leftovers.extend(pids)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert all(wait_for(lambda pid=pid: gone(pid), 5) for pid in pids)


# --- the checks' environment, user and directory (--pass-env, --env-file, --user, --tmpdir) -


def test_env_file_format(tmp_path: Path) -> None:
    """NAME=VALUE verbatim; blank and # lines skipped; a bare NAME passes ours; later wins."""
    path = tmp_path / "checks.env"
    path.write_bytes(
        b"# a comment\n\n   \nPLAIN=1\nQUOTED=\"kept as is\" \nEQ=a=b#not a comment\r\n"
        b"  INDENTED=x\nEMPTY=\nFROM_HERE\nUNSET_HERE\nPLAIN=2\n"
    )
    env = cli.read_env_file(path, {"FROM_HERE": "ours"})
    assert env == {"PLAIN": "2", "QUOTED": '"kept as is" ', "EQ": "a=b#not a comment",
                   "INDENTED": "x", "EMPTY": "", "FROM_HERE": "ours"}


@pytest.mark.parametrize(("content", "message"), [
    (b"OK=1\nexport X=1\n", ":2: expected NAME=VALUE"),
    (b"X = 1\n", ":1: expected NAME=VALUE"),
    (b"=1\n", ":1: expected NAME=VALUE"),
    (b"1X=1\n", ":1: expected NAME=VALUE"),
    (b"X=\xff\n", ":1: not valid UTF-8"),
])
def test_env_file_bad_lines_are_errors(tmp_path: Path, content: bytes, message: str) -> None:
    """A line that is not NAME=VALUE, NAME, blank or a comment is an error naming its line."""
    path = tmp_path / "bad.env"
    path.write_bytes(content)
    with pytest.raises(cli.EnvFileError, match=re.escape(f"{path}{message}")):
        cli.read_env_file(path, {})


def test_env_flags_reach_every_check(
    tmp_path: Path, fake: FakeVerify, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """--env-file then --pass-env build the checks' whole environment, passed to each claim."""
    monkeypatch.setenv("BP_PASSED", "from-here")
    monkeypatch.setenv("BP_BOTH", "pass-env wins")
    monkeypatch.delenv("BP_UNSET", raising=False)
    (tmp_path / "a.env").write_text("BP_FILE=a\nBP_BOTH=file\nBP_OVER=a\n")
    (tmp_path / "b.env").write_text("BP_OVER=b\n")
    path = write_claims(tmp_path, claim("one"), claim("two"))
    argv = [str(path), "--env-file", str(tmp_path / "a.env"), "--env-file",
            str(tmp_path / "b.env"), "--pass-env", "BP_PASSED", "--pass-env", "BP_BOTH",
            "--pass-env", "BP_UNSET"]
    assert cli.main(argv) == 0
    expected = {"BP_FILE": "a", "BP_BOTH": "pass-env wins", "BP_OVER": "b",
                "BP_PASSED": "from-here"}
    assert [call["env"] for call in fake.calls] == [expected, expected]
    assert "--pass-env BP_UNSET: not set here, not passed" in capsys.readouterr().err


def test_without_env_flags_checks_get_an_empty_environment(
    tmp_path: Path, fake: FakeVerify
) -> None:
    """No --env-file or --pass-env: env=None, the empty environment, as before."""
    assert cli.main([str(write_claims(tmp_path, claim("one")))]) == 0
    assert fake.calls[0]["env"] is None


def test_a_bad_env_file_exits_two_before_grading(
    tmp_path: Path, fake: FakeVerify, capsys: Any
) -> None:
    """An --env-file that is missing or malformed exits 2 and grades nothing."""
    path = write_claims(tmp_path, claim("one"))
    assert cli.main([str(path), "--env-file", str(tmp_path / "missing.env")]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "bad.env").write_text("export X=1\n")
    assert cli.main([str(path), "--env-file", str(tmp_path / "bad.env")]) == 2
    assert "bad.env:1: expected NAME=VALUE" in capsys.readouterr().err
    assert fake.calls == []


def test_pass_env_needs_a_variable_name(tmp_path: Path, capsys: Any) -> None:
    """--pass-env with something that is not a variable name is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([str(write_claims(tmp_path, claim("one"))), "--pass-env", "A=B"])
    assert exited.value.code == 2
    assert "not a variable name" in capsys.readouterr().err


def test_user_and_tmpdir_pass_through(tmp_path: Path, fake: FakeVerify) -> None:
    """--user (a name, or digits for a uid) and --tmpdir reach every check; no cwd with tmpdir."""
    path = write_claims(tmp_path, claim("one"))
    assert cli.main([str(path), "--user", "nobody", "--tmpdir"]) == 0
    assert fake.calls[-1] | {"check": None} == {
        "check": None, "cwd": None, "bash": "bash", "timeout": cli.DEFAULT_TIMEOUT,
        "cancel": fake.calls[-1]["cancel"], "env": None, "user": "nobody", "tmpdir": True}
    assert cli.main([str(path), "--user", "65534"]) == 0
    assert fake.calls[-1]["user"] == 65534 and fake.calls[-1]["tmpdir"] is False
    assert fake.calls[-1]["cwd"] == str(tmp_path.resolve())


def test_tmpdir_and_cwd_exclude_each_other(tmp_path: Path, capsys: Any) -> None:
    """--tmpdir with --cwd is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        cli.main([str(write_claims(tmp_path, claim("one"))), "--tmpdir", "--cwd", str(tmp_path)])
    assert exited.value.code == 2
    assert "--tmpdir" in capsys.readouterr().err


def test_real_run_with_pass_env_path_and_tmpdir(tmp_path: Path, capsys: Any) -> None:
    """Through bash: --pass-env PATH is the check's PATH, --tmpdir its fresh, removed cwd."""
    checks = [
        claim("path", check='printf "%s\\n" "$PATH"', expect=os.environ["PATH"]),
        claim("cwd", check='test "$PWD" = "$TMPDIR" && test ! -e claims.jsonl; echo $?',
              expect="0"),
        claim("mess", check="mkdir -p d/e && chmod a-rwx d/e d; echo $?", expect="0"),
    ]
    path = write_claims(tmp_path, *checks)
    before = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("boundedproc-")}
    assert cli.main([str(path), "--pass-env", "PATH", "--tmpdir"]) == 0
    lines = output_lines(capsys.readouterr().out)
    assert [(line["id"], line["verdict"]) for line in lines] == [
        ("path", "verified"), ("cwd", "verified"), ("mess", "verified")]
    after = {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("boundedproc-")}
    assert after <= before


def test_real_run_with_an_env_file(tmp_path: Path, capsys: Any) -> None:
    """Through bash: a variable of --env-file is what the check reads, verbatim."""
    (tmp_path / "checks.env").write_text("ANSWER='42'\n")
    path = write_claims(tmp_path, claim("answer", check='echo "$ANSWER"', expect="'42'"))
    assert cli.main([str(path), "--env-file", str(tmp_path / "checks.env")]) == 0
    assert output_lines(capsys.readouterr().out)[0]["verdict"] == "verified"


def test_real_run_with_an_unknown_user_is_unrunnable(tmp_path: Path, capsys: Any) -> None:
    """--user naming nobody this machine has grades unrunnable/runner-failure, never contradicted."""
    path = write_claims(tmp_path, claim("one"))
    assert cli.main([str(path), "--user", "bp-no-such-user-0"]) == 0
    line = output_lines(capsys.readouterr().out)[0]
    assert (line["verdict"], line["reason"]) == ("unrunnable", "runner-failure")


# --- --verbose: each check's output streamed live to stderr --------------------------------


def test_verbose_streams_each_line_prefixed_with_the_claim_id(
    tmp_path: Path, capsys: Any
) -> None:
    """--verbose writes every line of each check's stdout and stderr to stderr as [ID] line."""
    path = write_claims(
        tmp_path,
        claim("a", check="echo one; echo two >&2; printf 'x=%s' 3", expect="x=3"),
        claim("b", check="printf 'caf\\303\\251\\n'; echo \"n=$((1 + 1))\"", expect="n=2"),
    )
    assert cli.main([str(path), "--verbose", "--jobs", "2"]) == 0
    captured = capsys.readouterr()
    assert [line["verdict"] for line in output_lines(captured.out)] == ["verified"] * 2
    streamed = [line for line in captured.err.splitlines() if line.startswith("[")]
    assert [line for line in streamed if line.startswith("[a] ")] == [
        "[a] one", "[a] two", "[a] x=3"]
    assert [line for line in streamed if line.startswith("[b] ")] == ["[b] café", "[b] n=2"]
    assert len(streamed) == 5
    assert cli.main([str(path)]) == 0
    assert "[a]" not in capsys.readouterr().err


def test_verbose_echo_keeps_lines_and_characters_whole(capsys: Any) -> None:
    """The echo joins a line and a UTF-8 character split across reads, and cuts huge lines."""
    echo = cli._PrefixedEcho("id")
    echo(1, b"he")
    echo(2, b"err\xc3")
    echo(1, b"llo\nwor")
    echo(2, b"\xa9\n")
    assert capsys.readouterr().err == "[id] hello\n[id] err\u00e9\n"
    echo(1, b"ld\n" + b"z" * (cli._PrefixedEcho._ECHO_MAX_LINE + 1))
    echo.close()
    assert capsys.readouterr().err.splitlines() == [
        "[id] world", "[id] " + "z" * cli._PrefixedEcho._ECHO_MAX_LINE, "[id] z"]


def test_verbose_output_arrives_while_the_check_runs(tmp_path: Path, leftovers: list[int]) -> None:
    """A check's line reaches the grader's stderr before the check ends: it waits on it here."""
    check = (
        "echo started; i=0; while [ ! -e go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done;"
        " if [ -e go ]; then echo re$(echo leased); else echo waited-in-vain; fi"
    )
    path = write_claims(tmp_path, claim("live", check=check, expect="released"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "grader", str(path), "--verbose", "--timeout", "60"],
        env=importable_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    leftovers.append(proc.pid)
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        started = time.monotonic()
        for line in proc.stderr:  # the check waits 30 s at most, and the grader's timeout is 60
            seen.append(line)
            if line == "[live] started\n":
                # The check is still waiting for this file: what was read came live.
                (tmp_path / "go").touch()
                break
        assert time.monotonic() - started < 25, seen
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert seen[-1:] == ["[live] started\n"], seen
    assert "[live] released\n" in err, err
    assert proc.returncode == 0, err
    assert [line["verdict"] for line in output_lines(out)] == ["verified"]


def test_verbose_with_a_dask_executor_is_a_usage_error(tmp_path: Path, capsys: Any) -> None:
    """--verbose streams checks run here, so with --executor dask:// it exits 2 at once."""
    path = write_claims(tmp_path, claim("one"))
    with pytest.raises(SystemExit) as exited:
        cli.main([str(path), "--verbose", "--executor", "dask://127.0.0.1:1"])
    assert exited.value.code == 2
    assert "--verbose streams the output of checks run here" in capsys.readouterr().err


def test_the_grader_started_with_fd_2_closed_still_grades(tmp_path: Path) -> None:
    """With fd 2 closed Python has no sys.stderr: the progress display crashed the pass
    (exit 3, no verdict), and print(file=None) would have put messages among the verdicts
    on stdout. Its messages now go nowhere; stdout holds verdicts only."""
    proc = subprocess.run(
        ["sh", "-c", 'exec 2>&-; exec "$@"', "sh", sys.executable, "-m", "grader",
         str(REPO / "examples" / "claims.jsonl"), "--jobs", "2"],
        cwd=tmp_path, env=importable_env(), capture_output=True, text=True, timeout=120,
        check=False)
    assert proc.returncode == 1, proc.stdout
    lines = output_lines(proc.stdout)
    assert {line["verdict"] for line in lines} == {v.value for v in Verdict}
    assert all(line.startswith("{") for line in proc.stdout.splitlines() if line.strip())


def test_a_ctrl_c_before_any_check_started_is_130_without_a_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A Ctrl-C in the first moments (while the runner is imported, before the pass's own
    handler) printed a KeyboardInterrupt traceback; it is `grader: interrupted`, 130."""
    def interrupted(argv: object = None) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main([]) == 130
    err = capsys.readouterr().err
    assert "grader: interrupted" in err and "Traceback" not in err
