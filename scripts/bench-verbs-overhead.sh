#!/usr/bin/env bash
# The verbs backend's own cost per work request: the example
# crates/ferroce/examples/verbs_hot_path.rs against the stand-in libibverbs of the tests (its
# provider functions do next to nothing), beside the same single-post loop in C as perftest
# writes it. Instructions are counted exactly by callgrind at two request counts, so that
# setup cancels out, with the stand-in provider's share; wall time per request is the median
# of three runs of 2,000,000 requests. BENCHMARKS.md has the figures.
# Needs: valgrind, a C compiler.
# Usage: scripts/bench-verbs-overhead.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "bench: valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cc -shared -fPIC -O2 -o "$out/libibverbs.so.1" crates/ferroce/tests/fake-ibverbs/fake.c \
    -Wl,--version-script=crates/ferroce/tests/fake-ibverbs/libibverbs.map
cargo build --release -q -p ferroce --example verbs_hot_path
bin=target/release/examples/verbs_hot_path

# The same single-post loop in C, as perftest and rdma-core's tools write it: one request
# built per post, `ibv_post_send` and `ibv_poll_cq` as verbs.h inlines them (one indirect
# call each through the context's ops), against the same stand-in.
cat > "$out/direct.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
struct sge { uint64_t addr; uint32_t length, lkey; };
struct send_wr { uint64_t wr_id; struct send_wr *next; struct sge *sg_list; int num_sge;
                 unsigned opcode, send_flags; uint32_t imm; uint64_t wr[4], tail[7]; };
struct wc { uint64_t wr_id; unsigned status, opcode; uint32_t v[6]; uint16_t p, s; uint8_t a, b; };
struct ctx { void *device; void *ops[32]; int cmd_fd, async_fd; };
struct qp { struct ctx *context; void *a[5]; uint32_t handle, qp_num; };
struct cq { struct ctx *context; };
struct cap { uint32_t sw, rw, ss, rs, inl; };
struct init { void *qc; struct cq *scq, *rcq; void *srq; struct cap cap; unsigned type; int sig; };
int main(int argc, char **argv) {
    long n = atol(argv[2]);
    void *h = dlopen(argv[1], RTLD_NOW);
    void **(*list)(int *) = dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1");
    struct ctx *(*open)(void *) = dlvsym(h, "ibv_open_device", "IBVERBS_1.1");
    void *(*pd_)(struct ctx *) = dlvsym(h, "ibv_alloc_pd", "IBVERBS_1.1");
    void *(*ch_)(struct ctx *) = dlvsym(h, "ibv_create_comp_channel", "IBVERBS_1.0");
    struct cq *(*cq_)(struct ctx *, int, void *, void *, int) = dlvsym(h, "ibv_create_cq", "IBVERBS_1.1");
    struct qp *(*qp_)(void *, struct init *) = dlvsym(h, "ibv_create_qp", "IBVERBS_1.1");
    int nd; struct ctx *c = open(list(&nd)[0]);
    void *pd = pd_(c); struct cq *cq = cq_(c, 64, 0, ch_(c), 0);
    struct init ia = { .scq = cq, .rcq = cq, .cap = { 32, 1, 1, 1, 0 }, .type = 2 };
    struct qp *qp = qp_(pd, &ia);
    static char buf[4096];
    struct sge sg = { (uintptr_t)buf, 64, 0x100 };
    struct send_wr wr, *bad;
    struct wc wc;
    int (*post)(struct qp *, struct send_wr *, struct send_wr **) = (void *)c->ops[25];
    int (*poll)(struct cq *, int, struct wc *) = (void *)c->ops[11];
    for (long i = 0; i < n; i++) {
        memset(&wr, 0, sizeof wr);
        wr.wr_id = i; wr.sg_list = &sg; wr.num_sge = 1; wr.opcode = 2; wr.send_flags = 2;
        if (post(qp, &wr, &bad)) return 1;
        while (poll(cq, 1, &wc) == 0) {}
        if (wc.status) return 2;
    }
    printf("%ld\n", n);
    return 0;
}
C
cc -O2 -o "$out/direct" "$out/direct.c" -ldl

# ferroce loads the stand-in (the C loop is given its path).
export FERROCE_IBVERBS="$out/libibverbs.so.1"
# The command of path $1 for $2 requests.
cmd() {
    case $1 in
        c) echo "$out/direct $out/libibverbs.so.1 $2" ;;
        *) echo "$bin fake0 $2 $1" ;;
    esac
}
# Instructions of path $1 for $2 requests: the total and the stand-in provider's.
count() {
    # shellcheck disable=SC2046
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1.$2" $(cmd "$1" "$2") >/dev/null 2>&1
    callgrind_annotate "$out/cg.$1.$2" 2>/dev/null | awk '
        /PROGRAM TOTALS/ {gsub(",", "", $1); total = $1}
        /fake_(post_send|poll_cq)/ {gsub(",", "", $1); provider += $1}
        END {print total, provider + 0}'
}
# Nanoseconds per request of path $1: the median of three runs of 2,000,000.
wall() {
    python3 - "$(cmd "$1" 2000000)" <<'PY'
import subprocess, sys, time
runs = []
for _ in range(3):
    t = time.perf_counter()
    subprocess.run(sys.argv[1], shell=True, check=True, stdout=subprocess.DEVNULL)
    runs.append((time.perf_counter() - t) / 2_000_000 * 1e9)
print(f"{sorted(runs)[1]:.0f}")
PY
}
for path in single chain c; do
    read -r t1 p1 < <(count $path 1600)
    read -r t2 p2 < <(count $path 33600)
    ns=$(wall $path)
    python3 - "$path" "$t1" "$p1" "$t2" "$p2" "$ns" <<'PY'
import sys
path = sys.argv[1]
t1, p1, t2, p2, ns = map(int, sys.argv[2:])
per, prov = (t2 - t1) / 32000, (p2 - p1) / 32000
label = {"single": "ferroce, one post and one poll",
         "chain": "ferroce, chains of 16 and batched polls",
         "c": "C, one post and one poll through verbs.h's inline calls"}[path]
print(f"{label}: {per:.0f} instructions per request, {prov:.0f} of them the stand-in "
      f"provider's; {ns} ns per request")
PY
done
