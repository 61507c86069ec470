"""Bad input: one line on stderr, exit 2, never a traceback, and the child never starts.

Every case runs the real `reaper` command with a COMMAND that would leave a marker file
if it ran. Values that parse but cannot work (an uncatchable signal, a time of a month)
are bad input too. Writing --help or the stats view to a closed or full stdout is not
bad input: one line and exit 1, as coreutils does.
"""
import os
import subprocess

import pytest

from conftest import REAPER, clean_env, free_port, one_line as _one_line, refused, refused_sub

TIMEOUT = 30
TIME_FLAGS = ["--grace", "--budget-window", "--budget-grace", "--budget-kill-after", "--budget-interval",
              "--metrics-interval"]
WATCH_TIME_FLAGS = ["--budget-window", "--budget-grace", "--budget-kill-after", "--budget-interval",
                    "--metrics-interval"]


def _run(argv, env=None, stdout=subprocess.PIPE):
    p = subprocess.run([REAPER, *argv], env=clean_env(env), stdin=subprocess.DEVNULL, stdout=stdout,
                       stderr=subprocess.PIPE, timeout=TIMEOUT)
    return p.returncode, p.stderr


def test_the_marker_would_appear(tmp_path):
    """The control: with good values the same kind of command runs the child."""
    marker = tmp_path / "child-ran"
    status, stderr = _run(["--grace", "604800", "--summary-file", str(tmp_path / "s.json"), "--",
                           "touch", str(marker)])
    assert status == 0, stderr
    assert marker.exists()


# --- 1. time values --------------------------------------------------------------------

@pytest.mark.parametrize("flag", TIME_FLAGS)
@pytest.mark.parametrize("value", ["3000000", "1e308", "604800.5"])
def test_time_values_have_an_upper_bound(tmp_path, flag, value):
    refused(tmp_path, [flag, value], flag, "at most 604800 seconds", repr(value))


@pytest.mark.parametrize("flag", TIME_FLAGS)
@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "abc", "1_0", "0x10", ""])
def test_time_values_must_be_plain_numbers(tmp_path, flag, value):
    refused(tmp_path, [flag, value], f"{flag}: expected a number of seconds, not {value!r}")


def test_grace_abc_message(tmp_path):
    line = refused(tmp_path, ["--grace", "abc"])
    assert line == "reaper: --grace: expected a number of seconds, not 'abc' (see 'reaper --help')"


@pytest.mark.parametrize("var", ["REAPER_GRACE", "REAPER_BUDGET_WINDOW", "REAPER_BUDGET_GRACE",
                                 "REAPER_BUDGET_KILL_AFTER", "REAPER_BUDGET_INTERVAL", "REAPER_METRICS_INTERVAL"])
def test_time_variables_have_the_same_bound(tmp_path, var):
    refused(tmp_path, [], var, "at most 604800", env={var: "86400000"})


@pytest.mark.parametrize("flag", WATCH_TIME_FLAGS)
def test_watch_time_values_have_the_same_bound(flag):
    refused_sub("watch", [flag, "86400000"], flag, "at most 604800")


def test_watch_time_variable_has_the_same_bound():
    refused_sub("watch", [], "REAPER_BUDGET_INTERVAL", "at most 604800", env={"REAPER_BUDGET_INTERVAL": "86400000"})


# Intervals something is repeated at: shorter than 0.1 s a sample, a file write or a
# crashing service's restart would keep a core busy (options.MIN_INTERVAL).
INTERVAL_FLAGS = ["--budget-interval", "--metrics-interval", "--restart-delay", "--restart-max-delay"]


@pytest.mark.parametrize("flag", INTERVAL_FLAGS)
@pytest.mark.parametrize("value", ["1e-300", "1e-9", "0.099"])
def test_intervals_have_a_lower_bound(tmp_path, flag, value):
    refused(tmp_path, [flag, value], f"{flag}: must be at least 0.1 seconds", repr(value))


@pytest.mark.parametrize("var", ["REAPER_BUDGET_INTERVAL", "REAPER_METRICS_INTERVAL", "REAPER_RESTART_DELAY",
                                 "REAPER_RESTART_MAX_DELAY"])
def test_interval_variables_have_the_same_lower_bound(tmp_path, var):
    refused(tmp_path, [], f"{var}: must be at least 0.1 seconds", env={var: "1e-300"})


@pytest.mark.parametrize("flag,var", [("--budget-interval", "REAPER_BUDGET_INTERVAL"),
                                      ("--metrics-interval", "REAPER_METRICS_INTERVAL")])
def test_watch_intervals_have_the_same_lower_bound(flag, var):
    refused_sub("watch", [flag, "1e-9"], flag, "at least 0.1 seconds")
    refused_sub("watch", [], var, "at least 0.1 seconds", env={var: "1e-300"})


def test_a_services_restart_delay_file_has_the_same_lower_bound(tmp_path):
    d = tmp_path / "services" / "web"
    d.mkdir(parents=True)
    (d / "run").write_text("#!/bin/sh\nexec sleep 600\n")
    (d / "run").chmod(0o755)
    (d / "restart-delay").write_text("0.001\n")
    refused(tmp_path, ["--services-dir", str(tmp_path / "services")], "restart-delay", "at least 0.1 seconds")


@pytest.mark.parametrize("value,needle", [("-1", "> 0"), ("0", "> 0"), ("1e9", "at most 604800"),
                                          ("inf", "expected a number of seconds"), ("abc", "expected a number")])
def test_stats_timeout(value, needle):
    refused_sub("stats", ["--timeout", value], "--timeout", needle)


# --- 2. ASCII digits only ----------------------------------------------------------------

@pytest.mark.parametrize("args,env,needle", [
    (["-e", "٣"], None, "-e: exit status must be 0-255, not '٣'"),
    ([], {"REAPER_REMAP_EXIT": "٣"}, "REAPER_REMAP_EXIT"),        # was: exit 3 became 0
    (["-e", "¹"], None, "-e"),
    (["--metrics-port", "٩٢٥٩"], None, "--metrics-port"),
    (["-p", "٩"], None, "-p: unknown signal"),
    (["-r", "١٥:0"], None, "-r: unknown signal"),
    (["-r", "TERM:١"], None, "-r: unknown signal"),
    (["-p", "RTMIN+١"], None, "-p"),
    (["--stray-cpus", "٠"], None, "--stray-cpus"),
    (["--grace", "٣"], None, "--grace: expected a number of seconds"),
    (["--cpu-budget", "٣"], None, "--cpu-budget: expected a number of cores"),
    ([], {"REAPER_VERBOSITY": "٣"}, "REAPER_VERBOSITY"),
    (["-p", "ſigterm"], None, "-p: unknown signal"),               # 'ſ'.upper() is 'S'
])
def test_only_ascii_digits_are_numbers(tmp_path, args, env, needle):
    refused(tmp_path, args, needle, env=env)


# --- 3. signals reaper cannot receive or forward ----------------------------------------

@pytest.mark.parametrize("rewrite,needle", [
    ("KILL:TERM", "can never be caught"),
    ("STOP:0", "can never be caught"),
    ("SIGKILL:0", "can never be caught"),
    ("9:15", "can never be caught"),
    ("CHLD:TERM", "never forwards"),
    ("32:TERM", "reserved by glibc"),
    ("33:0", "reserved by glibc"),
])
def test_rewrite_source_must_be_forwardable(tmp_path, rewrite, needle):
    refused(tmp_path, ["-r", rewrite], "-r: cannot rewrite", needle)


def test_rewrite_variable_is_checked_the_same(tmp_path):
    refused(tmp_path, [], "REAPER_REWRITE", "cannot rewrite SIGKILL", env={"REAPER_REWRITE": "HUP:0,KILL:TERM"})


@pytest.mark.parametrize("sig,needle", [("STOP", "stop reaper"), ("CHLD", "would be lost"),
                                        ("32", "would be lost")])
def test_pdeath_signal_must_make_sense(tmp_path, sig, needle):
    refused(tmp_path, ["-p", sig], "-p:", needle)


# --- 4. verbosity variables ---------------------------------------------------------------

@pytest.mark.parametrize("var,value", [("REAPER_VERBOSITY", "9"), ("REAPER_VERBOSITY", "-1"),
                                       ("REAPER_VERBOSITY", "4"), ("REAPER_VERBOSITY", "loud"),
                                       ("TINI_VERBOSITY", "abc"), ("TINI_VERBOSITY", "5"),
                                       ("TINI_VERBOSITY", "-1")])
def test_verbosity_variables_are_checked(tmp_path, var, value):
    refused(tmp_path, [], f"{var}={value!r}", "expected a level from 0", env={var: value})


# --- 5. files reaper writes ---------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--summary-file", "--metrics-file"])
def test_file_in_a_missing_directory(tmp_path, flag):
    refused(tmp_path, [flag, str(tmp_path / "missing" / "f")], flag, "cannot write in", "No such file")


@pytest.mark.parametrize("flag", ["--summary-file", "--metrics-file"])
def test_file_that_is_a_directory(tmp_path, flag):
    refused(tmp_path, [flag, str(tmp_path)], flag, "is a directory")


def test_summary_file_variable_is_checked_too(tmp_path):
    refused(tmp_path, [], "REAPER_SUMMARY_FILE", "is a directory", env={"REAPER_SUMMARY_FILE": str(tmp_path)})


def test_summary_file_empty(tmp_path):
    refused(tmp_path, ["--summary-file", ""], "--summary-file: expected a path")


# --- 6. the metrics address, metrics on or not ----------------------------------------------

@pytest.mark.parametrize("address", ["256.1.1.1", "not an address!", "[::1", "::1::2", "1.2.3", "-host",
                                     "a..b", "host_name", "é.example", "", "\udcff"])
def test_bad_metrics_address_without_metrics(tmp_path, address):
    refused(tmp_path, ["--metrics-address", address], "--metrics-address: bad address")


def test_bad_metrics_address_variable(tmp_path):
    line = refused(tmp_path, [], "REAPER_METRICS_ADDRESS: bad address", env={"REAPER_METRICS_ADDRESS": "\udcff"})
    assert r"'\xff'" in line


def test_watch_bad_metrics_address():
    refused_sub("watch", ["--metrics-address", "256.1.1.1"], "--metrics-address", "bad address")


@pytest.mark.parametrize("value", ["per-cpu", "Summary", "", "all"])
def test_bad_node_metrics_mode(tmp_path, value):
    refused(tmp_path, ["--node-metrics", value, "--metrics-port", str(free_port())], "--node-metrics",
            "unknown node metrics mode", "choose from summary, per-core, off")
    refused(tmp_path, [], "REAPER_NODE_METRICS", "unknown node metrics mode", env={"REAPER_NODE_METRICS": value})


# --- 7. help, version and stats output to a closed or full stdout ----------------------------

METRICS = ('# TYPE reaper_build_info gauge\n'
           'reaper_build_info{version="1.0",mode="init"} 1.0\n')


def _stdout_cases(tmp_path):
    good = tmp_path / "m.prom"
    good.write_text(METRICS)
    return [["--help"], ["-h"], ["--version"], ["-V"], ["stats", "--help"], ["watch", "--help"],
            ["stats", "--file", str(good)]]


@pytest.mark.parametrize("case", range(7))
def test_stdout_works(tmp_path, case):
    argv = _stdout_cases(tmp_path)[case]
    p = subprocess.run([REAPER, *argv], env=clean_env(), capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 0 and p.stdout and p.stderr == b"", p.stderr


@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize("where,error", [(">&-", "Bad file descriptor"), (">/dev/full", "No space left on device")])
def test_unwritable_stdout_is_one_line_and_exit_1(tmp_path, case, where, error):
    argv = _stdout_cases(tmp_path)[case]
    p = subprocess.run(["sh", "-c", f'exec "$0" "$@" {where}', REAPER, *argv], env=clean_env(),
                       stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=TIMEOUT)
    prog = "reaper stats" if argv[0] == "stats" else "reaper watch" if argv[0] == "watch" else "reaper"
    line = _one_line(p.stderr, f"{prog}: ")
    assert line == f"{prog}: cannot write to standard output: {error}"
    assert p.returncode == 1


# --- 8. reaper watch -v ------------------------------------------------------------------------

@pytest.mark.parametrize("argv,env,level", [
    ([], {}, 1), (["-v"], {}, 2), (["-v", "-v"], {}, 3), (["-vv"], {}, 3),
    ([], {"REAPER_VERBOSITY": "0"}, 0),
    (["-v"], {"REAPER_VERBOSITY": "0"}, 2),         # a flag wins over the variable, as in reaper
    (["-v"], {"REAPER_VERBOSITY": "9"}, 2),         # ... which is then not read at all
    ([], {"TINI_VERBOSITY": "4"}, 3),               # tini's 4 (trace) is debug
])
def test_watch_verbose_adds_one_to_the_default(monkeypatch, argv, env, level):
    from reaper import commands

    for k in list(os.environ):
        if k.startswith(("REAPER_", "TINI_")):
            monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert commands._watch_config(argv).verbosity == level


def test_watch_bad_verbosity_variable():
    refused_sub("watch", [], "REAPER_VERBOSITY='9'", env={"REAPER_VERBOSITY": "9"})


# --- 9. bytes that are not UTF-8 ---------------------------------------------------------------

@pytest.mark.parametrize("args,env,needle", [
    (["--metrics-file", "\udcff/x"], None, "--metrics-file: cannot write in"),
    (["--summary-file", "\udcff/x"], None, "--summary-file: cannot write in"),
    ([], {"REAPER_GRACE": "\udcff"}, "REAPER_GRACE: expected a number of seconds, not '\\xff'"),
    ([], {"REAPER_SUBREAPER": "\udcff"}, "REAPER_SUBREAPER='\\xff'"),
    ([], {"REAPER_METRICS_FILE": "\udcff/x"}, "REAPER_METRICS_FILE"),
    ([], {"REAPER_VERBOSITY": "\udcff"}, "REAPER_VERBOSITY='\\xff'"),
    (["--\udcff"], None, "unknown option --\\xff"),
    (["-\udcff"], None, "unknown option -\\xff"),
    (["--grace=\udcff"], None, "--grace"),
    (["-e\udcff"], None, "-e"),
    (["-p", "\udcff"], None, "-p: unknown signal: '\\xff'"),
    (["-r", "TERM:\udcff"], None, "-r: unknown signal"),
    (["--stray-match", "(\udcff"], None, "--stray-match: invalid regular expression '(\\xff'"),
    (["--budget-action", "\udcff"], None, "--budget-action: unknown action '\\xff'"),
    (["--stray-cpus", "\udcff"], None, "--stray-cpus"),
    (["--grace", "1\n2"], None, "--grace: expected a number of seconds, not '1\\n2'"),
])
def test_undecodable_bytes_are_shown_readably(tmp_path, args, env, needle):
    line = refused(tmp_path, args, needle, env=env)
    assert "udc" not in line, line


@pytest.mark.parametrize("name,args,needle", [
    ("stats", ["\udcff"], "unexpected argument '\\xff'"),
    ("stats", ["--timeout", "\udcff"], "--timeout: expected a number of seconds, not '\\xff'"),
    # reaper watch reads its flags with reaper's own scanner (reaper/options.py), not argparse:
    # reaper's wording, "unknown option" (argparse said "unrecognized arguments").
    ("watch", ["--\udcff"], "unknown option --\\xff"),
    ("watch", ["--metrics-file", "\udcff/x"], "--metrics-file: cannot write in"),
    ("watch", ["--metrics-address", "\udcff"], "bad address '\\xff'"),
    ("watch", ["--stray-match", "(\udcff"], "invalid regular expression '(\\xff'"),
])
def test_subcommands_show_undecodable_bytes_readably(name, args, needle):
    line = refused_sub(name, args, needle)
    assert "udc" not in line, line


def test_stats_unreadable_file_names_are_readable(tmp_path):
    status, stderr = _run(["stats", "--file", str(tmp_path / "\udcff")])
    line = _one_line(stderr, "reaper stats: cannot read ")
    assert status == 1 and "\\xff" in line and "udc" not in line, line


def test_stats_file_that_is_not_utf8(tmp_path):
    bad = tmp_path / "m.prom"
    bad.write_bytes(b"\xff\xfe")
    status, stderr = _run(["stats", "--file", str(bad)])
    line = _one_line(stderr, "reaper stats: ")
    assert status == 1 and "not UTF-8" in line, line


# Values that parse as numbers but cannot work, and values too long for int() (issue 20, point 6).
HUGE = "1" * 400
ENDLESS = "1" * 5000


@pytest.mark.parametrize("env, needle", [
    ({"REAPER_VERBOSITY": ENDLESS}, "REAPER_VERBOSITY='1111"),
    ({"TINI_VERBOSITY": ENDLESS}, "TINI_VERBOSITY='1111"),
    ({"REAPER_MEMORY_BUDGET": HUGE}, "REAPER_MEMORY_BUDGET: must be below 4 EiB"),
    ({"REAPER_CPU_BUDGET": HUGE}, "REAPER_CPU_BUDGET: expected a number of cores"),
    ({"REAPER_CPU_BUDGET": "100000"}, "REAPER_CPU_BUDGET: must be at most 65536 cores"),
    ({"REAPER_GRACE": HUGE}, "REAPER_GRACE: expected a number of seconds"),
])
def test_endless_and_infinite_values_are_one_line_exit_2(tmp_path, env, needle):
    line = refused(tmp_path, [], needle, env=env)
    assert len(line) < 400, line                   # a long value is shown shortened, with its length


def test_a_cpu_range_too_large_to_build_is_refused_before_it_is_built(tmp_path):
    refused(tmp_path, ["--cpu-budget", "1", "--stray-cpus", "0-4000000000"], "--stray-cpus: CPU numbers stop at 65535")


# --- leftovers (docs/leftovers.md) --------------------------------------------------------

@pytest.mark.parametrize("args, env, needle", [
    (["--leftovers", "kill"], None, "unknown leftovers mode 'kill'"),
    ([], {"REAPER_LEFTOVERS": "END"}, "REAPER_LEFTOVERS"),
    (["--leftover-grace", "-1"], None, "must be a number >= 0"),
    (["--leftover-grace", "nan"], None, "expected a number of seconds"),
    (["--leftover-grace", "inf"], None, "expected a number of seconds"),
    (["--leftover-grace", "3601"], None, "at most 3600 seconds"),
    ([], {"REAPER_LEFTOVER_GRACE": "1e9"}, "REAPER_LEFTOVER_GRACE"),
    (["--devices", ""], None, "at least one device glob"),
    ([], {"REAPER_DEVICES": " , "}, "at least one device glob"),
    (["--devices", "/dev/nvidia[0-9"], None, "unclosed ["),
    (["--devices", "dev/nvidia*"], None, "absolute path"),
    (["--devices", "/dev/kfd,"], None, "an empty device glob"),
], ids=["mode", "mode-env", "grace-negative", "grace-nan", "grace-inf", "grace-absurd", "grace-env",
        "devices-empty", "devices-env-empty", "glob-unclosed", "glob-relative", "glob-trailing-comma"])
def test_leftover_options_refuse_bad_values(tmp_path, args, env, needle):
    refused(tmp_path, args, needle, env=env)
