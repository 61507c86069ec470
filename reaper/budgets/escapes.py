"""Keeping a lineage in the cgroups reaper made for it.

A stray that may write to the cgroup.procs of the cgroup it came from (reaper's own:
a subtree delegated to its uid) can move itself out of the cgroup that caps it, and
a stray of reaper's own uid may even rewrite its leaf's quota, a file of that uid.
So every sample, for each member of a lineage a kind holds in a cgroup (and only for
those: one short read each), reaper reads /proc/PID/cgroup and puts a member found
elsewhere back. A member found outside that was seen inside before (or whose parent
was, when it forked it) has escaped: counted (stats: stray_cgroup_escapes), said once
per lineage. A lineage whose members escape
more than ESCAPES_MAX times, or that cannot be moved back, is held without that
cgroup from then on (Kind.give_up: the duty cycle for CPU, the sample's judgement
for memory). A lineage alone in a cgroup that used more CPU than its quota allows
over a whole sample (a thread moved out through cgroup v1's tasks file, a rewritten
quota: what /proc/PID/cgroup does not show) is put back and its quota written again,
and that counts as an escape too. A kind may hold a lineage that escaped otherwise as
well, while it keeps leaving (Kind.escaped: the CPU budget duty-cycles it on top of its
cgroup for a window), so that leaving gains it at most the one interval before the
sample that finds it.
"""
from __future__ import annotations

from reaper.budgets.lineage import who
from reaper.procctl import Gone
from reaper.procfs.processes import exiting

ESCAPES_MAX = 3          # escapes of one lineage from one cgroup before it is held without it


def hold(kinds: list, judged: list, book, act, prev_sample: float | None, now: float) -> None:
    """One sample: every member of a lineage of judged a kind holds in a cgroup is in it.
    book: /proc/PID/cgroup (proc_cgroup); act: the actions door (once, log, escaped);
    prev_sample: when the last sample was (None: none yet)."""
    kinds = [k for k in kinds if k.cgroup is not None and k.cgroup.mount is not None]
    if not kinds:
        return
    for a in judged:
        for kind in kinds:
            d = kind.leaf_of(a)
            if d is not None:
                _hold(book, act, prev_sample, a, kind, d, now)


def _hold(book, act, prev_sample, a, kind, d: str, now: float) -> None:
    moved = False
    for t in list(a.members.values()):
        if t.refused is not None or kind.leaf_of(a) != d:
            continue
        data = book.proc_cgroup(t.key[0])
        if data is None:
            continue                     # gone: dropped at the next sample
        where = kind.cgroup.dir_of(data)
        if where == d:
            t.placed[kind.reason] = d
            kind.placed(t, moved=False)      # a fork born inside is held like its lineage
            continue
        if exiting(t.key[0]):
            continue                     # a dying process's cgroup is the kernel's teardown, not an escape
        # Seen inside before (a child forked inside counts as seen: lineage.py), then
        # elsewhere: it left. A member never seen inside is only put in.
        escaped = t.placed.get(kind.reason) == d
        if not _put_back(act, a, t, kind, d):
            continue
        moved = True
        if escaped:
            escape(act, a, t, kind, f"left its {kind.reason} cgroup {d} (found in {where or 'a cgroup out of view'})",
                   now)
    settled = a.settled.get(kind.reason)
    if moved or kind.leaf_of(a) != d:
        a.settled.pop(kind.reason, None)
        return
    if settled is not None and prev_sample is not None and settled <= prev_sample:
        why = kind.leaking(a)            # in its cgroup for the whole last interval, yet over its cap
        if why:
            for t in list(a.members.values()):
                if t.refused is None and kind.leaf_of(a) == d:
                    _put_back(act, a, t, kind, d)
            kind.reassert(a)
            t = a.first()
            if t is not None:
                escape(act, a, t, kind, why, now)
            a.settled.pop(kind.reason, None)
            return
    a.settled.setdefault(kind.reason, now)


def _put_back(act, a, t, kind, d: str) -> bool:
    """Moves t into d; True if done. One that cannot be moved ends the cgroup for its lineage."""
    first = kind.reason not in t.placed
    try:
        t.handle.checked(lambda: kind.cgroup.move(t.key[0], d))
    except Gone:
        return False
    except OSError as e:                 # NotPermitted too
        act.once(f"escape-move-{kind.reason}", f"cannot move {who(t)} back into {d} ({e.strerror})", "warn")
        kind.give_up(a, f"cannot be moved back into {d}")
        return False
    t.placed[kind.reason] = d
    kind.placed(t, moved=first)
    return True


def escape(act, a, t, kind, detail: str, now: float) -> None:
    """A member of a was found outside its cgroup: counted, said once, and past
    ESCAPES_MAX the lineage is held without that cgroup."""
    n = a.escapes[kind.reason] = a.escapes.get(kind.reason, 0) + 1
    act.escaped()
    kind.escaped(a, now)
    if n == 1:
        act.log.warn(f"{who(t)} {detail}: moved back")
    else:
        act.log.debug(f"{who(t)} {detail}: moved back ({n} times)")
    if n > ESCAPES_MAX and kind.leaf_of(a) is not None:
        kind.give_up(a, f"left its {kind.reason} cgroup {n} times")
