/* reaper's C core. See reaper_core.h; the Python layer is reaper/_native.py.
 *
 * Pipeline, as the Python side calls it:
 *   reaper_setup      block every signal we handle, remember what the invoker gave us
 *   reaper_spawn      fork, isolate the child, give it back the invoker's signals, exec
 *   reaper_wait       one blocking poll, then a batch of signals and reaped children
 */
#define _GNU_SOURCE
#include "reaper_core.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What the invoker gave us, restored in the child before exec. */
static sigset_t invoker_mask;
static unsigned char invoker_ignored[_NSIG];

static int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* CPython ignores SIGPIPE and SIGXFSZ before any of our code runs, and
 * installs its own SIGINT handler only where the invoker left SIG_DFL; the
 * child must not inherit those changes (subprocess's restore_signals does the
 * same). An invoker's SIG_IGN on PIPE/XFSZ is indistinguishable from
 * CPython's, so those two always go back to SIG_DFL. */
static int set_by_python(int sig)
{
    return sig == SIGPIPE || sig == SIGXFSZ;
}

/* Also says which signals are at SIG_DFL now (at_default), for reaper_setup. */
static void remember_invoker_dispositions(unsigned char *at_default)
{
    for (int sig = 1; sig < _NSIG; sig++) {
        struct sigaction old;
        if (sigaction(sig, NULL, &old) != 0)
            continue;
        at_default[sig] = old.sa_handler == SIG_DFL;
        if (!set_by_python(sig))
            invoker_ignored[sig] = old.sa_handler == SIG_IGN;
    }
}

/* Returns a signalfd on success, -errno on failure. Must run before the
 * interpreter starts any thread, so that every thread inherits the mask and
 * no handled signal can be delivered to a thread instead of the signalfd.
 * invoker_blocked: when a launcher blocked the same set before this call (bin/reaper's
 * first statement), the mask it replaced, bit N-1 for signal N; NULL: the mask in
 * place now is the invoker's. */
int reaper_setup(const uint64_t *invoker_blocked)
{
    sigset_t handled;
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    unsigned char at_default[_NSIG] = {0};

    remember_invoker_dispositions(at_default);

    /* sigfillset leaves out glibc's two reserved real-time signals (32, 33); so does
     * the launcher's _signal.valid_signals(), which is sigfillset too.
     * SIGTTIN and SIGTTOU are handled like the rest (forwarded, for job control):
     * blocked, they also never stop reaper for writing a log line to a terminal
     * it does not own (the kernel treats a blocked TTOU like an ignored one). */
    sigfillset(&handled);

    int rc = pthread_sigmask(SIG_BLOCK, &handled, &invoker_mask);
    if (rc != 0)
        return -rc;
    if (invoker_blocked != NULL) {
        sigemptyset(&invoker_mask);
        for (int sig = 1; sig <= 64 && sig < _NSIG; sig++)
            if (*invoker_blocked >> (sig - 1) & 1)
                sigaddset(&invoker_mask, sig); /* fails harmlessly for 32/33 */
    }

    /* Blocked signals are queued even for PID 1 and even when ignored; but an
     * inherited SIG_IGN for SIGCHLD would make the kernel reap children itself
     * and hide the main child's status from us. Only what is not at its default
     * is reset: setting SIG_DFL again would drop a pending signal whose default
     * is to ignore it (SIGWINCH, SIGURG, SIGCONT) that came since the launcher's block. */
    for (int sig = 1; sig < _NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && !at_default[sig])
            sigaction(sig, &dfl, NULL); /* fails harmlessly for 32/33 */

    int sfd = signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        return -errno;
    /* An invoker that closed stdin, stdout or stderr gets them closed in the
     * child too, not replaced by our signalfd (nor our log lines sent to it). */
    if (sfd <= STDERR_FILENO) {
        int high = fcntl(sfd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1), err = errno;
        close(sfd);
        sfd = high < 0 ? -err : high;
    }
    return sfd;
}

static void restore_invoker_signals(void)
{
    struct sigaction act = {0};
    for (int sig = 1; sig < _NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        act.sa_handler = invoker_ignored[sig] ? SIG_IGN : SIG_DFL;
        sigaction(sig, &act, NULL); /* fails harmlessly for 32/33 */
    }
    /* Dispositions first, mask last: a signal already pending (forwarded
     * before exec) is then delivered with the invoker's disposition, never
     * to a handler left over from the interpreter. */
    pthread_sigmask(SIG_SETMASK, &invoker_mask, NULL);
}

static void restore_cwd(int cwdfd)
{
    if (cwdfd >= 0) {
        int unused = fchdir(cwdfd);
        (void)unused;
        close(cwdfd);
    }
}

int reaper_exec_failure_code(int err)
{
    return err == ENOENT || err == ENOTDIR ? 127 : 126;
}

int reaper_exit_code(int status)
{
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

/* The child fails before or at exec: tell the parent through the pipe, or say
 * it ourselves when there is no pipe (no fd was free for it). */
static void child_failed(char *const argv[], int err, int errfd)
{
    ssize_t unused;
    if (errfd >= 0) {
        unused = write(errfd, &err, sizeof err);
    } else {
        const char *what = strerror(err);
        struct iovec line[] = {{"reaper: cannot run ", 19}, {argv[0], strlen(argv[0])},
                               {": ", 2}, {(char *)what, strlen(what)}, {"\n", 1}};
        unused = writev(STDERR_FILENO, line, 5);
    }
    (void)unused;
    _exit(reaper_exec_failure_code(err));
}

/* systemd socket activation through an init: LISTEN_PID named reaper, the
 * sockets are the child's now. Rewritten in place, without malloc. */
static void rewrite_listen_pid(void)
{
    static char entry[32] = "LISTEN_PID=";
    char digits[16];
    int len = 0;
    for (unsigned long pid = (unsigned long)getpid(); len == 0 || pid > 0; pid /= 10)
        digits[len++] = (char)('0' + pid % 10);
    for (int i = 0; i < len; i++)
        entry[11 + i] = digits[len - 1 - i];
    entry[11 + len] = '\0';
    for (char **e = environ; e != NULL && *e != NULL; e++)
        if (strncmp(*e, "LISTEN_PID=", 11) == 0)
            *e = entry;
}

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* A service gets stdin, stdout, stderr and its readiness fd, nothing else reaper
 * holds or inherited (the main child keeps the inherited ones; a restart later
 * would not have them anyway). Marked close-on-exec, so the exec pipe still works. */
static void close_other_fds(int keep_fd)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
#endif
    {
        struct rlimit rl;
        int top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur : 65536;
        for (int fd = 3; fd < top; fd++)
            fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    if (keep_fd >= 0)
        fcntl(keep_fd, F_SETFD, 0);
}

static void service_setup(char *const argv[], const struct reaper_spawn_extra *x, int errfd)
{
    if (x->cwd != NULL && chdir(x->cwd) < 0)
        child_failed(argv, errno, errfd);
    if (x->stdin_fd >= 0 && x->stdin_fd != STDIN_FILENO && dup2(x->stdin_fd, STDIN_FILENO) < 0)
        child_failed(argv, errno, errfd);
    close_other_fds(x->keep_fd);
    if (x->oom_score_adj[0] != '\0') {
        /* Back to the invoker's value (reaper lowers its own): raising it needs no privilege. */
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t unused = write(fd, x->oom_score_adj, strnlen(x->oom_score_adj, sizeof x->oom_score_adj));
            (void)unused;
            close(fd);
        }
    }
}

/* REAPER_CHILD_OOM_RAISE, in the child: raw system calls and integers written by hand
 * (async-signal-safe). Skipped where reaper may lower its own value instead (it has
 * CAP_SYS_RESOURCE: reaper/oom.py), and for a value of -1000 (nobody is chosen). */
static void raise_oom_score(void)
{
    /* capget(2)'s ABI, version 3 (linux/capability.h, which musl toolchains may lack);
     * CAP_SYS_RESOURCE is capability 24. */
    struct { uint32_t version; int pid; } hdr = { 0x20080522, 0 };
    struct { uint32_t effective, permitted, inheritable; } caps[2];
    if (syscall(SYS_capget, &hdr, caps) == 0 && (caps[0].effective & (1u << 24)))
        return;
    char buf[16];
    int fd = open("/proc/self/oom_score_adj", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return;
    int neg = buf[0] == '-', value = 0;
    for (ssize_t i = neg; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
        value = value * 10 + (buf[i] - '0');
    if (neg)
        value = -value;
    int want = value + REAPER_CHILD_OOM_RAISE > 1000 ? 1000 : value + REAPER_CHILD_OOM_RAISE;
    if (value <= -1000 || want <= value)
        return;
    char out[8];
    int len = 0, w = want < 0 ? -want : want;
    char digits[8];
    int d = 0;
    do {
        digits[d++] = (char)('0' + w % 10);
        w /= 10;
    } while (w > 0);
    if (want < 0)
        out[len++] = '-';
    while (d > 0)
        out[len++] = digits[--d];
    fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t unused = write(fd, out, (size_t)len);
        (void)unused;
        close(fd);
    }
}

/* Only async-signal-safe calls between fork and exec. */
static void become_child(char *const argv[], int own_group, int take_tty, int listen_pid,
                         const struct reaper_spawn_extra *extra, int cwdfd, int errfd)
{
    /* Back to the directory reaper was started in (the parent left it before the fork). */
    if (cwdfd >= 0 && fchdir(cwdfd) < 0)
        child_failed(argv, errno, errfd);
    if (extra != NULL)
        service_setup(argv, extra, errfd);
    raise_oom_score();
    if (own_group) {
        setpgid(0, 0);
        /* In the child, not the parent: the child must own the terminal
         * before it execs and reads from it. SIGTTOU is blocked here. */
        if (take_tty && isatty(STDIN_FILENO))
            tcsetpgrp(STDIN_FILENO, getpid());
    }
    if (listen_pid)
        rewrite_listen_pid();
    restore_invoker_signals();
    if (extra != NULL && extra->envp != NULL)
        execvpe(argv[0], argv, extra->envp);
    else
        execvp(argv[0], argv);
    child_failed(argv, errno, errfd);
}

/* Returns the child's pid, or -errno if fork failed. *exec_errno is 0 when
 * the child exec'd, or the errno of the failed exec (the child then exits
 * 127/126 by itself). extra: NULL for the main child; a service's stdin,
 * environment, directory, readiness fd and OOM score. */
int reaper_spawn(char *const argv[], int own_group, int take_tty, int listen_pid,
                 const struct reaper_spawn_extra *extra, int *exec_errno)
{
    int errpipe[2];
    *exec_errno = 0;
    /* Without a free fd for the pipe (ulimit -n) the command still runs; an exec
     * failure is then reported by the child itself and through its exit status. */
    if (pipe2(errpipe, O_CLOEXEC) < 0) {
        if (errno != EMFILE && errno != ENFILE)
            return -errno;
        errpipe[0] = errpipe[1] = -1;
    }
    /* reaper's own cwd is / before the child can run (it must never pin a mount
     * the child may want to unmount); the child goes back to the start directory.
     * Without an fd for it, reaper changes directory after the spawn instead. */
    int cwdfd = extra != NULL && extra->cwd != NULL ? -1 : open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cwdfd >= 0 && chdir("/") < 0) {
        close(cwdfd);
        cwdfd = -1;
    }

    /* vfork: no copy of the interpreter's page tables, which made the spawn cost
     * several times the exec itself. Safe here because the child only makes
     * system calls on its own behalf until it execs or _exits: every signal is
     * blocked and none has a handler (reaper_setup), fds and dispositions are
     * the child's own copies, and nothing in the parent's memory is written.
     * Rewriting LISTEN_PID writes the environment, so that case forks. */
    pid_t pid = listen_pid ? fork() : vfork();
    if (pid < 0) {
        int err = errno;
        if (errpipe[0] >= 0) {
            close(errpipe[0]);
            close(errpipe[1]);
        }
        restore_cwd(cwdfd);
        return -err;
    }
    if (pid == 0) {
        if (errpipe[0] >= 0)
            close(errpipe[0]);
        become_child(argv, own_group, take_tty, listen_pid, extra, cwdfd, errpipe[1]);
    }
    /* setpgid in both processes: whichever runs first creates the group, so a
     * signal forwarded to -pid right after we return always has a target.
     * EACCES means the child already exec'd, having done it itself. */
    if (own_group)
        setpgid(pid, pid);
    if (errpipe[0] < 0) {
        if (cwdfd >= 0)
            close(cwdfd);
        return pid;
    }
    close(errpipe[1]);

    /* The pipe closes on a successful exec (CLOEXEC) or carries its errno. */
    int err = 0;
    ssize_t got;
    do
        got = read(errpipe[0], &err, sizeof err);
    while (got < 0 && errno == EINTR);
    close(errpipe[0]);
    if (got == (ssize_t)sizeof err) {
        *exec_errno = err;
        restore_cwd(cwdfd);    /* reaper exits now: its message names paths as given */
    } else if (cwdfd >= 0) {
        close(cwdfd);
    }
    return pid;
}

/* Whether forwarding has a live target: the main child cannot have been reaped
 * while this holds. The reap that would end it comes after the signals in the
 * same call, and that reap sets watch_reaped (reap_children), so a recycled pid
 * is never signalled. */
static int forwarding(const struct reaper_config *cfg, const struct reaper_state *st)
{
    return cfg->forward_pid > 0 && !(st->watch_reaped && cfg->forward_pid == cfg->watch_pid);
}

/* Returns the signal sent to the main child, 0 if none is due, -errno on failure. */
static int forward_signal(const struct reaper_config *cfg, const struct reaper_state *st,
                          const struct signalfd_siginfo *si)
{
    if (!forwarding(cfg, st) || si->ssi_signo > REAPER_MAX_SIGNAL || (int)si->ssi_pid == cfg->self_pid)
        return 0;
    int entry = cfg->forward[si->ssi_signo];
    int target = entry & ~REAPER_FWD_USER_ONLY;
    if (target == 0)
        return 0;
    /* kill, sigqueue and tgkill/tkill are sent by a process; a fault the kernel
     * raised has a positive si_code, which no other process can fake (the kernel
     * refuses si_code >= 0 from rt_sigqueueinfo to another process). */
    if ((entry & REAPER_FWD_USER_ONLY) && si->ssi_code != SI_USER && si->ssi_code != SI_QUEUE &&
        si->ssi_code != SI_TKILL)
        return 0;
    if (cfg->forward_group) {
        /* The group the child is in now: it may have moved to another one since its
         * start, leaving a helper in its first. (It is not reaped yet: forwarding().)
         * Never reaper's own group, which getpgid() names if the child joined it. */
        pid_t group = getpgid(cfg->forward_pid);
        if (group > 0 && group != getpgrp() && kill(-group, target) == 0)
            return target;
    }
    /* No group of its own: the child itself. */
    return kill(cfg->forward_pid, target) == 0 ? target : -errno;
}

/* Returns 1 if signals may be left in the signalfd (the batch was full). */
static int take_signals(int sfd, const struct reaper_waiter *w, struct reaper_event *events,
                        int cap, int *n, int64_t woke)
{
    struct signalfd_siginfo si[16];
    ssize_t got;

    /* One read takes up to 16 signals; a full read means there may be more.
     * Signals may fill only half the buffer: a flood of real-time signals
     * must never keep the reap below from running (or from seeing ECHILD). */
    cap /= 2;
    do {
        got = read(sfd, si, sizeof si);
        for (int i = 0; got > 0 && i < (int)(got / sizeof si[0]); i++) {
            /* SIGCHLD only says "look": the reap below never trusts one per child. */
            if (si[i].ssi_signo == SIGCHLD)
                continue;
            struct reaper_event *ev = &events[(*n)++];
            memset(ev, 0, sizeof *ev);
            ev->forwarded = forward_signal(&w->config, &w->state, &si[i]);
            ev->kind = REAPER_EV_SIGNAL;
            ev->signo = (int)si[i].ssi_signo;
            ev->pid = (int)si[i].ssi_pid;
            ev->uid = (int)si[i].ssi_uid;
            ev->code = si[i].ssi_code;
            ev->woke_ns = woke;
            ev->at_ns = monotonic_ns();
        }
    } while (got == (ssize_t)sizeof si && *n + 16 <= cap);
    return got == (ssize_t)sizeof si;
}

/* A child reaped without an event: into the totals. */
static void count_reaped(struct reaper_waiter *w, int status, const struct rusage *ru, int64_t latency)
{
    struct reaper_totals *t = &w->totals;
    const struct reaper_config *cfg = &w->config;
    int b = 0;

    t->reaped++;
    if (WIFSIGNALED(status) && WTERMSIG(status) <= REAPER_MAX_SIGNAL)
        t->signaled[WTERMSIG(status)]++;
    else if (WIFEXITED(status))
        t->exited[WEXITSTATUS(status)]++;
    while (b < cfg->nbounds && latency > cfg->bounds_ns[b])
        b++;
    t->latency[b]++;
    t->latency_sum_ns += latency;
    t->cpu_us += ru->ru_utime.tv_sec * 1000000L + ru->ru_utime.tv_usec +
                 ru->ru_stime.tv_sec * 1000000L + ru->ru_stime.tv_usec;
}

static int reported(const struct reaper_config *cfg, pid_t pid)
{
    for (int i = 0; i < cfg->nreport && i < REAPER_MAX_EXTRA; i++)
        if (cfg->report_pids[i] == pid)
            return 1;
    return 0;
}

/* Bounds one call's silent reaping, so that an endless storm still lets the
 * loop look at its signals and timers. */
#define SILENT_REAPS_PER_CALL 8192

static void reap_children(struct reaper_waiter *w, struct reaper_event *events, int cap, int *n,
                          int64_t woke, int *state)
{
    const struct reaper_config *cfg = &w->config;
    int silent = 0;
    /* Filling rusage has the kernel add up each child's CPU times: a measurable
     * part of a reap in a storm, skipped when nothing reads them (no metrics). */
    struct rusage ru = {0};
    struct rusage *want_ru = cfg->no_rusage ? NULL : &ru;
    while (*n < cap) {
        int status;
        pid_t pid = wait4(-1, &status, WNOHANG | (cfg->report_stops ? WUNTRACED : 0), want_ru);
        if (pid == 0)
            return;
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ECHILD)
                *state |= REAPER_WAIT_NO_CHILDREN;
            return;
        }
        int64_t now = monotonic_ns();
        if (WIFSTOPPED(status)) {
            /* Reported once per stop; only the main child's matters (job control). */
            if (pid == cfg->watch_pid) {
                struct reaper_event *ev = &events[(*n)++];
                memset(ev, 0, sizeof *ev);
                ev->kind = REAPER_EV_STOP;
                ev->pid = pid;
                ev->signo = WSTOPSIG(status);
                ev->code = status;
                ev->woke_ns = woke;
                ev->at_ns = now;
            }
            continue;
        }
        if (pid == cfg->watch_pid) {
            /* Recorded here, before Python sees the event: the status is the
             * one thing reaper must never lose. The pid is free from now on:
             * nothing is forwarded to it any more (forwarding()). */
            w->state.watch_reaped = 1;
            w->state.watch_status = status;
        }
        if (pid != cfg->watch_pid && !cfg->report_all && !reported(cfg, pid)) {
            count_reaped(w, status, &ru, now - woke);
            if (++silent == SILENT_REAPS_PER_CALL) {
                *state |= REAPER_WAIT_MORE;
                return;
            }
            continue;
        }
        struct reaper_event *ev = &events[(*n)++];
        memset(ev, 0, sizeof *ev);
        ev->kind = REAPER_EV_EXIT;
        ev->pid = pid;
        ev->code = status;
        ev->utime_us = ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec;
        ev->stime_us = ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec;
        ev->maxrss_kb = ru.ru_maxrss;
        ev->woke_ns = woke;
        ev->at_ns = now;
    }
}

/* 1 only if the drain has nothing to stop, found without reading /proc: as
 * PID 1, no other process in the namespace (orphans, a `kubectl exec`); else
 * no child (so no descendant) and nothing left in the main child's group.
 * 0 when unsure. Signal 0 is a check: nothing is sent. kill(-1) only as PID 1,
 * where it means this namespace and nothing beyond. */
int reaper_scope_is_empty(int no_children, int main_group)
{
    int r;
    if (getpid() == 1)
        r = kill(-1, 0);
    else if (!no_children)
        return 0;
    else if (main_group > 0)
        r = kill(-main_group, 0);
    else
        return 1;
    return r < 0 && errno == ESRCH;
}

/* The quiet end (reaper_config.quiet_end): after a long sleep every bytecode
 * the interpreter runs is slow (cold caches), so the common end, the main
 * child's exit and nothing else, is taken here, as a C init would. */
static void end_if_quiet(const struct reaper_waiter *w, const struct reaper_event *events, int n, int state)
{
    const struct reaper_config *cfg = &w->config;
    if (!cfg->quiet_end || !w->state.watch_reaped || n != 1 || events[0].kind != REAPER_EV_EXIT ||
        events[0].pid != cfg->watch_pid || (state & REAPER_WAIT_MORE) || w->totals.reaped)
        return;
    if (cfg->quiet_end == REAPER_END_IF_ALONE &&
        !reaper_scope_is_empty(state & REAPER_WAIT_NO_CHILDREN, cfg->watch_pid))
        return;
    int code = reaper_exit_code(w->state.watch_status);
    _exit(cfg->zero_codes[code & 0xff] ? 0 : code);
}

/* poll()'s timeout for what is left until deadline (-1: none). */
static int remaining_ms(int64_t deadline, int timeout_ms)
{
    if (deadline < 0)
        return -1;
    int64_t left = deadline - monotonic_ns();
    if (left <= 0)
        return 0;
    int64_t ms = (left + 999999) / 1000000;
    return ms < timeout_ms ? (int)ms : timeout_ms;
}

/* Blocks until a signal arrives or timeout_ms passes (-1: no timeout, so an
 * idle reaper never wakes up). Then takes every queued signal and reaps every
 * child that has exited, whether or not a SIGCHLD was seen: SIGCHLDs
 * coalesce, so one may stand for thousands of exits. Children other than
 * config.watch_pid and config.report_pids (the services) are counted in
 * w->totals unless config.report_all. The poll also wakes for config.poll_fds
 * (the services' readiness pipes): REAPER_WAIT_FDS in *state, no timer. Called
 * with the GIL released. Returns the number of events written. */
int reaper_wait(int sfd, int timeout_ms, struct reaper_waiter *w,
                struct reaper_event *events, int cap, int *state)
{
    struct pollfd pfd[1 + REAPER_MAX_EXTRA] = {{.fd = sfd, .events = POLLIN}};
    int n = 0, nfds = 1;

    for (int i = 0; i < w->config.npoll && i < REAPER_MAX_EXTRA; i++)
        pfd[nfds++] = (struct pollfd){.fd = w->config.poll_fds[i], .events = POLLIN};
    int64_t deadline = timeout_ms < 0 ? -1 : monotonic_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        *state = 0;
        int ready = poll(pfd, (nfds_t)nfds, remaining_ms(deadline, timeout_ms));
        if (ready < 0 && errno != EINTR)
            return -errno;
        for (int i = 1; i < nfds; i++)
            if (pfd[i].revents)
                *state |= REAPER_WAIT_FDS;
        int64_t woke = monotonic_ns();
        int before = n;
        if (take_signals(sfd, w, events, cap, &n, woke))
            *state |= REAPER_WAIT_MORE;
        for (int i = before; i < n; i++)
            if (events[i].forwarded > 0) {
                /* The main child was just signalled: let it run before reaper's
                 * own bookkeeping when both share this CPU (the latency it sees). */
                sched_yield();
                break;
            }
        reap_children(w, events, cap, &n, woke, state);
        if (n == cap)
            *state |= REAPER_WAIT_MORE;
        end_if_quiet(w, events, n, *state);
        /* Orphans reaped silently (counted in the totals) give Python nothing to
         * do: wait again here rather than return. In a storm of orphan deaths the
         * interpreter then stays off the path between one SIGCHLD and the next,
         * and reaper wakes as cheaply as a C init does. */
        if (n > 0 || *state || ready == 0 || remaining_ms(deadline, timeout_ms) == 0)
            return n;
    }
}

int reaper_set_subreaper(void)
{
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0 ? -errno : 0;
}

int reaper_set_pdeathsig(int signo)
{
    return prctl(PR_SET_PDEATHSIG, signo, 0, 0, 0) < 0 ? -errno : 0;
}
