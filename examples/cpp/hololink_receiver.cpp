// A Hololink-shaped frame receiver written on ferroce.h: FerroceRoceReceiver implements the
// RoceReceiverInterfaceV2 shape (Hololink Sensor Bridge; see hololink_standin.hpp) over ferroce's
// soft NIC, so an HSB application could take frames from it on a host without a ConnectX NIC.
//
// main() runs it on loopback: the receiver on 127.0.2.13, a ferroce sender standing in for
// the sensor bridge on 127.0.2.14, frames checked byte for byte where they landed.
//
// Build (one line): c++ -std=c++17 -I crates/ferroce-capi/include
//   examples/cpp/hololink_receiver.cpp target/release/libferroce_capi.a
//   -lpthread -ldl -lm -lrt -lutil -lgcc_s
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ferroce.h"
#include "hololink_standin.hpp"

namespace {

std::string last_error() {
    std::string text(ferroce_last_error(nullptr, 0) + 1, '\0');
    ferroce_last_error(text.data(), text.size());
    text.resize(text.size() - 1);
    return text;
}

struct NicFree {
    void operator()(ferroce_nic *n) const { ferroce_nic_free(n); }
};
struct ReceiverFree {
    void operator()(ferroce_receiver *r) const { ferroce_receiver_free(r); }
};

}  // namespace

using standin::hololink_module_status_t;

// The device name carries the soft NIC's address: "ferroce:192.168.0.101".
class FerroceRoceReceiver final : public standin::RoceReceiverInterfaceV2 {
public:
    FerroceRoceReceiver() {
        ferroce_receiver *rx = nullptr;
        if (ferroce_receiver_new(&rx) != FERROCE_RESULT_OK) throw std::runtime_error(last_error());
        rx_.reset(rx);
        // The trampoline stays registered; set_frame_ready swaps what it calls.
        ferroce_receiver_set_frame_ready(rx_.get(), &FerroceRoceReceiver::trampoline, this);
    }

    ~FerroceRoceReceiver() override { close(); }

    hololink_module_status_t start(const std::string &ibv_name, unsigned ibv_port,
                                   uint64_t cu_buffer, size_t cu_buffer_size,
                                   size_t cu_frame_size, size_t cu_page_size, unsigned pages,
                                   size_t metadata_offset, const std::string &peer_ip,
                                   unsigned queue_size) override {
        (void)ibv_port;  // one port per soft NIC
        const std::string prefix = "ferroce:";
        if (ibv_name.compare(0, prefix.size(), prefix) != 0)
            throw std::runtime_error("device \"" + ibv_name +
                                     "\" is not a ferroce soft NIC (\"ferroce:<address>\")");
        ferroce_nic *nic = nullptr;
        if (ferroce_nic_open(ibv_name.c_str() + prefix.size(), &nic) != FERROCE_RESULT_OK)
            throw std::runtime_error(last_error());
        nic_.reset(nic);
        ferroce_receiver_config c{};
        c.struct_size = sizeof c;
        c.pages = pages;
        c.frame_size = cu_frame_size;
        c.page_size = cu_page_size;
        c.metadata_offset = metadata_offset;
        c.queue_size = queue_size;
        c.immediate_layout = FERROCE_IMMEDIATE_PAGE12;
        c.cu_buffer = cu_buffer;
        c.cu_buffer_size = cu_buffer_size;
        c.peer_ip = peer_ip.c_str();
        switch (ferroce_receiver_start(rx_.get(), nic_.get(), &c)) {
        case FERROCE_RESULT_OK:
            started_ = true;
            return standin::HOLOLINK_MODULE_OK;
        case FERROCE_RESULT_INVALID:
            std::fprintf(stderr, "start: %s\n", last_error().c_str());
            return standin::HOLOLINK_MODULE_INVALID_PARAMETER;
        default:
            throw std::runtime_error(last_error());
        }
    }

    void close() override { ferroce_receiver_close(rx_.get()); }

    void blocking_monitor() override {
        ferroce_result r = ferroce_receiver_blocking_monitor(rx_.get());
        if (r == FERROCE_RESULT_NOT_STARTED) throw std::runtime_error(last_error());
        // FAILED: receive_path_failed() now says so; Hololink's API returns normally.
    }

    bool get_next_frame(unsigned timeout_ms, standin::RoceReceiverFrameInfoV1 &out) override {
        ferroce_frame_info f{};
        f.struct_size = sizeof f;
        switch (ferroce_receiver_next_frame(rx_.get(), timeout_ms, &f)) {
        case FERROCE_RESULT_OK:
            break;
        case FERROCE_RESULT_NOT_STARTED:
            throw std::runtime_error(last_error());
        default:  // a timeout, or the receive path failed
            return false;
        }
        out.frame_memory = f.frame_memory;
        out.metadata_memory = f.metadata_memory;
        out.received_frame_number = f.received_frame_number;
        out.frame_number = f.frame_number;
        out.imm_data = f.imm_data;
        out.received_s = f.received_s;
        out.received_ns = f.received_ns;
        out.dropped = f.dropped;
        out.bytes_written = f.bytes_written;
        return true;
    }

    bool frames_ready() override { return ferroce_receiver_frames_ready(rx_.get()); }

    void set_frame_ready(std::function<void()> callback) override {
        std::lock_guard<std::mutex> lock(ready_lock_);
        ready_ = std::move(callback);
    }

    uint32_t get_qp_number() override { return started(ferroce_receiver_qp_number(rx_.get())); }
    uint32_t get_rkey() override { return started(ferroce_receiver_rkey(rx_.get())); }
    uint64_t external_frame_memory() override {
        return started(ferroce_receiver_external_frame_memory(rx_.get()));
    }
    size_t frame_size() override { return ferroce_receiver_frame_size(rx_.get()); }
    size_t page_size() override { return ferroce_receiver_page_size(rx_.get()); }
    unsigned pages() override { return ferroce_receiver_pages(rx_.get()); }
    bool receive_path_failed() override {
        return ferroce_receiver_receive_path_failed(rx_.get());
    }

    // The address and port the device is to send to.
    std::string local_address() const {
        char text[64] = {0};
        ferroce_nic_addr(nic_.get(), text, sizeof text);
        return text;
    }

private:
    template <typename T> T started(T value) const {
        if (!started_) throw std::runtime_error("the receiver has not been started");
        return value;
    }

    // Runs on the monitor's thread; must not let an exception out into the library.
    static void trampoline(void *self) {
        auto &me = *static_cast<FerroceRoceReceiver *>(self);
        std::function<void()> ready;
        {
            std::lock_guard<std::mutex> lock(me.ready_lock_);
            ready = me.ready_;
        }
        try {
            if (ready) ready();
        } catch (...) {
            std::fprintf(stderr, "the frame-ready callback threw; ignored\n");
        }
    }

    // Declared before rx_ so the receiver is freed first.
    std::unique_ptr<ferroce_nic, NicFree> nic_;
    std::unique_ptr<ferroce_receiver, ReceiverFree> rx_;
    std::mutex ready_lock_;
    std::function<void()> ready_;
    bool started_ = false;
};

int main() {
    const size_t frame_size = 1920 * 1080 * 2;  // a 1080p frame of 16-bit pixels
    const size_t metadata_offset = (frame_size + 127) / 128 * 128;
    const size_t page_size = metadata_offset + 128;
    const unsigned pages = 3, frames = 12;

    FerroceRoceReceiver receiver;
    standin::RoceReceiverInterfaceV2 &rx = receiver;  // used only through the interface
    std::atomic<unsigned> ready{0};
    rx.set_frame_ready([&ready] { ready++; });
    if (rx.start("ferroce:127.0.2.13", 1, 0, 0, frame_size, page_size, pages, metadata_offset,
                 "127.0.2.14", pages) != standin::HOLOLINK_MODULE_OK)
        return 1;
    std::thread monitor([&rx] { rx.blocking_monitor(); });

    // The sensor bridge, programmed from what the interface reports.
    const std::string dest = receiver.local_address();
    ferroce_sender_target t{};
    t.struct_size = sizeof t;
    t.qp = rx.get_qp_number();
    t.dest = dest.c_str();
    t.address = rx.external_frame_memory();
    t.page_size = rx.page_size();
    t.frame_size = rx.frame_size();
    t.payload = 4096;  // loopback carries jumbo packets
    t.rkey = rx.get_rkey();
    t.pages = rx.pages();
    ferroce_sender *bridge = nullptr;
    if (ferroce_sender_new("127.0.2.14", &t, &bridge) != FERROCE_RESULT_OK) {
        std::fprintf(stderr, "sender: %s\n", last_error().c_str());
        return 1;
    }

    std::vector<uint8_t> data(frame_size);
    unsigned good = 0;
    for (unsigned n = 0; n < frames; n++) {
        ferroce_pattern_fill(n, data.data(), data.size());
        if (ferroce_sender_send_frame(bridge, data.data(), data.size(), nullptr) !=
            FERROCE_RESULT_OK)
            break;
        standin::RoceReceiverFrameInfoV1 info;
        if (!rx.get_next_frame(5000, info)) break;
        // frame_memory is where the frame landed, in this process: read it in place.
        const auto *bytes = reinterpret_cast<const uint8_t *>(info.frame_memory);
        if (info.bytes_written == frame_size && info.frame_number == n &&
            std::memcmp(bytes, data.data(), frame_size) == 0)
            good++;
    }
    rx.close();
    monitor.join();
    ferroce_sender_free(bridge);
    std::printf("%u of %u frames of %zu bytes byte-exact, %u frame-ready calls, failed: %s\n",
                good, frames, frame_size, ready.load(), rx.receive_path_failed() ? "yes" : "no");
    return good == frames && !rx.receive_path_failed() ? 0 : 1;
}
