"""Kernel addresses to function names, from the running kernel's symbol table
(PROC/kallsyms: "address type name [module]"). The text symbols only, sorted, kept as
one array of addresses and one blob of names (about 4 MB for 120,000 symbols, loaded
once, when a core is first sampled); a name found once is cached by address.

The addresses are shown only to a reader with CAP_SYSLOG (kernel.kptr_restrict 0 and
perf_event_paranoid > 1, the default) or perf_event_paranoid <= 1: otherwise every
address reads 0, and load() says so.
"""
from __future__ import annotations

from array import array
from bisect import bisect_right

TEXT = frozenset("tTwW")
CACHE_MAX = 65536


class Hidden(Exception):
    """The symbol table cannot be read, or its addresses are hidden; the message says why."""


class Symbols:
    def __init__(self, addresses: array, names: bytes, offsets: array) -> None:
        self.addresses = addresses
        self.names = names
        self.offsets = offsets        # names[offsets[i]:offsets[i + 1] - 1] is addresses[i]'s name
        self.cache: dict = {}

    def name(self, address: int) -> str:
        hit = self.cache.get(address)
        if hit is not None:
            return hit
        i = bisect_right(self.addresses, address) - 1
        name = "?" if i < 0 else self.names[self.offsets[i]:self.offsets[i + 1] - 1].decode("ascii", "replace")
        if len(self.cache) >= CACHE_MAX:
            self.cache.clear()
        self.cache[address] = name
        return name


def parse(text: bytes) -> Symbols:
    rows = []
    for line in text.splitlines():
        parts = line.split(None, 3)
        if len(parts) < 3 or len(parts[1]) != 1 or chr(parts[1][0]) not in TEXT:
            continue
        try:
            rows.append((int(parts[0], 16), parts[2]))
        except ValueError:
            continue
    if not rows:
        raise Hidden("no text symbols")
    if not any(a for a, _ in rows):
        raise Hidden("its addresses read 0 (needs CAP_SYSLOG, or kernel.perf_event_paranoid <= 1)")
    rows.sort()
    addresses = array("Q", (a for a, _ in rows))
    names = b"\n".join(n for _, n in rows) + b"\n"
    offsets, pos = array("I"), 0
    for _, n in rows:
        offsets.append(pos)
        pos += len(n) + 1
    offsets.append(pos)
    return Symbols(addresses, names, offsets)


def load(proc: str = "/proc") -> Symbols:
    path = f"{proc}/kallsyms"
    try:
        with open(path, "rb") as f:
            return parse(f.read(64 << 20))
    except OSError as e:
        raise Hidden(f"{path}: {e.strerror}") from None
    except Hidden as e:
        raise Hidden(f"{path}: {e}") from None
