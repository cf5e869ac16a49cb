//! A CQ's completion channel on the soft NIC: armed with `Cq::req_notify`, its descriptor
//! (`AsFd`) turns readable at the next completion, or with `solicited_only` at the next
//! solicited or failed one, once per arming, as `ibv_req_notify_cq` and `ibv_get_cq_event`
//! behave; an event-driven ping-pong as `rping` runs one; and a post made beside a poller
//! that then stops, whose timer the progress thread must still run; and a poller that polls
//! long and then stops, whose peer the progress thread must still answer; and events
//! announced by a call instead of the descriptor. Soft NICs on 127.0.3.21–29, .33 and .34.

mod poll;
mod support;

use poll::readable;
use support::{host_region, rc_pair, soft_nic, RcPair};

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

/// `Cq::announce_events` (a C channel that several CQs share, as the drop-in libibverbs's):
/// each firing is one call, made once per arming, and the CQ's own descriptor stays quiet.
#[test]
fn announced_events_are_one_call_per_arming_and_leave_the_descriptor_quiet() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 33)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 34)),
    );
    let RcPair { qa, qb, cq_a, cq_b } = rc_pair(&a, &b, 64);
    let src = host_region(&a, RegionAccess::Local, vec![1; 64]);
    let sink = host_region(&b, RegionAccess::Local, vec![0; 64 * 4]);
    for i in 0..4 {
        qb.post_recv(RecvWr {
            wr_id: i,
            sges: vec![sink.local(i * 64, 64).unwrap()],
        })
        .unwrap();
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    cq_b.announce_events(move || {
        counted.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    // Waits up to ten seconds for the count to reach `n`.
    let reaches = |n: usize| {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) < n && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(1));
        }
        calls.load(Ordering::SeqCst) == n
    };

    // Not armed: nothing is announced.
    send(&qa, &src, 1, false);
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    assert!(cq_b.wait(Duration::from_secs(10)).is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Armed: the next receive is one call, and the descriptor stays quiet.
    cq_b.req_notify(false).unwrap();
    send(&qa, &src, 2, false);
    assert!(reaches(1), "the arming is announced by a call");
    assert!(!readable(cq_b.as_fd(), Duration::from_millis(50)));
    assert_eq!(cq_b.take_events(), 0);
    assert!(cq_b.poll().is_some());

    // Fired once: the next receive passes by until the CQ is armed again.
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    send(&qa, &src, 3, false);
    assert!(cq_a.wait(Duration::from_secs(10)).is_some());
    assert!(cq_b.wait(Duration::from_secs(10)).is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a fired arming calls once");
    cq_b.req_notify(false).unwrap();
    send(&qa, &src, 4, false);
    assert!(reaches(2), "the next arming calls again");
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

/// What one side's CQ thread saw.
#[derive(Debug, PartialEq)]
enum Seen {
    Sent,
    Received,
}

/// A CQ thread as `rping`'s: waits on the channel (armed before anything was posted), takes
/// the event, arms again, then polls until the CQ is empty, posting a fresh receive for each
/// one taken. Returns when `stop` is set.
fn cq_thread(
    cq: &Cq,
    qp: &Qp,
    sink: &Region,
    tell: &std::sync::mpsc::Sender<Seen>,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    while !stop.load(Ordering::Relaxed) {
        if !readable(cq.as_fd(), Duration::from_millis(50)) {
            continue;
        }
        let _ = cq.take_events();
        cq.req_notify(false).unwrap();
        while let Some(c) = cq.poll() {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            let seen = if c.opcode == WcOpcode::Recv {
                qp.post_recv(RecvWr {
                    wr_id: c.wr_id,
                    sges: vec![sink.local(0, 64).unwrap()],
                })
                .unwrap();
                Seen::Received
            } else {
                Seen::Sent
            };
            let _ = tell.send(seen);
        }
    }
}

/// Waits for what the CQ thread reports next, at most 10 s: a completion the engine had
/// everything for but waited on a progress thread that nobody woke never comes.
fn next(seen: &std::sync::mpsc::Receiver<Seen>, round: usize, side: &str) -> Seen {
    seen.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| {
            panic!("round {round}: {side} waited 10 s for a completion (a lost wake-up)")
        })
}

/// `rping`'s shape on the soft NIC's own API: on each side a thread that waits on the CQ's
/// channel, takes the event, arms it again and polls until the CQ is empty, reposting
/// receives; the pinger's main thread posts a SEND while that thread may still count as
/// polling and waits for it to report the SEND's completion and the answer; the echo's main
/// thread READs the pinger's buffer, as rping's server does, then answers with a SEND. Every
/// completion must come with nobody polling between events: the progress thread has to be
/// awake for each. One pair for 300 round trips, then four fresh pairs on the same addresses
/// for 20 each (a NIC's first exchanges run while its progress thread starts). Drop-in
/// `rping` itself runs in `scripts/test-rdmacm.sh`, which caught a doorbell change that this
/// test did not (BENCHMARKS.md, the data path's sixth step).
#[test]
fn an_event_driven_ping_pong_loses_no_wake_up() {
    event_driven_ping_pong(300);
    for _ in 0..4 {
        event_driven_ping_pong(20);
    }
}

fn event_driven_ping_pong(rounds: usize) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::channel;
    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 24)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 25)),
    );
    let RcPair { qa, qb, cq_a, cq_b } = rc_pair(&a, &b, 64);
    let (src_a, src_b) = (
        host_region(&a, RegionAccess::Remote, vec![1; 64]),
        host_region(&b, RegionAccess::Local, vec![2; 64]),
    );
    let read_into = host_region(&b, RegionAccess::Local, vec![0; 64]);
    let (sink_a, sink_b) = (
        host_region(&a, RegionAccess::Local, vec![0; 64]),
        host_region(&b, RegionAccess::Local, vec![0; 64]),
    );
    for (qp, sink) in [(&qa, &sink_a), (&qb, &sink_b)] {
        for i in 0..4 {
            qp.post_recv(RecvWr {
                wr_id: i,
                sges: vec![sink.local(0, 64).unwrap()],
            })
            .unwrap();
        }
    }
    // Armed before the first post: a completion before the arming would raise nothing.
    cq_a.req_notify(false).unwrap();
    cq_b.req_notify(false).unwrap();
    let stop = AtomicBool::new(false);
    let ((tell_a, seen_a), (tell_b, seen_b)) = (channel(), channel());
    std::thread::scope(|s| {
        s.spawn(|| cq_thread(&cq_a, &qa, &sink_a, &tell_a, &stop));
        s.spawn(|| cq_thread(&cq_b, &qb, &sink_b, &tell_b, &stop));
        let (qa, qb, src_a, src_b, read_into) = (&qa, &qb, &src_a, &src_b, &read_into);
        let echo = s.spawn(move || {
            for round in 0..rounds {
                assert_eq!(next(&seen_b, round, "the echo"), Seen::Received);
                // As rping's server: a READ of the pinger's buffer, then the answer.
                let read = SendWr::new(
                    round as u64,
                    SendOp::Read(src_a.remote(0).unwrap()),
                    Payload::Sge(read_into.local(0, 64).unwrap()),
                );
                qb.post_send(read).unwrap();
                assert_eq!(next(&seen_b, round, "the echo's READ"), Seen::Sent);
                send(qb, src_b, round as u64, false);
                assert_eq!(next(&seen_b, round, "the echo"), Seen::Sent);
            }
        });
        let pinger = s.spawn(move || {
            for round in 0..rounds {
                send(qa, src_a, round as u64, false);
                let mut got = [
                    next(&seen_a, round, "the pinger"),
                    next(&seen_a, round, "the pinger"),
                ];
                got.sort_by_key(|s| *s == Seen::Received);
                assert_eq!(got, [Seen::Sent, Seen::Received], "round {round}");
            }
        });
        let (pinged, echoed) = (pinger.join(), echo.join());
        stop.store(true, Ordering::Relaxed);
        pinged.unwrap();
        echoed.unwrap();
    });
}

/// A post made while the application counts as polling, whose only timer is the progress
/// thread's to run once the application stops: it sleeps on the socket (nothing was in
/// flight), and the post arms a timer (here the link's, which holds every packet back by
/// 3 ms). The post must ring it, even though a poller is active, since a poller that then
/// stops polling without a word (its grace lapses, and waiting in `Cq::wait` then rings
/// nothing) would otherwise leave the packet held for good: a first form of the progress
/// thread's nap beside pollers skipped that doorbell, and `rping` on the drop-in hung.
#[test]
fn a_post_beside_a_poller_that_then_stops_still_has_its_timer_run() {
    let delayed = ferroce::NicConfig {
        addr: std::net::SocketAddr::new(Ipv4Addr::new(127, 0, 3, 26).into(), 4791),
        faults: Some(ferroce::nic::Faults {
            delay: Duration::from_millis(3),
            seed: 1,
            ..Default::default()
        }),
        ..ferroce::NicConfig::default()
    };
    let a = ferroce::Nic::open(&delayed).unwrap();
    let b = soft_nic(Ipv4Addr::new(127, 0, 3, 27));
    let RcPair {
        qa, qb, cq_a, cq_b, ..
    } = rc_pair(&a, &b, 16);
    let src = host_region(&a, RegionAccess::Local, vec![7; 8]);
    let sink = host_region(&b, RegionAccess::Local, vec![0; 8]);
    for round in 0..5u64 {
        qb.post_recv(RecvWr {
            wr_id: round,
            sges: vec![sink.local(0, 8).unwrap()],
        })
        .unwrap();
        // Both progress threads asleep on their sockets, nothing in flight.
        std::thread::sleep(Duration::from_millis(20));
        // A poll that finds nothing: the application counts as polling for a while.
        assert!(cq_a.poll().is_none());
        send(&qa, &src, round, false);
        // It stops polling, and waits only after its grace has lapsed.
        std::thread::sleep(Duration::from_millis(1));
        let done = cq_a
            .wait(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("round {round}: the held SEND never left"));
        assert_eq!(done.status, WcStatus::Success, "round {round}");
        let got = cq_b.wait(Duration::from_secs(5)).expect("the receive");
        assert_eq!(got.wr_id, round);
    }
}

/// An application that polls long enough pushes the progress thread's nap on with its polls
/// instead of having the thread look every 2 ms (a context switch on the core it spins on).
/// When it then stops polling without a word (no arming, no `Cq::wait`), the last push must
/// still end the nap and the thread take the socket back: the peer's SEND is acknowledged
/// although the application makes no call into its NIC. A lost wake-up here leaves the
/// peer's SEND unanswered until its retries run out.
#[test]
fn a_poller_that_polls_long_then_stops_without_a_word_has_the_thread_take_over() {
    let a = soft_nic(Ipv4Addr::new(127, 0, 3, 28));
    let b = soft_nic(Ipv4Addr::new(127, 0, 3, 29));
    let RcPair {
        qa, qb, cq_a, cq_b, ..
    } = rc_pair(&a, &b, 16);
    let src = host_region(&b, RegionAccess::Local, vec![9; 8]);
    let sink = host_region(&a, RegionAccess::Local, vec![0; 8 * 3]);
    let mut received = Vec::new();
    for round in 0..3u64 {
        qa.post_recv(RecvWr {
            wr_id: round,
            sges: vec![sink.local(round * 8, 8).unwrap()],
        })
        .unwrap();
        // Polls, for longer than the looks take to reach 2 ms apart; they find the receive
        // of the round before, and nothing else.
        let until = std::time::Instant::now() + Duration::from_millis(30);
        while std::time::Instant::now() < until {
            if let Some(wc) = cq_a.poll() {
                received.push((wc.wr_id, wc.status));
            }
        }
        // The application is away now; only its progress thread can answer.
        send(&qb, &src, round, false);
        let done = cq_b
            .wait(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("round {round}: the SEND was never acknowledged"));
        assert_eq!(done.status, WcStatus::Success, "round {round}");
    }
    received.extend(cq_a.poll().map(|wc| (wc.wr_id, wc.status)));
    let want: Vec<_> = (0..3).map(|round| (round, WcStatus::Success)).collect();
    assert_eq!(received, want);
    let mut got = [0u8; 24];
    sink.read(0, &mut got).unwrap();
    assert_eq!(got, [9; 24]);
}
