//! The Rust side of `bench/bench.py`: the same loops the Python benchmark times, so that the
//! cost of crossing into Python can be read off one run.
//!
//! ```text
//! cargo run --release -p ferroce-py --example loops -- <frames|write|ready> <iterations> <host a> <host b>
//! ```
//!
//! - `frames`: a receiver with `iterations` frames of 4 KiB already queued; times taking each
//!   (`next_frame`) and viewing it in place (`frame_view`, what `numpy.asarray(frame)` does).
//! - `write`: an RC queue pair between two soft NICs; times posting a 64-byte WRITE and
//!   polling its completion, one at a time.
//!
//! - `ready`: a started receiver with no frames; times `frames_ready`, a call that only takes
//!   a lock, so that the Python figure is the bare cost of a call into the module.
//!
//! Prints one line: `<loop> <iterations> <ns per iteration>`.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use ferroce::frames::{ImmediateLayout, Pattern, Receiver, ReceiverConfig, Sender, Target};
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: loops <frames|write|ready> <iterations> <ip a> <ip b>";
    let (Some(what), Some(n), Some(a), Some(b)) =
        (args.get(1), args.get(2), args.get(3), args.get(4))
    else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let n: u32 = n.parse().expect("iterations");
    let a: IpAddr = a.parse().expect("ip a");
    let b: IpAddr = b.parse().expect("ip b");
    let ns = match what.as_str() {
        "frames" => frames(n, a, b),
        "write" => write(n, a, b),
        "ready" => ready(n, a, b),
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    println!("{what} {n} {ns:.0}");
}

fn frames(n: u32, a: IpAddr, b: IpAddr) -> f64 {
    let nic = Nic::open(&NicConfig::on(a)).expect("NIC");
    let rx = Receiver::new();
    let mut config = ReceiverConfig::for_frames(4096, n, b);
    config.queue_size = n as usize;
    rx.start(&nic, config).expect("start");
    let monitor = {
        let rx = rx.clone();
        std::thread::spawn(move || rx.blocking_monitor())
    };
    let target = Target {
        dest: rx.local_addr().expect("started"),
        qp: rx.qp_number().expect("started"),
        rkey: rx.rkey().expect("started"),
        address: rx.external_frame_memory().expect("started"),
        page_size: rx.page_size(),
        pages: rx.pages(),
        frame_size: 4096,
        payload: 4096,
        immediate: ImmediateLayout::Page12,
        fold_metadata: false,
    };
    let mut tx = Sender::new(SocketAddr::new(b, 0), target).expect("sender");
    let mut data = vec![0u8; 4096];
    for i in 0..n {
        Pattern::Counter.fill(i, &mut data);
        tx.send_frame(&data, None).expect("send");
        // Keep the receiver's socket from overflowing: wait for each frame to be queued.
        let deadline = Instant::now() + Duration::from_secs(5);
        while rx.counters().frames <= u64::from(i) && Instant::now() < deadline {
            std::thread::yield_now();
        }
    }
    let start = Instant::now();
    let mut sum = 0u64;
    for _ in 0..n {
        let info = rx
            .next_frame(Duration::from_secs(5))
            .expect("started")
            .expect("a queued frame");
        let view = rx.frame_view(&info).expect("view");
        sum = sum.wrapping_add(view.addr());
    }
    let elapsed = start.elapsed();
    std::hint::black_box(sum);
    rx.close();
    monitor.join().expect("monitor").expect("monitor ran");
    elapsed.as_nanos() as f64 / f64::from(n)
}

fn write(n: u32, a: IpAddr, b: IpAddr) -> f64 {
    let na = Nic::open(&NicConfig::on(a)).expect("NIC a");
    let nb = Nic::open(&NicConfig::on(b)).expect("NIC b");
    let ca = Cq::new(&na, 256).expect("cq");
    let cb = Cq::new(&nb, 256).expect("cq");
    let qa = Qp::new(&na, QpType::Rc, &ca, &ca, QpCaps::default()).expect("qp");
    let qb = Qp::new(&nb, QpType::Rc, &cb, &cb, QpCaps::default()).expect("qp");
    let options = ConnectOptions::default();
    qa.connect(&qb.endpoint(), &options).expect("connect");
    qb.connect(&qa.endpoint(), &options).expect("connect");
    let src = Region::register(
        &na,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![7; 64]),
    )
    .expect("region");
    let dst = Region::register(
        &nb,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; 64]),
    )
    .expect("region");
    let wr = SendWr::new(
        1,
        SendOp::Write(dst.remote(0).expect("remote")),
        Payload::Sge(src.local(0, 64).expect("local")),
    );
    let once = || {
        qa.post_send(wr.clone()).expect("post");
        loop {
            if let Some(c) = ca.poll() {
                assert!(c.status == ferroce::cq::WcStatus::Success, "{c:?}");
                break;
            }
        }
    };
    for _ in 0..100 {
        once();
    }
    let start = Instant::now();
    for _ in 0..n {
        once();
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

fn ready(n: u32, a: IpAddr, b: IpAddr) -> f64 {
    let nic = Nic::open(&NicConfig::on(a)).expect("NIC");
    let rx = Receiver::new();
    rx.start(&nic, ReceiverConfig::for_frames(4096, 2, b))
        .expect("start");
    let start = Instant::now();
    let mut ready = 0u32;
    for _ in 0..n {
        ready += u32::from(std::hint::black_box(rx.frames_ready()));
    }
    let elapsed = start.elapsed();
    assert_eq!(ready, 0);
    elapsed.as_nanos() as f64 / f64::from(n)
}
