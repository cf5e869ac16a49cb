//! Whether the engine's work grows with idle queue pairs (issue 16): two engines in one
//! thread, packets handed over in memory, one busy RC connection moving `BATCHES` × 64 RDMA
//! WRITEs of 4 KiB while `IDLE` other connected queue pairs on each engine send nothing.
//! Count the busy part's instructions with callgrind, once with no idle queue pairs and once
//! with many (BENCHMARKS.md):
//!
//! ```sh
//! cargo build --release -p ferroce-proto --example idle_qps
//! valgrind --tool=callgrind --toggle-collect='idle_qps::transfer' \
//!     target/release/examples/idle_qps 10000
//! ```

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use ferroce_proto::engine::{roce_peer, MAX_PACKET};
use ferroce_proto::memory::{Access, HeapMemory, RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    CqId, Mtu, Payload, QpAttr, QpCaps, QpInit, QpState, QpType, RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce_proto::wire::{Qpn, RnrTimer};
use ferroce_proto::{Engine, EngineConfig, Psn};

const BATCHES: u64 = 200;
const BATCH: u64 = 64;
const SIZE: u32 = 4096;

struct Side {
    engine: Engine,
    mem: HeapMemory,
    ip: IpAddr,
    cq: CqId,
    qp: Qpn,
    region: RegionInfo,
}

fn init(e: &mut Engine, cq: CqId) -> QpInit {
    QpInit {
        qp_type: QpType::Rc,
        pd: e.alloc_pd(),
        send_cq: cq,
        recv_cq: cq,
        caps: QpCaps {
            sq_depth: 1024,
            rq_depth: 16,
            max_inline: 0,
        },
        sq_sig_all: false,
        srq: None,
    }
}

fn side(last: u8) -> Side {
    let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, last));
    let mut engine = Engine::new(EngineConfig {
        local_ip: ip,
        seed: 7,
    });
    let cq = engine.create_cq(4096);
    let init = init(&mut engine, cq);
    let qp = engine.create_qp(init).unwrap();
    let region = engine
        .register(
            init.pd,
            0x1000,
            u64::from(SIZE),
            Access::REMOTE,
            WriteOrder::InOrder,
        )
        .unwrap();
    let mut mem = HeapMemory::new();
    mem.insert(region.id, vec![7; SIZE as usize]);
    Side {
        engine,
        mem,
        ip,
        cq,
        qp,
        region,
    }
}

/// Brings `qp` of `e` to RTS towards queue pair `dest` at `peer`.
fn connect(e: &mut Engine, qp: Qpn, dest: Qpn, peer: IpAddr) {
    let steps = [
        QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::REMOTE),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(Mtu::M4096),
            dest_qpn: Some(dest),
            peer: Some(roce_peer(peer)),
            rq_psn: Some(Psn::new(0).unwrap()),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(RnrTimer::new(12).unwrap()),
            ..QpAttr::default()
        },
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0).unwrap()),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..QpAttr::default()
        },
    ];
    for attr in &steps {
        e.modify_qp(qp, attr).unwrap();
    }
}

/// Moves every ready packet from `from` to `to`; returns how many.
fn pump(now: Instant, from: &mut Side, to: &mut Side, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(t) = from.engine.poll_transmit(now, &from.mem, buf) {
        let src = SocketAddr::new(from.ip, t.src_port);
        to.engine
            .handle_datagram(now, src, to.ip, &buf[..t.len], &mut to.mem);
        n += 1;
    }
    n
}

/// The busy part, which callgrind counts: every batch posted, carried, completed; the
/// engines asked for their next timer after each, as a driver does.
#[inline(never)]
fn transfer(a: &mut Side, b: &mut Side, now: Instant) -> u64 {
    let mut buf = vec![0u8; MAX_PACKET];
    let mut packets = 0;
    for _ in 0..BATCHES {
        for i in 0..BATCH {
            let local = Payload::Sges(vec![Sge {
                addr: a.region.va,
                len: SIZE,
                lkey: a.region.lkey,
            }]);
            let remote = RemoteAddr {
                va: b.region.va,
                rkey: b.region.rkey,
            };
            let mut wr = SendWr::new(i, SendOp::Write(remote), local);
            wr.signaled = i == BATCH - 1;
            a.engine.post_send(a.qp, wr).unwrap();
        }
        loop {
            let n = pump(now, a, b, &mut buf) + pump(now, b, a, &mut buf);
            black_box((a.engine.poll_timeout(), b.engine.poll_timeout()));
            if n == 0 {
                break;
            }
            packets += n as u64;
        }
        let done = a.engine.poll_completion(a.cq).expect("the batch completed");
        assert_eq!(done.wr_id, BATCH - 1);
    }
    packets
}

fn main() {
    let idle: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let (mut a, mut b) = (side(1), side(2));
    connect(&mut a.engine, a.qp, b.qp, b.ip);
    connect(&mut b.engine, b.qp, a.qp, a.ip);
    for _ in 0..idle {
        let init_a = init(&mut a.engine, a.cq);
        let qa = a.engine.create_qp(init_a).unwrap();
        let init_b = init(&mut b.engine, b.cq);
        let qb = b.engine.create_qp(init_b).unwrap();
        connect(&mut a.engine, qa, qb, b.ip);
        connect(&mut b.engine, qb, qa, a.ip);
    }
    let start = Instant::now();
    let packets = transfer(&mut a, &mut b, start);
    let took = start.elapsed();
    println!(
        "{idle} idle QPs on each engine: {packets} packets for {} WRITEs, {:.0} ns per WRITE",
        BATCHES * BATCH,
        took.as_nanos() as f64 / (BATCHES * BATCH) as f64
    );
}
