//! The checks the fuzz targets share.
//!
//! [`check_packet`] holds a UDP payload to the contract of `ferroce_proto::wire::Packet`: if
//! `Packet::new_checked` accepts it, no accessor panics, the accessors agree with
//! `PacketRepr::parse`, the representation passes `check`, and `emit` writes the input back
//! byte for byte except where the wire format says bits are reserved (sent as zero), the pad
//! (sent as zero) and the ICRC (emitted as zero, then sealed). [`check_datagram`] does the
//! same for a whole IP packet, after checking that its IP and UDP headers re-emit.
//! [`check_cm`] holds a 256-byte MAD to the contract of `ferroce_proto::cm`.
//! [`engine::run`] drives a protocol engine with a sequence of datagrams (the `engine` target).
//! The parsers of the `ferroce` library have their own modules: [`capture::check_capture`]
//! (pcap and pcapng files and the records `ferroce decode` makes of them),
//! [`control::check_control`] (a session's hello and channel lines) and
//! [`exchange::check_exchange`] (the pingpong and ferroce endpoint exchanges).

pub mod capture;
pub mod control;
pub mod engine;
pub mod exchange;

use std::net::{IpAddr, Ipv4Addr};

use ferroce_proto::cm::{CmMessage, CmaHeader, MadHeader, MAD_LEN};
use ferroce_proto::wire::{
    icrc, Bth, Datagram, HeaderSet, IpHeader, Packet, PacketRepr, UdpHeader,
};

/// The ICRC trailer's length.
const ICRC_LEN: usize = 4;

/// The headers the `packet` target verifies the ICRC against: 192.0.2.1 → 192.0.2.2 (IPv4
/// defaults), UDP port 1 → 4791.
pub fn fixed_headers() -> (IpHeader, UdpHeader) {
    let ip = IpHeader::between(
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)),
    )
    .expect("both addresses are IPv4");
    (ip, UdpHeader::to_roce_port(1))
}

/// Which bits of each byte of a packet `emit` reproduces from the parsed values; the others
/// it writes as zero.
///
/// - BTH byte 4: FECN and BECN (bits 7-6); bits 5-0 are reserved.
/// - BTH byte 8: AckReq (bit 7); bits 6-0 are reserved.
/// - DETH byte 4: reserved (the source QP is bytes 5-7).
/// - FETH bytes 0-2 and bits 7-6 of byte 3: reserved (selectivity is bits 5-4, placement
///   bits 3-0).
/// - The CNP's 16 reserved bytes.
/// - The pad after the payload, and the ICRC.
///
/// Every other byte (opcode; SE, MigReq, PadCnt and TVer; P_Key; destination QP; PSN; RETH,
/// AtomicETH, AETH, AtomicAckETH, ImmDt, IETH; DETH Q_Key and source QP; payload) is exact.
fn emitted_bits(headers: HeaderSet, payload_end: usize, len: usize) -> Vec<u8> {
    let mut mask = vec![0xff; len];
    mask[4] = 0xc0;
    mask[8] = 0x80;
    let at = |h: HeaderSet| headers.offset_of(h).map(|o| Bth::LEN + o);
    if let Some(o) = at(HeaderSet::DETH) {
        mask[o + 4] = 0;
    }
    if let Some(o) = at(HeaderSet::FETH) {
        mask[o..o + 3].fill(0);
        mask[o + 3] = 0x3f;
    }
    if let Some(o) = at(HeaderSet::CNP_RESERVED) {
        mask[o..o + 16].fill(0);
    }
    mask[payload_end..].fill(0);
    mask
}

/// Checks a UDP payload; `ip` and `udp` are the headers its ICRC is verified against.
pub fn check_packet(data: &[u8], ip: &IpHeader, udp: &UdpHeader) {
    // The ICRC functions take any bytes.
    let verified = icrc::verify(ip, udp, data);
    let Ok(p) = Packet::new_checked(data) else {
        return;
    };

    // Every accessor, and their agreement with each other.
    let bth = p.bth();
    assert_eq!(p.opcode(), bth.opcode);
    assert_eq!(p.dest_qp(), bth.dest_qp);
    assert_eq!(p.psn(), bth.psn);
    assert_eq!(p.ack_req(), bth.ack_req);
    let pad = p.pad();
    assert!(pad <= 3);
    let headers = p.headers();
    assert_eq!(headers, bth.opcode.headers());
    let header_len = p.header_len();
    assert_eq!(header_len, Bth::LEN + headers.len());
    let (deth, feth, reth) = (p.deth(), p.feth(), p.reth());
    let (atomic, aeth, atomic_ack) = (p.atomic_eth(), p.aeth(), p.atomic_ack());
    let (imm, ieth) = (p.imm(), p.ieth());
    let payload = p.payload();
    assert_eq!(payload, &data[header_len..header_len + payload.len()]);
    assert_eq!(header_len + payload.len() + usize::from(pad) + ICRC_LEN, data.len());
    assert_eq!(p.covered(), &data[..data.len() - ICRC_LEN]);
    let carried = p.icrc();
    let mut le = [0; 4];
    le.copy_from_slice(&data[data.len() - ICRC_LEN..]);
    assert_eq!(carried, u32::from_le_bytes(le));
    assert_eq!(
        verified,
        icrc::compute(ip, udp, p.covered()) == Ok(carried),
        "icrc::verify disagrees with icrc::compute"
    );

    // The representation.
    let repr = PacketRepr::parse(&p);
    assert_eq!(repr.bth, bth);
    assert_eq!(repr.deth, deth);
    assert_eq!(repr.feth, feth);
    assert_eq!(repr.reth, reth);
    assert_eq!(repr.atomic, atomic);
    assert_eq!(repr.aeth, aeth);
    assert_eq!(repr.atomic_ack, atomic_ack);
    assert_eq!(repr.imm, imm);
    assert_eq!(repr.ieth, ieth);
    assert_eq!(repr.payload_len, payload.len());
    if let Err(e) = repr.check() {
        panic!("a parsed representation fails check: {e}: {repr:?}");
    }
    assert_eq!(repr.present(), headers);
    assert_eq!(repr.pad(), pad);
    assert_eq!(repr.header_len(), header_len);
    assert_eq!(repr.buffer_len(), data.len());

    // Emit reproduces the input, reserved bits, pad and ICRC zeroed.
    let mut again = vec![0xa5; repr.buffer_len()];
    match repr.emit(payload, &mut again) {
        Ok(n) => assert_eq!(n, data.len()),
        Err(e) => panic!("emit refuses a parsed representation: {e}: {repr:?}"),
    }
    let mask = emitted_bits(headers, header_len + payload.len(), data.len());
    for (i, ((&a, &d), &m)) in again.iter().zip(data).zip(&mask).enumerate() {
        assert_eq!(
            a,
            d & m,
            "emitted byte {i} is {a:#04x}, input {d:#04x}, expected {:#04x} (mask {m:#04x})",
            d & m
        );
    }

    // The emitted packet parses back to the same representation, and seals.
    let back = Packet::new_checked(&again[..]).expect("emitted packet parses");
    assert_eq!(PacketRepr::parse(&back), repr);
    if icrc::seal(ip, udp, &mut again).is_ok() {
        assert!(icrc::verify(ip, udp, &again), "a sealed packet fails verify");
    }
}

/// Checks a whole IP packet.
pub fn check_datagram(data: &[u8]) {
    let Ok(d) = Datagram::parse(data) else {
        return;
    };
    let ip_len = d.ip.len();
    let header_len = ip_len + UdpHeader::LEN;
    assert_eq!(d.payload, &data[header_len..header_len + d.payload.len()]);

    // The headers re-emit, except the IPv4 header checksum (recomputed) and the UDP
    // checksum (sent as zero).
    let mut out = vec![0xa5; header_len];
    match Datagram::emit_headers(&d.ip, &d.udp, d.payload.len(), &mut out) {
        Ok(n) => assert_eq!(n, header_len),
        Err(e) => panic!("emit_headers refuses parsed headers: {e}: {d:?}"),
    }
    let mut expected = data[..header_len].to_vec();
    if let IpHeader::V4(_) = d.ip {
        expected[10..12].copy_from_slice(&out[10..12]);
    }
    assert_eq!(
        d.udp_checksum,
        u16::from_be_bytes([expected[ip_len + 6], expected[ip_len + 7]])
    );
    expected[ip_len + 6..ip_len + 8].fill(0);
    assert_eq!(out, expected, "re-emitted IP/UDP headers differ");

    check_packet(d.payload, &d.ip, &d.udp);
}

/// Checks a CM MAD: if `CmMessage::parse` accepts the bytes, they are 256 long, the message
/// emits with its header, the emitted MAD sets no bit the input did not (reserved bits come
/// back as zero, every other bit as it was) and parses to the same header and message. An
/// rdma_cm header in a REQ's or SIDR_REQ's private data, when there is one, emits back the
/// same way. The header and rdma_cm parsers take any bytes.
pub fn check_cm(data: &[u8]) {
    let _ = MadHeader::parse(data);
    if let Ok(cma) = CmaHeader::parse(data) {
        let mut out = [0; CmaHeader::LEN];
        cma.emit(&mut out).expect("a parsed rdma_cm header emits");
        assert_eq!(CmaHeader::parse(&out), Ok(cma));
    }
    let Ok((header, message)) = CmMessage::parse(data) else {
        return;
    };
    assert_eq!(data.len(), MAD_LEN);
    let mut out = [0xa5; MAD_LEN];
    if let Err(e) = message.emit(&header, &mut out) {
        panic!("emit refuses a parsed message: {e}: {message:?}");
    }
    for (i, (&o, &d)) in out.iter().zip(data).enumerate() {
        assert_eq!(o & !d, 0, "emitted byte {i} is {o:#04x}, input {d:#04x}");
    }
    assert_eq!(CmMessage::parse(&out), Ok((header, message)));
    let private = match &message {
        CmMessage::Req(m) => &m.private_data.0[..],
        CmMessage::SidrReq(m) => &m.private_data.0[..],
        _ => return,
    };
    if let Ok(cma) = CmaHeader::parse(private) {
        let mut again = [0; CmaHeader::LEN];
        cma.emit(&mut again).expect("a parsed rdma_cm header emits");
        assert_eq!(CmaHeader::parse(&again), Ok(cma));
    }
}
