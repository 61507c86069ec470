"""Who the budgets know: the strays tracked, the dormant ones, and their lineages.

Book is the only writer of what it holds: the tracked strays (lineage.Tracked, pinned
by procctl.Handle) and the dormant records (dormant.Records), the strays of this scan
gone before they could be pinned (ghosts, unpinnable) and those reaper may not even
read (unpinned), the Linker and the lineages of this sample (accounts, listed again
when a member came or went: regroup), and whether the stray list must be made again
(rows_changed, dormant_top). A stray comes to be tracked one way, track(): found by a
scan, or caught as a duty-cycled lineage's fork between two samples (hops.py); it
leaves by drop() (gone, or no longer a stray), or sleeps as a record (sleep_small)
until thaw() makes it a tracked one again.

The scan (/proc listed: strays.Finder) is the book's too: the strays found, those
gone, the new ones tracked and linked, a hop a sample late (late_hops), the lineages
left empty for a whole sample let go (retire).
"""
from __future__ import annotations

import time

from reaper.budgets import dormant, hops, pulse, reaped
from reaper.budgets.lineage import Ghost, Linker, Tracked, boot_ticks, hop_from, join, lineages, read_groups
from reaper.budgets.strays import KNOWN
from reaper.procctl import Gone, Handle, NotPermitted
from reaper.procfs.cgroups import read_pid_cgroup
from reaper.procfs.processes import ProcTable, read_stat


class Book:
    def __init__(self, cfg, log, stats, kinds: list, act, finder, reaped, cpus) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.kinds = kinds                       # the budgets that are on, in order
        self.act = act                           # actions.Actions: refusals, the duty cycle
        self.finder = finder
        self.reaped = reaped                     # reaped.ReapedCPU where reaper reaps the orphans
        self.cpus = cpus                         # --stray-cpus (may_keep: a stray not pinned yet stays)
        self.schedule = self.reader = None       # wired by the engine (wire)
        self.table = ProcTable()
        self.linker = Linker()
        self.tracked: dict = {}
        self.emptied: list = []                  # accounts that lost a member: retired once empty
        self.late_gone: list = []                # members found gone after this sample's linking
        self.recent_gone: list = []              # members gone at the last scan
        self.ghosts: dict = {}                   # key -> Ghost: strays of this scan gone before pinned
        self.hop_seen: set = set()               # reaper's children looked at for hops since the scan
        self.owners: dict | None = None          # cgroup directory -> its lineage, this sample (leaf_owner)
        self.accounts: list = []                 # the lineages of this sample (lineages())
        self.unlinked: list = []                 # last sample's new fork-copies of no lineage (late_hops)
        self.unpinnable: set = set()             # keys of this scan's strays gone before pinned
        self.retiring: list = []                 # lineages empty at the last sample: retired if still empty
        self.cgroup_data: dict = {}              # pid -> /proc/PID/cgroup, read this sample
        self.boot = 0                            # boot ticks at this sample's scan
        self.unpinned: set = set()               # keys of strays reaper may not even read
        self.dormant = dormant.Records()         # key -> dormant.Dormant: sleeping strays kept small
        self.top: list | None = None             # those holding most memory (dormant_top), until one changes
        self.scan_boots = (0, 0)                 # boot ticks of the last two scans: when dormant strays were seen
        # Budgets of all strays together judge every lineage at every sample: nothing sleeps small then.
        self.small = not any(kind.judges_all() for kind in kinds)
        self.known = dormant.Known(self)
        self.regroup = True                      # a member came or went: the lineages are listed again
        self.rows_changed = True                 # the stray list is made again

    def wire(self, schedule, reader) -> None:
        self.schedule, self.reader = schedule, reader

    def start(self, boot: int) -> None:
        """A sample starts: boot ticks now (whatever starts later is new); /proc/PID/cgroup read afresh."""
        self.boot = boot
        self.cgroup_data = {}

    # --- the scan -------------------------------------------------------------------

    def scan(self, now: float, boot: int) -> None:
        """Lists /proc: the strays found, those gone, the new ones tracked and linked."""
        self.table.refresh(now, self.finder.reapers())
        found = self.finder.find(self.table, self.known)
        if self.finder.behind:
            self.schedule.rescan_soon()      # a burst: the rest of its new strays at the next sample

        gone, self.late_gone = self.late_gone, []
        for key in self.dormant:
            why = found.get(key, False)
            if why is False:                 # gone, or no longer a stray: dropped as a tracked one
                self._drop_gone(self.thaw(key), now, gone)
            elif why is not KNOWN:
                d = self.dormant.get(key)
                comm, cmdline = self.finder.verdict(key)
                if comm != d.comm or not d.same_cmdline(cmdline):
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
            self.track(key, self.finder.stray(key, found[key], self.table), now, (gone, self.recent_gone))
        self.finder.settled(self.known)
        self.recent_gone = gone
        if self.regroup:
            self.linker.prune(self.tracked)
        self._retire()
        self.linker.prev_boot = boot

    def _drop_gone(self, t: Tracked, now: float, gone: list) -> None:
        """t, not found by this scan, is no longer tracked; if it ended, it is among the
        members gone (a hop of it may yet appear)."""
        self.tracked.pop(t.key)
        alive = tracked_alive(t.key)
        self.drop(t, now, alive)
        if not alive:
            gone.append(t)

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

    # --- a stray comes and goes ---------------------------------------------------------

    def track(self, key, stray, now: float, gone: tuple = ((), ()), groups: tuple | None = None,
              hop: Tracked | None = None) -> Tracked | None:
        """Tracks new stray key, as found by a scan (gone: the members gone at this scan and
        the last, its lineage found by Linker), or as the fork of hop, a duty-cycled member
        gone between two samples (groups: its own; hops.catch). The Tracked, or None if it
        is not tracked (gone, or not to be pinned, or kept dormant at once)."""
        if hop is not None:
            try:
                handle = Handle(*key)
            except OSError:                  # Gone, NotPermitted: the next sample decides
                return None
            t = Tracked(key, stray, handle, now, self.kinds, hop.acct, groups, newborn=True)
            # Read as at its fork (0: it is new): what hop burnt until then is estimated now.
            t.seen_boot = t.read_boot = boot_ticks()
            t.last_cpu, t.pred = 0.0, hop
            hops.count_unseen(self.stats, t, self.reaped is None)
            self._enter(t)
            self.schedule.fresh_one(t)
            self.log.debug(f"stray {key[0]} ({t.comm}): {t.reason}, lineage of {hop.acct.root[0]} (hop, at once)")
            return t
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
            return None
        except NotPermitted as e:
            self.unpinned.add(key)                  # not pinned again every sample
            self.act.unpinnable(key, stray.comm, e)
            return None
        acct, rule, via = self.linker.find(stray, groups, self.table, known, gone, self.finder.reapers(),
                                           lambda: self.leaf_owner(key[0]), self.unpinnable)
        prev = self.linker.prev_boot
        t = Tracked(key, stray, handle, now, self.kinds, acct, groups, prev is not None and key[1] >= prev)
        t.seen_boot = self.boot
        self._enter(t)
        if acct is None and not (groups is not None and groups[2] and t.newborn) and self._sleeps_at_once(t, now):
            self.log.debug(f"stray {key[0]} ({stray.comm}): {stray.reason}")
            return None
        self.schedule.fresh_one(t)
        if rule == "parent" and isinstance(via, Tracked):
            t.placed = dict(via.placed)      # forked inside its parent's cgroups, if the parent was in them
        elif acct is not None and t.newborn:
            t.pred = via if rule == "hop" and isinstance(via, Tracked) else hops.predecessor(t, gone[0] + gone[1])
        if acct is None and groups is not None and groups[2] and t.newborn:
            self.unlinked.append(t)          # a fork-copy of no lineage: a sample to find it one
        self.log.debug(f"stray {key[0]} ({stray.comm}): {stray.reason}"
                       + (f", lineage of {acct.root[0]} ({rule})" if acct is not None else ""))
        return t

    def _enter(self, t: Tracked) -> None:
        self.tracked[t.key] = t
        self.regroup = True
        self.linker.note(t)                  # the groups it leads name its lineage (a fork leads none)
        self.stats.strays_seen += 1

    def _sleeps_at_once(self, t: Tracked, now: float) -> bool:
        """A new stray in a lineage of its own is read at once and kept dormant, if plain
        (dormant.may_keep): thousands that appear together never cost a tracked stray each.
        A busy one is woken at the next sweep: its CPU is what nobody read (pulse.py)."""
        if self.schedule.draining or not dormant.may_keep(self, t.acct):
            return False
        self.reader.read(t.key, t, now)
        if self.tracked.get(t.key) is not t:
            return True                      # gone at its read: dropped already
        if t.acct.members and dormant.may_keep(self, t.acct):
            self.schedule.unwake(t.acct)
            self.sleep_small(t.acct)
            return True
        return False

    def looked_at(self, pid: int) -> bool:
        """pid (a child of reaper) is known to this scan's table or was looked at for a
        hop since; it is looked at from now on (hops.catch)."""
        if pid in self.table.procs or pid in self.hop_seen:
            return True
        self.hop_seen.add(pid)
        return False

    def drop(self, t: Tracked, now: float, alive: bool) -> None:
        """t (taken out of tracked) is no longer a stray (alive) or is gone."""
        if alive:
            self.act.release(t, now)            # no longer a stray: let it run
        else:
            self.act.forget(t)
            if self.reaped is not None:
                self.reaped.gone(t, self.known, self.table.procs, self.finder.reapers())
            else:
                reaped.carry(t, self.known, self.table.procs)
        for kind in self.kinds:
            kind.drop(t, alive)
        t.acct.leave(t)
        self.emptied.append(t.acct)
        t.handle.close()
        self.regroup = True

    def lose(self, key, t: Tracked, now: float) -> None:
        """A stray found gone at its read."""
        if self.tracked.get(key) is t:
            self.drop(self.tracked.pop(key), now, alive=False)
            self.late_gone.append(t)

    def judge_exec(self, key, t: Tracked, comm: str, now: float) -> bool:
        """t exec'd (or renamed itself): judged again at once, before any budget acts on
        it, and listed again at the next sample. False if it is no longer a stray (a
        --protect'ed or Ray's program now): dropped, left alone."""
        self.finder.forget(key)
        self.schedule.rescan_soon()
        verdict = self.finder.judge_now(key, comm)
        if verdict is not None:
            t.comm, t.cmdline = verdict
            return True
        if self.tracked.get(key) is t:
            del self.tracked[key]
            self.drop(t, now, alive=tracked_alive(key))
        return False

    def thaw(self, key, why: str = "") -> Tracked:
        """Dormant stray key as a tracked one again (dormant.thaw), read at the next sweep
        or by pulse.QUIET_MAX, and woken by what reads it. why: said (-vv) if given."""
        d = self.dormant.pop(key)
        self.top = None
        if why:
            self.log.debug(f"stray {key[0]} ({d.comm}) tracked again: {why}")
        t = dormant.thaw(d, Handle.unchecked(*key), self.kinds, self.scan_boots[1], self.scan_boots[0])
        self.tracked[key] = t
        self.schedule.rest_until(time.monotonic() + pulse.QUIET_MAX, key)
        self.regroup = True
        return t

    def sleep_small(self, a) -> None:
        """a's only member as a dormant record; a is let go (its age is the record's)."""
        self.schedule.say_asleep()
        t = a.first()
        del self.tracked[t.key]
        self.dormant.put(t)
        self.top = None
        a.members.clear()
        t.handle.close()
        self.regroup = True
        self.schedule.due(a.since, t.key, was=a)

    def remeasured(self, key, rss: int, mem: int | None) -> None:
        """A dormant stray's memory read again."""
        self.dormant.set_memory(key, rss, mem)
        self.rows_changed, self.top = True, None

    # --- this sample's lineages and rows --------------------------------------------------

    def regrouped(self) -> None:
        """The lineages listed again if a member came or went."""
        if self.regroup:
            self.accounts = lineages(self.tracked.values())
            self.regroup = False
            self.rows_changed = True

    def changed(self) -> None:
        """A row's figures moved: the stray list is made again."""
        self.rows_changed = True

    def rows_taken(self) -> bool:
        """The stray list must be made again (it is, now)."""
        if self.rows_changed:
            self.rows_changed = False
            return True
        return False

    def dormant_top(self) -> list:
        """The dormant strays holding most memory (dormant.top), until one changes."""
        if self.top is None:
            self.top = dormant.top(self.dormant)
        return self.top

    def proc_cgroup(self, pid: int) -> bytes | None:
        """/proc/PID/cgroup, read once a sample."""
        if pid not in self.cgroup_data:
            self.cgroup_data[pid] = read_pid_cgroup(pid)
        return self.cgroup_data[pid]

    def leaf_owner(self, pid: int):
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

    # --- the end ----------------------------------------------------------------------

    def count_final(self) -> None:
        """At the end (the drain is over): the CPU of the strays reaped since the last sample."""
        if self.reaped is None:
            return
        reapers = self.finder.reapers()
        for key in [k for k in self.dormant if not tracked_alive(k)]:
            self.thaw(key)
        for key, t in list(self.tracked.items()):
            if not tracked_alive(key):
                self.reaped.gone(t, self.known, {}, reapers)
        self.stats.stray_cpu_seconds += self.reaped.count()

    def close(self) -> None:
        for t in self.tracked.values():
            t.handle.close()
        self.tracked.clear()


def tracked_alive(key) -> bool:
    st = read_stat(key[0])
    return st is not None and st[1] == key[1] and st[3] not in ("Z", "X")
