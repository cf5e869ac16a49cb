/*
 * What the floor programs (recv-floor.c, footprint-floor.c, timer-rearm.c) share: their
 * clock, the order their samples sort in, and the RoCE port on a loopback address. Included
 * by each; nothing to build on its own.
 */
#ifndef FERROCE_FLOOR_H
#define FERROCE_FLOOR_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds. */
static inline double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

/* Ascending doubles, for qsort. */
static inline int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Port 4791 on `ip`, a dotted IPv4 address. */
static inline struct sockaddr_in addr_of(const char *ip)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(4791)};
    a.sin_addr.s_addr = inet_addr(ip);
    return a;
}

#endif
