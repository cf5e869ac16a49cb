//! Golden vectors for the CM codec: the connection management MADs that Linux's own CM
//! (kernel 6.1, rxe on both ends) sent between two QEMU guests, captured on the bridge by
//! `interop/cm_captures.py` and kept in `testdata/cm/` (its README says how).
//!
//! Every MAD parses, and emitting what was parsed gives back the kernel's 256 bytes exactly.
//! The values are the ones rdmacm.md says the kernel sends, and the messages of one exchange
//! hang together: transaction IDs, communication IDs, QPNs, request IDs. A missing capture
//! fails the tests: the files are part of the repository.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use ferroce::capture::CaptureReader;
use ferroce::decode::{decode_frame, IcrcStatus};
use ferroce_proto::cm::{
    CmMessage, CmaHeader, MadHeader, MessageKind, Mtu, PathInfo, PortSpace, RejectReason, Req,
    ServiceId, SidrStatus, TransportType, IB_QP1_QKEY, MAD_LEN,
};
use ferroce_proto::wire::{icrc, Datagram, Opcode, Packet, Qpn, ROCE_PORT};

/// vm2, where every client ran: the active side.
const ACTIVE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 12);
/// vm1, where every server ran (or nothing listened): the passive side.
const PASSIVE: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 11);
/// The node GUIDs rxe derives from the guests' MACs, 52:54:00:77:00:{12,11} (EUI-64).
const ACTIVE_GUID: u64 = 0x5054_00ff_fe77_0012;
const PASSIVE_GUID: u64 = 0x5054_00ff_fe77_0011;
/// rdma_cm's default Q_Key for UD (`RDMA_UDP_QKEY`), returned in a successful SIDR_REP.
const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// rxe's UDP source port for QP 1: 0xC000 + hash_32(1, 14).
const QP1_UDP_SOURCE_PORT: u16 = 55410;

/// What one capture must hold.
struct Golden {
    /// `testdata/cm/NAME.pcap`.
    name: &'static str,
    /// The CM messages, in the order they crossed the bridge.
    messages: &'static [&'static str],
    /// The REQs' service ID and the connection parameters the tool asked for: responder
    /// resources, initiator depth, retry count, RNR retry count (the REP answers with the
    /// same responder resources and initiator depth in every capture here).
    req: Option<(ServiceId, u8, u8, u8, u8)>,
    /// The SIDR_REQ's service ID and the SIDR_REP's status.
    sidr: Option<(ServiceId, SidrStatus)>,
}

const fn tcp(port: u16) -> ServiceId {
    ServiceId::rdma_cm(PortSpace::Tcp, port)
}

const fn udp(port: u16) -> ServiceId {
    ServiceId::rdma_cm(PortSpace::Udp, port)
}

const GOLDEN: &[Golden] = &[
    Golden {
        name: "rping",
        messages: &["REQ", "REP", "RTU", "DREQ", "DREP"],
        req: Some((tcp(7174), 1, 1, 7, 7)),
        sidr: None,
    },
    Golden {
        name: "ucmatose",
        messages: &[
            "REQ", "REQ", "REP", "RTU", "REP", "RTU", "DREQ", "DREQ", "DREP", "DREP",
        ],
        // ucmatose's client leaves the RNR retry count at 0 and asks for 5 retries
        req: Some((tcp(7471), 1, 1, 5, 0)),
        sidr: None,
    },
    Golden {
        name: "udaddy",
        messages: &["SIDR_REQ", "SIDR_REP"],
        req: None,
        sidr: Some((udp(7174), SidrStatus::Success)),
    },
    Golden {
        // perftest -R: one RC connection for its own parameter exchange, one for the test
        name: "ib_send_bw-rc",
        messages: &[
            "REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREP", "DREQ", "DREP",
        ],
        req: Some((tcp(18515), 0, 0, 7, 7)),
        sidr: None,
    },
    Golden {
        // the same command again, where both sides closed the test's connection at once:
        // the two DREQs crossed, and each side answered the other's with a DREP
        name: "ib_send_bw-rc-dreqs-crossed",
        messages: &[
            "REQ", "REP", "RTU", "REQ", "REP", "RTU", "DREQ", "DREQ", "DREP", "DREP", "DREQ",
            "DREP",
        ],
        req: Some((tcp(18515), 0, 0, 7, 7)),
        sidr: None,
    },
    Golden {
        name: "rping-rej8",
        messages: &["REQ", "REJ"],
        req: Some((tcp(9999), 1, 1, 7, 7)),
        sidr: None,
    },
    Golden {
        // perftest -R -c UD: the RC connection for the parameter exchange, SIDR for the UD QP
        name: "ib_send_bw-ud",
        messages: &["REQ", "REP", "RTU", "SIDR_REQ", "SIDR_REP", "DREQ", "DREP"],
        req: Some((tcp(18515), 0, 0, 7, 7)),
        sidr: Some((udp(18515), SidrStatus::Success)),
    },
    Golden {
        name: "udaddy-unreachable",
        messages: &["SIDR_REQ", "SIDR_REP"],
        req: None,
        sidr: Some((udp(7174), SidrStatus::Unsupported)),
    },
];

/// One CM MAD of a capture.
struct Mad {
    /// The frame number in the capture, from 1.
    frame: u64,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    bytes: [u8; MAD_LEN],
    header: MadHeader,
    message: CmMessage,
}

impl Mad {
    fn sent_by_active(&self) -> bool {
        (self.src, self.dst) == (ACTIVE, PASSIVE)
    }

    fn sent_by_passive(&self) -> bool {
        (self.src, self.dst) == (PASSIVE, ACTIVE)
    }

    fn tid(&self) -> u64 {
        self.header.transaction_id
    }
}

fn capture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/cm")
}

/// Every frame of `testdata/cm/NAME.pcap`, each of which must be a CM MAD as rxe sends it:
/// UD SEND_ONLY from QP 1 to QP 1, P_Key 0xFFFF, Q_Key 0x80010000, a good ICRC, 256 bytes.
fn mads(name: &str) -> Vec<Mad> {
    let path = capture_dir().join(format!("{name}.pcap"));
    assert!(
        path.is_file(),
        "golden capture {} is missing (it is committed; interop/cm_captures.py takes it again)",
        path.display()
    );
    let reader = CaptureReader::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = Vec::new();
    for frame in reader {
        let frame = frame.unwrap_or_else(|e| panic!("{name}: {e}"));
        let at = format!("{name} frame {}", frame.index);
        let ip = frame.ip_packet().unwrap_or_else(|| panic!("{at}: no IP"));
        let d = Datagram::parse(ip).unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(d.udp.dst_port, ROCE_PORT, "{at}");
        assert_eq!(d.udp.src_port, QP1_UDP_SOURCE_PORT, "{at}: rxe's QP 1 port");
        assert!(icrc::verify(&d.ip, &d.udp, d.payload), "{at}: ICRC");
        let (IpAddr::V4(src), IpAddr::V4(dst)) = (d.ip.src(), d.ip.dst()) else {
            panic!("{at}: not IPv4");
        };
        let p = Packet::new_checked(d.payload).unwrap_or_else(|e| panic!("{at}: {e}"));
        assert_eq!(p.opcode(), Opcode::UD_SEND_ONLY, "{at}");
        assert_eq!(p.dest_qp(), Qpn::GSI, "{at}");
        assert_eq!(p.bth().pkey, 0xffff, "{at}");
        let deth = p.deth().unwrap();
        assert_eq!(deth.qkey, IB_QP1_QKEY, "{at}");
        assert_eq!(deth.src_qp, Qpn::GSI, "{at}");
        let bytes: [u8; MAD_LEN] = p
            .payload()
            .try_into()
            .unwrap_or_else(|_| panic!("{at}: a {}-byte MAD", p.payload().len()));
        let (header, message) = CmMessage::parse(&bytes).unwrap_or_else(|e| panic!("{at}: {e}"));

        // `ferroce decode` reads it the same way
        let record = decode_frame(&frame, ROCE_PORT).unwrap();
        assert_eq!(record.icrc, Some(IcrcStatus::Ok), "{at}");
        assert_eq!(record.error, None, "{at}");
        assert_eq!(record.cm_error, None, "{at}");
        assert_eq!(
            record.cm.as_ref().map(|c| c.message),
            Some(message.name()),
            "{at}"
        );

        out.push(Mad {
            frame: frame.index,
            src,
            dst,
            bytes,
            header,
            message,
        });
    }
    out
}

#[test]
fn every_capture_is_there_with_its_messages() {
    for g in GOLDEN {
        let names: Vec<_> = mads(g.name).iter().map(|m| m.message.name()).collect();
        assert_eq!(names, g.messages, "{}", g.name);
    }
    // and nothing in testdata/cm escapes these tests
    for entry in std::fs::read_dir(capture_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "pcap") {
            let stem = path.file_stem().unwrap().to_str().unwrap();
            assert!(
                GOLDEN.iter().any(|g| g.name == stem),
                "{}: a capture no test reads",
                path.display()
            );
        }
    }
}

#[test]
fn every_mad_emits_back_to_the_kernels_bytes() {
    let mut total = 0;
    for g in GOLDEN {
        for m in mads(g.name) {
            let mut again = [0xa5; MAD_LEN];
            m.message.emit(&m.header, &mut again).unwrap();
            let differ: Vec<_> = (0..MAD_LEN)
                .filter(|&i| again[i] != m.bytes[i])
                .map(|i| format!("{i}: {:02x} not {:02x}", again[i], m.bytes[i]))
                .collect();
            assert!(
                differ.is_empty(),
                "{} frame {} ({}): MAD bytes differ at {differ:?}",
                g.name,
                m.frame,
                m.message.name()
            );
            // the header is the one the codec would put on the message itself
            assert_eq!(m.header, m.message.header(m.tid()), "{}", g.name);
            total += 1;
        }
    }
    assert_eq!(total, 5 + 10 + 2 + 10 + 12 + 2 + 7 + 2);
}

/// A REQ as the kernel's rdma_cm builds it on RoCE (rdmacm.md §1.3, §2).
fn check_req(g: &Golden, m: &Mad, req: &Req) {
    let at = format!("{} frame {}", g.name, m.frame);
    let (service, rr, depth, retry, rnr) = g.req.expect("a REQ in this capture");
    assert!(m.sent_by_active(), "{at}: a REQ from the client");
    assert_eq!(req.service_id, service, "{at}");
    assert_eq!(req.local_ca_guid, ACTIVE_GUID, "{at}");
    assert_eq!(req.local_qkey, 0, "{at}: RC");
    assert_ne!(req.local_qpn.value(), 0, "{at}");
    assert_eq!(
        (req.responder_resources, req.initiator_depth),
        (rr, depth),
        "{at}"
    );
    assert_eq!((req.retry_count, req.rnr_retry_count), (retry, rnr), "{at}");
    assert_eq!((req.local_eecn, req.remote_eecn), (0, 0), "{at}");
    assert_eq!(req.transport_type, TransportType::Rc, "{at}");
    assert!(!req.end_to_end_flow_control, "{at}");
    assert_eq!(req.remote_cm_response_timeout, 20, "{at}");
    assert_eq!(req.local_cm_response_timeout, 20, "{at}");
    assert_eq!(req.max_cm_retries, 15, "{at}");
    assert_eq!(req.pkey, 0xffff, "{at}");
    // the guests' eth0 MTU is 1500
    assert_eq!(req.path_mtu, Mtu::M1024, "{at}");
    assert!(!req.rdc_exists && !req.srq, "{at}");
    assert_eq!(req.extended_transport_type, 0, "{at}");
    assert_ne!(req.starting_psn.value(), 0, "{at}: REQ starting PSN");

    let path = &req.primary_path;
    assert_eq!((path.local_lid, path.remote_lid), (0xffff, 0xffff), "{at}");
    assert_eq!(path.local_gid, ACTIVE.to_ipv6_mapped(), "{at}");
    assert_eq!(path.remote_gid, PASSIVE.to_ipv6_mapped(), "{at}");
    assert_eq!(path.packet_rate, 0, "{at}");
    assert_eq!(
        (path.traffic_class, path.hop_limit, path.sl),
        (0, 64, 0),
        "{at}"
    );
    assert!(!path.subnet_local, "{at}");
    // cm_ack_timeout for Debian 6.1's packet life time of 18
    assert_eq!(path.local_ack_timeout, 19, "{at}");
    assert_eq!(req.alternate_path, PathInfo::NONE, "{at}");

    let cma = check_cma(&at, &req.private_data.0);
    // rdma_cm's flow label for RoCE over IPv4: the ports, hashed
    let port = service.port().unwrap();
    let label = (u32::from(cma.src_port) * 31 + u32::from(port)) & 0xf_ffff;
    assert_eq!(path.flow_label, label, "{at}: flow label");
    // no user private data after the rdma_cm header, in any of these tools
    assert!(
        req.private_data.0[CmaHeader::LEN..].iter().all(|&b| b == 0),
        "{at}"
    );
}

/// The rdma_cm header at the start of a REQ's or SIDR_REQ's private data: from the client's
/// ephemeral rdma_cm port and address to the server's address, re-emitted to the same bytes.
fn check_cma(at: &str, private: &[u8]) -> CmaHeader {
    let cma = CmaHeader::parse(private).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert_eq!(private[..2], [0x00, 0x40], "{at}: cma_version 0, IPv4");
    assert_eq!(cma.src, IpAddr::V4(ACTIVE), "{at}");
    assert_eq!(cma.dst, IpAddr::V4(PASSIVE), "{at}");
    assert_ne!(cma.src_port, 0, "{at}");
    let mut again = [0xa5; CmaHeader::LEN];
    cma.emit(&mut again).unwrap();
    assert_eq!(
        again,
        private[..CmaHeader::LEN],
        "{at}: rdma_cm header bytes"
    );
    cma
}

#[test]
fn values_are_the_ones_the_kernel_sends() {
    for g in GOLDEN {
        for m in mads(g.name) {
            let at = format!("{} frame {}", g.name, m.frame);
            assert!(
                m.sent_by_active() || m.sent_by_passive(),
                "{at}: between the guests"
            );
            match &m.message {
                CmMessage::Req(req) => check_req(g, &m, req),
                CmMessage::Rep(rep) => {
                    let (_, rr, depth, _, _) = g.req.unwrap();
                    assert!(m.sent_by_passive(), "{at}");
                    assert_eq!(rep.local_ca_guid, PASSIVE_GUID, "{at}");
                    assert_eq!(rep.local_qkey, 0, "{at}");
                    assert_ne!(rep.local_qpn.value(), 0, "{at}");
                    assert_eq!(rep.local_eecn, 0, "{at}");
                    assert_ne!(rep.starting_psn.value(), 0, "{at}: REP starting PSN");
                    assert_eq!(
                        (rep.responder_resources, rep.initiator_depth),
                        (rr, depth),
                        "{at}"
                    );
                    // rxe's ACK delay; the passive kernel asks the active QP for 7 RNR
                    // retries (rdma_accept's conn_param in every tool here)
                    assert_eq!(rep.target_ack_delay, 15, "{at}");
                    assert_eq!(rep.failover_accepted, 0, "{at}");
                    assert!(!rep.end_to_end_flow_control && !rep.srq, "{at}");
                    assert_eq!(rep.rnr_retry_count, 7, "{at}");
                    assert!(rep.private_data.0.iter().all(|&b| b == 0), "{at}");
                }
                CmMessage::Rej(rej) => {
                    assert!(m.sent_by_passive(), "{at}");
                    assert_eq!(rej.reason, RejectReason::InvalidServiceId, "{at}");
                    assert_eq!(rej.reason.code(), 8, "{at}");
                    assert_eq!(rej.message_rejected, MessageKind::Req, "{at}");
                    // no listener: the kernel never made a cm_id of its own for the REQ
                    assert_eq!(rej.local_comm_id, 0, "{at}");
                    assert_eq!(rej.reject_info_length, 0, "{at}");
                    assert!(rej.ari.0.iter().all(|&b| b == 0), "{at}");
                    assert!(rej.private_data.0.iter().all(|&b| b == 0), "{at}");
                }
                CmMessage::Rtu(rtu) => {
                    assert!(m.sent_by_active(), "{at}");
                    assert!(rtu.private_data.0.iter().all(|&b| b == 0), "{at}");
                }
                CmMessage::Dreq(dreq) => {
                    assert_ne!(dreq.remote_qpn.value(), 0, "{at}");
                    assert!(dreq.private_data.0.iter().all(|&b| b == 0), "{at}");
                }
                CmMessage::Drep(drep) => {
                    assert!(drep.private_data.0.iter().all(|&b| b == 0), "{at}");
                }
                CmMessage::SidrReq(sidr) => {
                    let (service, _) = g.sidr.expect("SIDR in this capture");
                    assert!(m.sent_by_active(), "{at}");
                    assert_eq!(sidr.service_id, service, "{at}");
                    assert_eq!(sidr.pkey, 0xffff, "{at}");
                    check_cma(&at, &sidr.private_data.0);
                    assert!(
                        sidr.private_data.0[CmaHeader::LEN..]
                            .iter()
                            .all(|&b| b == 0),
                        "{at}"
                    );
                }
                CmMessage::SidrRep(rep) => {
                    let (service, status) = g.sidr.unwrap();
                    assert!(m.sent_by_passive(), "{at}");
                    assert_eq!(rep.status, status, "{at}");
                    assert_eq!(rep.service_id, service, "{at}");
                    assert_eq!(rep.additional_info_length, 0, "{at}");
                    assert!(rep.additional_info.0.iter().all(|&b| b == 0), "{at}");
                    assert!(rep.private_data.0.iter().all(|&b| b == 0), "{at}");
                    if status == SidrStatus::Success {
                        assert_eq!(rep.qkey, RDMA_UDP_QKEY, "{at}");
                        assert_ne!(rep.qpn.value(), 0, "{at}");
                    } else {
                        // no listener: no QP, no Q_Key
                        assert_eq!((rep.qpn.value(), rep.qkey), (0, 0), "{at}");
                    }
                }
                other => panic!("{at}: the kernel sent a {} here", other.name()),
            }
        }
    }
}

/// The kernel builds the transaction ID of the messages that open an exchange (REQ, DREQ,
/// SIDR_REQ) from its CM agent's high word and the sender's own ID, which it keeps in
/// little-endian order: the ID's bytes read backwards.
fn tid_carries(m: &Mad, id: u32) {
    assert_eq!(
        m.tid() as u32,
        id.swap_bytes(),
        "frame {} ({}): TID {:#018x}",
        m.frame,
        m.message.name(),
        m.tid()
    );
}

/// The MADs of one capture, each to be claimed by exactly one exchange.
struct Ledger<'a> {
    name: &'static str,
    mads: &'a [Mad],
    claimed: Vec<bool>,
}

impl<'a> Ledger<'a> {
    fn new(name: &'static str, mads: &'a [Mad]) -> Self {
        let claimed = vec![false; mads.len()];
        Self {
            name,
            mads,
            claimed,
        }
    }

    /// Claims every MAD `pred` picks; none may have been claimed before.
    fn all(&mut self, pred: impl Fn(&Mad) -> bool) -> Vec<usize> {
        let hits: Vec<_> = (0..self.mads.len())
            .filter(|&i| pred(&self.mads[i]))
            .collect();
        for &i in &hits {
            let m = &self.mads[i];
            assert!(!self.claimed[i], "{}: frame {} twice", self.name, m.frame);
            self.claimed[i] = true;
        }
        hits
    }

    /// Claims the one MAD `pred` picks, if any.
    fn one(&mut self, what: &str, pred: impl Fn(&Mad) -> bool) -> Option<usize> {
        let hits = self.all(pred);
        assert!(hits.len() <= 1, "{}: {} {what}s", self.name, hits.len());
        hits.first().copied()
    }

    fn unclaimed(&self) -> Vec<(u64, &'static str)> {
        self.mads
            .iter()
            .zip(&self.claimed)
            .filter(|(_, &c)| !c)
            .map(|(m, _)| (m.frame, m.message.name()))
            .collect()
    }
}

#[test]
fn each_exchange_hangs_together() {
    for g in GOLDEN {
        let mads = mads(g.name);
        let name = g.name;
        let mut book = Ledger::new(name, &mads);
        for (ri, req_mad) in mads.iter().enumerate() {
            let CmMessage::Req(req) = &req_mad.message else {
                continue;
            };
            book.one("REQ", |m| m.frame == req_mad.frame);
            let a = req.local_comm_id;
            tid_carries(req_mad, a);
            // the answer: a REJ (no listener) or a REP, each with the REQ's TID
            let rej = book.one(
                "REJ",
                |m| matches!(&m.message, CmMessage::Rej(x) if x.remote_comm_id == a),
            );
            if let Some(i) = rej {
                assert_eq!(name, "rping-rej8");
                assert_eq!(mads[i].tid(), req_mad.tid(), "{name}: REJ's TID");
                assert!(i > ri);
                continue;
            }
            let pi = book
                .one(
                    "REP",
                    |m| matches!(&m.message, CmMessage::Rep(x) if x.remote_comm_id == a),
                )
                .unwrap_or_else(|| panic!("{name}: no answer to the REQ {a:#x}"));
            let CmMessage::Rep(rep) = &mads[pi].message else {
                unreachable!()
            };
            let b = rep.local_comm_id;
            assert_ne!(b, 0, "{name}");
            assert_eq!(mads[pi].tid(), req_mad.tid(), "{name}: REP's TID");
            let ti = book
                .one("RTU", |m| {
                    m.sent_by_active()
                        && matches!(&m.message,
                            CmMessage::Rtu(x) if (x.local_comm_id, x.remote_comm_id) == (a, b))
                })
                .unwrap_or_else(|| panic!("{name}: no RTU for {a:#x}/{b:#x}"));
            assert_eq!(mads[ti].tid(), req_mad.tid(), "{name}: RTU's TID");
            assert!(ri < pi && pi < ti, "{name}: REQ, REP, RTU in order");

            // the close: a DREQ from one side naming the other's QPN, or one from each side
            // when both closed at once; each answered by the other side's DREP with its TID
            let dreqs = book.all(|m| {
                matches!(&m.message, CmMessage::Dreq(x)
                    if (m.sent_by_active() && (x.local_comm_id, x.remote_comm_id) == (a, b))
                        || (m.sent_by_passive() && (x.local_comm_id, x.remote_comm_id) == (b, a)))
            });
            assert!(
                !dreqs.is_empty(),
                "{name}: connection {a:#x}/{b:#x} never closed"
            );
            assert!(
                dreqs.len() == 1 || (dreqs.len() == 2 && mads[dreqs[0]].src != mads[dreqs[1]].src),
                "{name}: {} DREQs for {a:#x}/{b:#x}",
                dreqs.len()
            );
            for di in dreqs {
                let dreq_mad = &mads[di];
                let CmMessage::Dreq(dreq) = &dreq_mad.message else {
                    unreachable!()
                };
                let peer_qpn = if dreq_mad.sent_by_active() {
                    rep.local_qpn
                } else {
                    req.local_qpn
                };
                assert_eq!(dreq.remote_qpn, peer_qpn, "{name}: DREQ's QPN");
                tid_carries(dreq_mad, dreq.local_comm_id);
                let (x, y) = (dreq.local_comm_id, dreq.remote_comm_id);
                let ei = book
                    .one("DREP", |m| {
                        m.src == dreq_mad.dst
                            && matches!(&m.message,
                                CmMessage::Drep(d) if (d.local_comm_id, d.remote_comm_id) == (y, x))
                    })
                    .unwrap_or_else(|| panic!("{name}: no DREP for {x:#x}/{y:#x}"));
                assert_eq!(mads[ei].tid(), dreq_mad.tid(), "{name}: DREP's TID");
                assert!(ti < di && di < ei, "{name}: RTU, DREQ, DREP in order");
            }
        }
        for (qi, q) in mads.iter().enumerate() {
            let CmMessage::SidrReq(sidr) = &q.message else {
                continue;
            };
            book.one("SIDR_REQ", |m| m.frame == q.frame);
            tid_carries(q, sidr.request_id);
            let ri = book
                .one("SIDR_REP", |m| {
                    matches!(&m.message,
                        CmMessage::SidrRep(r) if r.request_id == sidr.request_id)
                })
                .unwrap_or_else(|| panic!("{name}: no SIDR_REP"));
            assert_eq!(mads[ri].tid(), q.tid(), "{name}: SIDR_REP's TID");
            assert!(qi < ri, "{name}");
        }
        let stray = book.unclaimed();
        assert!(
            stray.is_empty(),
            "{name}: messages of no exchange: {stray:?}"
        );
    }
}
