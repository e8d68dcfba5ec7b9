"""`python -m boundedproc`: the group-safe timeout(1) of SPEC section 4."""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import exec_after, importable_env, pids_in, python_module_argv, wait_dead, wait_for

from boundedproc.__main__ import main, parse_size

PY = sys.executable


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([PY, "-m", "boundedproc", *args], capture_output=True, timeout=timeout,
                          check=False)


@pytest.mark.parametrize("text, expected", [
    ("1048576", 1048576), ("512K", 512 * 1024), ("16M", 16 << 20), ("2G", 2 << 30),
    ("1k", 1024), ("3MiB", 3 << 20), ("1.5K", 1536),
])
def test_parse_size(text: str, expected: int) -> None:
    """SIZE is bytes or a number with K, M or G in powers of 1024."""
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "-1", "1T", "1.5.2M",
                                  "\u0663",  # ARABIC-INDIC DIGIT THREE: \d, not a byte count
                                  "1.5"])   # a fraction of a byte
def test_parse_size_rejects(text: str) -> None:
    """Anything else is a usage error."""
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size(text)


def test_exit_code_and_output_pass_through() -> None:
    """The command's stdout, stderr and exit status pass through."""
    p = cli("--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert p.returncode == 7 and p.stdout == b"out\n" and b"err\n" in p.stderr


def test_deadline_is_124_and_kills_the_group() -> None:
    """--timeout ends the run with 124 and no background process survives."""
    p = cli("--timeout", "0.3", "--", "bash", "-c", "echo $$; sleep 60 & echo $!; wait")
    assert p.returncode == 124
    assert wait_dead(pids_in(p.stdout)) == []
    assert b"timed out" in p.stderr


def test_a_note_starts_its_own_line_after_output_without_one() -> None:
    """The command's stderr ended mid-line: our note began on it ("partialboundedproc:
    timed out ..."). It gets a line of its own; stdout, another file, is left alone."""
    p = cli("--timeout", "0.3", "--", "sh", "-c", "printf partial >&2; sleep 5")
    assert p.returncode == 124
    assert p.stderr == b"partial\nboundedproc: timed out after 0.3 s\n", p.stderr
    p = cli("--timeout", "0.3", "--", "sh", "-c", "echo line >&2; printf out; sleep 5")
    assert (p.stdout, p.stderr) == (b"out", b"line\nboundedproc: timed out after 0.3 s\n")


def test_json_has_every_field() -> None:
    """--json prints the Result as one JSON object with every field."""
    p = cli("--json", "--", "sh", "-c", "printf 'a\\377'; exit 3")
    data = json.loads(p.stdout)
    assert p.returncode == 3 and data["exit_code"] == 3
    assert data["stdout"] == "a\ufffd" and data["args"] == ["sh", "-c", "printf 'a\\377'; exit 3"]
    for field in ("timed_out", "cancelled", "output_truncated", "escaped", "spawned",
                  "stdin_delivered", "runner_error", "term_signal", "pid", "duration",
                  "output_bytes", "user_time", "system_time", "max_rss", "ok"):
        assert field in data


def test_shell_joins_words() -> None:
    """With --shell the words after -- are joined into one command for SH -c."""
    p = cli("--json", "--shell", "bash", "--", "echo", "$((6*7))")
    data = json.loads(p.stdout)
    assert data["args"] == ["bash", "-c", "echo $((6*7))"] and data["stdout"] == "42\n"


def test_max_output_and_kill() -> None:
    """--max-output with --on-overflow kill ends `yes` at the cap with 137."""
    p = cli("--max-output", "64K", "--on-overflow", "kill", "--", "yes")
    assert p.returncode == 137 and len(p.stdout) == 64 * 1024
    assert b"truncated" in p.stderr


def test_missing_program_is_127() -> None:
    """A program that cannot be started exits 127 with the runner's error on stderr."""
    p = cli("--", "/no/such/prog")
    assert p.returncode == 127 and b"spawn failed: ENOENT" in p.stderr


def test_usage_errors() -> None:
    """No command, a bad option or a bad option value is a usage error: exit 125, as timeout(1)."""
    for argv in ([], ["--timeout", "-1", "--", "true"], ["--no-such-option", "--", "true"],
                 ["--max-output", "1T", "--", "true"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 125, argv
    p = cli("--timeout", "x", "--", "true")
    assert p.returncode == 125 and b"not a number of seconds" in p.stderr


def test_output_passes_through_live() -> None:
    """A line reaches our stdout while the command still runs, not at its end."""
    proc = subprocess.Popen(
        [PY, "-m", "boundedproc", "--timeout", "60", "--", PY, "-c",
         "import time\nprint('first', flush=True)\ntime.sleep(60)"],
        stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready and proc.stdout.readline() == b"first\n"
        assert proc.poll() is None  # the command is still sleeping
    finally:
        proc.kill()  # the run dies with its caller (containment, or PDEATHSIG)
        proc.wait()


def test_live_output_keeps_the_cap() -> None:
    """What is shown live is the kept head: the cap holds for it, across both streams."""
    p = cli("--max-output", "10", "--", "sh", "-c",
            "printf 0123456; sleep 0.2; printf abcdef >&2; sleep 0.2; echo xyz")
    assert p.stdout == b"0123456" and p.stderr.startswith(b"abc")
    assert b"output truncated at 10 bytes" in p.stderr


def test_a_cap_that_kills_says_so() -> None:
    """Under --on-overflow kill the message says the command was killed, beside its 137;
    it said only that the output was truncated, as under truncate."""
    p = cli("--max-output", "1K", "--on-overflow", "kill", "--", "sh", "-c", "yes")
    assert p.returncode == 137
    assert b"output truncated at 1024 bytes (" in p.stderr
    assert b"; killed (--on-overflow kill)" in p.stderr, p.stderr
    q = cli("--max-output", "1K", "--", "sh", "-c", "yes | head -c 5000")
    assert q.returncode == 0 and b"killed" not in q.stderr, q.stderr


def test_closed_stdout_reader_ends_the_run() -> None:
    """`python -m boundedproc -- yes | head -1` ends at once, without a traceback."""
    p = subprocess.run(["sh", "-c", f"'{PY}' -m boundedproc --timeout 60 -- yes | head -1"],
                       capture_output=True, timeout=30, check=False)
    assert p.stdout == b"y\n" and b"Traceback" not in p.stderr


def test_infinite_kill_grace_is_a_usage_error() -> None:
    """--kill-grace inf (no finite grace) is a usage error, 125, not a traceback."""
    p = cli("--kill-grace", "inf", "--", "true")
    assert p.returncode == 125 and b"Traceback" not in p.stderr
    assert b"--kill-grace" in p.stderr


def test_closed_stderr_keeps_the_status() -> None:
    """With our stderr closed, the deadline's note is lost, not the status: still 124."""
    p = subprocess.run([*exec_after("os.close(2)"), PY, "-m", "boundedproc", "--timeout", "0.2",
                        "--", "sleep", "30"],
                       stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60, check=False)
    assert p.returncode == 124


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("args", [["--", "echo", "hi"], ["--json", "--", "echo", "hi"],
                                  ["--", "yes"]])
def test_output_that_cannot_be_written_is_125(args: list[str]) -> None:
    """Output our stdout cannot take (ENOSPC): a write error and 125, no traceback, no survivor."""
    with open("/dev/full", "wb") as full:
        p = subprocess.run([PY, "-m", "boundedproc", "--timeout", "60", *args], stdout=full,
                           stderr=subprocess.PIPE, timeout=60, check=False)
    assert p.returncode == 125 and b"Traceback" not in p.stderr, p.stderr
    assert b"boundedproc: write error: No space left on device" in p.stderr


def test_json_is_utf8_for_an_argument_that_is_not() -> None:
    """--json prints valid UTF-8 also when an argument is not UTF-8 (U+FFFD, as for output)."""
    p = subprocess.run([PY, "-m", "boundedproc", "--json", "--", "echo", b"a\xffb"],
                       capture_output=True, timeout=60, check=False)
    data = json.loads(p.stdout.decode("utf-8"))
    assert p.returncode == 0 and data["args"] == ["echo", "a\ufffdb"]
    assert data["stdout"] == "a\ufffdb\n"


def test_ctrl_c_ends_it_by_sigint_as_timeout_does(tmp_path: Path) -> None:
    """SIGINT (a Ctrl-C) kills the run and then ends the CLI by SIGINT, as coreutils timeout
    and boundedproc-timeout do, so that a calling shell's loop stops too (an exit 130 reads to
    bash as "the command handled it", and the loop went on)."""
    f = tmp_path / "pids"
    proc = subprocess.Popen(
        python_module_argv("boundedproc", "--timeout", "100", "--", "sh", "-c",
                           f"echo $$ > {f}.tmp; sleep 977.75 & echo $! >> {f}.tmp; "
                           f"mv {f}.tmp {f}; wait"),
        env=importable_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(f.exists, 30)
        pids = pids_in(f.read_text())
        time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGINT
    assert wait_dead(pids) == []
