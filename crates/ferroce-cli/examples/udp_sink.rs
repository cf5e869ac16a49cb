//! The baseline for the frame receiver's benchmark: a plain UDP receive loop that moves the
//! same bytes, as the sensor bridge's own socket receiver does (one `recv` per datagram, the
//! payload copied to the RETH's offset in a ring of pages) with no ICRC, no queue pair, key,
//! source or page check.
//!
//! `cargo run --release --example udp_sink -- ADDR:PORT RING_BYTES [IDLE_SECONDS]` receives
//! until the stream has been idle for `IDLE_SECONDS` (default 1) and prints one JSON object:
//! datagrams, payload bytes, seconds between the first and last datagram, and the process's
//! CPU seconds.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// BTH (12) + RETH (16) before the payload; the ICRC (4) after it.
const HEADERS: usize = 28;

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(addr), Some(ring)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: udp_sink ADDR:PORT RING_BYTES [IDLE_SECONDS]");
        std::process::exit(2);
    };
    let ring: usize = ring.parse().expect("RING_BYTES");
    let idle: f64 = args
        .get(3)
        .map_or(1.0, |s| s.parse().expect("IDLE_SECONDS"));
    let socket = UdpSocket::bind(addr.as_str()).expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_secs_f64(idle)))
        .expect("timeout");
    let mut pages = vec![0u8; ring];
    let mut buf = vec![0u8; 65_536];
    let (mut datagrams, mut bytes) = (0u64, 0u64);
    let mut first = None;
    let mut last = Instant::now();
    let mut base = None;
    while let Ok(n) = socket.recv(&mut buf) {
        let now = Instant::now();
        first.get_or_insert(now);
        last = now;
        if n < HEADERS + 4 {
            continue;
        }
        let va = u64::from_be_bytes(buf[12..20].try_into().expect("8 bytes"));
        let base = *base.get_or_insert(va);
        let payload = &buf[HEADERS..n - 4];
        let at = (va.wrapping_sub(base) as usize) % ring;
        let end = (at + payload.len()).min(ring);
        pages[at..end].copy_from_slice(&payload[..end - at]);
        datagrams += 1;
        bytes += payload.len() as u64;
    }
    let seconds = first.map_or(0.0, |f| (last - f).as_secs_f64());
    println!(
        "{{\"datagrams\":{datagrams},\"bytes\":{bytes},\"seconds\":{seconds:.3},\"cpu_seconds\":{:.2},\"checksum\":{}}}",
        cpu_seconds(),
        pages.iter().step_by(4096).map(|&b| u64::from(b)).sum::<u64>()
    );
}
