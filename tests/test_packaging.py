"""The built package: the supervisor program beside the core, the console scripts, --version."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys

import pytest
from conftest import importable_env

import boundedproc
from boundedproc import _native


def test_supervisor_beside_the_core() -> None:
    """The build puts an executable _bp_supervisor in the directory of the loaded extension."""
    path = os.path.join(os.path.dirname(os.path.abspath(_native._bp.__file__)), "_bp_supervisor")
    assert os.path.isfile(path), f"{path} is not built"
    assert os.access(path, os.X_OK), f"{path} is not executable"


@pytest.mark.parametrize("module", ["boundedproc", "grader"])
def test_version_flag(module: str) -> None:
    """`python -m boundedproc --version` and `python -m grader --version` print the version."""
    proc = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True,
                          text=True, env=importable_env(), timeout=60, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0, f"boundedproc {boundedproc.__version__}\n", "")


def test_console_scripts() -> None:
    """An installed distribution has the boundedproc and boundedproc-grade console scripts."""
    try:
        dist = importlib.metadata.distribution("boundedproc")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("boundedproc is not installed (an in-place build has no metadata)")
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts["boundedproc"] == "boundedproc.__main__:main"
    assert scripts["boundedproc-grade"] == "grader._cli:main"
