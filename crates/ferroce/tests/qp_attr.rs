//! Queue pairs brought up attribute by attribute (`Qp::modify`, `Qp::query`), as verbs programs
//! do it: RESET → INIT → RTR → RTS in separate calls, each checked as the providers check it,
//! between two soft NICs on 127.0.3.1 and 127.0.3.2 (and 127.0.3.3–5).

mod support;

use support::{host_region, soft_nic};

use std::net::Ipv4Addr;
use std::time::Duration;

use ferroce::cq::WcStatus;
use ferroce::proto::memory::Access;
use ferroce::proto::wire::RnrTimer;
use ferroce::proto::Psn;
use ferroce::qp::{ModifyError, Mtu, Payload, QpAttr, QpCaps, QpState, QpType, SendOp, SendWr};
use ferroce::{Cq, Qp, RegionAccess};

/// The RTR attributes toward `peer`, as `ibv_rc_pingpong` sets them.
fn rtr(peer: &Qp) -> QpAttr {
    let end = peer.endpoint();
    QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(Mtu::M1024),
        dest_qpn: Some(end.qpn),
        peer: Some(end.addr),
        rq_psn: Some(end.psn),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: RnrTimer::new(12),
        ..QpAttr::default()
    }
}

/// The RTS attributes, with our own first PSN.
fn rts(qp: &Qp) -> QpAttr {
    QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(qp.endpoint().psn),
        timeout: Some(14),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(1),
        ..QpAttr::default()
    }
}

#[test]
fn a_queue_pair_brought_up_step_by_step_carries_a_write_and_reports_its_attributes() {
    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 1)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 2)),
    );
    let cq_a = Cq::new(&a, 64).unwrap();
    let cq_b = Cq::new(&b, 64).unwrap();
    let qa = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qb = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    assert_eq!(qa.query().state, Some(QpState::Init), "created in INIT");

    // Skipping RTR, or RTR without its required attributes, is refused and changes nothing.
    assert!(matches!(
        qa.modify(&rts(&qa)),
        Err(ModifyError::InvalidTransition {
            from: QpState::Init,
            to: QpState::Rts
        })
    ));
    let no_peer = QpAttr {
        peer: None,
        ..rtr(&qb)
    };
    assert!(matches!(
        qa.modify(&no_peer),
        Err(ModifyError::Missing { attr: "peer", .. })
    ));
    assert_eq!(qa.state(), Some(QpState::Init));
    let too_many_retries = QpAttr {
        retry_cnt: Some(8),
        ..rts(&qa)
    };

    for (qp, peer) in [(&qa, &qb), (&qb, &qa)] {
        qp.modify(&QpAttr {
            access: Some(Access::REMOTE_WRITE),
            ..QpAttr::default()
        })
        .expect("INIT → INIT with the access peers get");
        qp.modify(&rtr(peer)).expect("INIT → RTR");
    }
    assert!(matches!(
        qa.modify(&too_many_retries),
        Err(ModifyError::InvalidValue {
            attr: "retry_cnt",
            ..
        })
    ));
    for qp in [&qa, &qb] {
        qp.modify(&rts(qp)).expect("RTR → RTS");
    }

    let q = qa.query();
    assert_eq!(q.state, Some(QpState::Rts));
    assert_eq!(q.dest_qpn, Some(qb.qpn()));
    assert_eq!(q.peer, Some(qb.endpoint().addr));
    assert_eq!(q.path_mtu, Some(Mtu::M1024));
    assert_eq!(q.access, Some(Access::REMOTE_WRITE));
    assert_eq!(q.sq_psn, Some(qa.endpoint().psn));
    assert_eq!(q.rq_psn, Some(qb.endpoint().psn));
    assert_eq!(
        (q.timeout, q.retry_cnt, q.rnr_retry),
        (Some(14), Some(7), Some(7))
    );
    assert_eq!(q.min_rnr_timer, RnrTimer::new(12));

    // The QP works: a WRITE lands, and the requester's next PSN moved past it.
    let src = host_region(&a, RegionAccess::Local, vec![0x5a; 3000]);
    let dst = host_region(&b, RegionAccess::RemoteWrite, vec![0; 3000]);
    qa.post_send(SendWr::new(
        1,
        SendOp::Write(dst.remote(0).unwrap()),
        Payload::Sge(src.local(0, 3000).unwrap()),
    ))
    .unwrap();
    let done = cq_a.wait(Duration::from_secs(10)).expect("a completion");
    assert_eq!(done.status, WcStatus::Success);
    let mut back = vec![0; 3000];
    dst.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    // 3000 bytes at MTU 1024: three packets.
    let sent = Psn::from_low_bits(qa.endpoint().psn.value().wrapping_add(3));
    assert_eq!(qa.query().sq_psn, Some(sent));

    // To ERR, by attribute: the state says so, and a post completes with a flush error.
    qa.modify(&QpAttr {
        state: Some(QpState::Err),
        ..QpAttr::default()
    })
    .unwrap();
    assert_eq!(qa.query().state, Some(QpState::Err));
    qa.post_send(SendWr::new(
        2,
        SendOp::Write(dst.remote(0).unwrap()),
        Payload::Sge(src.local(0, 8).unwrap()),
    ))
    .unwrap();
    let flushed = cq_a
        .wait(Duration::from_secs(10))
        .expect("a flush completion");
    assert_eq!(flushed.status, WcStatus::WrFlushErr);
}

/// `Qp::create` with `sq_sig_all`: an unsignaled send completes anyway; without it, it does
/// not (only the signaled one after it does).
#[test]
fn sq_sig_all_makes_every_send_complete() {
    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 3)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 4)),
    );
    let cq_a = Cq::new(&a, 16).unwrap();
    let cq_b = Cq::new(&b, 16).unwrap();
    let qb = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    let dst = host_region(&b, RegionAccess::RemoteWrite, vec![0; 64]);
    let src = host_region(&a, RegionAccess::Local, vec![9; 64]);
    for sig_all in [true, false] {
        let qa = Qp::create(
            &a,
            &ferroce::QpConfig {
                qp_type: QpType::Rc,
                send_cq: &cq_a,
                recv_cq: &cq_a,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: sig_all,
                in_reset: false,
            },
        )
        .unwrap();
        let options = ferroce::ConnectOptions::default();
        qa.connect(&qb.endpoint(), &options).unwrap();
        qb.connect(&qa.endpoint(), &options).unwrap();
        let write = |id, signaled| SendWr {
            signaled,
            ..SendWr::new(
                id,
                SendOp::Write(dst.remote(0).unwrap()),
                Payload::Sge(src.local(0, 64).unwrap()),
            )
        };
        qa.post_send(write(1, false)).unwrap();
        qa.post_send(write(2, true)).unwrap();
        let first = cq_a.wait(Duration::from_secs(10)).expect("a completion");
        assert_eq!(
            first.wr_id,
            if sig_all { 1 } else { 2 },
            "sq_sig_all {sig_all}"
        );
        if sig_all {
            assert_eq!(cq_a.wait(Duration::from_secs(10)).map(|c| c.wr_id), Some(2));
        }
        assert!(cq_a.poll().is_none());
        // The peer's QP goes back to RESET, INIT for the next round.
        qb.modify(&QpAttr {
            state: Some(QpState::Reset),
            ..QpAttr::default()
        })
        .unwrap();
        qb.modify(&QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::NONE),
            ..QpAttr::default()
        })
        .unwrap();
    }
}

/// `QpConfig::in_reset`: the queue pair starts in RESET, as `ibv_create_qp` leaves it, takes
/// no receives there, and RESET → INIT asks what the kernel asks: access flags for RC, a Q_Key
/// (and no access flags) for UD.
#[test]
fn a_queue_pair_created_in_reset_takes_what_the_kernel_requires_to_reach_init() {
    let nic = soft_nic(Ipv4Addr::new(127, 0, 3, 5));
    let cq = Cq::new(&nic, 16).unwrap();
    let region = host_region(&nic, RegionAccess::Local, vec![0; 64]);
    let create = |qp_type| {
        Qp::create(
            &nic,
            &ferroce::QpConfig {
                qp_type,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
                in_reset: true,
            },
        )
        .unwrap()
    };
    let rc = create(QpType::Rc);
    assert_eq!(rc.query().state, Some(QpState::Reset));
    let recv = || ferroce::qp::RecvWr {
        wr_id: 1,
        sges: vec![region.local(0, 64).unwrap()],
    };
    assert!(
        matches!(
            rc.post_recv(recv()),
            Err(ferroce::qp::PostError::InvalidState(QpState::Reset))
        ),
        "a receive in RESET"
    );
    let to_init = QpAttr {
        state: Some(QpState::Init),
        ..QpAttr::default()
    };
    assert!(
        matches!(
            rc.modify(&to_init),
            Err(ModifyError::Missing { attr: "access", .. })
        ),
        "RC needs its access flags"
    );
    assert_eq!(rc.query().state, Some(QpState::Reset), "unchanged");
    rc.modify(&QpAttr {
        access: Some(Access::REMOTE_WRITE),
        ..to_init
    })
    .unwrap();
    assert_eq!(rc.query().state, Some(QpState::Init));
    rc.post_recv(recv()).unwrap();

    let ud = create(QpType::Ud);
    assert!(
        matches!(
            ud.modify(&to_init),
            Err(ModifyError::Missing { attr: "qkey", .. })
        ),
        "UD needs its Q_Key"
    );
    ud.modify(&QpAttr {
        qkey: Some(0x1111_1111),
        ..to_init
    })
    .unwrap();
    assert_eq!(
        ud.query().state,
        Some(QpState::Init),
        "with no access flags"
    );
    assert_eq!(ud.query().qkey, Some(0x1111_1111));
}
