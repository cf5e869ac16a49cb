/*
 * receive_frames: sensor frames into a ring of pages over RoCEv2, checked byte for byte.
 *
 * By default the device is in this program: a ferroce sender on 127.0.2.12 streams frames of
 * the test pattern to a receiver on 127.0.2.11, both on loopback. With --device ADDR the
 * receiver instead programs a device at ADDR (for example `ferroce stream send --device
 * 127.0.2.12`) to stream to it, as a Hololink host programs its sensor bridge.
 *
 *   cc -std=c11 -I crates/ferroce-capi/include examples/c/receive_frames.c \
 *      target/release/libferroce_capi.a -lpthread -ldl -lm -lrt -lutil -lgcc_s -o receive_frames
 *   ./receive_frames [--frames N] [--local ADDR] [--device ADDR]
 *
 * Exits 0 when every frame arrived whole and equal to the pattern.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferroce.h"

enum { FRAME_SIZE = 64 * 1024, PAGES = 4, WAIT_MS = 5000 };

static int check(ferroce_result r, const char *what) {
    if (r == FERROCE_RESULT_OK) return 1;
    char text[512];
    ferroce_last_error(text, sizeof text);
    fprintf(stderr, "receive_frames: %s: %s (%s)\n", what, text, ferroce_result_name(r));
    return 0;
}

static void *run_monitor(void *rx) {
    /* Returns when the receiver is closed, or when its receive path fails. */
    return (void *)(intptr_t)ferroce_receiver_blocking_monitor(rx);
}

static void count_frame(void *counter) {
    atomic_fetch_add((atomic_uint *)counter, 1);
}

int main(int argc, char **argv) {
    unsigned frames = 10;
    const char *local = "127.0.2.11";
    const char *device = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--frames") == 0) frames = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--local") == 0) local = argv[i + 1];
        else if (strcmp(argv[i], "--device") == 0) device = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--frames N] [--local ADDR] [--device ADDR]\n", argv[0]);
            return 2;
        }
    }
    const char *peer = device ? device : "127.0.2.12";

    ferroce_nic *nic = NULL;
    if (!check(ferroce_nic_open(local, &nic), "opening the NIC")) return 1;

    ferroce_receiver *rx = NULL;
    static atomic_uint announced;
    check(ferroce_receiver_new(&rx), "creating the receiver");
    check(ferroce_receiver_set_frame_ready(rx, count_frame, &announced), "set_frame_ready");
    ferroce_receiver_config config;
    memset(&config, 0, sizeof config);
    config.struct_size = sizeof config;
    config.frame_size = FRAME_SIZE;
    config.pages = PAGES;
    config.queue_size = PAGES;
    config.peer_ip = peer;
    if (!check(ferroce_receiver_start(rx, nic, &config), "starting the receiver")) return 1;
    printf("receiver on %s, queue pair %#x, key %#x, %u pages of %zu bytes\n", local,
           ferroce_receiver_qp_number(rx), ferroce_receiver_rkey(rx), ferroce_receiver_pages(rx),
           ferroce_receiver_page_size(rx));

    pthread_t monitor;
    if (pthread_create(&monitor, NULL, run_monitor, rx) != 0) return 1;

    ferroce_sender *tx = NULL;
    if (device) {
        if (!check(ferroce_receiver_program_device(rx, device, 0), "programming the device"))
            return 1;
    } else if (!check(ferroce_sender_for_receiver(peer, rx, 0, &tx), "opening the sender")) {
        return 1;
    }

    static uint8_t expected[FRAME_SIZE];
    unsigned good = 0;
    for (unsigned n = 0; n < frames; n++) {
        if (tx) {
            check(ferroce_pattern_fill(n, expected, FRAME_SIZE), "filling a frame");
            if (!check(ferroce_sender_send_frame(tx, expected, FRAME_SIZE, NULL), "sending"))
                break;
        }
        ferroce_frame_info info;
        info.struct_size = sizeof info;
        if (!check(ferroce_receiver_next_frame(rx, WAIT_MS, &info), "waiting for a frame")) break;
        /* A device programmed from outside numbers frames from wherever it stands. */
        check(ferroce_pattern_fill((uint32_t)info.frame_number, expected, FRAME_SIZE), "pattern");

        /* Read the frame where it landed: no copy. */
        ferroce_frame *frame = NULL;
        if (!check(ferroce_receiver_frame_view(rx, &info, &frame), "viewing the frame")) break;
        const uint8_t *bytes = ferroce_frame_data(frame);
        size_t len = ferroce_frame_len(frame);
        int same = bytes && len == FRAME_SIZE && memcmp(bytes, expected, len) == 0;
        /* Still the frame's bytes after reading? (The device rewrites a page once the ring
         * wraps to it.) */
        int current = ferroce_frame_is_current(frame);
        ferroce_frame_free(frame);
        if (!same || !current || !info.complete) {
            fprintf(stderr, "frame %llu (page %u): %s\n", (unsigned long long)info.frame_number,
                    info.page, !info.complete ? "incomplete" : !current ? "overwritten"
                                                                         : "wrong bytes");
            break;
        }
        good++;
    }

    ferroce_receiver_close(rx);
    void *monitor_result = NULL;
    pthread_join(monitor, &monitor_result);
    int failed = ferroce_receiver_receive_path_failed(rx);
    printf("%u of %u frames of %d bytes arrived byte-exact (%u announced)\n", good, frames,
           FRAME_SIZE, atomic_load(&announced));
    ferroce_sender_free(tx);
    ferroce_receiver_free(rx);
    ferroce_nic_free(nic);
    return good == frames && !failed && (intptr_t)monitor_result == FERROCE_RESULT_OK ? 0 : 1;
}
