"""Budgets for strays: sample, track, act; each budget kind judges (kinds/).

Every --budget-interval the enforcer reads the strays that may have changed (one
/proc/PID/stat each: CPU, RSS, name; private memory when the RSS moved), lists /proc
for new strays (strays.py) when a pid was handed out, and averages the CPU over
--budget-window (Usage). Lineages whose CPU did not move for a window sleep: read
again when reaper's cgroup's counters say something nobody read ran (pulse.py), or
every pulse.QUIET_MAX seconds. Then each budget kind that is on
(kinds/: cpu, memory, age, in that order) judges which strays are over its budget
past their --budget-grace and responds through the enforcer's actions, as far as
--budget-action goes, each step including the ones before it:

    observe    one log line per violation, metrics
    nice       nice 19 and SCHED_IDLE (and --stray-cpus affinity)
    throttle   a hard cap: a cgroup of reaper's own, else SIGSTOP/SIGCONT duty-cycling
    terminate  SIGTERM (CPU: after --budget-kill-after seconds over budget; memory: at
               once), SIGKILL after --grace

--stray-max-age sends SIGTERM whatever the action but observe. The enforcer keeps
what every kind shares: the strays it tracks (Tracked, pinned against pid reuse by
procctl.Handle), their lineages (lineage.py: a stray's descendants share its
account, so that a fork that lets its parent exit starts no grace, age or CPU
afresh; hops.py: what a lineage does between samples), their measures, the cgroups
they must stay in (escapes.py), the duty cycle that stops and resumes them, the
SIGTERM and its SIGKILL, and the counts. Actions are counted by reason (a kind's
reason, or "any"). At start, the empty stray cgroups of reapers that are gone are
removed (cleanup.py).

A stray reaper may not act on (another user's: EPERM, EACCES) is named once,
counted in actions["not_permitted"] and left alone from then on; the others are
held to their budget all the same. No ordinary OS fault escapes tick() or
close(), and close() resumes every stray it stopped whatever failed before.
"""
from __future__ import annotations

import os
import time
from collections import deque

# _heapq: heapq's C functions without heapq.py (its pure-Python fallbacks cost PID 1 memory).
from _heapq import heappop, heappush, heappushpop
# _signal: the numbers and pidfd_send_signal without the enum module (start-up time and memory).
import _signal as signal

from reaper.budgets import cleanup, dormant, escapes, hops, pulse
from reaper.budgets.cgroupfs import read_proc_cgroup
from reaper.budgets.kinds import ANY, REASONS, load as load_kinds
from reaper.budgets.lineage import Account, Ghost, Linker, Tracked, Usage, boot_ticks, hop_from, join, lineages, \
    read_groups
from reaper.procctl import Gone, Handle, NotPermitted, pidfds_work
from reaper.budgets.strays import KNOWN, Finder
from reaper.budgets.throttle import DutyCycler
from reaper.procfs.processes import CLK_TCK, ProcTable, read_counters
from reaper.stats import TOP_STRAYS

__all__ = ["Enforcer", "Tracked", "Usage", "LEVELS"]

LEVELS = {"observe": 0, "nice": 1, "throttle": 2, "terminate": 3}
KEPT_MAX = 64            # main-tree processes read each sample to explain the cgroup's CPU


class Enforcer:
    name = "budget"

    def __init__(self, cfg, log, stats, scope, reaped=None) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.scope = scope
        self.level = LEVELS[cfg.budget_action]
        self.table = ProcTable()
        self.finder = Finder(cfg, scope)
        self.linker = Linker()
        self.tracked: dict = {}
        self.emptied: list = []                  # accounts that lost a member: retired once empty
        self.late_gone: list = []                # members found gone after this sample's linking
        self.recent_gone: list = []              # members gone at the last sample
        self.ghosts: dict = {}                   # key -> Ghost: strays of this sample gone before pinned
        self.hop_seen: set = set()               # reaper's children looked at for hops since the sample
        self.owners: dict | None = None          # cgroup directory -> its lineage, this sample (_leaf_owner)
        self.accounts: list = []                 # the lineages of this sample (lineages())
        self.unlinked: list = []                 # last sample's new fork-copies of no lineage (_late_hops)
        self.unpinnable: set = set()             # keys of this sample's strays gone before pinned
        self.retiring: list = []                 # lineages empty at the last sample: retired if still empty
        self.cgroup_data: dict = {}              # pid -> /proc/PID/cgroup, read this sample
        self.prev_sample: float | None = None
        self.boot = 0                            # boot ticks at this sample's scan
        self.duty = DutyCycler()
        self.reaped = reaped                     # reaped.ReapedCPU where reaper reaps the orphans
        self.watch = bool(getattr(scope, "watch", False))
        self.said: set = set()                   # things said once
        self.unpinned: set = set()               # keys of strays reaper may not even read
        self.refusals: list = []                 # (what, pid, comm, strerror) not said yet
        self.next_sample = time.monotonic()      # first sample right away
        budgets = [b for b in (cfg.memory_budget, cfg.memory_budget_total) if b is not None]
        self.pulse = pulse.Pulse(min(budgets) // 4 if budgets else None)   # the cheap triggers (pulse.py)
        self.seq = 0                             # samples so far
        self.last_scan = float("-inf")           # when /proc was last listed
        self.swept = True                        # this sample reads every stray
        self.awake: dict = {}                    # id(account) -> account: its members read every sample
        self.resting: deque = deque()            # (due, key): sleeping strays, read by QUIET_MAX at the latest
        self.age_due: list = []                  # heap (since + max age, n, account or dormant key)
        self.kept: dict = {}                     # (pid, start) -> CPU ticks: main-tree processes read each sample
        self.dormant = dormant.Records()         # key -> dormant.Dormant: sleeping strays kept small
        self.dormant_top: list | None = None     # those holding most memory (_dormant_rows), until one changes
        self.dormant_read = time.monotonic()     # when every dormant stray was last read
        self.scan_boots = (0, 0)                 # boot ticks of the last two scans: when dormant strays were seen
        # Budgets of all strays together judge every lineage at every sample: nothing sleeps small then.
        self.small = cfg.cpu_budget_total is None and cfg.memory_budget_total is None
        self.known = dormant.Known(self)
        self.age_n = 0                           # tie-breaker of age_due's entries
        self.regroup = True                      # a member came or went: the lineages are listed again
        self.fresh: list = []                    # strays tracked since the last sample: read at once
        self.rescanned = False                   # this sample listed /proc
        self.rows_changed = True                 # the stray list is made again
        self.kinds = [kind(self) for kind in load_kinds(cfg)]   # the budgets that are on, in order
        self.cpus = None
        if cfg.stray_cpus is not None:           # stray_cpus.py (and values.py) loaded only then
            self._confine(cfg.stray_cpus)
        self._remove_stale_cgroups()
        if not pidfds_work():
            self.once("nopidfd", "no pidfd support: signals to strays go through kill() "
                                 "after a start-time check")
        self.log.debug(f"budgets on: per stray {cfg.cpu_budget}, total {cfg.cpu_budget_total}, "
                       f"memory {cfg.memory_budget}, {cfg.memory_budget_total}, max age {cfg.stray_max_age}, "
                       f"action {cfg.budget_action}, every {cfg.budget_interval:g}s")

    def _confine(self, spec: str) -> None:
        """The CPUs of --stray-cpus; never fatal: affinity left alone."""
        try:
            from reaper.budgets import stray_cpus

            self.cpus, msg = stray_cpus.resolve(spec)
            if msg:
                self.log.info(msg)
        except Exception as e:
            self.log.warn(f"--stray-cpus {spec}: {e}; affinity left alone")

    def _remove_stale_cgroups(self) -> None:
        """The stray cgroups of reapers that are gone (cleanup.py); never fatal."""
        try:
            removed, kept = cleanup.remove_stale()
        except Exception as e:               # a surprise here must not keep budgets off
            self.log.warn(f"could not look for stale stray cgroups: {e!r}")
            return
        self.stats.stale_cgroups_removed += len(removed)
        if removed:
            self.log.info(f"removed {len(removed)} stray cgroup(s) left by reapers that are gone: "
                          f"{', '.join(removed[:5])}{' ...' if len(removed) > 5 else ''}")
        if kept:
            self.log.warn(f"stray cgroup(s) left by reapers that are gone still hold processes, "
                          f"left in place: {', '.join(kept[:5])}{' ...' if len(kept) > 5 else ''}")

    # --- Plugin protocol ---------------------------------------------------

    def next_deadline(self) -> float | None:
        due = self.duty.next_deadline()
        return self.next_sample if due is None else min(due, self.next_sample)

    def tick(self, now: float) -> None:
        try:
            if now >= self.next_sample:
                self.next_sample += self.cfg.budget_interval
                if self.next_sample <= now:
                    self.next_sample = now + self.cfg.budget_interval
                self.sample(now)
            if self.duty.members and self.draining:
                self.duty.close(now)        # reaper drains everything: nothing may stay stopped
                for t in self.tracked.values():
                    t.cycled = False
        finally:
            # Whatever the sample met, the duty cycle moves on: its deadline must not stay behind.
            self.duty.step(time.monotonic())
            if self.duty.lost:
                hops.catch(self, self.duty.take_lost())
            self._take_duty_faults()
            self._say_refusals()

    def close(self) -> None:
        now = time.monotonic()
        try:
            self.duty.close(now)            # every stopped stray resumed, whatever failed before
            self._count_final()
        finally:
            self._take_duty_faults()
            self._say_refusals()
            for kind in self.kinds:
                kind.closing()
            self._remove_cgroups()
            for t in self.tracked.values():
                t.handle.close()
            self.tracked.clear()

    def _count_final(self) -> None:
        """At the end (the drain is over): the CPU of the strays reaped since the last sample."""
        if self.reaped is None:
            return
        reapers = self.finder.reapers()
        for key in [k for k in self.dormant if not self.tracked_alive(k)]:
            self.thaw(key)
        for key, t in list(self.tracked.items()):
            if not self.tracked_alive(key):
                self.reaped.gone(t, self.known, {}, reapers)
        self.stats.stray_cpu_seconds += self.reaped.count()

    def _cgroups(self) -> list:
        """The cgroup holders the kinds made, in the kinds' order."""
        return [kind.cgroup for kind in self.kinds if kind.cgroup is not None]

    def _remove_cgroups(self) -> None:
        left = []
        for cg in self._cgroups():
            try:
                left += cg.close()
            except OSError as e:
                left.append(f"{cg.base} ({e.strerror})")
        if left:
            self.log.warn(f"could not remove cgroup(s) {', '.join(left)}")

    def v2_taken(self) -> bool:
        """A kind holds a cgroup of the v2 hierarchy: a process is in one cgroup of it only,
        so the first kind to need v2 takes it and the others use v1 or fall back."""
        return any(cg.version == 2 for cg in self._cgroups())

    # --- one sample ----------------------------------------------------------

    def once(self, key: str, msg: str, level: str = "info") -> None:
        """msg, the first time key is said."""
        if key not in self.said:
            self.said.add(key)
            getattr(self.log, level)(msg)

    @property
    def draining(self) -> bool:
        # The supervisor's phase (pause mode has no main child at all).
        return not getattr(self.scope, "watch", False) and getattr(self.scope, "phase", "running") != "running"

    def sample(self, now: float) -> None:
        """One sample. /proc is listed (the scan: new strays, gone ones) when a pid was
        handed out, when the cgroup's CPU says something nobody read ran, and every
        pulse.SCAN_EVERY seconds; every stray is read when that CPU adds up
        (pulse.QUIET_CPU: a sweep). Otherwise only the awake lineages are read (those
        whose CPU moved within the window, held, over, or being terminated) and the
        sleeping strays that are due (pulse.QUIET_MAX)."""
        boot = self.boot = boot_ticks()          # before the scan: whatever starts later is new
        self.seq += 1
        self.cgroup_data = {}
        explained = self._read_awake(now)
        self.swept = self.pulse.account(explained) or self.draining
        forked = self.pulse.forked()
        # --stray-match: a process may exec into a match at any time, forking nothing.
        if self.swept or forked or self.cfg.stray_match or now - self.last_scan >= pulse.SCAN_EVERY:
            self.last_scan = now
            self._scan(now, boot)
        self._measure(now)
        if self.swept:
            self.pulse.swept()
        self.stats.samples += 1
        self.stats.strays = len(self.tracked) + len(self.dormant)
        if self.draining:
            # reaper drains everything now: resume what is stopped and stand back.
            self.duty.close(now)
            for t in self.tracked.values():
                t.cycled = False
            self._publish()
            return
        escapes.hold(self, now)
        self._pin(now)
        for kind in self.kinds:
            kind.judge(now)
        self._follow_up(now)
        self._rest(now)
        self.prev_sample = now
        self._publish()

    def _scan(self, now: float, boot: int) -> None:
        """Lists /proc: the strays found, those gone, the new ones tracked and linked."""
        self.table.refresh(now, self.finder.reapers())
        found = self.finder.find(self.table, self.known)

        gone, self.late_gone = self.late_gone, []
        for key in self.dormant:
            why = found.get(key, False)
            if why is False:                 # gone, or no longer a stray: dropped as a tracked one
                self._drop_gone(self.thaw(key), now, gone)
            elif why is not KNOWN:
                d = self.dormant.get(key)
                if self.finder.verdict(key) != (d.comm, d.cmdline):
                    self.thaw(key, "it exec'd")  # judged as a tracked one
        self.scan_boots = (self.scan_boots[1], boot)     # the dormant strays left were seen now
        for key in [k for k in self.tracked if k not in found]:
            self._drop_gone(self.tracked[key], now, gone)
        self.unpinned &= found.keys()
        self._late_hops(gone)
        new = []
        for key, why in found.items():
            t = self.tracked.get(key)
            if t is not None:
                if why is not KNOWN:
                    t.comm, t.cmdline = self.finder.verdict(key)    # it may have exec'd since
                t.seen_before, t.seen_boot = t.seen_boot, boot
            elif key not in self.unpinned and key not in self.dormant:
                new.append(key)
        # A hop's parent may have vanished a sample before it is seen: the members gone
        # at the last sample count too, after this sample's.
        self.ghosts, self.unpinnable, self.hop_seen, self.owners = {}, set(), set(), None
        new.sort(key=lambda k: k[1])         # the oldest first: parents before children
        for key in new:
            self._track(key, self.finder.stray(key, found[key], self.table), now, (gone, self.recent_gone))
        self.finder.settled(self.known)
        self.recent_gone = gone
        if self.regroup:
            self.linker.prune(self.tracked)
        self._retire()
        self.linker.prev_boot = boot
        self._keep_main(self.finder.kept)
        self.rescanned = True

    def _drop_gone(self, t: Tracked, now: float, gone: list) -> None:
        """t, not found by this scan, is no longer tracked; if it ended, it is among the
        members gone (a hop of it may yet appear)."""
        self.tracked.pop(t.key)
        alive = self.tracked_alive(t.key)
        self._drop(t, now, alive)
        if not alive:
            gone.append(t)

    def _keep_main(self, kept) -> None:
        """The main-tree processes read each sample (if few): their CPU is not a stray's."""
        if kept is None or len(kept) > KEPT_MAX:
            self.kept = {}
            return
        procs, old = self.table.procs, self.kept
        self.kept = {}
        for pid in kept:
            p = procs.get(pid)
            if p is not None and pid != self.scope.pid:
                key = (pid, p.start)
                self.kept[key] = old.get(key)

    def _read_awake(self, now: float) -> float:
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
        for a in list(self.awake.values()):
            for key, t in list(a.members.items()):
                if self.tracked.get(key) is t:
                    explained += self.read(key, t, now)
        return explained

    def _measure(self, now: float) -> None:
        """The strays not read yet this sample that must be: every one at a sweep, else
        the new ones and the sleeping ones due. Then each lineage read: its CPU."""
        if self.swept or now - self.dormant_read >= pulse.QUIET_MAX:
            dormant.read_all(self, now)
        if self.swept:
            for key, t in list(self.tracked.items()):
                if t.read_seq != self.seq:
                    self.read(key, t, now)
            self.resting.clear()
        else:
            for t in self.fresh:
                if t.read_seq == 0 and self.tracked.get(t.key) is t:
                    self.read(t.key, t, now)           # new since the last sample
            q = self.resting
            while q and q[0][0] <= now:
                _, key = q.popleft()
                t = self.tracked.get(key)
                if t is not None and t.read_seq != self.seq and id(t.acct) not in self.awake:
                    self.read(key, t, now)
        self.fresh = []
        self._count_reaped(self.rescanned)
        self.rescanned = False
        if self.regroup:
            self.accounts = lineages(self.tracked.values())
            self.regroup = False
            self.rows_changed = True
        self._wake_aged(now)
        cfg = self.cfg
        for a in list(self.awake.values()):
            if not a.members:
                continue
            stopped = a.duty.stopped(now) if a.duty is not None else 0.0
            a.use.add(now, a.cpu(), now - a.since - stopped, cfg.budget_window, cfg.budget_interval)

    def read(self, key, t: Tracked, now: float) -> float:
        """One read of a stray (its stat; statm only when its RSS moved): its CPU and
        private memory; its lineage is awake if its CPU moved. The CPU seconds it used
        since the last sample if it was read then, else 0."""
        if t.refused is not None and t.refused.what == "read":
            return 0.0
        seq, t.read_seq = t.read_seq, self.seq
        try:
            c = t.handle.read()
        except Gone:
            self._lose(key, t, now)
            return 0.0
        except NotPermitted as e:
            self.refuse(t, e)
            return 0.0
        except OSError as e:
            self.once("fail-read", f"cannot read the CPU time of stray {key[0]} ({t.comm}): "
                                   f"{e.strerror}; it is skipped while this lasts", "warn")
            return 0.0
        if c.comm != t.comm and not self._judge_exec(key, t, c.comm, now):
            return 0.0
        if c.rss != t.rss:
            t.rss = c.rss
            try:
                t.use.mem = t.handle.private_memory(exact_above=self.cfg.memory_budget)
            except (Gone, OSError):
                t.use.mem = None                # gone: dropped at the next sample
            self.rows_changed = True
        cpu = c.cpu / CLK_TCK
        if t.last_cpu is None:
            # A stray born since the last sample has used nothing but as one (0 at its fork).
            t.base = t.last_cpu = 0.0 if t.newborn else cpu
        elif t.read_at is not None:
            t.prev = (t.read_at, t.last_cpu)
        used = max(0.0, cpu - t.last_cpu)
        self.stats.stray_cpu_seconds += used
        moved = cpu != t.last_cpu or c.state == "R"
        t.last_cpu, t.read_at, t.read_boot = cpu, now, self.boot
        if t.pred is not None:
            hops.count_unseen(self.stats, t, self.reaped is None)
        p = self.table.procs.get(key[0])
        if p is not None:
            t.ppid = p.ppid                     # who reaps it: reaped.ReapedCPU.gone
        if moved or seq == 0:
            self.wake(t.acct)
        return used if seq == self.seq - 1 else 0.0

    def thaw(self, key, why: str = "") -> Tracked:
        """Dormant stray key as a tracked one again (dormant.thaw), read at the next sweep
        or by pulse.QUIET_MAX, and woken by what reads it. why: said (-vv) if given."""
        d = self.dormant.pop(key)
        self.dormant_top = None
        if why:
            self.log.debug(f"stray {key[0]} ({d.comm}) tracked again: {why}")
        t = dormant.thaw(d, Handle.unchecked(*key), self.kinds, self.scan_boots[1], self.scan_boots[0])
        self.tracked[key] = t
        self.resting.append((time.monotonic() + pulse.QUIET_MAX, key))
        self.regroup = True
        return t

    def _say_asleep(self) -> None:
        self.once("rest", f"strays asleep: read again when the cgroup's CPU says so "
                          f"({self.pulse.file or 'not readable: at every sample'}), "
                          f"or every {pulse.QUIET_MAX:g}s", "debug")

    def _sleep_small(self, a: Account) -> None:
        """a's only member as a dormant record; a is let go (its age is the record's)."""
        self._say_asleep()
        t = a.first()
        del self.tracked[t.key]
        self.dormant.put(t)
        self.dormant_top = None
        a.members.clear()
        t.handle.close()
        self.regroup = True
        self._due_age(a.since, t.key)

    def _due_age(self, since: float, what) -> None:
        """what (an account, or a dormant stray's key) is judged when past --stray-max-age."""
        limit = self.cfg.stray_max_age
        if limit is not None:
            self.age_n += 1
            heappush(self.age_due, (since + limit, self.age_n, what))

    def _judge_exec(self, key, t: Tracked, comm: str, now: float) -> bool:
        """t exec'd (or renamed itself): judged again at once, before any budget acts on
        it, and listed again at the next sample. False if it is no longer a stray (a
        --protect'ed or Ray's program now): dropped, left alone."""
        self.finder.forget(key)
        self.last_scan = float("-inf")
        verdict = self.finder.judge_now(key, comm)
        if verdict is not None:
            t.comm, t.cmdline = verdict
            return True
        if self.tracked.get(key) is t:
            del self.tracked[key]
            self._drop(t, now, alive=self.tracked_alive(key))
        return False

    def _lose(self, key, t: Tracked, now: float) -> None:
        """A stray found gone at its read."""
        if self.tracked.get(key) is t:
            self._drop(self.tracked.pop(key), now, alive=False)
            self.late_gone.append(t)

    def wake(self, a: Account) -> None:
        if id(a) not in self.awake:
            self.awake[id(a)] = a
            self.rows_changed = True

    def _wake_aged(self, now: float) -> None:
        """The sleeping lineages past --stray-max-age (or about to be): judged now."""
        limit = self.cfg.stray_max_age
        if limit is None:
            return
        h = self.age_due
        while h and h[0][0] <= now + self.cfg.budget_interval:
            a = heappop(h)[2]
            if isinstance(a, tuple):
                if a not in self.dormant:
                    continue
                a = self.thaw(a, "past --stray-max-age").acct
            if a.members:
                self.wake(a)

    def _rest(self, now: float) -> None:
        """The awake lineages that have not moved for a whole window, are past their
        grace and are held, over or terminated by nothing: read again when the
        cgroup's CPU says so (a sweep) or by pulse.QUIET_MAX."""
        if self.draining:
            return
        due = now + pulse.QUIET_MAX
        for aid, a in list(self.awake.items()):
            if not a.members:
                del self.awake[aid]
                continue
            if not self._sleeping(a, now):
                continue
            del self.awake[aid]
            self._say_asleep()
            a.use.rest(now, self.cfg.budget_window, a.since)
            if dormant.may_keep(self, a):
                self._sleep_small(a)
                continue
            for key in a.members:
                self.resting.append((due, key))
            if self.cfg.stray_max_age is not None and now - a.since < self.cfg.stray_max_age:
                self._due_age(a.since, a)

    def _sleeping(self, a: Account, now: float) -> bool:
        if a.use.rate != 0.0 or (self.cpus is not None and now - a.since < self.cfg.budget_grace):
            return False
        if a.duty is not None or a._terms or (self.cfg.stray_max_age is not None
                                             and now - a.since >= self.cfg.stray_max_age):
            return False
        for s in a.kinds.values():
            if getattr(s, "over", False) or getattr(s, "cycling", False) or getattr(s, "leaf", None):
                return False
        for t in a.members.values():
            if t.term_at is not None or t.cycled or t.read_at != now or (self.cpus is not None and not t.pinned):
                return False
        return True

    def _count_reaped(self, rescan: bool) -> None:
        """What reaper reaped of strays that no sample read (reaped.py)."""
        r = self.reaped
        if r is None:
            return
        scope = self.scope
        kept = {scope.main_pid, *getattr(scope, "supervised", ())}
        r.read_others(self.table, scope.pid, self.known, kept, rescan)
        self.stats.stray_cpu_seconds += r.count()

    def _track(self, key, stray, now: float, gone: tuple) -> None:
        groups = read_groups(*key)
        known = self.known
        try:
            handle = Handle(*key)
        except Gone:
            # Gone between the scan and now: its descendants seen in this scan, or forked
            # since, still belong to its lineage.
            self.unpinnable.add(key)
            acct, _, _ = self.linker.find(stray, groups, self.table, known, gone, self.finder.reapers(),
                                          lambda: None, self.unpinnable)
            if acct is not None and groups is not None:
                self.ghosts[key] = ghost = Ghost(key, acct, groups, stray.cmdline, self.boot)
                gone[0].append(ghost)
            return
        except NotPermitted as e:
            self.unpinned.add(key)                  # not pinned again every sample
            self.refusals.append((e.what, key[0], stray.comm, e.strerror))
            self.count("not_permitted", ANY)
            return
        acct, rule, via = self.linker.find(stray, groups, self.table, known, gone, self.finder.reapers(),
                                           lambda: self._leaf_owner(key[0]), self.unpinnable)
        prev = self.linker.prev_boot
        t = Tracked(key, stray, handle, now, self.kinds, acct, groups, prev is not None and key[1] >= prev)
        t.seen_boot = self.boot
        self.tracked[key] = t
        self.regroup = True
        self.linker.note(t)
        self.stats.strays_seen += 1
        if acct is None and not (groups is not None and groups[2] and t.newborn) and self._sleeps_at_once(t, now):
            self.log.debug(f"stray {key[0]} ({stray.comm}): {stray.reason}")
            return
        self.fresh.append(t)
        if rule == "parent" and isinstance(via, Tracked):
            t.placed = dict(via.placed)      # forked inside its parent's cgroups, if the parent was in them
        elif acct is not None and t.newborn:
            t.pred = via if rule == "hop" and isinstance(via, Tracked) else hops.predecessor(t, gone[0] + gone[1])
        if acct is None and groups is not None and groups[2] and t.newborn:
            self.unlinked.append(t)          # a fork-copy of no lineage: a sample to find it one
        self.log.debug(f"stray {key[0]} ({stray.comm}): {stray.reason}"
                       + (f", lineage of {acct.root[0]} ({rule})" if acct is not None else ""))

    def _sleeps_at_once(self, t: Tracked, now: float) -> bool:
        """A new stray in a lineage of its own is read at once and kept dormant, if plain
        (dormant.may_keep): thousands that appear together never cost a tracked stray each.
        A busy one is woken at the next sweep: its CPU is what nobody read (pulse.py)."""
        if self.draining or not dormant.may_keep(self, t.acct):
            return False
        self.read(t.key, t, now)
        if self.tracked.get(t.key) is not t:
            return True                      # gone at its read: dropped already
        if t.acct.members and dormant.may_keep(self, t.acct):
            self.awake.pop(id(t.acct), None)
            self._sleep_small(t.acct)
            return True
        return False

    def _late_hops(self, gone: list) -> None:
        """A fork-copy that opened a lineage of its own at the last sample, while the member
        it hopped from still lived (descheduled between its fork and its exit, or waiting
        on purpose): if that member is gone now, the new one joins its lineage."""
        unlinked, self.unlinked = self.unlinked, []
        for t in unlinked:
            if self.tracked.get(t.key) is not t or len(t.acct.members) != 1:
                continue
            g = hop_from(t.key[1], t.cmdline, t.groups, (gone,), lambda g: g.seen_before)
            if g is None or g.acct is t.acct:
                continue
            self.emptied.append(t.acct)
            join(t, g.acct)
            self.linker.note(t)
            self.log.debug(f"stray {t.key[0]} ({t.comm}): lineage of {g.acct.root[0]} (hop, a sample late)")

    def _retire(self) -> None:
        """The lineages left without a member for a whole sample (a hop may still join
        them: Linker.find): what holds them is let go (kinds' retire)."""
        for a in {id(a): a for a in self.retiring}.values():
            if not a.members:
                for kind in self.kinds:
                    kind.retire(a)
        self.retiring = [a for a in self.emptied if not a.members]
        self.emptied = []

    def proc_cgroup(self, pid: int) -> bytes | None:
        """/proc/PID/cgroup, read once a sample."""
        if pid not in self.cgroup_data:
            self.cgroup_data[pid] = read_proc_cgroup(pid)
        return self.cgroup_data[pid]

    def _leaf_owner(self, pid: int) -> Account | None:
        """The lineage whose own cgroup pid is in; read only while reaper holds such cgroups."""
        if self.owners is None:              # once a sample: the kinds make cgroups after the linking
            self.owners = {}
            for a in lineages(self.tracked.values()):
                for kind in self.kinds:
                    d = kind.leaf_of(a)
                    if d is not None:
                        self.owners[d] = None if d in self.owners else a   # a cgroup of several: nobody's
        owners = self.owners
        if not owners:
            return None
        data = self.proc_cgroup(pid)
        for kind in self.kinds:
            if kind.cgroup is not None:
                a = owners.get(kind.cgroup.dir_of(data))
                if a is not None:
                    return a
        return None

    def tracked_alive(self, key) -> bool:
        from reaper.procfs.processes import read_stat

        st = read_stat(key[0])
        return st is not None and st[1] == key[1] and st[3] not in ("Z", "X")

    def lineages(self) -> list:
        """The lineages the kinds judge at this sample (lineage.Account): every one at
        a sweep or where a budget of all strays together is on, else the awake ones
        (a sleeping lineage is over no budget, and its figures have not moved)."""
        cfg = self.cfg
        if self.swept or cfg.cpu_budget_total is not None or cfg.memory_budget_total is not None:
            return self.accounts
        return [a for a in self.awake.values() if a.members]

    def eligible_lineages(self, now: float) -> list:
        """The lineages past their --budget-grace whose CPU use is measured."""
        return [a for a in self.lineages() if now - a.since >= self.cfg.budget_grace and a.use.rate is not None]

    def eligible(self, now: float) -> list:
        """The strays whose lineage is past its --budget-grace and has its CPU use measured."""
        return [t for a in self.eligible_lineages(now) for t in a.members.values()]

    def _pin(self, now: float) -> None:
        """--stray-cpus: every stray past its grace, whatever the action."""
        if self.cpus is None:
            return
        for t in self.eligible(now):
            if not t.pinned and t.refused is None:
                self.act(t, "affinity", lambda h: h.set_affinity(self.cpus), "cpu")
                t.pinned = True

    # --- the actions a kind asks for ------------------------------------------

    def violation(self, reason: str, t: Tracked | None = None) -> None:
        """Counts a stray going over a budget; t, if given, is observed (when nothing stronger was done)."""
        self.stats.violations[self.cfg.budget_action] += 1
        self.stats.violations_by_reason[(self.cfg.budget_action, reason)] += 1
        if t is not None and t.action == "none":
            t.action = "observe"

    def nice(self, t: Tracked, reason: str) -> None:
        """From the nice level on: nice 19 and SCHED_IDLE, once."""
        if self.level >= 1 and not t.niced:
            t.niced = True
            if self.act(t, "nice", lambda h: h.renice(19), reason):
                t.action = "nice"
            self.act(t, "sched_idle", lambda h: h.sched_idle(), reason)

    def act(self, t: Tracked, action: str, fn, reason: str) -> bool:
        """fn(t.handle), counted as action for reason; False if it did not happen."""
        if t.refused is not None:
            return False
        try:
            fn(t.handle)
        except Gone:
            return False
        except NotPermitted as e:
            self.refuse(t, e, reason)
            return False
        except OSError as e:
            self.once(f"fail-{action}", f"cannot apply {action} to stray {t.key[0]} ({t.comm}): "
                                        f"{e.strerror}; going on without it", "warn")
            return False
        self.count(action, reason)
        return True

    def count(self, action: str, reason: str) -> None:
        self.stats.actions[action] += 1
        self.stats.actions_by_reason[(action, reason)] += 1

    def kill(self, t: Tracked, now: float, reason: str, why: str) -> None:
        """SIGTERM (and SIGCONT: a stopped process must run to exit), once; the
        SIGKILL follows --grace seconds later (_follow_up), counted from its lineage's
        first SIGTERM for reason for a member born after it (a fork must not start the
        grace afresh)."""
        if t.term_at is not None or t.refused is not None:
            return
        first = t.acct.terms.get(reason)
        try:
            if t.cycled:
                self.duty.release(t.key, now)
                t.cycled = False
            t.handle.signal(signal.SIGTERM)
            t.handle.signal(signal.SIGCONT)
            t.term_at = first[0] if first is not None and t.key[1] >= first[1] else now
            if first is None:
                t.acct.terms[reason] = (now, boot_ticks())
            t.term_reason = reason
            t.action = "terminate"
            self.count("terminate", reason)
            self.log.warn(f"stray {t.key[0]} ({t.comm}) {why}: SIGTERM")
        except Gone:
            pass
        except NotPermitted as e:
            self.refuse(t, e, reason)
        except OSError as e:
            self.once("fail-terminate", f"cannot terminate stray {t.key[0]} ({t.comm}): {e.strerror}", "warn")

    def _follow_up(self, now: float) -> None:
        """SIGKILL for every stray still alive --grace seconds after its SIGTERM."""
        for t in [t for a in self.lineages() for t in a.members.values()]:
            if t.term_at is None or t.killed or now - t.term_at < self.cfg.grace or t.refused is not None:
                continue
            try:
                t.handle.signal(signal.SIGKILL)
                t.killed = True
                t.action = "kill"
                self.count("kill", t.term_reason)
                self.log.warn(f"stray {t.key[0]} ({t.comm}) still alive {self.cfg.grace:g}s after SIGTERM: SIGKILL")
            except Gone:
                t.killed = True
            except NotPermitted as e:
                self.refuse(t, e, t.term_reason)
            except OSError as e:
                self.once("fail-terminate", f"cannot terminate stray {t.key[0]} ({t.comm}): {e.strerror}", "warn")

    # --- strays reaper may not act on -------------------------------------------

    def refuse(self, t: Tracked, e: NotPermitted, reason: str = ANY) -> None:
        """Leaves t alone from now on: nothing refused is retried every sample."""
        if t.refused is not None:
            return
        t.refused = e
        t.action = "not_permitted"
        if t.cycled:
            self.duty.release(t.key, time.monotonic())    # if stopped, resumed where possible
            t.cycled = False
        self.refusals.append((e.what, t.key[0], t.comm, e.strerror))
        self.count("not_permitted", reason)

    def _take_duty_faults(self) -> None:
        for key, signame, e in self.duty.take_faults():
            t = self.tracked.get(key)
            if t is None:
                continue
            t.cycled = False                 # the cycle dropped it
            if isinstance(e, NotPermitted):
                self.refuse(t, e)
            else:
                self.once(f"fail-{signame}", f"cannot send {signame} to stray {key[0]} ({t.comm}): "
                                             f"{e.strerror}; it is no longer duty-cycled", "warn")

    def _say_refusals(self) -> None:
        """One line per kind of action refused since the last call, naming the strays."""
        if not self.refusals:
            return
        by_what: dict = {}
        for what, pid, comm, why in self.refusals:
            by_what.setdefault(what, []).append((pid, comm, why))
        self.refusals = []
        for what, strays in by_what.items():
            named = ", ".join(f"{pid} ({comm}, uid {_owner(pid)})" for pid, comm, _ in strays[:10])
            more = f" and {len(strays) - 10} more" if len(strays) > 10 else ""
            one = len(strays) == 1
            self.log.warn(f"uid {os.geteuid()} may not {what} stray{'' if one else 's'} {named}{more}: "
                          f"{strays[0][2]}; {'it is' if one else 'they are'} left alone, "
                          f"not held to {'its' if one else 'their'} budget")

    # --- bookkeeping ---------------------------------------------------------

    def _drop(self, t: Tracked, now: float, alive: bool) -> None:
        if alive:
            self.duty.release(t.key, now)        # no longer a stray: let it run
        else:
            self.duty.forget(t.key)
            if self.reaped is not None:
                self.reaped.gone(t, self.known, self.table.procs, self.finder.reapers())
        for kind in self.kinds:
            kind.drop(t, alive)
        t.acct.leave(t)
        self.emptied.append(t.acct)
        t.handle.close()
        self.regroup = True

    def _count_cgroups(self) -> dict:
        try:
            return _cgroups_of(self._cgroups())
        except OSError:
            return {"live": 0}

    def _publish(self) -> None:
        """The counts over budget and the stray list: only the awake lineages' figures
        move (a sleeping one is over nothing), so only their rows are made again."""
        b = self.stats
        judged = self.lineages()
        b.over_budget = dict.fromkeys(REASONS, 0)
        for kind in self.kinds:
            b.over_budget[kind.reason] = sum(1 for a in judged for t in a.members.values() if kind.over(t))
        b.cgroups = self._count_cgroups()
        if self.rows_changed:
            self.rows_changed = False
            self.stats.stray_list = [_row(t) for t in self.tracked.values()] + self._dormant_rows()
        else:
            for a in judged:
                for t in a.members.values():
                    _row(t)


    def _dormant_rows(self) -> list:
        """Rows of the dormant strays that may be shown: they use no CPU, so those
        holding most memory (Stats.TOP_STRAYS of them)."""
        if self.dormant_top is None:
            top: list = []                   # (memory, n, record): the least first
            for n, d in enumerate(self.dormant.values()):
                if len(top) < TOP_STRAYS:
                    heappush(top, (d.mem, n, d))
                elif d.mem > top[0][0]:
                    heappushpop(top, (d.mem, n, d))
            self.dormant_top = [d for _, _, d in sorted(top, reverse=True)]
        out = []
        for d in self.dormant_top:
            row = Row()
            row.pid, row.name, row.reason, row.action, row.cpu_cores = d.key[0], d.comm, d.reason, d.action, 0.0
            row.memory_bytes, row.since = d.mem, round(dormant.since_wall(d), 3)
            out.append(row)
        return out


class Row:
    """A stray's entry in the stray list (Stats.stray_list): read as a dict (get, [],
    keys), at a fraction of a dict's size (thousands of strays)."""

    __slots__ = ("pid", "name", "reason", "cpu_cores", "memory_bytes", "action", "since")

    def get(self, key: str, default=None):
        return getattr(self, key, default) if key in Row.__slots__ else default

    def __getitem__(self, key: str):
        if key not in Row.__slots__:
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key) -> bool:
        return key in Row.__slots__

    def keys(self) -> tuple:
        return Row.__slots__

    def items(self) -> list:
        return [(k, getattr(self, k)) for k in Row.__slots__]

    def __iter__(self):
        return iter(Row.__slots__)

    def __len__(self) -> int:
        return len(Row.__slots__)

    def __repr__(self) -> str:
        return repr(dict(self.items()))


def _row(t: Tracked) -> Row:
    """t's entry in the stray list, brought up to date in place."""
    row = t.row
    if row is None:
        row = t.row = Row()
    row.pid, row.name, row.reason, row.action = t.key[0], t.comm, t.reason, t.action
    row.cpu_cores, row.memory_bytes, row.since = round(_cores(t), 3), t.use.mem or 0, round(t.since_wall, 3)
    return row


def _cores(t: Tracked) -> float:
    """A stray's cores: its lineage's over the window where it is its only member (a
    fork seen once included), else its own over the last interval."""
    if len(t.acct.members) == 1:
        return t.acct.use.rate or 0.0
    return t.own_rate() or 0.0


def _cgroups_of(holders) -> dict:
    """{"live": n} and, where the kernel says (cgroup v2), "dying": the cgroups reaper holds."""
    out = {"live": 0}
    for cg in holders:
        out["live"] += cg.live()
        dying = cg.dying()
        if dying is not None:
            out["dying"] = out.get("dying", 0) + dying
    return out


def _owner(pid: int) -> str:
    try:
        return str(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return "?"
