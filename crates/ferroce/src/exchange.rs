//! Out-of-band endpoint exchange: how two peers tell each other their queue pair number, first
//! PSN and address before RDMA can flow.
//!
//! [`PingpongDest`] is the 52-byte `LID:QPN:PSN:GID` message of rdma-core's `ibv_rc_pingpong`
//! (protocol.md §5), so `ferroce pingpong` talks to that very tool over TCP port 18515.
//! [`PeerInfo`] is ferroce's own, versioned exchange between ferroce peers: a queue pair
//! endpoint and the regions the peer may access, as a few lines of text.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ferroce_proto::wire::{Qpn, ROCE_PORT};
use ferroce_proto::Psn;

use crate::QpEndpoint;

/// The length of `ibv_rc_pingpong`'s message: 51 characters and a NUL.
pub const PINGPONG_MSG_LEN: usize = 52;

/// One side's endpoint as `ibv_rc_pingpong` sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingpongDest {
    /// The local identifier; 0 on RoCE.
    pub lid: u16,
    /// The queue pair number.
    pub qpn: Qpn,
    /// The first PSN.
    pub psn: Psn,
    /// The GID: an IPv6 address, or IPv4-mapped (`::ffff:a.b.c.d`) for an IPv4 peer.
    pub gid: Ipv6Addr,
}

/// Why a peer's message could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// The connection failed or closed early.
    #[error("out-of-band exchange failed: {0}")]
    Io(#[from] io::Error),
    /// The message is not what the exchange expects (`LID:QPN:PSN:GID` in hex for the
    /// pingpong format; the line format of [`PeerInfo`] for ferroce's own).
    #[error("malformed endpoint message {0:?}")]
    Malformed(String),
    /// The peer speaks another version of ferroce's exchange.
    #[error("the peer speaks ferroce exchange version {theirs}; this build speaks version {ours}")]
    Version {
        /// Our version.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
}

impl PingpongDest {
    /// The message for a queue pair endpoint (LID 0).
    #[must_use]
    pub fn from_endpoint(endpoint: &QpEndpoint) -> Self {
        let gid = match endpoint.addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        Self {
            lid: 0,
            qpn: endpoint.qpn,
            psn: endpoint.psn,
            gid,
        }
    }

    /// The endpoint this message names, on the RoCEv2 port.
    #[must_use]
    pub fn endpoint(&self) -> QpEndpoint {
        let ip = self
            .gid
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(self.gid), IpAddr::V4);
        QpEndpoint {
            qpn: self.qpn,
            psn: self.psn,
            addr: SocketAddr::new(ip, ROCE_PORT),
        }
    }

    /// The 52 bytes on the wire.
    #[must_use]
    pub fn to_wire(&self) -> [u8; PINGPONG_MSG_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid
                .octets()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        let mut out = [0u8; PINGPONG_MSG_LEN];
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses the 52 bytes a peer sent.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Malformed`] with the text received.
    pub fn parse(bytes: &[u8]) -> Result<Self, ExchangeError> {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let bad = || ExchangeError::Malformed(text.clone());
        let mut parts = text.split(':');
        let mut field = |digits: usize| {
            let part = parts.next().filter(|p| p.len() == digits).ok_or_else(bad)?;
            u128::from_str_radix(part, 16).map_err(|_| bad())
        };
        let lid = field(4)? as u16;
        let qpn = Qpn::from_low_bits(field(6)? as u32);
        let psn = Psn::from_low_bits(field(6)? as u32);
        let gid = Ipv6Addr::from(field(32)?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self { lid, qpn, psn, gid })
    }

    /// Sends this message on `stream`.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Io`].
    pub fn send(&self, stream: &mut impl Write) -> Result<(), ExchangeError> {
        stream.write_all(&self.to_wire())?;
        Ok(())
    }

    /// Reads a peer's message from `stream`.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Io`] or [`ExchangeError::Malformed`].
    pub fn receive(stream: &mut impl Read) -> Result<Self, ExchangeError> {
        let mut buf = [0u8; PINGPONG_MSG_LEN];
        stream.read_exact(&mut buf)?;
        Self::parse(&buf)
    }
}

impl fmt::Display for PingpongDest {
    /// `LID 0x0000, QPN 0x000011, PSN 0x3a2f1c, GID ::ffff:127.0.0.1`, as `ibv_rc_pingpong`
    /// prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_of_protocol_md() {
        let wire = b"0000:000011:5f2841:00000000000000000000ffff0a000001";
        let dest = PingpongDest::parse(wire).unwrap();
        assert_eq!(dest.qpn, Qpn::new(0x11).unwrap());
        assert_eq!(dest.psn, Psn::new(0x5f2841).unwrap());
        assert_eq!(dest.endpoint().addr, "10.0.0.1:4791".parse().unwrap());
        let round = dest.to_wire();
        assert_eq!(&round[..51], &wire[..]);
        assert_eq!(round[51], 0);
        assert_eq!(
            dest.to_string(),
            "LID 0x0000, QPN 0x000011, PSN 0x5f2841, GID ::ffff:10.0.0.1"
        );
        assert!(PingpongDest::parse(b"0000:11:5f2841:00").is_err());
        assert!(
            PingpongDest::parse(b"zzzz:000011:5f2841:00000000000000000000ffff0a000001").is_err()
        );
    }
}

/// The version of ferroce's own exchange; a peer with another version is refused by name.
pub const EXCHANGE_VERSION: u32 = 1;

/// A region a peer may access, as exchanged: where it starts, its key and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// The address of its first byte.
    pub va: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u64,
}

/// What ferroce peers tell each other: a queue pair endpoint and the regions they may access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The queue pair to connect to.
    pub endpoint: QpEndpoint,
    /// Regions the peer may read or write.
    pub regions: Vec<RemoteRegion>,
}

impl PeerInfo {
    /// The text on the wire: a version line, the endpoint, one line per region, an empty line.
    #[must_use]
    pub fn to_wire(&self) -> String {
        let e = &self.endpoint;
        let mut text = format!(
            "ferroce-exchange/{EXCHANGE_VERSION}\nqp qpn=0x{:06x} psn=0x{:06x} addr={}\n",
            e.qpn.value(),
            e.psn.value(),
            e.addr
        );
        for r in &self.regions {
            text.push_str(&format!(
                "region va=0x{:x} rkey=0x{:x} len={}\n",
                r.va, r.rkey, r.len
            ));
        }
        text.push('\n');
        text
    }

    /// Parses a peer's text (up to and including the empty line).
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Version`] for another version, [`ExchangeError::Malformed`] otherwise.
    pub fn parse(text: &str) -> Result<Self, ExchangeError> {
        let bad = |line: &str| ExchangeError::Malformed(line.to_owned());
        let mut lines = text.lines();
        let version_line = lines.next().unwrap_or_default();
        let version = version_line
            .strip_prefix("ferroce-exchange/")
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| bad(version_line))?;
        if version != EXCHANGE_VERSION {
            return Err(ExchangeError::Version {
                ours: EXCHANGE_VERSION,
                theirs: version,
            });
        }
        let field = |line: &str, key: &str| -> Option<String> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('=').map(str::to_owned))
        };
        let hex =
            |v: Option<String>| v.and_then(|v| u64::from_str_radix(v.strip_prefix("0x")?, 16).ok());
        let mut endpoint = None;
        let mut regions = Vec::new();
        for line in lines.take_while(|l| !l.is_empty()) {
            match line.split_whitespace().next() {
                Some("qp") => {
                    let qpn =
                        hex(field(line, "qpn")).and_then(|v| Qpn::new(u32::try_from(v).ok()?));
                    let psn =
                        hex(field(line, "psn")).and_then(|v| Psn::new(u32::try_from(v).ok()?));
                    let addr = field(line, "addr").and_then(|a| a.parse::<SocketAddr>().ok());
                    let (Some(qpn), Some(psn), Some(addr)) = (qpn, psn, addr) else {
                        return Err(bad(line));
                    };
                    endpoint = Some(QpEndpoint { qpn, psn, addr });
                }
                Some("region") => {
                    let va = hex(field(line, "va"));
                    let rkey = hex(field(line, "rkey")).and_then(|v| u32::try_from(v).ok());
                    let len = field(line, "len").and_then(|v| v.parse().ok());
                    let (Some(va), Some(rkey), Some(len)) = (va, rkey, len) else {
                        return Err(bad(line));
                    };
                    regions.push(RemoteRegion { va, rkey, len });
                }
                // Lines a later minor revision may add are skipped.
                _ => {}
            }
        }
        let endpoint = endpoint.ok_or_else(|| bad("no qp line"))?;
        Ok(Self { endpoint, regions })
    }

    /// Exchanges with a peer over `stream`: sends ours, reads theirs (both sides may send
    /// first; TCP buffers the few hundred bytes).
    ///
    /// # Errors
    ///
    /// [`ExchangeError`] for I/O failures, another version or a malformed message.
    pub fn exchange(&self, stream: &mut (impl Read + Write)) -> Result<Self, ExchangeError> {
        stream.write_all(self.to_wire().as_bytes())?;
        stream.flush()?;
        let mut text = Vec::new();
        let mut byte = [0u8; 1];
        // Read up to the empty line that ends the message, and no further.
        while !text.ends_with(b"\n\n") {
            if stream.read(&mut byte)? == 0 {
                return Err(ExchangeError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
            text.push(byte[0]);
            if text.len() > 64 * 1024 {
                return Err(ExchangeError::Malformed(
                    "message longer than 64 KiB".into(),
                ));
            }
        }
        Self::parse(&String::from_utf8_lossy(&text))
    }
}

#[cfg(test)]
mod peer_info_tests {
    use super::*;

    fn info() -> PeerInfo {
        PeerInfo {
            endpoint: QpEndpoint {
                qpn: Qpn::new(0x12).unwrap(),
                psn: Psn::new(0xabcdef).unwrap(),
                addr: "[fd00::2]:4791".parse().unwrap(),
            },
            regions: vec![RemoteRegion {
                va: 0x7f00_0000_1000,
                rkey: 0xdead_beef,
                len: 65_536,
            }],
        }
    }

    #[test]
    fn round_trip_and_version() {
        let info = info();
        assert_eq!(PeerInfo::parse(&info.to_wire()).unwrap(), info);
        let future = info
            .to_wire()
            .replace("ferroce-exchange/1", "ferroce-exchange/2");
        let err = PeerInfo::parse(&future).unwrap_err();
        assert!(err.to_string().contains("version 2"), "{err}");
        assert!(PeerInfo::parse("ferroce-exchange/1\nqp qpn=zz\n\n").is_err());
        assert!(PeerInfo::parse("hello\n\n").is_err());
    }

    #[test]
    fn over_tcp() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut mine = info();
            mine.regions.clear();
            mine.exchange(&mut stream).unwrap()
        });
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let theirs = info().exchange(&mut stream).unwrap();
        assert!(theirs.regions.is_empty());
        assert_eq!(server.join().unwrap(), info());
    }
}
