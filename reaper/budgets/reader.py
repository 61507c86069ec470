"""How the budgets read strays: one /proc/PID/stat each (CPU, RSS, name), private
memory when the RSS moved, and each lineage's CPU over the window (lineage.Usage).

A sample reads the awake lineages and the main tree's few processes first (the CPU
they explain of reaper's cgroup: pulse.Pulse.account), then what must be read: every
stray at a sweep, else the new ones and the sleeping ones due (Schedule). A read that
finds a stray's CPU moved wakes its lineage; one that finds it renamed has it judged
again (Book.judge_exec); one that finds it gone drops it (Book.lose). Every dormant
stray is read at a sweep and every pulse.QUIET_MAX seconds (read_dormant). The CPU of
strays that no sample read is counted from what reaper reaped (reaped.py).

Private memory is read exactly (smaps_rollup) above the kinds' exact_above threshold,
and read again, its RSS unmoved, where a stray shares more than the kinds' cow_above
copy-on-write: when the process it shares with frees its copy, those pages are the
stray's alone and nothing it shows moves (issue 33.3; cow_due).
"""
from __future__ import annotations

from reaper.budgets import hops, pulse, reaped
from reaper.procctl import Gone, Handle, NotPermitted
from reaper.procfs.processes import CLK_TCK, read_counters

KEPT_MAX = 64            # main-tree processes read each sample to explain the cgroup's CPU
# Bytes of strays sharing copy-on-write whose private memory is read again per sample:
# a smaps_rollup read walks the page tables, about 10 ms a GiB. More are spread over samples.
COW_READ_MAX = 1 << 30


class Reader:
    def __init__(self, cfg, stats, scope, kinds: list, act, book, schedule, reaped, now: float) -> None:
        self.cfg = cfg
        self.stats = stats
        self.scope = scope
        self.act = act
        self.book = book
        self.schedule = schedule
        self.reaped = reaped                     # reaped.ReapedCPU where reaper reaps the orphans
        # Private memory above this is read exactly (Kind.exact_above: the memory budget's).
        self.exact_above = next((x for x in (k.exact_above() for k in kinds) if x is not None), None)
        # A stray sharing more than this copy-on-write is read again each sample (Kind.cow_above).
        self.cow_above = next((x for x in (k.cow_above() for k in kinds) if x is not None), None)
        self.cow_seq = 0                         # the sample cow_bytes counts
        self.cow_bytes = 0                       # RSS of the sharers met at that sample
        self.cow_period = 1                      # samples the sharers' reads are spread over
        self.kept: dict = {}                     # (pid, start) -> CPU ticks: main-tree processes read each sample
        self.dormant_read = now                  # when every dormant stray was last read

    def keep_main(self, kept) -> None:
        """The main-tree processes read each sample (if few): their CPU is not a stray's."""
        if kept is None or len(kept) > KEPT_MAX:
            self.kept = {}
            return
        procs, old = self.book.table.procs, self.kept
        self.kept = {}
        for pid in kept:
            p = procs.get(pid)
            if p is not None and pid != self.scope.pid:
                key = (pid, p.start)
                self.kept[key] = old.get(key)

    def read_awake(self, now: float) -> float:
        """Reads the members of the awake lineages and the main tree's few processes;
        the CPU seconds of those also read at the last sample (the cgroup's CPU they
        explain: pulse.Pulse.account)."""
        explained = 0
        for key, ticks in list(self.kept.items()):
            c = read_counters(*key)
            if c is None:
                del self.kept[key]
                continue
            if ticks is not None:
                explained += c.cpu - ticks
            self.kept[key] = c.cpu
        explained /= CLK_TCK
        tracked = self.book.tracked
        for a in list(self.schedule.awake.values()):
            for key, t in list(a.members.items()):
                if tracked.get(key) is t:
                    explained += self.read(key, t, now)
        return explained

    def measure(self, now: float, rescanned: bool) -> None:
        """The strays not read yet this sample that must be: every one at a sweep, else
        the new ones and the sleeping ones due. Then each lineage read: its CPU."""
        book, schedule = self.book, self.schedule
        swept, seq = schedule.swept, schedule.seq
        if swept or now - self.dormant_read >= pulse.QUIET_MAX:
            self.read_dormant(now)
        tracked = book.tracked
        if swept:
            for key, t in list(tracked.items()):
                if t.read_seq != seq:
                    self.read(key, t, now)
            schedule.clear_resting()
        else:
            for t in schedule.take_fresh():
                if t.read_seq == 0 and tracked.get(t.key) is t:
                    self.read(t.key, t, now)           # new since the last sample
            awake = schedule.awake
            for key in schedule.due_now(now):
                t = tracked.get(key)
                if t is not None and t.read_seq != seq and id(t.acct) not in awake:
                    self.read(key, t, now)
        schedule.take_fresh()
        self.count_reaped(rescanned)
        book.regrouped()
        schedule.wake_due(now)
        cfg = self.cfg
        for a in list(schedule.awake.values()):
            if not a.members:
                continue
            if all(t.read_seq == seq for t in a.members.values()):
                self.count_waited(a)
            stopped = a.duty.stopped(now) if a.duty is not None else 0.0
            a.use.add(now, a.cpu(), now - a.since - stopped, cfg.budget_window, cfg.budget_interval)

    def read(self, key, t, now: float) -> float:
        """One read of a stray (its stat; statm only when its RSS moved): its CPU and
        private memory; its lineage is awake if its CPU moved. The CPU seconds it used
        since the last sample if it was read then, else 0."""
        if t.refused is not None and t.refused.what == "read":
            return 0.0
        seq = self.schedule.seq
        last, t.read_seq = t.read_seq, seq
        try:
            c = t.handle.read()
        except Gone:
            self.book.lose(key, t, now)
            return 0.0
        except NotPermitted as e:
            self.act.refuse(t, e)
            return 0.0
        except OSError as e:
            self.act.once("fail-read", f"cannot read the CPU time of stray {key[0]} ({t.comm}): "
                                       f"{e.strerror}; it is skipped while this lasts", "warn")
            return 0.0
        if c.comm != t.comm and not self.book.judge_exec(key, t, c.comm, now):
            return 0.0
        cow = c.rss == t.rss and self.cow_due(t)
        if c.rss != t.rss or cow:
            mem = t.use.mem
            try:
                # A sharer's exact figure at once (its statm counts what it shares).
                t.use.mem, unshared = t.handle.memory(exact_above=0 if cow else self.exact_above)
                t.use.cow = unshared - t.use.mem
            except (Gone, OSError):
                t.use.mem, t.use.cow = None, 0  # gone: dropped at the next sample
            if c.rss != t.rss or t.use.mem != mem:
                self.book.changed()
            t.rss = c.rss
        cpu = c.cpu / CLK_TCK
        if t.last_cpu is None:
            # A stray born since the last sample has used nothing but as one (0 at its fork).
            t.base = t.last_cpu = 0.0 if t.newborn else cpu
        elif t.read_at is not None:
            t.prev = (t.read_at, t.last_cpu)
        used = max(0.0, cpu - t.last_cpu)
        self.stats.stray_cpu_seconds += used
        waited = c.reaped / CLK_TCK
        moved = cpu != t.last_cpu or c.state == "R" or waited != t.waited_at
        t.waited_at = waited
        if t.waited0 is None:
            t.waited0 = (waited, t.carried)     # what it reaped before its first read is not counted
        t.last_cpu, t.read_at, t.read_boot = cpu, now, self.book.boot
        if t.pred is not None:
            hops.count_unseen(self.stats, t, self.reaped is None)
        p = self.book.table.procs.get(key[0])
        if p is not None:
            t.ppid = p.ppid                     # who reaps it: reaped.ReapedCPU.gone
        if moved or last == 0:
            self.schedule.wake(t.acct)
        return used if last == seq - 1 else 0.0

    def cow_due(self, t) -> bool:
        """t shares more than cow_above copy-on-write: its private memory is read again,
        its RSS unmoved (a sharer may have freed its copy). At every sample, or once in
        as many samples as the sharers' RSS together needs COW_READ_MAX per sample."""
        floor = self.cow_above
        if floor is None or t.use.cow <= floor:
            return False
        seq = self.schedule.seq
        if seq != self.cow_seq:
            self.cow_period = max(1, -(-self.cow_bytes // COW_READ_MAX))
            self.cow_seq, self.cow_bytes = seq, 0
        self.cow_bytes += t.rss or 0
        return (seq + t.key[0]) % self.cow_period == 0

    def count_waited(self, a) -> None:
        """The CPU of the children a's members waited for that no read counted (reaped.waited),
        in a's CPU and the stats. Every member was read at this sample: a child found gone
        is carried to its parent in the same sample as the parent's cutime is read."""
        for t in a.members.values():
            unseen = reaped.waited(t)
            if unseen:
                a.gone_cpu += unseen
                self.stats.stray_cpu_seconds += unseen

    def read_dormant(self, now: float) -> None:
        """One read of every dormant stray: one whose CPU moved (or that runs) is tracked
        again and read as such (it wakes); one gone is dropped as a tracked one would be;
        one whose RSS alone moved has its private memory read again."""
        self.dormant_read = now
        book = self.book
        for d in book.dormant.values():
            key = d.key
            c = read_counters(*key)
            if c is not None and c.state not in ("Z", "X") and c.cpu / CLK_TCK == d.last_cpu and c.state != "R" \
                    and c.comm == d.comm:
                if c.rss != d.rss:
                    self._remeasure(d, c.rss)
                continue
            t = book.thaw(key, "" if c is None or c.state in ("Z", "X") else "its CPU moved, or it runs")
            if book.tracked.get(key) is t:
                self.read(key, t, now)

    def _remeasure(self, d, rss: int) -> None:
        """A dormant stray's private memory, read again because its RSS moved; one now
        over its memory budget, or sharing more than cow_above copy-on-write, is tracked
        again, to be judged (and read every sample while it shares)."""
        try:
            mem, unshared = Handle.unchecked(*d.key).memory(exact_above=self.exact_above)
        except (Gone, OSError):
            mem = unshared = None
        self.book.remeasured(d.key, rss, mem)
        if mem is None or unshared is None:
            return
        over = self.cfg.memory_budget is not None and mem > self.cfg.memory_budget
        if over or (self.cow_above is not None and unshared - mem > self.cow_above):
            t = self.book.thaw(d.key, "over its memory budget" if over else "it shares much copy-on-write")
            t.use.cow = unshared - mem
            self.schedule.wake(t.acct)

    def count_reaped(self, rescan: bool) -> None:
        """What reaper reaped of strays that no sample read (reaped.py)."""
        r = self.reaped
        if r is None:
            return
        scope = self.scope
        kept = {scope.main_pid, *scope.supervised}
        r.read_others(self.book.table, scope.pid, self.book.known, kept, rescan)
        self.stats.stray_cpu_seconds += r.count()
