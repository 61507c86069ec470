"""reaper is typed (PEP 561): py.typed ships in the package, reaper/_core.pyi types the cffi
extension after csrc/reaper_core.h, and reaper/_native.py, the facade over it, passes
mypy --strict. A program that misuses the facade is refused: the types are real, not Any.
Run on the reaper that is imported (the source tree, or an install from the sdist in
.ci/check-pythons: there mypy finds it through py.typed alone)."""
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

import reaper

from conftest import importable, require

PKG = Path(reaper.__file__).resolve().parent
HEADER = Path(__file__).resolve().parents[1] / "csrc" / "reaper_core.h"


def _mypy(args: list, cwd: Path, mypypath: str = "") -> subprocess.CompletedProcess:
    require("mypy", importable("mypy"), "pip install -e '.[test]'")
    env = {k: v for k, v in os.environ.items() if k != "MYPYPATH"}
    if mypypath:
        env["MYPYPATH"] = mypypath
    return subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                           "--cache-dir", os.devnull, "--hide-error-context", *args],
                          cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=300)


def _installed() -> bool:
    """reaper is a regular install in site-packages (not the source tree, not editable)."""
    return str(PKG.parent) in site.getsitepackages() + [site.getusersitepackages()]


def test_py_typed_and_the_stub_ship_in_the_package():
    assert (PKG / "py.typed").is_file()
    assert (PKG / "_core.pyi").is_file()


def test_the_stub_declares_what_the_header_does():
    """reaper/_core.pyi by hand after csrc/reaper_core.h: every function with its number of
    arguments, every #define, and every field of the structs _native reads or writes."""
    header = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    stub = (PKG / "_core.pyi").read_text()
    functions = re.findall(r"^int (reaper_\w+)\(([^)]*)\);", header, re.M | re.S)
    # Every declaration is checked: one the pattern stopped matching would be skipped silently.
    declared = set(re.findall(r"^[a-z][\w \t*]*?\b(reaper_\w+)\(", header, re.M))
    assert functions and {name for name, _ in functions} == declared, sorted(declared)
    for name, params in functions:
        nargs = 0 if params.strip() == "void" else params.count(",") + 1
        m = re.search(rf"def {name}\(self,?([^)]*)\)", stub)
        assert m, f"_core.pyi has no {name}"
        declared = [p for p in m.group(1).replace("\n", " ").split(",") if p.strip() not in ("", "/")]
        assert len(declared) == nargs, (name, declared)
    for macro in re.findall(r"^#define (REAPER_[A-Z_]+) ", header, re.M):
        if macro != "REAPER_CORE_H":
            assert re.search(rf"^    {macro}: int$", stub, re.M), f"_core.pyi has no {macro}"
    for struct, cls in (("reaper_event", "Event"), ("reaper_totals", "Totals"), ("reaper_config", "Config"),
                        ("reaper_state", "State"), ("reaper_waiter", "WaiterStruct"),
                        ("reaper_spawn_extra", "SpawnExtra")):
        body = re.search(rf"struct {struct} {{(.*?)}};", header, re.S).group(1)
        fields = re.findall(r"(\w+)(?:\[[^\]]*\])?;", body)
        declared = re.search(rf"^class {cls}:\n((?:    .*\n)+)", stub, re.M).group(1)
        assert set(fields) == set(re.findall(r"^    (\w+):", declared, re.M)), struct


def test_the_native_facade_passes_mypy_strict(tmp_path):
    # A copy of the files: mypy run in site-packages would take every module there for ours.
    (tmp_path / "reaper").mkdir()
    for name in ("__init__.py", "_native.py", "_core.pyi", "py.typed"):
        shutil.copy(PKG / name, tmp_path / "reaper" / name)
    r = _mypy(["reaper/_native.py"], cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    assert "Success: no issues found in 1 source file" in r.stdout, r.stdout


def test_mypy_refuses_a_wrong_use_of_the_facade(tmp_path):
    """From outside the package, as a user's program: the facade's types reach it."""
    prog = tmp_path / "use_native.py"
    prog.write_text(
        "from reaper import _native\n"
        "w = _native.Waiter(3, _native.REAP_LATENCY_BUCKETS)\n"
        "reveal_type(w.wait(0))\n"
        "reveal_type(_native.spawn)\n"
        "_native.exit_code('3')\n"                       # a str for a wait status
        "events, done, more = w.wait(-1)\n"
        "events[0].signal\n"                              # no such field: it is signo
        "_native.forward_table({'TERM': 15})\n")          # signal names for numbers
    r = _mypy([prog.name], cwd=tmp_path, mypypath="" if _installed() else str(PKG.parent))
    out = r.stdout
    assert r.returncode == 1, out
    assert 'Revealed type is "tuple[builtins.list[reaper._core.Event], builtins.bool, builtins.bool]"' in out \
        or 'Revealed type is "tuple[list[reaper._core.Event], bool, bool]"' in out, out
    assert re.search(r"Revealed type is \"def \(argv: builtins\.list\[builtins\.str\]|"
                     r"Revealed type is \"def \(argv: list\[str\]", out), out
    errors = re.findall(r"^use_native\.py:(\d+): error: .*\[([\w-]+)\]$", out, re.M)
    assert sorted(errors) == [("5", "arg-type"), ("7", "attr-defined"), ("8", "dict-item")], out


def test_the_budget_kinds_their_door_and_their_fake_pass_mypy_strict(tmp_path):
    """The kinds see a Sample and act through an Actions door, both protocols
    (reaper/budgets/kinds/__init__.py): the kinds, the real door (actions.py) and the
    kinds' test fake (tests/budget_recorder.py) are checked against them, so the
    interface the kinds use is declared, not mirrored. Imports are followed silently:
    the rest of the budgets is not typed strictly."""
    if _installed():
        pytest.skip("run on the source tree: the budgets' test fake is not installed")
    tests = Path(__file__).resolve().parent
    files = sorted(str(p) for p in (PKG / "budgets" / "kinds").glob("*.py"))
    files += [str(PKG / "budgets" / "actions.py"), str(tests / "budget_recorder.py")]
    r = _mypy(["--follow-imports=silent", *files], cwd=tmp_path, mypypath=f"{PKG.parent}:{tests}")
    assert r.returncode == 0, r.stdout
    assert f"Success: no issues found in {len(files)} source files" in r.stdout, r.stdout
