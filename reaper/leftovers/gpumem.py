"""GPU memory of leftovers, through NVIDIA's NVML (nvidia-ml-py: pip install
'reaper-init[nvml]'), loaded only with --gpu-memory.

For each device a leftover holds, the memory in use on that GPU when its owner
ended and after the end (the device's total: what the next task can have), and,
where NVML's pids are reaper's, each holder's own. NVML names processes by their
pid in the host's PID namespace: in a container with a PID namespace of its own
(the usual pod, without hostPID) they match nobody here, and only the device
totals are told.

A device file is mapped to its GPU by the node's minor number (/dev/nvidiaN is
character device 195:N, and NVML gives each GPU's minor number). A wedged GPU
may not answer: every NVML call runs off the loop under a deadline
(procfs/offloop.py), and one that does not answer switches NVML off for the run.
"""
from __future__ import annotations

import os

from reaper.procfs.offloop import Late, OffLoop

NVML_TIMEOUT = 1.0        # seconds the loop waits for NVML


class Unavailable(Exception):
    """NVML cannot be used here; the message says why."""


class Gpus:
    def __init__(self) -> None:
        self.off = OffLoop(NVML_TIMEOUT, max_stuck=1, name="reaper-nvml")
        try:
            self.nv, self.by_minor = self.off.run(_open)
        except ImportError:
            raise Unavailable("nvidia-ml-py is not installed (pip install 'reaper-init[nvml]')") from None
        except Late:
            raise Unavailable("NVML did not answer") from None
        except Exception as e:          # pynvml.NVMLError and what its loading raises
            raise Unavailable(f"NVML: {e}") from None

    def _call(self, fn, *args):
        if self.nv is None:
            return None
        try:
            return self.off.run(fn, *args)
        except Late:
            self.nv = None               # a GPU that does not answer: not asked again
            return None
        except Exception:
            return None

    def handle(self, path: str):
        """The NVML handle of the GPU whose device file path is, or None."""
        try:
            minor = os.minor(os.stat(path).st_rdev)
        except OSError:
            return None
        return self.by_minor.get(minor)

    def used(self, path: str) -> "int | None":
        h = self.handle(path)
        return None if h is None else self._call(lambda: self.nv.nvmlDeviceGetMemoryInfo(h).used)

    def by_pid(self, path: str) -> dict:
        """pid (as NVML gives it) -> bytes it holds on that GPU."""
        h = self.handle(path)
        if h is None:
            return {}
        return self._call(_processes, self.nv, h) or {}


def _open() -> tuple:
    import pynvml

    pynvml.nvmlInit()
    by_minor = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        by_minor[pynvml.nvmlDeviceGetMinorNumber(h)] = h
    return pynvml, by_minor


def _processes(nv, h) -> dict:
    out: dict = {}
    for get in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
        for p in get(h):
            used = getattr(p, "usedGpuMemory", None)
            if isinstance(used, int) and used >= 0:
                out[p.pid] = out.get(p.pid, 0) + used
    return out
