"""Where ``python -m grader`` runs the checks: a thread pool here, or a Dask cluster.

``--executor local`` (the default) grades with a pool of ``--jobs`` threads in this process:
the runner releases the GIL while a check runs, so threads are enough. ``--executor
dask://HOST:PORT`` grades on the ``distributed`` cluster whose scheduler listens there, through
``Client.get_executor()``, a ``concurrent.futures.Executor``. ``distributed`` is the optional
``dask`` extra and is imported only when asked for. The package index's ``boundedproc`` is not
this project, so the install hint names ``distributed`` itself, or the extra of a checkout
(``pip install '.[dask]'``), never ``boundedproc[dask]``.

On a cluster, each claim travels to a worker as data (a ``ClaimLine``), the worker verifies it
with its own ``boundedproc`` and sends back a ``ClaimOutcome``; duplicates are flagged here once
every grade is back, so the output equals a local run's. Every worker therefore needs the same
version of this package installed and the checks' working directory at the same path.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

__all__ = ["ExecutorUnavailable", "dask_executor", "parse_executor"]

#: How to get ``distributed``: the ``dask`` extra's requirement (pyproject.toml), or the extra
#: itself from a checkout or an sdist of this project.
_INSTALL_DISTRIBUTED = "pip install 'distributed>=2023.1', or from a checkout pip install '.[dask]'"

LOCAL = "local"
DASK_SCHEME = "dask"


class ExecutorUnavailable(RuntimeError):
    """The executor named cannot be used: its package is missing or it cannot be reached.

    The message is written for the person who named it.
    """


def parse_executor(text: str) -> str | None:
    """Read an ``--executor`` value.

    Args:
        text: ``local``, or ``dask://HOST:PORT`` (an IPv6 host in brackets).

    Returns:
        ``None`` for ``local``; otherwise the scheduler's address, ``tcp://HOST:PORT``.

    Raises:
        ValueError: Any other value.
    """
    if text == LOCAL:
        return None
    expected = f"expected '{LOCAL}' or '{DASK_SCHEME}://HOST:PORT', not {text!r}"
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(expected) from None
    if (
        parts.scheme != DASK_SCHEME
        or not parts.hostname
        or port is None
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(expected)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"tcp://{host}:{port}"


@contextmanager
def dask_executor(address: str, *, connect_timeout: float) -> Iterator[Executor]:
    """Connect to a Dask scheduler and lend its ``concurrent.futures`` executor.

    The executor submits with ``pure=False``: a check is run each time it is asked for, never
    answered from another claim's task with the same arguments. Leaving the block closes the
    client, which releases every task not yet finished; a check already running on a worker
    goes on until it ends or its own timeout kills it, and its result is dropped.

    Args:
        address: The scheduler, ``tcp://HOST:PORT``.
        connect_timeout: Seconds to wait for the scheduler before giving up.

    Yields:
        The cluster's executor.

    Raises:
        ExecutorUnavailable: ``distributed`` is not installed, or the scheduler did not answer
            within ``connect_timeout``.
    """
    try:
        distributed: Any = importlib.import_module("distributed")
    except ImportError as exc:
        raise ExecutorUnavailable(
            "a Dask executor needs the optional 'distributed' package "
            f"({_INSTALL_DISTRIBUTED}): {exc}"
        ) from exc
    try:
        client = distributed.Client(address, timeout=connect_timeout, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ExecutorUnavailable(
            f"cannot reach the Dask scheduler at {address} within {connect_timeout:g} s: {exc}"
        ) from exc
    try:
        yield client.get_executor(pure=False)
    finally:
        client.close()
