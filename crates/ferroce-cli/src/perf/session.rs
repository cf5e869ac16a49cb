//! `ferroce perf session-lat`: the round trip of the request/reply session (Catalyst's
//! `TransportSession`), in the latency table of the other `perf` latency tests. The client is a
//! controller, the server an echoing coprocessor; the client submits one request at a time and
//! collects its reply. Each sample is one round trip, halved as perftest reports ping-pong latency;
//! the session's own `last_rtt_ns` is checked against the round trip measured around it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use ferroce::nic::active_mtu_on;
use ferroce::proto::qp::Mtu;
use ferroce::session::{
    ChannelDesc, ConnectInfo, Controller, Coprocessor, MemoryKind, SessionError, MAX_MESSAGE,
};
use ferroce::verbs::{describe, SOFT_DEVICE};
use serde_json::{Map, Value};

use super::report::{self, Outcome, RESULT_LINE};

/// How long the client waits for one reply before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// The flags of `perf session-lat`.
#[derive(Args, Debug, Clone)]
pub(crate) struct SessionLatArgs {
    /// The server to connect to; without it, serve as the echoing coprocessor.
    server: Option<String>,
    /// Request (and reply) size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 64)]
    size: u32,
    /// Round trips to measure.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u64,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (the smaller of both sides' wins). Default:
    /// the NIC's active MTU, from its link (1024 at 1500 bytes, 4096 on loopback).
    #[arg(short = 'm', long = "mtu")]
    mtu: Option<u32>,
    /// TCP port of the out-of-band connection.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// The local address: the soft NIC's (127.0.0.1 unless given), or the one whose GID a
    /// verbs device uses.
    #[arg(long = "local")]
    local: Option<IpAddr>,
    /// Write the results as JSON (to --out_json_file).
    #[arg(long = "out_json")]
    out_json: bool,
    /// The JSON file (implies --out_json).
    #[arg(long = "out_json_file")]
    out_json_file: Option<PathBuf>,
    /// Device: `ferroce0` (the soft NIC) or a verbs device (`rxe0`), whose RoCE v2 GID is
    /// that of `--local` when given, else its first IPv4 one.
    #[arg(short = 'd', long = "ib-dev", default_value = "ferroce0")]
    ib_dev: String,
    /// Write every packet sent and received to this pcap file.
    #[arg(long = "pcap")]
    pcap: Option<PathBuf>,
    /// Inject faults on every packet sent: loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N.
    #[arg(long = "fault")]
    fault: Option<ferroce::nic::Faults>,
    /// Print the NIC's counters at exit, as `rdma statistic show` does.
    #[arg(long = "stats")]
    stats: bool,
}

/// The NIC's address: as given; else 127.0.0.1 for the soft NIC, and for a verbs device the
/// unspecified address (its first IPv4 GID).
fn local(a: &SessionLatArgs) -> IpAddr {
    a.local.unwrap_or(if a.ib_dev == SOFT_DEVICE {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    })
}

/// `ConnectInfo` for this side: the device, the MTU, and on the soft NIC the taps asked for.
fn connect_info(a: &SessionLatArgs, oob: SocketAddr, mtu: Mtu) -> ConnectInfo {
    let mut info = ConnectInfo::new(local(a), oob)
        .on_device(&a.ib_dev)
        .with_mtu(mtu);
    if let Some(faults) = a.fault {
        info = info.with_faults(faults);
    }
    if let Some(path) = &a.pcap {
        info = info.with_pcap(path);
    }
    info
}

/// Refuses taps a verbs device cannot honour, once `nic` is open.
fn taps_fit(a: &SessionLatArgs, nic: Option<&ferroce::Nic>) -> Result<(), String> {
    nic.map_or(Ok(()), |nic| {
        crate::refuse_soft_only(nic, a.fault.is_some(), a.pcap.is_some())
    })
}

/// The counters line `--stats` prints at exit.
fn print_stats(a: &SessionLatArgs, nic: Option<&ferroce::Nic>) {
    if let (true, Some(nic)) = (a.stats, nic) {
        println!("{}", nic.statistics_line(&a.ib_dev));
    }
}

/// Runs the test; the error is the message to print.
pub(crate) fn run(a: &SessionLatArgs) -> Result<(), String> {
    if a.size == 0 || a.size > MAX_MESSAGE {
        return Err(format!(" Message size must be 1 to {MAX_MESSAGE} bytes"));
    }
    if a.iters < 5 {
        return Err(" Iterations must be at least 5".into());
    }
    let asked = match a.mtu {
        Some(mtu) => mtu,
        None if a.ib_dev == SOFT_DEVICE => active_mtu_on(local(a)).bytes(),
        // perftest's default: the port's active MTU.
        None => describe(&a.ib_dev)
            .ok()
            .and_then(|d| d.ports.first().and_then(|p| p.active_mtu))
            .map_or(1024, |m| m.bytes()),
    };
    let Some(mtu) = Mtu::from_bytes(asked) else {
        return Err(format!(
            " Invalid MTU {asked}: use 256, 512, 1024, 2048 or 4096"
        ));
    };
    let json = match (&a.out_json_file, a.out_json) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => return Err(" --out_json needs --out_json_file FILE".into()),
        (None, false) => None,
    };
    let desc = ChannelDesc::new(1, a.size, a.size);
    match &a.server {
        Some(server) => client(a, server, desc, mtu, json.as_deref()),
        None => server(a, desc, mtu),
    }
}

fn header(a: &SessionLatArgs, role: &str, mtu: Mtu) {
    println!("{RESULT_LINE}");
    println!("                    Session Latency Test");
    println!(" Role            : {role}\t\tDevice         : {}", a.ib_dev);
    println!(" Slots           : 1\t\tTransport      : RC WRITE with immediate");
    println!(
        " Request size    : {}[B]\tReply size     : {}[B]",
        a.size, a.size
    );
    println!(" Mtu             : {}[B]", mtu.bytes());
    println!(" Link type       : Ethernet");
    println!("{RESULT_LINE}");
}

fn failed(e: &SessionError) -> String {
    format!(" Session failed: {e}")
}

fn server(a: &SessionLatArgs, desc: ChannelDesc, mtu: Mtu) -> Result<(), String> {
    let any = match local(a) {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    // perftest's server waits for its client as long as it takes.
    let info = connect_info(a, SocketAddr::new(any, a.port), mtu)
        .with_timeout(Duration::from_secs(24 * 3600));
    println!();
    println!("************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
    let s = Coprocessor::new().connect(&info).map_err(|e| failed(&e))?;
    taps_fit(a, s.nic())?;
    let (s, mem) = s
        .alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)
        .map_err(|e| failed(&e))?;
    let (s, peer) = s.exchange_keys(&mem).map_err(|e| failed(&e))?;
    let mut s = s
        .establish_channel(&desc, &mem, &peer)
        .and_then(|s| {
            s.set_coprocessor_fn(|request: &[u8], reply: &mut [u8]| {
                reply[..request.len()].copy_from_slice(request);
                Ok(request.len())
            })
        })
        .and_then(Coprocessor::start)
        .map_err(|e| failed(&e))?;
    header(a, "coprocessor", mtu);
    // The engine serves on its own thread until the client stops. Waiting in `collect` for
    // every request would wake this thread once per round trip, on the cores the engine and
    // the client spin on; it looks in now and then instead. Each look takes a core from one
    // of them: at every 5 ms it took the controller's 200 times a second.
    let outcome = loop {
        std::thread::sleep(Duration::from_millis(50));
        match s.peer_gone() {
            None => {}
            Some(reason) if reason.contains("stopped") => break Ok(()),
            Some(reason) => break Err(failed(&SessionError::PeerGone { reason })),
        }
    };
    println!(" Served {} requests", s.served());
    println!("{RESULT_LINE}");
    s.stop();
    print_stats(a, s.nic());
    outcome
}

fn client(
    a: &SessionLatArgs,
    server: &str,
    desc: ChannelDesc,
    mtu: Mtu,
    json: Option<&std::path::Path>,
) -> Result<(), String> {
    let oob = (server, a.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("Couldn't resolve {server}:{}", a.port))?;
    let info = connect_info(a, oob, mtu);
    let s = Controller::new()
        .connect(&info)
        .map_err(|e| format!("Couldn't connect to {server}:{} ({e})", a.port))?;
    taps_fit(a, s.nic())?;
    let (s, mem) = s
        .alloc_memory(desc.region_bytes() as usize, MemoryKind::Host)
        .map_err(|e| failed(&e))?;
    let (s, peer) = s.exchange_keys(&mem).map_err(|e| failed(&e))?;
    let mut s = s
        .establish_channel(&desc, &mem, &peer)
        .and_then(Controller::start)
        .map_err(|e| failed(&e))?;
    header(a, "controller", mtu);
    println!("{}", report::lat_columns(false));
    let request = super::pattern(u64::from(a.size));
    let mut reply = vec![0u8; a.size as usize];
    let mut samples = Vec::with_capacity(a.iters as usize);
    for i in 0..a.iters {
        let started = Instant::now();
        let id = s.submit(&request).map_err(|e| failed(&e))?;
        let got = s
            .collect_timeout(&mut [&mut reply[..]], STALL)
            .map_err(|e| failed(&e))?;
        samples.push(started.elapsed().as_nanos() as u64);
        if got.request != id || got.bytes != request.len() || reply != request {
            return Err(format!(
                " Data check failed: round trip {i} brought back {} bytes for {}",
                got.bytes, got.request
            ));
        }
    }
    let last_rtt = s.last_rtt_ns();
    let last_sample = samples.last().copied().unwrap_or(0);
    super::write_turn_steps()?;
    s.stop();
    print_stats(a, s.nic());
    let r = report::lat_report(u64::from(a.size), a.iters, &samples, 2);
    println!("{}", report::lat_line(&r));
    println!("{RESULT_LINE}");
    let mut sorted = samples.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2];
    let check = check_rtt(last_rtt, last_sample, median);
    println!(
        " last_rtt_ns     : {last_rtt} (round trip measured around it: {last_sample} ns; median round trip {median} ns): {}",
        match &check {
            Check::Consistent => "consistent",
            Check::Unusual(_) => "unusual",
            Check::Inconsistent(_) => "INCONSISTENT",
        }
    );
    if let Some(path) = json {
        let mut info = Map::new();
        info.insert("test".into(), "Session_Latency_Test".into());
        info.insert("Device".into(), a.ib_dev.clone().into());
        info.insert("Role".into(), "controller".into());
        info.insert("Slots".into(), 1.into());
        info.insert("Transport_type".into(), "RC".into());
        info.insert("Mtu".into(), mtu.bytes().into());
        info.insert("Link_type".into(), "Ethernet".into());
        report::write_doc(
            path,
            info,
            &[Outcome::Lat(r)],
            &[("last_rtt_ns", Value::from(last_rtt))],
        )?;
    }
    match check {
        Check::Consistent => Ok(()),
        Check::Unusual(why) => {
            eprintln!(" Warning: last_rtt_ns is unusual: {why}");
            Ok(())
        }
        Check::Inconsistent(why) => Err(format!(" last_rtt_ns is inconsistent: {why}")),
    }
}

/// How `last_rtt_ns` compares with the round trips measured around it.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    /// Inside the last round trip and near the median.
    Consistent,
    /// Possible but far from the median (a scheduling hiccup in either).
    Unusual(String),
    /// Impossible: zero, or longer than the round trip that encloses it.
    Inconsistent(String),
}

/// `last_rtt` was measured inside the last sample (from posting the request to the reply's
/// arrival), so it cannot exceed it; it should be near the median, within a factor of 4.
fn check_rtt(last_rtt: u64, last_sample: u64, median: u64) -> Check {
    // Instant's granularity and the two clocks' reads: a microsecond of slack.
    const SLACK_NS: u64 = 1000;
    if last_rtt == 0 {
        return Check::Inconsistent("it is zero after a completed round trip".into());
    }
    if last_rtt > last_sample + SLACK_NS {
        return Check::Inconsistent(format!(
            "{last_rtt} ns is longer than the {last_sample} ns round trip that encloses it"
        ));
    }
    if last_rtt * 4 < median || last_rtt > median * 4 {
        return Check::Unusual(format!(
            "{last_rtt} ns against a median round trip of {median} ns"
        ));
    }
    Check::Consistent
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtt_checks() {
        assert_eq!(check_rtt(9_000, 10_000, 10_000), Check::Consistent);
        assert!(matches!(
            check_rtt(0, 10_000, 10_000),
            Check::Inconsistent(_)
        ));
        assert!(matches!(
            check_rtt(20_000, 10_000, 10_000),
            Check::Inconsistent(_)
        ));
        assert!(matches!(
            check_rtt(1_000, 10_000, 10_000),
            Check::Unusual(_)
        ));
        assert!(matches!(
            check_rtt(90_000, 100_000, 10_000),
            Check::Unusual(_)
        ));
    }
}
