"""Failures of the core's own system calls, made on purpose (tests/faults/inject.c).

SPEC 8: an environment failure comes back as a result with the right flags, never as a
plausible but wrong one. A fault injector is LD_PRELOADed into a Python child, armed
through ctypes once the child is ready, and fails one call, once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import importable_env

from boundedproc import _native

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def injector(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or not sys.platform.startswith("linux"):
        pytest.skip("needs a C compiler and Linux's LD_PRELOAD")
    out = tmp_path_factory.mktemp("faults") / "inject.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O", "-o", str(out), str(HERE / "faults" / "inject.c"),
                    "-ldl"], check=True, capture_output=True)
    return str(out)


def _env_with(injector: str) -> dict[str, str]:
    env = importable_env()
    # After any preload already there (the sanitizer runtime must come first).
    env["LD_PRELOAD"] = " ".join(p for p in (env.get("LD_PRELOAD"), injector) if p)
    return env


def _under_fault(injector: str, code: str) -> dict[str, object]:
    env = _env_with(injector)
    prog = ("import ctypes, json, sys\n"
            "from boundedproc import run\n"
            "fault = ctypes.CDLL(None)\n"
            f"{code}\n"
            "out['fired'] = fault.bp_fault_fired()\n"
            "sys.stdout.write(json.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got: dict[str, object] = json.loads(done.stdout)
    assert got["fired"] == 1, got  # the fault did happen
    return got


def test_a_failed_read_of_the_output_is_a_runner_failure_not_a_silent_eof(
        injector: str) -> None:
    """read() of the output pipe failing (EIO) was taken as its EOF: `echo hi` came back
    exit 0 with an empty stdout and no runner_error, which a grader reads as a silent
    check. The result now says runner failed: EIO, read."""
    got = _under_fault(injector, (
        "fault.bp_fault_arm(1)\n"
        "r = run(['sh', '-c', 'sleep 0.2; echo hi'], contain=False, timeout=10)\n"
        "out = dict(exit_code=r.exit_code, error=r.runner_error, stdout=r.stdout.decode())"))
    error = got["error"]
    assert isinstance(error, str) and error.startswith("runner failed: EIO"), got
    assert "read" in error, got


@pytest.mark.skipif(not _native.CONTAIN_SUPPORTED, reason="needs containment")
def test_a_failed_wait_on_the_supervisor_says_why(injector: str) -> None:
    """poll() failing (ENOMEM) while the run's end waited for the supervisor's report gave
    up on it and reported a kill's 137 (a clean exit became 137) with no runner_error.
    The result now says runner failed: ENOMEM, poll."""
    got = _under_fault(injector, (
        "run(['true'])  # the thread's supervisor starts before the fault is armed\n"
        "fault.bp_fault_arm(2)\n"
        "r = run(['sleep', '30'], timeout=0.3)\n"
        "out = dict(exit_code=r.exit_code, error=r.runner_error, timed_out=r.timed_out)"))
    error = got["error"]
    assert isinstance(error, str) and error.startswith("runner failed: ENOMEM"), got
    assert "poll" in error, got


def test_the_injector_is_only_armed_on_purpose(injector: str) -> None:
    """Unarmed, the injector changes nothing: the faults above are the ones chosen."""
    done = subprocess.run(
        [sys.executable, "-c",
         ("from boundedproc import run; r = run(['sh', '-c', 'echo hi']); "
          "print(r.ok, r.stdout, r.runner_error)")],
        env=_env_with(injector), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True b'hi\\n' None"
    assert os.path.exists(injector)
