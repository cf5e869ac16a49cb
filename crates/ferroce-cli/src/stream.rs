//! `ferroce stream recv|send` and `ferroce demo`: the two ends of a sensor-frame stream.
//!
//! `stream recv` is a [`Receiver`] on a soft NIC; with `--device` it programs that device's
//! data channel over the bridge's control protocol, without it it waits for frames from
//! whoever programs the device. `stream send` is the device: it serves the bridge's register
//! map on UDP 8192 and streams once a host has programmed it (or at once, to a target given
//! on the command line). `demo` runs both on loopback and checks every frame.

use std::fs;
use std::io::{self, IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use ferroce::device::DeviceMemory;
use ferroce::frames::control::{DataChannel, DeviceRegisters, RoceChannel, CONTROL_PORT};
use ferroce::frames::{
    FrameInfo, ImmediateLayout, MonitorError, Pattern, PatternCrcs, Receiver, ReceiverConfig,
    Sender, Target, BRIDGE_DATA_PORT,
};
use ferroce::nic::Faults;
use ferroce::proto::wire::ROCE_PORT;
use ferroce::{Nic, NicConfig};
use serde_json::json;

/// A 4K RAW12 frame: 3840 × 2160 pixels of 12 bits.
pub(crate) const FRAME_4K_RAW12: usize = 3840 * 2160 * 3 / 2;

/// `stream recv --frames N`'s idle limit unless `--idle` says otherwise: seconds without a
/// frame after which a stream that stopped short ends.
const DEFAULT_IDLE: f64 = 5.0;

/// `ferroce stream`'s two ends.
#[derive(Subcommand)]
pub(crate) enum StreamCommand {
    /// Receive frames into a ring of pages (Hololink's receiver) and report each one.
    Recv(RecvArgs),
    /// Be the device: serve the bridge's registers, then stream frames where they say.
    Send(SendArgs),
}

/// Flags of `stream recv`.
#[derive(Args)]
pub(crate) struct RecvArgs {
    /// The RDMA device to receive on: `ferroce0` (the soft NIC) or a verbs device (`rxe0`,
    /// `mlx5_0`), whose UC queue pair the frames are written into by the NIC itself.
    #[arg(short = 'd', long = "ib-dev", default_value = ferroce::verbs::SOFT_DEVICE)]
    ib_dev: String,
    /// The device's port.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// The local address: the soft NIC's (frames arrive on its UDP port 4791; 127.0.0.1
    /// unless given), or on a verbs device the address whose RoCE v2 GID to use (default: the
    /// first IPv4 one).
    #[arg(long)]
    local: Option<IpAddr>,
    /// The device's data address: frames from any other are dropped. Defaults to
    /// `--device`'s address.
    #[arg(long)]
    peer: Option<IpAddr>,
    /// Program this device (its control address; port 8192 unless given) to send here.
    #[arg(long)]
    device: Option<String>,
    /// Bytes of data per frame.
    #[arg(long, default_value_t = FRAME_4K_RAW12)]
    frame_size: usize,
    /// Pages in the ring.
    #[arg(long, default_value_t = 4)]
    pages: u32,
    /// Completed frames held while this tool is busy.
    #[arg(long, default_value_t = 2)]
    queue: usize,
    /// The device's link MTU, which sets its payload per packet (programmed with
    /// `--device`): 1408 bytes at 1500, 4096 from 4170 (jumbo frames, loopback).
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// Exit once this many frames have arrived, checked or dropped (0: run until the stream
    /// stops for `--idle` seconds). A stream that stops short ends after `--idle` with what
    /// arrived, and exit status 1.
    #[arg(long, default_value_t = 0)]
    frames: u64,
    /// Exit when no frame came for this many seconds (0: never). Default: 5 with `--frames`,
    /// so that a sender that stops early cannot leave the receiver waiting; never without.
    #[arg(long)]
    idle: Option<f64>,
    /// Print JSON: a description of the receiver, one object per frame, then a summary.
    #[arg(long)]
    json: bool,
    /// Do not check frames' CRC: measure the receive path alone.
    #[arg(long)]
    no_check: bool,
    /// Older bridges' immediate layout (psn << 8 | buffer).
    #[arg(long)]
    buffer8: bool,
    /// Write every packet sent and received to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Send every packet as its own datagram: no UDP GSO, even where the path allows it.
    #[arg(long = "no-gso")]
    no_gso: bool,

    /// Print the NIC's counters at exit, as `rdma statistic show` does.
    #[arg(long)]
    stats: bool,
    /// Deliver frames into this CUDA device's memory (staged in host pages) and check
    /// each frame's content from there. Needs a build with `--features cuda`.
    #[arg(long, value_name = "ORDINAL")]
    cuda: Option<u32>,
}

/// Flags of `stream send`.
#[derive(Args)]
pub(crate) struct SendArgs {
    /// The device's address: its control port (8192) and data port (12288) bind here.
    #[arg(long, default_value = "127.0.0.1")]
    local: IpAddr,
    /// Serve the control protocol on this port.
    #[arg(long, default_value_t = CONTROL_PORT)]
    control_port: u16,
    /// Frames per second (0: as fast as the socket takes them).
    #[arg(long, default_value_t = 30.0)]
    fps: f64,
    /// Frames to send (0: until killed).
    #[arg(long, default_value_t = 0)]
    frames: u64,
    /// Fill frames with the test pattern (the default).
    #[arg(long, conflicts_with = "file")]
    pattern: bool,
    /// Send this file's bytes, a frame at a time, over and over.
    #[arg(long)]
    file: Option<PathBuf>,
    /// The link MTU, which sets the payload per packet when not programmed (with `--to`).
    #[arg(long, default_value_t = 1500)]
    mtu: usize,
    /// Fold the frame's tail and metadata into one packet, as the bridge's emulator does.
    #[arg(long)]
    fold: bool,
    /// Stream at once to this receiver (`ADDR` or `ADDR:PORT`) instead of waiting to be
    /// programmed; needs `--qp`, `--rkey`, `--address` and `--frame-size`.
    #[arg(long, requires_all = ["qp", "rkey", "address", "frame_size"])]
    to: Option<String>,
    /// The receiver's queue pair (with `--to`).
    #[arg(long, value_parser = parse_u32)]
    qp: Option<u32>,
    /// The receiver's key (with `--to`).
    #[arg(long, value_parser = parse_u32)]
    rkey: Option<u32>,
    /// Page 0's address (with `--to`).
    #[arg(long, value_parser = parse_u64)]
    address: Option<u64>,
    /// Bytes of data per frame (with `--to`).
    #[arg(long)]
    frame_size: Option<usize>,
    /// Pages in the receiver's ring (with `--to`).
    #[arg(long, default_value_t = 4)]
    pages: u32,
    /// Bytes from page to page (with `--to`; default: the bridge's layout).
    #[arg(long)]
    page_size: Option<usize>,
    /// Inject faults on every packet sent: loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N.
    #[arg(long)]
    fault: Option<Faults>,
    /// Write every packet sent to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Send every packet as its own datagram: no UDP GSO, even where the path allows it.
    #[arg(long = "no-gso")]
    no_gso: bool,

    /// Print JSON lines: one per frame sent and a summary.
    #[arg(long)]
    json: bool,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    parse_u64(s).and_then(|v| u32::try_from(v).map_err(|_| format!("{s} exceeds 32 bits")))
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s}: {e}"))
}

/// Parses ADDR or ADDR:PORT.
fn socket_addr(text: &str, default_port: u16) -> anyhow::Result<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let ip: IpAddr = text
        .parse()
        .with_context(|| format!("{text} is neither ADDR nor ADDR:PORT"))?;
    Ok(SocketAddr::new(ip, default_port))
}

/// Runs `ferroce stream …`.
pub(crate) fn run(command: &StreamCommand) -> ExitCode {
    let result = match command {
        StreamCommand::Recv(args) => recv(args),
        StreamCommand::Send(args) => send(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferroce stream: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// What the consumer of a stream saw.
#[derive(Debug, Default)]
struct Tally {
    frames: u64,
    bytes: u64,
    dropped: u64,
    packets_lost: u64,
    content_errors: u64,
    incomplete: u64,
    /// Frames the device overwrote before they could be copied.
    overtaken: u64,
    restarts: u64,
    first: Option<Instant>,
    last: Option<Instant>,
}

impl Tally {
    /// Frames that arrived: those checked (or counted) and those dropped before this tool
    /// took them, because its queue was full or the device overwrote their page.
    fn arrived(&self) -> u64 {
        self.frames + self.dropped
    }

    fn seconds(&self) -> f64 {
        match (self.first, self.last) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Frames per second between the first frame and the last.
    fn fps(&self) -> f64 {
        let s = self.seconds();
        if s > 0.0 {
            (self.frames.saturating_sub(1)) as f64 / s
        } else {
            0.0
        }
    }

    fn gbps(&self) -> f64 {
        let s = self.seconds();
        if s > 0.0 && self.frames > 1 {
            self.bytes as f64 * 8.0 / s / 1e9 * (self.frames - 1) as f64 / self.frames as f64
        } else {
            0.0
        }
    }

    fn summary(&self) -> serde_json::Value {
        json!({
            "frames": self.frames,
            "fps": round2(self.fps()),
            "gbps": round2(self.gbps()),
            "dropped": self.dropped,
            "packets_lost": self.packets_lost,
            "content_errors": self.content_errors,
            "incomplete_frames": self.incomplete,
            "restarts": self.restarts,
        })
    }

    fn line(&self) -> String {
        format!(
            "{} frames, {:.1} fps, {:.2} Gb/s, {} dropped, {} packets lost, {} content errors",
            self.frames,
            self.fps(),
            self.gbps(),
            self.dropped,
            self.packets_lost,
            self.content_errors
        )
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Counts a frame without touching its data (at most `frame_size` of its bytes).
fn count(frame: &FrameInfo, frame_size: usize, tally: &mut Tally) {
    let now = Instant::now();
    tally.first.get_or_insert(now);
    tally.last = Some(now);
    tally.frames += 1;
    tally.bytes += frame.metadata.bytes_written.min(frame_size as u64);
    tally.dropped = frame.dropped + tally.overtaken;
    tally.packets_lost += frame.packets_lost;
    tally.incomplete += u64::from(!frame.is_complete());
}

/// CPU time this process has used (user + system), from `/proc/self/stat`: Linux counts it
/// in ticks of 1/100 s (USER_HZ).
fn cpu_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces; fields resume after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    Some((ticks(11)? + ticks(12)?) / 100.0)
}

/// Takes one frame: checks its data against the CRC the device put in the metadata, and
/// counts it. Returns the CRC-32 of the data, or `None` when the device overtook the frame
/// (counted as dropped).
fn take(rx: &Receiver, frame: &FrameInfo, tally: &mut Tally) -> Option<u32> {
    let len = usize::try_from(frame.metadata.bytes_written)
        .unwrap_or(usize::MAX)
        .min(rx.frame_size());
    // The CRC reads the frame where it landed: a copy out first cost the check three times
    // the memory traffic (BENCHMARKS.md, the data path's sixteenth step).
    let mut crc = crc32fast::Hasher::new();
    if rx
        .inspect_frame(frame, len, |piece| crc.update(piece))
        .is_err()
    {
        // The device has moved on to this page again: this tool fell a ring behind.
        tally.overtaken += 1;
        tally.dropped = frame.dropped + tally.overtaken;
        return None;
    }
    count(frame, rx.frame_size(), tally);
    let crc = crc.finalize();
    // The device's JAMCRC is the CRC-32 without its final inversion; 0 means it sent none.
    if frame.metadata.crc != 0 && frame.metadata.crc != !crc {
        tally.content_errors += 1;
    }
    Some(crc)
}

fn frame_json(frame: &FrameInfo, crc: u32) -> serde_json::Value {
    let received = frame
        .received
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let md = &frame.metadata;
    json!({
        "frame_number": frame.frame_number,
        "received_frame_number": frame.received_frame_number,
        "page": frame.page,
        "imm": frame.imm,
        "psn": md.psn,
        "flags": md.flags,
        "crc": md.crc,
        "timestamp_s": md.timestamp_s,
        "timestamp_ns": md.timestamp_ns,
        "metadata_s": md.metadata_s,
        "metadata_ns": md.metadata_ns,
        "bytes_written": md.bytes_written,
        "received_s": received.as_secs(),
        "received_ns": received.subsec_nanos(),
        "dropped": frame.dropped,
        "packets_received": frame.packets_received,
        "packets_lost": frame.packets_lost,
        "bytes_received": frame.bytes_received,
        "metadata_psn_matches": frame.metadata_psn_matches,
        "data_crc32": crc,
    })
}

/// Starts `rx` and its monitor thread.
fn start(
    rx: &Receiver,
    nic: &Nic,
    config: ReceiverConfig,
) -> anyhow::Result<JoinHandle<Result<(), MonitorError>>> {
    rx.start(nic, config).context("cannot start the receiver")?;
    let monitor = rx.clone();
    std::thread::Builder::new()
        .name("ferroce monitor".into())
        .spawn(move || monitor.blocking_monitor())
        .context("cannot start the monitor thread")
}

fn receiver_config(
    args: &RecvArgs,
    peer: IpAddr,
    device: Option<&Arc<dyn DeviceMemory>>,
) -> ReceiverConfig {
    let mut config = ReceiverConfig::for_frames(args.frame_size, args.pages, peer);
    config.queue_size = args.queue;
    if args.buffer8 {
        config.immediate = ImmediateLayout::Buffer8;
    }
    config.device_memory = device.cloned();
    config
}

/// The CUDA memory `--cuda` asks for: room for the ring `start` will want.
fn cuda_memory(args: &RecvArgs) -> anyhow::Result<Option<Arc<dyn DeviceMemory>>> {
    let Some(ordinal) = args.cuda else {
        return Ok(None);
    };
    // Only the ring's size is wanted here: any peer address does.
    let any = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let probe = ReceiverConfig::for_frames(args.frame_size, args.pages, any);
    let ring = probe.page_size * args.pages as usize;
    #[cfg(feature = "cuda")]
    {
        let memory = ferroce::cuda::CudaMemory::alloc(ordinal, ring)
            .with_context(|| format!("--cuda {ordinal}: cannot have {ring} bytes for the ring"))?;
        Ok(Some(Arc::new(memory)))
    }
    #[cfg(not(feature = "cuda"))]
    {
        bail!(
            "--cuda {ordinal}: this ferroce was built without CUDA ({ring} bytes of device \
             memory wanted); build it with `cargo build --release --features cuda`"
        )
    }
}

fn program(rx: &Receiver, device: SocketAddr, mtu: usize) -> anyhow::Result<()> {
    let local = rx.local_addr()?;
    let IpAddr::V4(host_ip) = local.ip() else {
        bail!("the bridge's control protocol carries IPv4 host addresses only");
    };
    let mut channel = DataChannel::new(device)?;
    channel
        .configure_roce(&RoceChannel {
            qp: rx.qp_number()?,
            rkey: rx.rkey()?,
            address: rx.external_frame_memory()?,
            frame_size: rx.frame_size(),
            page_size: rx.page_size(),
            pages: rx.pages(),
            payload: Target::payload_for_mtu(mtu),
            host_ip,
            host_mac: [0; 6],
            host_port: local.port(),
        })
        .with_context(|| format!("cannot program the device at {device}"))
}

fn describe(rx: &Receiver, peer: IpAddr) -> anyhow::Result<serde_json::Value> {
    let local = rx.local_addr()?;
    Ok(json!({
        "qp": rx.qp_number()?,
        "rkey": rx.rkey()?,
        "address": rx.external_frame_memory()?,
        "page_size": rx.page_size(),
        "pages": rx.pages(),
        "frame_size": rx.frame_size(),
        "metadata_offset": rx.metadata_offset(),
        "ip": local.ip().to_string(),
        "udp_port": local.port(),
        "peer": peer.to_string(),
        "device_memory": rx.device_memory().map(|d| json!({
            "device": d.describe(),
            "address": d.address(),
        })),
    }))
}

fn recv(args: &RecvArgs) -> anyhow::Result<ExitCode> {
    let device = args
        .device
        .as_deref()
        .map(|d| socket_addr(d, CONTROL_PORT))
        .transpose()?;
    let Some(peer) = args.peer.or(device.map(|d| d.ip())) else {
        bail!("say where frames come from: --peer ADDR, or --device ADDR to program one");
    };
    let soft = NicConfig {
        addr: SocketAddr::new(
            args.local.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ROCE_PORT,
        ),
        faults: None,
        pcap: args.pcap.clone(),
        gso: !args.no_gso,
        gro: true,
        progress_priority: true,
    };
    let options = ferroce::DeviceOptions {
        port: args.ib_port,
        gid_index: None,
        local: args.local,
    };
    let nic = Nic::open_device(&args.ib_dev, &options, &soft)
        .with_context(|| format!("cannot open device {}", args.ib_dev))?;
    crate::refuse_soft_only(&nic, false, args.pcap.is_some()).map_err(anyhow::Error::msg)?;
    let cuda = cuda_memory(args)?;
    let rx = Receiver::new();
    // Starts the receiver and its monitor, and programs the device to send to it: at first,
    // and again after the receive path failed.
    let bring_up = || -> anyhow::Result<_> {
        let monitor = start(&rx, &nic, receiver_config(args, peer, cuda.as_ref()))?;
        if let Some(device) = device {
            program(&rx, device, args.mtu)?;
        }
        Ok(monitor)
    };
    let mut monitor = Some(bring_up()?);
    let described = describe(&rx, peer)?;
    if args.json {
        println!("{described}");
    } else {
        eprintln!(
            "stream recv: QP {:#x}, rkey {:#x}, {} pages of {} bytes at {:#x} on {}, frames of {} \
             bytes from {peer}",
            rx.qp_number()?,
            rx.rkey()?,
            rx.pages(),
            rx.page_size(),
            rx.external_frame_memory()?,
            nic.addr(),
            rx.frame_size()
        );
    }
    let mut tally = Tally::default();
    let live = !args.json && io::stderr().is_terminal();
    let mut last_print = Instant::now();
    let mut last_frame = Instant::now();
    let mut out = io::stdout().lock();
    let idle = args
        .idle
        .unwrap_or(if args.frames > 0 { DEFAULT_IDLE } else { 0.0 });
    loop {
        if args.frames > 0 && tally.arrived() >= args.frames {
            break;
        }
        if idle > 0.0 && last_frame.elapsed().as_secs_f64() > idle {
            break;
        }
        if rx.receive_path_failed() {
            // Recover as Hololink's receiver allows: a fresh start, once the cause has gone.
            let why = rx.failure().unwrap_or_default();
            if let Some(m) = monitor.take() {
                let _ = m.join();
            }
            // A NIC that failed for good (a socket error, a device gone) cannot come back.
            if let Some(fatal) = nic.failure() {
                bail!("the receive path failed ({why}) and the NIC cannot recover: {fatal}");
            }
            eprintln!("stream recv: {why}; restarting when the address is back");
            while nic.address_gone() {
                std::thread::sleep(Duration::from_millis(100));
            }
            monitor = Some(bring_up()?);
            tally.restarts += 1;
            eprintln!("stream recv: restarted, QP {:#x}", rx.qp_number()?);
            continue;
        }
        if let Some(frame) = rx.next_frame(Duration::from_millis(100))? {
            last_frame = Instant::now();
            if args.no_check {
                count(&frame, rx.frame_size(), &mut tally);
                continue;
            }
            let crc = take(&rx, &frame, &mut tally);
            if let (true, Some(crc)) = (args.json, crc) {
                writeln!(out, "{}", frame_json(&frame, crc))?;
            }
        }
        if live && last_print.elapsed() >= Duration::from_millis(500) {
            last_print = Instant::now();
            eprint!("\r{}   ", tally.line());
        }
    }
    rx.close();
    if let Some(m) = monitor.take() {
        let _ = m.join();
    }
    if live {
        eprintln!();
    }
    if args.json {
        let mut summary = tally.summary();
        summary["counters"] = counters_json(&rx, &nic);
        if let Some(cpu) = cpu_seconds() {
            summary["cpu_seconds"] = json!(round2(cpu));
        }
        writeln!(out, "{summary}")?;
    } else {
        eprintln!("stream recv: {}", tally.line());
    }
    if args.stats {
        eprintln!("{}", nic.statistics_line(nic.device_name()));
    }
    let short = args.frames > 0 && tally.arrived() < args.frames;
    if short {
        eprintln!(
            "stream recv: the stream stopped after {} of {} frames (none for {idle} s)",
            tally.arrived(),
            args.frames
        );
    }
    Ok(if tally.content_errors > 0 || short {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn counters_json(rx: &Receiver, nic: &Nic) -> serde_json::Value {
    let c = rx.counters();
    let n = nic.counters();
    json!({
        "frames": c.frames,
        "frames_dropped": c.frames_dropped,
        "incomplete_frames": c.incomplete_frames,
        "packets": c.packets,
        "packets_lost": c.packets_lost,
        "late_packets": c.late_packets,
        "page_out_of_range": c.page_out_of_range,
        "write_crosses_page": c.write_crosses_page,
        "page_mismatch": c.page_mismatch,
        "metadata_misplaced": c.metadata_misplaced,
        "metadata_psn_mismatch": c.metadata_psn_mismatch,
        "icrc_err": n.icrc_err,
        "unknown_qp": n.unknown_qp,
        "wrong_source": n.wrong_source,
        "uc_access_err": n.uc_access_err,
        "malformed_pkts": n.malformed_pkts,
    })
}

/// Where the frames' bytes come from.
enum Source {
    Pattern(Pattern),
    File(Vec<u8>),
}

impl Source {
    /// A file's frame `frame_number` into `out`; a pattern's frames are filled as they are
    /// sent ([`Sender::send_frame_filled`]).
    fn fill(&self, frame_number: u32, out: &mut [u8]) {
        match self {
            Self::Pattern(p) => p.fill(frame_number, out),
            Self::File(bytes) => {
                // Frame n takes the file's n-th frame-sized slice, wrapping around.
                let start = (frame_number as usize * out.len()) % bytes.len();
                for (i, b) in out.iter_mut().enumerate() {
                    *b = bytes[(start + i) % bytes.len()];
                }
            }
        }
    }
}

/// How the device side streams: shared by `stream send` and `demo`.
struct Streamer {
    fps: f64,
    frames: u64,
    json: bool,
    source: Source,
    /// `--fold`, kept when a host programs the device again (the registers do not say it).
    fold: bool,
}

/// What a device following its registers does next: [`Schedule::observe`]'s answer.
#[derive(Debug, PartialEq, Eq)]
enum Change {
    /// Nothing changed: stream on to the same target.
    None,
    /// The host stopped the device (or has not finished programming it): wait.
    Unprogrammed,
    /// A host programmed the device, after it was stopped or with another target: stream
    /// to this one, the pacing starting over from now.
    Programmed(Target),
}

/// When each frame is due, and the target the registers last named: a device streams at
/// `fps` from the moment it is programmed, the nth frame due `n / fps` after it.
///
/// Each (re)programming starts the schedule again. Before it did, the frames a device was
/// stopped for were still owed when a host programmed it again: every frame was overdue,
/// each went out as soon as the one before had been paced over its 80% of the frame time,
/// and the device ran at 1.25 times `fps` (36 fps at 30) until it had made up the pause.
#[derive(Debug)]
struct Schedule {
    period: Option<Duration>,
    /// When the current programming began: frame `frames` is due `frames × period` after.
    epoch: Instant,
    /// Frames sent since `epoch`.
    frames: u64,
    /// The registers' generation last looked at.
    generation: Option<u64>,
    /// The target the registers named then (`None`: unprogrammed), as they name it
    /// (without `--fold`).
    programmed: Option<Target>,
}

impl Schedule {
    /// A schedule at `fps` (0: no pacing) starting at `now`, for a device programmed with
    /// `target`.
    fn new(fps: f64, target: Target, now: Instant) -> Self {
        Self {
            period: (fps > 0.0).then(|| Duration::from_secs_f64(1.0 / fps)),
            epoch: now,
            frames: 0,
            generation: None,
            programmed: Some(Target {
                fold_metadata: false,
                ..target
            }),
        }
    }

    /// The frame time, if paced.
    fn period(&self) -> Option<Duration> {
        self.period
    }

    /// When the next frame is due (`None`: at once).
    fn due(&self) -> Option<Instant> {
        self.period
            .map(|p| self.epoch + p.mul_f64(self.frames as f64))
    }

    /// Counts a frame sent.
    fn sent(&mut self) {
        self.frames += 1;
    }

    /// Looks at the registers at `now`: their `generation`, and the `target` they describe
    /// (asked only when the generation moved). A new programming restarts the schedule.
    fn observe(
        &mut self,
        now: Instant,
        generation: u64,
        target: impl FnOnce() -> Option<Target>,
    ) -> Change {
        if self.generation != Some(generation) {
            self.generation = Some(generation);
            let current = target();
            if current != self.programmed {
                self.programmed = current;
                if let Some(t) = current {
                    self.epoch = now;
                    self.frames = 0;
                    return Change::Programmed(t);
                }
            }
        }
        if self.programmed.is_some() {
            Change::None
        } else {
            Change::Unprogrammed
        }
    }
}

/// What `stream send` says when a host programs it (first or again).
fn programmed_line(target: &Target, fps: f64) -> String {
    format!(
        "stream send: frames of {} bytes to {} QP {:#x}, {} pages, {} bytes per packet, {} fps",
        target.frame_size, target.dest, target.qp, target.pages, target.payload, fps
    )
}

impl Streamer {
    /// Streams to `target`, following the registers when `registers` is given (a host that
    /// reprograms or stops the device is obeyed, and each new target announced on stderr).
    /// Stops after `frames` frames or when `stop` is set. Returns frames sent and seconds
    /// taken.
    fn stream(
        &self,
        sender: &mut Sender,
        registers: Option<&DeviceRegisters>,
        stop: &AtomicBool,
    ) -> anyhow::Result<(u64, f64)> {
        let start = Instant::now();
        let mut schedule = Schedule::new(self.fps, *sender.target(), start);
        // A sensor's readout takes most of its frame time; pace the packets over 80% of it.
        let pace = schedule.period().map(|p| p.mul_f64(0.8));
        // A file's frame, copied out of the file (a pattern's are filled as they are sent).
        let mut data = Vec::new();
        // A pattern's CRCs are worked out, not read: a third of the sender's time otherwise.
        let mut crcs = PatternCrcs::new();
        let mut sent = 0u64;
        let mut complained = false;
        let mut out = io::stdout().lock();
        while (self.frames == 0 || sent < self.frames) && !stop.load(Ordering::SeqCst) {
            if let Some(regs) = registers {
                match schedule.observe(Instant::now(), regs.generation(), || regs.target()) {
                    Change::None => {}
                    Change::Unprogrammed => {
                        // Unprogrammed: wait until a host points us somewhere again.
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    Change::Programmed(t) => {
                        let t = Target {
                            fold_metadata: self.fold,
                            ..t
                        };
                        // Pages start again at 0 for the new receiver; PSNs run on.
                        sender.retarget(t)?;
                        eprintln!("{}", programmed_line(&t, self.fps));
                    }
                }
            }
            if let Some(due) = schedule.due() {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            let number = sent as u32;
            let frame_size = sender.target().frame_size;
            let sending = match self.source {
                // Each batch written just before it leaves, still in the cache for the
                // socket's copy (BENCHMARKS.md, the data path's sixteenth step).
                Source::Pattern(p) => sender.send_frame_filled(
                    frame_size,
                    pace,
                    &mut |at, piece| p.fill_at(number, at, piece),
                    &mut |at, bytes| crcs.crc(p, number, at, bytes),
                ),
                Source::File(_) => {
                    data.resize(frame_size, 0);
                    self.source.fill(number, &mut data);
                    sender.send_frame(&data, pace)
                }
            };
            let frame = match sending {
                Ok(frame) => frame,
                // A device keeps streaming whatever the network does (its host's address
                // gone, say); say so once and go on.
                Err(e @ ferroce::frames::SendError::Io { .. }) => {
                    if !complained {
                        eprintln!("stream send: {e}; still trying");
                        complained = true;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            complained = false;
            sent += 1;
            schedule.sent();
            if self.json {
                writeln!(
                    out,
                    "{}",
                    json!({"frame_number": frame.frame_number, "page": frame.page, "psn": frame.psn,
                           "packets": frame.packets, "bytes": frame.bytes, "data_crc32": frame.crc32})
                )?;
            }
        }
        sender.flush()?;
        Ok((sent, start.elapsed().as_secs_f64()))
    }
}

fn source(args: &SendArgs) -> anyhow::Result<Source> {
    match &args.file {
        Some(path) => {
            let bytes =
                fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            if bytes.is_empty() {
                bail!("{} is empty", path.display());
            }
            Ok(Source::File(bytes))
        }
        None => Ok(Source::Pattern(Pattern::Counter)),
    }
}

fn send(args: &SendArgs) -> anyhow::Result<ExitCode> {
    let streamer = Streamer {
        fps: args.fps,
        frames: args.frames,
        json: args.json,
        source: source(args)?,
        fold: args.fold,
    };
    let data_addr = SocketAddr::new(args.local, BRIDGE_DATA_PORT);
    let (registers, target) = if let Some(to) = &args.to {
        let frame_size = args.frame_size.unwrap_or_default();
        let page_size = args
            .page_size
            .unwrap_or(ferroce::frames::round_up(frame_size) + ferroce::frames::METADATA_SIZE);
        let target = Target {
            dest: socket_addr(to, ROCE_PORT)?,
            qp: args.qp.unwrap_or_default(),
            rkey: args.rkey.unwrap_or_default(),
            address: args.address.unwrap_or_default(),
            page_size,
            pages: args.pages,
            frame_size,
            payload: Target::payload_for_mtu(args.mtu),
            immediate: ImmediateLayout::Page12,
            fold_metadata: args.fold,
        };
        (None, target)
    } else {
        let control = SocketAddr::new(args.local, args.control_port);
        let registers = DeviceRegisters::serve(control)
            .with_context(|| format!("cannot serve the control protocol on {control}"))?;
        eprintln!("stream send: waiting to be programmed on {control}");
        let mut target = loop {
            if let Some(t) = registers.wait_programmed(Duration::from_secs(3600)) {
                break t;
            }
        };
        target.fold_metadata = args.fold;
        (Some(registers), target)
    };
    let mut sender = Sender::open(data_addr, target, !args.no_gso)?;
    sender.set_faults(args.fault);
    if let Some(path) = &args.pcap {
        sender.set_pcap(path)?;
    }
    eprintln!("{}", programmed_line(&target, args.fps));
    let stop = AtomicBool::new(false);
    let (frames, seconds) = streamer.stream(&mut sender, registers.as_ref(), &stop)?;
    let gbps = if seconds > 0.0 {
        frames as f64 * target.frame_size as f64 * 8.0 / seconds / 1e9
    } else {
        0.0
    };
    if args.json {
        println!(
            "{}",
            json!({"frames": frames, "seconds": round2(seconds), "gbps": round2(gbps),
                   "packets": sender.packets_sent()})
        );
    } else {
        eprintln!(
            "stream send: {frames} frames in {seconds:.2} s ({:.1} fps, {gbps:.2} Gb/s), {} packets",
            if seconds > 0.0 { frames as f64 / seconds } else { 0.0 },
            sender.packets_sent()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `ferroce demo`: a device and a receiver on loopback, 4K RAW12 frames for a few seconds,
/// every frame checked.
pub(crate) fn demo(json_out: bool) -> ExitCode {
    match run_demo(json_out) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ferroce demo: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Frames the demo streams, and at what rate: 3 seconds of film rate, which both ends fit
/// on two cores together (BENCHMARKS.md has the ceiling).
const DEMO_FRAMES: u64 = 72;
const DEMO_FPS: f64 = 24.0;

fn run_demo(json_out: bool) -> anyhow::Result<ExitCode> {
    let host = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let nic = Nic::open(&NicConfig::on(host))?;
    // The device: its register map on an ephemeral control port, programmed as a host
    // programs a real bridge.
    let registers = DeviceRegisters::serve(SocketAddr::new(host, 0))?;
    let rx = Receiver::new();
    // Four pages: one being written, two waiting, one being copied.
    let mut config = ReceiverConfig::for_frames(FRAME_4K_RAW12, 4, host);
    config.queue_size = 2;
    let monitor = start(&rx, &nic, config)?;
    program(&rx, registers.addr(), 9000)?;
    let target = registers
        .wait_programmed(Duration::from_secs(5))
        .context("the device was not programmed")?;
    let mut sender = Sender::new(SocketAddr::new(host, 0), target)?;
    // On loopback the receiver's socket is the only buffer between the two ends, and an
    // unprivileged process gets only net.core.rmem_max of it: keep the packets in flight
    // within what it holds (a quarter of the granted bytes, at 16 KiB of kernel memory per
    // 4 KiB packet), paced by the packets the receiving NIC has taken.
    let granted = nic.grow_buffers(2 * rx.page_size()).unwrap_or(0);
    let window = u32::try_from(granted / 4 / (16 << 10))
        .unwrap_or(u32::MAX)
        .max(4);
    let taken_by = nic.clone();
    sender.set_window(Some((
        window,
        Arc::new(move || taken_by.counters().rcvd_pkts) as ferroce::frames::Taken,
    )));
    if !json_out {
        eprintln!(
            "ferroce demo: {DEMO_FRAMES} frames of 3840x2160 RAW12 ({} bytes) at {DEMO_FPS} fps over \
             RoCEv2 on loopback: device {} -> QP {:#x} on {}",
            FRAME_4K_RAW12,
            sender.local_addr(),
            target.qp,
            nic.addr()
        );
    }
    let stop = Arc::new(AtomicBool::new(false));
    let device = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("ferroce device".into())
            .spawn(move || {
                let streamer = Streamer {
                    fps: DEMO_FPS,
                    frames: DEMO_FRAMES,
                    json: false,
                    source: Source::Pattern(Pattern::Counter),
                    fold: false,
                };
                streamer.stream(&mut sender, None, &stop)
            })?
    };
    let mut tally = Tally::default();
    let mut last = Instant::now();
    let live = !json_out && io::stderr().is_terminal();
    while tally.arrived() < DEMO_FRAMES {
        match rx.next_frame(Duration::from_millis(100))? {
            Some(frame) => {
                last = Instant::now();
                // Checked against the CRC the device computed over what it sent.
                take(&rx, &frame, &mut tally);
            }
            None if last.elapsed() > Duration::from_secs(3) => break,
            None => {}
        }
        if rx.receive_path_failed() {
            break;
        }
        if live {
            eprint!("\r{}   ", tally.line());
        }
    }
    stop.store(true, Ordering::SeqCst);
    let sent = device
        .join()
        .map_err(|_| anyhow::anyhow!("the device thread panicked"))??;
    rx.close();
    let _ = monitor.join();
    if live {
        eprintln!();
    }
    // Frames the device sent that never completed here are dropped frames too.
    tally.dropped = tally.dropped.max(sent.0.saturating_sub(tally.frames));
    if json_out {
        println!("{}", tally.summary());
    } else {
        println!("ferroce demo: {}", tally.line());
    }
    let ok = tally.frames > 0 && tally.content_errors == 0 && !rx.receive_path_failed();
    if let Some(why) = rx.failure() {
        eprintln!("ferroce demo: the receive path failed: {why}");
    } else if !ok {
        let c = rx.counters();
        eprintln!(
            "ferroce demo: {} frames arrived damaged ({} packets lost; the receiver fell behind \
             the device: is this a release build, on an idle machine?)",
            tally.content_errors, c.packets_lost
        );
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(dest: &str, qp: u32) -> Target {
        Target {
            dest: dest.parse().unwrap(),
            qp,
            rkey: 0x1234,
            address: 0x10_0000,
            page_size: 10_112,
            pages: 4,
            frame_size: 10_000,
            payload: 1408,
            immediate: ImmediateLayout::Page12,
            fold_metadata: false,
        }
    }

    /// Sends `n` frames on `schedule`, each at the moment it is due (a virtual clock: no
    /// sleeping), and returns those moments.
    fn send(schedule: &mut Schedule, n: usize) -> Vec<Instant> {
        (0..n)
            .map(|_| {
                let due = schedule.due().unwrap();
                schedule.sent();
                due
            })
            .collect()
    }

    /// Issue 25: a device unprogrammed for a while, then programmed again, ran at 1.25 ×
    /// `--fps` because the frames of the pause were still owed. The schedule starts again at
    /// each programming: the first frame is due at once, the rest one frame time apart.
    #[test]
    fn programming_again_restarts_the_schedule() {
        let t0 = Instant::now();
        let first = target("127.0.0.1:4791", 0x11);
        let mut schedule = Schedule::new(30.0, first, t0);
        let period = schedule.period().unwrap();
        assert_eq!(schedule.observe(t0, 1, || Some(first)), Change::None);
        let dues = send(&mut schedule, 5);
        assert_eq!(dues[0], t0);
        assert_eq!(dues[4], t0 + period * 4);

        // A host unconfigures the device: it waits, however long, whatever it is asked.
        let stopped = t0 + Duration::from_millis(200);
        assert_eq!(schedule.observe(stopped, 2, || None), Change::Unprogrammed);
        let later = stopped + Duration::from_secs(5);
        assert_eq!(
            schedule.observe(later, 2, || unreachable!()),
            Change::Unprogrammed
        );

        // Another host programs it.
        let second = target("127.0.0.2:4791", 0x12);
        let again = later + Duration::from_millis(7);
        assert_eq!(
            schedule.observe(again, 3, || Some(second)),
            Change::Programmed(second)
        );
        let dues = send(&mut schedule, 12);
        assert_eq!(
            dues[0], again,
            "the first frame after programming is due at once"
        );
        for pair in dues.windows(2) {
            assert_eq!(pair[1] - pair[0], period);
        }
        let mean = (dues[11] - dues[0]) / 11;
        assert_eq!(mean, period, "{mean:?} between frames at 30 fps");
    }

    /// The same target programmed again after a stop is a new programming too; a target
    /// rewritten while streaming, but unchanged, is not.
    #[test]
    fn the_same_target_after_a_stop_is_programmed_anew() {
        let t0 = Instant::now();
        let t = target("127.0.0.1:4791", 0x11);
        let mut schedule = Schedule::new(30.0, t, t0);
        send(&mut schedule, 3);
        assert_eq!(schedule.observe(t0, 5, || Some(t)), Change::None);
        assert_eq!(schedule.due(), Some(t0 + schedule.period().unwrap() * 3));
        assert_eq!(schedule.observe(t0, 6, || None), Change::Unprogrammed);
        let later = t0 + Duration::from_secs(2);
        assert_eq!(
            schedule.observe(later, 7, || Some(t)),
            Change::Programmed(t)
        );
        assert_eq!(schedule.due(), Some(later));
    }

    /// `--fold` is the device's own: a target the registers name is the same target whether
    /// or not the device folds.
    #[test]
    fn fold_is_not_a_new_target() {
        let t0 = Instant::now();
        let folded = Target {
            fold_metadata: true,
            ..target("127.0.0.1:4791", 0x11)
        };
        let mut schedule = Schedule::new(0.0, folded, t0);
        assert_eq!(schedule.due(), None);
        let from_registers = target("127.0.0.1:4791", 0x11);
        assert_eq!(
            schedule.observe(t0, 1, || Some(from_registers)),
            Change::None
        );
    }
}
