"""How reaper acts on strays: the one door a budget kind acts through (kinds/).

Actions holds the level --budget-action names (OBSERVE, NICE, THROTTLE, TERMINATE, in
options.BUDGET_ACTIONS' order: each includes the ones before), and does what a kind
asks at that level: a violation counted (and observed), nice 19 and SCHED_IDLE, the
duty cycle's SIGSTOP/SIGCONT (throttle.DutyCycler), SIGTERM and, --grace seconds later,
SIGKILL (follow_up), each counted by its reason (a kind's, or ANY). It is the only
writer of the stats' actions, violations and escapes counts.

A stray reaper may not act on (EPERM, EACCES) is refused: named once in one line per
kind of action (say_refusals), counted in actions["not_permitted"] and left alone from
then on. Any other failure to act is said once per action and the rest goes on.
"""
from __future__ import annotations

import os
import time

TYPE_CHECKING = False    # typing's, without importing typing (mypy takes it as true)
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable, Iterable
    from typing import Any

    from reaper.budgets.kinds import Actions as _Door
else:
    # _signal: the numbers without the enum module (start-up time and memory).
    import _signal as signal

from reaper.budgets.kinds import ANY
from reaper.budgets.lineage import Tracked, boot_ticks
from reaper.budgets.throttle import DutyCycler
from reaper.options import BUDGET_ACTIONS
from reaper.procctl import Gone, NotPermitted

OBSERVE, NICE, THROTTLE, TERMINATE = (BUDGET_ACTIONS.index(a) for a in ("observe", "nice", "throttle", "terminate"))


class Actions:
    """The actions a kind asks for, at cfg's level (the door of Kind: act)."""

    OBSERVE, NICE, THROTTLE, TERMINATE = OBSERVE, NICE, THROTTLE, TERMINATE

    def __init__(self, cfg: Any, log: Any, stats: Any) -> None:
        self.cfg = cfg
        self.log = log
        self.stats = stats
        self.level = BUDGET_ACTIONS.index(cfg.budget_action)
        self.duty = DutyCycler()
        self.said: set[str] = set()              # things said once
        self.refusals: list[tuple[str, int, str, str | None]] = []   # (what, pid, comm, strerror) not said yet
        self.cpus: Any = None                    # --stray-cpus: the CPUs strays are pinned to

    def confine(self, spec: str) -> None:
        """The CPUs of --stray-cpus; never fatal: affinity left alone."""
        try:
            from reaper.budgets import stray_cpus

            self.cpus, msg = stray_cpus.resolve(spec)
            if msg:
                self.log.info(msg)
        except Exception as e:
            self.log.warn(f"--stray-cpus {spec}: {e}; affinity left alone")

    def once(self, key: str, msg: str, level: str = "info") -> None:
        """msg, the first time key is said."""
        if key not in self.said:
            self.said.add(key)
            getattr(self.log, level)(msg)

    def violation(self, reason: str, t: Tracked | None = None) -> None:
        """Counts a stray going over a budget; t, if given, is observed (when nothing stronger was done)."""
        self.stats.violations[self.cfg.budget_action] += 1
        self.stats.violations_by_reason[(self.cfg.budget_action, reason)] += 1
        if t is not None and t.action == "none":
            t.action = "observe"

    def nice(self, t: Tracked, reason: str) -> None:
        """From the nice level on: nice 19 and SCHED_IDLE, once."""
        if self.level >= NICE and not t.niced:
            t.niced = True
            if self.act(t, "nice", lambda h: h.renice(19), reason):
                t.action = "nice"
            self.act(t, "sched_idle", lambda h: h.sched_idle(), reason)

    def pin(self, t: Tracked) -> None:
        """--stray-cpus: t's affinity, once."""
        if not t.pinned and t.refused is None:
            self.act(t, "affinity", lambda h: h.set_affinity(self.cpus), "cpu")
            t.pinned = True

    def act(self, t: Tracked, action: str, fn: Callable[[Any], Any], reason: str) -> bool:
        """fn(t.handle), counted as action for reason; False if it did not happen."""
        if t.refused is not None:
            return False
        try:
            fn(t.handle)
        except Gone:
            return False
        except NotPermitted as e:
            self.refuse(t, e, reason)
            return False
        except OSError as e:
            self.once(f"fail-{action}", f"cannot apply {action} to stray {t.key[0]} ({t.comm}): "
                                        f"{e.strerror}; going on without it", "warn")
            return False
        self.count(action, reason)
        return True

    def count(self, action: str, reason: str | None) -> None:
        self.stats.actions[action] += 1
        self.stats.actions_by_reason[(action, reason)] += 1

    def escaped(self) -> None:
        """A stray found outside the cgroup reaper holds it in (escapes.py)."""
        self.stats.stray_cgroup_escapes += 1

    def mechanism(self, reason: str, name: str) -> None:
        """How the budget of reason is held (stats: mechanism for cpu, memory_mechanism)."""
        if reason == "cpu":
            self.stats.mechanism = name
        else:
            self.stats.memory_mechanism = name

    def cycle(self, t: Tracked, fraction: float, now: float, group: Any) -> None:
        """t runs fraction of each duty period (throttle.DutyCycler), with its lineage's group."""
        self.duty.set(t.key, t.handle, fraction, now, group)

    def ran_stopped(self, t: Tracked) -> float | None:
        """The share of the time the duty cycle held t stopped that it ran all the same
        (another process resumed it); None until enough of it was checked."""
        return self.duty.ran_stopped(t.key)

    def release(self, t: Tracked, now: float) -> None:
        """t leaves the duty cycle (resumed if stopped)."""
        self.duty.release(t.key, now)

    def forget(self, t: Tracked) -> None:
        """t, gone, leaves the duty cycle."""
        self.duty.forget(t.key)

    def kill(self, t: Tracked, now: float, reason: str, why: str) -> None:
        """SIGTERM (and SIGCONT: a stopped process must run to exit), once; the
        SIGKILL follows --grace seconds later (follow_up), counted from its lineage's
        first SIGTERM for reason for a member born after it (a fork must not start the
        grace afresh)."""
        if t.term_at is not None or t.refused is not None:
            return
        first = t.acct.terms.get(reason)
        try:
            if t.cycled:
                self.duty.release(t.key, now)
                t.cycled = False
            t.handle.signal(signal.SIGTERM)
            t.handle.signal(signal.SIGCONT)
            t.term_at = first[0] if first is not None and t.key[1] >= first[1] else now
            if first is None:
                t.acct.terms[reason] = (now, boot_ticks())
            t.term_reason = reason
            t.action = "terminate"
            self.count("terminate", reason)
            self.log.warn(f"stray {t.key[0]} ({t.comm}) {why}: SIGTERM")
        except Gone:
            pass
        except NotPermitted as e:
            self.refuse(t, e, reason)
        except OSError as e:
            self.once("fail-terminate", f"cannot terminate stray {t.key[0]} ({t.comm}): {e.strerror}", "warn")

    def follow_up(self, members: list[Tracked], now: float) -> None:
        """SIGKILL for every one of members still alive --grace seconds after its SIGTERM."""
        for t in members:
            if t.term_at is None or t.killed or now - t.term_at < self.cfg.grace or t.refused is not None:
                continue
            try:
                t.handle.signal(signal.SIGKILL)
                t.killed = True
                t.action = "kill"
                self.count("kill", t.term_reason)
                self.log.warn(f"stray {t.key[0]} ({t.comm}) still alive {self.cfg.grace:g}s after SIGTERM: SIGKILL")
            except Gone:
                t.killed = True
            except NotPermitted as e:
                self.refuse(t, e, t.term_reason)
            except OSError as e:
                self.once("fail-terminate", f"cannot terminate stray {t.key[0]} ({t.comm}): {e.strerror}", "warn")

    def drain(self, now: float, members: Iterable[Tracked]) -> None:
        """reaper drains everything: nothing may stay stopped."""
        self.duty.close(now)
        for t in members:
            t.cycled = False

    # --- strays reaper may not act on -------------------------------------------

    def refuse(self, t: Tracked, e: NotPermitted, reason: str | None = ANY) -> None:
        """Leaves t alone from now on: nothing refused is retried every sample."""
        if t.refused is not None:
            return
        t.refused = e
        t.action = "not_permitted"
        if t.cycled:
            self.duty.release(t.key, time.monotonic())    # if stopped, resumed where possible
            t.cycled = False
        self.refusals.append((e.what, t.key[0], t.comm, e.strerror))
        self.count("not_permitted", reason)

    def unpinnable(self, key: tuple[int, int], comm: str, e: NotPermitted) -> None:
        """A new stray reaper may not even read: named with the refusals, counted once."""
        self.refusals.append((e.what, key[0], comm, e.strerror))
        self.count("not_permitted", ANY)

    def take_duty_faults(self, tracked: dict[tuple[int, int], Tracked]) -> None:
        for key, signame, e in self.duty.take_faults():
            t = tracked.get(key)
            if t is None:
                continue
            t.cycled = False                 # the cycle dropped it
            if isinstance(e, NotPermitted):
                self.refuse(t, e)
            else:
                self.once(f"fail-{signame}", f"cannot send {signame} to stray {key[0]} ({t.comm}): "
                                             f"{e.strerror}; it is no longer duty-cycled", "warn")

    def say_refusals(self) -> None:
        """One line per kind of action refused since the last call, naming the strays."""
        if not self.refusals:
            return
        by_what: dict[str, list[tuple[int, str, str | None]]] = {}
        for what, pid, comm, why in self.refusals:
            by_what.setdefault(what, []).append((pid, comm, why))
        self.refusals = []
        for what, strays in by_what.items():
            named = ", ".join(f"{pid} ({comm}, uid {_owner(pid)})" for pid, comm, _ in strays[:10])
            more = f" and {len(strays) - 10} more" if len(strays) > 10 else ""
            one = len(strays) == 1
            self.log.warn(f"uid {os.geteuid()} may not {what} stray{'' if one else 's'} {named}{more}: "
                          f"{strays[0][2]}; {'it is' if one else 'they are'} left alone, "
                          f"not held to {'its' if one else 'their'} budget")


def _owner(pid: int) -> str:
    try:
        return str(os.stat(f"/proc/{pid}").st_uid)
    except OSError:
        return "?"


if TYPE_CHECKING:
    def _declared(a: Actions) -> _Door:
        """Actions is the door the kinds declare (mypy --strict says so, or fails)."""
        return a
