//! The soft NIC over real UDP sockets on loopback: two NICs on 127.0.0.2 and 127.0.0.3 in one
//! process, every verb in both directions, byte-exact.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::qp::Mtu;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{
    ConnectOptions, Cq, Nic, NicConfig, NicError, Qp, Region, RegionAccess, RegionError,
    RegionMemory,
};

/// A port of its own per test, so the tests of this file can run in parallel.
fn nic(host: u8, port: u16) -> Nic {
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), port);
    Nic::open(&NicConfig {
        addr,
        ..NicConfig::default()
    })
    .expect("open a soft NIC on loopback")
}

struct Side {
    nic: Nic,
    cq: Cq,
    qp: Qp,
}

fn pair(port: u16, qp_type: QpType, options: &ConnectOptions) -> (Side, Side) {
    let a = nic(2, port);
    let b = nic(3, port);
    let side = |nic: Nic| {
        let cq = Cq::new(&nic, 1024).unwrap();
        let qp = Qp::new(&nic, qp_type, &cq, &cq, QpCaps::default()).unwrap();
        Side { nic, cq, qp }
    };
    let (a, b) = (side(a), side(b));
    a.qp.connect(&b.qp.endpoint(), options).unwrap();
    b.qp.connect(&a.qp.endpoint(), options).unwrap();
    (a, b)
}

fn region(nic: &Nic, access: RegionAccess, bytes: Vec<u8>) -> Region {
    Region::register(nic, access, WriteOrder::InOrder, RegionMemory::Host(bytes)).unwrap()
}

fn wait(cq: &Cq) -> ferroce::cq::Completion {
    cq.wait(Duration::from_secs(10))
        .expect("a completion within 10 s")
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn every_verb_both_ways() {
    let (a, b) = pair(24791, QpType::Rc, &ConnectOptions::default());
    for (from, to, seed) in [(&a, &b, 1u8), (&b, &a, 2u8)] {
        let src = region(&from.nic, RegionAccess::Local, pattern(100_000, seed));
        let sink = region(&from.nic, RegionAccess::Local, vec![0; 100_000]);
        let dst = region(&to.nic, RegionAccess::Remote, vec![0; 100_000]);
        let recv = region(&to.nic, RegionAccess::Local, vec![0; 100_000]);

        // SEND into a posted receive.
        to.qp
            .post_recv(RecvWr {
                wr_id: 1,
                sges: vec![recv.local(0, 100_000).unwrap()],
            })
            .unwrap();
        from.qp
            .post_send(SendWr::new(
                10,
                SendOp::SendWithImm(7),
                Payload::Sges(vec![src.local(0, 70_000).unwrap()]),
            ))
            .unwrap();
        assert_eq!(wait(&from.cq).status, WcStatus::Success);
        let c = wait(&to.cq);
        assert_eq!(
            (c.wr_id, c.status, c.byte_len, c.imm),
            (1, WcStatus::Success, 70_000, Some(7))
        );
        let mut got = vec![0; 70_000];
        recv.read(0, &mut got).unwrap();
        assert!(got == pattern(100_000, seed)[..70_000]);

        // WRITE, then READ it back, then both atomics.
        let write = SendOp::Write(dst.remote(5).unwrap());
        from.qp
            .post_send(SendWr::new(
                11,
                write,
                Payload::Sges(vec![src.local(0, 99_995).unwrap()]),
            ))
            .unwrap();
        let read = SendOp::Read(dst.remote(5).unwrap());
        from.qp
            .post_send(SendWr::new(
                12,
                read,
                Payload::Sges(vec![sink.local(0, 99_995).unwrap()]),
            ))
            .unwrap();
        for wr_id in [11, 12] {
            let c = wait(&from.cq);
            assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::Success));
        }
        let mut back = vec![0; 99_995];
        sink.read(0, &mut back).unwrap();
        assert!(back == pattern(100_000, seed)[..99_995]);

        let atomics = region(&to.nic, RegionAccess::Remote, 40u64.to_ne_bytes().to_vec());
        let result = region(&from.nic, RegionAccess::Local, vec![0; 16]);
        let add = SendOp::FetchAdd {
            remote: atomics.remote(0).unwrap(),
            add: 2,
        };
        from.qp
            .post_send(SendWr::new(
                13,
                add,
                Payload::Sges(vec![result.local(0, 8).unwrap()]),
            ))
            .unwrap();
        let cas = SendOp::CompareSwap {
            remote: atomics.remote(0).unwrap(),
            compare: 42,
            swap: 1000,
        };
        from.qp
            .post_send(SendWr::new(
                14,
                cas,
                Payload::Sges(vec![result.local(8, 8).unwrap()]),
            ))
            .unwrap();
        for wr_id in [13, 14] {
            assert_eq!(wait(&from.cq).wr_id, wr_id);
        }
        let mut words = [0u8; 16];
        result.read(0, &mut words).unwrap();
        assert_eq!(u64::from_ne_bytes(words[..8].try_into().unwrap()), 40);
        assert_eq!(u64::from_ne_bytes(words[8..].try_into().unwrap()), 42);
        let mut target = [0u8; 8];
        atomics.read(0, &mut target).unwrap();
        assert_eq!(u64::from_ne_bytes(target), 1000);
    }
    // Every packet's ICRC verified on both sides (ID 0 and DF from an unconnected socket).
    for side in [&a, &b] {
        let c = side.nic.counters();
        assert_eq!(c.icrc_err, 0);
        assert!(c.rcvd_pkts > 100);
    }
}

#[test]
fn a_wrong_key_is_a_remote_access_error_and_writes_nothing() {
    let (a, b) = pair(24792, QpType::Rc, &ConnectOptions::default());
    let src = region(&a.nic, RegionAccess::Local, vec![9; 64]);
    let dst = region(&b.nic, RegionAccess::Remote, vec![0; 64]);
    let mut remote = dst.remote(0).unwrap();
    remote.rkey ^= 1;
    a.qp.post_send(SendWr::new(
        1,
        SendOp::Write(remote),
        Payload::Sges(vec![src.local(0, 64).unwrap()]),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemAccessErr);
    let mut got = [1u8; 64];
    dst.read(0, &mut got).unwrap();
    assert_eq!(got, [0; 64]);
    assert_eq!(b.nic.counters().resp_access_err, 1);
    let line = b.nic.statistics_line("ferroce0");
    assert!(line.starts_with("link ferroce0/1 sent_pkts "), "{line}");
    assert!(line.contains(" resp_access_err 1 "), "{line}");
}

/// A queue pair grants exactly what it was connected with, checked before any key, as rxe's
/// `check_op_valid` does: an operation the QP does not enable is an invalid request (NAK
/// code 1), whatever the region would allow; one it enables on a region that does not is a
/// remote access error (NAK code 2). Each failure is fatal to the pair, so each case has its
/// own.
#[test]
fn a_queue_pair_grants_what_it_was_connected_with_and_no_more() {
    let cases: [(RegionAccess, RegionAccess, &str, WcStatus); 5] = [
        // ibv_rc_pingpong's QP grants nothing: a WRITE is an invalid request.
        (
            RegionAccess::Local,
            RegionAccess::Remote,
            "write",
            WcStatus::RemInvReqErr,
        ),
        // ib_write_bw's grants WRITE only: a READ is an invalid request.
        (
            RegionAccess::RemoteWrite,
            RegionAccess::Remote,
            "read",
            WcStatus::RemInvReqErr,
        ),
        // ib_read_bw's grants READ only: a WRITE and an atomic are invalid requests.
        (
            RegionAccess::RemoteRead,
            RegionAccess::Remote,
            "write",
            WcStatus::RemInvReqErr,
        ),
        (
            RegionAccess::RemoteRead,
            RegionAccess::Remote,
            "atomic",
            WcStatus::RemInvReqErr,
        ),
        // Granted by the QP, refused by the region: a remote access error.
        (
            RegionAccess::RemoteRead,
            RegionAccess::RemoteWrite,
            "read",
            WcStatus::RemAccessErr,
        ),
    ];
    for (i, (qp_grant, region_grant, op, want)) in cases.into_iter().enumerate() {
        let options = ConnectOptions {
            access: qp_grant,
            ..ConnectOptions::default()
        };
        let (a, b) = pair(24800 + i as u16, QpType::Rc, &options);
        let local = region(&a.nic, RegionAccess::Local, vec![9; 64]);
        let target = region(&b.nic, region_grant, vec![0; 64]);
        let remote = target.remote(0).unwrap();
        let op = match op {
            "write" => SendOp::Write(remote),
            "read" => SendOp::Read(remote),
            _ => SendOp::FetchAdd { remote, add: 1 },
        };
        let len = if matches!(op, SendOp::FetchAdd { .. }) {
            8
        } else {
            64
        };
        a.qp.post_send(SendWr::new(
            1,
            op,
            Payload::Sge(local.local(0, len).unwrap()),
        ))
        .unwrap();
        assert_eq!(wait(&a.cq).status, want, "case {i}");
        let mut got = [1u8; 64];
        target.read(0, &mut got).unwrap();
        assert_eq!(got, [0; 64], "case {i}: nothing written");
        let counters = b.nic.counters();
        let (invalid, access) = (counters.resp_invalid_req, counters.resp_access_err);
        if want == WcStatus::RemInvReqErr {
            assert_eq!((invalid, access), (1, 0), "case {i}");
        } else {
            assert_eq!((invalid, access), (0, 1), "case {i}");
        }
    }
}

#[test]
fn a_peer_that_disappears_ends_in_retry_exceeded() {
    // 4.096 µs × 2^10 ≈ 4 ms per try, 3 retries.
    let options = ConnectOptions {
        timeout: 10,
        retry_cnt: 3,
        ..ConnectOptions::default()
    };
    let (a, b) = pair(24793, QpType::Rc, &options);
    drop(b);
    let src = region(&a.nic, RegionAccess::Local, vec![1; 8]);
    let started = Instant::now();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::Send,
        Payload::Sges(vec![src.local(0, 8).unwrap()]),
    ))
    .unwrap();
    a.qp.post_send(SendWr::new(
        2,
        SendOp::Send,
        Payload::Sges(vec![src.local(0, 8).unwrap()]),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RetryExcErr);
    assert_eq!(wait(&a.cq).status, WcStatus::WrFlushErr);
    assert!(
        started.elapsed() >= Duration::from_millis(16),
        "four timeouts of 4 ms"
    );
}

#[test]
fn an_address_in_use_is_named() {
    let first = nic(2, 24794);
    let err = Nic::open(&NicConfig {
        addr: first.addr(),
        ..NicConfig::default()
    })
    .unwrap_err();
    assert!(matches!(err, NicError::AddressInUse { .. }));
    let text = err.to_string();
    assert!(
        text.contains("127.0.0.2:24794") && text.contains("UDP port 24794"),
        "{text}"
    );
}

#[test]
fn the_active_mtu_follows_the_link_as_rxe_derives_it() {
    // Loopback's MTU (65536 unless someone changed it) carries 4096-byte RoCE packets.
    let lo: u32 = std::fs::read_to_string("/sys/class/net/lo/mtu")
        .expect("loopback's MTU in sysfs")
        .trim()
        .parse()
        .unwrap();
    let on_lo = nic(2, 24793);
    assert_eq!(on_lo.active_mtu(), Mtu::for_link(lo));
    // IPv6 loopback, where the host has it.
    if let Ok(v6) = Nic::open(&NicConfig {
        addr: SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::LOCALHOST), 24793),
        ..NicConfig::default()
    }) {
        assert_eq!(v6.active_mtu(), Mtu::for_link(lo));
    }
    // A NIC on every address has no one link: the common 1024.
    let anywhere = Nic::open(&NicConfig {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 24789),
        ..NicConfig::default()
    })
    .unwrap();
    assert_eq!(anywhere.active_mtu(), Mtu::M1024);
}

#[test]
fn regions_check_ranges_and_give_their_bytes_back() {
    let nic = nic(2, 24795);
    let r = region(&nic, RegionAccess::RemoteWrite, vec![5; 100]);
    assert!(r.local(90, 10).is_ok());
    assert!(matches!(
        r.local(91, 10),
        Err(RegionError::OutOfRange { .. })
    ));
    assert!(matches!(r.remote(100), Err(RegionError::OutOfRange { .. })));
    assert!(matches!(
        r.read(u64::MAX, &mut [0; 2]),
        Err(RegionError::OutOfRange { .. })
    ));
    let local = region(&nic, RegionAccess::Local, vec![1]);
    assert!(matches!(local.remote(0), Err(RegionError::NotRemote)));
    assert!(matches!(
        Region::register(
            &nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Host(Vec::new())
        ),
        Err(RegionError::Empty)
    ));
    assert!(matches!(
        Region::register(
            &nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Dmabuf {
                fd: -1,
                offset: 0,
                bytes: 8
            }
        ),
        Err(RegionError::Dmabuf { .. })
    ));
    r.write(0, &[7, 7]).unwrap();
    let RegionMemory::Host(bytes) = r.deregister().unwrap() else {
        panic!("host memory comes back")
    };
    assert_eq!(&bytes[..3], &[7, 7, 5]);
}

/// `read_with` copies as `read` does and shows every piece, in order, once it is copied (a
/// frame-sized read comes in 64 KiB pieces); a refused range shows nothing.
#[test]
fn a_read_shows_each_piece_it_copied() {
    let nic = nic(2, 24812);
    let len = 3 * 65536 + 100;
    let bytes = pattern(len, 3);
    let r = region(&nic, RegionAccess::Local, bytes.clone());
    let (mut out, mut seen, mut pieces) = (vec![0; len - 10], Vec::new(), 0);
    r.read_with(10, &mut out, |piece| {
        seen.extend_from_slice(piece);
        pieces += 1;
    })
    .unwrap();
    assert_eq!(out, bytes[10..]);
    assert_eq!(seen, out);
    assert_eq!(pieces, 4);
    let mut calls = 0;
    assert!(matches!(
        r.read_with(len as u64 - 1, &mut [0; 2], |_| calls += 1),
        Err(RegionError::OutOfRange { .. })
    ));
    assert_eq!(calls, 0);
}

/// `inspect` shows the bytes in 64 KiB pieces, in order, without a copy to give; a refused
/// range shows nothing; a closure that uses the region it is shown panics with the reason
/// (the region's lock is held) rather than deadlock, and leaves the region usable.
#[test]
fn an_inspect_shows_each_piece_in_place() {
    let nic = nic(2, 24813);
    let len = 3 * 65536 + 100;
    let bytes = pattern(len, 4);
    let r = region(&nic, RegionAccess::Local, bytes.clone());
    let (mut seen, mut pieces) = (Vec::new(), 0);
    r.inspect(10, len as u64 - 10, |piece| {
        seen.extend_from_slice(piece);
        pieces += 1;
    })
    .unwrap();
    assert!(seen == bytes[10..]);
    assert_eq!(pieces, 4);
    let mut calls = 0;
    assert!(matches!(
        r.inspect(len as u64 - 1, 2, |_| calls += 1),
        Err(RegionError::OutOfRange { .. })
    ));
    assert_eq!(calls, 0);

    let inside = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        r.inspect(0, 8, |_| {
            let _ = r.read(0, &mut [0; 1]);
        })
    }));
    let why = inside.expect_err("a read inside the region's own inspect");
    let why = why
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| why.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("");
    assert!(why.contains("from inside its own inspect"), "{why}");
    let mut one = [0; 1];
    r.read(10, &mut one).unwrap();
    assert_eq!(one[0], bytes[10]);
}

/// A dma-buf region is mapped by the soft backend: a peer's WRITE lands in the exporter's
/// memory (here a plain file, which maps the same way), at the registered offset, and a READ
/// returns it; a descriptor that cannot be mapped is refused with the reason.
#[test]
fn dmabuf_regions_are_mapped() {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::fd::AsRawFd;

    let (a, b) = pair(24797, QpType::Rc, &ConnectOptions::default());
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(&vec![0xaa; 3 * 4096]).unwrap();
    let memory = RegionMemory::Dmabuf {
        fd: file.as_raw_fd(),
        offset: 4096 + 100,
        bytes: 2000,
    };
    let device =
        Region::register(&b.nic, RegionAccess::Remote, WriteOrder::InOrder, memory).unwrap();
    let src = region(&a.nic, RegionAccess::Local, pattern(2000, 6));
    let write = SendOp::Write(device.remote(0).unwrap());
    a.qp.post_send(SendWr::new(
        1,
        write,
        Payload::Sges(vec![src.local(0, 2000).unwrap()]),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);

    let mut landed = vec![0; 3 * 4096];
    file.seek(SeekFrom::Start(0)).unwrap();
    file.read_exact(&mut landed).unwrap();
    assert!(
        landed[4196..6196] == pattern(2000, 6)[..],
        "the WRITE landed in the mapped file"
    );
    assert!(
        landed[..4196]
            .iter()
            .chain(&landed[6196..])
            .all(|&x| x == 0xaa),
        "nothing else changed"
    );
    let mut through_region = vec![0; 2000];
    device.read(0, &mut through_region).unwrap();
    assert!(through_region == pattern(2000, 6));

    let back = device.deregister().unwrap();
    assert!(matches!(
        back,
        RegionMemory::Dmabuf {
            offset: 4196,
            bytes: 2000,
            ..
        }
    ));
    // A socket cannot be mapped.
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let unmappable = RegionMemory::Dmabuf {
        fd: socket.as_raw_fd(),
        offset: 0,
        bytes: 8,
    };
    let err =
        Region::register(&a.nic, RegionAccess::Local, WriteOrder::InOrder, unmappable).unwrap_err();
    assert!(matches!(err, RegionError::Dmabuf { .. }));
    assert!(err.to_string().contains("mmap failed"), "{err}");
}

#[test]
fn uc_send_and_write() {
    let (a, b) = pair(24796, QpType::Uc, &ConnectOptions::default());
    let src = region(&a.nic, RegionAccess::Local, pattern(5000, 4));
    let dst = region(&b.nic, RegionAccess::RemoteWrite, vec![0; 5000]);
    let recv = region(&b.nic, RegionAccess::Local, vec![0; 5000]);
    b.qp.post_recv(RecvWr {
        wr_id: 3,
        sges: vec![recv.local(0, 5000).unwrap()],
    })
    .unwrap();
    a.qp.post_send(SendWr::new(
        1,
        SendOp::Write(dst.remote(0).unwrap()),
        Payload::Sges(vec![src.local(0, 5000).unwrap()]),
    ))
    .unwrap();
    a.qp.post_send(SendWr::new(
        2,
        SendOp::Send,
        Payload::Sges(vec![src.local(0, 3000).unwrap()]),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).wr_id, 1);
    assert_eq!(wait(&a.cq).wr_id, 2);
    assert_eq!(wait(&b.cq).byte_len, 3000);
    let mut got = vec![0; 5000];
    dst.read(0, &mut got).unwrap();
    assert!(got == pattern(5000, 4));
}

/// A READ of 4 MiB arrives as one burst of 4096 responses: the NIC's enlarged socket buffers
/// absorb it (the default 208 KiB would drop its tail every time and exhaust the retries).
#[test]
fn a_large_read_arrives_whole() {
    let (a, b) = pair(24798, QpType::Rc, &ConnectOptions::default());
    let len = 4 << 20;
    let target = region(&b.nic, RegionAccess::Remote, pattern(len, 21));
    let sink = region(&a.nic, RegionAccess::Local, vec![0; len]);
    let read = SendOp::Read(target.remote(0).unwrap());
    a.qp.post_send(SendWr::new(
        1,
        read,
        Payload::Sges(vec![sink.local(0, len as u32).unwrap()]),
    ))
    .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::Success);
    let mut got = vec![0; len];
    sink.read(0, &mut got).unwrap();
    assert!(got == pattern(len, 21));
}

/// Sixteen 64 KiB READs outstanding while the responder's NIC drops 2% of what it sends:
/// every loss is recovered by one retry. (Each response in flight behind a lost one used to
/// count as a fresh loss, and a single lost packet exhausted `retry_cnt` in milliseconds.)
#[test]
fn reads_in_flight_survive_loss() {
    let faulty = |host: u8| {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 24799);
        Nic::open(&NicConfig {
            addr,
            faults: Some("loss=0.02,seed=5".parse().unwrap()),
            ..NicConfig::on(addr.ip())
        })
        .unwrap()
    };
    let (a, b) = (faulty(2), faulty(3));
    let cq_a = Cq::new(&a, 64).unwrap();
    let cq_b = Cq::new(&b, 64).unwrap();
    let qa = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
    let qb = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
    let options = ConnectOptions::default();
    qa.connect(&qb.endpoint(), &options).unwrap();
    qb.connect(&qa.endpoint(), &options).unwrap();
    let len = 64 * 1024;
    let target = region(&b, RegionAccess::Remote, pattern(len, 23));
    let sink = region(&a, RegionAccess::Local, vec![0; 16 * len]);
    for round in 0..4u64 {
        for i in 0..16u64 {
            let at = i * len as u64;
            qa.post_send(SendWr::new(
                round * 16 + i,
                SendOp::Read(target.remote(0).unwrap()),
                Payload::Sges(vec![sink.local(at, len as u32).unwrap()]),
            ))
            .unwrap();
        }
        for _ in 0..16 {
            let c = wait(&cq_a);
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
        }
    }
    let mut got = vec![0; len];
    for i in 0..16u64 {
        sink.read(i * len as u64, &mut got).unwrap();
        assert!(got == pattern(len, 23), "READ {i}");
    }
    assert_eq!(a.counters().retry_exceeded_err, 0);
}

/// Every set of remote rights a user can OR together (`RegionAccess::from_flags`, all eight)
/// grants exactly that, on a region and on a queue pair: each of WRITE, READ and an atomic
/// succeeds where its right is in the set and fails where it is not (a remote access error
/// from the region, an invalid request from the QP), writing nothing. A failure is fatal to
/// the pair, so each operation has its own, on 127.0.4.1 and 127.0.4.2.
#[test]
fn every_or_of_access_flags_grants_exactly_that() {
    let nic4 = |host: u8, port: u16| {
        Nic::open(&NicConfig {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 4, host)), port),
            ..NicConfig::default()
        })
        .expect("open a soft NIC on loopback")
    };
    let mut port = 25000u16;
    for bits in 0..8u32 {
        let grant = RegionAccess::from_flags(bits).unwrap();
        assert_eq!(grant.flags(), bits);
        // The same set built with `|` from the single rights.
        let mut ored = RegionAccess::Local;
        for (bit, single) in [
            (1, RegionAccess::RemoteWrite),
            (2, RegionAccess::RemoteRead),
            (4, RegionAccess::RemoteAtomic),
        ] {
            if bits & bit != 0 {
                ored |= single;
            }
        }
        assert_eq!(ored, grant);
        for (bit, op) in [(1u32, "write"), (2, "read"), (4, "atomic")] {
            // Granted by the region (the QP grants everything), then by the QP (the region
            // grants everything).
            for on_qp in [false, true] {
                port += 1;
                let options = ConnectOptions {
                    access: if on_qp { grant } else { RegionAccess::Remote },
                    ..ConnectOptions::default()
                };
                let (a, b) = (nic4(1, port), nic4(2, port));
                let side = |nic: &Nic| {
                    let cq = Cq::new(nic, 64).unwrap();
                    let qp = Qp::new(nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
                    (cq, qp)
                };
                let ((a_cq, a_qp), (_b_cq, b_qp)) = (side(&a), side(&b));
                a_qp.connect(&b_qp.endpoint(), &options).unwrap();
                b_qp.connect(&a_qp.endpoint(), &options).unwrap();
                let local = region(&a, RegionAccess::Local, vec![9; 64]);
                let region_grant = if on_qp { RegionAccess::Remote } else { grant };
                let target = region(&b, region_grant, vec![0; 64]);
                if region_grant == RegionAccess::Local {
                    // No right, no key: nothing a peer could present.
                    assert!(matches!(target.remote(0), Err(RegionError::NotRemote)));
                    continue;
                }
                let remote = target.remote(0).unwrap();
                let (send_op, len) = match op {
                    "write" => (SendOp::Write(remote), 64),
                    "read" => (SendOp::Read(remote), 64),
                    _ => (SendOp::FetchAdd { remote, add: 1 }, 8),
                };
                a_qp.post_send(SendWr::new(
                    1,
                    send_op,
                    Payload::Sge(local.local(0, len).unwrap()),
                ))
                .unwrap();
                let status = a_cq
                    .wait(Duration::from_secs(10))
                    .expect("a completion within 10 s")
                    .status;
                let want = if bits & bit != 0 {
                    WcStatus::Success
                } else if on_qp {
                    WcStatus::RemInvReqErr
                } else {
                    WcStatus::RemAccessErr
                };
                assert_eq!(status, want, "{grant:?} on the QP: {on_qp}, {op}");
                let mut got = [1u8; 64];
                target.read(0, &mut got).unwrap();
                let changed = got != [0; 64];
                assert_eq!(
                    changed,
                    want == WcStatus::Success && bit != 2,
                    "{grant:?} on the QP: {on_qp}, {op}: written only when granted"
                );
            }
        }
    }
}

/// A receiver that takes its completion and closes at once has still acknowledged what it
/// took. A polling receiver holds its ACK back a few microseconds, to leave with its next
/// packet; that ACK must go out when the QP or the NIC goes, or the sender resends to a peer
/// that is gone (kernel rxe resent `ibv_rc_pingpong`'s last message for as long as it ran).
#[test]
fn a_receiver_that_closes_right_after_its_completion_has_acknowledged() {
    // One retry after 4.096 µs × 2^10 ≈ 4 ms: a lost ACK ends in RETRY_EXC_ERR within 10 ms.
    let options = ConnectOptions {
        timeout: 10,
        retry_cnt: 1,
        ..ConnectOptions::default()
    };
    for round in 0..20u8 {
        let (a, b) = pair(24831, QpType::Rc, &options);
        let dst = region(&b.nic, RegionAccess::Local, vec![0; 8]);
        b.qp.post_recv(RecvWr {
            wr_id: 7,
            sges: vec![dst.local(0, 8).unwrap()],
        })
        .unwrap();
        let src = region(&a.nic, RegionAccess::Local, vec![round; 8]);
        a.qp.post_send(SendWr::new(
            1,
            SendOp::Send,
            Payload::Sges(vec![src.local(0, 8).unwrap()]),
        ))
        .unwrap();
        // Poll, as ibv_rc_pingpong does, and close the moment the receive completes: the
        // QP first, then the NIC, as ibv_destroy_qp and ibv_close_device do.
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            if let Some(c) = b.cq.poll() {
                break c;
            }
            assert!(Instant::now() < deadline, "round {round}: no receive");
        };
        let Side { nic, cq, qp } = b;
        drop(qp);
        drop(cq);
        drop(dst);
        drop(nic);
        assert_eq!((got.wr_id, got.status), (7, WcStatus::Success));
        assert_eq!(
            wait(&a.cq).status,
            WcStatus::Success,
            "round {round}: the SEND was acknowledged"
        );
    }
}
