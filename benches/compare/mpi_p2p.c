/* OSU-style point-to-point figures between ranks 0 and 1, measured the way
 * hcomm-bench measures them: `latency` is half the round trip of a ping-pong;
 * `bw` streams windows of WINDOW messages from rank 0 to rank 1, each window answered
 * by a 4-byte acknowledgement, and reports time per message and GB/s.
 *
 *   mpirun -n 2 mpi_p2p MIN MAX ITERS
 *
 * Prints one line per operation and size: `latency BYTES US` and `bw BYTES US GBPS`.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc < 4 || size < 2) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -n 2 %s MIN MAX ITERS\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long min = atol(argv[1]), max = atol(argv[2]);
    int iters = atoi(argv[3]);
    char *buf = malloc(max), *ack = malloc(4);
    char **wbuf = malloc(sizeof(char *) * WINDOW);
    for (int i = 0; i < WINDOW; i++) { wbuf[i] = malloc(max); memset(wbuf[i], 1, max); }
    memset(buf, 1, max);
    MPI_Request req[WINDOW];
    for (long n = min; n <= max; n *= 2) {
        int it = n >= (1 << 20) ? iters / 10 + 2 : iters;
        /* latency */
        for (int phase = 0; phase < 2; phase++) {
            int count = phase == 0 ? it / 10 + 2 : it;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < count; i++) {
                if (rank == 0) {
                    MPI_Send(buf, n, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
                    MPI_Recv(buf, n, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    MPI_Recv(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
                }
            }
            double t = MPI_Wtime() - t0;
            if (phase == 1 && rank == 0) printf("latency %ld %.3f\n", n, t / count / 2 * 1e6);
        }
        /* bandwidth */
        int bit = it / 4 + 2;
        for (int phase = 0; phase < 2; phase++) {
            int count = phase == 0 ? 2 : bit;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < count; i++) {
                if (rank == 0) {
                    for (int w = 0; w < WINDOW; w++) MPI_Isend(wbuf[w], n, MPI_CHAR, 1, 2, MPI_COMM_WORLD, &req[w]);
                    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                    MPI_Recv(ack, 4, MPI_CHAR, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else if (rank == 1) {
                    for (int w = 0; w < WINDOW; w++) MPI_Irecv(wbuf[w], n, MPI_CHAR, 0, 2, MPI_COMM_WORLD, &req[w]);
                    MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
                    MPI_Send(ack, 4, MPI_CHAR, 0, 3, MPI_COMM_WORLD);
                }
            }
            double t = MPI_Wtime() - t0;
            if (phase == 1 && rank == 0) {
                double per = t / count / WINDOW;
                printf("bw %ld %.3f %.3f\n", n, per * 1e6, n / per / 1e9);
            }
        }
    }
    MPI_Finalize();
    return 0;
}
