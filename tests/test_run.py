"""The run() contract of SPEC section 2, pinned against real processes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    SIGINT_PRELUDE,
    alive,
    group_members,
    importable_env,
    pids_in,
    wait_dead,
    wait_for_pids,
)

import boundedproc
from boundedproc import Cancel, ProcessFailed, Result, run

PY = sys.executable
BG = "echo $$; sleep 60 & echo $!; wait"


# ---- the group dies ---------------------------------------------------------------

def test_deadline_kills_background_descendant(reaper: list[int]) -> None:
    """A deadline on `sleep 60 & wait` empties the group and kills the background pid."""
    r = run(["bash", "-c", BG], timeout=0.3)
    leader, bg = pids_in(r.stdout)
    reaper.append(bg)
    assert r.timed_out and r.exit_code == boundedproc.DEADLINE_EXIT_CODE
    assert r.pid == leader
    assert wait_dead([bg]) == []
    assert group_members(leader) == []


def test_subprocess_control_leaves_descendant_alive(tmp_path: Path, reaper: list[int]) -> None:
    """Control: subprocess.run(timeout=) kills bash alone and its `sleep` survives."""
    pidfile = tmp_path / "pids"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["bash", "-c", f"echo $! > {pidfile}; sleep 60 & echo $! > {pidfile}; wait"],
                       check=False, timeout=0.5, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    bg = int(pidfile.read_text())
    reaper.append(bg)
    assert alive(bg)


def test_leader_exit_kills_the_rest(reaper: list[int]) -> None:
    """`echo hi; sleep 60 &` returns once bash exits, with `hi`, and the sleep is gone."""
    r = run(["bash", "-c", "echo hi; sleep 60 & echo $!"], timeout=30)
    bg = pids_in(r.stdout)[0]
    reaper.append(bg)
    assert r.stdout.startswith(b"hi\n")
    assert r.exit_code == 0 and not r.timed_out and r.ok
    assert r.duration < 10
    assert wait_dead([bg]) == []


@pytest.mark.parametrize("contain", [False, None])
def test_no_process_of_the_group_is_running_when_run_returns(contain: bool | None) -> None:
    """SPEC 2.2: no process of the group outlives the call, read the moment run() returns.
    Uncontained, 40 background jobs SIGKILLed with the group: about 2% of them were still
    running their exit (pipes closed, not yet zombies) when run() returned; it now waits
    (at most 0.25 s) until none is. Contained, the supervisor reaps them all."""
    left: list[int] = []
    for _ in range(6):
        r = run(["bash", "-c", "for i in $(seq 40); do sleep 30 & echo $!; done"],
                timeout=30, contain=contain)
        pids = pids_in(r.stdout)
        assert len(pids) == 40, r
        left += [p for p in pids if alive(p)]  # read at once, no waiting
    assert left == []


def _fork_script(script: str, how: str) -> Any:
    """Run a forking script for `how` ("contained" or not) in a fresh interpreter; what
    it printed, as JSON."""
    if how == "contained" and boundedproc.containment_status() != "available":
        pytest.skip("no containment here")
    done = subprocess.run([PY, "-c", script, how], env=importable_env(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# Another thread fork()s children that live on without exec (multiprocessing "fork"
# workers) while runs start: none of them may keep a copy of a run's pipes.
FORKS_DURING_RUNS = """
import json, os, sys, threading, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a fork with threads
from boundedproc import run
contain = sys.argv[1] == "contained"
bad, count, done = [], [0], threading.Event()
def checks():
    while not done.is_set():
        r = run(["cat"], stdin=b"data", timeout=1, drain_grace=0.5, contain=contain)
        count[0] += 1
        if not (r.ok and r.stdout == b"data") or r.duration > 0.5:
            bad.append([round(r.duration, 2), r.exit_code, r.timed_out, r.escaped])
t = threading.Thread(target=checks)
t.start()
kids = []
for _ in range(150):
    pid = os.fork()
    if pid == 0:
        time.sleep(3)
        os._exit(0)
    kids.append(pid)
    time.sleep(0.02)
done.set()
t.join()
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
print(json.dumps({"runs": count[0], "bad": bad}))
"""


@pytest.mark.parametrize("how", ["uncontained", "contained"])
def test_a_child_forked_while_runs_start_keeps_none_of_their_pipes(how: str) -> None:
    """A fork (by another thread) while a run's pipes were set up left the child's ends,
    or the stdin's write end, in the forked child: the run's stdout never reached EOF
    (escaped) or `cat` never saw its stdin's (124). fork() now waits for the few
    microseconds a run takes to set them up (spawn.c, "The fork guard")."""
    got = _fork_script(FORKS_DURING_RUNS, how)
    assert got["runs"] >= 3 and got["bad"] == [], got


FORK_WHILE_STDIN_IS_WRITTEN = """
import json, os, sys, threading, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a fork with threads
from boundedproc import run
payload = b"x" * (4 << 20)
got = {}
def check():
    r = run(["sh", "-c", "sleep 0.6; exec wc -c"], stdin=payload, timeout=5,
            contain=sys.argv[1] == "contained")
    got.update(ok=r.ok, out=r.stdout.decode().strip(), timed_out=r.timed_out,
               delivered=r.stdin_delivered, duration=r.duration)
t = threading.Thread(target=check)
t.start()
time.sleep(0.3)  # the loop is writing the payload: wc has not started reading
pid = os.fork()
if pid == 0:
    time.sleep(8)
    os._exit(0)
t.join()
os.kill(pid, 9)
os.waitpid(pid, 0)
print(json.dumps(got))
"""


@pytest.mark.parametrize("how", ["uncontained", "contained"])
def test_a_child_forked_while_stdin_is_written_keeps_no_write_end(how: str) -> None:
    """A payload larger than the pipe is written by the loop as the command reads. A child
    forked meanwhile (another thread's os.fork(), a multiprocessing worker) kept the
    stdin's write end, so `wc` never saw EOF and the run ended at its deadline (124). The
    fork's child now has that fd pointed at /dev/null (spawn.c, the guard's list)."""
    got = _fork_script(FORK_WHILE_STDIN_IS_WRITTEN, how)
    assert got["ok"] and got["out"] == str(4 << 20) and got["delivered"], got
    assert not got["timed_out"] and got["duration"] < 4, got


def test_setsid_escapee_sets_escaped(reaper: list[int]) -> None:
    """A descendant in its own session holding the pipes: escaped is set within drain_grace."""
    script = "setsid sh -c 'echo $$; exec sleep 30' & sleep 0.2; echo parent-done"
    r = run(["bash", "-c", script], timeout=20, drain_grace=0.5, contain=False)
    reaper.extend(pids_in(r.stdout))
    assert r.escaped
    assert not r.timed_out
    assert r.duration < 10
    assert b"parent-done" in r.stdout


def test_killed_background_jobs_are_not_escapees_under_load() -> None:
    """Forty background jobs killed with the run are not escapees, even with drain_grace=0
    and eight runs at once: a killed process can be a zombie while the kernel has yet to
    release its end of the pipes (a clock tick; tens of ms under load). Before, 77 of 80
    such runs said escaped; a pipe no process holds is now waited on until its EOF."""
    cmd = "for i in $(seq 40); do sleep 54 & done; exit 0"
    escaped: list[bool] = []

    def work() -> None:
        for _ in range(5):
            r = run(cmd, shell="bash", timeout=30, drain_grace=0, contain=False)
            escaped.append(r.escaped)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(escaped) == 40
    assert sum(escaped) <= 4, f"{sum(escaped)} of 40 runs said escaped"


def test_kill_grace_sigkills_a_group_that_traps_sigterm() -> None:
    """A group that ignores SIGTERM is SIGKILLed once kill_grace has passed."""
    r = run(["bash", "-c", "trap '' TERM; sleep 30 & wait"], timeout=0.2, kill_grace=0.8)
    assert r.timed_out and r.exit_code == 124
    assert r.term_signal == signal.SIGKILL
    assert r.duration >= 0.9


def test_kill_grace_ends_early_when_the_group_exits() -> None:
    """A group that exits on SIGTERM ends the grace early, long before it runs out."""
    r = run(["sleep", "30"], timeout=0.2, kill_grace=20)
    assert r.timed_out and r.exit_code == 124
    assert r.term_signal == signal.SIGTERM
    assert r.duration < 10


def test_killed_run_never_reports_zero() -> None:
    """A command that exits 0 on SIGTERM after the deadline still reports 124."""
    r = run(["bash", "-c", "trap 'exit 0' TERM; sleep 30 & wait"], timeout=0.2, kill_grace=5)
    assert r.timed_out and r.exit_code == 124 and not r.ok


# ---- cancel ---------------------------------------------------------------------

def test_cancel_before_spawn_spawns_nothing(tmp_path: Path) -> None:
    """An already-set Cancel: nothing runs, cancelled, exit 137, no runner_error."""
    marker = tmp_path / "marker"
    c = Cancel()
    c.cancel()
    r = run(["touch", str(marker)], cancel=c)
    assert not marker.exists()
    assert r.cancelled and not r.spawned and r.pid is None
    assert r.exit_code == boundedproc.CANCEL_EXIT_CODE
    assert r.runner_error is None


def test_cancel_mid_run_from_another_thread(reaper: list[int]) -> None:
    """Cancel from a thread: group gone, cancelled, exit 137, not timed out."""
    c = Cancel()
    threading.Timer(0.3, c.cancel).start()
    r = run(["bash", "-c", BG], timeout=30, cancel=c)
    leader, bg = pids_in(r.stdout)
    reaper.append(bg)
    assert r.cancelled and not r.timed_out
    assert r.exit_code == 137
    assert wait_dead([bg]) == []
    assert group_members(leader) == []


def test_one_cancel_shared_by_many_runs() -> None:
    """One Cancel ends several concurrent runs, and stays set for later runs."""
    c = Cancel()
    results: list[Result] = []
    threads = [threading.Thread(target=lambda: results.append(run(["sleep", "30"], cancel=c)))
               for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    c.cancel()
    c.cancel()  # idempotent
    for t in threads:
        t.join(20)
    assert len(results) == 3 and all(r.cancelled for r in results)
    assert c.cancelled and run(["true"], cancel=c).cancelled


def test_cancel_close_releases_fds() -> None:
    """Cancel.close() (or a with block) releases its fds; a closed switch is refused."""
    before = len(os.listdir("/proc/self/fd"))
    with Cancel() as c:
        assert len(os.listdir("/proc/self/fd")) == before + 2
    assert len(os.listdir("/proc/self/fd")) == before
    with pytest.raises(ValueError):
        run(["true"], cancel=c)


def test_cancel_cannot_be_pickled() -> None:
    """A Cancel refuses pickling: its fds would be wrong (and closed) in another process."""
    import pickle

    with pytest.raises(TypeError):
        pickle.dumps(Cancel())


# ---- the output cap --------------------------------------------------------------

INTERLEAVE = textwrap.dedent("""
    import sys
    for i in range(20):
        stream = sys.stdout if i % 2 == 0 else sys.stderr
        stream.write(chr(65 + i) * 1000)
        stream.flush()
    sys.exit(3)
""")


def test_combined_cap_keeps_exactly_max_output() -> None:
    """Interleaved writes: exactly max_output kept across both streams, all bytes counted."""
    r = run([PY, "-c", INTERLEAVE], max_output=5500)
    assert len(r.stdout) + len(r.stderr) == 5500
    assert r.output_bytes == 20000
    assert r.output_truncated
    assert r.exit_code == 3  # truncate lets the command finish with its own status
    # Each stream keeps a prefix of what was written to it.
    assert b"".join(bytes([65 + i]) * 1000 for i in range(0, 20, 2)).startswith(r.stdout)
    assert b"".join(bytes([65 + i]) * 1000 for i in range(1, 20, 2)).startswith(r.stderr)


def test_cap_keeps_the_first_bytes_in_arrival_order() -> None:
    """With merge_stderr the kept bytes are exactly the first max_output of the stream."""
    r = run([PY, "-c", INTERLEAVE], max_output=5500, merge_stderr=True)
    expected = b"".join(bytes([65 + i]) * 1000 for i in range(20))[:5500]
    assert r.stdout == expected and r.stderr == b""


def test_no_cap_and_exact_cap_are_not_truncated() -> None:
    """Output of exactly max_output bytes, or with no cap, is not flagged truncated."""
    r = run([PY, "-c", INTERLEAVE], max_output=20000)
    assert not r.output_truncated and len(r.stdout) + len(r.stderr) == 20000
    r = run([PY, "-c", INTERLEAVE], max_output=None)
    assert not r.output_truncated and r.output_bytes == 20000


def test_overflow_kill_ends_at_once() -> None:
    """`yes` under on_overflow='kill' is killed at the cap: 137, SIGKILL, cap kept."""
    r = run(["yes"], max_output=1 << 20, on_overflow="kill", timeout=30)
    assert r.exit_code == 137 and r.term_signal == signal.SIGKILL
    assert r.output_truncated and len(r.stdout) == 1 << 20
    assert not r.timed_out and r.duration < 10


@pytest.mark.parametrize("contain", [True, False])
def test_overflow_kill_racing_the_leaders_own_death_reports_that_death(contain: bool) -> None:
    """The cap's kill races a leader that kills itself: its status and signal agree.

    The leader writes past the cap and then dies of a signal of its own (SIGUSR1: a
    SIGSEGV would be caught by the sanitizer build's runtime, which its children inherit);
    sometimes that lands before the cap's SIGKILL (contained: 7 of 100 here).  Then its
    death is its own: 128 + N and N, as any signal the runner did not send (SPEC 2.4),
    still with output_truncated; otherwise 137 and SIGKILL.  Never 137 beside another.
    """
    seen = set()
    for _ in range(150):
        r = run(["bash", "-c", "head -c 100000 /dev/zero; kill -USR1 $$"], max_output=1000,
                on_overflow="kill", timeout=30, contain=contain)
        assert r.output_truncated and not r.timed_out
        seen.add((r.exit_code, r.term_signal))
    assert seen <= {(137, signal.SIGKILL), (128 + signal.SIGUSR1, signal.SIGUSR1)}, seen


def test_truncate_keeps_reading_so_writer_never_blocks() -> None:
    """Under truncate a writer of 8 MiB finishes though only 1 KiB is kept."""
    r = run([PY, "-c", "import sys; sys.stdout.buffer.write(b'x' * (8 << 20))"],
            max_output=1024, timeout=30)
    assert r.exit_code == 0 and r.output_truncated
    assert r.output_bytes == 8 << 20 and len(r.stdout) == 1024


def test_max_output_zero_keeps_nothing() -> None:
    """max_output=0 keeps no byte and flags any output as truncated."""
    r = run(["echo", "x"], max_output=0)
    assert r.stdout == b"" and r.output_truncated and r.output_bytes == 2


# ---- argument vectors --------------------------------------------------------------

ECHO_ARGV = "import os, sys; sys.stdout.buffer.write(b'\\0'.join(os.fsencode(a) for a in sys.argv[1:]))"


def test_argv_is_delivered_byte_exact() -> None:
    """Quotes, $(), backticks, newlines, spaces and non-UTF-8 bytes reach the child as given."""
    args = [b"'single'", b'"double"', b"$(touch /tmp/bp-never)", b"`id`", b"a\nb", b" sp ",
            b"\xff\xfe", b"*", b"", "é".encode()]
    r = run([PY, "-c", ECHO_ARGV, *args])
    assert r.stdout.split(b"\0") == args
    assert not os.path.exists("/tmp/bp-never")


def test_pathlike_and_str_entries() -> None:
    """Entries may be str, bytes or os.PathLike; args reports them as str."""
    r = run([Path(PY), "-c", ECHO_ARGV, Path("/a/b"), b"c"])
    assert r.stdout == b"/a/b\0c"
    assert r.args == (PY, "-c", ECHO_ARGV, "/a/b", "c")


def test_bash_n_parses_without_executing(tmp_path: Path) -> None:
    """`bash -n -c CHECK` parses the check and never runs it."""
    marker = tmp_path / "ran"
    ok = run(["bash", "-n", "-c", f"touch {marker}"])
    assert ok.exit_code == 0 and not marker.exists()
    bad = run(["bash", "-n", "-c", "if then fi ("])
    assert bad.exit_code != 0 and b"syntax error" in bad.stderr


# ---- stdin ---------------------------------------------------------------------

HASH_STDIN = "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())"


def test_stdin_payload_arrives_byte_exact() -> None:
    """A payload with NUL bytes and multibyte text arrives byte-exact."""
    payload = b"\0a\0" + "héllo ✓ 日本".encode() + b"\xff"
    r = run([PY, "-c", HASH_STDIN], stdin=payload)
    assert r.stdout.decode().strip() == hashlib.sha256(payload).hexdigest()
    assert r.stdin_delivered and r.runner_error is None


def test_stdin_str_is_utf8() -> None:
    """A str payload is sent as UTF-8."""
    r = run(["cat"], stdin="é✓")
    assert r.stdout == "é✓".encode()


def test_large_stdin_payload_to_a_reader() -> None:
    """A 4 MiB payload reaches a reader whole."""
    payload = os.urandom(4 << 20)
    r = run([PY, "-c", HASH_STDIN], stdin=payload, timeout=60)
    assert r.stdout.decode().strip() == hashlib.sha256(payload).hexdigest()
    assert r.stdin_delivered


def test_no_payload_means_eof_at_once() -> None:
    """Without a payload stdin is closed at once: `cat` sees EOF and exits."""
    r = run(["cat"], timeout=30)
    assert r.exit_code == 0 and not r.timed_out and r.stdout == b""


def test_unread_stdin_is_reported_not_raised() -> None:
    """A child that never reads a 4 MiB payload keeps its status; stdin_delivered is False."""
    r = run(["sh", "-c", "sleep 0.1; exit 3"], stdin=b"x" * (4 << 20), timeout=30)
    assert r.exit_code == 3
    assert not r.stdin_delivered and not r.ok
    assert r.runner_error is not None and r.runner_error.startswith("stdin not delivered: ")


def test_deadline_fires_while_child_holds_stdin() -> None:
    """A child that holds stdin open unread does not stop the deadline."""
    r = run(["sleep", "30"], stdin=b"x" * (4 << 20), timeout=0.3)
    assert r.timed_out and r.exit_code == 124 and not r.stdin_delivered


# ---- environment and PATH ----------------------------------------------------------

SHOW = "import os; print(os.environ.get('BP_A'), os.environ.get('BP_B'))"


def test_env_merge_and_replace_same_for_shell_and_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    """merge adds and removes (None) over the caller's env; replace gives env alone."""
    monkeypatch.setenv("BP_B", "inherited")
    for env, mode, expected in (
        ({"BP_A": "1"}, "merge", "1 inherited"),
        ({"BP_A": "1", "BP_B": None}, "merge", "1 None"),
        ({"BP_A": "1", "PATH": os.environ["PATH"]}, "replace", "1 None"),
    ):
        argv = run([PY, "-c", SHOW], env=env, env_mode=mode, text=True)  # type: ignore[arg-type]
        sh = run(f"{PY} -c \"{SHOW}\"", shell=True, env=env, env_mode=mode, text=True)  # type: ignore[arg-type]
        assert argv.stdout.strip() == sh.stdout.strip() == expected


def test_replace_gives_exactly_env() -> None:
    """env_mode='replace' gives the child exactly env and nothing else."""
    r = run(["/usr/bin/env"], env={"ONLY": "this"}, env_mode="replace")
    assert r.stdout == b"ONLY=this\n"


def test_path_lookup_uses_the_childs_env(tmp_path: Path) -> None:
    """cmd[0] is found on the child's PATH; without a PATH, os.defpath is searched."""
    tool = tmp_path / "bp-tool"
    tool.write_text("#!/bin/sh\necho found-me\n")
    tool.chmod(0o755)
    r = run(["bp-tool"], env={"PATH": str(tmp_path)})
    assert r.stdout == b"found-me\n"
    missing = run(["bp-tool"])
    assert not missing.spawned and missing.exit_code == 127 and "ENOENT" in missing.runner_error
    assert run(["true"], env={}, env_mode="replace").exit_code == 0  # /bin from os.defpath
    assert not run(["bp-tool"], env={}, env_mode="replace").spawned


# ---- what the child inherits --------------------------------------------------------

def test_child_has_default_sigpipe() -> None:
    """SIGPIPE is at its default in the child: `yes | head -c 10` kills yes by SIGPIPE."""
    r = run(["bash", "-c", 'yes | head -c 10; echo "${PIPESTATUS[0]}"'], timeout=20)
    assert r.stdout == b"y\n" * 5 + b"141\n" and not r.timed_out and r.exit_code == 0
    assert b"Broken pipe" not in r.stderr


def test_child_has_default_dispositions_and_empty_mask() -> None:
    """Every ignored/handled signal is at default, and the mask is empty, after exec."""
    code = textwrap.dedent("""
        import signal
        print(signal.pthread_sigmask(signal.SIG_BLOCK, []) == set())
        for line in open('/proc/self/status'):
            if line.startswith(('SigIgn', 'SigBlk')):
                print(line.split()[1])
    """)
    old = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        r = run([PY, "-c", code], text=True)
    finally:
        signal.signal(signal.SIGUSR1, old)
    lines = r.stdout.split()
    assert lines[0] == "True"
    # Python itself ignores SIGPIPE and SIGXFSZ at startup; nothing more must be ignored.
    ignored = int(lines[2], 16) if lines[1].startswith("0") and len(lines) > 2 else int(lines[1], 16)
    assert not ignored & (1 << (signal.SIGUSR1 - 1))


def test_child_sees_only_stdio_fds() -> None:
    """An inheritable fd of the caller is not open in the child: only 0, 1, 2."""
    fd = os.open("/dev/null", os.O_RDONLY)
    os.set_inheritable(fd, True)
    try:
        r = run(["sh", "-c", "ls /proc/$$/fd"], text=True)
    finally:
        os.close(fd)
    assert sorted(int(x) for x in r.stdout.split()) == [0, 1, 2]


def test_child_stdin_is_a_pipe_not_a_terminal() -> None:
    """The child's stdin is a pipe, never the caller's terminal."""
    code = "import os, stat; print(os.isatty(0), stat.S_ISFIFO(os.fstat(0).st_mode))"
    r = run([PY, "-c", code], text=True)
    assert r.stdout.split() == ["False", "True"]


def test_child_leads_a_new_session() -> None:
    """The child is the leader of a new session and process group."""
    code = "import os; print(os.getpid() == os.getsid(0) == os.getpgid(0))"
    r = run([PY, "-c", code], text=True)
    assert r.stdout.strip() == "True"
    assert os.getsid(0) != r.pid


# ---- exit codes ------------------------------------------------------------------

def test_own_exit_status() -> None:
    """A command that exits on its own reports its status."""
    r = run(["sh", "-c", "exit 5"])
    assert r.exit_code == 5 and r.term_signal is None and not r.ok


def test_signal_the_runner_did_not_send() -> None:
    """A leader killed by a signal the runner did not send reports 128+N."""
    r = run(["sh", "-c", "kill -USR1 $$"])
    assert r.exit_code == 128 + signal.SIGUSR1 and r.term_signal == signal.SIGUSR1


def test_missing_program_is_127_with_errno_name() -> None:
    """A missing program: not spawned, 127, `spawn failed: ENOENT` naming it."""
    r = run(["/no/such/program-x"])
    assert not r.spawned and r.exit_code == 127 and r.pid is None
    assert r.runner_error.startswith("spawn failed: ") and "ENOENT" in r.runner_error
    assert "/no/such/program-x" in r.runner_error


def test_non_executable_file_is_126(tmp_path: Path) -> None:
    """A file without execute permission is 126 (EACCES)."""
    f = tmp_path / "noexec"
    f.write_text("#!/bin/sh\necho hi\n")
    f.chmod(0o644)
    r = run([str(f)])
    assert r.exit_code == 126 and "EACCES" in r.runner_error and not r.spawned


def test_enoexec_is_126_and_never_handed_to_sh(tmp_path: Path) -> None:
    """An executable without a shebang (ENOEXEC) is 126, never run by /bin/sh."""
    marker = tmp_path / "marker"
    f = tmp_path / "script"
    f.write_text(f"touch {marker}\n")
    f.chmod(0o755)
    r = run([str(f)])
    assert r.exit_code == 126 and "ENOEXEC" in r.runner_error
    assert not marker.exists()


def test_cwd_missing_or_not_a_directory(tmp_path: Path) -> None:
    """A missing cwd is ENOENT and a file cwd is ENOTDIR: spawn failed, 127, and the text
    names the errno, the cwd and the program (SPEC 2.3: every `spawn failed: ` names both)."""
    missing = run(["true"], cwd=tmp_path / "nope")
    assert missing.exit_code == 127 and missing.runner_error is not None
    assert missing.runner_error == (
        f"spawn failed: ENOENT (No such file or directory): cwd {str(tmp_path / 'nope')!r} "
        "for 'true'")
    f = tmp_path / "file"
    f.write_text("")
    notdir = run(["true"], cwd=f)
    assert notdir.exit_code == 127 and notdir.runner_error is not None
    assert notdir.runner_error.startswith("spawn failed: ENOTDIR (")
    assert notdir.runner_error.endswith(f"cwd {str(f)!r} for 'true'")


def test_cwd_is_entered(tmp_path: Path) -> None:
    """The child starts in cwd."""
    r = run(["pwd"], cwd=tmp_path, text=True)
    assert os.path.samefile(r.stdout.strip(), tmp_path)


def test_nul_bytes_are_returned_not_raised() -> None:
    """NUL bytes in argv, env or cwd give `not spawned:` results, exit 127."""
    for kwargs in ({"cmd": ["echo", "a\0b"]}, {"cmd": ["echo"], "env": {"A": "x\0"}},
                   {"cmd": ["echo"], "cwd": "/tmp\0x"}, {"cmd": ["echo"], "env": {"A=B": "x"}}):
        cmd = kwargs.pop("cmd")
        r = run(cmd, **kwargs)  # type: ignore[arg-type]
        assert not r.spawned and r.exit_code == 127
        assert r.runner_error.startswith("not spawned: ")


@pytest.mark.parametrize("cmd, kwargs, what", [
    (["echo", "a\ud800"], {}, "cmd[1]"),
    ("echo \udfff", {"shell": True}, "the command string"),
    (["echo"], {"env": {"A": "\ud800"}}, "env['A']"),
    (["echo"], {"env": {"\ud800": "x"}}, "env key"),
    (["echo"], {"cwd": "/tmp/\ud800"}, "cwd"),
    (["cat"], {"stdin": "\ud800"}, "stdin"),
])
def test_lone_surrogates_are_returned_not_raised(cmd: object, kwargs: dict[str, object],
                                                 what: str) -> None:
    """A str no bytes encode (a lone surrogate, as a JSON file can spell it) cannot reach a
    process, as a NUL byte cannot: a `not spawned:` result that names where it was."""
    r = run(cmd, **kwargs)  # type: ignore[call-overload]
    assert (r.spawned, r.exit_code) == (False, 127)
    assert r.runner_error.startswith(f"not spawned: {what} contains a lone surrogate"), \
        r.runner_error
    assert r.args  # what would have run, for the report
    # SPEC 2.3: "there was no payload, or all of it was written": a payload that could
    # not be encoded was never written.
    assert r.stdin_delivered is ("stdin" not in kwargs)


def test_a_str_payload_gives_back_the_bytes_surrogateescape_stands_for() -> None:
    """U+DC80-U+DCFF in a str stand for the bytes 0x80-0xFF (os.fsdecode, a file read with
    errors="surrogateescape"): argv, env and cwd give them back, and so does stdin. It was
    `not spawned: stdin contains a lone surrogate (U+DCFF), which no bytes encode`."""
    text = b"a\xff\xfeb".decode("utf-8", "surrogateescape")
    r = run(["cat"], stdin=text)
    assert r.ok and r.stdout == b"a\xff\xfeb", r
    assert run(["printf", "%s", text]).stdout == b"a\xff\xfeb"


def test_e2big_is_returned() -> None:
    """An argument over the kernel's limit is `spawn failed: E2BIG`, not an exception."""
    r = run(["echo", "x" * (1 << 20)])
    assert not r.spawned and "E2BIG" in r.runner_error and r.exit_code in (126, 127)


# ---- caller bugs raise ------------------------------------------------------------

@pytest.mark.parametrize("cmd, kwargs, exc", [
    ("echo hi", {}, ValueError),
    (["echo", "hi"], {"shell": True}, ValueError),
    ([], {}, ValueError),
    (b"echo", {}, TypeError),
    (["echo", 3], {}, TypeError),
    ({"echo", "hi"}, {}, TypeError),  # unordered: which entry is the program?
    (frozenset({"true"}), {}, TypeError),
    ({"echo": 0, "hi": 0}, {}, TypeError),
    ({"echo": 0}.keys(), {}, TypeError),
    (["true"], {"timeout": -1}, ValueError),
    (["true"], {"timeout": float("nan")}, ValueError),
    (["true"], {"timeout": "1"}, TypeError),
    (["true"], {"max_output": -1}, ValueError),
    (["true"], {"max_output": 1.5}, TypeError),
    (["true"], {"max_output": "1M"}, TypeError),
    (["true"], {"max_output": -1.0}, ValueError),
    (["true"], {"max_output": float("nan")}, ValueError),
    (["true"], {"on_overflow": "explode"}, ValueError),
    (["true"], {"env_mode": "mix"}, ValueError),
    (["true"], {"stdin": 5}, TypeError),
    (["true"], {"kill_grace": -0.1}, ValueError),
    (["true"], {"drain_grace": float("nan")}, ValueError),
    (["true"], {"cancel": object()}, TypeError),
    (["true"], {"env": ["A=B"]}, TypeError),
])
def test_caller_bugs_raise_before_spawn(cmd: object, kwargs: dict, exc: type) -> None:
    """Wrong types, bad bounds, unknown modes and shell mismatches raise at once."""
    with pytest.raises(exc):
        run(cmd, **kwargs)  # type: ignore[arg-type]


def test_an_infinite_cap_is_no_cap() -> None:
    """max_output=math.inf reads as None (as timeout=math.inf does): all is kept."""
    r = run(["head", "-c", "100000", "/dev/zero"], max_output=math.inf)  # type: ignore[arg-type]
    assert r.ok and len(r.stdout) == 100000 and not r.output_truncated


def test_shell_forms() -> None:
    """shell=True runs /bin/sh -c; shell='bash' runs bash -c."""
    r = run("echo $0", shell=True, text=True)
    assert r.args == ("/bin/sh", "-c", "echo $0") and r.stdout.strip() == "/bin/sh"
    r = run("echo ${BASH_VERSION:+bash}", shell="bash", text=True)
    assert r.stdout.strip() == "bash" and r.args[0] == "bash"


@pytest.mark.parametrize("shell", [Path("/bin/sh"), b"/bin/sh"])
def test_shell_may_be_a_path_object_or_bytes(shell: object) -> None:
    """SPEC 2.1: shell= is "any program name or path": an os.PathLike or bytes names it
    as a str does (a string command still needs it; a vector still refuses it)."""
    r = run("echo $0", shell=shell, text=True)  # type: ignore[arg-type]
    assert r.args == ("/bin/sh", "-c", "echo $0") and r.stdout.strip() == "/bin/sh"
    with pytest.raises(ValueError):
        run(["true"], shell=shell)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        run("true", shell=3)  # type: ignore[arg-type]


# ---- results ------------------------------------------------------------------

def test_result_is_frozen_and_check_raises() -> None:
    """Result is frozen; check() returns ok results and raises ProcessFailed otherwise."""
    r = run(["true"])
    assert r.check() is r and r.ok
    with pytest.raises(AttributeError):
        r.exit_code = 3  # type: ignore[misc]
    bad = run(["false"])
    with pytest.raises(ProcessFailed) as info:
        bad.check()
    assert info.value.result is bad


def test_check_true_raises_a_message_a_user_can_read() -> None:
    """run(check=True) is run().check(); ProcessFailed quotes the command with shlex.join,
    ends with the last lines of stderr, and survives pickling (a process pool sends it)."""
    assert run(["true"], check=True).ok
    cmd = ["sh", "-c", "for i in 1 2 3 4 5 6 7; do echo line$i >&2; done; exit 3", "a b"]
    with pytest.raises(ProcessFailed) as info:
        run(cmd, check=True)
    message = str(info.value)
    assert message.splitlines()[0] == f"{shlex.join(cmd)}: exit 3"
    assert [m.strip() for m in message.splitlines()[1:]] == [f"line{i}" for i in range(3, 8)]
    assert info.value.result.exit_code == 3
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is ProcessFailed and again.result == info.value.result
    assert str(again) == message


def test_check_message_of_an_argument_that_is_not_utf8_can_be_written_as_utf8() -> None:
    """An argument byte that is not UTF-8 is a lone surrogate in `args` (b"caf\\xe9" is
    'caf\\udce9'): the message had it too, and a UTF-8 stream or log refused to write it
    (UnicodeEncodeError). It is now written as the surrogate's escape."""
    for cmd in ([b"sh", b"-c", b"exit 3", b"caf\xe9"], [b"/nonexistent/caf\xe9"]):
        with pytest.raises(ProcessFailed) as info:
            run(cmd, check=True)
        message = str(info.value)
        assert "caf\\udce9" in message, message
        message.encode("utf-8")  # raised UnicodeEncodeError
        assert info.value.result.args[-1].endswith("caf\udce9")  # the result keeps what ran


def test_check_message_stays_readable_whatever_the_command_wrote() -> None:
    """A 16 MiB last line, control characters, and output merged into stdout: the message
    is a few hundred characters, escaped, and shows the merged output's last lines."""
    with pytest.raises(ProcessFailed) as info:
        run([sys.executable, "-c", "import sys; sys.stderr.write('E' * 20_000_000); sys.exit(3)"],
            check=True)
    assert len(str(info.value)) < 1000
    assert str(info.value).splitlines()[1] == "  " + "E" * 197 + "..."
    cmd = ["sh", "-c", r"echo boom >&2; printf '\033[31mred\007\n' >&2; exit 3"]
    with pytest.raises(ProcessFailed) as info:
        run(cmd, check=True, merge_stderr=True)
    assert str(info.value).splitlines()[1:] == ["  boom", "  \\x1b[31mred\\x07"]


@pytest.mark.parametrize("keyword, hint", [
    ("input", "stdin="), ("capture_output", "captured by default"),
    ("universal_newlines", "text=True"), ("preexec_fn", "limits="),
])
def test_subprocess_keywords_name_the_equivalent(keyword: str, hint: str) -> None:
    """A keyword of subprocess.run is a TypeError that names boundedproc's equivalent."""
    with pytest.raises(TypeError, match=re.escape(hint)):
        run(["true"], **{keyword: b"x"})  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="unexpected keyword argument 'tiemout'"):
        run(["true"], tiemout=1)  # type: ignore[call-overload]


def test_text_mode_replaces_invalid_utf8() -> None:
    """text=True decodes UTF-8 with replacement characters for invalid bytes."""
    r = run([PY, "-c", "import sys; sys.stdout.buffer.write(b'ok \\xff'); sys.stderr.write('e')"],
            text=True)
    assert r.stdout == "ok \ufffd" and r.stderr == "e"


def test_rusage_fields() -> None:
    """user_time, system_time and max_rss come from wait4 on the leader."""
    r = run([PY, "-c", "x = sum(range(3_000_000))"])
    assert r.user_time > 0 and r.max_rss > 0 and r.duration > 0


# ---- concurrency, interruption, leaks ----------------------------------------------

def test_threads_run_concurrently() -> None:
    """8 threads each running `sleep 1` finish together, not one after another."""
    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(["sleep", "1"],)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert time.monotonic() - start < 5  # sequential would be 8 s


CTRL_C = textwrap.dedent("""
    import sys, threading, time
    from boundedproc import run
    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # another thread
    run(["bash", "-c", "echo $$ > {f}.tmp; sleep 60 & echo $! >> {f}.tmp; mv {f}.tmp {f}; wait"],
        timeout=60)
""")


def test_ctrl_c_kills_the_group_and_reraises(tmp_path: Path, reaper: list[int]) -> None:
    """SIGINT during run() kills the group, reaps it and raises KeyboardInterrupt promptly."""
    f = tmp_path / "pids"
    child = subprocess.Popen([PY, "-c", SIGINT_PRELUDE + CTRL_C.format(f=f)],
                             stderr=subprocess.PIPE)
    try:
        pids = wait_for_pids(f)
        reaper.extend(pids)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=10)
    finally:
        child.kill()
    assert b"KeyboardInterrupt" in err
    assert wait_dead(pids) == []


def test_thread_exit_watch_fallback() -> None:
    """The watcher-thread fallback (no pidfd) ends runs the same way."""
    from boundedproc import _native
    spec = _native.NativeSpec(
        argv=[b"bash", b"-c", BG.encode()], exec_paths=[b"/bin/bash", b"/usr/bin/bash"],
        envp=None, cwd=None, stdin=b"", timeout_ns=300_000_000, max_output=-1,
        overflow_kill=False, merge_stderr=False, cancel_fd=-1, cancel_fd2=-1,
        kill_grace_ns=0, drain_grace_ns=2_000_000_000, rlimits_soft=[-1] * 5,
        rlimits_hard=[-1] * 5, exit_watch=_native.WATCH_THREAD)
    out = _native.execute(spec)
    assert out.exit_watch == _native.WATCH_THREAD
    assert out.timed_out and out.exit_code == 124
    assert wait_dead(pids_in(out.stdout)) == []
    quick = _native.execute(_native.NativeSpec(**{**{f: getattr(spec, f) for f in spec.__slots__},
                                                  "argv": [b"bash", b"-c", b"exit 7"]}))
    assert quick.exit_code == 7 and not quick.timed_out


def _run_options(**overrides: object) -> object:
    """validate()'s Options for run()'s defaults with `overrides`."""
    import inspect

    from boundedproc import _options
    names = set(inspect.signature(_options.validate).parameters)
    kw = {n: p.default for n, p in inspect.signature(run).parameters.items() if n in names}
    return _options.validate(**{**kw, **overrides})


@pytest.mark.parametrize("overrides", [
    {}, {"timeout": 3.5, "max_output": 7, "on_overflow": "kill", "merge_stderr": True},
    {"stdout": boundedproc.DEVNULL, "keep": "tail", "kill_grace": 0.25, "drain_grace": 0.5},
    {"limits": boundedproc.Limits(cpu_seconds=5, open_files=64), "cwd": "/", "stdin": b"in"},
    {"contain": False, "env": {"BP_SPEC_TEST": "1"}},
])
def test_a_runs_spec_is_the_same_when_prepared_again_with_the_same_options(
        overrides: dict[str, object]) -> None:
    """prepare() builds a run's spec from its options once, and keeps the fields the options
    alone decide on them: a later run with the same options gets a spec equal, field by
    field, to one built anew (a positional slip would move a value into another field)."""
    from dataclasses import fields

    from boundedproc import _cancel, _native, _run
    names = [f.name for f in fields(_native.NativeSpec)]
    options = _run_options(**overrides)
    first = _run.prepare(["/bin/true"], False, options)
    assert options.spec_tail is not None  # type: ignore[attr-defined]
    with Cancel() as also:
        also_fd = also.fileno()
        token = _cancel.ALSO_CANCEL.set(also)
        try:
            again = _run.prepare(["/bin/echo", "x"], False, options)
        finally:
            _cancel.ALSO_CANCEL.reset(token)
        fresh = _run.prepare(["/bin/echo", "x"], False, _unseen_copy(options))
    assert first.spec is not None and again.spec is not None
    want = {n: getattr(first.spec, n) for n in names}
    want.update(argv=[b"/bin/echo", b"x"], exec_paths=[b"/bin/echo"], cancel_fd2=also_fd)
    assert {n: getattr(again.spec, n) for n in names} == want
    assert fresh.spec is not None
    assert {n: getattr(fresh.spec, n) for n in names} == {**want, "cancel_fd2": -1}


def _unseen_copy(options: object) -> object:
    """A copy of `options` that prepare() has not seen (dataclasses.replace drops the memo)."""
    from dataclasses import replace
    copy = replace(options)  # type: ignore[type-var]
    assert copy.spec_tail is None  # type: ignore[attr-defined]
    return copy


def test_a_spec_from_remembered_options_follows_containment_and_per_run_lookups() -> None:
    """What the options alone do not decide is never taken from an earlier run: whether
    contain=None means contained (the system may refuse the supervisor meanwhile), and the
    streams and ids looked up at each run (INHERIT, user=, group=)."""
    from boundedproc import _native, _run
    options = _run_options()
    assert _run.prepare(["/bin/true"], False, options).spec.contain is _native.CONTAIN_SUPPORTED
    saved = _native.CONTAIN_SUPPORTED
    _native.CONTAIN_SUPPORTED = not saved
    try:
        flipped = _run.prepare(["/bin/true"], False, options).spec
    finally:
        _native.CONTAIN_SUPPORTED = saved
    assert flipped is not None and flipped.contain is (not saved)
    for per_run in ({"stdin": boundedproc.INHERIT}, {"group": os.getgid()}):
        options = _run_options(**per_run)
        assert _run.prepare(["/bin/true"], False, options).spec is not None
        assert options.spec_tail is None, per_run  # type: ignore[attr-defined]


def test_a_result_and_an_outcome_carry_every_field_of_what_they_are_built_from() -> None:
    """The core's report becomes a NativeOutcome, and that a Result, in positional calls:
    each field, set to a value no other field has, lands where its name says."""
    import types
    from dataclasses import fields, replace

    from boundedproc import _native, _run
    ints = {"pid": 11, "exit_code": 12, "term_signal": 13, "stdin_written": 14, "err_stage": 0,
            "err_errno": 16, "output_bytes": 17, "max_rss": 18, "exit_watch": 19,
            "unkilled": 0, "stdout_read": 21, "stderr_read": 22, "stdout_gap": 23,
            "stderr_gap": 24, "raw_exit_code": 25, "stdout_len": 0, "stderr_len": 0,
            "runner_failed": _native.lib.BP_RUNNER_OK, "runner_status": -1}
    flags = ("spawned", "timed_out", "cancelled", "output_truncated", "escaped",
             "stdin_delivered")
    for flag in (*flags, None):
        res = types.SimpleNamespace(**ints, **{f: int(f == flag) for f in flags},
                                    user_time=0.5, system_time=0.25)
        out = _native._outcome(_native.ffi.NULL, res, 0)
        assert {f: getattr(out, f) for f in flags} == {f: f == flag for f in flags}
        assert (out.pid, out.exit_code, out.term_signal, out.stdin_written, out.err_errno,
                out.output_bytes, out.max_rss, out.exit_watch, out.raw_exit_code,
                out.stdout_omitted, out.stderr_omitted, out.stdout_gap, out.stderr_gap,
                out.user_time, out.system_time, out.stdout, out.stderr, out.runner_failure
                ) == (11, 12, 13, 14, 16, 17, 18, 19, 25, 21, 22, 23, 24, 0.5, 0.25, b"", b"",
                      None)
        prepared = _run.prepare(["/bin/true"], False, _run_options())
        out = replace(out, stdout=b"o", stderr=b"e", stdin_delivered=True)
        result = _run._to_result(out, prepared, 0.0, duration=1.5)
        shown = {f: getattr(out, f) for f in ("exit_code", "stdout", "stderr", "timed_out",
                                              "cancelled", "output_truncated", "escaped",
                                              "spawned", "stdin_delivered", "output_bytes",
                                              "user_time", "system_time", "max_rss",
                                              "stdout_omitted", "stderr_omitted",
                                              "stdout_gap", "stderr_gap")}
        assert {f: getattr(result, f) for f in shown} == shown, flag
        assert (result.args, result.term_signal, result.pid, result.duration,
                result.runner_error, result.cleanup_error) == (
            ("/bin/true",), 13, 11 if flag == "spawned" else None, 1.5, None, None)
        assert len(fields(result)) == len(shown) + 6


def test_a_runs_result_is_a_frozen_result_like_one_built_by_keyword() -> None:
    """run()'s result is made in an unfrozen twin of Result that then becomes one: it is a
    Result in every way a caller can look (type, frozen, equality, hash, replace, pickle)."""
    import dataclasses

    result = run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert type(result) is Result and isinstance(result, Result)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.exit_code = 0  # type: ignore[misc]
    built = Result(**{f.name: getattr(result, f.name) for f in dataclasses.fields(Result)})
    assert built == result and hash(built) == hash(result) and repr(built) == repr(result)
    assert dataclasses.replace(result, exit_code=4) == dataclasses.replace(built, exit_code=4)
    assert pickle.loads(pickle.dumps(result)) == result
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")


def test_spec_struct_has_each_runs_own_values() -> None:
    """The C spec of a run carries its own options even right after a run with other ones
    (the plain values are copied from a struct shared by runs with the same ones)."""
    from boundedproc import _native
    ffi = _native.ffi
    base = _native.NativeSpec(
        argv=[b"true"], exec_paths=[b"/bin/true"], envp=None, cwd=None, stdin=b"",
        timeout_ns=1, max_output=2, overflow_kill=False, merge_stderr=False, cancel_fd=3,
        cancel_fd2=4, kill_grace_ns=5, drain_grace_ns=6, rlimits_soft=[7, 8, 9, 10, 11],
        rlimits_hard=[12, 13, 14, 15, 16], exit_watch=_native.WATCH_THREAD, contain=False,
        stdin_fd=17, stdout_fd=18, stderr_fd=19, first_signal=20, new_session=False, keep=1,
        uid=21, gid=22, groups=(23, 24))
    other = {"timeout_ns": 101, "max_output": 102, "overflow_kill": True, "merge_stderr": True,
             "cancel_fd": 103, "cancel_fd2": 104, "kill_grace_ns": 105, "drain_grace_ns": 106,
             "rlimits_soft": [7, 8, 9, 10, 111], "rlimits_hard": [112, 13, 14, 15, 16],
             "exit_watch": _native.WATCH_AUTO, "contain": True, "stdin_fd": 117,
             "stdout_fd": 118, "stderr_fd": 119, "first_signal": 9, "new_session": True,
             "keep": 2, "uid": 121, "gid": 122, "groups": (123,)}

    def fields(c: object) -> dict[str, object]:
        got = {f: getattr(c, f) for f in other if f not in ("rlimits_soft", "rlimits_hard",
                                                             "groups")}
        got["rlimits_soft"] = list(c.rlimits_soft)  # type: ignore[attr-defined]
        got["rlimits_hard"] = list(c.rlimits_hard)  # type: ignore[attr-defined]
        got["groups"] = tuple(c.groups[i] for i in range(c.ngroups))  # type: ignore[attr-defined]
        return got

    def expected(spec: _native.NativeSpec) -> dict[str, object]:
        want = {f: getattr(spec, f) for f in other}
        for flag in ("overflow_kill", "merge_stderr", "contain", "new_session"):
            want[flag] = int(want[flag])  # type: ignore[call-overload]
        want["rlimits_soft"] = list(spec.rlimits_soft)
        want["rlimits_hard"] = list(spec.rlimits_hard)
        return want

    for name, value in other.items():
        changed = _native.NativeSpec(**{**{f: getattr(base, f) for f in base.__slots__},
                                        name: value})
        for spec in (base, changed, base):
            c, _keep = _native._cspec(spec, False)
            assert fields(c) == expected(spec), name
            assert (c.wake_fd, c.report_chunks, ffi.string(c.argv[0])) == (-1, 0, b"true")
    chunks, _keep = _native._cspec(base, True)
    assert chunks.report_chunks == 1


def _fd_count() -> int:
    import gc

    gc.collect()  # a dropped Cancel releases its fds when collected
    return len(os.listdir("/proc/self/fd"))


def test_no_fd_leak_over_10000_runs() -> None:
    """10,000 runs (with failures mixed in) keep the caller's fd count flat."""
    run(["true"])
    before = _fd_count()
    for i in range(10_000):
        if i % 1000 == 1:
            run(["/no/such"])
        elif i % 1000 == 2:
            run(["sleep", "5"], timeout=0.001)
        else:
            run(["/bin/true"])
    assert _fd_count() == before


CLOSED_STDIO = textwrap.dedent("""
    import json, os, sys, threading
    out = open(sys.argv[1], "w")
    os.close(0); os.close(1); os.close(2)
    from boundedproc import run
    rows = []
    def work():  # not the main thread: no wakeup pipe takes the low fds
        for contain in (None, False):
            ok = run(["sh", "-c", "cat; echo out; echo err >&2"], stdin=b"in ", contain=contain)
            bad = run(["/no/such/prog"], contain=contain)
            rows.append([ok.stdout.decode(), ok.stderr.decode(), bad.spawned, bad.runner_error])
    t = threading.Thread(target=work)
    t.start()
    t.join()
    out.write(json.dumps(rows))
""")


def test_caller_with_closed_stdio(tmp_path: Path) -> None:
    """A caller whose fds 0-2 are closed still gets correct pipes and spawn errors."""
    import json

    report = tmp_path / "report.json"
    subprocess.run([PY, "-c", CLOSED_STDIO, str(report)], timeout=60, check=True)
    rows = json.loads(report.read_text())
    assert len(rows) == 2
    for stdout, stderr, spawned, error in rows:
        assert stdout == "in out\n" and stderr == "err\n"
        assert spawned is False and "ENOENT" in error


def test_remembered_options_still_refuse_what_differs_only_in_type() -> None:
    """Validated options are remembered by value and type: True then 1, 0.5 then '0.5', a
    good keep then a bad one: the second of each is still refused."""
    assert run(["true"], merge_stderr=True, timeout=0.5).ok
    with pytest.raises(TypeError):
        run(["true"], merge_stderr=1, timeout=0.5)  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        run(["true"], timeout="0.5")  # type: ignore[call-overload]
    assert run(["true"], keep="tail").ok
    with pytest.raises(ValueError):
        run(["true"], keep="tail ")  # type: ignore[call-overload]
    for _ in range(2):  # a refused value is never remembered
        with pytest.raises(ValueError):
            run(["true"], timeout=-1.0)


@pytest.mark.parametrize("contain", [True, False], ids=["contained", "uncontained"])
def test_a_payload_the_pipe_holds_is_delivered_to_a_command_that_never_reads(
        contain: bool) -> None:
    """A small stdin payload to a command that exits at once without reading it (a test
    harness feeds every case an input the program may ignore): delivered every time.  It
    was written only after the spawn, and lost the race to the command's exit about once in
    a hundred runs (stdin_delivered=False, ok=False, `stdin not delivered: 0 of 6 bytes`);
    it is now in the pipe before the command starts."""
    results = [run(["true"], stdin=b"hello\n", contain=contain) for _ in range(500)]
    bad = [(r.stdin_delivered, r.runner_error) for r in results if not r.ok]
    assert bad == []
    assert {r.stdin_delivered for r in results} == {True}


def test_a_payload_larger_than_the_pipe_is_partly_written_before_the_start() -> None:
    """Past what the pipe holds, the rest waits for the command to read: one that never
    does leaves the payload undelivered, the bytes the pipe took counted as written."""
    r = run(["true"], stdin=b"x" * (4 << 20))
    assert (r.stdin_delivered, r.ok) == (False, False)
    assert r.runner_error is not None
    m = re.match(r"stdin not delivered: (\d+) of 4194304 bytes written", r.runner_error)
    assert m is not None and 0 < int(m.group(1)) < 4 << 20, r.runner_error


@pytest.mark.parametrize("contain", [True, False], ids=["contained", "uncontained"])
def test_a_stopped_command_is_continued_after_the_deadlines_sigterm(contain: bool) -> None:
    """A command that stopped itself never acted on the deadline's SIGTERM: its handler
    never ran, and the grace ran to its end before the SIGKILL.  SIGCONT follows the
    SIGTERM, as coreutils' timeout sends it: the handler runs and the grace ends with it."""
    t = time.monotonic()
    r = run(["sh", "-c", 'trap "echo term; exit 5" TERM; kill -STOP $$'], timeout=0.3,
            kill_grace=5, contain=contain)
    took = time.monotonic() - t
    assert (r.timed_out, r.exit_code, r.stdout, r.term_signal) == (True, 124, b"term\n", None), r
    assert took < 3, took
