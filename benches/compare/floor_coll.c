/* The floor of an allreduce and a broadcast over loopback TCP: the fewest bytes
 * through the kernel, moved by the plainest code, to set HComm's and OpenMPI's times
 * beside (issue 4). No library, no framing, no matching, no checks beyond the first
 * result: N forked processes joined in a ring of TCP connections (Reno, no Nagle),
 * each step a poll loop over non-blocking sockets.
 *
 * - allreduce: the ring (reduce-scatter, then allgather), `2(n-1)/n · S` sent by each
 *   rank, the fewest bytes any allreduce sends; float32 sum, reduced as the bytes
 *   arrive. On 2 ranks, the exchange of halves.
 * - broadcast: a chain from rank 0 in pieces of 256 KiB (whole below that), `S` sent by
 *   each rank but the last: `(n-1) · S` in all, the fewest any broadcast sends.
 * - allreduce_bytes, broadcast_bytes: those operations' bytes alone, each rank's in one
 *   stream, sent and received at once: no steps that wait on one another, no reduction.
 *   What the kernel's copies and protocol work alone cost on this machine. Not a strict
 *   bound: where ranks outnumber the processors, one long stream per rank can be
 *   scheduled worse than the ring's steps (4 ranks, 4 MiB, once: 1.3x the ring).
 *
 * It is a reference, not a rival: it has no matching, no failure handling, no
 * deadlines beyond the poll's, and small messages wait in poll(2) without spinning, so
 * its times below 64 KiB or so say nothing.
 *
 * Timed as benches/compare/mpi_coll.c and hcomm-bench time: ITERS = 64 MiB worth,
 * between 10 and 1000, a tenth of that as warm-up, a barrier, then ITERS operations
 * back to back; each rank's mean per operation; the mean, minimum and maximum over
 * ranks. Ranks are not bound to processors (as OpenMPI's, oversubscribed).
 *
 * usage: floor_coll RANKS MIN MAX OPS
 * output: op bytes iters avg_us min_us max_us */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PIECE (256L << 10)

static int rank, size, left, right; /* left: from rank-1; right: to rank+1 */

static void die(const char *what) {
    fprintf(stderr, "floor_coll rank %d: %s: %s\n", rank, what, strerror(errno));
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void tune(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) die("TCP_NODELAY");
    /* HComm's default where the system runs BBR (BENCHMARKS.md, 2026-12-04). */
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
}

/* Sends `sn` bytes of `s` to the right while receiving `rn` into `r` from the left;
 * with `acc`, adds each float received into `acc` as it lands. */
static void step(const char *s, long sn, char *r, long rn, float *acc) {
    long sent = 0, got = 0, added = 0;
    while (sent < sn || got < rn) {
        struct pollfd p[2];
        int k = 0, si = -1, ri = -1;
        if (sent < sn) p[si = k++] = (struct pollfd){right, POLLOUT, 0};
        if (got < rn) p[ri = k++] = (struct pollfd){left, POLLIN, 0};
        if (poll(p, (nfds_t)k, 60000) <= 0) die("poll (60 s deadline)");
        if (si >= 0 && p[si].revents) {
            ssize_t w = send(right, s + sent, (size_t)(sn - sent), MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w < 0 && errno != EAGAIN) die("send");
            if (w > 0) sent += w;
        }
        if (ri >= 0 && p[ri].revents) {
            ssize_t n = recv(left, r + got, (size_t)(rn - got), MSG_DONTWAIT);
            if (n == 0) { errno = ECONNRESET; die("recv"); }
            if (n < 0 && errno != EAGAIN) die("recv");
            if (n > 0) got += n;
            if (acc) {
                long upto = got / 4;
                const float *in = (const float *)r;
                for (long i = added; i < upto; i++) acc[i] += in[i];
                added = upto;
            }
        }
    }
}

static void allreduce(float *a, float *tmp, long elems) {
    if (size == 1) return;
    long blk = (elems + size - 1) / size;
#define LO(c) ((c) * blk < elems ? (c) * blk : elems)
#define HI(c) ((c + 1) * blk < elems ? (c + 1) * blk : elems)
    for (int k = 0; k < size - 1; k++) { /* reduce-scatter */
        int sc = ((rank - k) % size + size) % size, rc = ((rank - k - 1) % size + size) % size;
        step((char *)(a + LO(sc)), (HI(sc) - LO(sc)) * 4, (char *)tmp, (HI(rc) - LO(rc)) * 4, a + LO(rc));
    }
    for (int k = 0; k < size - 1; k++) { /* allgather */
        int sc = ((rank + 1 - k) % size + size) % size, rc = ((rank - k) % size + size) % size;
        step((char *)(a + LO(sc)), (HI(sc) - LO(sc)) * 4, (char *)(a + LO(rc)), (HI(rc) - LO(rc)) * 4, NULL);
    }
}

static void broadcast(float *a, long elems) {
    long bytes = elems * 4;
    char *b = (char *)a;
    for (long off = 0; off < bytes; off += PIECE) {
        long n = bytes - off < PIECE ? bytes - off : PIECE;
        if (rank > 0) step(NULL, 0, b + off, n, NULL);
        if (rank < size - 1) step(b + off, n, NULL, 0, NULL);
    }
}

static void once(int ar, float *a, float *tmp, long elems) {
    if (ar)
        allreduce(a, tmp, elems);
    else
        broadcast(a, elems);
}

/* The bytes of one allreduce (`ar`) or broadcast of `bytes`, alone. */
static void once_alone(int ar, float *a, float *tmp, long bytes) {
    if (size == 1) return;
    if (ar) {
        long each = 2L * (size - 1) * ((bytes / 4 + size - 1) / size) * 4;
        /* `a` and `tmp` hold `bytes`; the stream wraps around them. */
        for (long off = 0; off < each; off += bytes) {
            long n = each - off < bytes ? each - off : bytes;
            step((char *)a, n, (char *)tmp, n, NULL);
        }
    } else {
        step(rank < size - 1 ? (char *)a : NULL, rank < size - 1 ? bytes : 0, rank > 0 ? (char *)tmp : NULL,
             rank > 0 ? bytes : 0, NULL);
    }
}

static void barrier(void) { /* a token twice around the ring */
    char t = 0, u;
    for (int round = 0; round < 2; round++) {
        if (rank == 0) {
            step(&t, 1, &u, 1, NULL);
        } else {
            step(NULL, 0, &u, 1, NULL);
            step(&u, 1, NULL, 0, NULL);
        }
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s RANKS MIN MAX OPS\n", argv[0]);
        return 2;
    }
    size = atoi(argv[1]);
    long min = atol(argv[2]), max = atol(argv[3]);
    if (size < 1 || size > 64 || min < 4 || max < min) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    if (ls < 0 || bind(ls, (void *)&addr, len) || getsockname(ls, (void *)&addr, &len) || listen(ls, 64)) die("listen");
    /* Link r runs from rank r (its right) to rank r+1 mod n (its left), made before
     * the ranks fork so that each inherits its two ends. */
    int *cl = calloc((size_t)size, sizeof(int)), *sv = calloc((size_t)size, sizeof(int));
    for (int r = 0; r < size; r++) {
        cl[r] = socket(AF_INET, SOCK_STREAM, 0);
        if (cl[r] < 0 || connect(cl[r], (void *)&addr, sizeof addr)) die("connect");
        if ((sv[r] = accept(ls, NULL, NULL)) < 0) die("accept");
        tune(cl[r]);
        tune(sv[r]);
    }
    /* Each rank's mean time per operation, for the parent to print. */
    double *slot = mmap(NULL, (size_t)size * sizeof(double), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (slot == MAP_FAILED) die("mmap");
    char *ops = strdup(argv[4]);
    long cap = max / 4 + 1;
    pid_t *kids = calloc((size_t)size, sizeof(pid_t));
    for (int r = 0; r < size; r++) {
        if ((kids[r] = fork()) < 0) die("fork");
        if (kids[r] == 0) {
            rank = r;
            right = cl[r];
            left = sv[(r + size - 1) % size];
            break;
        }
    }
    int parent = 1;
    for (int r = 0; r < size; r++) parent &= kids[r] != 0;
    /* Each process keeps only its own ends (the parent none), so that a rank that
     * dies closes its links and its neighbours fail at once instead of at the poll's
     * deadline. */
    close(ls);
    for (int r = 0; r < size; r++) {
        if (parent || cl[r] != right) close(cl[r]);
        if (parent || sv[r] != left) close(sv[r]);
    }
    float *a = NULL, *tmp = NULL;
    if (!parent) {
        a = malloc((size_t)cap * sizeof(float));
        tmp = malloc((size_t)cap * sizeof(float));
        if (!a || !tmp) die("malloc");
    }
    for (char *op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
        int ar = !strcmp(op, "allreduce") || !strcmp(op, "allreduce_bytes");
        int alone = !strcmp(op, "allreduce_bytes") || !strcmp(op, "broadcast_bytes");
        if (!ar && !alone && strcmp(op, "broadcast")) {
            fprintf(stderr, "unknown op %s (allreduce, broadcast, allreduce_bytes, broadcast_bytes)\n", op);
            return 2;
        }
        for (long bytes = min; bytes <= max; bytes *= 2) {
            long elems = bytes / 4, iters = (64L << 20) / bytes;
            iters = iters < 10 ? 10 : iters > 1000 ? 1000 : iters;
            long warm = iters / 10 < 2 ? 2 : iters / 10;
            if (parent) {
                /* The ranks report through `slot` after their last barrier. */
                continue;
            }
            for (long i = 0; i < elems; i++) a[i] = ar ? (float)(rank + 1) : (rank == 0 ? 1.0f : 0.0f);
            if (alone) {
                once_alone(ar, a, tmp, elems * 4);
            } else {
                once(ar, a, tmp, elems);
                float want = ar ? (float)(size * (size + 1) / 2) : 1.0f;
                for (long i = 0; i < elems; i++)
                    if (a[i] != want) {
                        fprintf(stderr, "rank %d: %s of %ld bytes gave a wrong result\n", rank, op, bytes);
                        exit(1);
                    }
            }
            for (long w = 1; w < warm; w++) alone ? once_alone(ar, a, tmp, elems * 4) : once(ar, a, tmp, elems);
            barrier();
            double t0 = now();
            for (long it = 0; it < iters; it++) alone ? once_alone(ar, a, tmp, elems * 4) : once(ar, a, tmp, elems);
            slot[rank] = (now() - t0) / (double)iters;
            barrier();
            if (rank == 0) {
                double sum = 0, lo = 1e30, hi = 0;
                for (int r = 0; r < size; r++) {
                    sum += slot[r];
                    lo = slot[r] < lo ? slot[r] : lo;
                    hi = slot[r] > hi ? slot[r] : hi;
                }
                printf("%s %ld %ld %.3f %.3f %.3f\n", op, bytes, iters, sum / size * 1e6, lo * 1e6, hi * 1e6);
                fflush(stdout);
            }
            barrier(); /* nobody writes `slot` again before rank 0 has read it */
        }
    }
    if (!parent) return 0;
    int bad = 0;
    for (int r = 0; r < size; r++) {
        int st;
        if (waitpid(kids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) bad = 1;
    }
    return bad;
}
