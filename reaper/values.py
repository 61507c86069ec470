"""Parsers of option values that are more than numbers and words: addresses,
paths reaper writes, regular expressions, CPU lists. Apart from reaper/options.py
so that their code is loaded only when such an option is given: options.py is on
the way from start to the child's exec.
"""
import os

from reaper.text import digits, display, quoted


def address(text: str) -> str:
    """An IPv4 or IPv6 literal ('[::1]' too) or a host name; no name lookup here."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    bad = ValueError(f"bad address {quoted(text)} (expected an IPv4 or IPv6 address or a host name)")
    if not host or not host.isascii() or not host.isprintable():
        raise bad
    import socket

    if ":" in host:                                      # IPv6, perhaps with a zone: fe80::1%eth0
        addr, pct, zone = host.partition("%")
        if pct and (not zone or zone.strip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")):
            raise bad
        try:
            socket.inet_pton(socket.AF_INET6, addr)
        except (OSError, ValueError):
            raise bad from None
        return text.strip()
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if digits(labels[-1]):                               # numeric: an IPv4 address or nothing
        try:
            socket.inet_pton(socket.AF_INET, host)
        except (OSError, ValueError):
            raise bad from None
        return text.strip()
    for label in labels:
        if not 0 < len(label) <= 63 or label[0] == "-" or label[-1] == "-" or \
                label.strip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-"):
            raise bad
    if len(host) > 253:
        raise bad
    return text.strip()


def check_writable(path: str) -> None:
    """Raises ValueError unless a file can be written at path: a directory is an
    error; a temporary file is created beside it and removed (as reaper/metrics/exporter.py does)."""
    if os.path.isdir(path):
        raise ValueError(f"{display(path)} is a directory")
    d, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(d, f".{base}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as e:
        raise ValueError(f"cannot write in {display(d)}: {e.strerror}") from None
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:
        pass


def writable_file(text: str) -> str:
    """A file reaper writes: checked now, and made absolute (reaper's working
    directory is / once the child runs)."""
    if not text.strip():
        raise ValueError("expected a path, not an empty string")
    check_writable(text)
    return os.path.abspath(text)


def regex(text: str) -> str:
    import re

    try:
        re.compile(text)
    except re.error as e:
        raise ValueError(f"invalid regular expression {quoted(text)}: {e}") from None
    return text


MAX_CPU = 65535            # above any kernel's NR_CPUS: a larger number is a typo


def parse_cpu_list(text: str, present_only: bool = True) -> frozenset:
    """'0-3,7' -> {0,1,2,3,7}; every CPU must exist on this machine (present_only)."""
    cpus = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not digits(lo) or (sep and not digits(hi)):
            raise ValueError(f"bad CPU list {quoted(text)} (expected e.g. 0-3,7 or auto)")
        if len(lo) > 5 or len(hi) > 5:       # checked before any set is built: no CPU numbers that big
            raise ValueError(f"CPU numbers stop at {MAX_CPU}, not {quoted(part.strip())}")
        lo_i, hi_i = int(lo), int(hi) if sep else int(lo)
        if hi_i < lo_i:
            raise ValueError(f"bad CPU range {quoted(part)}")
        if hi_i > MAX_CPU:
            raise ValueError(f"CPU numbers stop at {MAX_CPU}, not {quoted(part.strip())}")
        cpus.update(range(lo_i, hi_i + 1))
    if not present_only:
        return frozenset(cpus)
    present = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    unknown = sorted(cpus - present)
    if unknown:
        raise ValueError(f"unknown CPU {unknown[0]} in {quoted(text)}")
    return frozenset(cpus)
