//! Taps on the datagram layer's I/O path: a fault injector for sends and a pcap writer for both
//! directions, as `--fault` and `--pcap` of the tools configure them. Both work on whole
//! batches ([`super::Link`]), so that batching and GSO stay on under them.

use std::collections::BinaryHeap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferroce_proto::wire::{icrc, Datagram, IpHeader, UdpHeader};

use super::{TxBatch, TxPacket};

/// Faults to inject on every packet the NIC sends (`--fault loss=P,dup=P,reorder=P,
/// corrupt=P,delay=US,seed=N`): probabilities in 0..=1, a delay in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Drop a packet.
    pub loss: f64,
    /// Send a packet twice.
    pub dup: f64,
    /// Hold a packet back by twice the delay (at least 100 µs), so later ones overtake it.
    pub reorder: f64,
    /// Flip one bit of a packet.
    pub corrupt: f64,
    /// Delay every packet by this much.
    pub delay: Duration,
    /// Seeds the generator, so a run can be repeated.
    pub seed: u64,
}

/// Why a `--fault` specification did not parse.
#[derive(Debug, thiserror::Error)]
#[error("bad fault specification {spec:?}: {reason} (expected loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N)")]
pub struct FaultsError {
    spec: String,
    reason: String,
}

impl FromStr for Faults {
    type Err = FaultsError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| FaultsError {
            spec: spec.to_owned(),
            reason,
        };
        let mut faults = Self {
            seed: 1,
            ..Self::default()
        };
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| err(format!("{part:?} has no '='")))?;
            let probability = || {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| err(format!("{key}={value} is not a probability in 0..1")))
            };
            match key {
                "loss" => faults.loss = probability()?,
                "dup" => faults.dup = probability()?,
                "reorder" => faults.reorder = probability()?,
                "corrupt" => faults.corrupt = probability()?,
                "delay" => {
                    let us = value
                        .parse::<u64>()
                        .map_err(|_| err(format!("delay={value} is not microseconds")))?;
                    faults.delay = Duration::from_micros(us);
                }
                "seed" => {
                    faults.seed = value
                        .parse()
                        .map_err(|_| err(format!("seed={value} is not a number")))?
                }
                other => return Err(err(format!("unknown fault {other:?}"))),
            }
        }
        Ok(faults)
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "loss={},dup={},reorder={},corrupt={},delay={},seed={}",
            self.loss,
            self.dup,
            self.reorder,
            self.corrupt,
            self.delay.as_micros(),
            self.seed
        )
    }
}

#[derive(PartialEq, Eq)]
struct Held {
    at: Instant,
    seq: u64,
    dst: SocketAddr,
    bytes: Vec<u8>,
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Applies [`Faults`] to outgoing batches; delayed packets wait in a queue until due, then
/// join the next batch sent.
pub(crate) struct FaultInjector {
    faults: Faults,
    rng: u64,
    held: BinaryHeap<Held>,
    seq: u64,
    /// The batch's packets while the new list is built, kept for its capacity.
    scratch: Vec<TxPacket>,
}

impl fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultInjector")
            .field("faults", &self.faults)
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

impl FaultInjector {
    pub(crate) fn new(faults: Faults) -> Self {
        Self {
            faults,
            rng: faults.seed,
            held: BinaryHeap::new(),
            seq: 0,
            scratch: Vec::new(),
        }
    }

    fn next(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    /// Applies the faults to every packet of `batch` (bodies in `ext`): lost packets leave
    /// it, duplicates and corrupted copies join it, delayed ones wait. Held packets now due
    /// go first, as they were sent earlier.
    pub(crate) fn apply(&mut self, now: Instant, batch: &mut TxBatch, ext: &[u8]) {
        let mut packets = std::mem::take(&mut self.scratch);
        packets.clear();
        batch.take_packets(&mut packets);
        while self.held.peek().is_some_and(|h| h.at <= now) {
            let held = self.held.pop().expect("peeked");
            batch.push_copy(held.dst, &held.bytes);
        }
        for p in &packets {
            if self.chance(self.faults.loss) {
                continue;
            }
            let copies = if self.chance(self.faults.dup) { 2 } else { 1 };
            for copy in 0..copies {
                let corrupt = self.chance(self.faults.corrupt);
                let mut delay = self.faults.delay;
                if self.chance(self.faults.reorder) {
                    delay += (self.faults.delay * 2).max(Duration::from_micros(100));
                }
                if !corrupt && delay.is_zero() {
                    // A duplicate gets bytes of its own: a GSO send re-seals each packet's
                    // ICRC in place, and two packets sharing one would undo each other.
                    if copy == 0 {
                        batch.push_packet(*p);
                    } else {
                        batch.push_duplicate(p, ext);
                    }
                    continue;
                }
                let mut bytes = batch.parts(p, ext).concat();
                if corrupt && !bytes.is_empty() {
                    let at = (self.next() % bytes.len() as u64) as usize;
                    bytes[at] ^= 1 << (self.next() % 8);
                }
                if delay.is_zero() {
                    batch.push_copy(p.dst, &bytes);
                } else {
                    self.seq += 1;
                    self.held.push(Held {
                        at: now + delay,
                        seq: self.seq,
                        dst: p.dst,
                        bytes,
                    });
                }
            }
        }
        self.scratch = packets;
    }

    /// When the next held packet is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.at)
    }
}

/// How a packet left: what the socket does not show but the wire carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OnWire {
    /// The IPv4 ID (0 for a plain datagram; its index for a GSO segment).
    pub(crate) ipv4_id: u16,
    /// Whether the UDP checksum is filled in (GSO sends) or zero (plain sends).
    pub(crate) udp_checksum: bool,
}

/// Writes packets as a classic pcap file of Ethernet frames, rebuilding the IP and UDP
/// headers a UDP socket hides so that the ICRC of every packet verifies in tshark and
/// `ferroce decode`.
#[derive(Debug)]
pub(crate) struct PcapWriter {
    out: BufWriter<File>,
    frame: Vec<u8>,
    payload: Vec<u8>,
}

/// The UDP checksum of `datagram` (header, checksum field zero, then payload) between the
/// addresses of `ip` (RFC 768; RFC 8200 §8.1 for IPv6). Zero comes out as 0xFFFF.
fn udp_checksum(ip: &IpHeader, datagram: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            let hi = u64::from(pair[0]) << 8;
            sum += hi | pair.get(1).map_or(0, |&lo| u64::from(lo));
        }
    };
    match ip {
        IpHeader::V4(h) => {
            add(&h.src.octets());
            add(&h.dst.octets());
        }
        IpHeader::V6(h) => {
            add(&h.src.octets());
            add(&h.dst.octets());
        }
    }
    add(&(datagram.len() as u32).to_be_bytes());
    add(&[0, 17]);
    add(datagram);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    match !(sum as u16) {
        0 => 0xffff,
        c => c,
    }
}

impl PcapWriter {
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        // Magic, version 2.4, no time zone, no accuracy, snap length, LINKTYPE_ETHERNET.
        out.write_all(&0xa1b2_c3d4u32.to_le_bytes())?;
        out.write_all(&2u16.to_le_bytes())?;
        out.write_all(&4u16.to_le_bytes())?;
        out.write_all(&[0; 8])?;
        out.write_all(&65_535u32.to_le_bytes())?;
        out.write_all(&1u32.to_le_bytes())?;
        Ok(Self {
            out,
            frame: Vec::with_capacity(9000),
            payload: Vec::with_capacity(9000),
        })
    }

    /// Records one RoCE packet (a UDP payload, gathered from `parts`) from `src` to `dst`:
    /// with `sent`, one this host sent, as it left; without, one it received, whose IPv4 ID is
    /// recovered from the ICRC.
    pub(crate) fn record(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        parts: &[&[u8]],
        sent: Option<OnWire>,
    ) -> io::Result<()> {
        self.payload.clear();
        for part in parts {
            self.payload.extend_from_slice(part);
        }
        let payload = std::mem::take(&mut self.payload);
        let result = self.record_payload(src, dst, &payload, sent);
        self.payload = payload;
        result
    }

    fn record_payload(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
        sent: Option<OnWire>,
    ) -> io::Result<()> {
        let Some(mut ip) = IpHeader::between(src.ip(), dst.ip()) else {
            return Ok(());
        };
        let udp = UdpHeader {
            src_port: src.port(),
            dst_port: dst.port(),
        };
        // Put back the ID the sender used: the one it was sent with, or the one the ICRC
        // reveals.
        if let IpHeader::V4(v4) = &mut ip {
            match sent {
                Some(wire) => v4.id = wire.ipv4_id,
                // One pass over the packet finds it, as the engine's receive does.
                None => {
                    if let icrc::Ipv4Check::SentWithId(id) = icrc::check_ipv4(v4, &udp, payload) {
                        v4.id = id;
                    }
                }
            }
        }
        let ethertype: u16 = if matches!(src.ip(), IpAddr::V4(_)) {
            0x0800
        } else {
            0x86dd
        };
        self.frame.clear();
        self.frame
            .extend_from_slice(&[0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1]);
        self.frame.extend_from_slice(&ethertype.to_be_bytes());
        let at = self.frame.len();
        self.frame.resize(at + ip.len() + UdpHeader::LEN, 0);
        Datagram::emit_headers(&ip, &udp, payload.len(), &mut self.frame[at..])
            .map_err(io::Error::other)?;
        self.frame.extend_from_slice(payload);
        if sent.is_some_and(|w| w.udp_checksum) {
            let sum = udp_checksum(&ip, &self.frame[at + ip.len()..]);
            let c = at + ip.len() + 6;
            self.frame[c..c + 2].copy_from_slice(&sum.to_be_bytes());
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let len = self.frame.len() as u32;
        self.out.write_all(&(ts.as_secs() as u32).to_le_bytes())?;
        self.out.write_all(&ts.subsec_micros().to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(&len.to_le_bytes())?;
        self.out.write_all(&self.frame)
    }

    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_specifications() {
        let f: Faults = "loss=0.1,dup=0.02,reorder=0.05,corrupt=0.001,delay=50,seed=9"
            .parse()
            .unwrap();
        assert_eq!(f.loss, 0.1);
        assert_eq!(f.delay, Duration::from_micros(50));
        assert_eq!(f.seed, 9);
        assert_eq!(f.to_string().parse::<Faults>().unwrap(), f);
        for bad in ["loss=2", "loss", "jitter=3", "delay=-1", "seed=x"] {
            assert!(bad.parse::<Faults>().is_err(), "{bad}");
        }
    }

    #[test]
    fn loss_one_drops_everything_and_delay_holds() {
        let now = Instant::now();
        let dst: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let mut batch = TxBatch::default();
        batch.push_copy(dst, &[1, 2, 3, 4, 5]);
        let mut lossy = FaultInjector::new(Faults {
            loss: 1.0,
            ..Faults::default()
        });
        lossy.apply(now, &mut batch, &[]);
        assert_eq!(batch.len(), 0);
        let mut slow = FaultInjector::new(Faults {
            delay: Duration::from_millis(1),
            ..Faults::default()
        });
        batch.push_copy(dst, &[4, 0, 0, 0, 0]);
        slow.apply(now, &mut batch, &[]);
        assert_eq!(batch.len(), 0);
        assert_eq!(slow.next_due(), Some(now + Duration::from_millis(1)));
        slow.apply(now + Duration::from_millis(1), &mut batch, &[]);
        assert_eq!(batch.len(), 1);
        let p = batch.packet(0);
        assert_eq!(batch.parts(&p, &[]).concat(), [4, 0, 0, 0, 0]);
    }

    #[test]
    fn duplicates_and_corruption_copy_the_packet_with_its_body() {
        let dst: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        let body = [9u8; 6];
        let mut batch = TxBatch::default();
        batch.push_gathered(dst, &[1, 2], 0..6, &[7, 7, 7, 7]);
        let mut twice = FaultInjector::new(Faults {
            dup: 1.0,
            ..Faults::default()
        });
        twice.apply(Instant::now(), &mut batch, &body);
        assert_eq!(batch.len(), 2);
        let whole = [1, 2, 9, 9, 9, 9, 9, 9, 7, 7, 7, 7];
        for i in 0..2 {
            assert_eq!(batch.parts(&batch.packet(i), &body).concat(), whole);
        }
        let mut flip = FaultInjector::new(Faults {
            corrupt: 1.0,
            ..Faults::default()
        });
        flip.apply(Instant::now(), &mut batch, &body);
        for i in 0..2 {
            let got = batch.parts(&batch.packet(i), &body).concat();
            let flipped: u32 = got
                .iter()
                .zip(whole)
                .map(|(a, b)| (a ^ b).count_ones())
                .sum();
            assert_eq!(flipped, 1);
        }
    }

    #[test]
    fn udp_checksums_match_an_independent_computation() {
        // 10.0.0.1:4660 -> 10.0.0.2:4791, payload de ad be ef; 0x294b computed apart from
        // this code (Python, over the pseudo-header and datagram as RFC 768 lays them out).
        let ip = IpHeader::V4(ferroce_proto::wire::Ipv4Header::new(
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
        ));
        let datagram = [0x12, 0x34, 0x12, 0xb7, 0, 12, 0, 0, 0xde, 0xad, 0xbe, 0xef];
        assert_eq!(udp_checksum(&ip, &datagram), 0x294b);
    }

    /// A received packet is recorded with the IPv4 ID its ICRC reveals (rxe and NICs send
    /// non-zero ones, which the socket does not show), so that the capture verifies; one whose
    /// ICRC no ID explains is recorded as it came, with ID 0.
    #[test]
    fn a_received_packet_is_recorded_with_the_ip_id_its_icrc_reveals() {
        use ferroce_proto::wire::{Bth, Ipv4Header, Opcode, Qpn};
        use ferroce_proto::Psn;

        let (src, dst): (SocketAddr, SocketAddr) = (
            "10.0.0.1:49152".parse().unwrap(),
            "10.0.0.2:4791".parse().unwrap(),
        );
        let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
            unreachable!()
        };
        let ip = IpHeader::V4(Ipv4Header {
            id: 0x4321,
            ..Ipv4Header::new(s, d)
        });
        let udp = UdpHeader {
            src_port: src.port(),
            dst_port: dst.port(),
        };
        let bth = Bth::new(
            Opcode::RC_ACKNOWLEDGE,
            Qpn::new(0x11).unwrap(),
            Psn::new(7).unwrap(),
        );
        let mut packet = vec![0u8; Bth::LEN + 8];
        bth.emit(0, &mut packet[..Bth::LEN]).unwrap();
        icrc::seal(&ip, &udp, &mut packet).unwrap();
        let mut damaged = packet.clone();
        damaged[Bth::LEN] ^= 1;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rx.pcap");
        let mut pcap = PcapWriter::create(&path).unwrap();
        pcap.record(src, dst, &[&packet], None).unwrap();
        pcap.record(src, dst, &[&damaged], None).unwrap();
        pcap.flush().unwrap();
        let ids: Vec<_> = crate::capture::CaptureReader::open(&path)
            .unwrap()
            .map(|frame| {
                let frame = frame.unwrap();
                let d = Datagram::parse(frame.ip_packet().unwrap()).unwrap();
                let IpHeader::V4(v4) = d.ip else {
                    unreachable!()
                };
                (v4.id, icrc::verify(&d.ip, &d.udp, d.payload))
            })
            .collect();
        assert_eq!(ids, [(0x4321, true), (0, false)]);
    }
}
