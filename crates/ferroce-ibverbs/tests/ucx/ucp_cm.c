/*
 * ucp_cm: minimal UCP client/server check of connection establishment by
 * socket address (UCX connection manager, e.g. rdmacm).
 *
 *   ucp_cm server ADDR PORT   listen on ADDR:PORT, accept one connection,
 *                             receive 1 MiB, verify it, reply with 1 MiB
 *   ucp_cm client ADDR PORT   connect to ADDR:PORT, send 1 MiB, verify reply
 *
 * Protocol (tag API):
 *   client -> server  TAG_DATA   MSG_LEN bytes, byte i = pattern(i, 0)
 *   server -> client  TAG_REPLY  MSG_LEN bytes, byte i = pattern(i, 1)
 *   client -> server  TAG_FIN    8 bytes, then the client closes (flush)
 *   server closes its endpoint after TAG_FIN arrived.
 *
 * Every wait is bounded by a deadline (UCP_CM_TIMEOUT seconds, default 30);
 * on any error the program prints a message and exits non-zero.
 */
#include <ucp/api/ucp.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MSG_LEN    (1u << 20)
#define TAG_DATA   0x1001ull
#define TAG_REPLY  0x1002ull
#define TAG_FIN    0x1003ull
#define TAG_MASK   UINT64_MAX
#define FIN_MAGIC  0x46494e2146494e21ull

static const char *g_role = "ucp_cm";
static double g_deadline;
static int g_timeout_s = 30;

/* State shared with UCX callbacks */
static ucp_conn_request_h g_conn_request;
static ucs_status_t g_ep_error = UCS_OK;
static int g_ep_error_seen;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "%s: FAIL: ", g_role);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

static void on_alarm(int sig)
{
    static const char msg[] = "ucp_cm: FAIL: hard timeout (SIGALRM)\n";
    (void)sig;
    if (write(STDERR_FILENO, msg, sizeof(msg) - 1) < 0) {
        /* nothing to do */
    }
    _exit(3);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check_deadline(const char *what)
{
    if (now_s() > g_deadline) {
        die("timed out after %d s while %s", g_timeout_s, what);
    }
}

static uint8_t pattern(size_t i, unsigned which)
{
    /* Position-dependent, not periodic at any power of two below 64 KiB. */
    uint32_t x = (uint32_t)i * 2654435761u + which * 0x9e3779b9u;
    return (uint8_t)((x >> 24) ^ (i >> 16) ^ (which ? 0xa5 : 0x3c));
}

static void fill(uint8_t *buf, size_t len, unsigned which)
{
    for (size_t i = 0; i < len; i++) {
        buf[i] = pattern(i, which);
    }
}

static void verify(const uint8_t *buf, size_t len, unsigned which, const char *what)
{
    for (size_t i = 0; i < len; i++) {
        if (buf[i] != pattern(i, which)) {
            die("%s: byte %zu is 0x%02x, expected 0x%02x", what, i,
                buf[i], pattern(i, which));
        }
    }
}

static void ep_error_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    g_ep_error = status;
    g_ep_error_seen = 1;
    fprintf(stderr, "%s: endpoint error callback: %s\n", g_role,
            ucs_status_string(status));
}

static ucp_listener_h g_listener;

static void conn_handler_cb(ucp_conn_request_h conn_request, void *arg)
{
    ucp_listener_h listener = g_listener;

    (void)arg;
    if (g_conn_request != NULL) {
        /* Only one client is served; refuse any other. */
        fprintf(stderr, "%s: rejecting an extra connection request\n", g_role);
        ucp_listener_reject(listener, conn_request);
        return;
    }
    g_conn_request = conn_request;
}

/* Wait for a request returned by a *_nbx call; returns its final status. */
static ucs_status_t wait_req(ucp_worker_h worker, ucs_status_ptr_t req,
                             const char *what)
{
    ucs_status_t status;

    if (req == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(req)) {
        return UCS_PTR_STATUS(req);
    }
    while ((status = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(worker);
        check_deadline(what);
    }
    ucp_request_free(req);
    return status;
}

static void send_tag(ucp_worker_h worker, ucp_ep_h ep, const void *buf,
                     size_t len, ucp_tag_t tag, const char *what)
{
    ucp_request_param_t param;
    ucs_status_t status;

    memset(&param, 0, sizeof(param));
    status = wait_req(worker, ucp_tag_send_nbx(ep, buf, len, tag, &param), what);
    if (status != UCS_OK) {
        die("%s: %s", what, ucs_status_string(status));
    }
}

static size_t recv_tag(ucp_worker_h worker, void *buf, size_t len,
                       ucp_tag_t tag, const char *what)
{
    ucp_request_param_t param;
    ucp_tag_recv_info_t info;
    ucs_status_ptr_t req;
    ucs_status_t status;

    memset(&param, 0, sizeof(param));
    memset(&info, 0, sizeof(info));
    /* Always get a request back (no immediate completion), and read the
     * sender's tag and the length from it: UCX 1.13's ucp_tag_recv_nbx does
     * not fill param->recv_info when it completes a receive immediately. */
    param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;

    req = ucp_tag_recv_nbx(worker, buf, len, tag, TAG_MASK, &param);
    if (UCS_PTR_IS_ERR(req)) {
        die("%s: %s", what, ucs_status_string(UCS_PTR_STATUS(req)));
    }
    if (req == NULL) {
        die("%s: no request returned despite UCP_OP_ATTR_FLAG_NO_IMM_CMPL", what);
    }
    while ((status = ucp_tag_recv_request_test(req, &info)) == UCS_INPROGRESS) {
        ucp_worker_progress(worker);
        if (g_ep_error_seen) {
            ucp_request_cancel(worker, req);
        }
        check_deadline(what);
    }
    ucp_request_free(req);
    if (status != UCS_OK) {
        die("%s: %s%s%s", what, ucs_status_string(status),
            g_ep_error_seen ? ", endpoint error: " : "",
            g_ep_error_seen ? ucs_status_string(g_ep_error) : "");
    }
    if (info.sender_tag != tag) {
        die("%s: got tag 0x%llx, expected 0x%llx", what,
            (unsigned long long)info.sender_tag, (unsigned long long)tag);
    }
    return info.length;
}

/* Receives a whole MSG_LEN message tagged `tag` into buf and checks every byte against
 * pattern `which`. */
static void recv_checked(ucp_worker_h worker, uint8_t *buf, ucp_tag_t tag, unsigned which,
                         const char *what)
{
    memset(buf, 0, MSG_LEN);
    size_t len = recv_tag(worker, buf, MSG_LEN, tag, what);
    if (len != MSG_LEN) {
        die("%s: %zu bytes, expected %u", what, len, MSG_LEN);
    }
    verify(buf, MSG_LEN, which, what);
}

static ucs_status_t close_ep(ucp_worker_h worker, ucp_ep_h ep)
{
    ucp_request_param_t param;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags        = 0; /* flush mode: complete outstanding ops, then disconnect */
    return wait_req(worker, ucp_ep_close_nbx(ep, &param), "closing endpoint");
}

static void print_sockaddrs(ucp_ep_h ep)
{
    ucp_ep_attr_t attr;
    char l[INET6_ADDRSTRLEN] = "?", r[INET6_ADDRSTRLEN] = "?";
    unsigned lp = 0, rp = 0;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR |
                      UCP_EP_ATTR_FIELD_REMOTE_SOCKADDR;
    if (ucp_ep_query(ep, &attr) != UCS_OK) {
        printf("%s: ucp_ep_query(sockaddr) not available\n", g_role);
        return;
    }
    if (attr.local_sockaddr.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&attr.local_sockaddr;
        inet_ntop(AF_INET, &s->sin_addr, l, sizeof(l));
        lp = ntohs(s->sin_port);
    }
    if (attr.remote_sockaddr.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&attr.remote_sockaddr;
        inet_ntop(AF_INET, &s->sin_addr, r, sizeof(r));
        rp = ntohs(s->sin_port);
    }
    printf("%s: endpoint local %s:%u remote %s:%u\n", g_role, l, lp, r, rp);
}

static void parse_addr(const char *host, const char *port, struct sockaddr_in *sa)
{
    char *end;
    long p = strtol(port, &end, 10);

    if (*port == '\0' || *end != '\0' || p <= 0 || p > 65535) {
        die("bad port '%s'", port);
    }
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port   = htons((uint16_t)p);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        die("bad IPv4 address '%s'", host);
    }
}

static int run_server(ucp_worker_h worker, const struct sockaddr_in *sa, uint8_t *buf)
{
    ucp_listener_params_t lparams;
    ucp_listener_h listener;
    ucp_conn_request_attr_t cattr;
    ucp_ep_params_t eparams;
    ucp_ep_h ep;
    uint64_t fin = 0;
    ucs_status_t status;
    size_t len;

    memset(&lparams, 0, sizeof(lparams));
    lparams.field_mask         = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                 UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lparams.sockaddr.addr      = (const struct sockaddr *)sa;
    lparams.sockaddr.addrlen   = sizeof(*sa);
    lparams.conn_handler.cb    = conn_handler_cb;
    lparams.conn_handler.arg   = NULL;

    status = ucp_listener_create(worker, &lparams, &listener);
    if (status != UCS_OK) {
        die("ucp_listener_create: %s", ucs_status_string(status));
    }
    g_listener = listener; /* conn_handler_cb rejects extra requests */
    {
        ucp_listener_attr_t la;
        char a[INET_ADDRSTRLEN] = "?";
        memset(&la, 0, sizeof(la));
        la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
        if (ucp_listener_query(listener, &la) == UCS_OK &&
            la.sockaddr.ss_family == AF_INET) {
            const struct sockaddr_in *s = (const struct sockaddr_in *)&la.sockaddr;
            inet_ntop(AF_INET, &s->sin_addr, a, sizeof(a));
            printf("ucp_cm server: listening on %s:%u\n", a, ntohs(s->sin_port));
        } else {
            printf("ucp_cm server: listening\n");
        }
        fflush(stdout);
    }

    while (g_conn_request == NULL) {
        ucp_worker_progress(worker);
        check_deadline("waiting for a connection request");
    }

    memset(&cattr, 0, sizeof(cattr));
    cattr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(g_conn_request, &cattr) == UCS_OK &&
        cattr.client_address.ss_family == AF_INET) {
        const struct sockaddr_in *s = (const struct sockaddr_in *)&cattr.client_address;
        char a[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &s->sin_addr, a, sizeof(a));
        printf("ucp_cm server: connection request from %s:%u\n", a, ntohs(s->sin_port));
    }

    memset(&eparams, 0, sizeof(eparams));
    eparams.field_mask      = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                              UCP_EP_PARAM_FIELD_ERR_HANDLER;
    eparams.conn_request    = g_conn_request;
    eparams.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    eparams.err_handler.cb  = ep_error_cb;
    eparams.err_handler.arg = NULL;
    status = ucp_ep_create(worker, &eparams, &ep);
    if (status != UCS_OK) {
        die("ucp_ep_create(conn_request): %s", ucs_status_string(status));
    }

    recv_checked(worker, buf, TAG_DATA, 0, "client data");
    printf("ucp_cm server: received and verified %u bytes\n", MSG_LEN);
    print_sockaddrs(ep);
    ucp_ep_print_info(ep, stdout);
    fflush(stdout);

    fill(buf, MSG_LEN, 1);
    send_tag(worker, ep, buf, MSG_LEN, TAG_REPLY, "sending reply");

    len = recv_tag(worker, &fin, sizeof(fin), TAG_FIN, "receiving fin");
    if (len != sizeof(fin) || fin != FIN_MAGIC) {
        die("bad fin message (len %zu)", len);
    }

    status = close_ep(worker, ep);
    /* The client closes right after sending FIN, so its disconnect may beat
     * ours; that is a normal end of the connection. */
    if (status != UCS_OK && status != UCS_ERR_CONNECTION_RESET &&
        status != UCS_ERR_ENDPOINT_TIMEOUT) {
        die("ucp_ep_close_nbx: %s", ucs_status_string(status));
    }
    printf("ucp_cm server: endpoint closed (%s)\n", ucs_status_string(status));
    ucp_listener_destroy(listener);
    printf("ucp_cm server: ok\n");
    return 0;
}

static int run_client(ucp_worker_h worker, const struct sockaddr_in *sa, uint8_t *buf)
{
    ucp_ep_params_t eparams;
    ucp_ep_h ep;
    uint64_t fin = FIN_MAGIC;
    ucs_status_t status;

    memset(&eparams, 0, sizeof(eparams));
    eparams.field_mask       = UCP_EP_PARAM_FIELD_FLAGS |
                               UCP_EP_PARAM_FIELD_SOCK_ADDR |
                               UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                               UCP_EP_PARAM_FIELD_ERR_HANDLER;
    eparams.flags            = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    eparams.sockaddr.addr    = (const struct sockaddr *)sa;
    eparams.sockaddr.addrlen = sizeof(*sa);
    eparams.err_mode         = UCP_ERR_HANDLING_MODE_PEER;
    eparams.err_handler.cb   = ep_error_cb;
    eparams.err_handler.arg  = NULL;
    status = ucp_ep_create(worker, &eparams, &ep);
    if (status != UCS_OK) {
        die("ucp_ep_create(sockaddr): %s", ucs_status_string(status));
    }

    fill(buf, MSG_LEN, 0);
    send_tag(worker, ep, buf, MSG_LEN, TAG_DATA, "sending data");
    printf("ucp_cm client: sent %u bytes\n", MSG_LEN);

    recv_checked(worker, buf, TAG_REPLY, 1, "server reply");
    printf("ucp_cm client: received and verified %u-byte reply\n", MSG_LEN);
    print_sockaddrs(ep);
    ucp_ep_print_info(ep, stdout);
    fflush(stdout);

    send_tag(worker, ep, &fin, sizeof(fin), TAG_FIN, "sending fin");

    status = close_ep(worker, ep);
    if (status != UCS_OK) {
        die("ucp_ep_close_nbx(flush): %s", ucs_status_string(status));
    }
    printf("ucp_cm client: endpoint closed (flush)\n");
    printf("ucp_cm client: ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_config_t *config;
    ucp_context_h context;
    ucp_worker_h worker;
    struct sockaddr_in sa;
    ucs_status_t status;
    const char *t;
    uint8_t *buf;
    int is_server, rc;

    if (argc != 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
        fprintf(stderr, "usage: %s server|client ADDR PORT\n", argv[0]);
        return 2;
    }
    is_server = (strcmp(argv[1], "server") == 0);
    g_role    = is_server ? "ucp_cm server" : "ucp_cm client";
    setvbuf(stdout, NULL, _IOLBF, 0);

    if ((t = getenv("UCP_CM_TIMEOUT")) != NULL && atoi(t) > 0) {
        g_timeout_s = atoi(t);
    }
    g_deadline = now_s() + g_timeout_s;
    signal(SIGALRM, on_alarm);
    alarm((unsigned)g_timeout_s + 10); /* backstop if UCX blocks inside a call */

    parse_addr(argv[2], argv[3], &sa);

    buf = malloc(MSG_LEN);
    if (buf == NULL) {
        die("malloc(%u): %s", MSG_LEN, strerror(errno));
    }

    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        die("ucp_config_read: %s", ucs_status_string(status));
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features   = UCP_FEATURE_TAG;
    status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (status != UCS_OK) {
        die("ucp_init: %s", ucs_status_string(status));
    }

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    status = ucp_worker_create(context, &wparams, &worker);
    if (status != UCS_OK) {
        die("ucp_worker_create: %s", ucs_status_string(status));
    }

    rc = is_server ? run_server(worker, &sa, buf) : run_client(worker, &sa, buf);

    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    free(buf);
    return rc;
}
