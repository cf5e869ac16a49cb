//! The `engine` target's harness: arbitrary datagrams against an [`Engine`] with live queue
//! pairs and registered regions.
//!
//! One engine at 10.0.0.2 (`EngineConfig { seed: 1 }`) holds, in protection domain A, an RC
//! and a UC queue pair whose peer is 10.0.0.1:4791, and in protection domain B a "foreign" RC
//! queue pair whose peer is 10.0.0.5:4791 (from which nothing ever comes). All three are in
//! RTS with `Access::REMOTE`. The regions, back to back in one address space:
//!
//! | region        | PD | access                 | may change |
//! |---------------|----|------------------------|------------|
//! | `remote`      | A  | `REMOTE`               | yes: peers write it |
//! | `read_only`   | A  | `LOCAL + REMOTE_READ`  | no |
//! | `local`       | A  | `LOCAL` (no rkey)      | no: only the source of outgoing SEND/WRITE |
//! | `other_pd`    | B  | `REMOTE`               | no: no peer of a PD B queue pair ever sends |
//! | `recv`        | A  | `LOCAL`                | yes: the receive requests scatter into it |
//! | `sink`        | A  | `LOCAL`                | yes: the RC requester's READ and atomic results land in it |
//! | `foreign_recv`| B  | `LOCAL`                | no: the foreign QP's receive requests |
//!
//! The RC queue pair also has a READ, a FETCH_ADD, a COMPARE_SWAP, a SEND, a WRITE and an
//! inline SEND with immediate outstanding, so that responses from the peer have something to
//! answer; the UC queue pair has a SEND and a WRITE with immediate.
//!
//! # Input
//!
//! A sequence of records, each a 6-byte header and a datagram (the UDP payload, BTH through
//! ICRC):
//!
//! ```text
//! byte 0  sel   bit 0     source: 0 = the peer 10.0.0.1, 1 = a stranger 10.0.0.9
//!               bits 1-2  destination QP: 0 = as in the bytes, 1 = RC, 2 = UC, 3 = foreign;
//!                         with 1-3 an RC/UC opcode also moves to that QP's transport
//!               bit 3     re-seal the ICRC (last, after every other rewrite)
//!               bit 4     rewrite the RETH/AtomicETH va and key (if the bytes parse)
//!               bits 5-6  which key: 0 = remote's rkey, 1 = read_only's rkey,
//!                         2 = other_pd's rkey, 3 = local's lkey
//!               bit 7     rewrite the PSN: a request gets the destination QP's expected
//!                         PSN − back, a response the requester's next PSN − 1 − back
//! byte 1  arg   with bit 4 of sel: the rewritten va is the region's va + 16 × arg;
//!               without it, bit 0 set holds receives: none is posted during the record
//!               (none re-posted for the receives it completes, none when bit 7 of time
//!               reconnects a QP), so that SENDs can find an empty receive queue (RNR)
//! byte 2  back  see bit 7
//! byte 3  time  bits 0-4 e: after the datagram, advance the clock 2^(e−1) µs (0: not);
//!               bit 5: then jump to poll_timeout(); bit 6: re-post the send batch of a QP
//!               with none outstanding; bit 7: reset and reconnect a QP in ERR
//! bytes 4-5     length, big-endian; then that many bytes (fewer if the input ends)
//! ```
//!
//! The UDP source port is always [`SRC_PORT`]; the destination address 10.0.0.2.
//!
//! # Checks
//!
//! After every record: `handle_datagram` and everything after it ran without a panic; the
//! bytes of `read_only`, `local`, `other_pd` and `foreign_recv` are as they were filled; a
//! datagram from the stranger, one whose ICRC does not verify, one that does not parse, or one
//! for any queue pair but the RC and UC ones of PD A changed no byte of any region; every
//! packet `poll_transmit` emits parses, has a good ICRC, goes to 10.0.0.1:4791 (never to the
//! stranger or to the foreign QP's peer) with the destination QP and transport of one of the
//! two live QPs; every successful receive completion's length fits its receive request; and
//! every completion names a work request that was posted.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ferroce_proto::engine::{roce_peer, Engine, EngineConfig, MAX_PACKET};
use ferroce_proto::memory::{Access, HeapMemory, PdId, RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    Completion, CqId, Mtu, Payload, QpAttr, QpCaps, QpInit, QpState, QpType, RecvWr, RemoteAddr,
    SendOp, SendWr, Sge, WcOpcode, WcStatus,
};
use ferroce_proto::wire::{
    icrc, Bth, HeaderSet, IpHeader, NakCode, Opcode, Packet, Qpn, RnrTimer, Syndrome, Transport,
    UdpHeader, ROCE_PORT,
};
use ferroce_proto::Psn;

/// The engine's address.
pub const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
/// The peer of the RC and UC queue pairs.
pub const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
/// An address no queue pair is connected to.
pub const STRANGER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 9);
/// The peer of the foreign (PD B) queue pair; nothing is ever sent from it.
pub const FOREIGN_PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 5);
/// The UDP source port of every datagram fed to the engine.
pub const SRC_PORT: u16 = 0xc0de;
/// The length of a record's header.
pub const RECORD_HEADER: usize = 6;
/// At most this many records of an input are run.
pub const MAX_RECORDS: usize = 128;

/// The peer's QPN for the RC queue pair (the destination QP of what it sends).
pub const PEER_RC_QPN: u32 = 0x30;
/// The peer's QPN for the UC queue pair.
pub const PEER_UC_QPN: u32 = 0x31;
/// The foreign peer's QPN.
pub const FOREIGN_PEER_QPN: u32 = 0x32;
/// The PSN the responders expect first.
pub const RQ_PSN: u32 = 0x100;
/// The first PSN of the RC requester.
pub const RC_SQ_PSN: u32 = 0x200;
/// The first PSN of the UC requester.
pub const UC_SQ_PSN: u32 = 0x300;

/// The most packets taken from `poll_transmit` in one go.
const MAX_DRAIN: usize = 96;
/// The most timer rounds run after the last record.
const FINAL_ROUNDS: usize = 5;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The regions, see the module documentation.
#[derive(Clone, Copy, Debug)]
pub struct Regions {
    pub remote: RegionInfo,
    pub read_only: RegionInfo,
    pub local: RegionInfo,
    pub other_pd: RegionInfo,
    pub recv: RegionInfo,
    pub sink: RegionInfo,
    pub foreign_recv: RegionInfo,
}

impl Regions {
    fn all(&self) -> [(&'static str, RegionInfo); 7] {
        [
            ("remote", self.remote),
            ("read_only", self.read_only),
            ("local", self.local),
            ("other_pd", self.other_pd),
            ("recv", self.recv),
            ("sink", self.sink),
            ("foreign_recv", self.foreign_recv),
        ]
    }

    /// The regions no datagram may change, with their initial bytes.
    fn protected(&self) -> Vec<(&'static str, RegionInfo, &'static [u8])> {
        // Indices into `all()`, which is in the order of `fills()`.
        [1, 2, 3, 6]
            .iter()
            .map(|&i| {
                let (name, info) = self.all()[i];
                (name, info, &fills()[i][..])
            })
            .collect()
    }
}

/// What one run made the engine do, as seen from outside it: the packets it sent and the
/// completions it delivered. The `engine-paths` example sums these (with the engine's own
/// [`Counters`](ferroce_proto::counters::Counters)) over a corpus, to show which protocol
/// paths the corpus reaches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Request packets sent again: a (destination QP, PSN) the run had already sent.
    pub resent_packets: u64,
    /// READ response packets sent.
    pub read_responses: u64,
    /// Duplicate READ requests answered again: a READ request from the peer that the engine
    /// counted as a duplicate (`duplicate_request`) and answered with READ responses.
    pub read_replays: u64,
    /// ACKs sent.
    pub acks_sent: u64,
    /// RNR NAKs sent.
    pub rnr_naks_sent: u64,
    /// PSN sequence error NAKs sent.
    pub seq_naks_sent: u64,
    /// Invalid request NAKs sent.
    pub invalid_naks_sent: u64,
    /// Remote access error NAKs sent.
    pub access_naks_sent: u64,
    /// Remote operational error NAKs sent.
    pub op_naks_sent: u64,
    /// Completions with `Success`.
    pub ok_completions: u64,
    /// Completions with `WrFlushErr` (the queue pair went to ERR first).
    pub flush_completions: u64,
    /// Completions with any other error status.
    pub error_completions: u64,
    /// Queue pairs reset and reconnected after they went to ERR.
    pub reconnects: u64,
}

impl Tally {
    /// Every count with its name, in a fixed order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("resent_packets", self.resent_packets),
            ("read_responses", self.read_responses),
            ("read_replays", self.read_replays),
            ("acks_sent", self.acks_sent),
            ("rnr_naks_sent", self.rnr_naks_sent),
            ("seq_naks_sent", self.seq_naks_sent),
            ("invalid_naks_sent", self.invalid_naks_sent),
            ("access_naks_sent", self.access_naks_sent),
            ("op_naks_sent", self.op_naks_sent),
            ("ok_completions", self.ok_completions),
            ("flush_completions", self.flush_completions),
            ("error_completions", self.error_completions),
            ("reconnects", self.reconnects),
        ]
        .into_iter()
    }
}

/// A posted work request, remembered until it completes.
#[derive(Clone, Copy, Debug)]
struct Posted {
    qpn: Qpn,
    recv: bool,
    /// For receives, the bytes the request can hold.
    len: u64,
}

/// One fuzz run: the engine, its memory and what has been posted.
pub struct Harness {
    pub engine: Engine,
    pub mem: HeapMemory,
    pub regions: Regions,
    pub cq: CqId,
    pub rc: Qpn,
    pub uc: Qpn,
    pub foreign: Qpn,
    pub now: Instant,
    initial: Vec<(&'static str, RegionInfo, &'static [u8])>,
    posted: HashMap<u64, Posted>,
    next_wr_id: u64,
    buf: Vec<u8>,
    /// The (destination QP, PSN) of every request packet sent since the QP last connected.
    sent_requests: HashSet<(u32, u32)>,
    /// Whether the record being run holds receives (see the input format).
    hold_recvs: bool,
    /// What the run did; see [`Tally`].
    pub tally: Tally,
}

/// The lengths of the regions, in the order they are registered.
const REGION_LENS: [usize; 7] = [16384, 16384, 16384, 16384, 8192, 8192, 4096];

/// The initial bytes of each region: a pattern of its own, computed once.
fn fills() -> &'static [Vec<u8>; 7] {
    static FILLS: OnceLock<[Vec<u8>; 7]> = OnceLock::new();
    FILLS.get_or_init(|| {
        std::array::from_fn(|r| {
            let seed = (r as u8 + 1).wrapping_mul(0x35);
            (0..REGION_LENS[r])
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ ((i >> 8) as u8))
                .collect()
        })
    })
}

fn psn(v: u32) -> Psn {
    Psn::new(v).expect("a 24-bit PSN")
}

fn sge(region: &RegionInfo, at: u64, len: u32) -> Sge {
    Sge {
        addr: region.va + at,
        len,
        lkey: region.lkey,
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    /// The engine, regions and queue pairs described in the module documentation.
    #[must_use]
    pub fn new() -> Self {
        let mut engine = Engine::new(EngineConfig {
            local_ip: IpAddr::V4(LOCAL),
            seed: 1,
        });
        let pd_a = engine.alloc_pd();
        let pd_b = engine.alloc_pd();
        let cq = engine.create_cq(1024);
        let mut mem = HeapMemory::new();
        let mut va = 0x10_0000u64;
        let mut n = 0;
        let mut region = |engine: &mut Engine, pd: PdId, access: Access| {
            let bytes = &fills()[n];
            n += 1;
            let info = engine
                .register(pd, va, bytes.len() as u64, access, WriteOrder::InOrder)
                .expect("register");
            va += bytes.len() as u64;
            mem.insert(info.id, bytes.clone());
            info
        };
        // Back to back, in the order of REGION_LENS.
        let regions = Regions {
            remote: region(&mut engine, pd_a, Access::REMOTE),
            read_only: region(&mut engine, pd_a, Access::LOCAL.with(Access::REMOTE_READ)),
            local: region(&mut engine, pd_a, Access::LOCAL),
            other_pd: region(&mut engine, pd_b, Access::REMOTE),
            recv: region(&mut engine, pd_a, Access::LOCAL),
            sink: region(&mut engine, pd_a, Access::LOCAL),
            foreign_recv: region(&mut engine, pd_b, Access::LOCAL),
        };
        let caps = QpCaps {
            sq_depth: 32,
            rq_depth: 32,
            max_inline: 64,
        };
        let create = |engine: &mut Engine, qp_type, pd| {
            engine
                .create_qp(QpInit {
                    qp_type,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    caps,
                    sq_sig_all: false,
                    srq: None,
                })
                .expect("no SRQ to miss")
        };
        let rc = create(&mut engine, QpType::Rc, pd_a);
        let uc = create(&mut engine, QpType::Uc, pd_a);
        let foreign = create(&mut engine, QpType::Rc, pd_b);
        let initial = regions.protected();
        let mut h = Self {
            engine,
            mem,
            regions,
            cq,
            rc,
            uc,
            foreign,
            now: epoch(),
            initial,
            posted: HashMap::new(),
            next_wr_id: 1,
            buf: vec![0; MAX_PACKET],
            sent_requests: HashSet::new(),
            hold_recvs: false,
            tally: Tally::default(),
        };
        for qp in [rc, uc, foreign] {
            h.connect(qp);
            h.post_recvs(qp);
        }
        h.post_sends(rc);
        h.post_sends(uc);
        h.drain();
        h.check_protected();
        h
    }

    /// RESET → INIT → RTR → RTS.
    fn connect(&mut self, qp: Qpn) {
        let (peer, dest, mtu) = if qp == self.rc {
            (PEER, PEER_RC_QPN, Mtu::M1024)
        } else if qp == self.uc {
            (PEER, PEER_UC_QPN, Mtu::M4096)
        } else {
            (FOREIGN_PEER, FOREIGN_PEER_QPN, Mtu::M1024)
        };
        let sq_psn = if qp == self.uc { UC_SQ_PSN } else { RC_SQ_PSN };
        let e = &mut self.engine;
        e.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Init),
                access: Some(Access::REMOTE),
                ..QpAttr::default()
            },
        )
        .expect("INIT");
        e.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(mtu),
                dest_qpn: Some(Qpn::new(dest).expect("qpn")),
                peer: Some(roce_peer(IpAddr::V4(peer))),
                rq_psn: Some(psn(RQ_PSN)),
                max_dest_rd_atomic: Some(4),
                min_rnr_timer: Some(RnrTimer::new(1).expect("rnr timer")),
                ..QpAttr::default()
            },
        )
        .expect("RTR");
        e.modify_qp(
            qp,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(psn(sq_psn)),
                // 4.096 µs × 2^8 ≈ 1 ms.
                timeout: Some(8),
                retry_cnt: Some(3),
                rnr_retry: Some(3),
                max_rd_atomic: Some(4),
                ..QpAttr::default()
            },
        )
        .expect("RTS");
    }

    fn wr_id(&mut self, qpn: Qpn, recv: bool, len: u64) -> u64 {
        let id = self.next_wr_id;
        self.next_wr_id += 1;
        self.posted.insert(id, Posted { qpn, recv, len });
        id
    }

    fn post_recv(&mut self, qp: Qpn, sges: Vec<Sge>) {
        let len = sges.iter().map(|s| u64::from(s.len)).sum();
        let wr_id = self.wr_id(qp, true, len);
        if self.engine.post_recv(qp, RecvWr { wr_id, sges }).is_err() {
            self.posted.remove(&wr_id);
        }
    }

    /// Receive requests: whole `recv`, two pieces, a small one, and (RC) one whose second
    /// entry names a region of the other protection domain (a local protection error).
    fn post_recvs(&mut self, qp: Qpn) {
        if qp == self.foreign {
            let r = self.regions.foreign_recv;
            self.post_recv(qp, vec![sge(&r, 0, 4096)]);
            return;
        }
        let r = self.regions.recv;
        self.post_recv(qp, vec![sge(&r, 0, 8192)]);
        self.post_recv(qp, vec![sge(&r, 0, 100), sge(&r, 4096, 4096)]);
        self.post_recv(qp, vec![sge(&r, 64, 64)]);
        self.post_recv(qp, vec![sge(&r, 0, 8192)]);
        if qp == self.rc {
            let other = self.regions.other_pd;
            self.post_recv(qp, vec![sge(&r, 0, 16), sge(&other, 0, 4096)]);
        }
    }

    fn post_send(&mut self, qp: Qpn, op: SendOp, local: Payload) {
        let wr_id = self.wr_id(qp, false, 0);
        if self
            .engine
            .post_send(qp, SendWr::new(wr_id, op, local))
            .is_err()
        {
            self.posted.remove(&wr_id);
        }
    }

    /// The send batch: on RC a 4096-byte READ, FETCH_ADD, COMPARE_SWAP, SEND, 1500-byte
    /// WRITE and inline SEND with immediate (10 PSNs); on UC a SEND and a WRITE with
    /// immediate.
    fn post_sends(&mut self, qp: Qpn) {
        let remote = RemoteAddr {
            va: 0x7700_0000,
            rkey: 0x1234_5678,
        };
        let (local, sink) = (self.regions.local, self.regions.sink);
        if qp == self.rc {
            self.post_send(
                qp,
                SendOp::Read(remote),
                Payload::Sges(vec![sge(&sink, 0, 4096)]),
            );
            self.post_send(
                qp,
                SendOp::FetchAdd { remote, add: 3 },
                Payload::Sges(vec![sge(&sink, 4096, 8)]),
            );
            self.post_send(
                qp,
                SendOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 7,
                },
                Payload::Sges(vec![sge(&sink, 4104, 8)]),
            );
            self.post_send(qp, SendOp::Send, Payload::Sges(vec![sge(&local, 0, 64)]));
            self.post_send(
                qp,
                SendOp::Write(remote),
                Payload::Sges(vec![sge(&local, 100, 1000), sge(&local, 4096, 500)]),
            );
            self.post_send(qp, SendOp::SendWithImm(9), Payload::Inline(vec![0x5a; 32]));
        } else if qp == self.uc {
            self.post_send(qp, SendOp::Send, Payload::Sges(vec![sge(&local, 0, 2000)]));
            self.post_send(
                qp,
                SendOp::WriteWithImm(remote, 11),
                Payload::Sges(vec![sge(&local, 8, 100)]),
            );
        }
    }

    fn sends_outstanding(&self, qp: Qpn) -> bool {
        self.posted.values().any(|p| p.qpn == qp && !p.recv)
    }

    /// Checks one packet the engine sent.
    fn check_transmit(&mut self, len: usize, dst: SocketAddr, src_port: u16) {
        assert!(len <= MAX_PACKET, "a {len}-byte packet");
        assert_eq!(
            dst,
            roce_peer(IpAddr::V4(PEER)),
            "a packet to {dst}, not to the RC/UC peer"
        );
        let bytes = &self.buf[..len];
        let p = match Packet::new_checked(bytes) {
            Ok(p) => p,
            Err(e) => panic!("the engine sent a packet that does not parse: {e}: {bytes:02x?}"),
        };
        let ip = IpHeader::between(IpAddr::V4(LOCAL), dst.ip()).expect("IPv4");
        let udp = UdpHeader {
            src_port,
            dst_port: dst.port(),
        };
        assert!(icrc::verify(&ip, &udp, bytes), "the engine sent a bad ICRC");
        let want = match p.dest_qp().value() {
            PEER_RC_QPN => Transport::Rc,
            PEER_UC_QPN => Transport::Uc,
            other => panic!("a packet for QP {other:#x}, which no local QP is connected to"),
        };
        assert_eq!(
            p.opcode().transport(),
            want,
            "{} sent to QP {:#x}",
            p.opcode().name(),
            p.dest_qp().value()
        );
        count_transmit(&mut self.tally, &mut self.sent_requests, &p);
    }

    /// Takes up to [`MAX_DRAIN`] packets from `poll_transmit`, checking each.
    fn drain(&mut self) {
        for _ in 0..MAX_DRAIN {
            let mut buf = std::mem::take(&mut self.buf);
            let t = self.engine.poll_transmit(self.now, &self.mem, &mut buf);
            self.buf = buf;
            let Some(t) = t else { break };
            self.check_transmit(t.len, t.dst, t.src_port);
        }
    }

    fn check_protected(&self) {
        for (name, info, bytes) in &self.initial {
            let now = self.mem.bytes(info.id).expect("bytes");
            if now != *bytes {
                let at = now
                    .iter()
                    .zip(bytes.iter())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                panic!(
                    "region {name} (rkey {:#x}, {:?}) changed at offset {at}: {:#04x} was {:#04x}",
                    info.rkey, info.access, now[at], bytes[at]
                );
            }
        }
    }

    fn check_completion(&mut self, c: &Completion) {
        match c.status {
            WcStatus::Success => self.tally.ok_completions += 1,
            WcStatus::WrFlushErr => self.tally.flush_completions += 1,
            _ => self.tally.error_completions += 1,
        }
        let Some(posted) = self.posted.remove(&c.wr_id) else {
            panic!("a completion for a work request never posted (or completed twice): {c:?}");
        };
        assert_eq!(posted.qpn, c.qpn, "completion on the wrong QP: {c:?}");
        let recv = matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
        assert_eq!(
            posted.recv, recv,
            "a completion of the wrong kind of request: {c:?}"
        );
        if recv && c.status == WcStatus::Success && c.opcode == WcOpcode::Recv {
            assert!(
                u64::from(c.byte_len) <= posted.len,
                "received {} bytes into a {}-byte receive request",
                c.byte_len,
                posted.len
            );
        }
    }

    /// Polls the CQ, re-posting a receive for each one completed on a QP still running.
    fn poll_completions(&mut self) {
        let mut repost = Vec::new();
        while let Some(c) = self.engine.poll_completion(self.cq) {
            self.check_completion(&c);
            if !self.hold_recvs && matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                repost.push(c.qpn);
            }
        }
        for qp in repost {
            if matches!(self.engine.qp_state(qp), Some(QpState::Rtr | QpState::Rts)) {
                let r = self.regions.recv;
                if qp == self.foreign {
                    let f = self.regions.foreign_recv;
                    self.post_recv(qp, vec![sge(&f, 0, 4096)]);
                } else {
                    self.post_recv(qp, vec![sge(&r, 0, 8192)]);
                }
            }
        }
    }

    /// Rewrites `bytes` as the selector says.
    fn rewrite(&self, sel: u8, arg: u8, back: u8, src: Ipv4Addr, bytes: &mut [u8]) {
        let target = match (sel >> 1) & 3 {
            0 => None,
            1 => Some(self.rc),
            2 => Some(self.uc),
            _ => Some(self.foreign),
        };
        if bytes.len() >= Bth::LEN {
            if let Some(qp) = target {
                let want = if qp == self.uc {
                    Transport::Uc
                } else {
                    Transport::Rc
                };
                if let Some(op) = Opcode::new(bytes[0]) {
                    if matches!(op.transport(), Transport::Rc | Transport::Uc)
                        && op.transport() != want
                    {
                        if let Some(moved) = Opcode::from_parts(want, op.operation()) {
                            bytes[0] = moved.value();
                        }
                    }
                }
                bytes[5..8].copy_from_slice(&qp.value().to_be_bytes()[1..]);
            }
            if sel & 0x80 != 0 {
                let dest =
                    Qpn::from_low_bits(u32::from_be_bytes([0, bytes[5], bytes[6], bytes[7]]));
                if let Some((req, expected)) = self.engine.qp_psns(dest) {
                    let response = Opcode::new(bytes[0]).is_some_and(Opcode::is_response);
                    let psn = if response {
                        req.sub(1 + u32::from(back))
                    } else {
                        expected.sub(u32::from(back))
                    };
                    bytes[9..12].copy_from_slice(&psn.value().to_be_bytes()[1..]);
                }
            }
        }
        if sel & 0x10 != 0 {
            let opcode = Packet::new_checked(&bytes[..]).ok().map(|p| p.opcode());
            if let Some(opcode) = opcode {
                let r = &self.regions;
                let (region, key) = match (sel >> 5) & 3 {
                    0 => (r.remote, r.remote.rkey),
                    1 => (r.read_only, r.read_only.rkey),
                    2 => (r.other_pd, r.other_pd.rkey),
                    _ => (r.local, r.local.lkey),
                };
                let va = region.va + 16 * u64::from(arg);
                for h in [HeaderSet::RETH, HeaderSet::ATOMIC] {
                    if let Some(off) = opcode.header_offset(h) {
                        let at = Bth::LEN + off;
                        bytes[at..at + 8].copy_from_slice(&va.to_be_bytes());
                        bytes[at + 8..at + 12].copy_from_slice(&key.to_be_bytes());
                    }
                }
            }
        }
        if sel & 0x08 != 0 {
            let ip = IpHeader::between(IpAddr::V4(src), IpAddr::V4(LOCAL)).expect("IPv4");
            let udp = UdpHeader {
                src_port: SRC_PORT,
                dst_port: ROCE_PORT,
            };
            let _ = icrc::seal(&ip, &udp, bytes);
        }
    }

    /// Runs one record.
    pub fn step(&mut self, sel: u8, arg: u8, back: u8, time: u8, datagram: &[u8]) {
        let src = if sel & 1 != 0 { STRANGER } else { PEER };
        self.hold_recvs = sel & 0x10 == 0 && arg & 1 != 0;
        let mut bytes = datagram.to_vec();
        self.rewrite(sel, arg, back, src, &mut bytes);

        // Which datagrams may change memory at all: from the peer, ICRC good, parsed, for the
        // RC or UC QP of PD A.
        let ip = IpHeader::between(IpAddr::V4(src), IpAddr::V4(LOCAL)).expect("IPv4");
        let udp = UdpHeader {
            src_port: SRC_PORT,
            dst_port: ROCE_PORT,
        };
        let may_write = src == PEER
            && icrc::verify(&ip, &udp, &bytes)
            && Packet::new_checked(&bytes[..])
                .is_ok_and(|p| p.dest_qp() == self.rc || p.dest_qp() == self.uc);
        let read_request = Packet::new_checked(&bytes[..])
            .is_ok_and(|p| p.opcode() == Opcode::RC_RDMA_READ_REQUEST);
        let duplicates = self.engine.counters().duplicate_request;
        let before: Option<Vec<Vec<u8>>> = (!may_write).then(|| {
            self.regions
                .all()
                .iter()
                .map(|(_, info)| self.mem.bytes(info.id).expect("bytes").to_vec())
                .collect()
        });

        self.engine.handle_datagram(
            self.now,
            SocketAddr::new(IpAddr::V4(src), SRC_PORT),
            IpAddr::V4(LOCAL),
            &bytes,
            &mut self.mem,
        );

        if let Some(before) = before {
            for ((name, info), old) in self.regions.all().iter().zip(&before) {
                assert!(
                    self.mem.bytes(info.id).expect("bytes") == &old[..],
                    "region {name} changed by a datagram that may change nothing \
                     (from {src}, sel {sel:#04x}): {bytes:02x?}"
                );
            }
        }
        self.check_protected();
        let read_responses = self.tally.read_responses;
        self.drain();
        if read_request
            && self.engine.counters().duplicate_request > duplicates
            && self.tally.read_responses > read_responses
        {
            self.tally.read_replays += 1;
        }

        let e = time & 0x1f;
        if e != 0 {
            self.now += Duration::from_micros(1 << (e - 1));
        }
        if time & 0x20 != 0 {
            if let Some(at) = self.engine.poll_timeout() {
                self.now = self.now.max(at);
            }
        }
        self.engine.handle_timeout(self.now);
        self.drain();
        self.poll_completions();

        for qp in [self.rc, self.uc] {
            let state = self.engine.qp_state(qp);
            if time & 0x80 != 0 && state == Some(QpState::Err) {
                self.engine
                    .modify_qp(
                        qp,
                        &QpAttr {
                            state: Some(QpState::Reset),
                            ..QpAttr::default()
                        },
                    )
                    .expect("RESET");
                // RESET drops the queues without completions.
                self.posted.retain(|_, p| p.qpn != qp);
                self.tally.reconnects += 1;
                let dest = if qp == self.rc {
                    PEER_RC_QPN
                } else {
                    PEER_UC_QPN
                };
                self.sent_requests.retain(|&(d, _)| d != dest);
                self.connect(qp);
                if !self.hold_recvs {
                    self.post_recvs(qp);
                }
                self.post_sends(qp);
            } else if time & 0x40 != 0 && state == Some(QpState::Rts) && !self.sends_outstanding(qp)
            {
                self.post_sends(qp);
            }
        }
        self.drain();
        self.check_protected();
        self.hold_recvs = false;
    }

    /// Lets the timers run out after the last record.
    pub fn finish(&mut self) {
        for _ in 0..FINAL_ROUNDS {
            let Some(at) = self.engine.poll_timeout() else {
                break;
            };
            self.now = self.now.max(at);
            self.engine.handle_timeout(self.now);
            self.drain();
            self.poll_completions();
        }
        self.check_protected();
    }
}

/// Adds a packet the engine sent to the tally; `sent_requests` holds the (destination QP, PSN)
/// of the request packets sent before.
fn count_transmit(t: &mut Tally, sent_requests: &mut HashSet<(u32, u32)>, p: &Packet<&[u8]>) {
    let op = p.opcode();
    if matches!(
        op,
        Opcode::RC_RDMA_READ_RESPONSE_FIRST
            | Opcode::RC_RDMA_READ_RESPONSE_MIDDLE
            | Opcode::RC_RDMA_READ_RESPONSE_LAST
            | Opcode::RC_RDMA_READ_RESPONSE_ONLY
    ) {
        t.read_responses += 1;
    }
    if op == Opcode::RC_ACKNOWLEDGE {
        match p.aeth().map(|a| a.syndrome) {
            Some(Syndrome::Ack { .. }) => t.acks_sent += 1,
            Some(Syndrome::RnrNak(_)) => t.rnr_naks_sent += 1,
            Some(Syndrome::Nak(NakCode::PsnSequenceError)) => t.seq_naks_sent += 1,
            Some(Syndrome::Nak(NakCode::InvalidRequest)) => t.invalid_naks_sent += 1,
            Some(Syndrome::Nak(NakCode::RemoteAccessError)) => t.access_naks_sent += 1,
            Some(Syndrome::Nak(NakCode::RemoteOperationalError)) => t.op_naks_sent += 1,
            _ => {}
        }
    }
    if op.is_request() {
        let key = (p.dest_qp().value(), p.psn().value());
        if !sent_requests.insert(key) {
            t.resent_packets += 1;
        }
    }
}

/// Runs a whole fuzz input (see the module documentation for the format).
pub fn run(data: &[u8]) {
    run_harness(data);
}

/// Runs a whole fuzz input and returns the harness after it, for its engine's counters and
/// its [`Tally`].
pub fn run_harness(data: &[u8]) -> Harness {
    let mut h = Harness::new();
    let mut rest = data;
    for _ in 0..MAX_RECORDS {
        if rest.len() < RECORD_HEADER {
            break;
        }
        let (head, tail) = rest.split_at(RECORD_HEADER);
        let len = usize::from(u16::from_be_bytes([head[4], head[5]])).min(tail.len());
        let (datagram, tail) = tail.split_at(len);
        h.step(head[0], head[1], head[2], head[3], datagram);
        rest = tail;
    }
    h.finish();
    h
}
