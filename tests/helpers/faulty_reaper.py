"""reaper's own main(), with faults injected where no real fault can be had on demand.

Used by tests/test_faults.py as `python faulty_reaper.py FAULTS [reaper args...]`.
FAULTS is a comma-separated list; each one patches reaper before main() runs:

  wait-enomem      the first three waits of the core loop fail with ENOMEM, as poll() may
  supervisor       the Supervisor's own Python fails at its first event (a bug in the core loop)
  supervisor-init  the Supervisor cannot even be built
  budgets          building the budget enforcer raises
  budget-tick      the budget enforcer's tick raises
  budget-twice     the budget enforcer's first two samples raise MemoryError (as a stray's
                   endless file once made them), later ones work
  summary          building the exit summary raises
  title            setting the process title raises
  count-scans      counts full /proc scans made while killing; written to $FAULTY_SCANS at exit
  no-pidfd         a kernel without pidfds (older than 5.3): budgets signal through kill()
  unmovable        the cgroup refuses every stray (EINVAL, as v1 does for a real-time task
                   when RT group scheduling is on): throttling must duty-cycle instead
  services         building the services runner raises (reaper/services/runner.py)
  service-exit     the services runner raises on a service's exit
  service-fork     every fork of a service fails with EAGAIN (as at the pids limit)
  no-import-NAME   reaper.NAME cannot be imported (EMFILE at its open), e.g. no-import-boundary,
                   no-import-pieces: the steps after the spawn that load a module
"""
import errno
import os
import sys


def boom(*_a, **_k):
    raise RuntimeError("injected fault")


class _Unloadable:
    """A meta path finder under which the named modules cannot be imported: the open
    of their file fails as at the fd limit (EMFILE)."""

    def __init__(self, names: set) -> None:
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if name in self.names:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return None


def inject(faults: set) -> None:
    unloadable = {f"reaper.{f[len('no-import-'):]}" for f in faults if f.startswith("no-import-")}
    if unloadable:
        sys.meta_path.insert(0, _Unloadable(unloadable))
        return
    from reaper import _native, stats, supervisor

    if "wait-enomem" in faults:
        real_wait, left = _native.Waiter.wait, [3]

        def wait(self, timeout_ms):
            if left[0] > 0:
                left[0] -= 1
                raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))
            return real_wait(self, timeout_ms)
        _native.Waiter.wait = wait
    if "supervisor" in faults:
        supervisor.Supervisor._handle = boom
    if "supervisor-init" in faults:
        supervisor.Supervisor.__init__ = boom
    if "budgets" in faults:
        from reaper.budgets import enforcer
        enforcer.Enforcer.__init__ = boom
    if "budget-tick" in faults:
        from reaper.budgets import enforcer
        enforcer.Enforcer.tick = boom
    if "budget-twice" in faults:
        from reaper.budgets import enforcer
        real_sample, left = enforcer.Enforcer.sample, [2]

        def sample(self, now):
            if left[0] > 0:
                left[0] -= 1
                raise MemoryError()
            return real_sample(self, now)
        enforcer.Enforcer.sample = sample
    if "summary" in faults:
        stats.Stats.summary = boom
    if "title" in faults:
        from reaper import pieces
        pieces._setproctitle = lambda: boom
    if "services" in faults:
        from reaper.services import runner
        runner.Runner.__init__ = boom
    if "service-exit" in faults:
        from reaper.services import runner
        runner.Runner.on_exit = boom
    if "service-fork" in faults:
        real_spawn = _native.spawn

        def spawn(argv, *a, service=None, **k):
            if service is not None or (len(a) > 3 and a[3] is not None):
                raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
            return real_spawn(argv, *a, service=service, **k)
        _native.spawn = spawn
    if "unmovable" in faults:
        from reaper.budgets import throttle

        def refuse(self, pid, d):
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        throttle.CgroupThrottle.move = refuse
    if "no-pidfd" in faults:
        from reaper import procctl
        from reaper.budgets import enforcer
        procctl.HAVE_PIDFD = False
        enforcer.pidfds_work = lambda: False
    if "count-scans" in faults:
        from reaper.procfs import processes
        real_scan, count = processes.scan, [0]

        def scan(*a, **k):
            if getattr(supervisor, "_current_phase", lambda: "")() == "killing":
                count[0] += 1
            return real_scan(*a, **k)
        processes.scan = scan
        from reaper import drain
        real_kill_now = drain.Drain.kill_now

        def kill_now(self):
            supervisor._current_phase = lambda: self.phase
            return real_kill_now(self)
        drain.Drain.kill_now = kill_now
        real_finish = supervisor.Supervisor._finish

        def finish(self):
            with open(os.environ["FAULTY_SCANS"], "w") as f:
                f.write(str(count[0]))
            return real_finish(self)
        supervisor.Supervisor._finish = finish


if __name__ == "__main__":
    inject(set(sys.argv[1].split(",")))
    from reaper.cli import main

    sys.exit(main(sys.argv[2:]))
