//! The engine alone: requester → responder → completer for 64 B and 4 KiB RDMA WRITEs between
//! two engines in one thread, packets handed over in memory. This is the ceiling the UDP
//! driver works under. Run with `cargo bench -p ferroce-proto --bench engine`.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroce_proto::engine::{roce_peer, MAX_PACKET};
use ferroce_proto::memory::{Access, HeapMemory, RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    CqId, Mtu, Payload, QpAttr, QpCaps, QpInit, QpState, QpType, RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce_proto::wire::{Qpn, RnrTimer};
use ferroce_proto::{Engine, EngineConfig, Psn};

const BATCH: u64 = 64;

struct Side {
    engine: Engine,
    mem: HeapMemory,
    ip: IpAddr,
    cq: CqId,
    qp: Qpn,
    region: RegionInfo,
}

fn side(ip: [u8; 4], region_len: usize) -> Side {
    let ip = IpAddr::V4(Ipv4Addr::from(ip));
    let mut engine = Engine::new(EngineConfig {
        local_ip: ip,
        seed: 7,
    });
    let pd = engine.alloc_pd();
    let cq = engine.create_cq(4096);
    let qp = engine
        .create_qp(QpInit {
            qp_type: QpType::Rc,
            pd,
            send_cq: cq,
            recv_cq: cq,
            caps: QpCaps {
                sq_depth: 1024,
                rq_depth: 16,
                max_inline: 0,
            },
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let region = engine
        .register(
            pd,
            0x1000,
            region_len as u64,
            Access::REMOTE,
            WriteOrder::InOrder,
        )
        .unwrap();
    let mut mem = HeapMemory::new();
    mem.insert(region.id, vec![7; region_len]);
    Side {
        engine,
        mem,
        ip,
        cq,
        qp,
        region,
    }
}

fn connect(a: &mut Side, b: &Side) {
    let e = &mut a.engine;
    e.modify_qp(
        a.qp,
        &QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::REMOTE),
            ..QpAttr::default()
        },
    )
    .unwrap();
    e.modify_qp(
        a.qp,
        &QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(Mtu::M4096),
            dest_qpn: Some(b.qp),
            peer: Some(roce_peer(b.ip)),
            rq_psn: Some(Psn::new(0).unwrap()),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(RnrTimer::new(12).unwrap()),
            ..QpAttr::default()
        },
    )
    .unwrap();
    e.modify_qp(
        a.qp,
        &QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(0).unwrap()),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..QpAttr::default()
        },
    )
    .unwrap();
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

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_write");
    for size in [64u32, 4096] {
        let mut a = side([10, 0, 0, 1], size as usize);
        let mut b = side([10, 0, 0, 2], size as usize);
        connect(&mut a, &b);
        connect(&mut b, &a);
        let mut buf = vec![0u8; MAX_PACKET];
        let now = Instant::now();
        group.throughput(Throughput::Elements(BATCH));
        group.bench_function(BenchmarkId::new("packets", size), |bench| {
            bench.iter(|| {
                for i in 0..BATCH {
                    let local = Payload::Sges(vec![Sge {
                        addr: a.region.va,
                        len: size,
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
                while pump(now, &mut a, &mut b, &mut buf) + pump(now, &mut b, &mut a, &mut buf) > 0
                {
                }
                let done = a.engine.poll_completion(a.cq).expect("the batch completed");
                assert_eq!(done.wr_id, BATCH - 1);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
