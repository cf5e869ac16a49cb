//! A simulated fabric for the engine: two or more engines, virtual time, and links with seeded
//! loss, duplication, reordering, corruption, delay, a bandwidth and an MTU, plus a filter for
//! scripted drops. Each test reads as a script: build, post, `run`, assert.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::cell::Cell;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ferroce_proto::engine::{roce_peer, Engine, EngineConfig, MAX_PACKET};
use ferroce_proto::memory::{Access, HeapMemory, PdId, RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    Completion, CqId, Mtu, QpAttr, QpCaps, QpInit, QpState, QpType, RecvWr, Sge, SrqId,
};
use ferroce_proto::wire::{Operation, Packet, Qpn, RnrTimer};
use ferroce_proto::Psn;

/// SplitMix64: a seeded generator, so every fault schedule is reproducible.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Faults and shape of every link.
#[derive(Clone, Copy, Debug)]
pub struct LinkConfig {
    pub loss: f64,
    pub dup: f64,
    pub reorder: f64,
    pub corrupt: f64,
    pub delay: Duration,
    /// Extra delay for a reordered packet.
    pub reorder_delay: Duration,
    /// Link rate in bits per second; 0 for infinite.
    pub bits_per_sec: u64,
    /// The largest UDP payload the link carries; larger packets are dropped.
    pub mtu: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            loss: 0.0,
            dup: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: Duration::from_micros(5),
            reorder_delay: Duration::from_micros(20),
            bits_per_sec: 0,
            mtu: 9000,
        }
    }
}

pub struct Node {
    pub engine: Engine,
    pub mem: HeapMemory,
    pub ip: IpAddr,
    pub pd: PdId,
    pub cq: CqId,
    next_va: u64,
    /// When the node's outgoing link is free again (bandwidth model).
    link_free: Instant,
    /// Until when the node reads nothing (a process descheduled on a busy host): packets
    /// that reach it wait, unread, as in its socket's queue.
    pub asleep_until: Option<Instant>,
    /// Packets waiting for it to wake.
    unread: usize,
}

#[derive(PartialEq, Eq)]
struct InFlight {
    at: Instant,
    seq: u64,
    from: usize,
    to: usize,
    src: SocketAddr,
    bytes: Vec<u8>,
    /// Reached its node while it slept: counted in the node's `unread`.
    waited: bool,
}

impl Ord for InFlight {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Earliest first in a max-heap.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Decides per packet whether to drop it: `(from node, packet)`.
pub type Filter = Box<dyn FnMut(usize, &Packet<&[u8]>) -> bool>;

/// A filter that refuses what rxe's responder refuses of node 0's READ requests asked again
/// (a PSN inside an earlier request's responses), by rxe's test of a duplicate READ: it
/// may not start before the start of that READ's record (`va_org`), nor ask for more than
/// the original's length, nor end past `va_org` plus that length. Each duplicate served
/// moves `va_org` to its start ("except length"), so a part asked for again that starts
/// before the part last served is refused. With the count of requests refused; `mtu` is the
/// path's, which sets how many responses a request asks for. It sees requests before the
/// link's loss, so one lost on the link counts as served: stricter than rxe.
pub fn rxe_read_replay(mtu: u32) -> (Filter, Rc<Cell<u32>>) {
    let refused = Rc::new(Cell::new(0));
    let count = refused.clone();
    // Each READ request sent for the first time: its first response PSN, how many, its
    // length, and the address of the part last served.
    let mut served: Vec<(Psn, u32, u32, u64)> = Vec::new();
    let filter = Box::new(move |from: usize, p: &Packet<&[u8]>| {
        if from != 0 || p.opcode().operation() != Operation::RdmaReadRequest {
            return false;
        }
        let Some(reth) = p.reth() else { return false };
        let psn = p.psn();
        match served
            .iter_mut()
            .find(|(first, n, _, _)| psn.in_window(*first, *n))
        {
            Some((_, _, length, va_org)) => {
                let (va, len, length) = (reth.va, u64::from(reth.len), u64::from(*length));
                if va < *va_org || len > length || va + len > *va_org + length {
                    count.set(count.get() + 1);
                    return true;
                }
                *va_org = va;
                false
            }
            None => {
                let n = reth.len.div_ceil(mtu).max(1);
                served.push((psn, n, reth.len, reth.va));
                false
            }
        }
    });
    (filter, refused)
}

/// How long a sender pauses before a packet leaves, holding everything queued behind it on
/// its link: `(from node, packet)`. An emulated rxe's responder stops so for milliseconds in
/// the middle of a READ's answer while its guest is descheduled.
pub type Hold = Box<dyn FnMut(usize, &Packet<&[u8]>) -> Duration>;

/// A node that handles what reaches it at a fixed pace, one queue pair's packets at a time:
/// each turn takes what waited for one destination QP when the turn began, and what comes
/// for it meanwhile waits for its next turn, after the other QPs'. An emulated rxe works so
/// (in the 6.1 kernel each QP's responder task drains its queue in one softirq pass, while
/// nothing new is received on that CPU) at about 10 MB/s: a QP whose peer is busy with
/// another hears nothing for as long as that one's queue takes.
pub struct Turns {
    pub node: usize,
    pub per_packet: Duration,
    /// What waits, by destination QPN.
    waiting: BTreeMap<u32, VecDeque<InFlight>>,
    /// The QP being served, and how many of its packets this turn has left to take.
    serving: Option<(u32, usize)>,
    /// When the node may take its next packet.
    free_at: Instant,
}

impl Turns {
    pub fn new(node: usize, per_packet: Duration, now: Instant) -> Self {
        Self {
            node,
            per_packet,
            waiting: BTreeMap::new(),
            serving: None,
            free_at: now,
        }
    }

    fn enqueue(&mut self, now: Instant, p: InFlight) {
        if self.next().is_none() {
            self.free_at = self.free_at.max(now);
        }
        let qpn = Packet::new_checked(&p.bytes[..]).map_or(0, |pk| pk.dest_qp().value());
        self.waiting.entry(qpn).or_default().push_back(p);
    }

    /// When the next packet will be taken, if any waits.
    fn next(&self) -> Option<Instant> {
        (!self.waiting.values().all(VecDeque::is_empty)).then_some(self.free_at)
    }

    /// The next packet due by `now`, from the QP in turn.
    fn take(&mut self, now: Instant) -> Option<InFlight> {
        if self.next().is_none_or(|at| at > now) {
            return None;
        }
        let qpn = match self.serving {
            Some((qpn, left)) if left > 0 => qpn,
            current => {
                let after = current.map_or(0, |(qpn, _)| qpn);
                let busy = |(&q, w): (&u32, &VecDeque<InFlight>)| (!w.is_empty()).then_some(q);
                let next = self
                    .waiting
                    .range(after.saturating_add(1)..)
                    .find_map(busy)
                    .or_else(|| self.waiting.iter().find_map(busy))?;
                self.serving = Some((next, self.waiting[&next].len()));
                next
            }
        };
        if let Some((_, left)) = &mut self.serving {
            *left -= 1;
        }
        self.free_at += self.per_packet;
        self.waiting.get_mut(&qpn)?.pop_front()
    }
}

pub struct Fabric {
    pub nodes: Vec<Node>,
    pub now: Instant,
    pub start: Instant,
    pub link: LinkConfig,
    pub rng: Rng,
    pub filter: Option<Filter>,
    pub hold: Option<Hold>,
    /// Whether each node's timers learn which peers have not read what reached them (a
    /// driver's look at a peer's socket on the same host).
    pub show_unread: bool,
    /// Whether each node reads its clock once its sends have left, as the soft NIC's driver
    /// does, and tells its engine ([`Engine::transmitted`]): a hold then delays the timers a
    /// request armed along with the request, as for a sender descheduled before its send.
    pub clock_after_send: bool,
    /// A node that serves its queue pairs in turns, at a pace.
    pub turns: Option<Turns>,
    in_flight: BinaryHeap<InFlight>,
    seq: u64,
    pub delivered: u64,
    /// When the last packet reached its node.
    last_delivery: Instant,
    pub dropped: u64,
}

impl Fabric {
    /// `n` nodes on 10.0.0.1, 10.0.0.2, …
    pub fn new(n: usize, seed: u64) -> Self {
        let start = Instant::now();
        let nodes = (0..n)
            .map(|i| {
                let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, i as u8 + 1));
                let mut engine = Engine::new(EngineConfig {
                    local_ip: ip,
                    seed: seed ^ ((i as u64 + 1) * 0x1234_5678),
                });
                let pd = engine.alloc_pd();
                let cq = engine.create_cq(4096);
                Node {
                    engine,
                    mem: HeapMemory::new(),
                    ip,
                    pd,
                    cq,
                    next_va: 0x10_0000,
                    link_free: start,
                    asleep_until: None,
                    unread: 0,
                }
            })
            .collect();
        Self {
            nodes,
            now: start,
            start,
            link: LinkConfig::default(),
            rng: Rng::new(seed),
            filter: None,
            hold: None,
            show_unread: false,
            clock_after_send: false,
            turns: None,
            in_flight: BinaryHeap::new(),
            seq: 0,
            delivered: 0,
            last_delivery: start,
            dropped: 0,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Virtual time from the start to the last packet's arrival: how long the traffic took,
    /// without the timers that ran after it (one left from a disarmed timer does nothing).
    pub fn busy_for(&self) -> Duration {
        self.last_delivery - self.start
    }

    /// Registers `len` bytes filled with `fill` on node `i`.
    pub fn region(&mut self, i: usize, len: usize, access: Access, fill: u8) -> RegionInfo {
        let node = &mut self.nodes[i];
        let va = node.next_va;
        node.next_va += (len as u64).next_multiple_of(0x1000) + 0x1000;
        let info = node
            .engine
            .register(node.pd, va, len as u64, access, WriteOrder::InOrder)
            .unwrap();
        node.mem.insert(info.id, vec![fill; len]);
        info
    }

    pub fn bytes(&self, i: usize, region: &RegionInfo) -> &[u8] {
        self.nodes[i].mem.bytes(region.id).unwrap()
    }

    pub fn bytes_mut(&mut self, i: usize, region: &RegionInfo) -> &mut [u8] {
        self.nodes[i].mem.bytes_mut(region.id).unwrap()
    }

    /// A connected pair of queue pairs between nodes `a` and `b`, in RTS.
    pub fn connect(
        &mut self,
        a: usize,
        b: usize,
        qp_type: QpType,
        opts: &ConnectOptions,
    ) -> (Qpn, Qpn) {
        self.connect_srq(a, b, qp_type, opts, None)
    }

    /// As [`Fabric::connect`], with `b`'s queue pair taking its receives from `srq_b`.
    pub fn connect_srq(
        &mut self,
        a: usize,
        b: usize,
        qp_type: QpType,
        opts: &ConnectOptions,
        srq_b: Option<SrqId>,
    ) -> (Qpn, Qpn) {
        let qa = self.create_qp(a, qp_type, opts, None);
        let qb = self.create_qp(b, qp_type, opts, srq_b);
        self.bring_up(a, qa, b, qb, opts.psn_a, opts.psn_b, opts);
        self.bring_up(b, qb, a, qa, opts.psn_b, opts.psn_a, opts);
        (qa, qb)
    }

    fn create_qp(
        &mut self,
        i: usize,
        qp_type: QpType,
        opts: &ConnectOptions,
        srq: Option<SrqId>,
    ) -> Qpn {
        let node = &mut self.nodes[i];
        node.engine
            .create_qp(QpInit {
                qp_type,
                pd: node.pd,
                send_cq: node.cq,
                recv_cq: node.cq,
                caps: opts.caps,
                sq_sig_all: false,
                srq,
            })
            .unwrap()
    }

    /// A UD queue pair on node `i` with `qkey`, in RTS.
    pub fn ud_qp(&mut self, i: usize, qkey: u32) -> Qpn {
        let qp = self.create_qp(i, QpType::Ud, &ConnectOptions::default(), None);
        self.ud_up(i, qp, qkey);
        qp
    }

    /// Brings a UD queue pair (QP 1 included) to RTS with `qkey`.
    pub fn ud_up(&mut self, i: usize, qp: Qpn, qkey: u32) {
        let engine = &mut self.nodes[i].engine;
        let attrs = [
            QpAttr {
                state: Some(QpState::Init),
                access: Some(Access::NONE),
                qkey: Some(qkey),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(Psn::new(0).unwrap()),
                ..QpAttr::default()
            },
        ];
        for attr in attrs {
            engine.modify_qp(qp, &attr).unwrap();
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bring_up(
        &mut self,
        i: usize,
        qp: Qpn,
        peer: usize,
        peer_qp: Qpn,
        sq_psn: Psn,
        rq_psn: Psn,
        opts: &ConnectOptions,
    ) {
        let peer_ip = self.nodes[peer].ip;
        let engine = &mut self.nodes[i].engine;
        engine
            .modify_qp(
                qp,
                &QpAttr {
                    state: Some(QpState::Init),
                    access: Some(opts.access),
                    ..QpAttr::default()
                },
            )
            .unwrap();
        engine
            .modify_qp(
                qp,
                &QpAttr {
                    state: Some(QpState::Rtr),
                    path_mtu: Some(opts.mtu),
                    dest_qpn: Some(peer_qp),
                    peer: Some(roce_peer(peer_ip)),
                    rq_psn: Some(rq_psn),
                    max_dest_rd_atomic: Some(opts.max_rd_atomic),
                    min_rnr_timer: Some(opts.min_rnr_timer),
                    ..QpAttr::default()
                },
            )
            .unwrap();
        engine
            .modify_qp(
                qp,
                &QpAttr {
                    state: Some(QpState::Rts),
                    sq_psn: Some(sq_psn),
                    timeout: Some(opts.timeout),
                    retry_cnt: Some(opts.retry_cnt),
                    rnr_retry: Some(opts.rnr_retry),
                    max_rd_atomic: Some(opts.max_rd_atomic),
                    ..QpAttr::default()
                },
            )
            .unwrap();
    }

    pub fn post_recv(
        &mut self,
        i: usize,
        qp: Qpn,
        wr_id: u64,
        region: &RegionInfo,
        at: u64,
        len: u32,
    ) {
        let sge = Sge {
            addr: region.va + at,
            len,
            lkey: region.lkey,
        };
        self.nodes[i]
            .engine
            .post_recv(
                qp,
                RecvWr {
                    wr_id,
                    sges: vec![sge],
                },
            )
            .unwrap();
    }

    pub fn completions(&mut self, i: usize) -> Vec<Completion> {
        let node = &mut self.nodes[i];
        std::iter::from_fn(|| node.engine.poll_completion(node.cq)).collect()
    }

    fn node_of(&self, addr: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.ip == addr)
    }

    /// Sends everything every node has ready, through the link's faults.
    fn transmit(&mut self) -> bool {
        let mut any = false;
        let mut buf = vec![0u8; MAX_PACKET];
        for from in 0..self.nodes.len() {
            // A node that never stops sending at one instant is a livelock: fail, not hang.
            let mut sent = 0u32;
            let mut left = self.now;
            loop {
                let node = &mut self.nodes[from];
                let Some(t) = node.engine.poll_transmit(self.now, &node.mem, &mut buf) else {
                    break;
                };
                any = true;
                sent += 1;
                assert!(
                    sent < 1_000_000,
                    "node {from} sent a million packets at one instant"
                );
                let src = SocketAddr::new(node.ip, t.src_port);
                let bytes = buf[..t.len].to_vec();
                // Parsed once, for the hold and the filter.
                let packet =
                    Packet::new_checked(&bytes[..]).expect("the engine emits valid packets");
                let hold = self
                    .hold
                    .as_mut()
                    .map_or(Duration::ZERO, |hold| hold(from, &packet));
                // Behind what the link still carries and any pause, plus serialisation.
                let node = &mut self.nodes[from];
                let mut depart = node.link_free.max(self.now) + hold;
                // Ethernet, IPv4, UDP, FCS, preamble and gap around the packet.
                let wire_bits = ((t.len + 14 + 20 + 8 + 4 + 20) * 8) as u64;
                if let Some(ns) = (wire_bits * 1_000_000_000).checked_div(self.link.bits_per_sec) {
                    depart += Duration::from_nanos(ns);
                }
                node.link_free = depart;
                left = left.max(depart);
                let Some(to) = self.node_of(t.dst.ip()) else {
                    self.dropped += 1;
                    continue;
                };
                if let Some(filter) = &mut self.filter {
                    if filter(from, &packet) {
                        self.dropped += 1;
                        continue;
                    }
                }
                if bytes.len() > self.link.mtu || self.rng.chance(self.link.loss) {
                    self.dropped += 1;
                    continue;
                }
                let copies = if self.rng.chance(self.link.dup) { 2 } else { 1 };
                for _ in 0..copies {
                    let mut bytes = bytes.clone();
                    if self.rng.chance(self.link.corrupt) {
                        let at = self.rng.below(bytes.len() as u64) as usize;
                        bytes[at] ^= 1 << self.rng.below(8);
                    }
                    let mut at = depart + self.link.delay;
                    if self.rng.chance(self.link.reorder) {
                        at += self.link.reorder_delay;
                    }
                    self.seq += 1;
                    self.in_flight.push(InFlight {
                        at,
                        seq: self.seq,
                        from,
                        to,
                        src,
                        bytes,
                        waited: false,
                    });
                }
            }
            let engine = &mut self.nodes[from].engine;
            if self.clock_after_send && engine.armed_on_send() {
                engine.transmitted(left);
            }
        }
        any
    }

    /// Runs until nothing is in flight, nothing is ready to send and no timer is armed, or
    /// until `limit` of virtual time has passed. Returns whether it went idle.
    pub fn run_for(&mut self, limit: Duration) -> bool {
        let deadline = self.now + limit;
        loop {
            self.transmit();
            let next_packet = self
                .in_flight
                .peek()
                .map(|p| p.at)
                .into_iter()
                .chain(self.turns.as_ref().and_then(Turns::next))
                .min();
            let next_timer = self
                .nodes
                .iter()
                .filter_map(|n| n.engine.poll_timeout())
                .min();
            let next = match (next_packet, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) | (None, Some(a)) => a,
                (None, None) => return true,
            };
            if next > deadline {
                self.now = deadline;
                return false;
            }
            self.now = self.now.max(next);
            while self.in_flight.peek().is_some_and(|p| p.at <= self.now) {
                let mut p = self.in_flight.pop().unwrap();
                let node = &mut self.nodes[p.to];
                if let Some(wake) = node.asleep_until.filter(|&t| t > self.now) {
                    if !p.waited {
                        p.waited = true;
                        node.unread += 1;
                    }
                    p.at = wake;
                    self.in_flight.push(p);
                    continue;
                }
                if p.waited {
                    node.unread -= 1;
                }
                if let Some(turns) = self.turns.as_mut().filter(|t| t.node == p.to) {
                    turns.enqueue(self.now, p);
                    continue;
                }
                self.deliver(p);
            }
            while let Some(p) = self.turns.as_mut().and_then(|t| t.take(self.now)) {
                self.deliver(p);
            }
            // The nodes holding unread packets (none looked up, nothing allocated, unless asked).
            let unread: Vec<IpAddr> = if self.show_unread {
                self.nodes
                    .iter()
                    .filter(|n| n.unread > 0)
                    .map(|n| n.ip)
                    .collect()
            } else {
                Vec::new()
            };
            for node in &mut self.nodes {
                node.engine
                    .handle_timeout_with(self.now, |peer| unread.contains(&peer.ip()));
            }
        }
    }

    fn deliver(&mut self, p: InFlight) {
        let node = &mut self.nodes[p.to];
        let dst = node.ip;
        node.engine
            .handle_datagram(self.now, p.src, dst, &p.bytes, &mut node.mem);
        self.delivered += 1;
        self.last_delivery = self.now;
    }

    /// Runs until idle, failing the test if that takes more than 60 virtual seconds.
    pub fn run(&mut self) {
        assert!(
            self.run_for(Duration::from_secs(60)),
            "the fabric did not go idle"
        );
    }
}

/// How [`Fabric::connect`] sets up a pair.
#[derive(Clone, Copy, Debug)]
pub struct ConnectOptions {
    pub mtu: Mtu,
    pub access: Access,
    pub psn_a: Psn,
    pub psn_b: Psn,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: RnrTimer,
    pub max_rd_atomic: u8,
    pub caps: QpCaps,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            mtu: Mtu::M1024,
            access: Access::REMOTE,
            psn_a: Psn::new(0x00_1000).unwrap(),
            psn_b: Psn::new(0x77_0000).unwrap(),
            // 4.096 µs × 2^8 ≈ 1 ms.
            timeout: 8,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: RnrTimer::new(1).unwrap(),
            max_rd_atomic: 4,
            caps: QpCaps {
                sq_depth: 1024,
                rq_depth: 1024,
                max_inline: 256,
            },
        }
    }
}
