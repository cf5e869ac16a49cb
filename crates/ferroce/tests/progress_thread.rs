//! How the soft NIC's progress thread is scheduled (`NicConfig::progress_priority`). A file
//! of its own: it finds the threads by name in `/proc/self/task`, where a thread's name is
//! cut to 15 bytes, so no other test's NIC may be open in the process meanwhile.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

/// Waits up to a second for the nice values of the progress threads (sorted) to be `want`, and
/// returns what they were last.
fn progress_nices_become(want: &[i64]) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        // Both NICs' threads: their names, cut to 15 bytes, are alike.
        let mut now: Vec<i64> = support::threads_named("ferroce 127.0.0")
            .into_iter()
            .map(nice_of)
            .collect();
        now.sort_unstable();
        if now == want || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A thread's nice value.
fn nice_of(tid: u32) -> i64 {
    support::thread_stat(tid)[16].parse().unwrap()
}

/// Whether this process may raise a thread's priority: CAP_SYS_NICE (bit 23) in effect.
fn may_raise_priority() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    caps & (1 << 23) != 0
}

/// Two soft NICs, `a` allowed to raise its progress thread and `b` not, a QP on each,
/// connected, and a region on each end of a WRITE.
struct Pair {
    cq: Cq,
    qp: Qp,
    src: Region,
    dst: Region,
    _peer: (Qp, Cq),
    _nics: (Nic, Nic),
}

fn pair() -> Pair {
    let open = |host: u8, raise: bool| {
        Nic::open(&NicConfig {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 24802),
            progress_priority: raise,
            ..NicConfig::default()
        })
        .unwrap()
    };
    let (a, b) = (open(2, true), open(3, false));
    let (cq, cq_b) = (Cq::new(&a, 64).unwrap(), Cq::new(&b, 64).unwrap());
    let qp = Qp::new(&a, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let qp_b = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    qp.connect(&qp_b.endpoint(), &ConnectOptions::default())
        .unwrap();
    qp_b.connect(&qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    let region = |nic: &Nic, access| {
        Region::register(
            nic,
            access,
            WriteOrder::InOrder,
            RegionMemory::Host(vec![7; 64]),
        )
        .unwrap()
    };
    Pair {
        src: region(&a, RegionAccess::Local),
        dst: region(&b, RegionAccess::Remote),
        cq,
        qp,
        _peer: (qp_b, cq_b),
        _nics: (a, b),
    }
}

/// `n` WRITEs, each polled for until it completes (busy), then `away` elsewhere.
fn writes(p: &Pair, n: usize, away: Duration) {
    let (qp, cq, src, dst) = (&p.qp, &p.cq, &p.src, &p.dst);
    for i in 0..n {
        let wr = SendWr::new(
            i as u64,
            SendOp::Write(dst.remote(0).unwrap()),
            Payload::Sge(src.local(0, 8).unwrap()),
        );
        qp.post_send(wr).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(c) = cq.poll() {
                assert_eq!(c.wr_id, i as u64);
                break;
            }
            assert!(Instant::now() < deadline, "no completion");
        }
        if !away.is_zero() {
            let back = Instant::now() + away;
            while Instant::now() < back {
                std::hint::spin_loop();
            }
        }
    }
}

#[test]
fn the_progress_thread_outranks_an_application_that_waits_elsewhere_where_it_may() {
    // Where the process may raise a priority, `a`'s progress thread runs at nice -10 while
    // its application leaves after each completion (as ib_write_lat spins on memory), and at
    // the application's own while the application polls for itself; `b`'s, asked not to be
    // raised, never moves. Where the process may not, neither moves.
    let own = nice_of(std::process::id());
    let p = pair();
    assert_eq!(progress_nices_become(&[own, own]), [own, own]);
    writes(&p, 50, Duration::from_micros(200));
    let raised = if may_raise_priority() {
        vec![-10, own]
    } else {
        vec![own, own]
    };
    assert_eq!(progress_nices_become(&raised), raised);
    // Busy polling brings it back down. A busy poller descheduled right after a completion
    // (a loaded machine) looks away for that once, so it may take more than one batch.
    let mut now = Vec::new();
    for _ in 0..20 {
        writes(&p, 100, Duration::ZERO);
        now = progress_nices_become(&[own, own]);
        if now == [own, own] {
            break;
        }
    }
    assert_eq!(now, [own, own]);
}
