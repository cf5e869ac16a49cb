//! A CQ's completion channel on the soft NIC: armed with `Cq::req_notify`, its descriptor
//! (`AsFd`) turns readable at the next completion, or with `solicited_only` at the next
//! solicited or failed one, once per arming, as `ibv_req_notify_cq` and `ibv_get_cq_event`
//! behave. Two soft NICs on 127.0.3.21 and 127.0.3.22.

mod poll;
mod support;

use poll::readable;
use support::{host_region, soft_nic};

use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::time::Duration;

use ferroce::cq::{WcOpcode, WcStatus};
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Qp, Region, RegionAccess};

/// A send of 8 bytes, solicited or not.
fn send(qp: &Qp, src: &Region, id: u64, solicited: bool) {
    let wr = SendWr {
        solicited,
        ..SendWr::new(id, SendOp::Send, Payload::Sge(src.local(0, 8).unwrap()))
    };
    qp.post_send(wr).unwrap();
}

#[test]
fn an_armed_channel_fires_once_and_solicited_only_waits_for_a_solicited_or_failed_one() {
    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 21)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 22)),
    );
    let cq_a = Cq::new(&a, 64).unwrap();
    let send_b = Cq::new(&b, 64).unwrap();
    let recv_b = Cq::new(&b, 64).unwrap();
    let qa = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qb = Qp::new(&b, QpType::Rc, &send_b, &recv_b, QpCaps::default()).unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let src = host_region(&a, RegionAccess::Local, vec![1; 64]);
    let sink = host_region(&b, RegionAccess::Local, vec![0; 64 * 8]);
    for i in 0..8 {
        qb.post_recv(RecvWr {
            wr_id: i,
            sges: vec![sink.local(i * 64, 64).unwrap()],
        })
        .unwrap();
    }

    // Not armed: a completion raises nothing.
    send(&qa, &src, 1, false);
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    let got = recv_b.wait(Duration::from_secs(10)).expect("the receive");
    assert_eq!(got.opcode, WcOpcode::Recv);
    assert!(!readable(recv_b.as_fd(), Duration::from_millis(50)));
    assert_eq!(recv_b.take_events(), 0);

    // Armed for any: the next receive fires it, once.
    recv_b.req_notify(false).unwrap();
    send(&qa, &src, 2, false);
    assert!(
        readable(recv_b.as_fd(), Duration::from_secs(10)),
        "the channel fires"
    );
    assert_eq!(recv_b.take_events(), 1);
    assert!(
        recv_b.poll().is_some(),
        "and the completion is there to poll"
    );
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    send(&qa, &src, 3, false);
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    assert!(recv_b.wait(Duration::from_secs(10)).is_some());
    assert!(
        !readable(recv_b.as_fd(), Duration::from_millis(50)),
        "a fired arming does not fire again"
    );

    // Armed for solicited ones: an unsolicited receive passes by, a solicited one fires.
    recv_b.req_notify(true).unwrap();
    send(&qa, &src, 4, false);
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    assert!(recv_b.wait(Duration::from_secs(10)).is_some());
    assert!(!readable(recv_b.as_fd(), Duration::from_millis(50)));
    send(&qa, &src, 5, true);
    assert!(
        readable(recv_b.as_fd(), Duration::from_secs(10)),
        "the solicited one fires"
    );
    assert_eq!(recv_b.take_events(), 1);
    assert!(recv_b.poll().is_some());

    // Armed for solicited ones: a failed completion fires it too (the QP flushed).
    recv_b.req_notify(true).unwrap();
    qb.shutdown();
    assert!(
        readable(recv_b.as_fd(), Duration::from_secs(10)),
        "a flush fires"
    );
    assert_eq!(recv_b.take_events(), 1);
    let flushed = recv_b.poll().expect("a flushed receive");
    assert_eq!(flushed.status, WcStatus::WrFlushErr);
}

/// `Cq::resize` (`ibv_resize_cq`): a CQ grows and shrinks, but not below what it holds.
#[test]
fn a_cq_resizes_but_not_below_what_it_holds() {
    let a = soft_nic(Ipv4Addr::new(127, 0, 3, 23));
    let cq = Cq::new(&a, 4).unwrap();
    let qp = Qp::new(&a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let sink = host_region(&a, RegionAccess::Local, vec![0; 64]);
    for i in 0..3 {
        qp.post_recv(RecvWr {
            wr_id: i,
            sges: vec![sink.local(0, 64).unwrap()],
        })
        .unwrap();
    }
    // Three flushed receives wait in the CQ.
    qp.shutdown();
    assert!(matches!(
        cq.resize(2),
        Err(ferroce::NicError::CqTooSmall { depth: 2 })
    ));
    assert_eq!(cq.depth(), 4, "a refused resize changes nothing");
    assert_eq!(cq.poll().map(|c| c.status), Some(WcStatus::WrFlushErr));
    cq.resize(2).expect("two completions fit in two");
    assert_eq!(cq.depth(), 2);
    cq.resize(256).unwrap();
    assert_eq!(cq.depth(), 256);
    assert_eq!(
        std::iter::from_fn(|| cq.poll()).count(),
        2,
        "nothing lost on the way"
    );
}
