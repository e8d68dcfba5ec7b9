"""tmpdir=True (SPEC 9.4): a private directory per run, removed whatever the command did."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SIGINT_PRELUDE, TAKE_FDS, importable_env

from boundedproc import Cancel, run, run_many
from boundedproc import _tmpdir as tmpdir_mod

PY = sys.executable
ROOT = os.geteuid() == 0
NOBODY = next((p for p in pwd.getpwall() if p.pw_name == "nobody"), None)
needs_root = pytest.mark.skipif(not ROOT or NOBODY is None,
                                reason="needs root and a 'nobody' user")
# What a hostile command leaves: read-only files in a chmod 000 tree, a directory it can
# write but not list, one it can list but not enter, and symlinks pointing out of the tree.
HOSTILE = (
    "mkdir -p a/b/c d e && echo x > a/b/c/f && chmod 444 a/b/c/f && chmod 000 a/b/c a/b a "
    "&& echo y > d/g && chmod 300 d && chmod 600 e && ln -s / root-link "
    "&& ln -s {outside} file-link"
)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A file outside every run directory, that removal must leave as it is."""
    f = tmp_path / "outside.txt"
    f.write_text("keep me")
    f.chmod(0o640)
    yield f


def make_hostile_tree(top: Path, outside: Path) -> None:
    """Build HOSTILE's tree under `top` from this process."""
    subprocess.run(["sh", "-c", HOSTILE.format(outside=outside)], cwd=top, check=True)


def assert_untouched(outside: Path) -> None:
    """The file outside the tree still has its content and mode."""
    assert outside.read_text() == "keep me"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o640


def run_dirs(prefix: str = tmpdir_mod.PREFIX) -> set[str]:
    """The run directories that exist now under the temp dir."""
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(prefix)}


# ---- create() and remove() ----------------------------------------------------------

def test_create_makes_a_private_directory_under_the_temp_dir() -> None:
    """create() makes a fresh 0700 directory, owned by the caller, in tempfile.gettempdir()."""
    path = tmpdir_mod.create(None, None)
    try:
        st = os.lstat(path)
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid())
        assert os.path.dirname(path) == os.path.abspath(tempfile.gettempdir())
        assert os.path.basename(path).startswith(tmpdir_mod.PREFIX)
    finally:
        os.rmdir(path)


def test_two_creates_give_two_directories() -> None:
    """Each create() is a new directory."""
    a, b = tmpdir_mod.create(None, None), tmpdir_mod.create(None, None)
    try:
        assert a != b
    finally:
        os.rmdir(a)
        os.rmdir(b)


@needs_root
def test_create_gives_the_directory_to_the_user() -> None:
    """create(uid, gid) chowns the directory to the run's user."""
    assert NOBODY is not None
    path = tmpdir_mod.create(NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
        assert stat.S_IMODE(st.st_mode) == 0o700
    finally:
        os.rmdir(path)


def test_remove_deletes_a_hostile_tree_and_nothing_outside(outside: Path) -> None:
    """remove() deletes read-only files and chmod 000/300/600 dirs; symlinks are not followed."""
    path = tmpdir_mod.create(None, None)
    make_hostile_tree(Path(path), outside)
    assert tmpdir_mod.remove(path) is None
    assert not os.path.lexists(path)
    assert_untouched(outside)
    assert os.path.isdir("/etc")


def test_remove_of_a_missing_directory_is_no_error() -> None:
    """remove() of a directory that is already gone reports nothing."""
    path = tmpdir_mod.create(None, None)
    os.rmdir(path)
    assert tmpdir_mod.remove(path) is None


def test_remove_handles_a_tree_deeper_than_the_recursion_limit() -> None:
    """remove() walks with a stack, so a tree thousands of levels deep goes too."""
    path = tmpdir_mod.create(None, None)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(sys.getrecursionlimit() + 500):
        os.mkdir("d", dir_fd=fd)
        sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = sub
    os.close(fd)
    assert tmpdir_mod.remove(path) is None
    assert not os.path.lexists(path)


def test_remove_takes_a_symlink_left_in_the_directorys_place(outside: Path) -> None:
    """A command that moved its directory away and left a symlink: the link goes, not its target."""
    path = tmpdir_mod.create(None, None)
    os.rmdir(path)
    os.symlink(outside.parent, path)
    error = tmpdir_mod.remove(path)
    assert error is not None and error.startswith("tmpdir not removed: ENOTDIR")
    assert not os.path.lexists(path)
    assert_untouched(outside)


def _as_nobody(code: str) -> dict[str, object]:
    """Run `code` in a Python child that imports boundedproc as root, then becomes nobody."""
    assert NOBODY is not None
    prog = (
        "import json, os, sys, subprocess, tempfile\n"
        "import boundedproc\nfrom boundedproc import _tmpdir\n"
        f"os.setgroups([]); os.setgid({NOBODY.pw_gid}); os.setuid({NOBODY.pw_uid})\n"
        f"{code}\n"
        "sys.stdout.write(json.dumps(out))\n"
    )
    env = importable_env() | {"TMPDIR": "/tmp"}
    done = subprocess.run([PY, "-c", prog], env=env, cwd="/", capture_output=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@needs_root
def test_remove_as_a_caller_without_privilege_fixes_modes_first() -> None:
    """Without root's override, remove() gives chmod 000/300/600 dirs u+rwx back, then deletes."""
    out = _as_nobody(
        "path = _tmpdir.create(None, None)\n"
        f"subprocess.run(['sh', '-c', {HOSTILE.format(outside='/etc/hostname')!r}], cwd=path,\n"
        "               check=True)\n"
        "error = _tmpdir.remove(path)\n"
        "out = dict(error=error, exists=os.path.lexists(path))"
    )
    assert out == {"error": None, "exists": False}


ROOT_WITHOUT_CAPS = """
import json, os, subprocess, sys
from boundedproc import run
caps = [l for l in open("/proc/self/status") if l.startswith("CapEff:")][0].split()[1]
r = run(["sh", "-c", sys.argv[1]], tmpdir=True, timeout=30)
print(json.dumps({"uid": os.geteuid(), "caps": int(caps, 16), "ok": r.ok,
                  "cleanup_error": r.cleanup_error, "out": r.stdout.decode().strip()}))
"""


@pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None,
                    reason="needs root and setpriv (util-linux)")
def test_a_root_caller_without_capabilities_removes_what_its_command_made_read_only(
        ) -> None:
    """uid 0 without CAP_DAC_OVERRIDE (`docker --cap-drop=ALL`, a bounded service) has
    the permission checks of anyone: remove() took uid 0 for a caller that ignores modes
    and left a `chmod 500` directory and the run directory behind (`cleanup_error`
    EACCES). Modes are fixed by what fails, not by the uid."""
    done = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", PY, "-c", ROOT_WITHOUT_CAPS,
         "pwd; mkdir a && touch a/f && chmod 500 a && chmod 500 ."],
        env=importable_env(), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["uid"], got["caps"]) == (0, 0), got  # the setup this is about
    assert got["ok"] and got["cleanup_error"] is None, got
    assert not os.path.lexists(got["out"]), got


@needs_root
def test_remove_leaves_a_mount_inside_and_says_so() -> None:
    """A mount point inside the tree is never entered: its content stays, the failure is text."""
    path = tmpdir_mod.create(None, None)
    inside = os.path.join(path, "m")
    os.mkdir(inside)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "bp-test", inside], capture_output=True,
                             check=False)
    if mounted.returncode != 0:
        os.rmdir(inside)
        os.rmdir(path)
        pytest.skip("cannot mount here")
    try:
        Path(inside, "precious").write_text("x")
        error = tmpdir_mod.remove(path)
        assert error is not None and error.startswith("tmpdir not removed: EXDEV")
        assert Path(inside, "precious").read_text() == "x"
    finally:
        subprocess.run(["umount", inside], check=False)
        shutil.rmtree(path, ignore_errors=True)


# ---- run(tmpdir=True) ----------------------------------------------------------------

PRINT_DIR = "pwd; echo \"$TMPDIR\"; stat -c '%a %u' ."


def test_run_in_a_tmpdir_uses_it_as_cwd_and_tmpdir_and_removes_it() -> None:
    """The child's cwd and TMPDIR are one fresh 0700 directory, gone after the run."""
    r = run(["sh", "-c", PRINT_DIR], tmpdir=True, timeout=10)
    assert r.ok, r
    cwd, tmp, mode_owner = r.stdout.decode().splitlines()
    assert cwd == tmp
    assert os.path.basename(cwd).startswith(tmpdir_mod.PREFIX)
    assert mode_owner == f"700 {os.geteuid()}"
    assert not os.path.lexists(cwd)
    assert r.cleanup_error is None


def test_run_tmpdir_replaces_an_inherited_tmpdir() -> None:
    """A TMPDIR of the caller or of env= is replaced by the run's directory."""
    r = run(["sh", "-c", 'echo "$TMPDIR"; pwd'], tmpdir=True, env={"TMPDIR": "/elsewhere"},
            timeout=10)
    tmp, cwd = r.stdout.decode().splitlines()
    assert tmp == cwd
    r = run(["/bin/sh", "-c", 'echo "$TMPDIR"; pwd'], tmpdir=True, env={}, env_mode="replace",
            timeout=10)
    tmp, cwd = r.stdout.decode().splitlines()
    assert tmp == cwd


@needs_root
def test_run_tmpdir_is_owned_by_the_user() -> None:
    """With user=, the directory belongs to that user."""
    assert NOBODY is not None
    r = run(["stat", "-c", "%u %g %a", "."], tmpdir=True, user="nobody", timeout=10)
    assert r.ok, r
    assert r.stdout.split() == [str(NOBODY.pw_uid).encode(), str(NOBODY.pw_gid).encode(),
                                b"700"]


def test_run_tmpdir_with_cwd_is_a_caller_bug() -> None:
    """tmpdir=True and cwd= exclude each other (ValueError before anything runs)."""
    with pytest.raises(ValueError, match="tmpdir"):
        run(["true"], tmpdir=True, cwd="/")


def test_tmpdir_removed_after_a_hostile_command(outside: Path) -> None:
    """A command that chmod 000s its subdirectories and links out still leaves nothing."""
    r = run(["sh", "-c", HOSTILE.format(outside=outside) + " && pwd"], tmpdir=True, timeout=10)
    assert r.ok, r
    path = r.stdout.decode().strip()
    assert not os.path.lexists(path)
    assert r.cleanup_error is None
    assert_untouched(outside)


def test_tmpdir_removed_after_the_deadline() -> None:
    """A run killed at its deadline still has its directory removed."""
    r = run(["sh", "-c", "pwd; mkdir -p x && chmod 000 x; sleep 30"], tmpdir=True, timeout=0.5)
    assert r.timed_out
    assert not os.path.lexists(r.stdout.decode().strip())


def test_tmpdir_removed_after_a_cancel() -> None:
    """A run ended by its Cancel still has its directory removed."""
    cancel = Cancel()
    timer = threading.Timer(0.3, cancel.cancel)
    timer.start()
    try:
        r = run(["sh", "-c", "pwd; touch f; sleep 30"], tmpdir=True, cancel=cancel, timeout=30)
    finally:
        timer.cancel()
    assert r.cancelled
    assert not os.path.lexists(r.stdout.decode().strip())


def test_tmpdir_removed_when_on_output_raises() -> None:
    """An exception out of on_output ends the run and the directory is still removed."""
    seen: list[bytes] = []

    def boom(stream: int, chunk: bytes) -> None:
        seen.append(chunk)
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"):
        run(["sh", "-c", "pwd; sleep 30"], tmpdir=True, on_output=boom, timeout=30)
    assert seen
    assert not os.path.lexists(seen[0].decode().split()[0])


def test_tmpdir_removed_after_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C during a run: KeyboardInterrupt propagates and the directory is gone."""
    where = tmp_path / "where"
    code = SIGINT_PRELUDE + (
        "import sys\nfrom boundedproc import run\n"
        "try:\n"
        f"    run(['sh', '-c', 'pwd > {where}; mkdir -p s && chmod 000 s; sleep 30'],\n"
        "        tmpdir=True, timeout=30)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(42)\n"
    )
    child = subprocess.Popen([PY, "-c", code], env=importable_env())
    try:
        deadline = time.monotonic() + 20
        while not (where.exists() and where.read_text().strip()):
            assert time.monotonic() < deadline and child.poll() is None, "the run never started"
            time.sleep(0.02)
        path = where.read_text().strip()
        assert os.path.isdir(path)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=10) == 42
        assert not os.path.lexists(path)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_concurrent_runs_get_different_directories() -> None:
    """Runs that overlap in time each get a directory of their own."""
    results = list(run_many([["sh", "-c", "pwd; sleep 0.3"]] * 4, jobs=4, tmpdir=True,
                            timeout=10))
    dirs = [r.stdout.decode().strip() for r in results]
    assert all(r.ok for r in results)
    assert len(set(dirs)) == 4
    assert not any(os.path.lexists(d) for d in dirs)


LEFT_OPEN_AT_EXIT = """
import sys, threading
from boundedproc import run_many
def consume():
    it = run_many([["true"]] + [["sh", "-c", "echo $$; exec sleep 60"]] * 3, jobs=4,
                  tmpdir=True, timeout=120)
    next(it)
    return it
if sys.argv[1] == "main":
    it = consume()
else:  # left open by a thread that has ended
    kept = []
    t = threading.Thread(target=lambda: kept.append(consume()))
    t.start()
    t.join()
import time; time.sleep(0.3)  # the sleeps have started
"""


@pytest.mark.parametrize("left_by", ["main", "thread"])
def test_a_run_many_left_open_at_exit_removes_its_directories(tmp_path: Path,
                                                               left_by: str) -> None:
    """`it = run_many(..., tmpdir=True); next(it)` at a script's end: the runs in flight
    were killed but their directories stayed (the daemon workers stop running Python once
    the interpreter finalizes). The call is ended before that, as a cancel would."""
    env = {**importable_env(), "TMPDIR": str(tmp_path)}
    started = time.monotonic()
    done = subprocess.run([PY, "-c", LEFT_OPEN_AT_EXIT, left_by], env=env,
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    assert os.listdir(tmp_path) == []


def test_tmpdir_that_cannot_be_made_is_a_spawn_failure(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """No place to make the directory: a 'spawn failed:' result naming it, nothing raised."""
    missing = str(tmp_path / "missing")
    monkeypatch.setattr(tempfile, "tempdir", missing)
    r = run(["true"], tmpdir=True, timeout=10)
    assert not r.spawned and r.exit_code == 127
    assert r.runner_error == (
        f"spawn failed: ENOENT (No such file or directory): tmpdir under {missing!r}")


def test_a_failed_removal_is_cleanup_error_and_nothing_else(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A removal that fails is Result.cleanup_error: the run stays ok, nothing is raised."""
    kept: list[str] = []

    def failing_remove(path: str) -> str:
        kept.append(path)
        return f"tmpdir not removed: EBUSY (Device or resource busy): {path!r}"

    monkeypatch.setattr(tmpdir_mod, "remove", failing_remove)
    try:
        r = run(["true"], tmpdir=True, timeout=10)
    finally:
        for path in kept:
            os.rmdir(path)
    assert r.ok and r.runner_error is None
    assert r.cleanup_error == f"tmpdir not removed: EBUSY (Device or resource busy): {kept[0]!r}"


@needs_root
def test_a_mount_made_by_the_command_is_reported_not_raised() -> None:
    """A root command that mounts inside its tmpdir: cleanup_error says so, the run is ok."""
    r = run(["sh", "-c", "mkdir m && mount -t tmpfs bp-test m && touch m/x && pwd"],
            tmpdir=True, timeout=10)
    if not r.ok:
        pytest.skip(f"cannot mount here: {r.stderr!r}")
    path = r.stdout.decode().strip()
    try:
        assert r.cleanup_error is not None
        assert r.cleanup_error.startswith("tmpdir not removed: EXDEV")
        assert os.path.exists(os.path.join(path, "m", "x"))
    finally:
        subprocess.run(["umount", os.path.join(path, "m")], check=False)
        shutil.rmtree(path, ignore_errors=True)


def _precious(where: Path) -> Path:
    """A directory on the temp dir's own filesystem, with a file and a subtree."""
    precious = where / "precious"
    (precious / "sub").mkdir(parents=True)
    (precious / "keep").write_text("k")
    (precious / "sub" / "k2").write_text("k2")
    return precious


def _intact(precious: Path) -> bool:
    return (sorted(os.listdir(precious)) == ["keep", "sub"]
            and (precious / "sub" / "k2").read_text() == "k2")


@needs_root
@pytest.mark.parametrize("contain", [True, False], ids=["contained", "uncontained"])
def test_a_bind_mount_over_the_tmpdir_itself_is_left_alone(contain: bool, tmp_path: Path) -> None:
    """A root command that bind-mounts a directory of the same filesystem over its own
    TMPDIR: that directory's content is the mount's, never the run's (same st_dev, and no
    mount point strictly inside the tree), so nothing of it is removed."""
    precious = _precious(tmp_path)
    r = run(["sh", "-c", f'mount --bind {precious} "$TMPDIR" && pwd'], tmpdir=True,
            timeout=10, contain=contain)
    if r.exit_code != 0:
        pytest.skip(f"cannot mount here: {r.stderr!r}")
    path = r.stdout.decode().strip()
    try:
        assert r.cleanup_error == (
            f"tmpdir not removed: EXDEV (a mount covers it, left alone): {path!r}")
        assert _intact(precious)
    finally:
        subprocess.run(["umount", path], check=False)
        os.rmdir(path)


@needs_root
def test_a_bind_mount_inside_a_tmpdir_reached_through_a_symlink_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TMPDIR a symlink (the mount table names real paths) and a bind mount of the same
    filesystem inside the run's directory (the same st_dev): the mount's id tells it."""
    precious = _precious(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "link"))
    r = run(["sh", "-c", f"mkdir m && mount --bind {precious} m && pwd"], tmpdir=True,
            timeout=10)
    if r.exit_code != 0:
        pytest.skip(f"cannot mount here: {r.stderr!r}")
    path = r.stdout.decode().strip()
    try:
        assert r.cleanup_error is not None
        assert r.cleanup_error.startswith("tmpdir not removed: EXDEV (a mount point inside")
        assert _intact(precious)
    finally:
        subprocess.run(["umount", os.path.join(path, "m")], check=False)
        shutil.rmtree(path, ignore_errors=True)


def test_no_run_directory_is_left_by_this_module() -> None:
    """After the runs above, no run directory of theirs is left in the temp dir."""
    before = run_dirs()
    for _ in range(3):
        run(["true"], tmpdir=True, timeout=10)
    assert run_dirs() <= before


# Every fd but `spare` taken, then one run(tmpdir=True) of each spare count: what each
# result said, and what is left in TMPDIR (the test's own) afterwards.
OUT_OF_FDS = TAKE_FDS + """
import json, os, sys
from boundedproc import run
got = []
for spare in range(8):
    held = take_fds(spare)
    r = run(["true"], tmpdir=True, contain=sys.argv[1] == "1")
    for fd in held:
        os.close(fd)
    got.append([spare, r.spawned, r.runner_error, r.cleanup_error])
print(json.dumps({"runs": got, "left": os.listdir(os.environ["TMPDIR"])}))
"""


@pytest.mark.parametrize("contain", [True, False])
def test_a_run_refused_for_want_of_fds_leaves_no_directory(tmp_path: Path, contain: bool) -> None:
    """With 1 to 6 fds free, the fresh directory was made, the spawn failed (EMFILE), and
    the removal, out of fds to walk it, left it behind (`tmpdir not removed: EMFILE`). An
    empty directory needs no fd to be removed: it is now gone."""
    env = importable_env()
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run([PY, "-c", OUT_OF_FDS, str(int(contain))], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert any(not spawned for _, spawned, _, _ in got["runs"]), got  # some ran out of fds
    assert [cleanup for *_, cleanup in got["runs"]] == [None] * 8, got
    assert got["left"] == [], got
