/* The drop-in's data path from C (issue 23, stage 1), built against rdma-core's own
 * <infiniband/verbs.h> so that ibv_reg_mr's inline choice, ibv_post_*, ibv_poll_cq and
 * ibv_req_notify_cq run through the context's ops table as in any program. One process, one
 * soft NIC on FERROCE_ADDR (127.0.0.81 from scripts/test-dropin.sh): its RC queue pairs are
 * connected to each other through that address. Checks, with what rxe's provider answers:
 *   - RESET -> INIT -> RTR -> RTS attribute by attribute, a missing attribute refused (EINVAL),
 *     ibv_query_qp's state and max_inline_data;
 *   - SEND with immediate (imm_data big-endian in the wc), RDMA WRITE landing in place,
 *     RDMA READ, an inline send;
 *   - a completion channel: ibv_req_notify_cq, poll(2) on its fd, ibv_get_cq_event with the
 *     cq_context, ibv_ack_cq_events;
 *   - posting past a queue's depth: ENOMEM with bad_wr on the first refused;
 *   - a scatter entry with a wrong lkey: IBV_WC_LOC_PROT_ERR;
 *   - an unknown rkey: IBV_WC_REM_ACCESS_ERR;
 *   - an SRQ armed with ibv_modify_srq: IBV_EVENT_SRQ_LIMIT_REACHED on the async fd;
 *   - destroying a CQ (or an SRQ) a QP uses, or a PD with regions: EBUSY;
 *   - ibv_reg_mr_iova with an IOVA of 0; closing a context with objects left in it. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "stage1: %s:%d: %s (errno %d)\n", __FILE__, __LINE__, \
                    #cond, errno);                                               \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

/* Waits up to ~5 s for one completion on cq. */
static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
    struct ibv_wc wc;
    for (long i = 0; i < 5000000; i++) {
        int n = ibv_poll_cq(cq, 1, &wc);
        CHECK(n >= 0);
        if (n == 1)
            return wc;
        if (i > 1000) {
            struct timespec ts = { 0, 1000 };
            nanosleep(&ts, NULL);
        }
    }
    CHECK(!"a completion came");
    return wc;
}

static struct ibv_qp *rc_qp(struct ibv_cq *cq, uint32_t send_wr, uint32_t recv_wr)
{
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = { .max_send_wr = send_wr, .max_recv_wr = recv_wr, .max_send_sge = 2,
                 .max_recv_sge = 2, .max_inline_data = 64 },
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    CHECK(qp && qp->state == IBV_QPS_RESET);
    struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
                             .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
    /* RESET -> INIT without the port: refused, as ib_modify_qp_is_ok refuses it */
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_ACCESS_FLAGS) == EINVAL);
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                    IBV_QP_ACCESS_FLAGS) == 0);
    return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest)
{
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest, .rq_psn = 7,
        .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
        .ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .hop_limit = 1 } },
    };
    int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    CHECK(ibv_modify_qp(qp, &a, rtr & ~IBV_QP_RQ_PSN) == EINVAL);
    CHECK(ibv_modify_qp(qp, &a, rtr) == 0);
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 7;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                    IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

int main(void)
{
    struct ibv_device **list = ibv_get_device_list(NULL);
    CHECK(list && list[0]);
    ctx = ibv_open_device(list[0]);
    CHECK(ctx);
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
    pd = ibv_alloc_pd(ctx);
    CHECK(pd);

    static char buf_a[8192] __attribute__((aligned(4096)));
    static char buf_b[8192] __attribute__((aligned(4096)));
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *mr_a = ibv_reg_mr(pd, buf_a, sizeof(buf_a), access);
    struct ibv_mr *mr_b = ibv_reg_mr(pd, buf_b, sizeof(buf_b), access);
    CHECK(mr_a && mr_b && mr_a->addr == buf_a && mr_a->length == sizeof(buf_a));
    CHECK(ibv_reg_mr(pd, buf_a, sizeof(buf_a), IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EINVAL);

    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    CHECK(ch && ch->fd >= 0);
    int tag;
    struct ibv_cq *cq_a = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    struct ibv_cq *cq_b = ibv_create_cq(ctx, 64, &tag, ch, 0);
    CHECK(cq_a && cq_b && cq_b->cqe >= 64 && cq_b->channel == ch);
    CHECK(ibv_resize_cq(cq_a, 128) == 0 && cq_a->cqe >= 128);

    struct ibv_qp *a = rc_qp(cq_a, 16, 16), *b = rc_qp(cq_b, 16, 16);
    connect_qp(a, b->qp_num);
    connect_qp(b, a->qp_num);
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qi;
    CHECK(ibv_query_qp(a, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0);
    CHECK(qa.qp_state == IBV_QPS_RTS && qi.cap.max_inline_data >= 64 && qi.send_cq == cq_a);
    CHECK(qa.dest_qp_num == b->qp_num && qa.path_mtu == IBV_MTU_1024);

    /* SEND with immediate, B's channel armed */
    CHECK(ibv_req_notify_cq(cq_b, 0) == 0);
    struct ibv_sge rs = { (uintptr_t)buf_b, 4096, mr_b->lkey };
    struct ibv_recv_wr rwr = { .wr_id = 21, .sg_list = &rs, .num_sge = 1 }, *bad_r;
    CHECK(ibv_post_recv(b, &rwr, &bad_r) == 0);
    memcpy(buf_a, "hello, ferroce", 15);
    struct ibv_sge ss = { (uintptr_t)buf_a, 15, mr_a->lkey };
    struct ibv_send_wr swr = { .wr_id = 11, .sg_list = &ss, .num_sge = 1,
                               .opcode = IBV_WR_SEND_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
                               .imm_data = htonl(0x01020304) }, *bad_s;
    CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    struct pollfd p = { .fd = ch->fd, .events = POLLIN };
    CHECK(poll(&p, 1, 5000) == 1);
    struct ibv_cq *ev_cq;
    void *ev_ctx;
    CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq_b && ev_ctx == &tag);
    ibv_ack_cq_events(cq_b, 1);
    struct ibv_wc wc = wait_wc(cq_b);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.wr_id == 21);
    CHECK(wc.byte_len == 15 && (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 0x01020304);
    CHECK(wc.qp_num == b->qp_num && strcmp(buf_b, "hello, ferroce") == 0);
    wc = wait_wc(cq_a);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND && wc.wr_id == 11);

    /* RDMA WRITE lands in B's memory in place; an inline one too; then an RDMA READ */
    memset(buf_a, 'w', 100);
    swr = (struct ibv_send_wr){ .wr_id = 12, .sg_list = &ss, .num_sge = 1,
                                .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                                .wr.rdma = { (uintptr_t)buf_b + 1000, mr_b->rkey } };
    ss.length = 100;
    CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    wc = wait_wc(cq_a);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_WRITE);
    CHECK(buf_b[1000] == 'w' && buf_b[1099] == 'w' && buf_b[1100] == 0);
    char inl[8] = "inline!";
    struct ibv_sge is = { (uintptr_t)inl, 8, 0 };
    swr.sg_list = &is;
    swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    swr.wr.rdma.remote_addr = (uintptr_t)buf_b + 2000;
    CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    inl[0] = 'X'; /* the bytes were copied at post time */
    wc = wait_wc(cq_a);
    CHECK(wc.status == IBV_WC_SUCCESS && strcmp(buf_b + 2000, "inline!") == 0);
    strcpy(buf_b + 3000, "read me");
    swr = (struct ibv_send_wr){ .wr_id = 13, .sg_list = &ss, .num_sge = 1,
                                .opcode = IBV_WR_RDMA_READ, .send_flags = IBV_SEND_SIGNALED,
                                .wr.rdma = { (uintptr_t)buf_b + 3000, mr_b->rkey } };
    ss.length = 8;
    ss.addr = (uintptr_t)buf_a + 4000;
    CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    wc = wait_wc(cq_a);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 8);
    CHECK(strcmp(buf_a + 4000, "read me") == 0);

    /* a CQ in use is not destroyed */
    CHECK(ibv_destroy_cq(cq_b) == EBUSY);

    /* past the receive queue's depth: ENOMEM, bad_wr on the first refused */
    struct ibv_qp *c = rc_qp(cq_a, 2, 2);
    struct ibv_recv_wr r3[3];
    for (int i = 0; i < 3; i++)
        r3[i] = (struct ibv_recv_wr){ .wr_id = 30 + i, .sg_list = &rs, .num_sge = 1,
                                      .next = i < 2 ? &r3[i + 1] : NULL };
    bad_r = NULL;
    CHECK(ibv_post_recv(c, r3, &bad_r) == ENOMEM && bad_r == &r3[2]);
    /* too many scatter entries: EINVAL on that request */
    struct ibv_sge many[3] = { rs, rs, rs };
    struct ibv_recv_wr r4 = { .wr_id = 40, .sg_list = many, .num_sge = 3 };
    bad_r = NULL;
    CHECK(ibv_post_recv(b, &r4, &bad_r) == EINVAL && bad_r == &r4);
    CHECK(ibv_destroy_qp(c) == 0);
    CHECK(ibv_destroy_qp(c) == EINVAL);

    /* an unknown rkey: the responder refuses it */
    swr = (struct ibv_send_wr){ .wr_id = 14, .sg_list = &ss, .num_sge = 1,
                                .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                                .wr.rdma = { (uintptr_t)buf_b, mr_b->rkey ^ 0x5a5a00 } };
    CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    wc = wait_wc(cq_a);
    CHECK(wc.wr_id == 14 && wc.status == IBV_WC_REM_ACCESS_ERR);
    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);

    /* a wrong lkey: a local protection error */
    a = rc_qp(cq_a, 16, 16);
    b = rc_qp(cq_b, 16, 16);
    connect_qp(a, b->qp_num);
    connect_qp(b, a->qp_num);
    struct ibv_sge bad_sge = { (uintptr_t)buf_a, 8, mr_a->lkey ^ 0x5a5a00 };
    swr = (struct ibv_send_wr){ .wr_id = 15, .sg_list = &bad_sge, .num_sge = 1,
                                .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
                                .wr.rdma = { (uintptr_t)buf_b, mr_b->rkey } };
    CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    wc = wait_wc(cq_a);
    CHECK(wc.wr_id == 15 && wc.status == IBV_WC_LOC_PROT_ERR);
    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);

    /* an SRQ armed at 2: three of its four receives consumed, the async fd says so */
    struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
    struct ibv_srq *srq = ibv_create_srq(pd, &si);
    CHECK(srq && si.attr.max_wr >= 16);
    struct ibv_recv_wr sr[4];
    for (int i = 0; i < 4; i++)
        sr[i] = (struct ibv_recv_wr){ .wr_id = 50 + i, .sg_list = &rs, .num_sge = 1,
                                      .next = i < 3 ? &sr[i + 1] : NULL };
    CHECK(ibv_post_srq_recv(srq, sr, &bad_r) == 0);
    struct ibv_srq_attr sa = { .srq_limit = 2 };
    CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0);
    CHECK(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 2 && sa.max_wr >= 16);
    a = rc_qp(cq_a, 16, 16);
    struct ibv_qp_init_attr sinit = {
        .send_cq = cq_a, .recv_cq = cq_a, .srq = srq,
        .cap = { .max_send_wr = 4, .max_send_sge = 1 }, .qp_type = IBV_QPT_RC,
    };
    b = ibv_create_qp(pd, &sinit);
    CHECK(b);
    struct ibv_qp_attr init_b = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
    CHECK(ibv_modify_qp(b, &init_b, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                        IBV_QP_ACCESS_FLAGS) == 0);
    connect_qp(a, b->qp_num);
    connect_qp(b, a->qp_num);
    CHECK(ibv_destroy_srq(srq) == EBUSY);
    ss.addr = (uintptr_t)buf_a;
    ss.length = 16;
    for (int i = 0; i < 3; i++) {
        swr = (struct ibv_send_wr){ .wr_id = 60 + i, .sg_list = &ss, .num_sge = 1,
                                    .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED };
        CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
    }
    int sends = 0, recvs = 0;
    while (sends + recvs < 6) {
        wc = wait_wc(cq_a);
        CHECK(wc.status == IBV_WC_SUCCESS);
        if (wc.opcode == IBV_WC_RECV) {
            CHECK(wc.qp_num == b->qp_num && wc.wr_id >= 50 && wc.wr_id < 54);
            recvs++;
        } else {
            sends++;
        }
    }
    p = (struct pollfd){ .fd = ctx->async_fd, .events = POLLIN };
    CHECK(poll(&p, 1, 5000) == 1);
    struct ibv_async_event ae;
    CHECK(ibv_get_async_event(ctx, &ae) == 0);
    CHECK(ae.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ae.element.srq == srq);
    ibv_ack_async_event(&ae);
    CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
    CHECK(ibv_destroy_srq(srq) == 0);

    /* a region addressed from IOVA 0 */
    struct ibv_mr *mr_z = ibv_reg_mr_iova(pd, buf_a, 4096, 0, IBV_ACCESS_LOCAL_WRITE);
    CHECK(mr_z && mr_z->lkey != mr_a->lkey);
    CHECK(ibv_dereg_mr(mr_z) == 0);

    CHECK(ibv_destroy_cq(cq_a) == 0 && ibv_destroy_cq(cq_b) == 0);
    CHECK(ibv_destroy_cq(cq_b) == EINVAL);
    CHECK(ibv_destroy_comp_channel(ch) == 0);
    CHECK(ibv_dealloc_pd(pd) == EBUSY); /* its regions are live */
    CHECK(ibv_dereg_mr(mr_a) == 0 && ibv_dereg_mr(mr_b) == 0);
    CHECK(ibv_dereg_mr(mr_a) == EINVAL);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_close_device(ctx) == 0);

    /* a context closed with its objects still in it frees them */
    ctx = ibv_open_device(list[0]);
    CHECK(ctx);
    pd = ibv_alloc_pd(ctx);
    ch = ibv_create_comp_channel(ctx);
    cq_a = ibv_create_cq(ctx, 8, NULL, ch, 0);
    CHECK(pd && ch && cq_a && ibv_reg_mr(pd, buf_a, 4096, IBV_ACCESS_LOCAL_WRITE));
    CHECK(rc_qp(cq_a, 4, 4));
    CHECK(ibv_close_device(ctx) == 0);
    ibv_free_device_list(list);
    printf("stage1: all passed\n");
    return 0;
}
