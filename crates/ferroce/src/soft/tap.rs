//! Taps on the soft NIC's I/O path: a fault injector for sends and a pcap writer for both
//! directions, as `--fault` and `--pcap` of the tools configure them.

use std::collections::BinaryHeap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferroce_proto::wire::{icrc, Datagram, IpHeader, UdpHeader};

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

/// Applies [`Faults`] to outgoing packets; delayed ones wait in a queue until due.
pub(crate) struct FaultInjector {
    faults: Faults,
    rng: u64,
    held: BinaryHeap<Held>,
    seq: u64,
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

    /// Takes a packet to send; what is due now goes to `send`, the rest waits.
    pub(crate) fn submit(
        &mut self,
        now: Instant,
        dst: SocketAddr,
        bytes: &[u8],
        send: &mut impl FnMut(SocketAddr, &[u8]),
    ) {
        if self.chance(self.faults.loss) {
            return;
        }
        let copies = if self.chance(self.faults.dup) { 2 } else { 1 };
        for _ in 0..copies {
            let mut bytes = bytes.to_vec();
            if self.chance(self.faults.corrupt) && !bytes.is_empty() {
                let at = (self.next() % bytes.len() as u64) as usize;
                bytes[at] ^= 1 << (self.next() % 8);
            }
            let mut delay = self.faults.delay;
            if self.chance(self.faults.reorder) {
                delay += (self.faults.delay * 2).max(Duration::from_micros(100));
            }
            if delay.is_zero() {
                send(dst, &bytes);
            } else {
                self.seq += 1;
                self.held.push(Held {
                    at: now + delay,
                    seq: self.seq,
                    dst,
                    bytes,
                });
            }
        }
    }

    /// Sends what has become due.
    pub(crate) fn release(&mut self, now: Instant, send: &mut impl FnMut(SocketAddr, &[u8])) {
        while self.held.peek().is_some_and(|h| h.at <= now) {
            let held = self.held.pop().expect("peeked");
            send(held.dst, &held.bytes);
        }
    }

    /// When the next held packet is due.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.held.peek().map(|h| h.at)
    }
}

/// Writes packets as a classic pcap file of Ethernet frames, rebuilding the IP and UDP
/// headers a UDP socket hides so that the ICRC of every packet verifies in tshark and
/// `ferroce decode`.
#[derive(Debug)]
pub(crate) struct PcapWriter {
    out: BufWriter<File>,
    frame: Vec<u8>,
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
        })
    }

    /// Records one RoCE packet (a UDP payload) from `src` to `dst`.
    pub(crate) fn record(
        &mut self,
        src: SocketAddr,
        dst: SocketAddr,
        payload: &[u8],
    ) -> io::Result<()> {
        let Some(mut ip) = IpHeader::between(src.ip(), dst.ip()) else {
            return Ok(());
        };
        let udp = UdpHeader {
            src_port: src.port(),
            dst_port: dst.port(),
        };
        // Put back the ID the sender used: 0 from ferroce, or the one the ICRC reveals.
        let verified = icrc::verify(&ip, &udp, payload);
        if let IpHeader::V4(v4) = &mut ip {
            if !verified {
                if let Some(id) = icrc::recover_ipv4_id(v4, &udp, payload) {
                    v4.id = id;
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
        let sent = std::cell::RefCell::new(Vec::new());
        let mut send = |_: SocketAddr, b: &[u8]| sent.borrow_mut().push(b.to_vec());
        let mut lossy = FaultInjector::new(Faults {
            loss: 1.0,
            ..Faults::default()
        });
        lossy.submit(now, dst, &[1, 2, 3], &mut send);
        let mut slow = FaultInjector::new(Faults {
            delay: Duration::from_millis(1),
            ..Faults::default()
        });
        slow.submit(now, dst, &[4], &mut send);
        assert!(sent.borrow().is_empty());
        assert_eq!(slow.next_due(), Some(now + Duration::from_millis(1)));
        slow.release(now + Duration::from_millis(1), &mut send);
        assert_eq!(*sent.borrow(), [vec![4]]);
    }
}
