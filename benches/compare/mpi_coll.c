/* The MPI side of benches/compare/coll.sh: every collective hcomm-bench measures,
 * timed the way hcomm-bench times it, so that one table can hold both.
 *
 * For each operation and size: sizes double from MIN (raised to 4 * ranks for the
 * blocked operations) to MAX; ITERS = 64 MiB worth, between 10 and 1000; a tenth of
 * that (at least 2) as warm-up; a barrier; then ITERS operations back to back, each
 * rank's time per operation is the mean; rank 0 prints the mean, minimum and maximum
 * over ranks. float32, sum. As in nccl-tests and hcomm-bench, the size of allgather,
 * reduce_scatter and alltoall is the whole buffer (one block per rank); broadcast's
 * root is rank 0. The results of the first operation of each size are checked.
 *
 * usage: mpi_coll MIN MAX OPS [MAXITERS [TIMING]]
 *   OPS comma-separated: allreduce,broadcast,allgather,reduce_scatter,alltoall;
 *   MAXITERS lowers the 1000 iterations cap (for an MPI that busy-polls oversubscribed
 *   cores and takes milliseconds per operation);
 *   TIMING `b2b` (default): the operations back to back under one timer; `osu`: each
 *   operation timed alone, with an untimed barrier after it, as the OSU
 *   micro-benchmarks and hcomm-bench's `--timing osu` do.
 * output: op bytes iters avg_us min_us max_us */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static void fail(const char *what, long bytes) {
    fprintf(stderr, "rank %d: %s of %ld bytes gave a wrong result\n", rank, what, bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One operation on buffers a (input or in-place) and b (output) of `elems` floats in
 * all; `check` verifies the result of inputs a[i] = rank + 1 (b zeroed). */
static void once(const char *op, float *a, float *b, long elems, int check, long bytes) {
    long blk = elems / size;
    if (!strcmp(op, "allreduce")) {
        MPI_Allreduce(MPI_IN_PLACE, a, (int)elems, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (check)
            for (long i = 0; i < elems; i++)
                if (a[i] != (float)(size * (size + 1) / 2)) fail(op, bytes);
    } else if (!strcmp(op, "broadcast")) {
        MPI_Bcast(a, (int)elems, MPI_FLOAT, 0, MPI_COMM_WORLD);
        if (check)
            for (long i = 0; i < elems; i++)
                if (a[i] != 1.0f) fail(op, bytes);
    } else if (!strcmp(op, "allgather")) {
        MPI_Allgather(a, (int)blk, MPI_FLOAT, b, (int)blk, MPI_FLOAT, MPI_COMM_WORLD);
        if (check)
            for (long i = 0; i < blk * size; i++)
                if (b[i] != (float)(i / blk + 1)) fail(op, bytes);
    } else if (!strcmp(op, "reduce_scatter")) {
        MPI_Reduce_scatter_block(a, b, (int)blk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (check)
            for (long i = 0; i < blk; i++)
                if (b[i] != (float)(size * (size + 1) / 2)) fail(op, bytes);
    } else if (!strcmp(op, "alltoall")) {
        MPI_Alltoall(a, (int)blk, MPI_FLOAT, b, (int)blk, MPI_FLOAT, MPI_COMM_WORLD);
        if (check)
            for (long i = 0; i < blk * size; i++)
                if (b[i] != (float)(i / blk + 1)) fail(op, bytes);
    } else {
        if (rank == 0) fprintf(stderr, "unknown op %s\n", op);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 4) {
        if (rank == 0) fprintf(stderr, "usage: %s MIN MAX OPS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long min = atol(argv[1]), max = atol(argv[2]);
    char *ops = strdup(argv[3]);
    long cap_iters = argc > 4 ? atol(argv[4]) : 1000;
    int osu = argc > 5 && !strcmp(argv[5], "osu");
    long cap = max / 4 + 1;
    float *a = malloc(cap * sizeof(float)), *b = malloc(cap * sizeof(float));
    for (char *op = strtok(ops, ","); op; op = strtok(NULL, ",")) {
        int blocked = strcmp(op, "allreduce") && strcmp(op, "broadcast");
        long lo = blocked ? 4L * size : 4;
        for (long bytes = min > lo ? min : lo; bytes <= max; bytes *= 2) {
            long elems = bytes / 4;
            if (blocked) elems -= elems % size;
            long iters = (64L << 20) / bytes;
            iters = iters < 10 ? 10 : iters > 1000 ? 1000 : iters;
            if (iters > cap_iters) iters = cap_iters > 1 ? cap_iters : 1;
            long warm = iters / 10 < 2 ? 2 : iters / 10;
            for (long i = 0; i < elems; i++) {
                a[i] = (float)(rank + 1);
                b[i] = 0.0f;
            }
            if (!strcmp(op, "broadcast") && rank != 0)
                for (long i = 0; i < elems; i++) a[i] = 0.0f;
            if (!strcmp(op, "broadcast") && rank == 0)
                for (long i = 0; i < elems; i++) a[i] = 1.0f;
            once(op, a, b, elems, 1, bytes);
            for (long w = 1; w < warm; w++) once(op, a, b, elems, 0, bytes);
            MPI_Barrier(MPI_COMM_WORLD);
            double mine = 0.0, sum, lo_t, hi_t;
            if (osu) {
                for (long it = 0; it < iters; it++) {
                    double t0 = MPI_Wtime();
                    once(op, a, b, elems, 0, bytes);
                    mine += MPI_Wtime() - t0;
                    MPI_Barrier(MPI_COMM_WORLD);
                }
            } else {
                double t0 = MPI_Wtime();
                for (long it = 0; it < iters; it++) once(op, a, b, elems, 0, bytes);
                mine = MPI_Wtime() - t0;
            }
            mine /= (double)iters;
            MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
            MPI_Reduce(&mine, &lo_t, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
            MPI_Reduce(&mine, &hi_t, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (rank == 0)
                printf("%s %ld %ld %.3f %.3f %.3f\n", op, bytes, iters, sum / size * 1e6, lo_t * 1e6,
                       hi_t * 1e6);
            fflush(stdout);
        }
    }
    free(ops);
    MPI_Finalize();
    return 0;
}
