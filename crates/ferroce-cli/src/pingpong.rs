//! `ferroce pingpong`: rdma-core's `ibv_rc_pingpong`, same flags, same out-of-band message on
//! TCP 18515, same output, over the soft NIC.

use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use ferroce::cq::WcStatus;
use ferroce::exchange::PingpongDest;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Mtu, Payload, PostError, QpCaps, QpType, RecvWr, SendOp, SendWr, Sge};
use ferroce::{
    ConnectOptions, Cq, DeviceOptions, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory,
};

/// The receive and send work request IDs of rdma-core's ping-pong tools.
pub(crate) const RECV_WRID: u64 = 1;
pub(crate) const SEND_WRID: u64 = 2;
const PAGE: usize = 4096;

/// Flags of `ibv_rc_pingpong`, with its defaults.
#[derive(Args, Debug)]
pub(crate) struct PingpongArgs {
    /// The server to connect to; without it, wait for a client.
    server: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    #[command(flatten)]
    nic: NicFlags,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// Receives to keep posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Iterations.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted for compatibility).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// Check the content of every received message.
    #[arg(short = 'c', long = "chk")]
    chk: bool,
}

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

/// The buffer `ibv_rc_pingpong` sends: 0x7b everywhere, 0 at every page start when checking.
pub(crate) fn pingpong_buffer(size: usize, chk: bool) -> Vec<u8> {
    let mut buf = vec![0x7b; size.max(1)];
    if chk {
        for byte in buf.iter_mut().step_by(PAGE) {
            *byte = 0;
        }
    }
    buf
}

pub(crate) fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{message}");
    ExitCode::FAILURE
}

pub(crate) fn run(args: &PingpongArgs) -> ExitCode {
    let Some(mtu) = Mtu::from_bytes(args.mtu) else {
        return fail(format!(
            "Invalid MTU {}: use 256, 512, 1024, 2048 or 4096",
            args.mtu
        ));
    };
    let nic = match args.nic.open() {
        Ok(nic) => nic,
        Err(e) => return fail(e),
    };
    let size = args.size as usize;
    let cq = match Cq::new(&nic, args.rx_depth as usize + 1) {
        Ok(cq) => cq,
        Err(e) => return fail(format!("Couldn't create CQ: {e}")),
    };
    let caps = QpCaps {
        sq_depth: 1,
        rq_depth: args.rx_depth.max(1),
        max_inline: 0,
    };
    let qp = match Qp::new(&nic, QpType::Rc, &cq, &cq, caps) {
        Ok(qp) => qp,
        Err(e) => return fail(format!("Couldn't create QP: {e}")),
    };
    let register = |bytes| {
        Region::register(
            &nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Host(bytes),
        )
    };
    let (send_buf, recv_buf) = match (
        register(pingpong_buffer(size, args.chk)),
        register(vec![0; size.max(1)]),
    ) {
        (Ok(s), Ok(r)) => (s, r),
        (Err(e), _) | (_, Err(e)) => return fail(format!("Couldn't register MR: {e}")),
    };
    let Ok(recv_sge) = recv_buf.local(0, args.size) else {
        return fail("Couldn't register MR");
    };
    let Ok(send_sge) = send_buf.local(0, args.size) else {
        return fail("Couldn't register MR");
    };
    let post_recv = |n: u32| post_receives(n, recv_sge, |wr| qp.post_recv(wr));
    let mut routs = post_recv(args.rx_depth);
    if routs < args.rx_depth {
        return fail(format!("Couldn't post receive ({routs})"));
    }

    let local = PingpongDest::from_endpoint(&qp.endpoint());
    println!("  local address:  {local}");
    let remote = match &args.server {
        Some(server) => client_exchange(server, args.port, &[local], 1),
        None => server_exchange(args.port, &[local], 1, |remote| {
            connect(&qp, &remote[0], mtu)
        }),
    };
    let remote = match remote {
        Ok(remote) => remote[0],
        Err(e) => return fail(e),
    };
    println!("  remote address: {remote}");
    if args.server.is_some() {
        if let Err(e) = connect(&qp, &remote, mtu) {
            return fail(e);
        }
    }

    let send = || {
        qp.post_send(SendWr::new(SEND_WRID, SendOp::Send, Payload::Sge(send_sge)))
            .map_err(|_| "Couldn't post send".to_owned())
    };
    let expected = pingpong_buffer(size, true);
    let mut received = vec![0u8; size];
    let on_recv = |rcnt: u32| {
        if args.chk && size > 0 {
            let _ = recv_buf.read(0, &mut received);
            if let Some(at) = (0..size).find(|&i| received[i] != expected[i]) {
                return Err(format!("invalid data at byte {at} of message {rcnt}"));
            }
        }
        routs -= 1;
        if routs <= 1 {
            routs += post_recv(args.rx_depth - routs);
        }
        Ok(())
    };
    let start = match exchange_loop(
        &cq,
        args.events,
        args.iters,
        args.server.is_some(),
        send,
        on_recv,
        "the peer stopped answering",
    ) {
        Ok(start) => start,
        Err(e) => return fail(e),
    };
    print_result(start, args.size, args.iters);
    args.nic.finish(&nic);
    let _ = args.sl;
    ExitCode::SUCCESS
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
    let mut last_progress = Instant::now();
    while rcnt < iters || scnt < iters {
        let completion = if events {
            cq.wait(Duration::from_millis(100))
        } else {
            cq.poll()
        };
        let Some(wc) = completion else {
            if last_progress.elapsed() > Duration::from_secs(10) {
                return Err(format!("No completion for 10 s: {stalled}"));
            }
            if !events {
                // Busy polling, as the originals do, but giving the core away between polls:
                // on a machine with fewer cores than busy threads, a spinning poller otherwise
                // holds the core its peer's packets need.
                std::thread::yield_now();
            }
            continue;
        };
        last_progress = Instant::now();
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

fn connect(qp: &Qp, remote: &PingpongDest, mtu: Mtu) -> Result<(), String> {
    // ibv_rc_pingpong's QP grants peers nothing (qp_access_flags 0): a WRITE or READ to it is
    // an invalid request, as rxe answers it.
    let options = ConnectOptions {
        mtu,
        access: RegionAccess::Local,
        max_rd_atomic: 1,
        ..ConnectOptions::default()
    };
    qp.connect(&remote.endpoint(), &options)
        .map_err(|e| format!("Failed to modify QP to RTR/RTS: {e}"))
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
