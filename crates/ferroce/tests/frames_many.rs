//! Many camera streams into one frame receiver NIC (issue 16): eight senders, each a device
//! on an address of its own streaming into a receiver of its own (its own UC queue pair,
//! pages and monitor thread), all eight receivers on one soft NIC and one UDP port, all at
//! once. Every frame of every stream is checked byte for byte, with its metadata.
//!
//! Addresses 127.0.0.90 (the receiving NIC) and 127.0.0.91 to 127.0.0.98 (the devices).

#![forbid(unsafe_code)]

mod support;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use ferroce::frames::{FrameInfo, Pattern, Receiver, ReceiverConfig, Sender};
use ferroce::{Nic, NicConfig};

const STREAMS: usize = 8;
const FRAMES: u32 = 60;
/// Pages per receiver; a sender stays this many frames less one ahead of its application.
const PAGES: u32 = 4;
/// Data packets a sender has in flight at most, so the eight together stay well inside the
/// receiving socket's buffer (loopback has no other).
const WINDOW: u32 = 32;
const WAIT: Duration = Duration::from_secs(20);

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

/// Stream `k`'s frame size: each its own, none a whole number of packets.
fn frame_size(k: usize) -> usize {
    200_000 + k * 12_345
}

/// Frame `n` of stream `k`: no two frames of any streams alike.
fn frame_bytes(k: usize, n: u32) -> Vec<u8> {
    let mut data = vec![0; frame_size(k)];
    Pattern::Counter.fill(k as u32 * 1000 + n, &mut data);
    data
}

/// What the application side of one stream saw.
#[derive(Debug, Default)]
struct Seen {
    frames: Vec<FrameInfo>,
    mismatched: Vec<u64>,
}

#[test]
fn eight_cameras_stream_into_one_nic_at_once() {
    let nic = Nic::open(&NicConfig::on(ip(90))).expect("open the receiving NIC");
    let receivers: Vec<Receiver> = (0..STREAMS)
        .map(|k| {
            let rx = Receiver::new();
            let mut config = ReceiverConfig::for_frames(frame_size(k), PAGES, ip(91 + k as u8));
            config.queue_size = PAGES as usize;
            rx.start(&nic, config).expect("start a receiver");
            rx
        })
        .collect();
    // Eight queue pairs, one port.
    let mut qps: Vec<u32> = receivers.iter().map(|r| r.qp_number().unwrap()).collect();
    qps.sort_unstable();
    qps.dedup();
    assert_eq!(qps.len(), STREAMS);
    assert!(receivers
        .iter()
        .all(|r| r.local_addr().unwrap() == SocketAddr::new(ip(90), 4791)));

    let consumed: Vec<Arc<AtomicU64>> = (0..STREAMS).map(|_| Arc::default()).collect();
    let start = Barrier::new(STREAMS);
    let (sent, seen) = std::thread::scope(|s| {
        let monitors: Vec<_> = receivers
            .iter()
            .map(|rx| s.spawn(move || rx.blocking_monitor()))
            .collect();
        let apps: Vec<_> = (0..STREAMS)
            .map(|k| {
                let (rx, consumed) = (&receivers[k], &consumed[k]);
                s.spawn(move || {
                    let mut seen = Seen::default();
                    for _ in 0..FRAMES {
                        let Some(frame) = rx.next_frame(WAIT).unwrap() else {
                            break;
                        };
                        let mut got = vec![0; frame.metadata.bytes_written as usize];
                        let whole = rx.read_frame(&frame, &mut got).is_ok()
                            && got == frame_bytes(k, frame.frame_number as u32);
                        if !whole {
                            seen.mismatched.push(frame.frame_number);
                        }
                        seen.frames.push(frame);
                        consumed.fetch_add(1, Ordering::SeqCst);
                    }
                    seen
                })
            })
            .collect();
        let senders: Vec<_> = (0..STREAMS)
            .map(|k| {
                let (rx, consumed, start) = (&receivers[k], &consumed[k], &start);
                s.spawn(move || {
                    let mut tx = Sender::new(
                        SocketAddr::new(ip(91 + k as u8), 0),
                        support::target(rx, 4096),
                    )
                    .expect("a sender");
                    let taken = rx.clone();
                    tx.set_window(Some((
                        WINDOW,
                        Arc::new(move || taken.counters().packets) as ferroce::frames::Taken,
                    )));
                    start.wait();
                    (0..FRAMES)
                        .map(|n| {
                            // A page is the device's again only once its frame was taken.
                            while consumed.load(Ordering::SeqCst) + u64::from(PAGES - 1)
                                < u64::from(n)
                            {
                                std::thread::sleep(Duration::from_micros(200));
                            }
                            tx.send_frame(&frame_bytes(k, n), None)
                                .expect("send a frame")
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let sent: Vec<_> = senders.into_iter().map(|h| h.join().unwrap()).collect();
        let seen: Vec<Seen> = apps.into_iter().map(|h| h.join().unwrap()).collect();
        for rx in &receivers {
            rx.close();
        }
        for m in monitors {
            assert_eq!(m.join().unwrap(), Ok(()));
        }
        (sent, seen)
    });

    for k in 0..STREAMS {
        let (sent, seen) = (&sent[k], &seen[k]);
        assert_eq!(seen.frames.len(), FRAMES as usize, "stream {k}: {seen:?}");
        assert!(seen.mismatched.is_empty(), "stream {k}: {seen:?}");
        for (n, (frame, sent)) in seen.frames.iter().zip(sent).enumerate() {
            let what = format!("stream {k}, frame {n}: {frame:?}");
            assert_eq!(frame.frame_number, n as u64, "{what}");
            assert_eq!(frame.page, n as u32 % PAGES, "{what}");
            assert!(frame.is_complete(), "{what}");
            assert_eq!(frame.dropped, 0, "{what}");
            assert_eq!(frame.metadata.bytes_written, frame_size(k) as u64, "{what}");
            assert_eq!(frame.bytes_received, frame_size(k) as u64, "{what}");
            assert_eq!(frame.metadata.crc, !sent.crc32, "{what}");
            assert_eq!(frame.metadata.psn, sent.psn, "{what}");
            assert_eq!(frame.packets_received, sent.packets, "{what}");
        }
        let c = receivers[k].counters();
        assert_eq!(c.frames, u64::from(FRAMES), "stream {k}: {c:?}");
        assert_eq!(
            (c.frames_dropped, c.incomplete_frames, c.packets_lost),
            (0, 0, 0),
            "stream {k}: {c:?}"
        );
        assert_eq!(
            c.packets,
            sent.iter().map(|f| f.packets).sum::<u64>(),
            "stream {k}: {c:?}"
        );
    }
    // Nothing crossed from one stream into another's queue pair, and nothing was refused.
    let c = nic.counters();
    assert_eq!(
        (c.wrong_source, c.unknown_qp, c.write_filtered, c.icrc_err),
        (0, 0, 0, 0),
        "{c:?}"
    );
}
