"""`boundedproc-timeout` / `python -m boundedproc.timeout`: coreutils timeout(1), SPEC 9.5.

Every test runs the command line as a user would (a subprocess, real signals, a pty with a
job-control shell where the terminal matters).  Where GNU timeout is installed, the tests that
pin its command line also run it with the same arguments and compare; they never need it.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import psutil
import pytest
from conftest import alive, describe_tree, exec_after, importable_env, pids_in, wait_dead

from boundedproc.timeout import parse_duration, parse_signal, signal_name

PY = sys.executable
CLI = [PY, "-m", "boundedproc.timeout"]
HINT = b"Try 'python -m boundedproc.timeout --help' for more information.\n"


def _gnu_timeout() -> str | None:
    path = "/usr/bin/timeout"
    if not os.access(path, os.X_OK):
        return None
    out = subprocess.run([path, "--version"], capture_output=True, timeout=10, check=False)
    return path if b"GNU coreutils" in out.stdout else None


GNU = _gnu_timeout()


def env_c(**extra: str) -> dict[str, str]:
    """The test environment in the C locale (ASCII quotes), reaching the package under test."""
    env = importable_env()
    env["LC_ALL"] = "C"
    env[SESSION_TAG] = SESSION  # so the last test finds what this file started, and only that
    env.update(extra)
    return env


SESSION_TAG = "BOUNDEDPROC_TIMEOUT_TESTS"
SESSION = f"{os.getpid()}-{time.time_ns()}"


def tcli(*args: str, env: dict[str, str] | None = None, timeout: float = 60,
         prefix: Sequence[str] = (), **kw: object) -> subprocess.CompletedProcess[bytes]:
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    return subprocess.run([*prefix, *CLI, *args], timeout=timeout, env=env or env_c(),
                          check=False, **kw)  # type: ignore[call-overload]


def gnu(*args: str) -> subprocess.CompletedProcess[bytes]:
    assert GNU is not None
    return subprocess.run([GNU, *args], capture_output=True, timeout=60, env=env_c(),
                          check=False)


def normal(stderr: bytes) -> bytes:
    """A message with the program's name and --help hint written as `timeout`."""
    assert GNU is not None
    return (stderr.replace(b"python -m boundedproc.timeout", b"timeout")
            .replace(GNU.encode(), b"timeout"))


def shell_status(returncode: int) -> int:
    """The status a shell reports ($?): 128+N for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def same_as_gnu(args: Sequence[str], ours: subprocess.CompletedProcess[bytes],
                stderr: bool = True) -> None:
    """GNU timeout, where installed, gives the shell the same status (and says the same).

    The status, not the wait status: where KILL was needed GNU timeout is killed by it
    itself (its own group is signalled) and we exit 137 (README).
    """
    if GNU is None:
        return
    theirs = gnu(*args)
    assert shell_status(theirs.returncode) == ours.returncode, (args, theirs.stderr)
    if stderr:
        assert normal(theirs.stderr) == normal(ours.stderr), args


class Started:
    """The command line started with Popen; killed, with what it started, on close."""

    def __init__(self, args: Sequence[str], prefix: Sequence[str] = (), **kw: object) -> None:
        # PYTHONFAULTHANDLER: a run that hangs is sent SIGABRT, and tells where it was.
        # prefix: exec_after()'s, for masks and dispositions (no preexec_fn: conftest).
        self.proc = subprocess.Popen([*prefix, *CLI, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env_c(PYTHONFAULTHANDLER="1"),
                                     **kw)  # type: ignore[call-overload]
        self.out = b""

    def line(self, within: float = 30) -> bytes:
        """The next line of the command's stdout (bounded)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + within
        while b"\n" not in self.out:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            assert ready, f"no line within {within} s: {self.out!r}"
            data = os.read(fd, 4096)
            assert data, f"EOF before a line: {self.out!r}"
            self.out += data
        first, _, self.out = self.out.partition(b"\n")
        return first

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def finish(self, within: float = 30) -> tuple[int, bytes, bytes]:
        try:
            out, err = self.proc.communicate(timeout=within)
        except subprocess.TimeoutExpired as hung:
            # Where each process was, then the Python stack of ours (faulthandler on SIGABRT).
            where = describe_tree(self.proc.pid)
            self.proc.send_signal(signal.SIGABRT)
            try:
                _, err = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                err = b"(no stack: still running after SIGABRT)"
            raise AssertionError(f"no end within {within} s; output so far {hung.output!r}\n"
                                 f"{where}\n{err.decode(errors='replace')}") from None
        return self.proc.returncode, self.out + out, err

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # the run dies with it (containment, or PDEATHSIG)
        self.proc.communicate(timeout=30)


@pytest.fixture
def started() -> Iterator[Callable[..., Started]]:
    """Start the command line; whatever is still running is killed after the test."""
    runs: list[Started] = []

    def start(*args: str, prefix: Sequence[str] = ()) -> Started:
        run = Started(args, prefix)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


# --- the duration ---------------------------------------------------------------------

TIMED = ["0.2", "0.2s", ".2", "2e-1", "0x1p-3", "0X.4P0", "0.003m", "5e-5h", "2e-6d", " 0.2",
         "+0.2", "1e-400"]


@pytest.mark.parametrize("duration", TIMED)
def test_duration_forms_time_out(duration: str) -> None:
    """Decimal, exponent, hexadecimal and unit forms (and an underflow: not 0) time out: 124."""
    started = time.monotonic()
    p = tcli(duration, "sleep", "30")
    assert p.returncode == 124 and p.stderr == b""
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("duration", ["0", "0s", "-0", "0x0", "0.0d", "inf", "INFINITY",
                                      "1e400", "1e308d"])
def test_durations_without_a_limit(duration: str) -> None:
    """0 means no limit; infinity and overflows mean one never reached."""
    p = tcli("--", duration, "sh", "-c", "sleep 0.3; exit 3")
    assert p.returncode == 3 and p.stderr == b""


BAD_DURATIONS = ["", "x", "1x", "1ss", "0.2 ", "-1", "nan", "NaN", "1e", "0x", "0xg", "1S",
                 "1,5", "s", ".", "1.2.3", "--1", "-inf"]


@pytest.mark.parametrize("duration", BAD_DURATIONS)
def test_bad_durations_are_125(duration: str) -> None:
    """Anything strtod and one unit cannot read is 125 with coreutils' message."""
    for args in (["--", duration, "true"], ["-k", duration, "1", "true"]):
        p = tcli(*args)
        assert p.returncode == 125
        assert p.stderr == b"timeout: invalid time interval '%s'\n%s" % (
            duration.encode(), HINT)
        same_as_gnu(args, p)


def test_negative_underflow_is_an_error() -> None:
    """-1e-400 reads as a tiny negative number: an error (as coreutils since 9.6; 9.1 took 0)."""
    p = tcli("--", "-1e-400", "true")
    assert p.returncode == 125 and b"invalid time interval" in p.stderr


@pytest.mark.parametrize("text, point, seconds", [
    ("1.5m", ".", 90.0), ("0x1.8p1", ".", 3.0), ("0xAd", ".", 173.0), ("1d", ".", 86400.0),
    ("1,5", ",", 1.5), ("1.5", ",", 1.5), ("1e-400", ".", 5e-324), ("inf", ".", math.inf),
    ("  7s", ".", 7.0), ("0x10", ".", 16.0), ("1e3", ".", 1000.0), ("2h", ".", 7200.0),
])
def test_parse_duration(text: str, point: str, seconds: float) -> None:
    """DURATION reads as strtod does (the locale's decimal point or '.'), times its unit."""
    assert parse_duration(text, point) == seconds


# --- exit statuses --------------------------------------------------------------------

STATUSES = [
    (["0.2", "sleep", "30"], 124),
    (["--bogus", "1", "true"], 125),
    (["1", "/"], 126),
    (["1", "/no/such/program"], 127),
    (["-k", "0.2", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], 137),
    (["-k", "1e-6", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], 137),  # fires at once
    (["-k", "5e-324", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], 137),
    (["-s", "KILL", "0.2", "sleep", "30"], 137),
    (["5", "sh", "-c", "exit 7"], 7),
    (["--preserve-status", "0.2", "sleep", "30"], 143),
    (["--preserve-status", "0.2", "sh", "-c", "trap 'exit 5' TERM; sleep 30 & wait"], 5),
    (["--preserve-status", "-k", "0.2", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], 137),
    (["0.2", "sh", "-c", "trap 'exit 5' TERM; sleep 30 & wait"], 124),
]


@pytest.mark.parametrize("args, status", STATUSES)
def test_exit_statuses(args: list[str], status: int) -> None:
    """124 on the deadline, 125 own failure, 126/127 as exec fails, 137 when KILL was needed."""
    p = tcli(*args)
    assert p.returncode == status, p.stderr
    same_as_gnu(args, p, stderr=False)


def test_preserve_status_short_option() -> None:
    """-p is --preserve-status and -f --foreground, as in coreutils 9.5+."""
    assert tcli("-p", "0.2", "sleep", "30").returncode == 143
    assert tcli("-f", "5", "sh", "-c", "exit 6").returncode == 6


def test_exec_failures_say_why() -> None:
    """A command that cannot be run is named with the system's reason, as coreutils does."""
    p = tcli("1", "/no/such/program")
    assert p.stderr == b"timeout: failed to run command '/no/such/program': No such file or directory\n"
    same_as_gnu(["1", "/no/such/program"], p)
    p = tcli("1", "/")
    assert p.stderr == b"timeout: failed to run command '/': Permission denied\n"



def test_a_script_without_a_shebang_runs_with_sh(tmp_path: Path) -> None:
    """An executable file the kernel cannot run (no #!) is run by /bin/sh, as execvp does."""
    script = tmp_path / "noshebang"
    script.write_text('echo "ran:$0:$1"; exit 3\n')
    script.chmod(0o755)
    p = tcli("5", str(script), "arg")
    assert (p.returncode, p.stdout, p.stderr) == (3, f"ran:{script}:arg\n".encode(), b"")
    same_as_gnu(["5", str(script), "arg"], p)
    # Found on PATH the same way, and the deadline still holds for it.
    env = env_c(PATH=f"{tmp_path}:{os.environ.get('PATH', os.defpath)}")
    p = tcli("5", "noshebang", "x", env=env)
    assert (p.returncode, p.stdout) == (3, f"ran:{script}:x\n".encode())
    script.write_text("sleep 30\n")
    assert tcli("0.3", str(script)).returncode == 124
    script.chmod(0o644)  # not executable: still 126
    assert tcli("5", str(script)).returncode == 126


# --- the command line -----------------------------------------------------------------

USAGE = [
    ([], b""),
    (["5"], b""),
    (["-x", "1", "true"], b"timeout: invalid option -- 'x'\n"),
    (["--foo", "1", "true"], b"timeout: unrecognized option '--foo'\n"),
    (["-k"], b"timeout: option requires an argument -- 'k'\n"),
    (["--kill-after"], b"timeout: option '--kill-after' requires an argument\n"),
    (["--ver", "1", "true"],
     b"timeout: option '--ver' is ambiguous; possibilities: '--verbose' '--version'\n"),
    (["--foreground=x", "1", "true"],
     b"timeout: option '--foreground' doesn't allow an argument\n"),
    (["-s", "FOO", "1", "true"], b"timeout: 'FOO': invalid signal\n"),
    (["-s", "65", "1", "true"], b"timeout: '65': invalid signal\n"),
    (["-s", "-9", "1", "true"], b"timeout: '-9': invalid signal\n"),
    (["--", "-1", "true"], b"timeout: invalid time interval '-1'\n"),
]


@pytest.mark.parametrize("args, message", USAGE)
def test_usage_errors_are_125(args: list[str], message: bytes) -> None:
    """Bad options and operand counts exit 125 with getopt's message and the --help hint."""
    p = tcli(*args)
    assert p.returncode == 125 and p.stderr == message + HINT
    same_as_gnu(args, p)


@pytest.mark.parametrize("args, status", [
    (["--sig=9", "0", "true"], 0), (["--pres", "1", "true"], 0), (["-vk1", "1", "true"], 0),
    (["-sKILL", "1", "true"], 0), (["--", "1", "true"], 0), (["--kill-after=1", "1", "true"], 0),
    (["1", "--", "true"], 127), (["1", "-v", "true"], 127),
])
def test_option_forms(args: list[str], status: int) -> None:
    """Abbreviated long options, grouped short ones, --opt=value; options end at DURATION."""
    p = tcli(*args)
    assert p.returncode == status
    same_as_gnu(args, p)


def test_help_and_version() -> None:
    """--help and --version print to stdout and exit 0, whatever follows them."""
    p = tcli("--help", "--bogus")
    assert p.returncode == 0 and p.stdout.startswith(
        b"Usage: timeout [OPTION]... DURATION COMMAND [ARG]...\n")
    from boundedproc import __version__

    p = tcli("--version")
    assert p.returncode == 0 and p.stdout == f"timeout (boundedproc) {__version__}\n".encode()
    assert tcli("--bogus", "--help").returncode == 125


def test_console_script_names_itself(tmp_path: Path) -> None:
    """Run as `boundedproc-timeout` it says so; through a link named `timeout`, `timeout:`."""
    script = tmp_path / "boundedproc-timeout"
    script.write_text(f"#!{PY}\nimport sys\nfrom boundedproc.timeout import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    (tmp_path / "timeout").symlink_to(script)
    for name in ("boundedproc-timeout", "timeout"):
        p = subprocess.run([str(tmp_path / name), "-v", "0.2", "sleep", "30"],
                           capture_output=True, timeout=60, env=env_c(), check=False)
        assert p.returncode == 124
        assert p.stderr == f"{name}: sending signal TERM to command 'sleep'\n".encode()
        p = subprocess.run([str(tmp_path / name), "x"], capture_output=True, timeout=60,
                           env=env_c(), check=False)
        assert p.stderr == f"Try '{name} --help' for more information.\n".encode()


# --- -s, -k, -v ---------------------------------------------------------------------

REPORTER = ("for s in HUP INT USR1 TERM; do trap \"echo $s; exit 0\" $s; done; "
            "echo ready; sleep 30 & wait")


@pytest.mark.parametrize("spelling, name", [
    ("HUP", b"HUP"), ("SIGHUP", b"HUP"), ("hup", b"HUP"), ("1", b"HUP"), ("sigusr1", b"USR1"),
    ("10", b"USR1"), ("TERM", b"TERM"), ("INT", b"INT"),
])
def test_signal_option(spelling: str, name: bytes) -> None:
    """-s takes a name (any case, SIG or not) or a number: that signal is sent at the deadline."""
    p = tcli("-s", spelling, "0.5", "sh", "-c", REPORTER)
    assert p.returncode == 124 and p.stdout == b"ready\n" + name + b"\n"


def test_signal_zero_sends_nothing() -> None:
    """-s 0 sends no signal: the command runs on, and the status is still 124."""
    started = time.monotonic()
    p = tcli("-v", "-s", "0", "0.2", "sh", "-c", "sleep 1; echo done")
    assert p.returncode == 124 and p.stdout == b"done\n"
    assert time.monotonic() - started >= 0.9
    assert p.stderr == b"timeout: sending signal EXIT to command 'sh'\n"
    args = ["-s", "0", "-k", "0.3", "0.2", "sleep", "30"]
    p = tcli(*args)
    assert p.returncode == 137
    same_as_gnu(args, p)


@pytest.mark.parametrize("spelling, num", [
    ("TERM", 15), ("sigterm", 15), ("Sig15", 15), ("0", 0), ("EXIT", 0), ("137", 9),
    ("265", 9), ("256", 0), ("RTMIN", signal.SIGRTMIN), ("rtmin+2", signal.SIGRTMIN + 2),
    ("RTMAX-1", signal.SIGRTMAX - 1), ("IOT", 6), ("CLD", 17), ("09", 9),
])
def test_parse_signal(spelling: str, num: int) -> None:
    """Signal operands as coreutils' operand2sig reads them (a shell's 128+N status too)."""
    assert parse_signal(spelling) == num


@pytest.mark.parametrize("spelling", ["", "FOO", "-9", " 9", "9x", "65", "200", "32",
                                      "RTMIN+", "RTMIN+31", "RTMAX-31", "2147483657", "SIG"])
def test_parse_signal_rejects(spelling: str) -> None:
    """What is no signal here is a ValueError (a 125 on the command line)."""
    with pytest.raises(ValueError):
        parse_signal(spelling)


def test_signal_names() -> None:
    """-v names a signal as coreutils does: ABRT not IOT, POLL not IO, RTMIN+n, EXIT for 0."""
    assert [signal_name(n) for n in (6, 29, 0, 9)] == ["ABRT", "POLL", "EXIT", "KILL"]
    assert signal_name(signal.SIGRTMIN + 2) == "RTMIN+2"
    assert signal_name(signal.SIGRTMAX - 1) == "RTMAX-1"
    assert signal_name(32) is None


def test_verbose_messages() -> None:
    """-v says each signal sent: the deadline's, then -k's KILL; quotes follow the locale."""
    cases = [
        (["-v", "0.2", "sleep", "30"], env_c(),
         b"timeout: sending signal TERM to command 'sleep'\n"),
        (["-v", "-s", "HUP", "0.2", "sleep", "30"], env_c(),
         b"timeout: sending signal HUP to command 'sleep'\n"),
        (["-v", "-k", "0.2", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], env_c(),
         (b"timeout: sending signal TERM to command 'sh'\n"
          b"timeout: sending signal KILL to command 'sh'\n")),
        (["-v", "-k", "1e-6", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], env_c(),
         (b"timeout: sending signal TERM to command 'sh'\n"
          b"timeout: sending signal KILL to command 'sh'\n")),
        (["-v", "0.2", "sleep", "30"], env_c(LC_ALL="C.UTF-8"),
         "timeout: sending signal TERM to command \u2018sleep\u2019\n".encode()),
    ]
    for args, env, message in cases:
        p = tcli(*args, env=env)
        assert p.stderr == message, args
        if GNU is not None:
            theirs = subprocess.run([GNU, *args], capture_output=True, timeout=60, env=env,
                                    check=False)
            assert normal(theirs.stderr) == normal(p.stderr), args


def test_verbose_quotes_odd_names() -> None:
    """A command name with a quote, a backslash or a control character is quoted as coreutils."""
    for name, shown in (("a'b", b"'a\\'b'"), ("a\\b", b"'a\\\\b'"), ("a\tb", b"'a\\tb'"),
                        ("\u00e9", b"'\\303\\251'")):
        p = tcli("1", name)
        assert p.returncode == 127
        assert p.stderr.startswith(b"timeout: failed to run command " + shown + b":"), name
        same_as_gnu(["1", name], p)



def test_verbose_quotes_in_a_utf8_locale() -> None:
    """In a UTF-8 locale a closing quote in the name is escaped, and what glibc prints is kept."""
    for name, shown in (("a\u2019b", "\u2018a\\\u2019b\u2019"),
                        ("a\u200bb", "\u2018a\u200bb\u2019"),
                        ("a\u00a0b", "\u2018a\u00a0b\u2019"),
                        ("a\u2028b", "\u2018a\\342\\200\\250b\u2019"),
                        ("a\u0085b", "\u2018a\\302\\205b\u2019")):
        p = tcli("1", name, env=env_c(LC_ALL="C.UTF-8"))
        assert p.returncode == 127
        assert p.stderr.startswith(
            f"timeout: failed to run command {shown}:".encode()), (name, p.stderr)
        if GNU is not None:
            theirs = subprocess.run([GNU, "1", name], capture_output=True, timeout=60,
                                    env=env_c(LC_ALL="C.UTF-8"), check=False)
            assert normal(theirs.stderr) == normal(p.stderr), name


def test_kill_after_counts_from_a_forwarded_signal(started: Callable[..., Started]) -> None:
    """-k's clock starts at the first signal sent, also one received and sent on: then 137."""
    run = started("-k", "0.3", "30", "sh", "-c", "trap '' TERM; echo ready; sleep 30")
    assert run.line() == b"ready"
    began = time.monotonic()
    run.signal(signal.SIGTERM)
    status, _, _ = run.finish()
    assert status == 137 and time.monotonic() - began < 20


def test_a_kill_after_of_a_microsecond_from_a_forwarded_signal(
        started: Callable[..., Started]) -> None:
    """-k 1e-6 fires within the signal's own handling: KILL follows at once, no recursion."""
    run = started("-k", "1e-6", "30", "sh", "-c", "trap '' TERM; echo ready; sleep 30")
    assert run.line() == b"ready"
    run.signal(signal.SIGTERM)
    status, _, err = run.finish()
    assert status == 137, err
    assert b"Error" not in err


# --- signals received ---------------------------------------------------------------

FORWARDED = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGALRM]
# The signals are blocked and taken with sigtimedwait: a handler of Python's would run
# only at the next bytecode, and one that came between the last check and the sleep's
# select() waited for the sleep to end (CI: "got 2" only at the deadline's SIGTERM, 30 s on).
CATCHER = (
    "import signal\n"
    f"caught = {[int(s) for s in FORWARDED]}\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, caught)\n"
    "print('ready', flush=True)\n"
    "info = signal.sigtimedwait(caught, 60)\n"
    "print('got', info.si_signo if info else 'nothing', flush=True)\n"
)


# What a shell does to a background job: SIGINT and SIGQUIT ignored.
IGNORE_INT_QUIT = exec_after("signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                             "signal.signal(signal.SIGQUIT, signal.SIG_IGN)")
CLOSE_0, CLOSE_1, CLOSE_2 = (exec_after(f"os.close({fd})") for fd in range(3))


SENT_ON = [s for s in FORWARDED if s != signal.SIGALRM]


@pytest.mark.parametrize("background", [False, True], ids=["foreground-job", "background-job"])
@pytest.mark.parametrize("sig", SENT_ON, ids=[s.name for s in SENT_ON])
def test_signals_are_sent_on(sig: signal.Signals, background: bool,
                             started: Callable[..., Started]) -> None:
    """Each of the six signals received reaches the command, also with INT/QUIT ignored."""
    run = started("30", PY, "-c", CATCHER, prefix=IGNORE_INT_QUIT if background else ())
    assert run.line() == b"ready"
    run.signal(sig)
    status, out, _ = run.finish()
    assert (status, out) == (0, f"got {int(sig)}\n".encode())


@pytest.mark.parametrize("options, sent", [
    ([], signal.SIGTERM), (["-s", "INT"], signal.SIGINT), (["-s", "ALRM"], signal.SIGALRM),
], ids=["TERM", "INT", "ALRM"])
def test_a_sigalrm_received_is_the_deadline(options: list[str], sent: signal.Signals,
                                            started: Callable[..., Started]) -> None:
    """A SIGALRM sent to us is the deadline, now, as coreutils: -s's signal is sent, then 124."""
    run = started("-v", *options, "30", PY, "-c", CATCHER)
    assert run.line() == b"ready"
    run.signal(signal.SIGALRM)
    status, out, err = run.finish()
    assert (status, out) == (124, f"got {int(sent)}\n".encode()), err
    assert err == f"timeout: sending signal {sent.name[3:]} to command '{PY}'\n".encode()


def test_cascaded_timeouts(started: Callable[..., Started]) -> None:
    """timeout -s ALRM N timeout -s INT M: the outer's deadline, as ALRM, ends the inner one's."""
    run = started("-s", "ALRM", "30", *CLI, "-s", "INT", "30", PY, "-c", CATCHER)
    assert run.line() == b"ready"  # both are in place: their handlers are installed
    run.signal(signal.SIGALRM)  # the outer's deadline, now (as coreutils' timeout-group.sh)
    status, out, err = run.finish()
    assert (status, out) == (124, f"got {int(signal.SIGINT)}\n".encode()), err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE])
def test_a_command_killed_by_a_signal_passes_it_on(sig: signal.Signals,
                                                   started: Callable[..., Started]) -> None:
    """A command killed by a signal we did not send: we end by the same signal (a loop stops)."""
    run = started("30", "sh", "-c", f"echo ready; sleep 0.2; kill -s {sig.name[3:]} $$; sleep 5")
    assert run.line() == b"ready"
    status, _, err = run.finish()
    assert status == -sig and b"Traceback" not in err


def test_ctrl_c_as_sigint_ends_the_cli_by_sigint(started: Callable[..., Started]) -> None:
    """SIGINT sent on kills a plain command; then the CLI ends by SIGINT, not an exit code."""
    run = started("30", "sh", "-c", "echo ready; exec sleep 30")
    assert run.line() == b"ready"
    run.signal(signal.SIGINT)
    status, _, _ = run.finish()
    assert status == -signal.SIGINT


@pytest.mark.parametrize("sig, trap, status", [
    (signal.SIGTERM, "exit 3", 3), (signal.SIGINT, "exit 0", 0), (signal.SIGHUP, "exit 9", 9),
])
def test_a_trapped_signal_decides_the_status(sig: signal.Signals, trap: str, status: int,
                                             started: Callable[..., Started]) -> None:
    """A command that traps the signal sent on exits as it chooses, and so do we, as coreutils."""
    name = sig.name[3:]
    run = started("30", "sh", "-c", f"trap '{trap}' {name}; echo ready; sleep 30 & wait")
    assert run.line() == b"ready"
    run.signal(sig)
    got, _, _ = run.finish()
    assert got == status


def test_blocked_signals_change_nothing(started: Callable[..., Started]) -> None:
    """Signals blocked by our parent (TERM, ALRM, CHLD) are still received, timed and sent on.
    COMMAND inherits the mask, as coreutils' does: the deadline sends HUP, which it does not
    block, and the TERM sent on reaches a command that unblocks it."""
    block = exec_after("signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, "
                       "signal.SIGALRM, signal.SIGCHLD, signal.SIGINT})")
    run = started("-s", "HUP", "0.3", "sleep", "30", prefix=block)
    assert run.finish()[0] == 124
    unblocking = ("import signal, time\nsignal.pthread_sigmask(signal.SIG_UNBLOCK, "
                  "{signal.SIGTERM})\nprint('ready', flush=True)\ntime.sleep(30)")
    run = started("30", PY, "-c", unblocking, prefix=block)
    assert run.line() == b"ready"
    run.signal(signal.SIGTERM)
    assert run.finish()[0] == -signal.SIGTERM


def _status_bits(status: bytes, field: bytes) -> int:
    (line,) = [x for x in status.splitlines() if x.startswith(field + b":")]
    return int(line.split()[1], 16)


def _bits(*sigs: int) -> int:
    return sum(1 << (s - 1) for s in sigs)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
@pytest.mark.parametrize("contain", [True, False], ids=["contained", "no-contain"])
@pytest.mark.parametrize("term", [None, "USR2"])
def test_the_inherited_mask_and_ignored_signals_reach_the_command(contain: bool,
                                                                  term: str | None) -> None:
    """As coreutils' COMMAND: the signal mask we inherited (SIGCHLD unblocked), and the
    signals we found ignored
    but those coreutils catches (HUP here, and -s's signal), which are at their default.
    PIPE and XFSZ, which Python ignores at its start, are at their default (README)."""
    block = {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT}
    ignore = {signal.SIGUSR2, signal.SIGHUP, signal.SIGWINCH}
    # SIGCHLD blocked too: coreutils unblocks it in itself (it waits with it) before it
    # takes the mask its COMMAND gets, so COMMAND has it unblocked.
    blocked = sorted(map(int, block | {signal.SIGCHLD}))
    prefix = exec_after(f"signal.pthread_sigmask(signal.SIG_BLOCK, {blocked})\n"
                        f"for s in {sorted(map(int, ignore))}: signal.signal(s, signal.SIG_IGN)")
    args = [*([] if contain else ["--no-contain"]), *(["-s", term] if term else []), "5",
            "cat", "/proc/self/status"]
    p = tcli(*args, prefix=prefix)
    assert p.returncode == 0, p.stderr
    assert _status_bits(p.stdout, b"SigBlk") == _bits(*block)
    kept = ignore - {signal.SIGHUP} - ({signal.SIGUSR2} if term else set())
    assert _status_bits(p.stdout, b"SigIgn") == _bits(*kept)
    if GNU is not None:
        theirs = subprocess.run([*prefix, GNU, *args[1 - contain:]], capture_output=True,
                                timeout=60, env=env_c(), check=False)
        # Not passed on by us: what Python ignores at its start, and the C library's own 32
        # and 33, which a posix_spawn from a threaded process (Python 3.13's subprocess,
        # here) leaves ignored and coreutils passes on.
        not_ours = _bits(signal.SIGPIPE, signal.SIGXFSZ, 32, 33)
        assert _status_bits(theirs.stdout, b"SigBlk") == _bits(*block)
        assert _status_bits(theirs.stdout, b"SigIgn") & ~not_ours == _bits(*kept)


def test_a_stop_signal_at_the_deadline_leaves_the_command_stopped(tmp_path: Path) -> None:
    """`-s STOP`: coreutils' COMMAND is stopped at the deadline and stays so; ours got
    SIGCONT right after (as every signal but KILL does, for a COMMAND stopped before it) and
    ran to its end. With `-k`, KILL ends it."""
    ticks = tmp_path / "ticks"
    loop = f"while :; do echo tick >> {shlex.quote(str(ticks))}; sleep 0.05; done"
    started = time.monotonic()
    p = tcli("-s", "STOP", "-k", "1.5", "0.5", "sh", "-c", loop)
    took = time.monotonic() - started
    assert p.returncode == 137, p.stderr
    assert took > 1.9, took  # the KILL came 1.5 s after the STOP; nothing ended it before
    # Ticks stop at the deadline (0.5 s, about 10): none while stopped (1.5 s, about 30 more).
    assert ticks.read_text().count("tick") < 20, ticks.read_text().count("tick")


@pytest.mark.parametrize("args, status", [
    (["5", "sh", "-c", "exit 4"], 4), (["0.2", "sleep", "30"], 124),
    (["-k", "0.2", "0.2", "sh", "-c", "trap '' TERM; sleep 30"], 137),
])
def test_inherited_sigchld_ignored_changes_nothing(args: list[str], status: int) -> None:
    """`trap '' CHLD` before exec (SIGCHLD ignored, inherited) changes no status."""
    p = subprocess.run(["sh", "-c", f"trap '' CHLD; exec {shlex.join([*CLI, *args])}"],
                       capture_output=True, timeout=60, env=env_c(), check=False)
    assert p.returncode == status, p.stderr


# --- stdio --------------------------------------------------------------------------


def test_closed_stdout() -> None:
    """With our stdout closed: no traceback, the command's status, and its own fd 1 closed."""
    probe = "import os, sys\ntry:\n    os.fstat(1)\nexcept OSError:\n    sys.exit(9)\n"
    for args, status in ((["5", "sh", "-c", "echo hi; exit 3"], 3),
                         (["5", PY, "-c", probe], 9), (["0.2", "sleep", "30"], 124)):
        p = tcli(*args, stdout=subprocess.DEVNULL, prefix=CLOSE_1)
        assert p.returncode == status and b"Traceback" not in p.stderr, args


def test_closed_stdout_for_our_own_output() -> None:
    """--help, --version and --json to a closed stdout: coreutils' write error, 125."""
    for args in (["--help"], ["--version"], ["--json", "5", "true"]):
        p = tcli(*args, stdout=subprocess.DEVNULL, prefix=CLOSE_1)
        assert p.returncode == 125, args
        assert p.stderr == b"timeout: write error: Bad file descriptor\n", args
    if GNU is not None:
        p = subprocess.run([*CLOSE_1, GNU, "--help"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=60, check=False)
        assert p.returncode == 125



@pytest.mark.parametrize("args", [
    ["-v", "0.2", "sleep", "30"], ["1", "/no/such/program"], ["1", "/"],
    ["-v", "--preserve-status", "0.2", "sh", "-c", "trap 'exit 0' TERM; sleep 30 & wait"],
])
@pytest.mark.parametrize("stderr", ["closed", "full"])
def test_a_message_stderr_cannot_take_is_125(args: list[str], stderr: str) -> None:
    """A message lost to a closed or full stderr makes the status 125, as coreutils' exit."""
    if stderr == "closed":
        p = tcli(*args, stderr=subprocess.DEVNULL, prefix=CLOSE_2)
    else:
        if not os.path.exists("/dev/full"):
            pytest.skip("no /dev/full")
        with open("/dev/full", "wb") as full:
            p = tcli(*args, stderr=full)
    assert p.returncode == 125, args
    if GNU is not None and stderr == "full":
        with open("/dev/full", "wb") as full:
            theirs = subprocess.run([GNU, *args], stdout=subprocess.PIPE, stderr=full,
                                    timeout=60, env=env_c(), check=False)
        assert theirs.returncode == 125, args


def test_no_message_no_stderr_needed() -> None:
    """With stderr closed and nothing to say, the status is the usual one (124, the command's)."""
    for args, status in ((["0.2", "sleep", "30"], 124), (["5", "sh", "-c", "exit 3"], 3),
                         (["-v", "-k", "0.2", "0.2", "sh", "-c", "trap '' TERM; sleep 30"],
                          137)):
        p = tcli(*args, stderr=subprocess.DEVNULL, prefix=CLOSE_2)
        assert p.returncode == status, args


def test_closed_stdin_and_stderr_are_passed_on_closed() -> None:
    """A closed fd 0 or 2 of ours is closed in the command too, never one of our own fds."""
    probe = ("import os, sys\nfor fd in (0, 2):\n    try:\n        os.fstat(fd)\n"
             "    except OSError:\n        print('closed', fd)\n")
    p = tcli("5", PY, "-c", probe, stdin=subprocess.DEVNULL, prefix=CLOSE_0)
    assert p.stdout == b"closed 0\n"
    p = tcli("5", PY, "-c", probe, stderr=subprocess.DEVNULL, prefix=CLOSE_2)
    assert p.stdout == b"closed 2\n"


def test_yes_into_head_returns_at_once() -> None:
    """`timeout 60 yes | head -1`: our stdout's reader leaves, yes dies, and so do we (SIGPIPE)."""
    started = time.monotonic()
    p = subprocess.run(["bash", "-c", f"set -o pipefail; {shlex.join(CLI)} 60 yes | head -1"],
                       capture_output=True, timeout=60, env=env_c(), check=False)
    assert p.stdout == b"y\n" and p.returncode == 128 + signal.SIGPIPE
    assert time.monotonic() - started < 20 and b"Traceback" not in p.stderr


def test_stdin_and_output_are_live() -> None:
    """stdin, stdout and stderr are ours: read as it comes, written as it goes, uncapped."""
    proc = subprocess.Popen([*CLI, "30", "sh", "-c", "read x; echo got:$x; cat >&2"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_c())
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"one\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"got:one\n"
        _, err = proc.communicate(b"x" * (20 << 20), timeout=60)
        assert proc.returncode == 0 and len(err) == 20 << 20
    finally:
        proc.kill()
        proc.wait()


def test_json_prints_the_result() -> None:
    """--json prints the Result after the command's output, with timed_out and our status."""
    p = tcli("--json", "5", "sh", "-c", "echo out; exit 3")
    head, _, tail = p.stdout.partition(b"\n")
    data = json.loads(tail)
    assert head == b"out" and p.returncode == 3
    assert data["exit_code"] == 3 and data["timed_out"] is False and data["stdout"] == ""
    p = tcli("--json", "0.2", "sleep", "30")
    data = json.loads(p.stdout)
    assert p.returncode == 124 and data["timed_out"] is True and data["exit_code"] == 124
    assert data["term_signal"] == signal.SIGTERM and data["args"] == ["sleep", "30"]



def test_json_with_an_argument_that_is_not_utf8() -> None:
    """--json with an argument that is not UTF-8 prints valid UTF-8 JSON (U+FFFD), no traceback."""
    p = subprocess.run([*CLI, "--json", "5", "echo", b"a\xffb"], capture_output=True,
                       timeout=60, env=env_c(), check=False)
    assert p.returncode == 0 and b"Traceback" not in p.stderr, p.stderr
    head, _, tail = p.stdout.partition(b"\n")
    assert head == b"a\xffb"
    assert json.loads(tail.decode("utf-8"))["args"] == ["echo", "a\ufffdb"]


# --- the whole run is killed at the end ------------------------------------------------

ESCAPE = "setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!; sleep 0.2"


def test_setsid_escapee_is_killed_at_the_end(reaper: list[int]) -> None:
    """A process that left the group with setsid is killed when the command ends (contained)."""
    p = tcli("5", "sh", "-c", ESCAPE)
    escapee = pids_in(p.stdout)
    reaper.extend(escapee)
    assert p.returncode == 0 and len(escapee) == 1
    assert wait_dead(escapee) == []


def test_no_contain_leaves_the_escapee(reaper: list[int]) -> None:
    """--no-contain is coreutils' reach: the setsid escapee outlives the run."""
    p = tcli("--no-contain", "5", "sh", "-c", ESCAPE)
    escapee = pids_in(p.stdout)
    reaper.extend(escapee)
    assert p.returncode == 0 and len(escapee) == 1 and alive(escapee[0])


def test_background_job_of_the_command_is_killed_at_the_end(reaper: list[int]) -> None:
    """`sh -c 'sleep 60 & exit 0'`: the background sleep dies with the run, at once."""
    started = time.monotonic()
    p = tcli("60", "sh", "-c", "sleep 60 >/dev/null & echo $!")
    left = pids_in(p.stdout)
    reaper.extend(left)
    assert p.returncode == 0 and wait_dead(left) == [] and time.monotonic() - started < 20


@pytest.mark.parametrize("contain", [True, False], ids=["contained", "no-contain"])
def test_foreground_signals_the_command_alone(contain: bool, reaper: list[int]) -> None:
    """--foreground: the deadline's signal goes to the command only, not its children."""
    args = ["--foreground", *([] if contain else ["--no-contain"]), "0.3", "sh", "-c",
            "sleep 60 >/dev/null 2>&1 & echo $!; wait"]
    p = tcli(*args)
    child = pids_in(p.stdout)
    reaper.extend(child)
    assert p.returncode == 124 and len(child) == 1
    # Contained, what the command left behind is killed at its end (beyond coreutils).
    assert (wait_dead(child) == []) if contain else alive(child[0])


@pytest.mark.parametrize("contain", [True, False], ids=["contained", "no-contain"])
def test_foreground_command_is_in_the_callers_process_group(contain: bool) -> None:
    """--foreground: COMMAND stays in the process group timeout was started in (as
    coreutils), contained too: the supervisor has a group of its own, and the leader joins
    the caller's from it.  Without --foreground, COMMAND leads a group of its own."""
    stat = "cut -d' ' -f5 /proc/$$/stat"  # the shell's process group
    extra = [] if contain else ["--no-contain"]
    p = tcli("--foreground", *extra, "10", "sh", "-c", stat)
    assert p.returncode == 0 and int(p.stdout) == os.getpgrp(), p
    p = tcli(*extra, "10", "sh", "-c", f"echo $$; {stat}")
    pid, pgid = p.stdout.split()
    assert p.returncode == 0 and pid == pgid, p


# --- a terminal ---------------------------------------------------------------------


# Started on the pty's slave end in a session of its own, it makes the pty its controlling
# terminal and becomes the program: what pty.fork() does, without forking this process
# (the suite's threads make a fork of it unsafe: see conftest).
_ON_TTY = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
           "os.execvp(sys.argv[1], sys.argv[1:])")


class Terminal:
    """A program on a new pty: what it writes is read back; closed with all its session."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        master, slave = os.openpty()
        try:
            self.proc = subprocess.Popen([PY, "-c", _ON_TTY, *argv], stdin=slave, stdout=slave,
                                         stderr=slave, env=env, start_new_session=True)
        finally:
            os.close(slave)
        self.pid, self.fd, self.out = self.proc.pid, master, b""
        self.status: int | None = None

    def _reaped(self, status: int) -> None:
        self.status = status
        self.proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not reap it

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0))
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: every writer is gone
            data = b""
        self.out += data
        return bool(data)

    def expect(self, pattern: bytes, within: float = 30) -> float:
        """Wait (bounded) until pattern was written; returns when (monotonic)."""
        deadline = time.monotonic() + within
        while re.search(pattern, self.out) is None:
            left = deadline - time.monotonic()
            assert left > 0, f"{pattern!r} not seen in {self.out!r}"
            assert self._read(left), f"EOF before {pattern!r}: {self.out!r}"
        return time.monotonic()

    def wait(self, within: float = 30) -> int:
        deadline = time.monotonic() + within
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(status)
                break
            assert time.monotonic() < deadline, f"still running: {self.out!r}"
            self._read(0.05)
        return self.status

    def close(self) -> None:
        for proc in psutil.process_iter(["pid"]):
            try:
                if os.getsid(proc.info["pid"]) == self.pid:
                    os.kill(proc.info["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue
        if self.status is None:
            self._reaped(os.waitpid(self.pid, 0)[1])
        os.close(self.fd)


@pytest.fixture
def terminal() -> Iterator[Callable[..., Terminal]]:
    """Open programs on ptys; each is killed, with its session, after the test."""
    opened: list[Terminal] = []

    def open_(*argv: str, env: dict[str, str] | None = None) -> Terminal:
        t = Terminal(argv, env or env_c(TERM="dumb"))
        opened.append(t)
        return t

    yield open_
    for t in opened:
        t.close()


def shell(terminal: Callable[..., Terminal]) -> Terminal:
    """An interactive bash with job control, at its prompt."""
    t = terminal("bash", "--norc", "--noprofile", "--noediting", "-i",
                 env=env_c(TERM="dumb", PS1="PROMPT> "))
    t.expect(b"PROMPT> ")
    return t


def test_foreground_command_uses_the_terminal(terminal: Callable[..., Terminal]) -> None:
    """--foreground: the command opens /dev/tty and reads what is typed there."""
    t = terminal(*CLI, "--foreground", "30", "sh", "-c", "read x </dev/tty; echo got:$x")
    t.send(b"hello\n")
    t.expect(b"got:hello")
    assert os.waitstatus_to_exitcode(t.wait()) == 0


def test_without_foreground_the_command_has_no_terminal(terminal: Callable[..., Terminal]) -> None:
    """Without --foreground the command leads its own session: no /dev/tty (README)."""
    t = terminal(*CLI, "30", "sh", "-c", "(: </dev/tty) 2>/dev/null || echo no-tty")
    t.expect(b"no-tty")
    t.wait()


def test_foreground_ctrl_c(terminal: Callable[..., Terminal]) -> None:
    """--foreground: Ctrl-C reaches the command from the terminal; we end by SIGINT."""
    t = terminal(*CLI, "--foreground", "30", "sh", "-c", "echo ready; exec sleep 30")
    t.expect(b"ready")
    t.send(b"\x03")
    status = t.wait()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT


def test_ctrl_c_stops_a_shell_loop(terminal: Callable[..., Terminal]) -> None:
    """Ctrl-C in a job-control shell ends the command and the loop around it, as coreutils."""
    t = shell(terminal)
    t.send(f"for i in 1 2 3; do {shlex.join(CLI)} 30 sh -c \"echo ready-$i; exec sleep 30\"; "
           "echo iter-$i; done\n".encode())
    t.expect(b"ready-1")
    t.send(b"\x03")
    t.expect(b"PROMPT> ", within=20)
    t.send(b"echo AFTER-$?\n")
    t.expect(b"AFTER-130")
    assert b"iter-1" not in t.out and b"ready-2" not in t.out


def test_ctrl_z_stops_the_command_and_the_deadline_keeps_wall_time(
        terminal: Callable[..., Terminal], tmp_path: Path) -> None:
    """Ctrl-Z stops the command and us; fg continues both; the deadline counts wall time."""
    ticks = tmp_path / "ticks"
    t = shell(terminal)
    began = time.monotonic()
    t.send(f"{shlex.join(CLI)} 4 sh -c 'while :; do echo tick >> {ticks}; sleep 0.05; done'"
           "\n".encode())
    deadline = time.monotonic() + 20
    while (not ticks.exists() or ticks.read_text().count("tick") < 3):
        assert time.monotonic() < deadline, t.out
        time.sleep(0.02)
    t.send(b"\x1a")
    t.expect(b"Stopped")
    time.sleep(0.3)  # a tick under way lands
    stopped_at = ticks.read_text().count("tick")
    time.sleep(2.0)
    assert ticks.read_text().count("tick") == stopped_at  # the command is stopped too
    t.send(b"fg\n")
    t.expect(rb"PROMPT> fg\r\n(?s:.*)PROMPT> ", within=30)  # the prompt after fg, once the job is over
    ended = time.monotonic()
    t.send(b"echo RC-$?\n")
    t.expect(b"RC-124")
    assert ticks.read_text().count("tick") > stopped_at  # it ran again after fg
    # 4 s of wall time, 2.3 of them stopped: a deadline that paused would end after 6.3 s.
    assert ended - began < 6.0


# A command that handles SIGTSTP (as a full-screen program does, to set its terminal back)
# and notes each one; it ends once told to by the file.
TSTP_HANDLER = """
import signal, sys, time
out = sys.argv[1]
def on_tstp(sig, frame):
    with open(out, "a") as f:
        f.write("tstp\\n")
signal.signal(signal.SIGTSTP, on_tstp)
with open(out, "a") as f:
    f.write("ready\\n")
until = time.monotonic() + 30
while time.monotonic() < until and "go-on" not in open(out).read():
    time.sleep(0.01)
"""


def test_ctrl_z_lets_a_command_that_handles_sigtstp_handle_it(tmp_path: Path) -> None:
    """Ctrl-Z stopped COMMAND with SIGSTOP alone (its own session's SIGTSTP is dropped by
    the kernel when unhandled), so a full-screen program never set its terminal back and
    was confused after `fg`. It now gets SIGTSTP first, a moment before the SIGSTOP."""
    out = tmp_path / "notes"
    out.write_text("")
    p = subprocess.Popen([*CLI, "30", PY, "-c", TSTP_HANDLER, str(out)], env=importable_env())
    try:
        deadline = time.monotonic() + 30
        while "ready" not in out.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        p.send_signal(signal.SIGTSTP)  # what the terminal sends on Ctrl-Z
        while psutil.Process(p.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert out.read_text().split() == ["ready", "tstp"]
    finally:
        with out.open("a") as f:
            f.write("go-on\n")
        p.send_signal(signal.SIGCONT)
        assert p.wait(60) == 0


def test_ctrl_z_stops_the_command_of_a_nested_timeout_too(tmp_path: Path) -> None:
    """`boundedproc-timeout 30 boundedproc-timeout 30 CMD`, Ctrl-Z: both timeouts stopped but
    CMD ran on (and in a terminal read what was typed at the shell). The inner one leads a
    session of its own, so its own SIGTSTP was dropped and it went straight on to continue
    CMD; and the outer stopped it 50 ms after its SIGTSTP, whatever it was doing. The inner
    stops itself with SIGSTOP there, and the outer waits for a COMMAND that handles SIGTSTP
    to stop itself."""
    ticks = tmp_path / "ticks"
    loop = f"while :; do echo tick >> {shlex.quote(str(ticks))}; sleep 0.05; done"
    p = subprocess.Popen([*CLI, "30", *CLI, "30", "sh", "-c", loop], env=importable_env())

    def count() -> int:
        return ticks.read_text().count("tick") if ticks.exists() else 0

    try:
        deadline = time.monotonic() + 30
        while count() < 3:
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.02)
        p.send_signal(signal.SIGTSTP)  # what the terminal sends on Ctrl-Z
        while psutil.Process(p.pid).status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.3)  # a tick under way lands
        stopped_at = count()
        time.sleep(1.0)
        assert count() == stopped_at  # CMD is stopped too
        p.send_signal(signal.SIGCONT)  # `fg`
        while count() == stopped_at:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        p.send_signal(signal.SIGCONT)
        p.send_signal(signal.SIGTERM)
        p.wait(60)


# --- coreutils' own tests ----------------------------------------------------------

CASES = Path(__file__).parent / "coreutils_timeout" / "run_cases.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="run_cases.sh needs bash")
def test_coreutils_cases_all_pass() -> None:
    """Every case of tests/coreutils_timeout (coreutils' tests/timeout/) passes for ours."""
    p = subprocess.run(["bash", str(CASES), *CLI], capture_output=True, timeout=600,
                       env=env_c(), check=False)
    report = p.stdout.decode()
    cases = [line.split(" ", 1)[0] for line in report.splitlines()
             if line.startswith(("PASS ", "FAIL ", "SKIP "))]
    # A SKIP is a tool this machine lacks (setsid, unshare with user namespaces), not ours.
    assert len(cases) == 35 and "FAIL" not in cases and p.returncode == 0, report + p.stderr.decode()


def test_no_process_left_behind_by_this_file() -> None:
    """After the tests above, no command of theirs is still running."""
    def ours(p: psutil.Process) -> bool:
        # by the tag env_c() sets: another test run on this machine is not this file's
        try:
            return p.environ().get(SESSION_TAG) == SESSION
        except psutil.Error:
            return False

    mine = [p for p in psutil.process_iter(["cmdline"])
            if "boundedproc.timeout" in " ".join(p.info["cmdline"] or []) and ours(p)]
    assert wait_dead([p.pid for p in mine], within=10) == []


@pytest.mark.skipif(shutil.which("setsid") is None or shutil.which("stty") is None,
                    reason="needs setsid and stty")
def test_a_kill_at_the_deadline_leaves_the_terminal_as_it_was() -> None:
    """A command that set its terminal raw (`stty raw -echo`, a full-screen program) and
    was killed by -s KILL left it raw: coreutils is killed by that KILL too, and the
    shell restores the modes it saved before the job; we exit 137, which the shell takes
    as a job that set its modes on purpose. The modes are now set back before the exit."""
    import termios

    master, slave = os.openpty()
    try:
        name = os.ttyname(slave)
        before = termios.tcgetattr(slave)
        assert before[3] & termios.ICANON and before[3] & termios.ECHO
        # The terminal becomes the controlling one of a new session, its group foreground.
        proc = subprocess.run(
            ["setsid", "sh", "-c", f'exec "$@" <>{name} >&0 2>&0', "sh",
             sys.executable, "-m", "boundedproc.timeout", "-s", "KILL", "0.5",
             "sh", "-c", "stty raw -echo; sleep 30"],
            env=importable_env(), timeout=60, check=False)
        assert proc.returncode == 137
        after = termios.tcgetattr(slave)
        assert after[3] & termios.ICANON and after[3] & termios.ECHO, "left raw"
    finally:
        os.close(master)
        os.close(slave)
