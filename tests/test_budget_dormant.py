"""The dormant strays' records (reaper/budgets/dormant.py): a tracked stray kept as a
packed record by pid and made a tracked one again as it was; pid reuse; one verdict for
many copies. In-process: the enforcer's behaviour with dormant strays is tested with a
real reaper in tests/test_budget_scale.py."""
from __future__ import annotations

import sys

from reaper.budgets import dormant
from reaper.budgets.lineage import Tracked
from reaper.budgets.strays import Stray


class _Handle:
    def close(self) -> None:
        pass


def tracked(pid: int, start: int, cmdline: str = "sleep 600", mem: int = 5 << 20) -> Tracked:
    t = Tracked((pid, start), Stray(pid, start, 1, "sleep", cmdline, "orphan"), _Handle(), 100.0, [],
                groups=(7, 7, False))
    t.base, t.last_cpu, t.read_at, t.read_boot, t.rss, t.use.mem = 0.25, 1.5, 130.0, 4242, 6 << 20, mem
    t.acct.use.rate = 0.0
    t.action = "observe"
    return t


def test_a_stray_kept_as_a_record_comes_back_as_it_was(monkeypatch):
    # Its command line is read again when it comes back (a record keeps its digest only).
    monkeypatch.setattr(dormant, "read_cmdline", lambda pid: "sleep 600" if pid == 40 else "")
    records = dormant.Records()
    records.put(tracked(40, 1000))
    assert (40, 1000) in records and len(records) == 1 and records.comm((40, 1000)) == "sleep"
    d = records.pop((40, 1000))
    assert (40, 1000) not in records and len(records) == 0
    t = dormant.thaw(d, _Handle(), [], seen_boot=5000, seen_before=4900)
    assert t.key == (40, 1000) and (t.comm, t.cmdline, t.reason, t.groups, t.ppid) == \
        ("sleep", "sleep 600", "orphan", (7, 7, False), 1)
    assert (t.since, t.base, t.last_cpu, t.read_at, t.read_boot) == (100.0, 0.25, 1.5, 130.0, 4242)
    assert (t.rss, t.use.mem, t.action, t.seen_boot, t.seen_before) == (6 << 20, 5 << 20, "observe", 5000, 4900)
    assert t.acct.use.rate == 0.0 and t.acct.cpu() == 1.5 - 0.25
    assert t.acct.members == {(40, 1000): t}


def test_a_reused_pid_is_another_process():
    records = dormant.Records()
    records.put(tracked(40, 1000))
    assert (40, 2000) not in records and records.get((40, 2000)) is None and records.comm((40, 2000)) is None
    records.put(tracked(40, 2000, cmdline="other"))       # the pid's last holder is gone
    assert list(records) == [(40, 2000)] and records.get((40, 2000)).same_cmdline("other")
    assert not records.get((40, 2000)).same_cmdline("sleep 600")
    assert [v for v in records.verdicts if v is not None] == [records.get((40, 2000)).verdict]


def test_copies_of_one_program_share_one_verdict_and_a_small_record():
    records = dormant.Records()
    for pid in range(100, 1100):
        records.put(tracked(pid, 1000 + pid, cmdline="helper --serve"))
    assert len(records) == 1000 and len([v for v in records.verdicts if v is not None]) == 1
    assert max(sys.getsizeof(b) for b in records.by_pid.values()) <= 120
    for pid in range(100, 1100):
        records.pop((pid, 1000 + pid))
    assert records.numbers == {} and records.verdicts == [None]
    records.put(tracked(5, 6, cmdline="another"))
    assert records.verdicts == [records.get((5, 6)).verdict]    # its number used again


def test_what_a_stray_costs_does_not_depend_on_its_command_line():
    """Issue 33.6: strays with distinct command lines of 8 KB (as much as reaper reads)
    share one verdict when asleep (their records keep a digest, not the text), and what
    the finder keeps of one is bounded (strays.kept_cmdline)."""
    from reaper.budgets.strays import CMDLINE_KEPT, kept_cmdline

    long = ["sleep 3600 0." + "0" * 8150 + str(i) for i in range(1000)]
    kept = [kept_cmdline(c) for c in long]
    assert max(len(k) for k in kept) <= CMDLINE_KEPT and len(set(kept)) == 1000   # still told apart
    assert kept_cmdline("sleep 600") == "sleep 600"
    records = dormant.Records()
    for i, k in enumerate(kept):
        records.put(tracked(100 + i, 1000 + i, cmdline=k))
    assert len([v for v in records.verdicts if v is not None]) == 1
    assert max(sys.getsizeof(b) for b in records.by_pid.values()) <= 120
    assert all(records.get((100 + i, 1000 + i)).same_cmdline(k) for i, k in enumerate(kept))
    assert not records.get((100, 1000)).same_cmdline(kept[1])


def test_unknown_memory_stays_unknown():
    records = dormant.Records()
    t = tracked(40, 1000, mem=None)
    t.rss = None
    records.put(t)
    d = records.get((40, 1000))
    assert d.mem == 0 and d.rss is None
    back = dormant.thaw(records.pop((40, 1000)), _Handle(), [], 0, 0)
    assert back.use.mem is None and back.rss is None
    records.put(tracked(41, 1000))
    records.set_memory((41, 1000), 8 << 20, 3 << 20)
    assert (records.get((41, 1000)).rss, records.get((41, 1000)).mem) == (8 << 20, 3 << 20)


def test_strays_that_nap_keep_one_age_entry_each(monkeypatch):
    """Issue 33.7: with --stray-max-age, a lineage that falls asleep again and again (here
    10 strays working 1 s in every 12, for 10 fake minutes: ~50 naps each) keeps one entry
    in the age heap, not one per nap; and one that exits has its entry let go in time."""
    from budget_world import World

    w = World(["--stray-max-age", "86400", "--budget-action", "observe", "--budget-interval", "1"], 600)
    nappers = [w.add(comm="napper", cmdline=f"napper {i}") for i in range(10)]
    short = [w.add(comm="short", cmdline=f"short {i}") for i in range(100)]

    def work(p, on):
        p.rate = 0.5 if on else 0.0
    for k in range(48):
        for i, p in enumerate(nappers):
            at = 5 + 12 * k + i * 0.3
            w.at(at, lambda p=p: work(p, True))
            w.at(at + 1, lambda p=p: work(p, False))
    w.at(30, lambda: [w.exit(p.pid) for p in short])
    sizes, woken = [], []

    def each(enf):
        sizes.append(sum(len(h) for _, h, _ in enf.schedule.timers))
        woken.append(enf.stats.samples)
    w.run(monkeypatch, each)
    assert woken[-1] > 500
    # 110 lineages once (the 100 short ones' entries let go once they are gone), the
    # nappers' 10 whatever their naps.
    assert max(sizes) <= 110 + 10 + 64, max(sizes)
    assert sizes[-1] <= 10 + 64, sizes[-1]
