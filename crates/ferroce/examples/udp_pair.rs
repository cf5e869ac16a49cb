//! The floor under RoCE between two hosts (issue 26 item 5): a plain UDP program that moves,
//! between two machines (the lab's two guests), what perftest's `ib_write_lat`, `ib_read_lat`
//! and `ib_write_bw` put on the wire, with nothing of RDMA in it: no queue pair, no ICRC, no
//! copy into a region, no completion. What it reaches is what any user-space RoCE engine over UDP
//! sockets could reach there at best, so item 5's ratios against kernel rxe can be set beside
//! the floor's.
//!
//! - `udp_pair serve LOCAL [block]` answers one run on LOCAL (`ADDR:PORT`): it echoes each
//!   ping-pong datagram, or takes a stream, acknowledging every message's worth of bytes with
//!   their running total, and exits when the client says it is done. It spins on
//!   non-blocking receives, or with `block` sleeps in each receive, as a passive responder's
//!   thread does (`ib_read_lat`'s server makes no call while its NIC answers).
//! - `udp_pair pingpong LOCAL PEER SIZE ITERS [roce]`: a ping-pong of SIZE-byte datagrams,
//!   both ends spinning on non-blocking receives (as `sockperf --nonblocked` and perftest's
//!   latency tests do); prints the half round trip's typical (median) and average, in µs, as
//!   perftest's `t_typical` and `t_avg` for its ping-pongs, then the whole round trip's, as
//!   perftest's READ and atomic tests report theirs. With `roce`, each turn is what an RC
//!   `ib_write_lat` turn puts on the wire: the SIZE-byte WRITE and a 20-byte ACK of the
//!   peer's last one (BTH, AETH, ICRC), as one UDP GSO send, as ferroce's soft NIC sends them.
//! - `udp_pair stream LOCAL PEER MESSAGE SEGMENT ITERS [WINDOW]`: ITERS messages of MESSAGE
//!   payload bytes, each cut into datagrams of SEGMENT bytes by UDP GSO (the server receives
//!   with GRO), at most WINDOW messages (default 128, perftest's `-t`) unacknowledged; prints
//!   MB/s (2^20 bytes, as perftest) of payload acknowledged, and how many bytes never came.
//!   For an MTU of 1024 a RoCE WRITE's middle packet is 1040 bytes (BTH 12, payload, ICRC 4).
//!
//! ```sh
//! cargo build --release -p ferroce --example udp_pair
//! udp_pair serve 127.0.0.80:47920 &
//! udp_pair pingpong 127.0.0.81:47921 127.0.0.80:47920 36 10000
//! udp_pair serve 127.0.0.80:47920 &
//! udp_pair stream 127.0.0.81:47921 127.0.0.80:47920 65536 1040 400
//! ```

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// First byte of each datagram: what it is.
const PING: u8 = b'P';
const START: u8 = b'S';
const DATA: u8 = b'D';
const END: u8 = b'E';
/// The largest UDP payload one GSO send may carry.
const GSO_MAX_BYTES: usize = 65_000;
const GSO_MAX_SEGMENTS: usize = 64;
/// A RoCE ACK's UDP payload: BTH 12, AETH 4, ICRC 4.
const ACK_LEN: usize = 20;
/// Socket buffers as ferroce's soft NIC asks for them as root.
const BUFFERS: libc::c_int = 8 << 20;
/// A stream that hears no acknowledgement for this long takes what is in flight as lost.
const STALL: Duration = Duration::from_millis(20);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, what: &str| -> String {
        args.get(i)
            .cloned()
            .unwrap_or_else(|| fail(&format!("missing {what}")))
    };
    let num = |i: usize, what: &str| -> usize {
        arg(i, what)
            .parse()
            .unwrap_or_else(|_| fail(&format!("{what} is not a number")))
    };
    let addr = |i: usize, what: &str| -> SocketAddr {
        arg(i, what)
            .parse()
            .unwrap_or_else(|_| fail(&format!("{what} is not ADDR:PORT")))
    };
    match arg(0, "a mode").as_str() {
        "serve" => {
            let socket = bind(addr(1, "LOCAL"));
            match args.get(2).map(String::as_str) {
                None => {}
                Some("block") => socket.set_nonblocking(false).expect("blocking"),
                Some(other) => fail(&format!("a server spins or blocks, not {other}")),
            }
            serve(&socket);
        }
        "pingpong" => pingpong(
            &bind(addr(1, "LOCAL")),
            addr(2, "PEER"),
            num(3, "SIZE"),
            num(4, "ITERS"),
            match args.get(5).map(String::as_str) {
                None => false,
                Some("roce") => true,
                Some(other) => fail(&format!("a ping-pong's turn is plain or roce, not {other}")),
            },
        ),
        "stream" => stream(
            &bind(addr(1, "LOCAL")),
            addr(2, "PEER"),
            num(3, "MESSAGE"),
            num(4, "SEGMENT"),
            num(5, "ITERS"),
            args.get(6).map_or(128, |_| num(6, "WINDOW")),
        ),
        other => fail(&format!("unknown mode {other}")),
    }
}

fn fail(why: &str) -> ! {
    eprintln!(
        "udp_pair: {why}\nusage: udp_pair serve LOCAL [block] | pingpong LOCAL PEER SIZE ITERS \
         [roce] | stream LOCAL PEER MESSAGE SEGMENT ITERS [WINDOW]"
    );
    std::process::exit(2)
}

fn bind(addr: SocketAddr) -> UdpSocket {
    let socket = UdpSocket::bind(addr).unwrap_or_else(|e| fail(&format!("bind {addr}: {e}")));
    socket.set_nonblocking(true).expect("non-blocking");
    sys::grow_buffers(&socket, BUFFERS);
    sys::set_udp_option(&socket, libc::UDP_GRO, 1).expect("UDP_GRO");
    socket
}

/// Receives one datagram (or GRO buffer), spinning while none is there (on a non-blocking
/// socket; a blocking one sleeps in the call).
fn receive(socket: &UdpSocket, buf: &mut [u8]) -> (usize, SocketAddr) {
    loop {
        match socket.recv_from(buf) {
            Ok(got) => return got,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            // A peer's earlier datagram drew an ICMP error: not this one's business.
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
            Err(e) => panic!("recv: {e}"),
        }
    }
}

/// Echoes pings; counts a stream's bytes and acknowledges each message's worth; returns at the
/// end of the run.
fn serve(socket: &UdpSocket) {
    let mut buf = vec![0u8; 1 << 16];
    let (mut message, mut total, mut acked) = (1u64, 0u64, 0u64);
    // A RoCE-shaped ping-pong's turn (0: echo each datagram), and its bytes heard so far.
    let (mut turn, mut heard) = (Vec::new(), 0);
    loop {
        let (n, from) = receive(socket, &mut buf);
        let field = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        match buf[..n].first() {
            Some(&PING) if turn.is_empty() => {
                let _ = socket.send_to(&buf[..n], from);
            }
            Some(&PING) => {
                heard += n;
                if heard >= turn.len() {
                    heard -= turn.len();
                    let _ = socket.send_to(&turn, from);
                }
            }
            Some(&START) if n >= 17 => {
                message = field(1).max(1);
                (total, acked) = (0, 0);
                let segment = usize::try_from(field(9)).unwrap_or(0);
                if segment > 0 {
                    sys::set_udp_option(socket, libc::UDP_SEGMENT, segment as libc::c_int)
                        .expect("UDP_SEGMENT");
                    turn = vec![PING; segment + ACK_LEN];
                }
                let _ = socket.send_to(&0u64.to_le_bytes(), from);
            }
            Some(&DATA) => {
                total += n as u64;
                if total / message > acked {
                    acked = total / message;
                    let _ = socket.send_to(&total.to_le_bytes(), from);
                }
            }
            Some(&END) => {
                let _ = socket.send_to(&total.to_le_bytes(), from);
                return;
            }
            _ => {}
        }
    }
}

/// Tells the server the size of a message's wire bytes (0 for a ping-pong) and of a RoCE-shaped
/// ping-pong's WRITE (0 for a plain one) until it answers, so that either may start first.
fn hello(socket: &UdpSocket, peer: SocketAddr, wire: u64, write: u64) {
    let mut start = vec![START];
    start.extend_from_slice(&wire.to_le_bytes());
    start.extend_from_slice(&write.to_le_bytes());
    let mut buf = [0u8; 64];
    loop {
        socket.send_to(&start, peer).expect("send");
        std::thread::sleep(Duration::from_millis(10));
        while let Ok((n, _)) = socket.recv_from(&mut buf) {
            if n == 8 && buf[..8] == [0; 8] {
                return;
            }
        }
    }
}

/// Tells the server the run is over (more than once: a datagram may be lost).
fn goodbye(socket: &UdpSocket, peer: SocketAddr) {
    for _ in 0..3 {
        let _ = socket.send_to(&[END], peer);
    }
}

fn pingpong(socket: &UdpSocket, peer: SocketAddr, size: usize, iters: usize, roce: bool) {
    let size = size.max(1);
    let out = if roce {
        // The WRITE, then the ACK as the GSO send's shorter last segment.
        sys::set_udp_option(socket, libc::UDP_SEGMENT, size as libc::c_int).expect("UDP_SEGMENT");
        hello(socket, peer, 0, size as u64);
        vec![PING; size + ACK_LEN]
    } else {
        hello(socket, peer, 0, 0);
        vec![PING; size]
    };
    let mut buf = vec![0u8; out.len().max(64)];
    let mut halves = Vec::with_capacity(iters);
    // A few turns first, so that first-touch costs stay out, as perftest's warm-up does.
    for i in 0..iters + iters / 10 + 1 {
        let sent = Instant::now();
        socket.send_to(&out, peer).expect("send");
        // The whole turn back, one buffer by GRO or a datagram at a time (a late answer to
        // `hello` is not part of it).
        let mut heard = 0;
        while heard < out.len() {
            let (n, _) = receive(socket, &mut buf);
            if buf[0] == PING {
                heard += n;
            }
        }
        if i > iters / 10 {
            halves.push(sent.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
    }
    goodbye(socket, peer);
    let avg = halves.iter().sum::<f64>() / halves.len() as f64;
    halves.sort_by(f64::total_cmp);
    let typical = halves[halves.len() / 2];
    println!(
        "udp_pair pingpong: {size} B{}, {} iterations: t_typical {typical:.2} us, t_avg \
         {avg:.2} us; round trip typical {:.2} us, average {:.2} us",
        if roce { " and a 20 B ACK a turn" } else { "" },
        halves.len(),
        2.0 * typical,
        2.0 * avg
    );
}

fn stream(
    socket: &UdpSocket,
    peer: SocketAddr,
    message: usize,
    segment: usize,
    iters: usize,
    window: usize,
) {
    assert!(
        segment > 1 && segment <= GSO_MAX_BYTES,
        "SEGMENT out of range"
    );
    // Each message's wire bytes: its payload in segments that each carry 16 bytes more (a
    // RoCE packet's BTH and ICRC), as a WRITE's middle packets do.
    let payload_per = segment - 16;
    let wire = message.div_ceil(payload_per) * segment;
    let per_send = (GSO_MAX_BYTES / segment).min(GSO_MAX_SEGMENTS);
    sys::set_udp_option(socket, libc::UDP_SEGMENT, segment as libc::c_int).expect("UDP_SEGMENT");
    let mut data = vec![0u8; per_send * segment];
    for seg in data.chunks_mut(segment) {
        seg[0] = DATA;
    }
    let mut buf = [0u8; 64];
    let ack =
        |buf: &[u8], n: usize| (n == 8).then(|| u64::from_le_bytes(buf[..8].try_into().unwrap()));

    hello(socket, peer, wire as u64, 0);
    let began = Instant::now();
    let (mut sent, mut acked, mut forgiven) = (0usize, 0u64, 0u64);
    let mut last_progress = Instant::now();
    while sent < iters {
        // Room in the window: send a message, a GSO send at a time.
        if (sent as u64 * wire as u64).saturating_sub(acked + forgiven) < (window * wire) as u64 {
            let mut left = wire;
            while left > 0 {
                let n = left.min(data.len());
                match socket.send_to(&data[..n], peer) {
                    Ok(_) => left -= n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
                    Err(e) => panic!("send: {e}"),
                }
            }
            sent += 1;
            continue;
        }
        match socket.recv_from(&mut buf) {
            Ok((n, _)) => {
                if let Some(total) = ack(&buf, n) {
                    if total > acked {
                        acked = total;
                        last_progress = Instant::now();
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if last_progress.elapsed() > STALL {
                    // What is in flight is lost: stop waiting for it.
                    forgiven = (sent as u64 * wire as u64).saturating_sub(acked);
                    last_progress = Instant::now();
                }
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    // Wait for the last acknowledgement (or the stall), then ask for the total.
    let all = (iters * wire) as u64;
    while acked < all && last_progress.elapsed() < STALL {
        if let Ok((n, _)) = socket.recv_from(&mut buf) {
            if let Some(total) = ack(&buf, n).filter(|&t| t > acked) {
                acked = total;
                last_progress = Instant::now();
            }
        }
    }
    let secs = last_progress.duration_since(began).as_secs_f64();
    let got = acked * (message as u64) / wire as u64;
    println!(
        "udp_pair stream: {message} B messages in {segment}-byte datagrams, {iters} messages, \
         window {window}: {:.2} MB/sec, {} of {} wire bytes never acknowledged",
        got as f64 / secs / 1_048_576.0,
        all.saturating_sub(acked),
        all
    );
    goodbye(socket, peer);
}

/// Socket options std does not offer, shared with `udp_floor`.
#[path = "common/sockopt.rs"]
mod sys;
