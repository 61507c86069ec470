"""Point 1: exit status, and bad input: one line on stderr, conventional status, no traceback."""
import signal
import stat

import pytest

from conftest import refused, run_reaper, wait_for_file


@pytest.mark.parametrize("code", [0, 1, 3, 255])
def test_exit_code_is_the_childs(code):
    assert run_reaper(["--", "sh", "-c", f"exit {code}"]).proc.returncode == code


@pytest.mark.parametrize("sig", [9, 15, 11, 2])
def test_killed_by_signal_n_gives_128_plus_n(sig):
    # At its default for the child whatever the suite inherited (nohup, a CI runner's
    # ignored SIGINT): reaper passes the invoker's dispositions on.
    r = run_reaper(["sh", "-c", f"kill -{sig} $$"], preexec_fn=lambda: sig != 9 and signal.signal(sig, signal.SIG_DFL))
    assert r.proc.returncode == 128 + sig


def _one_error_line(r):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_command_not_found_is_127():
    r = run_reaper(["--", "no-such-command-xyz", "arg"])
    assert r.proc.returncode == 127
    line = _one_error_line(r)
    assert "no-such-command-xyz" in line and "No such file or directory" in line


def test_not_executable_is_126(tmp_path):
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    r = run_reaper(["--", str(script)])
    assert r.proc.returncode == 126
    line = _one_error_line(r)
    assert str(script) in line and "Permission denied" in line


def test_directory_is_126(tmp_path):
    r = run_reaper(["--", str(tmp_path)])
    assert r.proc.returncode == 126
    assert "Is a directory" in _one_error_line(r)      # execvp says EACCES


def test_a_file_in_no_executable_format_is_run_by_the_shell(tmp_path):
    # execvp hands ENOEXEC to /bin/sh, so 126 "bad format" cannot happen: the status
    # is the shell's (127 here: it finds no command in the file).
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF-not-really\n")
    junk.chmod(0o755)
    r = run_reaper(["--", str(junk)])
    assert r.proc.returncode == 127
    assert "cannot run" not in r.stderr


BAD_USAGE = [
    (["--no-such-flag", "true"], "unknown option --no-such-flag"),
    (["-x", "true"], "-x"),
    ([], "no command"),
    (["--"], "no command"),
    (["-p", "NOTASIGNAL", "true"], "NOTASIGNAL"),
    (["-p", "99", "true"], "99"),
    (["-r", "TERM", "true"], "FROM:TO"),
    (["-r", "TERM:BOGUS", "true"], "BOGUS"),
    (["-e", "256", "true"], "256"),
    (["-e", "abc", "true"], "abc"),
    (["--grace", "-1", "true"], "--grace"),
    (["--grace", "soon", "true"], "--grace"),
    (["--grace"], "requires an argument"),
    (["--grace=1", "-e"], "requires an argument"),
    (["-s=1", "true"], "unknown option -="),
    (["--subreaper=1", "true"], "takes no value"),
]


@pytest.mark.parametrize("args,needle", BAD_USAGE)
def test_usage_errors_are_one_line_and_exit_2(args, needle, tmp_path):
    if args and args[-1] == "true":           # a command follows: the suite's one check
        refused(tmp_path, args[:-1], needle)
        return
    r = run_reaper(args, pid1=False)          # no command at all, or a flag's value missing
    assert r.proc.returncode == 2
    line = _one_error_line(r)
    assert needle in line and line.endswith("(see 'reaper --help')"), line


@pytest.mark.parametrize("var,value", [
    ("REAPER_GRACE", "abc"),
    ("REAPER_PROCESS_GROUP", "maybe"),
    ("REAPER_VERBOSITY", "loud"),
    ("REAPER_REMAP_EXIT", "143,999"),
    ("REAPER_REWRITE", "TERM:NOPE"),
    ("REAPER_PDEATH_SIGNAL", "SIGFOO"),
])
def test_bad_environment_is_a_usage_error(var, value, tmp_path):
    refused(tmp_path, [], var, env={var: value})


def test_help_and_version():
    r = run_reaper(["--help"], pid1=False)
    assert r.proc.returncode == 0 and r.stdout.startswith("usage: reaper")
    for flag in ("--subreaper", "--process-group", "--remap-exit", "--pdeath-signal", "--warn-on-reap",
                 "--rewrite", "--single-child", "--grace", "REAPER_GRACE"):
        assert flag in r.stdout
    r = run_reaper(["-h"], pid1=False)
    assert r.proc.returncode == 0 and "usage:" in r.stdout
    r = run_reaper(["--version"], pid1=False)
    assert r.proc.returncode == 0 and r.stdout.startswith("reaper ")


def test_options_stop_at_first_non_option():
    # tini needs `--` here; reaper, like dumb-init, does not.
    r = run_reaper(["sh", "-c", "exit 4"])
    assert r.proc.returncode == 4


def test_exit_zero_on_stop(reaper):
    # Ray 2.60's `ray start` exits 1 after a graceful, SIGTERM-requested drain.
    child = ["sh", "-c", "trap 'exit 1' TERM; echo up; while :; do sleep 1 & wait; done"]
    for args, expect in ((["--exit-zero-on-stop"], 0), ([], 1)):
        r = reaper([*args, "--", *child])
        assert r.readline() == "up"
        r.send(signal.SIGTERM)
        assert r.wait() == expect
    # Without a stop request, the child's failure still shows.
    r = reaper(["--exit-zero-on-stop", "--", "sh", "-c", "exit 1"])
    assert r.wait() == 1
    r = reaper(["--", "sh", "-c", "exit 1"], env={"REAPER_EXIT_ZERO_ON_STOP": "1"})
    assert r.wait() == 1


# docs/reaper.md: boolean variables take 1/0, true/false, yes/no, on/off (any case).
@pytest.mark.parametrize("value, expect", [("1", 0), ("true", 0), ("YES", 0), ("On", 0),
                                           ("0", 1), ("false", 1), ("no", 1), ("OFF", 1)])
def test_exit_zero_on_stop_from_the_variable_in_every_spelling(reaper, value, expect):
    """The variable where it changes the status: a stop that the child answers with 1."""
    child = ["sh", "-c", "trap 'exit 1' TERM; echo up; while :; do sleep 1 & wait; done"]
    r = reaper(["--", *child], env={"REAPER_EXIT_ZERO_ON_STOP": value})
    assert r.readline() == "up"
    r.send(signal.SIGTERM)
    assert r.wait() == expect, r.stderr


def test_remap_exit():
    assert run_reaper(["-e", "143", "--", "sh", "-c", "kill $$"]).proc.returncode == 0
    assert run_reaper(["-e", "143", "-e", "3", "--", "sh", "-c", "exit 3"]).proc.returncode == 0
    assert run_reaper(["-e", "143", "--", "sh", "-c", "exit 3"]).proc.returncode == 3
    assert run_reaper(["sh", "-c", "exit 3"], env={"REAPER_REMAP_EXIT": "3,143"}).proc.returncode == 0


def test_a_command_name_that_is_not_utf8_is_shown_escaped():
    r = run_reaper(["--", b"no-such-\xff".decode(errors="surrogateescape")])
    assert r.proc.returncode == 127
    line = _one_error_line(r)
    assert r"'no-such-\xff'" in line and "udcff" not in line, line


def _final_metrics(path) -> dict:
    """name{labels} -> value from the metrics file reaper writes at exit."""
    out = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def test_the_final_metrics_say_whether_a_stop_was_requested(reaper, tmp_path):
    """reaper_stop_requested: 1 when a SIGTERM from outside asked for the end (the main
    child's exit 1 is then a stop, not a failure: ReaperMainChildFailed stays silent), 0
    when the main child failed on its own."""
    child = ["sh", "-c", "trap 'exit 1' TERM; echo up; while :; do sleep 1 & wait; done"]
    stopped, failed = tmp_path / "stopped.prom", tmp_path / "failed.prom"
    r = reaper(["--exit-zero-on-stop", "--metrics-file", str(stopped), "--", *child])
    assert r.readline() == "up"
    wait_for_file(stopped, contains="reaper_stop_requested 0")          # running, nothing asked yet
    r.send(signal.SIGTERM)
    assert r.wait() == 0
    m = _final_metrics(stopped)
    assert m["reaper_stop_requested"] == 1 and m['reaper_main_child_outcome{outcome="exited_nonzero"}'] == 1, m
    r = reaper(["--exit-zero-on-stop", "--metrics-file", str(failed), "--", "sh", "-c", "exit 1"])
    assert r.wait() == 1
    m = _final_metrics(failed)
    assert m["reaper_stop_requested"] == 0 and m['reaper_main_child_outcome{outcome="exited_nonzero"}'] == 1, m
