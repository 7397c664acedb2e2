/* The floor of back-to-back small messages over loopback TCP: one process writes
 * COUNT messages of HEAD + SIZE bytes, each with one writev (as a broadcast's root
 * does, HComm's with an 80-byte header, OpenMPI's with its own), the other reads
 * them. Prints the time per message seen by each side, with the reader spinning on
 * non-blocking reads ("polls") and with it blocking in read ("sleeps").
 *
 * usage: msg_ceiling [SIZE [COUNT [HEAD]]]   (defaults 8, 1000000, 80)
 *
 * cc -O2 -o target/compare/msg_ceiling benches/compare/msg_ceiling.c */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void run(const char *mode, long size, long count, long head) {
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 1) ||
        getsockname(ls, (struct sockaddr *)&a, &al))
        die("listen");
    int spin = !strcmp(mode, "polls");
    int fds[2];
    if (pipe(fds)) die("pipe");
    pid_t pid = fork();
    if (pid == 0) {
        /* The reader: reads everything, then reports its time through the pipe. */
        int s = accept(ls, NULL, NULL);
        if (s < 0) die("accept");
        long want = count * (head + size), got = 0;
        char *buf = malloc(1 << 20);
        double t0 = 0;
        while (got < want) {
            ssize_t n = recv(s, buf, 1 << 20, spin ? MSG_DONTWAIT : 0);
            if (n > 0) {
                if (got == 0) t0 = now();
                got += n;
            } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                die("recv");
            }
        }
        double t = now() - t0;
        if (write(fds[1], &t, sizeof t) != sizeof t) die("write");
        _exit(0);
    }
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
    printf("reader %s: %ld messages of %ld + %ld bytes: writer %.3f us each, reader %.3f us each\n", mode, count,
           head, size, tw / count * 1e6, tr / count * 1e6);
    close(s);
    close(ls);
}

int main(int argc, char **argv) {
    long size = argc > 1 ? atol(argv[1]) : 8, count = argc > 2 ? atol(argv[2]) : 1000000;
    long head = argc > 3 ? atol(argv[3]) : 80;
    run("polls", size, count, head);
    run("sleeps", size, count, head);
    return 0;
}
