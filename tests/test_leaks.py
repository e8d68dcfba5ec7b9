"""Leak checks: many runs of every outcome keep the caller's fds and RSS flat.

tests/test_run.py counts fds over 10,000 plain runs; here the mix covers every way a run can
end (spawn failures, refusals, deadlines, truncation, overflow kills, undelivered stdin,
cancels, escapes, threads), and the resident set is watched too. RSS is compared once, after
a warm-up and with a slack for the allocator, never per iteration.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import UNDER_ASAN, alive, pids_in, run_descendants, wait_dead

from boundedproc import Cancel, Result, _native, run

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")

RSS_SLACK = 8 * 1024 * 1024
# Under scripts/sanitize.sh (UNDER_ASAN), ASan holds freed memory in a quarantine of up to
# 256 MiB, so the resident set grows whatever the core does; only the fd counts mean
# something there.


def fd_count() -> int:
    gc.collect()  # a Cancel left from an earlier test closes its pipe only when collected
    return len(os.listdir("/proc/self/fd"))


def rss() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def outcomes(tmp: Path) -> list[Callable[[], Result]]:
    """One cheap run for each way a run can end, each checked to have ended that way."""
    a_file = tmp / "a-file"
    a_file.write_text("x")
    cancelled = Cancel()
    cancelled.cancel()

    def ok() -> Result:
        r = run(["/bin/true"])
        assert r.ok
        return r

    def missing_program() -> Result:
        r = run(["/bp/no/such/program"])
        assert not r.spawned and "ENOENT" in (r.runner_error or "")
        return r

    def cwd_is_a_file() -> Result:
        r = run(["/bin/true"], cwd=a_file)
        assert not r.spawned and "ENOTDIR" in (r.runner_error or "")
        return r

    def nul_byte() -> Result:
        r = run(["/bin/true", "a\0b"])
        assert not r.spawned and (r.runner_error or "").startswith("not spawned: ")
        return r

    def deadline() -> Result:
        r = run(["sleep", "5"], timeout=0.001)
        assert r.timed_out
        return r

    def truncated() -> Result:
        r = run(["head", "-c", "100000", "/dev/zero"], max_output=1000)
        assert r.output_truncated and r.output_bytes == 100000 and len(r.stdout) == 1000
        return r

    def overflow_kill() -> Result:
        r = run(["head", "-c", "1000000", "/dev/zero"], max_output=1000, on_overflow="kill")
        assert r.output_truncated and r.exit_code == 137
        return r

    def stdin_payload() -> Result:
        r = run(["cat"], stdin=b"s" * 10000, merge_stderr=True)
        assert r.ok and len(r.stdout) == 10000
        return r

    def stdin_not_delivered() -> Result:
        r = run(["/bin/true"], stdin=b"n" * 200_000)
        assert not r.stdin_delivered
        return r

    def cancelled_before_spawn() -> Result:
        r = run(["/bin/true"], cancel=cancelled)
        assert r.cancelled and not r.spawned
        return r

    def text_invalid_utf8() -> Result:
        r = run(["printf", "\\377\\376ok"], text=True)
        assert r.ok and r.stdout.endswith("ok")
        return r

    def stderr_and_status() -> Result:
        r = run(["sh", "-c", "echo err >&2; exit 3"])
        assert r.exit_code == 3 and r.stderr == b"err\n"
        return r

    return [ok, missing_program, cwd_is_a_file, nul_byte, deadline, truncated, overflow_kill,
            stdin_payload, stdin_not_delivered, cancelled_before_spawn, text_invalid_utf8,
            stderr_and_status]


def test_rss_and_fds_flat_over_10000_mixed_runs(tmp_path: Path) -> None:
    """10,000 runs of every cheap outcome keep RSS within 8 MiB and the fd count exact."""
    mix = outcomes(tmp_path)
    # run_many's workers that an earlier test left parked with their supervisors end after
    # 2 s idle: ended now, their fds do not leave during the count.
    _native.lib.bp_batch_release_parked()
    for i in range(1000):  # warm-up: allocator arenas, caches, the supervisor's page cache
        mix[i % len(mix)]()
    fds, before = fd_count(), rss()
    for i in range(10_000):
        mix[i % len(mix)]()
    after = rss()
    assert fd_count() == fds
    if not UNDER_ASAN:
        assert after - before < RSS_SLACK, f"RSS grew by {(after - before) / 2**20:.1f} MiB"


def test_e2big_runs_do_not_leak(tmp_path: Path) -> None:
    """E2BIG spawn failures (a 2 MiB argument vector each) leave RSS and fds flat."""
    big = ["y" * 100_000] * (os.sysconf("SC_ARG_MAX") // 100_000 + 2)
    for _ in range(50):
        run(["/bin/true", *big])
    fds, before = fd_count(), rss()
    for _ in range(300):
        r = run(["/bin/true", *big])
        assert "E2BIG" in (r.runner_error or "")
    assert fd_count() == fds
    if not UNDER_ASAN:
        assert rss() - before < RSS_SLACK


def test_fds_flat_across_escapes_and_uncontained_runs(tmp_path: Path,
                                                     reaper: list[int]) -> None:
    """Escaped, contained and uncontained runs close every fd they opened."""
    def script(n: int) -> str:
        f = tmp_path / f"pid{n}"
        return (f"setsid sh -c 'echo $$ > \"$0.tmp\" && mv \"$0.tmp\" \"$0\"; exec sleep 30' {f} & "
                f"while [ ! -e {f} ]; do sleep 0.01; done; cat {f}")

    for n in range(3):
        reaper.extend(pids_in(run(["sh", "-c", script(n)], drain_grace=0.05).stdout))
    fds = fd_count()
    for i in range(30):
        contained = run(["sh", "-c", script(2 * i + 3)], drain_grace=0.05)
        reaper.extend(pids_in(contained.stdout))
        loose = run(["sh", "-c", script(2 * i + 4)], drain_grace=0.05, contain=False)
        escapees = pids_in(loose.stdout)
        reaper.extend(escapees)
        assert loose.escaped and len(escapees) == 1
        for pid in escapees:
            os.kill(pid, signal.SIGKILL)
        run(["head", "-c", "100000", "/dev/zero"], max_output=10, contain=False)
        run(["sleep", "5"], timeout=0.001, contain=False)
    assert wait_dead(reaper) == []
    assert fd_count() == fds


def test_fds_flat_with_cancels_and_threads() -> None:
    """Runs cancelled mid-flight from other threads, 4 threads at once, leak no fd."""
    run(["/bin/true"])
    fds = fd_count()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for i in range(150):
                if i % 3 == 0:
                    c = Cancel()
                    threading.Timer(0.005, c.cancel).start()
                    r = run(["sleep", "5"], cancel=c, timeout=10)
                    assert r.cancelled or r.exit_code == 0
                    del c
                elif i % 3 == 1:
                    run(["sleep", "5"], timeout=0.002)
                else:
                    run(["/bp/no/such/program"])
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert fd_count() == fds


def test_no_children_left_after_the_mix(tmp_path: Path) -> None:
    """After a round of every outcome, the caller has no live child process left."""
    before = {p.pid for p in run_descendants()}
    for outcome in outcomes(tmp_path):
        outcome()
    left = [p.pid for p in run_descendants()
            if p.pid not in before and alive(p.pid)]
    assert wait_dead(left) == []


if __name__ == "__main__":  # pragma: no cover - for valgrind/ASan runs by hand
    sys.exit(pytest.main([__file__, "-q"]))


@pytest.mark.skipif(not sys.platform.startswith("linux") or UNDER_ASAN,
                    reason="the child stack is Linux's; ASan's quarantine holds memory")
def test_threads_that_exit_leave_no_child_stack_behind() -> None:
    """Each thread keeps one child stack for its uncontained starts (64 KiB, mapped at its
    first), and gives it back when it exits: 3,000 threads that each run once and are
    joined leave the resident set where it was.  (The child touches a page or two of it:
    kept stacks showed here as 13 MiB more.)"""
    def once() -> None:
        assert run(["true"], contain=False).ok

    for _ in range(20):  # the C library's cache of thread stacks, warmed up
        t = threading.Thread(target=once)
        t.start()
        t.join()
    before = rss()
    for _ in range(3000):
        t = threading.Thread(target=once)
        t.start()
        t.join()
    grown = rss() - before
    assert grown < 5 * 1024 * 1024, f"resident set grew by {grown / 2**20:.1f} MiB"


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child stack is Linux's")
def test_one_thread_reuses_its_child_stack() -> None:
    """Uncontained runs of one thread start their children on one stack, not one each."""
    run(["true"], contain=False)
    before = _vm_size()
    for _ in range(300):
        run(["true"], contain=False)
    grown = _vm_size() - before
    assert grown < 4 * 1024 * 1024, f"address space grew by {grown / 2**20:.1f} MiB"  # 300 kept: 19
