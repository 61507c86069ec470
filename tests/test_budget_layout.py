"""The budgets engine's layout (reaper/budgets/, docs/architecture.md "The budgets"),
held on the source, beside tests/test_import_graph.py: an engine of parts that each own
their state, and kinds that see a read-only sample and act through one door.

1. Only enforcer.py imports the engine's parts (book, schedule, reader, actions, publish).
2. Nothing but enforcer.py has a parameter or attribute named `enf`, or an Enforcer.
3. The kinds import, of reaper, only kinds/__init__, lineage.who, their cgroup holders
   (throttle, memory_cgroup) and procctl.Gone.
4. What Book and Schedule hold is assigned, or mutated (append, add, pop, [] =, del ...),
   only in their own module: elsewhere they are `book` and `schedule`, read only.
5. No module reaches into another's `_`-attributes.
6. One way to start tracking a stray (Book.track): only book.py and dormant.py (thaw)
   make a Tracked; kinds' state is asked through hooks, not probed with getattr
   outside kinds/; the levels have names (no `level >= 2`).
"""
from __future__ import annotations

import ast
from pathlib import Path

import reaper

BUDGETS = Path(reaper.__file__).resolve().parent / "budgets"
PARTS = {"book", "schedule", "reader", "actions", "publish"}
OWNED = {"book": "book.py", "schedule": "schedule.py"}
MUTATORS = {"append", "add", "pop", "popleft", "clear", "update", "remove", "discard", "extend", "setdefault",
            "insert", "appendleft", "put", "set_memory", "__setitem__", "__delitem__"}


def _modules() -> dict:
    return {p.relative_to(BUDGETS).as_posix(): ast.parse(p.read_text(), str(p)) for p in sorted(BUDGETS.rglob("*.py"))}


def _imports(tree: ast.AST) -> list:
    """(module, name) of every `from reaper... import name` and `import reaper...`, at any depth."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("reaper"):
            out += [(n.module, a.name) for a in n.names]
        elif isinstance(n, ast.Import):
            out += [(a.name, None) for a in n.names if a.name.startswith("reaper")]
    return out


def _base(node: ast.AST) -> str | None:
    """The part a chain like book.tracked[...] or self.book.dormant starts from: `book`
    or `schedule` (as a name, or as an attribute of anything), else None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        value = node.value
        if isinstance(value, ast.Name) and value.id in OWNED:
            return value.id
        if isinstance(value, ast.Attribute) and value.attr in OWNED and isinstance(node, ast.Attribute):
            return value.attr
        node = value
    return None


def test_only_the_engine_imports_its_parts():
    for name, tree in _modules().items():
        if name == "enforcer.py":
            continue
        for module, what in _imports(tree):
            part = module.rsplit(".", 1)[-1] if module != "reaper.budgets" else what
            assert not (module.startswith("reaper.budgets") and part in PARTS), f"{name} imports {module} {what or ''}"


def test_nothing_but_the_engine_holds_the_enforcer():
    for name, tree in _modules().items():
        if name == "enforcer.py":
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.arg):
                assert n.arg != "enf", f"{name}:{n.lineno}: a parameter named enf"
            elif isinstance(n, ast.Attribute):
                assert n.attr != "enf", f"{name}:{n.lineno}: an attribute named enf"
            elif isinstance(n, ast.Name):
                assert n.id not in ("enf", "Enforcer"), f"{name}:{n.lineno}: {n.id}"
        assert ("reaper.budgets.enforcer", "Enforcer") not in _imports(tree), name


def test_the_kinds_import_only_their_interface():
    allowed = {("reaper.budgets.kinds", "Kind"), ("reaper.budgets.lineage", "who"), ("reaper.procctl", "Gone")}
    holders = {"reaper.budgets.throttle", "reaper.budgets.memory_cgroup"}
    for name, tree in _modules().items():
        if not name.startswith("kinds/"):
            continue
        for module, what in _imports(tree):
            assert (module, what) in allowed or module in holders, f"{name} imports {what} from {module}"


def test_book_and_schedule_are_written_only_in_their_own_module():
    for name, tree in _modules().items():
        for n in ast.walk(tree):
            targets: list = []
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in MUTATORS:
                targets = [n.func.value]
            for t in targets:
                for leaf in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    # book.drop(...): a method of the part's is its own to call; book.tracked.pop(...) is not.
                    part = _base(leaf) if isinstance(leaf, (ast.Attribute, ast.Subscript)) else None
                    assert part is None or OWNED[part] == name, \
                        f"{name}:{n.lineno}: writes {part}'s state: {ast.unparse(leaf)}"


def test_no_reach_into_another_modules_private_attributes():
    private = {}
    trees = _modules()
    for name, tree in trees.items():
        own = set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name.startswith("_"):
                own.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and n.attr.startswith("_"):
                own.add(n.attr)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("_"):
                own.add(n.value)                # __slots__ entries
        private[name] = own
    for name, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.startswith("__"):
                if isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
                    continue
                assert n.attr in private[name], f"{name}:{n.lineno}: reaches into {ast.unparse(n)}"


def test_one_way_to_track_and_kinds_asked_not_probed():
    for name, tree in _modules().items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "Tracked":
                assert name in ("book.py", "dormant.py"), f"{name}:{n.lineno}: a Tracked made outside book.py"
            if isinstance(n, ast.FunctionDef) and n.name in ("track", "_track", "_hop_of"):
                assert name in ("book.py", "hops.py"), f"{name}: defines {n.name}"
            if name.startswith("kinds/"):
                continue
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                    and len(n.args) > 1 and isinstance(n.args[1], ast.Constant):
                assert n.args[1].value not in ("over", "cycling", "leaf", "watch", "phase", "supervised", "mount"), \
                    f"{name}:{n.lineno}: probes {n.args[1].value}"
        for n in ast.walk(tree):
            if isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute) and n.left.attr == "level":
                assert not any(isinstance(c, ast.Constant) for c in n.comparators), \
                    f"{name}:{n.lineno}: a level by number: {ast.unparse(n)}"
    assert sum(1 for t in _modules().values() for n in ast.walk(t)
               if isinstance(n, ast.FunctionDef) and n.name == "track") == 1


def test_no_budgets_module_is_over_700_lines():
    for p in BUDGETS.rglob("*.py"):
        assert len(p.read_text().splitlines()) <= 700, p
