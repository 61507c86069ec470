/* Installed setuid root by tests/test_faults.py: becomes root for good (real, effective
 * and saved ids), so that its unprivileged invoker may no longer signal it, writes its
 * pid to argv[1] and sleeps until SIGALRM ends it argv[2] seconds later. */
#define _GNU_SOURCE
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
    alarm((unsigned)atoi(argv[2]));
    for (;;)
        pause();
}
