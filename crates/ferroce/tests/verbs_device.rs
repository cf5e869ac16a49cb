//! The verbs backend on a real kernel RDMA device: every check here needs one, named by
//! `FERROCE_TEST_DEVICE` (the interop suite runs this binary inside a QEMU guest with
//! `FERROCE_TEST_DEVICE=rxe0`, kernel Soft-RoCE on Debian 12's 6.1 kernel). Without the
//! variable each test says it needs a device and does nothing; `interop/run.sh` is what runs
//! them, and fails when any of them fails or skips.
//!
//! Two QPs of one device connect to each other through the device's own GID (rxe loops them
//! back), so every verb crosses the kernel driver without a second host.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ferroce::cq::{Completion, WcOpcode, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::qp::Mtu;
use ferroce::qp::{Payload, PostError, QpCaps, QpType, RecvWr, RemoteAddr, SendOp, SendWr};
use ferroce::verbs::{DeviceOptions, VerbsError};
use ferroce::{
    ConnectOptions, Cq, Nic, NicConfig, NicError, Qp, Region, RegionAccess, RegionError,
    RegionMemory,
};

fn device() -> Option<String> {
    let name = std::env::var("FERROCE_TEST_DEVICE").ok();
    if name.is_none() {
        eprintln!("SKIPPED: needs a verbs device (FERROCE_TEST_DEVICE=rxe0; interop/run.sh runs this in a guest)");
    }
    name
}

fn open(name: &str) -> Nic {
    Nic::open_device(name, &DeviceOptions::default(), &NicConfig::default())
        .unwrap_or_else(|e| panic!("open {name}: {e}"))
}

fn wait(cq: &Cq) -> Completion {
    let c = cq
        .wait(Duration::from_secs(10))
        .expect("a completion within 10 s");
    assert_eq!(c.status, WcStatus::Success, "{c:?}");
    c
}

fn region(nic: &Nic, bytes: Vec<u8>) -> Region {
    Region::register(
        nic,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(bytes),
    )
    .expect("register")
}

struct Pair {
    cq_a: Cq,
    cq_b: Cq,
    a: Qp,
    b: Qp,
}

fn pair(nic: &Nic, qp_type: QpType, caps: QpCaps, cq_depth: usize) -> Pair {
    let cq_a = Cq::new(nic, cq_depth).unwrap();
    let cq_b = Cq::new(nic, cq_depth).unwrap();
    let a = Qp::new(nic, qp_type, &cq_a, &cq_a, caps).unwrap();
    let b = Qp::new(nic, qp_type, &cq_b, &cq_b, caps).unwrap();
    let options = ConnectOptions {
        mtu: nic.active_mtu().min(Mtu::M4096),
        ..ConnectOptions::default()
    };
    a.connect(&b.endpoint(), &options).unwrap();
    b.connect(&a.endpoint(), &options).unwrap();
    Pair { cq_a, cq_b, a, b }
}

#[test]
fn every_verb_crosses_the_device_byte_exact() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    assert_eq!(nic.device_name(), name);
    assert!(!nic.caps().per_packet_counters);
    let p = pair(&nic, QpType::Rc, QpCaps::default(), 64);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let src = region(&nic, data.clone());
    let dst = region(&nic, vec![0; data.len()]);

    // WRITE with immediate: the bytes land, and the immediate reaches a receive.
    p.b.post_recv(RecvWr {
        wr_id: 9,
        sges: Vec::new(),
    })
    .unwrap();
    let wr = SendWr::new(
        1,
        SendOp::WriteWithImm(dst.remote(0).unwrap(), 0xfeed_beef),
        Payload::Sge(src.local(0, data.len() as u32).unwrap()),
    );
    p.a.post_send(wr).unwrap();
    assert_eq!(wait(&p.cq_a).opcode, WcOpcode::RdmaWrite);
    let got = wait(&p.cq_b);
    assert_eq!(got.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(got.imm, Some(0xfeed_beef));
    assert_eq!(got.qpn, p.b.qpn());
    let mut out = vec![0; data.len()];
    dst.read(0, &mut out).unwrap();
    assert_eq!(out, data);

    // READ it back into another region.
    let back = region(&nic, vec![0; 4096]);
    p.a.post_send(SendWr::new(
        2,
        SendOp::Read(dst.remote(1000).unwrap()),
        Payload::Sge(back.local(0, 4096).unwrap()),
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).opcode, WcOpcode::RdmaRead);
    let mut out = vec![0; 4096];
    back.read(0, &mut out).unwrap();
    assert_eq!(out, data[1000..5096]);

    // SEND into a posted buffer, and the byte count.
    let inbox = region(&nic, vec![0; 512]);
    p.b.post_recv(RecvWr {
        wr_id: 10,
        sges: vec![inbox.local(0, 512).unwrap()],
    })
    .unwrap();
    p.a.post_send(SendWr::new(
        3,
        SendOp::Send,
        Payload::Sge(src.local(0, 300).unwrap()),
    ))
    .unwrap();
    wait(&p.cq_a);
    let got = wait(&p.cq_b);
    assert_eq!(
        (got.wr_id, got.opcode, got.byte_len),
        (10, WcOpcode::Recv, 300)
    );
    let mut out = vec![0; 300];
    inbox.read(0, &mut out).unwrap();
    assert_eq!(out, data[..300]);

    // Fetch-and-add and compare-and-swap on an 8-aligned word.
    let word = region(&nic, 40u64.to_le_bytes().to_vec());
    let old = region(&nic, vec![0; 8]);
    let remote = word.remote(0).unwrap();
    p.a.post_send(SendWr::new(
        4,
        SendOp::FetchAdd { remote, add: 2 },
        Payload::Sge(old.local(0, 8).unwrap()),
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).opcode, WcOpcode::FetchAdd);
    let mut v = [0; 8];
    old.read(0, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 40);
    p.a.post_send(SendWr::new(
        5,
        SendOp::CompareSwap {
            remote,
            compare: 42,
            swap: 7,
        },
        Payload::Sge(old.local(0, 8).unwrap()),
    ))
    .unwrap();
    assert_eq!(wait(&p.cq_a).opcode, WcOpcode::CompSwap);
    word.read(0, &mut v).unwrap();
    assert_eq!(u64::from_le_bytes(v), 7);

    // A list of WRITEs posted as one chain, one completion at its end.
    let wrs = (0..8u32).map(|i| SendWr {
        signaled: i == 7,
        ..SendWr::new(
            100 + u64::from(i),
            SendOp::Write(RemoteAddr {
                va: dst.va() + u64::from(i) * 1000,
                rkey: dst.rkey(),
            }),
            Payload::Sge(src.local(50_000 + u64::from(i) * 1000, 1000).unwrap()),
        )
    });
    p.a.post_send_list(wrs).unwrap();
    assert_eq!(wait(&p.cq_a).wr_id, 107);
    let mut out = vec![0; 8000];
    dst.read(0, &mut out).unwrap();
    assert_eq!(out, data[50_000..58_000]);

    // The device's own counters, as `--stats` prints them.
    let stats = nic.statistics_line(&name);
    assert!(stats.starts_with(&format!("link {name}/1 ")), "{stats}");
    let sent = stats
        .split_whitespace()
        .skip_while(|w| *w != "sent_pkts")
        .nth(1)
        .and_then(|v| v.parse::<u64>().ok());
    assert!(sent.is_some_and(|n| n > 0), "{stats}");

    // The host bytes come back with what the device wrote.
    match dst.deregister().unwrap() {
        RegionMemory::Host(bytes) => assert_eq!(bytes[..8000], data[50_000..58_000]),
        other => panic!("got {other:?}"),
    }
}

#[test]
fn an_access_the_region_does_not_grant_fails_the_request() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    let p = pair(&nic, QpType::Rc, QpCaps::default(), 16);
    let local = region(&nic, vec![1; 64]);
    let readonly = Region::register(
        &nic,
        RegionAccess::RemoteWrite,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 64]),
    )
    .unwrap();
    // READ from a region granted for writes only: rxe NAKs it (remote access error).
    p.a.post_send(SendWr::new(
        1,
        SendOp::Read(readonly.remote(0).unwrap()),
        Payload::Sge(local.local(0, 64).unwrap()),
    ))
    .unwrap();
    let c = p.cq_a.wait(Duration::from_secs(10)).expect("a completion");
    assert_eq!(c.status, WcStatus::RemAccessErr, "{c:?}");
    // The responder's QP: what its async events said.
    std::thread::sleep(Duration::from_millis(500));
    eprintln!(
        "responder after the access error: state {:?}, failure {:?}",
        p.b.state(),
        p.b.failure()
    );
    let _ = &p.cq_b;
}

#[test]
fn the_device_grants_inline_sizes_and_posts_beyond_them_are_refused() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    let cq = Cq::new(&nic, 16).unwrap();
    let mut granted = Vec::new();
    for ask in [0u32, 64, 256, 400, 1024] {
        let caps = QpCaps {
            max_inline: ask,
            ..QpCaps::default()
        };
        match Qp::new(&nic, QpType::Rc, &cq, &cq, caps) {
            Ok(qp) => {
                let got = qp.caps().max_inline;
                assert!(got >= ask, "asked {ask}, granted {got}");
                granted.push((ask, Some(got)));
            }
            Err(NicError::Verbs(VerbsError::Call { call, .. })) => {
                assert_eq!(call, "ibv_create_qp");
                granted.push((ask, None));
            }
            Err(e) => panic!("asked {ask}: {e}"),
        }
    }
    eprintln!("inline grants on {name}: {granted:?}");
    let probed = nic.caps().max_inline;
    assert!(
        granted
            .iter()
            .any(|&(ask, got)| got.is_some() && ask <= probed),
        "caps().max_inline {probed} is below every grant"
    );
    assert!(
        granted[0].1.is_some(),
        "a QP without inline data must be granted"
    );
    // Past the grant, the post is refused before it reaches the provider.
    let p = pair(&nic, QpType::Rc, QpCaps::default(), 16);
    let max = p.a.caps().max_inline as usize;
    let wr = SendWr::new(1, SendOp::Send, Payload::Inline(vec![0; max + 1]));
    assert!(matches!(
        p.a.post_send(wr),
        Err(PostError::InlineTooLong { .. })
    ));
    // At the grant it goes, and the bytes arrive.
    let inbox = region(&nic, vec![0; max.max(1)]);
    p.b.post_recv(RecvWr {
        wr_id: 1,
        sges: vec![inbox.local(0, max.max(1) as u32).unwrap()],
    })
    .unwrap();
    let bytes: Vec<u8> = (0..max).map(|i| i as u8).collect();
    p.a.post_send(SendWr::new(2, SendOp::Send, Payload::Inline(bytes.clone())))
        .unwrap();
    wait(&p.cq_a);
    assert_eq!(wait(&p.cq_b).byte_len as usize, max);
    let mut out = vec![0; max];
    inbox.read(0, &mut out).unwrap();
    assert_eq!(out, bytes);
}

#[test]
fn a_small_cq_grows_with_its_queues_and_never_overruns() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    // A CQ of 4 under a receive queue of 32: rxe would raise CQ_ERR and error the QP if the
    // CQ stayed at 4.
    let caps = QpCaps {
        sq_depth: 4,
        rq_depth: 32,
        max_inline: 0,
    };
    let p = pair(&nic, QpType::Rc, caps, 4);
    let src = region(&nic, vec![5; 64]);
    let inbox = region(&nic, vec![0; 64 * 32]);
    for i in 0..32u64 {
        p.b.post_recv(RecvWr {
            wr_id: i,
            sges: vec![inbox.local(i * 64, 64).unwrap()],
        })
        .unwrap();
    }
    for i in 0..32u64 {
        p.a.post_send(SendWr {
            signaled: false,
            ..SendWr::new(i, SendOp::Send, Payload::Sge(src.local(0, 64).unwrap()))
        })
        .unwrap();
        if i % 4 == 3 {
            // A signaled one now and then, so the send queue drains.
            p.a.post_send(SendWr::new(
                1000 + i,
                SendOp::Write(src.remote(0).unwrap()),
                Payload::Sge(src.local(0, 8).unwrap()),
            ))
            .unwrap();
            wait(&p.cq_a);
        }
    }
    // Nobody polled the receive CQ while 32 completions arrived.
    std::thread::sleep(Duration::from_millis(500));
    let mut got = 0;
    while let Some(c) = p.cq_b.poll() {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        got += 1;
    }
    assert_eq!(got, 32);
    assert_eq!(p.cq_b.failure(), None);
    assert_eq!(p.b.failure(), None);
}

#[test]
fn dma_buf_on_a_device_without_it_is_a_typed_refusal() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    let file = tempfile::tempfile().unwrap();
    file.set_len(1 << 16).unwrap();
    use std::os::fd::AsRawFd;
    let got = Region::register(
        &nic,
        RegionAccess::RemoteWrite,
        WriteOrder::AnyOrder,
        RegionMemory::Dmabuf {
            fd: file.as_raw_fd(),
            offset: 0,
            bytes: 1 << 16,
        },
    );
    if nic.caps().dmabuf {
        // A device that has it must not take a plain file for a dma-buf.
        assert!(got.is_err());
    } else {
        assert!(
            matches!(got, Err(RegionError::DmabufUnsupported { .. })),
            "{got:?}"
        );
    }
}

#[test]
fn children_forked_while_regions_are_registered_leave_them_intact() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    let p = pair(&nic, QpType::Rc, QpCaps::default(), 16);
    let src = region(&nic, vec![0xa5; 4096]);
    let dst = region(&nic, vec![0; 4096]);
    for _ in 0..4 {
        let status = std::process::Command::new("true").status().unwrap();
        assert!(status.success());
    }
    src.write(0, &[1, 2, 3, 4]).unwrap();
    p.a.post_send(SendWr::new(
        1,
        SendOp::Write(dst.remote(0).unwrap()),
        Payload::Sge(src.local(0, 4096).unwrap()),
    ))
    .unwrap();
    wait(&p.cq_a);
    let mut out = vec![0; 4096];
    dst.read(0, &mut out).unwrap();
    assert_eq!(out[..4], [1, 2, 3, 4]);
    assert!(out[4..].iter().all(|&b| b == 0xa5));
    let _ = &p.cq_b;
}

#[test]
fn teardown_in_any_order_returns_promptly() {
    let Some(name) = device() else { return };
    let start = Instant::now();
    for order in 0..4 {
        let nic = open(&name);
        let p = pair(&nic, QpType::Rc, QpCaps::default(), 64);
        let r = region(&nic, vec![0; 4096]);
        for i in 0..16 {
            p.b.post_recv(RecvWr {
                wr_id: i,
                sges: vec![r.local(0, 64).unwrap()],
            })
            .unwrap();
        }
        let Pair { cq_a, cq_b, a, b } = p;
        match order {
            0 => drop((nic, r, a, b, cq_a, cq_b)),
            1 => {
                drop(cq_b);
                drop(nic);
                drop(r);
                drop(b);
                drop(cq_a);
                drop(a);
            }
            2 => {
                b.shutdown();
                // Every outstanding receive is flushed.
                for _ in 0..16 {
                    let c = cq_b.wait(Duration::from_secs(5)).expect("a flush");
                    assert_eq!(c.status, WcStatus::WrFlushErr);
                }
                nic.close();
                drop((a, b, r, cq_a, cq_b, nic));
            }
            _ => {
                drop(r);
                drop(a);
                nic.close();
                drop((b, cq_b, cq_a, nic));
            }
        }
    }
    assert!(start.elapsed() < Duration::from_secs(30), "teardown hung");
}

#[test]
fn a_peer_that_cannot_be_resolved_is_named_at_rtr() {
    let Some(name) = device() else { return };
    let nic = open(&name);
    let cq = Cq::new(&nic, 8).unwrap();
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    // An address on the guest's subnet that no host holds: no ARP reply.
    let ghost = ferroce::QpEndpoint {
        qpn: qp.qpn(),
        psn: qp.endpoint().psn,
        addr: std::net::SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 77, 0, 99)), 4791),
    };
    let start = Instant::now();
    match qp.connect(&ghost, &ConnectOptions::default()) {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("RTR"), "{text}");
            assert!(text.contains("could not resolve 10.77.0.99"), "{text}");
        }
        // The kernel resolves the peer's MAC at RTR (rxe on 6.1 does: 7 s of ARP, five
        // retries included).
        Ok(()) => panic!("{name} moved to RTR towards an address no host holds"),
    }
    eprintln!("RTR towards a ghost took {:?}", start.elapsed());
}

#[test]
fn opening_says_what_is_wrong() {
    let Some(name) = device() else { return };
    let err = |r: Result<Nic, NicError>| match r {
        Err(NicError::Verbs(e)) => e,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened"),
    };
    let soft = NicConfig::default();
    match err(Nic::open_device(
        "nosuch9",
        &DeviceOptions::default(),
        &soft,
    )) {
        VerbsError::NoSuchDevice { found, .. } => {
            assert!(found.contains(&name), "{found:?}");
            assert_eq!(found[0], "ferroce0");
        }
        e => panic!("{e}"),
    }
    let port = DeviceOptions {
        port: 9,
        ..DeviceOptions::default()
    };
    assert!(matches!(
        err(Nic::open_device(&name, &port, &soft)),
        VerbsError::NoSuchPort { port: 9, .. }
    ));
    let wrong = DeviceOptions {
        local: Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 99))),
        ..DeviceOptions::default()
    };
    match err(Nic::open_device(&name, &wrong, &soft)) {
        e @ VerbsError::NoGid { .. } => {
            let text = e.to_string();
            assert!(text.contains("192.0.2.99"), "{text}");
            assert!(text.contains("RoCE v2"), "the table is printed: {text}");
        }
        e => panic!("{e}"),
    }
    // The GID chosen by default is the first IPv4 RoCE v2 one, and the NIC's address is it.
    let nic = open(&name);
    assert!(nic.addr().ip().is_ipv4(), "{}", nic.addr());
}

#[test]
fn the_cache_face_runs_on_the_device() {
    use ferroce::cache::{Context, ContextConfig, Device};
    use std::net::SocketAddr;
    let Some(name) = device() else { return };
    // Both contexts on the device's first IPv4 GID (the unspecified address), their
    // out-of-band hello on loopback.
    let oob = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 19600);
    let config = move |listen: bool| {
        ContextConfig::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), oob, listen)
            .with_max_message(65536)
            .on_device(&name)
    };
    let listening = config(true);
    let listener = std::thread::spawn(move || Context::connect(&listening));
    let dialler = Context::connect(&config(false)).unwrap();
    let listener = listener.join().unwrap().unwrap();
    let data: Vec<u8> = (0..50_000u32).map(|i| (i % 253) as u8).collect();
    let buffer = dialler.write_memory(data.len(), Device::Host).unwrap();
    buffer.write(0, &data).unwrap();
    dialler.flush(&buffer).unwrap();
    let got = listener.receive(Duration::from_secs(10)).unwrap();
    assert!(got.to_vec() == data);
}
