/* Ping-pong, MPI_Allreduce and MPI_Alltoall across every rank, each result
 * checked; prints one line per check on rank 0 and exits non-zero on any
 * mismatch. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, long got, long want) {
    fprintf(stderr, "MISMATCH %s: got %ld want %ld\n", what, got, want);
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
}

int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int peer = size / 2; /* rank 0's partner: first rank of the other host */
    int sizes[] = {8, 4096, 65536, 1 << 20};
    for (int s = 0; s < 4; s++) {
        int n = sizes[s], iters = n >= 65536 ? 20 : 200;
        unsigned char *buf = malloc(n);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            if (rank == 0) {
                for (int k = 0; k < n; k++) buf[k] = (unsigned char)(k * 7 + i);
                MPI_Send(buf, n, MPI_BYTE, peer, i, MPI_COMM_WORLD);
                MPI_Recv(buf, n, MPI_BYTE, peer, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (int k = 0; k < n; k++)
                    if (buf[k] != (unsigned char)(k * 7 + i + 1)) return fail("pingpong byte", buf[k], (unsigned char)(k * 7 + i + 1));
            } else if (rank == peer) {
                MPI_Recv(buf, n, MPI_BYTE, 0, i, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (int k = 0; k < n; k++) buf[k]++;
                MPI_Send(buf, n, MPI_BYTE, 0, i, MPI_COMM_WORLD);
            }
        }
        if (rank == 0)
            printf("pingpong %d B: %.2f us half round trip\n", n, (MPI_Wtime() - t0) / iters / 2 * 1e6);
        free(buf);
    }
    /* Allreduce of 1 Mi longs: element k sums rank*k + 1 over ranks. */
    int count = 1 << 17;
    long *in = malloc(count * sizeof(long)), *out = malloc(count * sizeof(long));
    for (int k = 0; k < count; k++) in[k] = (long)rank * k + 1;
    MPI_Allreduce(in, out, count, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    long ranksum = (long)size * (size - 1) / 2;
    for (int k = 0; k < count; k++)
        if (out[k] != ranksum * k + size) return fail("allreduce", out[k], ranksum * k + size);
    if (rank == 0) printf("allreduce %d longs on %d ranks: ok\n", count, size);
    /* Alltoall: rank r sends r*1000+d (repeated) to rank d. */
    int per = 4096;
    int *sb = malloc(size * per * sizeof(int)), *rb = malloc(size * per * sizeof(int));
    for (int d = 0; d < size; d++)
        for (int j = 0; j < per; j++) sb[d * per + j] = rank * 1000 + d + j;
    MPI_Alltoall(sb, per, MPI_INT, rb, per, MPI_INT, MPI_COMM_WORLD);
    for (int s = 0; s < size; s++)
        for (int j = 0; j < per; j++)
            if (rb[s * per + j] != s * 1000 + rank + j) return fail("alltoall", rb[s * per + j], s * 1000 + rank + j);
    int ok = 1, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("alltoall %d ints per pair on %d ranks: ok (%d ranks checked)\n", per, size, all);
    MPI_Finalize();
    return 0;
}
