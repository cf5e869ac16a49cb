/* The drop-in librdmacm from C (issue 24), built against rdma-core's own <rdma/rdma_cma.h>:
 * what stock tools do not show. Two processes, each its own soft NIC (FERROCE_ADDR):
 *
 *   rdmacm server ADDR PORT     rdmacm client ADDR PORT
 *
 * in this order (scripts/test-rdmacm.sh starts the server first; 1b is the client's alone):
 *   1. the server's channel fd, made non-blocking, gives EAGAIN with nothing queued and
 *      wakes poll(2) when an event comes;
 *  1b. rdma_getaddrinfo(NULL, NULL, hints) answers with the hints' addresses; a loopback
 *      address not the NIC's binds as the wildcard (no device yet); an id made without a
 *      channel and migrated to one gets its events there (libfabric's verbs provider needs
 *      all three);
 *   2. a connect to a port nobody listens on (the server's NIC is there): REJECTED, status 8
 *      (its QP made by rdma_create_qp_ex: with a PD; an extension not offered EOPNOTSUPP);
 *   3. a REQ with private data, rejected with private data: the server's CONNECT_REQUEST
 *      names the listener, carries the client's bytes and the peer's address, and the
 *      client's REJECTED has status 28 (consumer defined) and the server's bytes;
 *   4. a REQ accepted with private data (the client's source port in it, which the server's
 *      rdma_get_peer_addr must name too): the client's ESTABLISHED carries the server's REP
 *      bytes; its QP was made with no PD and no CQs (the id's PD, CQs made for it with the
 *      id as their context), and a SEND reaches the server's receive; the client
 *      disconnects and both sides see DISCONNECTED; a second rdma_disconnect on the closed
 *      connection is 0;
 *   5. ids without a QP, as UCX's rdmacm and kernel-style programs use them: each side makes
 *      its QP with ibv_create_qp and brings it up with rdma_init_qp_attr (the server before
 *      rdma_accept, naming its qp_num); the client gets CONNECT_RESPONSE with the REP's bytes,
 *      not ESTABLISHED, and sends the RTU with rdma_establish; a SEND crosses, and after the
 *      disconnect the QPs are still the programs' (RTS: the CM leaves them alone);
 *  5b. a UD id's SIDR request: the server's CONNECT_REQUEST names the client's bound port
 *      (rdma_get_peer_addr), as the kernel's rdma_cm header carries it; refused, the client
 *      gets UNREACHABLE with the SIDR status (2);
 *   6. a listener closed mid-handshake: the server destroys its listening id, then the
 *      request's id unanswered: the client's REJECTED has status 28, as the kernel's CM
 *      rejects for an id destroyed with a request pending; a second REQ finds nobody
 *      listening (REJECTED, status 8); the client's last REQ, to port + 2, tells the server
 *      it may go. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "rdmacm: %s:%d: %s (errno %d)\n", __FILE__, __LINE__, \
                    #cond, errno);                                               \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static struct sockaddr_in addr_of(const char *ip, int port)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    CHECK(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
    return a;
}

/* The next event on ch, which must be `want` (waits up to 10 s in poll(2)). */
static struct rdma_cm_event *next_event(struct rdma_event_channel *ch,
                                        enum rdma_cm_event_type want)
{
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    struct rdma_cm_event *ev;
    if (poll(&p, 1, 10000) != 1) {
        fprintf(stderr, "rdmacm: no %s within 10 s\n", rdma_event_str(want));
        exit(1);
    }
    CHECK(rdma_get_cm_event(ch, &ev) == 0);
    if (ev->event != want) {
        fprintf(stderr, "rdmacm: got %s (status %d), want %s\n", rdma_event_str(ev->event),
                ev->status, rdma_event_str(want));
        exit(1);
    }
    return ev;
}

static void wait_for(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
    CHECK(rdma_ack_cm_event(next_event(ch, want)) == 0);
}

/* A client id on ch, resolved to ip:port. */
static struct rdma_cm_id *resolved(struct rdma_event_channel *ch, const char *ip, int port)
{
    struct rdma_cm_id *id;
    struct sockaddr_in dst = addr_of(ip, port);
    CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
    wait_for(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(id->verbs != NULL);
    CHECK(id->pd != NULL);
    CHECK(rdma_get_dst_port(id) == htons(port));
    CHECK(rdma_get_src_port(id) != 0);
    CHECK(rdma_resolve_route(id, 2000) == 0);
    wait_for(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    return id;
}

static void make_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.qp_type = IBV_QPT_RC;
    attr.send_cq = attr.recv_cq = cq;
    attr.sq_sig_all = 1;
    CHECK(rdma_create_qp(id, pd, &attr) == 0);
    CHECK(id->qp != NULL && id->qp->state == IBV_QPS_INIT);
}

static void connect_with(struct rdma_cm_id *id, const char *private_data)
{
    struct rdma_conn_param p;
    memset(&p, 0, sizeof p);
    p.private_data = private_data;
    p.private_data_len = strlen(private_data);
    p.responder_resources = p.initiator_depth = 1;
    p.retry_count = p.rnr_retry_count = 7;
    CHECK(rdma_connect(id, &p) == 0);
}

/* Polls cq for one successful completion (up to ~5 s). */
static struct ibv_wc one_completion(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    for (int i = 0; i < 500000; i++) {
        int n = ibv_poll_cq(cq, 1, &wc);
        CHECK(n >= 0);
        if (n == 1) {
            CHECK(wc.status == IBV_WC_SUCCESS);
            return wc;
        }
        struct timespec t = { 0, 10000 };
        nanosleep(&t, NULL);
    }
    CHECK(!"a completion");
    return wc;
}

/* ibv_create_qp's QP (RESET), as a program that keeps its QPs off the id makes it. */
static struct ibv_qp *own_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
    struct ibv_qp_init_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.cap.max_send_wr = attr.cap.max_recv_wr = 4;
    attr.cap.max_send_sge = attr.cap.max_recv_sge = 1;
    attr.qp_type = IBV_QPT_RC;
    attr.send_cq = attr.recv_cq = cq;
    attr.sq_sig_all = 1;
    struct ibv_qp *qp = ibv_create_qp(pd, &attr);
    CHECK(qp != NULL && qp->state == IBV_QPS_RESET);
    return qp;
}

/* Moves qp to `state` with what rdma_init_qp_attr gives for id. */
static void move_qp(struct rdma_cm_id *id, struct ibv_qp *qp, enum ibv_qp_state state)
{
    struct ibv_qp_attr attr;
    int mask = 0;
    memset(&attr, 0, sizeof attr);
    attr.qp_state = state;
    CHECK(rdma_init_qp_attr(id, &attr, &mask) == 0);
    CHECK(attr.qp_state == state && (mask & IBV_QP_STATE));
    CHECK(ibv_modify_qp(qp, &attr, mask) == 0);
    CHECK(qp->state == state);
}

/* After a disconnect: the program's own QP is still in RTS (the CM leaves it alone); its
 * objects go in verbs order. */
static void free_own(struct ibv_qp *qp, struct ibv_mr *mr, struct ibv_cq *cq, struct ibv_pd *pd)
{
    CHECK(qp->state == IBV_QPS_RTS);
    CHECK(ibv_destroy_qp(qp) == 0);
    CHECK(ibv_dereg_mr(mr) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0);
}

/* The client's port, which its private data names after `tag`: the request's peer address
 * (rdma_get_peer_addr) must carry it too, as the kernel's CM reports the REQ's or SIDR
 * request's source port. */
static void check_named_port(struct rdma_cm_event *ev, const void *private_data, const char *tag)
{
    size_t n = strlen(tag);
    CHECK(memcmp(private_data, tag, n) == 0);
    unsigned named = (unsigned)atoi((const char *)private_data + n);
    struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(ev->id);
    CHECK(named != 0 && ntohs(peer->sin_port) == named);
}

static void server(const char *ip, int port)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_event *ev;
    struct rdma_cm_id *listen_id, *child;
    struct sockaddr_in me = addr_of(ip, port);
    CHECK(ch != NULL);
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
    CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN);
    CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&me) == 0);
    CHECK(rdma_listen(listen_id, 4) == 0);
    CHECK(rdma_get_src_port(listen_id) == htons(port));

    /* 3: rejected with private data. */
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(ev->listen_id == listen_id);
    CHECK(ev->param.conn.private_data_len >= 5);
    CHECK(memcmp(ev->param.conn.private_data, "hello", 5) == 0);
    child = ev->id;
    CHECK(child != listen_id && child->verbs != NULL);
    CHECK(rdma_get_peer_addr(child)->sa_family == AF_INET);
    CHECK(rdma_ack_cm_event(ev) == 0);
    CHECK(rdma_reject(child, "nope", 4) == 0);
    CHECK(rdma_destroy_id(child) == 0);

    /* 4: accepted; a SEND comes; the client disconnects. */
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    check_named_port(ev, ev->param.conn.private_data, "again ");
    child = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0);
    struct ibv_pd *pd = ibv_alloc_pd(child->verbs);
    struct ibv_cq *cq = ibv_create_cq(child->verbs, 8, NULL, NULL, 0);
    CHECK(pd != NULL && cq != NULL);
    make_qp(child, pd, cq);
    char buf[16] = { 0 };
    struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL);
    struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = sizeof buf, .lkey = mr->lkey };
    struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &sge, .num_sge = 1 }, *bad;
    CHECK(ibv_post_recv(child->qp, &rwr, &bad) == 0);
    struct rdma_conn_param p;
    memset(&p, 0, sizeof p);
    p.private_data = "yes";
    p.private_data_len = 3;
    p.responder_resources = p.initiator_depth = 1;
    CHECK(rdma_accept(child, &p) == 0);
    CHECK(child->qp->state == IBV_QPS_RTS);
    wait_for(ch, RDMA_CM_EVENT_ESTABLISHED);
    struct ibv_wc wc = one_completion(cq);
    CHECK(wc.wr_id == 7 && wc.opcode == IBV_WC_RECV && wc.byte_len == 5);
    CHECK(memcmp(buf, "ping", 5) == 0);
    wait_for(ch, RDMA_CM_EVENT_DISCONNECTED);
    CHECK(rdma_disconnect(child) == 0);
    rdma_destroy_qp(child);
    CHECK(ibv_dereg_mr(mr) == 0);
    CHECK(ibv_destroy_cq(cq) == 0);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(rdma_destroy_id(child) == 0);

    /* 5: an id without a QP; the program's own QP, brought up before the REP. */
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(memcmp(ev->param.conn.private_data, "own", 3) == 0);
    child = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0);
    struct ibv_qp_attr early;
    int early_mask = 0;
    memset(&early, 0, sizeof early);
    early.qp_state = IBV_QPS_RTR;
    CHECK(rdma_init_qp_attr(listen_id, &early, &early_mask) == -1 && errno == EINVAL);
    pd = ibv_alloc_pd(child->verbs);
    cq = ibv_create_cq(child->verbs, 8, NULL, NULL, 0);
    CHECK(pd != NULL && cq != NULL);
    struct ibv_qp *qp = own_qp(pd, cq);
    move_qp(child, qp, IBV_QPS_INIT);
    move_qp(child, qp, IBV_QPS_RTR);
    move_qp(child, qp, IBV_QPS_RTS);
    memset(buf, 0, sizeof buf);
    mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL);
    sge.lkey = mr->lkey;
    rwr.wr_id = 8;
    CHECK(ibv_post_recv(qp, &rwr, &bad) == 0);
    memset(&p, 0, sizeof p);
    p.private_data = "own-rep";
    p.private_data_len = 7;
    p.responder_resources = p.initiator_depth = 1;
    p.qp_num = qp->qp_num;
    CHECK(rdma_accept(child, &p) == 0);
    CHECK(child->qp == NULL);
    wait_for(ch, RDMA_CM_EVENT_ESTABLISHED);
    wc = one_completion(cq);
    CHECK(wc.wr_id == 8 && wc.opcode == IBV_WC_RECV && wc.byte_len == 4);
    CHECK(memcmp(buf, "mine", 4) == 0);
    wait_for(ch, RDMA_CM_EVENT_DISCONNECTED);
    free_own(qp, mr, cq, pd);
    CHECK(rdma_destroy_id(child) == 0);

    /* 5b: a UD id's SIDR request names the client's port, as its CONNECT_REQUEST says. */
    struct rdma_cm_id *ud_listen;
    struct sockaddr_in ud_me = addr_of(ip, port + 3);
    CHECK(rdma_create_id(ch, &ud_listen, NULL, RDMA_PS_UDP) == 0);
    CHECK(rdma_bind_addr(ud_listen, (struct sockaddr *)&ud_me) == 0);
    CHECK(rdma_listen(ud_listen, 1) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(ev->listen_id == ud_listen);
    check_named_port(ev, ev->param.ud.private_data, "ud ");
    child = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0);
    CHECK(rdma_reject(child, NULL, 0) == 0);
    CHECK(rdma_destroy_id(child) == 0);
    CHECK(rdma_destroy_id(ud_listen) == 0);

    /* 6: the listener closes with a request pending, which goes unanswered. */
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    child = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0);
    CHECK(rdma_destroy_id(listen_id) == 0);
    CHECK(rdma_destroy_id(child) == 0);
    /* The client says it is done on port + 2, so that this NIC outlives its last REQ. */
    me = addr_of(ip, port + 2);
    CHECK(rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_bind_addr(listen_id, (struct sockaddr *)&me) == 0);
    CHECK(rdma_listen(listen_id, 1) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    child = ev->id;
    CHECK(rdma_ack_cm_event(ev) == 0);
    CHECK(rdma_reject(child, "bye", 3) == 0);
    CHECK(rdma_destroy_id(child) == 0);
    CHECK(rdma_destroy_id(listen_id) == 0);
    rdma_destroy_event_channel(ch);
    printf("rdmacm server: ok\n");
}

/* A connect to ip:port that must end REJECTED with `status`. */
static void refused(struct rdma_event_channel *ch, const char *ip, int port, int status)
{
    struct rdma_cm_id *id = resolved(ch, ip, port);
    make_qp(id, NULL, NULL);
    connect_with(id, "late");
    struct rdma_cm_event *ev = next_event(ch, RDMA_CM_EVENT_REJECTED);
    CHECK(ev->status == status);
    CHECK(rdma_ack_cm_event(ev) == 0);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);
}

static void client(const char *ip, int port)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_event *ev;
    struct rdma_cm_id *id;
    CHECK(ch != NULL);

    /* 1b: what libfabric's verbs provider asks of librdmacm, as rdma-core answers it: an
     * rdma_getaddrinfo with neither node nor service gives the hints' addresses back; a
     * loopback address other than the NIC's binds as the wildcard, leaving the id without a
     * device; an id made without a channel and migrated to one queues its events there. */
    struct sockaddr_in server_addr = addr_of(ip, port);
    struct rdma_addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_port_space = RDMA_PS_TCP;
    hints.ai_dst_addr = (struct sockaddr *)&server_addr;
    hints.ai_dst_len = sizeof server_addr;
    CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0);
    CHECK(res->ai_dst_addr != NULL && res->ai_src_addr == NULL);
    CHECK(memcmp(res->ai_dst_addr, &server_addr, sizeof server_addr) == 0);
    rdma_freeaddrinfo(res);
    hints.ai_dst_addr = NULL;
    hints.ai_dst_len = 0;
    CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) != 0);
    CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
    if (strcmp(ip, "127.0.0.1") != 0) {
        struct sockaddr_in lo = addr_of("127.0.0.1", 0);
        CHECK(rdma_bind_addr(id, (struct sockaddr *)&lo) == 0);
        CHECK(id->verbs == NULL);
    }
    CHECK(rdma_migrate_id(id, ch) == 0);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&server_addr, 2000) == 0);
    wait_for(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(id->verbs != NULL);
    CHECK(rdma_destroy_id(id) == 0);

    /* 2: nobody listens on port + 1 (the QP made by rdma_create_qp_ex, with its PD). */
    id = resolved(ch, ip, port + 1);
    struct ibv_qp_init_attr_ex ex;
    memset(&ex, 0, sizeof ex);
    ex.cap.max_send_wr = ex.cap.max_recv_wr = 2;
    ex.cap.max_send_sge = ex.cap.max_recv_sge = 1;
    ex.qp_type = IBV_QPT_RC;
    ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    ex.pd = id->pd;
    CHECK(rdma_create_qp_ex(id, &ex) == -1 && errno == EOPNOTSUPP);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    CHECK(rdma_create_qp_ex(id, &ex) == 0);
    CHECK(id->qp != NULL && id->qp->pd == id->pd && ex.send_cq == id->send_cq);
    connect_with(id, "anyone");
    ev = next_event(ch, RDMA_CM_EVENT_REJECTED);
    CHECK(ev->status == 8);
    CHECK(rdma_ack_cm_event(ev) == 0);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);

    /* 3: the server refuses, saying why. */
    id = resolved(ch, ip, port);
    make_qp(id, NULL, NULL);
    connect_with(id, "hello");
    ev = next_event(ch, RDMA_CM_EVENT_REJECTED);
    CHECK(ev->status == 28);
    CHECK(ev->param.conn.private_data_len >= 4);
    CHECK(memcmp(ev->param.conn.private_data, "nope", 4) == 0);
    CHECK(rdma_ack_cm_event(ev) == 0);
    rdma_destroy_qp(id);
    CHECK(rdma_destroy_id(id) == 0);

    /* 4: accepted; the QP has the id's PD and CQs made for it. */
    id = resolved(ch, ip, port);
    make_qp(id, NULL, NULL);
    CHECK(id->qp->pd == id->pd);
    CHECK(id->send_cq != NULL && id->recv_cq != NULL && id->send_cq_channel != NULL);
    CHECK(id->send_cq->cq_context == id);
    /* The id's source port travels in the data too: the server's view of it must agree. */
    char again[16];
    snprintf(again, sizeof again, "again %u", ntohs(rdma_get_src_port(id)));
    connect_with(id, again);
    ev = next_event(ch, RDMA_CM_EVENT_ESTABLISHED);
    CHECK(ev->param.conn.private_data_len >= 3);
    CHECK(memcmp(ev->param.conn.private_data, "yes", 3) == 0);
    CHECK(rdma_ack_cm_event(ev) == 0);
    char msg[5] = "ping";
    struct ibv_mr *mr = ibv_reg_mr(id->pd, msg, sizeof msg, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL);
    struct ibv_sge sge = { .addr = (uintptr_t)msg, .length = sizeof msg, .lkey = mr->lkey };
    struct ibv_send_wr wr = { .wr_id = 9, .sg_list = &sge, .num_sge = 1,
                              .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED },
                       *bad;
    CHECK(ibv_post_send(id->qp, &wr, &bad) == 0);
    CHECK(one_completion(id->send_cq).wr_id == 9);
    CHECK(rdma_disconnect(id) == 0);
    wait_for(ch, RDMA_CM_EVENT_DISCONNECTED);
    CHECK(ibv_dereg_mr(mr) == 0);
    rdma_destroy_qp(id);
    CHECK(id->send_cq == NULL && id->qp == NULL);
    CHECK(rdma_destroy_id(id) == 0);

    /* 5: no QP on the id: CONNECT_RESPONSE, the program's own moves, rdma_establish. */
    id = resolved(ch, ip, port);
    CHECK(rdma_establish(id) == -1 && errno == EINVAL);
    struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
    struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
    CHECK(pd != NULL && cq != NULL);
    struct ibv_qp *qp = own_qp(pd, cq);
    move_qp(id, qp, IBV_QPS_INIT);
    struct rdma_conn_param p;
    memset(&p, 0, sizeof p);
    p.private_data = "own";
    p.private_data_len = 3;
    p.responder_resources = p.initiator_depth = 1;
    p.retry_count = p.rnr_retry_count = 7;
    p.qp_num = qp->qp_num;
    CHECK(rdma_connect(id, &p) == 0);
    ev = next_event(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);
    CHECK(ev->param.conn.private_data_len >= 7);
    CHECK(memcmp(ev->param.conn.private_data, "own-rep", 7) == 0);
    CHECK(ev->param.conn.responder_resources == 1 && ev->param.conn.initiator_depth == 1);
    CHECK(rdma_ack_cm_event(ev) == 0);
    CHECK(qp->state == IBV_QPS_INIT);
    move_qp(id, qp, IBV_QPS_RTR);
    move_qp(id, qp, IBV_QPS_RTS);
    CHECK(rdma_establish(id) == 0);
    char mine[4] = { 'm', 'i', 'n', 'e' };
    mr = ibv_reg_mr(pd, mine, sizeof mine, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr != NULL);
    sge.addr = (uintptr_t)mine;
    sge.length = sizeof mine;
    sge.lkey = mr->lkey;
    wr.wr_id = 10;
    CHECK(ibv_post_send(qp, &wr, &bad) == 0);
    CHECK(one_completion(cq).wr_id == 10);
    CHECK(rdma_disconnect(id) == 0);
    wait_for(ch, RDMA_CM_EVENT_DISCONNECTED);
    free_own(qp, mr, cq, pd);
    CHECK(rdma_destroy_id(id) == 0);

    /* 5b: a SIDR request, its id's port in the data; the server refuses it (status 2). */
    struct rdma_cm_id *ud;
    struct sockaddr_in ud_dst = addr_of(ip, port + 3);
    CHECK(rdma_create_id(ch, &ud, NULL, RDMA_PS_UDP) == 0);
    CHECK(rdma_resolve_addr(ud, NULL, (struct sockaddr *)&ud_dst, 2000) == 0);
    wait_for(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(rdma_resolve_route(ud, 2000) == 0);
    wait_for(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
    char ud_data[16];
    snprintf(ud_data, sizeof ud_data, "ud %u", ntohs(rdma_get_src_port(ud)));
    memset(&p, 0, sizeof p);
    p.private_data = ud_data;
    p.private_data_len = strlen(ud_data);
    /* The server may not listen yet: retry until it answers. */
    for (int tries = 0;; tries++) {
        CHECK(rdma_connect(ud, &p) == 0);
        ev = next_event(ch, RDMA_CM_EVENT_UNREACHABLE);
        int status = ev->status;
        CHECK(rdma_ack_cm_event(ev) == 0);
        if (status == 2)
            break;
        CHECK(tries < 50);
        struct timespec t = { 0, 100000000 };
        nanosleep(&t, NULL);
    }
    CHECK(rdma_destroy_id(ud) == 0);

    /* 6: the listener closes mid-handshake (28), then nobody listens (8). */
    refused(ch, ip, port, 28);
    refused(ch, ip, port, 8);
    /* Done: the server's last listener refuses this one and closes. */
    refused(ch, ip, port + 2, 28);
    rdma_destroy_event_channel(ch);
    printf("rdmacm client: ok\n");
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: rdmacm server|client ADDR PORT\n");
        return 2;
    }
    if (strcmp(argv[1], "server") == 0)
        server(argv[2], atoi(argv[3]));
    else
        client(argv[2], atoi(argv[3]));
    return 0;
}
