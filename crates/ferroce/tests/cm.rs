//! Connection management between two soft NICs over real sockets: connect, accept with
//! private data both ways, data over the connected QPs, disconnect from either side, the
//! refusals, SIDR, and many connections made and closed leaving nothing behind. Each test has
//! addresses of its own (127.0.0.100 and up).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferroce::cm::{self, CmError, ConnParam, Connection, Listener, RejectReason, SidrStatus};
use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
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
    let cq = Cq::new(&a, 16).unwrap();
    let qp = Qp::new(&a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    // Nobody listens: REJ 8, which rping reports as "RDMA_CM_EVENT_REJECTED, error 8".
    match Connection::connect(&a, &qp, ip(103), 9999, &ConnParam::default()) {
        Err(CmError::Rejected { reason, .. }) => {
            assert_eq!(reason, RejectReason::InvalidServiceId);
            assert_eq!(reason.code(), 8);
        }
        other => panic!("{other:?}"),
    }
    // The application refuses with private data: REJ 28.
    let listener = Listener::bind(&b, 7175).unwrap();
    let qp = Qp::new(&a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let refused = std::thread::scope(|s| {
        s.spawn(|| {
            let request = listener.get_request(10 * SECOND).unwrap();
            request.reject(b"busy").unwrap();
        });
        Connection::connect(&a, &qp, ip(103), 7175, &ConnParam::default())
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
        Connection::connect(&a, &qp, ip(103), 7175, &long),
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
            request.accept(&ud, cm::RDMA_UDP_QKEY_DEFAULT).unwrap();
        });
        cm::resolve_ud(&a, ip(105), 7174, b"udp", 10 * SECOND).unwrap()
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
