//! What a frame receiver costs in CPU with one camera stream and with eight (issue 16): the
//! receiving side runs in this process (one soft NIC on 127.0.0.90, one `frames::Receiver`
//! per stream, each with its monitor thread and an application thread taking its frames),
//! the devices in child processes (this program again, with `--send`), one per stream on
//! 127.0.0.91 and up, each streaming frames of the same size at the same rate. The
//! receiving process's user and system CPU time over the run comes from /proc/self/stat, so
//! the devices' work is not in it; each device reports its own. Same run, same frame size,
//! one stream, eight at the same rate each, and one at eight times the rate (BENCHMARKS.md).
//!
//! `cargo run --release -p ferroce --example frames_cpu -- [frame bytes] [fps per stream] [seconds]`

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ferroce::frames::{ImmediateLayout, Pattern, Receiver, ReceiverConfig, Sender, Target};
use ferroce::{Nic, NicConfig};

/// Linux reports process times in USER_HZ ticks, 100 a second on every architecture's ABI.
const USER_HZ: f64 = 100.0;
const PAGES: u32 = 4;
const RECEIVER_HOST: u8 = 90;

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

/// (user, system) CPU seconds of this process so far, all its threads, from /proc/self/stat.
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // The fields after the command name, which is in parentheses and may hold spaces: the
    // state is field 3, utime field 14, stime field 15.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields[i].parse::<f64>().expect("a tick count") / USER_HZ;
    (ticks(11), ticks(12))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--send") {
        device(&args[1..]);
        return;
    }
    let num = |i: usize, default: f64| {
        args.get(i)
            .map(|a| a.parse::<f64>().expect("a number"))
            .unwrap_or(default)
    };
    let frame_size = num(0, 1_536_000.0) as usize;
    let fps = num(1, 30.0);
    let seconds = num(2, 10.0);
    println!("frames of {frame_size} bytes for {seconds} s; receiving process's CPU only");
    println!(
        "{:>7} {:>6} {:>7} {:>9} {:>8} {:>6} {:>8} {:>7} {:>7} {:>7} {:>11} {:>10} {:>9} {:>11}",
        "streams",
        "fps",
        "frames",
        "complete",
        "lost pkt",
        "wall s",
        "MB/s",
        "user s",
        "sys s",
        "core %",
        "µs/frame",
        "CPU s/GB",
        "senders s",
        "late frames"
    );
    // One stream and eight at the same rate each; then one stream carrying what the eight
    // did together, which separates the cost of more streams from that of more bytes.
    for (streams, rate) in [(1, fps), (8, fps), (1, 8.0 * fps)] {
        run(streams, frame_size, rate, (rate * seconds).round() as u64);
    }
}

/// One run: `streams` devices streaming `frames` frames each into one receiving NIC.
fn run(streams: usize, frame_size: usize, fps: f64, frames: u64) {
    let nic = Nic::open(&NicConfig::on(ip(RECEIVER_HOST))).expect("open the receiving NIC");
    let receivers: Vec<Receiver> = (0..streams)
        .map(|k| {
            let rx = Receiver::new();
            let mut config = ReceiverConfig::for_frames(frame_size, PAGES, ip(91 + k as u8));
            config.queue_size = PAGES as usize;
            rx.start(&nic, config).expect("start a receiver");
            rx
        })
        .collect();
    let done = AtomicBool::new(false);
    let complete = AtomicU64::new(0);
    let taken = AtomicU64::new(0);
    let lost = AtomicU64::new(0);
    let (wall, cpu, senders) = std::thread::scope(|s| {
        for rx in &receivers {
            s.spawn(move || rx.blocking_monitor().expect("the receive path"));
            let (done, complete, taken, lost) = (&done, &complete, &taken, &lost);
            s.spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    if let Ok(Some(frame)) = rx.next_frame(Duration::from_millis(50)) {
                        taken.fetch_add(1, Ordering::SeqCst);
                        lost.fetch_add(frame.packets_lost, Ordering::SeqCst);
                        if frame.is_complete() {
                            complete.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
        let (cpu0, t0) = (cpu_seconds(), Instant::now());
        let children: Vec<_> = receivers
            .iter()
            .enumerate()
            .map(|(k, rx)| {
                let t = target(rx);
                Command::new(std::env::current_exe().expect("this program"))
                    .args([
                        "--send".to_owned(),
                        ip(91 + k as u8).to_string(),
                        t.dest.to_string(),
                        t.qp.to_string(),
                        t.rkey.to_string(),
                        t.address.to_string(),
                        t.page_size.to_string(),
                        t.frame_size.to_string(),
                        fps.to_string(),
                        frames.to_string(),
                    ])
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("start a device")
            })
            .collect();
        // Each device prints its CPU seconds and late frames when it is done.
        let mut senders = (0.0, 0u64);
        for mut child in children {
            let line = BufReader::new(child.stdout.take().unwrap())
                .lines()
                .next()
                .and_then(Result::ok)
                .unwrap_or_default();
            assert!(child.wait().expect("a device").success(), "a device failed");
            let mut it = line.split_whitespace();
            senders.0 += it.next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            senders.1 += it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        // The last frames are in once every one is taken, or after a quiet half second.
        let expected = frames * streams as u64;
        let mut last = (taken.load(Ordering::SeqCst), Instant::now());
        while taken.load(Ordering::SeqCst) < expected {
            std::thread::sleep(Duration::from_millis(5));
            let now = taken.load(Ordering::SeqCst);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_millis(500) {
                break;
            }
        }
        let (wall, cpu1) = (t0.elapsed(), cpu_seconds());
        done.store(true, Ordering::SeqCst);
        for rx in &receivers {
            rx.close();
        }
        (wall, (cpu1.0 - cpu0.0, cpu1.1 - cpu0.1), senders)
    });
    let taken = taken.load(Ordering::SeqCst);
    let complete = complete.load(Ordering::SeqCst);
    let bytes = complete as f64 * frame_size as f64;
    let total = cpu.0 + cpu.1;
    println!(
        "{:>7} {:>6} {:>7} {:>9} {:>8} {:>6.2} {:>8.1} {:>7.2} {:>7.2} {:>6.1}% {:>11.1} {:>10.3} {:>9.2} {:>11}",
        streams,
        fps,
        frames * streams as u64,
        format!("{complete}/{taken}"),
        lost.load(Ordering::SeqCst),
        wall.as_secs_f64(),
        bytes / wall.as_secs_f64() / 1e6,
        cpu.0,
        cpu.1,
        100.0 * total / wall.as_secs_f64(),
        total * 1e6 / complete.max(1) as f64,
        total / (bytes / 1e9).max(1e-9),
        senders.0,
        senders.1,
    );
}

fn target(rx: &Receiver) -> Target {
    Target {
        dest: rx.local_addr().expect("started"),
        qp: rx.qp_number().expect("started"),
        rkey: rx.rkey().expect("started"),
        address: rx.external_frame_memory().expect("started"),
        page_size: rx.page_size(),
        pages: rx.pages(),
        frame_size: rx.frame_size(),
        payload: 4096,
        immediate: ImmediateLayout::Page12,
        fold_metadata: false,
    }
}

/// A device (`--send LOCAL DEST QP RKEY VA PAGE_SIZE FRAME_SIZE FPS FRAMES`): streams its
/// frames at the rate asked, each spread over four fifths of its frame time as a sensor's
/// readout is, then prints its own CPU seconds and how many frames it started late.
fn device(args: &[String]) {
    let arg = |i: usize| args.get(i).expect("--send takes nine values").as_str();
    let n = |i: usize| arg(i).parse::<u64>().expect("a number");
    let frame_size = n(6) as usize;
    let target = Target {
        dest: arg(1).parse().expect("an address"),
        qp: n(2) as u32,
        rkey: n(3) as u32,
        address: n(4),
        page_size: n(5) as usize,
        pages: PAGES,
        frame_size,
        payload: 4096,
        immediate: ImmediateLayout::Page12,
        fold_metadata: false,
    };
    let local = SocketAddr::new(arg(0).parse().expect("an address"), 0);
    let fps: f64 = arg(7).parse().expect("a rate");
    let frames = n(8);
    let mut tx = Sender::new(local, target).expect("a sender");
    let data: Vec<Vec<u8>> = (0..2)
        .map(|i| {
            let mut d = vec![0; frame_size];
            Pattern::Counter.fill(i, &mut d);
            d
        })
        .collect();
    let period = Duration::from_secs_f64(1.0 / fps);
    let start = Instant::now();
    let mut late = 0;
    for i in 0..frames {
        let due = start + period.mul_f64(i as f64);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > period / 2 {
            late += 1;
        }
        tx.send_frame(&data[i as usize % 2], Some(period.mul_f64(0.8)))
            .expect("send a frame");
    }
    let (user, sys) = cpu_seconds();
    println!("{:.2} {late}", user + sys);
}
