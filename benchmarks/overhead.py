"""Where the time of one ``run(["/bin/true"])`` goes: Python versus the C core.

Run it alone for a breakdown (``python benchmarks/overhead.py [--calls N]``, or
``--capture BYTES`` to split a large capture the same way);
``run.py`` imports ``measure`` for its informational row.

The split is measured, not profiled: for the duration of the measurement
``boundedproc._native.lib`` is replaced by a proxy that times every call into
the compiled core, and ``boundedproc._native.execute`` by a wrapper that times
the marshalling layer.  The proxy itself costs well under a microsecond a call,
which is inside the noise of a millisecond-long spawn.

* ``c_start``: ``bp_start`` (pipes, vfork, the child's setup until execve).
* ``c_wait``: ``bp_wait`` (the poll loop until the leader is reaped and the
  pipes are at EOF; most of it is the child itself running).
* ``c_other``: ``bp_take_output`` (the copy of the kept bytes into the
  result's ``bytes``) and ``bp_free``.
* ``py_native``: ``_native.execute`` minus the C calls (``ffi.new`` of the
  spec, argv and result structs, borrowing the signal wakeup fd, building
  ``NativeOutcome``).
* ``py_run``: ``run()`` minus ``_native.execute`` (validation, ``PATH``
  candidates, ``NativeSpec``, ``Result``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any


class _TimedLib:
    """Forwards attribute access to the real cffi ``lib``, timing calls of bp_*."""

    def __init__(self, lib: Any, acc: dict[str, float]) -> None:
        self._lib = lib
        self._acc = acc
        self._wrapped: dict[str, Callable[..., Any]] = {}

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._lib, name)
        if not name.startswith("bp_") or not callable(value):
            return value
        wrapped = self._wrapped.get(name)
        if wrapped is None:
            acc = self._acc
            key = {"bp_start": "c_start", "bp_wait": "c_wait"}.get(name, "c_other")

            def wrapped(*args: Any, _f: Any = value, _k: str = key) -> Any:
                t0 = time.perf_counter()
                try:
                    return _f(*args)
                finally:
                    acc[_k] += time.perf_counter() - t0

            self._wrapped[name] = wrapped
        return wrapped


def measure(calls: int = 300, cmd: tuple[str, ...] = ("/bin/true",), warmup: int = 10,
            **options: Any) -> dict[str, float]:
    """Median seconds per part of one ``run(cmd, **options)`` over `calls` calls."""
    import boundedproc
    from boundedproc import _native

    real_lib = _native.lib
    real_execute = _native.execute
    acc = {"c_start": 0.0, "c_wait": 0.0, "c_other": 0.0, "execute": 0.0}

    def timed_execute(spec: Any, *args: Any, **kwargs: Any) -> Any:
        # Pass through whatever _native.execute takes (on_output=, control=, ...),
        # so a new keyword there never breaks the benchmark.
        t0 = time.perf_counter()
        try:
            return real_execute(spec, *args, **kwargs)
        finally:
            acc["execute"] += time.perf_counter() - t0

    parts: dict[str, list[float]] = {k: [] for k in
                                     ("total", "c_start", "c_wait", "c_other", "c_total",
                                      "py_native", "py_run", "py_total")}
    _native.lib = _TimedLib(real_lib, acc)
    _native.execute = timed_execute
    try:
        for i in range(calls + warmup):
            for k in acc:
                acc[k] = 0.0
            t0 = time.perf_counter()
            result = boundedproc.run(list(cmd), **options)
            total = time.perf_counter() - t0
            del result  # freeing a large capture is not part of the call
            if i < warmup:
                continue
            c_total = acc["c_start"] + acc["c_wait"] + acc["c_other"]
            parts["total"].append(total)
            parts["c_start"].append(acc["c_start"])
            parts["c_wait"].append(acc["c_wait"])
            parts["c_other"].append(acc["c_other"])
            parts["c_total"].append(c_total)
            parts["py_native"].append(acc["execute"] - c_total)
            parts["py_run"].append(total - acc["execute"])
            parts["py_total"].append(total - c_total)
    finally:
        _native.lib = real_lib
        _native.execute = real_execute
    return {k: statistics.median(v) for k, v in parts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--capture", type=int, metavar="BYTES",
                        help="time a capture of BYTES from head -c instead of /bin/true")
    a = parser.parse_args()
    if a.capture:
        m = measure(a.calls, ("head", "-c", str(a.capture), "/dev/zero"), warmup=1,
                    max_output=None)
    else:
        m = measure(a.calls)
    for k, v in m.items():
        print(f"{k:10s} {v * 1e6:9.1f} us")


if __name__ == "__main__":
    main()
