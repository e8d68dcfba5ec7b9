"""A/B: the same measurement on two builds of boundedproc, interleaved call by call.

Usage:
    python benchmarks/ab.py A_ROOT B_ROOT [--what capture|spawn|spawn-cpu|many|many-cpu|many-busy|threads]
                            [--bytes N] [--reps R] [--uncontained]

A_ROOT and B_ROOT are checkouts with an in-place build (``python
csrc/build_ffi.py``).  One worker process per build imports its own
``boundedproc``; the controller asks them in turn (A, B, B, A, ...), so load
from other processes on the machine hits both alike.  This is how a proposed
change to ``csrc/`` or ``boundedproc/`` is shown to help before it is made.

``capture`` times ``run(["head", "-c", N, "/dev/zero"], max_output=None)``
after touching and freeing 2N bytes (see ``run._warm_memory``) and reports
MiB/s; ``spawn`` times ``run(["/bin/true"])`` in blocks of 50 and reports the
median in microseconds, ``spawn-cpu`` the calling thread's own CPU a run
(``time.thread_time``: the Python side and the core's system calls, none of
the child's); ``many`` times ``run_many`` of 1,000 ``/bin/true`` at
jobs=4 (B9's shape) and reports microseconds a run, ``many-cpu`` the calling
process's own CPU a run (user + system) in the same call, ``many-busy`` the
time a run of 200 while another Python thread of the caller spins (every
return from C then waits for the GIL), ``threads`` four Python threads each
calling ``run(["/bin/true"])`` 250 times (fresh threads, so fresh supervisors,
each round) and reports microseconds a run of the whole.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

WORKER = r"""
import resource, statistics, sys, threading, time
sys.path.insert(0, sys.argv[1])
import boundedproc as bp
CONTAIN = None if sys.argv[2] == "default" else False

def spin_until(stop):
    x = 0
    while not stop:
        x += 1

for line in sys.stdin:
    what, arg = line.split()
    n = int(arg)
    if what == "capture":
        buf = bytearray(2 * n); buf[::4096] = b"\x01" * len(range(0, 2 * n, 4096)); del buf
        t0 = time.perf_counter()
        r = bp.run(["head", "-c", str(n), "/dev/zero"], max_output=None, timeout=300)
        d = time.perf_counter() - t0
        assert len(r.stdout) == n
        del r
        print(n / d / 2**20, flush=True)
    elif what == "many-busy":
        n, stop = 200, []
        spin = threading.Thread(target=spin_until, args=(stop,))
        spin.start()
        t0 = time.perf_counter()
        try:
            for r in bp.run_many((["/bin/true"] for _ in range(n)), jobs=4, timeout=10, contain=CONTAIN):
                assert r.exit_code == 0, r
        finally:
            stop.append(1)
            spin.join()
        print((time.perf_counter() - t0) / n * 1e6, flush=True)
    elif what.startswith("many"):
        c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        for r in bp.run_many((["/bin/true"] for _ in range(n)), jobs=4, timeout=10, contain=CONTAIN):
            assert r.exit_code == 0, r
        d, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
        print((cpu if what == "many-cpu" else d) / n * 1e6, flush=True)
    elif what == "threads":
        def loop(k):
            for _ in range(k):
                bp.run(["/bin/true"], contain=CONTAIN)
        ts = [threading.Thread(target=loop, args=(n // 4,)) for _ in range(4)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        print((time.perf_counter() - t0) / (n // 4 * 4) * 1e6, flush=True)
    elif what == "spawn-cpu":
        for _ in range(20):
            bp.run(["/bin/true"], contain=CONTAIN)
        t0 = time.thread_time()
        for _ in range(n):
            bp.run(["/bin/true"], contain=CONTAIN)
        print((time.thread_time() - t0) / n * 1e6, flush=True)
    else:
        xs = []
        for _ in range(n):
            t0 = time.perf_counter(); bp.run(["/bin/true"], contain=CONTAIN); xs.append(time.perf_counter() - t0)
        print(statistics.median(xs) * 1e6, flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--what", choices=["capture", "spawn", "spawn-cpu", "many", "many-cpu", "many-busy",
                                             "threads"],
                        default="capture")
    parser.add_argument("--bytes", type=int, default=512 << 20)
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--uncontained", action="store_true",
                        help="every run with contain=False (default: contained where supported)")
    a = parser.parse_args()
    contain = "uncontained" if a.uncontained else "default"
    workers = {k: subprocess.Popen([sys.executable, "-c", WORKER, root, contain],
                                   stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
               for k, root in (("A", a.a), ("B", a.b))}
    arg = {"capture": a.bytes, "spawn": 50}.get(a.what, 1000)
    got: dict[str, list[float]] = {"A": [], "B": []}
    try:
        for i in range(a.reps):
            for k in ("A", "B") if i % 2 == 0 else ("B", "A"):
                w = workers[k]
                assert w.stdin is not None and w.stdout is not None
                w.stdin.write(f"{a.what} {arg}\n")
                w.stdin.flush()
                got[k].append(float(w.stdout.readline()))
    finally:
        for w in workers.values():
            assert w.stdin is not None
            w.stdin.close()
            w.wait()
    unit = "MiB/s" if a.what == "capture" else "us"
    for k, root in (("A", a.a), ("B", a.b)):
        xs = got[k]
        print(f"{k} {root}: median {statistics.median(xs):.0f} {unit}  "
              f"[{', '.join(f'{x:.0f}' for x in xs)}]")
    ratio = statistics.median(got["B"]) / statistics.median(got["A"])
    print(f"B/A = {ratio:.2f}x")


if __name__ == "__main__":
    main()
