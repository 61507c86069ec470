"""reaper's log lines as a pipeline reads them (issue 36, point 4) and as a hostile process
would write them (issue 33, point 9), on real runs of reaper as PID 1 of a fresh PID
namespace:

- --log-format json (REAPER_LOG_FORMAT): every line on stderr is one JSON object with
  time, level, pid, event, msg and fields (the summary's figures an object, not a string);
  a bad value is one line, exit status 2, and the child never starts;
- a stray that names itself (prctl PR_SET_NAME, 15 bytes) with terminal escapes (a title
  ESC]0;...BEL, a screen clear ESC[2J, a clipboard write ESC]52) or a newline reaches
  neither the terminal nor a new line: reaper's log escapes what processes control, in
  text and in JSON.
"""
from __future__ import annotations

import json
import shlex
import signal
import subprocess

import pytest

from conftest import PYTHON, REAPER, UNSHARE, wait_for

KEYS = {"time", "level", "pid", "event", "msg", "fields"}


def _objects(stderr: str) -> list:
    lines = stderr.splitlines()
    assert lines, "nothing on stderr"
    objs = []
    for line in lines:
        obj = json.loads(line)                         # every line, or the test fails here
        assert set(obj) == KEYS, line
        assert obj["level"] in ("ERROR", "WARN", "INFO", "DEBUG")
        assert isinstance(obj["fields"], dict)
        assert obj["time"].endswith("Z") and obj["time"][10] == "T"
        objs.append(obj)
    return objs


@pytest.mark.parametrize("how", ["flag", "env"])
def test_json_format_every_line_is_one_object(reaper, how):
    args = ["--log-format", "json"] if how == "flag" else []
    env = {"REAPER_LOG_FORMAT": "json"} if how == "env" else {}
    r = reaper([*args, "-vv", "--", "sh", "-c", "sleep 30 & exit 3"], env=env)
    assert r.wait() == 3
    objs = _objects(r.stderr)
    assert all(o["pid"] == 1 for o in objs)
    summary = [o for o in objs if o["event"] == "summary"]
    assert len(summary) == 1
    fields = summary[0]["fields"]                      # an object, not a string to parse again
    assert fields["orphans"] == 1 and fields["exit_status"] == 3 and fields["main_exit_code"] == 3
    assert fields["drain"]["terminated"] == 1
    assert any(o["msg"].startswith("main child ") and o["event"] == "log" for o in objs)
    assert any(o["level"] == "DEBUG" for o in objs)     # -vv: the debug lines too


def test_text_stays_the_default(reaper):
    r = reaper(["-v", "--", "sh", "-c", "sleep 30 & exit 0"])
    assert r.wait() == 0
    lines = r.stderr.splitlines()
    assert lines and all(line.startswith("reaper[1]: ") for line in lines)
    assert any(line.startswith('reaper[1]: INFO summary {"budget_actions"') for line in lines)


def test_json_long_line_stays_one_object():
    """A line longer than a pipe takes whole is shortened as an object, not cut."""
    code = ("from reaper.log import Log, WARN\n"
            "log = Log(1, 'json')\n"
            "log.warn('x' * 20000)\n"
            "log.summary('summary', True, {str(i): 'y' * 50 for i in range(200)})\n")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    objs = _objects(out.stderr.decode())
    assert len(objs) == 2
    assert all(len(line) < 4000 for line in out.stderr.splitlines())
    assert objs[0]["msg"].endswith("...") and objs[1]["fields"] == {"truncated": True}


@pytest.mark.parametrize("value", ["xml", "", "JSON "])
def test_bad_log_format_is_a_usage_error(tmp_path, value):
    marker = tmp_path / "started"
    for argv, env in (([REAPER, "--log-format", value, "touch", str(marker)], {}),
                      ([REAPER, "touch", str(marker)], {"REAPER_LOG_FORMAT": value})):
        out = subprocess.run([*UNSHARE, *argv], capture_output=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin", **env})
        assert out.returncode == 2
        err = out.stderr.decode()
        assert err.count("\n") == 1 and "log format" in err and "Traceback" not in err, err
        assert not marker.exists(), "the child started"


# Names a stray gives itself, 15 bytes at most (the kernel's TASK_COMM_LEN - 1): a terminal
# title, a screen clear, a clipboard write (OSC 52), a forged line.
NAMES = ["\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x1b]52;c;SGk=\x07", "x\nFORGED line"]
NAMER = ("import ctypes, sys, time\n"
         "ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"   # PR_SET_NAME
         "time.sleep(60)\n")


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_stray_name_cannot_drive_the_terminal_or_forge_a_line(reaper, tmp_path, fmt):
    """Four strays named with control bytes, past --stray-max-age (observe: one warning
    each, naming them); then a stop, so the drain's lines too. Nothing raw on stderr."""
    strays = "\n".join(f"( {PYTHON} -c {shlex.quote(NAMER)} {shlex.quote(n)} & )" for n in NAMES)
    err_path = tmp_path / "stderr"
    with open(err_path, "wb") as err:
        r = reaper(["--log-format", fmt, "-v", "--stray-max-age", "1", "--budget-action", "observe",
                    "--budget-interval", "0.2", "--", "sh", "-c", strays + "\nexec sleep 600"], stderr=err)
        wait_for(lambda: err_path.read_bytes().count(b"past --stray-max-age") >= len(NAMES), 30,
                 what="reaper's four warnings about the strays")
        r.send(signal.SIGTERM)
        assert r.wait() == 143
    raw = err_path.read_bytes()
    for byte in (b"\x1b", b"\x07"):
        assert byte not in raw
    lines = raw.decode().splitlines()
    assert not [line for line in lines if line.startswith("FORGED")]
    if fmt == "json":
        msgs = [o["msg"] for o in _objects(raw.decode())]
    else:
        assert all(line.startswith("reaper[1]: ") for line in lines), lines
        msgs = lines
    warned = [m for m in msgs if "past --stray-max-age" in m]
    assert len(warned) == len(NAMES)
    for shown in ("\\x1b]0;pwned\\x07", "\\x1b[2J\\x1b[H", "\\x1b]52;c;SGk=\\x07", "x\\nFORGED line"):
        assert any(f"({shown}, orphan" in m for m in warned), (shown, warned)
