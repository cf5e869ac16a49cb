/*
 * The verbs a C user of libibverbs and librdmacm reaches for, against the real engine on
 * loopback (127.0.10.1 to 127.0.10.12, each NIC its own address): RC requests with several
 * scatter/gather entries and a chain of three in one post, with `bad_wr` naming the refused
 * one; a CQ's descriptor readable after arming and a completion, and the NIC's async event
 * when an SRQ falls below its limit; connection management with private data both ways, a
 * reject carrying private data, and a port nobody listens on; a UD datagram with its GRH to
 * a queue pair found by SIDR; an SRQ shared by two queue pairs; a remote buffer and an
 * endpoint round-tripped through bytes, and bad bytes refused.
 *
 * Built and run by tests/c_abi.rs and scripts/test-c.sh. Exits 0 when every check passes;
 * otherwise prints the first failure and exits 1. No check depends on timing: every wait has
 * a generous bound and only its outcome is checked.
 */
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static ferroce_completion_ex wait_ok(ferroce_cq *cq) {
    ferroce_completion_ex wc;
    OK(ferroce_cq_wait_ex(cq, WAIT_MS, &wc));
    if (wc.wc.status != 0) {
        fprintf(stderr, "completion %llu: %s\n", (unsigned long long)wc.wc.wr_id,
                ferroce_wc_status_str(wc.wc.status));
        fail("a completion failed", __LINE__);
    }
    return wc;
}

static ferroce_send_request send_request(uint32_t opcode, uint64_t wr_id, const ferroce_sge *sges,
                                         uint32_t n) {
    ferroce_send_request wr;
    memset(&wr, 0, sizeof wr);
    wr.struct_size = sizeof wr;
    wr.opcode = opcode;
    wr.wr_id = wr_id;
    wr.sg_list = sges;
    wr.num_sge = n;
    wr.flags = FERROCE_SEND_SIGNALED;
    return wr;
}

static ferroce_recv_request recv_request(uint64_t wr_id, const ferroce_sge *sges, uint32_t n) {
    ferroce_recv_request wr;
    memset(&wr, 0, sizeof wr);
    wr.struct_size = sizeof wr;
    wr.wr_id = wr_id;
    wr.sg_list = sges;
    wr.num_sge = n;
    return wr;
}

static ferroce_sge sge(const ferroce_region *r, uint64_t offset, uint32_t len) {
    ferroce_sge s = {ferroce_region_addr(r) + offset, len, ferroce_region_lkey(r)};
    return s;
}

/* Two NICs, each with a CQ, a queue pair on it and a mapped region of 4096 bytes. */
typedef struct pair {
    ferroce_nic *nic[2];
    ferroce_cq *cq[2];
    ferroce_qp *qp[2];
    ferroce_region *region[2];
} pair;

static void connect_through_bytes(ferroce_qp *from, ferroce_qp *to) {
    ferroce_endpoint e, back;
    uint8_t bytes[FERROCE_ENDPOINT_BYTES];
    OK(ferroce_qp_endpoint(to, &e));
    OK(ferroce_endpoint_to_bytes(&e, bytes, sizeof bytes));
    OK(ferroce_endpoint_from_bytes(bytes, sizeof bytes, &back));
    CHECK(back.qpn == e.qpn && back.psn == e.psn && strcmp(back.addr, e.addr) == 0);
    OK(ferroce_qp_connect(from, &back, NULL));
}

/* A pair of `qp_type` QPs (not connected) at `a` and `b`, their regions granting `access`. */
static pair open_unconnected(const char *a, const char *b, uint32_t qp_type, uint32_t access) {
    pair p;
    OK(ferroce_nic_open(a, &p.nic[0]));
    OK(ferroce_nic_open(b, &p.nic[1]));
    for (int i = 0; i < 2; i++) {
        OK(ferroce_cq_new(p.nic[i], 64, &p.cq[i]));
        OK(ferroce_qp_new(p.nic[i], qp_type, p.cq[i], p.cq[i], NULL, &p.qp[i]));
        OK(ferroce_region_register(p.nic[i], 4096, access, FERROCE_MEMORY_MAPPED, &p.region[i]));
    }
    return p;
}

/* An RC pair, connected through their endpoints as bytes. */
static pair open_pair(const char *a, const char *b) {
    pair p = open_unconnected(a, b, FERROCE_QP_RC, FERROCE_ACCESS_REMOTE);
    connect_through_bytes(p.qp[0], p.qp[1]);
    connect_through_bytes(p.qp[1], p.qp[0]);
    return p;
}

static void close_pair(pair *p) {
    for (int i = 0; i < 2; i++) {
        ferroce_qp_free(p->qp[i]);
        ferroce_region_free(p->region[i]);
        ferroce_cq_free(p->cq[i]);
        ferroce_nic_free(p->nic[i]);
    }
}

/* ---- several entries per request, chains, bad_wr ------------------------------------------ */

static void gather_scatter_and_chains(void) {
    pair p = open_pair("127.0.10.1", "127.0.10.2");
    ferroce_region *ra = p.region[0], *rb = p.region[1];
    uint8_t *a = ferroce_region_host_pointer(ra);
    uint8_t *b = ferroce_region_host_pointer(rb);
    memcpy(a + 0, "hello ", 6);
    memcpy(a + 100, "world", 5);
    memcpy(a + 200, "AAAA", 4);
    memcpy(a + 300, "BBBB", 4);
    memcpy(a + 400, "CCCC", 4);
    memcpy(a + 500, "second", 6);
    memcpy(a + 600, " send", 5);

    /* Two receives in one chain, each scattering into two places. */
    ferroce_sge r1[2] = {sge(rb, 1000, 4), sge(rb, 1100, 64)};
    ferroce_sge r2[2] = {sge(rb, 2000, 3), sge(rb, 2100, 64)};
    ferroce_recv_request rw[2] = {recv_request(11, r1, 2), recv_request(12, r2, 2)};
    rw[0].next = &rw[1];
    const ferroce_recv_request *bad_recv = NULL;
    OK(ferroce_qp_post_recv_list(p.qp[1], &rw[0], &bad_recv));
    CHECK(bad_recv == NULL);

    /* Three requests in one post: SEND of two entries, WRITE of three, SEND of two. */
    ferroce_sge s1[2] = {sge(ra, 0, 6), sge(ra, 100, 5)};
    ferroce_sge s2[3] = {sge(ra, 200, 4), sge(ra, 300, 4), sge(ra, 400, 4)};
    ferroce_sge s3[2] = {sge(ra, 500, 6), sge(ra, 600, 5)};
    ferroce_send_request sw[3] = {send_request(FERROCE_WR_SEND, 1, s1, 2),
                                  send_request(FERROCE_WR_WRITE, 2, s2, 3),
                                  send_request(FERROCE_WR_SEND, 3, s3, 2)};
    sw[1].remote_addr = ferroce_region_addr(rb) + 3000;
    sw[1].rkey = ferroce_region_rkey(rb);
    sw[0].next = &sw[1];
    sw[1].next = &sw[2];
    const ferroce_send_request *bad = NULL;
    OK(ferroce_qp_post_send_list(p.qp[0], &sw[0], &bad));
    CHECK(bad == NULL);
    for (uint64_t id = 1; id <= 3; id++) {
        ferroce_completion_ex wc = wait_ok(p.cq[0]);
        CHECK(wc.wc.wr_id == id);
    }
    ferroce_completion_ex wc = wait_ok(p.cq[1]);
    CHECK(wc.wc.wr_id == 11 && wc.wc.opcode == 128 && wc.wc.byte_len == 11);
    CHECK(wc.flags == 0 && wc.src_qp == 0);
    wc = wait_ok(p.cq[1]);
    CHECK(wc.wc.wr_id == 12 && wc.wc.byte_len == 11);
    CHECK(memcmp(b + 1000, "hell", 4) == 0 && memcmp(b + 1100, "o world", 7) == 0);
    CHECK(memcmp(b + 3000, "AAAABBBBCCCC", 12) == 0);
    CHECK(memcmp(b + 2000, "sec", 3) == 0 && memcmp(b + 2100, "ond send", 8) == 0);

    /* A chain whose second request is malformed: the first is posted, *bad_wr the second. */
    ferroce_send_request bw[2] = {send_request(FERROCE_WR_WRITE, 21, s1, 2),
                                  send_request(99, 22, s1, 2)};
    bw[0].remote_addr = ferroce_region_addr(rb) + 3500;
    bw[0].rkey = ferroce_region_rkey(rb);
    bw[0].next = &bw[1];
    EXPECT(ferroce_qp_post_send_list(p.qp[0], &bw[0], &bad), FERROCE_RESULT_INVALID);
    CHECK(bad == &bw[1]);
    wc = wait_ok(p.cq[0]);
    CHECK(wc.wc.wr_id == 21);
    CHECK(memcmp(b + 3500, "hello world", 11) == 0);

    /* Too many entries, a too-small struct, and NULL, each refused at the first request. */
    bw[0].num_sge = FERROCE_MAX_SGE + 1;
    bw[0].next = NULL;
    EXPECT(ferroce_qp_post_send_list(p.qp[0], &bw[0], &bad), FERROCE_RESULT_INVALID);
    CHECK(bad == &bw[0]);
    rw[0].struct_size = 4;
    rw[0].next = NULL;
    EXPECT(ferroce_qp_post_recv_list(p.qp[1], &rw[0], &bad_recv), FERROCE_RESULT_INVALID);
    CHECK(bad_recv == &rw[0]);
    EXPECT(ferroce_qp_post_send_list(p.qp[0], NULL, &bad), FERROCE_RESULT_NULL_PARAMETER);
    close_pair(&p);
}

/* ---- completion channel descriptor ------------------------------------------------------- */

static int readable(int fd) {
    struct pollfd pfd = {fd, POLLIN, 0};
    return poll(&pfd, 1, WAIT_MS) == 1 && (pfd.revents & POLLIN);
}

static void completion_fd_fires_after_arming(void) {
    pair p = open_pair("127.0.10.3", "127.0.10.4");
    ferroce_region *ra = p.region[0], *rb = p.region[1];
    int fd = ferroce_cq_fd(p.cq[1]);
    CHECK(fd >= 0);
    CHECK(ferroce_cq_fd(NULL) == -1);
    CHECK(ferroce_cq_take_events(p.cq[1]) == 0);

    for (int solicited = 0; solicited < 2; solicited++) {
        OK(ferroce_cq_req_notify(p.cq[1], solicited));
        OK(ferroce_qp_post_recv(p.qp[1], 40 + solicited, ferroce_region_addr(rb), 64,
                                ferroce_region_lkey(rb)));
        ferroce_sge s = sge(ra, 0, 16);
        ferroce_send_request wr = send_request(FERROCE_WR_SEND, 30 + solicited, &s, 1);
        if (solicited) wr.flags |= FERROCE_SEND_SOLICITED;
        OK(ferroce_qp_post_send_list(p.qp[0], &wr, NULL));
        wait_ok(p.cq[0]);
        CHECK(readable(fd));
        CHECK(ferroce_cq_take_events(p.cq[1]) >= 1);
        /* Poll the CQ dry after taking the events. */
        ferroce_completion_ex wc[4];
        size_t n = 0;
        for (int tries = 0; n == 0 && tries < 1000; tries++)
            OK(ferroce_cq_poll_ex(p.cq[1], wc, 4, &n));
        CHECK(n == 1 && wc[0].wc.wr_id == (uint64_t)(40 + solicited));
    }
    close_pair(&p);
}

/* ---- connection management with private data --------------------------------------------- */

typedef struct passive {
    ferroce_listener *listener;
    ferroce_qp *qp;
    int reject; /* reject the request instead of accepting it */
    ferroce_connection *conn;
    char seen[FERROCE_CM_REQ_PRIVATE];
    char peer[64];
} passive;

static void *passive_side(void *arg) {
    passive *ps = arg;
    ferroce_conn_request *req = NULL;
    OK(ferroce_listener_get_request(ps->listener, WAIT_MS, &req));
    CHECK(ferroce_conn_request_private_data(req, NULL, 0) == FERROCE_CM_REQ_PRIVATE);
    ferroce_conn_request_private_data(req, (uint8_t *)ps->seen, sizeof ps->seen);
    ferroce_conn_request_peer(req, ps->peer, sizeof ps->peer);
    if (ps->reject) {
        OK(ferroce_conn_request_reject(req, (const uint8_t *)"go away", 7));
        EXPECT(ferroce_conn_request_reject(req, NULL, 0), FERROCE_RESULT_CLOSED);
    } else {
        ferroce_conn_param param;
        memset(&param, 0, sizeof param);
        param.struct_size = sizeof param;
        param.responder_resources = 1;
        param.initiator_depth = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        param.private_data = (const uint8_t *)"welcome from b";
        param.private_data_len = 14;
        OK(ferroce_conn_request_accept(req, ps->qp, &param, &ps->conn));
        OK(ferroce_connection_wait_established(ps->conn, WAIT_MS));
    }
    ferroce_conn_request_free(req);
    return NULL;
}

static void connect_accept_reject_with_private_data(void) {
    pair p = open_unconnected("127.0.10.5", "127.0.10.6", FERROCE_QP_RC, FERROCE_ACCESS_REMOTE);
    ferroce_nic *a = p.nic[0], *b = p.nic[1];
    ferroce_cq *ca = p.cq[0], *cb = p.cq[1];
    ferroce_qp *qa = p.qp[0], *qb = p.qp[1];
    ferroce_region *ra = p.region[0], *rb = p.region[1];
    OK(ferroce_qp_post_recv(qb, 50, ferroce_region_addr(rb), 64, ferroce_region_lkey(rb)));

    ferroce_listener *listener = NULL;
    OK(ferroce_cm_listen(b, 7471, &listener));
    ferroce_listener *twice = NULL;
    EXPECT(ferroce_cm_listen(b, 7471, &twice), FERROCE_RESULT_ADDRESS_IN_USE);
    ferroce_conn_request *none = NULL;
    EXPECT(ferroce_listener_get_request(listener, 0, &none), FERROCE_RESULT_TIMEOUT);

    /* Accepted: private data both ways, then a SEND over the connection. */
    passive ps;
    memset(&ps, 0, sizeof ps);
    ps.listener = listener;
    ps.qp = qb;
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, passive_side, &ps) == 0);
    ferroce_conn_param param;
    memset(&param, 0, sizeof param);
    param.struct_size = sizeof param;
    param.responder_resources = 1;
    param.initiator_depth = 1;
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    param.timeout_ms = WAIT_MS;
    param.private_data = (const uint8_t *)"hello from a";
    param.private_data_len = 12;
    ferroce_connection *conn = NULL;
    OK(ferroce_cm_connect(a, qa, "127.0.10.6", 7471, &param, NULL, &conn));
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(memcmp(ps.seen, "hello from a", 12) == 0 && ps.seen[12] == 0);
    CHECK(strcmp(ps.peer, "127.0.10.5") == 0);
    uint8_t rep[FERROCE_CM_REP_PRIVATE];
    CHECK(ferroce_connection_private_data(conn, rep, sizeof rep) == FERROCE_CM_REP_PRIVATE);
    CHECK(memcmp(rep, "welcome from b", 14) == 0 && rep[14] == 0);
    char peer[64];
    CHECK(ferroce_connection_peer(conn, peer, sizeof peer) == strlen("127.0.10.6"));
    CHECK(strcmp(peer, "127.0.10.6") == 0);
    OK(ferroce_connection_wait_established(conn, WAIT_MS));

    memcpy(ferroce_region_host_pointer(ra), "over the CM", 11);
    ferroce_sge s = sge(ra, 0, 11);
    ferroce_send_request wr = send_request(FERROCE_WR_SEND, 51, &s, 1);
    OK(ferroce_qp_post_send_list(qa, &wr, NULL));
    wait_ok(ca);
    ferroce_completion_ex wc = wait_ok(cb);
    CHECK(wc.wc.wr_id == 50 && wc.wc.byte_len == 11);
    CHECK(memcmp(ferroce_region_host_pointer(rb), "over the CM", 11) == 0);

    OK(ferroce_connection_disconnect(conn, WAIT_MS));
    OK(ferroce_connection_wait_disconnected(ps.conn, WAIT_MS));
    ferroce_connection_free(conn);
    ferroce_connection_free(ps.conn);

    /* Rejected, with private data the active side reads. */
    ferroce_qp *qa2 = NULL, *qb2 = NULL;
    OK(ferroce_qp_new(a, FERROCE_QP_RC, ca, ca, NULL, &qa2));
    OK(ferroce_qp_new(b, FERROCE_QP_RC, cb, cb, NULL, &qb2));
    memset(&ps, 0, sizeof ps);
    ps.listener = listener;
    ps.qp = qb2;
    ps.reject = 1;
    CHECK(pthread_create(&thread, NULL, passive_side, &ps) == 0);
    param.private_data = (const uint8_t *)"again";
    param.private_data_len = 5;
    ferroce_cm_reject rejected;
    memset(&rejected, 0, sizeof rejected);
    rejected.struct_size = sizeof rejected;
    conn = NULL;
    EXPECT(ferroce_cm_connect(a, qa2, "127.0.10.6", 7471, &param, &rejected, &conn),
           FERROCE_RESULT_REJECTED);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(conn == NULL);
    CHECK(memcmp(ps.seen, "again", 5) == 0);
    CHECK(rejected.reason == 28);
    CHECK(rejected.private_data_len == FERROCE_CM_REJ_PRIVATE);
    CHECK(memcmp(rejected.private_data, "go away", 7) == 0 && rejected.private_data[7] == 0);

    /* Nobody listens on this port: REJ 8. Too much private data: INVALID, nothing sent. */
    ferroce_qp *qa3 = NULL;
    OK(ferroce_qp_new(a, FERROCE_QP_RC, ca, ca, NULL, &qa3));
    memset(&rejected, 0, sizeof rejected);
    rejected.struct_size = sizeof rejected;
    EXPECT(ferroce_cm_connect(a, qa3, "127.0.10.6", 7999, &param, &rejected, &conn),
           FERROCE_RESULT_REJECTED);
    CHECK(rejected.reason == 8);
    uint8_t big[FERROCE_CM_REQ_PRIVATE + 1];
    memset(big, 7, sizeof big);
    param.private_data = big;
    param.private_data_len = sizeof big;
    EXPECT(ferroce_cm_connect(a, qa3, "127.0.10.6", 7471, &param, NULL, &conn),
           FERROCE_RESULT_INVALID);

    ferroce_listener_free(listener);
    ferroce_qp_free(qa3);
    ferroce_qp_free(qa2);
    ferroce_qp_free(qb2);
    close_pair(&p);
}

/* ---- UD with GRH, found by SIDR ------------------------------------------------------------ */

typedef struct sidr_side {
    ferroce_listener *listener;
    ferroce_qp *qp;
    char seen[8];
} sidr_side;

static void *answer_sidr(void *arg) {
    sidr_side *s = arg;
    ferroce_sidr_request *req = NULL;
    OK(ferroce_listener_get_sidr_request(s->listener, WAIT_MS, &req));
    ferroce_sidr_request_private_data(req, (uint8_t *)s->seen, sizeof s->seen);
    OK(ferroce_sidr_request_accept(req, s->qp, 0x11111111));
    ferroce_sidr_request_free(req);
    return NULL;
}

static void ud_datagram_with_grh_found_by_sidr(void) {
    pair p = open_unconnected("127.0.10.7", "127.0.10.8", FERROCE_QP_UD, FERROCE_ACCESS_LOCAL);
    ferroce_nic *a = p.nic[0], *b = p.nic[1];
    ferroce_cq *ca = p.cq[0], *cb = p.cq[1];
    ferroce_qp *qa = p.qp[0], *qb = p.qp[1];
    ferroce_region *ra = p.region[0], *rb = p.region[1];
    OK(ferroce_qp_ready_ud(qa, 0x11111111));
    OK(ferroce_qp_ready_ud(qb, 0x11111111));
    OK(ferroce_qp_post_recv(qb, 60, ferroce_region_addr(rb), FERROCE_UD_GRH_LEN + 256,
                            ferroce_region_lkey(rb)));

    /* SIDR: a asks b's UDP-space port 7472 which queue pair serves it. */
    sidr_side side;
    memset(&side, 0, sizeof side);
    OK(ferroce_cm_listen_udp(b, 7472, &side.listener));
    side.qp = qb;
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, answer_sidr, &side) == 0);
    ferroce_ud_peer peer;
    memset(&peer, 0, sizeof peer);
    peer.struct_size = sizeof peer;
    OK(ferroce_cm_resolve_ud(a, "127.0.10.8", 7472, (const uint8_t *)"who", 3, WAIT_MS, NULL,
                             &peer));
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(memcmp(side.seen, "who", 3) == 0);
    CHECK(peer.qpn == ferroce_qp_qpn(qb) && peer.qkey == 0x11111111);
    CHECK(strcmp(peer.addr, "127.0.10.8:4791") == 0);

    ferroce_ah *ah = NULL;
    EXPECT(ferroce_ah_new(a, "::1", &ah), FERROCE_RESULT_INVALID);
    OK(ferroce_ah_new(a, peer.addr, &ah));
    memcpy(ferroce_region_host_pointer(ra), "datagram", 8);
    ferroce_sge s = sge(ra, 0, 8);
    ferroce_send_request wr = send_request(FERROCE_WR_SEND, 61, &s, 1);
    /* Without a destination a UD send is refused. */
    EXPECT(ferroce_qp_post_send_list(qa, &wr, NULL), FERROCE_RESULT_INVALID);
    wr.ah = ah;
    wr.remote_qpn = peer.qpn;
    wr.remote_qkey = peer.qkey;
    OK(ferroce_qp_post_send_list(qa, &wr, NULL));
    CHECK(wait_ok(ca).wc.wr_id == 61);
    ferroce_completion_ex wc = wait_ok(cb);
    CHECK(wc.wc.wr_id == 60 && wc.wc.opcode == 128);
    CHECK(wc.wc.byte_len == FERROCE_UD_GRH_LEN + 8);
    CHECK(wc.flags & FERROCE_WC_GRH);
    CHECK(wc.src_qp == ferroce_qp_qpn(qa));
    static const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 10, 7};
    CHECK(memcmp(wc.src_gid, gid, 16) == 0);
    const uint8_t *got = ferroce_region_host_pointer(rb);
    static const uint8_t src_ip[4] = {127, 0, 10, 7};
    CHECK(memcmp(got + 32, src_ip, 4) == 0); /* the IPv4 header's source, in the GRH */
    CHECK(memcmp(got + FERROCE_UD_GRH_LEN, "datagram", 8) == 0);

    /* b answers the sender through an address handle made from the completion. */
    ferroce_ah *back = NULL;
    OK(ferroce_ah_from_completion(b, &wc, &back));
    OK(ferroce_qp_post_recv(qa, 62, ferroce_region_addr(ra) + 1024, FERROCE_UD_GRH_LEN + 64,
                            ferroce_region_lkey(ra)));
    memcpy(ferroce_region_host_pointer(rb) + 2048, "reply", 5);
    ferroce_sge rs = sge(rb, 2048, 5);
    ferroce_send_request reply = send_request(FERROCE_WR_SEND, 63, &rs, 1);
    reply.ah = back;
    reply.remote_qpn = wc.src_qp;
    reply.remote_qkey = 0x11111111;
    OK(ferroce_qp_post_send_list(qb, &reply, NULL));
    CHECK(wait_ok(cb).wc.wr_id == 63);
    ferroce_completion_ex answer = wait_ok(ca);
    CHECK(answer.wc.wr_id == 62 && answer.src_qp == ferroce_qp_qpn(qb));
    CHECK(memcmp(ferroce_region_host_pointer(ra) + 1024 + FERROCE_UD_GRH_LEN, "reply", 5) == 0);
    ferroce_ah_free(back);
    ferroce_completion_ex not_ud;
    memset(&not_ud, 0, sizeof not_ud);
    EXPECT(ferroce_ah_from_completion(b, &not_ud, &back), FERROCE_RESULT_INVALID);

    /* Nobody listens on this UDP-space port: the SIDR answer is a failure status. */
    ferroce_cm_reject rejected;
    memset(&rejected, 0, sizeof rejected);
    rejected.struct_size = sizeof rejected;
    EXPECT(ferroce_cm_resolve_ud(a, "127.0.10.8", 7999, NULL, 0, WAIT_MS, &rejected, &peer),
           FERROCE_RESULT_REJECTED);
    CHECK(rejected.reason == 1);

    ferroce_ah_free(ah);
    ferroce_listener_free(side.listener);
    close_pair(&p);
}

/* ---- a shared receive queue, and its limit event -------------------------------------------- */

static void srq_shared_by_two_qps(void) {
    ferroce_nic *server = NULL, *client[2] = {NULL, NULL};
    OK(ferroce_nic_open("127.0.10.9", &server));
    OK(ferroce_nic_open("127.0.10.10", &client[0]));
    OK(ferroce_nic_open("127.0.10.11", &client[1]));
    ferroce_cq *scq = NULL, *ccq[2];
    OK(ferroce_cq_new(server, 64, &scq));
    ferroce_srq *srq = NULL;
    EXPECT(ferroce_srq_new(server, 0, 0, &srq), FERROCE_RESULT_INVALID);
    EXPECT(ferroce_srq_new(server, 4, 4, &srq), FERROCE_RESULT_INVALID);
    OK(ferroce_srq_new(server, 16, 0, &srq));
    ferroce_region *rs = NULL, *rc[2];
    OK(ferroce_region_register(server, 4096, FERROCE_ACCESS_LOCAL, FERROCE_MEMORY_MAPPED, &rs));

    ferroce_qp *sq[2], *cq[2];
    for (int i = 0; i < 2; i++) {
        OK(ferroce_cq_new(client[i], 64, &ccq[i]));
        OK(ferroce_region_register(client[i], 4096, FERROCE_ACCESS_LOCAL, FERROCE_MEMORY_MAPPED,
                                   &rc[i]));
        OK(ferroce_qp_new_with_srq(server, FERROCE_QP_RC, scq, scq, srq, NULL, &sq[i]));
        OK(ferroce_qp_new(client[i], FERROCE_QP_RC, ccq[i], ccq[i], NULL, &cq[i]));
        connect_through_bytes(sq[i], cq[i]);
        connect_through_bytes(cq[i], sq[i]);
    }
    /* A QP on an SRQ takes no receives of its own. */
    EXPECT(ferroce_qp_post_recv(sq[0], 1, ferroce_region_addr(rs), 64, ferroce_region_lkey(rs)),
           FERROCE_RESULT_INVALID);

    /* Four receives: three in one chain, one alone; then the limit armed at 3. */
    ferroce_sge e[3] = {sge(rs, 0, 64), sge(rs, 64, 64), sge(rs, 128, 64)};
    ferroce_recv_request rw[3] = {recv_request(100, &e[0], 1), recv_request(101, &e[1], 1),
                                  recv_request(102, &e[2], 1)};
    rw[0].next = &rw[1];
    rw[1].next = &rw[2];
    OK(ferroce_srq_post_recv_list(srq, &rw[0], NULL));
    OK(ferroce_srq_post_recv(srq, 103, ferroce_region_addr(rs) + 192, 64, ferroce_region_lkey(rs)));
    CHECK(ferroce_srq_queued(srq) == 4);
    OK(ferroce_srq_arm(srq, 3));

    for (int i = 0; i < 2; i++) {
        uint8_t *bytes = ferroce_region_host_pointer(rc[i]);
        snprintf((char *)bytes, 16, "from client %d", i);
        ferroce_sge s = sge(rc[i], 0, 14);
        ferroce_send_request wr = send_request(FERROCE_WR_SEND, 200 + (uint64_t)i, &s, 1);
        OK(ferroce_qp_post_send_list(cq[i], &wr, NULL));
        wait_ok(ccq[i]);
        ferroce_completion_ex wc = wait_ok(scq);
        CHECK(wc.wc.qpn == ferroce_qp_qpn(sq[i]));
        CHECK(wc.wc.wr_id == 100 + (uint64_t)i && wc.wc.byte_len == 14);
        char want[16];
        snprintf(want, sizeof want, "from client %d", i);
        CHECK(memcmp(ferroce_region_host_pointer(rs) + 64 * i, want, 14) == 0);
    }
    CHECK(ferroce_srq_queued(srq) == 2);

    /* Two left, fewer than the limit of 3: the NIC's async descriptor says so. */
    int fd = ferroce_nic_async_fd(server);
    CHECK(fd >= 0);
    CHECK(readable(fd));
    ferroce_async_event event;
    event.struct_size = sizeof event;
    OK(ferroce_nic_poll_event(server, WAIT_MS, &event));
    CHECK(event.event_type == FERROCE_EVENT_SRQ_LIMIT_REACHED);
    CHECK(event.srq == ferroce_srq_id(srq));
    EXPECT(ferroce_nic_poll_event(server, 0, &event), FERROCE_RESULT_TIMEOUT);
    event.struct_size = 4;
    EXPECT(ferroce_nic_poll_event(server, 0, &event), FERROCE_RESULT_INVALID);

    for (int i = 0; i < 2; i++) {
        ferroce_qp_free(sq[i]);
        ferroce_qp_free(cq[i]);
        ferroce_region_free(rc[i]);
        ferroce_cq_free(ccq[i]);
        ferroce_nic_free(client[i]);
    }
    ferroce_srq_free(srq);
    ferroce_region_free(rs);
    ferroce_cq_free(scq);
    ferroce_nic_free(server);
}

/* ---- bytes ------------------------------------------------------------------------------- */

static void bytes_round_trip_and_bad_bytes_refused(void) {
    ferroce_nic *nic = NULL;
    OK(ferroce_nic_open("127.0.10.12", &nic));
    ferroce_region *r = NULL, *local = NULL;
    OK(ferroce_region_register(nic, 8192, FERROCE_ACCESS_REMOTE_WRITE, FERROCE_MEMORY_PAGEABLE,
                               &r));
    OK(ferroce_region_register(nic, 64, FERROCE_ACCESS_LOCAL, FERROCE_MEMORY_PAGEABLE, &local));
    ferroce_remote remote, back;
    EXPECT(ferroce_region_remote(local, &remote), FERROCE_RESULT_INVALID);
    OK(ferroce_region_remote(r, &remote));
    CHECK(remote.addr == ferroce_region_addr(r) && remote.len == 8192 &&
          remote.rkey == ferroce_region_rkey(r));
    uint8_t bytes[FERROCE_ENDPOINT_BYTES + 1];
    EXPECT(ferroce_remote_to_bytes(&remote, bytes, FERROCE_REMOTE_BYTES - 1),
           FERROCE_RESULT_INVALID);
    OK(ferroce_remote_to_bytes(&remote, bytes, FERROCE_REMOTE_BYTES));
    /* Big-endian: the rkey's most significant byte first, at byte 4. */
    CHECK(bytes[0] == 'R' && bytes[1] == FERROCE_WIRE_VERSION);
    CHECK(bytes[4] == (uint8_t)(remote.rkey >> 24) && bytes[7] == (uint8_t)remote.rkey);
    CHECK(bytes[23] == (uint8_t)remote.len && bytes[22] == (uint8_t)(remote.len >> 8));
    OK(ferroce_remote_from_bytes(bytes, FERROCE_REMOTE_BYTES, &back));
    CHECK(back.addr == remote.addr && back.len == remote.len && back.rkey == remote.rkey);
    EXPECT(ferroce_remote_from_bytes(bytes, FERROCE_REMOTE_BYTES - 1, &back),
           FERROCE_RESULT_INVALID);
    EXPECT(ferroce_remote_from_bytes(bytes, FERROCE_REMOTE_BYTES + 1, &back),
           FERROCE_RESULT_INVALID);
    bytes[1] = FERROCE_WIRE_VERSION + 1;
    EXPECT(ferroce_remote_from_bytes(bytes, FERROCE_REMOTE_BYTES, &back), FERROCE_RESULT_INVALID);

    ferroce_cq *cq = NULL;
    ferroce_qp *qp = NULL;
    OK(ferroce_cq_new(nic, 8, &cq));
    OK(ferroce_qp_new(nic, FERROCE_QP_RC, cq, cq, NULL, &qp));
    ferroce_endpoint e, eb;
    OK(ferroce_qp_endpoint(qp, &e));
    OK(ferroce_endpoint_to_bytes(&e, bytes, sizeof bytes));
    CHECK(bytes[0] == 'E' && bytes[2] == 0x12 && bytes[3] == 0xb7); /* port 4791 */
    OK(ferroce_endpoint_from_bytes(bytes, FERROCE_ENDPOINT_BYTES, &eb));
    CHECK(eb.qpn == e.qpn && eb.psn == e.psn && strcmp(eb.addr, "127.0.10.12:4791") == 0);
    EXPECT(ferroce_endpoint_from_bytes(bytes, sizeof bytes, &eb), FERROCE_RESULT_INVALID);
    EXPECT(ferroce_endpoint_from_bytes(bytes, FERROCE_REMOTE_BYTES, &eb), FERROCE_RESULT_INVALID);
    EXPECT(ferroce_endpoint_to_bytes(&e, bytes, 8), FERROCE_RESULT_INVALID);
    bytes[0] = 'R';
    EXPECT(ferroce_endpoint_from_bytes(bytes, FERROCE_ENDPOINT_BYTES, &eb), FERROCE_RESULT_INVALID);
    bytes[0] = 'E';
    bytes[4] = 1; /* a QPN past 24 bits */
    EXPECT(ferroce_endpoint_from_bytes(bytes, FERROCE_ENDPOINT_BYTES, &eb), FERROCE_RESULT_INVALID);
    EXPECT(ferroce_endpoint_from_bytes(NULL, FERROCE_ENDPOINT_BYTES, &eb),
           FERROCE_RESULT_NULL_PARAMETER);

    ferroce_qp_free(qp);
    ferroce_cq_free(cq);
    ferroce_region_free(r);
    ferroce_region_free(local);
    ferroce_nic_free(nic);
}

int main(void) {
    bytes_round_trip_and_bad_bytes_refused();
    gather_scatter_and_chains();
    completion_fd_fires_after_arming();
    connect_accept_reject_with_private_data();
    ud_datagram_with_grh_found_by_sidr();
    srq_shared_by_two_qps();
    printf("verbs_test: all passed\n");
    return 0;
}
