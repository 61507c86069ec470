"""reaper's modules import each other without cycles, and the way from start to the
child's exec loads only the modules pinned here.

The import graph is read from the source (the AST of every module of the package),
not from a running reaper. Imports inside functions are edges as much as those at the
top of a module: reaper imports most of its modules in functions (to keep them off the
way to the child's exec), and a cycle through a function-level import is still a
cycle. It only works as long as nobody calls the function while the other module is
half initialised, and moving the import to the top, or calling the function at import
time, breaks it with an ImportError far from the change. Layers must not depend on
each other both ways, however lazily.

The start path is measured in a real interpreter: a small launcher starts `reaper
ARGS` as bin/reaper does (reaper.cli.run()), with reaper._native.spawn replaced by a
function that records sys.modules, the moment the real one would fork and exec the
child, and exits. What was loaded by then, less what the interpreter had loaded
before reaper (taken at the launcher's start), is what reaper costs its child's
start. The launcher runs with -S (no site): site and the .pth files of the
environment import modules of their own (typing, threading, zipfile and more, with
certifi or setuptools installed), which would hide the same imports made by reaper.
PYTHONPATH gives it reaper's package and cffi's backend instead. This is more robust
than `python -X importtime`, whose report covers the whole run (after the exec too)
and whose format is for people, and than running a child that lists its modules
(those are the child's, not reaper's).
"""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import reaper

PACKAGE = Path(reaper.__file__).parent

# Cycles tolerated, each a set of modules (a strongly connected component of the
# graph): none. A cycle listed here but gone does not fail.
KNOWN_CYCLES: set = set()

# The modules loaded before the child's exec of `reaper [OPTIONS] -- COMMAND`: the
# command line (cli, options and its text helpers), the spawn, and the C core
# (reaper._core: cffi's .lib, and _cffi_backend beside the package).
START = {"reaper", "reaper.cli", "reaper.options", "reaper.text", "reaper.spawn", "reaper._native",
         "reaper._core", "reaper._core.lib", "_cffi_backend"}
# -r and -p: the signal names too.
WITH_SIGNALS = START | {"reaper.signals"}
# Named for a clear message: none of them may be loaded before the exec of the runs
# below (reaper.log opens /proc/self/fd/2; the rest are large, or import re, enum,
# typing or threads). --metrics loads some, to bind its port before the spawn.
SLOW = {"reaper.log", "reaper.boundary", "reaper.pieces", "reaper.usage", "reaper.values", "reaper.commands",
         "re", "argparse", "getopt", "gettext", "enum", "typing", "dataclasses", "logging", "threading",
         "signal", "socket", "errno", "__future__", "psutil", "prometheus_client", "setproctitle", "cffi"}


# --- (a) the import graph --------------------------------------------------------------

def _modules() -> dict:
    """{module name: path} of every module of the reaper package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imported(module: str, is_package: bool, node) -> list:
    """The names an Import or ImportFrom node imports (a module, or a name in one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return [_base(module, is_package, node)] + [f"{_base(module, is_package, node)}.{a.name}" for a in node.names]


def _base(module: str, is_package: bool, node) -> str:
    base = node.module or ""
    if node.level:                     # relative: from . import x, from ..y import z
        parent = module.split(".")[:len(module.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parent + ([node.module] if node.module else []))
    return base


def _takes_from_package(module: str, is_package: bool, node, modules: dict) -> "str | None":
    """The package whose own code (its __init__) `from PACKAGE import name` takes a name
    of, when PACKAGE is one of module's: a real edge to it (from reaper.commands import
    answered, in reaper.commands.stats), unlike the load of a module's own packages."""
    if not isinstance(node, ast.ImportFrom):
        return None
    base = _base(module, is_package, node)
    if base in modules and module.startswith(base + ".") and \
            any(f"{base}.{a.name}" not in modules for a in node.names):
        return base
    return None


def import_graph() -> dict:
    """{module: {modules it imports}} within the package, imports anywhere in the module
    (top level, functions, methods) and the packages each import runs the __init__ of."""
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            package = _takes_from_package(name, path.name == "__init__.py", node, modules)
            if package is not None:
                edges.add(package)
            for target in _imported(name, path.name == "__init__.py", node):
                parts = target.split(".")
                for i in range(1, len(parts) + 1):     # reaper.a.b runs reaper/a/__init__ first
                    t = ".".join(parts[:i])
                    # A module's own packages are loaded before it: not an edge.
                    if t in modules and t != name and not name.startswith(t + "."):
                        edges.add(t)
        graph[name] = edges
    return graph


def cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=sorted)


def test_the_graph_sees_module_and_function_level_imports():
    """The control: edges the test must see, or it would pass on an empty graph."""
    graph = import_graph()
    assert "reaper.options" in graph["reaper.cli"]                # at the top
    assert "reaper.spawn" in graph["reaper.pieces"]               # in a function
    assert "reaper.boundary" in graph["reaper.cli"]               # in a function, after the spawn
    assert {"reaper.commands", "reaper.commands.watch"} <= graph["reaper.cli"] | graph["reaper.commands"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    # A name taken from a package's own code is an edge to it; a submodule of it is not.
    assert "reaper.metrics" not in graph["reaper.metrics.sections.budget"]
    tree = ast.parse("from reaper.metrics import names\nfrom reaper.metrics import prepare\n")
    modules = _modules()
    got = [_takes_from_package("reaper.metrics.client", False, n, modules) for n in tree.body]
    assert got == [None, "reaper.metrics"]


def test_no_import_cycles():
    graph = import_graph()
    unknown = [c for c in cycles(graph) if c not in KNOWN_CYCLES]
    lines = []
    for component in unknown:
        lines.append(" <-> ".join(sorted(component)) + ":")
        lines += [f"    {m} imports {', '.join(sorted(graph[m] & component))}" for m in sorted(component)]
    assert not unknown, ("import cycles (a function-level import counts: see this module's docstring); "
                         "move what both need to a module of its own:\n" + "\n".join(lines))


MAX_MODULE_LINES = 700     # a module past this is two concerns (docs/architecture.md)


def private_reach_ins(modules: dict) -> list:
    """Where a module of the package takes a private name (_x) of another: imports it
    (from reaper.a import _x) or reads it through the module (a._x, reaper.a._x). A
    private module (reaper._native, the typed facade of the C core) imported whole is
    the package's own and no reach-in; a name inside it is."""
    found = []
    for name, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        aliases = {}                              # local name -> the module of the package it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _base(name, is_package, node)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in modules:
                        aliases[a.asname or a.name] = full
                    elif a.name.startswith("_") and not a.name.startswith("__") and base in modules \
                            and base != name:
                        found.append(f"{path.name}:{node.lineno}: from {base} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in modules:
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            base, dotted = node.value, []
            while isinstance(base, ast.Attribute):
                dotted.insert(0, base.attr)
                base = base.value
            if isinstance(base, ast.Name) and base.id in aliases:
                owner = ".".join([aliases[base.id]] + dotted)
                if owner in modules and owner != name and f"{owner}.{node.attr}" not in modules:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_reaches_into_another_modules_private_names(tmp_path):
    assert private_reach_ins(_modules()) == []
    # The control: the check sees both forms, and lets a private module imported whole pass.
    pkg = tmp_path / "reaper"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_core.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("_x = 1\n")
    (pkg / "b.py").write_text("from reaper.a import _x\nfrom reaper import a, _core\nprint(a._x, _core)\n")
    fake = {"reaper": pkg / "__init__.py", "reaper.a": pkg / "a" / "__init__.py",
            "reaper._core": pkg / "_core.py", "reaper.b": pkg / "b.py"}
    assert private_reach_ins(fake) == ["b.py:1: from reaper.a import _x", "b.py:3: a._x"]


def test_no_module_is_over_700_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert len(sizes) > 50                        # the package was found
    assert {n: k for n, k in sizes.items() if k > MAX_MODULE_LINES} == {}


def test_text_helpers_and_signals_import_no_other_module_of_reaper():
    """The modules every layer uses, on the way to the exec too, sit at the bottom."""
    graph = import_graph()
    assert graph["reaper.text"] == set()
    assert graph["reaper.signals"] <= {"reaper.text"}
    assert graph["reaper.usage"] <= {"reaper.text"}


# --- (b) the start path ------------------------------------------------------------------

LAUNCHER = r'''
import os, sys
before = set(sys.modules)       # the interpreter's own (and os: site imports it in every real run)
from reaper import _native


def spawn(*args, **kwargs):
    loaded = sorted(set(sys.modules) - before)
    with open(os.environ["IMPORT_GRAPH_OUT"], "w") as f:
        f.write("\n".join(loaded))
    os._exit(0)


_native.spawn = spawn
sys.argv = ["reaper", *sys.argv[1:]]
from reaper.cli import run      # as bin/reaper does
run()
'''


def loaded_before_exec(tmp_path, argv: list, env: "dict | None" = None) -> set:
    import _cffi_backend

    out = tmp_path / "modules"
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("REAPER_", "TINI_", "PYTHON"))}
    clean.update(env or {}, IMPORT_GRAPH_OUT=str(out),
                 PYTHONPATH=os.pathsep.join([str(PACKAGE.parent), os.path.dirname(_cffi_backend.__file__)]))
    p = subprocess.run([sys.executable, "-S", str(launcher), *argv], env=clean, stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and out.exists(), f"the launcher did not reach the spawn: {p.stderr}"
    return set(out.read_text().split())


# --metrics: the port is bound before the spawn (a bad one fails before the child starts):
# the exporter's binding (reaper.metrics) and the Exporter it returns (reaper.metrics.exporter,
# which imports nothing the binding did not), the log for its one WARN line, and Stats.
WITH_METRICS = WITH_SIGNALS | {"reaper.log", "reaper.stats", "reaper.values", "reaper.metrics",
                               "reaper.metrics.exporter"}


def test_the_modules_loaded_before_the_childs_exec_with_metrics_are_pinned(tmp_path):
    """What --metrics loads of reaper before the exec: the binding, not the exporter's
    routes, sections, sampler, HTTP server or prometheus_client (imported after the spawn)."""
    from conftest import free_port

    loaded = loaded_before_exec(tmp_path, ["--metrics-port", str(free_port()), "--metrics-address", "127.0.0.1",
                                           "--", "true"])
    ours = {m for m in loaded if m.split(".")[0] in ("reaper", "_cffi_backend")}
    assert ours == WITH_METRICS, f"new {sorted(ours - WITH_METRICS)}, gone {sorted(WITH_METRICS - ours)}"
    assert not loaded & {"prometheus_client", "reaper.httpserver", "typing", "psutil"}


@pytest.mark.parametrize("argv,env,expected", [
    (["--", "true"], None, START),
    (["true"], {"REAPER_GRACE": "10", "TINI_SUBREAPER": ""}, START),
    (["-g", "-w", "-v", "-c", "--grace", "3", "--no-drain", "--exit-zero-on-stop", "--", "true"], None, START),
    (["--cpu-budget", "1", "--memory-budget", "1G", "--stray-max-age", "60", "--", "true"], None, START),
    (["--", "true"], {"REAPER_VERBOSITY": "2", "REAPER_REMAP_EXIT": "143"}, START),
    (["-e", "143", "-r", "TERM:INT", "-p", "KILL", "--", "true"], None, WITH_SIGNALS),
], ids=["plain", "variables", "core-flags", "budgets", "verbosity", "signals"])
def test_the_modules_loaded_before_the_childs_exec_are_pinned(tmp_path, argv, env, expected):
    """Not with --metrics (the port is bound before the spawn, so that a bad one fails
    before the child starts: the exporter is loaded then), nor with services or -P (no
    child is spawned before the loop)."""
    loaded = loaded_before_exec(tmp_path, argv, env)
    assert not loaded & SLOW, f"loaded before the child's exec, which nothing may slow: {sorted(loaded & SLOW)}"
    assert loaded == expected, (
        "the modules loaded before the child's exec changed: "
        f"new {sorted(loaded - expected)}, gone {sorted(expected - loaded)}. Import what is new in the "
        "function that needs it, after the spawn (or, if it must be on the way, pin it here and say why)")
