//! The RC and UC protocol engine: queue pairs, completion queues and the region table, driven
//! by datagrams, time and application commands, with no I/O of its own.
//!
//! The shape is quinn-proto's. Inputs: [`Engine::handle_datagram`] (a received UDP payload),
//! [`Engine::handle_timeout`] (time has passed) and the application's commands
//! ([`Engine::post_send`], [`Engine::post_recv`], [`Engine::modify_qp`], …). Outputs:
//! [`Engine::poll_transmit`] (the next packet to send), [`Engine::poll_timeout`] (when to call
//! `handle_timeout` next) and [`Engine::poll_completion`]. Time is passed in as an
//! [`Instant`]; the engine never reads a clock. After any input, drain `poll_transmit` until it
//! returns `None`, then ask `poll_timeout`.
//!
//! Behaviour follows IBTA Vol. 1 chapter 9 as Linux rxe implements it (`rxe_req.c`,
//! `rxe_resp.c`, `rxe_comp.c`): go-back-N retransmission, cumulative ACKs, sequence NAKs
//! re-armed only when the expected PSN arrives, RNR NAKs with the timer table, coalesced ACKs,
//! duplicate READ and atomic requests replayed from a responder resource ring, and a fatal
//! error moving the QP to ERR and flushing everything outstanding. Where rxe departs from the
//! specification, the engine follows the specification: `retry_cnt` 7 means seven retries
//! (rxe retries forever); `rnr_retry` 7 does mean forever, in both. Three additions on the
//! requester's side, none visible to the responder:
//! - after two retransmission timeouts in a row it probes with its oldest packets instead of
//!   resending the whole window, until an ACK makes progress (a slow peer is not buried in
//!   duplicates);
//! - its send window narrows by half at each retry and widens again by one packet per window
//!   acknowledged, so go-back-N on a lossy path resends a few packets per loss rather than up
//!   to 128; until its first retry it widens past 128 by a packet per two acknowledged, up to
//!   512, which a slow receiver's path (a guest under emulation) needs to keep moving;
//! - a stall of a few measured round trips with nothing answered (a lost last packet, ACK or
//!   sequence NAK) starts an early resend that spends no `retry_cnt`, instead of waiting out
//!   the ACK timeout (67 ms at perftest's default); behind a READ it asks again for the rest of
//!   one piece, since a responder answers a copy only after everything queued before it, and
//!   its wait doubles for each such resend that answers show needless;
//! - READ responses after a lost one are taken where their PSNs put them, and only the lost
//!   ones are asked for again (`read_ahead`); a go-back-N over READs asks each piece again
//!   from its first missing response to its last, and skips pieces already whole.
//!
//! And two the responder sees, within what IBTA allows it to expect: a READ of more than
//! [`MAX_UNACKED_PSNS`] response packets is asked for in several READ requests of that many
//! (never more unanswered than `max_rd_atomic`); and a READ asked again may ask for any part
//! of the original from a lost response on, which IBTA prefers ("may only reread those
//! portions that were not successfully responded to") and rxe serves. Its own responder
//! serves such parts too.
//!
//! Safety against peers: every remote request is checked against the [`MemoryTable`] (key,
//! protection domain, rights, bounds) before [`Memory`] is called, so a peer can only touch
//! bytes of regions that granted it access.
//!
//! UD queue pairs send and receive single-packet datagrams with a DETH, Q_Key checked, each
//! receive beginning with the 40-byte header verbs applications read the sender from; QP 1,
//! the GSI, is created by [`Engine::create_gsi_qp`]. Shared receive queues feed any number of
//! QPs, with the limit event of verbs ([`Engine::poll_event`]).
//!
//! One role per file: `requester` (the next request packet), `recovery` (rewinds, timers,
//! the RTT and the window), `read_ahead` (READ responses taken past lost ones),
//! `completer` (ACKs and responses in), `responder` (requests in),
//! `responses` (ACKs, NAKs and READ and atomic responses out), `datagram` (UD, both ways),
//! `srq` (shared receive queues and where a responder takes its receives from), `schedule`
//! (which queue pairs may send, and when their timers fire), with the queue pair's shared
//! state in `qp` and the work queue entries in `wqe`. This file holds the
//! [`Engine`] that routes datagrams, timers and commands to them.
//!
//! The engine's work grows with the queue pairs that are busy, not with all it holds: a queue
//! pair that may have something to send waits in a ready queue (entered when a command, a
//! packet or a timer reaches it, left when it has nothing more), and each one's earliest
//! timer is filed in an ordered index, so [`Engine::poll_transmit`],
//! [`Engine::poll_timeout`] and [`Engine::handle_timeout`] never walk the idle ones.

use std::collections::{BTreeSet, HashMap, VecDeque};

use rustc_hash::FxHashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::counters::Counters;
use crate::memory::{
    Access, AtomicOp, Memory, MemoryTable, PdId, RegionId, RegionInfo, RegisterError, WriteOrder,
};
use crate::qp::{
    ack_timeout, AsyncEvent, Completion, CqId, ModifyError, Payload, PostError, QpAttr, QpInit,
    QpState, QpType, RecvWr, SendOp, SendWr, Sge, SrqId, UdDest, UdSource, WcOpcode, WcStatus,
    GSI_QKEY, UD_GRH_LEN,
};
use crate::wire::{
    icrc, Aeth, AtomicAckEth, AtomicEth, Bth, Datagram, Deth, HeaderSet, IpHeader, NakCode, Opcode,
    Operation, Packet, PacketRepr, Qpn, Reth, RnrTimer, Syndrome, Transport, UdpHeader, ROCE_PORT,
};
use crate::Psn;

mod completer;
mod datagram;
mod qp;
mod read_ahead;
mod recovery;
mod requester;
mod responder;
mod responses;
mod schedule;
mod srq;
mod wqe;

use schedule::Schedule;

use qp::{AckWatch, Qp, ReadUpto, ReadWatch, Timers};
use read_ahead::{ReadAhead, Taken, AHEAD_PSNS};
use recovery::*;
use responder::*;
pub use responder::{InboundWrite, WriteFilter};
use responses::*;
use srq::Srq;
pub use srq::{SrqAttr, SrqError};
use wqe::*;

/// The most packets a requester sends beyond the oldest unacknowledged one once it has lost
/// one (rxe's `RXE_MAX_UNACKED_PSNS`), and where every queue pair's window starts.
pub const MAX_UNACKED_PSNS: u32 = 128;
/// The widest a requester's window grows while nothing has been lost: in the QEMU guests a
/// window of 128 packets left both ends waiting on each other (`ib_write_bw` 64 KiB, MTU
/// 1024: 18.6-20.6 MB/s with 128, 25.0-27.6 growing to 512; BENCHMARKS.md, the data path's
/// twenty-sixth step). A fixed 512 halved the goodput of the loss model's 1 % row, where each
/// loss costs a window of go-back-N; growing only until the first retry costs it 7 %.
pub const WIDEST_UNACKED_PSNS: u32 = 512;
/// The longest a requester lets its ACK timer run before an ACK makes progress without
/// narrowing its send window, as a fraction of the ACK timeout (a quarter, 17 ms at perftest's
/// 67 ms; `Window::waited`). Where a peer serves another queue pair first, the window sets
/// how long this one waits for its turn; one that waits near the ACK timeout sends again a
/// queue that was never lost. An ACK timeout of 0 (wait forever) sets no ceiling.
pub const QUEUE_CEILING_DIVISOR: u32 = 4;
/// After two retransmission timeouts in a row, the requester resends at most this many PSNs,
/// each asking for an ACK, until an ACK makes progress.
pub const PROBE_PSNS: u32 = 4;
/// The narrowest a requester's send window closes to after losses. The window starts at
/// [`MAX_UNACKED_PSNS`], halves at each retry and widens by one PSN per window acknowledged.
pub const MIN_WINDOW_PSNS: u32 = 16;
/// The earliest an early resend fires after the last response, however short the measured
/// round trip: a scheduler's hiccup on a busy host lasts longer than a loopback round trip,
/// and each spurious resend is a window of duplicates. (An early resend goes back to the
/// oldest unanswered PSN after a stall of a few round trips, spending no `retry_cnt`.)
pub const MIN_EARLY_RESEND: Duration = Duration::from_millis(1);
/// How long after its build a request may leave before the timers it armed start again from
/// its departure ([`Engine::transmitted`]): a sixteenth of the shortest early-resend delay.
/// A usual turn sends within microseconds of its clock read, and re-arming then cost a
/// ping-pong's round trip about 300 of its 10,200 instructions for nothing (BENCHMARKS.md, the
/// data path's thirty-fifth step).
pub const LATE_DEPARTURE: Duration = Duration::from_nanos(62_500);
/// The most doublings a QP's early-resend delay takes on after needless early resends.
const MAX_EARLY_SHIFT: u32 = 8;
/// A requester asks for an ACK at least every this many packets of a long message (rxe's
/// `RXE_MAX_PKT_PER_ACK`).
pub const MAX_PKT_PER_ACK: u32 = 64;
/// The largest packet the engine emits: BTH and the longest header set, a 4096-byte payload,
/// and the ICRC. A transmit buffer of this size always suffices.
pub const MAX_PACKET: usize = 4096 + 64;
/// The largest message, 2^31 bytes (IBTA).
pub const MAX_MESSAGE: u64 = 1 << 31;
/// The most asynchronous events kept for [`Engine::poll_event`]; older ones are dropped and
/// counted (`events_dropped`).
pub const MAX_EVENTS: usize = 1024;

/// The engine's fixed configuration.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// The local IP address: the source of every packet and part of its ICRC.
    pub local_ip: IpAddr,
    /// Seeds the generator of memory keys.
    pub seed: u64,
}

/// A packet ready to send: `len` bytes at the start of the buffer given to
/// [`Engine::poll_transmit`], to go from UDP port `src_port` to `dst`, with a payload lent
/// from registered memory between them where `lent` says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Transmit {
    /// Where to send it.
    pub dst: SocketAddr,
    /// The UDP source port: derived from the QPN as rxe does, so flows spread over paths.
    pub src_port: u16,
    /// The packet's length (BTH through ICRC).
    pub len: usize,
    /// A bare positive ACK: nothing but the peer's completions waits on it, and it answers
    /// everything up to its PSN, so a driver may hold it briefly to leave with the next packet
    /// (a NAK, a READ response or an atomic ACK is never one).
    pub ack: bool,
    /// The payload, when the memory lent it ([`Memory::can_lend`]): the buffer then holds
    /// the headers, pad and ICRC only (`len` bytes), and the packet on the wire is the first
    /// `at` of them, the lent bytes, then the rest. The ICRC already covers the lent bytes as
    /// they were when the engine looked.
    pub lent: Option<Lent>,
}

/// A packet's payload left where it lies in registered memory ([`Transmit::lent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lent {
    /// The region that holds it.
    pub region: RegionId,
    /// Where in the region it starts.
    pub offset: u64,
    /// Its length.
    pub len: usize,
    /// Where in the packet it goes: the length of the headers before it.
    pub at: usize,
}

impl Lent {
    /// The `len` bytes at `offset` of `region`, to go after `at` bytes of headers, when `mem`
    /// lends them ([`Memory::can_lend`]).
    fn ask(mem: &dyn Memory, region: RegionId, offset: u64, len: usize, at: usize) -> Option<Self> {
        mem.can_lend(region, offset, len).then_some(Self {
            region,
            offset,
            len,
            at,
        })
    }
}

/// The UDP source port rxe uses for a QP: 0xC000 plus 14 bits of a multiplicative hash. The
/// engine sends from its socket's port instead (a UDP socket cannot choose per packet); this
/// is for paths that build their own UDP headers.
#[must_use]
pub const fn udp_source_port(qpn: Qpn) -> u16 {
    let hash = qpn.value().wrapping_mul(0x61C8_8647) >> 18;
    0xc000 | (hash & 0x3fff) as u16
}

#[derive(Debug)]
struct Cq {
    depth: usize,
    entries: VecDeque<Completion>,
    /// Armed by `req_notify_cq`: `Some(true)` for the next solicited or error completion only,
    /// `Some(false)` for the next of any kind. Firing disarms it.
    armed: Option<bool>,
}

/// The engine's device-wide state: everything a queue pair's logic needs besides the queue
/// pair itself (the local address, completion and shared receive queues, asynchronous events,
/// the port's MTU, the memory table and the counters), as rdma-core hangs them off a device.
struct DeviceState {
    local_ip: IpAddr,
    /// The UDP port packets arrive on; part of their ICRC.
    local_port: u16,
    cqs: FxHashMap<CqId, Cq>,
    /// CQs whose armed notification fired, oldest first (`poll_cq_event`).
    cq_events: VecDeque<CqId>,
    srqs: FxHashMap<SrqId, Srq>,
    events: VecDeque<AsyncEvent>,
    /// The port's MTU: the most a UD datagram carries.
    port_mtu: u32,
    table: MemoryTable,
    counters: Counters,
    /// Every reliable queue pair's round-trip samples together ([`Engine::round_trip`]).
    round_trip: RttMedian,
}

impl DeviceState {
    /// Queues a completion; `false` when the CQ is full (the caller moves the QP to ERR).
    fn complete(&mut self, cq: CqId, completion: Completion) -> bool {
        self.complete_as(cq, completion, false)
    }

    /// As [`DeviceState::complete`], for a receive the peer marked `solicited`: an armed CQ
    /// fires for any completion when armed for any, and for a solicited or failed one when
    /// armed for solicited ones only (`ibv_req_notify_cq`).
    fn complete_as(&mut self, id: CqId, completion: Completion, solicited: bool) -> bool {
        match self.cqs.get_mut(&id) {
            Some(cq) if cq.entries.len() < cq.depth => {
                let fires = match cq.armed {
                    Some(only_solicited) => {
                        !only_solicited || solicited || completion.status != WcStatus::Success
                    }
                    None => false,
                };
                cq.entries.push_back(completion);
                if fires {
                    cq.armed = None;
                    self.cq_events.push_back(id);
                }
                true
            }
            _ => {
                self.counters.cq_overflow += 1;
                false
            }
        }
    }

    /// Queues an asynchronous event, dropping the oldest when [`MAX_EVENTS`] wait.
    fn raise(&mut self, event: AsyncEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
            self.counters.events_dropped += 1;
        }
        self.events.push_back(event);
    }
}

/// The RoCEv2 protocol engine of one local address: its queue pairs, completion queues and
/// memory regions. See the module documentation for how to drive it.
pub struct Engine {
    dev: DeviceState,
    /// By QPN. The tables here hash with FxHash, one multiplication, where the standard
    /// library's SipHash, built to resist chosen keys, cost a tenth of a WRITE's
    /// instructions. They hold only the engine's own numbers (random QPNs and keys): a peer
    /// names any QPN or key in a packet, which costs one probe, but inserts none, so it cannot
    /// pile keys into one bucket.
    qps: FxHashMap<u32, Box<Qp>>,
    /// What may send, and when timers fire.
    schedule: Schedule,
    next_cq: u32,
    next_srq: u32,
    next_pd: u32,
    /// Whether packets ahead of sequence are held to the end of the batch
    /// ([`Engine::set_batch_holding`]), and those held now.
    holding: bool,
    held: Vec<Held>,
    /// Queue pairs whose timers a request armed from idle in [`Engine::poll_transmit`], for
    /// [`Engine::transmitted`].
    departures: Departures,
}

/// Queue pairs whose timers were armed by a request built at `built`, until the driver says
/// when what it built then really left ([`Engine::transmitted`]).
#[derive(Debug, Default)]
struct Departures {
    built: Option<Instant>,
    qpns: Vec<u32>,
}

/// The most packets held at once ([`Engine::set_batch_holding`]): a GRO flush of one peer's
/// train is at most 64 segments; past this, packets are handled as they come.
pub const MAX_HELD: usize = 128;

/// A packet held until the end of its receive batch: where it came from and its bytes.
#[derive(Debug)]
struct Held {
    src: SocketAddr,
    dst: IpAddr,
    index: u16,
    qpn: u32,
    /// A READ response (the requester's sequence) rather than a request.
    response: bool,
    psn: Psn,
    bytes: Vec<u8>,
}

/// How many of each object an engine holds ([`Engine::census`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Census {
    /// Queue pairs, QP 1 included.
    pub qps: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Registered regions.
    pub regions: usize,
    /// Timers armed across all queue pairs.
    pub armed_timers: usize,
    /// Completions waiting to be polled.
    pub queued_completions: usize,
}

/// Why a queue pair could not be created.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CreateQpError {
    /// The shared receive queue named in [`QpInit::srq`] does not exist.
    #[error("no shared receive queue {0:?}")]
    UnknownSrq(SrqId),
    /// QP 1 exists already.
    #[error("the engine has its GSI (QP 1) already")]
    GsiExists,
    /// QP 1 must be a UD queue pair.
    #[error("the GSI (QP 1) is a UD queue pair, not {0:?}")]
    GsiNotUd(QpType),
}

impl Engine {
    /// An engine for `config.local_ip` with no queue pairs.
    #[must_use]
    pub fn new(config: EngineConfig) -> Self {
        Self {
            dev: DeviceState {
                local_ip: config.local_ip,
                local_port: ROCE_PORT,
                cqs: FxHashMap::default(),
                cq_events: VecDeque::new(),
                srqs: FxHashMap::default(),
                events: VecDeque::new(),
                port_mtu: 1024,
                table: MemoryTable::new(config.seed),
                counters: Counters::default(),
                round_trip: RttMedian::default(),
            },
            qps: HashMap::default(),
            schedule: Schedule::default(),
            next_cq: 1,
            next_srq: 1,
            next_pd: 1,
            holding: false,
            held: Vec::new(),
            departures: Departures::default(),
        }
    }

    /// Brings queue pair `qpn`'s place in the schedule up to date after something reached it
    /// ([`Schedule::touch`]). Every input that can give a queue pair something to send, or
    /// change its timers or what it has in flight, ends here.
    fn touch(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            self.schedule.touch(qpn, qp);
        }
    }

    /// The local IP address.
    #[must_use]
    pub fn local_ip(&self) -> IpAddr {
        self.dev.local_ip
    }

    /// Sets the UDP port this engine receives on (4791 unless changed). The ICRC covers the
    /// destination port, so it must be the port peers send to.
    pub fn set_local_port(&mut self, port: u16) {
        self.dev.local_port = port;
    }

    /// Sets the port's MTU (1024 unless changed): the longest payload a UD datagram carries,
    /// sent or received, as rxe takes its port's active MTU.
    pub fn set_port_mtu(&mut self, mtu: crate::qp::Mtu) {
        self.dev.port_mtu = mtu.bytes();
    }

    /// The next asynchronous event (SRQ limit, last WQE reached), oldest first.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.dev.events.pop_front()
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> &Counters {
        &self.dev.counters
    }

    /// The usual round trip of this engine's reliable queue pairs, all of them together:
    /// from a request sent once to the ACK that answered it (at once, or held for the peer's
    /// own next packet): the median of each 32 such samples, the lesser of the last two
    /// windows'; `None` before the first 32 answers. The path's round trip and the peer's usual
    /// turn are in it; the stalls of a loaded host, which come and go, are not. A driver
    /// scales its timing by it: what the peer and the application take to answer grows with
    /// it, in a guest under emulation some fiftyfold.
    #[must_use]
    pub fn round_trip(&self) -> Option<Duration> {
        self.dev.round_trip.usual()
    }

    /// A new protection domain.
    pub fn alloc_pd(&mut self) -> PdId {
        let pd = PdId(self.next_pd);
        self.next_pd += 1;
        pd
    }

    /// Registers a region (see [`MemoryTable::register`]); the I/O layer must then make
    /// [`RegionInfo::id`] resolve to the bytes in its [`Memory`].
    ///
    /// # Errors
    ///
    /// As [`MemoryTable::register`].
    pub fn register(
        &mut self,
        pd: PdId,
        va: u64,
        len: u64,
        access: Access,
        order: WriteOrder,
    ) -> Result<RegionInfo, RegisterError> {
        self.dev.table.register(pd, va, len, access, order)
    }

    /// Deregisters a region: its keys stop working at once and the engine never touches its
    /// bytes again. Returns it, or `None` if unknown.
    pub fn deregister(&mut self, id: RegionId) -> Option<RegionInfo> {
        self.dev.table.deregister(id)
    }

    /// The region table.
    #[must_use]
    pub fn regions(&self) -> &MemoryTable {
        &self.dev.table
    }

    /// How many asynchronous events wait for [`Engine::poll_event`].
    #[must_use]
    pub fn pending_events(&self) -> usize {
        self.dev.events.len()
    }

    /// A completion queue holding up to `depth` completions.
    pub fn create_cq(&mut self, depth: usize) -> CqId {
        let id = CqId(self.next_cq);
        self.next_cq += 1;
        self.dev.cqs.insert(
            id,
            Cq {
                depth: depth.max(1),
                entries: VecDeque::new(),
                armed: None,
            },
        );
        id
    }

    /// How many completions `cq` holds at most; `None` for an unknown CQ.
    #[must_use]
    pub fn cq_depth(&self, cq: CqId) -> Option<usize> {
        self.dev.cqs.get(&cq).map(|cq| cq.depth)
    }

    /// Changes how many completions `cq` holds (`ibv_resize_cq`). Refused (`false`) for an
    /// unknown CQ, or a depth below the completions it holds now (rxe says EINVAL there too).
    pub fn resize_cq(&mut self, cq: CqId, depth: usize) -> bool {
        match self.dev.cqs.get_mut(&cq) {
            Some(cq) if depth.max(1) >= cq.entries.len() => {
                cq.depth = depth.max(1);
                true
            }
            _ => false,
        }
    }

    /// Destroys a completion queue (`ibv_destroy_cq`); its completions are gone. Refused
    /// (`false`) while a queue pair reports to it, or when there is no such CQ.
    pub fn destroy_cq(&mut self, cq: CqId) -> bool {
        let in_use = self
            .qps
            .values()
            .any(|qp| qp.init.send_cq == cq || qp.init.recv_cq == cq);
        let removed = !in_use && self.dev.cqs.remove(&cq).is_some();
        if removed {
            self.dev.cq_events.retain(|&id| id != cq);
        }
        removed
    }

    /// What the engine holds now: for checking that what was set up was torn down.
    #[must_use]
    pub fn census(&self) -> Census {
        Census {
            qps: self.qps.len(),
            cqs: self.dev.cqs.len(),
            srqs: self.dev.srqs.len(),
            regions: self.dev.table.len(),
            armed_timers: self
                .qps
                .values()
                .map(|qp| {
                    let t = &qp.timers;
                    [t.retransmit, t.early, t.rnr_wait].iter().flatten().count()
                })
                .sum(),
            queued_completions: self.dev.cqs.values().map(|cq| cq.entries.len()).sum(),
        }
    }

    /// How many completions `cq` holds now (0 for an unknown CQ): whether a thread waiting
    /// on it has something to take.
    #[must_use]
    pub fn cq_pending(&self, cq: CqId) -> usize {
        self.dev.cqs.get(&cq).map_or(0, |cq| cq.entries.len())
    }

    /// The next completion of `cq`, oldest first.
    pub fn poll_completion(&mut self, cq: CqId) -> Option<Completion> {
        self.dev.cqs.get_mut(&cq)?.entries.pop_front()
    }

    /// Arms `cq` to report its next completion through [`Engine::poll_cq_event`]
    /// (`ibv_req_notify_cq`): the next of any kind, or with `solicited_only` the next receive
    /// the peer marked solicited, or the next that failed. It fires once; arm it again after.
    /// Completions already queued do not fire it, as in verbs: poll after arming. `false` for
    /// an unknown CQ.
    pub fn req_notify_cq(&mut self, cq: CqId, solicited_only: bool) -> bool {
        match self.dev.cqs.get_mut(&cq) {
            Some(cq) => {
                // Armed for any stays armed for any until it fires.
                cq.armed = Some(solicited_only && cq.armed != Some(false));
                true
            }
            None => false,
        }
    }

    /// Whether `cq` is armed ([`Engine::req_notify_cq`]) and has not fired since; `false` for
    /// an unknown CQ.
    #[must_use]
    pub fn cq_armed(&self, cq: CqId) -> bool {
        self.dev.cqs.get(&cq).is_some_and(|cq| cq.armed.is_some())
    }

    /// The next CQ whose armed notification fired, oldest first (what a completion channel
    /// delivers: `ibv_get_cq_event`).
    pub fn poll_cq_event(&mut self) -> Option<CqId> {
        self.dev.cq_events.pop_front()
    }

    /// Replaces where the engine's keys and queue pair numbers come from (by default a
    /// generator seeded from [`EngineConfig::seed`], reproducible and predictable): a NIC
    /// gives the operating system's CSPRNG, so that no peer can guess one from another.
    pub fn set_entropy(&mut self, entropy: Box<dyn crate::memory::Entropy>) {
        self.dev.table.set_entropy(entropy);
    }

    /// A queue pair in state RESET, numbered at random (24 bits, 0x11 and up: not in
    /// sequence, so one QP number tells nothing of the next).
    ///
    /// # Errors
    ///
    /// [`CreateQpError::UnknownSrq`] when `init.srq` names no shared receive queue.
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, CreateQpError> {
        let qpn = loop {
            let qpn = Qpn::from_low_bits(self.dev.table.random() as u32);
            if qpn.value() >= 0x11 && !self.qps.contains_key(&qpn.value()) {
                break qpn;
            }
        };
        self.insert_qp(qpn, init)?;
        Ok(qpn)
    }

    /// QP 1, the General Services Interface, in state RESET: a UD queue pair whose Q_Key is
    /// always [`GSI_QKEY`], sent and checked, whatever a work request or `modify_qp` says.
    /// Connection management's MADs travel on it.
    ///
    /// # Errors
    ///
    /// [`CreateQpError`]: QP 1 exists, `init` is not UD, or its SRQ does not exist.
    pub fn create_gsi_qp(&mut self, init: QpInit) -> Result<Qpn, CreateQpError> {
        let gsi = Qpn::from_low_bits(1);
        if init.qp_type != QpType::Ud {
            return Err(CreateQpError::GsiNotUd(init.qp_type));
        }
        if self.qps.contains_key(&gsi.value()) {
            return Err(CreateQpError::GsiExists);
        }
        self.insert_qp(gsi, init)?;
        Ok(gsi)
    }

    fn insert_qp(&mut self, qpn: Qpn, init: QpInit) -> Result<(), CreateQpError> {
        if let Some(id) = init.srq {
            self.dev
                .srqs
                .get_mut(&id)
                .ok_or(CreateQpError::UnknownSrq(id))?
                .attached += 1;
        }
        self.qps.insert(qpn.value(), Box::new(Qp::new(qpn, init)));
        Ok(())
    }

    /// Destroys a queue pair; packets for it are dropped from now on. Its outstanding work
    /// requests are discarded without completions, as `ibv_destroy_qp` does; a receive it had
    /// taken from a shared receive queue goes back there.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> bool {
        let Some(mut qp) = self.qps.remove(&qpn.value()) else {
            return false;
        };
        self.schedule.forget(qpn.value(), &qp);
        if let Some(InMsg::Send { wqe, .. }) = qp.resp.in_msg.take() {
            qp.return_recv(&mut self.dev, wqe);
        }
        if let Some(srq) = qp.init.srq.and_then(|id| self.dev.srqs.get_mut(&id)) {
            srq.attached -= 1;
        }
        true
    }

    /// Adds `filter` to the inbound RDMA WRITEs of queue pair `qpn` (replacing any earlier
    /// one; `None` removes it). Returns `false` when there is no such queue pair.
    pub fn set_write_filter(&mut self, qpn: Qpn, filter: Option<Box<dyn WriteFilter>>) -> bool {
        match self.qps.get_mut(&qpn.value()) {
            Some(qp) => {
                qp.resp.write_filter = FilterSlot(filter);
                true
            }
            None => false,
        }
    }

    /// A queue pair's internal state, for debugging.
    #[doc(hidden)]
    #[must_use]
    pub fn qp_debug(&self, qpn: Qpn) -> String {
        format!("{:#?}", self.qps.get(&qpn.value()))
    }

    /// A queue pair's state.
    #[must_use]
    pub fn qp_state(&self, qpn: Qpn) -> Option<QpState> {
        self.qps.get(&qpn.value()).map(|qp| qp.state)
    }

    /// How many send work requests a queue pair holds, posted and not yet completed (0 for an
    /// unknown QP): what its requester has in flight or still to send.
    #[must_use]
    pub fn sq_len(&self, qpn: Qpn) -> usize {
        self.qps.get(&qpn.value()).map_or(0, |qp| qp.sq.len())
    }

    /// The PSN a queue pair's requester will send next, and the one its responder expects.
    #[must_use]
    pub fn qp_psns(&self, qpn: Qpn) -> Option<(Psn, Psn)> {
        self.qps
            .get(&qpn.value())
            .map(|qp| (qp.req_psn, qp.resp.epsn))
    }

    /// A queue pair's attributes as they are now (`ibv_query_qp`): every field of [`QpAttr`]
    /// set, the PSNs being the next the requester sends and the responder expects. `None` for
    /// an unknown QP.
    #[must_use]
    pub fn query_qp(&self, qpn: Qpn) -> Option<QpAttr> {
        let qp = self.qps.get(&qpn.value())?;
        Some(QpAttr {
            state: Some(qp.state),
            access: Some(qp.access),
            path_mtu: crate::qp::Mtu::from_bytes(qp.mtu),
            dest_qpn: Some(qp.dest_qpn),
            peer: qp.peer,
            rq_psn: Some(qp.resp.epsn),
            sq_psn: Some(qp.req_psn),
            max_dest_rd_atomic: Some(qp.max_dest_rd_atomic),
            max_rd_atomic: Some(qp.max_rd_atomic),
            min_rnr_timer: Some(qp.min_rnr_timer),
            // `ack_timeout` backwards: 4.096 µs × 2^timeout, or 0 for none.
            timeout: Some(
                qp.timeout
                    .map_or(0, |t| ((t.as_nanos() >> 12) as u64).trailing_zeros() as u8),
            ),
            retry_cnt: Some(qp.retry_cnt),
            rnr_retry: Some(qp.rnr_retry),
            qkey: Some(qp.qkey),
        })
    }

    /// Moves a queue pair through its states (`ibv_modify_qp`); see [`QpAttr`] for what each
    /// transition requires.
    ///
    /// # Errors
    ///
    /// [`ModifyError`] names the unknown QP, the forbidden transition, the missing attribute
    /// or the value out of range; the QP is unchanged.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let result = self.modify_qp_inner(qpn, attr);
        self.touch(qpn.value());
        result
    }

    fn modify_qp_inner(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(ModifyError::UnknownQp(qpn))?;
        let from = qp.state;
        let to = attr.state.unwrap_or(from);
        let rc = qp.is_rc();
        let ud = qp.is_ud();
        let allowed = matches!(
            (from, to),
            (_, QpState::Reset | QpState::Err)
                | (QpState::Reset, QpState::Init)
                | (QpState::Init, QpState::Init | QpState::Rtr)
                | (QpState::Rtr, QpState::Rtr | QpState::Rts)
                | (QpState::Rts, QpState::Rts | QpState::Sqd)
                | (QpState::Sqd, QpState::Sqd | QpState::Rts)
        );
        if !allowed {
            return Err(ModifyError::InvalidTransition { from, to });
        }
        let need = |present: bool, name: &'static str| {
            if present {
                Ok(())
            } else {
                Err(ModifyError::Missing { to, attr: name })
            }
        };
        if from != to {
            match to {
                // As the kernel's table (`qp_state_table`): access flags for RC and UC, a
                // Q_Key for UD, which has no remote access to grant.
                QpState::Init if ud => need(attr.qkey.is_some(), "qkey")?,
                QpState::Init => need(attr.access.is_some(), "access")?,
                QpState::Rtr if ud => {}
                QpState::Rtr => {
                    need(attr.peer.is_some(), "peer")?;
                    need(attr.path_mtu.is_some(), "path_mtu")?;
                    need(attr.dest_qpn.is_some(), "dest_qpn")?;
                    need(attr.rq_psn.is_some(), "rq_psn")?;
                    if rc {
                        need(attr.max_dest_rd_atomic.is_some(), "max_dest_rd_atomic")?;
                        need(attr.min_rnr_timer.is_some(), "min_rnr_timer")?;
                    }
                }
                QpState::Rts if from == QpState::Rtr => {
                    need(attr.sq_psn.is_some(), "sq_psn")?;
                    if rc {
                        need(attr.timeout.is_some(), "timeout")?;
                        need(attr.retry_cnt.is_some(), "retry_cnt")?;
                        need(attr.rnr_retry.is_some(), "rnr_retry")?;
                        need(attr.max_rd_atomic.is_some(), "max_rd_atomic")?;
                    }
                }
                _ => {}
            }
        }
        let range =
            |name: &'static str, value: Option<u8>, max: u8, expected: &'static str| match value {
                Some(v) if v > max => Err(ModifyError::InvalidValue {
                    attr: name,
                    value: v.into(),
                    expected,
                }),
                _ => Ok(()),
            };
        range("timeout", attr.timeout, 31, "0 to 31")?;
        range("retry_cnt", attr.retry_cnt, 7, "0 to 7")?;
        range("rnr_retry", attr.rnr_retry, 7, "0 to 7")?;

        match to {
            QpState::Reset => {
                qp.reset();
                return Ok(());
            }
            QpState::Err => {
                if from != QpState::Err {
                    qp.enter_err(&mut self.dev);
                }
                return Ok(());
            }
            _ => {}
        }
        if let Some(access) = attr.access {
            qp.access = access;
        }
        if let Some(mtu) = attr.path_mtu {
            qp.mtu = mtu.bytes();
        }
        if let Some(dest) = attr.dest_qpn {
            qp.dest_qpn = dest;
        }
        if let Some(peer) = attr.peer {
            qp.peer = Some(peer);
        }
        if let Some(psn) = attr.rq_psn {
            qp.resp.epsn = psn;
        }
        if let Some(psn) = attr.sq_psn {
            qp.req_psn = psn;
            qp.sent_psn = psn;
            qp.comp_psn = psn;
        }
        if let Some(n) = attr.max_dest_rd_atomic {
            qp.max_dest_rd_atomic = n;
        }
        if let Some(n) = attr.max_rd_atomic {
            qp.max_rd_atomic = n;
        }
        if let Some(timer) = attr.min_rnr_timer {
            qp.min_rnr_timer = timer;
        }
        if let Some(t) = attr.timeout {
            qp.timeout = ack_timeout(t);
        }
        if let Some(n) = attr.retry_cnt {
            qp.retry_cnt = n;
            qp.retries_left = n;
        }
        if let Some(n) = attr.rnr_retry {
            qp.rnr_retry = n;
            qp.rnr_left = n;
        }
        if let Some(qkey) = attr.qkey {
            if !qp.is_gsi() {
                qp.qkey = qkey;
            }
        }
        qp.state = to;
        Ok(())
    }

    fn resolve(
        table: &MemoryTable,
        pd: PdId,
        sges: &[Sge],
        needed: Access,
    ) -> (ResolvedSgeList, u64, Option<WcStatus>) {
        let mut segs = ResolvedSgeList::Many(Vec::new());
        let mut total = 0u64;
        let mut fault = None;
        for sge in sges {
            total += u64::from(sge.len);
            match table.check_local(sge.lkey, pd, sge.addr, sge.len.into(), needed) {
                Ok((region, offset)) => segs.push(ResolvedSge {
                    region,
                    offset,
                    len: sge.len,
                }),
                Err(_) => {
                    fault = Some(WcStatus::LocProtErr);
                    break;
                }
            }
        }
        (segs, total, fault)
    }

    /// Posts a send work request (`ibv_post_send`). A bad local key or range is reported as
    /// a `LocProtErr` completion when the request's turn comes, as verbs do; in ERR the
    /// request completes at once with a flush error.
    ///
    /// # Errors
    ///
    /// [`PostError`] when the request cannot be queued at all.
    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), PostError> {
        let result = self.post_send_inner(qpn, wr);
        self.touch(qpn.value());
        result
    }

    fn post_send_inner(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), PostError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(PostError::UnknownQp(qpn))?;
        if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(PostError::InvalidState(qp.state));
        }
        if !qp.is_rc() && wr.op.is_read_or_atomic()
            || qp.is_ud() && !matches!(wr.op, SendOp::Send | SendOp::SendWithImm(_))
        {
            return Err(PostError::Unsupported(wr.op));
        }
        match wr.dest {
            Some(dest) if qp.is_ud() => {
                if IpHeader::between(self.dev.local_ip, dest.peer.ip()).is_none() {
                    return Err(PostError::AddressFamily(dest.peer.ip()));
                }
            }
            None if !qp.is_ud() => {}
            _ => return Err(PostError::Destination),
        }
        if qp.sq.len() >= qp.init.caps.sq_depth as usize {
            return Err(PostError::QueueFull(qp.init.caps.sq_depth));
        }
        let needed = if wr.op.is_read_or_atomic() {
            Access::LOCAL_WRITE
        } else {
            Access::NONE
        };
        let (data, len, fault) = match wr.local {
            Payload::Inline(bytes) => {
                if bytes.len() > qp.init.caps.max_inline as usize || wr.op.is_read_or_atomic() {
                    return Err(PostError::InlineTooLong {
                        len: bytes.len(),
                        max: qp.init.caps.max_inline,
                    });
                }
                let len = bytes.len() as u64;
                (WqeData::Inline(bytes), len, None)
            }
            Payload::Sges(sges) => {
                let (segs, len, fault) = Self::resolve(&self.dev.table, qp.init.pd, &sges, needed);
                (WqeData::Segs(segs), len, fault)
            }
            Payload::Sge(sge) => {
                let (segs, len, fault) = Self::resolve(&self.dev.table, qp.init.pd, &[sge], needed);
                (WqeData::Segs(segs), len, fault)
            }
        };
        if len > MAX_MESSAGE
            || (matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }) && len != 8)
        {
            return Err(PostError::Length(len));
        }
        if qp.is_ud() && len > u64::from(self.dev.port_mtu) {
            return Err(PostError::DatagramTooLong {
                len,
                mtu: self.dev.port_mtu,
            });
        }
        let len = len as u32;
        let npkts = match wr.op {
            SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. } => 1,
            _ => len.div_ceil(qp.mtu).max(1),
        };
        let wqe = SendWqe {
            wr_id: wr.wr_id,
            op: wr.op,
            signaled: wr.signaled,
            fence: wr.fence,
            solicited: wr.solicited,
            data,
            len,
            npkts,
            piece: npkts,
            first_psn: Psn::default(),
            started: false,
            fault,
            dest: wr.dest,
        };
        if qp.state == QpState::Err {
            qp.complete_send(&mut self.dev, &wqe, WcStatus::WrFlushErr);
            return Ok(());
        }
        qp.sq.push_back(wqe);
        Ok(())
    }

    /// Posts a receive work request (`ibv_post_recv`); allowed from INIT on. In ERR it
    /// completes at once with a flush error.
    ///
    /// # Errors
    ///
    /// [`PostError`] when the request cannot be queued.
    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), PostError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(PostError::UnknownQp(qpn))?;
        if qp.state == QpState::Reset {
            return Err(PostError::InvalidState(qp.state));
        }
        if qp.init.srq.is_some() {
            return Err(PostError::UsesSrq(qpn));
        }
        if qp.resp.rq.len() >= qp.init.caps.rq_depth as usize {
            return Err(PostError::QueueFull(qp.init.caps.rq_depth));
        }
        let (segs, len, fault) =
            Self::resolve(&self.dev.table, qp.init.pd, &wr.sges, Access::LOCAL_WRITE);
        if qp.state == QpState::Err {
            qp.complete_recv(
                &mut self.dev,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
            );
            return Ok(());
        }
        qp.resp.rq.push_back(RecvWqe {
            wr_id: wr.wr_id,
            segs,
            len,
            fault,
        });
        Ok(())
    }

    /// Handles one received UDP payload from `src` to local address `dst`.
    ///
    /// The ICRC is checked as an IPv4 packet with DF and ID 0 (what ferroce and sensor bridges
    /// send), else with the IP ID recovered from the ICRC (what rxe and NICs send; counted
    /// as `icrc_id_recovered`), or as IPv6. Every drop is counted under a named counter.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        bytes: &[u8],
        mem: &mut dyn Memory,
    ) {
        self.handle_segment(now, src, dst, bytes, 0, mem);
    }

    /// Handles one segment of a coalesced UDP GRO buffer, as [`Engine::handle_datagram`]
    /// does a datagram: segment `index` of a peer's GSO send left with IPv4 ID `index`
    /// (gso.md §1), so the ICRC is checked with that ID first, and recovered only when that
    /// fails.
    pub fn handle_segment(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        bytes: &[u8],
        index: u16,
        mem: &mut dyn Memory,
    ) {
        self.dev.counters.rcvd_pkts += 1;
        self.handle_received(now, src, dst, bytes, index, mem, self.holding);
    }

    /// Holds packets that arrive ahead of sequence until [`Engine::end_batch`], when `on`;
    /// otherwise (the default) each packet is handled as it comes. A receiving kernel's UDP
    /// GRO coalesces one flow's packets and passes another's meanwhile, so a peer whose
    /// message leaves in two flows (a FIRST from one socket, the rest as a GSO train from
    /// another) can be handed the train first; handled as it came, the train would draw a
    /// sequence NAK and be resent whole. Held, it lands in order once the FIRST, later in
    /// the same batch, has been handled, and is acknowledged as rxe acknowledges it. What is
    /// held: RC and UC requests ahead of the PSN their responder expects, and READ responses
    /// ahead of the one their requester expects, up to [`MAX_HELD`] packets (each copied);
    /// each is counted as `held_ahead`. A driver that turns this on calls `end_batch` after
    /// every receive batch (one `recvmmsg`, or a few in a row), before it sends.
    pub fn set_batch_holding(&mut self, on: bool) {
        self.holding = on;
    }

    /// Handles the packets held since the last call ([`Engine::set_batch_holding`]), each
    /// queue pair's in PSN order; one still ahead of sequence is handled as it would have
    /// been on arrival (a request draws its sequence NAK). Returns how many there were.
    pub fn end_batch(&mut self, now: Instant, mem: &mut dyn Memory) -> usize {
        if self.held.is_empty() {
            return 0;
        }
        let mut held = std::mem::take(&mut self.held);
        let n = held.len();
        // A QP's requests (its responder's PSNs) and its READ responses (its requester's) are
        // two sequences; each is put in order by distance from its first packet held, which
        // wraps with the 24-bit PSN as the packets do.
        let mut first: HashMap<(u32, bool), Psn> = HashMap::new();
        for h in &held {
            first.entry((h.qpn, h.response)).or_insert(h.psn);
        }
        held.sort_by_key(|h| {
            let key = (h.qpn, h.response);
            (key, first[&key].distance_to(h.psn))
        });
        for h in held.drain(..) {
            self.handle_received(now, h.src, h.dst, &h.bytes, h.index, mem, false);
        }
        // Keep the allocation for the next batch.
        self.held = held;
        n
    }

    /// [`Engine::handle_segment`] after the packet was counted as received; `hold` when a
    /// packet ahead of sequence may be held for [`Engine::end_batch`].
    #[allow(clippy::too_many_arguments)]
    fn handle_received(
        &mut self,
        now: Instant,
        src: SocketAddr,
        dst: IpAddr,
        bytes: &[u8],
        index: u16,
        mem: &mut dyn Memory,
        hold: bool,
    ) {
        let counters = &mut self.dev.counters;
        let Ok(packet) = Packet::new_checked(bytes) else {
            counters.malformed_pkts += 1;
            return;
        };
        let ip = match IpHeader::between(src.ip(), dst) {
            Some(IpHeader::V4(v4)) => IpHeader::V4(crate::wire::Ipv4Header { id: index, ..v4 }),
            Some(v6) => v6,
            None => {
                counters.icrc_err += 1;
                return;
            }
        };
        // The header checks first, as rxe's `hdr_check` comes before its ICRC check: a
        // packet for no queue pair here, or not from its peer, costs a lookup, not a CRC.
        let opcode = packet.opcode();
        let qpn = packet.dest_qp().value();
        let is_cnp = opcode.transport() == Transport::Cnp;
        // Looked up once: the checks and then the handling take the same queue pair.
        let mut found = None;
        if !is_cnp {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                counters.unknown_qp += 1;
                return;
            };
            if opcode.transport() != qp.transport() {
                counters.opcode_err += 1;
                return;
            }
            if packet.bth().pkey & 0x7fff != 0x7fff {
                counters.pkey_err += 1;
                return;
            }
            let ready = if qp.is_ud() {
                // No connection: any sender with the Q_Key may send.
                matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
            } else {
                if qp.peer.map(|p| p.ip()) != Some(src.ip()) {
                    counters.wrong_source += 1;
                    return;
                }
                if opcode.is_response() {
                    matches!(qp.state, QpState::Rts | QpState::Sqd)
                } else {
                    matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd)
                }
            };
            if !ready {
                counters.qp_state_drop += 1;
                return;
            }
            found = Some(qp);
        }
        let udp = UdpHeader {
            src_port: src.port(),
            dst_port: self.dev.local_port,
        };
        let mut ip = ip;
        match &mut ip {
            // A peer other than ferroce or a sensor bridge (or a GRO buffer that began inside
            // a GSO send) gave the packet another IP ID than the one expected, which the ICRC
            // covers and the socket does not show: found in the same pass over the packet,
            // with 16 bits of the ICRC left as the check.
            IpHeader::V4(v4) => match icrc::check_ipv4(v4, &udp, bytes) {
                icrc::Ipv4Check::Matches => {}
                icrc::Ipv4Check::SentWithId(id) => {
                    v4.id = id;
                    counters.icrc_id_recovered += 1;
                }
                icrc::Ipv4Check::Bad => {
                    counters.icrc_err += 1;
                    return;
                }
            },
            IpHeader::V6(_) => {
                if !icrc::verify(&ip, &udp, bytes) {
                    counters.icrc_err += 1;
                    return;
                }
            }
        }
        if is_cnp {
            counters.rcvd_cnp += 1;
            return;
        }
        // Found above: only a CNP has no queue pair, and it returned.
        let Some(qp) = found else {
            return;
        };
        if qp.is_ud() {
            qp.handle_datagram(&packet, &ip, &mut self.dev, mem);
            return;
        }
        if hold && self.held.len() < MAX_HELD && qp.is_ahead(&packet) {
            self.dev.counters.held_ahead += 1;
            self.held.push(Held {
                src,
                dst,
                index,
                qpn,
                response: opcode.is_response(),
                psn: packet.psn(),
                bytes: bytes.to_vec(),
            });
            return;
        }
        if opcode.is_response() {
            qp.handle_response(now, &packet, &mut self.dev, mem);
        } else {
            qp.handle_request(&packet, &mut self.dev, mem);
        }
        // An ACK may open the window or end a wait; a request may owe a response.
        self.schedule.touch(qpn, qp);
    }

    /// Writes the next packet to send into `buf` (at least [`MAX_PACKET`] bytes), ICRC
    /// included, and says where it goes; `None` when nothing is ready now.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if buf.len() < MAX_PACKET {
            return None;
        }
        // Round-robin over the queue pairs that may have something: one packet each per turn;
        // one that has nothing more leaves the line until something reaches it again.
        while let Some(key) = self.schedule.pop() {
            let Some(qp) = self.qps.get_mut(&key).filter(|qp| qp.sched.queued) else {
                continue;
            };
            let idle = qp.timers.retransmit.is_none();
            let sent = if qp.is_ud() {
                qp.next_datagram(&mut self.dev, mem, buf)
                    .map(|(len, peer)| (len, None, false, peer))
            } else {
                qp.peer.and_then(|peer| {
                    let ack = matches!(
                        qp.resp.responses.front(),
                        Some(Response::Ack { syndrome, .. }) if *syndrome == Syndrome::ACK
                    );
                    if let Some((len, lent)) = qp.next_response(mem, buf) {
                        return Some((len, lent, ack, peer));
                    }
                    qp.next_request(now, &mut self.dev, mem, buf)
                        .map(|(len, lent)| (len, lent, false, peer))
                })
            };
            // Sending arms timers; finding nothing may have failed a request.
            self.schedule.sync(key, qp);
            let Some((len, lent, ack, peer)) = sent else {
                Schedule::idle(qp);
                continue;
            };
            if idle && qp.timers.retransmit.is_some() {
                let d = &mut self.departures;
                if d.built != Some(now) {
                    d.built = Some(now);
                    d.qpns.clear();
                }
                d.qpns.push(key);
            }
            // One that certainly has nothing more leaves the line now, rather than at a turn
            // that would find so (a latency-bound exchange's one packet a message: a turn of
            // the line each, then another to find it empty).
            if qp.is_ud() || qp.may_send_more() {
                self.schedule.again(key);
            } else {
                Schedule::idle(qp);
            }
            let ip = IpHeader::between(self.dev.local_ip, peer.ip())?;
            // A UDP socket sends from its own port, not the per-QP port rxe picks when it
            // builds the IP header itself; the ICRC must cover the port actually used.
            let udp = UdpHeader {
                src_port: self.dev.local_port,
                dst_port: peer.port(),
            };
            match lent {
                None => icrc::seal(&ip, &udp, &mut buf[..len]).ok()?,
                Some(l) => icrc::seal_around(&ip, &udp, &mut buf[..len], l.at, l.len, |seen| {
                    mem.look(l.region, l.offset, l.len, seen);
                })
                .ok()?,
            }
            self.dev.counters.sent_pkts += 1;
            return Some(Transmit {
                dst: peer,
                src_port: self.dev.local_port,
                len,
                ack,
                lent,
            });
        }
        None
    }

    /// Whether a request that [`Engine::poll_transmit`] built armed its queue pair's timers
    /// (the first request after all were answered: a latency-bound exchange's every one). A
    /// driver that reads its clock once what it built has left passes that time to
    /// [`Engine::transmitted`]; one that does not loses nothing but that correction.
    #[must_use]
    pub fn armed_on_send(&self) -> bool {
        !self.departures.qpns.is_empty()
    }

    /// What [`Engine::poll_transmit`] built since the last call (at the `now` it was last
    /// given) left at `left`: the timers its requests armed (the ACK timeout, the early
    /// resend) and the round trip they time run from `left` instead. A sender's thread
    /// descheduled between its clock read and its send otherwise resent early a request its
    /// peer had not yet had time to answer (BENCHMARKS.md, the data path's thirty-third and
    /// thirty-fifth steps). A departure within [`LATE_DEPARTURE`] of the build changes nothing.
    pub fn transmitted(&mut self, left: Instant) {
        let d = &mut self.departures;
        let Some(built) = d.built.take() else {
            return;
        };
        if left.saturating_duration_since(built) < LATE_DEPARTURE {
            d.qpns.clear();
            return;
        }
        for qpn in d.qpns.drain(..) {
            if let Some(qp) = self.qps.get_mut(&qpn) {
                qp.left_at(built, left);
                self.schedule.sync(qpn, qp);
            }
        }
    }

    /// When [`Engine::handle_timeout`] should next be called, if any timer is armed: at or
    /// before the earliest, and now and then at a time when nothing is left due, after a timer
    /// was disarmed (the schedule files its entries lazily).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.schedule.next_deadline()
    }

    /// Runs the timers that are due at `now`: retransmission (go-back-N, or retry exhaustion)
    /// and the end of RNR waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.handle_timeout_with(now, |_| false);
    }

    /// [`Engine::handle_timeout`], asking `unread` before each early resend to a peer whether
    /// datagrams on the way to or from it still wait unread. The driver can know this where
    /// the engine cannot: its own socket may hold the answer, not yet taken, and a peer on
    /// the same host whose socket holds datagrams has been descheduled, not lost anything; a
    /// resend would only queue behind them. Where `unread` says so, the early resend is put
    /// off to when the next one would be due (counted in `early_put_off`); the ACK timeout
    /// runs as ever, so a peer that never reads again is still found.
    pub fn handle_timeout_with(
        &mut self,
        now: Instant,
        mut unread: impl FnMut(SocketAddr) -> bool,
    ) {
        // Called at every poll of a polling driver: most find nothing due.
        if self.schedule.next_deadline().is_none_or(|t| t > now) {
            return;
        }
        for qpn in self.schedule.due(now) {
            let Some(qp) = self.qps.get_mut(&qpn) else {
                continue;
            };
            let rnr_ended = Timers::take_due(&mut qp.timers.rnr_wait, now);
            let early = Timers::take_due(&mut qp.timers.early, now);
            if early {
                let due_anyway = qp.timers.retransmit.is_some_and(|t| t <= now);
                // An RNR wait is the responder's word, not a loss.
                if qp.state == QpState::Rts
                    && qp.comp_psn != qp.req_psn
                    && qp.timers.rnr_wait.is_none()
                    && !due_anyway
                {
                    if qp.peer.is_some_and(&mut unread) {
                        qp.put_off_early(&mut self.dev, now);
                    } else {
                        qp.resend_early(&mut self.dev, now);
                    }
                }
            }
            let timed_out = Timers::take_due(&mut qp.timers.retransmit, now);
            if timed_out && qp.state == QpState::Rts && qp.comp_psn != qp.req_psn {
                let from = qp.comp_psn;
                qp.probing = qp.timed_out;
                qp.timed_out = true;
                qp.retry(&mut self.dev, from, RetryCause::Timeout);
            }
            // The entry was due: filed again under what is armed now, or taken out. One left
            // from a disarmed timer has nothing more to do.
            self.schedule.refile(qpn, qp);
            if rnr_ended || early || timed_out {
                self.schedule.touch(qpn, qp);
            }
        }
    }
}

/// An address for a peer on the RoCEv2 port.
#[must_use]
pub fn roce_peer(ip: IpAddr) -> SocketAddr {
    SocketAddr::new(ip, ROCE_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HeapMemory;

    #[test]
    fn gather_lists_split_across_entries() {
        let seg = |region, offset, len| ResolvedSge {
            region: RegionId(region),
            offset,
            len,
        };
        let segs = [seg(1, 100, 10), seg(2, 0, 5), seg(3, 50, 20)];
        let got: Vec<_> = pieces(&segs, 8, 12).collect();
        assert_eq!(
            got,
            [
                (RegionId(1), 108, 0..2),
                (RegionId(2), 0, 2..7),
                (RegionId(3), 50, 7..12)
            ]
        );
        let got: Vec<_> = pieces(&segs, 15, 4).collect();
        assert_eq!(got, [(RegionId(3), 50, 0..4)]);
        assert_eq!(pieces(&segs, 0, 0).count(), 0);

        let mut mem = HeapMemory::new();
        for id in 1..=3 {
            mem.insert(RegionId(id), vec![0; 128]);
        }
        scatter(&segs, 3, b"0123456789abcdefghijklmnopqrstu", &mut mem);
        let mut out = [0u8; 31];
        gather(&segs, 3, &mut out, &mem);
        assert_eq!(&out, b"0123456789abcdefghijklmnopqrstu");
        assert_eq!(&mem.bytes(RegionId(2)).unwrap()[..5], b"789ab");
    }
}
