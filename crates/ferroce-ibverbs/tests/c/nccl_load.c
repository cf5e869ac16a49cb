/* The drop-in loaded as NCCL's IB transport loads libibverbs (NCCL 2.30's
 * src/misc/ibvsymbols.cc): dlopen() of the path in NCCL_IBVERBS_LIB, then each verb looked
 * up by dlvsym() at version IBVERBS_1.1, ibv_reg_mr_iova2 at IBVERBS_1.8 and
 * ibv_reg_dmabuf_mr at IBVERBS_1.12 (both optional to NCCL). NCCL itself needs a GPU, so
 * this program stands in for its loader, and then brings up what net_ib brings up through
 * those pointers alone: the device, its port and GID, a PD, regions (one at an IOVA), a CQ
 * and an RC QP moved to INIT and queried, fork protection and an event's name.
 *
 * Run by scripts/test-dropin.sh with NCCL_IBVERBS_LIB set to the drop-in's path and no
 * LD_LIBRARY_PATH, so the library can be found no other way. Not linked with libibverbs. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "nccl_load: %s:%d: %s (errno %d)\n", __FILE__, __LINE__, \
                    #cond, errno);                                                   \
            exit(1);                                                                 \
        }                                                                            \
    } while (0)

static void *lib;

/* A verb at a version, or exit naming it. */
static void *sym(const char *name, const char *version)
{
    void *p = dlvsym(lib, name, version);
    if (p == NULL) {
        fprintf(stderr, "nccl_load: dlvsym(%s, %s): %s\n", name, version, dlerror());
        exit(1);
    }
    return p;
}

#define V11(name) ((__typeof__(&name))sym(#name, "IBVERBS_1.1"))

int main(void)
{
    const char *path = getenv("NCCL_IBVERBS_LIB");
    CHECK(path != NULL && path[0] == '/');
    lib = dlopen(path, RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "nccl_load: dlopen(%s): %s\n", path, dlerror());
        return 1;
    }
    /* Every name NCCL requires at IBVERBS_1.1. */
    static const char *required[] = {
        "ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_open_device",
        "ibv_close_device", "ibv_get_async_event", "ibv_ack_async_event", "ibv_query_device",
        "ibv_query_port", "ibv_query_gid", "ibv_query_qp", "ibv_alloc_pd", "ibv_dealloc_pd",
        "ibv_reg_mr", "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq", "ibv_create_qp",
        "ibv_modify_qp", "ibv_destroy_qp", "ibv_fork_init", "ibv_event_type_str",
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        sym(required[i], "IBVERBS_1.1");
    struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int) =
        sym("ibv_reg_mr_iova2", "IBVERBS_1.8");
    CHECK(dlvsym(lib, "ibv_reg_dmabuf_mr", "IBVERBS_1.12") != NULL);
    printf("nccl_load: %zu verbs at IBVERBS_1.1, ibv_reg_mr_iova2 at 1.8, ibv_reg_dmabuf_mr at 1.12\n",
           sizeof required / sizeof required[0]);

    CHECK(V11(ibv_fork_init)() == 0);
    int n = -1;
    struct ibv_device **list = V11(ibv_get_device_list)(&n);
    CHECK(list != NULL && n == 1);
    CHECK(strcmp(V11(ibv_get_device_name)(list[0]), "ferroce0") == 0);
    struct ibv_context *ctx = V11(ibv_open_device)(list[0]);
    CHECK(ctx != NULL);
    V11(ibv_free_device_list)(list);

    struct ibv_device_attr dev;
    CHECK(V11(ibv_query_device)(ctx, &dev) == 0 && dev.phys_port_cnt == 1);
    /* NCCL declares ibv_query_port with verbs.h's old signature: the exported function. */
    int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *) =
        sym("ibv_query_port", "IBVERBS_1.1");
    struct ibv_port_attr port;
    memset(&port, 0, sizeof port);
    CHECK(query_port(ctx, 1, &port) == 0);
    CHECK(port.state == IBV_PORT_ACTIVE && port.link_layer == IBV_LINK_LAYER_ETHERNET);
    union ibv_gid gid;
    CHECK(V11(ibv_query_gid)(ctx, 1, 0, &gid) == 0);
    CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff); /* ::ffff:a.b.c.d, RoCE v2 */

    struct ibv_pd *pd = V11(ibv_alloc_pd)(ctx);
    CHECK(pd != NULL);
    static char buf[8192];
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int) = sym("ibv_reg_mr", "IBVERBS_1.1");
    struct ibv_mr *mr = reg_mr(pd, buf, 4096, access);
    CHECK(mr != NULL && mr->addr == buf && mr->length == 4096);
    struct ibv_mr *at_zero = reg_mr_iova2(pd, buf + 4096, 4096, 0, (unsigned)access);
    CHECK(at_zero != NULL && at_zero->rkey != mr->rkey);

    struct ibv_cq *cq = V11(ibv_create_cq)(ctx, 64, NULL, NULL, 0);
    CHECK(cq != NULL);
    struct ibv_qp_init_attr init = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp *qp = V11(ibv_create_qp)(pd, &init);
    CHECK(qp != NULL);
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_INIT,
        .pkey_index = 0,
        .port_num = 1,
        .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
    };
    CHECK(V11(ibv_modify_qp)(qp, &attr,
                             IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
    struct ibv_qp_attr got;
    struct ibv_qp_init_attr got_init;
    CHECK(V11(ibv_query_qp)(qp, &got, IBV_QP_STATE, &got_init) == 0 && got.qp_state == IBV_QPS_INIT);
    CHECK(strcmp(V11(ibv_event_type_str)(IBV_EVENT_PORT_ACTIVE), "port active") == 0);

    CHECK(V11(ibv_destroy_qp)(qp) == 0);
    CHECK(V11(ibv_destroy_cq)(cq) == 0);
    CHECK(V11(ibv_dereg_mr)(at_zero) == 0);
    CHECK(V11(ibv_dereg_mr)(mr) == 0);
    CHECK(V11(ibv_dealloc_pd)(pd) == 0);
    CHECK(V11(ibv_close_device)(ctx) == 0);
    printf("nccl_load: ferroce0 port 1 ACTIVE, Ethernet; PD, regions (one at IOVA 0), CQ, RC QP in INIT\n");
    return 0;
}
