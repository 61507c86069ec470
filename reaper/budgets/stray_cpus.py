"""--stray-cpus: the CPUs strays may run on.

``auto`` keeps strays off the CPUs that serve the network interfaces' interrupt
queues. An interface's IRQs are those of its device (the MSI vectors under
/sys/class/net/IF/device, or of the parent PCI function for virtio) and any
/proc/interrupts line naming the interface; a CPU serves an IRQ if that IRQ's
effective affinity includes it or, where that is unreadable, if it has taken
any of its interrupts.
"""
from __future__ import annotations

import os

from reaper.procfs.system import read_interrupts, read_irq_affinity
from reaper.values import parse_cpu_list


def _nic_irqs(sys_root: str = "/sys", proc: str = "/proc") -> set:
    irqs: set = set()
    names = []
    try:
        ifaces = os.listdir(f"{sys_root}/class/net")
    except OSError:
        return irqs
    for iface in ifaces:
        dev = f"{sys_root}/class/net/{iface}/device"
        if not os.path.exists(dev):
            continue                     # lo, bridges, veth: no hardware queues
        names += [iface, iface + "-"]
        for d in (dev, os.path.join(dev, "..")):
            try:
                irqs.update(int(x) for x in os.listdir(os.path.join(d, "msi_irqs")))
            except (OSError, ValueError):
                pass
        try:
            irq = int(open(os.path.join(dev, "irq")).read())
            if irq > 0:
                irqs.add(irq)
        except (OSError, ValueError):
            pass
        try:
            # virtio-net's vectors are named after the virtio device, not the interface.
            names.append(os.path.basename(os.path.realpath(dev)) + "-")
        except OSError:
            pass
    _, lines = read_interrupts(proc) or ((), ())
    for line in lines:
        label = line.name
        if line.irq.isdigit() and label and \
                any(label == n or (n.endswith("-") and label.startswith(n)) for n in names):
            irqs.add(int(line.irq))
    return irqs


def _serving_cpus(irqs: set, proc: str = "/proc") -> set:
    cpus: set = set()
    _, lines = read_interrupts(proc) or ((), ())
    counts = {int(line.irq): line.counts for line in lines if line.irq.isdigit()}
    for irq in irqs:
        text = read_irq_affinity(irq, proc)
        if text is not None:
            try:
                cpus |= set(parse_cpu_list(text, present_only=False))
                continue
            except ValueError:
                pass
        cpus |= {i for i, n in enumerate(counts.get(irq, ())) if n > 0}
    return cpus


def resolve(spec: str | None, sys_root: str = "/sys", proc: str = "/proc", allowed=None) -> tuple:
    """(cpus or None, message): None means leave affinity alone. The roots and the
    allowed CPUs are parameters for the tests' recorded machines."""
    if spec is None:
        return None, ""
    allowed = set(os.sched_getaffinity(0) if allowed is None else allowed)
    if spec != "auto":
        cpus = set(parse_cpu_list(spec)) & allowed
        if not cpus:
            return None, f"--stray-cpus {spec}: none of these CPUs is available to reaper; affinity left alone"
        return frozenset(cpus), f"strays confined to CPUs {_fmt(cpus)}"
    irqs = _nic_irqs(sys_root, proc)
    if not irqs:
        return None, "--stray-cpus auto: no network interrupt queues found; affinity left alone"
    serving = _serving_cpus(irqs, proc)
    cpus = allowed - serving
    if not serving:
        return None, "--stray-cpus auto: no CPU serves network interrupts; affinity left alone"
    if not cpus:
        return None, (f"--stray-cpus auto: every CPU ({_fmt(allowed)}) serves network interrupts; "
                      "affinity left alone")
    return frozenset(cpus), f"strays kept off CPUs {_fmt(serving)} (network interrupts): confined to {_fmt(cpus)}"


def _fmt(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus))
