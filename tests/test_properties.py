"""Property tests (hypothesis) of what run() carries: argument vectors, stdin, and the cap.

Inputs are drawn, not chosen: arbitrary bytes in argv entries and stdin payloads, and random
plans of writes to stdout and stderr whose totals fall on either side of ``max_output``.
"""

from __future__ import annotations

import json
import random
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from boundedproc import run

PY = sys.executable

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads /proc/self/cmdline")

# Prints the child's own argv exactly as the kernel holds it, with no decoding in between.
ECHO_ARGV = "import sys; sys.stdout.buffer.write(open('/proc/self/cmdline', 'rb').read())"

# Writes a plan of (fd, size, seed) chunks, each of seeded random bytes, with os.write so that
# nothing is buffered and the chunks reach the pipes in plan order.
WRITER = """
import json, os, random, sys
for fd, size, seed in json.loads(sys.argv[1]):
    data = random.Random(seed).randbytes(size)
    while data:
        data = data[os.write(fd, data):]
"""

PROFILE = settings(max_examples=60, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

no_nul_bytes = st.binary(max_size=40).map(lambda b: b.replace(b"\0", b""))
no_nul_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                      max_size=20)


def chunk(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


# ---- argument vectors ---------------------------------------------------------------------

@PROFILE
@given(st.lists(st.one_of(no_nul_bytes, no_nul_text), max_size=24))
def test_argv_round_trips_exactly(args: list[bytes | str]) -> None:
    """Any argument vector without NUL reaches the child byte for byte, empty entries included."""
    r = run([PY, "-c", ECHO_ARGV, *args], timeout=30)
    assert r.ok, r
    sent = [a if isinstance(a, bytes) else a.encode("utf-8") for a in args]
    received = r.stdout.split(b"\0")
    assert received[-1] == b""
    assert received[3:-1] == sent
    assert list(r.args[3:]) == [a.decode("utf-8", "surrogateescape") for a in sent]


@PROFILE
@given(st.lists(no_nul_bytes, min_size=1, max_size=8), st.integers(0, 7),
       st.integers(0, 40))
def test_argv_with_a_nul_is_refused_whole(args: list[bytes], where: int, at: int) -> None:
    """One NUL byte anywhere in any entry: nothing runs and the result says `not spawned:`."""
    where %= len(args)
    entry = args[where]
    at = min(at, len(entry))
    args[where] = entry[:at] + b"\0" + entry[at:]
    r = run([PY, "-c", ECHO_ARGV, *args], timeout=30)
    assert not r.spawned and r.exit_code == 127 and r.stdout == b""
    assert r.runner_error is not None and r.runner_error.startswith("not spawned: ")


# ---- stdin payloads -----------------------------------------------------------------------

payloads = st.one_of(
    st.binary(max_size=2048),
    st.builds(chunk, st.integers(0, 2**32), st.integers(0, 600_000)),
)


@PROFILE
@given(payloads)
def test_stdin_payload_round_trips_through_cat(payload: bytes) -> None:
    """Any payload, from empty to several pipe buffers, comes back from `cat` exactly."""
    r = run(["cat"], stdin=payload, timeout=30)
    assert r.ok, r
    assert r.stdout == payload and r.stdin_delivered
    assert r.output_bytes == len(payload)


@PROFILE
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_str_stdin_round_trips_as_utf8(payload: str) -> None:
    """A str payload arrives as its UTF-8 encoding and reads back with text=True."""
    r = run(["cat"], stdin=payload, timeout=30, text=True)
    assert r.ok and r.stdout == payload


# ---- interleavings around the cap ---------------------------------------------------------

@st.composite
def plans(draw: st.DrawFn) -> tuple[int, list[tuple[int, int, int]]]:
    """A cap and a plan of writes to fds 1 and 2 whose total lands near, under or over it."""
    cap = draw(st.integers(0, 150_000))
    plan = draw(st.lists(st.tuples(st.sampled_from([1, 2]), st.integers(0, 70_000),
                                   st.integers(0, 2**32)), max_size=10))
    if draw(st.booleans()):
        # Top the plan up to within a few bytes of the cap, to hit the boundary exactly.
        total = sum(size for _, size, _ in plan)
        delta = draw(st.integers(-3, 3))
        if cap + delta - total >= 0:
            plan.append((draw(st.sampled_from([1, 2])), cap + delta - total,
                         draw(st.integers(0, 2**32))))
    return cap, plan


def written(plan: list[tuple[int, int, int]], fd: int | None = None) -> bytes:
    """What the writer writes, to one fd or to both in plan order."""
    return b"".join(chunk(seed, size) for f, size, seed in plan if fd is None or f == fd)


@PROFILE
@given(plans())
def test_merged_cap_keeps_the_first_bytes_in_order(case: tuple[int, list]) -> None:
    """merge_stderr: the kept bytes are exactly the first max_output bytes written, in order."""
    cap, plan = case
    everything = written(plan)
    r = run([PY, "-c", WRITER, json.dumps(plan)], max_output=cap, merge_stderr=True,
            timeout=30)
    assert r.exit_code == 0 and not r.timed_out and r.runner_error is None
    assert r.stdout == everything[:cap]
    assert r.stderr == b""
    assert r.output_bytes == len(everything)
    assert r.output_truncated == (len(everything) > cap)


@PROFILE
@given(plans())
def test_separate_streams_share_one_cap(case: tuple[int, list]) -> None:
    """Without merge: both streams keep min(total, cap) bytes, each a prefix of its own writes."""
    cap, plan = case
    out, err = written(plan, 1), written(plan, 2)
    total = len(out) + len(err)
    r = run([PY, "-c", WRITER, json.dumps(plan)], max_output=cap, timeout=30)
    assert r.exit_code == 0 and not r.timed_out and r.runner_error is None
    assert len(r.stdout) + len(r.stderr) == min(total, cap)
    assert out.startswith(r.stdout) and err.startswith(r.stderr)
    assert r.output_bytes == total
    assert r.output_truncated == (total > cap)


@PROFILE
@given(plans())
def test_kill_on_overflow_keeps_the_same_prefix(case: tuple[int, list]) -> None:
    """on_overflow='kill': the same first max_output bytes are kept; only a real overflow kills."""
    cap, plan = case
    everything = written(plan)
    r = run([PY, "-c", WRITER, json.dumps(plan)], max_output=cap, merge_stderr=True,
            on_overflow="kill", timeout=30)
    assert r.stdout == everything[:cap]
    if len(everything) > cap:
        assert r.output_truncated and r.exit_code == 137
        assert cap < r.output_bytes <= len(everything)
    else:
        assert not r.output_truncated and r.exit_code == 0
        assert r.output_bytes == len(everything)


@PROFILE
@given(plans())
def test_no_cap_keeps_every_byte(case: tuple[int, list]) -> None:
    """max_output=None keeps every byte of both streams and never flags truncation."""
    _, plan = case
    assume(plan)
    r = run([PY, "-c", WRITER, json.dumps(plan)], max_output=None, timeout=30)
    assert r.ok
    assert r.stdout == written(plan, 1) and r.stderr == written(plan, 2)
