"""Signals in reaper's first milliseconds (issue 20, point 10).

The launchers (bin/reaper, and reaper/__main__.py for `python -m reaper`) block every
signal in their first statement, before reaper's own modules load; the C core's
setup blocks the same set and reads what came since from its signalfd once the child
runs. Before that first statement the interpreter is still starting: a SIGTERM to a
namespace's PID 1 at its default disposition is dropped by the kernel, and a SIGINT
after the interpreter installed its handler is a KeyboardInterrupt in the
interpreter's own start (docs/reaper.md, Signals). These tests run the launcher of the
tree under test (the installed command may be an older copy) as PID 1 of a fresh PID
namespace, with real signals:

- paused at the import of reaper.cli (an audit hook in a sitecustomize of the test's
  own, on PYTHONPATH), a SIGINT, SIGTERM or SIGWINCH must reach the child: no
  traceback, no lost signal;
- at many offsets in the first ~50 ms after the exec (a helper makes each namespace
  itself, so that it knows reaper's pid and the moment of its exec): whenever the
  signal was blocked when it was sent, it reaches the child; a traceback may only come
  from before the launcher's first statement, never from reaper's code.
"""
import json
import os
import select
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

import reaper
from conftest import (POLL_SYSCALLS, PYTHON, Reaper, children_of, in_poll, invoker_signals, proc_status,
                      summary, signal_set)

ROOT = Path(reaper.__file__).resolve().parents[1]
LAUNCHER = ROOT / "bin" / "reaper"
LAUNCHERS = {"bin/reaper": [PYTHON, str(LAUNCHER)], "python -m reaper": [PYTHON, "-m", "reaper"]}
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}

pytestmark = pytest.mark.skipif(not LAUNCHER.exists(), reason="no source tree: bin/reaper is not beside the package")


def _env(extra_path=None, **more) -> dict:
    """This environment, the tree under test first on PYTHONPATH (for `-m` and for an
    old tree given by PYTHONPATH), plus extra_path in front of it."""
    paths = [p for p in (extra_path, str(ROOT), os.environ.get("PYTHONPATH")) if p]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REAPER_", "TINI_"))}
    env.update(more, PYTHONPATH=os.pathsep.join(paths))
    return env


def _bit(status: dict, field: str, sig: int) -> bool:
    return bool(int(status.get(field, "0"), 16) >> (sig - 1) & 1)


def _settled(pid: int, sig: int) -> bool:
    """reaper (pid) runs its child and has taken sig from its signalfd (and so forwarded
    it) if it ever had it: nothing pending, and back in poll since."""
    try:
        st = proc_status(pid)
    except OSError:
        return True
    return bool(children_of(pid)) and not _bit(st, "SigPnd", sig) and not _bit(st, "ShdPnd", sig) \
        and in_poll(pid, forever=False)


# --- paused where reaper loads: the signal must reach the child ---------------------------

# Pauses the interpreter at the import of reaper.cli (the first of reaper's modules a
# launcher imports itself; `-m` has imported the package before its first statement):
# says so on one fd and waits for a byte on the other.
PAUSE = '''
import os, sys


def _pause(event, args):
    if event == "import" and args[0] == "reaper.cli":
        go, ready = (int(fd) for fd in os.environ["STARTUP_TEST_PAUSE"].split(","))
        os.write(ready, b"p")
        os.read(go, 1)


sys.addaudithook(_pause)
'''


# The signal, and reaper's exit status once the child got it: SIGWINCH is ignored by
# default (cat lives on), and a pending one must survive the C core's setup, which
# would drop it by setting SIG_DFL again.
PAUSED = {"SIGINT": (signal.SIGINT, 130), "SIGTERM": (signal.SIGTERM, 143), "SIGWINCH": (signal.SIGWINCH, 0)}


@pytest.mark.parametrize("how", sorted(LAUNCHERS))
@pytest.mark.parametrize("name", sorted(PAUSED))
def test_a_signal_while_reaper_loads_reaches_the_child(tmp_path, how, name):
    sig, status = PAUSED[name]
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PAUSE)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    r = Reaper(["-v", "--", "cat"], exe=LAUNCHERS[how], env=_env(str(site), STARTUP_TEST_PAUSE=f"{go_r},{ready_w}"),
               pass_fds=(go_r, ready_w), stdin=subprocess.PIPE, cwd=tmp_path,
               preexec_fn=invoker_signals())   # SIGINT at its default for cat, even under `nohup ... &`
    os.close(go_r)
    os.close(ready_w)
    try:
        assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"p", \
            "reaper did not reach the import of reaper.cli"
        os.kill(r.pid, sig)
        os.write(go_w, b"g")
        deadline = time.monotonic() + 20
        while r.proc.poll() is None and not _settled(r.pid, sig):
            assert time.monotonic() < deadline, "reaper did not settle"
            time.sleep(0.005)
        code = r.wait(20)            # closes stdin: the child (cat) ends now if the signal did not end it
    finally:
        r.kill()
        os.close(ready_r)
        os.close(go_w)
    assert "Traceback" not in r.stderr, r.stderr
    assert code == status, f"the {name} sent while reaper loaded did not reach the child:\n{r.stderr}"
    s = summary(r.stderr)
    assert s["signals_forwarded"] == 1 and s["exit_status"] == status, s


# --- many offsets after the exec ------------------------------------------------------------

# One trial per offset, each reaper PID 1 of a namespace of its own, made here with
# unshare(2) so that the exec's moment (a close-on-exec pipe's EOF) and reaper's pid are
# known. The child is `cat` on a pipe: the trial closes it once reaper has settled, so a
# child the signal did not reach exits 0. One JSON line per trial.
TRIALS = r'''
import ctypes, json, os, signal, sys, time

cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWPID = 0x20000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 0x40000
sig, polls = cfg["signal"], set(cfg["poll"])


def status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def bit(st, field):
    return int(st.get(field, "0"), 16) >> (sig - 1) & 1


def settled(pid):
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
        call = open(f"/proc/{pid}/syscall").read().split()[0]
    except (OSError, IndexError):
        return False
    st = status(pid)
    return bool(kids) and not bit(st, "SigPnd") and not bit(st, "ShdPnd") and call.isdigit() and int(call) in polls


def become_reaper(exec_w, err_w, stdin_r):
    try:
        if libc.unshare(CLONE_NEWNS) or libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) or \
                libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None):
            os.write(err_w, b"cannot mount /proc\n")
            os._exit(97)
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(stdin_r, 0)
        os.dup2(null, 1)
        os.dup2(err_w, 2)
        for fd in (stdin_r, null, err_w):
            os.close(fd)
        for s in range(1, signal.NSIG):          # an invoker that set nothing
            if s not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(s, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.execv(cfg["argv"][0], cfg["argv"] + ["--", "cat"])
    finally:
        os._exit(98)


def trial(offset_ms):
    exec_r, exec_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe()
    stdin_r, stdin_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(exec_r); os.close(err_r); os.close(stdin_w)
        become_reaper(exec_w, err_w, stdin_r)
    os.close(exec_w); os.close(err_w); os.close(stdin_r)
    os.read(exec_r, 1)                          # EOF: the exec
    t0 = time.monotonic()
    os.close(exec_r)
    due = t0 + offset_ms / 1000
    if due - time.monotonic() > 0.0005:
        time.sleep(due - time.monotonic() - 0.0005)
    while time.monotonic() < due:
        pass
    blocked = bool(bit(status(pid), "SigBlk"))   # never unblocked again before the spawn
    os.kill(pid, sig)
    sent = (time.monotonic() - t0) * 1000
    deadline, code = time.monotonic() + 15, None
    while time.monotonic() < deadline:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(st)
            break
        if stdin_w >= 0 and settled(pid):
            os.close(stdin_w)
            stdin_w = -1
        time.sleep(0.001)
    if code is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    err = b""
    while True:
        chunk = os.read(err_r, 65536)
        if not chunk:
            break
        err += chunk
    return {"offset": offset_ms, "sent": round(sent, 2), "blocked": blocked, "code": code,
            "stderr": err.decode(errors="replace")}


def run(offset):
    rd, wr = os.pipe2(os.O_CLOEXEC)
    t = os.fork()
    if t == 0:
        os.close(rd)
        if libc.unshare(CLONE_NEWPID):
            os._exit(96)
        os.write(wr, json.dumps(trial(offset)).encode())
        os._exit(0)
    os.close(wr)
    data = b""
    while True:
        chunk = os.read(rd, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(rd)
    os.waitpid(t, 0)
    result = json.loads(data) if data else {"offset": offset, "error": "the trial failed"}
    print(json.dumps(result), flush=True)
    if not data:
        sys.exit(1)
    return result


# Increasing offsets over at least the first max_ms, then on until several trials in a
# row found the signals blocked; then closer ones in the last milliseconds before the
# first of those (where reaper's own code starts). All within the time budget.
start, offset, in_a_row, first_blocked = time.monotonic(), 0.0, 0, None
while time.monotonic() - start < cfg["budget"] and (offset <= cfg["max_ms"] or in_a_row < 4) and offset < 400:
    blocked = run(offset)["blocked"]
    in_a_row = in_a_row + 1 if blocked else 0
    if in_a_row == 1:
        first_blocked = offset
    offset += cfg["step_ms"]
if first_blocked is not None:
    offset = max(0.0, first_blocked - 10)
    while time.monotonic() - start < cfg["budget"] and offset < first_blocked:
        run(offset)
        offset += 0.5
'''


def reaper_frames(stderr: str) -> list:
    """The frames of a traceback in stderr that are reaper's code (a launcher, the package)
    at a statement. Line 0 is a module entered before its first statement ran; the rest
    (frozen importlib, site, codecs; the environment's .pth files) is the interpreter's
    own start."""
    found = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith('File "'):
            path, _, rest = line[len('File "'):].partition('", line ')
            if (path == str(LAUNCHER) or path.startswith(str(ROOT / "reaper") + os.sep)) and rest.split(",")[0] != "0":
                found.append(line)
    return found


@pytest.mark.xdist_group("cpu-heavy")
@pytest.mark.parametrize("name", sorted(SIGNALS))
def test_a_signal_in_the_first_milliseconds_is_forwarded_once_blocked_and_never_a_traceback(tmp_path, name):
    sig = SIGNALS[name]
    calls = POLL_SYSCALLS.get(os.uname().machine)
    if calls is None:
        pytest.skip("poll's syscall numbers are not known for this architecture")
    cfg = {"argv": LAUNCHERS["bin/reaper"], "signal": int(sig), "poll": sorted(calls),
           "max_ms": 50, "step_ms": 2.5, "budget": 11}
    p = subprocess.run([PYTHON, "-c", TRIALS, json.dumps(cfg)], env=_env(), cwd=tmp_path, capture_output=True,
                       text=True, timeout=60, preexec_fn=invoker_signals())   # not the invoker's SIG_IGN
    assert p.returncode == 0, (p.stdout[-300:], p.stderr)
    trials = [json.loads(line) for line in p.stdout.splitlines()]
    assert max(t["offset"] for t in trials) >= 25, f"too few trials in the time budget: {len(trials)}"

    def show(t):
        return f"sent {t['sent']} ms after the exec, blocked: {t['blocked']}, exit {t['code']}:\n{t['stderr']}"

    for t in trials:
        if t["stderr"]:      # only SIGINT's KeyboardInterrupt, in the interpreter's own start
            assert sig == signal.SIGINT and "KeyboardInterrupt" in t["stderr"] and not reaper_frames(t["stderr"]), \
                show(t)
        else:
            # Lost before the block (the kernel drops it), reaped from the child, or (SIGINT
            # before the block) the launcher's quiet end.
            allowed = {0, 128 + sig} | ({130} if sig == signal.SIGINT else set())
            assert t["code"] in allowed, show(t)
        if t["blocked"]:
            assert t["code"] == 128 + sig and not t["stderr"], "blocked, yet not the child's: " + show(t)
    blocked = [t for t in trials if t["blocked"]]
    assert len(blocked) >= 4, f"no trial came after the block: {[show(t) for t in trials[-3:]]}"


# --- what the early block must not change --------------------------------------------------

@pytest.mark.parametrize("how", sorted(LAUNCHERS))
def test_the_child_gets_the_invokers_mask_not_the_launchers_block(tmp_path, how):
    blocked = {signal.SIGUSR2, signal.SIGRTMIN + 3}
    ignored = {signal.SIGHUP}
    r = Reaper(["--", "grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"], exe=LAUNCHERS[how], env=_env(),
               cwd=tmp_path, preexec_fn=invoker_signals(ignored, blocked))
    assert r.wait() == 0, r.stderr
    fields = dict(line.split(":\t") for line in r.stdout.strip().splitlines())

    assert signal_set(fields["SigBlk"]) == {int(s) for s in blocked}
    assert signal_set(fields["SigIgn"]) == {int(s) for s in ignored}


def test_the_launchers_block_is_the_set_the_c_core_blocks():
    """Both sides block sigfillset's set (less SIGKILL and SIGSTOP, which the kernel never
    blocks): the launcher's _signal.valid_signals(), and the C core's setup on its own."""
    code = ("import _signal, sys; from reaper import _native\n"
            "_signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())\n"
            "launcher = _signal.pthread_sigmask(_signal.SIG_SETMASK, [])\n"
            "_native.setup()\n"
            "core = _signal.pthread_sigmask(_signal.SIG_BLOCK, [])\n"
            "print(sorted(launcher ^ core))\n"
            "sys.exit(0 if launcher == core == _signal.valid_signals() - {9, 19} else 1)\n")
    p = subprocess.run([PYTHON, "-c", code], env=_env(), preexec_fn=invoker_signals(), capture_output=True,
                       timeout=30)
    assert p.returncode == 0, (p.stdout, p.stderr)


@pytest.mark.parametrize("how", sorted(LAUNCHERS))
def test_reaper_stats_still_ends_on_ctrl_c(tmp_path, how):
    """`reaper stats` handles no signal: the launcher's block is undone, and a SIGINT
    while it waits for an endpoint that never answers ends it (130)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        p = subprocess.Popen([*LAUNCHERS[how], "stats", "--url", f"http://127.0.0.1:{port}/metrics", "--timeout", "60"],
                             env=_env(), cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=invoker_signals())
        try:
            assert select.select([server], [], [], 30)[0], "reaper stats did not connect"
            conn, _ = server.accept()
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=20)
            conn.close()
        finally:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    assert b"Traceback" not in err, err

