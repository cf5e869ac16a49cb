//! The frame receiver and the device side over real sockets on loopback: every contract of
//! Hololink's `RoceReceiverInterfaceV2`, drops when the application is slow, loss reported per
//! frame, two streams on one port, a failed receive path and its restart, and hostile packets
//! counted without a byte landing outside its page.
//!
//! Frames delivered into device memory use a stand-in device whose copies can fail.
//!
//! Each test owns its addresses (127.0.0.100 to 127.0.0.119), so they run in parallel.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use ferroce::frames::{
    FrameInfo, FrameReadError, ImmediateLayout, MonitorError, NotStarted, Pattern, Receiver,
    ReceiverConfig, Sender, StartError, Target, METADATA_SIZE,
};
use ferroce::proto::wire::{icrc, Bth, IpHeader, Opcode, PacketRepr, Qpn, Reth, UdpHeader};
use ferroce::proto::Psn;
use ferroce::{Faults, Nic, NicConfig, RegionMemory};

mod support;
use support::{target, FakeDevice};

const WAIT: Duration = Duration::from_secs(5);

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

fn nic(host: u8) -> Nic {
    Nic::open(&NicConfig::on(ip(host))).expect("open NIC")
}

/// Starts a receiver and its monitor thread.
fn receiver(nic: &Nic, config: ReceiverConfig) -> (Receiver, JoinHandle<Result<(), MonitorError>>) {
    let rx = Receiver::new();
    rx.start(nic, config).expect("start");
    let monitor = {
        let rx = rx.clone();
        std::thread::spawn(move || rx.blocking_monitor())
    };
    (rx, monitor)
}

fn sender(host: u8, target: Target) -> Sender {
    Sender::new(SocketAddr::new(ip(host), 0), target).expect("sender")
}

fn frame_bytes(frame_number: u32, len: usize) -> Vec<u8> {
    let mut data = vec![0; len];
    Pattern::Counter.fill(frame_number, &mut data);
    data
}

fn read(rx: &Receiver, frame: &FrameInfo) -> Vec<u8> {
    let mut out = vec![0; frame.metadata.bytes_written as usize];
    rx.read_frame(frame, &mut out).unwrap();
    out
}

/// The frame as `inspect_frame` shows it, and in how many pieces.
fn inspected(rx: &Receiver, frame: &FrameInfo) -> Result<(Vec<u8>, usize), FrameReadError> {
    let (mut seen, mut pieces) = (Vec::new(), 0);
    rx.inspect_frame(frame, frame.metadata.bytes_written as usize, |piece| {
        assert!(piece.len() <= 64 * 1024, "a piece of {} bytes", piece.len());
        seen.extend_from_slice(piece);
        pieces += 1;
    })?;
    Ok((seen, pieces))
}

fn stop(rx: &Receiver, monitor: JoinHandle<Result<(), MonitorError>>) {
    rx.close();
    assert_eq!(monitor.join().unwrap(), Ok(()));
}

#[test]
fn frames_arrive_whole_in_rotating_pages() {
    let nic = nic(100);
    for fold in [false, true] {
        let mut config = ReceiverConfig::for_frames(10_000, 3, ip(101));
        config.queue_size = 3;
        let (rx, monitor) = receiver(&nic, config);
        assert_eq!(rx.frame_size(), 10_000);
        assert_eq!(rx.page_size(), 10_112 + METADATA_SIZE);
        assert_eq!(rx.pages(), 3);
        let mut t = target(&rx, 1408);
        t.fold_metadata = fold;
        let mut tx = sender(101, t);
        tx.set_psn(0xff_fff0); // across the 24-bit wrap
        for n in 0..7u32 {
            let data = frame_bytes(n, 10_000);
            // Odd frames are filled as they leave, into the sender's batch.
            let sent = if n % 2 == 0 {
                tx.send_frame(&data, None).unwrap()
            } else {
                let mut fill = |at: usize, piece: &mut [u8]| Pattern::Counter.fill_at(n, at, piece);
                tx.send_frame_filled(10_000, None, &mut fill, &mut |_, b| crc32fast::hash(b))
                    .unwrap()
            };
            let frame = rx.next_frame(WAIT).unwrap().expect("a frame");
            assert_eq!(frame.page, n % 3);
            assert_eq!(frame.frame_number, u64::from(n));
            assert_eq!(frame.received_frame_number, u64::from(n) + 1);
            assert_eq!(frame.metadata.bytes_written, 10_000);
            // The sender combines its packets' payload CRCs into the frame's: it must be the
            // CRC of the data itself, folded tail included.
            assert_eq!(sent.crc32, crc32fast::hash(&data));
            assert_eq!(frame.metadata.crc, !sent.crc32);
            assert_eq!(frame.metadata.psn, sent.psn);
            assert!(frame.metadata_psn_matches);
            assert_eq!(
                frame.imm,
                ImmediateLayout::Page12.immediate(n % 3, sent.psn)
            );
            assert_eq!(
                (frame.packets_received, frame.packets_lost),
                (sent.packets, 0)
            );
            assert_eq!(frame.bytes_received, 10_000);
            assert!(frame.is_complete());
            assert!(read(&rx, &frame) == data, "frame {n}, fold {fold}");
            assert_eq!(frame.dropped, 0);
        }
        assert!(!rx.frames_ready());
        stop(&rx, monitor);
    }
}

#[test]
fn the_seed_calls_refuse_before_start_and_validate_their_parameters() {
    let rx = Receiver::new();
    rx.close(); // harmless before start
    assert_eq!(rx.qp_number(), Err(NotStarted));
    assert_eq!(rx.rkey(), Err(NotStarted));
    assert_eq!(rx.external_frame_memory(), Err(NotStarted));
    assert_eq!(rx.next_frame(Duration::ZERO), Err(NotStarted));
    assert_eq!(rx.blocking_monitor(), Err(MonitorError::NotStarted));
    assert_eq!((rx.frame_size(), rx.page_size(), rx.pages()), (0, 0, 0));
    assert!(!rx.receive_path_failed());

    let nic = nic(102);
    let bad = |edit: &dyn Fn(&mut ReceiverConfig)| {
        let mut c = ReceiverConfig::for_frames(4096, 4, ip(103));
        edit(&mut c);
        match rx.start(&nic, c) {
            Err(StartError::Invalid { parameter, .. }) => parameter,
            other => panic!("expected a refusal, got {other:?}"),
        }
    };
    assert_eq!(bad(&|c| c.frame_size = 0), "frame_size");
    assert_eq!(bad(&|c| c.pages = 0), "pages");
    assert_eq!(bad(&|c| c.pages = 4097), "pages");
    assert_eq!(bad(&|c| c.metadata_offset = 4000), "metadata_offset");
    assert_eq!(bad(&|c| c.page_size = 4200), "page_size");
    assert_eq!(bad(&|c| c.page_size = 4096), "page_size");
    assert_eq!(
        bad(&|c| c.memory = RegionMemory::Pageable(vec![0; 100])),
        "memory"
    );
    assert_eq!(bad(&|c| c.queue_size = 0), "queue_size");
    assert_eq!(bad(&|c| c.queue_size = 5), "queue_size");
    assert_eq!(bad(&|c| c.peer_ip = "::1".parse().unwrap()), "peer_ip");
    assert_eq!(
        bad(&|c| {
            c.immediate = ImmediateLayout::Buffer8;
            c.pages = 300;
            c.memory = RegionMemory::Pageable(vec![0; 300 * 4224]);
        }),
        "pages"
    );

    rx.start(&nic, ReceiverConfig::for_frames(4096, 4, ip(103)))
        .unwrap();
    assert!(matches!(
        rx.start(&nic, ReceiverConfig::for_frames(4096, 4, ip(103))),
        Err(StartError::AlreadyStarted)
    ));
    assert_eq!(rx.next_frame(Duration::from_millis(10)), Ok(None));
    rx.close();
    rx.close();
    // Closed: a fresh start is allowed, and the monitor returns at once once closed.
    rx.start(&nic, ReceiverConfig::for_frames(4096, 4, ip(103)))
        .unwrap();
    let monitor = {
        let rx = rx.clone();
        std::thread::spawn(move || rx.blocking_monitor())
    };
    std::thread::sleep(Duration::from_millis(50));
    stop(&rx, monitor);
}

#[test]
fn a_slow_application_loses_the_oldest_frames_and_is_told() {
    let nic = nic(104);
    let mut config = ReceiverConfig::for_frames(3000, 8, ip(105));
    config.queue_size = 2;
    let (rx, monitor) = receiver(&nic, config);
    let ready = Arc::new(AtomicUsize::new(0));
    {
        let ready = Arc::clone(&ready);
        rx.set_frame_ready(Some(move || {
            ready.fetch_add(1, Ordering::SeqCst);
        }));
    }
    let mut tx = sender(105, target(&rx, 1024));
    for n in 0..6 {
        tx.send_frame(&frame_bytes(n, 3000), None).unwrap();
    }
    let deadline = std::time::Instant::now() + WAIT;
    while ready.load(Ordering::SeqCst) < 6 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        ready.load(Ordering::SeqCst),
        6,
        "the callback runs once per frame"
    );
    assert!(rx.frames_ready());
    let a = rx.next_frame(WAIT).unwrap().unwrap();
    let b = rx.next_frame(WAIT).unwrap().unwrap();
    assert_eq!((a.frame_number, b.frame_number), (4, 5));
    assert_eq!((a.dropped, b.dropped), (3, 4));
    assert_eq!(rx.counters().frames_dropped, 4);
    assert!(read(&rx, &b) == frame_bytes(5, 3000));
    assert_eq!(rx.next_frame(Duration::from_millis(20)), Ok(None));
    stop(&rx, monitor);
}

#[test]
fn loss_and_reordering_are_reported_per_frame() {
    let nic = nic(106);
    let mut config = ReceiverConfig::for_frames(64 * 1024, 4, ip(107));
    config.queue_size = 4;
    let (rx, monitor) = receiver(&nic, config);
    let mut tx = sender(107, target(&rx, 1024));
    tx.set_faults(Some(
        "loss=0.05,reorder=0.05,delay=50,seed=7"
            .parse::<Faults>()
            .unwrap(),
    ));
    let mut lost = 0;
    let mut seen = 0;
    for n in 0..40 {
        tx.send_frame(&frame_bytes(n, 64 * 1024), None).unwrap();
        tx.flush().unwrap();
        while let Some(f) = rx.next_frame(Duration::from_millis(100)).unwrap() {
            seen += 1;
            lost += f.packets_lost;
            if f.frame_number > 0 {
                // The first frame's range starts at the first packet that arrived.
                assert!(f.packets_received + f.packets_lost >= 65, "{f:?}");
            }
            if f.is_complete() {
                let whole = read(&rx, &f) == frame_bytes(f.frame_number as u32, 64 * 1024);
                assert!(whole, "a complete frame has every byte: {f:?}");
            } else {
                assert!(f.packets_lost > 0 || f.bytes_received < 64 * 1024, "{f:?}");
            }
        }
    }
    assert!(
        seen > 20,
        "most frames end with their metadata packet: {seen}"
    );
    assert!(lost > 0, "5% loss over 2600 packets loses some");
    assert!(rx.counters().incomplete_frames > 0);
    stop(&rx, monitor);
}

#[test]
fn two_streams_share_one_port() {
    let nic = nic(108);
    let (a, monitor_a) = receiver(&nic, ReceiverConfig::for_frames(5000, 2, ip(109)));
    let (b, monitor_b) = receiver(&nic, ReceiverConfig::for_frames(7000, 2, ip(109)));
    assert_ne!(a.qp_number().unwrap(), b.qp_number().unwrap());
    assert_eq!(a.local_addr().unwrap(), b.local_addr().unwrap());
    let mut tx_a = sender(109, target(&a, 2048));
    let mut tx_b = sender(109, target(&b, 2048));
    for n in 0..5 {
        tx_a.send_frame(&frame_bytes(n, 5000), None).unwrap();
        tx_b.send_frame(&frame_bytes(100 + n, 7000), None).unwrap();
        let fa = a.next_frame(WAIT).unwrap().unwrap();
        let fb = b.next_frame(WAIT).unwrap().unwrap();
        assert!(read(&a, &fa) == frame_bytes(n, 5000));
        assert!(read(&b, &fb) == frame_bytes(100 + n, 7000));
    }
    stop(&a, monitor_a);
    stop(&b, monitor_b);
}

#[test]
fn a_panicking_callback_fails_the_receive_path_until_restarted() {
    let nic = nic(110);
    let (rx, monitor) = receiver(&nic, ReceiverConfig::for_frames(2000, 2, ip(111)));
    rx.set_frame_ready(Some(|| panic!("the application's callback broke")));
    let mut tx = sender(111, target(&rx, 1024));
    tx.send_frame(&frame_bytes(0, 2000), None).unwrap();
    let ended = monitor.join().unwrap();
    assert!(
        matches!(&ended, Err(MonitorError::Failed(why)) if why.contains("callback panicked")),
        "{ended:?}"
    );
    assert!(rx.receive_path_failed());
    assert!(rx.frames_ready(), "a waiter is not left waiting");
    let started = std::time::Instant::now();
    assert_eq!(rx.next_frame(WAIT), Ok(None));
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "returns at once"
    );

    // Restart: the callback is kept (set it to one that works), frames flow again.
    let count = Arc::new(AtomicUsize::new(0));
    {
        let count = Arc::clone(&count);
        rx.set_frame_ready(Some(move || {
            count.fetch_add(1, Ordering::SeqCst);
        }));
    }
    rx.start(&nic, ReceiverConfig::for_frames(2000, 2, ip(111)))
        .unwrap();
    assert!(!rx.receive_path_failed());
    let monitor = {
        let rx = rx.clone();
        std::thread::spawn(move || rx.blocking_monitor())
    };
    tx.retarget(target(&rx, 1024)).unwrap();
    tx.send_frame(&frame_bytes(1, 2000), None).unwrap();
    let f = rx.next_frame(WAIT).unwrap().unwrap();
    assert!(read(&rx, &f) == frame_bytes(1, 2000));
    // The callback runs just after the frame is queued.
    let deadline = std::time::Instant::now() + WAIT;
    while count.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);
    stop(&rx, monitor);
}

/// A hand-made UC WRITE ONLY (WITH IMMEDIATE when `imm` is set).
#[derive(Clone, Copy)]
struct Forged<'a> {
    qp: u32,
    rkey: u32,
    psn: u32,
    va: u64,
    imm: Option<u32>,
    payload: &'a [u8],
    break_icrc: bool,
}

impl Forged<'_> {
    fn send(&self, from: &UdpSocket, to: SocketAddr) {
        let opcode = if self.imm.is_some() {
            Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UC_RDMA_WRITE_ONLY
        };
        let bth = Bth::new(
            opcode,
            Qpn::from_low_bits(self.qp),
            Psn::from_low_bits(self.psn),
        );
        let mut repr = PacketRepr::new(bth);
        repr.reth = Some(Reth {
            va: self.va,
            rkey: self.rkey,
            len: self.payload.len() as u32,
        });
        repr.imm = self.imm;
        repr.payload_len = self.payload.len();
        let mut buf = vec![0; repr.buffer_len()];
        repr.emit(self.payload, &mut buf).unwrap();
        let local = from.local_addr().unwrap();
        let ip = IpHeader::between(local.ip(), to.ip()).unwrap();
        let udp = UdpHeader {
            src_port: local.port(),
            dst_port: to.port(),
        };
        icrc::seal(&ip, &udp, &mut buf).unwrap();
        if self.break_icrc {
            let n = buf.len();
            buf[n - 1] ^= 0xff;
        }
        from.send_to(&buf, to).unwrap();
    }
}

#[test]
fn hostile_packets_are_counted_and_never_land_outside_their_page() {
    let nic = nic(112);
    // Memory for three pages, a ring of two: the third is the region's, but no page's.
    let mut config = ReceiverConfig::for_frames(1024, 2, ip(113));
    config.memory = RegionMemory::Pageable(vec![0; 3 * config.page_size]);
    let (rx, monitor) = receiver(&nic, config);
    let t = target(&rx, 1024);
    let page = t.page_size as u64;
    let md = t.metadata_offset() as u64;
    let device = UdpSocket::bind(SocketAddr::new(ip(113), 0)).unwrap();
    let stranger = UdpSocket::bind(SocketAddr::new(ip(114), 0)).unwrap();
    let junk = [0xee; 256];
    let block = [0u8; METADATA_SIZE];
    let send =
        |s: &UdpSocket, qp: u32, rkey: u32, psn: u32, va: u64, imm: Option<u32>, payload: &[u8]| {
            let w = Forged {
                qp,
                rkey,
                psn,
                va,
                imm,
                payload,
                break_icrc: false,
            };
            w.send(s, t.dest);
        };
    let before = nic.counters();
    // Past the region altogether: the engine's own bounds check.
    send(&device, t.qp, t.rkey, 0, t.address + 3 * page, None, &junk);
    // A write that would run from page 0 into page 1.
    send(
        &device,
        t.qp,
        t.rkey,
        1,
        t.address + page - 128,
        None,
        &junk,
    );
    // A write to a page past `pages`, though inside the region.
    send(&device, t.qp, t.rkey, 2, t.address + 2 * page, None, &junk);
    // An immediate naming page 7 of 2.
    send(
        &device,
        t.qp,
        t.rkey,
        3,
        t.address + md,
        Some(ImmediateLayout::Page12.immediate(7, 3)),
        &block,
    );
    // An immediate naming page 1 for a write into page 0.
    send(
        &device,
        t.qp,
        t.rkey,
        4,
        t.address + md,
        Some(ImmediateLayout::Page12.immediate(1, 4)),
        &block,
    );
    // A frame-ending write whose metadata misses the metadata offset.
    send(
        &device,
        t.qp,
        t.rkey,
        5,
        t.address,
        Some(ImmediateLayout::Page12.immediate(0, 5)),
        &block,
    );
    // A wrong key, another source, another queue pair, a broken ICRC.
    send(&device, t.qp, t.rkey ^ 1, 6, t.address, None, &junk);
    send(&stranger, t.qp, t.rkey, 7, t.address, None, &junk);
    send(&device, t.qp ^ 0x40, t.rkey, 8, t.address, None, &junk);
    Forged {
        qp: t.qp,
        rkey: t.rkey,
        psn: 9,
        va: t.address,
        imm: None,
        payload: &junk,
        break_icrc: true,
    }
    .send(&device, t.dest);
    // Junk on the port.
    device.send_to(&[1, 2, 3], t.dest).unwrap();

    // Then a frame whose metadata names another PSN than its immediate, and a truncated one
    // (its first packet never sent).
    let mut md_block = ferroce::frames::Metadata {
        psn: 99,
        bytes_written: 1024,
        ..Default::default()
    };
    send(&device, t.qp, t.rkey, 10, t.address, None, &[5; 1024]);
    send(
        &device,
        t.qp,
        t.rkey,
        11,
        t.address + md,
        Some(ImmediateLayout::Page12.immediate(0, 11)),
        &md_block.to_bytes(),
    );
    md_block.psn = 13;
    send(
        &device,
        t.qp,
        t.rkey,
        13,
        t.address + page + md,
        Some(ImmediateLayout::Page12.immediate(1, 13)),
        &md_block.to_bytes(),
    );

    let first = rx.next_frame(WAIT).unwrap().expect("the mismatched frame");
    assert!(!first.metadata_psn_matches);
    assert_eq!(first.page, 0);
    let second = rx.next_frame(WAIT).unwrap().expect("the truncated frame");
    assert!(second.metadata_psn_matches);
    assert_eq!((second.packets_received, second.packets_lost), (1, 1));
    assert_eq!(second.bytes_received, 0);
    assert!(!second.is_complete());

    let c = rx.counters();
    assert_eq!(c.write_crosses_page, 1);
    assert_eq!(c.page_out_of_range, 2);
    assert_eq!(c.page_mismatch, 1);
    assert_eq!(c.metadata_misplaced, 1);
    assert_eq!(c.metadata_psn_mismatch, 1);
    assert_eq!(c.incomplete_frames, 2);
    let n = nic.counters();
    assert_eq!(
        n.uc_access_err - before.uc_access_err,
        2,
        "wrong key, past the region"
    );
    assert_eq!(n.write_filtered - before.write_filtered, 5);
    assert_eq!(n.wrong_source - before.wrong_source, 1);
    assert_eq!(n.unknown_qp - before.unknown_qp, 1);
    assert_eq!(n.icrc_err - before.icrc_err, 1);
    assert_eq!(n.malformed_pkts - before.malformed_pkts, 1);

    // Nothing refused landed: page 1's data is untouched, page 0 holds only the good write.
    let mut p1 = vec![0; 1024];
    rx.read_frame(&second, &mut p1).unwrap();
    assert!(p1.iter().all(|&b| b == 0), "page 1 untouched");
    let mut p0 = vec![0; 1024];
    rx.read_frame(&first, &mut p0).unwrap();
    assert!(p0.iter().all(|&b| b == 5));
    assert!(!rx.receive_path_failed());
    stop(&rx, monitor);
}

#[test]
fn frames_land_in_device_memory_and_a_failed_copy_is_fatal_until_restarted() {
    let nic = nic(115);
    let config = || ReceiverConfig::for_frames(300_000, 3, ip(116));
    let ring = config().page_size * 3;

    let small = FakeDevice::new(ring - 1, usize::MAX);
    match Receiver::new().start(&nic, config().with_device_memory(small)) {
        Err(StartError::Invalid { parameter, reason }) => {
            assert_eq!(parameter, "device_memory");
            assert!(reason.contains("fake device 7"), "{reason}");
        }
        other => panic!("a device too small for the ring was accepted: {other:?}"),
    }

    // Two copies per frame (data, metadata) in 1 MiB steps: the third frame's first fails.
    let failing = FakeDevice::new(ring, 5);
    let (rx, monitor) = receiver(&nic, config().with_device_memory(failing.clone()));
    assert_eq!(
        rx.device_memory().map(|d| d.address()),
        Some(0x7f00_0000_0000)
    );
    let mut tx = sender(116, target(&rx, 4096));
    for n in 0..2u32 {
        let data = frame_bytes(n, 300_000);
        tx.send_frame(&data, None).unwrap();
        let frame = rx.next_frame(WAIT).unwrap().expect("a frame");
        assert!(
            read(&rx, &frame) == data,
            "frame {n} read back from the device"
        );
        let page = frame.page as usize * rx.page_size();
        let on_device = failing.bytes.lock().unwrap()[page..page + data.len()].to_vec();
        assert!(on_device == data, "frame {n} is in the device memory");
        let metadata_at = page + rx.metadata_offset();
        let block = failing.bytes.lock().unwrap()[metadata_at..metadata_at + 128].to_vec();
        assert_eq!(
            ferroce::frames::Metadata::parse(block.as_slice().try_into().unwrap()).frame_number,
            n
        );
    }
    tx.send_frame(&frame_bytes(2, 300_000), None).unwrap();
    let ended = monitor.join().unwrap();
    assert!(
        matches!(&ended, Err(MonitorError::Failed(why))
            if why.contains("copying frame 2 (page 2) to fake device 7 failed")
                && why.contains("illegal address")),
        "{ended:?}"
    );
    assert!(rx.receive_path_failed());
    assert_eq!(
        rx.next_frame(WAIT),
        Ok(None),
        "the failed frame is not handed out"
    );

    let working = FakeDevice::new(ring, usize::MAX);
    rx.start(&nic, config().with_device_memory(working.clone()))
        .unwrap();
    assert!(!rx.receive_path_failed());
    let monitor = {
        let rx = rx.clone();
        std::thread::spawn(move || rx.blocking_monitor())
    };
    tx.retarget(target(&rx, 4096)).unwrap();
    let data = frame_bytes(3, 300_000);
    // 74 packets: two batches filled as they leave, and a tail.
    let sent = tx
        .send_frame_filled(
            300_000,
            None,
            &mut |at, piece| Pattern::Counter.fill_at(3, at, piece),
            &mut |_, bytes| crc32fast::hash(bytes),
        )
        .unwrap();
    assert_eq!((sent.packets, sent.crc32), (75, crc32fast::hash(&data)));
    let frame = rx
        .next_frame(WAIT)
        .unwrap()
        .expect("a frame after the restart");
    assert!(read(&rx, &frame) == data);
    // Shown from the device a piece at a time, as the copy brings it.
    let (seen, pieces) = inspected(&rx, &frame).unwrap();
    assert!(seen == data);
    assert_eq!(pieces, 5);
    stop(&rx, monitor);
}

/// Frames viewed where they landed: the view's bytes are the ring's (no copy), the view
/// outlives the receiver's close, and once the ring wraps to its page the view says so and
/// its checked copy refuses. The NIC is built on a socket bound here, as Hololink's
/// `linux_receiver` hands one over.
#[test]
fn frame_views_are_zero_copy_and_tell_when_overtaken() {
    use ferroce::frames::ViewMemory;

    let socket = UdpSocket::bind(SocketAddr::new(ip(118), 4791)).unwrap();
    let nic = Nic::from_udp_socket(socket, &NicConfig::default()).unwrap();
    assert_eq!(nic.addr(), SocketAddr::new(ip(118), 4791));

    let config = ReceiverConfig::for_frames(5000, 2, ip(119));
    assert!(matches!(config.memory, RegionMemory::Mapped(_)));
    let (rx, monitor) = receiver(&nic, config);
    let mut tx = sender(119, target(&rx, 1024));
    tx.send_frame(&frame_bytes(0, 5000), None).unwrap();
    let first = rx.next_frame(WAIT).unwrap().expect("a frame");
    let view = rx.frame_view(&first).unwrap();
    assert_eq!(view.memory(), ViewMemory::Host);
    assert_eq!(view.len(), 5000);
    assert_eq!(view.addr(), rx.external_frame_memory().unwrap());
    assert!(view.is_current());
    let mut copy = vec![0; view.len()];
    view.copy_into(&mut copy).unwrap();
    assert!(copy == frame_bytes(0, 5000));
    assert!(matches!(
        view.copy_into(&mut vec![0; rx.page_size() + 1]),
        Err(FrameReadError::OutOfPage { .. })
    ));
    // Inspected where it landed, whole; nothing shown past the page.
    assert!(inspected(&rx, &first).unwrap().0 == frame_bytes(0, 5000));
    let mut shown = 0;
    assert!(matches!(
        rx.inspect_frame(&first, rx.page_size() + 1, |_| shown += 1),
        Err(FrameReadError::OutOfPage { .. })
    ));
    assert_eq!(shown, 0);

    // The next frame lands in page 1, the one after in page 0 again: the first view is then
    // stale, and says so.
    tx.send_frame(&frame_bytes(1, 5000), None).unwrap();
    let second = rx.next_frame(WAIT).unwrap().expect("a frame");
    let second_view = rx.frame_view(&second).unwrap();
    assert_eq!(second_view.addr(), view.addr() + rx.page_size() as u64);
    assert!(
        view.is_current(),
        "page 0 is untouched by a frame in page 1"
    );
    tx.send_frame(&frame_bytes(2, 5000), None).unwrap();
    let third = rx.next_frame(WAIT).unwrap().expect("a frame");
    assert_eq!(third.page, 0);
    assert!(!view.is_current());
    assert_eq!(
        view.copy_into(&mut copy),
        Err(FrameReadError::Overwritten { page: 0 })
    );
    assert!(matches!(
        rx.frame_view(&first),
        Err(FrameReadError::Overwritten { page: 0 })
    ));
    assert_eq!(
        inspected(&rx, &first),
        Err(FrameReadError::Overwritten { page: 0 })
    );

    // The view keeps the ring mapped after the receiver closes and is dropped.
    let third_view = rx.frame_view(&third).unwrap();
    stop(&rx, monitor);
    drop(rx);
    third_view.copy_into(&mut copy).unwrap();
    assert!(copy == frame_bytes(2, 5000));

    // A ring the region owns is never handed out.
    let mut config = ReceiverConfig::for_frames(5000, 2, ip(119));
    config.memory = RegionMemory::Pageable(vec![0; 2 * config.page_size]);
    let (rx, monitor) = receiver(&nic, config);
    tx = sender(119, target(&rx, 1024));
    tx.send_frame(&frame_bytes(3, 5000), None).unwrap();
    let frame = rx.next_frame(WAIT).unwrap().expect("a frame");
    assert!(matches!(
        rx.frame_view(&frame),
        Err(FrameReadError::NoView(_))
    ));
    assert!(read(&rx, &frame) == frame_bytes(3, 5000));
    assert!(inspected(&rx, &frame).unwrap().0 == frame_bytes(3, 5000));
    stop(&rx, monitor);

    // The address of an adopted socket's NIC is taken like any other.
    let taken = UdpSocket::bind(SocketAddr::new(ip(118), 4791));
    assert!(taken.is_err(), "the NIC holds its socket");
}
