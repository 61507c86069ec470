/* Test helper: makes orphans for reaper to reap.
 *   storm orphans N   fork N children that each fork a grandchild and exit at once,
 *                     so N grandchildren are orphaned; prints "done N" when all are made
 *   storm burst N S   fork N children blocked on a pipe, then exit with status S:
 *                     the children see EOF and die in the same instant as their parent */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int orphans(int n)
{
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            if (fork() < 0)
                _exit(1);
            _exit(0); /* the grandchild (if any) exits too, orphaned */
        }
        waitpid(pid, NULL, 0);
    }
    printf("done %d\n", n);
    fflush(stdout);
    return 0;
}

static int burst(int n, int status)
{
    int fds[2];
    char c;
    if (pipe(fds) < 0)
        return 1;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            close(fds[1]);
            while (read(fds[0], &c, 1) > 0)
                ;
            _exit(0);
        }
    }
    return status; /* closing fds[1] at exit wakes every child at once */
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "orphans") == 0)
        return orphans(atoi(argv[2]));
    if (argc >= 4 && strcmp(argv[1], "burst") == 0)
        return burst(atoi(argv[2]), atoi(argv[3]));
    fprintf(stderr, "usage: storm orphans N | storm burst N STATUS\n");
    return 2;
}
