//! A NIC under a flood keeps serving its real peer. Two soft NICs on 127.0.0.84 and .85 move
//! WRITEs and ping-pong SENDs, once quietly and once while a stranger on 127.0.0.86 floods the
//! receiving NIC with four kinds of bad packet as fast as it can: junk bytes, well-formed
//! requests to queue pairs that do not exist, UD datagrams to QP 1 with a wrong Q_Key (ICRC
//! valid, so they reach the Q_Key check), and RDMA WRITEs with a made-up rkey to the real
//! queue pair from the wrong source (ICRC valid too).
//!
//! Asserted: every byte of the real traffic arrives during the flood; each kind of flood
//! packet is counted under its own name; none draws an answer. Printed, not asserted (speed is
//! for benchmarks): the real peer's bandwidth and round trip before and during the flood, and
//! the receiving NIC thread's CPU per flood packet.

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferroce::cq::{WcOpcode, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::{icrc, IpHeader, UdpHeader};
use ferroce::proto::Counters;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

const PORT: u16 = 19_420;
const CHUNK: usize = 256 * 1024;
const CHUNKS: usize = 64;
const ROUND_TRIPS: usize = 200;

fn at(host: u8) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), PORT)
}

struct Side {
    nic: Nic,
    cq: Cq,
    qp: Qp,
}

fn side(host: u8) -> Side {
    let nic = Nic::open(&NicConfig {
        addr: at(host),
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback");
    let cq = Cq::new(&nic, 4096).unwrap();
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    Side { nic, cq, qp }
}

fn region(nic: &Nic, access: RegionAccess, bytes: Vec<u8>) -> Region {
    Region::register(nic, access, WriteOrder::InOrder, RegionMemory::Host(bytes)).unwrap()
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The next completion of `cq`, which must be a success of `opcode`.
fn expect(cq: &Cq, opcode: WcOpcode) {
    let c = cq
        .wait(Duration::from_secs(20))
        .expect("a completion within 20 s, flood or not");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    assert_eq!(c.opcode, opcode, "{c:?}");
}

/// What one phase measured of the real traffic.
struct Phase {
    mb_per_s: f64,
    median_rtt: Duration,
    nic_cpu: Duration,
}

/// Writes `CHUNKS` chunks from `a` into `b`'s region and checks every byte there, then runs
/// `ROUND_TRIPS` 64-byte SEND ping-pongs.
fn real_traffic(a: &Side, b: &Side, seed: u64, b_thread: Option<u32>) -> Phase {
    let data = pattern(CHUNK * CHUNKS, seed);
    let src = region(&a.nic, RegionAccess::Local, data.clone());
    let dst = region(&b.nic, RegionAccess::Remote, vec![0; CHUNK * CHUNKS]);
    let cpu_before = b_thread.map(thread_cpu);
    let start = Instant::now();
    for i in 0..CHUNKS {
        let at = (i * CHUNK) as u64;
        a.qp.post_send(SendWr::new(
            i as u64,
            SendOp::Write(dst.remote(at).unwrap()),
            Payload::Sges(vec![src.local(at, CHUNK as u32).unwrap()]),
        ))
        .unwrap();
    }
    for _ in 0..CHUNKS {
        expect(&a.cq, WcOpcode::RdmaWrite);
    }
    let mb_per_s = (CHUNK * CHUNKS) as f64 / start.elapsed().as_secs_f64() / 1e6;
    let mut landed = vec![0; CHUNK * CHUNKS];
    dst.read(0, &mut landed).unwrap();
    assert!(landed == data, "a WRITE landed wrong during phase {seed}");

    let ping_a = region(&a.nic, RegionAccess::Local, vec![0xa5; 64]);
    let ping_b = region(&b.nic, RegionAccess::Local, vec![0; 64]);
    let mut rtts = Vec::with_capacity(ROUND_TRIPS);
    for n in 0..ROUND_TRIPS as u64 {
        for (side, buf) in [(a, &ping_a), (b, &ping_b)] {
            side.qp
                .post_recv(RecvWr {
                    wr_id: n,
                    sges: vec![buf.local(0, 64).unwrap()],
                })
                .unwrap();
        }
        let t = Instant::now();
        a.qp.post_send(SendWr::new(
            n,
            SendOp::Send,
            Payload::Sges(vec![ping_a.local(0, 64).unwrap()]),
        ))
        .unwrap();
        expect(&b.cq, WcOpcode::Recv);
        b.qp.post_send(SendWr::new(
            n,
            SendOp::Send,
            Payload::Sges(vec![ping_b.local(0, 64).unwrap()]),
        ))
        .unwrap();
        // a's send and its receive complete in either order.
        let mut seen = [false; 2];
        while !(seen[0] && seen[1]) {
            let c = a.cq.wait(Duration::from_secs(20)).expect("a completion");
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            seen[usize::from(c.opcode == WcOpcode::Recv)] = true;
        }
        rtts.push(t.elapsed());
        expect(&b.cq, WcOpcode::Send);
    }
    rtts.sort();
    let nic_cpu = match (b_thread, cpu_before) {
        (Some(tid), Some(before)) => thread_cpu(tid).saturating_sub(before),
        _ => Duration::ZERO,
    };
    Phase {
        mb_per_s,
        median_rtt: rtts[rtts.len() / 2],
        nic_cpu,
    }
}

/// The thread of this process named after the NIC on `addr`, if /proc shows it.
fn nic_thread(addr: SocketAddr) -> Option<u32> {
    support::threads_named(&format!("ferroce {addr}"))
        .first()
        .copied()
}

/// A thread's user and system CPU time, from /proc (clock ticks of 10 ms).
fn thread_cpu(tid: u32) -> Duration {
    let fields = support::thread_stat(tid);
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The four kinds of flood packet, cycled.
fn flood_packet(n: u64, target: SocketAddr, from: SocketAddr, real_qpn: u32) -> Vec<u8> {
    let bth = |opcode: u8, qpn: u32, len: usize| {
        let mut p = vec![0u8; len];
        p[0] = opcode;
        p[2] = 0xff;
        p[3] = 0xff;
        p[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p[9..12].copy_from_slice(&((n as u32) & 0xff_ffff).to_be_bytes()[1..]);
        p
    };
    let seal = |p: &mut Vec<u8>| {
        let ip = IpHeader::between(from.ip(), target.ip()).unwrap();
        let udp = UdpHeader {
            src_port: from.port(),
            dst_port: target.port(),
        };
        icrc::seal(&ip, &udp, p).unwrap();
    };
    match n % 4 {
        // Junk: bytes of any length that are no RoCE packet (an opcode no transport has).
        0 => {
            let mut p = pattern(1 + (n as usize * 7) % 300, n);
            p[0] = 0xff;
            p
        }
        // An RC SEND to a queue pair that does not exist (a NIC's QPNs are drawn at random:
        // one of these could hit one of the NIC's three with odds of about 2^-21 each).
        1 => bth(0x04, 0x80_0000 | (n as u32 & 0x7f_ffff), 12 + 64 + 4),
        // A UD SEND to QP 1 with a wrong Q_Key, sealed.
        2 => {
            let mut p = bth(0x64, 1, 12 + 8 + 256 + 4);
            p[12..16].copy_from_slice(&0x1234_5678u32.to_be_bytes());
            p[17..20].copy_from_slice(&[0, 0, 0x42]);
            seal(&mut p);
            p
        }
        // An RDMA WRITE ONLY to the real queue pair, a made-up rkey, from the wrong host.
        _ => {
            let mut p = bth(0x0a, real_qpn, 12 + 16 + 64 + 4);
            p[12..20].copy_from_slice(&0x1000u64.to_be_bytes());
            p[20..24].copy_from_slice(&(n as u32).to_be_bytes());
            p[24..28].copy_from_slice(&64u32.to_be_bytes());
            seal(&mut p);
            p
        }
    }
}

#[test]
fn a_flooded_nic_keeps_serving_its_real_peer() {
    let a = side(84);
    let b = side(85);
    a.qp.connect(&b.qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    b.qp.connect(&a.qp.endpoint(), &ConnectOptions::default())
        .unwrap();
    let b_thread = nic_thread(b.nic.addr());

    let quiet = real_traffic(&a, &b, 1, b_thread);
    let before = b.nic.counters();

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let flooder = UdpSocket::bind(SocketAddr::new(at(86).ip(), 0)).unwrap();
    let from = flooder.local_addr().unwrap();
    let target = b.nic.addr();
    let real_qpn = b.qp.qpn().value();
    let flood = {
        let (stop, sent, flooder) = (
            Arc::clone(&stop),
            Arc::clone(&sent),
            flooder.try_clone().unwrap(),
        );
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // A full socket buffer at the NIC drops the excess: that is the point.
                let _ = flooder.send_to(&flood_packet(n, target, from, real_qpn), target);
                n += 1;
            }
            sent.store(n, Ordering::Relaxed);
        })
    };
    // Let the flood build up before the real traffic starts.
    std::thread::sleep(Duration::from_millis(200));
    let flooded = real_traffic(&a, &b, 2, b_thread);
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let after = b.nic.counters();

    let grew = |f: fn(&Counters) -> u64| f(&after) - f(&before);
    let junk = grew(|c| c.malformed_pkts);
    let unknown = grew(|c| c.unknown_qp);
    let qkey = grew(|c| c.qkey_err);
    let stranger = grew(|c| c.wrong_source);
    let flood_sent = sent.load(Ordering::Relaxed);
    eprintln!(
        "flood: {flood_sent} sent; counted at the NIC: malformed_pkts {junk}, unknown_qp \
         {unknown}, qkey_err {qkey}, wrong_source {stranger} (the rest dropped by the kernel)"
    );
    for (name, n) in [
        ("malformed_pkts", junk),
        ("unknown_qp", unknown),
        ("qkey_err", qkey),
        ("wrong_source", stranger),
    ] {
        assert!(n >= 100, "{name} counted {n} of the flood's packets");
    }
    // Nothing the flood sent was let through or answered.
    assert_eq!(after.resp_access_err, before.resp_access_err);
    flooder.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    assert!(
        flooder.recv_from(&mut buf).is_err(),
        "the NIC answered a flood packet"
    );
    let counted = junk + unknown + qkey + stranger;
    let per_packet = |p: &Phase| {
        p.nic_cpu
            .saturating_sub(quiet.nic_cpu)
            .as_nanos()
            .checked_div(u128::from(counted))
            .unwrap_or(0)
    };
    eprintln!(
        "real peer: {:.0} MB/s and median round trip {:?} quiet; {:.0} MB/s and {:?} flooded \
         ({:.2}x the bandwidth); NIC thread CPU {:?} quiet, {:?} flooded, about {} ns per \
         flood packet counted",
        quiet.mb_per_s,
        quiet.median_rtt,
        flooded.mb_per_s,
        flooded.median_rtt,
        flooded.mb_per_s / quiet.mb_per_s,
        quiet.nic_cpu,
        flooded.nic_cpu,
        per_packet(&flooded),
    );
}
