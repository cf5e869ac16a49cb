/*
 * Does a busy-polled ping-pong's user code slow the kernel's part of a turn? (BENCHMARKS.md,
 * the data path's seventeenth step.) Two processes on loopback (127.0.15.3 <-> 127.0.15.4,
 * port 4791) exchange what ferroce's write-lat exchanges each turn, a 48-byte WRITE and a
 * 20-byte ACK in one UDP GSO send, taken whole by GRO, both ends spinning on recv. Between a
 * turn's receive and its send each end runs a block of user code: CALLS direct calls to
 * distinct generated functions, one after another (fp_chain, built by
 * scripts/bench-footprint.sh; straight-line code, about 40 bytes each), and an increment of
 * one byte in every cache line of a DATA KiB buffer.
 *
 *   footprint-floor CALLS DATA-KIB TURNS
 *
 * Prints the median half round trip, the median of the block's own time measured in place
 * (after the kernel's receive), and the same block's median when run back to back with no
 * system call between (warm). The kernel's share of a half round trip is the half round trip
 * less one block (each half holds one end's block).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { WRITE_LEN = 48, ACK_LEN = 20, TURN = WRITE_LEN + ACK_LEN, WARMUP = 2000 };

/* The first `calls` of the generated functions, each on the last one's result. */
extern unsigned fp_chain(int calls, unsigned x);

static int calls;
static size_t data_len;
static volatile unsigned char *data;

/* A socket as ferroce's: GSO cuts each send after the WRITE, GRO hands a train over whole. */
static int bound(const char *ip)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = addr_of(ip);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror(ip);
        exit(1);
    }
    int segment = WRITE_LEN, on = 1;
    if (setsockopt(fd, IPPROTO_UDP, UDP_SEGMENT, &segment, sizeof segment) != 0 ||
        setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on) != 0) {
        perror("UDP_SEGMENT / UDP_GRO");
        exit(1);
    }
    return fd;
}

/* The user code of one turn: the calls, then every line of the buffer. */
static unsigned block(unsigned x)
{
    x = fp_chain(calls, x);
    for (size_t at = 0; at < data_len; at += 64)
        data[at]++;
    return x;
}

/* Spins until a whole turn has arrived; the first byte of the last datagram, or -1 if the
 * peer ended the run (a datagram starting with 0xff). */
static int receive_turn(int fd)
{
    unsigned char buf[256];
    int got = 0, first = 0;
    while (got < TURN) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) {
            got += (int)n;
            first = buf[0];
        }
    }
    return first == 0xff ? -1 : first;
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, by_value);
    return v[n / 2];
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: footprint-floor CALLS DATA-KIB TURNS\n");
        return 2;
    }
    calls = atoi(argv[1]);
    data_len = (size_t)atoi(argv[2]) * 1024;
    int turns = atoi(argv[3]);
    data = calloc(1, data_len + 64);
    struct sockaddr_in client = addr_of("127.0.15.3"), server = addr_of("127.0.15.4");
    unsigned char msg[TURN];
    memset(msg, 7, sizeof msg);
    /* Where each block's result goes, so that the compiler keeps the block. */
    volatile unsigned sink = 1;

    pid_t echo = fork();
    if (echo == 0) {
        int fd = bound("127.0.15.4");
        while (receive_turn(fd) >= 0) {
            sink = block(sink);
            sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&client, sizeof client);
        }
        _exit(0);
    }
    int fd = bound("127.0.15.3");
    usleep(100000);

    double *halves = malloc(sizeof(double) * turns), *inside = malloc(sizeof(double) * turns);
    for (int i = 0; i < WARMUP + turns; i++) {
        double sent = now_ns();
        sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&server, sizeof server);
        receive_turn(fd);
        double got = now_ns();
        sink = block(sink);
        double done = now_ns();
        if (i >= WARMUP) {
            /* The round trip held the peer's block; this end's follows it. */
            halves[i - WARMUP] = (done - sent) / 2000.0;
            inside[i - WARMUP] = (done - got) / 1000.0;
        }
    }
    msg[0] = 0xff;
    sendto(fd, msg, sizeof msg, 0, (struct sockaddr *)&server, sizeof server);
    waitpid(echo, NULL, 0);

    double *warm = malloc(sizeof(double) * 2000);
    for (int i = 0; i < 2000; i++) {
        double t = now_ns();
        sink = block(sink);
        warm[i] = (now_ns() - t) / 1000.0;
    }
    double half = median(halves, turns), in_place = median(inside, turns);
    printf("calls %5d, data %5zu KiB: half round trip %.3f us, block in place %.3f us, "
           "warm %.3f us, kernel's share %.3f us\n",
           calls, data_len / 1024, half, in_place, median(warm, 2000), half - in_place);
    return 0;
}
