// A stand-in for the receiver interface of Holoscan Sensor Bridge's module API, written here
// so the adapter in hololink_receiver.cpp builds without HSB's headers. It has the shape of
// `hololink::module::RoceReceiverInterfaceV2` (Holoscan Sensor Bridge's receiver): the same
// methods, argument types and status codes, declared in a namespace of our own. In an HSB build the
// adapter would include <hololink/module/roce_receiver.hpp> instead and derive from the real
// interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace standin {

// The module API's status codes (a plain integer type, as in HSB's C header).
using hololink_module_status_t = int;
constexpr hololink_module_status_t HOLOLINK_MODULE_OK = 0;
constexpr hololink_module_status_t HOLOLINK_MODULE_INVALID_PARAMETER = 1;
constexpr hololink_module_status_t HOLOLINK_MODULE_NOT_FOUND = 2;
constexpr hololink_module_status_t HOLOLINK_MODULE_NETWORK_ERROR = 3;
constexpr hololink_module_status_t HOLOLINK_MODULE_TIMEOUT = 4;

// What get_next_frame reports about the frame it took.
struct RoceReceiverFrameInfoV1 {
    uint64_t frame_memory = 0;     // address of the frame's first byte in the ring
    uint64_t metadata_memory = 0;  // address of its metadata block
    uint64_t received_frame_number = 0;
    uint64_t frame_number = 0;
    uint32_t imm_data = 0;
    uint64_t received_s = 0;
    uint64_t received_ns = 0;
    uint64_t dropped = 0;
    uint64_t bytes_written = 0;
};

// A receiver of sensor frames written by a bridge over RDMA into a ring of pages.
class RoceReceiverInterfaceV1 {
public:
    virtual ~RoceReceiverInterfaceV1() = default;

    // Brings the receiver up; throws std::runtime_error when it cannot be.
    virtual hololink_module_status_t start(const std::string &ibv_name, unsigned ibv_port,
                                           uint64_t cu_buffer, size_t cu_buffer_size,
                                           size_t cu_frame_size, size_t cu_page_size,
                                           unsigned pages, size_t metadata_offset,
                                           const std::string &peer_ip, unsigned queue_size) = 0;
    // Ends a run; blocking_monitor then returns. Any thread, any time.
    virtual void close() = 0;
    // Receives until close(); run it on a thread of its own.
    virtual void blocking_monitor() = 0;
    // Takes the next frame, waiting up to timeout_ms; false when none came.
    virtual bool get_next_frame(unsigned timeout_ms, RoceReceiverFrameInfoV1 &info) = 0;
    // Whether get_next_frame would return at once.
    virtual bool frames_ready() = 0;
    // Called on the monitor's thread each time a frame is ready.
    virtual void set_frame_ready(std::function<void()> callback) = 0;
    virtual uint32_t get_qp_number() = 0;
    virtual uint32_t get_rkey() = 0;
    virtual uint64_t external_frame_memory() = 0;
    virtual size_t frame_size() = 0;
    virtual size_t page_size() = 0;
    virtual unsigned pages() = 0;
};

// V1 plus: whether a fatal event has stopped the receive path until the next start().
class RoceReceiverInterfaceV2 : public RoceReceiverInterfaceV1 {
public:
    virtual bool receive_path_failed() = 0;
};

}  // namespace standin
