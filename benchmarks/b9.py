"""B9: many short commands, ``run_many(jobs=4)`` vs the machine's floor and ``subprocess.run``.

2,000 (``--quick``: 200) runs of ``/bin/true``, each side in the same process and
the same run.  The targets: run_many (contained, and again with contain=False)
at least 0.85 of the speed of ``benchmarks/floor.c`` from 4 threads (SPEC 9.6;
run.py passes the compiled floor in), and at least 1.5x faster than a 4-thread
pool over ``subprocess.run`` (SPEC 7).  Every side starts each command in a new
session and captures its output, four at a time.  Each side is measured
``repeats`` times, interleaved, and its best time is kept, so a noisy moment on
the machine does not favour either.

Run as a script it also prints the CPU each command costs, in this process and
in its children (the command, and the containment supervisor when there is
one): with more jobs than CPUs the run is CPU-bound, and the command's own
exec/link/exit time is a floor no runner goes under.  It also times run_many
with ``contain=False``, to show what containment (SPEC 5) costs per command.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from boundedproc._scale import run_many

JOBS = 4
TRUE = "/bin/true"


def _ours(n: int, **options: Any) -> None:
    for result in run_many(([TRUE] for _ in range(n)), jobs=JOBS, timeout=10, **options):
        if result.exit_code != 0:
            raise RuntimeError(f"run_many: {TRUE} failed: {result}")


def _ours_uncontained(n: int) -> None:
    _ours(n, contain=False)


def _one_subprocess(_: int) -> int:
    return subprocess.run([TRUE], check=False, capture_output=True, timeout=10,
                          start_new_session=True).returncode


def _theirs(n: int) -> None:
    with ThreadPoolExecutor(max_workers=JOBS) as pool:
        for code in pool.map(_one_subprocess, range(n)):
            if code != 0:
                raise RuntimeError(f"subprocess.run: {TRUE} exited {code}")


def _cpu() -> tuple[float, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime


def _timed(side: Callable[[int], float | None], n: int) -> tuple[float, float, float]:
    """Wall seconds, and CPU seconds in this process and in the children, for n commands.

    A side that returns a float has timed itself (floor.c, whose own start-up is
    then not counted); that is its wall time.
    """
    cpu0 = _cpu()
    started = time.perf_counter()
    own = side(n)
    wall = time.perf_counter() - started if own is None else own
    cpu1 = _cpu()
    return wall, cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]


Timing = tuple[float, float, float]


def _rounds(quick: bool, sides: list[Callable[[int], float | None]]) -> list[Timing]:
    n = 200 if quick else 2000
    repeats = 1 if quick else 3
    for side in sides:
        side(20)  # warm-up: import-time work, the first threads, page cache
    times: list[list[Timing]] = [[] for _ in sides]
    for _ in range(repeats):  # interleaved, so a noisy moment hits every side alike
        for i, side in enumerate(sides):
            times[i].append(_timed(side, n))
    return [min(t) for t in times]


def measure(quick: bool,
            floor: Callable[[int, int], float] | None = None) -> dict[str, float]:
    """Time every side, interleaved round by round.

    Args:
        quick: 200 commands and one round instead of 2,000 and three.
        floor: ``floor(runs, threads)`` -> wall seconds of benchmarks/floor.c
            (run.py's ``floor_run``); None leaves that side out.

    Returns:
        The best wall time of each side, in seconds: ``ours`` (run_many,
        contained by default), ``uncontained`` (run_many, contain=False),
        ``theirs`` (the subprocess.run pool) and, with ``floor``, ``floor``
        (floor.c from JOBS threads).
    """
    names = ["ours", "uncontained", "theirs"]
    sides: list[Callable[[int], float | None]] = [_ours, _ours_uncontained, _theirs]
    if floor is not None:
        names.append("floor")
        sides.append(lambda n: floor(n, JOBS))
    return {name: t[0] for name, t in zip(names, _rounds(quick, sides))}


def main() -> None:
    parser = argparse.ArgumentParser(description="B9: run_many vs a thread pool of subprocess.run")
    parser.add_argument("--quick", action="store_true", help="200 commands, one round")
    quick = parser.parse_args().quick
    n = 200 if quick else 2000
    ours, theirs, bare = _rounds(quick, [_ours, _theirs, _ours_uncontained])
    print(f"B9  {n} x {TRUE}, jobs={JOBS}, {os.cpu_count()} CPUs   "
          "(per command: wall, CPU in this process, CPU in the child)")
    for name, (wall, me, child) in (("run_many", ours), ("ThreadPool+subprocess.run", theirs),
                                    ("run_many, contain=False", bare)):
        print(f"    {name:26s} {wall:7.3f} s   {wall / n * 1e3:.3f} ms  "
              f"{me / n * 1e3:.3f} ms  {child / n * 1e3:.3f} ms")
    print(f"    speedup: {theirs[0] / ours[0]:.2f}x  (target >= 1.5x); "
          f"with contain=False: {theirs[0] / bare[0]:.2f}x")


if __name__ == "__main__":
    main()
