"""examples/humaneval/grade.py: the bundled problems grade as the example says."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import importable_env

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "humaneval" / "grade.py"


def test_example_grades_one_pass_one_failure_one_hostile_and_leaves_nothing() -> None:
    """The correct candidate passes, the wrong one fails its assert, the hostile one times out."""
    done = subprocess.run([sys.executable, str(SCRIPT), "--timeout", "2"], env=importable_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:3] for line in lines[:3]] == [
        ["bp/0", "count_runs", "passed"],
        ["bp/1", "interleave", "failed:"],
        ["bp/2", "digit_product", "failed:"],
    ]
    assert "AssertionError" in lines[1]
    assert "timed out" in lines[2]
    assert lines[3].startswith("passed 1 of 3") and lines[3].endswith("left behind: 0")


def test_survivors_are_this_passs_own_not_a_neighbours() -> None:
    """A sleeper like the hostile candidate's, left by another pass running beside this one
    (two CI jobs on one host), is not counted; one carrying this pass's token is."""
    import importlib.util
    import os

    spec = importlib.util.spec_from_file_location("humaneval_grade", SCRIPT)
    assert spec is not None and spec.loader is not None
    grade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grade)
    token = "BP_EXAMPLE_PASS=ours"
    sleepers = [subprocess.Popen(grade.SLEEPER, env={"PATH": os.defpath, **env})
                for env in ({"BP_EXAMPLE_PASS": "theirs"}, {"BP_EXAMPLE_PASS": "ours"})]
    try:
        # Popen returns once the exec began: /proc/PID/cmdline reads empty for a moment more.
        wanted = ("\0".join(grade.SLEEPER) + "\0").encode()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(
                Path(f"/proc/{p.pid}/cmdline").read_bytes() != wanted for p in sleepers):
            time.sleep(0.01)
        assert grade.survivors(token) == [sleepers[1].pid]
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
