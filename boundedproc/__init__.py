"""boundedproc: run commands you did not write, bounded and killed as a group.

    >>> from boundedproc import run
    >>> r = run(["echo", "hi"], timeout=5)
    >>> r.exit_code, r.stdout
    (0, b'hi\\n')
"""

from boundedproc._cancel import Cancel
from boundedproc._native import (
    CANCEL_EXIT_CODE,
    DEADLINE_EXIT_CODE,
    SPAWN_FAILURE_EXIT_CODE,
    containment_status,
)
from boundedproc._options import CAPTURE, DEVNULL, INHERIT, Limits, Stream
from boundedproc._result import ProcessFailed, Result
from boundedproc._run import run
from boundedproc._scale import Job, run_async, run_many
from boundedproc._version import __version__

__all__ = [
    "CANCEL_EXIT_CODE",
    "CAPTURE",
    "DEADLINE_EXIT_CODE",
    "DEVNULL",
    "INHERIT",
    "SPAWN_FAILURE_EXIT_CODE",
    "Cancel",
    "Job",
    "Limits",
    "ProcessFailed",
    "Result",
    "Stream",
    "__version__",
    "containment_status",
    "run",
    "run_async",
    "run_many",
]
