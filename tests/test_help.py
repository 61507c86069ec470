"""Help a person can read: every command's --help fits 80 columns (wrapped to the
terminal's width when it is wider), lists its environment variables and ends with
where its documentation is; every subcommand has -V and reaper's wording for errors."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import REAPER

DOCS = Path(__file__).resolve().parent.parent / "docs"
COMMANDS = {"": ("reaper.md", ["REAPER_GRACE", "REAPER_METRICS_PORT", "REAPER_CPU_BUDGET"]),
            "stats": ("reaper-stats.md", ["REAPER_METRICS_PORT", "REAPER_METRICS_ADDRESS"]),
            "top": ("reaper-top.md", ["REAPER_METRICS_PORT", "REAPER_METRICS_ADDRESS", "REAPER_STRAY_MATCH"]),
            "watch": ("reaper-watch.md", ["REAPER_METRICS_PORT", "REAPER_CPU_BUDGET", "REAPER_QUIET"]),
            "node": ("reaper-node.md", ["REAPER_NODE_WINDOW", "REAPER_METRICS_PORT", "REAPER_QUIET"])}


def _run(args, columns=None):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([REAPER, *args], capture_output=True, text=True, timeout=30, env=env)


def _argv(name, *rest):
    return [name, *rest] if name else list(rest)


@pytest.mark.parametrize("name", COMMANDS, ids=lambda n: n or "reaper")
def test_help_fits_80_columns_lists_its_variables_and_ends_with_its_docs(name):
    page, variables = COMMANDS[name]
    out = _run(_argv(name, "--help"))          # a pipe: no terminal to ask, 80 columns
    assert out.returncode == 0 and out.stderr == "", out
    lines = out.stdout.splitlines()
    wide = [ln for ln in lines if len(ln) > 80]
    assert not wide, wide
    for var in variables:
        assert var in out.stdout, var
    last = " ".join(out.stdout.strip().split("\n\n")[-1].split())
    assert last.startswith(f"Documentation: docs/{page} "), last
    assert (DOCS / page).is_file(), page


@pytest.mark.parametrize("name", COMMANDS, ids=lambda n: n or "reaper")
def test_help_uses_a_wider_terminal(name):
    narrow = _run(_argv(name, "--help")).stdout.splitlines()
    wide = _run(_argv(name, "--help"), columns=132).stdout.splitlines()
    assert max(len(ln) for ln in wide) <= 132
    assert max(len(ln) for ln in wide) > 80 and len(wide) < len(narrow), "\n".join(wide)


@pytest.mark.parametrize("name", [n for n in COMMANDS if n])
def test_every_subcommand_has_dash_V(name):
    out = _run([name, "-V"])
    assert out.returncode == 0 and re.fullmatch(r"reaper \S+\n", out.stdout), out


@pytest.mark.parametrize("name", COMMANDS, ids=lambda n: n or "reaper")
def test_errors_have_reapers_wording(name):
    who = f"reaper {name}" if name else "reaper"
    out = _run(_argv(name, "--no-such-flag"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"{who}: unknown option --no-such-flag (see '{who} --help')\n", out.stderr
    if name:
        out = _run([name, "stray-word"])
        assert out.returncode == 2
        assert out.stderr == f"{who}: unexpected argument 'stray-word' (see '{who} --help')\n", out.stderr


def test_every_docs_page_opens_with_a_quick_start():
    """Each page in docs/ starts small: its first section is a quick start."""
    pages = sorted(DOCS.glob("*.md"))
    assert len(pages) > 10
    late = [p.name for p in pages if re.search(r"^## (.*)$", p.read_text(), re.M).group(1) != "Quick start"]
    assert not late, late
