//! Sensor frames (Hololink's `RoceReceiverInterfaceV2`): `ferroce_receiver`, the
//! zero-copy `ferroce_frame`, and `ferroce_sender`, the device side.
//!
//! A receiver is thread-safe as Hololink's is: one thread runs
//! `ferroce_receiver_blocking_monitor`, another takes frames with
//! `ferroce_receiver_next_frame`, and any thread may call `ferroce_receiver_close`. Free it
//! only once the monitor has returned.

use std::ffi::{c_char, c_void};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use ferroce::frames::control::{DataChannel, RoceChannel};
use ferroce::frames::{
    FrameInfo, FrameReadError, FrameView, ImmediateLayout, Metadata, MonitorError, Pattern,
    Receiver, ReceiverConfig, SendError, Sender, StartError, Target, ViewMemory, METADATA_SIZE,
};
use ferroce::{MappedMemory, RegionMemory};

use crate::fence::{
    check_struct_size, copy_text, fence, fence_result, free_handle, handle, into_handle,
    struct_size_of, text_arg, versioned, write_out, Failure, Outcome,
};
use crate::ferroce_result;
use crate::nic::{ferroce_nic, parse_addr};
use crate::region::region_failure;

/// `immediate_layout`: HSB IP 0x2603 and later, `psn[19:0] << 12 | page[11:0]` (the default).
pub const FERROCE_IMMEDIATE_PAGE12: u32 = 0;
/// `immediate_layout`: older bridges (HSB-Lite 2510), `psn[23:0] << 8 | buffer[7:0]`.
pub const FERROCE_IMMEDIATE_BUFFER8: u32 = 1;

/// `ferroce_frame_memory`: the frame is in host memory; `ferroce_frame_data` points to it.
pub const FERROCE_FRAME_HOST: u32 = 0;
/// `ferroce_frame_memory`: the frame is in CUDA memory; `ferroce_frame_addr` is a
/// `CUdeviceptr` on device `ferroce_frame_cuda_ordinal`.
pub const FERROCE_FRAME_CUDA: u32 = 1;
/// `ferroce_frame_memory`: the frame is in another device's memory.
pub const FERROCE_FRAME_DEVICE: u32 = 2;

/// A sensor-frame receiver (Hololink's `RoceReceiverInterfaceV2`). Thread-safe.
pub struct ferroce_receiver {
    rx: Receiver,
}

/// A frame where it landed (`ferroce_receiver_frame_view`): its memory stays valid, at the
/// same address, until `ferroce_frame_free`, even after the receiver is closed or freed.
pub struct ferroce_frame {
    view: FrameView,
}

/// The device side of a frame stream: a sensor bridge's data plane in software.
pub struct ferroce_sender {
    sender: Mutex<Sender>,
}

/// How to start a receiver: Hololink's `start` parameters, less the device name (the NIC is
/// passed instead). Versioned: set `struct_size` to `sizeof`. The library allocates the
/// ring of pages itself, in host memory whose frames `ferroce_receiver_frame_view` hands out.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_receiver_config {
    /// `sizeof(ferroce_receiver_config)`.
    pub struct_size: u32,
    /// Pages the device cycles through, 1 to 4096 (`pages`).
    pub pages: u32,
    /// Bytes of frame data per frame (`cu_frame_size`).
    pub frame_size: usize,
    /// Bytes from one page to the next (`cu_page_size`), a multiple of 128 with room for the
    /// frame and the 128-byte metadata block; 0 for the bridge's own layout.
    pub page_size: usize,
    /// Where in a page the device writes the metadata block (`metadata_offset`), at or
    /// after the frame's end; 0 for the bridge's own layout (the frame size rounded up to
    /// 128).
    pub metadata_offset: usize,
    /// Completed frames held while the application is busy (`queue_size`); 0 for
    /// `min(pages, 4)`.
    pub queue_size: u32,
    /// `FERROCE_IMMEDIATE_*`.
    pub immediate_layout: u32,
    /// Caller-owned CUDA memory to deliver into (`cu_buffer`), a `CUdeviceptr` of
    /// `cuda_device`'s primary context holding `cu_buffer_size` bytes (at least
    /// `pages × page_size`), or 0 for frames to stay in the host ring. Frames land in the host
    /// ring and are copied there whole; the memory must stay allocated until the receiver is
    /// started again or freed. Needs a library built with the `cuda` feature (`UNSUPPORTED`
    /// otherwise).
    pub cu_buffer: u64,
    /// Bytes of ring to allocate (`cu_buffer_size`); 0 for `pages × page_size`, and never
    /// less than that.
    pub cu_buffer_size: usize,
    /// The device's IPv4 or IPv6 address as text (`peer_ip`): data from any other is dropped.
    pub peer_ip: *const c_char,
    /// The CUDA device `cu_buffer` is on (its ordinal); unused when `cu_buffer` is 0.
    pub cuda_device: u32,
}

/// One completed frame (Hololink's `RoceReceiverFrameInfoV1`, with Hololink's Linux
/// receiver's extras and ferroce's own). Versioned: set `struct_size` to `sizeof` before
/// passing it to `ferroce_receiver_next_frame`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_frame_info {
    /// `sizeof(ferroce_frame_info)`.
    pub struct_size: u32,
    /// The page the frame is in.
    pub page: u32,
    /// Where the frame's first byte is (`frame_memory`): in the caller's `cu_buffer` when the
    /// receiver delivers there (a CUDA address), else in the receiver's host ring (an
    /// address in this process), valid until the receiver is started again or freed. Its
    /// bytes are the device's again once the ring wraps; prefer a `ferroce_frame`.
    pub frame_memory: u64,
    /// Where its metadata block is (`metadata_memory`).
    pub metadata_memory: u64,
    /// Frames completed by this run, from 1 (`received_frame_number`).
    pub received_frame_number: u64,
    /// The device's frame counter, widened past its 16 bits (`frame_number`).
    pub frame_number: u64,
    /// Frames the queue dropped so far in this run (`dropped`).
    pub dropped: u64,
    /// When the receiver took the frame: seconds since the Unix epoch (`received_s`).
    pub received_s: u64,
    /// Nanoseconds part of `received_s` (`received_ns`).
    pub received_ns: u32,
    /// The immediate of the frame-ending WRITE (`imm_data`).
    pub imm_data: u32,
    /// Valid data bytes (the metadata's `bytes_written`).
    pub bytes_written: u64,
    /// The metadata's flags: bit 0, the frame ended early.
    pub flags: u32,
    /// The PSN of the packet that carried the metadata.
    pub psn: u32,
    /// The frame's CRC as the bridge computes it (JAMCRC), 0 when the device computes none.
    pub crc: u32,
    /// The device's frame counter as the metadata holds it.
    pub metadata_frame_number: u32,
    /// PTP seconds of the frame's first data (`timestamp_s`).
    pub timestamp_s: u64,
    /// PTP seconds when the metadata was formed (`metadata_s`).
    pub metadata_s: u64,
    /// Nanoseconds part of `timestamp_s`.
    pub timestamp_ns: u32,
    /// Nanoseconds part of `metadata_s`.
    pub metadata_ns: u32,
    /// Packets of this frame that landed (`frame_packets_received`).
    pub packets_received: u64,
    /// Packets missing from the frame's PSN range.
    pub packets_lost: u64,
    /// Data bytes that landed (`frame_bytes_received`).
    pub bytes_received: u64,
    /// The page's write count when the frame ended: what a view compares against.
    pub page_epoch: u64,
    /// Every byte the metadata announces arrived, no packet lost.
    pub complete: bool,
    /// The metadata's PSN is the immediate's: the device has not begun rewriting the page.
    pub metadata_psn_matches: bool,
    /// The packet counts above were taken (a soft NIC); on a verbs device they are 0.
    pub packets_counted: bool,
}

/// What `ferroce_sender_send_frame` sent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_frame_sent {
    /// The page written.
    pub page: u32,
    /// The frame number in the metadata.
    pub frame_number: u32,
    /// The PSN of the frame-ending packet.
    pub psn: u32,
    /// The frame's CRC-32 over its data.
    pub crc32: u32,
    /// Packets sent, the frame-ending one included.
    pub packets: u64,
    /// Data bytes sent.
    pub bytes: u64,
}

/// Where and how a sender writes frames: what a device's data channel is programmed with.
/// Versioned: set `struct_size` to `sizeof`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_sender_target {
    /// `sizeof(ferroce_sender_target)`.
    pub struct_size: u32,
    /// The receiver's queue pair (`ferroce_receiver_qp_number`).
    pub qp: u32,
    /// The receiver's NIC, `"127.0.0.2:4791"` (`ferroce_nic_addr`).
    pub dest: *const c_char,
    /// Where page 0 begins (`ferroce_receiver_external_frame_memory`).
    pub address: u64,
    /// Bytes from one page to the next.
    pub page_size: usize,
    /// Bytes of data per frame; the metadata goes at this rounded up to 128.
    pub frame_size: usize,
    /// Payload bytes per packet, a multiple of 128 up to 4096; 0 for 1408 (a 1500-byte link).
    pub payload: usize,
    /// The receiver's key (`ferroce_receiver_rkey`).
    pub rkey: u32,
    /// Pages to rotate through.
    pub pages: u32,
    /// `FERROCE_IMMEDIATE_*`.
    pub immediate_layout: u32,
    /// Fold the frame's tail and metadata into one packet, as the bridge's emulator does.
    pub fold_metadata: bool,
}

fn layout_arg(value: u32) -> Result<ImmediateLayout, Failure> {
    match value {
        FERROCE_IMMEDIATE_PAGE12 => Ok(ImmediateLayout::Page12),
        FERROCE_IMMEDIATE_BUFFER8 => Ok(ImmediateLayout::Buffer8),
        other => Err(Failure::invalid(format_args!(
            "immediate_layout {other} is not a FERROCE_IMMEDIATE_* value (0 or 1)"
        ))),
    }
}

fn start_failure(e: &StartError) -> Failure {
    match e {
        StartError::Region(r) => {
            let mut f = region_failure(r);
            f.message = e.to_string();
            f
        }
        StartError::Device(_) => Failure::new(ferroce_result::Device, e),
        StartError::Qp(_) => Failure::failed(e),
        _ => Failure::invalid(e),
    }
}

fn read_failure(e: &FrameReadError) -> Failure {
    match e {
        FrameReadError::NotStarted => Failure::new(ferroce_result::NotStarted, e),
        FrameReadError::Device(_) => Failure::new(ferroce_result::Device, e),
        FrameReadError::Overwritten { .. } | FrameReadError::Region(_) => Failure::failed(e),
        _ => Failure::invalid(e),
    }
}

fn not_started() -> Failure {
    Failure::new(
        ferroce_result::NotStarted,
        "the receiver has not been started: call ferroce_receiver_start first",
    )
}

fn send_failure(e: &SendError) -> Failure {
    match e {
        SendError::Io { .. } => Failure::failed(e),
        _ => Failure::invalid(e),
    }
}

/// The caller's frame info, checked, back into the Rust frame it describes.
fn frame_info(info: &ferroce_frame_info) -> Result<FrameInfo, Failure> {
    Ok(FrameInfo {
        page: info.page,
        received_frame_number: info.received_frame_number,
        frame_number: info.frame_number,
        imm: info.imm_data,
        received: UNIX_EPOCH + Duration::new(info.received_s, info.received_ns.min(999_999_999)),
        dropped: info.dropped,
        metadata: Metadata {
            flags: info.flags,
            psn: info.psn,
            crc: info.crc,
            timestamp_s: info.timestamp_s,
            timestamp_ns: info.timestamp_ns,
            bytes_written: info.bytes_written,
            frame_number: info.metadata_frame_number,
            metadata_s: info.metadata_s,
            metadata_ns: info.metadata_ns,
        },
        packets_received: info.packets_received,
        packets_lost: info.packets_lost,
        bytes_received: info.bytes_received,
        metadata_psn_matches: info.metadata_psn_matches,
        page_epoch: info.page_epoch,
        packets_counted: info.packets_counted,
    })
}

/// A new receiver that has not been started.
///
/// # Safety
///
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_new(out: *mut *mut ferroce_receiver) -> ferroce_result {
    fence_result("ferroce_receiver_new", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let rx = Receiver::new();
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_receiver { rx }), "out") }
    })
}

/// Brings the receiver up on `nic` (Hololink's `start`): allocates and registers the ring,
/// creates the queue pair that takes the device's writes, and posts its receives. Frames
/// arrive once `ferroce_receiver_blocking_monitor` runs. After `close`, or after the receive
/// path failed, `start` brings up a fresh run.
///
/// `INVALID` names a parameter out of range (or a receiver already running) and says what
/// would do.
///
/// # Safety
///
/// `rx` and `nic` are NULL or live; `config` is NULL or a `ferroce_receiver_config` of at
/// least its `struct_size` bytes whose `peer_ip` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_start(
    rx: *const ferroce_receiver,
    nic: *const ferroce_nic,
    config: *const ferroce_receiver_config,
) -> ferroce_result {
    fence_result("ferroce_receiver_start", || {
        // SAFETY: the caller promises NULL or live objects.
        let (rx, nic, c) = unsafe {
            (
                handle(rx, "rx")?,
                handle(nic, "nic")?,
                versioned(config, "config", "ferroce_receiver_config")?,
            )
        };
        // SAFETY: the caller promises NULL or a NUL-terminated string.
        let peer = unsafe { text_arg(c.peer_ip, "config.peer_ip") }?;
        let peer_ip: IpAddr = peer.trim().parse().map_err(|_| {
            Failure::invalid(format_args!(
                "config.peer_ip {peer:?} is not an IP address (\"192.168.0.2\")"
            ))
        })?;
        let mut config = ReceiverConfig::for_frames(c.frame_size, c.pages, peer_ip);
        if c.metadata_offset != 0 {
            config.metadata_offset = c.metadata_offset;
        }
        if c.page_size != 0 {
            config.page_size = c.page_size;
        } else {
            config.page_size = config.metadata_offset.saturating_add(METADATA_SIZE);
        }
        if c.queue_size != 0 {
            config.queue_size = c.queue_size as usize;
        }
        config.immediate = layout_arg(c.immediate_layout)?;
        let ring = config
            .page_size
            .checked_mul(c.pages as usize)
            .ok_or_else(|| Failure::invalid("pages × page_size overflows"))?;
        let bytes = if c.cu_buffer == 0 {
            ring.max(c.cu_buffer_size)
        } else {
            config.device_memory =
                Some(borrowed_cuda(c.cuda_device, c.cu_buffer, c.cu_buffer_size)?);
            ring
        };
        if bytes == 0 {
            // Let the receiver's own checks name the parameter.
            config.memory = RegionMemory::Pageable(Vec::new());
        } else {
            let mapped = MappedMemory::new(bytes).map_err(|e| region_failure(&e))?;
            config.memory = RegionMemory::Mapped(mapped);
        }
        rx.rx.start(&nic.nic, config).map_err(|e| start_failure(&e))
    })
}

/// The caller's CUDA memory for a receiver (Hololink's `cu_buffer`).
#[cfg(feature = "cuda")]
fn borrowed_cuda(
    device: u32,
    ptr: u64,
    size: usize,
) -> Result<std::sync::Arc<dyn ferroce::device::DeviceMemory>, Failure> {
    // SAFETY: `ferroce_receiver_start`'s contract: `cu_buffer` is `cu_buffer_size` bytes of
    // that device's primary context, allocated until the receiver starts again or is freed
    // (which drops the run holding this borrow).
    let memory =
        unsafe { ferroce::cuda::CudaMemory::from_raw(device, ptr, size) }.map_err(|e| {
            Failure::new(
                ferroce_result::Device,
                format_args!("config.cu_buffer on CUDA device {device}: {e}"),
            )
        })?;
    Ok(std::sync::Arc::new(memory))
}

/// Without the `cuda` feature, a `cu_buffer` is refused.
#[cfg(not(feature = "cuda"))]
fn borrowed_cuda(
    _device: u32,
    _ptr: u64,
    _size: usize,
) -> Result<std::sync::Arc<dyn ferroce::device::DeviceMemory>, Failure> {
    Err(Failure::new(
        ferroce_result::Unsupported,
        "config.cu_buffer: this library was built without the `cuda` feature; rebuild with \
         `cargo build --release -p ferroce-capi --features cuda`, or pass 0 and read frames \
         from the host ring (ferroce_receiver_frame_view)",
    ))
}

/// Runs the receive path on this thread until `ferroce_receiver_close` (Hololink's
/// `blocking_monitor`): receives packets, completes frames, queues them and runs the
/// frame-ready callback. Give it a thread of its own.
///
/// `OK` after `close`; `NOT_STARTED` before `start`; `FAILED` when a fatal event stopped
/// the receive path (the text says which), as `ferroce_receiver_receive_path_failed` then
/// reports.
///
/// # Safety
///
/// `rx` is NULL or a live receiver, not freed until this returns.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_blocking_monitor(
    rx: *const ferroce_receiver,
) -> ferroce_result {
    fence_result("ferroce_receiver_blocking_monitor", || {
        // SAFETY: the caller promises NULL or a live receiver.
        let rx = unsafe { handle(rx, "rx") }?;
        rx.rx.blocking_monitor().map_err(|e| match e {
            MonitorError::NotStarted => not_started(),
            other => Failure::failed(other),
        })
    })
}

/// Ends the run, returning `ferroce_receiver_blocking_monitor` to its caller (Hololink's
/// `close`). Callable from any thread and more than once; does nothing before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_close(rx: *const ferroce_receiver) {
    fence("ferroce_receiver_close", || {
        // SAFETY: the caller promises NULL or a live receiver.
        if let Ok(rx) = unsafe { handle(rx, "rx") } {
            rx.rx.close();
        }
    });
}

/// Takes the next completed frame, waiting up to `timeout_ms` (Hololink's `get_next_frame`);
/// frames come in the order they completed. Set `out->struct_size` first.
///
/// `TIMEOUT` when none came in time (or the receiver was closed); `FAILED` at once when the
/// receive path has failed; `NOT_STARTED` before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver; `out` is NULL or a writable `ferroce_frame_info`.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_next_frame(
    rx: *const ferroce_receiver,
    timeout_ms: u32,
    out: *mut ferroce_frame_info,
) -> ferroce_result {
    fence_result("ferroce_receiver_next_frame", || {
        // SAFETY: the caller promises NULL or a live receiver.
        let rx = unsafe { handle(rx, "rx") }?;
        // SAFETY: the caller promises NULL or a frame info whose `struct_size` is set.
        let given = unsafe { struct_size_of(out.cast_const(), "out") }?;
        check_struct_size("ferroce_frame_info", given, size_of::<ferroce_frame_info>())?;
        let timeout = Duration::from_millis(timeout_ms.into());
        let frame = rx.rx.next_frame(timeout).map_err(|_| not_started())?;
        let Some(f) = frame else {
            if let Some(reason) = rx.rx.failure() {
                return Err(Failure::failed(format_args!(
                    "the receive path failed: {reason}; start the receiver again"
                )));
            }
            return Err(Failure::new(
                ferroce_result::Timeout,
                format_args!("no frame within {timeout_ms} ms"),
            ));
        };
        // Frames delivered into device memory are read there, not in the staging ring.
        let base = match rx.rx.device_memory() {
            Some(device) => device.address(),
            None => rx.rx.external_frame_memory().unwrap_or(0),
        };
        let frame_memory = base + u64::from(f.page) * rx.rx.page_size() as u64;
        let received = f.received.duration_since(UNIX_EPOCH).unwrap_or_default();
        let info = ferroce_frame_info {
            struct_size: size_of::<ferroce_frame_info>() as u32,
            page: f.page,
            frame_memory,
            metadata_memory: frame_memory + rx.rx.metadata_offset() as u64,
            received_frame_number: f.received_frame_number,
            frame_number: f.frame_number,
            dropped: f.dropped,
            received_s: received.as_secs(),
            received_ns: received.subsec_nanos(),
            imm_data: f.imm,
            bytes_written: f.metadata.bytes_written,
            flags: f.metadata.flags,
            psn: f.metadata.psn,
            crc: f.metadata.crc,
            metadata_frame_number: f.metadata.frame_number,
            timestamp_s: f.metadata.timestamp_s,
            metadata_s: f.metadata.metadata_s,
            timestamp_ns: f.metadata.timestamp_ns,
            metadata_ns: f.metadata.metadata_ns,
            packets_received: f.packets_received,
            packets_lost: f.packets_lost,
            bytes_received: f.bytes_received,
            page_epoch: f.page_epoch,
            complete: f.is_complete(),
            metadata_psn_matches: f.metadata_psn_matches,
            packets_counted: f.packets_counted,
        };
        // SAFETY: checked readable above; the caller promises it is writable.
        unsafe { write_out(out, info, "out") }
    })
}

/// The receiver's counters, kept across starts (what Hololink's receivers report as
/// `frames`, `dropped`, `packets_dropped`, `rx_write_requests`, and ferroce's refusals by
/// name). Versioned: set `struct_size` to `sizeof` before passing it. Packets the NIC
/// refused before the receiver saw them (a bad ICRC, another source) are the NIC's counters.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_frame_counters {
    /// `sizeof(ferroce_frame_counters)`.
    pub struct_size: u32,
    /// Frames completed.
    pub frames: u64,
    /// Completed frames dropped because `queue_size` frames were already waiting.
    pub frames_dropped: u64,
    /// Frames that lost packets or bytes, or whose metadata PSN did not match.
    pub incomplete_frames: u64,
    /// Packets missing from frames' PSN ranges.
    pub packets_lost: u64,
    /// Data packets landed (`rx_write_requests`).
    pub packets: u64,
    /// Packets that arrived after the packet ending their frame.
    pub late_packets: u64,
    /// WRITEs to a page past `pages`, or an immediate naming one: refused.
    pub page_out_of_range: u64,
    /// WRITEs that would cross from one page into the next: refused.
    pub write_crosses_page: u64,
    /// Frame-ending WRITEs whose immediate names another page than their address: refused.
    pub page_mismatch: u64,
    /// Frame-ending WRITEs whose last 128 bytes miss the metadata offset: refused.
    pub metadata_misplaced: u64,
    /// Frames whose metadata PSN differs from the immediate's.
    pub metadata_psn_mismatch: u64,
}

/// Fills `*out` with the receiver's counters (see `ferroce_frame_counters`).
///
/// `NULL_PARAMETER` for a NULL `rx` or `out`; `INVALID` for an older, smaller
/// `struct_size`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver; `out` is NULL or a readable and writable
/// `ferroce_frame_counters` whose `struct_size` is set.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_counters(
    rx: *const ferroce_receiver,
    out: *mut ferroce_frame_counters,
) -> ferroce_result {
    fence_result("ferroce_receiver_counters", || {
        // SAFETY: the caller promises NULL or a live receiver.
        let rx = unsafe { handle(rx, "rx") }?;
        // SAFETY: the caller promises NULL or counters whose `struct_size` is set.
        let given = unsafe { struct_size_of(out.cast_const(), "out") }?;
        check_struct_size(
            "ferroce_frame_counters",
            given,
            size_of::<ferroce_frame_counters>(),
        )?;
        let c = rx.rx.counters();
        let counters = ferroce_frame_counters {
            struct_size: size_of::<ferroce_frame_counters>() as u32,
            frames: c.frames,
            frames_dropped: c.frames_dropped,
            incomplete_frames: c.incomplete_frames,
            packets_lost: c.packets_lost,
            packets: c.packets,
            late_packets: c.late_packets,
            page_out_of_range: c.page_out_of_range,
            write_crosses_page: c.write_crosses_page,
            page_mismatch: c.page_mismatch,
            metadata_misplaced: c.metadata_misplaced,
            metadata_psn_mismatch: c.metadata_psn_mismatch,
        };
        // SAFETY: checked readable above; the caller promises it is writable.
        unsafe { write_out(out, counters, "out") }
    })
}

/// Whether `ferroce_receiver_next_frame` would return at once (Hololink's `frames_ready`):
/// a frame is waiting, or the receive path has failed. False for a NULL `rx`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_frames_ready(rx: *const ferroce_receiver) -> bool {
    fence("ferroce_receiver_frames_ready", || {
        // SAFETY: the caller promises NULL or a live receiver.
        unsafe { handle(rx, "rx") }.is_ok_and(|rx| rx.rx.frames_ready())
    })
}

/// Whether a fatal event has stopped the receive path (Hololink's `receive_path_failed`);
/// `ferroce_receiver_start` again to recover. False for a NULL `rx`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_receive_path_failed(rx: *const ferroce_receiver) -> bool {
    fence("ferroce_receiver_receive_path_failed", || {
        // SAFETY: the caller promises NULL or a live receiver.
        unsafe { handle(rx, "rx") }.is_ok_and(|rx| rx.rx.receive_path_failed())
    })
}

/// What stopped the receive path, copied into `buf` as `snprintf` does; returns its full
/// length, 0 when it has not failed.
///
/// # Safety
///
/// `rx` is NULL or a live receiver; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_failure(
    rx: *const ferroce_receiver,
    buf: *mut c_char,
    len: usize,
) -> usize {
    fence("ferroce_receiver_failure", || {
        // SAFETY: the caller promises NULL or a live receiver.
        let Ok(rx) = (unsafe { handle(rx, "rx") }) else {
            return 0;
        };
        let text = rx.rx.failure().unwrap_or_default();
        // SAFETY: the caller's promise about `buf` and `len`.
        unsafe { copy_text(&text, buf, len) }
    })
}

/// A frame-ready callback (Hololink's `set_frame_ready` callback), called with the user data
/// it was registered with, on the monitor's thread; NULL for none.
pub type ferroce_frame_ready_fn = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// A frame-ready callback and its user data, carried to the monitor's thread.
struct FrameReady {
    callback: unsafe extern "C" fn(*mut c_void),
    user: *mut c_void,
}

// SAFETY: `ferroce_receiver_set_frame_ready` makes the caller promise that the callback may
// run on the monitor's thread with `user`; the pointer is only handed back to it.
unsafe impl Send for FrameReady {}
// SAFETY: as for Send; the callback runs on one thread at a time (the monitor's).
unsafe impl Sync for FrameReady {}

/// Sets the function run on the monitor's thread each time a frame becomes available
/// (Hololink's `set_frame_ready`), called with `user`; a NULL `callback` removes it. It is
/// kept across starts. Register it before the monitor starts.
///
/// The callback must return (not `longjmp` out) and must not throw a C++ exception; it may
/// call any function of this library except freeing this receiver.
///
/// # Safety
///
/// `rx` is NULL or a live receiver; `callback` is NULL or a function that may be called
/// from another thread with `user` until it is replaced or the receiver freed.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_set_frame_ready(
    rx: *const ferroce_receiver,
    callback: ferroce_frame_ready_fn,
    user: *mut c_void,
) -> ferroce_result {
    fence_result("ferroce_receiver_set_frame_ready", || {
        // SAFETY: the caller promises NULL or a live receiver.
        let rx = unsafe { handle(rx, "rx") }?;
        match callback {
            None => rx.rx.set_frame_ready(None::<fn()>),
            Some(callback) => {
                let ready = FrameReady { callback, user };
                rx.rx.set_frame_ready(Some(move || {
                    let ready = &ready;
                    // SAFETY: the caller of set_frame_ready promised the callback may run
                    // here with `user`.
                    unsafe { (ready.callback)(ready.user) }
                }));
            }
        }
        Ok(())
    })
}

/// Runs `get` on a started receiver; 0 and `NOT_STARTED` as the last error otherwise.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
unsafe fn started<T: Default>(
    rx: *const ferroce_receiver,
    get: impl FnOnce(&Receiver) -> Result<T, Failure>,
) -> T {
    // SAFETY: the caller promises NULL or a live receiver.
    let result = unsafe { handle(rx, "rx") }.and_then(|rx| get(&rx.rx));
    result.unwrap_or_else(|f| {
        crate::fence::set_last_error(f.message);
        T::default()
    })
}

/// The queue pair the device sends to (Hololink's `get_qp_number`); 0 before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_qp_number(rx: *const ferroce_receiver) -> u32 {
    fence("ferroce_receiver_qp_number", || {
        // SAFETY: the caller's promise.
        unsafe { started(rx, |rx| rx.qp_number().map_err(|_| not_started())) }
    })
}

/// The key the device presents (Hololink's `get_rkey`); 0 before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_rkey(rx: *const ferroce_receiver) -> u32 {
    fence("ferroce_receiver_rkey", || {
        // SAFETY: the caller's promise.
        unsafe { started(rx, |rx| rx.rkey().map_err(|_| not_started())) }
    })
}

/// Where page 0 begins in the device's view of the ring (Hololink's
/// `external_frame_memory`); page n is at this plus n × page size. 0 before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_external_frame_memory(
    rx: *const ferroce_receiver,
) -> u64 {
    fence("ferroce_receiver_external_frame_memory", || {
        // SAFETY: the caller's promise.
        unsafe {
            started(rx, |rx| {
                rx.external_frame_memory().map_err(|_| not_started())
            })
        }
    })
}

/// The UDP port of the NIC the device sends to (the channel reads it off the receiver as
/// `local_port`); 0 before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_local_port(rx: *const ferroce_receiver) -> u16 {
    fence("ferroce_receiver_local_port", || {
        // SAFETY: the caller's promise.
        unsafe {
            started(rx, |rx| {
                rx.local_addr().map(|a| a.port()).map_err(|_| not_started())
            })
        }
    })
}

/// The frame size `start` was given (Hololink's `frame_size`); 0 before.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_frame_size(rx: *const ferroce_receiver) -> usize {
    fence("ferroce_receiver_frame_size", || {
        // SAFETY: the caller's promise.
        unsafe { started(rx, |rx| Ok(rx.frame_size())) }
    })
}

/// The page size in use (Hololink's `page_size`); 0 before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_page_size(rx: *const ferroce_receiver) -> usize {
    fence("ferroce_receiver_page_size", || {
        // SAFETY: the caller's promise.
        unsafe { started(rx, |rx| Ok(rx.page_size())) }
    })
}

/// The pages `start` was given (Hololink's `pages`); 0 before.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_pages(rx: *const ferroce_receiver) -> u32 {
    fence("ferroce_receiver_pages", || {
        // SAFETY: the caller's promise.
        unsafe { started(rx, |rx| Ok(rx.pages())) }
    })
}

/// The metadata offset in use; 0 before `start`.
///
/// # Safety
///
/// `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_metadata_offset(rx: *const ferroce_receiver) -> usize {
    fence("ferroce_receiver_metadata_offset", || {
        // SAFETY: the caller's promise.
        unsafe { started(rx, |rx| Ok(rx.metadata_offset())) }
    })
}

/// Copies the first `len` bytes of a frame's page into `out` (at most the page size; the
/// first `bytes_written` are the frame's), checking that the device stayed off the page.
///
/// `FAILED` when the device has begun rewriting the page (the application fell a ring
/// behind); `INVALID` when `len` runs past the page.
///
/// # Safety
///
/// `rx` is NULL or a live receiver; `info` is NULL or a `ferroce_frame_info` of at least its
/// `struct_size` bytes; `out` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_read_frame(
    rx: *const ferroce_receiver,
    info: *const ferroce_frame_info,
    out: *mut c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_receiver_read_frame", || -> Outcome {
        // SAFETY: the caller promises NULL or live / readable.
        let (rx, info) = unsafe {
            (
                handle(rx, "rx")?,
                versioned(info, "info", "ferroce_frame_info")?,
            )
        };
        let frame = frame_info(info)?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: not NULL; the caller promises `len` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        rx.rx.read_frame(&frame, out).map_err(|e| read_failure(&e))
    })
}

/// A view of a frame where it landed, without a copy; `*out` receives it. The view keeps the
/// memory mapped until `ferroce_frame_free`; the page is the device's again once the ring
/// wraps to it, which `ferroce_frame_is_current` tells.
///
/// `FAILED` when the device has already begun rewriting the page.
///
/// # Safety
///
/// `rx` is NULL or a live receiver; `info` is NULL or a `ferroce_frame_info` of at least its
/// `struct_size` bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_frame_view(
    rx: *const ferroce_receiver,
    info: *const ferroce_frame_info,
    out: *mut *mut ferroce_frame,
) -> ferroce_result {
    fence_result("ferroce_receiver_frame_view", || {
        // SAFETY: the caller promises NULL or live / readable.
        let (rx, info) = unsafe {
            (
                handle(rx, "rx")?,
                versioned(info, "info", "ferroce_frame_info")?,
            )
        };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let frame = frame_info(info)?;
        let view = rx.rx.frame_view(&frame).map_err(|e| read_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_frame { view }), "out") }
    })
}

/// Frees the receiver; NULL does nothing. Close it and let the monitor return first.
///
/// # Safety
///
/// `rx` is NULL or a receiver from this library not freed before, which no other thread
/// uses (no monitor running, no call in flight).
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_free(rx: *mut ferroce_receiver) {
    fence("ferroce_receiver_free", || {
        // SAFETY: the caller promises NULL or a live receiver only this thread uses.
        if let Ok(r) = unsafe { handle(rx.cast_const(), "rx") } {
            r.rx.close();
        }
        // SAFETY: the caller's promise is free_handle's.
        unsafe { free_handle(rx) }
    });
}

/// The frame's first byte in host memory, for reading in place; NULL when the frame is in
/// device memory (`ferroce_frame_memory`) or `frame` is NULL. Valid until
/// `ferroce_frame_free`; read `ferroce_frame_len` bytes, then check
/// `ferroce_frame_is_current`.
///
/// # Safety
///
/// `frame` is NULL or a live frame.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_data(frame: *const ferroce_frame) -> *const u8 {
    fence("ferroce_frame_data", || {
        // SAFETY: the caller promises NULL or a live frame.
        match unsafe { handle(frame, "frame") } {
            Ok(f) if matches!(f.view.memory(), ViewMemory::Host) => {
                f.view.addr() as usize as *const u8
            }
            _ => std::ptr::null(),
        }
    })
}

/// The frame's address: a host pointer, or a device pointer (a `CUdeviceptr`) as
/// `ferroce_frame_memory` says; 0 for a NULL `frame`.
///
/// # Safety
///
/// `frame` is NULL or a live frame.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_addr(frame: *const ferroce_frame) -> u64 {
    fence("ferroce_frame_addr", || {
        // SAFETY: the caller promises NULL or a live frame.
        unsafe { handle(frame, "frame") }.map_or(0, |f| f.view.addr())
    })
}

/// The frame's data bytes (its `bytes_written`, at most the frame size); 0 for NULL.
///
/// # Safety
///
/// `frame` is NULL or a live frame.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_len(frame: *const ferroce_frame) -> usize {
    fence("ferroce_frame_len", || {
        // SAFETY: the caller promises NULL or a live frame.
        unsafe { handle(frame, "frame") }.map_or(0, |f| f.view.len())
    })
}

/// Where the frame is: `FERROCE_FRAME_HOST`, `FERROCE_FRAME_CUDA` or `FERROCE_FRAME_DEVICE`.
///
/// # Safety
///
/// `frame` is NULL or a live frame.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_memory(frame: *const ferroce_frame) -> u32 {
    fence("ferroce_frame_memory", || {
        // SAFETY: the caller promises NULL or a live frame.
        match unsafe { handle(frame, "frame") }.map(|f| f.view.memory()) {
            Ok(ViewMemory::Host) | Err(_) => FERROCE_FRAME_HOST,
            Ok(ViewMemory::Cuda { .. }) => FERROCE_FRAME_CUDA,
            Ok(_) => FERROCE_FRAME_DEVICE,
        }
    })
}

/// The CUDA device ordinal of a `FERROCE_FRAME_CUDA` frame; 0 otherwise.
///
/// # Safety
///
/// `frame` is NULL or a live frame.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_cuda_ordinal(frame: *const ferroce_frame) -> u32 {
    fence("ferroce_frame_cuda_ordinal", || {
        // SAFETY: the caller promises NULL or a live frame.
        match unsafe { handle(frame, "frame") }.map(|f| f.view.memory()) {
            Ok(ViewMemory::Cuda { ordinal }) => ordinal,
            _ => 0,
        }
    })
}

/// Whether the device has stayed off the frame's page since it ended: true means the bytes
/// at the frame's address are still the frame's. Check it after reading in place.
///
/// # Safety
///
/// `frame` is NULL or a live frame.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_is_current(frame: *const ferroce_frame) -> bool {
    fence("ferroce_frame_is_current", || {
        // SAFETY: the caller promises NULL or a live frame.
        unsafe { handle(frame, "frame") }.is_ok_and(|f| f.view.is_current())
    })
}

/// Copies the first `len` bytes of the frame's page into `out`, checking before and after
/// that the device stayed off the page (`FAILED` when it did not: `out` may hold a mix).
///
/// # Safety
///
/// `frame` is NULL or a live frame; `out` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_copy(
    frame: *const ferroce_frame,
    out: *mut c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_frame_copy", || {
        // SAFETY: the caller promises NULL or a live frame.
        let frame = unsafe { handle(frame, "frame") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: not NULL; the caller promises `len` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        frame.view.copy_into(out).map_err(|e| read_failure(&e))
    })
}

/// Frees the view (its memory may then be unmapped); NULL does nothing.
///
/// # Safety
///
/// `frame` is NULL or a frame from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_frame_free(frame: *mut ferroce_frame) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_frame_free", || unsafe { free_handle(frame) });
}

fn payload_arg(payload: usize) -> Result<usize, Failure> {
    let payload = if payload == 0 {
        Target::payload_for_mtu(1500)
    } else {
        payload
    };
    if payload % METADATA_SIZE != 0 || payload > 4096 {
        return Err(Failure::invalid(format_args!(
            "payload {payload}: a multiple of 128 up to 4096"
        )));
    }
    Ok(payload)
}

fn open_sender(local: &str, target: Target) -> Result<*mut ferroce_sender, Failure> {
    // An address alone binds any free port: 4791 is the receivers'.
    let local = match local.trim().parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, 0),
        Err(_) => parse_addr(local, "local")?,
    };
    let sender = Sender::new(local, target).map_err(|e| send_failure(&e))?;
    Ok(into_handle(ferroce_sender {
        sender: Mutex::new(sender),
    }))
}

/// A sender on `local` (an address, `"127.0.0.3"`, or an address and port) writing frames
/// to `target`, from page 0, frame 0 and PSN 0.
///
/// # Safety
///
/// `local` is NULL or a NUL-terminated string; `target` is NULL or a `ferroce_sender_target`
/// of at least its `struct_size` bytes whose `dest` is NULL or a NUL-terminated string; `out`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sender_new(
    local: *const c_char,
    target: *const ferroce_sender_target,
    out: *mut *mut ferroce_sender,
) -> ferroce_result {
    fence_result("ferroce_sender_new", || {
        // SAFETY: the caller promises NULL or readable.
        let t = unsafe { versioned(target, "target", "ferroce_sender_target") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller promises NULL or NUL-terminated strings.
        let (local, dest) =
            unsafe { (text_arg(local, "local")?, text_arg(t.dest, "target.dest")?) };
        let target = Target {
            dest: parse_addr(dest, "target.dest")?,
            qp: t.qp,
            rkey: t.rkey,
            address: t.address,
            page_size: t.page_size,
            pages: t.pages,
            frame_size: t.frame_size,
            payload: payload_arg(t.payload)?,
            immediate: layout_arg(t.immediate_layout)?,
            fold_metadata: t.fold_metadata,
        };
        let sender = open_sender(local, target)?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, sender, "out") }
    })
}

/// The target a device would be programmed with for a started receiver.
fn receiver_target(rx: &Receiver, payload: usize) -> Result<Target, Failure> {
    let dest = rx.local_addr().map_err(|_| not_started())?;
    Ok(Target {
        dest,
        qp: rx.qp_number().map_err(|_| not_started())?,
        rkey: rx.rkey().map_err(|_| not_started())?,
        address: rx.external_frame_memory().map_err(|_| not_started())?,
        page_size: rx.page_size(),
        pages: rx.pages(),
        frame_size: rx.frame_size(),
        payload: payload_arg(payload)?,
        immediate: ImmediateLayout::Page12,
        fold_metadata: false,
    })
}

/// A sender on `local` aimed at a started receiver of this process, as a device programmed
/// for it would be: its NIC, queue pair, key and ring; `payload` bytes per packet (0 for
/// 1408). The receiver must use `FERROCE_IMMEDIATE_PAGE12`.
///
/// # Safety
///
/// `local` is NULL or a NUL-terminated string; `rx` is NULL or a live receiver; `out` is NULL
/// or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sender_for_receiver(
    local: *const c_char,
    rx: *const ferroce_receiver,
    payload: usize,
    out: *mut *mut ferroce_sender,
) -> ferroce_result {
    fence_result("ferroce_sender_for_receiver", || {
        // SAFETY: the caller promises NULL or live / a NUL-terminated string.
        let (local, rx) = unsafe { (text_arg(local, "local")?, handle(rx, "rx")?) };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let target = receiver_target(&rx.rx, payload)?;
        let sender = open_sender(local, target)?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, sender, "out") }
    })
}

/// Sends one frame of `len` bytes from `data` (at most the target's frame size; fewer is an
/// early end, flagged in the metadata) into the next page, as fast as the socket takes it.
/// `sent` may be NULL.
///
/// # Safety
///
/// `sender` is NULL or a live sender; `data` is NULL or valid for reads of `len` bytes;
/// `sent` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sender_send_frame(
    sender: *const ferroce_sender,
    data: *const c_void,
    len: usize,
    sent: *mut ferroce_frame_sent,
) -> ferroce_result {
    fence_result("ferroce_sender_send_frame", || {
        // SAFETY: the caller promises NULL or a live sender.
        let sender = unsafe { handle(sender, "sender") }?;
        if data.is_null() && len > 0 {
            return Err(Failure::null("data"));
        }
        let data = if len == 0 {
            &[][..]
        } else {
            // SAFETY: not NULL; the caller promises `len` readable bytes.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }
        };
        let mut s = sender.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let info = s.send_frame(data, None).map_err(|e| send_failure(&e))?;
        drop(s);
        if !sent.is_null() {
            let value = ferroce_frame_sent {
                page: info.page,
                frame_number: info.frame_number,
                psn: info.psn,
                crc32: info.crc32,
                packets: info.packets,
                bytes: info.bytes,
            };
            // SAFETY: not NULL; the caller promises it is writable.
            unsafe { write_out(sent, value, "sent") }?;
        }
        Ok(())
    })
}

/// Sets the sender's next PSN (a bridge's is wherever its counter stands).
///
/// # Safety
///
/// `sender` is NULL or a live sender.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sender_set_psn(
    sender: *const ferroce_sender,
    psn: u32,
) -> ferroce_result {
    fence_result("ferroce_sender_set_psn", || {
        // SAFETY: the caller promises NULL or a live sender.
        let sender = unsafe { handle(sender, "sender") }?;
        sender
            .sender
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_psn(psn);
        Ok(())
    })
}

/// Frees the sender; NULL does nothing.
///
/// # Safety
///
/// `sender` is NULL or a sender from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sender_free(sender: *mut ferroce_sender) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_sender_free", || unsafe { free_handle(sender) });
}

/// Fills `len` bytes at `out` with frame `frame_number` of the test pattern `ferroce stream
/// send` sends, so a receiver can check a frame byte for byte.
///
/// # Safety
///
/// `out` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_pattern_fill(
    frame_number: u32,
    out: *mut c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_pattern_fill", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: not NULL; the caller promises `len` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        Pattern::Counter.fill(frame_number, out);
        Ok(())
    })
}

/// Programs the device whose control port is at `device` (`"127.0.0.3"`, port 8192 unless
/// given; a `ferroce stream send` or a sensor bridge) to send its frames to a started
/// receiver, `payload` bytes per packet (0 for 1408), over the bridge's register protocol.
///
/// # Safety
///
/// `device` is NULL or a NUL-terminated string; `rx` is NULL or a live receiver.
#[no_mangle]
pub unsafe extern "C" fn ferroce_receiver_program_device(
    rx: *const ferroce_receiver,
    device: *const c_char,
    payload: usize,
) -> ferroce_result {
    fence_result("ferroce_receiver_program_device", || {
        // SAFETY: the caller promises NULL or live / a NUL-terminated string.
        let (rx, text) = unsafe { (handle(rx, "rx")?, text_arg(device, "device")?) };
        let device = match text.trim().parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, ferroce::frames::control::CONTROL_PORT),
            Err(_) => parse_addr(text, "device")?,
        };
        let target = receiver_target(&rx.rx, payload)?;
        let host_ip = match target.dest.ip() {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        };
        let mut channel = DataChannel::new(device).map_err(Failure::failed)?;
        channel
            .configure_roce(&RoceChannel {
                qp: target.qp,
                rkey: target.rkey,
                address: target.address,
                frame_size: target.frame_size,
                page_size: target.page_size,
                pages: target.pages,
                payload: target.payload,
                host_ip,
                host_mac: [0; 6],
                host_port: target.dest.port(),
            })
            .map_err(|e| {
                Failure::new(
                    match e {
                        ferroce::frames::control::ControlError::Timeout { .. } => {
                            ferroce_result::Timeout
                        }
                        ferroce::frames::control::ControlError::Invalid(_) => {
                            ferroce_result::Invalid
                        }
                        _ => ferroce_result::Failed,
                    },
                    format_args!("cannot program the device at {device}: {e}"),
                )
            })
    })
}
