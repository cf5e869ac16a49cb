//! parse ∘ emit is the identity for every opcode, alone and inside IPv4/IPv6 + UDP frames.

use std::net::{Ipv4Addr, Ipv6Addr};

use ferroce_proto::wire::{
    icrc, Aeth, AtomicAckEth, AtomicEth, Bth, Datagram, Deth, Feth, HeaderSet, IpHeader,
    Ipv4Header, Ipv6Header, Opcode, Packet, PacketRepr, Qpn, Reth, Syndrome, UdpHeader,
};
use ferroce_proto::Psn;
use proptest::prelude::*;

fn u24() -> impl Strategy<Value = u32> {
    0..=0x00ff_ffffu32
}

fn bth(opcode: Opcode) -> impl Strategy<Value = Bth> {
    (any::<[bool; 5]>(), any::<u16>(), u24(), u24()).prop_map(move |(f, pkey, qp, psn)| Bth {
        opcode,
        solicited: f[0],
        mig_req: f[1],
        pkey,
        fecn: f[2],
        becn: f[3],
        dest_qp: Qpn::from_low_bits(qp),
        ack_req: f[4],
        psn: Psn::from_low_bits(psn),
    })
}

/// A representation with exactly the headers `opcode` needs, random values in each.
fn repr() -> impl Strategy<Value = PacketRepr> {
    proptest::sample::select(Opcode::ALL).prop_flat_map(|opcode| {
        let h = opcode.headers();
        let max_payload: usize = if opcode.carries_payload() { 300 } else { 0 };
        (
            bth(opcode),
            (any::<u32>(), u24()).prop_map(|(qkey, qp)| Deth {
                qkey,
                src_qp: Qpn::from_low_bits(qp),
            }),
            (0..4u8, 0..16u8).prop_map(|(selectivity, placement)| Feth {
                selectivity,
                placement,
            }),
            any::<(u64, u32, u32)>().prop_map(|(va, rkey, len)| Reth { va, rkey, len }),
            any::<(u64, u32, u64, u64)>().prop_map(|(va, rkey, swap_add, compare)| AtomicEth {
                va,
                rkey,
                swap_add,
                compare,
            }),
            (any::<u8>(), u24()).prop_map(|(s, msn)| Aeth {
                syndrome: Syndrome::from_byte(s),
                msn,
            }),
            any::<u64>().prop_map(|orig| AtomicAckEth { orig }),
            any::<(u32, u32)>(),
            0..=max_payload,
        )
            .prop_map(
                move |(bth, deth, feth, reth, atomic, aeth, ack, (imm, ieth), len)| {
                    let pick = |flag| h.contains(flag);
                    PacketRepr {
                        bth,
                        deth: pick(HeaderSet::DETH).then_some(deth),
                        feth: pick(HeaderSet::FETH).then_some(feth),
                        reth: pick(HeaderSet::RETH).then_some(reth),
                        atomic: pick(HeaderSet::ATOMIC).then_some(atomic),
                        aeth: pick(HeaderSet::AETH).then_some(aeth),
                        atomic_ack: pick(HeaderSet::ATOMIC_ACK).then_some(ack),
                        imm: pick(HeaderSet::IMM).then_some(imm),
                        ieth: pick(HeaderSet::IETH).then_some(ieth),
                        payload_len: len,
                    }
                },
            )
    })
}

fn ip_header() -> impl Strategy<Value = IpHeader> {
    prop_oneof![
        any::<([u8; 4], [u8; 4], u16, bool, u8, u8)>().prop_map(|(s, d, id, df, tos, ttl)| {
            IpHeader::V4(Ipv4Header {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                id,
                flags_fragment: if df { Ipv4Header::DF } else { 0 },
                tos,
                ttl,
            })
        }),
        any::<([u8; 16], [u8; 16], u8, u32, u8)>().prop_map(|(s, d, tc, flow, hop)| {
            IpHeader::V6(Ipv6Header {
                src: Ipv6Addr::from(s),
                dst: Ipv6Addr::from(d),
                traffic_class: tc,
                flow_label: flow & 0xf_ffff,
                hop_limit: hop,
            })
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn packet_parse_emit_identity(repr in repr(), fill in any::<u8>()) {
        let payload: Vec<u8> = (0..repr.payload_len).map(|i| fill.wrapping_add(i as u8)).collect();
        let mut buf = vec![0xa5; repr.buffer_len()];
        let n = repr.emit(&payload, &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(buf.len() % 4, 0, "payload plus pad is 4-byte aligned");

        let view = Packet::new_checked(&buf[..]).unwrap();
        prop_assert_eq!(PacketRepr::parse(&view), repr);
        prop_assert_eq!(view.payload(), &payload[..]);
        prop_assert_eq!(view.pad(), repr.pad());

        // And emit ∘ parse: re-emitting the parsed representation gives the same bytes.
        let mut again = vec![0; buf.len()];
        PacketRepr::parse(&view).emit(view.payload(), &mut again).unwrap();
        prop_assert_eq!(again, buf);
    }

    #[test]
    fn framed_parse_emit_identity(repr in repr(), ip in ip_header(), sport in any::<u16>()) {
        let udp = UdpHeader::to_roce_port(sport);
        let payload = vec![0x5a; repr.payload_len];
        let mut frame = vec![0; ip.len() + UdpHeader::LEN + repr.buffer_len()];
        let h = Datagram::emit_headers(&ip, &udp, repr.buffer_len(), &mut frame).unwrap();
        repr.emit(&payload, &mut frame[h..]).unwrap();
        icrc::seal(&ip, &udp, &mut frame[h..]).unwrap();

        let d = Datagram::parse(&frame).unwrap();
        prop_assert_eq!(d.ip, ip);
        prop_assert_eq!(d.udp, udp);
        prop_assert!(icrc::verify(&d.ip, &d.udp, d.payload));
        let view = Packet::new_checked(d.payload).unwrap();
        prop_assert_eq!(PacketRepr::parse(&view), repr);
    }

    #[test]
    fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(view) = Packet::new_checked(&bytes[..]) {
            let repr = PacketRepr::parse(&view);
            prop_assert!(repr.check().is_ok());
            prop_assert_eq!(repr.buffer_len(), bytes.len());
        }
        if let Ok(d) = Datagram::parse(&bytes) {
            let _ = icrc::verify(&d.ip, &d.udp, d.payload);
        }
    }
}

#[test]
fn emit_refuses_mismatched_headers() {
    let bth = Bth::new(
        Opcode::RC_RDMA_WRITE_FIRST,
        Qpn::new(5).unwrap(),
        Psn::default(),
    );
    let repr = PacketRepr::new(bth);
    let mut buf = [0u8; 64];
    assert!(matches!(
        repr.emit(&[], &mut buf),
        Err(ferroce_proto::wire::Error::HeaderMismatch { .. })
    ));
    let mut ack = PacketRepr::new(Bth::new(
        Opcode::RC_ACKNOWLEDGE,
        Qpn::new(5).unwrap(),
        Psn::default(),
    ));
    ack.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 1 << 24,
    });
    assert!(matches!(
        ack.emit(&[], &mut buf),
        Err(ferroce_proto::wire::Error::FieldRange { .. })
    ));
    ack.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    ack.payload_len = 4;
    assert!(matches!(
        ack.emit(&[0; 4], &mut buf),
        Err(ferroce_proto::wire::Error::UnexpectedPayload { .. })
    ));
}
