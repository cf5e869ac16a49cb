//! The invariant CRC that ends every RoCEv2 packet (IBTA annex A17.3.3, Linux `rxe_icrc.c`).
//!
//! The ICRC is the CRC-32 of zlib (reflected polynomial 0xEDB88320, initial value and final
//! XOR 0xFFFFFFFF) over:
//!
//! 1. eight 0xFF bytes standing for the masked InfiniBand LRH;
//! 2. the IP header with the fields routers may change masked to ones: IPv4 TOS, TTL and
//!    header checksum; IPv6 traffic class, flow label and hop limit. The IPv4 ID and flags
//!    **are** covered;
//! 3. the UDP header with its checksum masked to ones;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) masked to ones;
//! 5. the extension headers, payload and pad.
//!
//! The 32-bit result is appended little-endian. The IP and UDP fields come in as values
//! ([`IpHeader`], [`UdpHeader`]) because a UDP socket never sees the header bytes; for a whole
//! captured packet parse it with [`super::Datagram::parse`] first. The CRC itself runs on
//! `crc32fast`, which uses the CPU's carry-less multiply (PCLMULQDQ, or PMULL on aarch64), or
//! on the `crc` crate's slice-by-16 tables where those run faster: under an emulator that
//! translates each carry-less multiply into a call (QEMU's TCG, as in a guest without KVM or
//! an amd64 container on an arm64 host), the table loop's plain loads and XORs run about
//! twice as fast. This crate reads no clock: the soft NIC times both ([`crc32_on`]) when it
//! starts and says which to use ([`set_crc_implementation`]); until then it is `crc32fast`.

use super::packet::ICRC_LEN;
use super::{Bth, Error, IpHeader, UdpHeader};

/// The longest run of masked headers after the LRH stand-in: IPv6 40 + UDP 8 + BTH 12 bytes.
const PREFIX_MAX: usize = 40 + 8 + Bth::LEN;

/// The most bytes after the BTH that are copied behind the masked headers to be covered in
/// one pass with them.
const SHORT_REST: usize = 64;

/// The CRC-32 of the eight 0xFF bytes that stand for the masked LRH, i.e.
/// `crc32fast::hash(&[0xff; 8])`: every ICRC starts from this state.
const LRH_CRC: u32 = 0x2144_df1c;

/// A hasher in the state after the LRH stand-in. `crc32fast` looks up the CPU's features each
/// time it makes a hasher (about 40 instructions, four times a round trip); a clone of one made
/// once does not.
fn lrh_hasher() -> Crc {
    match crc_implementation() {
        CrcImplementation::Crc32fast => {
            static LRH: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
            Crc::Crc32fast(
                LRH.get_or_init(|| crc32fast::Hasher::new_with_initial(LRH_CRC))
                    .clone(),
            )
        }
        // A table digest is its register: nothing to look up.
        CrcImplementation::Tables => Crc::resume_on(CrcImplementation::Tables, LRH_CRC),
    }
}

/// zlib's CRC-32 by slice-by-16 tables (16 KiB, built at compile time).
static TABLES: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISO_HDLC);

/// How the ICRC's CRC-32 is computed ([`set_crc_implementation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrcImplementation {
    /// `crc32fast`: the CPU's carry-less multiply where it has one, its own tables where not.
    Crc32fast,
    /// The `crc` crate's slice-by-16 tables: chosen where they ran faster than `crc32fast`,
    /// which is where the carry-less multiply is emulated.
    Tables,
}

/// A CRC-32 in progress (zlib's), on the implementation this machine runs fastest.
#[derive(Clone)]
pub(crate) enum Crc {
    Crc32fast(crc32fast::Hasher),
    Tables(crc::Digest<'static, u32, crc::Table<16>>),
}

/// Whether every ICRC from now on runs on the tables rather than `crc32fast`.
static TABLES_CHOSEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Crc {
    /// The CRC of bytes already covered, `crc` (a finished CRC-32), to go on from.
    fn resume(crc: u32) -> Self {
        Self::resume_on(crc_implementation(), crc)
    }

    fn resume_on(implementation: CrcImplementation, crc: u32) -> Self {
        match implementation {
            CrcImplementation::Crc32fast => {
                Self::Crc32fast(crc32fast::Hasher::new_with_initial(crc))
            }
            // The digest takes its register unreflected, and a finished CRC is the register
            // inverted (the final XOR).
            CrcImplementation::Tables => {
                Self::Tables(TABLES.digest_with_initial((!crc).reverse_bits()))
            }
        }
    }

    fn update(&mut self, bytes: &[u8]) {
        match self {
            Self::Crc32fast(h) => h.update(bytes),
            Self::Tables(d) => d.update(bytes),
        }
    }

    fn finalize(self) -> u32 {
        match self {
            Self::Crc32fast(h) => h.finalize(),
            Self::Tables(d) => d.finalize(),
        }
    }
}

/// zlib's CRC-32 of `bytes` on `implementation`, whatever the ICRC uses: for a caller that
/// times the two to choose ([`set_crc_implementation`]).
#[must_use]
pub fn crc32_on(implementation: CrcImplementation, bytes: &[u8]) -> u32 {
    match implementation {
        CrcImplementation::Crc32fast => crc32fast::hash(bytes),
        CrcImplementation::Tables => TABLES.checksum(bytes),
    }
}

/// Makes every ICRC computed from now on, in this process, run on `implementation`. Both give
/// the same CRCs; only their speed differs, so a change while packets are being sealed or
/// checked is harmless. The soft NIC sets the faster one when it starts.
pub fn set_crc_implementation(implementation: CrcImplementation) {
    TABLES_CHOSEN.store(
        implementation == CrcImplementation::Tables,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The implementation the ICRC runs on ([`set_crc_implementation`]; `crc32fast` until set).
#[must_use]
pub fn crc_implementation() -> CrcImplementation {
    if TABLES_CHOSEN.load(std::sync::atomic::Ordering::Relaxed) {
        CrcImplementation::Tables
    } else {
        CrcImplementation::Crc32fast
    }
}

/// Computes the ICRC of a packet whose bytes from the BTH up to (not including) the ICRC are
/// `covered`.
///
/// The IP and UDP length fields are derived from `covered.len()`, as the packet on the wire
/// would carry them. `covered` must hold at least the 12-byte BTH.
///
/// # Errors
///
/// [`Error::Truncated`] when `covered` is shorter than a BTH, [`Error::Length`] when the
/// packet would not fit in one IP packet.
pub fn compute(ip: &IpHeader, udp: &UdpHeader, covered: &[u8]) -> Result<u32, Error> {
    compute_gathered(ip, udp, covered, &[])
}

/// Computes the ICRC of a packet whose covered bytes are `headers` (starting with the BTH)
/// followed by each slice of `rest` in turn: a sender that gathers a packet from its headers
/// and a payload in registered memory computes the ICRC without copying them together.
///
/// # Errors
///
/// As [`compute`].
pub fn compute_gathered(
    ip: &IpHeader,
    udp: &UdpHeader,
    headers: &[u8],
    rest: &[&[u8]],
) -> Result<u32, Error> {
    let total = headers.len() + rest.iter().map(|r| r.len()).sum::<usize>();
    let mut crc = headers_crc(ip, udp, headers, total)?;
    for part in rest {
        crc.update(part);
    }
    Ok(crc.finalize())
}

/// Computes the ICRC of a packet whose covered bytes are `headers` (starting with the BTH), a
/// payload of which only the CRC-32 is given (`payload_crc`, as `crc32fast::hash` computes it,
/// `payload.len()` bytes long), and `trailer` (the pad). A sender that needs the CRC of its data
/// anyway (a sensor bridge puts the frame's CRC in its metadata) reads each byte once.
///
/// # Errors
///
/// As [`compute`].
pub fn compute_with_payload_crc(
    ip: &IpHeader,
    udp: &UdpHeader,
    headers: &[u8],
    payload_crc: u32,
    payload: &CrcShift,
    trailer: &[u8],
) -> Result<u32, Error> {
    let total = headers.len() + payload.len + trailer.len();
    let head = headers_crc(ip, udp, headers, total)?.finalize();
    let mut crc = Crc::resume(payload.combine(head, payload_crc));
    crc.update(trailer);
    Ok(crc.finalize())
}

/// Appending bytes whose CRC-32 is known to a CRC-32 computed so far (zlib's
/// `crc32_combine`), for a fixed length of appended bytes: the shift is computed once, and each
/// combination is one carry-less multiplication.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrcShift {
    /// x^(8·len), reflected.
    by: u32,
    len: usize,
}

impl CrcShift {
    /// The shift past `len` bytes.
    #[must_use]
    pub const fn new(len: usize) -> Self {
        Self {
            by: gf2::pow(gf2::ONE >> 1, 8 * len as u64),
            len,
        }
    }

    /// How many bytes it shifts past.
    #[must_use]
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether it shifts past nothing.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CRC-32 of A ‖ B from the CRC-32 of A and that of B, B being this shift's length.
    #[must_use]
    pub const fn combine(&self, crc_a: u32, crc_b: u32) -> u32 {
        gf2::mul(self.by, crc_a) ^ crc_b
    }
}

/// The CRC state after the masked LRH, IP, UDP and BTH headers and the rest of `headers`, for a
/// packet of `total` covered bytes (BTH up to the ICRC).
fn headers_crc(ip: &IpHeader, udp: &UdpHeader, headers: &[u8], total: usize) -> Result<Crc, Error> {
    let covered = headers;
    super::check_len("BTH", covered, Bth::LEN)?;
    let udp_len = UdpHeader::LEN + total + ICRC_LEN;
    let ip_len = match ip {
        IpHeader::V4(_) => 20 + udp_len,
        IpHeader::V6(_) => udp_len,
    };
    let ip_len = u16::try_from(ip_len).map_err(|_| Error::Length {
        what: "IP packet length",
        claimed: ip_len,
        actual: usize::from(u16::MAX),
    })?;
    // Both fit: `udp_len` is at most `ip_len`.
    let udp_len = udp_len as u16;

    // The masked headers; masked bytes stay 0xFF.
    let mut prefix = [0xffu8; PREFIX_MAX + SHORT_REST];
    let mut at = 0;
    match ip {
        IpHeader::V4(h) => {
            let p = &mut prefix[at..at + 20];
            p[0] = 0x45;
            // p[1]: TOS, masked.
            p[2..4].copy_from_slice(&ip_len.to_be_bytes());
            p[4..6].copy_from_slice(&h.id.to_be_bytes());
            p[6..8].copy_from_slice(&h.flags_fragment.to_be_bytes());
            // p[8]: TTL, masked.
            p[9] = 17;
            // p[10..12]: header checksum, masked.
            p[12..16].copy_from_slice(&h.src.octets());
            p[16..20].copy_from_slice(&h.dst.octets());
            at += 20;
        }
        IpHeader::V6(h) => {
            let p = &mut prefix[at..at + 40];
            // Version 6, then traffic class and flow label all ones.
            p[0..4].copy_from_slice(&[0x6f, 0xff, 0xff, 0xff]);
            p[4..6].copy_from_slice(&ip_len.to_be_bytes());
            p[6] = 17;
            // p[7]: hop limit, masked.
            p[8..24].copy_from_slice(&h.src.octets());
            p[24..40].copy_from_slice(&h.dst.octets());
            at += 40;
        }
    }
    let u = &mut prefix[at..at + 8];
    u[0..2].copy_from_slice(&udp.src_port.to_be_bytes());
    u[2..4].copy_from_slice(&udp.dst_port.to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    // u[6..8]: UDP checksum, masked.
    at += 8;
    prefix[at..at + Bth::LEN].copy_from_slice(&covered[..Bth::LEN]);
    prefix[at + 4] = 0xff;
    at += Bth::LEN;

    let mut crc = lrh_hasher();
    let rest = &covered[Bth::LEN..];
    if rest.len() <= SHORT_REST {
        // One pass over a short packet's few remaining bytes with the headers: the CRC's
        // setup and tail are paid once (an ACK, a small WRITE).
        prefix[at..at + rest.len()].copy_from_slice(rest);
        crc.update(&prefix[..at + rest.len()]);
    } else {
        crc.update(&prefix[..at]);
        crc.update(rest);
    }
    Ok(crc)
}

/// Computes the ICRC of `packet` (BTH through the 4-byte ICRC slot) and writes it into the
/// last four bytes, little-endian.
///
/// # Errors
///
/// As [`compute`]; [`Error::Truncated`] when `packet` cannot hold a BTH and an ICRC.
pub fn seal(ip: &IpHeader, udp: &UdpHeader, packet: &mut [u8]) -> Result<(), Error> {
    super::check_len("RoCE packet", packet, Bth::LEN + ICRC_LEN)?;
    let end = packet.len() - ICRC_LEN;
    let icrc = compute(ip, udp, &packet[..end])?;
    packet[end..].copy_from_slice(&icrc.to_le_bytes());
    Ok(())
}

/// Seals a packet whose payload is not in `packet`: `packet` holds its headers (the first
/// `at` bytes, from the BTH), then its pad and the 4-byte ICRC slot, and the `body_len` bytes
/// that go between them on the wire are shown to `body`'s callback in order (a sender that
/// hands the kernel the payload where it lies computes the ICRC without copying it in).
///
/// # Errors
///
/// As [`seal`]; [`Error::Truncated`] also when `at` lies past the ICRC slot.
pub fn seal_around(
    ip: &IpHeader,
    udp: &UdpHeader,
    packet: &mut [u8],
    at: usize,
    body_len: usize,
    body: impl FnOnce(&mut dyn FnMut(&[u8])),
) -> Result<(), Error> {
    super::check_len("RoCE packet", packet, Bth::LEN + ICRC_LEN)?;
    let end = packet.len() - ICRC_LEN;
    super::check_len("RoCE packet", packet, at + ICRC_LEN)?;
    let mut crc = headers_crc(ip, udp, &packet[..at], end + body_len)?;
    body(&mut |piece| crc.update(piece));
    crc.update(&packet[at..end]);
    let icrc = crc.finalize();
    packet[end..].copy_from_slice(&icrc.to_le_bytes());
    Ok(())
}

/// Whether the ICRC at the end of `packet` (BTH through ICRC) is right for these headers.
/// Bytes too short to hold a BTH and an ICRC never verify.
#[must_use]
#[inline]
pub fn verify(ip: &IpHeader, udp: &UdpHeader, packet: &[u8]) -> bool {
    if packet.len() < Bth::LEN + ICRC_LEN {
        return false;
    }
    let end = packet.len() - ICRC_LEN;
    let mut carried = [0; 4];
    carried.copy_from_slice(&packet[end..]);
    compute(ip, udp, &packet[..end]) == Ok(u32::from_le_bytes(carried))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Datagram, Ipv6Header};

    /// A packet's ICRC is the same whichever implementation computes it, and the choice holds
    /// for every ICRC after it (other tests may run meanwhile: they compute the same CRCs).
    #[test]
    fn the_icrc_is_the_same_on_either_implementation() {
        let ip =
            IpHeader::between("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()).unwrap();
        let udp = UdpHeader {
            src_port: 49152,
            dst_port: 4791,
        };
        let covered: Vec<u8> = (0..1500u32).map(|i| (i * 37) as u8).collect();
        let with = |imp| {
            set_crc_implementation(imp);
            assert_eq!(crc_implementation(), imp);
            let bytes = (
                compute(&ip, &udp, &covered[..12]),
                compute(&ip, &udp, &covered),
            );
            assert_eq!(crc32_on(imp, &covered), crc32fast::hash(&covered));
            bytes
        };
        let tables = with(CrcImplementation::Tables);
        let fast = with(CrcImplementation::Crc32fast);
        assert_eq!(tables, fast);
    }

    /// Both implementations go on from a finished CRC-32 to that of the longer run, for runs
    /// shorter and longer than a table step (16 bytes) and a carry-less multiply's fold.
    #[test]
    fn both_crc_implementations_resume_to_zlibs_crc() {
        let data: Vec<u8> = (0..3000u32).map(|i| ((i * 7919) >> 5) as u8).collect();
        for imp in [CrcImplementation::Crc32fast, CrcImplementation::Tables] {
            for (a, b) in [(0, 0), (0, 5), (8, 1), (13, 64), (100, 1000), (1, 2999)] {
                let mut crc = Crc::resume_on(imp, crc32fast::hash(&data[..a]));
                crc.update(&data[a..a + b / 2]);
                crc.update(&data[a + b / 2..a + b]);
                assert_eq!(
                    crc.finalize(),
                    crc32fast::hash(&data[..a + b]),
                    "{imp:?} {a}+{b}"
                );
            }
        }
    }

    #[test]
    fn lrh_stand_in_crc() {
        assert_eq!(crc32fast::hash(&[0xff; 8]), LRH_CRC);
    }

    /// IPv4 and UDP headers between two test hosts.
    fn headers() -> (IpHeader, UdpHeader) {
        let ip = IpHeader::V4(crate::wire::Ipv4Header::new(
            [10, 0, 0, 1].into(),
            [10, 0, 0, 2].into(),
        ));
        let udp = UdpHeader {
            src_port: 12288,
            dst_port: 4791,
        };
        (ip, udp)
    }

    #[test]
    fn a_packet_sealed_around_its_body_has_the_icrc_of_the_whole() {
        let (ip, udp) = headers();
        // Headers, a 251-byte body, a pad of 1 and the ICRC slot.
        let mut whole: Vec<u8> = (0..28 + 251 + 1 + 4).map(|i: u32| (i * 13) as u8).collect();
        seal(&ip, &udp, &mut whole).unwrap();
        let (at, end) = (28, 28 + 251);
        let body = whole[at..end].to_vec();
        let mut rest = [&whole[..at], &whole[end..]].concat();
        let n = rest.len();
        rest[n - ICRC_LEN..].fill(0);
        seal_around(&ip, &udp, &mut rest, at, body.len(), |seen| {
            // Shown in pieces, as a region's lock shows them.
            for piece in body.chunks(100) {
                seen(piece);
            }
        })
        .unwrap();
        assert_eq!(rest[n - ICRC_LEN..], whole[whole.len() - ICRC_LEN..]);
        // Headers that end past the ICRC slot are refused, not read.
        let mut short = [0u8; 20];
        assert!(seal_around(&ip, &udp, &mut short, 18, 0, |_| {}).is_err());
    }

    #[test]
    fn a_gathered_packet_has_the_icrc_of_the_whole() {
        let (ip, udp) = headers();
        let whole: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        let want = compute(&ip, &udp, &whole).unwrap();
        for split in [12, 28, 100] {
            let (head, rest) = whole.split_at(split);
            let (a, b) = rest.split_at(rest.len() / 3);
            assert_eq!(compute_gathered(&ip, &udp, head, &[a, b]).unwrap(), want);
        }
        assert!(compute_gathered(&ip, &udp, &whole[..8], &[&whole[8..]]).is_err());
    }

    #[test]
    fn short_packets_covered_in_one_pass_have_the_icrc_of_two() {
        let (ip, udp) = headers();
        let whole: Vec<u8> = (0..Bth::LEN as u32 + 2 * SHORT_REST as u32)
            .map(|i| (i * 13) as u8)
            .collect();
        // Gathered behind the BTH alone, the rest is always a pass of its own.
        for len in Bth::LEN..whole.len() {
            let (bth, rest) = whole[..len].split_at(Bth::LEN);
            assert_eq!(
                compute(&ip, &udp, &whole[..len]).unwrap(),
                compute_gathered(&ip, &udp, bth, &[rest]).unwrap(),
                "{len} bytes"
            );
        }
    }

    #[test]
    fn combined_crcs_equal_the_crc_of_the_whole() {
        let data: Vec<u8> = (0..9000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (a, b) in [(0, 10), (1, 4096), (100, 1), (4000, 4096), (777, 0)] {
            let whole = crc32fast::hash(&data[..a + b]);
            let shift = CrcShift::new(b);
            let (ca, cb) = (
                crc32fast::hash(&data[..a]),
                crc32fast::hash(&data[a..a + b]),
            );
            assert_eq!(shift.combine(ca, cb), whole, "{a} + {b}");
        }
        let (ip, udp) = headers();
        let (head, rest) = data[..1300].split_at(28);
        let (payload, pad) = rest.split_at(1269);
        let want = compute_gathered(&ip, &udp, head, &[payload, pad]).unwrap();
        let got = compute_with_payload_crc(
            &ip,
            &udp,
            head,
            crc32fast::hash(payload),
            &CrcShift::new(payload.len()),
            pad,
        );
        assert_eq!(got, Ok(want));
    }

    pub(super) fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(char::is_ascii_hexdigit).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// A CNP captured from a ConnectX-4 Lx (scapy's RoCE tests), ICRC bytes `82 fd 00 2a`.
    #[test]
    fn connectx_vector() {
        let frame = hex(
            "45c2003c718c400040119161 0a001101 0a001201 000012b7 00280000
             8100ffff 40000118 00000000 00000000000000000000000000000000 82fd002a",
        );
        let d = Datagram::parse(&frame).unwrap();
        assert_eq!(d.udp.dst_port, 4791);
        assert!(verify(&d.ip, &d.udp, d.payload));
        let covered = &d.payload[..d.payload.len() - 4];
        assert_eq!(compute(&d.ip, &d.udp, covered), Ok(0x2a00_fd82));
    }

    /// The self-computed vector of protocol.md §2: WRITE_ONLY "hello", ID 0.
    #[test]
    fn write_only_hello_vector() {
        let frame = hex("4500004400004000401126a70a0000010a000002 df9412b700300000
             0a30ffff000000128000010000007f0000001000000005170000000568656c6c6f000000 4e33c4b7");
        let d = Datagram::parse(&frame).unwrap();
        assert!(verify(&d.ip, &d.udp, d.payload));
    }

    /// IPv6: an RC SEND ONLY with traffic class 0x12, flow label 0xabcde and hop limit 7,
    /// whose ICRC was computed independently (Python's zlib over the header bytes masked as
    /// the recipe says, not from field values as here).
    #[test]
    fn ipv6_vector() {
        let frame = hex(
            "612abcde00201107 fd000000000000000000000000000001 fd000000000000000000000000000002
             c12312b700200000 0400ffff0000001180000102 666572726f636521 57e726da",
        );
        let d = Datagram::parse(&frame).unwrap();
        let IpHeader::V6(v6) = d.ip else {
            panic!("IPv6")
        };
        assert_eq!(
            (v6.traffic_class, v6.flow_label, v6.hop_limit),
            (0x12, 0xabcde, 7)
        );
        assert!(verify(&d.ip, &d.udp, d.payload));
        let covered = &d.payload[..d.payload.len() - 4];
        assert_eq!(compute(&d.ip, &d.udp, covered), Ok(0xda26_e757));
        // Traffic class, flow label and hop limit are masked; the addresses are not.
        let other = IpHeader::V6(Ipv6Header {
            traffic_class: 0,
            flow_label: 1,
            hop_limit: 64,
            ..v6
        });
        assert!(verify(&other, &d.udp, d.payload));
        let moved = IpHeader::V6(Ipv6Header { dst: v6.src, ..v6 });
        assert!(!verify(&moved, &d.udp, d.payload));
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let frame = hex(
            "45c2003c718c400040119161 0a001101 0a001201 000012b7 00280000
             8100ffff 40000118 00000000 00000000000000000000000000000000 82fd002a",
        );
        let d = Datagram::parse(&frame).unwrap();
        let IpHeader::V4(mut v4) = d.ip else { panic!() };
        v4.tos = 0;
        v4.ttl = 1;
        let mut packet = d.payload.to_vec();
        packet[4] = 0xc0; // FECN and BECN
        assert!(verify(&IpHeader::V4(v4), &d.udp, &packet));
        v4.id ^= 1;
        assert!(!verify(&IpHeader::V4(v4), &d.udp, &packet));
    }
}

/// CRC-32 polynomial arithmetic modulo P in zlib's reflected representation (bit 31 is the
/// coefficient of x^0), for reasoning about how the ICRC changes when bytes change.
mod gf2 {
    /// The CRC-32 polynomial, reflected.
    const POLY: u32 = 0xedb8_8320;
    /// x^0.
    pub(super) const ONE: u32 = 1 << 31;

    /// a·b mod P.
    pub(super) const fn mul(a: u32, mut b: u32) -> u32 {
        let mut m = ONE;
        let mut p = 0;
        while m != 0 {
            if a & m != 0 {
                p ^= b;
            }
            m >>= 1;
            b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        }
        p
    }

    /// base^n mod P.
    pub(super) const fn pow(mut base: u32, mut n: u64) -> u32 {
        let mut p = ONE;
        while n != 0 {
            if n & 1 != 0 {
                p = mul(p, base);
            }
            base = mul(base, base);
            n >>= 1;
        }
        p
    }

    /// x^-1 mod P: P's constant term is 1, so x·((P − 1)/x) ≡ 1.
    pub(super) const X_INV: u32 = ((POLY & 0x7fff_ffff) << 1) | 1;

    /// The raw CRC register (zero initial value, no final XOR) after the two bytes `[hi, lo]`.
    pub(super) const fn raw2(hi: u8, lo: u8) -> u32 {
        let mut reg = (hi as u32) | ((lo as u32) << 8);
        let mut i = 0;
        while i < 16 {
            reg = if reg & 1 != 0 {
                (reg >> 1) ^ POLY
            } else {
                reg >> 1
            };
            i += 1;
        }
        reg
    }

    /// A reduced basis for solving `raw2(id) = t` for the 16-bit `id`: rows of (pivot bit,
    /// row, the id bits that produce it), each pivot cleared from every other row.
    pub(super) const BASIS: [(u32, u32, u16); 16] = {
        let mut rows = [(0u32, 0u32, 0u16); 16];
        let mut b = 0;
        while b < 16 {
            let id = 1u16 << b;
            rows[b] = (0, raw2((id >> 8) as u8, id as u8), id);
            b += 1;
        }
        let mut r = 0;
        while r < 16 {
            // Pivot on the row's highest set bit, then clear it from every other row.
            let pivot = 1u32 << (31 - rows[r].1.leading_zeros());
            rows[r].0 = pivot;
            let mut o = 0;
            while o < 16 {
                if o != r && rows[o].1 & pivot != 0 {
                    rows[o].1 ^= rows[r].1;
                    rows[o].2 ^= rows[r].2;
                }
                o += 1;
            }
            r += 1;
        }
        rows
    };
}

/// Recovers the IPv4 identification a packet was sent with, from its ICRC alone.
///
/// A UDP socket does not show the IP ID, and the ICRC covers it: Linux rxe and RoCE NICs send
/// non-zero IDs. CRC-32 is linear, so the carried ICRC XOR the ICRC computed with ID 0 depends
/// only on the ID and the packet's length; solving for the 16-bit ID leaves the other 16 bits
/// of the difference as a check. Returns the ID when one explains the ICRC (a corrupted
/// packet passes with probability 2^-16), `None` otherwise. `ip.id` is ignored.
#[must_use]
pub fn recover_ipv4_id(ip: &super::Ipv4Header, udp: &UdpHeader, packet: &[u8]) -> Option<u16> {
    match check_ipv4(&super::Ipv4Header { id: 0, ..*ip }, udp, packet) {
        Ipv4Check::Matches => Some(0),
        Ipv4Check::SentWithId(id) => Some(id),
        Ipv4Check::Bad => None,
    }
}

/// x^-8·`tail` mod P: what takes a change of the CRC back over the `tail` bytes that followed
/// it. Its power costs some 30 bit-serial multiplications, six to seven times a CRC pass over
/// a 1 KiB packet, so the last length's is kept: a stream's packets mostly share one. One word holds
/// the length and the factor, so that threads share it without a lock.
fn unshift(tail: usize) -> u32 {
    use std::sync::atomic::{AtomicU64, Ordering};
    /// The last `tail` (high half; `u32::MAX` for none yet) and its factor (low half).
    static LAST: AtomicU64 = AtomicU64::new(u64::MAX);
    let Ok(key) = u32::try_from(tail) else {
        return gf2::pow(gf2::X_INV, 8 * tail as u64);
    };
    let last = LAST.load(Ordering::Relaxed);
    if (last >> 32) as u32 == key && key != u32::MAX {
        return last as u32;
    }
    let factor = gf2::pow(gf2::X_INV, 8 * u64::from(key));
    LAST.store(u64::from(key) << 32 | u64::from(factor), Ordering::Relaxed);
    factor
}

/// What an IPv4 packet's ICRC says ([`check_ipv4`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv4Check {
    /// The ICRC is right for the headers as given, their IP ID included.
    Matches,
    /// The ICRC is right for the headers with this IP ID in place of the one given.
    SentWithId(u16),
    /// No IP ID explains the ICRC: the packet is damaged (or shorter than a BTH and an ICRC).
    Bad,
}

/// Checks the ICRC at the end of an IPv4 `packet` (BTH through ICRC) for `ip`, whose `id` is
/// the one expected (0 from ferroce and sensor bridges; segment *i* of a peer's GSO send left
/// with *i*), and when it does not match, finds the ID the packet left with from the same pass
/// over its bytes. CRC-32 is linear: the carried ICRC XOR the one computed depends only on the
/// two IDs' difference and the packet's length, so solving for the 16-bit difference leaves
/// the other 16 bits as the check (a damaged packet passes with probability 2^-16). One pass
/// over the packet where [`verify`], then [`recover_ipv4_id`], takes two: rxe and RoCE NICs
/// send non-zero IDs, so every packet from them is recovered.
#[must_use]
pub fn check_ipv4(ip: &super::Ipv4Header, udp: &UdpHeader, packet: &[u8]) -> Ipv4Check {
    if packet.len() < Bth::LEN + ICRC_LEN {
        return Ipv4Check::Bad;
    }
    let end = packet.len() - ICRC_LEN;
    let mut carried = [0; 4];
    carried.copy_from_slice(&packet[end..]);
    let Ok(computed) = compute(&IpHeader::V4(*ip), udp, &packet[..end]) else {
        return Ipv4Check::Bad;
    };
    let diff = u32::from_le_bytes(carried) ^ computed;
    if diff == 0 {
        return Ipv4Check::Matches;
    }
    // The ID's two bytes sit 12 bytes into the CRC's input (8 LRH bytes + 4 of the IP
    // header); `tail` bytes follow them.
    let tail = 8 + 20 + UdpHeader::LEN + end - 14;
    let target = gf2::mul(unshift(tail), diff);
    let mut rest = target;
    let mut id_xor = 0u16;
    for (pivot, row, bits) in gf2::BASIS {
        if rest & pivot != 0 {
            rest ^= row;
            id_xor ^= bits;
        }
    }
    if rest == 0 {
        Ipv4Check::SentWithId(ip.id ^ id_xor)
    } else {
        Ipv4Check::Bad
    }
}

/// How a packet's ICRC changes when it leaves with another IPv4 ID or UDP source port than it
/// was sealed for: UDP GSO gives segment *i* of a send ID *i* (gso.md §1), and GSO sends leave a
/// socket of their own, on another source port than the one the engine sealed for.
///
/// CRC-32 is linear: changing two bytes of the input XORs the CRC with a value that depends
/// only on the change and on how many bytes follow it. A `Reseal` holds that dependence for one
/// packet length and IP version, so re-sealing costs two carry-less multiplications instead
/// of another pass over the packet. Applying the same change twice restores the original.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reseal {
    /// The ICRC change of each bit of the IPv4 ID (bit 0 first); all zero for IPv6.
    id_bits: [u32; 16],
    /// The ICRC change of each bit of the UDP source port.
    port_bits: [u32; 16],
}

impl Reseal {
    /// The re-seal for packets of `packet_len` bytes (BTH through ICRC) over IPv4 (`ipv4`) or
    /// IPv6.
    #[must_use]
    pub const fn new(ipv4: bool, packet_len: usize) -> Self {
        let covered = packet_len.saturating_sub(ICRC_LEN) as u64;
        // After the source port: its UDP neighbours (destination port, length, checksum:
        // 6 bytes), then the covered bytes. The IPv4 ID has 16 more bytes behind it: the
        // rest of the IPv4 header (14) and the source port itself (2).
        let x = gf2::ONE >> 1;
        let port_factor = gf2::pow(x, 8 * (covered + 6));
        let id_factor = gf2::mul(port_factor, gf2::pow(x, 8 * 16));
        let mut id_bits = [0; 16];
        let mut port_bits = [0; 16];
        let mut b = 0;
        while b < 16 {
            let v = 1u16 << b;
            let raw = gf2::raw2((v >> 8) as u8, v as u8);
            port_bits[b] = gf2::mul(raw, port_factor);
            if ipv4 {
                id_bits[b] = gf2::mul(raw, id_factor);
            }
            b += 1;
        }
        Self { id_bits, port_bits }
    }

    /// The value to XOR into the ICRC when the IPv4 ID changes by `id_xor` (ignored for
    /// IPv6) and the UDP source port by `port_xor` (old XOR new, each).
    #[must_use]
    pub const fn delta(&self, id_xor: u16, port_xor: u16) -> u32 {
        // Linear in each bit: one XOR of a precomputed change per bit that changed, no
        // multiplication.
        Self::sum(&self.id_bits, id_xor) ^ Self::sum(&self.port_bits, port_xor)
    }

    /// The XOR of `bits[b]` over the bits `b` set in `xor`, visiting only those.
    const fn sum(bits: &[u32; 16], mut xor: u16) -> u32 {
        let mut d = 0;
        while xor != 0 {
            d ^= bits[xor.trailing_zeros() as usize];
            xor &= xor - 1;
        }
        d
    }

    /// Re-seals the little-endian ICRC in `icrc` for the change [`Reseal::delta`] describes.
    pub fn apply(&self, icrc: &mut [u8], id_xor: u16, port_xor: u16) {
        let delta = self.delta(id_xor, port_xor).to_le_bytes();
        for (b, d) in icrc.iter_mut().zip(delta) {
            *b ^= d;
        }
    }
}

#[cfg(test)]
mod recover_tests {
    use super::*;
    use crate::wire::{Datagram, Ipv4Header};

    #[test]
    fn x_inverse_and_raw_crc() {
        // x · x^-1 = 1.
        assert_eq!(gf2::mul(gf2::X_INV, 1 << 30), gf2::ONE);
        // The raw CRC of two bytes equals zlib's with the pre- and post-inversion undone:
        // crc(m) = raw(m) ^ raw(init effect) ^ !0, so differences agree.
        let a = crc32fast::hash(&[0x12, 0x34]) ^ crc32fast::hash(&[0, 0]);
        assert_eq!(a, gf2::raw2(0x12, 0x34));
    }

    #[test]
    fn a_reseal_equals_sealing_anew() {
        let covered: Vec<u8> = (0..1500u32).map(|i| (i * 13 + 5) as u8).collect();
        for len in [12usize, 100, 1500] {
            for (v4, ip) in [
                (
                    true,
                    IpHeader::V4(Ipv4Header::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into())),
                ),
                (
                    false,
                    IpHeader::V6(crate::wire::Ipv6Header::new(
                        "fd00::1".parse().unwrap(),
                        "fd00::2".parse().unwrap(),
                    )),
                ),
            ] {
                let udp = UdpHeader {
                    src_port: 4791,
                    dst_port: 4791,
                };
                let mut packet = covered[..len].to_vec();
                packet.extend_from_slice(&[0; 4]);
                seal(&ip, &udp, &mut packet).unwrap();
                let reseal = Reseal::new(v4, packet.len());
                for (id, port) in [(0u16, 40000u16), (1, 4791), (7, 51234), (0xffff, 1)] {
                    let mut moved = packet.clone();
                    reseal.apply(&mut moved[len..], id, 4791 ^ port);
                    let ip2 = match ip {
                        IpHeader::V4(h) => IpHeader::V4(Ipv4Header { id, ..h }),
                        v6 => v6,
                    };
                    let udp2 = UdpHeader {
                        src_port: port,
                        ..udp
                    };
                    assert!(
                        verify(&ip2, &udp2, &moved),
                        "len {len} v4 {v4} id {id} port {port}"
                    );
                    // Applying it again gives back the packet sealed for the old header.
                    reseal.apply(&mut moved[len..], id, 4791 ^ port);
                    assert_eq!(moved, packet);
                }
            }
        }
    }

    #[test]
    fn recovers_the_id_of_the_write_only_vector() {
        // protocol.md's WRITE ONLY "hello", re-sealed with ID 0x1234.
        let mut frame = tests::hex(
            "4500004412344000401126a70a0000010a000002 df9412b700300000
             0a30ffff000000128000010000007f0000001000000005170000000568656c6c6f000000 00000000",
        );
        let d = Datagram::parse(&frame).unwrap();
        let (ip, udp) = (d.ip, d.udp);
        let start = 28;
        seal(&ip, &udp, &mut frame[start..]).unwrap();
        let IpHeader::V4(v4) = ip else { panic!() };
        assert_eq!(v4.id, 0x1234);
        let blind = Ipv4Header { id: 0, ..v4 };
        assert_eq!(recover_ipv4_id(&blind, &udp, &frame[start..]), Some(0x1234));
        // Expecting another ID finds the same one in the same pass; the right one matches.
        let packet = &frame[start..];
        for expected in [0, 1, 0x1233, 0xedcb, 0xffff] {
            let guess = Ipv4Header { id: expected, ..v4 };
            assert_eq!(
                check_ipv4(&guess, &udp, packet),
                Ipv4Check::SentWithId(0x1234)
            );
        }
        assert_eq!(check_ipv4(&v4, &udp, packet), Ipv4Check::Matches);
        assert_eq!(check_ipv4(&v4, &udp, &packet[..15]), Ipv4Check::Bad);
        frame[start + 30] ^= 0x40;
        assert_eq!(recover_ipv4_id(&blind, &udp, &frame[start..]), None);
        assert_eq!(check_ipv4(&v4, &udp, &frame[start..]), Ipv4Check::Bad);
    }
}
