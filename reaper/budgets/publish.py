"""What the budgets publish each sample (BudgetStats): the strays over each budget, the
cgroups reaper holds, and the stray list (`reaper stats`, the metrics).

Only the awake lineages' figures move (a sleeping one is over nothing), so only their
rows are made again; the whole list is made again when a stray came or went or its
memory moved (Book.rows_changed). Of the dormant strays (dormant.py), which use no CPU,
those holding most memory are listed (Stats.TOP_STRAYS of them).
"""
from __future__ import annotations

from reaper.budgets import dormant
from reaper.budgets.kinds import REASONS


def publish(stats, judged: list, kinds: list, book) -> None:
    """The counts over budget and the stray list; judged: the lineages of this sample."""
    b = stats
    b.over_budget = dict.fromkeys(REASONS, 0)
    for kind in kinds:
        b.over_budget[kind.reason] = sum(1 for a in judged for t in a.members.values() if kind.over(t))
    b.cgroups = count_cgroups(kinds)
    if book.rows_taken():
        b.stray_list = [_row(t) for t in book.tracked.values()] + dormant_rows(book.dormant_top())
    else:
        for a in judged:
            for t in a.members.values():
                _row(t)


def count_cgroups(kinds: list) -> dict:
    try:
        return _cgroups_of([kind.cgroup for kind in kinds if kind.cgroup is not None])
    except OSError:
        return {"live": 0}


def dormant_rows(top: list) -> list:
    """Rows of the dormant strays that may be shown (dormant.top's)."""
    out = []
    for d in top:
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


def _row(t) -> Row:
    """t's entry in the stray list, brought up to date in place."""
    row = t.row
    if row is None:
        row = t.row = Row()
    row.pid, row.name, row.reason, row.action = t.key[0], t.comm, t.reason, t.action
    row.cpu_cores, row.memory_bytes, row.since = round(_cores(t), 3), t.use.mem or 0, round(t.since_wall, 3)
    return row


def _cores(t) -> float:
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
