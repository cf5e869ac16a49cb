//! UD queue pairs and shared receive queues in the simulated fabric: datagrams under loss and
//! duplication (never resent, every one accounted for), the Q_Key and length checks, the GSI,
//! and an SRQ shared by several RC queue pairs with its limit event and RNR.

mod fabric;

use std::net::IpAddr;
use std::time::Duration;

use fabric::{ConnectOptions, Fabric, LinkConfig};
use ferroce_proto::engine::roce_peer;
use ferroce_proto::memory::{Access, RegionInfo};
use ferroce_proto::qp::{
    AsyncEvent, Completion, Mtu, Payload, PostError, QpInit, QpType, RecvWr, SendOp, SendWr, Sge,
    UdDest, UdSource, WcOpcode, WcStatus, GSI_QKEY, UD_GRH_LEN,
};
use ferroce_proto::wire::Qpn;
use ferroce_proto::{CreateQpError, SrqError};

const QKEY: u32 = 0x1111_1111;

fn sge(region: &RegionInfo, at: u64, len: u32) -> Sge {
    Sge {
        addr: region.va + at,
        len,
        lkey: region.lkey,
    }
}

fn dest(f: &Fabric, node: usize, qpn: Qpn, qkey: u32) -> UdDest {
    UdDest {
        peer: roce_peer(f.nodes[node].ip),
        qpn,
        qkey,
    }
}

fn recvs(completions: &[Completion]) -> Vec<Completion> {
    completions
        .iter()
        .filter(|c| c.opcode == WcOpcode::Recv)
        .copied()
        .collect()
}

/// Node 0 sends `n` numbered datagrams of `len` bytes to node 1, which has `n * 2`
/// receives of `UD_GRH_LEN + len` posted.
struct UdRun {
    f: Fabric,
    src: Qpn,
    dst: Qpn,
    rx: RegionInfo,
    slot: u64,
}

impl UdRun {
    fn new(link: LinkConfig, seed: u64, n: usize, len: usize) -> Self {
        let mut f = Fabric::new(2, seed);
        f.link = link;
        let src = f.ud_qp(0, QKEY);
        let dst = f.ud_qp(1, QKEY);
        let slot = (UD_GRH_LEN + len) as u64;
        let tx = f.region(0, n * len, Access::NONE, 0);
        for i in 0..n {
            f.bytes_mut(0, &tx)[i * len..(i + 1) * len].fill(i as u8);
        }
        let rx = f.region(1, 2 * n * slot as usize, Access::LOCAL_WRITE, 0xee);
        for i in 0..2 * n as u64 {
            f.nodes[1]
                .engine
                .post_recv(
                    dst,
                    RecvWr {
                        wr_id: i,
                        sges: vec![sge(&rx, i * slot, slot as u32)],
                    },
                )
                .unwrap();
        }
        for i in 0..n {
            let to = dest(&f, 1, dst, QKEY);
            let op = SendOp::SendWithImm(i as u32);
            let local = Payload::Sge(sge(&tx, (i * len) as u64, len as u32));
            f.nodes[0]
                .engine
                .post_send(src, SendWr::to(i as u64, op, local, to))
                .unwrap();
        }
        Self {
            f,
            src,
            dst,
            rx,
            slot,
        }
    }
}

#[test]
fn datagrams_under_loss_and_duplication_are_never_resent_and_all_accounted_for() {
    let (n, len) = (300, 512);
    let link = LinkConfig {
        loss: 0.2,
        dup: 0.05,
        ..LinkConfig::default()
    };
    let mut run = UdRun::new(link, 7, n, len);
    run.f.run();
    let sent = run.f.completions(0);
    assert_eq!(sent.len(), n, "every send completes once it leaves");
    assert!(sent.iter().all(|c| c.status == WcStatus::Success));
    let tx = *run.f.nodes[0].engine.counters();
    assert_eq!(tx.sent_pkts, n as u64, "nothing is resent");
    assert_eq!(tx.completer_retry_err + tx.early_resends, 0);

    let received = recvs(&run.f.completions(1));
    let rx = *run.f.nodes[1].engine.counters();
    assert!(
        run.f.dropped > 20,
        "the link lost datagrams ({})",
        run.f.dropped
    );
    assert_eq!(
        received.len() as u64,
        run.f.delivered,
        "each arrival is one receive"
    );
    assert_eq!(rx.rdma_recvs, run.f.delivered);
    assert_eq!(rx.ud_no_recv + rx.qkey_err + rx.ud_len_err, 0);
    let unique: std::collections::BTreeSet<u32> = received.iter().map(|c| c.imm.unwrap()).collect();
    assert_eq!(
        unique.len() as u64 + run.f.dropped,
        n as u64,
        "every datagram arrived (once or twice) or was lost on the link"
    );
    assert!(
        received.len() > unique.len(),
        "duplicates arrive as datagrams of their own"
    );

    let sender_ip = run.f.nodes[0].ip;
    let bytes = run.f.bytes(1, &run.rx).to_vec();
    for c in &received {
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.byte_len as usize, UD_GRH_LEN + len);
        assert_eq!(c.qpn, run.dst);
        assert_eq!(
            c.ud,
            Some(UdSource {
                qpn: run.src,
                ip: sender_ip
            })
        );
        let at = (c.wr_id * run.slot) as usize;
        let buf = &bytes[at..at + UD_GRH_LEN + len];
        assert_eq!(buf[..20], [0; 20], "20 zero bytes before the IPv4 header");
        assert_eq!(buf[20], 0x45);
        let IpAddr::V4(ip) = sender_ip else {
            unreachable!()
        };
        assert_eq!(
            buf[32..36],
            ip.octets(),
            "the header's source is the sender"
        );
        let imm = c.imm.unwrap() as u8;
        assert!(buf[UD_GRH_LEN..].iter().all(|&b| b == imm), "payload {imm}");
    }
}

#[test]
fn a_datagram_without_a_receive_is_dropped_and_counted() {
    let mut f = Fabric::new(2, 1);
    let src = f.ud_qp(0, QKEY);
    let dst = f.ud_qp(1, QKEY);
    let tx = f.region(0, 64, Access::NONE, 1);
    let to = dest(&f, 1, dst, QKEY);
    f.nodes[0]
        .engine
        .post_send(
            src,
            SendWr::to(1, SendOp::Send, Payload::Sge(sge(&tx, 0, 64)), to),
        )
        .unwrap();
    f.run();
    assert_eq!(f.completions(0).len(), 1);
    assert!(f.completions(1).is_empty());
    let rx = f.nodes[1].engine.counters();
    assert_eq!(rx.ud_no_recv, 1);
    assert_eq!(rx.send_rnr_err, 0, "UD has no RNR");
    assert_eq!(
        f.nodes[1].engine.counters().sent_pkts,
        0,
        "and no answer at all"
    );
}

#[test]
fn the_qkey_is_checked_exactly_and_a_top_bit_means_the_senders_own() {
    let mut f = Fabric::new(2, 2);
    let src = f.ud_qp(0, 0x8000_1234);
    let dst = f.ud_qp(1, QKEY);
    let tx = f.region(0, 64, Access::NONE, 1);
    let rx = f.region(1, 1024, Access::LOCAL_WRITE, 0);
    for i in 0..4 {
        f.post_recv(1, dst, i, &rx, i * 256, 256);
    }
    let payload = || Payload::Sge(sge(&tx, 0, 64));
    let post = |f: &mut Fabric, id, qkey| {
        let to = dest(f, 1, dst, qkey);
        f.nodes[0]
            .engine
            .post_send(src, SendWr::to(id, SendOp::Send, payload(), to))
            .unwrap();
    };
    post(&mut f, 1, QKEY ^ 1);
    // The top bit: the sender's own Q_Key 0x80001234 goes out, which is not the receiver's.
    post(&mut f, 2, 0x8000_0000);
    post(&mut f, 3, QKEY);
    f.run();
    assert_eq!(f.nodes[1].engine.counters().qkey_err, 2);
    let got = recvs(&f.completions(1));
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].wr_id, 0,
        "the first receive went to the one right Q_Key"
    );
}

#[test]
fn a_datagram_is_one_packet_of_at_most_the_mtu_and_must_fit_its_receive() {
    let mut f = Fabric::new(2, 3);
    f.nodes[0].engine.set_port_mtu(Mtu::M1024);
    f.nodes[1].engine.set_port_mtu(Mtu::M1024);
    let src = f.ud_qp(0, QKEY);
    let dst = f.ud_qp(1, QKEY);
    let tx = f.region(0, 4096, Access::NONE, 1);
    let rx = f.region(1, 4096, Access::LOCAL_WRITE, 0);
    let to = dest(&f, 1, dst, QKEY);
    let wr = |id, len| SendWr::to(id, SendOp::Send, Payload::Sge(sge(&tx, 0, len)), to);
    assert_eq!(
        f.nodes[0].engine.post_send(src, wr(1, 1025)),
        Err(PostError::DatagramTooLong {
            len: 1025,
            mtu: 1024
        })
    );
    assert_eq!(
        f.nodes[0].engine.post_send(
            src,
            SendWr::new(2, SendOp::Send, Payload::Sge(sge(&tx, 0, 8)))
        ),
        Err(PostError::Destination),
        "a UD send names its destination"
    );
    let write = SendOp::Write(ferroce_proto::qp::RemoteAddr { va: 0, rkey: 0 });
    assert!(matches!(
        f.nodes[0]
            .engine
            .post_send(src, SendWr::to(3, write, Payload::Sge(sge(&tx, 0, 8)), to)),
        Err(PostError::Unsupported(_))
    ));
    // A receive of 40 + 100 bytes takes a 100-byte datagram, not a 101-byte one.
    f.post_recv(1, dst, 10, &rx, 0, (UD_GRH_LEN + 100) as u32);
    f.post_recv(1, dst, 11, &rx, 1024, (UD_GRH_LEN + 100) as u32);
    f.nodes[0].engine.post_send(src, wr(4, 101)).unwrap();
    f.nodes[0].engine.post_send(src, wr(5, 100)).unwrap();
    f.run();
    let got = recvs(&f.completions(1));
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].wr_id, got[0].status), (10, WcStatus::LocLenErr));
    assert_eq!((got[1].wr_id, got[1].status), (11, WcStatus::Success));
    assert_eq!(got[1].byte_len as usize, UD_GRH_LEN + 100);
    assert_eq!(f.nodes[1].engine.counters().ud_len_err, 1);
}

#[test]
fn the_gsi_is_qp_one_and_speaks_only_its_own_qkey() {
    let mut f = Fabric::new(2, 4);
    let init = |f: &Fabric, i: usize| QpInit {
        qp_type: QpType::Ud,
        pd: f.nodes[i].pd,
        send_cq: f.nodes[i].cq,
        recv_cq: f.nodes[i].cq,
        caps: Default::default(),
        sq_sig_all: false,
        srq: None,
    };
    let gsi_init = init(&f, 0);
    let gsi = f.nodes[0].engine.create_gsi_qp(gsi_init).unwrap();
    assert_eq!(gsi.value(), 1);
    assert_eq!(
        f.nodes[0].engine.create_gsi_qp(gsi_init),
        Err(CreateQpError::GsiExists)
    );
    let rc = QpInit {
        qp_type: QpType::Rc,
        ..init(&f, 1)
    };
    assert_eq!(
        f.nodes[1].engine.create_gsi_qp(rc),
        Err(CreateQpError::GsiNotUd(QpType::Rc))
    );
    let peer_init = init(&f, 1);
    let peer_gsi = f.nodes[1].engine.create_gsi_qp(peer_init).unwrap();
    // Whatever Q_Key modify_qp is given, QP 1's stays GSI_QKEY.
    f.ud_up(0, gsi, 0x42);
    f.ud_up(1, peer_gsi, 0x42);
    let other = f.ud_qp(0, 0x42);
    let tx = f.region(0, 256, Access::NONE, 7);
    let rx = f.region(1, 1024, Access::LOCAL_WRITE, 0);
    f.post_recv(1, peer_gsi, 1, &rx, 0, 512);
    f.post_recv(1, peer_gsi, 2, &rx, 512, 512);
    let mad = || Payload::Sge(sge(&tx, 0, 256));
    // A MAD from QP 1 carries GSI_QKEY whatever the request says; one from another QP with
    // 0x42 is refused by the peer's GSI.
    let to = dest(&f, 1, peer_gsi, 0x42);
    f.nodes[0]
        .engine
        .post_send(gsi, SendWr::to(1, SendOp::Send, mad(), to))
        .unwrap();
    f.nodes[0]
        .engine
        .post_send(other, SendWr::to(2, SendOp::Send, mad(), to))
        .unwrap();
    // GSI_QKEY is a controlled Q_Key (its top bit is set): an ordinary QP that names it
    // sends its own instead (C10-15), so it cannot pass for the GSI.
    let to = dest(&f, 1, peer_gsi, GSI_QKEY);
    f.nodes[0]
        .engine
        .post_send(other, SendWr::to(3, SendOp::Send, mad(), to))
        .unwrap();
    f.run();
    let got = recvs(&f.completions(1));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].ud.unwrap().qpn, gsi);
    assert_eq!(f.nodes[1].engine.counters().qkey_err, 2);
}

/// Node 1 serves three RC QPs from one SRQ of `receives` posted 4 KiB receives, its limit
/// armed at `limit`; node 0 sends `per_qp` 1 KiB SENDs on each.
struct SrqRun {
    f: Fabric,
    srq: ferroce_proto::qp::SrqId,
    senders: Vec<Qpn>,
    receivers: Vec<Qpn>,
    rx: RegionInfo,
}

impl SrqRun {
    fn new(receives: u64, limit: u32, per_qp: u64) -> Self {
        let mut f = Fabric::new(2, 5);
        let pd = f.nodes[1].pd;
        let srq = f.nodes[1].engine.create_srq(pd, 64);
        let opts = ConnectOptions::default();
        let (mut senders, mut receivers) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (a, b) = f.connect_srq(0, 1, QpType::Rc, &opts, Some(srq));
            senders.push(a);
            receivers.push(b);
        }
        let rx = f.region(1, 64 * 4096, Access::LOCAL_WRITE, 0);
        let mut run = Self {
            f,
            srq,
            senders,
            receivers,
            rx,
        };
        run.post(0..receives);
        run.f.nodes[1]
            .engine
            .modify_srq(srq, None, Some(limit))
            .unwrap();
        let tx = run.f.region(0, 3 * 1024, Access::NONE, 0);
        for (q, &qp) in run.senders.iter().enumerate() {
            run.f.bytes_mut(0, &tx)[q * 1024..(q + 1) * 1024].fill(q as u8 + 1);
            for i in 0..per_qp {
                let local = Payload::Sge(sge(&tx, q as u64 * 1024, 1024));
                run.f.nodes[0]
                    .engine
                    .post_send(qp, SendWr::new(i, SendOp::Send, local))
                    .unwrap();
            }
        }
        run
    }

    fn post(&mut self, ids: std::ops::Range<u64>) {
        for i in ids {
            let wr = RecvWr {
                wr_id: i,
                sges: vec![sge(&self.rx, slot(i), 4096)],
            };
            self.f.nodes[1].engine.post_srq_recv(self.srq, wr).unwrap();
        }
    }

    fn events(&mut self) -> Vec<AsyncEvent> {
        std::iter::from_fn(|| self.f.nodes[1].engine.poll_event()).collect()
    }
}

/// Where receive `wr_id` lands in the 64 slots of 4 KiB.
fn slot(wr_id: u64) -> u64 {
    wr_id % 64 * 4096
}

#[test]
fn an_srq_feeds_three_qps_fires_its_limit_once_and_rnr_naks_when_empty() {
    let mut run = SrqRun::new(8, 4, 4);
    // 12 SENDs for 8 receives: 8 land, the rest are RNR NAKed and retried.
    run.f.run_for(Duration::from_millis(50));
    let got = recvs(&run.f.completions(1));
    assert_eq!(got.len(), 8);
    assert!(run.f.nodes[1].engine.counters().send_rnr_err > 0);
    assert!(run.f.nodes[0].engine.counters().rcvd_rnr_err > 0);
    assert_eq!(
        run.events(),
        [AsyncEvent::SrqLimitReached(run.srq)],
        "once, though four receives were taken below the limit"
    );
    let attr = run.f.nodes[1].engine.query_srq(run.srq).unwrap();
    assert_eq!(
        (attr.queued, attr.limit, attr.max_wr),
        (0, 0, 64),
        "disarmed"
    );

    // Refilled and re-armed, the waiting SENDs land and the limit fires again.
    run.f.nodes[1]
        .engine
        .modify_srq(run.srq, None, Some(8))
        .unwrap();
    run.post(100..110);
    run.f.run_for(Duration::from_millis(200));
    let mut all = got;
    all.extend(recvs(&run.f.completions(1)));
    assert_eq!(all.len(), 12);
    assert_eq!(run.events(), [AsyncEvent::SrqLimitReached(run.srq)]);
    let sends = run.f.completions(0);
    assert_eq!(sends.len(), 12);
    assert!(sends.iter().all(|c| c.status == WcStatus::Success));

    // Each completion names the QP it came in on, and its bytes are that QP's.
    let bytes = run.f.bytes(1, &run.rx).to_vec();
    for (q, qpn) in run.receivers.iter().enumerate() {
        let mine: Vec<_> = all.iter().filter(|c| c.qpn == *qpn).collect();
        assert_eq!(mine.len(), 4, "QP {q}");
        for c in mine {
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, 1024));
            let at = slot(c.wr_id) as usize;
            assert!(bytes[at..at + 1024].iter().all(|&b| b == q as u8 + 1));
        }
    }
}

#[test]
fn an_srq_refuses_what_verbs_refuses_and_outlives_a_failed_qp() {
    let mut run = SrqRun::new(6, 0, 0);
    let engine = &mut run.f.nodes[1].engine;
    assert_eq!(engine.destroy_srq(run.srq), Err(SrqError::Busy(3)));
    assert!(matches!(
        engine.modify_srq(run.srq, Some(3), None),
        Err(SrqError::InvalidValue { what: "max_wr", .. })
    ));
    assert!(matches!(
        engine.modify_srq(run.srq, None, Some(64)),
        Err(SrqError::InvalidValue {
            what: "srq_limit",
            ..
        })
    ));
    let rq = RecvWr {
        wr_id: 0,
        sges: Vec::new(),
    };
    let first = run.receivers[0];
    assert_eq!(engine.post_recv(first, rq), Err(PostError::UsesSrq(first)));
    // One QP failing flushes none of the shared receives and says it took its last.
    engine
        .modify_qp(
            first,
            &ferroce_proto::qp::QpAttr {
                state: Some(ferroce_proto::qp::QpState::Err),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(run.events(), [AsyncEvent::QpLastWqeReached(first)]);
    let engine = &mut run.f.nodes[1].engine;
    assert_eq!(engine.query_srq(run.srq).unwrap().queued, 6);
    assert!(run.f.completions(1).is_empty(), "nothing flushed");
    let engine = &mut run.f.nodes[1].engine;
    for qp in run.receivers.clone() {
        assert!(engine.destroy_qp(qp));
    }
    assert_eq!(engine.destroy_srq(run.srq), Ok(()));
    assert_eq!(engine.query_srq(run.srq), None);
}
