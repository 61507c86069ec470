/* The processes bench/bench_core.py puts under an init (reaper or tini).
 * One static binary, several roles picked by argv[1]; every timestamp is
 * CLOCK_MONOTONIC in nanoseconds, the clock Python's time.monotonic_ns() reads.
 *
 *   launch INIT ARGS...  stamp, posix_spawn INIT, wait, stamp: "launch T0 T2 STATUS"
 *   stamp                "child T1": the moment the child runs
 *   storm N [FD]         park N orphans on PID 1, release them on "go" (stdin);
 *                        with FD, each orphan writes a byte to FD as it exits
 *   drain K              leave K processes behind and exit: "exit T"
 *   linger               "ready", then on a line from stdin "exit T" and exit
 *   stream N             on "go", N orphans one after another, as fast as they can be
 *                        made (double fork: each grandchild exits at once): "done T"
 *   sigwait COUNT        block SIGUSR1, answer each one with "sig T"
 *   idle                 "ready", then block on stdin until EOF
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* One write(2) per line: several processes share the bench's pipe. */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ssize_t unused = write(STDOUT_FILENO, buf, (size_t)n);
    (void)unused;
}

/* Reads stdin until a newline or EOF; returns 0 on EOF without data. */
static int read_line(void)
{
    char c;
    int got = 0;
    for (;;) {
        ssize_t n = read(STDIN_FILENO, &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return got;
        got = 1;
        if (c == '\n')
            return 1;
    }
}

static int launch(char **argv)
{
    pid_t pid;
    long long t0 = now_ns();
    int rc = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ);
    if (rc != 0) {
        fprintf(stderr, "launch: %s: %s\n", argv[0], strerror(rc));
        return 1;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    long long t2 = now_ns();
    say("launch %lld %lld %d\n", t0, t2, status);
    return 0;
}

#define PER_PARENT 100

/* Each intermediate parent forks up to PER_PARENT grandchildren that block on
 * the go pipe, then exits: the grandchildren are re-parented to PID 1 (the
 * init under test) while still alive. One close() of the go pipe then makes
 * all of them exit in the same instant: a storm of orphan deaths that only
 * the init can reap. The parent's exit status is how many it forked. */
static int storm(int n, int exited_fd)
{
    int go[2];
    if (pipe(go) < 0)
        return 1;
    int parents = (n + PER_PARENT - 1) / PER_PARENT, parked = 0;
    for (int p = 0; p < parents; p++) {
        int want = n - p * PER_PARENT < PER_PARENT ? n - p * PER_PARENT : PER_PARENT;
        pid_t pid = fork();
        if (pid < 0)
            break;
        if (pid == 0) {
            int made = 0;
            for (; made < want; made++) {
                pid_t g = fork();
                if (g < 0)
                    break;
                if (g == 0) {
                    close(go[1]);
                    char c;
                    while (read(go[0], &c, 1) < 0 && errno == EINTR)
                        ;
                    if (exited_fd >= 0) {   /* counted by the bench: exited, not yet reaped */
                        ssize_t unused = write(exited_fd, "x", 1);
                        (void)unused;
                    }
                    _exit(0);
                }
            }
            _exit(made);
        }
    }
    close(go[0]);
    int status;
    pid_t w;
    while ((w = wait(&status)) > 0 || (w < 0 && errno == EINTR))
        if (w > 0 && WIFEXITED(status))
            parked += WEXITSTATUS(status);
    say("ready %d\n", parked);
    if (!read_line())
        return 1;
    long long t = now_ns();
    close(go[1]);
    say("go %lld\n", t);
    while (read_line())     /* stay until the bench has seen the storm end */
        ;
    return 0;
}

/* A stream of orphan deaths at the rate the machine can fork: the init must keep
 * up with one exit after another rather than reap a backlog. */
static int stream(int n)
{
    say("ready\n");
    if (!read_line())
        return 1;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            if (fork() < 0)
                _exit(1);
            _exit(0);      /* the grandchild (and the child) exit at once */
        }
        int status;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
    say("done %lld\n", now_ns());
    while (read_line())
        ;
    return 0;
}

static void on_term(int sig)
{
    (void)sig;
    static const char msg[] = "term\n";   /* proof that the handler ran */
    ssize_t unused = write(STDOUT_FILENO, msg, sizeof msg - 1);
    (void)unused;
    _exit(0);
}

/* K processes stay behind when this main child exits: half catch SIGTERM and
 * report it, half keep the default action. */
static int drain(int k)
{
    int ready[2];
    if (pipe(ready) < 0)
        return 1;
    for (int i = 0; i < k; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            close(ready[0]);
            if (i % 2 == 0) {
                struct sigaction sa = {.sa_handler = on_term};
                sigaction(SIGTERM, &sa, NULL);
            }
            ssize_t unused = write(ready[1], "r", 1);
            (void)unused;
            close(ready[1]);
            close(STDIN_FILENO);
            for (;;)
                pause();
        }
    }
    close(ready[1]);
    char c;
    for (int got = 0; got < k;) {
        ssize_t n = read(ready[0], &c, 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 1;
        got++;
    }
    say("exit %lld\n", now_ns());
    _exit(0);
}

static int sigwait_loop(int count)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    say("ready\n");
    for (int i = 0; i < count; i++) {
        siginfo_t si;
        if (sigwaitinfo(&set, &si) < 0) {
            if (errno == EINTR) {
                i--;
                continue;
            }
            return 1;
        }
        say("sig %lld\n", now_ns());
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    const char *role = argv[1];
    if (!strcmp(role, "stamp")) {
        say("child %lld\n", now_ns());
        return 0;
    }
    if (!strcmp(role, "launch") && argc > 2)
        return launch(argv + 2);
    if (!strcmp(role, "storm") && (argc == 3 || argc == 4))
        return storm(atoi(argv[2]), argc == 4 ? atoi(argv[3]) : -1);
    if (!strcmp(role, "drain") && argc == 3)
        return drain(atoi(argv[2]));
    if (!strcmp(role, "sigwait") && argc == 3)
        return sigwait_loop(atoi(argv[2]));
    if (!strcmp(role, "stream") && argc == 3)
        return stream(atoi(argv[2]));
    if (!strcmp(role, "linger")) {
        say("ready\n");
        if (!read_line())
            return 1;
        say("exit %lld\n", now_ns());
        _exit(0);
    }
    if (!strcmp(role, "idle")) {
        say("ready\n");
        while (read_line())
            ;
        return 0;
    }
    fprintf(stderr, "bench_helper: unknown role %s\n", role);
    return 2;
}
