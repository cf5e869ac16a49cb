//! `Cq::drive`, the frame receiver's wait: the thread that waits on the NIC's socket is the
//! one that receives. While it waits there (a millisecond at a time) the progress thread
//! keeps off the socket, rather than wake with it for each datagram and take its share: a
//! second thread landing packets beside the first cost a 4K stream's receiver CPU and lock
//! contention. Counted, not timed (`progress_thread_rcvd`).

mod support;

use std::time::{Duration, Instant};

use ferroce::qp::{Payload, RecvWr, SendOp, SendWr};
use ferroce::RegionAccess;
use support::{counter, host_region, rc_pair, soft_nic};

/// SENDs per attempt, each some hundreds of microseconds after the last: longer than the
/// 200 µs a poll holds the progress thread off, shorter than a wait on the socket.
const MESSAGES: u64 = 100;

#[test]
fn the_progress_thread_keeps_off_while_a_driver_waits_on_the_socket() {
    let (nic_a, nic_b) = (
        soft_nic([127, 0, 16, 1].into()),
        soft_nic([127, 0, 16, 2].into()),
    );
    let pair = rc_pair(&nic_a, &nic_b, 256);
    let (src, dst) = (
        host_region(&nic_a, RegionAccess::Local, vec![7; 8]),
        host_region(&nic_b, RegionAccess::Local, vec![0; 8]),
    );
    let recv = |id| RecvWr {
        wr_id: id,
        sges: vec![dst.local(0, 8).unwrap()],
    };
    // A descheduled driver hands the socket over for a while, which a loaded machine may do
    // in any one attempt: the median of five says whether the progress thread kept off (a
    // few of the 100 each time where it does, 40-58 where it did not).
    let mut shares = Vec::new();
    for attempt in 0..5 {
        let before = counter(&nic_b, "progress_thread_rcvd");
        std::thread::scope(|s| {
            s.spawn(|| {
                // As the frame receiver's monitor does: a receive posted again after each.
                pair.qb.post_recv(recv(0)).unwrap();
                for n in 0..MESSAGES {
                    let c = pair
                        .cq_b
                        .drive(Duration::from_secs(10))
                        .expect("a SEND within 10 s");
                    assert_eq!(c.wr_id, n, "attempt {attempt}");
                    if n + 1 < MESSAGES {
                        pair.qb.post_recv(recv(n + 1)).unwrap();
                    }
                }
            });
            std::thread::sleep(Duration::from_millis(1));
            for n in 0..MESSAGES {
                let next = Instant::now() + Duration::from_micros(400);
                pair.qa
                    .post_send(SendWr::new(
                        n,
                        SendOp::Send,
                        Payload::Sge(src.local(0, 8).unwrap()),
                    ))
                    .unwrap();
                let c = pair.cq_a.wait(Duration::from_secs(10)).expect("its ACK");
                assert_eq!(c.wr_id, n);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        });
        shares.push(counter(&nic_b, "progress_thread_rcvd") - before);
    }
    let mut sorted = shares.clone();
    sorted.sort_unstable();
    assert!(
        sorted[2] <= MESSAGES / 5,
        "the progress thread took {shares:?} of {MESSAGES} SENDs in five attempts"
    );
}
