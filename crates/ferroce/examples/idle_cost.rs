//! What an idle queue pair and a region cost on the soft NIC, measured (issue 16): the
//! resident set before and after creating N RC queue pairs (default capacities, nothing
//! posted) on one CQ, then N 64-byte pageable regions, and the time each creation took
//! (BENCHMARKS.md).
//!
//! `cargo run --release -p ferroce --example idle_cost -- [N] [host octet]`

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{QpCaps, QpType};
use ferroce::{Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

/// The resident set size in KiB, from /proc.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let host: u8 = args.next().and_then(|a| a.parse().ok()).unwrap_or(220);
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 4791);
    let nic = Nic::open(&NicConfig {
        addr,
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback");
    let cq = Cq::new(&nic, 64).unwrap();

    let before = rss_kib();
    let start = Instant::now();
    let qps: Vec<_> = (0..n)
        .map(|_| Qp::new(&nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap())
        .collect();
    let took = start.elapsed();
    let after = rss_kib();
    println!(
        "{n} idle RC QPs: {:.0} bytes each, {:.2} µs each to create",
        (after - before) as f64 * 1024.0 / n as f64,
        took.as_secs_f64() * 1e6 / n as f64
    );

    let before = rss_kib();
    let start = Instant::now();
    let regions: Vec<_> = (0..n)
        .map(|_| {
            Region::register(
                &nic,
                RegionAccess::Remote,
                WriteOrder::InOrder,
                RegionMemory::Pageable(vec![0; 64]),
            )
            .unwrap()
        })
        .collect();
    let took = start.elapsed();
    let after = rss_kib();
    println!(
        "{n} regions of 64 bytes: {:.0} bytes each (the 64 included), {:.2} µs each to register",
        (after - before) as f64 * 1024.0 / n as f64,
        took.as_secs_f64() * 1e6 / n as f64
    );
    println!("engine: {:?}", nic.census());
    drop((qps, regions));
}
