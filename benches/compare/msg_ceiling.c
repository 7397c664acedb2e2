/* The floor of back-to-back small messages over loopback TCP: one process writes
 * COUNT messages of HEAD + SIZE bytes, each with one writev (as a broadcast's root
 * does, HComm's with an 80-byte header, OpenMPI's with its own), the other reads
 * them; the writer runs on processor 0 and the reader on processor 1. Prints the
 * time per message seen by each side, for each way of reading:
 *   polls   non-blocking recv in a loop (as OpenMPI's receiving ranks poll);
 *   epoll   epoll_wait with timeout 0 in a loop, reading what it reports (as a
 *           spinning tokio reader does);
 *   pauses  as polls, with PAUSE_NS (default 1000) of spinning on the clock after
 *           each empty read;
 *   sleeps  blocking read.
 * To see what a busy processor does to the writer, run the program beside a plain
 * loop on processor 1, e.g. `taskset -c 1 nice -n 19 sh -c 'while :; do :; done'`.
 *
 * usage: msg_ceiling [SIZE [COUNT [HEAD [MODES]]]]
 *        (defaults 8, 1000000, 80, "polls,sleeps"; MODES comma-separated)
 *
 * cc -O2 -o target/compare/msg_ceiling benches/compare/msg_ceiling.c */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Runs the calling process on processor `cpu` if there is one (ignored otherwise). */
static void pin(int cpu) {
    cpu_set_t c;
    CPU_ZERO(&c);
    CPU_SET(cpu, &c);
    sched_setaffinity(0, sizeof c, &c);
}

/* Reads `want` bytes from `s` as `mode` says; returns the time from the first byte. */
static double read_all(int s, const char *mode, long want) {
    int block = !strcmp(mode, "sleeps"), use_ep = !strcmp(mode, "epoll");
    long pause_ns = 0;
    if (!strcmp(mode, "pauses")) pause_ns = getenv("PAUSE_NS") ? atol(getenv("PAUSE_NS")) : 1000;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.fd = s};
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev)) die("epoll");
    char *buf = malloc(1 << 20);
    long got = 0;
    double t0 = 0;
    while (got < want) {
        if (use_ep) {
            struct epoll_event out;
            if (epoll_wait(ep, &out, 1, 0) <= 0) continue;
        }
        /* After epoll's report, read until the socket is empty (edge-triggered). */
        for (;;) {
            ssize_t n = recv(s, buf, 1 << 20, block ? 0 : MSG_DONTWAIT);
            if (n > 0) {
                if (got == 0) t0 = now();
                got += n;
                if (use_ep && got < want) continue;
                break;
            }
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) die("recv");
            if (pause_ns) {
                double until = now() + pause_ns * 1e-9;
                while (now() < until) {
                }
            }
            break;
        }
    }
    free(buf);
    close(ep);
    return now() - t0;
}

static void run(const char *mode, long size, long count, long head) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        die("listen");
    int fds[2];
    if (pipe(fds)) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        /* The reader: reads everything, then reports its time through the pipe. */
        pin(1);
        int s = accept(ls, NULL, NULL);
        if (s < 0) die("accept");
        double t = read_all(s, mode, count * (head + size));
        if (write(fds[1], &t, sizeof t) != sizeof t) die("write");
        _exit(0);
    }
    pin(0);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (s < 0 || setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) ||
        connect(s, (struct sockaddr *)&a, sizeof a))
        die("connect");
    char *h = calloc(1, head), *p = calloc(1, size > 0 ? size : 1);
    struct iovec iov[2] = {{h, head}, {p, size}};
    double t0 = now();
    for (long i = 0; i < count; i++) {
        ssize_t want = head + size, n = writev(s, iov, 2);
        if (n != want) die("writev");
    }
    double tw = now() - t0, tr = 0;
    if (read(fds[0], &tr, sizeof tr) != sizeof tr) die("read");
    waitpid(pid, NULL, 0);
    printf("reader %s: %ld messages of %ld + %ld bytes: writer %.3f us each, reader %.3f us each\n", mode,
           count, head, size, tw / count * 1e6, tr / count * 1e6);
    free(h);
    free(p);
    close(s);
    close(ls);
    close(fds[0]);
    close(fds[1]);
}

int main(int argc, char **argv) {
    long size = argc > 1 ? atol(argv[1]) : 8, count = argc > 2 ? atol(argv[2]) : 1000000;
    long head = argc > 3 ? atol(argv[3]) : 80;
    char *modes = strdup(argc > 4 ? argv[4] : "polls,sleeps");
    for (char *m = strtok(modes, ","); m; m = strtok(NULL, ",")) {
        if (strcmp(m, "polls") && strcmp(m, "epoll") && strcmp(m, "pauses") && strcmp(m, "sleeps")) {
            fprintf(stderr, "unknown mode %s (polls, epoll, pauses, sleeps)\n", m);
            return 2;
        }
        run(m, size, count, head);
    }
    free(modes);
    return 0;
}
