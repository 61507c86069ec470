"""tests/README.md maps every module of reaper/ to its tests: a newcomer who changes a
module finds the tests to run there. The map is held to the tree: a module without a row,
a row for no module, or a test file that does not exist fails here."""
from __future__ import annotations

import re
from pathlib import Path

import reaper

TESTS = Path(__file__).resolve().parent
PACKAGE = Path(reaper.__file__).resolve().parent
ROW = re.compile(r"^\| `(reaper/[\w/]+\.py)` \|([^|]*)\|([^|]*)\|$", re.M)


def _rows() -> dict:
    rows = {}
    for module, unit, black_box in ROW.findall((TESTS / "README.md").read_text()):
        assert module not in rows, f"tests/README.md: two rows for {module}"
        rows[module] = [f.strip() for f in (unit + "," + black_box).split(",") if f.strip()]
    return rows


def test_every_module_has_a_row_and_every_row_a_module():
    rows = _rows()
    modules = {f"reaper/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*.py")}
    assert len(modules) > 50 and len(rows) > 50, "the tree or the table was not read"
    assert not modules - rows.keys(), f"add to tests/README.md's table: {sorted(modules - rows.keys())}"
    assert not rows.keys() - modules, f"tests/README.md names modules that are gone: {sorted(rows.keys() - modules)}"


def test_the_rows_name_test_files_that_exist():
    missing = {f for files in _rows().values() for f in files if not (TESTS / f).is_file()}
    assert not missing, f"tests/README.md names test files that do not exist: {sorted(missing)}"


def test_every_package_of_reaper_is_in_the_distribution():
    """pyproject.toml lists the packages a wheel carries; an editable install finds any
    directory, so a new subpackage missing from the list passes here and breaks every
    install from the wheel or the sdist."""
    root = TESTS.parent                               # the source tree (a checkout, an unpacked sdist)
    line = re.search(r"^packages = \[(.*)\]$", (root / "pyproject.toml").read_text(), re.M)
    listed = set(re.findall(r'"([\w.]+)"', line.group(1)))
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "reaper").rglob("__init__.py")}
    assert len(found) > 5 and found == listed
