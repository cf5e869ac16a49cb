//! UD queue pairs and shared receive queues on the soft NIC over real UDP sockets: a datagram
//! answered through the address handle its completion gives, with the 40-byte header as the
//! kernel's socket delivered it; and an SRQ feeding three RC queue pairs with its limit event.
//! Each test has addresses of its own (127.0.0.80 and up), so they run in parallel.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferroce::cq::{Completion, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{AsyncEvent, Payload, PostError, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::ud::{AddressHandle, UD_GRH_LEN};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory, Srq};

fn nic(host: u8) -> Nic {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 4791);
    Nic::open(&NicConfig {
        addr,
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

fn wait(cq: &Cq) -> Completion {
    cq.wait(Duration::from_secs(10))
        .expect("a completion within 10 s")
}

#[test]
fn a_datagram_is_answered_through_the_address_its_completion_names() {
    let (a, b) = (nic(80), nic(81));
    let (cq_a, cq_b) = (Cq::new(&a, 64).unwrap(), Cq::new(&b, 64).unwrap());
    let qp_a = Qp::new(&a, QpType::Ud, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qp_b = Qp::new(&b, QpType::Ud, &cq_b, &cq_b, QpCaps::default()).unwrap();
    qp_a.ready_ud(0x1111_1111).unwrap();
    qp_b.ready_ud(0x1111_1111).unwrap();
    let len = 1000;
    let (tx_a, rx_a) = (region(&a, vec![0xa5; len]), region(&a, vec![0; 2048]));
    let (tx_b, rx_b) = (region(&b, vec![0x5a; len]), region(&b, vec![0; 2048]));
    let recv = |qp: &Qp, rx: &Region| {
        qp.post_recv(RecvWr {
            wr_id: 9,
            sges: vec![rx.local(0, 2048).unwrap()],
        })
        .unwrap();
    };
    recv(&qp_a, &rx_a);
    recv(&qp_b, &rx_b);

    let to_b = AddressHandle::new(b.addr().ip()).dest(qp_b.qpn(), 0x1111_1111);
    let send = SendWr::to(
        1,
        SendOp::SendWithImm(42),
        Payload::Sge(tx_a.local(0, len as u32).unwrap()),
        to_b,
    );
    qp_a.post_send(send).unwrap();
    assert_eq!(wait(&cq_a).status, WcStatus::Success);
    let got = wait(&cq_b);
    assert_eq!(
        (got.status, got.byte_len, got.imm),
        (WcStatus::Success, (UD_GRH_LEN + len) as u32, Some(42))
    );
    assert_eq!(got.ud.unwrap().qpn, qp_a.qpn());
    let mut header = [0; UD_GRH_LEN];
    rx_b.read(0, &mut header).unwrap();
    assert_eq!(header[..20], [0; 20]);
    assert_eq!(header[20], 0x45, "an IPv4 header follows 20 zero bytes");
    assert_eq!(header[32..36], [127, 0, 0, 80], "from A");
    assert_eq!(header[36..40], [127, 0, 0, 81], "to B");
    let mut payload = vec![0; len];
    rx_b.read(UD_GRH_LEN as u64, &mut payload).unwrap();
    assert!(payload.iter().all(|&b| b == 0xa5));

    // B answers whoever sent it, as udaddy's server does with ibv_create_ah_from_wc.
    let back = AddressHandle::from_completion(&got).unwrap();
    assert_eq!(back.peer().ip(), a.addr().ip());
    let reply = SendWr::to(
        2,
        SendOp::Send,
        Payload::Sge(tx_b.local(0, len as u32).unwrap()),
        back.dest(got.ud.unwrap().qpn, 0x1111_1111),
    );
    qp_b.post_send(reply).unwrap();
    assert_eq!(wait(&cq_b).status, WcStatus::Success);
    let answer = wait(&cq_a);
    assert_eq!(answer.status, WcStatus::Success);
    let mut payload = vec![0; len];
    rx_a.read(UD_GRH_LEN as u64, &mut payload).unwrap();
    assert!(payload.iter().all(|&b| b == 0x5a));

    // One datagram is one packet: no more than the port's MTU.
    let mtu = a.active_mtu().bytes();
    let big = region(&a, vec![0; mtu as usize + 1]);
    let too_long = SendWr::to(
        3,
        SendOp::Send,
        Payload::Sge(big.local(0, mtu + 1).unwrap()),
        to_b,
    );
    assert_eq!(
        qp_a.post_send(too_long),
        Err(PostError::DatagramTooLong {
            len: u64::from(mtu) + 1,
            mtu
        })
    );
}

#[test]
fn one_srq_serves_three_rc_queue_pairs_and_says_when_it_runs_low() {
    let (a, b) = (nic(82), nic(83));
    let (cq_a, cq_b) = (Cq::new(&a, 256).unwrap(), Cq::new(&b, 256).unwrap());
    let srq = Srq::new(&b, 32).unwrap();
    let options = ConnectOptions {
        access: RegionAccess::Local,
        ..ConnectOptions::default()
    };
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let qa = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
        let qb = Qp::with_srq(&b, QpType::Rc, &cq_b, &cq_b, &srq, QpCaps::default()).unwrap();
        qa.connect(&qb.endpoint(), &options).unwrap();
        qb.connect(&qa.endpoint(), &options).unwrap();
        pairs.push((qa, qb));
    }
    assert!(matches!(
        pairs[0].1.post_recv(RecvWr {
            wr_id: 0,
            sges: Vec::new()
        }),
        Err(PostError::UsesSrq(_))
    ));
    let rx = region(&b, vec![0; 32 * 256]);
    for i in 0..8u64 {
        srq.post_recv(RecvWr {
            wr_id: i,
            sges: vec![rx.local(i * 256, 256).unwrap()],
        })
        .unwrap();
    }
    srq.arm(4).unwrap();
    assert_eq!(srq.query().limit, 4);
    let tx = region(&a, (0..3 * 256).map(|i| (i / 256) as u8 + 1).collect());
    for (q, (qa, _)) in pairs.iter().enumerate() {
        for _ in 0..2 {
            let local = Payload::Sge(tx.local(q as u64 * 256, 256).unwrap());
            qa.post_send(SendWr::new(100 + q as u64, SendOp::Send, local))
                .unwrap();
        }
    }
    let sent: Vec<_> = (0..6).map(|_| wait(&cq_a)).collect();
    assert!(sent.iter().all(|c| c.status == WcStatus::Success));
    let received: Vec<_> = (0..6).map(|_| wait(&cq_b)).collect();
    for (q, (_, qb)) in pairs.iter().enumerate() {
        let mine: Vec<_> = received.iter().filter(|c| c.qpn == qb.qpn()).collect();
        assert_eq!(mine.len(), 2, "QP {q}'s two messages name it");
        for c in mine {
            assert_eq!((c.status, c.byte_len), (WcStatus::Success, 256));
            let mut bytes = vec![0; 256];
            rx.read(c.wr_id * 256, &mut bytes).unwrap();
            assert!(bytes.iter().all(|&b| b == q as u8 + 1), "QP {q}'s bytes");
        }
    }
    assert_eq!(b.poll_event(), Some(AsyncEvent::SrqLimitReached(srq.id())));
    assert_eq!(b.poll_event(), None, "once, then disarmed");
    let attr = srq.query();
    assert_eq!((attr.queued, attr.limit), (2, 0));
}
