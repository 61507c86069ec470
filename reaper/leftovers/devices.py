"""Accelerator device files, and which processes hold one open.

A device holder is a process with an open descriptor on a device file that one
of the --devices globs matches. Its descriptors are the links in /proc/PID/fd:
the process controls how many there are and what they name, so at most
MAX_FDS links are read, each a readlink (no open, nothing of the target's),
and only links into /dev are compared.

The default globs, and where each comes from:
- /dev/nvidia[0-9]*: NVIDIA GPUs, one node per GPU (the driver's nvidia-modprobe;
  /dev/nvidiactl and /dev/nvidia-uvm are shared by every CUDA process and are
  left out: holding them holds no GPU);
- /dev/kfd and /dev/dri/renderD*: AMD ROCm (the KFD compute node and the DRM
  render nodes, as ROCm's container docs pass them);
- /dev/neuron*: AWS Inferentia and Trainium (the Neuron driver's nodes);
- /dev/accel/*: the kernel's compute-accelerator subsystem (drivers/accel:
  Intel Gaudi habanalabs and NPU, AMD XDNA, Qualcomm AIC); /dev/accel[0-9]*:
  Google TPU VMs (v2 to v4); /dev/hl[0-9]*: Gaudi before the accel subsystem.

The matcher is fnmatch's syntax (* ? [abc] [a-z] [!a]) without fnmatch, which
would load re into PID 1.
"""
from __future__ import annotations

import os

from reaper.text import quoted

DEFAULT_GLOBS = ("/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dri/renderD*", "/dev/neuron*",
                 "/dev/accel/*", "/dev/accel[0-9]*", "/dev/hl[0-9]*")
MAX_FDS = 4096           # links of one process read at most: a process may hold a million
MAX_GLOBS = 64
MAX_GLOB = 4096


def check_glob(text: str) -> str:
    """A --devices glob as given; ValueError if it cannot be one."""
    g = text.strip()
    if not g:
        raise ValueError("an empty device glob")
    if not g.startswith("/"):
        raise ValueError(f"a device glob must be an absolute path, not {quoted(g)}")
    if len(g) > MAX_GLOB or "\0" in g or not g.isprintable():
        raise ValueError(f"not a device glob: {quoted(g)}")
    i = 0
    while i < len(g):
        if g[i] == "[":
            end = _class_end(g, i)
            if end < 0:
                raise ValueError(f"unclosed [ in device glob {quoted(g)}")
            i = end
        elif g[i] == "]":
            raise ValueError(f"a ] without [ in device glob {quoted(g)}")
        i += 1
    return g


def _class_end(g: str, i: int) -> int:
    """Index of the ] closing the class opened at g[i], or -1."""
    j = i + 1
    if j < len(g) and g[j] == "!":
        j += 1
    if j < len(g) and g[j] == "]":
        j += 1                       # a ] first in the class is a member
    while j < len(g) and g[j] != "]":
        j += 1
    return j if j < len(g) else -1


def match(glob: str, path: str) -> bool:
    """path matches glob (fnmatch's rules, * and ? cross /: a device path is short)."""
    return _match(glob, 0, path, 0)


def _match(g: str, gi: int, s: str, si: int) -> bool:
    while gi < len(g):
        c = g[gi]
        if c == "*":
            while gi < len(g) and g[gi] == "*":
                gi += 1
            if gi == len(g):
                return True
            return any(_match(g, gi, s, k) for k in range(si, len(s) + 1))
        if si >= len(s):
            return False
        if c == "?":
            gi, si = gi + 1, si + 1
            continue
        if c == "[":
            end = _class_end(g, gi)
            if end < 0:
                return False
            body = g[gi + 1:end]
            neg = body.startswith("!")
            if neg:
                body = body[1:]
            hit, k = False, 0
            while k < len(body):
                if k + 2 < len(body) and body[k + 1] == "-":
                    hit = hit or body[k] <= s[si] <= body[k + 2]
                    k += 3
                else:
                    hit = hit or body[k] == s[si]
                    k += 1
            if hit == neg:
                return False
            gi, si = end + 1, si + 1
            continue
        if c != s[si]:
            return False
        gi, si = gi + 1, si + 1
    return si == len(s)


class Devices:
    def __init__(self, globs) -> None:
        self.globs = tuple(globs)

    def matches(self, path: str) -> bool:
        return any(match(g, path) for g in self.globs)

    def held_by(self, pid: int, proc: str = "/proc") -> list:
        """The matching device files pid holds open, sorted; [] if none or gone."""
        found = set()
        try:
            it = os.scandir(f"{proc}/{pid}/fd")
        except OSError:
            return []
        with it:
            for n, entry in enumerate(it):
                if n >= MAX_FDS:
                    break
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if target.startswith("/") and self.matches(target):
                    found.add(target)
        return sorted(found)


def parse_globs(text: str) -> tuple:
    """--devices: comma-separated globs, at least one; ValueError otherwise."""
    items = [p.strip() for p in text.split(",")]
    if not any(items):
        raise ValueError("expected at least one device glob such as /dev/nvidia[0-9]*")
    if len(items) > MAX_GLOBS:
        raise ValueError(f"at most {MAX_GLOBS} device globs")
    return tuple(check_glob(p) for p in items)
