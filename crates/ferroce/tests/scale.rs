//! Scale on one NIC: tens of thousands of regions, each written by the peer through its own
//! key and read back; thousands of idle queue pairs beside a busy one, which moves its bytes
//! as it would alone; and every object gone again afterwards (`Nic::census`). Two soft NICs
//! on 127.0.0.74 and .75.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use ferroce::cq::{WcOpcode, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

fn nic(host: u8, port: u16) -> Nic {
    Nic::open(&NicConfig {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), port),
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback")
}

fn census(nic: &Nic) -> ferroce::proto::Census {
    nic.census().expect("a soft NIC counts its objects")
}

fn connected(a: &Nic, b: &Nic, cq_a: &Cq, cq_b: &Cq, caps: QpCaps) -> (Qp, Qp) {
    let qa = Qp::new(a, QpType::Rc, cq_a, cq_a, caps).unwrap();
    let qb = Qp::new(b, QpType::Rc, cq_b, cq_b, caps).unwrap();
    qa.connect(&qb.endpoint(), &ConnectOptions::default())
        .unwrap();
    qb.connect(&qa.endpoint(), &ConnectOptions::default())
        .unwrap();
    (qa, qb)
}

fn byte(region: usize, at: usize) -> u8 {
    (region.wrapping_mul(31) ^ at.wrapping_mul(7)) as u8
}

/// Waits for `n` successful completions of `opcode`.
fn drain(cq: &Cq, n: usize, opcode: WcOpcode) {
    for _ in 0..n {
        let c = cq
            .wait(Duration::from_secs(30))
            .expect("a completion within 30 s");
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.opcode, opcode);
    }
}

#[test]
fn twenty_thousand_regions_each_written_through_its_own_key() {
    const REGIONS: usize = 20_000;
    const LEN: usize = 128;
    let (a, b) = (nic(74, 19_450), nic(75, 19_450));
    let (cq_a, cq_b) = (Cq::new(&a, 1024).unwrap(), Cq::new(&b, 64).unwrap());
    let caps = QpCaps {
        sq_depth: 512,
        ..QpCaps::default()
    };
    let (qa, _qb) = connected(&a, &b, &cq_a, &cq_b, caps);
    let baseline = census(&b);
    let targets: Vec<Region> = (0..REGIONS)
        .map(|_| {
            Region::register(
                &b,
                RegionAccess::Remote,
                WriteOrder::InOrder,
                RegionMemory::Pageable(vec![0; LEN]),
            )
            .unwrap()
        })
        .collect();
    let rkeys: std::collections::HashSet<u32> =
        targets.iter().map(|r| r.remote(0).unwrap().rkey).collect();
    assert_eq!(rkeys.len(), REGIONS, "every region has a key of its own");
    let source: Vec<u8> = (0..REGIONS * LEN).map(|i| byte(i / LEN, i % LEN)).collect();
    let src = Region::register(
        &a,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(source),
    )
    .unwrap();
    // 256 WRITEs at a time, each into its own region at its own key.
    for chunk in (0..REGIONS).collect::<Vec<_>>().chunks(256) {
        for &i in chunk {
            qa.post_send(SendWr::new(
                i as u64,
                SendOp::Write(targets[i].remote(0).unwrap()),
                Payload::Sges(vec![src.local((i * LEN) as u64, LEN as u32).unwrap()]),
            ))
            .unwrap();
        }
        drain(&cq_a, chunk.len(), WcOpcode::RdmaWrite);
    }
    for (i, region) in targets.iter().enumerate() {
        let mut got = vec![0; LEN];
        region.read(0, &mut got).unwrap();
        assert!(
            got.iter().enumerate().all(|(at, &v)| v == byte(i, at)),
            "region {i} holds another region's bytes"
        );
    }
    assert_eq!(census(&b).regions, baseline.regions + REGIONS);
    drop(targets);
    assert_eq!(census(&b), baseline, "deregistering left something behind");
}

#[test]
fn a_busy_queue_pair_among_five_thousand_idle_ones() {
    const IDLE: usize = 5_000;
    let (a, b) = (nic(74, 19_451), nic(75, 19_451));
    let (cq_a, cq_b) = (Cq::new(&a, 1024).unwrap(), Cq::new(&b, 64).unwrap());
    let baseline = (census(&a), census(&b));
    let idle: Vec<(Qp, Qp)> = (0..IDLE)
        .map(|_| connected(&a, &b, &cq_a, &cq_b, QpCaps::default()))
        .collect();
    let caps = QpCaps {
        sq_depth: 256,
        ..QpCaps::default()
    };
    let (busy, _peer) = connected(&a, &b, &cq_a, &cq_b, caps);
    let data: Vec<u8> = (0..1 << 20).map(|i| byte(i >> 12, i & 0xfff)).collect();
    let src = Region::register(
        &a,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(data.clone()),
    )
    .unwrap();
    let dst = Region::register(
        &b,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 1 << 20]),
    )
    .unwrap();
    for round in 0..8u64 {
        for i in 0..256u64 {
            let at = i * 4096;
            busy.post_send(SendWr::new(
                round * 256 + i,
                SendOp::Write(dst.remote(at).unwrap()),
                Payload::Sges(vec![src.local(at, 4096).unwrap()]),
            ))
            .unwrap();
        }
        drain(&cq_a, 256, WcOpcode::RdmaWrite);
    }
    let mut landed = vec![0; 1 << 20];
    dst.read(0, &mut landed).unwrap();
    assert!(landed == data, "the busy queue pair's WRITEs landed wrong");
    // Nothing runs for the idle ones: no timer armed, no completion queued.
    let now = census(&a);
    assert_eq!(now.qps, baseline.0.qps + IDLE + 1);
    assert_eq!(now.armed_timers, 0, "{now:?}");
    assert_eq!(now.queued_completions, 0, "{now:?}");
    drop((busy, _peer, src, dst, idle));
    assert_eq!((census(&a), census(&b)), baseline);
}
