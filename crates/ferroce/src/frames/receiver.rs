//! The frame receiver (Hololink's `RoceReceiverInterfaceV2`): a UC queue pair whose region is
//! a ring of pages, each holding one frame and its metadata block.
//!
//! The device writes every packet of a frame with its own RETH and ends the frame with a
//! WRITE WITH IMMEDIATE naming the page; only that last packet produces a completion. Beyond
//! what the engine checks (ICRC, QP, source address, key, range), a [`WriteFilter`] on the
//! queue pair keeps every packet inside one page of the ring, refuses pages past `pages`,
//! and tallies packets, bytes and PSN gaps per frame, so each frame says what it lost.

use std::collections::VecDeque;
use std::net::IpAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use ferroce_proto::memory::WriteOrder;
use ferroce_proto::qp::{QpCaps, QpType, RecvWr, WcOpcode, WcStatus};
use ferroce_proto::wire::Qpn;
use ferroce_proto::{InboundWrite, Psn, WriteFilter};

use super::metadata::{round_up, ExtendedCounter, ImmediateLayout, Metadata, METADATA_SIZE};
use crate::device::DeviceMemory;
use crate::memory::show_copied;
use crate::qp::{ConnectOptions, Mtu, QpEndpoint};
use crate::{Cq, MappedMemory, Nic, Qp, Region, RegionAccess, RegionError, RegionMemory};

/// The UDP source port a sensor bridge sends its data from (`DP_PACKET_UDP_PORT`).
pub const BRIDGE_DATA_PORT: u16 = 12288;

/// The most pages a bridge cycles through (`DP_MAX_BUFF` holds 12 bits).
pub const MAX_PAGES: u32 = 4096;

/// Receive requests kept posted: one is used by each frame, and reposted at once.
const RECV_DEPTH: usize = 256;

/// How often the monitor checks that the NIC's address still exists.
const HEALTH_INTERVAL: Duration = Duration::from_millis(200);

/// How a [`Receiver`] is started: Hololink's `start` parameters, less the device name (the
/// [`Nic`] is passed instead).
#[derive(Debug)]
pub struct ReceiverConfig {
    /// The memory frames land in (seed: `cu_buffer` and `cu_buffer_size`). Its length must
    /// hold `pages × page_size` bytes. [`RegionMemory::Mapped`] (what
    /// [`ReceiverConfig::for_frames`] gives) needs no locked-memory allowance on the soft NIC
    /// and lets [`Receiver::frame_view`] hand frames out without a copy.
    pub memory: RegionMemory,
    /// Bytes of frame data the device sends per frame (`cu_frame_size`).
    pub frame_size: usize,
    /// Bytes from one page to the next (`cu_page_size`): a multiple of 128 with room for the
    /// frame and the metadata block.
    pub page_size: usize,
    /// Pages the device cycles through, 1 to 4096.
    pub pages: u32,
    /// Where, from the start of a page, the device writes the 128-byte metadata block; at or
    /// after the frame's end.
    pub metadata_offset: usize,
    /// The device's address: packets from any other are dropped (`wrong_source`).
    pub peer_ip: IpAddr,
    /// Completed frames held while the application is busy; the oldest is dropped when a
    /// frame completes with this many waiting. 1 to `pages`.
    pub queue_size: usize,
    /// How the immediate names the page (bridges from HSB IP 0x2603 on use
    /// [`ImmediateLayout::Page12`]).
    pub immediate: ImmediateLayout,
    /// Device memory the frames are delivered into (Hololink's `cu_buffer` as CUDA memory:
    /// `ferroce::cuda::CudaMemory` with the `cuda` feature), or `None` for frames to stay in
    /// `memory`. With it, `memory` is the staging ring the NIC writes, and when a frame ends
    /// its data and metadata block are copied to the same offsets of the device memory
    /// before the frame is queued; a copy that fails is a fatal event. It must hold
    /// `pages × page_size` bytes too.
    pub device_memory: Option<Arc<dyn DeviceMemory>>,
}

impl ReceiverConfig {
    /// A configuration in the bridge's own layout for `pages` frames of `frame_size` bytes:
    /// metadata at the frame's end rounded up to 128 bytes, and pages just large enough
    /// (what the bridge's host code computes). The memory is [`MappedMemory`], so frames can
    /// be viewed where they land; should the kernel refuse the mapping, it is pageable host
    /// memory, which works the same but offers no views.
    #[must_use]
    pub fn for_frames(frame_size: usize, pages: u32, peer_ip: IpAddr) -> Self {
        let metadata_offset = round_up(frame_size);
        let page_size = metadata_offset + METADATA_SIZE;
        let ring = page_size * pages as usize;
        let memory = MappedMemory::new(ring).map_or_else(
            |_| RegionMemory::Pageable(vec![0; ring]),
            RegionMemory::Mapped,
        );
        Self {
            memory,
            frame_size,
            page_size,
            pages,
            metadata_offset,
            peer_ip,
            queue_size: (pages as usize).clamp(1, 4),
            immediate: ImmediateLayout::Page12,
            device_memory: None,
        }
    }

    /// The same, delivering frames into `device` (staged in `memory`).
    #[must_use]
    pub fn with_device_memory(mut self, device: Arc<dyn DeviceMemory>) -> Self {
        self.device_memory = Some(device);
        self
    }
}

/// Why [`Receiver::start`] refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The receiver is running: `close` it first.
    #[error("the receiver is already started; close() it before starting again")]
    AlreadyStarted,
    /// A parameter is out of range.
    #[error("invalid {parameter}: {reason}")]
    Invalid {
        /// The parameter, by its name in [`ReceiverConfig`].
        parameter: &'static str,
        /// What is wrong and what would do.
        reason: String,
    },
    /// The frame memory could not be registered.
    #[error("cannot register the frame memory: {0}")]
    Region(#[from] RegionError),
    /// The queue pair could not be brought up.
    #[error("cannot bring the queue pair up: {0}")]
    Qp(String),
    /// The device named in `start_named` could not be opened.
    #[error("cannot open the device: {0}")]
    Device(String),
}

/// The local address packets to `peer` leave from (a UDP connect sends nothing).
fn route_source(peer: IpAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = if peer.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let probe = std::net::UdpSocket::bind((any, 0))?;
    probe.connect((peer, ferroce_proto::wire::ROCE_PORT))?;
    Ok(probe.local_addr()?.ip())
}

/// Why a call needs [`Receiver::start`] first (Hololink's receiver throws `std::runtime_error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the receiver has not been started")]
pub struct NotStarted;

/// How [`Receiver::blocking_monitor`] ended other than by `close`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MonitorError {
    /// `start` has not been called.
    #[error("the receiver has not been started")]
    NotStarted,
    /// A fatal event stopped the receive path; `start` again to recover.
    #[error("the receive path failed: {0}")]
    Failed(String),
}

/// One completed frame (Hololink's `RoceReceiverFrameInfoV1`, with what ferroce adds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    /// The page the frame is in; its data starts at `page × page_size` of the frame memory
    /// (of the device memory, when the receiver delivers there).
    pub page: u32,
    /// Frames completed by this run, counting from 1 (`received_frame_number`).
    pub received_frame_number: u64,
    /// The device's frame counter, widened past its 16 bits (`frame_number`).
    pub frame_number: u64,
    /// The immediate of the frame-ending WRITE (`imm_data`).
    pub imm: u32,
    /// When the receiver took the frame's completion (`received_s`/`received_ns`).
    pub received: SystemTime,
    /// Frames dropped by the queue so far in this run (`dropped`).
    pub dropped: u64,
    /// The metadata block, decoded.
    pub metadata: Metadata,
    /// Packets of this frame that landed.
    pub packets_received: u64,
    /// Packets of this frame missing from its PSN range.
    pub packets_lost: u64,
    /// Data bytes of this frame that landed (the metadata block not counted).
    pub bytes_received: u64,
    /// Whether the metadata's PSN is the one the immediate carries: when not, the device
    /// has already begun to overwrite the page.
    pub metadata_psn_matches: bool,
    /// How many times the device had begun writing this page when the frame ended;
    /// [`Receiver::read_frame`] compares it with the page's count now to tell whether the
    /// device has since begun to write the page again.
    pub page_epoch: u64,
    /// Whether the packet counts above were taken: on the soft NIC every WRITE passes the
    /// receiver; on a verbs device (`Nic::caps().per_packet_counters` false) the NIC writes
    /// memory itself, the counts are zero, and only the metadata and a check of the data
    /// (its CRC) can show loss.
    pub packets_counted: bool,
}

impl FrameInfo {
    /// Whether every byte the metadata announces arrived, with no packet lost. Without
    /// packet counts (a verbs device) only the metadata can say: its PSN must be the
    /// immediate's, and the caller should check the frame's CRC.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        if !self.packets_counted {
            return self.metadata_psn_matches;
        }
        self.packets_lost == 0
            && self.metadata_psn_matches
            && self.bytes_received >= self.metadata.bytes_written
    }
}

/// The receiver's own counters; packets the engine refused before the receiver saw them
/// are counted by the NIC (`icrc_err`, `unknown_qp`, `wrong_source`, `uc_access_err`, …).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FrameCounters {
    /// Frames completed.
    pub frames: u64,
    /// Completed frames dropped because `queue_size` frames were already waiting.
    pub frames_dropped: u64,
    /// Frames that lost packets or bytes, or whose metadata PSN did not match.
    pub incomplete_frames: u64,
    /// Packets missing from frames' PSN ranges.
    pub packets_lost: u64,
    /// Data packets landed.
    pub packets: u64,
    /// Packets that arrived after the packet ending their frame (reordered): they land in
    /// their page, but their frame was already reported without them.
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

#[derive(Debug, Default)]
struct AtomicCounters {
    frames: AtomicU64,
    frames_dropped: AtomicU64,
    incomplete_frames: AtomicU64,
    packets_lost: AtomicU64,
    packets: AtomicU64,
    late_packets: AtomicU64,
    page_out_of_range: AtomicU64,
    write_crosses_page: AtomicU64,
    page_mismatch: AtomicU64,
    metadata_misplaced: AtomicU64,
    metadata_psn_mismatch: AtomicU64,
}

fn bump(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl AtomicCounters {
    fn snapshot(&self) -> FrameCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FrameCounters {
            frames: get(&self.frames),
            frames_dropped: get(&self.frames_dropped),
            incomplete_frames: get(&self.incomplete_frames),
            packets_lost: get(&self.packets_lost),
            packets: get(&self.packets),
            late_packets: get(&self.late_packets),
            page_out_of_range: get(&self.page_out_of_range),
            write_crosses_page: get(&self.write_crosses_page),
            page_mismatch: get(&self.page_mismatch),
            metadata_misplaced: get(&self.metadata_misplaced),
            metadata_psn_mismatch: get(&self.metadata_psn_mismatch),
        }
    }
}

/// The page geometry the filter enforces.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    base: u64,
    page_size: u64,
    pages: u32,
    metadata_end: u64,
    frame_size: u64,
    layout: ImmediateLayout,
}

/// Packets of the frame in progress, as the filter saw them land.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    packets: u64,
    bytes: u64,
    first_psn: Option<Psn>,
}

/// A finished frame's tally, waiting for the monitor to take its completion.
#[derive(Clone, Copy, Debug)]
struct FrameTally {
    /// The page's epoch when the frame ended.
    epoch: u64,
    psn: Psn,
    packets: u64,
    bytes: u64,
    lost: u64,
}

#[derive(Debug, Default)]
struct TallyBook {
    current: Tally,
    /// The PSN of the previous frame's last packet: the next frame starts after it.
    last_end: Option<Psn>,
    done: VecDeque<FrameTally>,
    /// Per page, how many times the device has begun writing it.
    epochs: Vec<u64>,
    /// The page the last packet landed in.
    writing: Option<u32>,
}

/// The [`WriteFilter`] on a receiver's queue pair.
struct PageFilter {
    geometry: Geometry,
    book: Arc<Mutex<TallyBook>>,
    counters: Arc<AtomicCounters>,
}

impl WriteFilter for PageFilter {
    fn admit(&mut self, write: &InboundWrite) -> bool {
        let g = self.geometry;
        let c = &self.counters;
        let Some(rel) = write.va.checked_sub(g.base) else {
            bump(&c.page_out_of_range, 1);
            return false;
        };
        let page = rel / g.page_size;
        if page >= u64::from(g.pages) {
            bump(&c.page_out_of_range, 1);
            return false;
        }
        let within = rel % g.page_size;
        let end = within + u64::from(write.len);
        if end > g.page_size {
            bump(&c.write_crosses_page, 1);
            return false;
        }
        let mut data = u64::from(write.len);
        if let Some(imm) = write.imm {
            let named = g.layout.page(imm);
            if named >= g.pages {
                bump(&c.page_out_of_range, 1);
                return false;
            }
            if u64::from(named) != page {
                bump(&c.page_mismatch, 1);
                return false;
            }
            if end != g.metadata_end || data < METADATA_SIZE as u64 {
                bump(&c.metadata_misplaced, 1);
                return false;
            }
            // Whatever precedes the metadata in this packet is the tail of the frame, then
            // the zero pad up to the metadata offset: count only the frame's bytes.
            data = (end - METADATA_SIZE as u64)
                .min(g.frame_size)
                .saturating_sub(within);
        }
        bump(&c.packets, 1);
        let mut book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
        if book.last_end.is_some_and(|end| !end.precedes(write.psn)) {
            // Reordered behind the end of its frame: it landed in that frame's page, but
            // the frame was already counted (as having lost it).
            bump(&c.late_packets, 1);
            return true;
        }
        let page = page as u32;
        if book.writing != Some(page) {
            book.writing = Some(page);
            if let Some(epoch) = book.epochs.get_mut(page as usize) {
                *epoch += 1;
            }
        }
        let tally = &mut book.current;
        tally.packets += 1;
        tally.bytes += data;
        tally.first_psn.get_or_insert(write.psn);
        if write.imm.is_some() {
            let start = book
                .last_end
                .map(Psn::next)
                .or(book.current.first_psn)
                .unwrap_or(write.psn);
            let expected =
                u64::from(write.psn.value().wrapping_sub(start.value()) & 0x00ff_ffff) + 1;
            let tally = std::mem::take(&mut book.current);
            book.last_end = Some(write.psn);
            if book.done.len() >= 4 * RECV_DEPTH {
                book.done.pop_front();
            }
            let epoch = book.epochs.get(page as usize).copied().unwrap_or(0);
            book.done.push_back(FrameTally {
                epoch,
                psn: write.psn,
                packets: tally.packets,
                bytes: tally.bytes,
                lost: expected.saturating_sub(tally.packets),
            });
        }
        true
    }
}

/// Everything one `start` brought up; torn down when the next `start` replaces it.
struct ReceivePath {
    nic: Nic,
    region: Region,
    qp: Qp,
    cq: Cq,
    frame_size: usize,
    page_size: usize,
    pages: u32,
    metadata_offset: usize,
    layout: ImmediateLayout,
    queue_size: usize,
    /// Where whole frames are copied, when not left in the region.
    device: Option<Arc<dyn DeviceMemory>>,
    /// The region's memory, when it may be viewed in place.
    mapped: Option<MappedMemory>,
    book: Arc<Mutex<TallyBook>>,
    closed: AtomicBool,
    /// Held by the thread in `blocking_monitor`.
    monitor: Mutex<()>,
}

impl Drop for ReceivePath {
    fn drop(&mut self) {
        self.qp.shutdown();
    }
}

#[derive(Default)]
struct Ready {
    frames: VecDeque<FrameInfo>,
    failed: Option<String>,
    received: u64,
    dropped: u64,
}

type Callback = Arc<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct ReceiverShared {
    run: Mutex<Option<Arc<ReceivePath>>>,
    ready: Mutex<Ready>,
    arrived: Condvar,
    callback: Mutex<Option<Callback>>,
    counters: Arc<AtomicCounters>,
}

/// A sensor-frame receiver (Hololink's `RoceReceiverInterfaceV2`). Cheap to clone: every
/// clone is the same receiver, so one thread can run [`Receiver::blocking_monitor`] while
/// another takes frames and a third calls [`Receiver::close`].
#[derive(Clone, Default)]
pub struct Receiver {
    shared: Arc<ReceiverShared>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("qp_number", &self.qp_number().ok())
            .field("failed", &self.receive_path_failed())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn invalid(parameter: &'static str, reason: String) -> StartError {
    StartError::Invalid { parameter, reason }
}

fn validate(nic: &Nic, c: &ReceiverConfig) -> Result<(), StartError> {
    if c.frame_size == 0 {
        return Err(invalid(
            "frame_size",
            "a frame needs at least one byte".into(),
        ));
    }
    if c.pages == 0 || c.pages > MAX_PAGES.min(c.immediate.max_pages()) {
        return Err(invalid(
            "pages",
            format!(
                "{} pages; the device cycles through 1 to {} with this immediate layout",
                c.pages,
                MAX_PAGES.min(c.immediate.max_pages())
            ),
        ));
    }
    if c.metadata_offset < c.frame_size {
        return Err(invalid(
            "metadata_offset",
            format!(
                "{} is inside the frame of {} bytes; the device writes metadata after the data \
                 (at {} in its own layout)",
                c.metadata_offset,
                c.frame_size,
                round_up(c.frame_size)
            ),
        ));
    }
    if c.page_size % METADATA_SIZE != 0 {
        return Err(invalid(
            "page_size",
            format!(
                "{} is not a multiple of 128 (the device steps pages in 128-byte units)",
                c.page_size
            ),
        ));
    }
    let needed = c.metadata_offset.saturating_add(METADATA_SIZE);
    if c.page_size < needed {
        return Err(invalid(
            "page_size",
            format!(
                "{} cannot hold the metadata block at offset {}: at least {needed} bytes",
                c.page_size, c.metadata_offset
            ),
        ));
    }
    let memory = c.memory.len();
    let ring = (c.page_size as u64).saturating_mul(c.pages.into());
    if memory < ring {
        return Err(invalid(
            "memory",
            format!(
                "{memory} bytes cannot hold {} pages of {} bytes ({ring} bytes)",
                c.pages, c.page_size
            ),
        ));
    }
    if let Some(device) = &c.device_memory {
        if device.size() < ring {
            return Err(invalid(
                "device_memory",
                format!(
                    "{} bytes of {} cannot hold {} pages of {} bytes ({ring} bytes)",
                    device.size(),
                    device.describe(),
                    c.pages,
                    c.page_size
                ),
            ));
        }
    }
    if c.queue_size == 0 || c.queue_size > c.pages as usize {
        return Err(invalid(
            "queue_size",
            format!("{}; it must be 1 to pages ({})", c.queue_size, c.pages),
        ));
    }
    if c.peer_ip.is_ipv4() != nic.addr().is_ipv4() {
        return Err(invalid(
            "peer_ip",
            format!(
                "{} is not of the NIC's address family ({})",
                c.peer_ip,
                nic.addr()
            ),
        ));
    }
    Ok(())
}

impl Receiver {
    /// A receiver that has not been started.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Brings the receiver up on the device called `ibv_name`, port `ibv_port` (Hololink's
    /// `RoceReceiverInterfaceV2::start(ibv_name, ibv_port, …)`): `ferroce0` is the soft NIC, any
    /// other name a verbs device (a RoCE NIC, or kernel rxe) whose RoCE v2 GID is that of the local
    /// address the route to `config.peer_ip` leaves from, as Hololink finds its device for a peer.
    /// Returns the NIC, whose address the device is to send to.
    ///
    /// # Errors
    ///
    /// [`StartError::Device`] when the device cannot be opened (no library, no RDMA in the
    /// kernel, no such device or port, no GID for the address); then those of
    /// [`Receiver::start`].
    pub fn start_named(
        &self,
        ibv_name: &str,
        ibv_port: u8,
        config: ReceiverConfig,
    ) -> Result<Nic, StartError> {
        let local = route_source(config.peer_ip).map_err(|e| {
            StartError::Device(format!("no route to the device at {}: {e}", config.peer_ip))
        })?;
        let options = crate::DeviceOptions {
            port: ibv_port,
            gid_index: None,
            local: Some(local),
        };
        let nic = Nic::open_device(ibv_name, &options, &crate::NicConfig::on(local))
            .map_err(|e| StartError::Device(e.to_string()))?;
        self.start(&nic, config)?;
        Ok(nic)
    }

    /// Brings the receiver up on `nic` (Hololink's `start`): registers the frame memory for
    /// remote writes, creates a UC queue pair that takes writes only from `peer_ip`, and
    /// posts its receive requests. Frames arrive once [`Receiver::blocking_monitor`] runs.
    /// After `close`, or after the receive path failed, `start` brings up a fresh run; the
    /// frame-ready callback is kept.
    ///
    /// # Errors
    ///
    /// [`StartError::AlreadyStarted`] while running; [`StartError::Invalid`] names a
    /// parameter out of range and says what would do; [`StartError::Region`] when the
    /// memory cannot be registered (the locked-memory limit, say).
    pub fn start(&self, nic: &Nic, config: ReceiverConfig) -> Result<(), StartError> {
        let mut slot = lock(&self.shared.run);
        if let Some(run) = slot.as_ref() {
            let failed = lock(&self.shared.ready).failed.is_some();
            if !run.closed.load(Ordering::SeqCst) && !failed {
                return Err(StartError::AlreadyStarted);
            }
            // Wait for a monitor still on its way out, then tear the old run down.
            run.closed.store(true, Ordering::SeqCst);
            run.nic.wake();
            drop(lock(&run.monitor));
        }
        *slot = None;
        validate(nic, &config)?;
        let ReceiverConfig {
            memory,
            frame_size,
            page_size,
            pages,
            metadata_offset,
            peer_ip,
            queue_size,
            immediate,
            device_memory,
        } = config;
        let mapped = match &memory {
            RegionMemory::Mapped(m) => Some(m.clone()),
            _ => None,
        };
        let region =
            Region::register(nic, RegionAccess::RemoteWrite, WriteOrder::AnyOrder, memory)?;
        // Room for two whole frames in the socket, so a monitor descheduled for a frame time
        // loses nothing (never below the NIC's 8 MiB; unprivileged, rmem_max caps it).
        let _ = nic.grow_buffers((2 * page_size).clamp(8 << 20, 256 << 20));
        let cq = Cq::new(nic, RECV_DEPTH * 2).map_err(|e| StartError::Qp(e.to_string()))?;
        let qp = Qp::new(
            nic,
            QpType::Uc,
            &cq,
            &cq,
            QpCaps {
                sq_depth: 1,
                rq_depth: RECV_DEPTH as u32,
                max_inline: 0,
            },
        )
        .map_err(|e| StartError::Qp(e.to_string()))?;
        for i in 0..RECV_DEPTH {
            qp.post_recv(RecvWr {
                wr_id: i as u64,
                sges: Vec::new(),
            })
            .map_err(|e| StartError::Qp(e.to_string()))?;
        }
        // The device has no queue pair of its own to name; it sends from its data port.
        let device = QpEndpoint {
            qpn: Qpn::from_low_bits(0),
            psn: Psn::default(),
            addr: std::net::SocketAddr::new(peer_ip, BRIDGE_DATA_PORT),
        };
        let options = ConnectOptions {
            mtu: Mtu::M4096,
            access: RegionAccess::RemoteWrite,
            ..ConnectOptions::default()
        };
        qp.connect(&device, &options)
            .map_err(|e| StartError::Qp(e.to_string()))?;
        let book = Arc::new(Mutex::new(TallyBook {
            epochs: vec![0; pages as usize],
            ..TallyBook::default()
        }));
        let filter = PageFilter {
            geometry: Geometry {
                base: region.va(),
                page_size: page_size as u64,
                pages,
                metadata_end: (metadata_offset + METADATA_SIZE) as u64,
                frame_size: frame_size as u64,
                layout: immediate,
            },
            book: Arc::clone(&book),
            counters: Arc::clone(&self.shared.counters),
        };
        // The soft engine shows the receiver every WRITE; a verbs device places them in
        // hardware and shows it none (`Unsupported`): its frames are checked as they complete.
        let _ = qp.set_write_filter(Box::new(filter));
        *lock(&self.shared.ready) = Ready::default();
        *slot = Some(Arc::new(ReceivePath {
            nic: nic.clone(),
            region,
            qp,
            cq,
            frame_size,
            page_size,
            pages,
            metadata_offset,
            layout: immediate,
            queue_size,
            device: device_memory,
            mapped,
            book,
            closed: AtomicBool::new(false),
            monitor: Mutex::new(()),
        }));
        Ok(())
    }

    fn run(&self) -> Result<Arc<ReceivePath>, NotStarted> {
        lock(&self.shared.run).clone().ok_or(NotStarted)
    }

    /// Runs the receive path on this thread until [`Receiver::close`] (Hololink's
    /// `blocking_monitor`): it receives the stream's packets, completes frames, queues them
    /// and runs the frame-ready callback. Give it a thread of its own.
    ///
    /// # Errors
    ///
    /// [`MonitorError::NotStarted`] before `start`; [`MonitorError::Failed`] when a fatal
    /// event (the socket failing, the NIC's address removed, the queue pair in error, a
    /// callback that panicked) stopped the receive path, which
    /// [`Receiver::receive_path_failed`] then reports.
    pub fn blocking_monitor(&self) -> Result<(), MonitorError> {
        let run = self.run().map_err(|_| MonitorError::NotStarted)?;
        let _monitor = lock(&run.monitor);
        let mut frame_numbers = ExtendedCounter::default();
        let mut scratch = Vec::new();
        let mut last_check = Instant::now();
        loop {
            if run.closed.load(Ordering::SeqCst) {
                return Ok(());
            }
            if let Some(reason) = lock(&self.shared.ready).failed.clone() {
                return Err(MonitorError::Failed(reason));
            }
            if last_check.elapsed() >= HEALTH_INTERVAL {
                last_check = Instant::now();
                if let Some(reason) = run.nic.failure() {
                    return Err(self.fail(format!("the NIC failed: {reason}")));
                }
                // A verbs device reports a QP or CQ error as an async event, which may come
                // with no completion at all.
                if let Some(reason) = run.qp.failure().or_else(|| run.cq.failure()) {
                    return Err(self.fail(format!("the queue pair failed: {reason}")));
                }
                if run.nic.address_gone() {
                    return Err(self.fail(format!(
                        "the NIC's address {} is no longer on this host",
                        run.nic.addr().ip()
                    )));
                }
            }
            let Some(c) = run.cq.drive(HEALTH_INTERVAL) else {
                continue;
            };
            if run.closed.load(Ordering::SeqCst) {
                return Ok(());
            }
            if c.status != WcStatus::Success {
                // A closing run flushes its receives; anything else is fatal.
                return Err(self.fail(format!("a receive completed with status \"{}\"", c.status)));
            }
            if c.opcode == WcOpcode::RecvRdmaWithImm {
                if let Err(reason) = self.complete(&run, c.imm, &mut frame_numbers, &mut scratch) {
                    return Err(self.fail(reason));
                }
            }
            if let Err(e) = run.qp.post_recv(RecvWr {
                wr_id: c.wr_id,
                sges: Vec::new(),
            }) {
                return Err(self.fail(format!("cannot repost a receive: {e}")));
            }
        }
    }

    /// Marks the receive path failed and wakes everyone waiting for a frame.
    fn fail(&self, reason: String) -> MonitorError {
        let mut ready = lock(&self.shared.ready);
        ready.failed.get_or_insert(reason.clone());
        drop(ready);
        self.shared.arrived.notify_all();
        MonitorError::Failed(reason)
    }

    /// Builds the frame a completion ends, queues it and runs the callback.
    fn complete(
        &self,
        run: &ReceivePath,
        imm: Option<u32>,
        frame_numbers: &mut ExtendedCounter,
        scratch: &mut Vec<u8>,
    ) -> Result<(), String> {
        let received = SystemTime::now();
        let imm = imm.unwrap_or(0);
        let page = run.layout.page(imm);
        // The filter refused any page out of range; check again rather than trust it.
        if page >= run.pages {
            bump(&self.shared.counters.page_out_of_range, 1);
            return Ok(());
        }
        let imm_psn = run.layout.psn(imm);
        let mask = run.layout.psn_mask();
        let tally = {
            let mut book = lock(&run.book);
            loop {
                match book.done.pop_front() {
                    Some(t) if t.psn.value() & mask == imm_psn => break Some(t),
                    Some(_) => {}
                    None => break None,
                }
            }
        };
        let mut block = [0; METADATA_SIZE];
        let at = u64::from(page) * run.page_size as u64 + run.metadata_offset as u64;
        run.region
            .read(at, &mut block)
            .map_err(|e| format!("cannot read the metadata of page {page}: {e}"))?;
        let metadata = Metadata::parse(&block);
        if let Some(device) = &run.device {
            let data = metadata.bytes_written.min(run.frame_size as u64);
            copy_to_device(run, device.as_ref(), page, data, scratch).map_err(|e| {
                format!(
                    "copying frame {} (page {page}) to {} failed: {e}",
                    metadata.frame_number,
                    device.describe()
                )
            })?;
        }
        let metadata_psn_matches = metadata.psn & mask == imm_psn;
        let (packets_received, packets_lost, bytes_received, page_epoch) =
            tally.map_or((0, 0, 0, 0), |t| (t.packets, t.lost, t.bytes, t.epoch));
        let counters = &self.shared.counters;
        bump(&counters.frames, 1);
        bump(&counters.packets_lost, packets_lost);
        if !metadata_psn_matches {
            bump(&counters.metadata_psn_mismatch, 1);
        }
        let mut ready = lock(&self.shared.ready);
        ready.received += 1;
        if ready.frames.len() >= run.queue_size {
            ready.frames.pop_front();
            ready.dropped += 1;
            bump(&counters.frames_dropped, 1);
        }
        let info = FrameInfo {
            page,
            received_frame_number: ready.received,
            frame_number: frame_numbers.update(metadata.frame_number),
            imm,
            received,
            dropped: ready.dropped,
            metadata,
            packets_received,
            packets_lost,
            bytes_received,
            metadata_psn_matches,
            page_epoch,
            packets_counted: run.nic.caps().per_packet_counters,
        };
        if !info.is_complete() {
            bump(&counters.incomplete_frames, 1);
        }
        ready.frames.push_back(info);
        drop(ready);
        self.shared.arrived.notify_all();
        let callback = lock(&self.shared.callback).clone();
        if let Some(callback) = callback {
            catch_unwind(AssertUnwindSafe(|| callback())).map_err(|panic| {
                let what =
                    crate::panic_message(panic.as_ref()).unwrap_or_else(|| "no message".into());
                format!("the frame-ready callback panicked: {what}")
            })?;
        }
        Ok(())
    }

    /// Ends the run, returning [`Receiver::blocking_monitor`] to its caller (Hololink's
    /// `close`). Callable from any thread and more than once; does nothing before `start`.
    pub fn close(&self) {
        if let Some(run) = lock(&self.shared.run).as_ref() {
            run.closed.store(true, Ordering::SeqCst);
            run.nic.wake();
        }
        self.shared.arrived.notify_all();
    }

    /// Takes the next completed frame, waiting up to `timeout` (Hololink's
    /// `get_next_frame`). Frames come in the order they completed.
    ///
    /// Returns `Ok(None)` when the timeout passed first, and at once when the receive path
    /// has failed.
    ///
    /// # Errors
    ///
    /// [`NotStarted`] before `start`.
    pub fn next_frame(&self, timeout: Duration) -> Result<Option<FrameInfo>, NotStarted> {
        let run = self.run()?;
        let deadline = Instant::now() + timeout;
        let mut ready = lock(&self.shared.ready);
        loop {
            if ready.failed.is_some() {
                return Ok(None);
            }
            if let Some(frame) = ready.frames.pop_front() {
                return Ok(Some(frame));
            }
            let now = Instant::now();
            if now >= deadline || run.closed.load(Ordering::SeqCst) {
                return Ok(None);
            }
            ready = self
                .shared
                .arrived
                .wait_timeout(ready, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Whether [`Receiver::next_frame`] would return at once (Hololink's `frames_ready`):
    /// a frame is waiting, or the receive path has failed.
    #[must_use]
    pub fn frames_ready(&self) -> bool {
        let ready = lock(&self.shared.ready);
        !ready.frames.is_empty() || ready.failed.is_some()
    }

    /// Sets the callback run on the monitor's thread each time a frame becomes available
    /// (Hololink's `set_frame_ready`); `None` removes it. It is kept across `start`s. A
    /// callback that panics fails the receive path.
    pub fn set_frame_ready(&self, callback: Option<impl Fn() + Send + Sync + 'static>) {
        *lock(&self.shared.callback) = callback.map(|c| Arc::new(c) as Callback);
    }

    /// Whether a fatal event has stopped the receive path (Hololink's
    /// `receive_path_failed`); `start` again to recover.
    #[must_use]
    pub fn receive_path_failed(&self) -> bool {
        lock(&self.shared.ready).failed.is_some()
    }

    /// What stopped the receive path, if it failed.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        lock(&self.shared.ready).failed.clone()
    }

    /// The queue pair the device sends to (Hololink's `get_qp_number`).
    ///
    /// # Errors
    ///
    /// [`NotStarted`] before `start`.
    pub fn qp_number(&self) -> Result<u32, NotStarted> {
        Ok(self.run()?.qp.qpn().value())
    }

    /// The key the device presents (Hololink's `get_rkey`).
    ///
    /// # Errors
    ///
    /// [`NotStarted`] before `start`.
    pub fn rkey(&self) -> Result<u32, NotStarted> {
        Ok(self.run()?.region.rkey())
    }

    /// Where page 0 begins in the device's view of the frame memory (Hololink's
    /// `external_frame_memory`): page n is at this address plus n × `page_size`.
    ///
    /// # Errors
    ///
    /// [`NotStarted`] before `start`.
    pub fn external_frame_memory(&self) -> Result<u64, NotStarted> {
        Ok(self.run()?.region.va())
    }

    /// The `frame_size` `start` was given, 0 before.
    #[must_use]
    pub fn frame_size(&self) -> usize {
        self.run().map_or(0, |r| r.frame_size)
    }

    /// The `page_size` `start` was given, 0 before.
    #[must_use]
    pub fn page_size(&self) -> usize {
        self.run().map_or(0, |r| r.page_size)
    }

    /// The `pages` `start` was given, 0 before.
    #[must_use]
    pub fn pages(&self) -> u32 {
        self.run().map_or(0, |r| r.pages)
    }

    /// The `metadata_offset` `start` was given, 0 before.
    #[must_use]
    pub fn metadata_offset(&self) -> usize {
        self.run().map_or(0, |r| r.metadata_offset)
    }

    /// The device memory frames are delivered into, if `start` was given one: a frame's
    /// data starts at its [`DeviceMemory::address`] plus `page × page_size`.
    #[must_use]
    pub fn device_memory(&self) -> Option<Arc<dyn DeviceMemory>> {
        self.run().ok().and_then(|r| r.device.clone())
    }

    /// The NIC address the device sends to.
    ///
    /// # Errors
    ///
    /// [`NotStarted`] before `start`.
    pub fn local_addr(&self) -> Result<std::net::SocketAddr, NotStarted> {
        Ok(self.run()?.nic.addr())
    }

    /// Copies a frame's data (`out.len()` bytes from the start of its page; at most
    /// `metadata.bytes_written` are meaningful), from the device memory when the receiver
    /// delivers there. The page is the device's again once the ring
    /// wraps to it, so the copy is checked: if the device began writing the page again
    /// before or during it, the call says so rather than hand back a mix of two frames.
    ///
    /// # Errors
    ///
    /// [`FrameReadError::Overwritten`] when the device has begun rewriting the page (the
    /// application fell a ring behind); [`FrameReadError::OutOfPage`] when `out` runs past
    /// the page; [`FrameReadError::NotStarted`] before `start`; [`FrameReadError::Device`]
    /// when the device memory refused the copy.
    pub fn read_frame(&self, frame: &FrameInfo, out: &mut [u8]) -> Result<(), FrameReadError> {
        self.read_frame_with(frame, out, |_| {})
    }

    /// [`Receiver::read_frame`], showing each piece of the copy to `seen` as soon as it is
    /// copied, while it is still in the cache ([`Region::read_with`]): a CRC of the frame
    /// then reads it from memory once, not twice. What `seen` was shown belongs to a frame
    /// that was overwritten when the call returns [`FrameReadError::Overwritten`].
    ///
    /// # Errors
    ///
    /// As [`Receiver::read_frame`].
    pub fn read_frame_with(
        &self,
        frame: &FrameInfo,
        out: &mut [u8],
        mut seen: impl FnMut(&[u8]),
    ) -> Result<(), FrameReadError> {
        let (run, at) = self.frame_span(frame, out.len())?;
        epoch_checked(&run.book, frame.page, frame.page_epoch, || {
            match &run.device {
                Some(device) => {
                    device
                        .read(at, out)
                        .map_err(|e| FrameReadError::Device(e.to_string()))?;
                    seen(out);
                    Ok(())
                }
                None => run
                    .region
                    .read_with(at, out, &mut seen)
                    .map_err(|e| FrameReadError::Region(e.to_string())),
            }
        })
    }

    /// Shows the first `len` bytes of a frame's page to `seen`, a piece (64 KiB) at a time,
    /// without copying the frame out: what checks a frame (a CRC, say) where it landed, reading
    /// it from memory once and writing none ([`Region::inspect`]). A ring of host memory shows
    /// each piece where it lies; a mapped ring (the default, so that the ring has an address)
    /// and device memory copy each piece into a buffer of one piece, which stays in the
    /// cache, first. As with [`Receiver::read_frame`], the pieces belong to one frame only
    /// when the call returns `Ok`: the device may begin rewriting the page while `seen` looks,
    /// and the call then says so.
    ///
    /// `seen` must not read from the receiver or poll its NIC ([`Region::inspect`]).
    ///
    /// # Errors
    ///
    /// As [`Receiver::read_frame`], with `len` for the length of `out`.
    pub fn inspect_frame(
        &self,
        frame: &FrameInfo,
        len: usize,
        mut seen: impl FnMut(&[u8]),
    ) -> Result<(), FrameReadError> {
        let (run, at) = self.frame_span(frame, len)?;
        epoch_checked(&run.book, frame.page, frame.page_epoch, || {
            match &run.device {
                Some(device) => show_copied(
                    len as u64,
                    |off, piece| {
                        device
                            .read(at + off, piece)
                            .map_err(|e| FrameReadError::Device(e.to_string()))
                    },
                    &mut seen,
                ),
                None => run
                    .region
                    .inspect(at, len as u64, &mut seen)
                    .map_err(|e| FrameReadError::Region(e.to_string())),
            }
        })
    }

    /// The receive path and where a frame's page starts in the ring, if `len` bytes fit in
    /// the page.
    fn frame_span(
        &self,
        frame: &FrameInfo,
        len: usize,
    ) -> Result<(Arc<ReceivePath>, u64), FrameReadError> {
        let run = self.run().map_err(|_| FrameReadError::NotStarted)?;
        if frame.page >= run.pages || len > run.page_size {
            return Err(FrameReadError::OutOfPage {
                page: frame.page,
                len,
                page_size: run.page_size,
            });
        }
        let at = u64::from(frame.page) * run.page_size as u64;
        Ok((run, at))
    }

    /// A view of a frame where it landed, without a copy: in the ring when it is
    /// [`RegionMemory::Mapped`], or in the device memory the receiver delivers to. The view
    /// keeps that memory alive (even after [`Receiver::close`], another `start` or the
    /// receiver's drop), so its address stays valid as long as the view. What it does not
    /// hold still is the page: once the ring wraps to it the device writes it again, and
    /// [`FrameView::is_current`] turns false; [`FrameView::copy_into`] is the checked copy.
    ///
    /// # Errors
    ///
    /// [`FrameReadError::NotStarted`] before `start`; [`FrameReadError::OutOfPage`] for a page
    /// the ring does not have; [`FrameReadError::Overwritten`] when the page is being written
    /// again already; [`FrameReadError::NoView`] when the ring is memory Rust owns
    /// ([`RegionMemory::Host`] or [`RegionMemory::Pageable`]), which is never handed out.
    pub fn frame_view(&self, frame: &FrameInfo) -> Result<FrameView, FrameReadError> {
        let run = self.run().map_err(|_| FrameReadError::NotStarted)?;
        if frame.page >= run.pages {
            return Err(FrameReadError::OutOfPage {
                page: frame.page,
                len: 0,
                page_size: run.page_size,
            });
        }
        let memory = match (&run.device, &run.mapped) {
            (Some(device), _) => ViewSource::Device(Arc::clone(device)),
            (None, Some(mapped)) => ViewSource::Host(mapped.clone()),
            (None, None) => {
                return Err(FrameReadError::NoView(
                    "the ring is memory the region owns; start the receiver on \
                     RegionMemory::Mapped (ReceiverConfig::for_frames does) to view frames"
                        .into(),
                ))
            }
        };
        let view = FrameView {
            memory,
            book: Arc::clone(&run.book),
            page: frame.page,
            epoch: frame.page_epoch,
            offset: u64::from(frame.page) * run.page_size as u64,
            len: (frame.metadata.bytes_written as usize).min(run.frame_size),
            page_size: run.page_size,
        };
        if !view.is_current() {
            return Err(FrameReadError::Overwritten { page: frame.page });
        }
        Ok(view)
    }

    /// A snapshot of the receiver's counters (kept across `start`s).
    #[must_use]
    pub fn counters(&self) -> FrameCounters {
        self.shared.counters.snapshot()
    }
}

/// Why [`Receiver::read_frame`] refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameReadError {
    /// `start` has not been called.
    #[error("the receiver has not been started")]
    NotStarted,
    /// The read would run past the frame's page.
    #[error("{len} bytes of page {page} run past the page of {page_size} bytes")]
    OutOfPage {
        /// The page.
        page: u32,
        /// The bytes asked for.
        len: usize,
        /// The page size.
        page_size: usize,
    },
    /// The device has begun writing the frame's page again: the frame is gone.
    #[error("page {page} is being rewritten by the device: the frame was overtaken")]
    Overwritten {
        /// The page.
        page: u32,
    },
    /// The region refused.
    #[error("{0}")]
    Region(String),
    /// The device memory refused the copy back.
    #[error("{0}")]
    Device(String),
    /// The frame cannot be viewed in place; the text says why and what would do.
    #[error("{0}")]
    NoView(String),
}

/// Where a [`FrameView`] points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewMemory {
    /// Host memory: [`FrameView::addr`] is a pointer in this process.
    Host,
    /// CUDA device memory: [`FrameView::addr`] is a `CUdeviceptr` on device `ordinal`.
    Cuda {
        /// The device's ordinal.
        ordinal: u32,
    },
    /// Memory of another device ([`DeviceMemory::describe`] names it).
    Device,
}

#[derive(Clone, Debug)]
enum ViewSource {
    Host(MappedMemory),
    Device(Arc<dyn DeviceMemory>),
}

/// A frame where it landed ([`Receiver::frame_view`]): an address and a length to hand to
/// NumPy, CuPy, DLPack or C without copying, plus the check that tells whether the device
/// has since begun writing the page again.
///
/// The address stays valid while the view (or a clone) lives. The bytes at it belong to the
/// device once the ring wraps: a reader that keeps a view past that reads the next frame, or
/// a mix of two. [`FrameView::is_current`] after reading says whether what was read was the
/// frame's; [`FrameView::copy_into`] does that check for a copy. On a verbs device the NIC
/// writes the ring itself and the receiver sees no packets, so the page epoch cannot change
/// and only the frame's own check (its CRC) can tell.
#[derive(Clone, Debug)]
pub struct FrameView {
    memory: ViewSource,
    book: Arc<Mutex<TallyBook>>,
    page: u32,
    epoch: u64,
    offset: u64,
    len: usize,
    page_size: usize,
}

impl FrameView {
    /// The address of the frame's first byte: host memory or a device pointer, as
    /// [`FrameView::memory`] says.
    #[must_use]
    pub fn addr(&self) -> u64 {
        match &self.memory {
            ViewSource::Host(m) => m.addr() + self.offset,
            ViewSource::Device(d) => d.address() + self.offset,
        }
    }

    /// The frame's data bytes: the metadata's `bytes_written`, at most the frame size.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the frame has no data bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frame's page.
    #[must_use]
    pub fn page(&self) -> u32 {
        self.page
    }

    /// Where the bytes are.
    #[must_use]
    pub fn memory(&self) -> ViewMemory {
        match &self.memory {
            ViewSource::Host(_) => ViewMemory::Host,
            ViewSource::Device(d) => d
                .cuda_ordinal()
                .map_or(ViewMemory::Device, |ordinal| ViewMemory::Cuda { ordinal }),
        }
    }

    /// Whether the device has stayed off the page since the frame ended: true means the bytes
    /// at [`FrameView::addr`] are still the frame's.
    #[must_use]
    pub fn is_current(&self) -> bool {
        page_at_epoch(&self.book, self.page, self.epoch)
    }

    /// Copies `out.len()` bytes from the start of the frame's page (at most the page size),
    /// checking before and after that the device stayed off the page.
    ///
    /// # Errors
    ///
    /// [`FrameReadError::Overwritten`] when the page was rewritten before or during the copy
    /// (`out` may then hold a mix of frames); [`FrameReadError::OutOfPage`] when `out` runs
    /// past the page; [`FrameReadError::Device`] when device memory refused the copy.
    pub fn copy_into(&self, out: &mut [u8]) -> Result<(), FrameReadError> {
        if out.len() > self.page_size {
            return Err(FrameReadError::OutOfPage {
                page: self.page,
                len: out.len(),
                page_size: self.page_size,
            });
        }
        epoch_checked(&self.book, self.page, self.epoch, || match &self.memory {
            ViewSource::Host(m) => m
                .read(self.offset, out)
                .map_err(|e| FrameReadError::Region(e.to_string())),
            ViewSource::Device(d) => d
                .read(self.offset, out)
                .map_err(|e| FrameReadError::Device(e.to_string())),
        })
    }
}

/// Whether `page` is still at `epoch`: the device has not begun writing it again.
fn page_at_epoch(book: &Mutex<TallyBook>, page: u32, epoch: u64) -> bool {
    lock(book).epochs.get(page as usize).copied() == Some(epoch)
}

/// Runs `copy` of a frame's page between two looks at the page's epoch: a copy the device
/// may have written into meanwhile could mix two frames, so it is refused as `Overwritten`.
fn epoch_checked(
    book: &Mutex<TallyBook>,
    page: u32,
    epoch: u64,
    copy: impl FnOnce() -> Result<(), FrameReadError>,
) -> Result<(), FrameReadError> {
    if !page_at_epoch(book, page, epoch) {
        return Err(FrameReadError::Overwritten { page });
    }
    copy()?;
    if !page_at_epoch(book, page, epoch) {
        return Err(FrameReadError::Overwritten { page });
    }
    Ok(())
}

/// Bytes moved from the staging ring to device memory per step.
const DEVICE_COPY_STEP: usize = 1 << 20;

/// Copies a finished frame, `data` bytes and the metadata block, from the staging ring to
/// the same offsets of the device memory. Runs on the monitor thread, which is also the one
/// that lands packets, so the device cannot write the page while it runs.
fn copy_to_device(
    run: &ReceivePath,
    device: &dyn DeviceMemory,
    page: u32,
    data: u64,
    scratch: &mut Vec<u8>,
) -> Result<(), String> {
    let base = u64::from(page) * run.page_size as u64;
    let metadata_at = base + run.metadata_offset as u64;
    let spans = [(base, data), (metadata_at, METADATA_SIZE as u64)];
    for (start, len) in spans {
        let mut at = start;
        let end = start + len;
        while at < end {
            let n = ((end - at) as usize).min(DEVICE_COPY_STEP);
            scratch.resize(n, 0);
            run.region
                .read(at, &mut scratch[..n])
                .map_err(|e| e.to_string())?;
            device.write(at, &scratch[..n]).map_err(|e| e.to_string())?;
            at += n as u64;
        }
    }
    Ok(())
}
