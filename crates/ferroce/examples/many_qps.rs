//! Many queue pairs against one (issue 16): two soft NICs in one process, N RC queue pairs
//! connected between them, each keeping `DEPTH` 4 KiB WRITEs in flight for a fixed time.
//! Prints the time each connection took to set up, the aggregate bandwidth, each queue
//! pair's share (least, median, most) and Jain's fairness index over the shares (1 when all
//! are equal, 1/N when one takes everything). Run with N = 1 and N = 1000 back to back for
//! BENCHMARKS.md.
//!
//! `cargo run --release -p ferroce --example many_qps -- N [seconds] [first host octet]`

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

const SIZE: u32 = 4096;
const DEPTH: u64 = 32;

fn nic(host: u8) -> Nic {
    Nic::open(&NicConfig {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 4791),
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback")
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let secs: f64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(3.0);
    let host: u8 = args.next().and_then(|a| a.parse().ok()).unwrap_or(230);
    let (a, b) = (nic(host), nic(host + 1));
    let depth = (n as u64 * DEPTH + 64) as usize;
    let (cq_a, cq_b) = (Cq::new(&a, depth).unwrap(), Cq::new(&b, 64).unwrap());
    let src = Region::register(
        &a,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0x5a; SIZE as usize]),
    )
    .unwrap();
    // One target slot per queue pair.
    let dst = Region::register(
        &b,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; SIZE as usize * n]),
    )
    .unwrap();

    let start = Instant::now();
    let caps = QpCaps {
        sq_depth: DEPTH as u32 * 2,
        ..QpCaps::default()
    };
    let pairs: Vec<(Qp, Qp)> = (0..n)
        .map(|_| {
            let qa = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, caps).unwrap();
            let qb = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, caps).unwrap();
            qa.connect(&qb.endpoint(), &ConnectOptions::default())
                .unwrap();
            qb.connect(&qa.endpoint(), &ConnectOptions::default())
                .unwrap();
            (qa, qb)
        })
        .collect();
    let setup = start.elapsed();

    let post = |i: usize| {
        let wr = SendWr::new(
            i as u64,
            SendOp::Write(dst.remote(i as u64 * u64::from(SIZE)).unwrap()),
            Payload::Sges(vec![src.local(0, SIZE).unwrap()]),
        );
        pairs[i].0.post_send(wr).expect("post a WRITE");
    };
    for i in 0..n {
        for _ in 0..DEPTH {
            post(i);
        }
    }
    let mut done = vec![0u64; n];
    let run = Duration::from_secs_f64(secs);
    let began = Instant::now();
    while began.elapsed() < run {
        let Some(c) = cq_a
            .poll()
            .or_else(|| cq_a.wait(Duration::from_millis(100)))
        else {
            continue;
        };
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        let i = c.wr_id as usize;
        done[i] += 1;
        post(i);
    }
    let elapsed = began.elapsed().as_secs_f64();
    let total: u64 = done.iter().sum();
    let rate = |writes: u64| writes as f64 * f64::from(SIZE) / elapsed / 1e6;
    let mut shares: Vec<f64> = done.iter().map(|&d| rate(d)).collect();
    shares.sort_by(f64::total_cmp);
    let sum: f64 = shares.iter().sum();
    let squares: f64 = shares.iter().map(|s| s * s).sum();
    let jain = if squares > 0.0 {
        sum * sum / (n as f64 * squares)
    } else {
        0.0
    };
    println!(
        "{n} QPs: setup {:.1} µs per connected pair; {:.0} MB/s in all over {elapsed:.1} s; \
         per QP least {:.2}, median {:.2}, most {:.2} MB/s; Jain's index {jain:.3}",
        setup.as_secs_f64() * 1e6 / n as f64,
        rate(total),
        shares[0],
        shares[n / 2],
        shares[n - 1],
    );
}
