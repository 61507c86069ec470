"""Signal names and numbers, both ways."""
# The built-in _signal, not signal: the same numbers without the enum module,
# which costs PID 1 milliseconds and memory (this module is on the loop's path,
# and with -r or -p on the way to the child's exec: no __future__ import either).
import _signal as signal

from reaper.text import digits, quoted

SIGRTMIN = signal.SIGRTMIN
SIGRTMAX = signal.SIGRTMAX

_BY_NAME = {k[3:]: v for k, v in vars(signal).items()
            if k.startswith("SIG") and k[3:].isalnum() and k[3:].isupper() and k[3:] not in ("RTMIN", "RTMAX")}
_NAMES = {}
for _name, _num in sorted(_BY_NAME.items()):
    _NAMES.setdefault(_num, _name)
# Prefer the usual names for aliases.
_NAMES.update({signal.SIGCHLD: "CHLD", signal.SIGIO: "IO", signal.SIGABRT: "ABRT"})

# Raised by the kernel for a fault in the receiving process; forwarded only
# when another process sent them.
FAULT_SIGNALS = frozenset(
    int(s) for s in (signal.SIGFPE, signal.SIGILL, signal.SIGSEGV, signal.SIGBUS,
                     signal.SIGABRT, signal.SIGTRAP, signal.SIGSYS)
)
SI_USER = 0
SI_QUEUE = -1
# Numbers below SIGRTMIN without a name: glibc's two reserved real-time signals (32, 33).
RESERVED = frozenset(n for n in range(1, SIGRTMIN) if n not in _NAMES)


def not_forwarded(signo: int) -> "str | None":
    """Why reaper never receives or forwards signo (so -r cannot rewrite it); None if it does."""
    if signo in (signal.SIGKILL, signal.SIGSTOP):
        return "it can never be caught"
    if signo == signal.SIGCHLD:
        return "reaper never forwards it (it only wakes the reaping loop)"
    if signo in RESERVED:
        return "it is reserved by glibc for its threads: reaper cannot receive it"
    return None


def not_for_pdeath(signo: int) -> "str | None":
    """Why signo makes no sense as reaper's parent-death signal; None if it does.
    SIGKILL is fine (reaper dies with its parent, as with tini -p SIGKILL); every
    signal reaper forwards is fine; SIGSTOP would stop reaper, and its reaping, for
    good; the rest would be lost."""
    if signo == signal.SIGKILL:
        return None
    if signo == signal.SIGSTOP:
        return "SIGSTOP would stop reaper (and all reaping) for good when its parent dies"
    why = not_forwarded(signo)
    return f"{name(signo)} would be lost: {why}" if why else None


def name(signo: int) -> str:
    """SIGTERM, SIGRTMIN+2, ... (also for numbers without a name)."""
    if signo in _NAMES:
        return "SIG" + _NAMES[signo]
    if signo == SIGRTMIN or signo == SIGRTMAX:
        return "SIGRTMIN" if signo == SIGRTMIN else "SIGRTMAX"
    if SIGRTMIN < signo < SIGRTMAX:
        return f"SIGRTMIN+{signo - SIGRTMIN}"
    return f"SIG{signo}"


def parse(text: str, allow_zero: bool = False) -> int:
    """TERM, SIGTERM, sigterm, 15, RTMIN+2, SIGRTMAX-1 -> number; ValueError otherwise."""
    t = text.strip().upper() if text.isascii() else ""   # 'ſ'.upper() is 'S'; '٣'.isdigit()
    if digits(t):
        n = int(t)
        if (n == 0 and allow_zero) or 1 <= n <= SIGRTMAX:
            return n
        raise ValueError(f"signal number out of range: {quoted(text)}")
    if t.startswith("SIG"):
        t = t[3:]
    for base, num in (("RTMIN", SIGRTMIN), ("RTMAX", SIGRTMAX)):
        if t.startswith(base):
            rest = t[len(base):]
            off = 0
            if rest:
                if rest[0] not in "+-" or not digits(rest[1:]):
                    break
                off = int(rest)
            n = num + off
            if SIGRTMIN <= n <= SIGRTMAX:
                return n
            raise ValueError(f"real-time signal out of range: {quoted(text)}")
    if t in _BY_NAME:
        return _BY_NAME[t]
    raise ValueError(f"unknown signal: {quoted(text)}")
