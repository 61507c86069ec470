"""Every option has a REAPER_* variable that sets the same thing as the flag; flags win."""
import pytest

from reaper import options
from reaper.options import OPTIONS, UsageError, parse

SAMPLE = {  # a valid value for each option that takes one
    "remap_exit": "143", "pdeath_signal": "TERM", "rewrite": "TERM:QUIT", "grace": "2.5",
    "cpu_budget": "0.5", "cpu_budget_total": "2", "budget_window": "5", "budget_grace": "3",
    "budget_action": "throttle", "budget_kill_after": "7", "budget_interval": "0.5",
    "stray_match": "stress", "protect": "raylet", "stray_cpus": "0", "metrics_port": "9300",
    "metrics_address": "127.0.0.1", "metrics_file": "/tmp/x.prom", "metrics_interval": "3",
    "summary_file": "/tmp/s.json",
}


def _flag_args(opt):
    flag = "--" + opt.long
    if opt.kind in ("flag", "count", "off") or opt.metavar == "":
        return [flag]
    return [flag, SAMPLE[opt.dest]]


def _env_value(opt):
    if opt.kind == "count":
        return "3"
    if opt.kind in ("flag", "off") or opt.metavar == "":
        return "1"
    return SAMPLE[opt.dest]


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: o.long)
def test_every_option_has_an_env_var_equal_to_its_flag(opt):
    assert opt.env and opt.env[0].startswith("REAPER_")
    by_flag = parse(_flag_args(opt) + ["true"], environ={})
    by_env = parse(["true"], environ={opt.env[0]: _env_value(opt)})
    default = parse(["true"], environ={})
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
    assert cfg.verbosity == 4
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
                                  ["--metrics-port", "70000", "x"]])
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
    assert cfg.rewrite == {15: 0} and cfg.verbosity == 3
    assert cfg.command == ["-x", "--y"]
    assert parse(["cmd", "-g", "--grace", "1"], environ={}).command == ["cmd", "-g", "--grace", "1"]
