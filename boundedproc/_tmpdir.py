"""``tmpdir=True``: a private directory made for one run and removed after it.

``create`` makes it under ``tempfile.gettempdir()`` (so ``TMPDIR`` of the
caller decides where), mode 0700, owned by the run's user when ``user=`` is
given.  ``remove`` deletes it with everything in it, whatever the command did
to it, as the caller:

- Files the command made read-only are unlinked (that needs only the
  directory's permission); directories it made unreadable, unsearchable or
  unwritable (``chmod 000``, ``chmod 300``) are given back ``u+rwx`` first.
- It walks the tree through directory fds, opening every entry with
  ``O_NOFOLLOW`` and deciding by ``lstat``: a symlink is unlinked, never
  followed, so nothing outside the tree is touched, even by a process that
  swaps a directory for a symlink while the walk runs.  Where a directory's
  permissions must be fixed, its mode is changed through an ``O_PATH`` handle
  on Linux (never by name); elsewhere by name, then verified to be the same
  directory before it is entered.
- It never crosses into another filesystem or a mount point inside the tree
  (a root command can mount there), nor empties the tree when a mount covers
  the directory itself; what it cannot remove stays, and is reported.  A
  mount is known by its id (``/proc/self/fdinfo``, of each directory it
  opens), as well as by ``st_dev`` and by the mount table's paths: a bind
  mount of a directory of the same filesystem has the same ``st_dev``, and a
  path can go through a symlink (a ``TMPDIR`` that is one).
- It does not raise for anything the command did: a failure is returned as
  text, ``tmpdir not removed: <errno name> (<why>): <path>`` (the first
  failure; the walk goes on and removes what it can).  ``run()`` puts that in
  ``Result.cleanup_error``.

The tree's depth is bounded by the caller's free fds (one is held per level):
a tree deeper than that is reported (``EMFILE``) and left in place.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile

__all__ = ["PREFIX", "create", "remove"]

#: The name of every run directory starts with this.
PREFIX = "boundedproc-"

_OCTAL = re.compile(rb"\\([0-7]{3})")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_PATH: int | None = getattr(os, "O_PATH", None)


def create(uid: int | None, gid: int | None) -> str:
    """Make a fresh private directory for one run.

    Args:
        uid: The owner to give it (the run's ``user``); ``None`` keeps the caller.
        gid: The group to give it; ``None`` keeps the caller's.

    Returns:
        Its absolute path, under ``tempfile.gettempdir()``, mode 0700.

    Raises:
        OSError: it could not be made or given to ``uid``/``gid`` (then nothing
            is left behind).  ``run()`` turns this into a ``spawn failed:``
            result.
    """
    try:
        path = tempfile.mkdtemp(prefix=PREFIX)
    except FileNotFoundError:
        _raise_if_out_of_fds()
        raise
    if uid is not None or gid is not None:
        try:
            os.chown(path, -1 if uid is None else uid, -1 if gid is None else gid)
        except OSError:
            os.rmdir(path)
            raise
    return os.path.abspath(path)


def _raise_if_out_of_fds() -> None:
    """Raise EMFILE (or ENFILE) if that is why ``tempfile`` found no usable directory.

    ``gettempdir()`` probes each candidate by making a file in it and treats any
    failure as "not usable", so with no fd left it reports ENOENT ("No usable
    temporary directory found"), which would send a caller looking for a missing
    directory.  Asking for one fd tells the two apart.
    """
    try:
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as err:
        if err.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return
    os.close(fd)


def _why(err: OSError, path: str) -> str:
    code = err.errno or errno.EIO
    name = errno.errorcode.get(code, f"errno {code}")
    return f"tmpdir not removed: {name} ({err.strerror or os.strerror(code)}): {path!r}"


def _mounts_under(top: str) -> set[str]:
    """Mount points strictly inside ``top`` (Linux; empty where unknown)."""
    found: set[str] = set()
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                fields = line.split(b" ")
                if len(fields) > 4:
                    # Field 5 is the mount point, with space, tab, newline and
                    # backslash written as octal escapes.
                    point = _OCTAL.sub(lambda m: bytes([int(m.group(1), 8)]), fields[4])
                    found.add(os.fsdecode(point))
    except OSError:
        return set()
    prefix = top.rstrip("/") + "/"
    return {p for p in found if p.startswith(prefix)}


def _mount_id(fd: int) -> int | None:
    """The id of the mount the open directory ``fd`` is on; ``None`` where unknown
    (not Linux, no ``/proc``)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            for line in f:
                if line.startswith(b"mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _set_rwx(parent: int, name: str, st: os.stat_result) -> None:
    """Give the directory ``name`` (of ``parent``, as ``lstat`` saw it) back u+rwx.

    Never follows a symlink: on Linux the mode is changed through an ``O_PATH``
    handle of exactly that directory.
    """
    mode = stat.S_IMODE(st.st_mode) | stat.S_IRWXU
    if _O_PATH is not None and sys.platform.startswith("linux"):
        handle = os.open(name, _O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC,
                         dir_fd=parent)
        try:
            os.chmod(f"/proc/self/fd/{handle}", mode)
            return
        except FileNotFoundError:  # no /proc: fall back to the name
            pass
        finally:
            os.close(handle)
    os.chmod(name, mode, dir_fd=parent)


def _open_dir(parent: int, name: str, st: os.stat_result) -> int:
    """An fd of the directory ``name`` that ``lstat`` saw, fixing its mode if need be."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        _set_rwx(parent, name, st)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise OSError(errno.ESTALE, "replaced while it was being removed")
        if stat.S_IMODE(now.st_mode) & stat.S_IRWXU != stat.S_IRWXU:
            # Listing needs r, lstat-ing entries x, unlinking them w.  Also as uid 0: one
            # without CAP_DAC_OVERRIDE (docker --cap-drop=ALL) is checked as anyone is.
            os.fchmod(fd, stat.S_IMODE(now.st_mode) | stat.S_IRWXU)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Walk:
    """One removal: the first error, and what not to descend into."""

    def __init__(self, top: str, dev: int, mount: int | None) -> None:
        self.top = top
        self.dev = dev
        self.mount = mount  # the tree's mount id, None: unknown
        # The tree's resolved path, once: the walk never follows a symlink, so a path
        # below it resolves to this plus the same names (realpath of each directory of a
        # deep tree would cost as many system calls as it has levels).
        self.real_top = os.path.realpath(top)
        self.mounts = _mounts_under(self.real_top)
        self.error: str | None = None

    def note(self, err: OSError, path: str) -> None:
        if self.error is None:
            self.error = _why(err, path)

    def empty(self, fd: int, path: str) -> None:
        """Remove everything inside the directory ``fd`` (at ``path``), as far as it can."""
        try:
            names = os.listdir(fd)
        except OSError as err:
            self.note(err, path)
            return
        # An explicit stack, not recursion: a hostile tree may be thousands deep.
        # Each level holds its fd until its entries are gone; ``fd`` is the caller's.
        stack: list[tuple[int, str, list[str]]] = [(fd, path, names)]
        try:
            while stack:
                dir_fd, dir_path, pending = stack[-1]
                if pending:
                    self._entry(stack, dir_fd, dir_path, pending.pop())
                    continue
                stack.pop()
                if stack:  # as empty as it gets: remove it from its parent
                    os.close(dir_fd)
                    try:
                        os.rmdir(os.path.basename(dir_path), dir_fd=stack[-1][0])
                    except OSError as err:
                        self.note(err, dir_path)
        finally:
            for dir_fd, _, _ in stack[1:]:
                os.close(dir_fd)

    def _entry(self, stack: list[tuple[int, str, list[str]]], dir_fd: int, dir_path: str,
               name: str) -> None:
        """Unlink one entry of ``dir_fd``, or push it on ``stack`` when it is a directory."""
        child = os.path.join(dir_path, name)
        try:
            st = os.lstat(name, dir_fd=dir_fd)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=dir_fd)
                return
        except FileNotFoundError:
            return
        except OSError as err:
            self.note(err, child)
            return
        if st.st_dev != self.dev or self.real_top + child[len(self.top):] in self.mounts:
            self.note(OSError(errno.EXDEV, "a mount point inside the tree, left alone"), child)
            return
        try:
            sub = _open_dir(dir_fd, name, st)
        except OSError as err:
            self.note(err, child)
            return
        if self.mount is not None and _mount_id(sub) != self.mount:
            os.close(sub)
            self.note(OSError(errno.EXDEV, "a mount point inside the tree, left alone"), child)
            return
        try:
            names = os.listdir(sub)
        except OSError as err:
            os.close(sub)
            self.note(err, child)
            return
        stack.append((sub, child, names))


def _rmdir_empty(err: OSError, name: str, path: str, parent_fd: int | None = None) -> bool:
    """Out of fds (``err``) to walk the directory: remove it if it is empty, which takes
    no fd (a run refused its spawn by EMFILE left nothing in it).  True when it is gone."""
    if err.errno not in (errno.EMFILE, errno.ENFILE):
        return False
    try:
        if parent_fd is None:
            os.rmdir(path)  # never follows a link put in its place: ENOTDIR
        else:
            os.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # not empty: the walk needs fds, and the EMFILE is the answer
    return True


def remove(path: str) -> str | None:
    """Remove a run's directory and everything in it, as the caller.

    Args:
        path: What ``create`` returned.

    Returns:
        ``None`` when it is gone (or was already), otherwise the first
        failure as ``tmpdir not removed: ENAME (why): 'path'``; whatever could
        be removed was.  Never raises for what the command did to the tree.
    """
    parent, name = os.path.split(os.path.abspath(path))
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        return _why(err, path) if not _rmdir_empty(err, name, path) else None
    try:
        try:
            st = os.lstat(name, dir_fd=parent_fd)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            # The command moved the directory away and left something in its
            # place: remove that (never following it) and say the rest is lost.
            try:
                os.unlink(name, dir_fd=parent_fd)
            except OSError:
                pass
            return _why(OSError(errno.ENOTDIR, "moved away by the command"), path)
        try:
            fd = _open_dir(parent_fd, name, st)
        except OSError as err:
            return _why(err, path) if not _rmdir_empty(err, name, path, parent_fd) else None
        try:
            mount = _mount_id(fd)
            if mount is not None and mount != _mount_id(parent_fd):
                # A mount covers the directory itself (a root command mounted over its
                # TMPDIR): what is in it is the mounted tree's, never the run's.
                return _why(OSError(errno.EXDEV, "a mount covers it, left alone"), path)
            walk = _Walk(path, st.st_dev, mount)
            walk.empty(fd, path)
        finally:
            os.close(fd)
        try:
            os.rmdir(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass
        except OSError as err:
            walk.note(err, path)
            return walk.error
        # Gone, all of it: what the walk could not do (list an empty directory out of
        # fds, read the mounts) left nothing behind.
        return None
    finally:
        os.close(parent_fd)
