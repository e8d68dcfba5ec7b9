"""Whole-run accounting (SPEC 9.4): user_time, system_time and max_rss cover the run's processes."""

from __future__ import annotations

import shlex
import sys

import pytest

from boundedproc import run
from boundedproc._native import CONTAIN_SUPPORTED

#: CPU seconds each spinner burns.
SPIN = 0.3
SPINNER = shlex.join([
    sys.executable, "-c",
    f"import time\nt = time.process_time()\nwhile time.process_time() - t < {SPIN}: pass",
])
CONTAIN = pytest.mark.parametrize("contain", [
    pytest.param(True, marks=pytest.mark.skipif(not CONTAIN_SUPPORTED,
                                                reason="containment unsupported here")),
    False,
], ids=["contained", "uncontained"])


@CONTAIN
def test_cpu_of_children_the_leader_waited_for_is_counted(contain: bool) -> None:
    """`sh -c 'spin & spin & wait'` reports about both spinners' CPU, not the shell's ~0."""
    r = run(["sh", "-c", f"{SPINNER} & {SPINNER} & wait"], contain=contain, timeout=60)
    assert r.ok, r
    cpu = r.user_time + r.system_time
    assert cpu >= 1.5 * SPIN, (r.user_time, r.system_time)


@CONTAIN
def test_max_rss_is_the_largest_process_of_the_run(contain: bool) -> None:
    """A child that touches 256 MiB makes max_rss at least that, though the leader stays small."""
    big = shlex.join([sys.executable, "-c", "b = bytearray(256 << 20)\nb[::4096] = b'x' * (1 << 16)"])
    r = run(["sh", "-c", f"{big}; true"], contain=contain, timeout=60)
    assert r.ok, r
    assert r.max_rss >= 256 << 20, r.max_rss


@pytest.mark.skipif(not CONTAIN_SUPPORTED, reason="containment unsupported here")
def test_cpu_of_an_orphan_is_counted_when_contained() -> None:
    """An orphan the supervisor adopted and reaped adds its CPU to the run's."""
    # The subshell exits at once, so the spinner is orphaned and reparented to the
    # supervisor; the leader outlives the spinning, so it is reaped before the run ends.
    r = run(["sh", "-c", f"({SPINNER} &); sleep {4 * SPIN}"], contain=True, timeout=60)
    assert r.ok, r
    assert r.user_time + r.system_time >= 0.8 * SPIN, (r.user_time, r.system_time)
