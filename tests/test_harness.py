"""The harness itself (conftest.py): what it guards and cleans up must hold, or the
suite proves less than it says. Issue 22."""
import ast
import os
import subprocess
from pathlib import Path

import pytest

import budget_helpers as bh
from conftest import PYTHON, Reaper, port_block, usable_ports, wait_for, why_user_cannot_run

HERE = Path(__file__).resolve().parent


def test_a_missing_dependency_under_ci_and_xdist_fails_naming_it(tmp_path):
    """CI=true with -n 2: each test that needs it fails with the line naming it, and the
    run ends with exit 1, not an xdist INTERNALERROR (pytest.exit in a worker)."""
    (tmp_path / "test_needs.py").write_text(
        f"import sys\nsys.path.insert(0, {str(HERE)!r})\nfrom conftest import importable, require\n\n"
        "def test_a():\n    require('no_such_module_r22', importable('no_such_module_r22'), 'pip install it')\n\n"
        "def test_b():\n    assert True\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CI"))}
    p = subprocess.run([PYTHON, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", "-q", "-rf",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_needs.py")],
                       cwd=tmp_path, env={**env, "CI": "true"}, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert "INTERNALERROR" not in out, out
    assert p.returncode == 1, out
    assert "no_such_module_r22 is missing, though .ci/run installs it (pip install it)" in out, out
    assert "1 failed, 1 passed" in out, out


def test_the_user_check_fails_where_the_user_cannot_reach_the_program(tmp_path):
    """uid 1000 cannot exec a program in a directory only root may search; setpriv,
    still holding root's capabilities at its exec, would have run it."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to uid 1000")
    d = Path(__import__("tempfile").mkdtemp(prefix="rt", dir="/tmp"))
    try:
        prog = d / "prog"
        prog.write_text("#!/bin/sh\nexit 0\n")
        prog.chmod(0o755)
        d.chmod(0o700)
        assert "Permission denied" in why_user_cannot_run(1000, [str(prog)])
        assert why_user_cannot_run(0, [str(prog)]) == ""
        d.chmod(0o755)
        assert why_user_cannot_run(1000, [str(prog)]) == ""
    finally:
        prog.unlink()
        d.rmdir()


@pytest.mark.parametrize("workers", [1, 2, 27, 64, 200])
def test_every_worker_has_ports_of_its_own(workers):
    blocks = [port_block(w, workers) for w in range(workers)]
    taken = [p for b in blocks for p in b]
    assert len(taken) == len(set(taken))                 # no two workers share a port
    assert min(len(b) for b in blocks) >= 16
    assert set(taken) <= set(usable_ports())
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = (int(x) for x in f.read().split())
    assert not [p for p in taken if low <= p <= high]    # none an outgoing connection may take


def test_a_worker_that_used_its_block_starts_it_again():
    """Handing out more ports than a block holds goes round, it does not run out."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import conftest\n"
            "block = conftest.port_block(5, 64)\n"
            "got = [conftest.reserve_ports(3)[0] for _ in range(len(block))]\n"
            "assert set(got) <= set(block), got\n"
            "print(len(got), len(set(got)))\n")
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw5", "PYTEST_XDIST_WORKER_COUNT": "64"}
    p = subprocess.run([PYTHON, "-c", code, str(HERE)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    handed, distinct = (int(x) for x in p.stdout.split())
    assert handed > distinct > 0


@bh.needs_v1
@pytest.mark.xdist_group("cpu-heavy")
def test_a_killed_reaper_leaves_no_stray_cgroup_though_it_logged_none():
    """Without -v reaper names no cgroup; Reaper.kill finds them by the directories
    reaper holds open and removes them after the SIGKILL."""
    tag = bh.marker()
    r = Reaper(["--cpu-budget", "0.1", "--budget-action", "throttle", *bh.FAST, "--",
                *bh.orphans_then_sleep(bh.busy_argv(tag))])
    try:
        (pid,) = bh.wait_tagged(tag)
        leaf = wait_for(lambda: (lambda c: c if "reaper-strays." in c else None)(bh.cpu_cgroup(pid)), 30,
                        what="the stray throttled")
        base = bh.V1_CPU + leaf.rsplit("/", 1)[0]
        assert os.path.isdir(base)
    finally:
        r.kill()
    assert "reaper-strays" not in r.stderr, r.stderr       # nothing logged to find it by
    assert not os.path.exists(base), f"{base} left behind"



# What a require() names -> the marker that lets a run leave the test out (.ci/check-pythons
# runs -m 'not ray and not container and not prometheus' where those are not installed).
NEEDS_MARKER = {"ray": "ray", "promtool": "prometheus", "prometheus": "prometheus"}


def _marks(decorators) -> set:
    """pytest.mark.NAME (called or not) among decorators or a pytestmark value."""
    out = set()
    for d in decorators:
        d = d.func if isinstance(d, ast.Call) else d
        if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Attribute) and d.value.attr == "mark":
            out.add(d.attr)
    return out


def _needs(fn) -> tuple:
    """(markers fn's own require() calls need, names of the functions it calls)."""
    needs, calls = set(), set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            calls.add(node.func.id)
            if node.func.id == "require" and node.args and isinstance(node.args[0], ast.Constant):
                if node.args[0].value in NEEDS_MARKER:
                    needs.add(NEEDS_MARKER[node.args[0].value])
    return needs, calls


def test_a_test_that_needs_ray_or_prometheus_carries_its_marker():
    """A test whose require() (its own, a helper's or a fixture's in its module) needs Ray
    or Prometheus is marked so: unmarked, the runs that leave those out by marker (the
    Python 3.9 and 3.13 runs of .ci/check-pythons) fail it under CI=true."""
    unmarked = []
    for path in sorted(HERE.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_marks: set = set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                    for t in node.targets):
                value = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                module_marks |= _marks(value)
        funcs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        own = {name: _needs(fn) for name, fn in funcs.items()}

        def needed(name: str, seen: set) -> set:
            if name in seen or name not in own:
                return set()
            seen.add(name)
            direct, calls = own[name]
            args = [a.arg for a in funcs[name].args.args]
            return direct.union(*(needed(c, seen) for c in calls | set(args)))
        for name, fn in funcs.items():
            if name.startswith("test_"):
                missing = needed(name, set()) - _marks(fn.decorator_list) - module_marks
                if missing:
                    unmarked.append(f"{path.name}::{name} needs @pytest.mark.{', '.join(sorted(missing))}")
    assert not unmarked, unmarked
