"""Budgets for strays: sample, track, act; each budget kind judges (kinds/).

Every --budget-interval the enforcer refreshes the process table, finds the
strays (strays.py), reads each one's CPU time and private memory (psutil), and
averages the CPU over --budget-window (Usage). Then each budget kind that is on
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
import signal
import time
from collections import ChainMap
from typing import Optional

from reaper.budgets import cleanup, escapes, hops, stray_cpus
from reaper.budgets.cgroupfs import read_proc_cgroup
from reaper.budgets.kinds import ANY, REASONS, load as load_kinds
from reaper.budgets.lineage import Account, Ghost, Linker, Tracked, Usage, boot_ticks, hop_from, join, lineages, \
    read_groups
from reaper.procctl import Gone, Handle, NotPermitted, pidfds_work
from reaper.budgets.strays import Finder
from reaper.budgets.throttle import DutyCycler
from reaper.procfs.processes import ProcTable

__all__ = ["Enforcer", "Tracked", "Usage", "LEVELS"]

LEVELS = {"observe": 0, "nice": 1, "throttle": 2, "terminate": 3}


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
        self.owners: Optional[dict] = None       # cgroup directory -> its lineage, this sample (_leaf_owner)
        self.accounts: list = []                 # the lineages of this sample (lineages())
        self.unlinked: list = []                 # last sample's new fork-copies of no lineage (_late_hops)
        self.unpinnable: set = set()             # keys of this sample's strays gone before pinned
        self.retiring: list = []                 # lineages empty at the last sample: retired if still empty
        self.cgroup_data: dict = {}              # pid -> /proc/PID/cgroup, read this sample
        self.prev_sample: Optional[float] = None
        self.boot = 0                            # boot ticks at this sample's scan
        self.duty = DutyCycler()
        self.reaped = reaped                     # reaped.ReapedCPU where reaper reaps the orphans
        self.watch = bool(getattr(scope, "watch", False))
        self.said: set = set()                   # things said once
        self.unpinned: set = set()               # keys of strays reaper may not even read
        self.refusals: list = []                 # (what, pid, comm, strerror) not said yet
        self.next_sample = time.monotonic()      # first sample right away
        self.kinds = [kind(self) for kind in load_kinds(cfg)]   # the budgets that are on, in order
        self.cpus = None
        try:
            self.cpus, msg = stray_cpus.resolve(cfg.stray_cpus)
            if msg:
                self.log.info(msg)
        except Exception as e:                   # never fatal: leave affinity alone
            self.log.warn(f"--stray-cpus {cfg.stray_cpus}: {e}; affinity left alone")
        self._remove_stale_cgroups()
        if not pidfds_work():
            self.once("nopidfd", "no pidfd support: signals to strays go through kill() "
                                 "after a start-time check")
        self.log.debug(f"budgets on: per stray {cfg.cpu_budget}, total {cfg.cpu_budget_total}, "
                       f"memory {cfg.memory_budget}, {cfg.memory_budget_total}, max age {cfg.stray_max_age}, "
                       f"action {cfg.budget_action}, every {cfg.budget_interval:g}s")

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

    def next_deadline(self) -> Optional[float]:
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
        for key, t in list(self.tracked.items()):
            if not self.tracked_alive(key):
                self.reaped.gone(t, self.tracked, {}, reapers)
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
        boot = self.boot = boot_ticks()          # before the scan: whatever starts later is new
        self.table.refresh(now, self.finder.reapers())
        found = self.finder.find(self.table)
        self.cgroup_data = {}

        gone, self.late_gone = self.late_gone, []
        for key in [k for k in self.tracked if k not in found]:
            t = self.tracked.pop(key)
            alive = self.tracked_alive(key)
            self._drop(t, now, alive)
            if not alive:
                gone.append(t)
        self.unpinned &= found.keys()
        self._late_hops(gone)
        new = []
        for key, stray in found.items():
            t = self.tracked.get(key)
            if t is not None:
                t.comm, t.cmdline = stray.comm, stray.cmdline    # it may have exec'd since
                t.seen_before, t.seen_boot = t.seen_boot, boot
            elif key not in self.unpinned:
                new.append((key, stray))
        # A hop's parent may have vanished a sample before it is seen: the members gone
        # at the last sample count too, after this sample's.
        self.ghosts, self.unpinnable, self.hop_seen, self.owners = {}, set(), set(), None
        for key, stray in sorted(new, key=lambda ks: ks[0][1]):   # the oldest first: parents before children
            self._track(key, stray, now, (gone, self.recent_gone))
        self.recent_gone = gone
        self.linker.prune(self.tracked)
        self._retire()
        self.linker.prev_boot = boot

        self._measure(now)
        self.stats.samples += 1
        self.stats.strays = len(self.tracked)
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
        self.prev_sample = now
        self._publish()

    def _measure(self, now: float) -> None:
        """Each stray's CPU and private memory, then each lineage's CPU."""
        cfg = self.cfg
        for key, t in list(self.tracked.items()):
            if t.refused is not None and t.refused.what == "read":
                continue
            try:
                cpu = t.handle.cpu_seconds()
            except Gone:
                self._drop(self.tracked.pop(key), now, alive=False)
                self.late_gone.append(t)
                continue
            except NotPermitted as e:
                self.refuse(t, e)
                continue
            except OSError as e:
                self.once("fail-read", f"cannot read the CPU time of stray {key[0]} ({t.comm}): "
                                       f"{e.strerror}; it is skipped while this lasts", "warn")
                continue
            try:
                t.use.mem = t.handle.private_memory(exact_above=cfg.memory_budget)
            except (Gone, OSError):
                t.use.mem = None             # gone: dropped at the next sample
            if t.last_cpu is None:
                # A stray born since the last sample has used nothing but as one (0 at its fork).
                t.base = t.last_cpu = 0.0 if t.newborn else cpu
            elif t.read_at is not None:
                t.prev = (t.read_at, t.last_cpu)
            self.stats.stray_cpu_seconds += max(0.0, cpu - t.last_cpu)
            t.last_cpu, t.read_at, t.read_boot = cpu, now, self.boot
            if t.pred is not None:
                hops.count_unseen(self.stats, t, self.reaped is None)
            p = self.table.procs.get(key[0])
            if p is not None:
                t.ppid = p.ppid              # who reaps it: reaped.ReapedCPU.gone
        self._count_reaped()
        self.accounts = lineages(self.tracked.values())
        for a in self.accounts:
            stopped = a.duty.stopped(now) if a.duty is not None else 0.0
            a.use.add(now, a.cpu(), now - a.since - stopped, cfg.budget_window, cfg.budget_interval)

    def _count_reaped(self) -> None:
        """What reaper reaped of strays that no sample read (reaped.py)."""
        r = self.reaped
        if r is None:
            return
        scope = self.scope
        kept = {scope.main_pid, *getattr(scope, "supervised", ())}
        r.read_others(self.table, scope.pid, self.tracked, kept)
        self.stats.stray_cpu_seconds += r.count()

    def _track(self, key, stray, now: float, gone: tuple) -> None:
        groups = read_groups(*key)
        known = ChainMap(self.tracked, self.ghosts)
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
        self.linker.note(t)
        self.stats.strays_seen += 1
        if rule == "parent" and isinstance(via, Tracked):
            t.placed = dict(via.placed)      # forked inside its parent's cgroups, if the parent was in them
        elif acct is not None and t.newborn:
            t.pred = via if rule == "hop" and isinstance(via, Tracked) else hops.predecessor(t, gone[0] + gone[1])
        if acct is None and groups is not None and groups[2] and t.newborn:
            self.unlinked.append(t)          # a fork-copy of no lineage: a sample to find it one
        self.log.debug(f"stray {key[0]} ({stray.comm}): {stray.reason}"
                       + (f", lineage of {acct.root[0]} ({rule})" if acct is not None else ""))

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

    def proc_cgroup(self, pid: int) -> Optional[bytes]:
        """/proc/PID/cgroup, read once a sample."""
        if pid not in self.cgroup_data:
            self.cgroup_data[pid] = read_proc_cgroup(pid)
        return self.cgroup_data[pid]

    def _leaf_owner(self, pid: int) -> Optional[Account]:
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
        """The lineages of the strays tracked at this sample (lineage.Account)."""
        return self.accounts

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

    def violation(self, reason: str, t: Optional[Tracked] = None) -> None:
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
        for t in self.tracked.values():
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
                self.reaped.gone(t, self.tracked, self.table.procs, self.finder.reapers())
        for kind in self.kinds:
            kind.drop(t, alive)
        t.acct.leave(t)
        self.emptied.append(t.acct)
        t.handle.close()

    def _count_cgroups(self) -> dict:
        try:
            return _cgroups_of(self._cgroups())
        except OSError:
            return {"live": 0}

    def _publish(self) -> None:
        b = self.stats
        b.over_budget = dict.fromkeys(REASONS, 0)
        for kind in self.kinds:
            b.over_budget[kind.reason] = sum(1 for t in self.tracked.values() if kind.over(t))
        b.cgroups = self._count_cgroups()
        self.stats.stray_list = sorted(
            ({"pid": t.key[0], "name": t.comm, "reason": t.reason, "cpu_cores": round(_cores(t), 3),
              "memory_bytes": t.use.mem or 0, "action": t.action, "since": round(t.since_wall, 3)}
             for t in self.tracked.values()), key=lambda d: -d["cpu_cores"])


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
