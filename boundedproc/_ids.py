"""``user=`` and ``group=``: from a name or an id to the ids the child runs with.

Resolution happens in the caller, before the spawn (the child between vfork
and exec can call no NSS code), and only looks things up: the C core does the
``setgroups``, ``setgid`` and ``setuid`` before exec, and a refusal there is a
``spawn failed: EPERM ...`` result.  Here:

- ``user`` (a name or a uid) gives the uid, the user's primary gid and, as
  supplementary groups, ``os.getgrouplist(name, gid)``: exactly the groups a
  login as that user would get, so the caller's own groups (root's, say) are
  dropped.
- ``group`` (a name or a gid) replaces the primary gid; with ``user`` the
  supplementary groups are then the user's groups for that gid.  With
  ``group`` alone the uid is left as it is and the supplementary groups are
  ``[gid]``, so the caller's other groups are dropped there too.
- A numeric id need not exist in the user or group database (a sandbox often
  runs as an unnamed uid).  A uid that has no ``passwd`` entry has no primary
  group and no group list: without ``group=`` it runs with the gid of the same
  number and no other group (the "user private group" convention), never
  with the caller's groups (root's, say).
- A string of digits is a name first and, when no user (group) has that
  name, the id it spells, as ``chown`` and ``runuser`` read it: ``"65534"``
  from a command line is ``65534``.
- A name that does not exist is not an exception but a result: ``resolve``
  returns ``Unresolved`` whose
  ``runner_error`` reads, for example,
  ``spawn failed: ENOENT (no such user): user 'bob'``.  ``spawn failed:``
  because it is a fact of the machine the command was to run on, like a
  missing program, not of the command's content; the grader then says
  ``unrunnable``/``runner-failure``, never ``contradicted``.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
from dataclasses import dataclass

from boundedproc._native import spawn_failed

__all__ = ["ID_NONE", "Ids", "Unresolved", "resolve"]

#: (uid_t)-1 and (gid_t)-1: no id, "unchanged" to the kernel; the largest id a
#: run may name is one less.
ID_NONE = 2**32 - 1


@dataclass(frozen=True, slots=True)
class Ids:
    """The ids a child takes before exec; ``None`` leaves that one as the caller's.

    Attributes:
        uid: The user id to ``setuid`` to; ``None`` keeps the caller's.
        gid: The group id to ``setgid`` to; ``None`` keeps the caller's.
        groups: The supplementary groups to ``setgroups`` to, in
            ``getgrouplist`` order (the primary gid first); ``None`` keeps the
            caller's.
    """

    uid: int | None
    gid: int | None
    groups: tuple[int, ...] | None


NO_CHANGE = Ids(None, None, None)


@dataclass(frozen=True, slots=True)
class Unresolved:
    """Why ``user=``/``group=`` names nothing this machine has.

    Attributes:
        runner_error: The whole ``runner_error`` text of the result, starting
            with ``spawn failed: `` and the errno name (``ENOENT``).
        errno: The errno value the text names.
    """

    runner_error: str
    errno: int = errno.ENOENT


def _unknown(what: str, ident: int | str, why: str, more: str = "") -> Unresolved:
    return Unresolved(spawn_failed(errno.ENOENT, why, f"{what} {ident!r}{more}"))


def _group_id(group: int | str) -> int | Unresolved:
    if isinstance(group, int):
        return group  # a gid need not be named to be set
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        if _digits(group):
            return int(group)
        return _unknown("group", group, "no such group")


def _digits(name: str) -> bool:
    """Whether a name that the database lacks spells an id (ASCII digits, below ID_NONE)."""
    return name.isascii() and name.isdigit() and int(name) < ID_NONE


def _group_list(name: str, gid: int) -> tuple[int, ...] | Unresolved:
    try:
        groups = os.getgrouplist(name, gid)
    except OSError as err:  # the group database failed us: say which errno
        code = err.errno or errno.EIO
        return Unresolved(spawn_failed(code, os.strerror(code), f"getgrouplist for user {name!r}"),
                          code)
    # getgrouplist puts gid first; keep each group once, in its order.
    return tuple(dict.fromkeys([gid, *groups]))


def resolve(user: int | str | None, group: int | str | None) -> Ids | Unresolved:
    """The ids a run with ``user=`` and ``group=`` takes, or why it cannot.

    Args:
        user: A user name or a uid (validated by ``_options.validate``), or
            ``None`` for the caller's.
        group: A group name or a gid, or ``None``: the user's primary group
            (with ``user``) or the caller's (without).

    Returns:
        The ``Ids`` to set (see the module docstring for the rules), or
        ``Unresolved`` for a name the user or group database does not have.
    """
    if user is None and group is None:
        return NO_CHANGE
    gid: int | None = None
    if group is not None:
        found = _group_id(group)
        if isinstance(found, Unresolved):
            return found
        gid = found
    if user is None:
        assert gid is not None
        return Ids(None, gid, (gid,))
    if isinstance(user, str):
        try:
            entry = pwd.getpwnam(user)
        except KeyError:
            if not _digits(user):
                return _unknown("user", user, "no such user")
            user = int(user)
    if isinstance(user, int):
        try:
            entry = pwd.getpwuid(user)
        except KeyError:
            gid = user if gid is None else gid
            return Ids(user, gid, (gid,))
    if gid is None:
        gid = entry.pw_gid
    groups = _group_list(entry.pw_name, gid)
    if isinstance(groups, Unresolved):
        return groups
    return Ids(entry.pw_uid, gid, groups)
