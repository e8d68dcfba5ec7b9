"""The typed API as a user meets it: ``mypy --strict`` on the scripts in tests/typing/.

mypy runs in a scratch directory, so it reads no project config and finds ``boundedproc`` the
way a user's checker would: installed (PEP 561, through its ``py.typed``) when the package is
installed, and through ``MYPYPATH`` only for an in-place build in a source tree.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import boundedproc

pytest.importorskip("mypy", reason="mypy is not installed (it is in the test extra)")

HERE = Path(__file__).resolve().parent / "typing"


def _mypy(script: str, scratch: Path) -> subprocess.CompletedProcess[str]:
    """``python -m mypy --strict`` on one script of tests/typing/, from a scratch directory."""
    env = dict(os.environ)
    env.pop("MYPYPATH", None)
    root = Path(boundedproc.__file__).resolve().parent.parent
    installed = {Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")}
    if root not in installed:
        env["MYPYPATH"] = str(root)  # mypy refuses a site-packages directory here
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--hide-error-context",
         "--cache-dir", str(scratch / ".mypy_cache"), str(HERE / script)],
        cwd=scratch, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_user_code_type_checks(tmp_path: Path) -> None:
    """A user's script of run/run_many/run_async/Job/Result is clean under mypy --strict."""
    proc = _mypy("user_code.py", tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_mistakes_are_reported(tmp_path: Path) -> None:
    """mypy --strict reports each misspelt option by name and each wrong type, on its line."""
    expected: dict[int, str] = {}
    lines = (HERE / "user_mistakes.py").read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        marker = re.search(r"\S  # error: (.+)$", line)  # code, then the comment
        if marker:
            expected[number] = marker.group(1)
    assert len(expected) == 7
    proc = _mypy("user_mistakes.py", tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors: dict[int, list[str]] = {}
    for out in proc.stdout.splitlines():
        found = re.match(r".*user_mistakes\.py:(\d+): error: (.*)$", out)
        if found:
            errors.setdefault(int(found.group(1)), []).append(found.group(2))
    assert sorted(errors) == sorted(expected), proc.stdout
    for number, text in expected.items():
        assert any(text in message for message in errors[number]), (number, errors[number])
