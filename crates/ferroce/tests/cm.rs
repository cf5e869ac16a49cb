//! Connection management between two soft NICs over real sockets: connect, accept with
//! private data both ways, data over the connected QPs, disconnect from either side, the
//! refusals, SIDR, and many connections made and closed leaving nothing behind. Each test has
//! addresses of its own (127.0.0.100 and up).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferroce::cm::{self, CmError, ConnParam, Connection, Listener, RejectReason, SidrStatus};
use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::Qpn;
use ferroce::proto::Psn;
use ferroce::qp::{Payload, QpCaps, QpState, QpType, RecvWr, SendOp, SendWr};
use ferroce::ud::UD_GRH_LEN;
use ferroce::{Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

const SECOND: Duration = Duration::from_secs(1);

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

fn nic(host: u8) -> Nic {
    Nic::open(&NicConfig {
        addr: SocketAddr::new(ip(host), 4791),
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback")
}

/// Connects `qp_a` on `a` to `to`'s `listener` on `port`, which accepts with `qp_b`, default
/// parameters both ways: the client's and the server's connections, established.
fn connected(
    a: &Nic,
    qp_a: &Qp,
    listener: &Listener,
    qp_b: &Qp,
    to: IpAddr,
    port: u16,
) -> (Connection, Connection) {
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let request = listener.get_request(10 * SECOND).unwrap();
            let conn = request.accept(qp_b, &ConnParam::default()).unwrap();
            conn.wait_established(10 * SECOND).unwrap();
            conn
        });
        let client = Connection::connect(a, qp_a, to, port, &ConnParam::default()).unwrap();
        (client, server.join().unwrap())
    })
}

fn region(nic: &Nic, bytes: Vec<u8>) -> Region {
    Region::register(
        nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(bytes),
    )
    .unwrap()
}

#[test]
fn connect_exchange_data_and_disconnect_from_either_side() {
    let (a, b) = (nic(100), nic(101));
    let (cq_a, cq_b) = (Cq::new(&a, 64).unwrap(), Cq::new(&b, 64).unwrap());
    let listener = Listener::bind(&b, 7174).unwrap();
    assert!(matches!(
        Listener::bind(&b, 7174),
        Err(CmError::InUse(7174))
    ));
    for closer_is_client in [true, false] {
        let qp_a = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
        let qp_b = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
        let server = std::thread::scope(|s| {
            let server = s.spawn(|| {
                let request = listener.get_request(10 * SECOND).unwrap();
                assert_eq!(request.from(), ip(100));
                assert_eq!(&request.private_data()[..5], b"hello");
                assert_eq!(request.req().local_qpn, qp_a.qpn());
                let param = ConnParam {
                    private_data: b"welcome".to_vec(),
                    ..ConnParam::default()
                };
                let conn = request.accept(&qp_b, &param).unwrap();
                conn.wait_established(10 * SECOND).unwrap();
                conn
            });
            let param = ConnParam {
                private_data: b"hello".to_vec(),
                ..ConnParam::default()
            };
            let client = Connection::connect(&a, &qp_a, ip(101), 7174, &param).unwrap();
            assert_eq!(&client.private_data()[..7], b"welcome");
            (client, server.join().unwrap())
        });
        let (client, server) = server;

        // The QPs carry data both ways, and a READ (responder resources 1 each way).
        let rx = region(&b, vec![0; 64]);
        qp_b.post_recv(RecvWr {
            wr_id: 1,
            sges: vec![rx.local(0, 64).unwrap()],
        })
        .unwrap();
        let tx = region(&a, b"over rdma_cm".to_vec());
        qp_a.post_send(SendWr::new(
            2,
            SendOp::Send,
            Payload::Sge(tx.local(0, 12).unwrap()),
        ))
        .unwrap();
        assert_eq!(cq_a.wait(10 * SECOND).unwrap().status, WcStatus::Success);
        assert_eq!(cq_b.wait(10 * SECOND).unwrap().byte_len, 12);
        let mut got = [0; 12];
        rx.read(0, &mut got).unwrap();
        assert_eq!(&got, b"over rdma_cm");
        let remote = Region::register(
            &b,
            RegionAccess::Remote,
            WriteOrder::InOrder,
            RegionMemory::Host(vec![9; 32]),
        )
        .unwrap();
        let sink = region(&a, vec![0; 32]);
        qp_a.post_send(SendWr::new(
            3,
            SendOp::Read(remote.remote(0).unwrap()),
            Payload::Sge(sink.local(0, 32).unwrap()),
        ))
        .unwrap();
        assert_eq!(cq_a.wait(10 * SECOND).unwrap().status, WcStatus::Success);

        let (closer, other, other_qp) = if closer_is_client {
            (&client, &server, &qp_b)
        } else {
            (&server, &client, &qp_a)
        };
        closer.disconnect(10 * SECOND).unwrap();
        other.wait_disconnected(10 * SECOND).unwrap();
        assert_eq!(
            other_qp.state(),
            Some(QpState::Err),
            "the peer's DREQ stops the QP"
        );
        assert_eq!(qp_a.state(), Some(QpState::Err));
        drop((client, server));
    }
}

#[test]
fn refusals_come_back_with_their_reason() {
    let (a, b) = (nic(102), nic(103));
    let before = (a.census().unwrap(), b.census().unwrap());
    refusals(&a, &b);
    // Nothing of the refused attempts is left: no connection, QP, CQ or timer.
    assert_eq!(cm::connections(&a), Some(0));
    assert_eq!(cm::connections(&b), Some(0));
    assert_eq!(a.census().unwrap(), before.0);
    assert_eq!(b.census().unwrap(), before.1);
}

fn refusals(a: &Nic, b: &Nic) {
    let cq = Cq::new(a, 16).unwrap();
    let qp = Qp::new(a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    // Nobody listens: REJ 8, which rping reports as "RDMA_CM_EVENT_REJECTED, error 8".
    match Connection::connect(a, &qp, ip(103), 9999, &ConnParam::default()) {
        Err(CmError::Rejected { reason, .. }) => {
            assert_eq!(reason, RejectReason::InvalidServiceId);
            assert_eq!(reason.code(), 8);
        }
        other => panic!("{other:?}"),
    }
    // The application refuses with private data: REJ 28.
    let listener = Listener::bind(b, 7175).unwrap();
    let qp = Qp::new(a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let refused = std::thread::scope(|s| {
        s.spawn(|| {
            let request = listener.get_request(10 * SECOND).unwrap();
            request.reject(b"busy").unwrap();
        });
        Connection::connect(a, &qp, ip(103), 7175, &ConnParam::default())
    });
    match refused {
        Err(CmError::Rejected {
            reason,
            private_data,
        }) => {
            assert_eq!(reason, RejectReason::ConsumerDefined);
            assert_eq!(&private_data[..4], b"busy");
        }
        other => panic!("{other:?}"),
    }
    let long = ConnParam {
        private_data: vec![0; 57],
        ..ConnParam::default()
    };
    assert!(matches!(
        Connection::connect(a, &qp, ip(103), 7175, &long),
        Err(CmError::PrivateData {
            len: 57,
            max: 56,
            ..
        })
    ));
}

#[test]
fn sidr_finds_a_ud_queue_pair() {
    let (a, b) = (nic(104), nic(105));
    let cq_b = Cq::new(&b, 16).unwrap();
    let ud = Qp::new(&b, QpType::Ud, &cq_b, &cq_b, QpCaps::default()).unwrap();
    ud.ready_ud(cm::RDMA_UDP_QKEY_DEFAULT).unwrap();
    assert!(matches!(
        cm::resolve_ud(&a, ip(105), 7174, b"", 10 * SECOND),
        Err(CmError::Sidr(SidrStatus::Unsupported))
    ));
    let listener = Listener::bind_udp(&b, 7174).unwrap();
    let peer = std::thread::scope(|s| {
        s.spawn(|| {
            let request = listener.get_sidr_request(10 * SECOND).unwrap();
            assert_eq!(request.from(), ip(104));
            assert_eq!(&request.private_data()[..3], b"udp");
            // rdma_cm's header names the resolving id's port, as the kernel sends it.
            assert_eq!(request.peer(), Some(SocketAddr::new(ip(104), 51234)));
            request.accept(&ud, cm::RDMA_UDP_QKEY_DEFAULT).unwrap();
        });
        cm::resolve_ud_from(&a, Some(51234), ip(105), 7174, b"udp", 10 * SECOND).unwrap()
    });
    assert_eq!(peer.qpn, ud.qpn());
    assert_eq!(peer.qkey, cm::RDMA_UDP_QKEY_DEFAULT);
    // And a datagram reaches it there.
    let cq_a = Cq::new(&a, 16).unwrap();
    let mine = Qp::new(&a, QpType::Ud, &cq_a, &cq_a, QpCaps::default()).unwrap();
    mine.ready_ud(cm::RDMA_UDP_QKEY_DEFAULT).unwrap();
    let rx = region(&b, vec![0; 256]);
    ud.post_recv(RecvWr {
        wr_id: 1,
        sges: vec![rx.local(0, 256).unwrap()],
    })
    .unwrap();
    let tx = region(&a, vec![5; 100]);
    mine.post_send(SendWr::to(
        1,
        SendOp::Send,
        Payload::Sge(tx.local(0, 100).unwrap()),
        peer.address.dest(peer.qpn, peer.qkey),
    ))
    .unwrap();
    let got = cq_b.wait(10 * SECOND).unwrap();
    assert_eq!(got.byte_len as usize, UD_GRH_LEN + 100);
}

#[test]
fn a_thousand_connections_made_and_closed_leave_nothing_behind() {
    // As librdmacm's cmtime does: set up N connections, tear them down, and find each NIC as
    // it was: no QP, CQ, region or armed timer more, and no connection left in the CM.
    let (a, b) = (nic(106), nic(107));
    let before = (a.census().unwrap(), b.census().unwrap());
    let listener = Listener::bind(&b, 7176).unwrap();
    const N: usize = 1000;
    {
        let (cq_a, cq_b) = (Cq::new(&a, 64).unwrap(), Cq::new(&b, 64).unwrap());
        let qps_a: Vec<_> = (0..N)
            .map(|_| Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap())
            .collect();
        let qps_b: Vec<_> = (0..N)
            .map(|_| Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap())
            .collect();
        let (clients, servers) = std::thread::scope(|s| {
            let server = s.spawn(|| {
                qps_b
                    .iter()
                    .map(|qp| {
                        let request = listener.get_request(10 * SECOND).unwrap();
                        let conn = request.accept(qp, &ConnParam::default()).unwrap();
                        conn.wait_established(10 * SECOND).unwrap();
                        conn
                    })
                    .collect::<Vec<_>>()
            });
            let clients: Vec<_> = qps_a
                .iter()
                .map(|qp| {
                    Connection::connect(&a, qp, ip(107), 7176, &ConnParam::default()).unwrap()
                })
                .collect();
            (clients, server.join().unwrap())
        });
        assert_eq!(a.census().unwrap().qps, before.0.qps + N);
        for conn in &clients {
            conn.disconnect(10 * SECOND).unwrap();
        }
        for conn in &servers {
            conn.wait_disconnected(10 * SECOND).unwrap();
        }
        let counters = cm::counters(&a).unwrap();
        assert_eq!(counters.resends, 0, "{counters:?}");
        assert_eq!(counters.unexpected + counters.malformed, 0, "{counters:?}");
    }
    drop(listener);
    // Every connection is forgotten once timewait is over (QP numbers may be reused then).
    std::thread::sleep(Duration::from_millis(2300));
    assert_eq!(cm::connections(&a), Some(0));
    assert_eq!(cm::connections(&b), Some(0));
    assert_eq!(a.census().unwrap(), before.0);
    assert_eq!(b.census().unwrap(), before.1);
}

#[test]
fn queue_pairs_brought_up_by_their_owners_connect_as_librdmacm_users_do_it() {
    // The flow of a librdmacm program whose ids have no QP (UCX's rdmacm, or one that makes
    // its QPs with ibv_create_qp): the REQ and REP only name the QPs; each side moves its own
    // QP to RTR and RTS with what the exchange settled (rdma_init_qp_attr), and the active
    // side sends the RTU itself (rdma_establish).
    let (a, b) = (nic(108), nic(109));
    let (cq_a, cq_b) = (Cq::new(&a, 16).unwrap(), Cq::new(&b, 16).unwrap());
    let qp_a = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qp_b = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    let listener = Listener::bind(&b, 7177).unwrap();
    let (psn_a, psn_b) = (
        Psn::new(0x00ab_cdef).unwrap(),
        Psn::new(0x0012_3456).unwrap(),
    );
    let rx_b = region(&b, vec![0; 64]);
    let rx_a = region(&a, vec![0; 64]);
    let (conn_a, conn_b) = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let request = listener.get_request(10 * SECOND).unwrap();
            assert_eq!(request.req().local_qpn, qp_a.qpn());
            assert_eq!(request.req().starting_psn, psn_a);
            let param = ConnParam {
                private_data: b"own".to_vec(),
                ..ConnParam::default()
            };
            let settled = request.settle(psn_b, &param).unwrap();
            assert_eq!(settled.params.dest_qpn, qp_a.qpn());
            assert_eq!(settled.peer.ip(), ip(108));
            qp_b.modify(&settled.rtr()).unwrap();
            qp_b.modify(&settled.rts()).unwrap();
            qp_b.post_recv(RecvWr {
                wr_id: 1,
                sges: vec![rx_b.local(0, 64).unwrap()],
            })
            .unwrap();
            let conn = request.accept_own(qp_b.qpn(), psn_b, &param).unwrap();
            conn.wait_established(10 * SECOND).unwrap();
            conn
        });
        let replied =
            Connection::connect_own(&a, qp_a.qpn(), psn_a, ip(109), 7177, &ConnParam::default())
                .unwrap();
        assert_eq!(&replied.private_data()[..3], b"own");
        let settled = *replied.settled();
        assert_eq!(settled.params.dest_qpn, qp_b.qpn());
        assert_eq!(settled.params.sq_psn, psn_b);
        assert_eq!(settled.params.rq_psn, psn_a);
        // Nothing touched the QP: it is still where Qp::new left it.
        assert_eq!(qp_a.state(), Some(QpState::Init));
        qp_a.modify(&settled.rtr()).unwrap();
        qp_a.modify(&settled.rts()).unwrap();
        qp_a.post_recv(RecvWr {
            wr_id: 2,
            sges: vec![rx_a.local(0, 64).unwrap()],
        })
        .unwrap();
        let conn = replied.establish().unwrap();
        (conn, server.join().unwrap())
    });
    // Data both ways: each side starts at the PSN the other expects.
    let tx_a = region(&a, b"from a".to_vec());
    qp_a.post_send(SendWr::new(
        3,
        SendOp::Send,
        Payload::Sge(tx_a.local(0, 6).unwrap()),
    ))
    .unwrap();
    assert_eq!(cq_b.wait(10 * SECOND).unwrap().wr_id, 1);
    let tx_b = region(&b, b"from b!".to_vec());
    qp_b.post_send(SendWr::new(
        4,
        SendOp::Send,
        Payload::Sge(tx_b.local(0, 7).unwrap()),
    ))
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let c = cq_a.wait(10 * SECOND).unwrap();
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        got.push(c.wr_id);
    }
    got.sort_unstable();
    assert_eq!(got, [2, 3]);
    let mut bytes = [0; 7];
    rx_a.read(0, &mut bytes).unwrap();
    assert_eq!(&bytes, b"from b!");
    // The DREQ closes the connection and leaves the owners' QPs to their owners.
    conn_a.disconnect(10 * SECOND).unwrap();
    conn_b.wait_disconnected(10 * SECOND).unwrap();
    assert_eq!(qp_b.state(), Some(QpState::Rts));
    assert_eq!(qp_a.state(), Some(QpState::Rts));

    // A REP its application drops unanswered is rejected, as the kernel's CM rejects it.
    // Both sides name numbers no QP has (the QPs above are in timewait): UCX reserves a
    // number this way and connects its QPs with what the private data says.
    let (dummy_a, dummy_b) = (Qpn::new(0x1001).unwrap(), Qpn::new(0x1002).unwrap());
    let server = std::thread::scope(|s| {
        let server = s.spawn(|| {
            let request = listener.get_request(10 * SECOND).unwrap();
            let conn = request
                .accept_own(dummy_b, psn_b, &ConnParam::default())
                .unwrap();
            conn.wait_established(10 * SECOND)
        });
        drop(
            Connection::connect_own(&a, dummy_a, psn_a, ip(109), 7177, &ConnParam::default())
                .unwrap(),
        );
        server.join().unwrap()
    });
    assert!(
        matches!(
            server,
            Err(CmError::Rejected {
                reason: RejectReason::ConsumerDefined,
                ..
            })
        ),
        "{server:?}"
    );
}

#[test]
fn a_listener_closed_mid_handshake_refuses_and_leaves_nothing_behind() {
    let (a, b) = (nic(110), nic(111));
    let before = (a.census().unwrap(), b.census().unwrap());
    {
        let cq = Cq::new(&a, 16).unwrap();
        let qp = Qp::new(&a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
        let listener = Listener::bind(&b, 7178).unwrap();
        // The request has come; the listener closes, and the request goes unanswered: REJ
        // 28, as the kernel's CM sends for an id destroyed in REQ_RCVD.
        let refused = std::thread::scope(|s| {
            s.spawn(|| {
                let request = listener.get_request(10 * SECOND).unwrap();
                drop(listener);
                drop(request);
            });
            Connection::connect(&a, &qp, ip(111), 7178, &ConnParam::default())
        });
        assert!(
            matches!(
                refused,
                Err(CmError::Rejected {
                    reason: RejectReason::ConsumerDefined,
                    ..
                })
            ),
            "{refused:?}"
        );
        // And the port is free: nobody listens there any more (REJ 8).
        assert!(matches!(
            Connection::connect(&a, &qp, ip(111), 7178, &ConnParam::default()),
            Err(CmError::Rejected {
                reason: RejectReason::InvalidServiceId,
                ..
            })
        ));
        assert!(Listener::bind(&b, 7178).is_ok());
    }
    assert_eq!(cm::connections(&a), Some(0));
    assert_eq!(cm::connections(&b), Some(0));
    assert_eq!(a.census().unwrap(), before.0);
    assert_eq!(b.census().unwrap(), before.1);
}

#[test]
fn a_dreq_nobody_answers_still_disconnects_and_leaves_nothing_behind() {
    // The active side's NIC goes away while connected, so that every DREQ of the passive
    // side is lost: after its few retries (four times the REQ's 4 s response timeout) the
    // connection closes anyway, as the kernel's rdma_cm reports DISCONNECTED on a DREQ
    // timeout, and timewait then forgets it. Slow on purpose: these are the kernel's times.
    let (a, b) = (nic(112), nic(113));
    let before = b.census().unwrap();
    {
        let (cq_a, cq_b) = (Cq::new(&a, 16).unwrap(), Cq::new(&b, 16).unwrap());
        let qp_a = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
        let qp_b = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
        let listener = Listener::bind(&b, 7179).unwrap();
        let (conn_a, conn_b) = connected(&a, &qp_a, &listener, &qp_b, ip(113), 7179);
        a.close();
        assert!(matches!(
            conn_b.disconnect(SECOND),
            Err(CmError::Timeout { .. })
        ));
        conn_b.wait_disconnected(30 * SECOND).unwrap();
        assert_eq!(qp_b.state(), Some(QpState::Err));
        assert!(cm::counters(&b).unwrap().resends >= 3);
        drop(conn_a);
    }
    std::thread::sleep(Duration::from_millis(2300));
    assert_eq!(cm::connections(&b), Some(0));
    assert_eq!(b.census().unwrap(), before);
}

/// A side that answered its peer's DREQ lingers while the peer may still resend it (its NIC
/// is open: `linger` runs out first), and stops owing it once the peer's NIC has closed its
/// port: the peer can resend nothing then, and `linger` returns well before the five-second
/// interval it would otherwise wait out.
#[test]
fn a_peer_whose_nic_closed_is_not_waited_for() {
    let (a, b) = (nic(114), nic(115));
    let listener = Listener::bind(&b, 7174).unwrap();
    let cq_b = Cq::new(&b, 16).unwrap();
    let qp_b = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    {
        let cq_a = Cq::new(&a, 16).unwrap();
        let qp_a = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
        let (client, server) = connected(&a, &qp_a, &listener, &qp_b, ip(115), 7174);
        client.disconnect(10 * SECOND).unwrap();
        server.wait_disconnected(10 * SECOND).unwrap();
        assert!(
            !cm::linger(&b, Duration::from_millis(300)),
            "nothing owed to a peer that may resend its DREQ"
        );
        drop((client, server, qp_a, cq_a));
    }
    drop(a);
    assert!(
        cm::linger(&b, 3 * SECOND),
        "still owing a peer that is gone"
    );
}
