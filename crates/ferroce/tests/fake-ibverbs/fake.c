/* A stand-in for libibverbs.so.1 with one device, "fake0", for tests on hosts without RDMA.
 *
 * It exports the symbols ferroce's loader asks for, at their rdma-core versions (see
 * libibverbs.map), and lays out the objects ferroce reads (the context's ops table, qp_num,
 * lkey, rkey, the channel's fd, cqe) at rdma-core's x86_64 offsets. Posting queues one
 * completion per signaled request and checks the request's ABI: the gather list and its
 * length, the immediate, and the rdma union's remote address and key, so a wrong layout in
 * ferroce shows as a refused post or a wrong completion. No RDMA happens.
 *
 * Some request ids, MAGIC plus a low word, raise an asynchronous event instead of being
 * posted, so tests can drive ferroce's event thread: 0xdead QP_FATAL on the QP, 0xc0e0 CQ_ERR
 * on its send CQ, 0xfa7a1 DEVICE_FATAL, 0x91d0 GID_CHANGE with GID 1 taken out of the table,
 * 0x91d1 GID_CHANGE with it back; 0xbad is refused with ENOMEM (bad_wr). MAGIC keeps them
 * out of the way of ordinary ids (a benchmark posting ids 0, 1, 2, …).
 *
 * FAKE_IBVERBS_ENOSYS=1 makes ibv_get_device_list fail as it does on a kernel without RDMA.
 * Built by tests/verbs_fake.rs with the system C compiler. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct send_wr {
    uint64_t wr_id; struct send_wr *next; struct sge *sg_list; int num_sge;
    unsigned opcode; unsigned send_flags; uint32_t imm_data; uint64_t wr[4]; uint64_t tail[7];
};
struct recv_wr { uint64_t wr_id; struct recv_wr *next; struct sge *sg_list; int num_sge; };
struct wc {
    uint64_t wr_id; unsigned status; unsigned opcode; uint32_t vendor_err; uint32_t byte_len;
    uint32_t imm_data; uint32_t qp_num; uint32_t src_qp; unsigned wc_flags;
    uint16_t pkey_index; uint16_t slid; uint8_t sl; uint8_t dlid_path_bits;
};
struct context { void *device; void *ops[32]; int cmd_fd; int async_fd; int ncv; char rest[256]; };
struct channel { struct context *context; int fd; int refcnt; };
#define RING 4096
struct cq {
    struct context *context; struct channel *channel; void *cq_context; uint32_t handle; int cqe;
    struct wc ring[RING]; unsigned head, tail;
};
struct qp {
    struct context *context; void *qp_context; void *pd; struct cq *send_cq; struct cq *recv_cq;
    void *srq; uint32_t handle; uint32_t qp_num;
};
struct mr { struct context *context; void *pd; void *addr; size_t length; uint32_t handle, lkey, rkey; };
struct qp_cap { uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data; };
struct qp_init_attr {
    void *qp_context; struct cq *send_cq; struct cq *recv_cq; void *srq; struct qp_cap cap;
    unsigned qp_type; int sq_sig_all;
};
struct gid_entry { uint8_t gid[16]; uint32_t gid_index, port_num, gid_type, ndev_ifindex; };
struct async_event { void *element; unsigned event_type; };

/* The one address a test posts RDMA to, and its key: anything else is refused. */
#define REMOTE_ADDR 0x10000ull
#define REMOTE_KEY 0x1234u

#define MAGIC 0xfa4e000000000000ull

static int device_tag;
static struct context *the_context;
static int gid1_removed;
#define EVENTS 64
static struct async_event events[EVENTS];
static unsigned ev_head, ev_tail;

static void raise_event(unsigned type, void *element)
{
    uint64_t one = 1;
    events[ev_tail++ % EVENTS] = (struct async_event){ element, type };
    if (write(the_context->async_fd, &one, sizeof one) < 0) { /* the event stays queued */ }
}
static void *device_list[2] = { &device_tag, NULL };
static uint32_t next_qpn = 0x99, next_key = 0x100;

static void push(struct cq *cq, struct wc *wc)
{
    cq->ring[cq->tail++ % RING] = *wc;
}

static int fake_poll_cq(struct cq *cq, int n, struct wc *out)
{
    int got = 0;
    while (got < n && cq->head != cq->tail)
        out[got++] = cq->ring[cq->head++ % RING];
    return got;
}

static int fake_req_notify_cq(struct cq *cq, int solicited) { (void)cq; (void)solicited; return 0; }

static int fake_post_send(struct qp *qp, struct send_wr *wr, struct send_wr **bad)
{
    for (; wr; wr = wr->next) {
        uint32_t len = 0;
        if (wr->wr_id == (MAGIC | 0xbad)) { *bad = wr; return ENOMEM; }
        switch (wr->wr_id ^ MAGIC) {
        case 0xdead: raise_event(1, qp); continue;
        case 0xc0e0: raise_event(0, qp->send_cq); continue;
        case 0xfa7a1: raise_event(8, NULL); continue;
        case 0x91d0: gid1_removed = 1; raise_event(18, (void *)(uintptr_t)1); continue;
        case 0x91d1: gid1_removed = 0; raise_event(18, (void *)(uintptr_t)1); continue;
        }
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        if (wr->opcode <= 1 || wr->opcode == 4) { /* WRITE, WRITE_WITH_IMM, READ: the rdma union */
            if (wr->wr[0] != REMOTE_ADDR || (uint32_t)wr->wr[1] != REMOTE_KEY) { *bad = wr; return EINVAL; }
        }
        if (!(wr->send_flags & 2)) /* IBV_SEND_SIGNALED */
            continue;
        struct wc wc = { .wr_id = wr->wr_id, .byte_len = len, .qp_num = qp->qp_num };
        static const unsigned wc_opcode[] = { 1, 1, 0, 0, 2, 3, 4 };
        wc.opcode = wr->opcode < 7 ? wc_opcode[wr->opcode] : 0;
        if (wr->opcode == 1 || wr->opcode == 3) { wc.imm_data = wr->imm_data; wc.wc_flags = 2; }
        push(qp->send_cq, &wc);
    }
    return 0;
}

/* A receive completes at once, as if a WRITE with immediate 0x0a0b0c0d had arrived. */
static int fake_post_recv(struct qp *qp, struct recv_wr *wr, struct recv_wr **bad)
{
    (void)bad;
    for (; wr; wr = wr->next) {
        struct wc wc = { .wr_id = wr->wr_id, .opcode = 129, .qp_num = qp->qp_num,
                         .imm_data = __builtin_bswap32(0x0a0b0c0d), .wc_flags = 2 };
        push(qp->recv_cq, &wc);
    }
    return 0;
}

void **ibv_get_device_list(int *n)
{
    if (getenv("FAKE_IBVERBS_ENOSYS")) { errno = ENOSYS; return NULL; }
    if (n) *n = 1;
    return device_list;
}
void ibv_free_device_list(void **list) { (void)list; }
const char *ibv_get_device_name(void *dev) { (void)dev; return "fake0"; }

struct context *ibv_open_device(void *dev)
{
    struct context *c = calloc(1, sizeof *c);
    c->device = dev;
    c->ops[11] = (void *)fake_poll_cq;
    c->ops[12] = (void *)fake_req_notify_cq;
    c->ops[25] = (void *)fake_post_send;
    c->ops[26] = (void *)fake_post_recv;
    c->cmd_fd = -1;
    c->async_fd = eventfd(0, 0);
    the_context = c;
    return c;
}
int ibv_close_device(struct context *c) { close(c->async_fd); free(c); return 0; }

int ibv_query_device(struct context *c, void *attr)
{
    (void)c;
    char *a = attr;
    int32_t max_qp_wr = 1024, max_sge = 4, max_cqe = 8192;
    memset(a, 0, 232);
    memcpy(a, "fake-1.0", 9);
    memcpy(a + 112, &max_qp_wr, 4);
    memcpy(a + 120, &max_sge, 4);
    memcpy(a + 132, &max_cqe, 4);
    a[227] = 1; /* phys_port_cnt */
    return 0;
}

int ibv_query_port(struct context *c, uint8_t port, void *attr)
{
    (void)c;
    char *a = attr;
    uint32_t state = 4, max_mtu = 5, active_mtu = 3; int32_t len = 2;
    if (port != 1) return EINVAL;
    memset(a, 0, 52);
    memcpy(a, &state, 4);
    memcpy(a + 4, &max_mtu, 4);
    memcpy(a + 8, &active_mtu, 4);
    memcpy(a + 12, &len, 4);
    a[46] = 2; /* Ethernet */
    return 0;
}

static int gid_of(uint32_t index, uint8_t gid[16])
{
    static const uint8_t link_local[16] = { 0xfe, 0x80, [15] = 1 };
    static const uint8_t mapped[16] = { [10] = 0xff, [11] = 0xff, 127, 0, 0, 7 };
    if (index > 1 || (index == 1 && gid1_removed)) return ENODATA;
    memcpy(gid, index ? mapped : link_local, 16);
    return 0;
}

int _ibv_query_gid_ex(struct context *c, uint32_t port, uint32_t index, struct gid_entry *e,
                      uint32_t flags, size_t size)
{
    (void)c; (void)flags;
    if (size < sizeof *e) return EINVAL;
    memset(e, 0, sizeof *e);
    int rc = gid_of(index, e->gid);
    e->gid_index = index; e->port_num = port; e->gid_type = 2; /* RoCE v2 */
    return rc;
}
int ibv_query_gid(struct context *c, uint8_t port, int index, uint8_t *gid)
{
    (void)c; (void)port;
    return gid_of((uint32_t)index, gid) ? -1 : 0;
}

void *ibv_alloc_pd(struct context *c) { (void)c; return calloc(1, 16); }
int ibv_dealloc_pd(void *pd) { free(pd); return 0; }

struct mr *ibv_reg_mr(void *pd, void *addr, size_t len, int access)
{
    (void)access;
    struct mr *m = calloc(1, sizeof *m);
    m->pd = pd; m->addr = addr; m->length = len;
    m->lkey = next_key++; m->rkey = next_key++;
    return m;
}
/* The IOVA is what peers and local entries address; the stand-in keeps nothing of it. */
struct mr *ibv_reg_mr_iova2(void *pd, void *addr, size_t len, uint64_t iova, unsigned access)
{
    (void)iova;
    return ibv_reg_mr(pd, addr, len, (int)access);
}
int ibv_dereg_mr(struct mr *m) { free(m); return 0; }

struct channel *ibv_create_comp_channel(struct context *c)
{
    struct channel *ch = calloc(1, sizeof *ch);
    ch->context = c; ch->fd = eventfd(0, 0);
    return ch;
}
int ibv_destroy_comp_channel(struct channel *ch) { close(ch->fd); free(ch); return 0; }

struct cq *ibv_create_cq(struct context *c, int cqe, void *cq_context, struct channel *ch, int vector)
{
    (void)vector;
    struct cq *cq = calloc(1, sizeof *cq);
    cq->context = c; cq->channel = ch; cq->cq_context = cq_context; cq->cqe = cqe;
    return cq;
}
int ibv_resize_cq(struct cq *cq, int cqe) { cq->cqe = cqe; return 0; }
int ibv_destroy_cq(struct cq *cq) { free(cq); return 0; }
int ibv_get_cq_event(struct channel *ch, struct cq **cq, void **ctx) { (void)ch; (void)cq; (void)ctx; errno = EAGAIN; return -1; }
void ibv_ack_cq_events(struct cq *cq, unsigned n) { (void)cq; (void)n; }

struct qp *ibv_create_qp(void *pd, struct qp_init_attr *init)
{
    if (init->cap.max_inline_data > 512) { errno = EINVAL; return NULL; }
    struct qp *qp = calloc(1, sizeof *qp);
    qp->context = init->send_cq->context; qp->pd = pd;
    qp->send_cq = init->send_cq; qp->recv_cq = init->recv_cq;
    qp->qp_num = next_qpn++;
    if (init->cap.max_inline_data < 256) /* granted in steps, as devices round up */
        init->cap.max_inline_data = 256;
    return qp;
}
int ibv_modify_qp(struct qp *qp, void *attr, int mask) { (void)qp; (void)attr; (void)mask; return 0; }
int ibv_destroy_qp(struct qp *qp) { free(qp); return 0; }

int ibv_get_async_event(struct context *c, struct async_event *ev)
{
    uint64_t n;
    if (ev_head == ev_tail) {
        /* Empty: clear the eventfd's count (the fd is non-blocking), as the kernel's queue
         * stops being readable, then look once more for an event raised meanwhile. */
        if (read(c->async_fd, &n, sizeof n) < 0) { /* already clear */ }
        if (ev_head == ev_tail) {
            errno = EAGAIN;
            return -1;
        }
    }
    *ev = events[ev_head++ % EVENTS];
    return 0;
}
void ibv_ack_async_event(struct async_event *ev) { (void)ev; }
int ibv_fork_init(void) { return 0; }
