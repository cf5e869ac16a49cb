/* The drop-in libibverbs from C, built against rdma-core's own <infiniband/verbs.h> so that
 * the inline functions (ibv_query_port's extended op, ibv_query_gid_ex, ibv_query_device_ex's
 * fallback, ibv_alloc_mw) run exactly as in a stock program. Run by scripts/test-dropin.sh
 * with LD_LIBRARY_PATH pointing at the drop-in and FERROCE_ADDR=127.0.0.65. Linked with
 * libmlx5 to check that mlx5dv_is_supported says no. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <infiniband/mlx5dv.h>

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "stage0: %s:%d: %s (errno %d)\n", __FILE__, __LINE__, \
                    #cond, errno);                                               \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

int main(void)
{
    int n = -1;
    struct ibv_device **list = ibv_get_device_list(&n);
    CHECK(list && n == 1 && list[1] == NULL);
    CHECK(strcmp(ibv_get_device_name(list[0]), "ferroce0") == 0);
    CHECK(ibv_get_device_index(list[0]) == 0);
    CHECK(list[0]->node_type == IBV_NODE_CA && list[0]->transport_type == IBV_TRANSPORT_IB);
    CHECK(!mlx5dv_is_supported(list[0]));

    struct ibv_context *ctx = ibv_open_device(list[0]);
    CHECK(ctx);

    struct ibv_device_attr_ex dx;
    CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0); /* the fallback to ibv_query_device */
    CHECK(dx.orig_attr.phys_port_cnt == 1 && dx.orig_attr.max_qp_wr > 0);

    struct ibv_port_attr pa;
    memset(&pa, 0xab, sizeof(pa));
    CHECK(ibv_query_port(ctx, 1, &pa) == 0); /* verbs_context's query_port */
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.link_layer == IBV_LINK_LAYER_ETHERNET);
    CHECK(pa.gid_tbl_len == 1 && pa.port_cap_flags2 == 0);
    CHECK(ibv_query_port(ctx, 2, &pa) == EINVAL);

    union ibv_gid gid;
    char text[INET6_ADDRSTRLEN];
    CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
    CHECK(strcmp(inet_ntop(AF_INET6, gid.raw, text, sizeof(text)), "::ffff:127.0.0.65") == 0);
    CHECK(ibv_query_gid(ctx, 1, 1, &gid) == -1 && errno == EINVAL);

    struct ibv_gid_entry entry;
    CHECK(ibv_query_gid_ex(ctx, 1, 0, &entry, 0) == 0);
    CHECK(entry.gid_type == IBV_GID_TYPE_ROCE_V2 && entry.port_num == 1 && entry.gid_index == 0);
    CHECK(ibv_query_gid_ex(ctx, 1, 1, &entry, 0) == EINVAL);
    struct ibv_gid_entry table[4];
    CHECK(ibv_query_gid_table(ctx, table, 4, 0) == 1);

    __be16 pkey;
    CHECK(ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && pkey == htons(0xffff));
    CHECK(ibv_get_pkey_index(ctx, 1, htons(0xffff)) == 0);

    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    CHECK(pd && pd->context == ctx);
    CHECK(ibv_alloc_mw(pd, IBV_MW_TYPE_1) == NULL && errno == EOPNOTSUPP);
    CHECK(ibv_open_xrcd(ctx, &(struct ibv_xrcd_init_attr){ 0 }) == NULL && errno == EOPNOTSUPP);
    /* the data path exists since stage 1 (stage1.c); bad arguments are refused */
    errno = 0;
    CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL);
    CHECK(ibv_reg_mr(pd, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EINVAL);
    CHECK(ibv_dealloc_pd(pd) == 0);
    CHECK(ibv_dealloc_pd(pd) == EINVAL); /* a second free is refused, not followed */

    /* async_fd: a real descriptor; non-blocking and empty, it says EAGAIN */
    struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
    CHECK(poll(&p, 1, 0) == 0);
    CHECK(fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0);
    struct ibv_async_event ev;
    CHECK(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN);

    CHECK(ibv_fork_init() == 0 && ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
    CHECK(strcmp(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR), "remote access error") == 0);
    CHECK(strcmp(ibv_port_state_str(IBV_PORT_ACTIVE), "active") == 0);

    CHECK(ibv_close_device(ctx) == 0);
    CHECK(ibv_close_device(ctx) == EINVAL);
    ibv_free_device_list(list);
    ibv_free_device_list(list); /* ignored */
    printf("stage0: all passed\n");
    return 0;
}
