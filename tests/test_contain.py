"""Containment (SPEC section 5): escapees, parent death, subreaper hygiene, limits."""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    alive,
    as_nobody,
    fork_with_threads,
    importable_env,
    pids_in,
    wait_dead,
    wait_for_pids,
)

from boundedproc import Cancel, Limits, _native, run

PY = sys.executable
needs_contain = pytest.mark.skipif(not _native.CONTAIN_SUPPORTED,
                                   reason="containment needs x86_64/aarch64 Linux")

DAEMON = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            print(os.getpid(), flush=True)
            fd = os.open(os.devnull, os.O_RDWR)
            for n in (0, 1, 2):
                os.dup2(fd, n)
            time.sleep(60)
        os._exit(0)
    time.sleep(0.3)
""")


@needs_contain
def test_setsid_escapee_is_killed_by_default(reaper: list[int]) -> None:
    """A descendant that calls setsid and holds the pipes is killed; escaped stays False."""
    r = run(["bash", "-c", "setsid sh -c 'echo $$; exec sleep 60' & sleep 0.3"], timeout=20)
    pids = pids_in(r.stdout)
    reaper.extend(pids)
    assert len(pids) == 1
    assert not r.escaped and r.exit_code == 0
    assert wait_dead(pids) == []


@needs_contain
def test_double_forked_daemon_is_killed(reaper: list[int]) -> None:
    """A daemon (fork, setsid, fork, stdio to /dev/null) does not outlive the run."""
    r = run([PY, "-c", DAEMON], timeout=20)
    pids = pids_in(r.stdout)
    reaper.extend(pids)
    assert len(pids) == 1 and not r.escaped
    assert wait_dead(pids) == []


@needs_contain
def test_escapee_survives_without_contain(reaper: list[int]) -> None:
    """Control: with contain=False the same daemon survives the run."""
    r = run([PY, "-c", DAEMON], timeout=20, contain=False)
    pids = pids_in(r.stdout)
    reaper.extend(pids)
    assert len(pids) == 1 and alive(pids[0])


def _is_subreaper() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    value = ctypes.c_int(0)
    PR_GET_CHILD_SUBREAPER = 37
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0
    return value.value


@needs_contain
def test_caller_is_never_a_subreaper() -> None:
    """After contained runs the calling process is still not a child subreaper."""
    run(["bash", "-c", "setsid sleep 5 & true"])
    assert _is_subreaper() == 0


@needs_contain
def test_other_children_keep_their_status() -> None:
    """A subprocess.Popen beside contained runs keeps its own exit status."""
    child = subprocess.Popen(["sh", "-c", "sleep 0.3; exit 7"])
    threads = [threading.Thread(target=run, args=(["sh", "-c", "sleep 0.6; setsid sleep 5 & true"],))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert child.wait(timeout=10) == 7


PARENT = textwrap.dedent("""
    import sys
    from boundedproc import run
    run(["bash", "-c", "echo $$ > {f}.tmp; setsid sleep 60 & echo $! >> {f}.tmp; "
         "sleep 60 & echo $! >> {f}.tmp; mv {f}.tmp {f}; wait"], timeout=120, contain={contain})
""")


@pytest.mark.parametrize("contain", [None, False])
def test_parent_sigkill_takes_the_run_with_it(tmp_path: Path, reaper: list[int],
                                              contain: object) -> None:
    """SIGKILL of the caller mid-run: the run's processes die within about a second."""
    if contain is None and not _native.CONTAIN_SUPPORTED:
        pytest.skip("containment needs x86_64/aarch64 Linux")
    f = tmp_path / "pids"
    parent = subprocess.Popen([PY, "-c", PARENT.format(f=f, contain=contain)])
    try:
        pids = wait_for_pids(f)
        reaper.extend(pids)
        assert len(pids) == 3 and all(alive(p) for p in pids)
        parent.kill()
        parent.wait(10)
        if contain is None:
            assert wait_dead(pids, within=3.0) == []  # leader, setsid escapee, background
        else:
            assert wait_dead(pids[:1], within=3.0) == []  # uncontained: the leader (pdeathsig)
    finally:
        parent.kill()


@pytest.mark.skipif(not _native.CONTAIN_SUPPORTED, reason="containment is Linux-only")
def test_sigkill_of_the_callers_whole_group_takes_the_run_with_it(tmp_path: Path,
                                                                   reaper: list[int]) -> None:
    """SIGKILL of the caller's process group (`kill -9 -PGID`, `kill -9 %1` in a shell,
    `timeout -s KILL` around a grader): the run's processes die all the same.

    The supervisor has a process group of its own, so the signal that kills the caller
    does not kill it as well; it then sees the caller gone and kills the run.  In the
    caller's group, it died with it, and the rest of the leader's group lived on.
    """
    f = tmp_path / "pids"
    parent = subprocess.Popen([PY, "-c", PARENT.format(f=f, contain=None)],
                              start_new_session=True)
    try:
        pids = wait_for_pids(f)
        reaper.extend(pids)
        assert len(pids) == 3 and all(alive(p) for p in pids)
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert wait_dead(pids, within=3.0) == []  # leader, setsid escapee, background
    finally:
        parent.kill()


def test_contain_true_or_false_is_accepted() -> None:
    """contain accepts a bool or None and rejects other types before spawning."""
    assert run(["true"], contain=False).ok
    with pytest.raises(TypeError):
        run(["true"], contain="yes")  # type: ignore[arg-type]


# ---- limits -------------------------------------------------------------------

def test_cpu_limit_delivers_sigxcpu() -> None:
    """cpu_seconds: a busy loop is stopped by SIGXCPU (soft limit below the hard one)."""
    r = run([PY, "-c", "while True: pass"], limits=Limits(cpu_seconds=1), timeout=30)
    assert r.term_signal == signal.SIGXCPU and r.exit_code == 128 + signal.SIGXCPU
    assert not r.timed_out


def test_file_size_limit_delivers_sigxfsz(tmp_path: Path) -> None:
    """file_size_bytes: writing past it ends the writer with SIGXFSZ."""
    r = run(["sh", "-c", f"head -c 100000 /dev/zero > {tmp_path / 'big'}"],
            limits=Limits(file_size_bytes=1000), timeout=30)
    assert r.term_signal == signal.SIGXFSZ or r.exit_code != 0
    assert (tmp_path / "big").stat().st_size <= 1000


def test_memory_limit() -> None:
    """memory_bytes: an allocation beyond the address-space limit fails in the child."""
    r = run([PY, "-c", "b = bytearray(1 << 30)"], limits=Limits(memory_bytes=512 << 20))
    assert r.exit_code != 0 and b"MemoryError" in r.stderr


def test_open_files_limit() -> None:
    """open_files: the child cannot open more than the limit."""
    code = "import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', 0))\nexcept OSError: print(len(fds) + 3)"
    r = run([PY, "-c", code], limits=Limits(open_files=64), contain=False, text=True)
    assert int(r.stdout) <= 64


def test_refused_limit_is_a_runner_error() -> None:
    """A limit the kernel refuses (open files above fs.nr_open) is a runner_error."""
    nr_open = int(Path("/proc/sys/fs/nr_open").read_text())
    r = run(["true"], limits=Limits(open_files=nr_open + 1))
    assert not r.spawned and r.runner_error is not None
    assert r.runner_error.startswith("spawn failed: ") and "setrlimit" in r.runner_error


def test_limits_validation() -> None:
    """Negative, NaN or non-numeric limits raise before anything runs."""
    with pytest.raises(ValueError):
        Limits(cpu_seconds=-1)
    with pytest.raises(ValueError):
        Limits(cpu_seconds=float("nan"))
    with pytest.raises(TypeError):
        Limits(memory_bytes=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run(["true"], limits={"cpu_seconds": 1})  # type: ignore[arg-type]


def test_an_infinite_limit_is_no_limit() -> None:
    """math.inf in any field means no limit (clamped to RLIM_INFINITY's neighbour), as
    an infinite timeout means no deadline: the run starts and sees the limit lifted."""
    r = run(["sh", "-c", "ulimit -t; ulimit -v"], text=True,
            limits=Limits(cpu_seconds=math.inf, memory_bytes=math.inf))  # type: ignore[arg-type]
    assert r.ok, r
    cpu, mem = r.stdout.split()
    assert int(cpu) >= 2**62 and int(mem) >= 2**52, r.stdout


FORK_BOMB = textwrap.dedent("""
    n=0
    while [ $n -lt 400 ]; do
        ( sleep 60 & setsid sleep 60 & wait ) &
        n=$((n+1))
    done
    echo spawned
    wait
""")


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries BP_TEST_MARK=mark (ours, not by name)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get("BP_TEST_MARK") == mark:
                found.append(p.info["pid"])
        except psutil.Error:
            continue
    return found


def _marked_left(mark: str, within: float = 10.0) -> list[int]:
    """The processes marked `mark` still alive once none is, or `within` seconds passed."""
    deadline = time.monotonic() + within
    left = _marked(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = _marked(mark)
    return left


def test_fork_bomb_under_limits_leaves_nothing(reaper: list[int]) -> None:
    """A (bounded) fork bomb under max_processes and a deadline ends with nothing left.

    As root the kernel does not enforce RLIMIT_NPROC; the deadline and the group kill
    (and containment, for the setsid children) still end it.
    """
    mark = f"bomb-{os.getpid()}-{time.monotonic_ns()}"
    r = run(["bash", "-c", FORK_BOMB], limits=Limits(max_processes=200), timeout=3,
            env={"BP_TEST_MARK": mark})
    assert r.timed_out or r.exit_code != 0
    left = _marked_left(mark)
    reaper.extend(left)
    if _native.CONTAIN_SUPPORTED:
        assert left == []


# Each run forks 40 sleepers (half of them in sessions of their own) and is killed at a
# deadline while it forks; drain_grace=0.1 leaves the supervisor's final kill only its
# floor (20 ms).  On a loaded machine that is too short to see every sleeper dead, but
# each was SIGKILLed (and its not yet handed-over children with it): none survives, so
# no run may say escaped.
_FORKING = "for i in $(seq 20); do sleep 54 & setsid sleep 54 & done; wait"


@pytest.mark.skipif(not _native.CONTAIN_SUPPORTED, reason="containment is Linux-only")
def test_a_short_final_kill_under_load_is_not_an_escape(reaper: list[int]) -> None:
    mark = f"dying-{os.getpid()}-{time.monotonic_ns()}"
    results = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(4):
            r = run(["bash", "-c", _FORKING], timeout=0.1, drain_grace=0.1,
                    env={"BP_TEST_MARK": mark})
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    left = _marked_left(mark)
    reaper.extend(left)
    assert left == []
    escaped = [r for r in results if r.escaped]
    assert escaped == [], f"{len(escaped)} of {len(results)} said escaped: {escaped[0]}"


# A process slow to die: it holds touched memory, which its exit must free.
# "ready" in one write: print() writes the newline apart when stdout is unbuffered
# (PYTHONUNBUFFERED, -u), and a cancel at the first chunk then kept b"ready" alone.
_HEAVY = "import os, time\nbig = b'x' * (768 << 20)\nos.write(1, b'ready\\n')\ntime.sleep(1000)\n"
# ... with children in sessions of their own, each with a child in its group.
_HEAVY_PARENT = ("import subprocess, time\nfor i in range(4):\n"
                 "    subprocess.Popen(['bash', '-c', 'sleep 977.25 >/dev/null 2>&1 & "
                 "exec sleep 977.26'], start_new_session=True)\n" + _HEAVY)


@pytest.mark.skipif(not _native.CONTAIN_SUPPORTED, reason="containment is Linux-only")
def test_a_slow_death_leaves_no_grandchild_behind(reaper: list[int]) -> None:
    """The final kill's budget ends while a killed process frees its memory: the rest of
    its tree is killed, also a grandchild its killed parent handed over meanwhile.

    The supervisor kills the slow one's children (sessions of their own) and lists
    theirs; a child that dies before its list is read has handed its own child to the
    supervisor instead, and the supervisor looks at its own children again until it
    finds none it has not killed (without that: 8-10 survivors a run, and no escaped).
    """
    mark = f"slow-{os.getpid()}-{time.monotonic_ns()}"
    for _ in range(2):
        r = run(["bash", "-c", f'{sys.executable} -c "$K" & sleep 977.2; wait'], timeout=2,
                kill_grace=0, drain_grace=0, env={"BP_TEST_MARK": mark, "K": _HEAVY_PARENT})
        assert r.timed_out
        left = _marked_left(mark, within=1.5)
        reaper.extend(left)
        assert left == [] and not r.escaped, r


@pytest.mark.skipif(not _native.CONTAIN_SUPPORTED, reason="containment is Linux-only")
def test_a_slowly_dying_holder_of_the_pipes_is_not_an_escapee(reaper: list[int]) -> None:
    """A process in a session of its own holds the run's stdout and is killed with the run,
    but takes long to die (it frees its memory): that is not an escape (it was, 5 of 5)."""
    mark = f"holder-{os.getpid()}-{time.monotonic_ns()}"
    for _ in range(2):
        # Ended once the holder has its memory (it says "ready"), not at a fixed deadline:
        # on a loaded machine the allocation alone took longer than 2 s.
        ready = Cancel()

        def on_output(stream: int, chunk: bytes, ready: Cancel = ready) -> None:
            if b"ready" in chunk:
                ready.cancel()

        r = run(["bash", "-c", f'setsid {sys.executable} -c "$K" & sleep 977.2; wait'],
                timeout=60, kill_grace=0, drain_grace=0, cancel=ready, on_output=on_output,
                env={"BP_TEST_MARK": mark, "K": _HEAVY})
        assert r.cancelled and r.stdout == b"ready\n"
        left = _marked_left(mark, within=1.5)
        reaper.extend(left)
        assert left == [] and not r.escaped, r


# In a fresh interpreter: a run whose killed writer (in the leader's group) is slow to die,
# while the caller has forked a child that holds copies of its fds, the run's read ends too.
_FORKED_READER = """
import json, os, sys, threading, time
from boundedproc import run
K, contain = sys.argv[1], {"none": None, "false": False}[sys.argv[2]]
box = {}
def go():
    box["r"] = run(["bash", "-c", 'sleep 0.3; ' + sys.executable + ' -c "$K" & wait'],
                   timeout=2, kill_grace=0, drain_grace=0, contain=contain,
                   env={"BP_TEST_MARK": sys.argv[3], "K": K})
t = threading.Thread(target=go)
t.start()
time.sleep(0.1)
child = os.fork()
if child == 0:
    time.sleep(4)
    os._exit(0)
t.join()
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps({"escaped": box["r"].escaped, "timed_out": box["r"].timed_out}))
"""


@fork_with_threads
@pytest.mark.parametrize("contain", ["none", "false"])
def test_a_forked_copy_of_the_read_end_is_not_an_escapee(reaper: list[int], contain: str) -> None:
    """The drain looks for the pipes' *writers*: a child the caller forked (it holds copies
    of the caller's fds, the run's read ends among them) is no escapee, while the run's
    killed writer takes its time to die (it was, 5 of 5)."""
    if contain == "none" and not _native.CONTAIN_SUPPORTED:
        pytest.skip("containment is Linux-only")
    mark = f"reader-{os.getpid()}-{time.monotonic_ns()}"
    out = subprocess.run([PY, "-c", _FORKED_READER, _HEAVY, contain, mark], capture_output=True,
                         text=True, timeout=60, env=importable_env(), check=False)
    left = _marked_left(mark, within=1.5)
    reaper.extend(left)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"escaped": False, "timed_out": True} and left == [], (got, left)


# In a fresh interpreter: a child the caller forked (as another run's leader is, between its
# clone and its exec) holds a write end of the run's stdout for a moment past the leader's exit.
_CALLERS_CHILD_WRITER = """
import json, os, sys, time
from boundedproc import run
f = sys.argv[1]
child = os.fork()
if child == 0:
    while not os.path.exists(f):
        time.sleep(0.005)
    leader = int(open(f).read())
    fd = os.open(f"/proc/{leader}/fd/1", os.O_WRONLY)
    open(f + ".held", "w").close()
    time.sleep(0.6)  # past the leader's exit (0.4 s) and drain_grace (0): 0.2 s more
    os.close(fd)
    time.sleep(3)
    os._exit(0)
script = (f"echo $$ > {f}.tmp; mv {f}.tmp {f}; "
          f"while [ ! -e {f}.held ]; do sleep 0.01; done; sleep 0.4")
r = run(["sh", "-c", script], timeout=30, drain_grace=0, contain=False)
os.kill(child, 9)
os.waitpid(child, 0)
print(json.dumps({"escaped": r.escaped, "exit_code": r.exit_code}))
"""


@fork_with_threads
def test_a_child_of_the_caller_holding_a_write_end_for_a_moment_is_no_escapee(
        tmp_path: Path) -> None:
    """A child of the calling process is not the run's: one that holds a write end of the
    run's pipes (another run's leader between its clone and its exec has copies of the
    caller's fds for that moment) is waited for within the drain's 0.5 s, as a holder the
    run killed is; it was an escapee at once (1 of 320 under load)."""
    out = subprocess.run([PY, "-c", _CALLERS_CHILD_WRITER, str(tmp_path / "pid")],
                         capture_output=True, text=True, timeout=60, env=importable_env(),
                         check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"escaped": False, "exit_code": 0}


STOPPED_CALLER = """
import json, os, sys
from boundedproc import run
f = sys.argv[1]
r = run(["sh", "-c", f"echo $$ > {f}.tmp; mv {f}.tmp {f}; exec sleep 30"], timeout=0.5)
print(json.dumps(dict(timed_out=r.timed_out, exit_code=r.exit_code, error=r.runner_error)))
"""


@needs_contain
def test_a_stopped_caller_does_not_keep_its_command_past_the_bound(tmp_path: Path,
                                                                     reaper: list[int]) -> None:
    """The deadline lived in the caller alone: a caller stopped by Ctrl-Z (or SIGSTOP) left
    its command running, unbounded, for as long as it stayed stopped (the command leads a
    session of its own, so the terminal's stop never reaches it). The supervisor now kills
    the run itself once the caller's final kill is 0.5 s overdue; the caller, continued,
    reports the deadline (124)."""
    marker = tmp_path / "pid"
    caller = subprocess.Popen([PY, "-c", STOPPED_CALLER, str(marker)], env=importable_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        command = int(marker.read_text())
        reaper.append(command)
        caller.send_signal(signal.SIGSTOP)
        # timeout 0.5 + kill_grace 0 + the 0.5 s backstop, and room for a loaded machine
        survivors = wait_dead([command], within=10)
    finally:
        caller.send_signal(signal.SIGCONT)
        out, _ = caller.communicate(timeout=60)
    assert survivors == [], "the command outlived its bound while the caller was stopped"
    got = json.loads(out)
    assert got == {"timed_out": True, "exit_code": 124, "error": None}, got


@needs_contain
def test_an_on_output_that_blocks_does_not_keep_the_command_past_the_bound() -> None:
    """A callback that blocks (a pass-through write to a pipe nobody reads: `| less`) held
    the loop that owns the deadline: the command ran on for as long as it blocked. The
    supervisor kills the run at the backstop; the run reports the deadline."""
    seen: dict[str, object] = {}

    def stuck(stream: int, chunk: bytes) -> None:
        if "pid" in seen:
            return
        seen["pid"] = int(chunk.split()[0])
        seen["gone"] = wait_dead([int(chunk.split()[0])], within=10) == []

    r = run(["sh", "-c", "echo $$; exec sleep 30"], timeout=0.5, on_output=stuck)
    assert seen.get("gone") is True, seen
    assert r.timed_out and r.exit_code == 124, r


# The leader is PTRACE_SEIZEd (no stop, no signal: nothing it sees) by a child of its own
# that leaves its session and its stdio and sleeps: a zombie leader is then visible to its
# tracer alone until the tracer waits for it or dies.  argv: "exit" (the leader exits 5 at
# once) or "run" (it sleeps), and the file for the tracer's pid.
TRACED_LEADER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
leader = os.getpid()
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    ok = libc.ptrace(0x4206, leader, None, None) == 0
    with open(sys.argv[2] + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(sys.argv[2] + ".tmp", sys.argv[2])
    os.write(w, b"y" if ok else b"n")
    time.sleep(30)
    os._exit(0)
os.close(w)
print("seized=" + os.read(r, 1).decode(), flush=True)
if sys.argv[1] == "exit":
    os._exit(5)
time.sleep(30)
"""


def _traced_run(tmp_path: Path, reaper: list[int], what: str, **kw: object) -> tuple:
    pidfile = tmp_path / "tracer"
    t = time.monotonic()
    r = run([PY, "-c", TRACED_LEADER, what, str(pidfile)], **kw)  # type: ignore[arg-type]
    took = time.monotonic() - t
    tracer = int(pidfile.read_text())
    reaper.append(tracer)
    if r.stdout != b"seized=y\n":
        pytest.skip(f"PTRACE_SEIZE refused here: {r.stdout!r}")
    return r, took, tracer


@needs_contain
def test_a_leader_traced_by_its_own_child_exits_and_the_tracer_dies_with_the_run(
        tmp_path: Path, reaper: list[int]) -> None:
    """A command's child that leaves the session and traces the leader (no privilege needed)
    made the leader's exit invisible: only a tracer may wait for a traced zombie.  The
    supervisor saw no exit, the run went on to its deadline and reported 124 for a command
    that exited 5 at once.  The leader's exit is now seen (its pidfd), the run ends, the
    tracer (adopted by the supervisor when the leader died) is killed with the run, and the
    leader's own status comes back."""
    r, took, tracer = _traced_run(tmp_path, reaper, "exit", timeout=20)
    assert (r.exit_code, r.timed_out, r.runner_error) == (5, False, None), r
    assert took < 10, took
    assert wait_dead([tracer], within=2) == [], "the tracer outlived the run"


@needs_contain
def test_a_running_leader_traced_by_its_own_child_is_killed_and_the_tracer_with_it(
        tmp_path: Path, reaper: list[int]) -> None:
    """The same tracer, with a leader that runs on: at the deadline the supervisor killed the
    leader and then waited for its zombie, which only the tracer could release; the core gave
    the supervisor up as unanswering and the tracer lived on.  The supervisor now kills its
    adopted children (the tracer among them) while it waits for the leader."""
    r, took, tracer = _traced_run(tmp_path, reaper, "run", timeout=1, drain_grace=0.5)
    assert (r.exit_code, r.timed_out, r.runner_error) == (124, True, None), r
    assert took < 1 + 0.5 + 2, took  # the bound, and room for a loaded machine
    assert wait_dead([tracer], within=2) == [], "the tracer outlived the run"


def test_uncontained_a_leader_held_by_a_tracer_is_let_go_within_the_bound(
        tmp_path: Path, reaper: list[int]) -> None:
    """Uncontained, the run's end reaped the leader with a blocking wait4, which a tracer
    outside the group held for as long as it lived (30 s here, past every bound, and past a
    Ctrl-C).  The leader is now let go 100 ms after its exit: its status is unknown
    (runner failed: EBUSY ... wait4), and the tracer, which nothing uncontained can kill, is
    an escapee."""
    r, took, _ = _traced_run(tmp_path, reaper, "exit", timeout=1, drain_grace=0.5,
                             contain=False)
    assert took < 1 + 0.5 + 2, took
    assert r.escaped and not r.ok, r
    assert r.runner_error is not None and r.runner_error.startswith("runner failed: EBUSY"), r
    assert "traced" in r.runner_error, r.runner_error


# The leader's own part: a 4 GiB memfd, filled, held until the kill.
_FILL_4_GIB = """
time.sleep(0.1)
fd = os.memfd_create("big")
try:
    os.posix_fallocate(fd, 0, 4 << 30)
except OSError:
    os.write(1, b"no memory\\n")
    sys.exit(3)
os.write(1, b"ready\\n")
time.sleep(60)
"""
# A leader whose death takes the kernel long: it holds the only reference to a 4 GiB
# memfd, whose pages its exit frees (0.6 s here) before the exit shows.  Its child left
# the session first and let go of the pipes: an orphan the supervisor kills once the
# leader's death hands it over.
_BIG_LEADER = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    os.write(1, b"%d\\n" % os.getpid())
    if sys.argv[1:] == ["grandchild"] and os.fork() == 0:
        os.write(1, b"%d\\n" % os.getpid())  # it keeps the pipes
        time.sleep(60)
        os._exit(0)
    fd = os.open(os.devnull, os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(fd, n)
    time.sleep(60)
    os._exit(0)
""" + _FILL_4_GIB


def _memory_for(size: int) -> bool:
    """Whether this machine, and our memory cgroup (v2 or v1), has twice size to spare."""
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f
                         if line.startswith("MemAvailable:"))
        with open("/proc/self/cgroup") as f:
            groups = dict(line.strip().split(":", 2)[1:] for line in f if line.count(":") >= 2)
    except (OSError, StopIteration, ValueError):
        return False
    caps = [f"/sys/fs/cgroup{groups.get('', '/')}/memory.max",
            f"/sys/fs/cgroup/memory{groups.get('memory', '/')}/memory.limit_in_bytes"]
    for cap in caps:
        try:
            with open(cap) as f:
                value = f.read().strip()
        except OSError:
            continue
        if value != "max" and int(value) < 2 * size:
            return False
    return avail >= 2 * size


@needs_contain
@pytest.mark.skipif(not _memory_for(4 << 30), reason="needs 8 GiB of memory to spare")
@pytest.mark.parametrize("holder", ["none", "grandchild"])
def test_a_leader_slow_to_free_its_memory_ends_at_its_deadline(reaper: list[int],
                                                               holder: str) -> None:
    """Killed at its deadline, the leader took the kernel longer to free its memory than
    the kill's budget gave the supervisor, which was waiting for that death; given up as
    unanswering, the run said `runner failed` (a grader's unrunnable, not a timeout) and
    the supervisor was killed, so the orphan it would have killed lived on.  A supervisor
    only waiting is now let finish on its own; the pipes it and the leader's descendants
    hold until the leader is gone (a grandchild here) are no escape."""
    assert run(["true"]).ok
    (sup,) = _native.supervisor_pids()[-1:]  # this thread's, which serves the next run
    r = run([PY, "-c", _BIG_LEADER, holder], timeout=3, kill_grace=0, drain_grace=0)
    orphans = pids_in(r.stdout)
    reaper.extend(orphans)
    if b"ready" not in r.stdout:
        pytest.skip(f"the leader did not fill its memory before its deadline: {r.stdout!r}")
    assert (r.exit_code, r.timed_out, r.runner_error) == (124, True, None), r
    assert len(orphans) == (2 if holder == "grandchild" else 1) and not r.escaped, r
    assert wait_dead(orphans) == [], "the leader's orphan outlived the run"
    assert wait_dead([sup]) == [], "the supervisor let go stays behind"
    assert run(["true"]).ok  # a fresh supervisor serves the next run


# The same leader, whose child waits until the leader is in its exit, gives the core time
# to let the supervisor go, then stops the supervisor (SIGSTOP), so that the leader is
# never reaped and the orphan never killed, unless someone continues the supervisor.
_STOPPER = """
import os, sys, time
folder, sup, leader = sys.argv[1], os.getppid(), os.getpid()
if os.fork() == 0:
    os.setsid()
    fd = os.open(os.devnull, os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(fd, n)
    with open(os.path.join(folder, "pids"), "w") as f:
        f.write("%d %d %d" % (os.getpid(), sup, leader))
    def exiting():
        try:
            with open("/proc/%d/stat" % leader) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return True
        return fields[0] in "ZX" or int(fields[6]) & 0x4
    while not exiting():
        time.sleep(0.002)
    time.sleep(0.4)  # the core lets the supervisor go 0.32 s after the deadline
    os.kill(sup, 19)
    time.sleep(60)
    os._exit(0)
""" + _FILL_4_GIB


@needs_contain
@pytest.mark.skipif(not _memory_for(4 << 30), reason="needs 8 GiB of memory to spare")
def test_a_let_go_supervisor_that_the_command_stops_still_finishes(tmp_path: Path,
                                                                  reaper: list[int]) -> None:
    """A supervisor let go is watched: a process of the run that stopped it (SIGSTOP) left
    it stopped for good, with the leader never reaped and the orphan it would kill alive,
    behind a clean 124.  The watcher continues it, as the core does during the run."""
    r = run([PY, "-c", _STOPPER, str(tmp_path)], timeout=3, kill_grace=0, drain_grace=0)
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    reaper.append(pids[0])
    if b"ready" not in r.stdout:
        pytest.skip(f"the leader did not fill its memory before its deadline: {r.stdout!r}")
    assert (r.exit_code, r.timed_out, r.runner_error) == (124, True, None), r
    assert wait_dead(pids, within=5) == [], "the orphan, the supervisor or the leader stayed"


# A member of the group, killed with the run, holds a 1 GiB memfd: a process's last
# references to its files go at the end of its exit, the memfd's pages (0.15 s here) before
# the pipes, while no fd table holds the pipes any more.
_MEMFD_MEMBER = ("import os, time\nfd = os.memfd_create('big')\n"
                 "os.posix_fallocate(fd, 0, 1 << 30)\nos.write(1, b'ready\\n')\ntime.sleep(60)\n")


@pytest.mark.skipif(not _memory_for(1 << 30), reason="needs 2 GiB of memory to spare")
def test_not_root_a_killed_member_releasing_its_files_is_no_escapee() -> None:
    """Not root, where some fd tables cannot be read, a pipe that no fd table holds was
    waited on 50 ms, then called an escape, though the killed member of the group that
    held it was still releasing its files; it gets the drain's 0.5 s while a member is
    left."""
    # The member needs only a Python that nobody may run: a venv's may sit in a folder
    # closed to others (mktemp -d), its interpreter or the system's may not.
    pythons = [PY, os.path.realpath(PY), "/usr/bin/python3", "/usr/local/bin/python3"]
    got = as_nobody(
        "from boundedproc import run\n"
        f"py = next((p for p in {pythons!r} if os.access(p, os.X_OK)), None)\n"
        "out = {'py': py}\n"
        "if py is not None:\n"
        "    r = run(['bash', '-c', '\"$P\" -c \"$K\" & wait'], timeout=3, kill_grace=0,\n"
        f"            drain_grace=0, contain=False, env={{'K': {_MEMFD_MEMBER!r}, 'P': py}})\n"
        "    out.update(escaped=r.escaped, timed_out=r.timed_out, stdout=r.stdout.decode(),\n"
        "               stderr=r.stderr.decode())\n")
    if got["py"] is None:
        pytest.skip(f"nobody may run none of {pythons}")
    if got["stdout"] != "ready\n":
        pytest.skip(f"the member did not fill its memory before the deadline: {got}")
    assert (got["escaped"], got["timed_out"]) == (False, True), got
