"""Dying memory cgroups on a pure cgroup v2 host, counted for real: cgroups made and
removed here while their page cache stays charged to them are what the root's
cgroup.stat, reaper's reaper_cgroup_v2_descendants and reaper node's report count, and
reaper node names the cgroup that holds them. Runs where the hierarchy's root holds the
memory controller (a node booted with cgroup_no_v1=all, .ci/check-cgroup2's QEMU guest);
skips on a hybrid or v1 host, whose counts test_node.py reads."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON, REAPER, SLOW, wait_for, rmdir_quietly
from metrics_helpers import Scrape, start_with_metrics, wait_scrape

ROOT = Path("/sys/fs/cgroup")
LEAVES = 12

pytestmark = pytest.mark.xdist_group("cpu-heavy")    # counts host-wide cgroups: not beside the others

# Each leaf: a child moves itself in, writes a file (page cache charged to the leaf) and
# exits; the leaf is removed and stays dying while the file's pages are cached.
MAKE_DYING = r'''
import os, sys
base, files, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(n):
    leaf = os.path.join(base, f"l{i}")
    os.mkdir(leaf)
    pid = os.fork()
    if pid == 0:
        with open(os.path.join(leaf, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        with open(os.path.join(files, f"f{i}"), "wb") as f:
            f.write(b"x" * 65536)
        os._exit(0)
    os.waitpid(pid, 0)
    os.rmdir(leaf)
'''


def _pure_v2() -> bool:
    try:
        return "memory" in (ROOT / "cgroup.controllers").read_text().split()
    except OSError:
        return False


def _root_dying() -> int:
    stat = dict(line.split() for line in (ROOT / "cgroup.stat").read_text().splitlines())
    return int(stat["nr_dying_descendants"])


@pytest.fixture
def dying_below(tmp_path):
    """(base, count): a cgroup of this test's own below the root, with count memory
    cgroups removed below it and still dying. Their page cache goes at the end, so the
    kernel can free them."""
    if not _pure_v2() or os.geteuid() != 0:
        pytest.skip("needs root on a pure cgroup v2 host (the root holds the memory controller)")
    base = ROOT / f"reaper-cg2-test-{os.getpid()}-{os.urandom(3).hex()}"
    files = tmp_path / "cache"
    files.mkdir()
    (ROOT / "cgroup.subtree_control").write_text("+memory")
    base.mkdir()
    try:
        (base / "cgroup.subtree_control").write_text("+memory")
        made = subprocess.run([PYTHON, "-c", MAKE_DYING, str(base), str(files), str(LEAVES)],
                              capture_output=True, text=True, timeout=60 * SLOW)
        assert made.returncode == 0, made.stderr
        yield base, LEAVES
    finally:
        for f in files.iterdir():
            f.unlink()                       # the page cache goes: the dying cgroups can be freed
        wait_for(lambda: rmdir_quietly(base), 10, 0.05, what=f"{base} to be removed")


def _root_stat(key: str) -> int:
    return int(dict(line.split() for line in (ROOT / "cgroup.stat").read_text().splitlines())[key])


def _held_below(base: Path) -> int:
    st = dict(line.split() for line in (base / "cgroup.stat").read_text().splitlines())
    return int(st["nr_dying_descendants"])


def test_dying_cgroups_are_counted_from_cgroup_stat_by_reaper_and_reaper_node(reaper, tmp_path, dying_below):
    base, n = dying_below
    assert _held_below(base) == n                    # the kernel's own count, below the test's cgroup
    assert _root_dying() >= n
    # reaper's exporter: the root's cgroup.stat, as the kernel gives it at the scrape.
    r, port = start_with_metrics(reaper, ["sleep", "600"])
    s = wait_scrape(port, lambda s: s.value("reaper_source_available", source="cgroup_stat") == 1,
                    "cgroup.stat read")
    dying = s.value("reaper_cgroup_v2_descendants", state="dying")
    assert dying is not None and dying >= n, dying
    assert s.value("reaper_cgroup_v2_descendants", state="live") >= 1          # the test's own cgroup
    s = wait_scrape(port, lambda s: s.value("reaper_cgroup_v2_descendants", state="dying") == _root_dying(),
                    "reaper_cgroup_v2_descendants to agree with cgroup.stat")
    # Per controller, where the kernel counts them (nr_subsys_*: 6.11 and later); absent where not.
    root_stat = dict(line.split() for line in (ROOT / "cgroup.stat").read_text().splitlines())
    if "nr_dying_subsys_memory" in root_stat:
        s = wait_scrape(port, lambda s: s.value("reaper_cgroup_v2_controller_cgroups", controller="memory",
                                                state="dying") == _root_stat("nr_dying_subsys_memory"),
                        "reaper_cgroup_v2_controller_cgroups to agree with cgroup.stat")
        assert s.value("reaper_cgroup_v2_controller_cgroups", controller="memory", state="dying") >= n
    else:
        assert not s.samples("reaper_cgroup_v2_controller_cgroups"), s.samples("reaper_cgroup_v2_controller_cgroups")
    r.kill()
    # reaper node: the same count, and the cgroup holding them named.
    mfile = tmp_path / "node.prom"
    p = subprocess.run([REAPER, "node", "--diagnose", "1", "--metrics-file", str(mfile)],
                       capture_output=True, text=True, timeout=60 * SLOW)
    assert "Traceback" not in p.stderr and p.returncode in (0, 1), p.stderr
    assert "Memory cgroups (cgroup v2, " in p.stdout, p.stdout
    m = re.search(r"^  live (\d+), dying (\d+)", p.stdout, re.M)
    assert m and int(m.group(2)) >= n, p.stdout
    assert f"/{base.name} ({n})" in p.stdout, p.stdout                          # held below the test's cgroup
    f = Scrape(mfile.read_text())
    assert f.value("reaper_node_memory_cgroups", state="dying") >= n
    assert f.value("reaper_node_cgroup_dying_children", cgroup=f"/{base.name}") == n
