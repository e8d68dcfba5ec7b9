"""user= and group= (SPEC 9.4): resolving names and ids, and what the child runs as."""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import psutil
import pytest
from conftest import as_nobody

from boundedproc import SPAWN_FAILURE_EXIT_CODE, Limits, run
from boundedproc._ids import NO_CHANGE, Ids, Unresolved, resolve

ROOT = os.geteuid() == 0
NOBODY = pwd.getpwnam("nobody") if "nobody" in {p.pw_name for p in pwd.getpwall()} else None
needs_root = pytest.mark.skipif(not ROOT or NOBODY is None,
                                reason="needs root and a 'nobody' user")
CONTAIN = pytest.mark.parametrize("contain", [True, False], ids=["contained", "uncontained"])


def unused_name(prefix: str, taken: set[str]) -> str:
    """A user or group name that this machine does not have."""
    n = 0
    while f"{prefix}{n}" in taken:
        n += 1
    return f"{prefix}{n}"


def unused_uid() -> int:
    """A uid without a passwd entry."""
    taken = {p.pw_uid for p in pwd.getpwall()}
    uid = 43210
    while uid in taken:
        uid += 1
    return uid


# ---- resolve(): pure lookups ---------------------------------------------------------

def test_no_user_no_group_changes_nothing() -> None:
    """Without user= and group= the caller's ids are kept."""
    assert resolve(None, None) == NO_CHANGE == Ids(None, None, None)


def test_user_name_gives_uid_primary_gid_and_its_group_list() -> None:
    """A user name resolves to its uid, its primary gid and getgrouplist's groups."""
    me = pwd.getpwuid(os.getuid())
    ids = resolve(me.pw_name, None)
    assert isinstance(ids, Ids)
    assert (ids.uid, ids.gid) == (me.pw_uid, me.pw_gid)
    assert ids.groups is not None and ids.groups[0] == me.pw_gid
    assert set(ids.groups) == set(os.getgrouplist(me.pw_name, me.pw_gid))


def test_uid_with_an_entry_resolves_as_its_name() -> None:
    """A numeric uid that has a passwd entry resolves like that user's name."""
    me = pwd.getpwuid(os.getuid())
    assert resolve(me.pw_uid, None) == resolve(me.pw_name, None)


def test_group_replaces_the_primary_gid_and_leads_the_groups() -> None:
    """user= with group= keeps the uid and makes the group the primary one."""
    me = pwd.getpwuid(os.getuid())
    other = next((g for g in grp.getgrall() if g.gr_gid != me.pw_gid), None)
    if other is None:
        pytest.skip("needs a second group")
    ids = resolve(me.pw_name, other.gr_name)
    assert isinstance(ids, Ids)
    assert (ids.uid, ids.gid) == (me.pw_uid, other.gr_gid)
    assert ids.groups is not None and ids.groups[0] == other.gr_gid
    assert resolve(me.pw_name, other.gr_gid) == ids


def test_group_alone_keeps_the_uid_and_is_the_only_group() -> None:
    """group= without user= leaves the uid and drops every other group."""
    g = grp.getgrgid(os.getgid())
    assert resolve(None, g.gr_name) == Ids(None, g.gr_gid, (g.gr_gid,))
    assert resolve(None, 54321) == Ids(None, 54321, (54321,))


def test_unknown_user_name_is_a_spawn_failure_text() -> None:
    """An unknown user name is returned as 'spawn failed: ENOENT (no such user)', not raised."""
    name = unused_name("bp-nouser", {p.pw_name for p in pwd.getpwall()})
    found = resolve(name, None)
    assert found == Unresolved(f"spawn failed: ENOENT (no such user): user {name!r}")


def test_unknown_group_name_is_a_spawn_failure_text() -> None:
    """An unknown group name is returned as 'spawn failed: ENOENT (no such group)'."""
    name = unused_name("bp-nogroup", {g.gr_name for g in grp.getgrall()})
    found = resolve("root" if ROOT else None, name)
    assert isinstance(found, Unresolved)
    assert found.runner_error == f"spawn failed: ENOENT (no such group): group {name!r}"


def test_uid_without_an_entry_takes_the_gid_of_its_number() -> None:
    """A uid with no passwd entry has no primary group: alone it takes the gid of the same
    number and no other group (never the caller's); group= replaces that gid."""
    uid = unused_uid()
    assert resolve(uid, None) == Ids(uid, uid, (uid,))
    assert resolve(uid, 54321) == Ids(uid, 54321, (54321,))


def test_digit_strings_are_names_first_then_ids() -> None:
    """user="65534" (from a command line, a config file) names the id when no user has that
    name, as chown reads it; the same for group=; an id past uid_t's range names nothing."""
    uid = unused_uid()
    assert resolve(str(uid), None) == resolve(uid, None) == Ids(uid, uid, (uid,))
    me = pwd.getpwuid(os.getuid())
    assert resolve(str(me.pw_uid), None) == resolve(me.pw_name, None)
    assert resolve(None, "54321") == Ids(None, 54321, (54321,))
    too_big = str(2**32 - 1)
    found = resolve(too_big, None)
    assert isinstance(found, Unresolved) and "no such user" in found.runner_error


def test_run_with_an_unknown_user_returns_a_result() -> None:
    """run(user=<unknown>) spawns nothing and reports it in the Result, exit 127."""
    name = unused_name("bp-nouser", {p.pw_name for p in pwd.getpwall()})
    r = run(["true"], user=name, timeout=10)
    assert not r.spawned and r.pid is None
    assert r.exit_code == SPAWN_FAILURE_EXIT_CODE
    assert r.runner_error == f"spawn failed: ENOENT (no such user): user {name!r}"


def test_run_with_an_unknown_group_returns_a_result() -> None:
    """run(group=<unknown>) spawns nothing and reports it in the Result."""
    name = unused_name("bp-nogroup", {g.gr_name for g in grp.getgrall()})
    r = run(["true"], group=name, timeout=10)
    assert not r.spawned
    assert r.runner_error == f"spawn failed: ENOENT (no such group): group {name!r}"


# ---- what the child runs as (the core sets the ids) -----------------------------------

@needs_root
@CONTAIN
def test_user_runs_the_command_as_that_uid(contain: bool) -> None:
    """user='nobody' makes `id -u` print nobody's uid, and `id -g` its gid."""
    assert NOBODY is not None
    r = run(["sh", "-c", "id -u; id -g"], user="nobody", contain=contain, timeout=10)
    assert r.ok, r
    assert r.stdout.split() == [str(NOBODY.pw_uid).encode(), str(NOBODY.pw_gid).encode()]


@needs_root
@CONTAIN
def test_user_by_uid_runs_as_that_uid(contain: bool) -> None:
    """A numeric user= works like the name."""
    assert NOBODY is not None
    r = run(["id", "-u"], user=NOBODY.pw_uid, contain=contain, timeout=10)
    assert r.ok, r
    assert r.stdout.strip() == str(NOBODY.pw_uid).encode()


@needs_root
@CONTAIN
def test_unnamed_uid_runs_with_the_gid_of_its_number(contain: bool) -> None:
    """A uid the passwd file lacks, as an int or as digits, runs as that uid with the gid
    of the same number and no other group: the caller's (root's) are gone."""
    uid = unused_uid()
    for user in (uid, str(uid)):
        r = run(["sh", "-c", "id -u; id -g; id -G"], user=user, contain=contain, timeout=10)
        assert r.ok, r
        assert r.stdout.split() == [str(uid).encode()] * 3


@needs_root
@CONTAIN
def test_user_drops_the_callers_groups(contain: bool) -> None:
    """The caller's supplementary groups (root's) are gone: the child has the user's only."""
    assert NOBODY is not None
    r = run(["id", "-G"], user="nobody", contain=contain, timeout=10)
    assert r.ok, r
    groups = {int(g) for g in r.stdout.split()}
    expected = set(os.getgrouplist("nobody", NOBODY.pw_gid))
    assert groups == expected
    mine = (set(os.getgroups()) | {os.getgid()}) - expected
    assert mine and not mine & groups


@needs_root
@CONTAIN
def test_group_alone_sets_the_gid_and_the_only_group(contain: bool) -> None:
    """group= alone: the uid stays root's, the gid and the group list are that group."""
    assert NOBODY is not None
    r = run(["sh", "-c", "id -u; id -g; id -G"], group=NOBODY.pw_gid, contain=contain,
            timeout=10)
    assert r.ok, r
    uid, gid, *groups = r.stdout.split()
    assert (int(uid), int(gid)) == (0, NOBODY.pw_gid)
    assert [int(g) for g in groups] == [NOBODY.pw_gid]


@needs_root
@CONTAIN
def test_non_root_caller_cannot_become_another_user(contain: bool) -> None:
    """A caller that is not root asking for user='root' gets a 'spawn failed: EPERM' result."""
    out = as_nobody(
        f"r = boundedproc.run(['id', '-u'], user='root', contain={contain}, timeout=10)\n"
        "out = dict(spawned=r.spawned, exit_code=r.exit_code, error=r.runner_error,\n"
        "           stdout=r.stdout.decode())"
    )
    assert out["spawned"] is False, out
    assert out["exit_code"] == SPAWN_FAILURE_EXIT_CODE
    error = out["error"]
    assert isinstance(error, str) and error.startswith("spawn failed: EPERM"), out
    assert "setuid" in error or "setgroups" in error or "setgid" in error


@needs_root
@CONTAIN
def test_non_root_caller_naming_itself(contain: bool) -> None:
    """A caller that is not root naming its own user (and group) runs the command as itself:
    nothing to change, so no setgroups() that would need a privilege."""
    assert NOBODY is not None
    out = as_nobody(
        f"a = boundedproc.run(['id', '-u'], user='nobody', contain={contain}, timeout=10)\n"
        f"b = boundedproc.run(['id', '-g'], user={NOBODY.pw_uid}, group={NOBODY.pw_gid},\n"
        f"                    contain={contain}, timeout=10)\n"
        "out = dict(a=[a.exit_code, a.stdout.decode(), a.runner_error],\n"
        "           b=[b.exit_code, b.stdout.decode(), b.runner_error])"
    )
    assert out == {"a": [0, f"{NOBODY.pw_uid}\n", None], "b": [0, f"{NOBODY.pw_gid}\n", None]}


@needs_root
def test_user_makes_max_processes_hold_as_root() -> None:
    """A fork bomb under user= and Limits(max_processes=64) peaks near 64 processes, as root."""
    assert NOBODY is not None

    def nobody_processes() -> list[psutil.Process]:
        return [p for p in psutil.process_iter(["uids", "status"])
                if p.info["uids"] is not None and p.info["uids"].real == NOBODY.pw_uid
                and p.info["status"] != psutil.STATUS_ZOMBIE]

    before = len(nobody_processes())
    # bash goes on after a failed fork (dash's sh exits): the bomb presses on the limit
    # until the deadline.
    bomb = "while :; do sleep 5 & done 2>/dev/null"
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, len(nobody_processes()) - before)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = run(["bash", "-c", bomb], user="nobody", limits=Limits(max_processes=64), timeout=2)
    finally:
        stop.set()
        watcher.join()
    assert r.timed_out, r
    assert 32 <= peak <= 64, peak
    deadline = time.monotonic() + 5
    while len(nobody_processes()) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(nobody_processes()) <= before


@pytest.mark.parametrize("kw", [
    {"user": 2**32 - 1}, {"user": 2**32}, {"user": 2**32 + 65534}, {"user": 2**64},
    {"group": 2**32 - 1}, {"group": 2**32}, {"user": "nobody", "group": 2**33},
    {"user": -1}, {"group": -1},
])
def test_an_id_past_the_kernels_32_bits_is_a_caller_bug(kw: dict[str, object]) -> None:
    """uid_t and gid_t are 32 bits: 2**32 would wrap to 0 (root) and 2**32 - 1 means
    "unchanged" to setresuid, so a root caller's user=4294967295 ran its command as root.
    Such an id is a ValueError before anything is made, like a negative one, in run(),
    run_many and a Job; no tmpdir is left behind."""
    from boundedproc import Job, run_many

    before = set(os.listdir("/tmp"))
    with pytest.raises(ValueError, match=r"must be an id from 0 to 4294967294"):
        run(["id", "-u"], tmpdir=True, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must be an id from 0 to 4294967294"):
        run_many([["id"]], **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"must be an id from 0 to 4294967294"):
        list(run_many([Job(["id"], **kw)]))  # type: ignore[arg-type]
    assert {n for n in set(os.listdir("/tmp")) - before if n.startswith("boundedproc-")} == set()


@needs_root
@CONTAIN
def test_the_largest_id_is_set_as_asked(contain: bool) -> None:
    """4294967294, the largest id there is, is set, not taken for "unchanged"."""
    r = run(["sh", "-c", "id -u; id -g"], user=2**32 - 2, group=2**32 - 2, contain=contain)
    assert (r.exit_code, r.stdout) == (0, b"4294967294\n4294967294\n")


HOLD_ROOT_C = r"""
#define _GNU_SOURCE
#include <unistd.h>
int main(void)
{
    if (setresuid(0, 0, 0) != 0)
        return 3;
    sleep(30);
    return 0;
}
"""


@needs_root
@CONTAIN
def test_a_leader_that_took_root_for_good_is_let_go_within_the_bound(contain: bool) -> None:
    """A caller that is not root runs a setuid program that takes root for good (as sudo
    does): the group's SIGKILL is refused (EPERM), and the reap waited for as long as it
    chose to run (30 s here; uncontained the whole time, contained until the supervisor
    was given up as "stopped?"). It is now let go within the run's bound, and the result
    says why: runner failed: EPERM, escaped (it is left running)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    where = tempfile.mkdtemp(prefix="bp-setuid-", dir="/tmp")
    prog = os.path.join(where, "holdroot")
    pid = None
    try:
        os.chmod(where, 0o755)  # our own directory, for nobody to exec from
        subprocess.run([cc, "-x", "c", "-o", prog, "-"], input=HOLD_ROOT_C.encode(),
                       check=True, capture_output=True)
        os.chmod(prog, 0o4755)
        out = as_nobody(
            "import time\n"
            "t = time.monotonic()\n"
            f"r = boundedproc.run([{prog!r}], timeout=0.5, drain_grace=0.5, contain={contain})\n"
            "out = dict(took=time.monotonic() - t, exit_code=r.exit_code, pid=r.pid,\n"
            "           timed_out=r.timed_out, error=r.runner_error, escaped=r.escaped)"
        )
        pid = out["pid"]
        if out["exit_code"] == 3:
            pytest.skip("setuid programs do not take root here (a nosuid /tmp)")
        assert out["timed_out"] and out["exit_code"] == 124, out
        assert isinstance(out["took"], float) and out["took"] < 3, out  # bound 1 s; was 30
        error = out["error"]
        assert isinstance(error, str) and error.startswith("runner failed: EPERM"), out
        assert "left running" in error and out["escaped"], out
    finally:
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(psutil.Error):
                held = psutil.Process(pid)
                if held.exe() == prog:  # the run's own leader, left running: ours to end
                    held.send_signal(signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)


PDEATHSIG_OF_SELF = (
    "import ctypes; v = ctypes.c_int(-1); "
    "ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"  # PR_GET_PDEATHSIG
)


@needs_root
@CONTAIN
def test_a_leader_run_as_another_user_keeps_its_parent_death_signal(contain: bool) -> None:
    """The kernel clears a process's parent-death signal when its ids change: a leader
    started with user= ran without one (0), so a supervisor (or an uncontained caller's
    thread) that died before the leader's exec left it running, unowned. It is set again
    after the ids are changed."""
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that nobody can run")
    r = run([python, "-c", PDEATHSIG_OF_SELF], user="nobody", contain=contain, timeout=30)
    assert r.ok, r
    assert r.stdout.strip() == str(int(signal.SIGKILL)).encode(), r.stdout
