//! The `exchange` target's checks: the out-of-band endpoint exchanges of `ferroce::exchange`,
//! `PingpongDest` (rdma-core `ibv_rc_pingpong`'s 52-byte `LID:QPN:PSN:GID` message) and
//! `PeerInfo` (ferroce's own versioned lines, which sessions exchange their endpoint and
//! region with).
//!
//! [`check_exchange`] holds each to its contract:
//!
//! - `PingpongDest::parse` of the input: a message that parses is written again by `to_wire`
//!   as 51 ASCII characters and a NUL that parse to the same message; its endpoint is on the
//!   RoCE port and `from_endpoint` gives the message back with LID 0; `receive` from the same
//!   bytes reads the first 52 and agrees with `parse` of them (an I/O error when fewer).
//! - `PeerInfo::parse` of the input as text: a message that parses is written again by
//!   `to_wire`, which ends at its only empty line, and parses to the same message; one refused
//!   for its version names a version other than ours.
//! - `PeerInfo::exchange` with a peer that sends the input: it writes exactly our `to_wire`
//!   and reads up to and including the first empty line (`\n\n`) and no further, at most
//!   64 KiB; what it returns is what `parse` makes of those bytes.
//! - Emit → parse from values the input picks: a `PingpongDest` and a `PeerInfo` (IPv4 or
//!   IPv6 address with a scope, up to four regions) are written and must parse back equal.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use ferroce::exchange::{
    ExchangeError, PeerInfo, PingpongDest, RemoteRegion, EXCHANGE_VERSION, PINGPONG_MSG_LEN,
};
use ferroce::proto::wire::{Qpn, ROCE_PORT};
use ferroce::proto::Psn;
use ferroce::QpEndpoint;

/// The most bytes `PeerInfo::exchange` reads before it gives up.
const MAX_EXCHANGE: usize = 64 * 1024;

/// A peer that sends `input` and keeps what it is sent.
struct Peer<'a> {
    input: &'a [u8],
    read: usize,
    written: Vec<u8>,
}

impl Read for Peer<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.input.len() - self.read);
        buf[..n].copy_from_slice(&self.input[self.read..self.read + n]);
        self.read += n;
        Ok(n)
    }
}

impl Write for Peer<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn check_pingpong(data: &[u8]) {
    if let Ok(dest) = PingpongDest::parse(data) {
        check_pingpong_dest(&dest);
    }
    let mut from = data;
    let received = PingpongDest::receive(&mut from);
    if data.len() < PINGPONG_MSG_LEN {
        assert!(
            matches!(received, Err(ExchangeError::Io(_))),
            "receive from {} bytes: {received:?}",
            data.len()
        );
    } else {
        assert_eq!(
            from.len(),
            data.len() - PINGPONG_MSG_LEN,
            "receive read too much"
        );
        let parsed = PingpongDest::parse(&data[..PINGPONG_MSG_LEN]);
        assert_eq!(received.ok(), parsed.ok(), "receive and parse disagree");
    }
}

fn check_pingpong_dest(dest: &PingpongDest) {
    let wire = dest.to_wire();
    assert_eq!(wire.len(), PINGPONG_MSG_LEN);
    assert_eq!(wire[51], 0, "no NUL at the end: {wire:02x?}");
    assert!(
        wire[..51]
            .iter()
            .all(|&b| b == b':' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "not lower-case hex: {wire:02x?}"
    );
    match PingpongDest::parse(&wire) {
        Ok(back) => assert_eq!(back, *dest, "{wire:02x?}"),
        Err(e) => panic!("to_wire of {dest:?} does not parse: {e}"),
    }
    let _ = dest.to_string();
    let endpoint = dest.endpoint();
    assert_eq!(endpoint.addr.port(), ROCE_PORT);
    assert_eq!((endpoint.qpn, endpoint.psn), (dest.qpn, dest.psn));
    let again = PingpongDest::from_endpoint(&endpoint);
    assert_eq!(again, PingpongDest { lid: 0, ..*dest }, "{endpoint:?}");
}

fn check_peer_info(info: &PeerInfo) {
    let wire = info.to_wire();
    assert!(wire.ends_with("\n\n"), "{wire:?}");
    assert_eq!(
        wire.find("\n\n"),
        Some(wire.len() - 2),
        "an empty line before the end: {wire:?}"
    );
    match PeerInfo::parse(&wire) {
        Ok(back) => assert_eq!(&back, info, "{wire:?}"),
        Err(e) => panic!("to_wire of {info:?} does not parse: {e}"),
    }
}

fn check_parse(text: &str) {
    match PeerInfo::parse(text) {
        Ok(info) => check_peer_info(&info),
        Err(ExchangeError::Version { ours, theirs }) => {
            assert_eq!(ours, EXCHANGE_VERSION);
            assert_ne!(
                theirs, EXCHANGE_VERSION,
                "refused our own version: {text:?}"
            );
        }
        Err(ExchangeError::Malformed(_)) => {}
        Err(e) => panic!("an unexpected error for {text:?}: {e}"),
    }
}

fn check_exchange_with(data: &[u8]) {
    let mine = PeerInfo {
        endpoint: QpEndpoint {
            qpn: Qpn::new(0x11).expect("qpn"),
            psn: Psn::new(0x12_3456).expect("psn"),
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)), ROCE_PORT),
        },
        regions: vec![RemoteRegion {
            va: 0x7f00_0000_1000,
            rkey: 0xdead_beef,
            len: 65_536,
        }],
    };
    let mut peer = Peer {
        input: data,
        read: 0,
        written: Vec::new(),
    };
    let result = mine.exchange(&mut peer);
    assert_eq!(
        peer.written,
        mine.to_wire().as_bytes(),
        "what exchange sent"
    );
    let end = data.windows(2).position(|w| w == b"\n\n").map(|at| at + 2);
    match end {
        Some(end) if end <= MAX_EXCHANGE => {
            assert_eq!(peer.read, end, "exchange read past the empty line");
            let text = String::from_utf8_lossy(&data[..end]);
            let parsed = PeerInfo::parse(&text);
            match (&result, &parsed) {
                (Ok(a), Ok(b)) => assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                _ => panic!("exchange {result:?} and parse {parsed:?} disagree"),
            }
        }
        _ => {
            assert!(result.is_err(), "a message with no end: {result:?}");
            assert!(peer.read <= MAX_EXCHANGE + 1, "read {} bytes", peer.read);
        }
    }
}

/// A `PeerInfo` from the input's bytes (at least 16), for emit → parse.
fn peer_info_from(data: &[u8]) -> PeerInfo {
    let u32_at = |at: usize| {
        let mut b = [0u8; 4];
        for (i, x) in b.iter_mut().enumerate() {
            *x = data.get(at + i).copied().unwrap_or(0);
        }
        u32::from_le_bytes(b)
    };
    let u64_at = |at: usize| u64::from(u32_at(at)) << 32 | u64::from(u32_at(at + 4));
    let port = u32_at(8) as u16;
    let addr = if data[0] & 1 == 0 {
        SocketAddr::new(IpAddr::V4(Ipv4Addr::from(u32_at(12))), port)
    } else {
        let ip = Ipv6Addr::from(u128::from(u64_at(12)) << 64 | u128::from(u32_at(4)));
        let scope = if data[0] & 2 != 0 { u32_at(16) } else { 0 };
        SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope))
    };
    let regions = (0..usize::from(data[1] & 3))
        .map(|i| RemoteRegion {
            va: u64_at(20 + 20 * i),
            rkey: u32_at(28 + 20 * i),
            len: u64_at(32 + 20 * i),
        })
        .collect();
    PeerInfo {
        endpoint: QpEndpoint {
            qpn: Qpn::from_low_bits(u32_at(2)),
            psn: Psn::from_low_bits(u32_at(5)),
            addr,
        },
        regions,
    }
}

/// Runs the `exchange` target's checks on one input.
pub fn check_exchange(data: &[u8]) {
    check_pingpong(data);
    check_parse(&String::from_utf8_lossy(data));
    check_exchange_with(data);
    if data.len() >= 16 {
        let info = peer_info_from(data);
        check_peer_info(&info);
        let dest = PingpongDest {
            lid: u16::from_le_bytes([data[0], data[1]]),
            qpn: info.endpoint.qpn,
            psn: info.endpoint.psn,
            gid: match info.endpoint.addr.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            },
        };
        check_pingpong_dest(&dest);
    }
}
