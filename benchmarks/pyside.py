"""The Python side of a run, piece by piece: microseconds per call, measured alone.

    python benchmarks/pyside.py [--calls N] [--env-size N] [--profile run|many]

Each piece of ``run(["/bin/true"])`` (and of ``run_many``'s dispatch) is called
on its own in a loop, with the inputs a real run gives it, and the median of
several loops is printed in microseconds per call.  Nothing is spawned except
where a row says so (``execute`` and the whole-run rows).  ``--profile`` runs
cProfile over 2,000 contained runs (``run``) or one ``run_many`` of 2,000
(``many``) and prints the top functions by own time.

It measures the checkout around it (``PYTHONPATH`` or an in-place build) and
changes nothing in it.  The numbers are what benchmarks/README.md quotes under
"The Python side of a run".
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import boundedproc
from boundedproc import _cancel, _command, _native, _options, _run, _scale

TRUE = ["/bin/true"]


def per_call(f: Callable[[], object], calls: int, repeats: int = 7) -> float:
    """Median over `repeats` loops of `calls` calls: seconds per call."""
    for _ in range(min(calls, 50)):
        f()
    loops = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        loops.append((time.perf_counter() - t0) / calls)
    return statistics.median(loops)


def defaults() -> dict[str, Any]:
    """run()'s keyword defaults, as run() passes them to validate()."""
    sig = inspect.signature(_run.run)
    names = set(inspect.signature(_options.validate).parameters)
    return {k: p.default for k, p in sig.parameters.items() if k in names}


def _handoff() -> Callable[[], object]:
    """One command's trip through run_many's machinery with a job that does nothing: a
    ``_Slot``, a put on the workers' queue, a worker that fills it, the consumer's take."""
    import queue
    import threading

    tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def worker() -> None:
        while (slot := tasks.get()) is not None:
            slot.result = slot
            slot.done.release()

    threading.Thread(target=worker, daemon=True).start()

    def one() -> object:
        slot = _scale._Slot()
        tasks.put(slot)
        return slot.take()

    return one


def pieces(calls: int) -> list[tuple[str, float]]:
    rows: list[tuple[str, float]] = []
    kw = defaults()
    opts = _options.validate(**kw)
    prepared = _run.prepare(TRUE, False, opts)
    assert prepared.spec is not None
    out = _native.execute(prepared.spec)
    items = _command.env_items(None)
    started = time.monotonic()

    rows.append(("_options.validate (default options)", per_call(lambda: _options.validate(**kw),
                                                                  calls)))
    rows.append(("_run.prepare (whole)", per_call(lambda: _run.prepare(TRUE, False, opts), calls)))
    rows.append(("  _command.argv_of", per_call(lambda: _command.argv_of(TRUE, False), calls)))
    rows.append((f"  _command.environment merge ({len(os.environ)} vars)",
                 per_call(lambda: _command.environment(items, "merge"), calls)))
    rows.append(("  _command.exec_paths", per_call(lambda: _command.exec_paths(b"/bin/true",
                                                                               b"/usr/bin"),
                                                   calls)))
    spec_fields = {f: getattr(prepared.spec, f) for f in _native.NativeSpec.__slots__}
    rows.append(("  NativeSpec(...) by keyword (a first run of its options)",
                 per_call(lambda: _native.NativeSpec(**spec_fields), calls)))
    positional = tuple(spec_fields.values())
    rows.append(("  NativeSpec(...) from the options' memo (positional)",
                 per_call(lambda: _native.NativeSpec(*positional), calls)))
    rows.append(("_run._to_result (Result from an outcome)",
                 per_call(lambda: _run._to_result(out, prepared, started), calls)))
    rows.append(("  tuple(text_arg(a)) for args",
                 per_call(lambda: tuple(_command.text_arg(a) for a in prepared.args), calls)))
    outcome = tuple(getattr(out, f) for f in _native.NativeOutcome.__slots__)
    rows.append(("NativeOutcome(...) alone (positional)",
                 per_call(lambda: _native.NativeOutcome(*outcome), calls)))

    # _native.execute's own Python: spec struct, supervisor pool, wakeup fd.
    spec = prepared.spec
    rows.append(("_native spec struct (_cspec, and the result and handle ffi.new)",
                 per_call(lambda: _spec_struct(spec), calls)))
    rows.append(("_native._acquire + _release (idle supervisor)",
                 per_call(lambda: _native._release(_acquire()), calls)))
    rows.append(("_native._Wakeup enter/exit (main thread)",
                 per_call(_wakeup_cycle, calls)))
    rows.append(("_native.execute, contained /bin/true (whole, spawns)",
                 per_call(lambda: _native.execute(spec), max(calls // 10, 100), 5)))
    rows.append(("run(['/bin/true']) contained (whole, spawns)",
                 per_call(lambda: boundedproc.run(TRUE), max(calls // 10, 100), 5)))
    rows.append(("run(['/bin/true'], contain=False) (whole, spawns)",
                 per_call(lambda: boundedproc.run(TRUE, contain=False), max(calls // 10, 100), 5)))

    # run_many's dispatch, per command, in the consumer thread.
    mopts: dict[str, Any] = {k: v for k, v in kw.items()}
    mopts["shell"] = False
    sw = boundedproc.Cancel()
    rows.append(("run_many: _per_command", per_call(lambda: _scale._per_command(TRUE, mopts),
                                                    calls)))
    rows.append(("run_many: argv_of (a plain command's check)",
                 per_call(lambda: _command.argv_of(TRUE, False), calls)))
    rows.append(("run_many: _validate (a dry run(), a Job's check)",
                 per_call(lambda: _scale._validate(TRUE, mopts), calls)))
    rows.append(("run_async: _run_watching's ALSO_CANCEL set/reset",
                 per_call(lambda: _cancel.ALSO_CANCEL.reset(_cancel.ALSO_CANCEL.set(sw)), calls)))
    rows.append(("run_many: queue put + worker + slot lock (no-op job, 1 worker)",
                 per_call(_handoff(), calls)))
    with ThreadPoolExecutor(max_workers=4) as pool:
        rows.append(("  for scale: pool.submit + Future.result (no-op job, 4 workers)",
                     per_call(lambda: pool.submit(int).result(), calls)))
    n = max(calls // 5, 200)
    manys: list[float] = []
    ones: list[float] = []
    for _ in range(5):  # interleaved, so load from elsewhere hits both alike
        t0 = time.perf_counter()
        for _r in boundedproc.run_many((TRUE for _ in range(n)), jobs=1):
            pass
        manys.append((time.perf_counter() - t0) / n)
        ones.append(per_call(lambda: boundedproc.run(TRUE), n, 1))
    many1, one = statistics.median(manys), statistics.median(ones)
    rows.append(("run_many(jobs=1) per command (spawns)", many1))
    rows.append(("  minus a run() in a loop: dispatch per command", many1 - one))
    sw.close()
    return rows


def _spec_struct(spec: _native.NativeSpec) -> None:
    """What ``_native.execute`` builds before ``bp_start``: the spec struct as a run makes
    it (``_cspec``), the result struct and the handle."""
    _native._cspec(spec, False)
    _native.ffi.new("struct bp_result *")
    _native.ffi.new("struct bp_run **")


def _acquire() -> Any:
    got = _native._acquire(False)
    assert isinstance(got, _native._Supervisor)
    return got


def _wakeup_cycle() -> None:
    with _native._Wakeup():
        pass


def in_situ(calls: int, contain: bool) -> dict[str, float]:
    """Median microseconds per piece inside real runs of ``run(["/bin/true"])``.

    A tight loop over one piece runs with hot caches; inside a real run the
    piece runs after a spawn and a poll, with caches and branch predictors
    cold, and costs more.  Here every piece is wrapped in place (module
    attributes swapped for timing wrappers, restored after) and timed in each
    of `calls` runs.  ``lib`` is swapped for a plain namespace holding the same
    attributes, with the C entry points that block wrapped, so that the rest
    of ``_native`` is timed as its own Python.
    """
    import types

    acc: dict[str, float] = {}
    patched: list[tuple[Any, str, Any]] = []

    def wrap(mod: Any, name: str, key: str) -> None:
        real = getattr(mod, name)

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                acc[key] = acc.get(key, 0.0) + time.perf_counter() - t0

        patched.append((mod, name, real))
        setattr(mod, name, timed)

    real_lib = _native.lib
    ns = types.SimpleNamespace(**{n: getattr(real_lib, n) for n in dir(real_lib)})
    patched.append((_native, "lib", real_lib))
    _native.lib = ns
    for n in ("bp_start", "bp_wait", "bp_take_output", "bp_free"):
        wrap(ns, n, "C " + n)
    wrap(_run, "validate", "_options.validate")
    wrap(_run, "prepare", "_run.prepare")
    wrap(_command, "environment", "  _command.environment")
    wrap(_run, "_to_result", "_run._to_result")
    wrap(_native, "execute", "_native.execute")
    wrap(_native, "_acquire", "  _native._acquire")
    wrap(_native, "_release", "  _native._release")
    wrap(_native, "_drive", "  _native._drive")
    per: dict[str, list[float]] = {}
    try:
        for i in range(calls + 20):
            acc.clear()
            t0 = time.perf_counter()
            boundedproc.run(TRUE, contain=contain)
            acc["run() total"] = time.perf_counter() - t0
            if i >= 20:
                for k, v in acc.items():
                    per.setdefault(k, []).append(v)
    finally:
        for mod, name, real in reversed(patched):
            setattr(mod, name, real)
    med = {k: statistics.median(v) for k, v in per.items()}
    c = sum(v for k, v in med.items() if k.startswith("C "))
    med["_native.execute own Python (minus C, _drive aside)"] = (
        med["_native.execute"] - med["  _native._drive"] - med.get("  _native._acquire", 0.0)
        - med.get("  _native._release", 0.0))
    med["  _native._drive own Python (minus C)"] = med["  _native._drive"] - c
    med["run() Python in all (total minus C)"] = med["run() total"] - c
    return med


def profile(what: str) -> None:
    n = 2000
    prof = cProfile.Profile()
    if what == "run":
        for _ in range(20):
            boundedproc.run(TRUE)
        prof.enable()
        for _ in range(n):
            boundedproc.run(TRUE)
        prof.disable()
    else:
        list(boundedproc.run_many([TRUE] * 20, jobs=4))
        prof.enable()
        for _r in boundedproc.run_many((TRUE for _ in range(n)), jobs=4):
            pass
        prof.disable()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--env-size", type=int, default=0,
                        help="add N variables of 30 bytes to os.environ first")
    parser.add_argument("--profile", choices=("run", "many"))
    a = parser.parse_args()
    for i in range(a.env_size):
        os.environ[f"BP_PYSIDE_{i}"] = "x" * 16
    if a.profile:
        profile(a.profile)
        return
    for contain in (True, False):
        print(f"in real runs, contain={contain} (median of {a.calls // 4}):")
        for name, sec in in_situ(a.calls // 4, contain).items():
            print(f"{sec * 1e6:9.1f} us  {name}")
    print("alone, hot loop:")
    for name, sec in pieces(a.calls):
        print(f"{sec * 1e6:9.1f} us  {name}")


if __name__ == "__main__":
    main()
