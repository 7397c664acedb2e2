/* Baseline for BENCHMARKS.md: float32 sum allreduce timed exactly as
 * examples/ring_allreduce.rs times HComm's: barrier, time one allreduce, repeat;
 * rank 0 reports the median. Values are (rank + 1) * (i % 251 + 1) and every element
 * is checked, as in the example.
 *
 * usage: mpi_allreduce BYTES ITERS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 3) {
        if (rank == 0) fprintf(stderr, "usage: %s BYTES ITERS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long count = atol(argv[1]) / 4;
    int iters = atoi(argv[2]);
    float *buf = malloc((count > 0 ? count : 1) * sizeof(float));
    double *t = malloc(iters * sizeof(double));
    float tri = (float)(size * (size + 1) / 2);
    for (int it = 0; it < iters + 2; it++) {
        for (long i = 0; i < count; i++) buf[i] = (float)((rank + 1) * (i % 251 + 1));
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double dt = MPI_Wtime() - t0;
        for (long i = 0; i < count; i++) {
            if (buf[i] != tri * (float)(i % 251 + 1)) {
                fprintf(stderr, "rank %d: element %ld wrong\n", rank, i);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
        if (it >= 2) t[it - 2] = dt;
    }
    if (rank == 0) {
        qsort(t, iters, sizeof(double), cmp);
        printf("median_ms %.6f\n", t[iters / 2] * 1e3);
    }
    MPI_Finalize();
    return 0;
}
