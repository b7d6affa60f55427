/*
 * wake-latency: what this machine's kernel does to a ping-pong between two processes while
 * a third burns one CPU at low priority, with no ferry involved. It is the control for
 * issue 14's point 6 (`ferry bench`, `call-add-matmul`): if a bare pipe ping-pong's p99
 * grows many times under a SCHED_IDLE or nice-19 burner, no server can keep `add`'s p99
 * within 2x of quiet on this machine, whatever it does with its own compute.
 *
 *   gcc -O2 -o /tmp/wake bench/wake-latency/wake.c
 *   for b in none idle nice; do /tmp/wake $b 20000 0; done   # both sides sleep in read()
 *   for b in none idle nice; do /tmp/wake $b 20000 1; done   # the echoing side busy-polls 50 us
 *
 * Arguments: BURNER (none | idle: SCHED_IDLE | nice: nice 19), round trips, POLL (0: both
 * sides block in read(); 1: the echoing side polls for 50 us before it blocks, as `ferry
 * serve` does; 2: both sides poll). The burner computes 4 ms, sleeps 50 us, again (a
 * matmul loop). Prints p50, p99, p99.9, the maximum and how many round trips took over 1 ms.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Reads one byte: polls the (non-blocking) fd for `poll_us` first when asked, then blocks. */
static int read_byte(int fd, char *c, int poll_us) {
    if (poll_us) {
        double start = now_us();
        while (now_us() - start < poll_us)
            if (read(fd, c, 1) == 1) return 1;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    int r = (int)read(fd, c, 1);
    fcntl(fd, F_SETFL, flags);
    return r;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s none|idle|nice ROUND_TRIPS POLL(0|1|2)\n", argv[0]);
        return 2;
    }
    const char *burner = argv[1];
    int n = atoi(argv[2]), poll = atoi(argv[3]);
    if (n <= 0) return 2;
    pid_t burn = 0;
    if (strcmp(burner, "none") != 0) {
        burn = fork();
        if (burn == 0) {
            if (strcmp(burner, "idle") == 0) {
                struct sched_param p = {0};
                sched_setscheduler(0, SCHED_IDLE, &p);
            } else {
                setpriority(PRIO_PROCESS, 0, 19);
            }
            for (;;) {
                double t = now_us();
                while (now_us() - t < 4000) {
                }
                usleep(50);
            }
        }
        usleep(100000);
    }
    int to_echo[2], back[2];
    if (pipe(to_echo) || pipe(back)) return 1;
    pid_t echo = fork();
    if (echo == 0) {
        close(to_echo[1]);
        close(back[0]);
        if (poll >= 1) fcntl(to_echo[0], F_SETFL, O_NONBLOCK);
        char c;
        while (read_byte(to_echo[0], &c, poll >= 1 ? 50 : 0) == 1)
            if (write(back[1], &c, 1) != 1) break;
        _exit(0);
    }
    close(to_echo[0]);
    close(back[1]);
    if (poll >= 2) fcntl(back[0], F_SETFL, O_NONBLOCK);
    double *ts = malloc(sizeof(double) * n);
    char c = 'x';
    for (int i = 0; i < n; i++) {
        double t = now_us();
        if (write(to_echo[1], &c, 1) != 1 || read_byte(back[0], &c, poll >= 2 ? 50 : 0) != 1) return 1;
        ts[i] = now_us() - t;
        usleep(20);
    }
    close(to_echo[1]);
    waitpid(echo, 0, 0);
    if (burn) {
        kill(burn, SIGKILL);
        waitpid(burn, 0, 0);
    }
    int over = 0;
    for (int i = 0; i < n; i++) over += ts[i] > 1000;
    qsort(ts, n, sizeof(double), by_value);
    printf("burner %-4s poll %d: p50 %.1f us, p99 %.1f us, p99.9 %.1f us, max %.0f us, over 1 ms: %d of %d\n", burner,
           poll, ts[n / 2], ts[n * 99 / 100], ts[n * 999 / 1000], ts[n - 1], over, n);
    free(ts);
    return 0;
}
