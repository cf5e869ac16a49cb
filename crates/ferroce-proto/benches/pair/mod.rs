//! Two engines in one thread, packets handed over in memory, one RC connection between them:
//! what the `engine` bench times and the `idle_qps` example counts (it includes this file).

#![allow(dead_code)] // each includer uses its part

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use ferroce_proto::engine::roce_peer;
use ferroce_proto::memory::{Access, HeapMemory, RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    CqId, Mtu, Payload, QpAttr, QpCaps, QpInit, QpState, QpType, RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce_proto::wire::{Qpn, RnrTimer};
use ferroce_proto::{Engine, EngineConfig, Psn};

/// One engine with its memory, a CQ, an RC queue pair and a remotely writable region.
pub(crate) struct Side {
    pub(crate) engine: Engine,
    pub(crate) mem: HeapMemory,
    pub(crate) ip: IpAddr,
    pub(crate) cq: CqId,
    pub(crate) qp: Qpn,
    pub(crate) region: RegionInfo,
}

/// An RC queue pair in a protection domain of its own, reporting to `cq`.
pub(crate) fn qp_init(engine: &mut Engine, cq: CqId) -> QpInit {
    QpInit {
        qp_type: QpType::Rc,
        pd: engine.alloc_pd(),
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

/// An engine on `ip` with its queue pair and a region of `region_len` bytes of 7s.
pub(crate) fn side(ip: [u8; 4], region_len: usize) -> Side {
    let ip = IpAddr::V4(Ipv4Addr::from(ip));
    let mut engine = Engine::new(EngineConfig {
        local_ip: ip,
        seed: 7,
    });
    let cq = engine.create_cq(4096);
    let init = qp_init(&mut engine, cq);
    let qp = engine.create_qp(init).unwrap();
    let region = engine
        .register(
            init.pd,
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

/// Brings `qp` of `e` to RTS towards queue pair `dest` at `peer`.
pub(crate) fn connect(e: &mut Engine, qp: Qpn, dest: Qpn, peer: IpAddr) {
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

/// The two sides connected to each other.
pub(crate) fn pair(region_len: usize) -> (Side, Side) {
    let mut a = side([10, 0, 0, 1], region_len);
    let mut b = side([10, 0, 0, 2], region_len);
    connect(&mut a.engine, a.qp, b.qp, b.ip);
    connect(&mut b.engine, b.qp, a.qp, a.ip);
    (a, b)
}

/// Moves every ready packet from `from` to `to`; returns how many.
pub(crate) fn pump(now: Instant, from: &mut Side, to: &mut Side, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while let Some(t) = from.engine.poll_transmit(now, &from.mem, buf) {
        let src = SocketAddr::new(from.ip, t.src_port);
        to.engine
            .handle_datagram(now, src, to.ip, &buf[..t.len], &mut to.mem);
        n += 1;
    }
    n
}

/// Posts `batch` RDMA WRITEs of `size` bytes from `a`'s region to `b`'s, the last one
/// signaled; carries packets both ways until neither has any, calling `between` after each
/// exchange (a driver asks for its next timer there); checks the batch completed. Returns the
/// packets carried.
pub(crate) fn write_batch(
    a: &mut Side,
    b: &mut Side,
    size: u32,
    batch: u64,
    now: Instant,
    buf: &mut [u8],
    mut between: impl FnMut(&Side, &Side),
) -> u64 {
    for i in 0..batch {
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
        wr.signaled = i == batch - 1;
        a.engine.post_send(a.qp, wr).unwrap();
    }
    let mut packets = 0;
    loop {
        let n = pump(now, a, b, buf) + pump(now, b, a, buf);
        between(a, b);
        if n == 0 {
            break;
        }
        packets += n as u64;
    }
    let done = a.engine.poll_completion(a.cq).expect("the batch completed");
    assert_eq!(done.wr_id, batch - 1);
    packets
}
