/* Process lifecycles against the slice's books. Usage: lifecycle MODE BYTES [PROGRAM ARGS...]
 *   rawfork  allocates BYTES, makes a child by the raw clone system call (no fork handlers)
 *            that calls exit(), waits for it, prints "child_exited=1", holds until stdin closes;
 *   zombie   a child (fork) allocates BYTES and is killed (SIGKILL: no exit handler runs); the
 *            parent never waits for it, prints "zombie=Z" once the kernel shows it dead and
 *            unreaped, holds until stdin closes;
 *   exec     allocates BYTES, then execs PROGRAM ARGS (the old image's memory is gone). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver.h"

static int alloc(size_t bytes) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx))
        return -1;
    return cuMemAlloc_v2(&p, bytes);
}

static void hold(void) {
    fflush(stdout);
    char buf[16];
    while (fread(buf, 1, sizeof buf, stdin) > 0) {}
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: lifecycle MODE BYTES [PROGRAM ARGS...]\n"); return 2; }
    size_t bytes = strtoull(argv[2], 0, 10);
    if (strcmp(argv[1], "rawfork") == 0) {
        printf("alloc=%d ", alloc(bytes));
        fflush(stdout);
        long pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) exit(0);
        waitpid((pid_t)pid, 0, 0);
        printf("child_exited=1\n");
        hold();
        return 0;
    }
    if (strcmp(argv[1], "zombie") == 0) {
        int pipefd[2];
        if (pipe(pipefd)) return 1;
        pid_t pid = fork();
        if (pid == 0) {
            int r = alloc(bytes);
            if (write(pipefd[1], &r, sizeof r) != sizeof r) _exit(1);
            kill(getpid(), SIGKILL);
        }
        int r = -1;
        if (read(pipefd[0], &r, sizeof r) != sizeof r) return 1;
        /* Dead but not reaped: wait until the kernel shows it as a zombie. */
        char path[64], state = 0;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
        for (int i = 0; i < 1000 && state != 'Z'; i++) {
            FILE *f = fopen(path, "r");
            if (f) { if (fscanf(f, "%*d %*s %c", &state) != 1) state = 0; fclose(f); }
            if (state != 'Z') usleep(10000);
        }
        printf("child_alloc=%d zombie=%c\n", r, state);
        hold();
        return 0;
    }
    if (strcmp(argv[1], "exec") == 0 && argc > 3) {
        printf("alloc=%d ", alloc(bytes));
        fflush(stdout);
        execv(argv[3], argv + 3);
        return 127;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
