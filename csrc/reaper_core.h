/* reaper's C core: signal setup, spawning the main child, and the one
 * blocking wait that returns a batch of events. Policy lives in Python. */
#ifndef REAPER_CORE_H
#define REAPER_CORE_H

#include <stdint.h>

#define REAPER_EV_SIGNAL 1 /* a signal was read from the signalfd */
#define REAPER_EV_EXIT   2 /* a child was reaped */
#define REAPER_EV_STOP   3 /* the main child was stopped (signo: the stop signal); only with report_stops */

struct reaper_event {
    int kind;          /* REAPER_EV_SIGNAL, REAPER_EV_EXIT or REAPER_EV_STOP */
    int pid;           /* sender pid (signal) or reaped pid (exit) */
    int signo;         /* signal number (signal events) */
    int code;          /* si_code (signal) or wait status (exit, stop) */
    int uid;           /* sender uid (signal events) */
    int forwarded;     /* signal sent to the main child, 0 if none, -errno if that failed */
    long utime_us;     /* rusage of a reaped child */
    long stime_us;
    long maxrss_kb;
    int64_t woke_ns;   /* CLOCK_MONOTONIC when the wait returned */
    int64_t at_ns;     /* CLOCK_MONOTONIC when this event was taken */
};

#define REAPER_MAX_SIGNAL 64
#define REAPER_LATENCY_BOUNDS 16
#define REAPER_MAX_EXTRA 64 /* services: pids reported, readiness fds polled */

/* Children reaped without an event of their own (orphans, in the common case):
 * counted here in C, so a storm of thousands costs Python nothing per child. */
struct reaper_totals {
    uint64_t exited[256];                        /* by exit status */
    uint64_t signaled[REAPER_MAX_SIGNAL + 1];    /* by terminating signal */
    uint64_t latency[REAPER_LATENCY_BOUNDS + 1]; /* wake-up to reap, per bucket; last is +Inf */
    int64_t latency_sum_ns;
    int64_t cpu_us;                              /* user + system */
    uint64_t reaped;                             /* all of them: one number to test */
};

/* In reaper_config.forward[]: forward only a signal another process sent
 * (si_code SI_USER, SI_QUEUE or SI_TKILL), never one the kernel raised. */
#define REAPER_FWD_USER_ONLY 0x10000

/* What reaper_wait reports as events, where it counts the rest, and where it
 * forwards signals: set from Python (reaper/_native.py), only read here. The
 * forwarding table is policy; doing the kill() here keeps the interpreter off
 * the signal's path. */
struct reaper_config {
    int watch_pid;        /* always an event when reaped (the main child); 0: none */
    int report_all;       /* every reaped child is an event */
    int report_stops;     /* wait with WUNTRACED: a stop of watch_pid is an event, other stops are skipped */
    int no_rusage;        /* reap without rusage: no CPU times (only the metrics read them) */
    int self_pid;         /* reaper's pid: signals it raised itself are not forwarded */
    int forward_pid;      /* the main child; 0: forward nothing (nor once it is watch_pid and reaped) */
    int forward_group;    /* signal the process group it is in now, else the child alone */
    int forward[REAPER_MAX_SIGNAL + 1]; /* signal to send for each received, | REAPER_FWD_USER_ONLY; 0: none */
    int nbounds;          /* latency bucket upper bounds, ascending */
    int64_t bounds_ns[REAPER_LATENCY_BOUNDS];
    /* Supervised services (reaper/services/): their exits are events too, and the
     * wait also wakes for their readiness pipes (REAPER_WAIT_FDS says one is readable). */
    int nreport;
    int report_pids[REAPER_MAX_EXTRA];
    int npoll;
    int poll_fds[REAPER_MAX_EXTRA];
    /* The quiet end, armed from Python before each wait while nothing is asked of
     * the end but the exit status (no metrics, budgets, summary, news): when a
     * wait's only event is the main child's exit, no orphan was ever reaped and
     * (REAPER_END_IF_ALONE) nothing is left to drain, reaper_wait exits the
     * process itself with the status, 0 where zero_codes says so (-e). */
    int quiet_end;
    unsigned char zero_codes[256];
};

/* What reaper_wait found and keeps: the main child's end, kept in C so that it
 * survives any failure in Python. */
struct reaper_state {
    int watch_reaped;     /* config.watch_pid was reaped... */
    int watch_status;     /* ...with this wait status */
};

/* One waiter: its configuration, its state and its totals, apart. */
struct reaper_waiter {
    struct reaper_config config;
    struct reaper_state state;
    struct reaper_totals totals;
};

/* reaper_config.quiet_end */
#define REAPER_END_IF_ALONE 1     /* ...and scope_is_empty() */
#define REAPER_END_NO_DRAIN 2     /* --no-drain: whatever is left */

/* Flags for reaper_wait()'s *state output. */
#define REAPER_WAIT_NO_CHILDREN 1 /* waitpid said ECHILD: nothing left to reap */
#define REAPER_WAIT_MORE        2 /* the buffer filled up: call again at once */
#define REAPER_WAIT_FDS         4 /* one of config.poll_fds is readable (or hung up) */

/* Added to every child's oom_score_adj before it execs, where reaper cannot lower its
 * own (no CAP_SYS_RESOURCE): a child scores as if it used this many thousandths of the
 * memory limit more, so reaper (PID 1) is not the OOM killer's choice while a child could
 * be. Never lowers a value, never past 1000, never from -1000 (docs/reaper.md). */
#define REAPER_CHILD_OOM_RAISE 300

/* What a service gets besides what the main child gets (reaper_spawn's extra). */
struct reaper_spawn_extra {
    char *const *envp;      /* its environment; NULL: reaper's */
    const char *cwd;        /* chdir() here in the child; NULL: as the main child (see reaper_spawn) */
    int stdin_fd;           /* dup2()ed to its stdin; -1: reaper's */
    int keep_fd;            /* the one fd >= 3 it keeps (its readiness pipe); the rest are closed at exec */
    char oom_score_adj[8];  /* written to its oom_score_adj; "": left as inherited */
};

int reaper_setup(const uint64_t *invoker_blocked);
int reaper_spawn(char *const argv[], int own_group, int take_tty, int listen_pid,
                 const struct reaper_spawn_extra *extra, int *exec_errno);
int reaper_wait(int sfd, int timeout_ms, struct reaper_waiter *w,
                struct reaper_event *events, int cap, int *state);
int reaper_scope_is_empty(int no_children, int main_group);
/* reaper's one rule for exit codes, as a shell has it: a wait status's code (its exit
 * status, or 128+N if killed by signal N), and the code for a command that could not
 * be run (127: not found, 126: found but not executable, exec failed). */
int reaper_exit_code(int status);
int reaper_exec_failure_code(int err);
int reaper_set_subreaper(void);
int reaper_set_pdeathsig(int signo);

#endif
