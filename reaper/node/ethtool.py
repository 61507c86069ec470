"""A network interface's driver statistics (what `ethtool -S` prints) through the
kernel's ethtool ioctl, SIOCETHTOOL, without the ethtool binary: ETHTOOL_GDRVINFO (the
driver's name), ETHTOOL_GSSET_INFO (how many statistics), ETHTOOL_GSTRINGS (their
names, read once an interface) and ETHTOOL_GSTATS (their values). Unprivileged; the
interfaces are those of this process's network namespace (the host's: hostNetwork).

Exported (bounded): ENA's reset reasons and the *_allowance_exceeded counters of any
driver; other statistics only the ones asked for by name (--nic-stats).
"""
from __future__ import annotations

import ctypes
import fcntl
import socket
import struct

SIOCETHTOOL = 0x8946
GDRVINFO, GSTRINGS, GSTATS, GSSET_INFO = 0x03, 0x1B, 0x1D, 0x37
ETH_SS_STATS = 1
GSTRING_LEN = 32
STATS_MAX = 4096                 # statistics of one interface read at most
DRVINFO_SIZE = 196
IFACES_MAX = 64

# ENA's reset reasons and health counters (amzn-drivers ena_ethtool.c, ena_stats_global_strings)
ENA_RESETS = frozenset((
    "total_resets", "reset_fail", "tx_timeout", "wd_expired", "interface_down", "admin_q_pause",
    "bad_tx_req_id", "bad_rx_req_id", "bad_rx_desc_num", "missing_intr", "suspected_poll_starvation",
    "missing_tx_cmpl", "rx_desc_malformed", "tx_desc_malformed", "invalid_state", "os_netdev_wd",
    "missing_admin_interrupt", "admin_to", "device_request_reset", "missing_first_intr"))


def wanted(name: str, asked: frozenset = frozenset()) -> bool:
    return name in ENA_RESETS or name.endswith("_allowance_exceeded") or name in asked


def _ioctl(sock: socket.socket, iface: str, buf) -> None:
    name = iface.encode()[:15]
    req = bytearray(name + bytes(16 - len(name)) + struct.pack("P", ctypes.addressof(buf)) + bytes(16))
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, req)


def driver(sock: socket.socket, iface: str) -> str:
    buf = ctypes.create_string_buffer(struct.pack("<I", GDRVINFO), DRVINFO_SIZE)
    _ioctl(sock, iface, buf)
    return buf.raw[4:36].split(b"\0", 1)[0].decode("ascii", "replace")


def names(sock: socket.socket, iface: str) -> list:
    """The statistics' names, in the order of their values."""
    buf = ctypes.create_string_buffer(struct.pack("<IIQI", GSSET_INFO, 0, 1 << ETH_SS_STATS, 0), 20)
    _ioctl(sock, iface, buf)
    mask, count = struct.unpack_from("<QI", buf.raw, 8)
    if not mask & (1 << ETH_SS_STATS):
        return []
    count = min(count, STATS_MAX)
    buf = ctypes.create_string_buffer(struct.pack("<III", GSTRINGS, ETH_SS_STATS, count), 12 + count * GSTRING_LEN)
    _ioctl(sock, iface, buf)
    n = min(struct.unpack_from("<I", buf.raw, 8)[0], count)
    raw = buf.raw[12:12 + n * GSTRING_LEN]
    return [raw[i:i + GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
            for i in range(0, len(raw), GSTRING_LEN)]


def values(sock: socket.socket, iface: str, count: int) -> list:
    buf = ctypes.create_string_buffer(struct.pack("<II", GSTATS, count), 8 + 8 * count)
    _ioctl(sock, iface, buf)
    n = min(struct.unpack_from("<I", buf.raw, 4)[0], count)
    return list(struct.unpack_from(f"<{n}Q", buf.raw, 8))


def parse_ethtool_s(text: str) -> dict:
    """`ethtool -S IFACE`'s output (a recorded file) as name -> value."""
    out = {}
    for line in text.splitlines()[1:]:
        name, sep, value = line.strip().rpartition(":")
        if sep and value.strip().isdigit():
            out[name.strip()] = int(value)
    return out


class Reader:
    """Reads every interface's wanted statistics: read() -> {(iface, driver): {stat: value}}.
    Names are read once an interface (again if its count changes)."""

    def __init__(self, asked: frozenset = frozenset()) -> None:
        self.asked = asked
        self.known: dict = {}        # iface -> (driver, [names], [indexes wanted])
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)

    def read(self) -> dict:
        out = {}
        for _, iface in socket.if_nameindex()[:IFACES_MAX]:
            try:
                got = self._one(iface)
            except OSError:          # no ethtool statistics (lo), or gone
                self.known.pop(iface, None)
                continue
            if got:
                out[iface] = got
        return out

    def _one(self, iface: str) -> "tuple | None":
        k = self.known.get(iface)
        if k is None:
            all_names = names(self.sock, iface)
            k = self.known[iface] = (driver(self.sock, iface), all_names,
                                     [i for i, n in enumerate(all_names) if wanted(n, self.asked)])
        drv, all_names, idx = k
        if not idx:
            return None
        vals = values(self.sock, iface, len(all_names))
        if len(vals) != len(all_names):
            del self.known[iface]
            return None
        return drv, {all_names[i]: vals[i] for i in idx}

    def close(self) -> None:
        self.sock.close()
