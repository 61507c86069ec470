from conftest import run_reaper


def test_exit_status_as_pid1():
    r = run_reaper(["--", "sh", "-c", "echo $$; exit 7"])
    assert r.proc.returncode == 7
    assert r.stdout.strip() == "2"   # the main child is pid 2 under reaper as PID 1
