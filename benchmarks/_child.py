"""Measurements that must run in a fresh process of their own.

``benchmarks/run.py`` starts this file with ``sys.executable`` so that the
measuring process holds exactly what the measurement needs:

* ``spawn-latency``: B3.  Optionally allocate and touch a large bytearray, then
  time ``run(["/bin/true"])``.  The parent of the benchmark stays small.
* ``peak-rss``: B6.  Capture N bytes of stdout with ``boundedproc.run`` or
  ``subprocess.run`` and report the peak RSS above the baseline.

Each prints one JSON object on stdout.  The ``boundedproc`` it imports is the
one on ``PYTHONPATH`` that ``run.py`` passes down.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

PAGE = 4096


def _touch(nbytes: int) -> bytearray:
    """A bytearray of nbytes with every page written (so it is resident)."""
    buf = bytearray(nbytes)
    # bytearray(n) may come from calloc's zero pages; write one byte per page.
    buf[::PAGE] = b"\x01" * len(range(0, nbytes, PAGE))
    return buf


def _current_rss() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except ImportError:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Reset this process's peak RSS to its current RSS where Linux allows it."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss() -> int:
    """Peak RSS of this process's own address space, in bytes.

    On Linux this is ``VmHWM``, not ``ru_maxrss``: after a vfork+exec (which is
    how ``run.py`` starts this process) ``ru_maxrss`` starts at the *parent's*
    peak, because the kernel folds the high-water mark of the address space it
    replaces into the new process's rusage.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def spawn_latency(alloc: int, rounds: int, calls: int, forks: int) -> dict[str, object]:
    """Median seconds of run(["/bin/true"]) with `alloc` bytes touched first."""
    import boundedproc

    hold = _touch(alloc) if alloc else bytearray()
    rss = _current_rss()
    for _ in range(5):
        boundedproc.run(["/bin/true"])
    samples: list[float] = []
    for _ in range(rounds):
        for _ in range(calls):
            t0 = time.perf_counter()
            r = boundedproc.run(["/bin/true"])
            samples.append(time.perf_counter() - t0)
            if r.exit_code != 0:
                raise SystemExit(f"/bin/true failed: {r}")
    fork_samples: list[float] = []
    for _ in range(forks):  # what a copying spawn costs here, for scale
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/true", ["/bin/true"])
        os.waitpid(pid, 0)
        fork_samples.append(time.perf_counter() - t0)
    del hold
    return {
        "median": statistics.median(samples),
        "samples": len(samples),
        "rss": rss,
        "fork_exec_median": statistics.median(fork_samples) if fork_samples else None,
    }


def peak_rss(which: str, nbytes: int) -> dict[str, object]:
    """Peak RSS above baseline while capturing nbytes of stdout."""
    cmd = ["head", "-c", str(nbytes), "/dev/zero"]
    if which == "ours":
        import boundedproc

        boundedproc.run(["/bin/true"])  # load the core and warm the import
        _reset_peak()
        base = _current_rss()
        base_peak = _peak_rss()
        r = boundedproc.run(cmd, max_output=None, timeout=120)
        got = len(r.stdout)
    else:
        subprocess.run(["/bin/true"], capture_output=True, check=False)
        _reset_peak()
        base = _current_rss()
        base_peak = _peak_rss()
        p = subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        got = len(p.stdout)
    peak = _peak_rss()
    if got != nbytes:
        raise SystemExit(f"captured {got} bytes, expected {nbytes}")
    return {"base": base, "base_peak": base_peak, "peak": peak, "above": peak - base}


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("spawn-latency")
    p.add_argument("--alloc", type=int, default=0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--forks", type=int, default=0)
    p = sub.add_parser("peak-rss")
    p.add_argument("which", choices=["ours", "subprocess"])
    p.add_argument("--bytes", type=int, required=True)
    a = parser.parse_args()
    if a.what == "spawn-latency":
        out = spawn_latency(a.alloc, a.rounds, a.calls, a.forks)
    else:
        out = peak_rss(a.which, a.bytes)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
