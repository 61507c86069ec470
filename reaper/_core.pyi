"""Types of reaper._core, the extension cffi builds from csrc/reaper_core.h (csrc/build_core.py):
what reaper/_native.py, its only user, touches. Structs are cffi views: their arrays index and
assign like lists of int. Keep in step with csrc/reaper_core.h."""
from typing import Any

class Event:
    """struct reaper_event"""
    kind: int
    pid: int
    signo: int
    code: int
    uid: int
    forwarded: int
    utime_us: int
    stime_us: int
    maxrss_kb: int
    woke_ns: int
    at_ns: int

class Totals:
    """struct reaper_totals"""
    exited: list[int]
    signaled: list[int]
    latency: list[int]
    latency_sum_ns: int
    cpu_us: int
    reaped: int

class Config:
    """struct reaper_config"""
    watch_pid: int
    report_all: int
    report_stops: int
    no_rusage: int
    self_pid: int
    forward_pid: int
    forward_group: int
    forward: list[int]
    nbounds: int
    bounds_ns: list[int]
    nreport: int
    report_pids: list[int]
    npoll: int
    poll_fds: list[int]
    quiet_end: int
    zero_codes: list[int]

class State:
    """struct reaper_state"""
    watch_reaped: int
    watch_status: int

class WaiterStruct:
    """struct reaper_waiter"""
    config: Config
    state: State
    totals: Totals

class SpawnExtra:
    """struct reaper_spawn_extra"""
    envp: Any
    cwd: Any
    stdin_fd: int
    keep_fd: int
    oom_score_adj: bytes

class _FFI:
    NULL: Any
    def new(self, cdecl: str, init: Any = ...) -> Any: ...
    def unpack(self, cdata: Any, length: int) -> list[Any]: ...

class _Lib:
    REAPER_EV_SIGNAL: int
    REAPER_EV_EXIT: int
    REAPER_EV_STOP: int
    REAPER_MAX_SIGNAL: int
    REAPER_LATENCY_BOUNDS: int
    REAPER_MAX_EXTRA: int
    REAPER_FWD_USER_ONLY: int
    REAPER_END_IF_ALONE: int
    REAPER_END_NO_DRAIN: int
    REAPER_WAIT_NO_CHILDREN: int
    REAPER_WAIT_MORE: int
    REAPER_WAIT_FDS: int
    REAPER_CHILD_OOM_RAISE: int
    def reaper_setup(self, invoker_blocked: Any, /) -> int: ...
    def reaper_spawn(self, argv: Any, own_group: int, take_tty: int, listen_pid: int, extra: Any,
                     exec_errno: Any, /) -> int: ...
    def reaper_wait(self, sfd: int, timeout_ms: int, w: WaiterStruct, events: Any, cap: int,
                    state: Any, /) -> int: ...
    def reaper_scope_is_empty(self, no_children: int, main_group: int, /) -> int: ...
    def reaper_exit_code(self, status: int, /) -> int: ...
    def reaper_exec_failure_code(self, err: int, /) -> int: ...
    def reaper_set_subreaper(self, /) -> int: ...
    def reaper_set_pdeathsig(self, signo: int, /) -> int: ...

ffi: _FFI
lib: _Lib
