//! The datagram layer: the UDP sockets a RoCEv2 endpoint sends and receives on, with batched
//! sends (UDP GSO where the path segments in software), batched receives (UDP GRO), and the taps
//! (fault injection, capture) as layers over whole batches. The soft NIC and the device side of
//! the frames face both stand on it; neither touches a socket but through it.
//!
//! A [`Port`] is the sockets: the one bound to the endpoint's address (port 4791 for a NIC),
//! which receives everything, and, when GSO is on, a send-only socket on another source port
//! of the same address with checksums on (the kernel refuses GSO without them, gso.md §2).
//! While GSO is on every packet leaves from that socket, runs and lone packets alike, so that
//! a peer sees one flow and its kernel's GRO cannot reorder it; otherwise packets leave the
//! endpoint's socket with zero UDP checksums, as rxe's do. Peers answer to 4791 whatever port
//! a request came from. A [`Link`] is what one sender owns around a port: the batch being built, the
//! receive buffers, and the taps.
//!
//! GSO sends change two things the ICRC covers: the UDP source port, and the IPv4 ID, which
//! the kernel numbers 0, 1, … across the segments of one send. Packets are sealed by their
//! maker for the plain socket (its port, ID 0) and re-sealed here for what they will carry
//! ([`ferroce_proto::wire::icrc::Reseal`]).
//!
//! Every send names its destination. An unconnected socket has the kernel look the route up
//! for each; an IPv6 GSO socket is therefore connected to the first peer it sends to, and the
//! kernel keeps that route for the sends that name it (0.8 µs of a write-lat half round trip
//! over IPv6 here: BENCHMARKS.md, the data path's fourteenth step). An IPv4 one never is:
//! connected, the kernel would number its IPv4 IDs from a random start that user space cannot
//! read, and the ICRC covers them.

pub(crate) mod gso;
pub(crate) mod table;
pub(crate) mod tap;

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::engine::MAX_PACKET;
use ferroce_proto::wire::icrc::Reseal;
use ferroce_proto::wire::{Opcode, Operation};

use crate::steps::{self, Step};
use crate::sys;

/// The most packets a [`TxBatch`] holds before it must be sent.
pub(crate) const TX_BATCH: usize = 128;

/// How a [`Port`] is set up.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PortOptions {
    /// Send by UDP GSO where the path allows it.
    pub(crate) gso: bool,
    /// Receive with UDP GRO.
    pub(crate) gro: bool,
    /// Socket buffers to ask for, each way.
    pub(crate) buffers: usize,
}

/// Whether a NIC or sender sends by UDP GSO, and if not, why not.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GsoStatus {
    /// Runs of equal-sized packets to one peer leave as one GSO send.
    Active,
    /// Turned off by configuration (`NicConfig::gso`, `--no-gso`).
    Disabled,
    /// The address belongs to a physical network device that segments UDP in hardware (or
    /// does not say), and then writes IPv4 IDs of its own choosing, which the ICRC covers.
    /// GSO is used by default only where the kernel segments in software: loopback, veth,
    /// bridges, tap, and physical devices without UDP segmentation offload.
    Hardware(String),
    /// The start-up self-test failed: the kernel refused GSO or did not deliver it.
    Unsupported(String),
    /// A GSO send failed with EIO or EINVAL after start-up; every send since is plain.
    FellBack(String),
}

impl std::fmt::Display for GsoStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Active => f.write_str("on"),
            Self::Disabled => f.write_str("off (configured)"),
            Self::Hardware(dev) => write!(
                f,
                "off ({dev} segments UDP in hardware, or does not say, and would choose its own IPv4 IDs)"
            ),
            Self::Unsupported(why) => write!(f, "off (self-test failed: {why})"),
            Self::FellBack(why) => write!(f, "off (fell back to plain sends: {why})"),
        }
    }
}

/// Counters of the datagram layer (the engine counts the protocol).
#[derive(Debug, Default)]
pub(crate) struct UdpCounters {
    pub(crate) send_errors: AtomicU64,
    pub(crate) recv_errors: AtomicU64,
    pub(crate) pcap_errors: AtomicU64,
    /// Datagrams too large for any RoCE packet, dropped.
    pub(crate) oversized: AtomicU64,
    /// Packets handed to the kernel as plain datagrams.
    pub(crate) plain_sends: AtomicU64,
    /// GSO sends of two or more segments, and the segments they carried.
    pub(crate) gso_sends: AtomicU64,
    pub(crate) gso_segments: AtomicU64,
    /// GSO sends refused with EIO or EINVAL, after which the port sends plain datagrams.
    pub(crate) gso_fallbacks: AtomicU64,
    /// Received buffers of two or more coalesced segments, and the segments they carried.
    pub(crate) gro_buffers: AtomicU64,
    pub(crate) gro_segments: AtomicU64,
}

impl UdpCounters {
    /// The counters by name, for `statistics_line`.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        [
            ("udp_send_errors", &self.send_errors),
            ("udp_recv_errors", &self.recv_errors),
            ("udp_oversized", &self.oversized),
            ("pcap_errors", &self.pcap_errors),
            ("udp_plain_sends", &self.plain_sends),
            ("udp_gso_sends", &self.gso_sends),
            ("udp_gso_segments", &self.gso_segments),
            ("udp_gso_fallbacks", &self.gso_fallbacks),
            ("udp_gro_buffers", &self.gro_buffers),
            ("udp_gro_segments", &self.gro_segments),
        ]
        .into_iter()
        .map(|(name, c)| (name, c.load(Ordering::Relaxed)))
    }

    /// Adds `n` to `counter`.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// The size of [`Port::rehearse`]'s packets: a READ response of 64 bytes.
const REHEARSAL_PACKET: usize = 84;

/// The sockets of one endpoint; see the module's documentation.
#[derive(Debug)]
pub(crate) struct Port {
    socket: UdpSocket,
    local: SocketAddr,
    /// The send-only GSO socket and its address, when GSO passed its checks at start-up.
    gso: Option<(UdpSocket, SocketAddr)>,
    /// Cleared for good by the first EIO or EINVAL of a GSO send.
    gso_on: AtomicBool,
    /// Whether the GSO socket's route is settled (`Port::keep_route`): from the start on IPv4,
    /// which never connects; on IPv6 once it has connected to its first peer.
    route_kept: AtomicBool,
    status: Mutex<GsoStatus>,
    /// The first send the kernel refused since [`Port::take_send_error`] last looked.
    send_error: Mutex<Option<io::Error>>,
    pub(crate) counters: UdpCounters,
}

impl Port {
    /// Binds the endpoint's socket to `addr` and, with `options.gso`, a GSO socket beside it,
    /// which must pass a self-test over the local address before it is used.
    ///
    /// # Errors
    ///
    /// What the operating system said when binding or setting up the endpoint's socket
    /// failed. A GSO socket that cannot be had only turns GSO off ([`Port::gso_status`]).
    pub(crate) fn open(addr: SocketAddr, options: PortOptions) -> io::Result<Self> {
        Self::adopt(UdpSocket::bind(addr)?, options)
    }

    /// The same on a socket the caller bound (Hololink's `linux_receiver` binds its own and
    /// hands it over); the port takes the options above onto it.
    pub(crate) fn adopt(socket: UdpSocket, options: PortOptions) -> io::Result<Self> {
        let local = socket.local_addr()?;
        match local {
            SocketAddr::V4(_) => {
                sys::set_dont_fragment(&socket)?;
                sys::send_zero_checksum4(&socket)?;
            }
            SocketAddr::V6(_) => {
                sys::accept_zero_checksum6(&socket)?;
                sys::send_zero_checksum6(&socket)?;
            }
        }
        sys::grow_buffers(&socket, options.buffers)?;
        if options.gro {
            // A kernel without UDP_GRO (before 5.0) splits trains itself: slower, not wrong.
            let _ = sys::enable_gro(&socket);
        }
        let (gso, status) = if options.gso {
            match open_gso(local.ip(), options.buffers) {
                Ok(pair) => (Some(pair), GsoStatus::Active),
                Err(status) => (None, status),
            }
        } else {
            (None, GsoStatus::Disabled)
        };
        Ok(Self {
            socket,
            local,
            gso_on: AtomicBool::new(gso.is_some()),
            // Nothing to keep for IPv4 (see the module's documentation).
            route_kept: AtomicBool::new(local.is_ipv4()),
            gso,
            status: Mutex::new(status),
            send_error: Mutex::new(None),
            counters: UdpCounters::default(),
        })
    }

    /// Sends throw-away packets through [`Port::send`] from a port of its own, opened beside
    /// this one on the same address with the same choice of GSO and with GRO, to that port
    /// itself, takes them back through [`Link::receive_batch`] and [`Link::handle_buffer`],
    /// and closes it: one packet alone and a train of three, so that the first live packet of
    /// either kind, sent or received, finds the path run once (the soft NIC's `rehearsal`).
    /// Received, the train is one coalesced buffer where the kernel allows, as a GSO peer's
    /// are. This port's sockets and counters are untouched. Best effort; returns how many
    /// packets it took back.
    pub(crate) fn rehearse(&self) -> usize {
        let options = PortOptions {
            gso: self.gso.is_some(),
            gro: true,
            buffers: 1 << 16,
        };
        let Ok(scratch) = Self::open(SocketAddr::new(self.local.ip(), 0), options) else {
            return 0;
        };
        let to = scratch.local;
        let mut batch = TxBatch::default();
        for train in [1, 3] {
            for _ in 0..train {
                batch.slot()[..REHEARSAL_PACKET].fill(0);
                batch.push_written(to, REHEARSAL_PACKET, false);
            }
            scratch.send(&mut batch, &[], None);
            batch.clear();
        }
        // Sent to a local address, they are queued before the sends return.
        let mut link = Link::new(None, None);
        let n = link.receive_batch(&scratch, sys::RECV_BATCH);
        (0..n)
            .map(|i| link.handle_buffer(&scratch, i, &mut |_, _, _| {}))
            .sum()
    }

    /// The endpoint's socket: it receives everything, and sends plain datagrams.
    pub(crate) fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// The endpoint's address.
    pub(crate) fn local(&self) -> SocketAddr {
        self.local
    }

    /// Whether GSO sends are in use, and if not, why.
    pub(crate) fn gso_status(&self) -> GsoStatus {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first send the kernel refused since the last call, if any.
    pub(crate) fn take_send_error(&self) -> Option<io::Error> {
        self.send_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Connects the IPv6 GSO socket to `dst`, the first peer it sends to, once: the kernel
    /// then keeps the route to it rather than looking it up for each send, and sends that
    /// name another peer go as before. An ICMP error for the connected peer now comes back on
    /// the socket's next send, which the send functions retry once ([`send_one`]). Best effort:
    /// a socket that cannot connect sends as an unconnected one.
    fn keep_route(&self, socket: &UdpSocket, dst: SocketAddr) {
        // A plain load on every send after the first, not a read-modify-write.
        if !self.route_kept.load(Ordering::Relaxed)
            && !self.route_kept.swap(true, Ordering::Relaxed)
        {
            let _ = socket.connect(dst);
        }
    }

    fn refused(&self, e: io::Error) {
        UdpCounters::add(&self.counters.send_errors, 1);
        self.send_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(e);
    }

    /// Sends every packet of `batch` in order, whose bodies lie in `ext`, recording each as it
    /// leaves in `pcap`. A packet the kernel refuses is counted and skipped, as a lost packet
    /// would be; the protocol above recovers it. Packets sent by GSO are left sealed as they
    /// left (another port, another ID): the batch is for emptying once sent.
    pub(crate) fn send(
        &self,
        batch: &mut TxBatch,
        ext: &[u8],
        mut pcap: Option<&mut tap::PcapWriter>,
    ) {
        let mut at = 0;
        while at < batch.packets.len() {
            let end = (at + TX_BATCH).min(batch.packets.len());
            let gso = match &self.gso {
                Some((socket, addr)) if self.gso_on.load(Ordering::Relaxed) => {
                    Some((socket, *addr))
                }
                _ => None,
            };
            let mut plain_from = at;
            if let Some((socket, addr)) = gso {
                // Everything leaves from the GSO socket while GSO is on, a lone ACK too: one
                // flow to each peer, so that a receiving kernel's GRO, which holds back one
                // flow's packets to coalesce them while another's pass, cannot hand a
                // message's train to the peer before the FIRST that left alone earlier.
                batch.groups.clear();
                batch.trail_acks(at..end);
                let packets = &batch.packets[at..end];
                gso::plan(
                    packets.len(),
                    |i| (packets[i].dst, packets[i].len()),
                    &mut batch.groups,
                );
                for g in &mut batch.groups {
                    g.first += at;
                }
                plain_from = self.send_gso(batch, ext, socket, addr, pcap.as_deref_mut());
            }
            if plain_from < end {
                self.send_plain(batch, plain_from..end, ext, pcap.as_deref_mut());
            }
            at = end;
        }
    }

    /// Sends the planned groups of `batch` from the GSO socket. Returns where plain sends must
    /// take over: the end of the groups, or the first packet of a send refused for lack of GSO
    /// (then GSO is off from here on, and those packets are sealed for plain sends again).
    fn send_gso(
        &self,
        batch: &mut TxBatch,
        ext: &[u8],
        socket: &UdpSocket,
        addr: SocketAddr,
        mut pcap: Option<&mut tap::PcapWriter>,
    ) -> usize {
        let port_xor = self.local.port() ^ addr.port();
        let end = batch.groups.last().map_or(0, |g| g.first + g.count);
        // The ICRCs stay sealed for the GSO socket afterwards: the batch is emptied once sent
        // (fault injection took its copies before).
        let groups = std::mem::take(&mut batch.groups);
        for g in &groups {
            batch.reseal_group(g, port_xor);
        }
        if let Some(g) = groups.first() {
            self.keep_route(socket, batch.packets[g.first].dst);
        }
        // One packet held whole in the batch (a latency-bound exchange): a plain sendto
        // costs less than setting up a batch.
        if let [g] = groups[..] {
            let p = batch.packets[g.first];
            if let (1, Some(bytes)) = (g.count, batch.contiguous(&p)) {
                match send_one(socket, bytes, p.dst) {
                    Err(e) if is_gso_refusal(&e) => {
                        batch.reseal_group(&g, port_xor);
                        self.fall_back(&e);
                        batch.groups = groups;
                        return g.first;
                    }
                    Err(e) => self.refused(e),
                    Ok(_) => self.record_groups(batch, &groups, ext, addr, pcap),
                }
                batch.groups = groups;
                return end;
            }
        }
        // A few small groups (a reply and the ACK that trails it): small arrays, as for
        // plain sends. Clearing the arrays for 64 groups cost more than the rest of such a
        // send (3,272 against 1,514 instructions, BENCHMARKS.md, the eleventh step).
        let few = groups.len() <= 2 && groups.iter().all(|g| g.count <= 2);
        let mut done = 0;
        while done < groups.len() {
            let chunk = &groups[done..groups.len().min(done + sys::MAX_MESSAGES)];
            let result = if few {
                send_groups::<2, 12>(socket, batch, chunk, ext)
            } else {
                send_groups::<{ sys::MAX_MESSAGES }, { 3 * TX_BATCH }>(socket, batch, chunk, ext)
            };
            match result {
                Ok(sent) => {
                    self.record_groups(batch, &chunk[..sent], ext, addr, pcap.as_deref_mut());
                    done += sent;
                }
                Err((sent, e)) if is_gso_refusal(&e) => {
                    // This and every later group go plain, sealed as their maker sealed them.
                    let first = chunk[sent].first;
                    self.record_groups(batch, &chunk[..sent], ext, addr, pcap.as_deref_mut());
                    for g in &groups[done + sent..] {
                        batch.reseal_group(g, port_xor);
                    }
                    self.fall_back(&e);
                    batch.groups = groups;
                    return first;
                }
                Err((sent, e)) => {
                    // Refused for another reason (no route, a full buffer of a peer): that
                    // send is lost, as a packet on a wire can be.
                    self.record_groups(batch, &chunk[..sent], ext, addr, pcap.as_deref_mut());
                    self.refused(e);
                    done += sent + 1;
                }
            }
        }
        batch.groups = groups;
        end
    }

    /// Counts the groups that left, and records each of their segments as it was on the wire.
    fn record_groups(
        &self,
        batch: &TxBatch,
        groups: &[gso::Group],
        ext: &[u8],
        from: SocketAddr,
        mut pcap: Option<&mut tap::PcapWriter>,
    ) {
        for g in groups {
            if g.count > 1 {
                UdpCounters::add(&self.counters.gso_sends, 1);
                UdpCounters::add(&self.counters.gso_segments, g.count as u64);
            } else {
                UdpCounters::add(&self.counters.plain_sends, 1);
            }
            if let Some(pcap) = pcap.as_deref_mut() {
                for (i, p) in batch.packets[g.first..g.first + g.count].iter().enumerate() {
                    let wire = tap::OnWire {
                        ipv4_id: i as u16,
                        udp_checksum: true,
                    };
                    if pcap
                        .record(from, p.dst, &batch.parts(p, ext), Some(wire))
                        .is_err()
                    {
                        UdpCounters::add(&self.counters.pcap_errors, 1);
                    }
                }
            }
        }
    }

    fn fall_back(&self, e: &io::Error) {
        self.gso_on.store(false, Ordering::Relaxed);
        UdpCounters::add(&self.counters.gso_fallbacks, 1);
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) =
            GsoStatus::FellBack(format!("a GSO send failed: {e}"));
    }

    /// Sends packets `range` of `batch` as plain datagrams from the endpoint's socket.
    fn send_plain(
        &self,
        batch: &TxBatch,
        range: std::ops::Range<usize>,
        ext: &[u8],
        pcap: Option<&mut tap::PcapWriter>,
    ) {
        let packets = &batch.packets[range.clone()];
        if let Some(pcap) = pcap {
            for p in packets {
                let wire = tap::OnWire {
                    ipv4_id: 0,
                    udp_checksum: false,
                };
                if pcap
                    .record(self.local, p.dst, &batch.parts(p, ext), Some(wire))
                    .is_err()
                {
                    UdpCounters::add(&self.counters.pcap_errors, 1);
                }
            }
        }
        UdpCounters::add(&self.counters.plain_sends, packets.len() as u64);
        // One packet held whole in the batch (a latency-bound exchange): a plain sendto
        // costs less than setting up a batch.
        if let [p] = packets {
            if let Some(bytes) = batch.contiguous(p) {
                if let Err(e) = send_one(&self.socket, bytes, p.dst) {
                    self.refused(e);
                }
                return;
            }
        }
        if packets.len() <= 4 {
            self.send_plain_chunks::<4, 12>(batch, range, ext);
        } else {
            self.send_plain_chunks::<{ sys::MAX_MESSAGES }, { 3 * sys::MAX_MESSAGES }>(
                batch, range, ext,
            );
        }
    }

    /// Sends packets `range` of `batch` as plain datagrams, `N` to a `sendmmsg` call with
    /// room for `IOV` (3·N) slices (the arrays are set up for every call, so a few packets get
    /// small ones).
    fn send_plain_chunks<const N: usize, const IOV: usize>(
        &self,
        batch: &TxBatch,
        range: std::ops::Range<usize>,
        ext: &[u8],
    ) {
        let single = |i: usize| gso::Group {
            first: i,
            count: 1,
            segment: batch.packets[i].len(),
        };
        let mut at = range.start;
        while at < range.end {
            let n = (range.end - at).min(N);
            let mut groups = [single(at); N];
            for (k, g) in groups[..n].iter_mut().enumerate() {
                *g = single(at + k);
            }
            match send_groups::<N, IOV>(&self.socket, batch, &groups[..n], ext) {
                Ok(sent) => at += sent,
                Err((sent, e)) => {
                    self.refused(e);
                    at += sent + 1;
                }
            }
        }
    }
}

/// Sends each of `groups` (runs of `batch`'s packets, bodies in `ext`) as one message from
/// `socket`, a GSO send where a group has more than one packet: at most `N` groups, gathered
/// into at most `IOV` slices (up to three a packet). Returns as [`send_all`] does.
fn send_groups<const N: usize, const IOV: usize>(
    socket: &UdpSocket,
    batch: &TxBatch,
    groups: &[gso::Group],
    ext: &[u8],
) -> Result<usize, (usize, io::Error)> {
    let groups = &groups[..groups.len().min(N)];
    let Some(first) = groups.first() else {
        return Ok(0);
    };
    let mut iov = [io::IoSlice::new(&[]); IOV];
    let mut spans = [(0usize, 0usize); N];
    let mut n_iov = 0;
    for (k, g) in groups.iter().enumerate() {
        let start = n_iov;
        for p in &batch.packets[g.first..g.first + g.count] {
            n_iov += batch.gather(p, ext, &mut iov[n_iov..]);
        }
        spans[k] = (start, n_iov);
    }
    let mut msgs = [sys::OutMessage {
        dst: batch.packets[first.first].dst,
        iov: &[],
        segment: None,
    }; N];
    for (k, g) in groups.iter().enumerate() {
        msgs[k] = sys::OutMessage {
            dst: batch.packets[g.first].dst,
            iov: &iov[spans[k].0..spans[k].1],
            segment: (g.count > 1).then_some(g.segment as u16),
        };
    }
    send_all(socket, &msgs[..groups.len()])
}

/// Sends one datagram, waiting while the socket's queue is full (as [`send_all`] does).
/// ECONNREFUSED is retried once: on a connected socket ([`Port::keep_route`]) it reports an
/// ICMP error that an earlier send to the connected peer drew, whatever this send's
/// destination, and the kernel clears it as it reports it.
fn send_one(socket: &UdpSocket, bytes: &[u8], dst: SocketAddr) -> io::Result<()> {
    let mut retried = false;
    loop {
        steps::mark(Step::Sending);
        let sent = socket.send_to(bytes, dst);
        steps::mark(Step::Sent);
        match sent {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && !retried => retried = true,
            Err(e) => return Err(e),
        }
    }
}

/// Sends `msgs` until all are taken or one is refused, waiting while the socket's queue is
/// full. Returns how many were taken; on a refusal, how many were taken before it and why.
/// ECONNREFUSED is retried once for each message, as [`send_one`] retries it.
fn send_all(socket: &UdpSocket, msgs: &[sys::OutMessage<'_>]) -> Result<usize, (usize, io::Error)> {
    let (mut done, mut retried_at) = (0, None);
    while done < msgs.len() {
        steps::mark(Step::Sending);
        let sent = sys::send_messages(socket, &msgs[done..]);
        steps::mark(Step::Sent);
        match sent {
            Ok(0) => return Err((done, io::Error::from(io::ErrorKind::WriteZero))),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && retried_at != Some(done) => {
                retried_at = Some(done);
            }
            Err(e) => return Err((done, e)),
        }
    }
    Ok(done)
}

/// EIO (6.1: the device cannot checksum) or EINVAL (checksums off, too many segments, an old
/// kernel): the kernel will not take GSO sends on this path. quinn latches off on the same.
fn is_gso_refusal(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL))
}

/// Opens the GSO socket beside the endpoint's and checks that GSO works on the path, or says
/// why it is not used.
fn open_gso(ip: IpAddr, buffers: usize) -> Result<(UdpSocket, SocketAddr), GsoStatus> {
    let Some(device) = sys::interface_of(ip) else {
        // The unspecified address, say: no one path, so no one answer about segmentation.
        return Err(GsoStatus::Unsupported(format!("no interface holds {ip}")));
    };
    if segments_in_hardware(&device) {
        return Err(GsoStatus::Hardware(device));
    }
    let unsupported = |what: &str, e: io::Error| GsoStatus::Unsupported(format!("{what}: {e}"));
    let socket = UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(|e| unsupported("cannot bind a GSO socket", e))?;
    if ip.is_ipv4() {
        sys::set_dont_fragment(&socket).map_err(|e| unsupported("cannot set DF", e))?;
    }
    sys::grow_buffers(&socket, buffers).map_err(|e| unsupported("cannot size buffers", e))?;
    self_test(&socket, ip)?;
    let addr = socket
        .local_addr()
        .map_err(|e| unsupported("no local address", e))?;
    Ok((socket, addr))
}

/// msquic's start-up check: a two-segment GSO send to a throw-away socket on the same address
/// must arrive whole, as one coalesced buffer or as two datagrams.
fn self_test(gso: &UdpSocket, ip: IpAddr) -> Result<(), GsoStatus> {
    const SEGMENT: usize = 64;
    let fail = |why: String| GsoStatus::Unsupported(why);
    let probe = UdpSocket::bind(SocketAddr::new(ip, 0))
        .map_err(|e| fail(format!("cannot bind the probe: {e}")))?;
    let _ = sys::enable_gro(&probe);
    let to = probe
        .local_addr()
        .map_err(|e| fail(format!("no probe address: {e}")))?;
    let mut data = [0u8; 2 * SEGMENT];
    for (i, b) in data.iter_mut().enumerate() {
        *b = i as u8;
    }
    let iov = [io::IoSlice::new(&data)];
    let msg = sys::OutMessage {
        dst: to,
        iov: &iov,
        segment: Some(SEGMENT as u16),
    };
    sys::send_messages(gso, &[msg])
        .map_err(|e| fail(format!("the kernel refused a GSO send: {e}")))?;
    // Either one coalesced buffer (UDP_GRO) or two datagrams; a room twice the send's size
    // shows a buffer that is too long, too.
    probe
        .set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| fail(format!("cannot time the probe: {e}")))?;
    let mut got = Vec::with_capacity(data.len());
    let mut room = [0u8; 4 * SEGMENT];
    while got.len() < data.len() {
        match probe.recv(&mut room) {
            Ok(n) => got.extend_from_slice(&room[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // Nothing more within the timeout (WouldBlock or TimedOut), or the probe failed.
            Err(_) => break,
        }
    }
    if got == data {
        Ok(())
    } else {
        Err(fail(format!(
            "a {}-byte GSO send to {to} arrived as {} bytes",
            data.len(),
            got.len()
        )))
    }
}

/// Whether GSO sends through network device `name` may not be segmented in software: it is a
/// physical device (sysfs gives it a `device` link; loopback, veth, bridges, tun and tap have
/// none) whose `tx-udp-segmentation` is active or cannot be read. A physical device without
/// UDP segmentation offload (a virtio NIC on Linux 6.1, many NICs) has the kernel segment, with
/// the IDs of gso.md §1.
fn segments_in_hardware(name: &str) -> bool {
    std::path::Path::new(&format!("/sys/class/net/{name}/device")).exists()
        && sys::udp_segmentation_offload(name) != Some(false)
}

/// One packet of a [`TxBatch`]: a head and a tail in the batch's own bytes, and between them a
/// body that lies outside it (a frame sender's data, a payload lent from a region: sent without
/// a copy into the batch). Its ICRC is the last four bytes of the tail.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TxPacket {
    pub(crate) dst: SocketAddr,
    head: (u32, u32),
    body: (u32, u32),
    tail: (u32, u32),
    /// Its maker allows it to wait for the next packet ([`TxBatch::only_deferrable`]).
    deferrable: bool,
}

impl TxPacket {
    /// Its length on the wire (a UDP payload).
    pub(crate) fn len(&self) -> usize {
        (self.head.1 + self.body.1 + self.tail.1) as usize
    }

    /// Where its ICRC lies in the batch's bytes: the last four of its tail.
    fn icrc_range(&self) -> std::ops::Range<usize> {
        let end = (self.tail.0 + self.tail.1) as usize;
        end - 4..end
    }
}

/// Packets waiting to leave, in order.
#[derive(Debug)]
pub(crate) struct TxBatch {
    bytes: Vec<u8>,
    used: usize,
    packets: Vec<TxPacket>,
    groups: Vec<gso::Group>,
    reseals: ResealCache,
}

/// The [`Reseal`]s of recent packet lengths: computing one costs about 2 µs, applying it
/// about 30 ns (`cargo bench -p ferroce-proto --bench wire -- reseal_4k`), and a stream of
/// packets has few lengths.
#[derive(Debug)]
struct ResealCache([Option<(bool, usize, Reseal)>; 64]);

impl ResealCache {
    fn get(&mut self, ipv4: bool, len: usize) -> &Reseal {
        let slot = &mut self.0[len % 64];
        if !matches!(slot, Some((v4, l, _)) if *v4 == ipv4 && *l == len) {
            *slot = None;
        }
        &slot
            .get_or_insert_with(|| (ipv4, len, Reseal::new(ipv4, len)))
            .2
    }
}

impl Default for TxBatch {
    fn default() -> Self {
        Self {
            bytes: vec![0; TX_BATCH * MAX_PACKET],
            used: 0,
            packets: Vec::with_capacity(2 * TX_BATCH),
            groups: Vec::with_capacity(TX_BATCH),
            reseals: ResealCache([None; 64]),
        }
    }
}

impl TxBatch {
    /// Whether the batch holds its [`TX_BATCH`] packets, and must be sent before it takes more.
    pub(crate) fn is_full(&self) -> bool {
        self.packets.len() >= TX_BATCH
    }

    /// How many packets wait.
    pub(crate) fn len(&self) -> usize {
        self.packets.len()
    }

    /// Room for the next packet, [`MAX_PACKET`] bytes, to be written in place and taken with
    /// [`TxBatch::push_written`].
    pub(crate) fn slot(&mut self) -> &mut [u8] {
        if self.bytes.len() < self.used + MAX_PACKET {
            self.bytes.resize(self.used + MAX_PACKET, 0);
        }
        &mut self.bytes[self.used..self.used + MAX_PACKET]
    }

    /// Takes the `len`-byte packet just written into [`TxBatch::slot`], ICRC included;
    /// `deferrable` when its maker allows it to wait for the next packet (a bare ACK).
    pub(crate) fn push_written(&mut self, dst: SocketAddr, len: usize, deferrable: bool) {
        debug_assert!(len <= MAX_PACKET, "a packet of {len} bytes");
        let at = self.used;
        self.used += len;
        self.push_whole(dst, (at as u32, len as u32), deferrable);
    }

    /// Takes a packet written into [`TxBatch::slot`] without its body: `len` bytes, the first
    /// `at` its headers and the rest its pad and ICRC, with `body` (a range of the `ext` bytes
    /// that will be given to [`Port::send`]) between them on the wire.
    pub(crate) fn push_written_around(
        &mut self,
        dst: SocketAddr,
        len: usize,
        at: usize,
        body: std::ops::Range<usize>,
    ) {
        debug_assert!(
            at + 4 <= len && len <= MAX_PACKET,
            "{at} of a {len}-byte packet"
        );
        let start = self.used;
        self.used += len;
        self.packets.push(TxPacket {
            dst,
            head: (start as u32, at as u32),
            body: (body.start as u32, body.len() as u32),
            tail: ((start + at) as u32, (len - at) as u32),
            deferrable: false,
        });
    }

    /// Takes a packet gathered from `head`, `body` (a range of the `ext` bytes that will be
    /// given to [`Port::send`]) and `tail` (pad and ICRC), copying only the head and tail.
    pub(crate) fn push_gathered(
        &mut self,
        dst: SocketAddr,
        head: &[u8],
        body: std::ops::Range<usize>,
        tail: &[u8],
    ) {
        let head = self.append(head);
        let tail = self.append(tail);
        self.packets.push(TxPacket {
            dst,
            head,
            body: (body.start as u32, body.len() as u32),
            tail,
            deferrable: false,
        });
    }

    /// Copies a whole packet (ICRC included) into the batch.
    pub(crate) fn push_copy(&mut self, dst: SocketAddr, bytes: &[u8]) {
        let whole = self.append(bytes);
        self.push_whole(dst, whole, false);
    }

    /// Adds a copy of packet `p` (body from `ext`) with bytes of its own.
    pub(crate) fn push_duplicate(&mut self, p: &TxPacket, ext: &[u8]) {
        let at = self.used;
        self.append_own(p.head);
        self.append(ext.get(range(p.body)).unwrap_or(&[]));
        self.append_own(p.tail);
        let len = self.used - at;
        self.push_whole(p.dst, (at as u32, len as u32), p.deferrable);
    }

    /// Takes the packet at `(offset, length)` of the batch's own bytes, its ICRC the last four.
    fn push_whole(&mut self, dst: SocketAddr, (at, len): (u32, u32), deferrable: bool) {
        debug_assert!(len >= 4, "a packet of {len} bytes has no ICRC");
        let len = len.max(4);
        self.packets.push(TxPacket {
            dst,
            head: (at, len - 4),
            body: (0, 0),
            tail: (at + len - 4, 4),
            deferrable,
        });
    }

    /// Whether every packet waiting may wait for the next one: what a sender may hold back a
    /// little to send with its next packet.
    pub(crate) fn only_deferrable(&self) -> bool {
        !self.packets.is_empty() && self.packets.iter().all(|p| p.deferrable)
    }

    /// Moves the batch's packet list into `out`, leaving their bytes in place, so that a tap
    /// can put packets back ([`TxBatch::push_packet`]) or add copies.
    pub(crate) fn take_packets(&mut self, out: &mut Vec<TxPacket>) {
        out.append(&mut self.packets);
    }

    /// Puts back a packet taken by [`TxBatch::take_packets`].
    pub(crate) fn push_packet(&mut self, p: TxPacket) {
        self.packets.push(p);
    }

    /// Packet `i`.
    #[cfg(test)]
    pub(crate) fn packet(&self, i: usize) -> TxPacket {
        self.packets[i]
    }

    /// Appends `bytes` to the batch's own bytes; returns where they lie.
    fn append(&mut self, bytes: &[u8]) -> (u32, u32) {
        let at = self.room(bytes.len());
        self.bytes[at..at + bytes.len()].copy_from_slice(bytes);
        (at as u32, bytes.len() as u32)
    }

    /// Appends a copy of the batch's own bytes at `part`; returns where the copy lies.
    fn append_own(&mut self, part: (u32, u32)) -> (u32, u32) {
        let at = self.room(part.1 as usize);
        self.bytes.copy_within(range(part), at);
        (at as u32, part.1)
    }

    /// Claims `n` bytes at the end of the batch's own bytes, growing them if need be.
    fn room(&mut self, n: usize) -> usize {
        let at = self.used;
        if self.bytes.len() < at + n {
            self.bytes.resize(at + n, 0);
        }
        self.used += n;
        at
    }

    /// Empties the batch.
    pub(crate) fn clear(&mut self) {
        self.packets.clear();
        self.used = 0;
    }

    /// A packet's three parts: head, body (from `ext`) and tail.
    pub(crate) fn parts<'a>(&'a self, p: &TxPacket, ext: &'a [u8]) -> [&'a [u8]; 3] {
        let body = ext.get(range(p.body)).unwrap_or(&[]);
        [&self.bytes[range(p.head)], body, &self.bytes[range(p.tail)]]
    }

    /// The packet's bytes when it lies whole in the batch's own bytes.
    fn contiguous(&self, p: &TxPacket) -> Option<&[u8]> {
        (p.body.1 == 0 && p.head.0 + p.head.1 == p.tail.0)
            .then(|| &self.bytes[p.head.0 as usize..(p.tail.0 + p.tail.1) as usize])
    }

    /// Writes the packet's non-empty parts into `iov` (at least three long), a packet whole
    /// in the batch as one slice; returns how many.
    fn gather<'a>(&'a self, p: &TxPacket, ext: &'a [u8], iov: &mut [io::IoSlice<'a>]) -> usize {
        if let Some(bytes) = self.contiguous(p) {
            iov[0] = io::IoSlice::new(bytes);
            return 1;
        }
        let mut n = 0;
        for part in self.parts(p, ext) {
            if !part.is_empty() {
                iov[n] = io::IoSlice::new(part);
                n += 1;
            }
        }
        n
    }

    /// Lets each bare ACK among packets `range` trade places with the packet after it when
    /// that one goes to the same peer, is longer, and may not wait itself: the ACK then ends
    /// that packet's GSO send ([`gso::plan`]) instead of leaving alone before it. In a
    /// ping-pong the ACK held for the peer's last message and the reply posted after it thus
    /// leave as one send of two segments and reach a GRO peer as one buffer, where two
    /// datagrams cost the kernels about twice one (BENCHMARKS.md, the eleventh step). Safe to
    /// reorder: a positive ACK only acknowledges, a request after it travels the other way,
    /// and a response after it from the same queue pair acknowledges at least as far.
    fn trail_acks(&mut self, range: std::ops::Range<usize>) {
        let mut i = range.start;
        while i + 1 < range.end {
            let (ack, next) = (self.packets[i], self.packets[i + 1]);
            if ack.deferrable && !next.deferrable && ack.dst == next.dst && next.len() > ack.len() {
                self.packets.swap(i, i + 1);
                i += 2;
            } else {
                i += 1;
            }
        }
    }

    /// Applies to every packet of `g` the ICRC change for segment *i* of a GSO send (IPv4 ID
    /// *i*) and the source port change `port_xor`. Applying it twice undoes it.
    fn reseal_group(&mut self, g: &gso::Group, port_xor: u16) {
        for i in 0..g.count {
            let p = self.packets[g.first + i];
            let reseal = self.reseals.get(p.dst.is_ipv4(), p.len());
            reseal.apply(&mut self.bytes[p.icrc_range()], i as u16, port_xor);
        }
    }
}

/// The byte range an `(offset, length)` pair names.
fn range((at, len): (u32, u32)) -> std::ops::Range<usize> {
    at as usize..(at + len) as usize
}

/// What one sender owns around a [`Port`]: the batch being built, receive buffers, and the
/// taps, which work on whole batches so that batching and GSO stay on under them.
#[derive(Debug)]
pub(crate) struct Link {
    /// The packets waiting to leave.
    pub(crate) tx: TxBatch,
    rx: sys::RecvBatch,
    faults: Option<tap::FaultInjector>,
    pcap: Option<tap::PcapWriter>,
}

impl Link {
    pub(crate) fn new(faults: Option<tap::Faults>, pcap: Option<tap::PcapWriter>) -> Self {
        Self {
            tx: TxBatch::default(),
            rx: sys::RecvBatch::new(),
            faults: faults.map(tap::FaultInjector::new),
            pcap,
        }
    }

    /// Touches every page of the receive buffers (`sys::RecvBatch::prefault`).
    pub(crate) fn prefault(&mut self) {
        self.rx.prefault();
    }

    /// Injects `faults` into every batch sent from now on; `None` stops.
    pub(crate) fn set_faults(&mut self, faults: Option<tap::Faults>) {
        self.faults = faults.map(tap::FaultInjector::new);
    }

    /// Records every packet from now on in `pcap`.
    pub(crate) fn set_pcap(&mut self, pcap: tap::PcapWriter) {
        self.pcap = Some(pcap);
    }

    /// Sends the batch (through the fault injector, which may also release packets it held
    /// that are due), packet bodies from `ext`, and empties it. A capture is written out
    /// after each batch, so that a program that exits without closing its NIC (an error
    /// path, often the one being debugged) leaves every packet it sent in the file.
    pub(crate) fn transmit(&mut self, port: &Port, now: Instant, ext: &[u8]) {
        if let Some(faults) = self.faults.as_mut() {
            faults.apply(now, &mut self.tx, ext);
        }
        if self.tx.len() > 0 {
            port.send(&mut self.tx, ext, self.pcap.as_mut());
            if self.flush_capture().is_err() {
                UdpCounters::add(&port.counters.pcap_errors, 1);
            }
        }
        self.tx.clear();
    }

    /// When a packet held back by fault injection is next due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.faults.as_ref().and_then(tap::FaultInjector::next_due)
    }

    /// Writes out what the capture buffers.
    pub(crate) fn flush_capture(&mut self) -> io::Result<()> {
        self.pcap.as_mut().map_or(Ok(()), tap::PcapWriter::flush)
    }

    /// Takes up to two receive batches that have already arrived, without blocking, and hands
    /// each packet to `handle` with its sender and its index in a coalesced train (split into
    /// its segments; 0 for a plain datagram), which is the IPv4 ID a ferroce peer's GSO send
    /// gave it. Returns how many packets were handled. (The soft NIC takes a batch at a time,
    /// to send between buffers.)
    #[cfg(test)]
    pub(crate) fn receive(
        &mut self,
        port: &Port,
        mut handle: impl FnMut(SocketAddr, &[u8], u16),
    ) -> usize {
        let mut handled = 0;
        for _ in 0..2 {
            let n = self.receive_batch(port, sys::RECV_BATCH);
            for i in 0..n {
                handled += self.handle_buffer(port, i, &mut handle);
            }
            if n < sys::RECV_BATCH {
                break;
            }
        }
        handled
    }

    /// Takes one batch of up to `max` buffers (at most [`sys::RECV_BATCH`]) that have already
    /// arrived, without blocking: how many, to be handed over one at a time by
    /// [`Link::handle_buffer`]. 0 when none is waiting or the socket failed (counted).
    pub(crate) fn receive_batch(&mut self, port: &Port, max: usize) -> usize {
        loop {
            match self.rx.receive(&port.socket, max) {
                Ok(n) => return n,
                // ICMP port unreachable from an earlier send: the peer is gone; retries and
                // timeouts will say so.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {}
                Err(_) => {
                    UdpCounters::add(&port.counters.recv_errors, 1);
                    return 0;
                }
            }
        }
    }

    /// Hands each packet of buffer `i` of the last [`Link::receive_batch`] to `handle`, as
    /// [`Link::receive`] describes, in order but for a trailing bare ACK, which goes first
    /// (see [`trailing_ack`]). Returns how many packets it held. `handle` is a trait object
    /// so that this is one function whoever calls it: [`Port::rehearse`] then runs the very
    /// code the soft NIC's drain does (a generic would be compiled once per closure, and a
    /// guest under emulation translates each copy the first time it runs).
    pub(crate) fn handle_buffer(
        &mut self,
        port: &Port,
        i: usize,
        handle: &mut dyn FnMut(SocketAddr, &[u8], u16),
    ) -> usize {
        let counters = &port.counters;
        let Ok(got) = self.rx.get(i) else {
            UdpCounters::add(&counters.recv_errors, 1);
            return 0;
        };
        let Some(bytes) = got.bytes else {
            // Larger than any RoCE packet: counted as such, never half-handled.
            UdpCounters::add(&counters.oversized, 1);
            return 0;
        };
        if bytes.is_empty() {
            // A poke (`Nic::wake`) has nothing to handle; from anyone else, the engine counts
            // it as malformed.
            if got.from == port.local {
                return 0;
            }
            handle(got.from, bytes, 0);
            return 1;
        }
        let segment = got.segment.unwrap_or(bytes.len()).max(1);
        let count = bytes.len().div_ceil(segment);
        if count > 1 {
            UdpCounters::add(&counters.gro_buffers, 1);
            UdpCounters::add(&counters.gro_segments, count as u64);
        }
        if let Some(pcap) = self.pcap.as_mut() {
            for packet in bytes.chunks(segment) {
                if pcap.record(got.from, port.local, &[packet], None).is_err() {
                    UdpCounters::add(&counters.pcap_errors, 1);
                }
            }
        }
        let last = count - 1;
        // A bare ACK its sender let trail the next packet (`TxBatch::trail_acks`) was made
        // before it: handled first, as a NIC that sends each ACK at once is heard, a reply's
        // sender sees its own request complete no later than the reply arrive.
        let ack_first = last > 0 && trailing_ack(bytes, segment);
        if ack_first {
            handle(got.from, &bytes[last * segment..], last as u16);
        }
        let rest = if ack_first { last } else { count };
        for (index, packet) in bytes.chunks(segment).take(rest).enumerate() {
            handle(got.from, packet, index as u16);
        }
        count
    }
}

/// Whether the last segment of a coalesced buffer is a bare ACK that trails requests only: no
/// other segment is a response, whose order against the ACK matters (an ACK past a READ's
/// responses would say they were lost).
fn trailing_ack(bytes: &[u8], segment: usize) -> bool {
    let opcode = |packet: &[u8]| packet.first().and_then(|&b| Opcode::new(b));
    let mut packets = bytes.chunks(segment);
    let Some(last) = packets.next_back() else {
        return false;
    };
    opcode(last).is_some_and(|o| o.operation() == Operation::Acknowledge)
        && packets.all(|p| opcode(p).is_some_and(|o| !o.is_response()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_proto::wire::{icrc, IpHeader, Ipv4Header, UdpHeader};
    use std::net::Ipv4Addr;

    const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn options(gso: bool, gro: bool) -> PortOptions {
        PortOptions {
            gso,
            gro,
            buffers: 1 << 20,
        }
    }

    /// A packet of `len` bytes (a BTH's worth of header, a pattern, an ICRC) sealed as its
    /// maker seals it: from `src` with IPv4 ID 0.
    fn sealed(src: SocketAddr, dst: SocketAddr, len: usize, tag: u8) -> Vec<u8> {
        let mut p: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ tag).collect();
        let ip = IpHeader::between(src.ip(), dst.ip()).unwrap();
        let udp = UdpHeader {
            src_port: src.port(),
            dst_port: dst.port(),
        };
        icrc::seal(&ip, &udp, &mut p).unwrap();
        p
    }

    fn verifies(from: SocketAddr, to: SocketAddr, id: u16, bytes: &[u8]) -> bool {
        let (IpAddr::V4(s), IpAddr::V4(d)) = (from.ip(), to.ip()) else {
            panic!("IPv4")
        };
        let ip = IpHeader::V4(Ipv4Header {
            id,
            ..Ipv4Header::new(s, d)
        });
        let udp = UdpHeader {
            src_port: from.port(),
            dst_port: to.port(),
        };
        icrc::verify(&ip, &udp, bytes)
    }

    /// A message's worth of packets: a longer FIRST, equal MIDDLEs, a shorter LAST.
    fn message(src: SocketAddr, dst: SocketAddr) -> Vec<Vec<u8>> {
        let mut packets = vec![sealed(src, dst, 1060, 0)];
        packets.extend((1..=20).map(|k| sealed(src, dst, 1044, k)));
        packets.push(sealed(src, dst, 300, 99));
        packets
    }

    #[test]
    fn loopback_segments_in_software_and_says_so() {
        // lo advertises UDP segmentation (it is software GSO), but it is no physical device.
        assert_eq!(sys::udp_segmentation_offload("lo"), Some(true));
        assert!(!segments_in_hardware("lo"));
        assert_eq!(sys::udp_segmentation_offload("no-such-device0"), None);
        // No interface holds the unspecified address: GSO is not used, and it says why.
        let anywhere = Port::open("0.0.0.0:0".parse().unwrap(), options(true, true)).unwrap();
        assert!(
            matches!(anywhere.gso_status(), GsoStatus::Unsupported(ref why) if why.contains("0.0.0.0")),
            "{:?}",
            anywhere.gso_status()
        );
    }

    #[test]
    fn segments_are_resealed_for_their_ids_and_the_gso_port() {
        let src: SocketAddr = "10.0.0.1:4791".parse().unwrap();
        let dst: SocketAddr = "10.0.0.2:4791".parse().unwrap();
        let packets = message(src, dst);
        let mut batch = TxBatch::default();
        for p in &packets {
            batch.push_copy(dst, p);
        }
        gso::plan(
            batch.len(),
            |i| (dst, batch.packets[i].len()),
            &mut batch.groups,
        );
        assert_eq!(
            batch
                .groups
                .iter()
                .map(|g| (g.count, g.segment))
                .collect::<Vec<_>>(),
            [(1, 1060), (21, 1044)]
        );
        let gso_port = 40_000;
        let groups = batch.groups.clone();
        for g in &groups {
            batch.reseal_group(g, src.port() ^ gso_port);
        }
        let from = SocketAddr::new(src.ip(), gso_port);
        for g in &groups {
            for i in 0..g.count {
                let p = batch.packets[g.first + i];
                let bytes = batch.parts(&p, &[]).concat();
                assert!(verifies(from, dst, i as u16, &bytes), "segment {i}");
                assert!(!verifies(from, dst, i as u16 + 1, &bytes));
            }
        }
    }

    /// Receives until `want` packets came or a second passed, with their sender and index.
    fn collect(link: &mut Link, port: &Port, want: usize) -> Vec<(SocketAddr, Vec<u8>, u16)> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(1);
        while got.len() < want && Instant::now() < deadline {
            let _ = sys::wait_readable(port.socket(), Some(Duration::from_millis(20)));
            link.receive(port, |from, bytes, index| {
                got.push((from, bytes.to_vec(), index))
            });
        }
        got
    }

    fn send_message(port: &Port, link: &mut Link, dst: SocketAddr) -> Vec<Vec<u8>> {
        let packets = message(port.local(), dst);
        for p in &packets {
            link.tx.push_copy(dst, p);
        }
        link.transmit(port, Instant::now(), &[]);
        packets
    }

    #[test]
    fn a_gso_send_arrives_byte_exact_at_gro_and_plain_sockets() {
        let tx = Port::open(SocketAddr::new(LO, 0), options(true, false)).unwrap();
        assert_eq!(tx.gso_status(), GsoStatus::Active);
        let gso_from = tx.gso.as_ref().unwrap().1;
        let mut link = Link::new(None, None);
        for gro in [true, false] {
            let rx = Port::open(SocketAddr::new(LO, 0), options(false, gro)).unwrap();
            let mut rx_link = Link::new(None, None);
            let sent = send_message(&tx, &mut link, rx.local());
            let got = collect(&mut rx_link, &rx, sent.len());
            assert_eq!(got.len(), sent.len(), "GRO {gro}");
            // The FIRST left alone, as a plain datagram of the GSO socket; the rest as one
            // send, segment i with ID i.
            for (k, ((from, bytes, index), want)) in got.iter().zip(&sent).enumerate() {
                // All but the ICRC, which was re-sealed.
                assert_eq!(bytes.len(), want.len());
                let n = want.len() - 4;
                assert_eq!(bytes[..n], want[..n], "packet {k}, GRO {gro}");
                assert_eq!(*from, gso_from);
                let id = k.saturating_sub(1) as u16;
                if gro {
                    assert_eq!(*index, id);
                    assert!(verifies(*from, rx.local(), id, bytes), "packet {k}");
                } else {
                    let (IpAddr::V4(s), IpAddr::V4(d)) = (from.ip(), rx.local().ip()) else {
                        unreachable!()
                    };
                    let udp = UdpHeader {
                        src_port: from.port(),
                        dst_port: rx.local().port(),
                    };
                    let v4 = Ipv4Header::new(s, d);
                    let recovered = icrc::recover_ipv4_id(&v4, &udp, bytes).unwrap();
                    assert_eq!(recovered, id, "packet {k}");
                }
            }
            if gro {
                assert_eq!(rx.counters.gro_buffers.load(Ordering::Relaxed), 1);
            }
        }
        assert_eq!(tx.counters.gso_sends.load(Ordering::Relaxed), 2);
        assert_eq!(tx.counters.gso_segments.load(Ordering::Relaxed), 42);
    }

    /// The rehearsal runs on a port of its own, and takes back the four packets it sent: the
    /// NIC's port counts nothing, sends nothing from its sockets and receives nothing, with
    /// GSO on and off.
    #[test]
    fn the_rehearsal_leaves_the_port_as_it_was() {
        for gso in [true, false] {
            let port = Port::open(SocketAddr::new(LO, 0), options(gso, true)).unwrap();
            assert_eq!(port.rehearse(), 4, "GSO {gso}");
            let counted: Vec<_> = port.counters.iter().filter(|(_, n)| *n != 0).collect();
            assert!(counted.is_empty(), "GSO {gso}: {counted:?}");
            let mut rx = sys::RecvBatch::new();
            assert_eq!(
                rx.receive(&port.socket, sys::RECV_BATCH).unwrap(),
                0,
                "GSO {gso}"
            );
            if let Some((socket, _)) = &port.gso {
                socket.set_nonblocking(true).unwrap();
                let err = socket.recv(&mut [0; 64]).unwrap_err();
                assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "GSO {gso}");
            }
        }
    }

    /// A capped receive takes no more buffers than asked, in order, and leaves the rest for
    /// the next (the progress thread's first `recvmmsg` after a wake-up takes a few).
    #[test]
    fn a_capped_receive_takes_what_it_asked_for_and_leaves_the_rest() {
        let tx = UdpSocket::bind(SocketAddr::new(LO, 0)).unwrap();
        let rx = Port::open(SocketAddr::new(LO, 0), options(false, false)).unwrap();
        for k in 0..10u8 {
            tx.send_to(&[k; 40], rx.local()).unwrap();
        }
        let mut link = Link::new(None, None);
        let mut got = Vec::new();
        for (max, want) in [(4, 4), (1, 1), (sys::RECV_BATCH, 5), (sys::RECV_BATCH, 0)] {
            let n = link.receive_batch(&rx, max);
            assert_eq!(n, want, "asked for {max}");
            for i in 0..n {
                let handled = link.handle_buffer(&rx, i, &mut |_, bytes, _| got.push(bytes[0]));
                assert_eq!(handled, 1);
            }
        }
        assert_eq!(got, (0..10).collect::<Vec<u8>>());
    }

    /// A receive of one buffer (`recvmsg`, where a batch is `recvmmsg`) takes a whole GRO
    /// train with its sender and segment size, as a batch does: the message's FIRST alone,
    /// then its train, segment by segment, and nothing is left behind.
    #[test]
    fn a_one_buffer_receive_takes_a_whole_train_with_its_sender() {
        let tx = Port::open(SocketAddr::new(LO, 0), options(true, false)).unwrap();
        let gso_from = tx.gso.as_ref().unwrap().1;
        let rx = Port::open(SocketAddr::new(LO, 0), options(false, true)).unwrap();
        let (mut link, mut rx_link) = (Link::new(None, None), Link::new(None, None));
        let sent = send_message(&tx, &mut link, rx.local());
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(1);
        while got.len() < sent.len() && Instant::now() < deadline {
            let _ = sys::wait_readable(rx.socket(), Some(Duration::from_millis(20)));
            let n = rx_link.receive_batch(&rx, 1);
            assert!(n <= 1, "asked for one buffer, took {n}");
            if n == 1 {
                let before = got.len();
                rx_link.handle_buffer(&rx, 0, &mut |from, bytes, index| {
                    got.push((from, bytes.to_vec(), index));
                });
                assert!(got.len() > before, "a buffer with no packet");
            }
        }
        assert_eq!(got.len(), sent.len());
        for (k, ((from, bytes, index), want)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(*from, gso_from, "packet {k}");
            let n = want.len() - 4;
            assert_eq!(
                (bytes.len(), &bytes[..n]),
                (want.len(), &want[..n]),
                "packet {k}"
            );
            assert_eq!(*index, k.saturating_sub(1) as u16, "packet {k}");
            assert!(verifies(*from, rx.local(), *index, bytes), "packet {k}");
        }
        assert_eq!(rx_link.receive_batch(&rx, 1), 0);
    }

    /// A FIRST sent alone and its train sent later leave from one socket: two flows could be
    /// reordered by the receiver's GRO (issue 26). With GSO off, both leave the endpoint's
    /// socket.
    #[test]
    fn a_lone_packet_leaves_from_the_gso_socket_while_gso_is_on() {
        for gso in [true, false] {
            let tx = Port::open(SocketAddr::new(LO, 0), options(gso, false)).unwrap();
            let rx = Port::open(SocketAddr::new(LO, 0), options(false, true)).unwrap();
            let (mut link, mut rx_link) = (Link::new(None, None), Link::new(None, None));
            let packets = message(tx.local(), rx.local());
            link.tx.push_copy(rx.local(), &packets[0]);
            link.transmit(&tx, Instant::now(), &[]);
            for p in &packets[1..] {
                link.tx.push_copy(rx.local(), p);
            }
            link.transmit(&tx, Instant::now(), &[]);
            let got = collect(&mut rx_link, &rx, packets.len());
            assert_eq!(got.len(), packets.len(), "GSO {gso}");
            let from = if gso {
                tx.gso.as_ref().unwrap().1
            } else {
                tx.local()
            };
            for (k, (sender, bytes, index)) in got.iter().enumerate() {
                assert_eq!(*sender, from, "packet {k}, GSO {gso}");
                let id = if gso { *index } else { 0 };
                assert!(verifies(*sender, rx.local(), id, bytes), "packet {k}");
            }
            // The seals above assume the IPv4 IDs an unconnected socket sends with DF (0, and
            // 0, 1, ... along a train); a connected one numbers them from a random start, which
            // a receiver on this host never sees but rxe checks (BENCHMARKS.md, the data
            // path's thirteenth step). An IPv4 GSO socket keeps no route (`Port::keep_route`).
            if let Some((socket, _)) = &tx.gso {
                assert!(socket.peer_addr().is_err(), "the GSO socket is connected");
            }
        }
    }

    /// An IPv6 GSO socket connects to the first peer it sends to (so the kernel keeps the
    /// route) and still sends to any other; the ICMP port unreachable that the connected
    /// peer's closed port draws comes back on the socket's next send, to another peer, which
    /// is retried and arrives. Packets verify: IPv6 has no ID, so connecting changes nothing
    /// the ICRC covers.
    #[test]
    fn an_ipv6_gso_socket_keeps_its_first_peers_route() {
        let lo6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
        let tx = Port::open(SocketAddr::new(lo6, 0), options(true, false))
            .expect("IPv6 loopback (::1), which this test needs");
        assert_eq!(tx.gso_status(), GsoStatus::Active);
        let (socket, from) = tx.gso.as_ref().map(|(s, a)| (s, *a)).unwrap();
        let first = Port::open(SocketAddr::new(lo6, 0), options(false, false)).unwrap();
        let second = Port::open(SocketAddr::new(lo6, 0), options(false, false)).unwrap();
        let mut link = Link::new(None, None);
        let send = |link: &mut Link, to: SocketAddr, tag: u8| {
            link.tx.push_copy(to, &sealed(tx.local(), to, 64, tag));
            link.transmit(&tx, Instant::now(), &[]);
        };
        let receive = |port: &Port| {
            let got = collect(&mut Link::new(None, None), port, 1);
            assert_eq!(got.len(), 1, "a packet to {}", port.local());
            let (sender, bytes, _) = &got[0];
            assert_eq!(*sender, from);
            let ip = IpHeader::between(sender.ip(), port.local().ip()).unwrap();
            let udp = UdpHeader {
                src_port: sender.port(),
                dst_port: port.local().port(),
            };
            assert!(
                icrc::verify(&ip, &udp, bytes),
                "the ICRC of a packet to {}",
                port.local()
            );
        };
        assert!(
            socket.peer_addr().is_err(),
            "connected before its first send"
        );
        send(&mut link, first.local(), 1);
        assert_eq!(socket.peer_addr().unwrap(), first.local());
        receive(&first);
        send(&mut link, second.local(), 2);
        receive(&second);
        assert_eq!(
            socket.peer_addr().unwrap(),
            first.local(),
            "connected for good"
        );

        // The first peer goes away; a packet to it draws an ICMP error on loopback at once,
        // which the next send reports: a lone packet (`send_one`), then, after another such
        // error, two packets of two sends in one call (`send_all`).
        let gone = first.local();
        drop(first);
        send(&mut link, gone, 3);
        send(&mut link, second.local(), 4);
        receive(&second);
        send(&mut link, gone, 5);
        let to = second.local();
        link.tx.push_copy(to, &sealed(tx.local(), to, 64, 6));
        link.tx.push_copy(to, &sealed(tx.local(), to, 100, 7));
        link.transmit(&tx, Instant::now(), &[]);
        let got = collect(&mut Link::new(None, None), &second, 2);
        assert_eq!(got.len(), 2, "the two packets of one call after the error");
        assert_eq!(tx.counters.send_errors.load(Ordering::Relaxed), 0);
    }

    /// Pushes `bytes` as a bare ACK would be pushed: written in place, allowed to wait.
    fn push_ack(batch: &mut TxBatch, dst: SocketAddr, bytes: &[u8]) {
        batch.slot()[..bytes.len()].copy_from_slice(bytes);
        batch.push_written(dst, bytes.len(), true);
    }

    /// RC opcodes as the first byte of `sealed`'s packets.
    const ACK: u8 = Opcode::RC_ACKNOWLEDGE.value();
    const WRITE_ONLY: u8 = Opcode::RC_RDMA_WRITE_ONLY.value();
    const READ_RESPONSE_LAST: u8 = Opcode::RC_RDMA_READ_RESPONSE_LAST.value();

    /// A ping-pong's turn: the ACK held for the peer's last WRITE, then the reply. The ACK
    /// trails the reply in one GSO send, and a GRO peer gets both in one buffer, each sealed
    /// for its own segment's ID, and handles the ACK first, in the order they were made.
    #[test]
    fn a_held_ack_leaves_behind_the_reply_in_one_send() {
        let tx = Port::open(SocketAddr::new(LO, 0), options(true, false)).unwrap();
        let rx = Port::open(SocketAddr::new(LO, 0), options(false, true)).unwrap();
        let (mut link, mut rx_link) = (Link::new(None, None), Link::new(None, None));
        let ack = sealed(tx.local(), rx.local(), 20, ACK);
        let write = sealed(tx.local(), rx.local(), 40, WRITE_ONLY);
        push_ack(&mut link.tx, rx.local(), &ack);
        link.tx.push_copy(rx.local(), &write);
        link.transmit(&tx, Instant::now(), &[]);
        let got = collect(&mut rx_link, &rx, 2);
        let handled: Vec<_> = got.iter().map(|(_, b, i)| (b[0], b.len(), *i)).collect();
        assert_eq!(handled, [(ACK, 20, 1), (WRITE_ONLY, 40, 0)]);
        for (from, bytes, index) in &got {
            assert!(verifies(*from, rx.local(), *index, bytes));
        }
        assert_eq!(tx.counters.gso_sends.load(Ordering::Relaxed), 1);
        assert_eq!(rx.counters.gro_buffers.load(Ordering::Relaxed), 1);
    }

    /// Only a bare ACK behind requests is taken out of a coalesced buffer's order: behind a
    /// READ's responses it would say they were lost.
    #[test]
    fn a_trailing_ack_goes_first_only_behind_requests() {
        let buffer = |packets: &[(u8, usize)]| -> Vec<u8> {
            packets
                .iter()
                .flat_map(|&(op, len)| std::iter::once(op).chain(std::iter::repeat_n(0, len - 1)))
                .collect()
        };
        let cases = [
            (vec![(WRITE_ONLY, 40), (ACK, 20)], true),
            (vec![(WRITE_ONLY, 40), (WRITE_ONLY, 40), (ACK, 20)], true),
            (vec![(READ_RESPONSE_LAST, 40), (ACK, 20)], false),
            (
                vec![(WRITE_ONLY, 40), (READ_RESPONSE_LAST, 40), (ACK, 20)],
                false,
            ),
            (vec![(WRITE_ONLY, 40), (WRITE_ONLY, 20)], false),
            // An opcode ferroce does not know (RD's) is not taken for a request.
            (vec![(0x40, 40), (ACK, 20)], false),
        ];
        for (packets, first) in cases {
            assert_eq!(trailing_ack(&buffer(&packets), 40), first, "{packets:?}");
        }
    }

    /// An ACK keeps its place before a packet to another peer, one no longer than it (a NAK),
    /// or one that may wait too.
    #[test]
    fn an_ack_trails_only_a_longer_packet_to_the_same_peer() {
        let (a, b): (SocketAddr, SocketAddr) = (
            "10.0.0.2:4791".parse().unwrap(),
            "10.0.0.3:4791".parse().unwrap(),
        );
        let order = |packets: &[(SocketAddr, usize, bool)]| {
            let mut batch = TxBatch::default();
            for (k, &(dst, len, ack)) in packets.iter().enumerate() {
                let bytes = vec![k as u8; len];
                if ack {
                    push_ack(&mut batch, dst, &bytes);
                } else {
                    batch.push_copy(dst, &bytes);
                }
            }
            batch.trail_acks(0..batch.len());
            (0..batch.len())
                .map(|i| batch.parts(&batch.packet(i), &[]).concat()[0])
                .collect::<Vec<u8>>()
        };
        assert_eq!(order(&[(a, 20, true), (a, 40, false)]), [1, 0]);
        assert_eq!(order(&[(a, 20, true), (b, 40, false)]), [0, 1]);
        assert_eq!(order(&[(a, 20, true), (a, 20, false)]), [0, 1]);
        assert_eq!(
            order(&[(a, 20, true), (a, 20, true), (a, 40, false)]),
            [0, 2, 1]
        );
        assert_eq!(
            order(&[(a, 20, true), (a, 40, false), (b, 20, true), (b, 60, false)]),
            [1, 0, 3, 2]
        );
    }

    #[test]
    fn a_refused_gso_send_falls_back_to_plain_datagrams() {
        let tx = Port::open(SocketAddr::new(LO, 0), options(true, false)).unwrap();
        // Zero checksums on the GSO socket: the kernel now refuses every GSO send (EINVAL).
        sys::send_zero_checksum4(&tx.gso.as_ref().unwrap().0).unwrap();
        let rx = Port::open(SocketAddr::new(LO, 0), options(false, true)).unwrap();
        let (mut link, mut rx_link) = (Link::new(None, None), Link::new(None, None));
        let mut sent = send_message(&tx, &mut link, rx.local());
        sent.extend(send_message(&tx, &mut link, rx.local()));
        let got = collect(&mut rx_link, &rx, sent.len());
        assert_eq!(got.len(), sent.len());
        for (k, ((from, bytes, _), want)) in got.iter().zip(&sent).enumerate() {
            assert_eq!(bytes.len(), want.len());
            assert_eq!(
                bytes[..want.len() - 4],
                want[..want.len() - 4],
                "packet {k}"
            );
            // The FIRST of the first message left before the refusal, from the GSO socket;
            // everything after it as its maker sealed it, from the endpoint's socket.
            if k == 0 {
                assert!(verifies(*from, rx.local(), 0, bytes));
            } else {
                assert_eq!(*from, tx.local(), "packet {k}");
                assert!(verifies(*from, rx.local(), 0, bytes));
            }
        }
        assert_eq!(tx.counters.gso_fallbacks.load(Ordering::Relaxed), 1);
        assert!(matches!(tx.gso_status(), GsoStatus::FellBack(_)));
    }

    #[test]
    fn faults_keep_gso_on_and_duplicates_seal_apart() {
        let tx = Port::open(SocketAddr::new(LO, 0), options(true, false)).unwrap();
        let rx = Port::open(SocketAddr::new(LO, 0), options(false, true)).unwrap();
        let faults = tap::Faults {
            dup: 1.0,
            ..tap::Faults::default()
        };
        let (mut link, mut rx_link) = (Link::new(Some(faults), None), Link::new(None, None));
        let sent = send_message(&tx, &mut link, rx.local());
        let got = collect(&mut rx_link, &rx, 2 * sent.len());
        assert_eq!(got.len(), 2 * sent.len());
        for (from, bytes, index) in &got {
            assert!(verifies(*from, rx.local(), *index, bytes));
        }
        assert!(tx.counters.gso_sends.load(Ordering::Relaxed) >= 1);
    }
}
