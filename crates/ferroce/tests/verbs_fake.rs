//! The verbs backend against a stand-in libibverbs (`tests/fake-ibverbs/fake.c`, built here
//! with the system C compiler), on any host: the loader's versioned lookups, the ops-table
//! dispatch of the four hot-path calls, the layouts of what crosses (a wrong offset makes the
//! fake refuse the post or complete it wrongly), `bad_wr`, and the open errors that need a
//! device list. The real library on a real device is tests/verbs_device.rs, in the guests.

mod poll;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use ferroce::cq::{WcOpcode, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, PostError, QpCaps, QpType, RecvWr, RemoteAddr, SendOp, SendWr};
use ferroce::verbs::{DeviceOptions, VerbsError};
use ferroce::{
    ConnectOptions, Cq, Nic, NicConfig, NicError, Qp, Region, RegionAccess, RegionError,
    RegionMemory,
};

/// The high bits of the request ids the fake acts on (`fake.c`).
const MAGIC: u64 = 0xfa4e_0000_0000_0000;

#[path = "fake-ibverbs/build.rs"]
mod fake_build;

/// Builds the fake once and points the loader at it (before anything in this process loads
/// libibverbs).
fn fake() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let lib = fake_build::build_fake_ibverbs(
            &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-ibverbs"),
        );
        std::env::set_var("FERROCE_IBVERBS", &lib);
        lib
    })
}

/// The fake's state (its GID table, its event queue) is the process's: one test at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn open() -> Nic {
    fake();
    Nic::open_device("fake0", &DeviceOptions::default(), &NicConfig::default())
        .unwrap_or_else(|e| panic!("open fake0: {e}"))
}

#[test]
fn the_fake_device_opens_with_its_ipv4_roce_v2_gid() {
    let nic = open();
    assert_eq!(nic.device_name(), "fake0");
    assert_eq!(nic.gid_index(), 1);
    assert_eq!(nic.addr().ip().to_string(), "127.0.0.7");
    assert_eq!(nic.active_mtu(), ferroce::proto::qp::Mtu::M1024);
    let caps = nic.caps();
    assert!(!caps.dmabuf, "the fake has no ibv_reg_dmabuf_mr");
    assert!(!caps.pageable_memory && !caps.fault_injection && !caps.pcap);
    assert_eq!((caps.max_qp_wr, caps.max_cqe), (1024, 8192));
    assert_eq!(
        caps.max_inline, 512,
        "the fake takes up to 512 inline bytes"
    );
    assert_eq!(nic.failure(), None);
}

#[test]
fn a_name_that_is_not_there_lists_the_devices_that_are() {
    let _serial = serial();
    fake();
    let e =
        Nic::open_device("mlx5_7", &DeviceOptions::default(), &NicConfig::default()).unwrap_err();
    match &e {
        NicError::Verbs(VerbsError::NoSuchDevice { found, .. }) => {
            assert_eq!(found, &["ferroce0".to_owned(), "fake0".to_owned()]);
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("ferroce0, fake0"), "{e}");
}

#[test]
fn the_hot_path_goes_through_the_ops_table_with_rdma_cores_layouts() {
    let _serial = serial();
    let nic = open();
    let cq = Cq::new(&nic, 8).unwrap();
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    assert_eq!(qp.qpn().value() & 0xff00, 0, "a QPN from the fake");
    let peer = ferroce::QpEndpoint {
        qpn: qp.qpn(),
        psn: qp.endpoint().psn,
        addr: nic.addr(),
    };
    qp.connect(&peer, &ConnectOptions::default()).unwrap();
    let region = Region::register(
        &nic,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 4096]),
    )
    .unwrap();
    assert_ne!(region.rkey(), 0);
    let remote = RemoteAddr {
        va: 0x10000,
        rkey: 0x1234,
    };
    // Two gather entries: the fake sums their lengths into byte_len.
    let sges = vec![
        region.local(0, 100).unwrap(),
        region.local(200, 28).unwrap(),
    ];
    qp.post_send(SendWr::new(
        7,
        SendOp::WriteWithImm(remote, 0x1122_3344),
        Payload::Sges(sges),
    ))
    .unwrap();
    let c = cq.poll().expect("the fake's completion");
    assert_eq!(
        (c.wr_id, c.status, c.opcode, c.byte_len, c.imm),
        (
            7,
            WcStatus::Success,
            WcOpcode::RdmaWrite,
            128,
            Some(0x1122_3344)
        )
    );
    assert_eq!(c.qpn, qp.qpn());
    // The rdma union in the wrong place would carry another address or key: refused.
    let wrong = SendWr::new(
        8,
        SendOp::Write(RemoteAddr {
            va: 0x10000,
            rkey: 0x9999,
        }),
        Payload::Sge(region.local(0, 8).unwrap()),
    );
    assert!(matches!(qp.post_send(wrong), Err(PostError::Device(_))));
    // A receive: the fake completes it as a WRITE with immediate 0x0a0b0c0d arriving.
    qp.post_recv(RecvWr {
        wr_id: 0x1005,
        sges: Vec::new(),
    })
    .unwrap();
    let c = cq.wait(Duration::from_secs(1)).expect("a completion");
    assert_eq!(
        (c.wr_id, c.opcode, c.imm),
        (0x1005, WcOpcode::RecvRdmaWithImm, Some(0x0a0b_0c0d))
    );
    assert!(cq.poll().is_none());
}

#[test]
fn a_refused_request_in_a_list_is_named_by_its_index() {
    let _serial = serial();
    let nic = open();
    let cq = Cq::new(&nic, 8).unwrap();
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, QpCaps::default()).unwrap();
    let region = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 64]),
    )
    .unwrap();
    assert_eq!(region.rkey(), 0, "a Local region gives peers no key");
    let send = |id| SendWr::new(id, SendOp::Send, Payload::Sge(region.local(0, 8).unwrap()));
    // The fake refuses wr_id MAGIC | 0xbad with ENOMEM and points bad_wr at it.
    let got = qp.post_send_list([send(1), send(MAGIC | 0xbad), send(3)]);
    assert!(matches!(got, Err((1, PostError::QueueFull(_)))), "{got:?}");
    assert_eq!(
        cq.poll().map(|c| c.wr_id),
        Some(1),
        "the one before it went"
    );
    assert!(cq.poll().is_none(), "and none after it");
}

#[test]
fn refusals_before_the_provider_are_typed() {
    let _serial = serial();
    let nic = open();
    let cq = Cq::new(&nic, 8).unwrap();
    // The fake grants at least 256 inline bytes and refuses a QP asking for more than 512.
    let big = QpCaps {
        max_inline: 1024,
        ..QpCaps::default()
    };
    match Qp::new(&nic, QpType::Rc, &cq, &cq, big) {
        Err(NicError::Verbs(VerbsError::Call { call, hint, .. })) => {
            assert_eq!(call, "ibv_create_qp");
            assert!(hint.is_some_and(|h| h.contains("max_inline")));
        }
        other => panic!("{other:?}"),
    }
    let uc = Qp::new(&nic, QpType::Uc, &cq, &cq, QpCaps::default()).unwrap();
    assert_eq!(uc.caps().max_inline, 400, "the default asks for 400");
    let read = SendWr::new(
        1,
        SendOp::Read(RemoteAddr {
            va: 0x10000,
            rkey: 0x1234,
        }),
        Payload::Inline(vec![0; 8]),
    );
    assert!(matches!(uc.post_send(read), Err(PostError::Unsupported(_))));
    let long = SendWr::new(2, SendOp::Send, Payload::Inline(vec![0; 401]));
    assert!(matches!(
        uc.post_send(long),
        Err(PostError::InlineTooLong { len: 401, max: 400 })
    ));
    // A CQ of another NIC is refused before any call.
    let soft = Nic::open(&NicConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        ..NicConfig::default()
    })
    .unwrap();
    let soft_cq = Cq::new(&soft, 8).unwrap();
    assert!(matches!(
        Qp::new(&nic, QpType::Rc, &soft_cq, &cq, QpCaps::default()),
        Err(NicError::OtherNic(_))
    ));
    // dma-buf on a library without ibv_reg_dmabuf_mr.
    let got = Region::register(
        &nic,
        RegionAccess::RemoteWrite,
        WriteOrder::AnyOrder,
        RegionMemory::Dmabuf {
            fd: 0,
            offset: 0,
            bytes: 4096,
        },
    );
    assert!(
        matches!(got, Err(RegionError::DmabufUnsupported { ref device }) if device == "fake0"),
        "{got:?}"
    );
}

#[test]
fn a_cq_grows_when_its_queues_could_overrun_it_and_polls_in_batches() {
    let _serial = serial();
    let nic = open();
    let cq = Cq::new(&nic, 4).unwrap();
    let caps = QpCaps {
        sq_depth: 64,
        rq_depth: 64,
        max_inline: 0,
    };
    assert_eq!(cq.depth(), 4);
    let a = Qp::new(&nic, QpType::Rc, &cq, &cq, caps).unwrap();
    assert_eq!(
        cq.depth(),
        128,
        "grown for one QP's 64 sends and 64 receives"
    );
    let qp = Qp::new(&nic, QpType::Rc, &cq, &cq, caps).unwrap();
    assert_eq!(cq.depth(), 256, "and for the second's");
    drop(a);
    // The room is kept (no shrink), but a third QP fits in what the first gave back.
    let _c = Qp::new(&nic, QpType::Rc, &cq, &cq, caps).unwrap();
    assert_eq!(cq.depth(), 256);
    for i in 0..64 {
        qp.post_recv(RecvWr {
            wr_id: i,
            sges: Vec::new(),
        })
        .unwrap();
    }
    let mut out = vec![
        ferroce::cq::Completion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qpn: qp.qpn(),
            ud: None,
        };
        100
    ];
    let n = cq.poll_into(&mut out);
    assert_eq!(n, 32, "one poll_cq takes at most 32 here");
    assert_eq!(out[31].wr_id, 31);
    assert_eq!(cq.poll_into(&mut out), 32);
    assert_eq!(cq.poll_into(&mut out), 0);
}

/// Waits up to 2 s for `f` to say yes (the event thread runs on its own).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 2 s"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn async_events_reach_the_qp_the_cq_and_the_nic() {
    let _serial = serial();
    let nic = open();
    let cq = Cq::new(&nic, 8).unwrap();
    let other = Cq::new(&nic, 8).unwrap();
    let qp = Qp::new(&nic, QpType::Rc, &cq, &other, QpCaps::default()).unwrap();
    let bystander = Qp::new(&nic, QpType::Rc, &other, &other, QpCaps::default()).unwrap();
    let raise = |qp: &Qp, id| {
        qp.post_send(SendWr::new(id, SendOp::Send, Payload::Inline(Vec::new())))
            .unwrap();
    };
    // QP_FATAL names one QP: it reads as failed and in ERR; the other QP and the NIC do not.
    raise(&qp, MAGIC | 0xdead);
    eventually("QP_FATAL", || qp.failure().is_some());
    // The NIC's async descriptor says an event was handled, until poll_event clears it.
    assert!(
        poll::readable(nic.async_fd(), Duration::ZERO),
        "the async descriptor is readable"
    );
    assert_eq!(
        nic.poll_event(),
        None,
        "a verbs device's events are handled by ferroce"
    );
    assert!(
        !poll::readable(nic.async_fd(), Duration::ZERO),
        "and no longer once taken"
    );
    assert!(qp.failure().unwrap().contains("QP fatal"));
    assert_eq!(qp.state(), Some(ferroce::qp::QpState::Err));
    assert_eq!(bystander.failure(), None);
    assert_eq!(nic.failure(), None);
    // CQ_ERR on the QP's send CQ: the CQ says so, and the QPs on it.
    raise(&bystander, MAGIC | 0xc0e0);
    eventually("CQ_ERR", || other.failure().is_some());
    assert!(other.failure().unwrap().contains("overrun"));
    assert!(bystander.failure().is_some());
    assert_eq!(cq.failure(), None);
    // Our GID out of the table: the address is gone until it is back.
    assert!(!nic.address_gone());
    raise(&bystander, MAGIC | 0x91d0);
    eventually("GID_CHANGE, ours gone", || nic.address_gone());
    assert_eq!(
        nic.failure(),
        None,
        "an address can come back: not a failure"
    );
    raise(&bystander, MAGIC | 0x91d1);
    eventually("GID_CHANGE, ours back", || !nic.address_gone());
    assert_eq!(nic.gid_index(), 1);
    // DEVICE_FATAL: the NIC failed for good.
    raise(&bystander, MAGIC | 0xfa7a1);
    eventually("DEVICE_FATAL", || nic.failure().is_some());
    assert!(nic.failure().unwrap().contains("device fatal"));
}

/// Mapped memory goes to `ibv_reg_mr` at its own address, is read, written and inspected
/// through the region and the handle alike, and comes back whole from `deregister`.
#[test]
fn mapped_memory_is_registered_in_place_and_given_back() {
    let _serial = serial();
    let nic = open();
    let memory = ferroce::MappedMemory::new(8192).unwrap();
    let region = Region::register(
        &nic,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Mapped(memory.clone()),
    )
    .unwrap();
    assert_eq!(region.va(), memory.addr(), "registered where it is mapped");
    assert_eq!(region.len(), 8192);
    region.write(100, b"through the region").unwrap();
    let mut seen = [0; 18];
    memory.read(100, &mut seen).unwrap();
    assert_eq!(&seen, b"through the region");
    // Inspected through a buffer of one piece: the device may write the memory any time.
    let mut shown = Vec::new();
    region
        .inspect(100, 18, |piece| shown.extend_from_slice(piece))
        .unwrap();
    assert_eq!(shown, b"through the region");
    match region.deregister().unwrap() {
        RegionMemory::Mapped(back) => assert_eq!(back.addr(), memory.addr()),
        other => panic!("{other:?}"),
    }
}

/// A region at an IOVA of the caller's is registered with `ibv_reg_mr_iova2`, and named by
/// that IOVA in both kinds of entry; the same bytes come back on deregistration.
#[test]
fn a_region_at_an_iova_goes_through_reg_mr_iova2() {
    let _serial = serial();
    let nic = open();
    let region = Region::register_at(
        &nic,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![7; 4096]),
        0,
    )
    .unwrap();
    assert_eq!(region.va(), 0);
    assert_eq!(region.local(8, 8).unwrap().addr, 8);
    assert_eq!(region.remote(16).unwrap().va, 16);
    let lkey = region.local(0, 1).unwrap().lkey;
    assert_eq!(
        nic.region_of_lkey(lkey).map(|r| (r.va, r.len)),
        Some((0, 4096))
    );
    let Ok(RegionMemory::Host(bytes)) = region.deregister() else {
        panic!("host bytes back");
    };
    assert_eq!(bytes, vec![7; 4096]);
    assert!(
        nic.region_of_lkey(lkey).is_none(),
        "gone with its registration"
    );
}
