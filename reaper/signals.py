"""Signal names and numbers, both ways."""
from __future__ import annotations

import signal

SIGRTMIN = signal.SIGRTMIN
SIGRTMAX = signal.SIGRTMAX

_BY_NAME = {s.name[3:]: int(s) for s in signal.Signals if not s.name.startswith("SIG_")}
_BY_NAME.pop("RTMIN", None)
_BY_NAME.pop("RTMAX", None)
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
    t = text.strip().upper()
    if t.isdigit():
        n = int(t)
        if (n == 0 and allow_zero) or 1 <= n <= SIGRTMAX:
            return n
        raise ValueError(f"signal number out of range: {text!r}")
    if t.startswith("SIG"):
        t = t[3:]
    for base, num in (("RTMIN", SIGRTMIN), ("RTMAX", SIGRTMAX)):
        if t.startswith(base):
            rest = t[len(base):]
            off = 0
            if rest:
                if rest[0] not in "+-" or not rest[1:].isdigit():
                    break
                off = int(rest)
            n = num + off
            if SIGRTMIN <= n <= SIGRTMAX:
                return n
            raise ValueError(f"real-time signal out of range: {text!r}")
    if t in _BY_NAME:
        return _BY_NAME[t]
    raise ValueError(f"unknown signal: {text!r}")
