//! The request/reply session (Catalyst's `TransportSession`) over real UDP sockets on loopback: a
//! controller and a coprocessor in one process, each with its own soft NIC. Every test has its own
//! addresses (127.0.0.60 and up) and out-of-band TCP port (19501 and up), so they run in parallel.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ferroce::device::DeviceMemory;
use ferroce::session::state::Running;
use ferroce::session::{
    AnySession, ChannelDesc, ConnectInfo, Controller, Coprocessor, DeviceCall, MemoryKind, Role,
    Session, SessionError, Step,
};

mod support;
use support::{established_controller, established_coprocessor, FakeDevice};

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

/// The connect information of a side on 127.0.0.`host` whose coprocessor listens on
/// 127.0.0.`listen`:`port`.
fn info(host: u8, listen: u8, port: u16) -> ConnectInfo {
    ConnectInfo::new(ip(host), SocketAddr::new(ip(listen), port))
        .with_timeout(Duration::from_secs(10))
        .with_peer_timeout(Duration::from_secs(2))
}

type Function = Box<dyn FnMut(&[u8], &mut [u8]) -> Result<usize, String> + Send>;

fn echo() -> Function {
    Box::new(|request: &[u8], reply: &mut [u8]| {
        let n = request.len().min(reply.len());
        reply[..n].copy_from_slice(&request[..n]);
        Ok(n)
    })
}

/// A running controller on 127.0.0.`hosts.0` and coprocessor on 127.0.0.`hosts.1`.
fn pair(
    hosts: (u8, u8),
    port: u16,
    desc: ChannelDesc,
    function: Function,
) -> (Controller<Running>, Coprocessor<Running>) {
    let (c, p) = hosts;
    let size = desc.region_bytes() as usize;
    let coprocessor = thread::spawn(move || {
        established_coprocessor(&info(p, p, port), &desc, |s| {
            s.alloc_memory(size, MemoryKind::Host)
        })?
        .0
        .set_coprocessor_fn(function)?
        .start()
    });
    let (s, _) = established_controller(&info(c, p, port), &desc, |s| {
        s.alloc_memory(size, MemoryKind::Host)
    })
    .unwrap();
    (s.start().unwrap(), coprocessor.join().unwrap().unwrap())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn many_requests_in_flight() {
    let desc = ChannelDesc::new(16, 4096, 4100);
    // The reply is the request, reversed, with its length in front.
    let function: Function = Box::new(|request: &[u8], reply: &mut [u8]| {
        reply[..4].copy_from_slice(&(request.len() as u32).to_le_bytes());
        for (i, b) in request.iter().rev().enumerate() {
            reply[4 + i] = *b;
        }
        Ok(4 + request.len())
    });
    let (mut controller, mut coprocessor) = pair((60, 61), 19501, desc, function);
    let mut expected = std::collections::HashMap::new();
    let mut next = 0usize;
    let total = 500usize;
    let mut done = 0usize;
    let mut most = 0;
    let mut buf = vec![0u8; 4100];
    while done < total {
        // Fill every slot, then collect one.
        while next < total {
            let len = (next * 37) % 4097;
            let request = pattern(len, next as u8);
            match controller.submit(&request) {
                Ok(id) => {
                    expected.insert(id, request);
                    next += 1;
                }
                Err(SessionError::NoFreeSlot { slots: 16 }) => break,
                Err(e) => panic!("submit: {e}"),
            }
        }
        most = most.max(expected.len());
        let got = controller.collect(&mut [&mut buf[..]]).unwrap();
        let request = expected
            .remove(&got.request)
            .expect("a reply to a request in flight");
        assert_eq!(got.bytes, 4 + request.len());
        assert_eq!(buf[..4], (request.len() as u32).to_le_bytes());
        let reversed: Vec<u8> = request.iter().rev().copied().collect();
        assert!(
            buf[4..got.bytes] == reversed[..],
            "reply to {}",
            got.request
        );
        done += 1;
    }
    assert_eq!(most, 16, "every slot was in flight at once");
    assert!(matches!(
        controller.collect(&mut [&mut buf[..]]),
        Err(SessionError::NothingInFlight)
    ));
    assert!(controller.last_rtt_ns() > 0);
    assert_eq!(coprocessor.served(), total as u64);
    // The coprocessor's collect hands out what it served (the last 64 are kept).
    let served = coprocessor
        .collect_timeout(&mut [&mut buf[..]], Duration::from_secs(5))
        .unwrap();
    assert_eq!(served.request.0, (total - 64) as u64);
    controller.stop();
    controller.stop();
    coprocessor.stop();
}

#[test]
fn replies_scatter_and_too_large_replies_stay() {
    let desc = ChannelDesc::new(2, 1000, 1000);
    let (mut controller, _coprocessor) = pair((62, 63), 19502, desc, echo());
    let request = pattern(1000, 7);
    let id = controller.submit(&request).unwrap();
    let mut small = [0u8; 100];
    let err = controller.collect(&mut [&mut small[..]]).unwrap_err();
    assert!(
        matches!(err, SessionError::ReplyTooLarge { request: r, len: 1000, capacity: 100 } if r == id),
        "{err}"
    );
    assert!(err.to_string().contains("1000 bytes"), "{err}");
    // The reply stayed: three buffers that hold it together get it, in order.
    let (mut a, mut b, mut c) = (vec![0u8; 300], vec![0u8; 300], vec![0u8; 500]);
    let got = controller
        .collect(&mut [&mut a[..], &mut b[..], &mut c[..]])
        .unwrap();
    assert_eq!((got.request, got.bytes), (id, 1000));
    let joined: Vec<u8> = a.iter().chain(&b).chain(&c[..400]).copied().collect();
    assert!(joined == request);
    // A request larger than a slot is refused before it leaves.
    assert!(matches!(
        controller.submit(&[0; 1001]),
        Err(SessionError::RequestTooLarge {
            len: 1001,
            max: 1000
        })
    ));
    // An empty request and an empty reply.
    let id = controller.submit(&[]).unwrap();
    let got = controller.collect(&mut []).unwrap();
    assert_eq!((got.request, got.bytes), (id, 0));
}

#[test]
fn a_panicking_function_is_reported_and_the_engine_goes_on() {
    let desc = ChannelDesc::new(4, 64, 256);
    let function: Function = Box::new(|request: &[u8], reply: &mut [u8]| match request {
        b"panic" => panic!("asked to panic"),
        b"fail" => Err("asked to fail".into()),
        b"huge" => Ok(reply.len() + 1),
        _ => {
            reply[..request.len()].copy_from_slice(request);
            Ok(request.len())
        }
    });
    let (mut controller, mut coprocessor) = pair((64, 65), 19503, desc, function);
    let mut buf = [0u8; 256];
    for _ in 0..3 {
        let id = controller.submit(b"panic").unwrap();
        let started = Instant::now();
        match controller.collect(&mut [&mut buf[..]]) {
            Err(SessionError::CoprocessorPanicked { request, message }) => {
                assert_eq!(request, id);
                assert!(message.contains("asked to panic"), "{message}");
            }
            other => panic!("expected a panic report, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        // The engine still serves.
        let id = controller.submit(b"hello").unwrap();
        let got = controller.collect(&mut [&mut buf[..]]).unwrap();
        assert_eq!((got.request, &buf[..got.bytes]), (id, &b"hello"[..]));
    }
    controller.submit(b"fail").unwrap();
    let err = controller.collect(&mut [&mut buf[..]]).unwrap_err();
    assert!(
        matches!(&err, SessionError::CoprocessorFailed { message, .. } if message == "asked to fail"),
        "{err}"
    );
    controller.submit(b"huge").unwrap();
    let err = controller.collect(&mut [&mut buf[..]]).unwrap_err();
    assert!(err.to_string().contains("returned 257 bytes"), "{err}");
    // The coprocessor's own collect reports the panic too.
    let err = coprocessor
        .collect_timeout(&mut [&mut buf[..]], Duration::from_secs(5))
        .unwrap_err();
    assert!(
        matches!(err, SessionError::CoprocessorPanicked { .. }),
        "{err}"
    );
}

#[test]
fn a_peer_that_stops_or_disappears_is_reported() {
    let desc = ChannelDesc::new(4, 64, 64);
    // The coprocessor blocks in its function while the controller waits, then goes away.
    let (gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let gate = std::sync::Mutex::new(gate_rx);
    let function: Function = Box::new(move |_: &[u8], _: &mut [u8]| {
        let _ = gate.lock().unwrap().recv_timeout(Duration::from_secs(20));
        Ok(0)
    });
    let (mut controller, coprocessor) = pair((66, 67), 19504, desc, function);
    controller.submit(b"never answered").unwrap();
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(200));
        // Releases the function while the session stops: the engine finishes its request,
        // says bye and joins.
        let _ = gate_tx.send(());
        drop(gate_tx);
        drop(coprocessor);
    });
    let started = Instant::now();
    let mut buf = [0u8; 64];
    // The empty reply may leave before the engine stops, and a request or two more may be
    // served while the bye is on its way; then a submit or collect reports the peer gone.
    let err = loop {
        if let Err(e) = controller.collect(&mut [&mut buf[..]]) {
            break e;
        }
        if let Err(e) = controller.submit(b"again") {
            break e;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    };
    assert!(matches!(err, SessionError::PeerGone { .. }), "{err}");
    assert!(err.to_string().contains("the peer"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    stopper.join().unwrap();
    assert!(controller.peer_gone().is_some());
    assert!(matches!(
        controller.submit(b"x"),
        Err(SessionError::PeerGone { .. })
    ));
}

#[test]
fn a_coprocessor_is_told_when_its_controller_goes() {
    let desc = ChannelDesc::new(1, 8, 8);
    let (controller, mut coprocessor) = pair((68, 69), 19505, desc, echo());
    drop(controller);
    let err = coprocessor
        .collect_timeout(&mut [], Duration::from_secs(5))
        .unwrap_err();
    assert!(
        matches!(&err, SessionError::PeerGone { reason } if reason.contains("stopped")),
        "{err}"
    );
}

#[test]
fn no_coprocessor_is_a_timeout() {
    let info = info(70, 71, 19506).with_timeout(Duration::from_millis(300));
    let started = Instant::now();
    let err = Controller::new().connect(&info).unwrap_err();
    assert!(matches!(err, SessionError::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn calls_out_of_order_name_the_missing_step() {
    let mut s: Box<dyn Session> = Box::new(AnySession::controller());
    assert_eq!(s.role(), Role::Controller);
    let err = s.alloc_memory(64, MemoryKind::Host).unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::OutOfOrder {
                call: Step::AllocMemory,
                missing: Step::Connect
            }
        ),
        "{err}"
    );
    assert_eq!(err.to_string(), "alloc_memory needs connect first");
    let err = s.start().unwrap_err();
    assert_eq!(err.to_string(), "start needs connect first");
    let err = s.submit(b"x").unwrap_err();
    assert_eq!(err.to_string(), "submit needs connect first");
    let err = s.collect(&mut []).unwrap_err();
    assert_eq!(err.to_string(), "collect needs connect first");
    let err = s.set_coprocessor_fn(echo()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "set_coprocessor_fn is not a controller's call"
    );
    s.stop();
    s.stop();
    assert!(matches!(
        s.start(),
        Err(SessionError::Stopped { call: Step::Start })
    ));

    // Two dynamic sessions, walked step by step with mistakes on the way.
    let desc = ChannelDesc::new(2, 32, 32);
    let coprocessor = thread::spawn(move || -> Result<(), SessionError> {
        let mut s: Box<dyn Session> = Box::new(AnySession::coprocessor());
        s.connect(&info(73, 73, 19507))?;
        let mem = s.alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)?;
        let peer = s.exchange_keys(&mem)?;
        let err = s.start().unwrap_err();
        assert_eq!(err.to_string(), "start needs establish_channel first");
        let err = s.set_coprocessor_fn(echo()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "set_coprocessor_fn needs establish_channel first"
        );
        s.establish_channel(&desc, &mem, &peer)?;
        let err = s.start().unwrap_err();
        assert_eq!(err.to_string(), "start needs set_coprocessor_fn first");
        let err = s.submit(b"x").unwrap_err();
        assert_eq!(err.to_string(), "submit is not a coprocessor's call");
        s.set_coprocessor_fn(echo())?;
        s.start()?;
        let err = s.set_coprocessor_fn(echo()).unwrap_err();
        assert_eq!(err.to_string(), "set_coprocessor_fn must come before start");
        let mut buf = [0u8; 32];
        s.collect(&mut [&mut buf[..]])?;
        assert_eq!(&buf[..2], b"hi");
        // Stays until the controller stops.
        let err = s.collect(&mut [&mut buf[..]]).unwrap_err();
        assert!(matches!(err, SessionError::PeerGone { .. }), "{err}");
        s.stop();
        Ok(())
    });
    let mut s = AnySession::controller();
    s.connect(&info(72, 73, 19507)).unwrap();
    assert!(matches!(
        s.connect(&info(72, 73, 19507)),
        Err(SessionError::AlreadyDone {
            call: Step::Connect
        })
    ));
    let cuda = s
        .alloc_memory(64, MemoryKind::Cuda { device: 0 })
        .unwrap_err();
    assert!(matches!(cuda, SessionError::Unsupported(_)), "{cuda}");
    assert!(cuda.to_string().contains("cuda"), "{cuda}");
    let mem = s
        .alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)
        .unwrap();
    let fake_peer = ferroce::session::PeerRef {
        va: 0,
        rkey: 0,
        len: 0,
    };
    let err = s.establish_channel(&desc, &mem, &fake_peer).unwrap_err();
    assert_eq!(
        err.to_string(),
        "establish_channel needs exchange_keys first"
    );
    let peer = s.exchange_keys(&mem).unwrap();
    let err = s.submit(b"x").unwrap_err();
    assert_eq!(err.to_string(), "submit needs establish_channel first");
    s.establish_channel(&desc, &mem, &peer).unwrap();
    let err = s.submit(b"x").unwrap_err();
    assert_eq!(err.to_string(), "submit needs start first");
    s.start().unwrap();
    assert!(matches!(
        s.start(),
        Err(SessionError::AlreadyDone { call: Step::Start })
    ));
    s.submit(b"hi").unwrap();
    let mut buf = [0u8; 32];
    assert_eq!(
        s.collect_timeout(&mut [&mut buf[..]], Duration::from_secs(5))
            .unwrap()
            .bytes,
        2
    );
    s.stop();
    coprocessor.join().unwrap().unwrap();
}

#[test]
fn bad_channels_and_foreign_regions_are_refused() {
    let desc = ChannelDesc::new(2, 64, 64);
    let coprocessor = thread::spawn(move || -> Result<(), SessionError> {
        let s = Coprocessor::new().connect(&info(75, 75, 19508))?;
        let (s, mem) = s.alloc_memory(4096, MemoryKind::Host)?;
        let (s, peer) = s.exchange_keys(&mem)?;
        // Another description than the controller's.
        let other = ChannelDesc::new(3, 64, 64);
        match s.establish_channel(&other, &mem, &peer) {
            Err(SessionError::ChannelMismatch { .. }) => Ok(()),
            other => panic!("expected a mismatch, got {other:?}"),
        }
    });
    let mut s = AnySession::controller();
    s.connect(&info(74, 75, 19508)).unwrap();
    let mem = s.alloc_memory(4096, MemoryKind::Host).unwrap();
    assert!(matches!(
        s.alloc_memory(0, MemoryKind::Host),
        Err(SessionError::InvalidArgument(_))
    ));
    // A region of another session.
    let mut other = AnySession::controller();
    let foreign = {
        let mut helper = AnySession::coprocessor();
        let listen = thread::spawn(move || {
            helper.connect(&info(77, 77, 19509)).unwrap();
            let region = helper.alloc_memory(64, MemoryKind::Host).unwrap();
            (helper, region)
        });
        other.connect(&info(76, 77, 19509)).unwrap();
        listen.join().unwrap()
    };
    assert!(matches!(
        s.exchange_keys(&foreign.1),
        Err(SessionError::ForeignRegion)
    ));
    let peer = s.exchange_keys(&mem).unwrap();
    for bad in [
        ChannelDesc::new(0, 64, 64),
        ChannelDesc::new(2, 0, 64),
        ChannelDesc::new(2, 64, u32::MAX),
    ] {
        assert!(matches!(
            s.establish_channel(&bad, &mem, &peer),
            Err(SessionError::InvalidArgument(_))
        ));
    }
    let big = ChannelDesc::new(64, 64, 64);
    let err = s.establish_channel(&big, &mem, &peer).unwrap_err();
    assert!(matches!(err, SessionError::RegionTooSmall { .. }), "{err}");
    let err = s.establish_channel(&desc, &mem, &peer).unwrap_err();
    assert!(matches!(err, SessionError::ChannelMismatch { .. }), "{err}");
    coprocessor.join().unwrap().unwrap();
}

/// A coprocessor that speaks the handshake and then goes silent, holding its connection open
/// (its host froze or its network went away), with a queue pair endpoint nobody answers on.
fn silent_coprocessor(
    listen: SocketAddr,
    desc: ChannelDesc,
) -> thread::JoinHandle<std::net::TcpStream> {
    use ferroce::exchange::{PeerInfo, RemoteRegion};
    use ferroce::proto::wire::Qpn;
    use ferroce::proto::Psn;
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind(listen).unwrap();
    thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(
            line.starts_with("ferroce-session/1 role=controller"),
            "{line}"
        );
        stream
            .write_all(b"ferroce-session/1 role=coprocessor mtu=1024\n")
            .unwrap();
        let mut info = PeerInfo {
            endpoint: ferroce::QpEndpoint {
                qpn: Qpn::new(0x99).unwrap(),
                psn: Psn::new(1).unwrap(),
                addr: SocketAddr::new(ip(79), 4791),
            },
            regions: Vec::new(),
        };
        // PeerInfo::exchange reads byte by byte, so nothing is lost in the reader's buffer
        // as long as the reader has not read ahead: the controller waits for our answers.
        info.exchange(&mut stream).unwrap();
        info.regions.push(RemoteRegion {
            va: 0x1000,
            rkey: 0x1234,
            len: desc.region_bytes(),
        });
        info.exchange(&mut stream).unwrap();
        line.clear();
        reader.read_line(&mut line).unwrap();
        assert!(line.starts_with("channel "), "{line}");
        stream.write_all(line.as_bytes()).unwrap();
        stream
    })
}

#[test]
fn a_silent_peer_is_lost_after_the_peer_timeout() {
    let desc = ChannelDesc::new(2, 16, 16);
    let listen = SocketAddr::new(ip(71), 19510);
    let fake = silent_coprocessor(listen, desc);
    let info = info(70, 71, 19510)
        .with_nic_port(19510)
        .with_peer_timeout(Duration::from_millis(400));
    let (s, _) = established_controller(&info, &desc, |s| {
        s.alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)
    })
    .unwrap();
    let controller = s.start().unwrap();
    let _stream = fake.join().unwrap();
    let started = Instant::now();
    while controller.peer_gone().is_none() {
        assert!(started.elapsed() < Duration::from_secs(3), "still not lost");
        thread::sleep(Duration::from_millis(20));
    }
    let reason = controller.peer_gone().unwrap();
    assert!(reason.contains("silent"), "{reason}");
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[test]
fn a_request_nobody_acknowledges_is_a_transport_error() {
    let desc = ChannelDesc::new(2, 16, 16);
    let listen = SocketAddr::new(ip(75), 19511);
    let fake = silent_coprocessor(listen, desc);
    let mut info = info(74, 75, 19511)
        .with_nic_port(19511)
        .with_peer_timeout(Duration::from_secs(30));
    // 4.096 µs × 2^10 ≈ 4 ms per try, 3 retries.
    info.ack_timeout = 10;
    info.retry_cnt = 3;
    let (s, _) = established_controller(&info, &desc, |s| {
        s.alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)
    })
    .unwrap();
    let mut controller = s.start().unwrap();
    let _stream = fake.join().unwrap();
    let id = controller.submit(b"anyone?").unwrap();
    let started = Instant::now();
    let err = controller.collect(&mut []).unwrap_err();
    assert!(
        matches!(err, SessionError::Transport { request: Some(r), status: ferroce::cq::WcStatus::RetryExcErr } if r == id),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn device_memory_is_kept_in_step_and_a_failed_copy_is_reported() {
    let desc = ChannelDesc::new(4, 256, 256);
    let size = desc.region_bytes() as usize;
    // The coprocessor's device fails on its 7th copy: 3 requests and their replies go.
    let coprocessor_device = FakeDevice::new(size, 7);
    let controller_device = FakeDevice::new(size, usize::MAX);
    let coprocessor = {
        let device = Arc::clone(&coprocessor_device);
        thread::spawn(move || {
            let (s, mem) = established_coprocessor(&info(81, 81, 19512), &desc, |s| {
                s.alloc_device_memory(device)
            })?;
            assert_eq!(mem.kind(), MemoryKind::Device);
            assert_eq!(mem.len(), desc.region_bytes());
            s.set_coprocessor_fn(echo())?.start()
        })
    };
    let (s, mem) = established_controller(&info(80, 81, 19512), &desc, |s| {
        s.alloc_device_memory(Arc::clone(&controller_device) as Arc<dyn DeviceMemory>)
    })
    .unwrap();
    assert_eq!(
        mem.device_memory().map(|d| d.describe()),
        Some("fake device 7".into())
    );
    let mut controller = s.start().unwrap();
    let mut coprocessor = coprocessor.join().unwrap().unwrap();

    // The controller's region: replies in its slots, then the requests it stages.
    // The coprocessor's: requests in its slots, then the replies it stages.
    let mut reply = [0u8; 256];
    for n in 0..3u8 {
        let request = pattern(100 + usize::from(n), n);
        controller.submit(&request).unwrap();
        let got = controller.collect(&mut [&mut reply[..]]).unwrap();
        assert_eq!(reply[..got.bytes], request[..]);
        // Only slot 0 is ever in flight, one request at a time.
        let len = request.len();
        assert_eq!(
            controller_device.bytes_at(4 * 256, len),
            request,
            "staged request"
        );
        assert_eq!(
            controller_device.bytes_at(0, len),
            request,
            "reply in its slot"
        );
        assert_eq!(
            coprocessor_device.bytes_at(0, len),
            request,
            "request in its slot"
        );
        assert_eq!(
            coprocessor_device.bytes_at(4 * 256, len),
            request,
            "staged reply"
        );
    }
    controller
        .submit(b"the copy of this request fails")
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let err = loop {
        let mut seen = [0u8; 256];
        match coprocessor.collect_timeout(&mut [&mut seen[..]], Duration::from_millis(100)) {
            Err(SessionError::Timeout { .. }) | Ok(_) => {}
            Err(e) => break e,
        }
        assert!(
            Instant::now() < deadline,
            "the failed copy was never reported"
        );
    };
    assert!(
        matches!(&err, SessionError::Engine(why)
            if why.contains("request in slot 0") && why.contains("fake device 7")),
        "{err}"
    );
    controller.stop();
    coprocessor.stop();
}

#[test]
fn device_memory_the_session_cannot_have_is_refused_by_name() {
    let coprocessor = thread::spawn(|| {
        let s = Coprocessor::new().connect(&info(83, 83, 19513)).unwrap();
        thread::sleep(Duration::from_millis(500));
        drop(s);
    });
    let s = Controller::new().connect(&info(82, 83, 19513)).unwrap();
    let err = s.alloc_memory(64, MemoryKind::Device).unwrap_err();
    assert!(
        matches!(&err, SessionError::InvalidArgument(why) if why.contains("alloc_device_memory")),
        "{err}"
    );
    coprocessor.join().unwrap();
}

#[test]
fn a_device_function_works_in_the_device_memory() {
    let desc = ChannelDesc::new(2, 128, 128);
    let size = desc.region_bytes() as usize;
    let device = FakeDevice::new(size, usize::MAX);
    let coprocessor = {
        let device = Arc::clone(&device);
        thread::spawn(move || {
            established_coprocessor(&info(85, 85, 19514), &desc, |s| {
                s.alloc_device_memory(device)
            })?
            .0
            .set_device_coprocessor_fn(|call: DeviceCall<'_>| {
                assert_eq!(
                    call.request_address(),
                    call.memory.address() + call.request_offset
                );
                let mut request = vec![0; call.request_len];
                call.memory
                    .read(call.request_offset, &mut request)
                    .map_err(|e| e.to_string())?;
                if request == b"too long" {
                    return Ok(call.reply_capacity + 1);
                }
                request.reverse();
                call.memory
                    .write(call.reply_offset, &request)
                    .map_err(|e| e.to_string())?;
                Ok(request.len())
            })?
            .start()
        })
    };
    let (s, _) = established_controller(&info(84, 85, 19514), &desc, |s| {
        s.alloc_memory(size, MemoryKind::Host)
    })
    .unwrap();
    let mut controller = s.start().unwrap();
    let coprocessor = coprocessor.join().unwrap().unwrap();
    let mut reply = [0u8; 128];
    for n in 0..5u8 {
        let request = pattern(40 + usize::from(n), n);
        controller.submit(&request).unwrap();
        let got = controller.collect(&mut [&mut reply[..]]).unwrap();
        let reversed: Vec<u8> = request.iter().rev().copied().collect();
        assert_eq!(reply[..got.bytes], reversed[..], "request {n}");
    }
    controller.submit(b"too long").unwrap();
    let err = controller.collect(&mut [&mut reply[..]]).unwrap_err();
    assert!(
        matches!(&err, SessionError::CoprocessorFailed { .. }) && err.to_string().contains("129"),
        "{err}"
    );
    drop((controller, coprocessor));

    // Without device memory there is nothing for a device function to work in.
    let coprocessor = thread::spawn(move || {
        let s = Coprocessor::new().connect(&info(87, 87, 19515)).unwrap();
        let (s, mem) = s.alloc_memory(size, MemoryKind::Host).unwrap();
        let (s, peer) = s.exchange_keys(&mem).unwrap();
        let err = s
            .establish_channel(&desc, &mem, &peer)
            .unwrap()
            .set_device_coprocessor_fn(|_: DeviceCall<'_>| Ok(0))
            .unwrap_err();
        assert!(
            matches!(&err, SessionError::InvalidArgument(why) if why.contains("device memory")),
            "{err}"
        );
    });
    let s = Controller::new().connect(&info(86, 87, 19515)).unwrap();
    let (s, mem) = s.alloc_memory(size, MemoryKind::Host).unwrap();
    let (s, peer) = s.exchange_keys(&mem).unwrap();
    let _established = s.establish_channel(&desc, &mem, &peer).unwrap();
    coprocessor.join().unwrap();
}
