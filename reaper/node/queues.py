"""NIC queues, their interrupts and the cores that serve them, and the early warning of a
starved queue: its interrupt count stops moving while its core is saturated in kernel
time.

Why interrupts and not softnet's time_squeeze: the kernel counts a squeeze only inside
the receive softirq (net_rx_action), which a starved core never runs, so the counter
stays flat exactly then. ENA (and most multi-queue drivers) keep a queue's interrupt
masked until its NAPI poll has run: a queue whose poll is starved raises no further
interrupt, and /proc/interrupts shows its line standing still, seconds before the
transmit watchdog (5 s) fires.

A queue's IRQ is found by its name, the last word of its /proc/interrupts line:
`IFACE-Tx-Rx-N` (ENA), `IFACE-TxRx-N` (Intel), `virtioK-input.N` / `virtioK-output.N`
(virtio-net: virtioK is the interface whose SYS/class/net/IFACE/device says so). Its
core: PROC/irq/N/effective_affinity_list (else smp_affinity_list), the first listed.
"""
from __future__ import annotations

import os
import re
from typing import NamedTuple

from reaper.node.kmsg import Event
from reaper.procfs import system

QUEUE_NAME = (re.compile(r"^(?P<dev>[\w.@-]+?)-(?:Tx-Rx|TxRx|txrx|rx-tx)-(?P<queue>\d+)$"),
              re.compile(r"^(?P<dev>virtio\d+)-(?:input|output)\.(?P<queue>\d+)$"))
QUEUES_MAX = 1024        # queue IRQs watched at most
STALL_SECONDS = 2.0      # a queue still for this long on a core saturated in kernel time: the warning
MOVED_WINDOW = 10.0      # ... if it had moved within this long before
MOVED_RUN = 3            # ... at this many readings in a row (a queue with steady traffic, not an idle one)


class Queue(NamedTuple):
    irq: int
    device: str
    queue: int
    cpu: int             # -1: unknown


def parse_queue_counts(text: str) -> dict:
    """irq -> (name, interrupts summed over the cores) for the lines whose name is a
    NIC queue's."""
    return queue_counts(system.parse_interrupts(text))


def queue_counts(parsed: tuple) -> dict:
    cpus, lines = parsed
    out = {}
    for line in lines:
        if not line.irq.isdigit() or len(line.counts) < len(cpus) or \
                not any(p.match(line.name) for p in QUEUE_NAME):
            continue
        out[int(line.irq)] = (line.name, sum(line.counts))
        if len(out) >= QUEUES_MAX:
            break
    return out


def _first_cpu(text: str) -> int:
    first = text.strip().split(",")[0].split("-")[0]
    return int(first) if first.isdigit() else -1


def irq_cpu(irq: int, proc: str = "/proc") -> int:
    """The first CPU serving irq (its effective affinity, else its smp affinity); -1: unknown."""
    text = system.read_irq_affinity(irq, proc, ("effective_affinity_list", "smp_affinity_list"))
    return -1 if text is None else _first_cpu(text)


def virtio_interfaces(sys: str = "/sys") -> dict:
    """virtioK -> the interface it is (SYS/class/net/IFACE/device)."""
    out = {}
    base = f"{sys}/class/net"
    try:
        ifaces = os.listdir(base)
    except OSError:
        return out
    for iface in ifaces[:256]:
        try:
            target = os.path.basename(os.readlink(f"{base}/{iface}/device"))
        except OSError:
            continue
        if target.startswith("virtio"):
            out[target] = iface
    return out


def queues(counts: dict, proc: str = "/proc", sys: str = "/sys") -> dict:
    """irq -> Queue, for parse_queue_counts()'s lines."""
    virtio = None
    out = {}
    for irq, (name, _) in counts.items():
        for p in QUEUE_NAME:
            m = p.match(name)
            if m:
                dev = m["dev"]
                if dev.startswith("virtio"):
                    virtio = virtio_interfaces(sys) if virtio is None else virtio
                    dev = virtio.get(dev, dev)
                out[irq] = Queue(irq, dev, int(m["queue"]), irq_cpu(irq, proc))
                break
    return out


class _State:
    __slots__ = ("count", "moved_at", "run", "moving", "warned")

    def __init__(self, count: int) -> None:
        self.count, self.moved_at, self.run, self.moving, self.warned = count, None, 0, False, False


class Watch:
    """Fed each reading of the queues' counts; update() returns an irq_stalled Event for
    a queue whose count stood still for STALL_SECONDS while its core was saturated in
    kernel time for as long, after moving at MOVED_RUN readings in a row, the last within
    MOVED_WINDOW before: once a stall."""

    def __init__(self) -> None:
        self.state: dict = {}        # irq -> _State

    def update(self, now: float, counts: dict, queue_map: dict, kernel_since: dict) -> list:
        """counts: parse_queue_counts(); queue_map: irq -> Queue; kernel_since: cpu -> when
        its ongoing kernel-time saturation began."""
        events = []
        for irq in [i for i in self.state if i not in counts]:
            del self.state[irq]
        for irq, (_, n) in counts.items():
            st = self.state.get(irq)
            if st is None:
                self.state[irq] = _State(n)
                continue
            if n != st.count:
                st.run = st.run + 1 if st.moving else 1
                st.count, st.moved_at, st.moving, st.warned = n, now, True, False
                continue
            st.moving = False
            q = queue_map.get(irq)
            if q is None or q.cpu < 0 or st.warned or q.cpu not in kernel_since or st.run < MOVED_RUN:
                continue
            since = max(st.moved_at, kernel_since[q.cpu])
            if now - since >= STALL_SECONDS and since - st.moved_at <= MOVED_WINDOW:
                st.warned = True
                events.append(Event(now, "irq_stalled", q.device, "", q.queue, q.cpu,
                                    f"IRQ {irq} of {q.device} queue {q.queue}: no interrupt on cpu{q.cpu} for "
                                    f"{now - st.moved_at:.0f} s while it was saturated in kernel time"))
        return events
