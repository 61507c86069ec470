"""Every option has a REAPER_* variable that sets the same thing as the flag; flags win."""
import pytest

from reaper import options
from reaper.options import OPTIONS, UsageError, parse

SAMPLE = {  # a valid value for each option that takes one
    "remap_exit": "143", "pdeath_signal": "TERM", "rewrite": "TERM:QUIT", "grace": "2.5",
    "cpu_budget": "0.5", "cpu_budget_total": "2", "budget_window": "5", "budget_grace": "3",
    "budget_action": "throttle", "budget_kill_after": "7", "budget_interval": "0.5",
    "memory_budget": "64M", "memory_budget_total": "1Gi", "stray_max_age": "3600",
    "stray_match": "stress", "protect": "raylet", "stray_cpus": "0", "metrics_port": "9300",
    "metrics_address": "127.0.0.1", "metrics_file": "/tmp/x.prom", "metrics_interval": "3",
    "summary_file": "/tmp/s.json", "node_metrics": "per-core", "log_format": "json",
    "services": "web=sleep 60", "restart": "on-failure", "restart_delay": "0.5",
    "restart_max_delay": "60", "restart_limit": "3/60", "on_service_failure": "stop", "service_ready": "db",
    "wait_ready": "10", "leftovers": "end", "leftover_grace": "2", "devices": "/dev/nvidia[0-9]*,/tmp/x*",
    "services_dir": str(__import__("pathlib").Path(__file__).with_name("helpers") / "services"),
}
# What an option needs beside it to be valid (a --service-ready names a service).
NEEDS = {"service_ready": ["--service", "db=true"]}


def _flag_args(opt):
    flag = "--" + opt.long
    if opt.kind in ("flag", "count", "off", "quiet") or opt.metavar == "":
        return [flag]
    return [flag, SAMPLE[opt.dest]]


def _env_value(opt):
    if opt.kind == "count":
        return "2"                     # the default (1) and one -v
    if opt.kind in ("flag", "off", "quiet") or opt.metavar == "":
        return "1"
    return SAMPLE[opt.dest]


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: o.long)
def test_every_option_has_an_env_var_equal_to_its_flag(opt):
    assert opt.env and opt.env[0].startswith("REAPER_")
    cmd = NEEDS.get(opt.dest, []) + ([] if opt.dest == "pause" else ["true"])   # pause mode takes no command
    by_flag = parse(_flag_args(opt) + cmd, environ={})
    by_env = parse(cmd, environ={opt.env[0]: _env_value(opt)})
    default = parse(NEEDS.get(opt.dest, []) + ["true"], environ={})
    assert getattr(by_env, opt.dest) == getattr(by_flag, opt.dest) != getattr(default, opt.dest)


def test_flags_override_environment():
    cfg = parse(["--grace", "1", "-e", "3", "true"], environ={"REAPER_GRACE": "9", "REAPER_REMAP_EXIT": "143"})
    assert cfg.grace == 1 and cfg.remap_exit == {3}


def test_tini_variables():
    cfg = parse(["true"], environ={"TINI_SUBREAPER": "", "TINI_KILL_PROCESS_GROUP": "", "TINI_VERBOSITY": "3"})
    assert cfg.subreaper and cfg.process_group and cfg.verbosity == 3
    # REAPER_* wins over TINI_*
    cfg = parse(["true"], environ={"TINI_VERBOSITY": "3", "REAPER_VERBOSITY": "0"})
    assert cfg.verbosity == 0


def test_short_flags_and_repeats():
    cfg = parse(["-s", "-g", "-w", "-v", "-v", "-e", "143", "-e", "130", "-r", "TERM:QUIT", "-r", "HUP:0",
                 "-p", "SIGKILL", "sh", "-c", "x"], environ={})
    assert cfg.subreaper and cfg.process_group and cfg.warn_on_reap
    assert cfg.verbosity == 3          # the default (1) and two -v
    assert cfg.remap_exit == {143, 130}
    assert cfg.rewrite == {15: 3, 1: 0}
    assert cfg.pdeath_signal == 9
    assert cfg.command == ["sh", "-c", "x"]


def test_rewrite_takes_names_and_numbers():
    assert parse(["-r", "15:3", "-r", "SIGUSR1:usr2", "-r", "RTMIN+1:0", "x"], environ={}).rewrite == \
        {15: 3, 10: 12, 35: 0}


def test_single_child_overrides_process_group():
    assert not parse(["-g", "-c", "x"], environ={}).process_group


@pytest.mark.parametrize("args", [["--cpu-budget", "0", "x"], ["--cpu-budget", "-1", "x"],
                                  ["--budget-action", "explode", "x"], ["--stray-match", "([", "x"],
                                  ["--stray-cpus", "0-999", "x"], ["--stray-cpus", "a-b", "x"],
                                  ["--metrics-port", "70000", "x"], ["--metrics-port", "٩٠٠٠", "x"],
                                  ["--budget-interval", "86400000", "x"], ["--stray-cpus", "٠", "x"],
                                  ["--cpu-budget", "inf", "x"], ["--cpu-budget", "nan", "x"],
                                  ["--node-metrics", "per-cpu", "x"], ["--node-metrics", "", "x"]])
def test_bad_values(args):
    with pytest.raises(UsageError):
        parse(args, environ={})


def test_help_mentions_every_option():
    text = options.help_text()
    for opt in OPTIONS:
        assert "--" + opt.long in text and opt.env[0] in text


def test_short_clusters_attached_values_and_long_equals():
    cfg = parse(["-gw", "-e143", "--grace=2", "--rewrite", "TERM:0", "-v", "--", "-x", "--y"], environ={})
    assert cfg.process_group and cfg.warn_on_reap and cfg.remap_exit == {143} and cfg.grace == 2
    assert cfg.rewrite == {15: 0} and cfg.verbosity == 2
    assert cfg.command == ["-x", "--y"]
    assert parse(["cmd", "-g", "--grace", "1"], environ={}).command == ["cmd", "-g", "--grace", "1"]


# --- values that parse but cannot work are refused; the good ones still pass -------------

def test_time_values_accept_plain_decimals_up_to_one_week():
    assert options.MAX_SECONDS == 7 * 86400
    for text, value in [("604800", 604800.0), ("0.5", 0.5), (" 2 ", 2.0), ("1e3", 1000.0), ("5.", 5.0)]:
        assert parse(["--grace", text, "x"], environ={}).grace == value
    assert str(parse(["--grace", "-0", "x"], environ={}).grace) == "0.0"
    assert parse(["x"], environ={"REAPER_BUDGET_INTERVAL": "604800"}).budget_interval == 604800
    assert options.seconds("0", allow_zero=True) == 0


def test_intervals_take_their_lower_bound_and_the_once_off_times_none():
    assert options.MIN_INTERVAL == 0.1
    for flag, dest in [("--budget-interval", "budget_interval"), ("--metrics-interval", "metrics_interval"),
                       ("--restart-delay", "restart_delay"), ("--restart-max-delay", "restart_max_delay")]:
        low = ["--restart-delay", "0.1"] if flag == "--restart-max-delay" else []    # not shorter than the first
        assert getattr(parse([*low, flag, "0.1", "x"], environ={}), dest) == 0.1
        with pytest.raises(UsageError, match="at least 0.1 seconds"):
            parse([flag, "1e-300", "x"], environ={})
        with pytest.raises(UsageError, match="> 0"):      # zero and below keep their own message
            parse([flag, "0", "x"], environ={})
    # A time waited once: 0 (or a tiny value) means at once, and keeps nothing busy.
    for flag, dest in [("--grace", "grace"), ("--budget-grace", "budget_grace"),
                       ("--budget-kill-after", "budget_kill_after")]:
        assert getattr(parse([flag, "0", "x"], environ={}), dest) == 0
    for flag, dest in [("--wait-ready", "wait_ready"), ("--stray-max-age", "stray_max_age"),
                       ("--budget-window", "budget_window")]:
        assert getattr(parse([flag, "1e-9", "x"], environ={}), dest) == 1e-9


@pytest.mark.parametrize("text", ["604801", "1e308", "1e400", "inf", "nan", "-1", "abc", "1_0", "٣", "", " "])
def test_time_values_refused(text):
    with pytest.raises(UsageError):
        parse(["--grace", text, "x"], environ={})


def test_digits_are_ascii_only():
    assert options.digits("0123456789")
    assert not any(options.digits(t) for t in ("٣", "³", "１", "", "1 "))
    with pytest.raises(UsageError):
        parse(["x"], environ={"REAPER_REMAP_EXIT": "٣"})


def test_rewrite_targets_may_be_anything_valid():
    cfg = parse(["-r", "TSTP:STOP", "-r", "HUP:KILL", "-r", "USR1:0", "-r", "RTMAX:32", "x"], environ={})
    assert cfg.rewrite == {20: 19, 1: 9, 10: 0, options_sigrtmax(): 32}
    for bad in ("KILL:TERM", "STOP:0", "CHLD:TERM", "32:0", "33:1"):
        with pytest.raises(UsageError, match="cannot rewrite"):
            parse(["-r", bad, "x"], environ={})


def options_sigrtmax():
    import signal

    return int(signal.SIGRTMAX)


@pytest.mark.parametrize("sig,ok", [("KILL", True), ("TERM", True), ("HUP", True), ("USR1", True),
                                    ("TSTP", True), ("RTMIN+1", True), ("STOP", False), ("CHLD", False),
                                    ("TTIN", True), ("TTOU", True), ("32", False)])
def test_pdeath_signal(sig, ok):
    if ok:
        assert parse(["-p", sig, "x"], environ={}).pdeath_signal
    else:
        with pytest.raises(UsageError):
            parse(["-p", sig, "x"], environ={})


def test_verbosity_variable_ranges():
    assert parse(["x"], environ={"REAPER_VERBOSITY": "3"}).verbosity == 3
    assert parse(["x"], environ={"REAPER_VERBOSITY": "0"}).verbosity == 0
    assert parse(["x"], environ={"TINI_VERBOSITY": "4"}).verbosity == 3      # tini's trace: debug here
    for env in ({"REAPER_VERBOSITY": "4"}, {"REAPER_VERBOSITY": "-1"}, {"TINI_VERBOSITY": "5"},
                {"TINI_VERBOSITY": "abc"}, {"TINI_VERBOSITY": ""}):
        with pytest.raises(UsageError, match="expected a level"):
            parse(["x"], environ=env)
    # flags override variables: a -v means the variable is not read at all
    assert parse(["-v", "x"], environ={"REAPER_VERBOSITY": "9"}).verbosity == 2


@pytest.mark.parametrize("address", ["0.0.0.0", "127.0.0.1", "::", "::1", "[::1]", "[::]", "::ffff:10.0.0.1",
                                     "fe80::1%lo", "localhost", "localhost.", "my-host.example.com", "a1", "x.0a"])
def test_metrics_address_accepted(address):
    assert parse(["--metrics-address", address, "x"], environ={}).metrics_address == address


@pytest.mark.parametrize("address", ["256.1.1.1", "999.0.0.1", "1.2.3", "1.2.3.4.5", "not an address!", "[::1",
                                     "::1::", "-a", "a-", "a..b", "a_b", "é", "", "\udcff", "fe80::1%", "x" * 64])
def test_metrics_address_refused(address):
    with pytest.raises(UsageError, match="--metrics-address: bad address"):
        parse(["--metrics-address", address, "x"], environ={})
    with pytest.raises(UsageError, match="REAPER_METRICS_ADDRESS: bad address"):
        parse(["x"], environ={"REAPER_METRICS_ADDRESS": address})


def test_metrics_address_parsing_does_not_import_socket_unless_given():
    import subprocess
    import sys

    code = ("import sys; from reaper import options; before = set(sys.modules); "
            "options.parse(['--grace', '1', '-e', '3', '--summary-file', '/tmp/s', 'x'], environ={}); "
            "print(' '.join(sorted(set(sys.modules) - before)) or '-')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    # No module for these but the path parsers (reaper.values); socket and re only when needed.
    assert set(out.split()) <= {"-", "reaper.values"}, out


def test_files_are_checked_and_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse(["--summary-file", "s.json", "--metrics-file", "m.prom", "x"], environ={})
    # reaper's working directory is / once the child runs: a relative path would land there
    assert cfg.summary_file == str(tmp_path / "s.json") and cfg.metrics_file == str(tmp_path / "m.prom")
    assert sorted(p.name for p in tmp_path.iterdir()) == []          # the probe file is gone
    for path, msg in [(str(tmp_path), "is a directory"), (str(tmp_path / "no" / "s"), "cannot write in"),
                      ("", "expected a path")]:
        with pytest.raises(UsageError, match=msg):
            parse(["--summary-file", path, "x"], environ={})


def test_display_and_quoted():
    d, q = options.display, options.quoted
    assert q("abc") == "'abc'" and d("abc") == "abc"
    assert q("\udcff") == r"'\xff'" and d("a\udcffb") == r"a\xffb"
    assert d(b"\xff/x") == r"\xff/x"
    assert q("1\n2") == r"'1\n2'" and d("1\n2") == r"1\n2"
    assert q("it's \\ \udcff") == r"'it\'s \\ \xff'" and d("a\\b") == "a\\b"
    assert q("٣") == "'٣'"
    for text in ("\udcff\n\x1b\ud800", "a\u2028b"):
        out = q(text) + d(text)
        out.encode("utf-8")                                 # never a surrogate
        assert len(out.splitlines()) == 1
    assert str(UsageError("bad \udcff\nvalue")) == r"bad \xff\nvalue"


def test_write_stdout_reports_errors_once(capfd):
    import os

    r, w = os.pipe()
    saved = os.dup(1)
    try:
        os.dup2(w, 1)
        assert options.write_stdout("hello\n") == 0
        assert os.read(r, 100) == b"hello\n"
        assert options.write_stdout("x", "reaper test", closed=True) == 1
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(r)
        os.close(w)
    assert capfd.readouterr().err == "reaper test: cannot write to standard output: Bad file descriptor\n"


# --- budget settings without a budget: one WARN line, the child runs -----------------

IDLE = "set (as a flag or its variable) but without effect: no budget is given"


@pytest.mark.parametrize("args, env, named", [
    (["--budget-action", "terminate", "--stray-match", "stress"], {}, "--budget-action, --stray-match"),
    (["--stray-cpus", "0"], {}, "--stray-cpus"),
    ([], {"REAPER_BUDGET_ACTION": "throttle", "REAPER_PROTECT": "raylet"}, "--budget-action, --protect"),
])
def test_budget_settings_without_a_budget_say_so_once_and_the_child_runs(args, env, named):
    from conftest import run_reaper

    r = run_reaper([*args, "--", "sh", "-c", "echo ran"], env=env)
    assert r.proc.returncode == 0 and r.stdout.strip() == "ran", r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and " WARN " in lines[0] and f"{named}: {IDLE}" in lines[0], r.stderr


def test_budget_settings_with_a_budget_or_at_their_defaults_say_nothing():
    from conftest import run_reaper

    for args in (["--cpu-budget", "0.5", "--stray-match", "stress", "--budget-action", "terminate"],
                 ["--budget-action", "nice"]):               # the default: it changes nothing
        r = run_reaper([*args, "--", "true"])
        assert r.proc.returncode == 0 and r.stderr == "", (args, r.stderr)


def test_watch_says_so_too(tmp_path):
    import signal

    from conftest import Reaper, wait_for_file

    prom = tmp_path / "m.prom"
    r = Reaper(["watch", "--metrics-file", str(prom), "--budget-action", "terminate"], pid1=False)
    wait_for_file(prom, contains="reaper_build_info")
    r.send(signal.SIGTERM)
    r.wait()
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and f"--budget-action: {IDLE}" in lines[0], r.stderr
