/*
 * What moving a timer on costs on this host, without ferroce: the push that a polling
 * application gives the progress thread's nap (BENCHMARKS.md, the data path's thirty-seventh
 * step). Each way moves a one-shot CLOCK_MONOTONIC timerfd deadline to `after` from now, N
 * times, with a spin of `gap` between moves (the pushes of a ping-pong come hundreds of
 * microseconds apart; the tick and other timers come later than the deadline, so it is the
 * CPU's next expiry):
 *
 *   one    timerfd_settime on the one armed timer: the kernel cancels it, which reprograms
 *          the CPU's timer to the next expiry, then starts it again, which reprograms it to
 *          the new deadline (ferroce's way until this step)
 *   pair   two timerfds, one armed: arm the idle one at the new deadline (later than the
 *          armed one's, so not the CPU's next expiry: nothing to reprogram), then disarm the
 *          armed one, which reprograms once (sys::MovingTimer, since)
 *
 * Then both ways again with the deadline moved alternately out to four times `after` and
 * back in to `after` ("earlier": the pair's newly armed timer is then the CPU's next expiry,
 * and the old one, no longer next, is disarmed without reprogramming), reporting the moves
 * in alone.
 *
 * Prints each way's median, 90th and 99th percentile in ns, the ways alternating in rounds so
 * that the host's drift hits both. In a virtual machine each reprogramming of the CPU's timer
 * is an exit to the hypervisor; on bare metal both ways cost little.
 *
 *   timer-rearm [N] [after-us] [gap-us] [rounds]     defaults 20000, 440, 20, 3
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/timerfd.h>

#include "floor.h"

static void spin(long ns)
{
    double until = now_ns() + ns;
    while (now_ns() < until) {
    }
}

static void report(const char *way, double *costs, int n)
{
    qsort(costs, n, sizeof costs[0], by_value);
    printf("%-13s  median %6.0f ns  p90 %6.0f ns  p99 %6.0f ns\n", way, costs[n / 2],
           costs[n * 9 / 10], costs[n * 99 / 100]);
}

static int new_timer(void)
{
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0) {
        perror("timerfd_create");
        exit(1);
    }
    return fd;
}

static void set(int fd, long ns)
{
    struct itimerspec spec = {.it_value = {.tv_sec = ns / 1000000000L, .tv_nsec = ns % 1000000000L}};
    if (timerfd_settime(fd, 0, &spec, NULL) < 0) {
        perror("timerfd_settime");
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 20000;
    long after = (argc > 2 ? atol(argv[2]) : 440) * 1000;
    long gap = (argc > 3 ? atol(argv[3]) : 20) * 1000;
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    if (n < 100 || after <= 0 || gap < 0 || rounds < 1) {
        fprintf(stderr, "usage: timer-rearm [N >= 100] [after-us > 0] [gap-us] [rounds]\n");
        return 2;
    }
    double *costs = calloc(n, sizeof costs[0]);
    int timers[2] = {new_timer(), new_timer()};
    for (int round = 1; round <= rounds; round++) {
        printf("## round %d (%d moves, %ld us ahead, %ld us apart)\n", round, n, after / 1000,
               gap / 1000);
        set(timers[0], after);
        for (int i = 0; i < n; i++) {
            double t = now_ns();
            set(timers[0], after);
            costs[i] = now_ns() - t;
            spin(gap);
        }
        report("one", costs, n);
        int armed = 0;
        for (int i = 0; i < n; i++) {
            double t = now_ns();
            set(timers[1 - armed], after);
            set(timers[armed], 0);
            costs[i] = now_ns() - t;
            armed = 1 - armed;
            spin(gap);
        }
        report("pair", costs, n);
        set(timers[0], 0);
        set(timers[1], 0);

        /* Out and back in: only the moves in (odd i) are kept. */
        int kept = 0;
        set(timers[0], 4 * after);
        for (int i = 0; i < 2 * n; i++) {
            double t = now_ns();
            set(timers[0], i % 2 ? after : 4 * after);
            if (i % 2)
                costs[kept++] = now_ns() - t;
            spin(gap);
        }
        report("one, earlier", costs, kept);
        kept = 0;
        armed = 0;
        set(timers[0], 4 * after);
        for (int i = 0; i < 2 * n; i++) {
            double t = now_ns();
            set(timers[1 - armed], i % 2 ? after : 4 * after);
            set(timers[armed], 0);
            if (i % 2)
                costs[kept++] = now_ns() - t;
            armed = 1 - armed;
            spin(gap);
        }
        report("pair, earlier", costs, kept);
        set(timers[0], 0);
        set(timers[1], 0);
    }
    free(costs);
    return 0;
}
