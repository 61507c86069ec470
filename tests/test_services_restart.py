"""reaper/services/restart.py in process: the restart policy, its backoff and the start
limit, on times passed in (the black-box restarts are in test_services.py)."""
from __future__ import annotations

from reaper.services.restart import DONE, GIVE_UP, RESTART, Restarts, failed

OK, FAIL, KILLED = 0, 1 << 8, 9          # wait statuses: exit 0, exit 1, SIGKILL


def test_failed_is_a_non_zero_exit_a_signal_or_no_process():
    assert not failed(OK)
    assert failed(FAIL) and failed(KILLED) and failed(None)


def test_on_failure_restarts_failures_only_and_never_gives_up_at_once():
    r = Restarts("on-failure", 1.0, 8.0, (100, 60.0))
    assert r.ended(0.0, OK) == (DONE, 0.0)
    assert r.ended(0.0, FAIL) == (RESTART, 1.0)
    assert Restarts("never", 1.0, 8.0, (100, 60.0)).ended(0.0, FAIL) == (GIVE_UP, 0.0)
    assert Restarts("never", 1.0, 8.0, (100, 60.0)).ended(0.0, OK) == (DONE, 0.0)
    assert Restarts("always", 1.0, 8.0, (100, 60.0)).ended(0.0, OK) == (RESTART, 1.0)


def test_the_delay_doubles_to_its_maximum_and_starts_over_after_a_long_run():
    r = Restarts("always", 1.0, 8.0, (100, 600.0))
    delays, now = [], 0.0
    for _ in range(5):
        r.started(now)
        now += 0.5
        decision, delay = r.ended(now, FAIL)
        assert decision == RESTART
        delays.append(delay)
        now += delay
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    r.started(now)
    assert r.ended(now + 8.0, FAIL) == (RESTART, 1.0)      # it stayed up the maximum: a fresh start


def test_the_start_limit_gives_up_within_its_window_only():
    r = Restarts("always", 0.0, 0.0, (3, 10.0))
    for t in (0.0, 1.0, 2.0):
        r.started(t)
    assert r.ended(3.0, FAIL) == (GIVE_UP, 0.0)               # 3 starts within 10 s
    assert r.ended(10.5, FAIL)[0] == RESTART                  # the first start left the window
