"""cffi build script for reaper's C core (API mode, out-of-line).

Referenced from setup.py's ``cffi_modules``; builds the extension ``reaper._core``.
"""
from cffi import FFI

ffi = FFI()
ffi.cdef(
    """
    #define REAPER_EV_SIGNAL ...
    #define REAPER_EV_EXIT ...
    #define REAPER_EV_STOP ...
    #define REAPER_WAIT_NO_CHILDREN ...
    #define REAPER_WAIT_MORE ...
    #define REAPER_MAX_SIGNAL ...
    #define REAPER_LATENCY_BOUNDS ...
    #define REAPER_FWD_USER_ONLY ...
    #define REAPER_WAIT_FDS ...
    #define REAPER_MAX_EXTRA ...

    struct reaper_event {
        int kind;
        int pid;
        int signo;
        int code;
        int uid;
        int forwarded;
        long utime_us;
        long stime_us;
        long maxrss_kb;
        int64_t woke_ns;
        int64_t at_ns;
    };

    struct reaper_totals {
        uint64_t exited[256];
        uint64_t signaled[...];
        uint64_t latency[...];
        int64_t latency_sum_ns;
        int64_t cpu_us;
        uint64_t reaped;
    };

    struct reaper_waitspec {
        int watch_pid;
        int watch_reaped;
        int watch_status;
        int report_all;
        int report_stops;
        int no_rusage;
        int self_pid;
        int forward_pid;
        int forward_group;
        int forward[...];
        int nbounds;
        int64_t bounds_ns[...];
        struct reaper_totals totals;
        int nreport;
        int report_pids[...];
        int npoll;
        int poll_fds[...];
        int quiet_end;
        unsigned char zero_codes[256];
    };

    #define REAPER_END_IF_ALONE ...
    #define REAPER_END_NO_DRAIN ...

    struct reaper_spawn_extra {
        char *const *envp;
        const char *cwd;
        int stdin_fd;
        int keep_fd;
        char oom_score_adj[8];
    };

    int reaper_setup(void);
    int reaper_spawn(char *const argv[], int own_group, int take_tty, int listen_pid,
                     const struct reaper_spawn_extra *extra, int *exec_errno);
    int reaper_wait(int sfd, int timeout_ms, struct reaper_waitspec *spec,
                    struct reaper_event *events, int cap, int *state);
    int reaper_scope_is_empty(int no_children, int main_group);
    int reaper_set_subreaper(void);
    int reaper_set_pdeathsig(int signo);
    """
)
ffi.set_source(
    "reaper._core",
    '#include "reaper_core.h"',
    # Paths relative to the project root, where setuptools runs this script.
    sources=["csrc/reaper_core.c"],
    include_dirs=["csrc"],
    extra_compile_args=["-std=gnu99", "-Wall", "-Wextra", "-O2"],
)

if __name__ == "__main__":
    ffi.compile(verbose=True)
