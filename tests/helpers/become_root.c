/* Installed setuid root by tests/test_faults.py: becomes root for good (real, effective
 * and saved ids), so that its unprivileged invoker may no longer signal it, writes its
 * pid to argv[1] and sleeps until SIGALRM ends it argv[2] seconds later. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc != 3 || setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0)
        return 1;
    FILE *f = fopen(argv[1], "w");
    if (f == NULL)
        return 1;
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
    /* It outlives reaper on purpose: it must not hold the test's pipes open. */
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++)
        dup2(null, fd);
    alarm((unsigned)atoi(argv[2]));
    for (;;)
        pause();
}
