"""Sampling one core with the kernel's perf_event_open: a software cpu-clock event bound
to that core (every task that runs on it), each sample its instruction pointer, its
process and thread, and its kernel call chain, written by the kernel into a ring buffer
this process maps and drains once a second.

Why ctypes and no library or C: Python has no wrapper for perf_event_open, the C core
(csrc/) is reaper's PID 1 path and stays small, and this is one syscall, one ioctl-free
open (the event starts enabled), one mmap and a read of the ring's head and tail: a
packed perf_event_attr and struct.unpack on the mapped pages. The syscall's number is
the only per-architecture fact (NR).

The cost is the samples', never the processes': FREQ samples a second on the one core
being sampled, whatever runs on the node; reading a sample is a few struct unpacks.
Requires CAP_PERFMON (or CAP_SYS_ADMIN), or perf_event_paranoid <= 0.
"""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import struct
from typing import NamedTuple

NR = {"x86_64": 298, "aarch64": 241, "arm64": 241, "ppc64le": 319, "s390x": 331, "riscv64": 241}
FREQ = 199                # samples a second (a prime: never in step with a periodic timer)
PAGES = 32                # data pages of the ring: 128 KiB, about 5 s of samples at FREQ
MAX_STACK = 24            # kernel frames kept per sample

PERF_TYPE_SOFTWARE = 1
PERF_COUNT_SW_CPU_CLOCK = 0
SAMPLE_IP, SAMPLE_TID, SAMPLE_CALLCHAIN = 1 << 0, 1 << 1, 1 << 5
FLAG_FREQ, FLAG_WATERMARK = 1 << 10, 1 << 14
FLAG_EXCLUDE_CALLCHAIN_USER = 1 << 22
PERF_FLAG_FD_CLOEXEC = 1 << 3
RECORD_LOST, RECORD_SAMPLE = 2, 9
CONTEXT_MAX = (1 << 64) - 4095          # call-chain entries at or above: context markers (PERF_CONTEXT_*)
KERNEL_MIN = 1 << 63                    # addresses at or above: the kernel's (x86_64, arm64)
ATTR_SIZE = 112                         # PERF_ATTR_SIZE_VER5
HEAD, TAIL = 1024, 1032                 # data_head, data_tail in perf_event_mmap_page

_libc = None


class Sample(NamedTuple):
    pid: int             # the process (thread group) in this process's PID namespace; 0: idle or not visible
    tid: int
    ip: int
    chain: tuple         # kernel addresses, the sampled one first, then its callers


def _attr() -> bytes:
    flags = FLAG_FREQ | FLAG_WATERMARK | FLAG_EXCLUDE_CALLCHAIN_USER
    head = struct.pack("<IIQQQQQII", PERF_TYPE_SOFTWARE, ATTR_SIZE, PERF_COUNT_SW_CPU_CLOCK, FREQ,
                       SAMPLE_IP | SAMPLE_TID | SAMPLE_CALLCHAIN, 0, flags, PAGES * mmap.PAGESIZE // 2, 0)
    body = head + bytes(ATTR_SIZE - len(head))
    return body[:108] + struct.pack("<H", MAX_STACK) + body[110:]      # sample_max_stack


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


class Unavailable(Exception):
    """Sampling is not permitted or not possible here; the message says why."""


def open_cpu(cpu: int) -> int:
    """A perf event fd sampling every task on cpu. Raises Unavailable."""
    nr = NR.get(platform.machine())
    if nr is None:
        raise Unavailable(f"perf_event_open: no syscall number known for {platform.machine()}")
    attr = ctypes.create_string_buffer(_attr(), ATTR_SIZE)
    fd = _syscall()(ctypes.c_long(nr), attr, ctypes.c_int(-1), ctypes.c_int(cpu), ctypes.c_int(-1),
                    ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        e = ctypes.get_errno()
        why = os.strerror(e)
        if e in (errno.EACCES, errno.EPERM):
            why += " (needs CAP_PERFMON or CAP_SYS_ADMIN, or kernel.perf_event_paranoid <= 0)"
        raise Unavailable(f"perf_event_open on cpu{cpu}: {why}")
    return fd


class CpuSampler:
    """One core's event and its ring. drain() returns the samples since the last drain;
    close() ends it. Not thread-safe (the monitor's thread only)."""

    def __init__(self, cpu: int) -> None:
        self.cpu = cpu
        self.fd = open_cpu(cpu)
        self.lost = 0
        try:
            self.size = PAGES * mmap.PAGESIZE
            self.ring = mmap.mmap(self.fd, mmap.PAGESIZE + self.size, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError) as e:
            os.close(self.fd)
            raise Unavailable(f"perf ring buffer on cpu{cpu}: {e}") from None

    def drain(self) -> list:
        ring, base, size = self.ring, mmap.PAGESIZE, self.size
        head = struct.unpack_from("<Q", ring, HEAD)[0]
        tail = struct.unpack_from("<Q", ring, TAIL)[0]
        if head - tail > size:            # cannot happen with a well-behaved kernel: start over
            tail = head
        start, end = base + tail % size, base + head % size
        data = ring[start:end] if start <= end and head - tail < size else ring[start:base + size] + ring[base:end]
        struct.pack_into("<Q", ring, TAIL, head)
        return self._parse(data)

    def _parse(self, data: bytes) -> list:
        out, pos, n = [], 0, len(data)
        while pos + 8 <= n:
            kind, _, size = struct.unpack_from("<IHH", data, pos)
            if size < 8 or pos + size > n:
                break
            if kind == RECORD_SAMPLE and size >= 32:
                ip, pid, tid, nr = struct.unpack_from("<QIIQ", data, pos + 8)
                nr = min(nr, (size - 32) // 8)
                ips = struct.unpack_from(f"<{nr}Q", data, pos + 32)
                chain = tuple(a for a in ips if KERNEL_MIN <= a < CONTEXT_MAX)
                out.append(Sample(pid, tid, ip, chain))
            elif kind == RECORD_LOST and size >= 24:
                self.lost += struct.unpack_from("<Q", data, pos + 16)[0]
            pos += size
        return out

    def close(self) -> None:
        try:
            self.ring.close()
        finally:
            os.close(self.fd)
