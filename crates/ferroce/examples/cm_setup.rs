//! Connection setup and teardown through `ferroce::cm`, as librdmacm's `cmtime` measures
//! them: two soft NICs on loopback, N RC connections made one after another (REQ, REP, RTU,
//! each QP brought to RTS), then closed (DREQ, DREP); the time of each, and what the NICs
//! hold before and after (BENCHMARKS.md).
//!
//! `cargo run --release -p ferroce --example cm_setup -- [N] [first host octet]`

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce::cm::{ConnParam, Connection, Listener};
use ferroce::qp::{QpCaps, QpType};
use ferroce::{Cq, Nic, NicConfig, Qp};

fn nic(host: u8) -> Nic {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 4791);
    Nic::open(&NicConfig {
        addr,
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback")
}

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

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut times: Vec<Duration>) {
    times.sort();
    let total: Duration = times.iter().sum();
    println!(
        "{what:<10} {:>5} connections: mean {:>7.3} ms  median {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
        times.len(),
        total.as_secs_f64() * 1e3 / times.len() as f64,
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let host: u8 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let (a, b) = (nic(host), nic(host + 1));
    let census = (a.census(), b.census());
    let rss_before = rss_kib();
    // Three times: later rounds show whether memory the first one took is reused or leaked.
    for round in 1..=3 {
        self::round(&a, &b, n);
        std::thread::sleep(Duration::from_millis(2300));
        let after = (a.census(), b.census());
        println!(
            "round {round}: NICs as they were after timewait: {} ({:?}); resident set {rss_before} KiB before, {} KiB now",
            after == census,
            after.0,
            rss_kib()
        );
    }
    let counters = ferroce::cm::counters(&a).unwrap_or_default();
    println!(
        "CM: {} resends, {} duplicates, {} unexpected",
        counters.resends, counters.duplicates, counters.unexpected
    );
}

fn round(a: &Nic, b: &Nic, n: usize) {
    let listener = Listener::bind(b, 7190).expect("listen");
    let (mut setup, mut teardown) = (Vec::with_capacity(n), Vec::with_capacity(n));
    {
        let (cq_a, cq_b) = (Cq::new(a, 64).unwrap(), Cq::new(b, 64).unwrap());
        let qps_a: Vec<_> = (0..n)
            .map(|_| Qp::new(a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap())
            .collect();
        let qps_b: Vec<_> = (0..n)
            .map(|_| Qp::new(b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap())
            .collect();
        let param = ConnParam::default();
        let (clients, servers) = std::thread::scope(|s| {
            let server = s.spawn(|| {
                qps_b
                    .iter()
                    .map(|qp| {
                        let request = listener.get_request(Duration::from_secs(10)).unwrap();
                        let conn = request.accept(qp, &param).unwrap();
                        conn.wait_established(Duration::from_secs(10)).unwrap();
                        conn
                    })
                    .collect::<Vec<_>>()
            });
            let clients: Vec<_> = qps_a
                .iter()
                .map(|qp| {
                    let start = Instant::now();
                    let conn = Connection::connect(a, qp, b.addr().ip(), 7190, &param).unwrap();
                    setup.push(start.elapsed());
                    conn
                })
                .collect();
            (clients, server.join().unwrap())
        });
        for conn in &clients {
            let start = Instant::now();
            conn.disconnect(Duration::from_secs(10)).unwrap();
            teardown.push(start.elapsed());
        }
        for conn in &servers {
            conn.wait_disconnected(Duration::from_secs(10)).unwrap();
        }
    }
    drop(listener);
    report("setup", setup);
    report("teardown", teardown);
}
