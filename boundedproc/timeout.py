"""``boundedproc-timeout``: coreutils ``timeout(1)``'s command line on boundedproc.

``boundedproc-timeout [OPTION]... DURATION COMMAND [ARG]...`` (also ``python -m
boundedproc.timeout``) takes ``timeout``'s options, duration syntax, messages and
exit statuses (SPEC 9.5), and passes stdin, stdout and stderr through live.
Beyond coreutils, whatever COMMAND started is killed when it ends (its process
group and, contained, the processes that left it with ``setsid``), and
``--json`` prints boundedproc's ``Result``.

How it maps onto the runner: the command runs with no deadline in the core and
``kill_grace=0``, so the core kills what is left of the run the moment the
leader exits; the deadline, ``-k``, and the signals received are handled here,
in the main thread, as coreutils handles them: a real ``SIGALRM`` from
``setitimer`` at each due time, the signal (and ``SIGCONT``) sent through
``RunControl.send_signal``, the ``-v`` line written before it.  The core's own
``first_signal``/``kill_grace`` cannot say "send nothing" (``-s 0``), send
``SIGCONT`` after the signal, print before it, or start ``-k``'s clock at a
forwarded signal; see the README section "As a timeout(1) replacement".
COMMAND starts with the signal mask and the ignored signals this process
inherited, as coreutils' does, but for the signals coreutils catches (at their
default) and SIGPIPE/SIGXFSZ, which Python ignores before any code of ours can
see what was inherited (at their default, as from ``subprocess``).
"""

from __future__ import annotations

import dataclasses
import errno
import heapq
import locale
import math
import os
import signal
import stat
import string
import sys
import time
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from boundedproc import _native
from boundedproc._options import INHERIT, validate
from boundedproc._result import AnyResult
from boundedproc._run import Prepared, execute, prepare
from boundedproc._version import __version__

__all__ = ["main", "parse_duration", "parse_signal", "signal_name"]

EXIT_TIMEDOUT = 124
EXIT_CANCELED = 125  # this program failed (a usage error, a bad duration, ...)
EXIT_CANNOT_INVOKE = 126
EXIT_ENOENT = 127

# --- signal names, as coreutils spells them (gnulib's sig2str table order) ----------

_SIGNAL_NAMES = (
    "HUP", "INT", "QUIT", "ILL", "TRAP", "ABRT", "FPE", "KILL", "SEGV", "BUS", "PIPE",
    "ALRM", "TERM", "USR1", "USR2", "CHLD", "URG", "STOP", "TSTP", "CONT", "TTIN", "TTOU",
    "SYS", "POLL", "VTALRM", "PROF", "XCPU", "XFSZ", "IOT", "EMT", "CLD", "PWR", "WINCH",
    "INFO", "IO", "STKFLT",
)
_LINUX_ONLY_NUMBERS = {"STKFLT": 16}  # Python < 3.11 has no signal.SIGSTKFLT


def _signal_table() -> list[tuple[str, int]]:
    table = []
    for name in _SIGNAL_NAMES:
        num = getattr(signal, "SIG" + name, None)
        if num is None and sys.platform.startswith("linux"):
            num = _LINUX_ONLY_NUMBERS.get(name)
        if num is not None:
            table.append((name, int(num)))
    table.append(("EXIT", 0))  # the shells' name for 0
    return table


_TABLE = _signal_table()
_RTMIN = int(getattr(signal, "SIGRTMIN", 0))
_RTMAX = int(getattr(signal, "SIGRTMAX", -1))
_SIGNUM_BOUND = signal.NSIG - 1
_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)
_WHITESPACE = " \t\n\v\f\r"
_DIGITS = "0123456789"
_HEXDIGITS = "0123456789abcdefABCDEF"


def signal_name(num: int) -> str | None:
    """The name coreutils prints for a signal number (``TERM``, ``RTMIN+2``, ``EXIT``)."""
    for name, n in _TABLE:
        if n == num:
            return name
    if not _RTMIN <= num <= _RTMAX:
        return None
    if num <= _RTMIN + (_RTMAX - _RTMIN) // 2:
        delta = num - _RTMIN
        return f"RTMIN+{delta}" if delta else "RTMIN"
    delta = _RTMAX - num
    return f"RTMAX-{delta}" if delta else "RTMAX"


def _strtol_whole(text: str) -> int | None:
    """``strtol(text, &end, 10)`` when it reads all of ``text`` (``""`` reads as 0)."""
    body = text.lstrip(_WHITESPACE)
    digits = body[1:] if body[:1] in ("+", "-") else body
    if text == "":
        return 0
    if not digits or any(c not in _DIGITS for c in digits):
        return None
    return int(body)


def _name_to_number(name: str) -> int | None:
    if name[:1] != "" and name[0] in _DIGITS:
        n = _strtol_whole(name)
        return n if n is not None and n <= _SIGNUM_BOUND else None
    for known, num in _TABLE:
        if known == name:
            return num
    if _RTMIN > 0 and name.startswith("RTMIN"):
        n = _strtol_whole(name[5:])
        if n is not None and 0 <= n <= _RTMAX - _RTMIN:
            return _RTMIN + n
    elif _RTMAX > 0 and name.startswith("RTMAX"):
        n = _strtol_whole(name[5:])
        if n is not None and _RTMIN - _RTMAX <= n <= 0:
            return _RTMAX + n
    return None


def parse_signal(operand: str) -> int:
    """A signal as ``-s`` takes it: ``TERM``, ``SIGTERM``, ``term``, ``15`` or ``0``.

    A number may also be a shell's status for that signal (``137`` is 9, as
    ``$?`` reports a death by KILL; ksh's ``265`` too).

    Raises:
        ValueError: not a signal this system has.
    """
    num: int | None
    if operand[:1] != "" and operand[0] in _DIGITS:
        if any(c not in _DIGITS for c in operand) or int(operand) > 2**31 - 1:
            num = None
        else:
            num = int(operand)
            num &= 0xFF if num >= 0xFF else 0x7F
    else:
        upper = operand.translate(_UPPER)
        num = _name_to_number(upper)
        if num is None and upper.startswith("SIG"):
            num = _name_to_number(upper[3:])
    if num is None or signal_name(num) is None:
        raise ValueError(f"invalid signal: {operand!r}")
    return num


# --- durations: what strtod reads, then one optional unit ---------------------------

_UNITS = {"": 1, "s": 1, "m": 60, "h": 60 * 60, "d": 60 * 60 * 24}
_TRUE_MIN = 5e-324  # the smallest positive double: a duration that underflowed


def _scan(text: str, start: int, chars: str) -> int:
    end = start
    while end < len(text) and text[end] in chars:
        end += 1
    return end


def _exponent(text: str, at: int, letters: str) -> tuple[str, int]:
    """An exponent at ``at`` (``e-3``, ``p+4``) if digits follow its letter."""
    if at < len(text) and text[at] in letters:
        j = at + 1
        if j < len(text) and text[j] in "+-":
            j += 1
        end = _scan(text, j, _DIGITS)
        if end > j:
            return text[at + 1:end], end
    return "0", at


def _strtod(text: str, point: str) -> tuple[float, int] | None:
    """The value and length of the longest prefix C's ``strtod`` reads, or None.

    Leading whitespace, a sign, decimal digits with ``point`` and an ``e``
    exponent, hexadecimal digits with a ``p`` exponent, ``inf``,
    ``infinity``, ``nan`` and ``nan(chars)``.  An overflow reads as infinity;
    a nonzero number that underflows to zero reads as the smallest positive
    double, as coreutils does (a duration too small to represent is not 0).
    """
    i = _scan(text, 0, _WHITESPACE)
    negative = text[i:i + 1] == "-"
    if text[i:i + 1] in ("+", "-"):
        i += 1
    sign = -1.0 if negative else 1.0
    lower = text[i:].lower()
    if lower.startswith("infinity"):
        return sign * math.inf, i + 8
    if lower.startswith("inf"):
        return sign * math.inf, i + 3
    if lower.startswith("nan"):
        end = i + 3
        if text[end:end + 1] == "(":
            close = _scan(text, end + 1, string.ascii_letters + _DIGITS + "_")
            if text[close:close + 1] == ")":
                end = close + 1
        return math.nan, end
    if lower.startswith("0x"):
        j = _scan(text, i + 2, _HEXDIGITS)
        whole = text[i + 2:j]
        frac = ""
        if text.startswith(point, j):
            k = _scan(text, j + len(point), _HEXDIGITS)
            frac, j = text[j + len(point):k], k
        if whole or frac:
            exp, end = _exponent(text, j, "pP")
            try:
                value = float.fromhex(f"0x{whole or '0'}.{frac or '0'}p{int(exp)}")
            except OverflowError:
                value = math.inf
            if value == 0 and (whole + frac).strip("0"):
                value = _TRUE_MIN
            return sign * value, end
        # "0x" with no hexadecimal digit: strtod reads the "0" alone.
    j = _scan(text, i, _DIGITS)
    whole = text[i:j]
    frac = ""
    if text.startswith(point, j):
        k = _scan(text, j + len(point), _DIGITS)
        frac, j = text[j + len(point):k], k
    if not whole and not frac:
        return None
    exp, end = _exponent(text, j, "eE")
    value = float(f"{whole or '0'}.{frac or '0'}e{exp}")
    if value == 0 and (whole + frac).strip("0"):
        value = _TRUE_MIN
    return sign * value, end


def parse_duration(text: str, decimal_point: str = ".") -> float:
    """Seconds from a DURATION: a floating point number and an optional unit.

    The number is what C's ``strtod`` reads (``1.5``, ``.5``, ``5e-1``,
    ``0x1.8p1``, ``inf``; leading whitespace and a sign allowed), written with
    ``.`` or with ``decimal_point`` (the locale's, as coreutils reads both);
    the unit is ``s`` (the default), ``m``, ``h`` or ``d``.  0 means no limit,
    infinity and overflows mean a limit never reached.

    Raises:
        ValueError: no number, a negative one, NaN, or anything after the unit.
    """
    read = _strtod(text, decimal_point)
    if decimal_point != "." and (read is None or read[1] < len(text)):
        c_read = _strtod(text, ".")
        if c_read is not None and (read is None or c_read[1] > read[1]):
            read = c_read
    if read is None:
        raise ValueError(f"invalid time interval: {text!r}")
    value, end = read
    unit = _UNITS.get(text[end:])
    if not 0 <= value or unit is None:
        raise ValueError(f"invalid time interval: {text!r}")
    return value * unit


# --- the environment the user gave us, before Python changed it ----------------------


def _initial_environ() -> dict[str, str] | None:
    """The environment this process was started with (Linux), or None.

    Python's locale coercion (PEP 538) sets ``LC_CTYPE`` in ``os.environ``
    when the locale is C; the command must not inherit that, and the
    locale-dependent output here (quotes, the decimal point) must follow
    what the user set.
    """
    try:
        with open("/proc/self/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env.setdefault(os.fsdecode(key), os.fsdecode(value))
    return env


def _locale_of(env: Mapping[str, str], category: str) -> str:
    for var in ("LC_ALL", category, "LANG"):
        value = env.get(var)
        if value:
            return value
    return "C"


def _uses_utf8(env: Mapping[str, str]) -> bool:
    name = _locale_of(env, "LC_CTYPE")
    if name in ("C", "POSIX"):
        return False
    old = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, name)
        codeset = locale.nl_langinfo(locale.CODESET)
    except locale.Error:
        return False
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    return codeset.upper().replace("-", "") == "UTF8"


def _decimal_point(env: Mapping[str, str]) -> str:
    name = _locale_of(env, "LC_NUMERIC")
    if name in ("C", "POSIX"):
        return "."
    old = locale.setlocale(locale.LC_NUMERIC)
    try:
        locale.setlocale(locale.LC_NUMERIC, name)
        return str(locale.localeconv()["decimal_point"]) or "."
    except locale.Error:
        return "."
    finally:
        locale.setlocale(locale.LC_NUMERIC, old)


_C_ESCAPES = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r",
              0x5C: "\\\\"}


# What glibc's iswprint refuses in a UTF-8 locale: controls, the line and
# paragraph separators, and code points with no character (checked against
# glibc 2.36 over every code point).
_UNPRINTABLE = frozenset({"Cc", "Zl", "Zp", "Cn", "Cs"})


def _printable(char: str) -> bool:
    return unicodedata.category(char) not in _UNPRINTABLE


def quote(arg: str, utf8: bool) -> str:
    """An argument quoted as coreutils quotes one in a message.

    ``'sleep'`` in the C locale (``'`` and ``\\`` escaped, other bytes outside
    printable ASCII as octal), ``‘sleep’`` in a UTF-8 one (``’`` and ``\\``
    escaped, characters glibc calls printable kept: ``str.isprintable`` is
    stricter, e.g. for a no-break space).
    """
    raw = os.fsencode(arg)
    out = []
    i = 0
    while i < len(raw):
        b = raw[i]
        if b in _C_ESCAPES:
            out.append(_C_ESCAPES[b])
        elif b == 0x27 and not utf8:
            out.append("\\'")
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        elif utf8 and b >= 0x80:
            for size in (2, 3, 4):
                try:
                    char = raw[i:i + size].decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if _printable(char):
                    # the closing quote inside is escaped, as "'" is in the C locale
                    out.append("\\\u2019" if char == "\u2019" else char)
                    i += size
                    break
                out.extend(f"\\{c:03o}" for c in raw[i:i + size])
                i += size
                break
            else:
                out.append(f"\\{b:03o}")
                i += 1
            continue
        else:
            out.append(f"\\{b:03o}")
        i += 1
    body = "".join(out)
    return f"\u2018{body}\u2019" if utf8 else f"'{body}'"


# --- the command line ------------------------------------------------------------


class _Usage(Exception):
    """A usage error: exit 125 after ``message`` (if any) and the ``--help`` hint."""

    def __init__(self, message: str | None) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Args:
    """The parsed command line."""

    duration: float = 0.0
    command: list[str] = dataclasses.field(default_factory=list)
    kill_after: float = 0.0
    signal: int = signal.SIGTERM
    foreground: bool = False
    preserve_status: bool = False
    verbose: bool = False
    json: bool = False
    contain: bool | None = None
    help: bool = False
    version: bool = False


# (long name, short letter or "", takes an argument); in --help's order.
_OPTIONS = (
    ("foreground", "f", False),
    ("kill-after", "k", True),
    ("preserve-status", "p", False),
    ("signal", "s", True),
    ("verbose", "v", False),
    ("json", "", False),
    ("no-contain", "", False),
    ("help", "", False),
    ("version", "", False),
)


def _apply(args: Args, name: str, value: str | None, utf8: bool, point: str) -> bool:
    """Apply one option; True when it ends the parse (``--help``, ``--version``)."""
    if name == "kill-after":
        assert value is not None
        try:
            args.kill_after = parse_duration(value, point)
        except ValueError:
            raise _Usage(f"invalid time interval {quote(value, utf8)}") from None
    elif name == "signal":
        assert value is not None
        try:
            args.signal = parse_signal(value)
        except ValueError:
            raise _Usage(f"{quote(value, utf8)}: invalid signal") from None
    elif name == "no-contain":
        args.contain = False
    else:
        setattr(args, name.replace("-", "_"), True)
    return name in ("help", "version")


def parse_args(argv: Sequence[str], *, utf8: bool = False, point: str = ".") -> Args:
    """``timeout``'s command line, read as GNU ``getopt_long`` with ``+`` reads it.

    Options stop at the first operand (or ``--``); long options may be
    abbreviated to any unique prefix and take ``--opt=value`` or ``--opt
    value``; short ones may be grouped (``-vk5``).  Each option is applied as
    it is read, so ``--help`` wins over what follows it, not over an error
    before it.

    Raises:
        _Usage: a bad option, option value, duration or operand count.
    """
    args = Args()
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        i += 1
        if word.startswith("--"):
            name, eq, attached = word[2:].partition("=")
            value: str | None = attached
            exact = [o for o in _OPTIONS if o[0] == name]
            found = exact or [o for o in _OPTIONS if o[0].startswith(name)]
            if not found:
                raise _Usage(f"unrecognized option '{word}'")
            if len(found) > 1:
                choices = " ".join(f"'--{o[0]}'" for o in found)
                raise _Usage(f"option '{word}' is ambiguous; possibilities: {choices}")
            long_name, _, takes = found[0]
            if takes and not eq:
                if i >= len(argv):
                    raise _Usage(f"option '--{long_name}' requires an argument")
                value, i = argv[i], i + 1
            elif not takes and eq:
                raise _Usage(f"option '--{long_name}' doesn't allow an argument")
            if _apply(args, long_name, value if takes else None, utf8, point):
                return args
            continue
        letters = word[1:]
        while letters:
            letter, letters = letters[0], letters[1:]
            option = next((o for o in _OPTIONS if o[1] == letter), None)
            if option is None:
                raise _Usage(f"invalid option -- '{letter}'")
            value = None
            if option[2]:
                if letters:
                    value, letters = letters, ""
                elif i < len(argv):
                    value, i = argv[i], i + 1
                else:
                    raise _Usage(f"option requires an argument -- '{letter}'")
            if _apply(args, option[0], value, utf8, point):
                return args
    operands = list(argv[i:])
    if len(operands) < 2:
        raise _Usage(None)
    try:
        args.duration = parse_duration(operands[0], point)
    except ValueError:
        raise _Usage(f"invalid time interval {quote(operands[0], utf8)}") from None
    args.command = operands[1:]
    return args


_HELP = """\
Usage: {prog} [OPTION]... DURATION COMMAND [ARG]...
Run COMMAND; if it is still running after DURATION, signal it.  Whatever
COMMAND started is killed when it ends (boundedproc's group kill).

  -f, --foreground       leave COMMAND in this process group, so that it can use
                           the terminal and get its signals when this runs from
                           a script; only COMMAND itself is then signalled
  -k, --kill-after=DURATION
                         send KILL if COMMAND still runs DURATION after the
                           first signal was sent
  -p, --preserve-status  exit with COMMAND's status also when it timed out
  -s, --signal=SIGNAL    the signal sent at the deadline, TERM if not given: a
                           name (HUP, SIGHUP, hup) or a number; 0 sends none
  -v, --verbose          tell on standard error each signal sent to COMMAND
      --json             at the end, print boundedproc's Result as one JSON
                           object on standard output
      --no-contain       leave alone the processes that left COMMAND's process
                           group (setsid); by default they are killed too
      --help             show this help and exit
      --version          show the version and exit

DURATION is a number, as C's strtod reads it (1.5, 5e-1, 0x1p-1), with an
optional unit: s seconds (the default), m minutes, h hours, d days.  A
DURATION of 0 sets no limit.

TERM, INT, HUP, QUIT, USR1 and USR2 received are sent on to COMMAND; an ALRM
received is the deadline, now.

Exit status:
  124  COMMAND timed out (and --preserve-status was not given)
  125  {prog} itself failed (a bad option, a bad DURATION, ...)
  126  COMMAND was found but could not be executed
  127  COMMAND was not found
  137  COMMAND had to be killed with KILL after the deadline (-s KILL, -k)
  otherwise COMMAND's exit status; if a signal that {prog} did not send
  killed COMMAND, {prog} ends itself by the same signal
"""


# --- writing ----------------------------------------------------------------------


def _write(fd: int, data: bytes) -> OSError | None:
    """Write all of ``data`` to ``fd``; the error that stopped it, if one did."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError as err:
            return err
        view = view[n:]
    return None


def _die_by(sig: int) -> None:
    """End this process by ``sig``, as the shell expects (returns if it cannot)."""
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):  # KILL and STOP keep their default anyway
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    signal.raise_signal(sig)


def _disable_core_dumps() -> bool:
    """No core file for this process when it dies by a passed-on SIGSEGV, SIGQUIT..."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(4, 0, 0, 0, 0) == 0:  # PR_SET_DUMPABLE, 0: no core, even piped
                return True
        except (OSError, AttributeError):
            pass
    import resource

    try:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    except (OSError, ValueError):
        return False
    return True


# --- the run ----------------------------------------------------------------------

# Received by this program and sent on to COMMAND (SPEC 9.5); SIGALRM is the
# deadline instead (on_alarm), as in coreutils.
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2, signal.SIGALRM)
# Never caught here, whatever -s names: job control, and the uncatchable.
_NOT_CAUGHT = {0, signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGTSTP,
               signal.SIGCONT, signal.SIGTTIN, signal.SIGTTOU}
# What coreutils' timeout catches (ALRM, INT, QUIT, HUP, TERM, and -s's signal), waits with
# (CHLD) or sets back to default before its exec (TTIN, TTOU): COMMAND has them at their
# default whatever was inherited (exec keeps only SIG_IGN).
_COREUTILS_CAUGHT = (signal.SIGALRM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
                     signal.SIGTERM, signal.SIGCHLD, signal.SIGTTIN, signal.SIGTTOU)
# Python ignores these itself at its start, so what this process inherited for them is not
# known here: COMMAND gets them at their default, as from Python's subprocess.
_PYTHON_IGNORES = frozenset(getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ")
                            if hasattr(signal, name))


def _signal_bits(sigs: Iterable[int]) -> int:
    """Signals as the core's bits: s-1 for signal s (1 to 64; others left out; each once)."""
    return sum({1 << (sig - 1) for sig in sigs if 0 < sig <= 64})


def _inherited_signals() -> tuple[int, int]:
    """The signals this process found ignored and its signal mask, each as bits
    (``_signal_bits``), read before anything here changes them; coreutils passes both on
    to COMMAND (its child restores the mask it started with; exec keeps SIG_IGN).  SIGCHLD
    is left out of the mask: coreutils unblocks it in itself, to wait with it, before it
    takes the mask its child restores."""
    ignored = _signal_bits(sig for sig in signal.valid_signals()
                           if sig not in _PYTHON_IGNORES
                           and signal.getsignal(sig) == signal.SIG_IGN)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, ()) - {signal.SIGCHLD}
    return ignored, _signal_bits(blocked)


_RETRY = 0.001  # a signal that came while the command was being started: again after 1 ms
_TSTP_GRACE = 0.25  # at most, between the SIGTSTP and the SIGSTOP of a Ctrl-Z (on_stop)
_MAX_ALARM = float(2**31)  # setitimer's reach, about 68 years; a longer wait is re-armed


def _proc_status_field(pid: int, name: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (unknown: True, the safe side)."""
    caught = _proc_status_field(pid, "SigCgt")
    return caught is None or bool(int(caught, 16) >> (sig - 1) & 1)


def _stopped(pid: int) -> bool:
    state = _proc_status_field(pid, "State")
    return state is None or state[:1] in ("T", "t")  # gone counts as done waiting


def _self_stop_signal() -> int:
    """How to stop ourselves on Ctrl-Z: SIGTSTP, as a job is stopped, unless our process
    group is orphaned (our parent is in another session: we are the COMMAND of another
    boundedproc-timeout, or were started with setsid), where the kernel drops a SIGTSTP
    without a handler and we would go on, continuing COMMAND: SIGSTOP then."""
    try:
        same = os.getsid(0) == os.getsid(os.getppid())
    except OSError:
        same = False
    return signal.SIGTSTP if same else signal.SIGSTOP


class _Timeout:
    """One run of COMMAND under coreutils ``timeout``'s rules."""

    def __init__(self, args: Args, prog: str, utf8: bool, closed_fds: Sequence[int],
                 child_env: Mapping[str, str | None] | None,
                 inherited: tuple[int, int] = (0, 0)) -> None:
        self.args = args
        # COMMAND's ignored signals and mask (bit s-1 for signal s), as coreutils leaves
        # them: what we inherited, but the signals coreutils catches back at their default.
        ignored, self.sig_mask = inherited
        self.sig_ignore = ignored & ~_signal_bits((*_COREUTILS_CAUGHT, args.signal))
        self.prog = prog
        self.utf8 = utf8
        self.closed_fds = closed_fds
        self.child_env = child_env
        self.term_signal = args.signal
        self.kill_after = args.kill_after
        self.timed_out = False
        self.running = False
        self.control = _native.RunControl()
        self.due: list[tuple[float, int, int]] = []  # (when, order, signal or -1 for the alarm)
        self.order = 0
        self.armed = False
        self.stderr_failed = False
        self.sent_kill = False  # KILL sent to the group: coreutils is killed by it too
        self.tty: tuple[int, list[Any]] | None = None  # a terminal's modes at the start

    # -- messages --

    def say(self, message: str) -> None:
        """One line on stderr, ``prog: message``; one stderr did not take makes the end 125."""
        if 2 in self.closed_fds or _write(
                2, f"{self.prog}: {message}\n".encode("utf-8", "surrogateescape")) is not None:
            # coreutils' exit checks stderr: a message lost there is a failure of its own.
            self.stderr_failed = True

    # -- timers: setitimer's SIGALRM, told apart from a SIGALRM sent to us --

    def schedule(self, delay: float, what: int) -> None:
        """``what`` (a signal to pass on, or -1 for the alarm) ``delay`` seconds from now."""
        self.order += 1
        heapq.heappush(self.due, (time.monotonic() + delay, self.order, what))
        self.rearm()

    def rearm(self) -> None:
        if not self.due:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.armed = False
            return
        left = self.due[0][0] - time.monotonic()
        self.armed = True  # first: the SIGALRM may be handled before setitimer returns
        signal.setitimer(signal.ITIMER_REAL, min(max(left, 1e-6), _MAX_ALARM))

    def on_alarm(self, signum: int, frame: FrameType | None) -> None:
        # Our itimer has expired exactly when it is armed and reads 0 now; a
        # SIGALRM from outside leaves it running.  (Both at once merge into one.)
        if not (self.armed and signal.getitimer(signal.ITIMER_REAL)[0] == 0.0):
            # coreutils cannot tell the two apart: a SIGALRM sent to it is its
            # deadline, now (-s's signal sent, 124), which is what `timeout -s
            # ALRM N timeout ...` relies on.  What is scheduled stays due.
            self.cleanup(None)
            return
        self.armed = False
        now = time.monotonic()
        fired = []
        while self.due and self.due[0][0] <= now + 1e-4:
            fired.append(heapq.heappop(self.due)[2])
        self.rearm()
        for what in fired:
            if what < 0:
                self.cleanup(None)
            else:
                self.deliver(what)

    # -- signals --

    def live(self) -> bool | None:
        """True while the command runs; None before it is attached; False after."""
        if not self.running:
            return False
        if self.control.send_signal(0):
            return True
        return None if self.control.pid is None else False

    def deliver(self, sig: int) -> None:
        """A signal received: send it on, as coreutils' cleanup() does."""
        state = self.live()
        if state is None:
            self.schedule(_RETRY, sig)
        elif state:
            self.cleanup(sig)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.deliver(signum)

    def cleanup(self, received: int | None) -> None:
        """Send a received signal, or (``None``) the deadline's, to COMMAND."""
        state = self.live()
        if state is None:
            self.schedule(_RETRY, -1 if received is None else received)
            return
        if not state:
            return
        if received is None:
            self.timed_out = True
            sig = self.term_signal
        else:
            sig = received
        kill_after, self.kill_after = self.kill_after, 0.0
        if kill_after > 0:
            # The first signal sent starts -k's clock; what is sent when it (or a
            # later deadline) expires is KILL.  The clock is armed last, as
            # coreutils does, once this signal is sent: a -k of a microsecond
            # fires at once, and its alarm runs this again (for the KILL).
            self.term_signal = signal.SIGKILL
        if self.args.verbose:
            name = signal_name(sig) or str(sig)
            self.say(f"sending signal {name} to command {quote(self.args.command[0], self.utf8)}")
        if sig != 0:
            self.control.send_signal(sig)
        if sig == signal.SIGKILL and not self.args.foreground:
            self.sent_kill = True
        if not self.args.foreground and sig not in (signal.SIGKILL, signal.SIGCONT,
                                                    signal.SIGSTOP):
            # A stopped command acts on the signal only once continued (`-s STOP` means
            # stopped: coreutils' COMMAND stays so).
            self.control.send_signal(signal.SIGCONT)
        if kill_after > 0:
            self.schedule(kill_after, -1)

    def on_stop(self, signum: int, frame: FrameType | None) -> None:
        """Ctrl-Z: stop COMMAND, then stop here; when continued, continue it."""
        if self.live():
            # COMMAND leads a session of its own, so its process group is
            # orphaned and the kernel drops a SIGTSTP it has no handler for:
            # SIGSTOP is what stops it.  SIGTSTP goes first: a program that
            # handles it gets to act on it.  One that stops itself then (another
            # boundedproc-timeout, which stops its own COMMAND first) is waited
            # for, up to _TSTP_GRACE; a full-screen one (less, vim) sets its
            # terminal back, though its own stop is dropped too.  A COMMAND
            # with no handler is stopped at once.
            self.control.send_signal(signal.SIGTSTP)
            pid = self.control.leader()
            if pid is not None and _catches(pid, signal.SIGTSTP):
                until = time.monotonic() + _TSTP_GRACE
                while time.monotonic() < until and not _stopped(pid):
                    time.sleep(0.005)
            self.control.send_signal(signal.SIGSTOP)
        stop = _self_stop_signal()
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), stop)  # stopped here until SIGCONT
        finally:
            signal.signal(signal.SIGTSTP, self.on_stop)
        if self.live():
            self.control.send_signal(signal.SIGCONT)

    def on_winch(self, signum: int, frame: FrameType | None) -> None:
        if self.live():  # the terminal's size changed: COMMAND has no terminal to tell it
            self.control.send_signal(signal.SIGWINCH)

    def install(self) -> None:
        """This process's signal state, as coreutils sets its own up."""
        if not self.args.foreground:
            try:
                os.setpgid(0, 0)  # as coreutils: not in a script's foreground group
            except OSError:  # already a session leader
                pass
        signal.signal(signal.SIGTTIN, signal.SIG_IGN)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # an inherited SIG_IGN would reap for us
        caught: set[int] = set(_FORWARDED)
        if self.args.signal not in _NOT_CAUGHT:
            caught.add(self.args.signal)
        for sig in caught:
            signal.signal(sig, self.on_alarm if sig == signal.SIGALRM else self.on_signal)
        unblock = caught | {signal.SIGCHLD}
        if not self.args.foreground:
            signal.signal(signal.SIGTSTP, self.on_stop)
            unblock |= {signal.SIGTSTP, signal.SIGCONT}
            if signal.SIGWINCH not in caught:
                signal.signal(signal.SIGWINCH, self.on_winch)
                unblock.add(signal.SIGWINCH)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)

    # -- the whole run --

    def prepared(self, command: Sequence[str | bytes]) -> Prepared:
        options = validate(
            timeout=None, max_output=None, on_overflow="truncate", stdin=INHERIT, cwd=None,
            env=self.child_env, env_mode="merge", merge_stderr=False, text=False, cancel=None,
            kill_grace=0.0, drain_grace=0.0, limits=None, contain=self.args.contain,
            on_output=None, keep="head", stdout=INHERIT, stderr=INHERIT, user=None,
            group=None, tmpdir=False, check=False)
        # No deadline in the core (it is kept here) and kill_grace 0: when the
        # leader exits, what is left of the run is killed at once.
        options = dataclasses.replace(options, new_session=not self.args.foreground)
        prepared = prepare(command, False, options)
        if prepared.spec is not None and (self.sig_ignore or self.sig_mask):
            prepared = dataclasses.replace(prepared, spec=dataclasses.replace(
                prepared.spec, sig_ignore=self.sig_ignore, sig_mask=self.sig_mask))
        if prepared.spec is not None and self.closed_fds:
            # Our closed fds 0-2 hold placeholders (so that no fd of ours lands
            # there); COMMAND gets them closed, as they were given to us.
            fds = {f"{name}_fd": _native.FD_CLOSED
                   for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr"))
                   if fd in self.closed_fds}
            prepared = dataclasses.replace(
                prepared, spec=dataclasses.replace(prepared.spec, **fds))  # type: ignore[arg-type]
        return prepared

    def run(self) -> int:
        prepared = self.prepared(self.args.command)
        if not self.args.foreground:
            self.tty = _terminal_modes()
        # From here on a signal is sent on: once the command is attached to
        # self.control (until then it is tried again each millisecond).
        self.running = True
        self.install()
        if 0 < self.args.duration < math.inf:
            self.schedule(self.args.duration, -1)
        try:
            result, outcome = execute(prepared, time.monotonic(), control=self.control)
            script = _script_argv(prepared, outcome)
            if script is not None:
                # As coreutils' execvp: a file the kernel does not know how to
                # run (no "#!") is run by /bin/sh, under the same deadline.
                result, outcome = execute(self.prepared(script), time.monotonic(),
                                          control=self.control)
        finally:
            self.running = False
            self.due.clear()
            self.rearm()
        return self.finish(result, outcome)

    def finish(self, result: AnyResult, outcome: _native.NativeOutcome | None) -> int:
        if self.sent_kill and self.tty is not None:
            # coreutils is killed by the KILL it sends its own group, and the shell then
            # restores the terminal modes it saved before the job: those a program left
            # raw (`stty raw`, a full-screen program) when it died mid-way.  We end by
            # exit(137) instead, which the shell takes as a job that set its modes on
            # purpose; so they are restored here, while we are the terminal's foreground.
            _restore_terminal_modes(*self.tty)
        status, die_by = self.status(result, outcome)
        if self.args.json:
            from boundedproc.__main__ import result_json

            shown = dataclasses.replace(result, timed_out=self.timed_out, exit_code=status)
            err = (OSError(9, os.strerror(9)) if 1 in self.closed_fds
                   else _write(1, (result_json(shown) + "\n").encode("utf-8")))
            if err is not None:
                return _write_failed(self.prog, err)
        if die_by is not None and _disable_core_dumps():
            _die_by(die_by)
        if self.stderr_failed and not self.sent_kill:
            # coreutils ends by exit(), whose check of stderr fails: 125.  (Where
            # it sent KILL to its own group it was killed by it first: 137.)
            return EXIT_CANCELED
        return status

    def status(self, result: AnyResult,
               outcome: _native.NativeOutcome | None) -> tuple[int, int | None]:
        """The exit status coreutils gives, and the signal to end by instead, if any."""
        command = quote(self.args.command[0], self.utf8)
        if not result.spawned:
            stage = outcome.err_stage if outcome is not None else 0
            err = outcome.err_errno if outcome is not None else 0
            if stage == _native.lib.BP_STAGE_EXEC:
                self.say(f"failed to run command {command}: {os.strerror(err)}")
                return (EXIT_ENOENT if err == 2 else EXIT_CANNOT_INVOKE), None
            if stage == _native.lib.BP_STAGE_FORK:
                self.say(f"fork system call failed: {os.strerror(err)}")
            else:
                self.say(f"failed to run command {command}: {result.runner_error}")
            return EXIT_CANCELED, None
        if result.runner_error is not None and result.runner_error.startswith("runner failed"):
            self.say(f"error waiting for command: {result.runner_error}")
            return EXIT_CANCELED, None
        sig = result.term_signal
        status = result.exit_code if sig is None else 128 + sig
        if sig is not None and not self.timed_out:
            return status, sig
        if self.timed_out and not self.args.preserve_status and sig != signal.SIGKILL:
            return EXIT_TIMEDOUT, None
        return status, None


def _terminal_modes() -> tuple[int, list[Any]] | None:
    """The modes of the first of fds 0-2 that is a terminal, with the fd; None: none is."""
    import termios

    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return fd, termios.tcgetattr(fd)
        except (OSError, termios.error):
            continue
    return None


def _restore_terminal_modes(fd: int, modes: list[Any]) -> None:
    """Set a terminal's modes back, only while our group is its foreground (never a
    background job's change of a terminal another job reads)."""
    import termios

    try:
        if os.tcgetpgrp(fd) == os.getpgrp():
            termios.tcsetattr(fd, termios.TCSANOW, modes)
    except (OSError, termios.error):
        pass


def _script_argv(prepared: Prepared,
                 outcome: _native.NativeOutcome | None) -> list[bytes] | None:
    """``/bin/sh FILE ARG...`` when the exec failed with ENOEXEC, as glibc's execvp runs it.

    FILE is the candidate that failed: the first on the search path that is an
    executable regular file (the ones before it failed with ENOENT, EACCES...).
    """
    if (outcome is None or outcome.spawned or prepared.spec is None
            or outcome.err_stage != _native.lib.BP_STAGE_EXEC
            or outcome.err_errno != errno.ENOEXEC):
        return None
    for path in prepared.spec.exec_paths:
        try:
            regular = stat.S_ISREG(os.stat(path).st_mode)
        except (OSError, ValueError):
            continue
        if regular and os.access(path, os.X_OK):
            return [b"/bin/sh", path, *prepared.args[1:]]
    return None


def _write_failed(prog: str, err: OSError) -> int:
    """coreutils' end for output it could not write: SIGPIPE, or a message and 125."""
    if err.errno == errno.EPIPE:  # a C program with SIGPIPE at its default dies of it
        _die_by(signal.SIGPIPE)
    _write(2, f"{prog}: write error: {err.strerror}\n".encode())
    return EXIT_CANCELED


def _reserve_closed_stdio() -> list[int]:
    """Hold each closed fd 0-2 with /dev/null, so nothing of ours is opened on it."""
    closed: list[int] = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            got = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            if got != fd:  # a lower one was free after all: keep ours, drop this
                os.close(got)
                continue
            closed.append(fd)
    return closed


def _names() -> tuple[str, str]:
    """The name messages start with, and the command the ``--help`` hint names.

    coreutils names itself as it was run; so does this: ``boundedproc-timeout``
    as the console script, ``timeout`` through a link of that name and under
    ``python -m boundedproc.timeout`` (whose hint then names that command).
    """
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "boundedproc-timeout"
    if os.path.abspath(argv0) == os.path.abspath(__file__):
        return "timeout", "python -m boundedproc.timeout"
    prog = os.path.basename(argv0)
    return prog, prog


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``boundedproc-timeout``; returns the exit status (or ends by a signal)."""
    inherited = _inherited_signals()
    closed = _reserve_closed_stdio()
    prog, hint = _names()
    initial = _initial_environ()
    env = initial if initial is not None else dict(os.environ)
    utf8 = _uses_utf8(env)
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv, utf8=utf8,
                          point=_decimal_point(env))
    except _Usage as usage:
        text = "" if usage.message is None else f"{prog}: {usage.message}\n"
        if 2 not in closed:
            _write(2, f"{text}Try '{hint} --help' for more information.\n".encode(
                "utf-8", "surrogateescape"))
        return EXIT_CANCELED
    if args.help or args.version:
        text = (_HELP.format(prog=prog) if args.help
                else f"{prog} (boundedproc) {__version__}\n")
        err = OSError(9, os.strerror(9)) if 1 in closed else _write(1, text.encode())
        return 0 if err is None else _write_failed(prog, err)
    child_env: dict[str, str | None] | None = None
    if initial is not None and os.environ.get("LC_CTYPE") != initial.get("LC_CTYPE"):
        child_env = {"LC_CTYPE": initial.get("LC_CTYPE")}  # undo Python's coercion
    try:
        return _Timeout(args, prog, utf8, closed, child_env, inherited).run()
    except KeyboardInterrupt:  # a Ctrl-C before the handlers were in place
        _die_by(signal.SIGINT)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
