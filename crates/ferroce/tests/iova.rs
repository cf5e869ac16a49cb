//! Regions addressed from an IOVA of the caller's choosing (`Region::register_at`,
//! `ibv_reg_mr_iova2`), as Hololink registers its frame memory at 0: peers and local entries
//! name the first byte by the IOVA, and the bytes still land where they are. Two soft NICs on
//! 127.0.3.11 and 127.0.3.12.

mod support;

use support::{rc_pair, soft_nic, RcPair};

use std::net::Ipv4Addr;
use std::time::Duration;

use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, SendOp, SendWr};
use ferroce::{Region, RegionAccess, RegionError, RegionMemory};

#[test]
fn a_write_to_iova_zero_lands_at_the_regions_first_byte() {
    let (a, b) = (
        soft_nic(Ipv4Addr::new(127, 0, 3, 11)),
        soft_nic(Ipv4Addr::new(127, 0, 3, 12)),
    );
    // B's side only answers; its QP and CQ stay alive to the end.
    let RcPair {
        qa,
        qb: _qb,
        cq_a,
        cq_b: _cq_b,
    } = rc_pair(&a, &b, 16);

    // The source at an IOVA of its own, the sink at 0.
    let src = Region::register_at(
        &a,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host((0..4096u32).map(|i| i as u8).collect()),
        0x7000_0000,
    )
    .unwrap();
    assert_eq!(src.va(), 0x7000_0000);
    let dst = Region::register_at(
        &b,
        RegionAccess::RemoteWrite,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 8192]),
        0,
    )
    .unwrap();
    assert_eq!(dst.va(), 0);
    assert_eq!(dst.remote(100).unwrap().va, 100, "peers address it from 0");
    let sge = src.local(0, 4096).unwrap();
    assert_eq!(sge.addr, 0x7000_0000, "local entries too");
    // The key of a raw entry finds its region, at its IOVA; another NIC's key does not.
    let found = a.region_of_lkey(sge.lkey).expect("the region of the key");
    assert_eq!((found.va, found.len), (0x7000_0000, 4096));
    assert!(b.region_of_lkey(sge.lkey).is_none());

    qa.post_send(SendWr::new(
        1,
        SendOp::Write(dst.remote(100).unwrap()),
        Payload::Sge(sge),
    ))
    .unwrap();
    let done = cq_a.wait(Duration::from_secs(10)).expect("a completion");
    assert_eq!(done.status, WcStatus::Success);
    let mut back = vec![0; 8192];
    dst.read(0, &mut back).unwrap();
    assert!(
        back[..100].iter().all(|&b| b == 0),
        "nothing before offset 100"
    );
    assert!(
        back[100..4196]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == i as u8),
        "the 4096 bytes at offset 100"
    );
    assert!(back[4196..].iter().all(|&b| b == 0), "nothing after");

    // An entry by the bytes' real address is outside the IOVA range: a local protection
    // error, not a write to whatever lives there.
    let real = ferroce::qp::Sge {
        addr: 0x7000_0000 + 0x1_0000,
        ..sge
    };
    qa.post_send(SendWr::new(
        2,
        SendOp::Write(dst.remote(0).unwrap()),
        Payload::Sge(real),
    ))
    .unwrap();
    let refused = cq_a.wait(Duration::from_secs(10)).expect("a completion");
    assert_eq!(refused.status, WcStatus::LocProtErr);
    let lkey = sge.lkey;
    drop(src);
    assert!(a.region_of_lkey(lkey).is_none(), "gone with its region");
}

#[test]
fn an_iova_range_past_the_end_of_the_address_space_is_refused() {
    let a = soft_nic(Ipv4Addr::new(127, 0, 3, 13));
    let r = Region::register_at(
        &a,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 4096]),
        u64::MAX - 100,
    );
    assert!(matches!(r, Err(RegionError::Refused(_))), "{r:?}");
}
