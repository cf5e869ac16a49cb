//! The CM codec against hand-built bytes (the values of the rxe rping capture in
//! `rdmacm.md` §1.3), at the widest field values, and against arbitrary bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use crate::wire::Qpn;
use crate::Psn;

const ATTRIBUTES: [AttributeId; 11] = [
    AttributeId::Req,
    AttributeId::Mra,
    AttributeId::Rej,
    AttributeId::Rep,
    AttributeId::Rtu,
    AttributeId::Dreq,
    AttributeId::Drep,
    AttributeId::SidrReq,
    AttributeId::SidrRep,
    AttributeId::Lap,
    AttributeId::Apr,
];

/// Message byte `at` in the MAD.
const fn cm(at: usize) -> usize {
    MadHeader::LEN + at
}

/// Which bits of each MAD byte the codec reproduces: every bit but the reserved ones, which
/// `emit` writes as zero.
///
/// - Header: bytes 18-19.
/// - REQ: bytes 4-7 and 24-27; in each path (at 52 and 96), the 12 bits between the flow
///   label and the packet rate (path byte 38 bits 3-0, byte 39 bits 7-6), byte 42 bits 2-0
///   and byte 43 bits 2-0.
/// - MRA: byte 8 bits 5-0, byte 9 bits 2-0. REJ: byte 8 bits 5-0, byte 9 bit 0.
/// - REP: bytes 15, 19, 23, byte 27 bits 3-0. DREQ: byte 11.
/// - SIDR_REQ: bytes 6-7. SIDR_REP: bytes 6-7 and 11.
/// - RTU, DREP, LAP and APR: none (LAP and APR bodies are kept whole).
fn preserved(attribute: AttributeId) -> [u8; MAD_LEN] {
    let mut mask = [0xff; MAD_LEN];
    mask[18] = 0;
    mask[19] = 0;
    let mut clear = |at: usize, keep: u8| mask[cm(at)] = keep;
    match attribute {
        AttributeId::Req => {
            for at in (4..8).chain(24..28) {
                clear(at, 0);
            }
            for path in [52, 96] {
                clear(path + 38, 0xf0);
                clear(path + 39, 0x3f);
                clear(path + 42, 0xf8);
                clear(path + 43, 0xf8);
            }
        }
        AttributeId::Mra => {
            clear(8, 0xc0);
            clear(9, 0xf8);
        }
        AttributeId::Rej => {
            clear(8, 0xc0);
            clear(9, 0xfe);
        }
        AttributeId::Rep => {
            for at in [15, 19, 23] {
                clear(at, 0);
            }
            clear(27, 0xf0);
        }
        AttributeId::Dreq => clear(11, 0),
        AttributeId::SidrReq => {
            clear(6, 0);
            clear(7, 0);
        }
        AttributeId::SidrRep => {
            for at in [6, 7, 11] {
                clear(at, 0);
            }
        }
        AttributeId::Rtu | AttributeId::Drep | AttributeId::Lap | AttributeId::Apr => {}
    }
    mask
}

fn emit(header: &MadHeader, message: &CmMessage) -> [u8; MAD_LEN] {
    let mut out = [0; MAD_LEN];
    message.emit(header, &mut out).expect("emit");
    out
}

fn round_trip(message: CmMessage) -> [u8; MAD_LEN] {
    let header = message.header(0xffff_ffff_ffff_ffff);
    let bytes = emit(&header, &message);
    let mask = preserved(message.attribute_id());
    for (i, (b, m)) in bytes.iter().zip(mask).enumerate() {
        assert_eq!(
            b & !m,
            0,
            "{}: reserved bits set in byte {i}",
            message.name()
        );
    }
    assert_eq!(
        CmMessage::parse(&bytes),
        Ok((header, message)),
        "{}",
        message.name()
    );
    bytes
}

fn ipv4_gid(a: [u8; 4]) -> Ipv6Addr {
    Ipv4Addr::from(a).to_ipv6_mapped()
}

fn widest_path() -> PathInfo {
    PathInfo {
        local_lid: u16::MAX,
        remote_lid: u16::MAX,
        local_gid: Ipv6Addr::from(u128::MAX),
        remote_gid: Ipv6Addr::from(u128::MAX),
        flow_label: 0xf_ffff,
        packet_rate: 0x3f,
        traffic_class: u8::MAX,
        hop_limit: u8::MAX,
        sl: 0xf,
        subnet_local: true,
        local_ack_timeout: 0x1f,
    }
}

fn widest_req() -> Req {
    Req {
        local_comm_id: u32::MAX,
        service_id: ServiceId(u64::MAX),
        local_ca_guid: u64::MAX,
        local_qkey: u32::MAX,
        local_qpn: Qpn::from_low_bits(u32::MAX),
        responder_resources: u8::MAX,
        local_eecn: 0xff_ffff,
        initiator_depth: u8::MAX,
        remote_eecn: 0xff_ffff,
        remote_cm_response_timeout: 0x1f,
        transport_type: TransportType::Extended,
        end_to_end_flow_control: true,
        starting_psn: Psn::MAX,
        local_cm_response_timeout: 0x1f,
        retry_count: 7,
        pkey: u16::MAX,
        path_mtu: Mtu::M4096,
        rdc_exists: true,
        rnr_retry_count: 7,
        max_cm_retries: 0xf,
        srq: true,
        extended_transport_type: 7,
        primary_path: widest_path(),
        alternate_path: widest_path(),
        private_data: FixedBytes([0xff; 92]),
    }
}

fn widest_messages() -> Vec<CmMessage> {
    let ids = (u32::MAX, u32::MAX);
    vec![
        CmMessage::Req(widest_req()),
        CmMessage::Mra(Mra {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            message_mraed: MessageKind::Other,
            service_timeout: 0x1f,
            private_data: FixedBytes([0xff; 222]),
        }),
        CmMessage::Rej(Rej {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            message_rejected: MessageKind::Other,
            reject_info_length: 0x7f,
            reason: RejectReason::Other(u16::MAX),
            ari: FixedBytes([0xff; 72]),
            private_data: FixedBytes([0xff; 148]),
        }),
        CmMessage::Rep(Rep {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            local_qkey: u32::MAX,
            local_qpn: Qpn::from_low_bits(u32::MAX),
            local_eecn: 0xff_ffff,
            starting_psn: Psn::MAX,
            responder_resources: u8::MAX,
            initiator_depth: u8::MAX,
            target_ack_delay: 0x1f,
            failover_accepted: 3,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            local_ca_guid: u64::MAX,
            private_data: FixedBytes([0xff; 196]),
        }),
        CmMessage::Rtu(Rtu {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            private_data: FixedBytes([0xff; 224]),
        }),
        CmMessage::Dreq(Dreq {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            remote_qpn: Qpn::from_low_bits(u32::MAX),
            private_data: FixedBytes([0xff; 220]),
        }),
        CmMessage::Drep(Drep {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            private_data: FixedBytes([0xff; 224]),
        }),
        CmMessage::SidrReq(SidrReq {
            request_id: u32::MAX,
            pkey: u16::MAX,
            service_id: ServiceId(u64::MAX),
            private_data: FixedBytes([0xff; 216]),
        }),
        CmMessage::SidrRep(SidrRep {
            request_id: u32::MAX,
            status: SidrStatus::Other(u8::MAX),
            additional_info_length: u8::MAX,
            qpn: Qpn::from_low_bits(u32::MAX),
            service_id: ServiceId(u64::MAX),
            qkey: u32::MAX,
            additional_info: FixedBytes([0xff; 72]),
            private_data: FixedBytes([0xff; 136]),
        }),
        CmMessage::Lap(Lap {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            body: FixedBytes([0xff; 224]),
        }),
        CmMessage::Apr(Apr {
            local_comm_id: ids.0,
            remote_comm_id: ids.1,
            body: FixedBytes([0xff; 224]),
        }),
    ]
}

#[test]
fn every_message_round_trips_at_its_widest_values() {
    let messages = widest_messages();
    let names: Vec<_> = messages.iter().map(CmMessage::name).collect();
    assert_eq!(
        names,
        ["REQ", "MRA", "REJ", "REP", "RTU", "DREQ", "DREP", "SIDR_REQ", "SIDR_REP", "LAP", "APR"]
    );
    for message in messages {
        let bytes = round_trip(message);
        // With every field at its widest, every defined bit is set, except where an enum's
        // largest code is not all ones: MTU 5 (0101) and message kind 2 (10).
        let mut expected = preserved(message.attribute_id());
        expected[..MadHeader::LEN].copy_from_slice(&[
            1, 7, 2, 3, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0,
            0, 0, 0,
        ]);
        expected[16..18].copy_from_slice(&message.attribute_id().value().to_be_bytes());
        match message {
            CmMessage::Req(_) => expected[cm(50)] = 0x5f,
            CmMessage::Mra(_) | CmMessage::Rej(_) => expected[cm(8)] = 0x80,
            _ => {}
        }
        assert_eq!(bytes, expected, "{}", message.name());
    }
    // The smallest values too: zero everywhere a zero is allowed.
    let zero_req = Req {
        local_comm_id: 0,
        service_id: ServiceId(0),
        local_ca_guid: 0,
        local_qkey: 0,
        local_qpn: Qpn::default(),
        responder_resources: 0,
        local_eecn: 0,
        initiator_depth: 0,
        remote_eecn: 0,
        remote_cm_response_timeout: 0,
        transport_type: TransportType::Rc,
        end_to_end_flow_control: false,
        starting_psn: Psn::default(),
        local_cm_response_timeout: 0,
        retry_count: 0,
        pkey: 0,
        path_mtu: Mtu::M256,
        rdc_exists: false,
        rnr_retry_count: 0,
        max_cm_retries: 0,
        srq: false,
        extended_transport_type: 0,
        primary_path: PathInfo::NONE,
        alternate_path: PathInfo::default(),
        private_data: FixedBytes::ZERO,
    };
    round_trip(CmMessage::Req(zero_req));
    round_trip(CmMessage::Rtu(Rtu::default()));
}

/// The REQ of the rxe rping capture: the field values rdmacm.md §1.3 marks as read from it.
/// The communication ID, GIDs and cma_hdr addresses are this test's own (10.77.0.12 connects
/// to 10.77.0.11 from rdma_cm port 0xe5be); the kernel's TID low word is the ID byte-swapped.
fn rping_req() -> (MadHeader, Req) {
    let header = MadHeader::cm(AttributeId::Req, 0x0000_0002_09a9_bc58);
    let mut private_data = FixedBytes::ZERO;
    CmaHeader {
        src_port: 0xe5be,
        src: Ipv4Addr::new(10, 77, 0, 12).into(),
        dst: Ipv4Addr::new(10, 77, 0, 11).into(),
    }
    .emit(&mut private_data.0)
    .unwrap();
    let req = Req {
        local_comm_id: 0x58bc_a909,
        service_id: ServiceId::rdma_cm(PortSpace::Tcp, 7174),
        local_ca_guid: 0x5054_00ff_fe77_0012,
        local_qkey: 0,
        local_qpn: Qpn::new(0x3c).unwrap(),
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: TransportType::Rc,
        end_to_end_flow_control: false,
        starting_psn: Psn::new(0x10_36e6).unwrap(),
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: Mtu::M1024,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: PathInfo {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: ipv4_gid([10, 77, 0, 12]),
            remote_gid: ipv4_gid([10, 77, 0, 11]),
            flow_label: 0xb_ee08,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 0x13,
        },
        alternate_path: PathInfo::NONE,
        private_data,
    };
    (header, req)
}

/// The same REQ, written byte by byte at the offsets of the layout table.
fn rping_req_bytes() -> [u8; MAD_LEN] {
    let mut mad = [0u8; MAD_LEN];
    mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    mad[8..16].copy_from_slice(&[0, 0, 0, 0x02, 0x09, 0xa9, 0xbc, 0x58]);
    mad[16..18].copy_from_slice(&[0x00, 0x10]);
    let mut put =
        |at: usize, bytes: &[u8]| mad[cm(at)..cm(at) + bytes.len()].copy_from_slice(bytes);
    put(0, &[0x58, 0xbc, 0xa9, 0x09]);
    put(8, &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
    put(16, &[0x50, 0x54, 0x00, 0xff, 0xfe, 0x77, 0x00, 0x12]);
    put(32, &[0x00, 0x00, 0x3c, 1]); // local QPN, responder resources
    put(39, &[1]); // initiator depth
    put(43, &[20 << 3]); // remote CM response timeout 20, RC, no flow control
    put(44, &[0x10, 0x36, 0xe6, (20 << 3) | 7]); // starting PSN; local timeout 20, retry 7
    put(48, &[0xff, 0xff]);
    put(50, &[(3 << 4) | 7, 15 << 4]); // MTU 1024, RNR retry 7; max CM retries 15
    put(52, &[0xff, 0xff, 0xff, 0xff]); // LIDs
    put(
        56,
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 12],
    );
    put(
        72,
        &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 77, 0, 11],
    );
    put(88, &[0xbe, 0xe0, 0x80, 0x00]); // flow label 0xBEE08 in bits 31-12, rate 0
    put(92, &[0, 64, 0, 0x13 << 3]); // TC 0, hop limit 64, SL 0, local ACK timeout 0x13
    put(140, &[0x00, 0x40, 0xe5, 0xbe]); // cma_hdr: version 0, IPv4, port 0xe5be
    put(156, &[10, 77, 0, 12]);
    put(172, &[10, 77, 0, 11]);
    mad
}

#[test]
fn the_rping_req_reads_and_writes_the_captured_values() {
    let bytes = rping_req_bytes();
    let (header, message) = CmMessage::parse(&bytes).unwrap();
    let CmMessage::Req(req) = message else {
        panic!("not a REQ: {message:?}");
    };
    assert_eq!(message.name(), "REQ");
    assert_eq!(header.transaction_id, 0x0000_0002_09a9_bc58);
    assert_eq!(req.service_id.value(), 0x0000_0000_0106_1c06);
    assert_eq!(req.service_id.port_space(), Some(PortSpace::Tcp));
    assert_eq!(req.service_id.port(), Some(7174));
    assert_eq!(req.local_ca_guid, 0x5054_00ff_fe77_0012);
    assert_eq!(req.local_qpn.value(), 0x3c);
    assert_eq!(req.starting_psn.value(), 0x10_36e6);
    assert_eq!((req.path_mtu.ibv_value(), req.path_mtu.bytes()), (3, 1024));
    assert_eq!((req.retry_count, req.rnr_retry_count), (7, 7));
    assert_eq!(req.remote_cm_response_timeout, 20);
    assert_eq!(req.local_cm_response_timeout, 20);
    assert_eq!(req.max_cm_retries, 15);
    assert_eq!(req.pkey, 0xffff);
    assert_eq!(req.primary_path.local_lid, 0xffff);
    assert_eq!(req.primary_path.remote_lid, 0xffff);
    assert_eq!(req.primary_path.flow_label, 0xb_ee08);
    assert_eq!(req.primary_path.hop_limit, 64);
    assert_eq!(req.primary_path.local_ack_timeout, 0x13);
    assert_eq!((req.responder_resources, req.initiator_depth), (1, 1));
    assert_eq!(req.alternate_path, PathInfo::NONE);
    let cma = CmaHeader::parse(&req.private_data.0).unwrap();
    assert_eq!(cma.src_port, 0xe5be);
    assert_eq!(cma.src, IpAddr::from([10, 77, 0, 12]));
    assert_eq!(cma.dst, IpAddr::from([10, 77, 0, 11]));

    let (expected_header, expected) = rping_req();
    assert_eq!((header, req), (expected_header, expected));
    assert_eq!(emit(&expected_header, &CmMessage::Req(expected)), bytes);
}

#[test]
fn the_rping_rep_reads_and_writes_the_captured_values() {
    let mut bytes = [0u8; MAD_LEN];
    bytes[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
    bytes[8..16].copy_from_slice(&[0, 0, 0, 0x02, 0x09, 0xa9, 0xbc, 0x58]);
    bytes[16..18].copy_from_slice(&[0x00, 0x13]);
    let mut put = |at: usize, b: &[u8]| bytes[cm(at)..cm(at) + b.len()].copy_from_slice(b);
    put(0, &[0x11, 0x22, 0x33, 0x44]); // this side's communication ID (the test's own)
    put(4, &[0x58, 0xbc, 0xa9, 0x09]); // the REQ's
    put(12, &[0x00, 0x00, 0x3b]); // local QPN
    put(20, &[0x0a, 0x6f, 0x23]); // starting PSN
    put(24, &[1, 1, 15 << 3, 7 << 5]); // RR 1, ID 1, target ACK delay 15; RNR retry 7
    put(28, &[0x50, 0x54, 0x00, 0xff, 0xfe, 0x77, 0x00, 0x11]);

    let (header, message) = CmMessage::parse(&bytes).unwrap();
    let expected = Rep {
        local_comm_id: 0x1122_3344,
        remote_comm_id: 0x58bc_a909,
        local_qkey: 0,
        local_qpn: Qpn::new(0x3b).unwrap(),
        local_eecn: 0,
        starting_psn: Psn::new(0x0a_6f23).unwrap(),
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x5054_00ff_fe77_0011,
        private_data: FixedBytes::ZERO,
    };
    assert_eq!(message, CmMessage::Rep(expected));
    assert_eq!(message.name(), "REP");
    assert_eq!(message.local_comm_id(), Some(0x1122_3344));
    assert_eq!(message.remote_comm_id(), Some(0x58bc_a909));
    assert_eq!(
        header,
        MadHeader::cm(AttributeId::Rep, 0x0000_0002_09a9_bc58)
    );
    assert_eq!(emit(&header, &CmMessage::Rep(expected)), bytes);
}

#[test]
fn each_kind_of_bad_mad_gets_its_own_error() {
    let good = rping_req_bytes();
    assert_eq!(CmMessage::parse(&good[..255]), Err(CmError::Length(255)));
    assert_eq!(CmMessage::parse(&[]), Err(CmError::Length(0)));
    let mut long = good.to_vec();
    long.push(0);
    assert_eq!(CmMessage::parse(&long), Err(CmError::Length(257)));

    let with = |at: usize, value: u8| {
        let mut b = good;
        b[at] = value;
        CmMessage::parse(&b)
    };
    assert_eq!(with(0, 2), Err(CmError::BaseVersion(2)));
    assert_eq!(with(1, 0x03), Err(CmError::MgmtClass(0x03)));
    assert_eq!(with(2, 1), Err(CmError::ClassVersion(1)));
    assert_eq!(with(3, 0x83), Err(CmError::Method(0x83)));
    assert_eq!(with(17, 0x1b), Err(CmError::UnknownAttribute(0x001b)));
    assert_eq!(
        with(cm(50), 0x67),
        Err(CmError::Reserved {
            field: "REQ path MTU",
            value: 6
        })
    );
    assert_eq!(
        with(cm(50), 0x07),
        Err(CmError::Reserved {
            field: "REQ path MTU",
            value: 0
        })
    );
    // REJ and MRA: message code 3 is reserved.
    for (attribute, field) in [(0x12, "REJ message rejected"), (0x11, "MRA message MRAed")] {
        let mut b = good;
        b[17] = attribute;
        b[cm(8)] = 0xc0;
        assert_eq!(
            CmMessage::parse(&b),
            Err(CmError::Reserved { field, value: 3 })
        );
    }
    assert_eq!(
        MadHeader::parse(&good[..23]),
        Err(CmError::Truncated {
            what: "MAD header",
            needed: 24,
            available: 23
        })
    );
    assert_eq!(
        CmError::MgmtClass(3).to_string(),
        "management class 0x03 is not CM (0x07)"
    );
}

#[test]
fn emit_refuses_what_parse_would_refuse_and_writes_nothing() {
    let (header, req) = rping_req();
    let mut out = [0xaa; MAD_LEN];
    let wide = |r: Req| CmMessage::Req(r).emit(&header, &mut [0; MAD_LEN]);
    assert_eq!(
        wide(Req {
            retry_count: 8,
            ..req
        }),
        Err(CmError::FieldRange {
            field: "REQ retry count",
            value: 8,
            bits: 3
        })
    );
    let mut path = req.primary_path;
    path.flow_label = 0x10_0000;
    assert_eq!(
        wide(Req {
            primary_path: path,
            ..req
        }),
        Err(CmError::FieldRange {
            field: "path flow label",
            value: 0x10_0000,
            bits: 20
        })
    );
    let too_wide = CmMessage::Mra(Mra {
        local_comm_id: 1,
        remote_comm_id: 2,
        message_mraed: MessageKind::Req,
        service_timeout: 32,
        private_data: FixedBytes::ZERO,
    });
    assert!(matches!(
        too_wide.emit(&too_wide.header(0), &mut out),
        Err(CmError::FieldRange { bits: 5, .. })
    ));
    let rtu = CmMessage::Rtu(Rtu::default());
    assert_eq!(
        rtu.emit(&header, &mut out),
        Err(CmError::AttributeMismatch {
            header: 0x0010,
            message: "RTU"
        })
    );
    let old = MadHeader {
        class_version: 1,
        ..rtu.header(0)
    };
    assert_eq!(rtu.emit(&old, &mut out), Err(CmError::ClassVersion(1)));
    assert_eq!(out, [0xaa; MAD_LEN]);
}

#[test]
fn accessors_name_the_ids_each_message_has() {
    for message in widest_messages() {
        let attribute = message.attribute_id();
        assert_eq!(AttributeId::from_value(attribute.value()), Some(attribute));
        let sidr = matches!(attribute, AttributeId::SidrReq | AttributeId::SidrRep);
        assert_eq!(message.local_comm_id().is_some(), !sidr);
        assert_eq!(message.request_id().is_some(), sidr);
        assert_eq!(
            message.remote_comm_id().is_some(),
            !sidr && attribute != AttributeId::Req
        );
        assert_eq!(
            message.service_id().is_some(),
            matches!(
                attribute,
                AttributeId::Req | AttributeId::SidrReq | AttributeId::SidrRep
            )
        );
    }
    assert_eq!(AttributeId::from_value(0x000f), None);
    assert_eq!(AttributeId::Apr.value(), 0x001a);
}

#[test]
fn codes_round_trip() {
    for code in 0..=u16::MAX {
        assert_eq!(RejectReason::from_code(code).code(), code);
    }
    assert_eq!(RejectReason::from_code(8), RejectReason::InvalidServiceId);
    assert_eq!(RejectReason::from_code(28), RejectReason::ConsumerDefined);
    assert_eq!(RejectReason::from_code(2), RejectReason::Other(2));
    assert_eq!(
        RejectReason::StaleConnection.to_string(),
        "stale connection"
    );
    for code in 0..=u8::MAX {
        assert_eq!(SidrStatus::from_code(code).code(), code);
    }
    assert_eq!(SidrStatus::from_code(1), SidrStatus::Unsupported);
    let mtus: Vec<_> = (0..16)
        .map(i64::from)
        .filter_map(Mtu::from_ibv_value)
        .map(Mtu::bytes)
        .collect();
    assert_eq!(mtus, [256, 512, 1024, 2048, 4096]);
}

#[test]
fn service_ids_and_port_spaces() {
    let sid = ServiceId::rdma_cm(PortSpace::Udp, 7174);
    assert_eq!(sid.value(), 0x0111_1c06);
    assert_eq!(
        (sid.port_space(), sid.port()),
        (Some(PortSpace::Udp), Some(7174))
    );
    assert_eq!(
        ServiceId::rdma_cm(PortSpace::Tcp, 18515).value(),
        0x0106_4853
    );
    assert_eq!(ServiceId::rdma_cm(PortSpace::IpoIb, 1).value(), 0x0002_0001);
    assert_eq!(ServiceId::rdma_cm(PortSpace::Ib, 1).value(), 0x013f_0001);
    // Not rdma_cm's shape: a non-zero upper half, or an unknown port space.
    assert_eq!(ServiceId(0x1_0106_1c06).port_space(), None);
    assert_eq!(ServiceId(0x0107_1c06).port(), None);
    assert_eq!(u64::from(ServiceId::from(5)), 5);
    assert_eq!(format!("{sid}"), "0x0000000001111c06");
}

#[test]
fn cma_headers_of_both_families() {
    let v6 = CmaHeader {
        src_port: 0x1234,
        src: "fd00::1".parse().unwrap(),
        dst: "fd00::2".parse().unwrap(),
    };
    let mut bytes = [0xee; 40];
    v6.emit(&mut bytes).unwrap();
    assert_eq!(&bytes[..4], &[0, 0x60, 0x12, 0x34]);
    assert_eq!(
        bytes[4..20],
        "fd00::1".parse::<Ipv6Addr>().unwrap().octets()
    );
    assert_eq!(&bytes[36..], &[0xee; 4], "only 36 bytes are written");
    assert_eq!(CmaHeader::parse(&bytes), Ok(v6));

    let v4 = CmaHeader {
        src_port: 7,
        src: Ipv4Addr::new(192, 0, 2, 1).into(),
        dst: Ipv4Addr::new(192, 0, 2, 2).into(),
    };
    v4.emit(&mut bytes).unwrap();
    let mut expected = [0u8; 36];
    expected[..4].copy_from_slice(&[0, 0x40, 0, 7]);
    expected[16..20].copy_from_slice(&[192, 0, 2, 1]);
    expected[32..36].copy_from_slice(&[192, 0, 2, 2]);
    assert_eq!(bytes[..36], expected);
    assert_eq!(CmaHeader::parse(&bytes), Ok(v4));

    assert_eq!(
        CmaHeader::parse(&bytes[..35]),
        Err(CmError::Truncated {
            what: "rdma_cm header",
            needed: 36,
            available: 35
        })
    );
    let mut bad = expected;
    bad[0] = 1;
    assert_eq!(CmaHeader::parse(&bad), Err(CmError::CmaVersion(1)));
    bad = expected;
    bad[1] = 0x50;
    assert_eq!(
        CmaHeader::parse(&bad),
        Err(CmError::Reserved {
            field: "rdma_cm header IP version",
            value: 5
        })
    );
    let mixed = CmaHeader { dst: v6.dst, ..v4 };
    assert!(matches!(
        mixed.emit(&mut bytes),
        Err(CmError::MixedFamilies { .. })
    ));
    assert!(matches!(
        v4.emit(&mut [0; 35]),
        Err(CmError::Truncated { needed: 36, .. })
    ));
}

#[test]
fn fixed_bytes_pad_and_trim() {
    let data = FixedBytes::<8>::from_slice(&[1, 2, 0, 3]).unwrap();
    assert_eq!(data.as_bytes(), &[1, 2, 0, 3, 0, 0, 0, 0]);
    assert_eq!(data.trimmed(), &[1, 2, 0, 3]);
    assert_eq!(FixedBytes::<2>::from_slice(&[1, 2, 3]), None);
    assert_eq!(format!("{data:?}"), "FixedBytes<8>(01020003 +4 zero)");
    assert_eq!(FixedBytes::<4>::default().trimmed(), &[] as &[u8]);
}

fn arbitrary_mad() -> impl Strategy<Value = Vec<u8>> {
    // Random bytes alone almost never make a CM header; half the cases get a valid one with
    // a random attribute, so the message bodies are exercised too.
    (
        vec(any::<u8>(), MAD_LEN),
        proptest::option::of(0..ATTRIBUTES.len()),
    )
        .prop_map(|(mut bytes, attribute)| {
            if let Some(i) = attribute {
                bytes[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
                bytes[16..18].copy_from_slice(&ATTRIBUTES[i].value().to_be_bytes());
            }
            bytes
        })
}

proptest! {
    /// Any 256 bytes either fail with an error or parse and re-emit to the same bytes in every
    /// bit [`preserved`] lists; the reserved bits come back as zero (they are not kept), and
    /// the re-emitted MAD parses to the same message.
    #[test]
    fn any_mad_fails_or_emits_back_every_defined_bit(bytes in arbitrary_mad()) {
        if let Ok((header, message)) = CmMessage::parse(&bytes) {
            let mut out = [0; MAD_LEN];
            prop_assert_eq!(message.emit(&header, &mut out), Ok(()));
            let mask = preserved(message.attribute_id());
            for i in 0..MAD_LEN {
                prop_assert_eq!(out[i], bytes[i] & mask[i], "{} byte {}", message.name(), i);
            }
            prop_assert_eq!(CmMessage::parse(&out), Ok((header, message)));
        }
    }

    /// Bytes of any length never panic the parsers.
    #[test]
    fn any_length_is_an_error_or_a_message(bytes in vec(any::<u8>(), 0..300)) {
        let parsed = CmMessage::parse(&bytes);
        if bytes.len() != MAD_LEN {
            prop_assert_eq!(parsed, Err(CmError::Length(bytes.len())));
        }
        let _ = MadHeader::parse(&bytes);
        let _ = CmaHeader::parse(&bytes);
    }

    /// Any rdma_cm header either fails or emits back its version, IP version nibble, port and
    /// addresses; the low nibble of byte 1 and an IPv4 address's 12 leading bytes are not kept.
    #[test]
    fn any_cma_header_fails_or_emits_back(mut bytes in vec(any::<u8>(), 36), v in 0..3u8) {
        if v > 0 {
            bytes[0] = 0;
            bytes[1] = (bytes[1] & 0x0f) | if v == 1 { 0x40 } else { 0x60 };
        }
        if let Ok(header) = CmaHeader::parse(&bytes) {
            let mut out = [0; 36];
            prop_assert_eq!(header.emit(&mut out), Ok(()));
            let mut expected = bytes.clone();
            expected[1] &= 0xf0;
            if bytes[1] >> 4 == 4 {
                expected[4..16].fill(0);
                expected[20..32].fill(0);
            }
            prop_assert_eq!(&out[..], &expected[..]);
        }
    }
}
