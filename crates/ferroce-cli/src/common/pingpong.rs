//! What rdma-core's ping-pong tools share, as its `libibverbs/examples/pingpong.{c,h}` holds
//! it for `ibv_rc_pingpong`, `ibv_ud_pingpong` and `ibv_srq_pingpong`: the device flags and
//! opening the device, the work request IDs, posting receives, the send/receive loop, the
//! out-of-band address exchange on TCP (client and server halves), the result lines, and
//! lingering for the peer's last packets before exit.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use ferroce::cq::{Completion, Spin, WcStatus};
use ferroce::exchange::PingpongDest;
use ferroce::qp::{PostError, RecvWr, Sge};
use ferroce::{Cq, DeviceOptions, Nic, NicConfig};

/// The receive and send work request IDs of rdma-core's ping-pong tools.
pub(crate) const RECV_WRID: u64 = 1;
pub(crate) const SEND_WRID: u64 = 2;

/// The device flags of rdma-core's pingpong tools (`-d -i -g`), and ferroce's own for the
/// soft NIC.
#[derive(Args, Debug)]
pub(crate) struct NicFlags {
    /// Device name: `ferroce0` is the soft NIC, any other a verbs device.
    #[arg(short = 'd', long = "ib-dev", default_value = "ferroce0")]
    pub(crate) ib_dev: String,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index on a verbs device (the soft NIC's GID is its address).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// The local address: the soft NIC's (127.0.0.1 unless given), or on a verbs device the
    /// address whose RoCE v2 GID to use.
    #[arg(long = "local")]
    local: Option<IpAddr>,
    /// Print the NIC's counters at exit, as `rdma statistic show` does.
    #[arg(long = "stats")]
    pub(crate) stats: bool,
    /// Write every packet sent and received to this pcap file.
    #[arg(long = "pcap")]
    pcap: Option<std::path::PathBuf>,
    /// Inject faults on every packet sent: loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N.
    #[arg(long = "fault")]
    fault: Option<ferroce::nic::Faults>,
    /// Send every packet as its own datagram: no UDP GSO, even where the path allows it.
    #[arg(long = "no-gso")]
    no_gso: bool,
}

impl NicFlags {
    /// Opens the device, as rdma-core's tools word a failure.
    pub(crate) fn open(&self) -> Result<Nic, String> {
        let config = NicConfig {
            faults: self.fault,
            pcap: self.pcap.clone(),
            gso: !self.no_gso,
            ..NicConfig::on(
                self.local
                    .unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)),
            )
        };
        let device = DeviceOptions {
            port: self.ib_port,
            gid_index: self.gid_idx,
            local: self.local,
        };
        let nic = Nic::open_device(&self.ib_dev, &device, &config)
            .map_err(|e| format!("Couldn't get device {}: {e}", self.ib_dev))?;
        crate::refuse_soft_only(&nic, self.fault.is_some(), self.pcap.is_some())?;
        Ok(nic)
    }

    /// Lingers for the peer's last packets, then prints the counters if asked.
    pub(crate) fn finish(&self, nic: &Nic) {
        linger(nic);
        if self.stats {
            println!("{}", nic.statistics_line(&self.ib_dev));
        }
    }
}

/// Prints `message` to stderr and fails, as rdma-core's ping-pong tools end on an error.
pub(crate) fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{message}");
    ExitCode::FAILURE
}

/// Posts up to `n` receives of `sge` through `post` (a QP's or an SRQ's), stopping at the
/// first refused, as rdma-core's ping-pong tools do; returns how many were posted.
pub(crate) fn post_receives(
    n: u32,
    sge: Sge,
    post: impl Fn(RecvWr) -> Result<(), PostError>,
) -> u32 {
    (0..n)
        .take_while(|_| {
            post(RecvWr {
                wr_id: RECV_WRID,
                sges: vec![sge],
            })
            .is_ok()
        })
        .count() as u32
}

/// How long the pingpong loops wait for a completion before they give up.
const STALL: Duration = Duration::from_secs(10);

/// No completion came for [`STALL`]: says so, as the start of the tools' message.
pub(crate) struct Stalled;

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "No completion for {} s", STALL.as_secs())
    }
}

/// How the pingpong loops wait for each completion: busy polling, as the originals do, or
/// asleep on the CQ's channel with `--events`. Polling, the core goes to another thread between
/// polls only while one needs it (on a machine with fewer cores than busy threads, the peer's:
/// [`Spin`]), and the clock is read at every 32nd empty poll.
pub(crate) struct Waiter {
    events: bool,
    spin: Spin,
    last_progress: Instant,
    progressed: bool,
}

impl Waiter {
    /// A wait whose [`STALL`] counts from `start`.
    pub(crate) fn new(events: bool, start: Instant) -> Self {
        Self {
            events,
            spin: Spin::new(),
            last_progress: start,
            progressed: false,
        }
    }

    /// One poll of `cq` (with `--events` one wait of up to 100 ms): its completion, or `None`.
    ///
    /// # Errors
    ///
    /// [`Stalled`] when no completion has come for [`STALL`].
    pub(crate) fn next(&mut self, cq: &Cq) -> Result<Option<Completion>, Stalled> {
        let completion = if self.events {
            cq.wait(Duration::from_millis(100))
        } else {
            cq.poll()
        };
        if completion.is_some() {
            self.progressed = true;
            return Ok(completion);
        }
        let now = if self.events {
            Some(Instant::now())
        } else {
            self.spin.empty_poll()
        };
        if let Some(now) = now {
            if std::mem::take(&mut self.progressed) {
                self.last_progress = now;
            } else if now - self.last_progress > STALL {
                return Err(Stalled);
            }
        }
        Ok(None)
    }
}

/// The loop `ibv_rc_pingpong` and `ibv_ud_pingpong` share: the client sends first; each side
/// sends again once its last send and receive have both completed, until `iters` of each.
/// `on_recv` sees each receive (with the count before it) and reposts what it needs;
/// `stalled` is what to say after 10 s without a completion (the originals wait for ever for
/// a peer that died, or for a lost datagram). Returns when the loop began, for the result
/// lines.
///
/// # Errors
///
/// The tools' messages: a failed status, an unknown work request, a failed post, or
/// `stalled`.
pub(crate) fn exchange_loop(
    cq: &Cq,
    events: bool,
    iters: u32,
    client: bool,
    send: impl Fn() -> Result<(), String>,
    mut on_recv: impl FnMut(u32) -> Result<(), String>,
    stalled: &str,
) -> Result<Instant, String> {
    let mut pending = RECV_WRID;
    if client {
        send()?;
        pending |= SEND_WRID;
    }
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let start = Instant::now();
    let mut waiter = Waiter::new(events, start);
    while rcnt < iters || scnt < iters {
        let Some(wc) = waiter.next(cq).map_err(|e| format!("{e}: {stalled}"))? else {
            continue;
        };
        if wc.status != WcStatus::Success {
            return Err(format!(
                "Failed status {} ({}) for wr_id {}",
                wc.status,
                wc.status.ibv_value(),
                wc.wr_id
            ));
        }
        match wc.wr_id {
            SEND_WRID => scnt += 1,
            RECV_WRID => {
                on_recv(rcnt)?;
                rcnt += 1;
            }
            other => return Err(format!("Completion for unknown wr_id {other}")),
        }
        pending &= !wc.wr_id;
        if scnt < iters && pending == 0 {
            send()?;
            pending = RECV_WRID | SEND_WRID;
        }
    }
    Ok(start)
}

/// The two result lines all of rdma-core's pingpong tools print.
pub(crate) fn print_result(start: Instant, size: u32, iters: u32) {
    let usec = start.elapsed().as_secs_f64() * 1e6;
    let bytes = u64::from(size) * u64::from(iters) * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{iters} iters in {:.2} seconds = {:.2} usec/iter",
        usec / 1e6,
        usec / f64::from(iters)
    );
}

/// Keeps the NIC answering until the peer has been quiet for a while (at most 2 s): our ACK of
/// its last SEND may have been lost, and a peer retransmitting to a NIC that is gone ends in
/// "retry counter exceeded" although every message arrived. Two ACK timeouts of quiet (the
/// default 67 ms each) mean the peer has its ACK.
pub(crate) fn linger(nic: &Nic) {
    // A verbs device answers in its own driver, and counts nothing here.
    if !nic.caps().manual_progress {
        return;
    }
    let quiet = Duration::from_millis(150);
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut seen = nic.counters().rcvd_pkts;
    while Instant::now() < deadline {
        std::thread::sleep(quiet);
        let now = nic.counters().rcvd_pkts;
        if now == seen {
            break;
        }
        seen = now;
    }
}

/// The client's half: connect, send ours, read `remotes` of theirs, say "done". Every
/// pingpong tool sends one line per QP (`ibv_srq_pingpong` always 256, unused ones zero).
pub(crate) fn client_exchange(
    server: &str,
    port: u16,
    locals: &[PingpongDest],
    remotes: usize,
) -> Result<Vec<PingpongDest>, String> {
    let mut stream = TcpStream::connect((server, port))
        .map_err(|e| format!("Couldn't connect to {server}:{port}: {e}"))?;
    for local in locals {
        local
            .send(&mut stream)
            .map_err(|e| format!("Couldn't send local address: {e}"))?;
    }
    let remote = receive_all(&mut stream, remotes)?;
    stream
        .write_all(b"done\0")
        .map_err(|e| format!("Couldn't send \"done\": {e}"))?;
    Ok(remote)
}

fn receive_all(stream: &mut TcpStream, n: usize) -> Result<Vec<PingpongDest>, String> {
    (0..n)
        .map(|i| {
            PingpongDest::receive(stream)
                .map_err(|e| format!("Couldn't read remote address [{i}]: {e}"))
        })
        .collect()
}

/// The server's half: accept, read `remotes` of theirs, connect the QPs, send ours, wait for
/// "done".
pub(crate) fn server_exchange(
    port: u16,
    locals: &[PingpongDest],
    remotes: usize,
    connect: impl FnOnce(&[PingpongDest]) -> Result<(), String>,
) -> Result<Vec<PingpongDest>, String> {
    // Every address, IPv6 and IPv4 alike where the host allows dual-stack sockets.
    let listener = TcpListener::bind(("::", port))
        .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
        .map_err(|e| format!("Couldn't listen to port {port}: {e}"))?;
    let (mut stream, _) = listener
        .accept()
        .map_err(|e| format!("accept() failed: {e}"))?;
    let remote = receive_all(&mut stream, remotes)?;
    connect(&remote)?;
    for local in locals {
        local
            .send(&mut stream)
            .map_err(|e| format!("Couldn't send local address: {e}"))?;
    }
    let mut done = [0u8; 5];
    stream
        .read_exact(&mut done)
        .map_err(|e| format!("Couldn't read \"done\": {e}"))?;
    Ok(remote)
}
