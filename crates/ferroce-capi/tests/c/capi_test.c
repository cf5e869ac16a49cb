/*
 * The C ABI from C, on loopback (127.0.2.1 to 127.0.2.8, 127.0.4.3 and 127.0.4.4): frames
 * received byte-exact, read both by copy and in place; an RC WRITE, READ and SEND between two
 * NICs; every OR of the FERROCE_ACCESS_* rights granting exactly that; a session round
 * trip through a C coprocessor function; a cache flush; bad arguments refused by code and
 * text; and a panic inside the library caught at the boundary, after which the program and
 * the library go on working.
 *
 * Built and run by tests/c_abi.rs with FERROCE_TEST_HOOKS defined. Exits 0 when every check
 * passes; otherwise prints the first failure and exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static int last_error_contains(const char *needle) {
    char text[512];
    ferroce_last_error(text, sizeof text);
    return strstr(text, needle) != NULL;
}

/* ---- errors and the panic fence ------------------------------------------------------------ */

static void bad_arguments_are_refused_with_a_reason(void) {
    ferroce_nic *nic = NULL;
    EXPECT(ferroce_nic_open(NULL, &nic), FERROCE_RESULT_NULL_PARAMETER);
    CHECK(last_error_contains("addr is NULL"));
    EXPECT(ferroce_nic_open("127.0.2.1", NULL), FERROCE_RESULT_NULL_PARAMETER);
    EXPECT(ferroce_nic_open("not an address", &nic), FERROCE_RESULT_INVALID);
    CHECK(last_error_contains("not an address"));
    CHECK(nic == NULL);

    /* The length comes back whole whatever the buffer, as snprintf's does. */
    size_t full = ferroce_last_error(NULL, 0);
    char tiny[8];
    CHECK(ferroce_last_error(tiny, sizeof tiny) == full);
    CHECK(strlen(tiny) == sizeof tiny - 1);

    ferroce_receiver *rx = NULL;
    OK(ferroce_receiver_new(&rx));
    ferroce_frame_info info;
    info.struct_size = sizeof info;
    EXPECT(ferroce_receiver_next_frame(rx, 0, &info), FERROCE_RESULT_NOT_STARTED);
    EXPECT(ferroce_receiver_blocking_monitor(rx), FERROCE_RESULT_NOT_STARTED);
    CHECK(ferroce_receiver_qp_number(rx) == 0);
    info.struct_size = 4;
    EXPECT(ferroce_receiver_next_frame(rx, 0, &info), FERROCE_RESULT_INVALID);
    CHECK(last_error_contains("struct_size"));
    ferroce_receiver_close(rx); /* harmless before start */
    ferroce_receiver_free(rx);

    /* Every free takes NULL. */
    ferroce_nic_free(NULL);
    ferroce_region_free(NULL);
    ferroce_cq_free(NULL);
    ferroce_qp_free(NULL);
    ferroce_receiver_free(NULL);
    ferroce_frame_free(NULL);
    ferroce_sender_free(NULL);
    ferroce_session_free(NULL);
    ferroce_mem_region_free(NULL);
    ferroce_context_free(NULL);
    ferroce_buffer_free(NULL);
    CHECK(ferroce_region_addr(NULL) == 0);
    CHECK(!ferroce_receiver_frames_ready(NULL));
    CHECK(strcmp(ferroce_result_name(FERROCE_RESULT_TIMEOUT), "FERROCE_RESULT_TIMEOUT") == 0);
    CHECK(strcmp(ferroce_version(), FERROCE_VERSION) == 0);
    /* A completion's status as text (ibv_wc_status_str), and the likely cause where the text
     * names only the symptom. */
    CHECK(strcmp(ferroce_wc_status_str(0), "success") == 0);
    CHECK(strcmp(ferroce_wc_status_str(10), "remote access error") == 0);
    CHECK(strcmp(ferroce_wc_status_str(12), "transport retry counter exceeded") == 0);
    CHECK(strcmp(ferroce_wc_status_str(99), "unknown status") == 0);
    CHECK(ferroce_wc_status_hint(0) == NULL);
    CHECK(ferroce_wc_status_hint(99) == NULL);
    CHECK(strstr(ferroce_wc_status_hint(10), "rkey") != NULL);
    CHECK(strstr(ferroce_wc_status_hint(12), "4791") != NULL);
    /* The device list: the soft NIC first, sized by a call with no buffer, cut to fit. */
    char names[256];
    size_t names_len = ferroce_devices(NULL, 0);
    CHECK(names_len >= strlen("ferroce0"));
    CHECK(ferroce_devices(names, sizeof names) == names_len);
    CHECK(strncmp(names, "ferroce0", 8) == 0 && (names[8] == '\0' || names[8] == '\n'));
    char cut[4];
    CHECK(ferroce_devices(cut, sizeof cut) == names_len && strcmp(cut, "fer") == 0);
}

static void a_panic_comes_back_as_a_code(void) {
    EXPECT(ferroce_test_panic(true), FERROCE_RESULT_PANIC);
    CHECK(last_error_contains("panicked"));
    /* The program goes on, and so does the library. */
    EXPECT(ferroce_test_panic(false), FERROCE_RESULT_INVALID);
    CHECK(last_error_contains("asked not to panic"));
    EXPECT(ferroce_test_panic(true), FERROCE_RESULT_PANIC);
}

/* ---- frames --------------------------------------------------------------------------------- */

static atomic_int frames_announced;

static void on_frame_ready(void *user) {
    atomic_fetch_add((atomic_int *)user, 1);
}

static void *monitor(void *rx) {
    ferroce_result r = ferroce_receiver_blocking_monitor((ferroce_receiver *)rx);
    return (void *)(intptr_t)r;
}

static void fill(uint8_t *data, size_t len, uint32_t n) {
    for (size_t i = 0; i < len; i++) data[i] = (uint8_t)(i * 7 + n * 31 + (i >> 8));
}

static void frames_arrive_byte_exact(void) {
    enum { FRAME = 10000, PAGES = 3, FRAMES = 7 };
    ferroce_nic *nic = NULL;
    OK(ferroce_nic_open("127.0.2.1", &nic));
    ferroce_nic *again = NULL;
    EXPECT(ferroce_nic_open("127.0.2.1:4791", &again), FERROCE_RESULT_ADDRESS_IN_USE);
    CHECK(last_error_contains("already in use"));
    CHECK(ferroce_nic_port(nic) == 4791);

    ferroce_receiver *rx = NULL;
    OK(ferroce_receiver_new(&rx));
    OK(ferroce_receiver_set_frame_ready(rx, on_frame_ready, &frames_announced));
    ferroce_receiver_config config;
    memset(&config, 0, sizeof config);
    config.struct_size = sizeof config;
    config.frame_size = FRAME;
    config.pages = PAGES;
    config.queue_size = PAGES;
    config.peer_ip = "127.0.2.2";

    /* A config from an older, smaller layout is refused by name, reading nothing past its
     * struct_size (here, an allocation of just 8 bytes). */
    config.struct_size = 8;
    EXPECT(ferroce_receiver_start(rx, nic, &config), FERROCE_RESULT_INVALID);
    CHECK(last_error_contains("ferroce_receiver_config.struct_size"));
    uint32_t *old_layout = malloc(8);
    CHECK(old_layout != NULL);
    old_layout[0] = 8;
    old_layout[1] = PAGES;
    EXPECT(ferroce_receiver_start(rx, nic, (const ferroce_receiver_config *)(void *)old_layout),
           FERROCE_RESULT_INVALID);
    free(old_layout);
    config.struct_size = sizeof config;
    config.page_size = 1000; /* not a multiple of 128 */
    EXPECT(ferroce_receiver_start(rx, nic, &config), FERROCE_RESULT_INVALID);
    CHECK(last_error_contains("page_size"));
    config.page_size = 0;
    /* Caller-owned CUDA memory needs the `cuda` feature, which this build lacks. */
    config.cu_buffer = 0x7f0000000000ull;
    EXPECT(ferroce_receiver_start(rx, nic, &config), FERROCE_RESULT_UNSUPPORTED);
    CHECK(last_error_contains("cuda"));
    config.cu_buffer = 0;

    OK(ferroce_receiver_start(rx, nic, &config));
    CHECK(ferroce_receiver_pages(rx) == PAGES);
    CHECK(ferroce_receiver_frame_size(rx) == FRAME);
    CHECK(ferroce_receiver_local_port(rx) == 4791);
    CHECK(ferroce_receiver_qp_number(rx) != 0);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, monitor, rx) == 0);

    ferroce_sender *tx = NULL;
    OK(ferroce_sender_for_receiver("127.0.2.2", rx, 0, &tx));
    static uint8_t data[FRAME], got[FRAME];
    for (uint32_t n = 0; n < FRAMES; n++) {
        fill(data, FRAME, n);
        ferroce_frame_sent sent;
        OK(ferroce_sender_send_frame(tx, data, FRAME, &sent));
        CHECK(sent.page == n % PAGES);

        ferroce_frame_info info;
        info.struct_size = sizeof info;
        OK(ferroce_receiver_next_frame(rx, WAIT_MS, &info));
        CHECK(info.page == n % PAGES);
        CHECK(info.frame_number == n);
        CHECK(info.received_frame_number == n + 1);
        CHECK(info.bytes_written == FRAME);
        CHECK(info.complete);
        CHECK(info.packets_lost == 0);

        /* By copy ... */
        memset(got, 0, sizeof got);
        OK(ferroce_receiver_read_frame(rx, &info, got, FRAME));
        CHECK(memcmp(got, data, FRAME) == 0);

        /* ... and in place. */
        ferroce_frame *frame = NULL;
        OK(ferroce_receiver_frame_view(rx, &info, &frame));
        CHECK(ferroce_frame_memory(frame) == FERROCE_FRAME_HOST);
        CHECK(ferroce_frame_len(frame) == FRAME);
        const uint8_t *bytes = ferroce_frame_data(frame);
        CHECK(bytes != NULL);
        CHECK((uint64_t)(uintptr_t)bytes == info.frame_memory);
        CHECK(memcmp(bytes, data, FRAME) == 0);
        CHECK(ferroce_frame_is_current(frame));
        memset(got, 0, sizeof got);
        OK(ferroce_frame_copy(frame, got, FRAME));
        CHECK(memcmp(got, data, FRAME) == 0);
        ferroce_frame_free(frame);
    }
    CHECK(!ferroce_receiver_frames_ready(rx));
    ferroce_frame_counters counters;
    counters.struct_size = 4;
    EXPECT(ferroce_receiver_counters(rx, &counters), FERROCE_RESULT_INVALID);
    counters.struct_size = sizeof counters;
    OK(ferroce_receiver_counters(rx, &counters));
    CHECK(counters.frames == FRAMES && counters.frames_dropped == 0);
    CHECK(counters.packets_lost == 0 && counters.incomplete_frames == 0);
    CHECK(counters.packets >= FRAMES);
    ferroce_frame_info none;
    none.struct_size = sizeof none;
    EXPECT(ferroce_receiver_next_frame(rx, 10, &none), FERROCE_RESULT_TIMEOUT);

    /* A panic between frames leaves the receiver working. */
    a_panic_comes_back_as_a_code();
    fill(data, FRAME, 99);
    OK(ferroce_sender_send_frame(tx, data, FRAME, NULL));
    ferroce_frame_info last;
    last.struct_size = sizeof last;
    OK(ferroce_receiver_next_frame(rx, WAIT_MS, &last));
    OK(ferroce_receiver_read_frame(rx, &last, got, FRAME));
    CHECK(memcmp(got, data, FRAME) == 0);

    /* The callback runs on the monitor thread after the frame is queued, so it may trail
     * next_frame by a moment: wait for it, boundedly. */
    for (int i = 0; i < 500 && atomic_load(&frames_announced) < FRAMES + 1; i++) {
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    CHECK(atomic_load(&frames_announced) == FRAMES + 1);
    CHECK(!ferroce_receiver_receive_path_failed(rx));
    ferroce_receiver_close(rx);
    void *monitor_result = NULL;
    CHECK(pthread_join(thread, &monitor_result) == 0);
    CHECK((intptr_t)monitor_result == FERROCE_RESULT_OK);

    ferroce_sender_free(tx);
    ferroce_receiver_free(rx);
    ferroce_nic_free(nic);
}

/* ---- verbs ----------------------------------------------------------------------------------- */

static ferroce_completion wait_one(ferroce_cq *cq) {
    ferroce_completion wc;
    OK(ferroce_cq_wait(cq, WAIT_MS, &wc));
    CHECK(wc.status == 0);
    return wc;
}

/* One WRITE or READ of 64 bytes from a fresh pair on 127.0.4.x:`port`, into a region of
 * `region_access` through QPs connected with `qp_access`; returns the completion's status
 * (a failure is fatal to the pair, hence one pair each). Whether the target's bytes changed
 * goes to `*written`. */
static uint32_t one_op(uint16_t port, uint32_t region_access, uint32_t qp_access, uint32_t opcode,
                       int *written) {
    char addr_a[32], addr_b[32];
    snprintf(addr_a, sizeof addr_a, "127.0.4.3:%u", (unsigned)port);
    snprintf(addr_b, sizeof addr_b, "127.0.4.4:%u", (unsigned)port);
    ferroce_nic *a = NULL, *b = NULL;
    OK(ferroce_nic_open(addr_a, &a));
    OK(ferroce_nic_open(addr_b, &b));
    ferroce_region *local = NULL, *target = NULL;
    OK(ferroce_region_register(a, 64, FERROCE_ACCESS_LOCAL, FERROCE_MEMORY_PAGEABLE, &local));
    OK(ferroce_region_register(b, 64, region_access, FERROCE_MEMORY_PAGEABLE, &target));
    OK(ferroce_region_write(local, 0, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde",
                            64));
    ferroce_cq *ca = NULL, *cb = NULL;
    OK(ferroce_cq_new(a, 16, &ca));
    OK(ferroce_cq_new(b, 16, &cb));
    ferroce_qp *qa = NULL, *qb = NULL;
    OK(ferroce_qp_new(a, FERROCE_QP_RC, ca, ca, NULL, &qa));
    OK(ferroce_qp_new(b, FERROCE_QP_RC, cb, cb, NULL, &qb));
    ferroce_endpoint ea, eb;
    OK(ferroce_qp_endpoint(qa, &ea));
    OK(ferroce_qp_endpoint(qb, &eb));
    ferroce_connect_options options;
    memset(&options, 0, sizeof options);
    options.struct_size = sizeof options;
    options.access = qp_access;
    options.mtu = 1024;
    options.timeout = 14;
    options.retry_cnt = 7;
    options.rnr_retry = 7;
    options.max_rd_atomic = 16;
    OK(ferroce_qp_connect(qa, &eb, &options));
    OK(ferroce_qp_connect(qb, &ea, &options));
    ferroce_send_wr wr;
    memset(&wr, 0, sizeof wr);
    wr.struct_size = sizeof wr;
    wr.opcode = opcode;
    wr.wr_id = 1;
    wr.local_addr = ferroce_region_addr(local);
    wr.length = 64;
    wr.lkey = ferroce_region_lkey(local);
    wr.remote_addr = ferroce_region_addr(target);
    wr.rkey = ferroce_region_rkey(target);
    wr.flags = FERROCE_SEND_SIGNALED;
    OK(ferroce_qp_post_send(qa, &wr));
    ferroce_completion wc;
    OK(ferroce_cq_wait(ca, WAIT_MS, &wc));
    uint8_t seen[64];
    OK(ferroce_region_read(target, 0, seen, 64));
    *written = 0;
    for (size_t i = 0; i < sizeof seen; i++) *written |= seen[i] != 0;
    ferroce_qp_free(qa);
    ferroce_qp_free(qb);
    ferroce_cq_free(ca);
    ferroce_cq_free(cb);
    ferroce_region_free(local);
    ferroce_region_free(target);
    ferroce_nic_free(a);
    ferroce_nic_free(b);
    return wc.status;
}

/* The FERROCE_ACCESS_* rights are bits: each of the eight ORs of them grants exactly its
 * rights, on a region (a refused WRITE or READ is IBV_WC_REM_ACCESS_ERR, 10) and on a queue
 * pair (IBV_WC_REM_INV_REQ_ERR, 9), and nothing is written where it was not granted. */
static void access_flags_or_exactly(void) {
    _Static_assert((FERROCE_ACCESS_REMOTE_WRITE & FERROCE_ACCESS_REMOTE_READ) == 0 &&
                       (FERROCE_ACCESS_REMOTE_WRITE & FERROCE_ACCESS_REMOTE_ATOMIC) == 0 &&
                       (FERROCE_ACCESS_REMOTE_READ & FERROCE_ACCESS_REMOTE_ATOMIC) == 0,
                   "no two FERROCE_ACCESS_* rights share a bit");
    CHECK((FERROCE_ACCESS_REMOTE_WRITE | FERROCE_ACCESS_REMOTE_READ) != FERROCE_ACCESS_REMOTE_ATOMIC);
    /* Bits beyond the three are refused, with a reason. */
    ferroce_nic *nic = NULL;
    ferroce_region *r = NULL;
    OK(ferroce_nic_open("127.0.4.3:4000", &nic));
    EXPECT(ferroce_region_register(nic, 64, 8, FERROCE_MEMORY_PAGEABLE, &r), FERROCE_RESULT_INVALID);
    CHECK(last_error_contains("unknown bits 0x8"));
    /* An atomic-only grant registers (the C API posts no atomics; Rust's test runs them). */
    OK(ferroce_region_register(nic, 64, FERROCE_ACCESS_REMOTE_ATOMIC, FERROCE_MEMORY_PAGEABLE, &r));
    CHECK(ferroce_region_rkey(r) != 0);
    ferroce_region_free(r);
    ferroce_nic_free(nic);

    uint16_t port = 4800;
    for (uint32_t bits = 0; bits < 8; bits++) {
        uint32_t grant = 0;
        if (bits & 1) grant |= FERROCE_ACCESS_REMOTE_WRITE;
        if (bits & 2) grant |= FERROCE_ACCESS_REMOTE_READ;
        if (bits & 4) grant |= FERROCE_ACCESS_REMOTE_ATOMIC;
        const uint32_t ops[2] = {FERROCE_WR_WRITE, FERROCE_WR_READ};
        const uint32_t rights[2] = {FERROCE_ACCESS_REMOTE_WRITE, FERROCE_ACCESS_REMOTE_READ};
        for (int i = 0; i < 2; i++) {
            int granted = (grant & rights[i]) != 0;
            int written = 0;
            /* The region grants `grant`, the QP everything. A LOCAL region has no key. */
            if (grant != FERROCE_ACCESS_LOCAL) {
                uint32_t status = one_op(port++, grant, FERROCE_ACCESS_REMOTE, ops[i], &written);
                if (status != (granted ? 0u : 10u)) {
                    fprintf(stderr, "region grant %u, op %u: status %u\n", grant, ops[i], status);
                    CHECK(0);
                }
                CHECK(written == (granted && i == 0));
            }
            /* The QP grants `grant`, the region everything. */
            uint32_t status = one_op(port++, FERROCE_ACCESS_REMOTE, grant, ops[i], &written);
            if (status != (granted ? 0u : 9u)) {
                fprintf(stderr, "QP grant %u, op %u: status %u\n", grant, ops[i], status);
                CHECK(0);
            }
            CHECK(written == (granted && i == 0));
        }
    }
}

static void rc_write_read_and_send(void) {
    ferroce_nic *a = NULL, *b = NULL;
    OK(ferroce_nic_open("127.0.2.3", &a));
    OK(ferroce_nic_open("127.0.2.4", &b));
    ferroce_region *ra = NULL, *rb = NULL;
    EXPECT(ferroce_region_register(a, 0, FERROCE_ACCESS_REMOTE, FERROCE_MEMORY_MAPPED, &ra),
           FERROCE_RESULT_INVALID);
    EXPECT(ferroce_region_register(a, 64, 9, FERROCE_MEMORY_MAPPED, &ra), FERROCE_RESULT_INVALID);
    OK(ferroce_region_register(a, 4096, FERROCE_ACCESS_REMOTE, FERROCE_MEMORY_MAPPED, &ra));
    OK(ferroce_region_register(b, 4096, FERROCE_ACCESS_REMOTE, FERROCE_MEMORY_PAGEABLE, &rb));
    CHECK(ferroce_region_host_pointer(ra) != NULL);
    CHECK(ferroce_region_host_pointer(rb) == NULL);
    CHECK(ferroce_region_len(ra) == 4096);
    EXPECT(ferroce_region_write(rb, 4090, "0123456789", 10), FERROCE_RESULT_INVALID);

    ferroce_cq *ca = NULL, *cb = NULL;
    OK(ferroce_cq_new(a, 64, &ca));
    OK(ferroce_cq_new(b, 64, &cb));
    ferroce_qp *qa = NULL, *qb = NULL;
    OK(ferroce_qp_new(a, FERROCE_QP_RC, ca, ca, NULL, &qa));
    OK(ferroce_qp_new(b, FERROCE_QP_RC, cb, cb, NULL, &qb));
    ferroce_endpoint ea, eb;
    OK(ferroce_qp_endpoint(qa, &ea));
    OK(ferroce_qp_endpoint(qb, &eb));
    CHECK(strcmp(ea.addr, "127.0.2.3:4791") == 0);
    CHECK(ea.qpn == ferroce_qp_qpn(qa));
    OK(ferroce_qp_connect(qa, &eb, NULL));
    OK(ferroce_qp_connect(qb, &ea, NULL));

    /* WRITE: a's bytes (written in place) into b's region. */
    uint8_t *pa = ferroce_region_host_pointer(ra);
    memcpy(pa, "written by a", 12);
    ferroce_send_wr wr;
    memset(&wr, 0, sizeof wr);
    wr.struct_size = sizeof wr;
    wr.opcode = FERROCE_WR_WRITE;
    wr.wr_id = 1;
    wr.local_addr = ferroce_region_addr(ra);
    wr.length = 12;
    wr.lkey = ferroce_region_lkey(ra);
    wr.remote_addr = ferroce_region_addr(rb) + 100;
    wr.rkey = ferroce_region_rkey(rb);
    wr.flags = FERROCE_SEND_SIGNALED;
    OK(ferroce_qp_post_send(qa, &wr));
    ferroce_completion wc = wait_one(ca);
    CHECK(wc.wr_id == 1 && wc.opcode == 1 && wc.byte_len == 12);
    char seen[16] = {0};
    OK(ferroce_region_read(rb, 100, seen, 12));
    CHECK(memcmp(seen, "written by a", 12) == 0);

    /* READ: b's bytes back into a's region, at offset 1000. */
    OK(ferroce_region_write(rb, 200, "read by a", 9));
    wr.opcode = FERROCE_WR_READ;
    wr.wr_id = 2;
    wr.local_addr = ferroce_region_addr(ra) + 1000;
    wr.length = 9;
    wr.remote_addr = ferroce_region_addr(rb) + 200;
    OK(ferroce_qp_post_send(qa, &wr));
    wc = wait_one(ca);
    CHECK(wc.wr_id == 2 && wc.opcode == 2);
    CHECK(memcmp(pa + 1000, "read by a", 9) == 0);

    /* SEND with immediate into a receive b posted. */
    OK(ferroce_qp_post_recv(qb, 7, ferroce_region_addr(rb) + 2048, 64, ferroce_region_lkey(rb)));
    memcpy(pa + 3000, "sent", 4);
    wr.opcode = FERROCE_WR_SEND_WITH_IMM;
    wr.wr_id = 3;
    wr.local_addr = ferroce_region_addr(ra) + 3000;
    wr.length = 4;
    wr.imm = 0xfeed;
    OK(ferroce_qp_post_send(qa, &wr));
    wait_one(ca);
    wc = wait_one(cb);
    CHECK(wc.wr_id == 7 && wc.opcode == 128 && wc.byte_len == 4);
    CHECK((wc.flags & FERROCE_WC_WITH_IMM) && wc.imm == 0xfeed);
    OK(ferroce_region_read(rb, 2048, seen, 4));
    CHECK(memcmp(seen, "sent", 4) == 0);

    /* WRITE into the caller's own buffer, registered in place. */
    static uint8_t mine[512];
    ferroce_region *rm = NULL;
    EXPECT(ferroce_region_register_user(b, NULL, 512, FERROCE_ACCESS_REMOTE, &rm),
           FERROCE_RESULT_NULL_PARAMETER);
    EXPECT(ferroce_region_register_user(b, mine, 0, FERROCE_ACCESS_REMOTE, &rm),
           FERROCE_RESULT_INVALID);
    OK(ferroce_region_register_user(b, mine, sizeof mine, FERROCE_ACCESS_REMOTE, &rm));
    CHECK(ferroce_region_host_pointer(rm) == mine);
    memcpy(pa + 3100, "into my buffer", 14);
    wr.opcode = FERROCE_WR_WRITE;
    wr.wr_id = 4;
    wr.local_addr = ferroce_region_addr(ra) + 3100;
    wr.length = 14;
    wr.remote_addr = ferroce_region_addr(rm) + 300;
    wr.rkey = ferroce_region_rkey(rm);
    OK(ferroce_qp_post_send(qa, &wr));
    wc = wait_one(ca);
    CHECK(wc.wr_id == 4 && wc.status == 0);
    CHECK(memcmp(mine + 300, "into my buffer", 14) == 0);
    ferroce_region_free(rm);

    wr.opcode = 77;
    EXPECT(ferroce_qp_post_send(qa, &wr), FERROCE_RESULT_INVALID);
    wr.struct_size = 8;
    EXPECT(ferroce_qp_post_send(qa, &wr), FERROCE_RESULT_INVALID);
    size_t polled = 99;
    ferroce_completion none[4];
    OK(ferroce_cq_poll(ca, none, 4, &polled));
    CHECK(polled == 0);

    ferroce_qp_free(qa);
    ferroce_qp_free(qb);
    ferroce_cq_free(ca);
    ferroce_cq_free(cb);
    ferroce_region_free(ra);
    ferroce_region_free(rb);
    ferroce_nic_free(a);
    ferroce_nic_free(b);
}

/* ---- session ----------------------------------------------------------------------------------- */

static ferroce_channel_desc channel = {4, 256, 256};

/* The coprocessor: the request, reversed. */
static int64_t reverse(void *user, const uint8_t *request, size_t len, uint8_t *reply,
                       size_t capacity) {
    atomic_fetch_add((atomic_int *)user, 1);
    if (len > capacity) return -1;
    for (size_t i = 0; i < len; i++) reply[i] = request[len - 1 - i];
    return (int64_t)len;
}

static atomic_int served;

static void *coprocessor(void *unused) {
    (void)unused;
    ferroce_session *s = NULL;
    OK(ferroce_session_new(FERROCE_ROLE_COPROCESSOR, &s));
    ferroce_session_config config = {sizeof config, 10000, "127.0.2.6", "127.0.2.6:19571", 0};
    OK(ferroce_session_connect(s, &config));
    ferroce_mem_region *mem = NULL;
    OK(ferroce_session_alloc_memory(s, 4 * 512, &mem));
    ferroce_peer_ref peer;
    OK(ferroce_session_exchange_keys(s, mem, &peer));
    OK(ferroce_session_establish_channel(s, &channel, mem, &peer));
    OK(ferroce_session_set_coprocessor_fn(s, reverse, &served));
    OK(ferroce_session_start(s));
    /* Report what was served until the controller stops. */
    uint8_t buf[256];
    void *replies[1] = {buf};
    uint64_t sizes[1] = {sizeof buf};
    while (ferroce_session_collect(s, replies, sizes, 1, WAIT_MS, NULL) == FERROCE_RESULT_OK) {
    }
    ferroce_mem_region_free(mem);
    ferroce_session_free(s);
    return NULL;
}

static void a_session_round_trip(void) {
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, coprocessor, NULL) == 0);
    ferroce_session *s = NULL;
    OK(ferroce_session_new(FERROCE_ROLE_CONTROLLER, &s));
    EXPECT(ferroce_session_start(s), FERROCE_RESULT_INVALID); /* before connect */
    CHECK(last_error_contains("connect"));
    ferroce_session_config config = {sizeof config, 10000, "127.0.2.5", "127.0.2.6:19571", 0};
    OK(ferroce_session_connect(s, &config));
    ferroce_mem_region *mem = NULL;
    OK(ferroce_session_alloc_memory(s, 4 * 512, &mem));
    ferroce_peer_ref peer;
    OK(ferroce_session_exchange_keys(s, mem, &peer));
    CHECK(peer.len == 4 * 512 && peer.rkey != 0);
    OK(ferroce_session_establish_channel(s, &channel, mem, &peer));
    OK(ferroce_session_start(s));
    uint64_t id = 0;
    OK(ferroce_session_submit(s, "ferroce", 7, &id));
    char reply[256] = {0};
    void *replies[1] = {reply};
    uint64_t sizes[1] = {sizeof reply};
    ferroce_collected got;
    OK(ferroce_session_collect(s, replies, sizes, 1, WAIT_MS, &got));
    CHECK(got.request == id && got.bytes == 7);
    CHECK(memcmp(reply, "ecorref", 7) == 0);
    CHECK(ferroce_session_last_rtt_ns(s) > 0);
    EXPECT(ferroce_session_collect(s, replies, sizes, 1, 10, &got), FERROCE_RESULT_INVALID);
    ferroce_session_stop(s);
    ferroce_mem_region_free(mem);
    ferroce_session_free(s);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(atomic_load(&served) == 1);
}

/* ---- cache ----------------------------------------------------------------------------------- */

static void *cache_listener(void *out) {
    ferroce_context_config config;
    memset(&config, 0, sizeof config);
    config.struct_size = sizeof config;
    config.nic = "127.0.2.8";
    config.oob = "127.0.2.8:19671";
    config.listen = true;
    OK(ferroce_context_connect(&config, (ferroce_context **)out));
    return NULL;
}

static void a_cache_flush_arrives(void) {
    ferroce_context *there = NULL, *here = NULL;
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, cache_listener, &there) == 0);
    ferroce_context_config config;
    memset(&config, 0, sizeof config);
    config.struct_size = sizeof config;
    config.nic = "127.0.2.7";
    config.oob = "127.0.2.8:19671";
    OK(ferroce_context_connect(&config, &here));
    CHECK(pthread_join(thread, NULL) == 0);

    ferroce_buffer *b = NULL;
    EXPECT(ferroce_context_write_memory(here, 64, -5, &b), FERROCE_RESULT_INVALID);
    OK(ferroce_context_write_memory(here, 100, -1, &b));
    OK(ferroce_buffer_write(b, 0, "cached bytes", 12));
    OK(ferroce_buffer_set_len(b, 12));
    OK(ferroce_context_flush(here, b));
    ferroce_buffer *in = NULL;
    OK(ferroce_context_receive(there, WAIT_MS, &in));
    CHECK(ferroce_buffer_len(in) == 12);
    char seen[12];
    OK(ferroce_buffer_read(in, 0, seen, 12));
    CHECK(memcmp(seen, "cached bytes", 12) == 0);
    EXPECT(ferroce_context_receive(there, 10, &in), FERROCE_RESULT_TIMEOUT);
    ferroce_buffer_free(in);
    ferroce_buffer_free(b);
    ferroce_context_free(here);
    ferroce_context_free(there);
}

int main(void) {
    bad_arguments_are_refused_with_a_reason();
    frames_arrive_byte_exact();
    rc_write_read_and_send();
    access_flags_or_exactly();
    a_session_round_trip();
    a_cache_flush_arrives();
    a_panic_comes_back_as_a_code();
    printf("capi_test: all checks passed\n");
    return 0;
}
