"""`reaper top`: the live view of a running reaper, driven in a real terminal (tmux: a
pane of 80x24, read with capture-pane, keys sent with send-keys), against a real
reaper as PID 1 with a stray and a zombie; its one frame over a pipe; without rich."""
import os
import shutil
import subprocess
import uuid

import pytest

from conftest import REAPER, require, wait_for
from metrics_helpers import start_with_metrics, wait_scrape, write_script

SCENE = """
import os, subprocess, sys, time
d = sys.argv[1]
# The stray: an orphan (its parent exits at once), asleep.
subprocess.run(["sh", "-c", "(exec sleep 300 &)"])
# The zombie: a child of the one below, never waited for.
parent = subprocess.Popen([sys.executable, "-c",
                           "import os, time\\nif os.fork() == 0: os._exit(0)\\ntime.sleep(300)"])
open(os.path.join(d, "ready"), "w").close()
time.sleep(300)
"""


class Tmux:
    """A tmux server of this test's own (-L: its socket), killed at the end."""

    def __init__(self) -> None:
        self.sock = f"reaper-top-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.name = "top"

    def __call__(self, *args) -> str:
        out = subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, timeout=10)
        assert out.returncode == 0, (args, out.stderr)
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", self.name)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux():
    require("tmux", shutil.which("tmux") is not None, "apt-get install tmux (.ci/apt-packages)")
    t = Tmux()
    yield t
    t.close()


def _scene(reaper, tmp_path):
    """A reaper (PID 1) whose main child left a stray (an orphan, observed after its
    age limit) and holds a zombie; (reaper, port, the stray's pid, the zombie's parent's
    pid), pids as reaper's namespace sees them."""
    r, port = start_with_metrics(reaper, [*write_script(tmp_path, "scene.py", SCENE), str(tmp_path)],
                                 ["--stray-max-age", "0.5", "--budget-action", "observe",
                                  "--budget-interval", "0.2"])
    s = wait_scrape(port, lambda s: s.value("reaper_zombies") == 1 and
                    any(x.labels["action"] == "observe" for x in s.samples("reaper_stray_cpu_cores")),
                    "the zombie and the observed stray")
    stray = [x.labels["pid"] for x in s.samples("reaper_stray_cpu_cores")]
    assert [x.labels["reason"] for x in s.samples("reaper_stray_cpu_cores")] == ["orphan"]
    parent = [x.labels["parent_pid"] for x in s.samples("reaper_zombies_by_parent")]
    assert len(stray) == 1 and len(parent) == 1, (stray, parent)
    return r, port, stray[0], parent[0]


def test_top_in_a_terminal_shows_the_stray_and_the_zombie_and_quits_on_q(reaper, tmp_path, tmux):
    require("rich", _has_rich(), "pip install 'reaper-init[top]'")
    r, port, stray, parent = _scene(reaper, tmp_path)
    # In reaper's PID namespace, as kubectl exec would be: nsenter into the main child's.
    inside = ["nsenter", "-t", str(r.main_child()), "-p", "-m", REAPER, "top", "--url", f"127.0.0.1:{port}"]
    tmux("new-session", "-d", "-s", tmux.name, "-x", "80", "-y", "24", "sh", "-c",
         " ".join(inside) + "; echo top-exited-$?; sleep 60")

    def shown():
        text = tmux.screen()
        return text if f" {stray} " in text and "orphan" in text and "observe" in text else None
    screen = wait_for(shown, 20, 0.1, what="the stray on reaper top's screen")
    (tmp_path / "screen.txt").write_text(screen)
    lines = screen.splitlines()
    assert len(lines) <= 24 and max(len(ln) for ln in lines) <= 80
    assert lines[0].startswith("reaper ") and "(init), pid 1, up " in lines[0]
    assert any(ln.startswith("main child  pid ") and "sleeping" in ln and ": python" in ln for ln in lines), screen
    row = [ln for ln in lines if ln.split()[:1] == [stray]]
    assert row and "sleep" in row[0] and "orphan" in row[0] and "observe" in row[0], screen
    assert f"zombies     1, by parent: python3[{parent}] 1" in screen or \
        f"[{parent}] 1" in screen, screen
    tmux("send-keys", "-t", tmux.name, "p")          # sort by pid: at once, not at the next refresh
    wait_for(lambda: "sorted by pid" in tmux.screen(), 5, 0.05, what="the sort key")
    tmux("send-keys", "-t", tmux.name, "q")
    done = wait_for(lambda: "top-exited-" in tmux.screen() and tmux.screen(), 10, 0.05, what="reaper top to quit")
    assert "top-exited-0" in done, done


def test_top_over_a_pipe_prints_one_frame(reaper, tmp_path):
    require("rich", _has_rich(), "pip install 'reaper-init[top]'")
    r, port, stray, parent = _scene(reaper, tmp_path)
    out = subprocess.run([REAPER, "top", "--url", f"127.0.0.1:{port}"], capture_output=True, text=True,
                         timeout=30, env={**os.environ, "COLUMNS": "80"})
    assert out.returncode == 0 and out.stderr == "", out
    assert out.stdout.startswith("reaper ") and f"[{parent}] 1" in out.stdout, out.stdout
    # From outside reaper's PID namespace: the reason comes from the endpoint, not /proc.
    row = [ln for ln in out.stdout.splitlines() if ln.split()[:1] == [stray]]
    assert row and "orphan" in row[0] and "observe" in row[0], out.stdout
    assert max(len(ln) for ln in out.stdout.splitlines()) <= 80


def test_top_without_rich_says_how_to_install_it(tmp_path):
    """rich made unimportable (a package of that name that fails, first on the path)."""
    (tmp_path / "rich").mkdir()
    (tmp_path / "rich" / "__init__.py").write_text("raise ImportError('no rich here')\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}".rstrip(":")}
    out = subprocess.run([REAPER, "top", "--url", "127.0.0.1:1"], capture_output=True, text=True, timeout=30,
                         env=env)
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr == "reaper top: needs the rich library: pip install 'reaper-init[top]'\n", out.stderr


def test_top_cannot_fetch_is_one_line(tmp_path):
    require("rich", _has_rich(), "pip install 'reaper-init[top]'")
    out = subprocess.run([REAPER, "top", "--url", "127.0.0.1:1", "--timeout", "2"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 1 and out.stdout == "", out
    assert out.stderr.startswith("reaper top: cannot fetch http://127.0.0.1:1/metrics") and \
        out.stderr.count("\n") == 1, out.stderr


def _has_rich() -> bool:
    from conftest import importable

    return importable("rich")


def test_only_the_screen_imports_rich():
    """PID 1 never imports rich: only reaper/commands/top/screen.py names it, and only
    `reaper top` (reaper.commands) loads that package."""
    import ast
    from pathlib import Path

    import reaper

    root = Path(reaper.__file__).parent
    users, loaders = set(), set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            rel = str(path.relative_to(root.parent))
            if any(n == "rich" or n.startswith("rich.") for n in names):
                users.add(rel)
            if any(n.startswith("reaper.commands.top") for n in names) or \
                    (isinstance(node, ast.ImportFrom) and node.module == "reaper.commands" and
                     any(a.name == "top" for a in node.names)):
                loaders.add(rel)
    assert users == {"reaper/commands/top/screen.py"}, users
    assert {p for p in loaders if not p.startswith("reaper/commands/top/")} == {"reaper/commands/__init__.py"}


def test_top_ends_on_ctrl_c_with_130_and_gives_the_terminal_back(reaper, tmp_path, tmux):
    require("rich", _has_rich(), "pip install 'reaper-init[top]'")
    r, port, stray, parent = _scene(reaper, tmp_path)
    tmux("new-session", "-d", "-s", tmux.name, "-x", "80", "-y", "24", "sh", "-c",
         f"trap : INT; {REAPER} top --url 127.0.0.1:{port}; echo top-exited-$?; "
         "stty -a | grep -o ' -\\?icanon'; sleep 60")
    wait_for(lambda: "strays 1" in tmux.screen(), 20, 0.1, what="reaper top's screen")
    tmux("send-keys", "-t", tmux.name, "C-c")        # SIGINT to the pane's foreground group (sh traps it)
    # The shell's stty line follows top's end: wait for it too.
    done = wait_for(lambda: (lambda sc: "top-exited-" in sc and "icanon" in sc.split("top-exited-", 1)[1] and sc)(
        tmux.screen()), 10, 0.05, what="reaper top to end and stty to answer")
    assert "top-exited-130" in done, done
    assert " icanon" in done and " -icanon" not in done, done        # the terminal's modes restored
    assert "reaper " not in done.split("top-exited-")[0], done          # the screen restored (alternate screen left)


def test_top_stays_responsive_against_an_endpoint_that_drips(tmp_path, tmux):
    """A server that answers a byte at a time, each within the timeout, never the whole:
    each fetch is given up after --timeout, the ones left hanging are bounded (no new
    fetch while 4 hang), the screen says so, and q still quits."""
    import socket
    import threading
    import time

    require("rich", _has_rich(), "pip install 'reaper-init[top]'")
    stop = threading.Event()
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    srv.settimeout(0.2)
    conns = []

    def serve():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            conns.append(c)
            threading.Thread(target=drip, args=(c,), daemon=True).start()

    def drip(c):
        try:
            c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            while not stop.wait(0.1):
                c.sendall(b"#")
        except OSError:
            pass
    threading.Thread(target=serve, daemon=True).start()
    try:
        port = srv.getsockname()[1]
        tmux("new-session", "-d", "-s", tmux.name, "-x", "80", "-y", "24", "sh", "-c",
             f"{REAPER} top --url 127.0.0.1:{port} --timeout 0.3 --interval 0.1; echo top-exited-$?; sleep 60")
        wait_for(lambda: f"4 fetches of http://127.0.0.1:{port}/metrics still hang" in tmux.screen(), 20, 0.1,
                 what="the hung fetches said")
        accepted = len(conns)
        time.sleep(1.0)                 # no event to await: that nothing more is fetched is the point
        assert len(conns) <= accepted + 1, (accepted, len(conns))
        tmux("send-keys", "-t", tmux.name, "q")
        done = wait_for(lambda: "top-exited-" in tmux.screen() and tmux.screen(), 10, 0.05, what="q")
        assert "top-exited-0" in done, done
    finally:
        stop.set()
        srv.close()
        for c in conns:
            c.close()


# --- leftovers and device holders (issue 34): counted by reaper stats, named by top ----------------

MODEL = """
import json, sys, time
from reaper.commands.top import model
f = model.Source(sys.argv[1], 5).frame(time.time())
print(json.dumps({"local": f.local, "holders": f.holders, "leftovers": f.leftovers, "error": f.error}))
"""


def test_stats_counts_and_top_names_leftovers_and_device_holders_with_their_owner(reaper, tmp_path):
    """reaper as PID 1 with --leftovers stop, a service whose run leaves a setsid'd rank
    holding a device node named like a GPU: after the restart, run 1's rank is a stopped
    leftover; the main child (a shell) and its sleep hold the device too, their owner
    alive. reaper stats counts the leftover from the endpoint; top's model, in reaper's
    PID namespace, names every holder with its owner."""
    import json

    from conftest import PYTHON, wait_for_file
    import leftovers_helpers as lh

    dev = lh.make_device(tmp_path)
    svc = f"svc={PYTHON} {lh.HERE} launcher {tmp_path} rank 1.5 device={dev}"
    r, port = start_with_metrics(reaper, ["sh", "-c", f"exec 3<{dev}; sleep 600 & wait"],
                                 ["--leftovers", "stop", "--devices", str(tmp_path / "nvidia*"),
                                  "--restart-delay", "0.1", "--service", svc])
    wait_for_file(tmp_path / "run-2.prev", timeout=15)
    rank1 = int(wait_for_file(tmp_path / "rank-1.pid", timeout=15))
    wait_scrape(port, lambda s: s.value("reaper_leftovers_total", action="stopped") == 1
                and s.value("reaper_leftover_device_holders", device=str(dev)) == 1, "the stopped holder counted")

    out = subprocess.run([REAPER, "stats", "--url", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    row = [ln for ln in out.stdout.splitlines() if ln.startswith("  leftovers ")]
    assert row and row[0].split(None, 1)[1].startswith(
        f"1 process left behind by 1 ended owner (1 service): 1 stopped (SIGSTOP); "
        f"of them holding a device now: 1 {dev}; "), out.stdout

    env = {**os.environ, "REAPER_DEVICES": str(tmp_path / "nvidia*")}
    inside = subprocess.run(["nsenter", "-t", str(r.main_child()), "-p", "-m", PYTHON, "-c", MODEL,
                             f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30, env=env)
    assert inside.returncode == 0, inside.stderr
    f = json.loads(inside.stdout)
    assert f["local"] and f["error"] == "", f
    assert f["leftovers"].startswith("1 process left behind"), f
    holders = {d["name"]: d for d in f["holders"]}
    by_pid = {d["pid"]: d for d in f["holders"]}
    # Pids in reaper's namespace follow who forked first (and reaper's threads take some):
    # the rank is found by its pid, not by its place in the list.
    assert rank1 in by_pid and len(f["holders"]) == 3, f
    assert [d["pid"] for d in f["holders"]] == sorted(by_pid), f      # holders by pid
    assert all(d["devices"] == str(dev) for d in f["holders"]), f
    assert by_pid[rank1]["state"] == "T" and by_pid[rank1]["owner"] == "ended", f     # its run is gone
    assert holders["sh"]["owner"] == "reaper (its own child)", f
    assert holders["sleep"]["owner"] == f"sh[{holders['sh']['pid']}]" and holders["sleep"]["state"] == "S", f
    r.kill()
