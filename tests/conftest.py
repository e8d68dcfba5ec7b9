"""Shared helpers: process liveness that treats zombies as dead, and cleanup."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

# Under scripts/sanitize.sh the ASan runtime is preloaded into the Python running the tests.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")

# SPEC 3.2's UNRUNNABLE_SIGNATURES, written out from the spec (not imported from the grader),
# so that a token the grader drops or misspells fails the tests that use it.
SPEC_SIGNATURES = (
    "No such file",
    "FileNotFoundError",
    "ModuleNotFoundError",
    "command not found",
    "ENOENT",
    "AbortError",
    "timed out",
    "ERR_CHILD_PROCESS_STDIO_MAXBUFFER",
    "Permission denied",
    "EACCES",
    "cannot create directory",
    "cannot open",
    "SyntaxError",
    "unexpected EOF while looking for matching",
    "syntax error near unexpected token",
)

# GCC 12's ASan runtime takes no lock of its allocator around fork(): a fork while another
# thread is inside malloc leaves that lock held in the child, whose next allocation then
# waits forever (seen: a forked child's core threads stuck in ASan's allocator, in
# test_fork_while_a_batch_runs).  glibc's malloc resets its locks in the child, so only
# the sanitizer pass skips the tests that fork while other threads of theirs are running.
_skip_under_asan = pytest.mark.skipif(
    UNDER_ASAN, reason="ASan's allocator (GCC 12) is not fork-safe while other threads allocate")
# Python 3.12+ warns at a fork of a multi-threaded process; these tests fork so on purpose.
_forks_on_purpose = pytest.mark.filterwarnings(
    r"ignore:This process \(pid=\d+\) is multi-threaded, use of fork\(\):DeprecationWarning")


def fork_with_threads(test: Any) -> Any:
    """For a test that os.fork()s this process while threads of its own run (fork safety):
    skipped under ASan, and Python 3.12's warning about it is expected."""
    return _skip_under_asan(_forks_on_purpose(test))

# For the same reason, no thread of the suite's own process may wake by itself: tqdm's monitor
# thread (started by the first progress bar, a grader or run_many test) wakes every 10 s and
# allocates.  A sanitizer run hung so: the child of test_signals_are_sent_on, forked for a
# preexec_fn, waited forever on ASan's allocator lock, and the suite's only thread not idle
# was tqdm_monitor.  It hung so again with tqdm's monitor off and every thread idle when
# looked at (56 run_async workers, dask's offload thread): so the tests set a child's state
# with exec_after() instead of a preexec_fn, and nothing of theirs forks Python any more.
with contextlib.suppress(ImportError):
    import tqdm

    tqdm.tqdm.monitor_interval = 0


def exec_after(setup: str) -> list[str]:
    """A command prefix: Python that runs ``setup`` (``os`` and ``signal`` imported), then
    execs the rest of the command line, which starts with the state it set (fds closed,
    signals ignored or blocked; exec keeps them all).  It does what a ``preexec_fn`` would,
    without one: subprocess then forks (vfork) and execs with no Python in the child."""
    return [sys.executable, "-c",
            f"import os, signal, sys\n{setup}\nos.execv(sys.argv[1], sys.argv[1:])"]


# For the scripts a test runs in a fresh interpreter: take_fds(spare) holds open every fd
# the process may still open but `spare`, and returns them (EMFILE on demand).
TAKE_FDS = """
import os

def take_fds(spare=0):
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    for _ in range(spare):
        os.close(held.pop())
    return held
"""


def pytest_configure(config: pytest.Config) -> None:
    # here, not only in pyproject.toml: CI runs the suite from outside the source tree
    config.addinivalue_line(
        "markers", "stress: many threads at once; short by default, "
        "BOUNDEDPROC_STRESS=SECONDS:THREADS for longer")


def alive(pid: int) -> bool:
    """True while pid is a running (non-zombie) process."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is pgid."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                found.append(proc.info["pid"])
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def wait_for(predicate: Callable[[], object], bound: float) -> bool:
    """Poll predicate with a bound."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def wait_dead(pids: Iterable[int], within: float = 5.0) -> list[int]:
    """Poll until every pid is dead or `within` seconds pass; return the survivors."""
    pids = list(pids)
    deadline = time.monotonic() + within
    while True:
        survivors = [p for p in pids if alive(p)]
        if not survivors or time.monotonic() > deadline:
            return survivors
        time.sleep(0.02)


def wait_for_pids(path: os.PathLike[str] | str, within: float = 20.0) -> list[int]:
    """Wait (bounded) until a command has written the file at path; return its pids."""
    from pathlib import Path

    f = Path(path)
    deadline = time.monotonic() + within
    while not f.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids_in(f.read_text())


def c_compiler() -> str:
    """The machine's C compiler (``cc``, else ``gcc``), for a test that builds a small
    program of its own; the test is skipped without one."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def importable_env() -> dict[str, str]:
    """This environment, with PYTHONPATH reaching the grader and boundedproc under test."""
    from pathlib import Path

    import boundedproc
    import grader

    roots = {
        str(Path(module.__file__ or "").resolve().parent.parent) for module in (grader, boundedproc)
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*sorted(roots), env.get("PYTHONPATH", "")])
    return env


def as_nobody(code: str, cwd: str = "/", imports: str = "") -> dict[str, object]:
    """Run `code` in a Python child that imports boundedproc as root, then becomes nobody.

    The interpreter of the test run may be unreadable by nobody (pyenv under a 0700 /root),
    so the child drops its ids itself once everything is imported; the code sets `out` to a
    dict, returned here.  Skips unless the test runs as root with a 'nobody' user whom the
    supervisor program is reachable by (it is executed after the ids are dropped).
    `imports` runs first, as root, for modules to import before the ids are dropped.
    """
    import json
    import pwd
    import subprocess
    import sys

    from boundedproc import _native

    if os.geteuid() != 0:
        pytest.skip("needs root, to become nobody")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user")
    probe = subprocess.run(
        [sys.executable, "-c",
         (f"import os; os.setgroups([]); os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid});"
          f"os._exit(0 if os.access({_native.SUPERVISOR_PATH!r}, os.X_OK) else 1)")],
        check=False)
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot execute {_native.SUPERVISOR_PATH} (a directory above it "
                    "is closed to others)")
    prog = (
        "import json, os, resource, sys\n"  # imported while the interpreter's files are ours
        "import boundedproc\n"
        f"{imports}\n"
        f"os.setgroups([]); os.setgid({nobody.pw_gid}); os.setuid({nobody.pw_uid})\n"
        f"{code}\n"
        "sys.stdout.write(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", prog], env=importable_env(), cwd=cwd,
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def batch_threads() -> list[str]:
    """The tids of run_many's core threads in this process, parked ones included, by the name
    csrc/batch.c gives them (by name: pytest's faulthandler watchdog comes and goes)."""
    tids = []
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            if Path(f"/proc/self/task/{tid}/comm").read_text().strip() == "bp-batch":
                tids.append(tid)
    return tids


def pids_in(text: str | bytes) -> list[int]:
    """Every integer on its own line of a command's output."""
    if isinstance(text, bytes):
        text = text.decode()
    return [int(line) for line in text.split() if line.strip().isdigit()]


# A shell starts background jobs with SIGINT ignored, and an ignored signal stays
# ignored across exec, so Python would install no SIGINT handler at all. Children
# that a test sends SIGINT to restore Python's handler first with this prelude,
# so the tests pin the product's behaviour however the test run was started.
SIGINT_PRELUDE = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"


def python_module_argv(module: str, *args: str) -> list[str]:
    """argv running `python -m module args` with Python's SIGINT handler restored."""
    import sys

    code = SIGINT_PRELUDE + f"import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    return [sys.executable, "-c", code, *args]


@pytest.fixture
def reaper() -> Iterator[list[int]]:
    """A list a test appends pids to; whatever is still alive is SIGKILLed after it."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_descendants() -> list[psutil.Process]:
    """The caller's descendants but its idle containment supervisors.

    A supervisor (``_bp_supervisor``) is reused from run to run and lives as
    long as the thread that started it: it is not a survivor of any run.  What
    it holds (an orphan it adopted) is still listed.
    """
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() == "_bp_supervisor":
                continue
        except psutil.NoSuchProcess:
            continue
        found.append(proc)
    return found


def describe_tree(pid: int) -> str:
    """What pid and its descendants are doing: state, system call, signals; for a hang's report.

    Read from /proc (each thread's current system call and its arguments, its kernel wait
    channel, and its pending, blocked and caught signals), so that a test that timed out
    says where each process of the run was waiting.
    """
    lines: list[str] = []
    todo = [(pid, 0)]
    while todo:
        proc, depth = todo.pop()
        pad = "  " * depth
        base = Path(f"/proc/{proc}")
        try:
            status = dict(line.split(":\t", 1) for line in
                          (base / "status").read_text().splitlines() if ":\t" in line)
            cmd = (base / "cmdline").read_bytes().replace(b"\0", b" ")
            lines.append(f"{pad}{proc} {status.get('State', '?')} {cmd[:100]!r} "
                         f"pending={status.get('SigPnd')}/{status.get('ShdPnd')} "
                         f"blocked={status.get('SigBlk')} caught={status.get('SigCgt')}")
            for task in sorted((base / "task").iterdir(), key=lambda t: int(t.name)):
                call = (task / "syscall").read_text().strip()
                chan = (task / "wchan").read_text().strip()
                lines.append(f"{pad}  thread {task.name}: syscall {call} wchan {chan}")
                todo.extend((int(c), depth + 1) for c in (task / "children").read_text().split())
        except OSError as err:
            lines.append(f"{pad}{proc}: {err}")
    return "\n".join(lines)
