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
//!   to 128;
//! - a stall of a few measured round trips with nothing answered (a lost last packet, ACK or
//!   sequence NAK) starts an early resend that spends no `retry_cnt`, instead of waiting out
//!   the ACK timeout (67 ms at perftest's default).
//!
//! And one the responder sees, within what IBTA allows it to expect: a READ of more than
//! [`MAX_UNACKED_PSNS`] response packets is asked for in several READ requests of that many
//! (never more unanswered than `max_rd_atomic`), so a lost response costs the rest of its
//! piece rather than of the whole message.
//!
//! Safety against peers: every remote request is checked against the [`MemoryTable`] (key,
//! protection domain, rights, bounds) before [`Memory`] is called, so a peer can only touch
//! bytes of regions that granted it access.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::counters::Counters;
use crate::memory::{
    Access, AtomicOp, Memory, MemoryTable, PdId, RegionId, RegionInfo, RegisterError, WriteOrder,
};
use crate::qp::{
    ack_timeout, Completion, CqId, ModifyError, Payload, PostError, QpAttr, QpInit, QpState,
    QpType, RecvWr, SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use crate::wire::{
    icrc, Aeth, AtomicAckEth, AtomicEth, Bth, HeaderSet, IpHeader, NakCode, Opcode, Operation,
    Packet, PacketRepr, Qpn, Reth, RnrTimer, Syndrome, Transport, UdpHeader, ROCE_PORT,
};
use crate::Psn;

/// The most packets a requester sends beyond the oldest unacknowledged one (rxe's
/// `RXE_MAX_UNACKED_PSNS`).
pub const MAX_UNACKED_PSNS: u32 = 128;
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

/// The engine's fixed configuration.
#[derive(Clone, Copy, Debug)]
pub struct EngineConfig {
    /// The local IP address: the source of every packet and part of its ICRC.
    pub local_ip: IpAddr,
    /// Seeds the generator of memory keys.
    pub seed: u64,
}

/// A packet ready to send: `len` bytes at the start of the buffer given to
/// [`Engine::poll_transmit`], to go from UDP port `src_port` to `dst`.
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
}

/// The UDP source port rxe uses for a QP: 0xC000 plus 14 bits of a multiplicative hash. The
/// engine sends from its socket's port instead (a UDP socket cannot choose per packet); this
/// is for paths that build their own UDP headers.
#[must_use]
pub const fn udp_source_port(qpn: Qpn) -> u16 {
    let hash = qpn.value().wrapping_mul(0x61C8_8647) >> 18;
    0xc000 | (hash & 0x3fff) as u16
}

/// A contiguous piece of a gather/scatter list, resolved against the region table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seg {
    region: RegionId,
    offset: u64,
    len: u32,
}

/// A resolved gather/scatter list. Most requests have one entry, which is kept inline: a
/// request then costs the engine no allocation of its own.
#[derive(Clone, Debug)]
enum SegList {
    One(Seg),
    Many(Vec<Seg>),
}

impl SegList {
    /// Appends an entry; only a second one moves the list to the heap.
    fn push(&mut self, seg: Seg) {
        match self {
            Self::Many(segs) if segs.is_empty() => *self = Self::One(seg),
            Self::One(first) => *self = Self::Many(vec![*first, seg]),
            Self::Many(segs) => segs.push(seg),
        }
    }
}

impl std::ops::Deref for SegList {
    type Target = [Seg];

    fn deref(&self) -> &[Seg] {
        match self {
            Self::One(seg) => std::slice::from_ref(seg),
            Self::Many(segs) => segs,
        }
    }
}

/// The pieces of `len` bytes starting `at` bytes into a gather/scatter list: for each, the
/// region, the offset in it, and the range of the caller's buffer it covers.
fn pieces(
    segs: &[Seg],
    mut at: u64,
    len: usize,
) -> impl Iterator<Item = (RegionId, u64, std::ops::Range<usize>)> + '_ {
    let mut done = 0;
    segs.iter().filter_map(move |seg| {
        let seg_len = u64::from(seg.len);
        if done == len || at >= seg_len {
            at = at.saturating_sub(seg_len);
            return None;
        }
        let n = ((seg_len - at) as usize).min(len - done);
        let piece = (seg.region, seg.offset + at, done..done + n);
        done += n;
        at = 0;
        Some(piece)
    })
}

/// Copies `out.len()` bytes starting `at` bytes into the list.
fn gather(segs: &[Seg], at: u64, out: &mut [u8], mem: &dyn Memory) {
    for (region, offset, range) in pieces(segs, at, out.len()) {
        mem.read(region, offset, &mut out[range]);
    }
}

/// Copies `data` into the list starting `at` bytes in.
fn scatter(segs: &[Seg], at: u64, data: &[u8], mem: &mut dyn Memory) {
    for (region, offset, range) in pieces(segs, at, data.len()) {
        mem.write(region, offset, &data[range]);
    }
}

#[derive(Debug)]
enum WqeData {
    Segs(SegList),
    Inline(Vec<u8>),
}

#[derive(Debug)]
struct SendWqe {
    wr_id: u64,
    op: SendOp,
    signaled: bool,
    fence: bool,
    solicited: bool,
    data: WqeData,
    len: u32,
    /// PSNs the message uses: its packets, or for a READ its response packets.
    npkts: u32,
    /// PSNs per READ request. A READ of more than [`MAX_UNACKED_PSNS`] response packets is
    /// asked for in pieces of that many, so that a lost response costs at most the rest of
    /// its piece rather than the rest of the message (a 1 MiB READ at MTU 1024 is 1024
    /// packets). Fixed when the request starts, so that a retry asks again for exactly the
    /// rest of a piece the responder holds. `npkts` otherwise. (Pieces sized to the adaptive
    /// window were tried: with few READs in flight allowed, they throttled 64 KiB READs.)
    piece: u32,
    first_psn: Psn,
    started: bool,
    /// A local error found at post time, reported when the request reaches the front.
    fault: Option<WcStatus>,
}

impl SendWqe {
    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }

    fn contains(&self, psn: Psn) -> bool {
        self.started && psn.in_window(self.first_psn, self.npkts)
    }

    fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            SendOp::Send | SendOp::SendWithImm(_) => WcOpcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => WcOpcode::RdmaWrite,
            SendOp::Read(_) => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    fn segs(&self) -> &[Seg] {
        match &self.data {
            WqeData::Segs(segs) => segs,
            WqeData::Inline(_) => &[],
        }
    }
}

#[derive(Debug)]
struct RecvWqe {
    wr_id: u64,
    segs: SegList,
    len: u64,
    fault: Option<WcStatus>,
}

/// A multi-packet request the responder is in the middle of.
#[derive(Debug)]
enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        target: Option<(RegionId, u64)>,
        /// The address of the message's first byte, as the RETH named it.
        va: u64,
        written: u32,
        total: u32,
    },
}

/// What started a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RetryCause {
    /// The retransmission timer.
    Timeout,
    /// A sequence NAK, an implied NAK or a gap in READ responses.
    Signal,
}

/// One inbound RDMA WRITE packet, as a [`WriteFilter`] sees it: it has passed every check of
/// the protocol (ICRC, QP, source, PSN, key, range and rights) and is about to be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundWrite {
    /// The packet's PSN.
    pub psn: Psn,
    /// Where its payload lands, in the address space the RETH uses.
    pub va: u64,
    /// Payload bytes.
    pub len: u32,
    /// The immediate, on a WRITE that carries one.
    pub imm: Option<u32>,
    /// Whether the packet ends its message (LAST or ONLY).
    pub last: bool,
}

/// A queue pair's [`WriteFilter`], if it has one (filters need not be `Debug`).
struct FilterSlot(Option<Box<dyn WriteFilter>>);

impl std::fmt::Debug for FilterSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// A check an application adds to a queue pair's inbound RDMA WRITEs, beyond what the
/// region's key and bounds already enforce (the frame receiver keeps each packet inside one
/// page, and tallies packets per frame). It runs on the thread driving the engine.
pub trait WriteFilter: Send {
    /// Whether `write` may land. A refusal is handled like a refused key: RC answers with a
    /// remote access error NAK, UC drops the message; either way nothing is written.
    fn admit(&mut self, write: &InboundWrite) -> bool;
}

#[derive(Clone, Copy, Debug)]
enum Resource {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// Where a READ response's bytes come from.
#[derive(Clone, Debug)]
enum ReadSource {
    /// A zero-length READ.
    Empty,
    /// Registered memory, read as each response packet is built.
    Region(RegionId, u64),
    /// A copy of the bytes not yet sent, taken when a later request was about to change
    /// memory (see [`Qp::snapshot_reads`]).
    Copied(Vec<u8>),
}

#[derive(Clone, Debug)]
struct ReadJob {
    psn: Psn,
    source: ReadSource,
    sent: u32,
    len: u32,
    msn: u32,
}

#[derive(Clone, Debug)]
enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    Read(ReadJob),
}

#[derive(Debug)]
struct Cq {
    depth: usize,
    entries: VecDeque<Completion>,
}

/// Everything a queue pair's logic needs besides the queue pair itself.
struct Ctx {
    local_ip: IpAddr,
    /// The UDP port packets arrive on; part of their ICRC.
    local_port: u16,
    cqs: HashMap<CqId, Cq>,
    table: MemoryTable,
    counters: Counters,
}

impl Ctx {
    /// Queues a completion; `false` when the CQ is full (the caller moves the QP to ERR).
    fn complete(&mut self, cq: CqId, completion: Completion) -> bool {
        match self.cqs.get_mut(&cq) {
            Some(cq) if cq.entries.len() < cq.depth => {
                cq.entries.push_back(completion);
                true
            }
            _ => {
                self.counters.cq_overflow += 1;
                false
            }
        }
    }
}

/// The outcome of a responder check that fails: the NAK to send.
struct Nak(NakCode);

#[derive(Debug)]
struct Qp {
    qpn: Qpn,
    init: QpInit,
    state: QpState,
    access: Access,
    mtu: u32,
    dest_qpn: Qpn,
    peer: Option<SocketAddr>,
    timeout: Option<Duration>,
    retry_cnt: u8,
    rnr_retry: u8,
    min_rnr_timer: RnrTimer,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,

    // Requester and completer.
    sq: VecDeque<SendWqe>,
    /// Index in `sq` of the request being transmitted.
    req_index: usize,
    /// PSN offset within that request of the next packet.
    req_pkt: u32,
    /// The next PSN to send.
    req_psn: Psn,
    /// One past the newest PSN ever sent: `req_psn` before any rewind. An ACK up to here
    /// counts even when a go-back-N or a probe has moved `req_psn` back.
    sent_psn: Psn,
    since_ack_req: u32,
    /// The oldest PSN not yet acknowledged or answered.
    comp_psn: Psn,
    retries_left: u8,
    rnr_left: u8,
    retransmit_at: Option<Instant>,
    /// A retransmission timeout fired and no ACK has made progress since.
    timed_out: bool,
    /// A second timeout in a row: the peer is slow (an emulated rxe can take longer than the
    /// ACK timeout to work through a 128-packet window) or gone. Until an ACK makes progress
    /// the requester resends only the oldest [`PROBE_PSNS`] packets, each asking for an ACK,
    /// instead of the whole window again: go-back-N bursts of duplicates only bury a slow
    /// responder deeper (it answers each with an ACK), until `retry_cnt` runs out.
    probing: bool,
    /// Where the last retry went back to: further signals of the same loss are ignored.
    retrying_from: Option<Psn>,
    /// The send window in PSNs, at most [`MAX_UNACKED_PSNS`]: halved by each retry (down to
    /// [`MIN_WINDOW_PSNS`]) and widened by one PSN per window's worth acknowledged, as TCP's
    /// congestion avoidance does. Go-back-N resends everything behind a lost packet, so on a
    /// lossy path a full window of 128 multiplies each loss into up to 128 packets; a window
    /// that follows the loss keeps goodput up. A path that never loses keeps the full window.
    cwnd: u32,
    /// PSNs acknowledged towards the next widening of `cwnd`.
    cwnd_credit: u32,
    /// The smoothed round trip and its mean deviation (RFC 6298), from packets that asked for
    /// an answer and were sent once.
    srtt: Option<Duration>,
    rttvar: Duration,
    /// The packet timing the next round-trip sample, and when it left.
    rtt_sample: Option<(Psn, Instant)>,
    /// When to resend early: a stall of a few round trips with nothing answered means a lost
    /// tail packet, ACK or sequence NAK, which would otherwise cost a whole ACK timeout (67 ms
    /// at perftest's default). It goes back to the oldest unanswered PSN as a retry would,
    /// without spending `retry_cnt`; the responder answers duplicates with an ACK. Each
    /// further early resend of one stall waits twice as long, while that stays under half the
    /// ACK timeout, which still fires on its own schedule: a dead peer is found as soon as
    /// before.
    early_at: Option<Instant>,
    /// Early resends since the last progress.
    early_count: u32,
    /// The oldest unanswered PSN when the last early resend probed behind a SEND or WRITE,
    /// until an answer shows whether the stall was a loss.
    early_probe: Option<Psn>,
    /// A READ early resend asked again for responses that may still have been on their
    /// way: a copy of one arriving twice shows it was needless.
    early_read_watch: bool,
    /// Doublings added to the early-resend delay for this QP: one more for each early resend
    /// found needless (the originals were answered), one fewer for each that found a loss.
    /// A peer whose answers come late and unevenly (an emulated rxe) is soon left alone.
    early_shift: u32,
    rnr_wait_until: Option<Instant>,

    // Responder.
    rq: VecDeque<RecvWqe>,
    epsn: Psn,
    msn: u32,
    nak_sent: bool,
    in_msg: Option<InMsg>,
    resources: VecDeque<Resource>,
    responses: VecDeque<Response>,
    write_filter: FilterSlot,
}

impl Qp {
    fn new(qpn: Qpn, init: QpInit) -> Self {
        Self {
            qpn,
            init,
            state: QpState::Reset,
            access: Access::NONE,
            mtu: 1024,
            dest_qpn: Qpn::default(),
            peer: None,
            timeout: None,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: RnrTimer::default(),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            sq: VecDeque::new(),
            req_index: 0,
            req_pkt: 0,
            req_psn: Psn::default(),
            sent_psn: Psn::default(),
            since_ack_req: 0,
            comp_psn: Psn::default(),
            retries_left: 0,
            rnr_left: 0,
            retransmit_at: None,
            timed_out: false,
            probing: false,
            retrying_from: None,
            cwnd: MAX_UNACKED_PSNS,
            cwnd_credit: 0,
            srtt: None,
            rttvar: Duration::ZERO,
            rtt_sample: None,
            early_at: None,
            early_count: 0,
            early_probe: None,
            early_read_watch: false,
            early_shift: 0,
            rnr_wait_until: None,
            rq: VecDeque::new(),
            epsn: Psn::default(),
            msn: 0,
            nak_sent: false,
            in_msg: None,
            resources: VecDeque::new(),
            responses: VecDeque::new(),
            write_filter: FilterSlot(None),
        }
    }

    fn is_rc(&self) -> bool {
        self.init.qp_type == QpType::Rc
    }

    fn transport(&self) -> Transport {
        match self.init.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
        }
    }

    fn reset(&mut self) {
        *self = Self::new(self.qpn, self.init);
    }

    // ---------------------------------------------------------------- completions, errors

    fn complete_send(&mut self, ctx: &mut Ctx, wqe: &SendWqe, status: WcStatus) {
        if status == WcStatus::Success {
            if matches!(wqe.op, SendOp::Send | SendOp::SendWithImm(_)) {
                ctx.counters.rdma_sends += 1;
            }
            if !(wqe.signaled || self.init.sq_sig_all) {
                return;
            }
        } else if status != WcStatus::WrFlushErr {
            ctx.counters.send_err += 1;
        }
        let completion = Completion {
            wr_id: wqe.wr_id,
            status,
            opcode: wqe.wc_opcode(),
            byte_len: wqe.len,
            imm: None,
            qpn: self.qpn,
        };
        if !ctx.complete(self.init.send_cq, completion) && self.state != QpState::Err {
            self.enter_err(ctx);
        }
    }

    fn complete_recv(
        &mut self,
        ctx: &mut Ctx,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u64,
        imm: Option<u32>,
    ) {
        let completion = Completion {
            wr_id,
            status,
            opcode,
            byte_len: u32::try_from(len).unwrap_or(u32::MAX),
            imm,
            qpn: self.qpn,
        };
        if !ctx.complete(self.init.recv_cq, completion) && self.state != QpState::Err {
            self.enter_err(ctx);
        }
    }

    /// Completes the oldest send request with `status` and moves the QP to ERR.
    fn fail_front(&mut self, ctx: &mut Ctx, status: WcStatus) {
        if let Some(wqe) = self.sq.pop_front() {
            self.complete_send(ctx, &wqe, status);
        }
        self.enter_err(ctx);
    }

    /// Enters ERR: every outstanding request completes with a flush error. A NAK already
    /// queued is still sent.
    fn enter_err(&mut self, ctx: &mut Ctx) {
        self.state = QpState::Err;
        self.retransmit_at = None;
        self.early_at = None;
        self.rnr_wait_until = None;
        while let Some(wqe) = self.sq.pop_front() {
            self.complete_send(ctx, &wqe, WcStatus::WrFlushErr);
        }
        self.req_index = 0;
        self.req_pkt = 0;
        if let Some(InMsg::Send { wqe, .. }) = self.in_msg.take() {
            self.rq.push_front(wqe);
        }
        while let Some(wqe) = self.rq.pop_front() {
            self.complete_recv(
                ctx,
                wqe.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
            );
        }
        self.responses.retain(|r| {
            matches!(
                r,
                Response::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            )
        });
        self.resources.clear();
    }

    // ---------------------------------------------------------------- requester

    /// Work requests started ahead of index `upto` that are READs or atomics.
    fn reads_outstanding(&self, upto: usize) -> usize {
        self.sq
            .iter()
            .take(upto)
            .filter(|w| w.op.is_read_or_atomic())
            .count()
    }

    /// How many response PSNs each request of a READ of `npkts` asks for: all of them, unless
    /// the READ is longer than the largest window; then the current window's worth.
    fn read_piece(&self, npkts: u32) -> u32 {
        if npkts > MAX_UNACKED_PSNS {
            self.cwnd
        } else {
            npkts
        }
    }

    /// READ and atomic requests (READ pieces counted one by one) ever sent and not fully
    /// answered: each holds one of the responder's `max_dest_rd_atomic` resources, even when
    /// a rewind means it will be asked for again.
    fn requests_outstanding(&self) -> u32 {
        let mut n = 0;
        for w in self
            .sq
            .iter()
            .filter(|w| w.started && w.op.is_read_or_atomic())
        {
            if !w.first_psn.precedes(self.sent_psn) {
                break;
            }
            let issued = w.first_psn.steps_to(self.sent_psn).min(w.npkts);
            let answered = if w.first_psn.precedes(self.comp_psn) {
                w.first_psn.steps_to(self.comp_psn).min(w.npkts)
            } else {
                0
            };
            let done = if answered == w.npkts {
                w.npkts.div_ceil(w.piece)
            } else {
                answered / w.piece
            };
            n += issued.div_ceil(w.piece).saturating_sub(done);
        }
        n
    }

    /// Builds the next request packet into `buf`, if one may be sent now.
    fn next_request(
        &mut self,
        now: Instant,
        ctx: &mut Ctx,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<usize> {
        if self.state != QpState::Rts {
            return None;
        }
        if let Some(until) = self.rnr_wait_until {
            if now < until {
                return None;
            }
            self.rnr_wait_until = None;
        }
        let index = self.req_index;
        let wqe = self.sq.get(index)?;
        if let Some(status) = wqe.fault {
            // Local errors surface in order, when the request is the oldest.
            if index == 0 {
                self.fail_front(ctx, status);
            }
            return None;
        }
        if self.is_rc() {
            let window = if self.probing { PROBE_PSNS } else { self.cwnd };
            if self.comp_psn.steps_to(self.req_psn) >= window {
                return None;
            }
            // A new READ or atomic request takes a responder resource; asking again for one
            // already sent (after a rewind) reuses its own.
            if wqe.op.is_read_or_atomic()
                && !self.req_psn.precedes(self.sent_psn)
                && self.requests_outstanding() >= u32::from(self.max_rd_atomic.max(1))
            {
                return None;
            }
            if self.req_pkt == 0 && wqe.fence && self.reads_outstanding(index) > 0 {
                return None;
            }
        }
        let mtu = self.mtu;
        let transport = self.transport();
        let read_piece = self.read_piece(self.sq[index].npkts);
        let wqe = &mut self.sq[index];
        if !wqe.started {
            wqe.started = true;
            wqe.first_psn = self.req_psn;
            if matches!(wqe.op, SendOp::Read(_)) && transport == Transport::Rc {
                wqe.piece = read_piece;
            }
        }
        let k = self.req_pkt;
        let psn = self.req_psn;
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, self.dest_qpn, psn);
        let (repr, consumed, payload_at) = match wqe.op {
            SendOp::Read(remote) => {
                // From here to the end of the piece holding PSN k.
                let done = u64::from(k) * u64::from(mtu);
                let piece_end = ((k / wqe.piece + 1) * wqe.piece).min(wqe.npkts);
                let end = (u64::from(piece_end) * u64::from(mtu)).min(u64::from(wqe.len));
                bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                bth.ack_req = true;
                let mut repr = PacketRepr::new(bth);
                repr.reth = Some(Reth {
                    va: remote.va.wrapping_add(done),
                    rkey: remote.rkey,
                    len: (end - done) as u32,
                });
                (repr, piece_end - k, None)
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                bth.opcode = Opcode::RC_COMPARE_SWAP;
                bth.ack_req = true;
                let mut repr = PacketRepr::new(bth);
                repr.atomic = Some(AtomicEth {
                    va: remote.va,
                    rkey: remote.rkey,
                    swap_add: swap,
                    compare,
                });
                (repr, 1, None)
            }
            SendOp::FetchAdd { remote, add } => {
                bth.opcode = Opcode::RC_FETCH_ADD;
                bth.ack_req = true;
                let mut repr = PacketRepr::new(bth);
                repr.atomic = Some(AtomicEth {
                    va: remote.va,
                    rkey: remote.rkey,
                    swap_add: add,
                    compare: 0,
                });
                (repr, 1, None)
            }
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write(_) | SendOp::WriteWithImm(..) => {
                let offset = u64::from(k) * u64::from(mtu);
                let n = (u64::from(wqe.len) - offset).min(u64::from(mtu)) as usize;
                let first = k == 0;
                let last = k + 1 == wqe.npkts;
                let (is_write, imm, remote) = match wqe.op {
                    SendOp::Send => (false, None, None),
                    SendOp::SendWithImm(imm) => (false, Some(imm), None),
                    SendOp::Write(r) => (true, None, Some(r)),
                    SendOp::WriteWithImm(r, imm) => (true, Some(imm), Some(r)),
                    _ => unreachable!("outer match"),
                };
                let imm = if last { imm } else { None };
                let operation = match (is_write, first, last, imm.is_some()) {
                    (false, true, true, false) => Operation::SendOnly,
                    (false, true, true, true) => Operation::SendOnlyWithImmediate,
                    (false, true, false, _) => Operation::SendFirst,
                    (false, false, false, _) => Operation::SendMiddle,
                    (false, false, true, false) => Operation::SendLast,
                    (false, false, true, true) => Operation::SendLastWithImmediate,
                    (true, true, true, false) => Operation::RdmaWriteOnly,
                    (true, true, true, true) => Operation::RdmaWriteOnlyWithImmediate,
                    (true, true, false, _) => Operation::RdmaWriteFirst,
                    (true, false, false, _) => Operation::RdmaWriteMiddle,
                    (true, false, true, false) => Operation::RdmaWriteLast,
                    (true, false, true, true) => Operation::RdmaWriteLastWithImmediate,
                };
                bth.opcode = Opcode::from_parts(transport, operation)?;
                bth.solicited = last && wqe.solicited && (!is_write || imm.is_some());
                if transport == Transport::Rc {
                    // Twice per window at least, so a narrowed window never waits for a
                    // timeout to open again.
                    let every = MAX_PKT_PER_ACK.min(self.cwnd / 2).max(1);
                    bth.ack_req = last || self.probing || self.since_ack_req + 1 >= every;
                }
                let mut repr = PacketRepr::new(bth);
                if first {
                    if let Some(r) = remote {
                        repr.reth = Some(Reth {
                            va: r.va,
                            rkey: r.rkey,
                            len: wqe.len,
                        });
                    }
                }
                repr.imm = imm;
                repr.payload_len = n;
                (repr, 1, Some(offset))
            }
        };
        let header_len = repr.emit_headers(buf).ok()?;
        let end = header_len + repr.payload_len;
        if let Some(offset) = payload_at {
            match &wqe.data {
                WqeData::Segs(segs) => gather(segs, offset, &mut buf[header_len..end], mem),
                WqeData::Inline(bytes) => {
                    let start = offset as usize;
                    buf[header_len..end].copy_from_slice(&bytes[start..start + repr.payload_len]);
                }
            }
        }
        let len = repr.buffer_len();
        buf[end..len].fill(0);

        if repr.bth.ack_req {
            self.since_ack_req = 0;
            // Time a packet sent for the first time (Karn: a resent one's answer could be
            // the first copy's).
            if self.is_rc() && self.rtt_sample.is_none() && !psn.precedes(self.sent_psn) {
                self.rtt_sample = Some((psn, now));
            }
        } else {
            self.since_ack_req += 1;
        }
        self.req_psn = psn.add(consumed);
        if self.sent_psn.precedes(self.req_psn) {
            self.sent_psn = self.req_psn;
        }
        self.req_pkt = k + consumed;
        if self.req_pkt >= self.sq[index].npkts {
            self.req_pkt = 0;
            if self.is_rc() {
                self.req_index += 1;
            } else if let Some(wqe) = self.sq.pop_front() {
                // UC: nothing will acknowledge it; it is done once sent.
                self.complete_send(ctx, &wqe, WcStatus::Success);
            }
        }
        if self.is_rc() && self.retransmit_at.is_none() {
            self.retransmit_at = self.timeout.map(|t| now + t);
            self.early_at = self.early_resend_at(now);
        }
        Some(len)
    }

    /// Rewinds the requester to resend from `to` (go-back-N).
    fn rewind(&mut self, to: Psn) {
        // The request holding `to`, or else the first one after it (which restarts whole).
        let index = self
            .sq
            .iter()
            .position(|w| w.contains(to) || !w.started || to.precedes(w.first_psn))
            .unwrap_or(self.sq.len());
        let (pkt, psn) = match self.sq.get(index) {
            Some(w) if w.contains(to) => (w.first_psn.steps_to(to), to),
            Some(w) if w.started => (0, w.first_psn),
            _ => (0, to),
        };
        self.req_index = index;
        self.req_pkt = pkt;
        self.req_psn = psn;
        self.since_ack_req = 0;
        self.rtt_sample = None;
    }

    /// A retry after a timeout, a sequence NAK or an implied NAK: counts it, or gives up.
    ///
    /// Only the first signal of a loss starts a retry: the responses already in flight
    /// behind a gap (a long READ's, or later requests' ACKs implying the loss again) each
    /// signal it anew, and retrying on every one would spend all of `retry_cnt` on one lost
    /// packet (rxe's completer ignores them the same way until the retry makes progress).
    /// A timeout always retries.
    fn retry(&mut self, ctx: &mut Ctx, from: Psn, cause: RetryCause) {
        if cause == RetryCause::Signal && self.retrying_from == Some(from) {
            ctx.counters.stale_response += 1;
            return;
        }
        self.retrying_from = Some(from);
        // A loss signalled or timed out: whatever an early probe was waiting to learn, this
        // retry is the answer.
        self.early_probe = None;
        self.early_read_watch = false;
        if self.retries_left == 0 {
            ctx.counters.retry_exceeded_err += 1;
            self.fail_front(ctx, WcStatus::RetryExcErr);
            return;
        }
        self.retries_left -= 1;
        ctx.counters.completer_retry_err += 1;
        self.cwnd = (self.cwnd / 2).max(MIN_WINDOW_PSNS);
        self.cwnd_credit = 0;
        self.rewind(from);
        self.retransmit_at = None;
    }

    /// Completes the SEND and WRITE requests whose packets up to `psn` are acknowledged, and
    /// moves the completer past `psn`. A READ or atomic in the way whose PSN is covered was
    /// answered by its peer with an ACK instead: an implied NAK, so it is retried.
    fn ack_through(&mut self, ctx: &mut Ctx, psn: Psn) {
        let start = self.comp_psn;
        let mut progressed = false;
        while let Some(front) = self.sq.front() {
            if !front.started || psn.precedes(front.first_psn) {
                break;
            }
            if front.op.is_read_or_atomic() {
                if psn.precedes(front.last_psn()) {
                    // Inside a READ's response PSNs: those responses are counted as they come.
                    return;
                }
                // The responder acknowledged a PSN at or past this request without answering
                // it: its response was lost (an implied NAK).
                if progressed {
                    self.comp_psn = front.first_psn;
                }
                self.retry(ctx, self.comp_psn, RetryCause::Signal);
                return;
            }
            if psn.precedes(front.last_psn()) {
                // Part of a long message: the completer moves on, the request stays.
                break;
            }
            let wqe = self.sq.pop_front().expect("front exists");
            self.req_index = self.req_index.saturating_sub(1);
            let after = wqe.last_psn().next();
            if self.comp_psn.precedes(after) {
                self.comp_psn = after;
            }
            self.complete_send(ctx, &wqe, WcStatus::Success);
            progressed = true;
        }
        if self.comp_psn.precedes(psn.next()) {
            self.comp_psn = psn.next();
            progressed = true;
        }
        if progressed {
            self.made_progress(start.steps_to(self.comp_psn));
        }
    }

    /// The peer acknowledged or answered `acked` PSNs more: the retry counts start over, the
    /// requester leaves probing, and the send window widens by one PSN per window acked.
    fn made_progress(&mut self, acked: u32) {
        self.cwnd_credit = self.cwnd_credit.saturating_add(acked);
        while self.cwnd < MAX_UNACKED_PSNS && self.cwnd_credit >= self.cwnd {
            self.cwnd_credit -= self.cwnd;
            self.cwnd += 1;
        }
        self.retries_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.timed_out = false;
        self.probing = false;
        self.early_count = 0;
    }

    /// Takes the round-trip sample if its packet is now answered, and updates the estimate.
    fn sample_rtt(&mut self, now: Instant) {
        let Some((psn, sent)) = self.rtt_sample else {
            return;
        };
        if !psn.precedes(self.comp_psn) {
            return;
        }
        self.rtt_sample = None;
        let rtt = now.saturating_duration_since(sent);
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let dev = rtt.abs_diff(srtt);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }

    /// When an early resend would be due if nothing is answered from `now` on: the RFC 6298
    /// timeout from the measured round trip, or a sixteenth of the ACK timeout before there is
    /// a measurement (a loss in the first window leaves none), at least [`MIN_EARLY_RESEND`]
    /// and doubled per early resend already made in this stall; `None` when it would not come
    /// well before the ACK timeout.
    fn early_resend_at(&self, now: Instant) -> Option<Instant> {
        let timeout = self.timeout?;
        let estimate = match self.srtt {
            Some(srtt) => srtt + 4 * self.rttvar,
            None => timeout / 16,
        };
        let after = estimate
            .max(MIN_EARLY_RESEND)
            .checked_mul(1 << (self.early_count + self.early_shift).min(16))?;
        (after * 2 <= timeout).then(|| now + after)
    }

    fn ack_before(&mut self, ctx: &mut Ctx, psn: Psn) {
        let prev = psn.sub(1);
        if !prev.precedes(self.comp_psn) {
            self.ack_through(ctx, prev);
        }
    }

    fn rearm(&mut self, now: Instant) {
        let waiting = self.comp_psn != self.req_psn && self.state == QpState::Rts;
        self.retransmit_at = if waiting {
            self.timeout.map(|t| now + t)
        } else {
            None
        };
        self.early_at = if waiting {
            self.early_resend_at(now)
        } else {
            None
        };
    }

    /// The early resend is due (see [`Qp::early_at`]). It spends no `retry_cnt`. A stall
    /// can be a slow peer rather than a loss (an emulated rxe working through a window), so
    /// it costs as little as it can when it turns out needless:
    ///
    /// - Behind a SEND or WRITE, it goes back to the oldest unanswered PSN as a retry would,
    ///   but probes: it resends only the oldest [`PROBE_PSNS`] packets, each asking for an
    ///   ACK, until an ACK makes progress. After a real loss, go-back-N then carries on; if
    ///   the ACK covers packets the probe did not resend, the originals got through.
    /// - Behind a READ, it asks again for the rest of the piece in flight (rxe's responder
    ///   cannot serve a smaller part first and the rest later: a replay moves the start of
    ///   its record). If a response then arrives twice, the originals were on their way.
    ///
    /// Either finding of a needless resend doubles this QP's later early-resend delays.
    fn resend_early(&mut self, ctx: &mut Ctx, now: Instant) {
        self.early_count += 1;
        ctx.counters.early_resends += 1;
        let from = self.comp_psn;
        let read = self
            .sq
            .front()
            .is_some_and(|w| matches!(w.op, SendOp::Read(_)) && w.contains(from));
        self.early_probe = (!read).then_some(from);
        self.early_read_watch = read;
        self.probing = !read;
        self.retrying_from = Some(from);
        self.rewind(from);
        self.early_at = self.early_resend_at(now);
    }

    /// An early resend turned out needless: later ones of this QP wait twice as long.
    fn early_was_needless(&mut self, ctx: &mut Ctx) {
        ctx.counters.early_needless += 1;
        self.early_shift = (self.early_shift + 1).min(MAX_EARLY_SHIFT);
    }

    /// A response (ACK, NAK, READ response, atomic ACK) reached the requester.
    fn handle_response(
        &mut self,
        now: Instant,
        packet: &Packet<&[u8]>,
        ctx: &mut Ctx,
        mem: &mut dyn Memory,
    ) {
        let psn = packet.psn();
        // Only PSNs that were sent and not yet completed mean anything. A cumulative ACK counts
        // up to the newest PSN ever sent; a READ response or atomic ACK beyond a rewind belongs
        // to the abandoned burst (the rewind asks for it again).
        let limit = if packet.opcode().operation() == Operation::Acknowledge {
            self.sent_psn
        } else {
            self.req_psn
        };
        let sent = psn.precedes(limit) && !psn.precedes(self.comp_psn);
        if !sent || self.sq.is_empty() {
            ctx.counters.stale_response += 1;
            if self.early_read_watch
                && packet.opcode().operation() != Operation::Acknowledge
                && psn.precedes(self.comp_psn)
            {
                // A second copy of a READ response already taken: the early resend asked
                // again for responses that were on their way.
                self.early_read_watch = false;
                self.early_was_needless(ctx);
            }
            return;
        }
        match packet.opcode().operation() {
            Operation::Acknowledge => {
                let Some(aeth) = packet.aeth() else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => self.ack_through(ctx, psn),
                    Syndrome::RnrNak(timer) => {
                        self.ack_before(ctx, psn);
                        ctx.counters.rcvd_rnr_err += 1;
                        if self.state != QpState::Rts && self.state != QpState::Sqd {
                            return;
                        }
                        if self.rnr_retry != 7 {
                            if self.rnr_left == 0 {
                                ctx.counters.retry_rnr_exceeded_err += 1;
                                self.fail_front(ctx, WcStatus::RnrRetryExcErr);
                                return;
                            }
                            self.rnr_left -= 1;
                        }
                        self.rewind(psn);
                        self.rnr_wait_until = Some(now + timer.duration());
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        self.ack_before(ctx, psn);
                        ctx.counters.rcvd_seq_err += 1;
                        if self.state == QpState::Rts || self.state == QpState::Sqd {
                            self.retry(ctx, psn, RetryCause::Signal);
                        }
                    }
                    Syndrome::Nak(code) => {
                        self.ack_before(ctx, psn);
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        if self.state != QpState::Err {
                            self.fail_front(ctx, status);
                        }
                    }
                    Syndrome::Reserved(_) => ctx.counters.stale_response += 1,
                }
            }
            Operation::AtomicAcknowledge => {
                self.ack_before(ctx, psn);
                let Some(front) = self.sq.front() else { return };
                if !front.op.is_read_or_atomic()
                    || matches!(front.op, SendOp::Read(_))
                    || !front.started
                    || front.first_psn != psn
                {
                    ctx.counters.stale_response += 1;
                    return;
                }
                let Some(ack) = packet.atomic_ack() else {
                    return;
                };
                scatter(front.segs(), 0, &ack.orig.to_ne_bytes(), mem);
                let wqe = self.sq.pop_front().expect("front exists");
                self.req_index = self.req_index.saturating_sub(1);
                let acked = self.comp_psn.steps_to(psn.next());
                self.comp_psn = psn.next();
                self.made_progress(acked);
                self.complete_send(ctx, &wqe, WcStatus::Success);
            }
            op @ (Operation::RdmaReadResponseFirst
            | Operation::RdmaReadResponseMiddle
            | Operation::RdmaReadResponseLast
            | Operation::RdmaReadResponseOnly) => {
                self.ack_before(ctx, psn);
                if self.state == QpState::Err {
                    return;
                }
                let mtu = self.mtu;
                let Some(front) = self.sq.front_mut() else {
                    return;
                };
                if !matches!(front.op, SendOp::Read(_)) || !front.contains(psn) {
                    ctx.counters.stale_response += 1;
                    return;
                }
                if psn != self.comp_psn {
                    // An earlier response was lost: go back for it.
                    if self.comp_psn.precedes(psn) {
                        let from = self.comp_psn;
                        self.retry(ctx, from, RetryCause::Signal);
                    } else {
                        ctx.counters.stale_response += 1;
                    }
                    return;
                }
                let k = front.first_psn.steps_to(psn);
                let offset = u64::from(k) * u64::from(mtu);
                let remaining = u64::from(front.len) - offset;
                let last = k + 1 == front.npkts;
                // The PSN fixes the offset. Whether the packet says FIRST or MIDDLE depends on
                // which request (the original or a retry) it answers, so only its length and
                // whether it ends a request (the last PSN of a piece) are checked. Anything
                // else is dropped; the retransmission timer recovers.
                let payload = packet.payload();
                let ends = matches!(
                    op,
                    Operation::RdmaReadResponseLast | Operation::RdmaReadResponseOnly
                );
                let piece_ends = last || (k + 1) % front.piece == 0;
                let len_ok =
                    ends == piece_ends && payload.len() as u64 == remaining.min(u64::from(mtu));
                if !len_ok {
                    ctx.counters.stale_response += 1;
                    return;
                }
                scatter(front.segs(), offset, payload, mem);
                self.comp_psn = psn.next();
                self.made_progress(1);
                if last {
                    let wqe = self.sq.pop_front().expect("front exists");
                    self.req_index = self.req_index.saturating_sub(1);
                    self.complete_send(ctx, &wqe, WcStatus::Success);
                }
            }
            _ => ctx.counters.opcode_err += 1,
        }
        if let Some(from) = self.early_probe {
            if self.comp_psn != from || self.state != QpState::Rts {
                self.early_probe = None;
                // Answered past what the probe resent: the originals got through, and the
                // stall was a slow peer or a lost ACK, not a loss (which would have been a
                // retry by now). Carry on from where sending had got to rather than resend
                // what is still on its way.
                if self.req_psn.precedes(self.comp_psn) {
                    self.early_was_needless(ctx);
                    self.rewind(self.sent_psn);
                } else {
                    self.early_shift = self.early_shift.saturating_sub(1);
                }
            }
        }
        if self.req_psn.precedes(self.comp_psn) {
            // Acknowledged past what a rewind left to resend: carry on from there.
            self.rewind(self.comp_psn);
        }
        self.sample_rtt(now);
        self.rearm(now);
    }

    // ---------------------------------------------------------------- responder

    fn push_ack(&mut self, psn: Psn) {
        let msn = self.msn;
        if let Some(Response::Ack {
            psn: last,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.responses.back_mut()
        {
            // Coalesce: a later cumulative ACK supersedes one not yet sent.
            *last = psn;
            *m = msn;
            return;
        }
        self.responses.push_back(Response::Ack {
            psn,
            syndrome: Syndrome::ACK,
            msn,
        });
    }

    /// No receive request for a SEND or a WRITE with immediate: ask the requester to wait
    /// the QP's RNR timer and retry from `psn`. Not fatal, and the packet is not executed.
    fn push_rnr_nak(&mut self, ctx: &mut Ctx, psn: Psn) {
        ctx.counters.send_rnr_err += 1;
        self.responses.push_back(Response::Ack {
            psn,
            syndrome: Syndrome::RnrNak(self.min_rnr_timer),
            msn: self.msn,
        });
    }

    fn push_nak(&mut self, psn: Psn, code: NakCode) {
        self.responses.push_back(Response::Ack {
            psn,
            syndrome: Syndrome::Nak(code),
            msn: self.msn,
        });
    }

    /// A request reached the responder.
    fn handle_request(&mut self, packet: &Packet<&[u8]>, ctx: &mut Ctx, mem: &mut dyn Memory) {
        let psn = packet.psn();
        if !self.is_rc() {
            self.handle_uc_request(packet, ctx, mem);
            return;
        }
        let distance = self.epsn.distance_to(psn);
        if distance > 0 {
            ctx.counters.out_of_seq_request += 1;
            if !self.nak_sent {
                self.nak_sent = true;
                self.push_nak(self.epsn, NakCode::PsnSequenceError);
            }
            return;
        }
        if distance < 0 {
            ctx.counters.duplicate_request += 1;
            self.handle_duplicate(packet, ctx);
            return;
        }
        self.nak_sent = false;
        if let Err(Nak(code)) = self.execute(packet, ctx, mem) {
            match code {
                NakCode::RemoteAccessError => ctx.counters.resp_access_err += 1,
                _ => ctx.counters.resp_invalid_req += 1,
            }
            self.push_nak(psn, code);
            self.enter_err(ctx);
        }
    }

    /// Checks the payload length of one packet of a SEND or WRITE message.
    fn check_len(&self, opcode: Opcode, len: usize) -> Result<(), Nak> {
        let mtu = self.mtu as usize;
        let ok = match (opcode.is_first(), opcode.is_last()) {
            (_, false) => len == mtu,
            (true, true) => len <= mtu,
            (false, true) => len >= 1 && len <= mtu,
        };
        if ok {
            Ok(())
        } else {
            Err(Nak(NakCode::InvalidRequest))
        }
    }

    /// Copies the unsent bytes of every queued READ response out of registered memory. A
    /// responder executes requests in PSN order, so a READ must return memory as it was
    /// before any later request changed it; responses are built lazily at transmit time, so
    /// the bytes are copied only when a later request is about to write while they wait.
    fn snapshot_reads(&mut self, mem: &dyn Memory) {
        let mtu = u64::from(self.mtu);
        for response in &mut self.responses {
            if let Response::Read(job) = response {
                if let ReadSource::Region(region, at) = job.source {
                    let done = u64::from(job.sent) * mtu;
                    let mut bytes = vec![0; (u64::from(job.len) - done) as usize];
                    mem.read(region, at + done, &mut bytes);
                    job.source = ReadSource::Copied(bytes);
                    job.len -= done as u32;
                    job.psn = job.psn.add(job.sent);
                    job.sent = 0;
                }
            }
        }
    }

    /// Executes the request at the expected PSN. For RC an `Err` is answered with its NAK
    /// and moves the QP to ERR; `Ok` covers RNR NAKs, which are not fatal.
    fn execute(
        &mut self,
        packet: &Packet<&[u8]>,
        ctx: &mut Ctx,
        mem: &mut dyn Memory,
    ) -> Result<(), Nak> {
        let opcode = packet.opcode();
        let psn = packet.psn();
        let op = opcode.operation();
        let payload = packet.payload();
        let invalid = || Nak(NakCode::InvalidRequest);
        if !matches!(op, Operation::RdmaReadRequest) {
            self.snapshot_reads(mem);
        }
        match op {
            Operation::SendFirst
            | Operation::SendMiddle
            | Operation::SendLast
            | Operation::SendLastWithImmediate
            | Operation::SendOnly
            | Operation::SendOnlyWithImmediate => {
                match (&self.in_msg, opcode.is_first()) {
                    (None, true) | (Some(InMsg::Send { .. }), false) => {}
                    _ => return Err(invalid()),
                }
                self.check_len(opcode, payload.len())?;
                if opcode.is_first() {
                    let Some(wqe) = self.rq.pop_front() else {
                        self.push_rnr_nak(ctx, psn);
                        return Ok(());
                    };
                    self.in_msg = Some(InMsg::Send { wqe, offset: 0 });
                }
                let Some(InMsg::Send { wqe, offset }) = &mut self.in_msg else {
                    return Err(invalid());
                };
                let end = *offset + payload.len() as u64;
                if end > wqe.len || wqe.fault.is_some() {
                    let (wr_id, status) = (wqe.wr_id, wqe.fault.unwrap_or(WcStatus::LocLenErr));
                    self.in_msg = None;
                    self.complete_recv(ctx, wr_id, status, WcOpcode::Recv, 0, None);
                    return Err(invalid());
                }
                scatter(&wqe.segs, *offset, payload, mem);
                *offset = end;
                self.epsn = psn.next();
                if opcode.is_last() {
                    let Some(InMsg::Send { wqe, offset }) = self.in_msg.take() else {
                        return Err(invalid());
                    };
                    self.msn = (self.msn + 1) & 0x00ff_ffff;
                    ctx.counters.rdma_recvs += 1;
                    self.complete_recv(
                        ctx,
                        wqe.wr_id,
                        WcStatus::Success,
                        WcOpcode::Recv,
                        offset,
                        packet.imm(),
                    );
                }
                if packet.ack_req() {
                    self.push_ack(psn);
                }
                Ok(())
            }
            Operation::RdmaWriteFirst
            | Operation::RdmaWriteMiddle
            | Operation::RdmaWriteLast
            | Operation::RdmaWriteLastWithImmediate
            | Operation::RdmaWriteOnly
            | Operation::RdmaWriteOnlyWithImmediate => {
                match (&self.in_msg, opcode.is_first()) {
                    (None, true) | (Some(InMsg::Write { .. }), false) => {}
                    _ => return Err(invalid()),
                }
                self.check_len(opcode, payload.len())?;
                let with_imm = packet.imm().is_some();
                if with_imm && self.rq.is_empty() {
                    self.push_rnr_nak(ctx, psn);
                    return Ok(());
                }
                if opcode.is_first() {
                    let reth = packet.reth().ok_or_else(invalid)?;
                    if !self.access.contains(Access::REMOTE_WRITE)
                        || u64::from(reth.len) > MAX_MESSAGE
                    {
                        return Err(invalid());
                    }
                    let target = if reth.len == 0 {
                        None
                    } else {
                        let pd = self.init.pd;
                        let found = ctx.table.check_remote(
                            reth.rkey,
                            pd,
                            reth.va,
                            reth.len.into(),
                            Access::REMOTE_WRITE,
                        );
                        Some(found.map_err(|_| Nak(NakCode::RemoteAccessError))?)
                    };
                    self.in_msg = Some(InMsg::Write {
                        target,
                        va: reth.va,
                        written: 0,
                        total: reth.len,
                    });
                }
                let Some(InMsg::Write {
                    target,
                    va,
                    written,
                    total,
                }) = &mut self.in_msg
                else {
                    return Err(invalid());
                };
                let end = u64::from(*written) + payload.len() as u64;
                if end > u64::from(*total) || (opcode.is_last() && end != u64::from(*total)) {
                    return Err(invalid());
                }
                if let Some(filter) = self.write_filter.0.as_mut() {
                    let write = InboundWrite {
                        psn,
                        va: va.wrapping_add(u64::from(*written)),
                        len: payload.len() as u32,
                        imm: packet.imm(),
                        last: opcode.is_last(),
                    };
                    if !filter.admit(&write) {
                        ctx.counters.write_filtered += 1;
                        return Err(Nak(NakCode::RemoteAccessError));
                    }
                }
                if let Some((region, offset)) = *target {
                    if !payload.is_empty() {
                        mem.write(region, offset + u64::from(*written), payload);
                    }
                }
                *written = end as u32;
                let total = *total;
                self.epsn = psn.next();
                if opcode.is_last() {
                    self.in_msg = None;
                    self.msn = (self.msn + 1) & 0x00ff_ffff;
                    if with_imm {
                        let wqe = self.rq.pop_front().expect("checked above");
                        self.complete_recv(
                            ctx,
                            wqe.wr_id,
                            WcStatus::Success,
                            WcOpcode::RecvRdmaWithImm,
                            total.into(),
                            packet.imm(),
                        );
                    }
                }
                if packet.ack_req() {
                    self.push_ack(psn);
                }
                Ok(())
            }
            Operation::RdmaReadRequest => {
                if self.in_msg.is_some() || !self.access.contains(Access::REMOTE_READ) {
                    return Err(invalid());
                }
                let reth = packet.reth().ok_or_else(invalid)?;
                if u64::from(reth.len) > MAX_MESSAGE {
                    return Err(invalid());
                }
                let target = self.check_read(ctx, reth)?;
                let n = reth.len.div_ceil(self.mtu).max(1);
                self.push_resource(Resource::Read {
                    first: psn,
                    last: psn.add(n - 1),
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.len,
                });
                self.msn = (self.msn + 1) & 0x00ff_ffff;
                self.responses.push_back(Response::Read(ReadJob {
                    psn,
                    source: target.into(),
                    sent: 0,
                    len: reth.len,
                    msn: self.msn,
                }));
                self.epsn = psn.add(n);
                Ok(())
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if self.in_msg.is_some() || !self.access.contains(Access::REMOTE_ATOMIC) {
                    return Err(invalid());
                }
                let a = packet.atomic_eth().ok_or_else(invalid)?;
                if a.va % 8 != 0 {
                    return Err(invalid());
                }
                let (region, offset) = ctx
                    .table
                    .check_remote(a.rkey, self.init.pd, a.va, 8, Access::REMOTE_ATOMIC)
                    .map_err(|_| Nak(NakCode::RemoteAccessError))?;
                let atomic = if op == Operation::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = mem.atomic(region, offset, atomic);
                self.push_resource(Resource::Atomic { psn, orig });
                self.msn = (self.msn + 1) & 0x00ff_ffff;
                self.responses.push_back(Response::AtomicAck {
                    psn,
                    orig,
                    msn: self.msn,
                });
                self.epsn = psn.next();
                Ok(())
            }
            // Invalidation, FLUSH and ATOMIC WRITE are not implemented: refused as invalid.
            _ => Err(invalid()),
        }
    }

    fn check_read(&self, ctx: &Ctx, reth: Reth) -> Result<Option<(RegionId, u64)>, Nak> {
        if reth.len == 0 {
            return Ok(None);
        }
        ctx.table
            .check_remote(
                reth.rkey,
                self.init.pd,
                reth.va,
                reth.len.into(),
                Access::REMOTE_READ,
            )
            .map(Some)
            .map_err(|_| Nak(NakCode::RemoteAccessError))
    }

    fn push_resource(&mut self, resource: Resource) {
        let capacity = usize::from(self.max_dest_rd_atomic.max(1)).next_power_of_two();
        while self.resources.len() >= capacity {
            self.resources.pop_front();
        }
        self.resources.push_back(resource);
    }

    /// A request with a PSN already executed: re-ACK a SEND or WRITE, replay a READ or an
    /// atomic from the resource ring, drop anything else.
    fn handle_duplicate(&mut self, packet: &Packet<&[u8]>, ctx: &Ctx) {
        let psn = packet.psn();
        match packet.opcode().operation() {
            Operation::RdmaReadRequest => {
                let Some(reth) = packet.reth() else { return };
                let mtu = u64::from(self.mtu);
                let found = self.resources.iter().rev().find_map(|r| match *r {
                    Resource::Read {
                        first,
                        last,
                        va,
                        rkey,
                        len,
                    } if psn.in_window(first, first.steps_to(last) + 1) => {
                        Some((first, va, rkey, len))
                    }
                    _ => None,
                });
                let Some((first, va, rkey, len)) = found else {
                    return;
                };
                let skip = u64::from(first.steps_to(psn)) * mtu;
                let expected_va = va.wrapping_add(skip);
                let fits = rkey == reth.rkey
                    && reth.va == expected_va
                    && u64::from(reth.len) + skip == u64::from(len);
                if !fits {
                    return;
                }
                // The region may have gone since: check again.
                let Ok(target) = self.check_read(ctx, reth) else {
                    return;
                };
                self.responses.push_back(Response::Read(ReadJob {
                    psn,
                    source: target.into(),
                    sent: 0,
                    len: reth.len,
                    msn: self.msn,
                }));
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let orig = self.resources.iter().rev().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = orig {
                    self.responses.push_back(Response::AtomicAck {
                        psn,
                        orig,
                        msn: self.msn,
                    });
                }
            }
            _ => self.push_ack(self.epsn.sub(1)),
        }
    }

    /// UC: no ACKs; a gap or an out-of-sequence opcode abandons the message in progress.
    fn handle_uc_request(&mut self, packet: &Packet<&[u8]>, ctx: &mut Ctx, mem: &mut dyn Memory) {
        let psn = packet.psn();
        let opcode = packet.opcode();
        if psn != self.epsn {
            ctx.counters.out_of_seq_request += 1;
            self.abandon_uc(ctx);
        }
        self.epsn = psn.next();
        if self.in_msg.is_none() && !opcode.is_first() {
            // The rest of a message whose start was lost.
            return;
        }
        let with_imm = packet.imm().is_some();
        let needs_wqe = (opcode.is_first() && opcode.operation_is_send()) || with_imm;
        if needs_wqe && self.rq.is_empty() && !matches!(self.in_msg, Some(InMsg::Send { .. })) {
            ctx.counters.uc_dropped_msgs += 1;
            self.in_msg = None;
            return;
        }
        // UC reuses the RC execution, minus ACKs; failures drop the message silently.
        let before = self.responses.len();
        let filtered = ctx.counters.write_filtered;
        let result = self.execute(packet, ctx, mem);
        self.responses.truncate(before);
        if let Err(nak) = result {
            // A filter's refusal is counted as `write_filtered` already.
            if nak.0 == NakCode::RemoteAccessError && ctx.counters.write_filtered == filtered {
                ctx.counters.uc_access_err += 1;
            }
            ctx.counters.uc_dropped_msgs += 1;
            self.abandon_uc(ctx);
            self.epsn = psn.next();
        }
    }

    fn abandon_uc(&mut self, ctx: &mut Ctx) {
        match self.in_msg.take() {
            Some(InMsg::Send { wqe, .. }) => {
                // The receive request is reused for the next message.
                self.rq.push_front(wqe);
                ctx.counters.uc_dropped_msgs += 1;
            }
            Some(InMsg::Write { .. }) => ctx.counters.uc_dropped_msgs += 1,
            None => {}
        }
    }

    /// Builds the next response packet (ACK, NAK, READ response, atomic ACK) into `buf`.
    fn next_response(&mut self, mem: &dyn Memory, buf: &mut [u8]) -> Option<usize> {
        let mtu = self.mtu;
        let dest_qpn = self.dest_qpn;
        let repr = match self.responses.front_mut()? {
            Response::Ack { psn, syndrome, msn } => {
                let mut repr = PacketRepr::new(Bth::new(Opcode::RC_ACKNOWLEDGE, dest_qpn, *psn));
                repr.aeth = Some(Aeth {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                repr
            }
            Response::AtomicAck { psn, orig, msn } => {
                let mut repr =
                    PacketRepr::new(Bth::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest_qpn, *psn));
                repr.aeth = Some(Aeth {
                    syndrome: Syndrome::ACK,
                    msn: *msn,
                });
                repr.atomic_ack = Some(AtomicAckEth { orig: *orig });
                repr
            }
            Response::Read(job) => {
                let offset = u64::from(job.sent) * u64::from(mtu);
                let remaining = u64::from(job.len) - offset;
                let n = remaining.min(u64::from(mtu)) as usize;
                let first = job.sent == 0;
                let last = remaining <= u64::from(mtu);
                let opcode = match (first, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                let mut repr = PacketRepr::new(Bth::new(opcode, dest_qpn, job.psn.add(job.sent)));
                if opcode.headers().contains(HeaderSet::AETH) {
                    repr.aeth = Some(Aeth {
                        syndrome: Syndrome::ACK,
                        msn: job.msn,
                    });
                }
                repr.payload_len = n;
                let header_len = repr.emit_headers(buf).ok()?;
                let out = &mut buf[header_len..header_len + n];
                match &job.source {
                    ReadSource::Empty => {}
                    ReadSource::Region(region, at) => mem.read(*region, at + offset, out),
                    ReadSource::Copied(bytes) => {
                        let start = offset as usize;
                        out.copy_from_slice(&bytes[start..start + n]);
                    }
                }
                buf[header_len + n..repr.buffer_len()].fill(0);
                job.sent += 1;
                if last {
                    self.responses.pop_front();
                }
                return Some(repr.buffer_len());
            }
        };
        let len = repr.emit(&[], buf).ok()?;
        self.responses.pop_front();
        Some(len)
    }
}

impl From<Option<(RegionId, u64)>> for ReadSource {
    fn from(target: Option<(RegionId, u64)>) -> Self {
        match target {
            Some((region, at)) => Self::Region(region, at),
            None => Self::Empty,
        }
    }
}

trait OpcodeExt {
    fn operation_is_send(self) -> bool;
}

impl OpcodeExt for Opcode {
    fn operation_is_send(self) -> bool {
        matches!(
            self.operation(),
            Operation::SendFirst
                | Operation::SendMiddle
                | Operation::SendLast
                | Operation::SendLastWithImmediate
                | Operation::SendOnly
                | Operation::SendOnlyWithImmediate
        )
    }
}

/// The RoCEv2 protocol engine of one local address: its queue pairs, completion queues and
/// memory regions. See the module documentation for how to drive it.
pub struct Engine {
    ctx: Ctx,
    qps: BTreeMap<u32, Qp>,
    next_qpn: u32,
    next_cq: u32,
    next_pd: u32,
    tx_cursor: u32,
}

impl Engine {
    /// An engine for `config.local_ip` with no queue pairs.
    #[must_use]
    pub fn new(config: EngineConfig) -> Self {
        Self {
            ctx: Ctx {
                local_ip: config.local_ip,
                local_port: ROCE_PORT,
                cqs: HashMap::new(),
                table: MemoryTable::new(config.seed),
                counters: Counters::default(),
            },
            qps: BTreeMap::new(),
            next_qpn: 0x11,
            next_cq: 1,
            next_pd: 1,
            tx_cursor: 0,
        }
    }

    /// The local IP address.
    #[must_use]
    pub fn local_ip(&self) -> IpAddr {
        self.ctx.local_ip
    }

    /// Sets the UDP port this engine receives on (4791 unless changed). The ICRC covers the
    /// destination port, so it must be the port peers send to.
    pub fn set_local_port(&mut self, port: u16) {
        self.ctx.local_port = port;
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> &Counters {
        &self.ctx.counters
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
        self.ctx.table.register(pd, va, len, access, order)
    }

    /// Deregisters a region: its keys stop working at once and the engine never touches its
    /// bytes again. Returns it, or `None` if unknown.
    pub fn deregister(&mut self, id: RegionId) -> Option<RegionInfo> {
        self.ctx.table.deregister(id)
    }

    /// The region table.
    #[must_use]
    pub fn regions(&self) -> &MemoryTable {
        &self.ctx.table
    }

    /// A completion queue holding up to `depth` completions.
    pub fn create_cq(&mut self, depth: usize) -> CqId {
        let id = CqId(self.next_cq);
        self.next_cq += 1;
        self.ctx.cqs.insert(
            id,
            Cq {
                depth: depth.max(1),
                entries: VecDeque::new(),
            },
        );
        id
    }

    /// The next completion of `cq`, oldest first.
    pub fn poll_completion(&mut self, cq: CqId) -> Option<Completion> {
        self.ctx.cqs.get_mut(&cq)?.entries.pop_front()
    }

    /// A queue pair in state RESET.
    pub fn create_qp(&mut self, init: QpInit) -> Qpn {
        let mut qpn = Qpn::from_low_bits(self.next_qpn);
        while self.qps.contains_key(&qpn.value()) || qpn.value() < 0x11 {
            self.next_qpn = self.next_qpn.wrapping_add(1);
            qpn = Qpn::from_low_bits(self.next_qpn);
        }
        self.next_qpn = self.next_qpn.wrapping_add(1);
        self.qps.insert(qpn.value(), Qp::new(qpn, init));
        qpn
    }

    /// Destroys a queue pair; packets for it are dropped from now on. Its outstanding work
    /// requests are discarded without completions, as `ibv_destroy_qp` does.
    pub fn destroy_qp(&mut self, qpn: Qpn) -> bool {
        self.qps.remove(&qpn.value()).is_some()
    }

    /// Adds `filter` to the inbound RDMA WRITEs of queue pair `qpn` (replacing any earlier
    /// one; `None` removes it). Returns `false` when there is no such queue pair.
    pub fn set_write_filter(&mut self, qpn: Qpn, filter: Option<Box<dyn WriteFilter>>) -> bool {
        match self.qps.get_mut(&qpn.value()) {
            Some(qp) => {
                qp.write_filter = FilterSlot(filter);
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

    /// The PSN a queue pair's requester will send next, and the one its responder expects.
    #[must_use]
    pub fn qp_psns(&self, qpn: Qpn) -> Option<(Psn, Psn)> {
        self.qps.get(&qpn.value()).map(|qp| (qp.req_psn, qp.epsn))
    }

    /// Moves a queue pair through its states (`ibv_modify_qp`); see [`QpAttr`] for what each
    /// transition requires.
    ///
    /// # Errors
    ///
    /// [`ModifyError`] names the unknown QP, the forbidden transition, the missing attribute
    /// or the value out of range; the QP is unchanged.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> Result<(), ModifyError> {
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(ModifyError::UnknownQp(qpn))?;
        let from = qp.state;
        let to = attr.state.unwrap_or(from);
        let rc = qp.is_rc();
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
                QpState::Init => need(attr.access.is_some(), "access")?,
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
                    qp.enter_err(&mut self.ctx);
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
            qp.epsn = psn;
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
        qp.state = to;
        Ok(())
    }

    fn resolve(
        table: &MemoryTable,
        pd: PdId,
        sges: &[Sge],
        needed: Access,
    ) -> (SegList, u64, Option<WcStatus>) {
        let mut segs = SegList::Many(Vec::new());
        let mut total = 0u64;
        let mut fault = None;
        for sge in sges {
            total += u64::from(sge.len);
            match table.check_local(sge.lkey, pd, sge.addr, sge.len.into(), needed) {
                Ok((region, offset)) => segs.push(Seg {
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
        let qp = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(PostError::UnknownQp(qpn))?;
        if !matches!(qp.state, QpState::Rts | QpState::Sqd | QpState::Err) {
            return Err(PostError::InvalidState(qp.state));
        }
        if !qp.is_rc() && wr.op.is_read_or_atomic() {
            return Err(PostError::Unsupported(wr.op));
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
                let (segs, len, fault) = Self::resolve(&self.ctx.table, qp.init.pd, &sges, needed);
                (WqeData::Segs(segs), len, fault)
            }
            Payload::Sge(sge) => {
                let (segs, len, fault) = Self::resolve(&self.ctx.table, qp.init.pd, &[sge], needed);
                (WqeData::Segs(segs), len, fault)
            }
        };
        if len > MAX_MESSAGE
            || (matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }) && len != 8)
        {
            return Err(PostError::Length(len));
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
        };
        if qp.state == QpState::Err {
            qp.complete_send(&mut self.ctx, &wqe, WcStatus::WrFlushErr);
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
        if qp.rq.len() >= qp.init.caps.rq_depth as usize {
            return Err(PostError::QueueFull(qp.init.caps.rq_depth));
        }
        let (segs, len, fault) =
            Self::resolve(&self.ctx.table, qp.init.pd, &wr.sges, Access::LOCAL_WRITE);
        if qp.state == QpState::Err {
            qp.complete_recv(
                &mut self.ctx,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
            );
            return Ok(());
        }
        qp.rq.push_back(RecvWqe {
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
        let counters = &mut self.ctx.counters;
        counters.rcvd_pkts += 1;
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
        let udp = UdpHeader {
            src_port: src.port(),
            dst_port: self.ctx.local_port,
        };
        if !icrc::verify(&ip, &udp, bytes) {
            // An IPv4 peer other than ferroce or a sensor bridge sent a non-zero IP ID, which
            // the ICRC covers and the socket does not show: recover it, keeping 16 bits of
            // the ICRC as the check.
            match ip {
                IpHeader::V4(v4) if icrc::recover_ipv4_id(&v4, &udp, bytes).is_some() => {
                    counters.icrc_id_recovered += 1;
                }
                _ => {
                    counters.icrc_err += 1;
                    return;
                }
            }
        }
        let opcode = packet.opcode();
        if opcode.transport() == Transport::Cnp {
            counters.rcvd_cnp += 1;
            return;
        }
        let Some(qp) = self.qps.get_mut(&packet.dest_qp().value()) else {
            counters.unknown_qp += 1;
            return;
        };
        if opcode.transport() != qp.transport() {
            counters.opcode_err += 1;
            return;
        }
        let pkey = packet.bth().pkey;
        if pkey & 0x7fff != 0x7fff {
            counters.pkey_err += 1;
            return;
        }
        if qp.peer.map(|p| p.ip()) != Some(src.ip()) {
            counters.wrong_source += 1;
            return;
        }
        if opcode.is_response() {
            if matches!(qp.state, QpState::Rts | QpState::Sqd) {
                qp.handle_response(now, &packet, &mut self.ctx, mem);
            } else {
                counters.qp_state_drop += 1;
            }
        } else if matches!(qp.state, QpState::Rtr | QpState::Rts | QpState::Sqd) {
            qp.handle_request(&packet, &mut self.ctx, mem);
        } else {
            counters.qp_state_drop += 1;
        }
    }

    /// Writes the next packet to send into `buf` (at least [`MAX_PACKET`] bytes), ICRC
    /// included, and says where it goes; `None` when nothing is ready now.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        if buf.len() < MAX_PACKET || self.qps.is_empty() {
            return None;
        }
        // Round-robin over the QPs, starting after the one served last.
        let mut key = self.tx_cursor;
        for _ in 0..self.qps.len() {
            key = match self.qps.range(key.wrapping_add(1)..).next() {
                Some((k, _)) if key != u32::MAX => *k,
                _ => *self.qps.keys().next().expect("not empty"),
            };
            let qp = self.qps.get_mut(&key).expect("key from the map");
            let Some(peer) = qp.peer else { continue };
            let ack = matches!(
                qp.responses.front(),
                Some(Response::Ack { syndrome, .. }) if *syndrome == Syndrome::ACK
            );
            let sent = qp
                .next_response(mem, buf)
                .map(|len| (len, ack))
                .or_else(|| {
                    qp.next_request(now, &mut self.ctx, mem, buf)
                        .map(|len| (len, false))
                });
            let Some((len, ack)) = sent else { continue };
            let ip = IpHeader::between(self.ctx.local_ip, peer.ip())?;
            // A UDP socket sends from its own port, not the per-QP port rxe picks when it
            // builds the IP header itself; the ICRC must cover the port actually used.
            let udp = UdpHeader {
                src_port: self.ctx.local_port,
                dst_port: peer.port(),
            };
            icrc::seal(&ip, &udp, &mut buf[..len]).ok()?;
            self.tx_cursor = key;
            self.ctx.counters.sent_pkts += 1;
            return Some(Transmit {
                dst: peer,
                src_port: self.ctx.local_port,
                len,
                ack,
            });
        }
        None
    }

    /// When [`Engine::handle_timeout`] should next be called, if any timer is armed.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.qps
            .values()
            .flat_map(|qp| [qp.retransmit_at, qp.early_at, qp.rnr_wait_until])
            .flatten()
            .min()
    }

    /// Runs the timers that are due at `now`: retransmission (go-back-N, or retry exhaustion)
    /// and the end of RNR waits.
    pub fn handle_timeout(&mut self, now: Instant) {
        for qp in self.qps.values_mut() {
            if qp.rnr_wait_until.is_some_and(|t| t <= now) {
                qp.rnr_wait_until = None;
            }
            if qp.early_at.is_some_and(|t| t <= now) {
                qp.early_at = None;
                let due_anyway = qp.retransmit_at.is_some_and(|t| t <= now);
                // An RNR wait is the responder's word, not a loss.
                if qp.state == QpState::Rts
                    && qp.comp_psn != qp.req_psn
                    && qp.rnr_wait_until.is_none()
                    && !due_anyway
                {
                    qp.resend_early(&mut self.ctx, now);
                }
            }
            if qp.retransmit_at.is_some_and(|t| t <= now) {
                qp.retransmit_at = None;
                if qp.state == QpState::Rts && qp.comp_psn != qp.req_psn {
                    let from = qp.comp_psn;
                    qp.probing = qp.timed_out;
                    qp.timed_out = true;
                    qp.retry(&mut self.ctx, from, RetryCause::Timeout);
                }
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
        let seg = |region, offset, len| Seg {
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
