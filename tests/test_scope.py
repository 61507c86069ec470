"""reaper/scope.py in process, on a made-up process table: who reaper answers for."""
from __future__ import annotations

from types import SimpleNamespace

from reaper import scope
from reaper.procfs.processes import Proc, children_index

# 1 (init) -> 10 (reaper) -> 11 (main) -> 12; 10 -> 20 (service) -> 21; 10 -> 30 (orphan's parent gone);
# 1 -> 40 (not reaper's)
TABLE = {p.pid: p for p in (Proc(1, 0, "S", "init", 1), Proc(10, 1, "S", "reaper", 2),
                              Proc(11, 10, "S", "main", 3), Proc(12, 11, "S", "child", 4),
                              Proc(20, 10, "S", "svc", 5), Proc(21, 20, "Z", "svc-child", 6),
                              Proc(30, 10, "S", "orphan", 7), Proc(40, 1, "S", "other", 8))}


def _scope(**kw):
    base = dict(pid=10, is_pid1=False, watch=False, main_pid=11, supervised={20}, phase="running")
    return SimpleNamespace(**{**base, **kw})


def test_a_subreaper_answers_for_its_descendants():
    assert scope.members(_scope(), TABLE) == {11, 12, 20, 21, 30}
    assert scope.members(_scope(), TABLE, children_index(TABLE.values())) == {11, 12, 20, 21, 30}


def test_pid1_and_watch_mode_answer_for_the_whole_namespace_but_reaper():
    everyone = set(TABLE) - {10}
    assert scope.members(_scope(is_pid1=True), TABLE) == everyone
    assert scope.members(_scope(watch=True), TABLE) == everyone
    assert not scope.whole(_scope()) and scope.whole(_scope(watch=True))


def test_the_kept_trees_are_the_main_childs_and_the_services():
    assert scope.kept(_scope(), TABLE) == {11, 12, 20, 21}
    assert scope.kept(_scope(main_pid=None, supervised=set()), TABLE) == set()
    assert scope.trees(TABLE, [30, 99]) == {30}         # a root gone from the table is left out


def test_the_supervisor_and_watch_scope_have_every_attribute_of_a_scope():
    from reaper.commands.watch import WatchScope
    from reaper.supervisor import Supervisor

    fields = {"pid", "is_pid1", "watch", "main_pid", "supervised", "phase"}
    assert fields == set(WatchScope.__slots__)
    log = SimpleNamespace(enabled=lambda level: False)
    sup = Supervisor(SimpleNamespace(), log, None, None, None, {})
    assert all(hasattr(sup, f) for f in fields) and sup.watch is False and sup.phase == "running"
