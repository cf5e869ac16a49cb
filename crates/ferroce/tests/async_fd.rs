//! The NIC's async-event descriptor (`Nic::async_fd`, `ibv_context.async_fd`) on the soft NIC:
//! readable while an event waits for `Nic::poll_event`, and no longer once the last is taken.
//! Two soft NICs on 127.0.3.31 and 127.0.3.32; the event is an SRQ falling below its limit.

mod poll;
mod support;

use poll::readable;
use support::{host_region, soft_nic};

use std::net::Ipv4Addr;
use std::time::Duration;

use ferroce::qp::{AsyncEvent, Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Qp, RegionAccess, Srq};

#[test]
fn the_async_descriptor_is_readable_while_an_event_waits() {
    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 31)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 32)),
    );
    assert!(!readable(b.async_fd(), Duration::ZERO), "nothing yet");
    let cq_a = Cq::new(&a, 16).unwrap();
    let cq_b = Cq::new(&b, 16).unwrap();
    let srq = Srq::new(&b, 16).unwrap();
    let qa = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qb = Qp::with_srq(&b, QpType::Rc, &cq_b, &cq_b, &srq, QpCaps::default()).unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    let src = host_region(&a, RegionAccess::Local, vec![3; 64]);
    let sink = host_region(&b, RegionAccess::Local, vec![0; 64 * 4]);
    for i in 0..4 {
        srq.post_recv(RecvWr {
            wr_id: i,
            sges: vec![sink.local(i * 64, 64).unwrap()],
        })
        .unwrap();
    }
    srq.arm(3).unwrap();

    // The first SEND leaves 3 queued (not below the limit): no event.
    let send = |id| {
        qa.post_send(SendWr::new(
            id,
            SendOp::Send,
            Payload::Sge(src.local(0, 8).unwrap()),
        ))
        .unwrap();
        assert!(cq_a.wait(Duration::from_secs(10)).is_some());
        assert!(cq_b.wait(Duration::from_secs(10)).is_some());
    };
    send(1);
    assert!(!readable(b.async_fd(), Duration::from_millis(50)));
    // The second leaves 2: the limit event, and the descriptor says so.
    send(2);
    assert!(
        readable(b.async_fd(), Duration::from_secs(10)),
        "readable with the event waiting"
    );
    assert_eq!(b.poll_event(), Some(AsyncEvent::SrqLimitReached(srq.id())));
    assert!(
        !readable(b.async_fd(), Duration::from_millis(50)),
        "not readable once the last event is taken"
    );
    assert_eq!(b.poll_event(), None);
    assert!(
        !readable(a.async_fd(), Duration::ZERO),
        "the other NIC saw none"
    );
}
