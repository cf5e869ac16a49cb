//! IPv4/IPv6 + UDP framing around a RoCE packet.
//!
//! A UDP socket sees only addresses and ports; a capture or a raw socket sees whole IP
//! packets. [`IpHeader`] and [`UdpHeader`] hold the fields as values, which is what the ICRC
//! needs in both cases, and [`Datagram`] parses and emits the header bytes of whole packets.
//! RoCEv2 packets carry no IPv4 options and no IPv6 extension headers and are never
//! fragmented; such packets are refused with a typed error.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{be_u16, check_len, Error, ROCE_PORT};

/// The IPv4 header fields of a RoCEv2 packet. Lengths, protocol and checksum follow from the
/// rest and are not stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv4Header {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Identification. Covered by the ICRC: Linux sends 0 on an unconnected socket with
    /// `IP_PMTUDISC_DO`, and the sensor bridge sends 0.
    pub id: u16,
    /// The flags and fragment offset field (covered by the ICRC); [`Ipv4Header::DF`] for
    /// RoCEv2.
    pub flags_fragment: u16,
    /// Type of service (DSCP and ECN); masked out of the ICRC.
    pub tos: u8,
    /// Time to live; masked out of the ICRC.
    pub ttl: u8,
}

impl Ipv4Header {
    /// The header's length: RoCEv2 uses no options.
    pub const LEN: usize = 20;
    /// The Don't Fragment flag in `flags_fragment`.
    pub const DF: u16 = 0x4000;

    /// A header as ferroce sends it from a UDP socket: ID 0, DF, TOS 0, TTL 64.
    #[must_use]
    pub const fn new(src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        Self {
            src,
            dst,
            id: 0,
            flags_fragment: Self::DF,
            tos: 0,
            ttl: 64,
        }
    }
}

/// The IPv6 header fields of a RoCEv2 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Header {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class; masked out of the ICRC.
    pub traffic_class: u8,
    /// Flow label (20 bits); masked out of the ICRC.
    pub flow_label: u32,
    /// Hop limit; masked out of the ICRC.
    pub hop_limit: u8,
}

impl Ipv6Header {
    /// The header's length: RoCEv2 uses no extension headers.
    pub const LEN: usize = 40;

    /// A header with traffic class 0, flow label 0 and hop limit 64.
    #[must_use]
    pub const fn new(src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        Self {
            src,
            dst,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        }
    }
}

/// The IP header of a RoCEv2 packet, either family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpHeader {
    /// IPv4.
    V4(Ipv4Header),
    /// IPv6.
    V6(Ipv6Header),
}

impl IpHeader {
    /// The header for a packet between two addresses of one family, with the defaults of
    /// [`Ipv4Header::new`] or [`Ipv6Header::new`]; `None` when the families differ.
    #[must_use]
    pub fn between(src: IpAddr, dst: IpAddr) -> Option<Self> {
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Some(Self::V4(Ipv4Header::new(s, d))),
            (IpAddr::V6(s), IpAddr::V6(d)) => Some(Self::V6(Ipv6Header::new(s, d))),
            _ => None,
        }
    }

    /// The source address.
    #[must_use]
    pub fn src(&self) -> IpAddr {
        match self {
            Self::V4(h) => h.src.into(),
            Self::V6(h) => h.src.into(),
        }
    }

    /// The destination address.
    #[must_use]
    pub fn dst(&self) -> IpAddr {
        match self {
            Self::V4(h) => h.dst.into(),
            Self::V6(h) => h.dst.into(),
        }
    }

    /// The header's length in bytes (20 or 40).
    #[must_use]
    pub const fn len(&self) -> usize {
        match self {
            Self::V4(_) => Ipv4Header::LEN,
            Self::V6(_) => Ipv6Header::LEN,
        }
    }

    /// Always false: an IP header has a length. Present for the `len`/`is_empty` pair.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        false
    }
}

/// The UDP ports of a RoCEv2 packet. The length follows from the payload, and the checksum
/// is sent as zero (RoCEv2 relies on the ICRC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdpHeader {
    /// Source port; rxe derives it from the QPN to spread flows (0xC000 + a 14-bit hash).
    pub src_port: u16,
    /// Destination port, 4791 unless configured otherwise.
    pub dst_port: u16,
}

impl UdpHeader {
    /// The header's length.
    pub const LEN: usize = 8;

    /// Ports from `src_port` to the RoCEv2 port.
    #[must_use]
    pub const fn to_roce_port(src_port: u16) -> Self {
        Self {
            src_port,
            dst_port: ROCE_PORT,
        }
    }
}

/// A whole IPv4 or IPv6 packet carrying UDP, split into its headers and the UDP payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// The IP header.
    pub ip: IpHeader,
    /// The UDP ports.
    pub udp: UdpHeader,
    /// The UDP checksum as carried (RoCEv2 senders use 0).
    pub udp_checksum: u16,
    /// The UDP payload: for RoCE, the BTH through the ICRC.
    pub payload: &'a [u8],
}

impl<'a> Datagram<'a> {
    /// Parses an IP packet that starts at `bytes[0]`. Bytes past the IP length (Ethernet
    /// padding) are ignored.
    ///
    /// # Errors
    ///
    /// [`Error::IpVersion`], [`Error::Ipv4Options`], [`Error::Fragment`], [`Error::NotUdp`],
    /// [`Error::Truncated`] and [`Error::Length`] describe what is wrong with the headers.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, Error> {
        check_len("IP header", bytes, 1)?;
        match bytes[0] >> 4 {
            4 => Self::parse_v4(bytes),
            6 => Self::parse_v6(bytes),
            v => Err(Error::IpVersion(v)),
        }
    }

    fn parse_v4(bytes: &'a [u8]) -> Result<Self, Error> {
        check_len("IPv4 header", bytes, Ipv4Header::LEN)?;
        let ihl = bytes[0] & 0x0f;
        if ihl != 5 {
            return Err(Error::Ipv4Options(ihl));
        }
        let total = usize::from(be_u16(bytes, 2));
        if total < Ipv4Header::LEN + UdpHeader::LEN || total > bytes.len() {
            return Err(Error::Length {
                what: "IPv4 total length",
                claimed: total,
                actual: bytes.len(),
            });
        }
        let flags_fragment = be_u16(bytes, 6);
        // More Fragments set, or a non-zero offset.
        if flags_fragment & 0x3fff != 0 {
            return Err(Error::Fragment(flags_fragment));
        }
        if bytes[9] != 17 {
            return Err(Error::NotUdp(bytes[9]));
        }
        let octets =
            |at: usize| Ipv4Addr::new(bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]);
        let ip = IpHeader::V4(Ipv4Header {
            src: octets(12),
            dst: octets(16),
            id: be_u16(bytes, 4),
            flags_fragment,
            tos: bytes[1],
            ttl: bytes[8],
        });
        Self::parse_udp(ip, &bytes[Ipv4Header::LEN..total])
    }

    fn parse_v6(bytes: &'a [u8]) -> Result<Self, Error> {
        check_len("IPv6 header", bytes, Ipv6Header::LEN)?;
        let payload_len = usize::from(be_u16(bytes, 4));
        if bytes[6] != 17 {
            return Err(Error::NotUdp(bytes[6]));
        }
        if payload_len < UdpHeader::LEN || Ipv6Header::LEN + payload_len > bytes.len() {
            return Err(Error::Length {
                what: "IPv6 payload length",
                claimed: payload_len,
                actual: bytes.len() - Ipv6Header::LEN,
            });
        }
        let addr = |at: usize| {
            let mut octets = [0; 16];
            octets.copy_from_slice(&bytes[at..at + 16]);
            Ipv6Addr::from(octets)
        };
        let word = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let ip = IpHeader::V6(Ipv6Header {
            src: addr(8),
            dst: addr(24),
            traffic_class: (word >> 20) as u8,
            flow_label: word & 0x000f_ffff,
            hop_limit: bytes[7],
        });
        Self::parse_udp(ip, &bytes[Ipv6Header::LEN..Ipv6Header::LEN + payload_len])
    }

    /// Parses the UDP header at the start of `ip_payload`, which is exactly the IP payload.
    fn parse_udp(ip: IpHeader, ip_payload: &'a [u8]) -> Result<Self, Error> {
        check_len("UDP header", ip_payload, UdpHeader::LEN)?;
        let udp_len = usize::from(be_u16(ip_payload, 4));
        if udp_len != ip_payload.len() {
            return Err(Error::Length {
                what: "UDP length",
                claimed: udp_len,
                actual: ip_payload.len(),
            });
        }
        Ok(Self {
            ip,
            udp: UdpHeader {
                src_port: be_u16(ip_payload, 0),
                dst_port: be_u16(ip_payload, 2),
            },
            udp_checksum: be_u16(ip_payload, 6),
            payload: &ip_payload[UdpHeader::LEN..],
        })
    }

    /// Writes the IP and UDP headers for a UDP payload of `payload_len` bytes into `out` and
    /// returns their length (28 or 48); the payload goes right after. The IPv4 header
    /// checksum is computed; the UDP checksum is zero, as RoCEv2 sends it.
    ///
    /// # Errors
    ///
    /// [`Error::BufferTooSmall`] when `out` is shorter than the headers, [`Error::Length`]
    /// when the payload is too long for one IP packet.
    pub fn emit_headers(
        ip: &IpHeader,
        udp: &UdpHeader,
        payload_len: usize,
        out: &mut [u8],
    ) -> Result<usize, Error> {
        let header_len = ip.len() + UdpHeader::LEN;
        if out.len() < header_len {
            return Err(Error::BufferTooSmall {
                needed: header_len,
                available: out.len(),
            });
        }
        let udp_len = UdpHeader::LEN + payload_len;
        let ip_total = match ip {
            IpHeader::V4(_) => Ipv4Header::LEN + udp_len,
            IpHeader::V6(_) => udp_len,
        };
        let too_long = Error::Length {
            what: "IP packet length",
            claimed: ip_total,
            actual: usize::from(u16::MAX),
        };
        let ip_total = u16::try_from(ip_total).map_err(|_| too_long)?;
        match ip {
            IpHeader::V4(h) => {
                let o = &mut out[..Ipv4Header::LEN];
                o[0] = 0x45;
                o[1] = h.tos;
                o[2..4].copy_from_slice(&ip_total.to_be_bytes());
                o[4..6].copy_from_slice(&h.id.to_be_bytes());
                o[6..8].copy_from_slice(&h.flags_fragment.to_be_bytes());
                o[8] = h.ttl;
                o[9] = 17;
                o[10..12].fill(0);
                o[12..16].copy_from_slice(&h.src.octets());
                o[16..20].copy_from_slice(&h.dst.octets());
                let sum = ipv4_checksum(o);
                o[10..12].copy_from_slice(&sum.to_be_bytes());
            }
            IpHeader::V6(h) => {
                let o = &mut out[..Ipv6Header::LEN];
                let word =
                    (6 << 28) | (u32::from(h.traffic_class) << 20) | (h.flow_label & 0xf_ffff);
                o[0..4].copy_from_slice(&word.to_be_bytes());
                o[4..6].copy_from_slice(&ip_total.to_be_bytes());
                o[6] = 17;
                o[7] = h.hop_limit;
                o[8..24].copy_from_slice(&h.src.octets());
                o[24..40].copy_from_slice(&h.dst.octets());
            }
        }
        let u = &mut out[ip.len()..header_len];
        u[0..2].copy_from_slice(&udp.src_port.to_be_bytes());
        u[2..4].copy_from_slice(&udp.dst_port.to_be_bytes());
        // `udp_len` fits: it is at most `ip_total`, which fitted in 16 bits.
        u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        u[6..8].fill(0);
        Ok(header_len)
    }
}

/// The ones'-complement sum of an IPv4 header whose checksum field is zero.
fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|pair| u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_checksum_matches_a_real_header() {
        // The ConnectX-4 Lx CNP header from scapy's RoCE tests: checksum 0x9161.
        let mut header = [
            0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0x0a, 0x00,
            0x11, 0x01, 0x0a, 0x00, 0x12, 0x01,
        ];
        assert_eq!(ipv4_checksum(&header), 0x9161);
        header[10..12].copy_from_slice(&0x9161u16.to_be_bytes());
        assert_eq!(ipv4_checksum(&header), 0);
    }

    #[test]
    fn refuses_what_roce_never_sends() {
        let ip = IpHeader::V4(Ipv4Header::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into()));
        let mut buf = [0u8; 64];
        let n = Datagram::emit_headers(&ip, &UdpHeader::to_roce_port(1), 16, &mut buf).unwrap();
        let good = &buf[..n + 16];
        assert!(Datagram::parse(good).is_ok());

        let mut options = good.to_vec();
        options[0] = 0x46;
        assert_eq!(Datagram::parse(&options), Err(Error::Ipv4Options(6)));
        let mut fragment = good.to_vec();
        fragment[6] = 0x20;
        assert!(matches!(
            Datagram::parse(&fragment),
            Err(Error::Fragment(_))
        ));
        let mut tcp = good.to_vec();
        tcp[9] = 6;
        assert_eq!(Datagram::parse(&tcp), Err(Error::NotUdp(6)));
        assert!(matches!(
            Datagram::parse(&good[..30]),
            Err(Error::Length { .. })
        ));
        assert_eq!(Datagram::parse(&[0x50]), Err(Error::IpVersion(5)));
    }
}
