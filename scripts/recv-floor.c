/*
 * What waiting for a datagram costs on this host, without ferroce: the floors under a
 * busy-polled ping-pong's receive (BENCHMARKS.md, the data path's fourteenth step).
 *
 *   recv-floor empty [N]          one look at an empty socket, by system call
 *   recv-floor pingpong MODE [N]  half round trip of a 48-byte UDP ping-pong on loopback
 *                                 (127.0.15.1 <-> 127.0.15.2, port 4791), both ends spinning
 *   recv-floor turn [N]           on one thread, a write-lat turn's send (a 40-byte WRITE and a
 *                                 20-byte ACK as one GSO send) and its receive by a GRO socket,
 *                                 in ns, by each pair of calls: what the soft NIC's calls cost
 *                                 against sockperf's, without a second thread's noise (the
 *                                 pairs interleave in twenty rounds)
 *
 * MODE says how each end waits and answers:
 *   sock         recvfrom(MSG_DONTWAIT) until a datagram, sendto: what sockperf --nonblocked does
 *   mmsg         recvmmsg(1, with a control buffer) until a datagram, sendmmsg(1): ferroce's calls
 *                until the data path's twenty-seventh step
 *   msg          recvmsg (with the sender's address and a control buffer) until a datagram,
 *                sendmsg: ferroce's calls for one buffer and one message since then
 *   gso          as msg, each answer shaped as write-lat's: a 40-byte WRITE and a 20-byte ACK
 *                as one GSO send (segment size by control message), taken as one GRO buffer
 *   uring        a recvmsg posted to io_uring ahead of time; spin on its completion queue in
 *                memory, no system call while waiting; answer and post the next receive in one
 *                io_uring_enter. The kernel completes the receive as task work of the waiting
 *                thread, which a datagram from the other core reaches by an interrupt.
 *   uring-coop   the same with IORING_SETUP_COOP_TASKRUN (no interrupt): the spin enters the
 *                kernel to run the task work (io_uring_get_events), a system call per look again
 *   uring-defer  the same with IORING_SETUP_DEFER_TASKRUN
 *
 * Build: cc -O2 -o recv-floor recv-floor.c -luring (Debian: liburing-dev).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"

#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { PAYLOAD = 48, ROOM = 2048, CONTROL = 64 };

static int bound(const char *ip)
{
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    struct sockaddr_in a = addr_of(ip);
    /* An io_uring run's sockets outlive its processes a moment (the ring is torn down by a
     * kernel worker): the next run waits for the address, up to two seconds. */
    for (int tries = 0; fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) != 0; tries++) {
        if (errno != EADDRINUSE || tries == 200) {
            perror(ip);
            exit(1);
        }
        usleep(10000);
    }
    if (fd < 0) {
        perror("socket");
        exit(1);
    }
    /* As ferroce's socket: coalesced trains arrive whole, with their segment size. */
    int on = 1;
    setsockopt(fd, IPPROTO_UDP, UDP_GRO, &on, sizeof on);
    return fd;
}

/* One look at an empty socket, by the calls a poller might make, in ns each. */
static void empty(int n)
{
    int fd = bound("127.0.15.1");
    static char room[32][ROOM];
    static char control[32][CONTROL];
    struct mmsghdr m[32];
    struct iovec iov[32];
    struct sockaddr_in from[32];
    for (int i = 0; i < 32; i++) {
        iov[i] = (struct iovec){room[i], ROOM};
        m[i] = (struct mmsghdr){.msg_hdr = {.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                            .msg_iov = &iov[i], .msg_iovlen = 1,
                                            .msg_control = control[i], .msg_controllen = CONTROL}};
    }
    for (int round = 1; round <= 3; round++) {
        double t;
#define TIME(what, call)                                   \
    t = now_ns();                                          \
    for (int i = 0; i < n; i++) {                          \
        call;                                              \
    }                                                      \
    printf("round %d %-34s %5.0f ns\n", round, what, (now_ns() - t) / n);
        TIME("getppid (a system call for nothing)", syscall(SYS_getppid));
        TIME("recvmmsg, 32 headers", recvmmsg(fd, m, 32, MSG_DONTWAIT, NULL));
        TIME("recvmmsg, 1 header", recvmmsg(fd, m, 1, MSG_DONTWAIT, NULL));
        TIME("recvmsg, with a control buffer", recvmsg(fd, &m[0].msg_hdr, MSG_DONTWAIT));
        socklen_t len;
        TIME("recvfrom", (len = sizeof from[0],
                          recvfrom(fd, room[0], ROOM, MSG_DONTWAIT, (struct sockaddr *)&from[0], &len)));
        TIME("recv, peek at 0 bytes", recv(fd, NULL, 0, MSG_DONTWAIT | MSG_PEEK | MSG_TRUNC));
#undef TIME
    }
}

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

/* How a turn is sent and received. */
enum send_way { SENDTO_OPT, SENDMSG_OPT, SENDMSG_CMSG, SENDMMSG_CMSG, SEND_WAYS };
enum recv_way { RECV, RECVFROM, RECVMSG, RECVMSG_NAME, RECVMSG_CONTROL, RECVMSG_BOTH, RECVMMSG_BOTH,
                RECV_WAYS };
static const char *send_name[] = {"sendto, segment size by setsockopt", "sendmsg, by setsockopt",
                                  "sendmsg, by control message", "sendmmsg(1), by control message"};
static const char *recv_name[] = {"recv", "recvfrom", "recvmsg", "recvmsg, address",
                                  "recvmsg, control", "recvmsg, address and control",
                                  "recvmmsg(1), address and control"};

struct turn {
    int opt_fd, cmsg_fd, rx_fd;
    struct sockaddr_in to, from;
    char out[60], room[ROOM], control[CONTROL];
};

static long send_turn(struct turn *t, enum send_way way)
{
    struct iovec iov = {t->out, sizeof t->out};
    struct msghdr m = {.msg_name = &t->to, .msg_namelen = sizeof t->to, .msg_iov = &iov,
                       .msg_iovlen = 1};
    union {
        char bytes[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control;
    switch (way) {
    case SENDTO_OPT:
        return sendto(t->opt_fd, t->out, sizeof t->out, 0, (struct sockaddr *)&t->to, sizeof t->to);
    case SENDMSG_OPT:
        return sendmsg(t->opt_fd, &m, 0);
    default:
        m.msg_control = control.bytes;
        m.msg_controllen = sizeof control.bytes;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = IPPROTO_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        *(uint16_t *)CMSG_DATA(c) = 40;
        if (way == SENDMSG_CMSG)
            return sendmsg(t->cmsg_fd, &m, 0);
        struct mmsghdr mm = {.msg_hdr = m};
        return sendmmsg(t->cmsg_fd, &mm, 1, 0) == 1 ? (long)sizeof t->out : -1;
    }
}

static long receive_turn(struct turn *t, enum recv_way way)
{
    socklen_t len = sizeof t->from;
    struct iovec iov = {t->room, ROOM};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (way == RECV)
        return recv(t->rx_fd, t->room, ROOM, MSG_DONTWAIT);
    if (way == RECVFROM)
        return recvfrom(t->rx_fd, t->room, ROOM, MSG_DONTWAIT, (struct sockaddr *)&t->from, &len);
    if (way == RECVMSG_NAME || way == RECVMSG_BOTH || way == RECVMMSG_BOTH) {
        m.msg_name = &t->from;
        m.msg_namelen = sizeof t->from;
    }
    if (way == RECVMSG_CONTROL || way == RECVMSG_BOTH || way == RECVMMSG_BOTH) {
        m.msg_control = t->control;
        m.msg_controllen = CONTROL;
    }
    if (way == RECVMMSG_BOTH) {
        struct mmsghdr mm = {.msg_hdr = m};
        return recvmmsg(t->rx_fd, &mm, 1, MSG_DONTWAIT, NULL) == 1 ? (long)mm.msg_len : -1;
    }
    return recvmsg(t->rx_fd, &m, MSG_DONTWAIT);
}

/* One thread sends a turn and takes it back, N times per pair of calls: each send pair
 * against recv (what the send costs), each receive against sockperf's sendto (what the
 * receive costs), and the soft NIC's pair before and since the twenty-seventh step. */
static void turns(int n)
{
    static struct turn t;
    t.opt_fd = bound("127.0.15.1");
    t.cmsg_fd = bound("127.0.15.3");
    t.rx_fd = bound("127.0.15.2");
    int segment = 40;
    setsockopt(t.opt_fd, IPPROTO_UDP, UDP_SEGMENT, &segment, sizeof segment);
    t.to = addr_of("127.0.15.2");
    memset(t.out, 7, sizeof t.out);
    int pairs[][2] = {{SENDTO_OPT, RECV},         {SENDMSG_OPT, RECV},
                      {SENDMSG_CMSG, RECV},       {SENDMMSG_CMSG, RECV},
                      {SENDTO_OPT, RECVFROM},     {SENDTO_OPT, RECVMSG},
                      {SENDTO_OPT, RECVMSG_NAME}, {SENDTO_OPT, RECVMSG_CONTROL},
                      {SENDTO_OPT, RECVMSG_BOTH}, {SENDTO_OPT, RECVMMSG_BOTH},
                      {SENDMMSG_CMSG, RECVMMSG_BOTH}, {SENDMSG_CMSG, RECVMSG_BOTH}};
    enum { PAIRS = sizeof pairs / sizeof pairs[0], ROUNDS = 20 };
    double total[PAIRS] = {0};
    for (int round = 0; round < ROUNDS; round++) {
        for (int p = 0; p < PAIRS; p++) {
            double start = now_ns();
            for (int i = 0; i < n / ROUNDS; i++) {
                /* Sent on loopback, the turn is queued on the receiving socket before the
                 * send returns; all sixty bytes come back in one buffer (GRO). */
                if (send_turn(&t, pairs[p][0]) != (long)sizeof t.out ||
                    receive_turn(&t, pairs[p][1]) != (long)sizeof t.out) {
                    fprintf(stderr, "%s + %s: %s\n", send_name[pairs[p][0]],
                            recv_name[pairs[p][1]], strerror(errno));
                    exit(1);
                }
            }
            total[p] += now_ns() - start;
        }
    }
    for (int p = 0; p < PAIRS; p++)
        printf("%-34s + %-33s %5.0f ns\n", send_name[pairs[p][0]], recv_name[pairs[p][1]],
               total[p] / (n / ROUNDS * ROUNDS));
}

struct end {
    int fd;
    struct sockaddr_in peer;
    const char *mode;
    unsigned ring_flags;
    struct io_uring ring;
    char room[ROOM], out[PAYLOAD], control[CONTROL], turn[60];
    struct sockaddr_in from;
    struct iovec riov, siov;
    struct msghdr rmsg, smsg;
};

enum { RECEIVED = 1, SENT = 2 };

static void post_receive(struct end *e)
{
    e->rmsg.msg_namelen = sizeof e->from;
    e->rmsg.msg_controllen = CONTROL;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
    io_uring_prep_recvmsg(sqe, e->fd, &e->rmsg, 0);
    sqe->user_data = RECEIVED;
}

/* Waits for the next datagram the mode's way. */
static void wait_datagram(struct end *e)
{
    if (!strcmp(e->mode, "sock")) {
        for (;;) {
            socklen_t len = sizeof e->from;
            if (recvfrom(e->fd, e->room, ROOM, MSG_DONTWAIT, (struct sockaddr *)&e->from, &len) > 0)
                return;
        }
    }
    if (!strcmp(e->mode, "msg") || !strcmp(e->mode, "gso")) {
        for (;;) {
            e->rmsg.msg_namelen = sizeof e->from;
            e->rmsg.msg_controllen = CONTROL;
            if (recvmsg(e->fd, &e->rmsg, MSG_DONTWAIT) > 0)
                return;
        }
    }
    if (!strcmp(e->mode, "mmsg")) {
        struct mmsghdr m = {.msg_hdr = e->rmsg};
        for (;;) {
            m.msg_hdr.msg_namelen = sizeof e->from;
            m.msg_hdr.msg_controllen = CONTROL;
            if (recvmmsg(e->fd, &m, 1, MSG_DONTWAIT, NULL) > 0)
                return;
        }
    }
    for (;;) {
        struct io_uring_cqe *cqe;
        if (e->ring_flags)
            io_uring_get_events(&e->ring);
        if (io_uring_peek_cqe(&e->ring, &cqe) != 0)
            continue;
        unsigned long long what = cqe->user_data;
        int res = cqe->res;
        io_uring_cqe_seen(&e->ring, cqe);
        if (what != RECEIVED)
            continue;
        if (res > 0)
            return;
        post_receive(e); /* EAGAIN and the like: ask again */
        io_uring_submit(&e->ring);
    }
}

/* Answers, the mode's way; with io_uring the next receive goes in the same call. */
static void answer(struct end *e)
{
    if (!strcmp(e->mode, "sock")) {
        sendto(e->fd, e->out, PAYLOAD, 0, (struct sockaddr *)&e->peer, sizeof e->peer);
    } else if (!strcmp(e->mode, "mmsg")) {
        struct mmsghdr m = {.msg_hdr = e->smsg};
        sendmmsg(e->fd, &m, 1, 0);
    } else if (!strcmp(e->mode, "msg")) {
        sendmsg(e->fd, &e->smsg, 0);
    } else if (!strcmp(e->mode, "gso")) {
        struct iovec iov = {e->turn, sizeof e->turn};
        union {
            char bytes[CMSG_SPACE(sizeof(uint16_t))];
            struct cmsghdr align;
        } control;
        struct msghdr m = {.msg_name = &e->peer, .msg_namelen = sizeof e->peer, .msg_iov = &iov,
                           .msg_iovlen = 1, .msg_control = control.bytes,
                           .msg_controllen = sizeof control.bytes};
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = IPPROTO_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
        *(uint16_t *)CMSG_DATA(c) = 40;
        sendmsg(e->fd, &m, 0);
    } else {
        post_receive(e);
        struct io_uring_sqe *sqe = io_uring_get_sqe(&e->ring);
        io_uring_prep_sendmsg(sqe, e->fd, &e->smsg, 0);
        sqe->user_data = SENT;
        io_uring_submit(&e->ring);
    }
}

/* One end on its bound socket `fd`; the first sends first and reports. */
static void run_end(const char *mode, int fd, const char *peer, int first, int n)
{
    static struct end e;
    e.fd = fd;
    e.peer = addr_of(peer);
    e.mode = mode;
    memset(e.out, 1, PAYLOAD);
    e.riov = (struct iovec){e.room, ROOM};
    e.siov = (struct iovec){e.out, PAYLOAD};
    e.rmsg = (struct msghdr){.msg_name = &e.from, .msg_namelen = sizeof e.from, .msg_iov = &e.riov,
                             .msg_iovlen = 1, .msg_control = e.control, .msg_controllen = CONTROL};
    e.smsg = (struct msghdr){.msg_name = &e.peer, .msg_namelen = sizeof e.peer, .msg_iov = &e.siov,
                             .msg_iovlen = 1};
    if (!strncmp(mode, "uring", 5)) {
        if (!strcmp(mode, "uring-coop"))
            e.ring_flags = IORING_SETUP_COOP_TASKRUN;
        else if (!strcmp(mode, "uring-defer"))
            e.ring_flags = IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_SINGLE_ISSUER;
        else if (strcmp(mode, "uring")) {
            fprintf(stderr, "unknown mode %s\n", mode);
            exit(2);
        }
        int err = io_uring_queue_init(8, &e.ring, e.ring_flags);
        if (err) {
            fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-err));
            exit(1);
        }
        post_receive(&e);
        io_uring_submit(&e.ring);
    } else if (strcmp(mode, "sock") && strcmp(mode, "mmsg") && strcmp(mode, "msg") &&
               strcmp(mode, "gso")) {
        fprintf(stderr, "unknown mode %s\n", mode);
        exit(2);
    }
    double start = now_ns(), answering = 0;
    if (first)
        sendto(e.fd, e.out, PAYLOAD, 0, (struct sockaddr *)&e.peer, sizeof e.peer);
    for (int i = 0; i < n; i++) {
        wait_datagram(&e);
        if (first && i == n - 1)
            break;
        /* The answer's call, timed with one clock read's cost in it: on loopback the sender's
         * call carries the datagram through the receiving socket's queue. */
        double t = now_ns();
        answer(&e);
        answering += now_ns() - t;
    }
    if (first)
        printf("%-12s half round trip %.2f us over %d round trips; its answer call %.0f ns\n",
               mode, (now_ns() - start) / n / 2 / 1000, n, answering / (n - 1));
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "empty")) {
        empty(argc > 2 ? atoi(argv[2]) : 200000);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "turn")) {
        turns(argc > 2 ? atoi(argv[2]) : 200000);
        return 0;
    }
    if (argc < 3 || strcmp(argv[1], "pingpong")) {
        fprintf(stderr, "usage: recv-floor empty [N] | recv-floor turn [N] | recv-floor pingpong "
                        "sock|mmsg|msg|gso|uring|uring-coop|uring-defer [N]\n");
        return 2;
    }
    int n = argc > 3 ? atoi(argv[3]) : 50000;
    int ready[2];
    if (pipe(ready) != 0)
        return 1;
    pid_t child = fork();
    if (child == 0) {
        close(ready[0]);
        /* The answering end: binds, says so, answers until killed. */
        int fd = bound("127.0.15.2");
        if (write(ready[1], "x", 1) != 1)
            _exit(1);
        run_end(argv[2], fd, "127.0.15.1", 0, n);
        _exit(0);
    }
    /* The first datagram goes only once the other end's socket is bound. */
    char x;
    close(ready[1]);
    int fd = bound("127.0.15.1");
    if (read(ready[0], &x, 1) != 1)
        return 1;
    run_end(argv[2], fd, "127.0.15.2", 1, n);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    return 0;
}
