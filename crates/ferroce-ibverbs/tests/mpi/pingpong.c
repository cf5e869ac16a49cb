/*
 * An MPI ping-pong between ranks 0 and 1, then an allreduce over every rank: what
 * scripts/test-ucx.sh runs under Open MPI over UCX on the drop-in libibverbs, and
 * scripts/bench-ucx.sh times against Open MPI's TCP transport.
 *
 *   pingpong [SIZE [ROUND_TRIPS]]     (defaults: 1 MiB, 100)
 *
 * Ten round trips come first with every byte checked both ways: rank 0 sends a pattern
 * that depends on the round, rank 1 checks it and sends back each byte plus one, rank 0
 * checks that. The timed round trips follow, unchecked so that only the transfer is timed.
 * Rank 0 prints one line per phase; any wrong byte or sum aborts the job with exit 1.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECKED_ROUNDS 10

static unsigned char pattern(size_t i, int round)
{
    return (unsigned char)(i * 131 + (size_t)round * 7 + (i >> 12));
}

static void check(const unsigned char *buf, size_t size, int round, int plus, int rank)
{
    for (size_t i = 0; i < size; i++) {
        unsigned char want = (unsigned char)(pattern(i, round) + plus);
        if (buf[i] != want) {
            fprintf(stderr, "pingpong: rank %d, round %d: byte %zu is 0x%02x, not 0x%02x\n",
                    rank, round, i, buf[i], want);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, ranks;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : (1u << 20);
    int rounds = argc > 2 ? atoi(argv[2]) : 100;
    if (ranks < 2 || size == 0 || size > (1u << 30) || rounds < 1) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np N (N >= 2) pingpong [SIZE [ROUND_TRIPS]]\n");
        MPI_Finalize();
        return 2;
    }
    unsigned char *buf = malloc(size);
    if (buf == NULL) {
        fprintf(stderr, "pingpong: rank %d: cannot allocate %zu bytes\n", rank, size);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    for (int round = 0; round < CHECKED_ROUNDS; round++) {
        if (rank == 0) {
            for (size_t i = 0; i < size; i++)
                buf[i] = pattern(i, round);
            MPI_Send(buf, (int)size, MPI_BYTE, 1, round, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_BYTE, 1, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(buf, size, round, 1, rank);
        } else if (rank == 1) {
            MPI_Recv(buf, (int)size, MPI_BYTE, 0, round, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            check(buf, size, round, 0, rank);
            for (size_t i = 0; i < size; i++)
                buf[i]++;
            MPI_Send(buf, (int)size, MPI_BYTE, 0, round, MPI_COMM_WORLD);
        }
    }
    if (rank == 0)
        printf("pingpong: %d round trips of %zu bytes, every byte checked both ways\n",
               CHECKED_ROUNDS, size);

    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int round = 0; round < rounds; round++) {
        if (rank == 0) {
            MPI_Send(buf, (int)size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, (int)size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
    }
    double elapsed = MPI_Wtime() - start;
    if (rank == 0) {
        double per_trip = elapsed / rounds;
        printf("pingpong: %d round trips of %zu bytes: %.2f us per round trip, %.1f MB/s each way\n",
               rounds, size, per_trip * 1e6, (double)size / (per_trip / 2) / 1e6);
    }

    long mine = rank + 1, sum = 0, want = (long)ranks * (ranks + 1) / 2;
    MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (sum != want) {
        fprintf(stderr, "pingpong: rank %d: allreduce gave %ld, not %ld\n", rank, sum, want);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        printf("allreduce: %d ranks summed to %ld\n", ranks, sum);
    free(buf);
    MPI_Finalize();
    return 0;
}
