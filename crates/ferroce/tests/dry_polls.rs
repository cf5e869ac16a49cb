//! The poll after one whose look at the socket emptied it does not look again (the soft NIC's
//! `dry_polls` counter): programs poll until a poll comes back empty (`while
//! (ibv_poll_cq(..) > 0)`, perf's reap loop), and that last poll used to pay a system call for
//! nothing between taking a message and answering it. The poll after the dry one looks again,
//! so nothing waits longer than one poll. Counted, not timed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

/// Messages in the run.
const ROUNDS: u64 = 200;

struct Side {
    nic: Nic,
    cq: Cq,
    qp: Qp,
    buf: Region,
}

fn side(host: u8) -> Side {
    let nic = Nic::open(&NicConfig {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 13, host)), 24812),
        ..NicConfig::default()
    })
    .unwrap();
    let cq = Cq::new(&nic, 64).unwrap();
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let buf = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![7; 8]),
    )
    .unwrap();
    Side { nic, cq, qp, buf }
}

/// A counter of the NIC's statistics line.
fn counter(nic: &Nic, name: &str) -> u64 {
    let line = nic.statistics_line("ferroce0");
    let mut words = line.split(' ');
    words.find(|w| *w == name).unwrap();
    words.next().unwrap().parse().unwrap()
}

/// The receiving side: polls without a pause, as a polling program does (so that its NIC's
/// progress thread keeps off the socket), and after each message polls twice more. Returns how
/// many messages its own polls took from the socket.
fn receive(b: &Side, deadline: Instant) -> u64 {
    let recv = |id| RecvWr {
        wr_id: id,
        sges: vec![b.buf.local(0, 8).unwrap()],
    };
    b.qp.post_recv(recv(0)).unwrap();
    let mut by_poll = 0;
    for n in 1..=ROUNDS {
        let thread_before = counter(&b.nic, "progress_thread_rcvd");
        // The poll that takes the message from the socket finds the socket empty behind it.
        let got = loop {
            if let Some(c) = b.cq.poll() {
                break c;
            }
            assert!(Instant::now() < deadline, "message {n} never arrived");
        };
        assert_eq!(got.wr_id, n - 1);
        let dry = counter(&b.nic, "dry_polls");
        assert!(b.cq.poll().is_none());
        let after_one = counter(&b.nic, "dry_polls");
        assert!(b.cq.poll().is_none());
        let after_two = counter(&b.nic, "dry_polls");
        // Where the progress thread took the message, the polls had no look of their own.
        if counter(&b.nic, "progress_thread_rcvd") == thread_before {
            by_poll += 1;
            assert_eq!(
                (after_one - dry, after_two - after_one),
                (1, 0),
                "message {n}: the first empty poll skips its look, the second looks"
            );
        }
        b.qp.post_recv(recv(n)).unwrap();
    }
    by_poll
}

#[test]
fn the_poll_after_a_look_that_emptied_the_socket_skips_one_look() {
    let (a, b) = (side(1), side(2));
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let by_poll = std::thread::scope(|s| {
        let receiver = s.spawn(|| receive(&b, deadline));
        for n in 1..=ROUNDS {
            a.qp.post_send(SendWr::new(
                n,
                SendOp::Send,
                Payload::Sge(a.buf.local(0, 8).unwrap()),
            ))
            .unwrap();
            // The receiver posts its next receive after its checks: the next SEND waits for
            // this one's completion, and a little longer, so as not to find none posted.
            loop {
                if let Some(c) = a.cq.poll() {
                    assert_eq!(c.wr_id, n);
                    break;
                }
                // A receiver that failed its checks took no more messages.
                if receiver.is_finished() {
                    return receiver.join().unwrap();
                }
                assert!(Instant::now() < deadline, "SEND {n} never completed");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        receiver.join().unwrap()
    });
    // The receiver's polls took messages themselves, so the rule was put to the test: all but
    // a few on a quiet machine, 34 of 200 at the least in runs beside two CPU hogs.
    assert!(
        by_poll >= ROUNDS / 20,
        "the polls took only {by_poll} of {ROUNDS} messages"
    );
}
