//! `ferroce perf`: perftest's bandwidth and latency tools (`ib_write_bw`, `ib_read_lat`, …)
//! over the soft NIC, with perftest's flags, defaults, output and out-of-band exchange as
//! Debian 12's perftest (version 6.06) does it, so that the peer may be the real perftest.
//! The exchange of write-bw, read-bw and atomic-bw is the one captured between two perftest
//! 6.06 (testdata/rc_*_bw_4KB.pcap, rc_atomic_fadd.pcap); the other tests follow perftest's
//! source.
//!
//! The run of every test, in the order perftest's `main()` does it:
//!
//! 1. TCP connection (the server prints its "Waiting for client" banner once listening);
//!    versions; cycle buffer and cache line; MTU (the smaller wins).
//! 2. The header block.
//! 3. write-lat, read-lat and atomic-lat only: one key line each way.
//! 4. One key line per queue pair each way; the queue pairs go to RTR and RTS; the local
//!    address lines; one key line per queue pair again, with the remote address lines; one
//!    more key line ("after RTR"), which send-bw and send-lat exchange before the local
//!    address lines instead.
//! 5. The traffic, and the end each test has:
//!    - write-bw, read-bw, atomic-bw: the server waits in a key line while the client runs;
//!      then the client's report goes over (`xchg_bw_reports`) and the closing handshake.
//!    - send-bw: per message size, the server posts receives, a key line syncs both, both
//!      run (and, with `-a`, a key line follows each size); then the closing handshake.
//!    - write-lat: both sides ping-pong; no closing handshake.
//!    - send-lat: per size, receives are posted and a key line syncs; both ping-pong; then
//!      the closing handshake.
//!    - read-lat, atomic-lat: the server goes straight to the closing handshake, where it
//!      waits while the client runs.
//!
//! With `-R` (`--rdma_cm`) the exchange runs over an RC connection made by rdma_cm on the
//! same port, and the queue pairs are connected by the connection manager (RC: REQ, REP,
//! RTU; UD: SIDR) between two empty key lines after the MTU, as perftest's `-R` does
//! ([`rdma_cm`]); the rest of the run is the same.
//!
//! send-bw and send-lat also run over UD (`-c UD`) and with a shared receive queue
//! (`--use-srq`), as perftest does them: a UD queue pair takes Q_Key 0x11111111 (perftest's
//! `DEF_QKEY`) and sends each message as one datagram to the QPN and GID of the peer's key
//! line; a message is at most the MTU both sides agreed on (a larger `-s` is refused after
//! the MTU exchange, the default size and `-a` are cut down to it); each receive buffer holds
//! the 40-byte GRH before the payload, which starts on a cache line; the receive depth of UD
//! and UC is the iteration count (up to 16000) unless `-r` says otherwise. With `--use-srq`
//! the receiving side (the server of send-bw, both sides of send-lat) puts every queue pair
//! on one SRQ of `-r` receives, posted as perftest does: `rx-depth / qps` per queue pair's
//! buffer, each re-posted to the SRQ when a message used it, whichever queue pair took it.

mod bw;
mod lat;
mod oob;
mod rdma_cm;
mod report;
mod session;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::{Qpn, ROCE_PORT};
use ferroce::proto::Psn;
use ferroce::qp::{Mtu, QpCaps, QpType};
use ferroce::ud::{AddressHandle, UdDest, UD_GRH_LEN};
use ferroce::{
    ConnectOptions, Cq, DeviceOptions, Nic, NicConfig, Qp, QpEndpoint, Region, RegionAccess,
    RegionMemory, Srq,
};

use oob::{BwReport, Comm, KeyLine};
use rdma_cm::CmChannel;
use report::{Outcome, RESULT_LINE};

/// perftest's bandwidth and latency tests.
#[derive(Subcommand, Debug)]
pub(crate) enum PerfCommand {
    /// RDMA WRITE bandwidth (`ib_write_bw`).
    WriteBw(PerfArgs),
    /// RDMA WRITE latency, ping-pong (`ib_write_lat`).
    WriteLat(PerfArgs),
    /// RDMA READ bandwidth (`ib_read_bw`).
    ReadBw(PerfArgs),
    /// RDMA READ latency (`ib_read_lat`).
    ReadLat(PerfArgs),
    /// SEND bandwidth (`ib_send_bw`).
    SendBw(PerfArgs),
    /// SEND latency, ping-pong (`ib_send_lat`).
    SendLat(PerfArgs),
    /// Atomic bandwidth (`ib_atomic_bw`).
    AtomicBw(PerfArgs),
    /// Atomic latency (`ib_atomic_lat`).
    AtomicLat(PerfArgs),
    /// Request/reply session round trip (Catalyst's `TransportSession`): a controller against an
    /// echoing coprocessor, in the latency table of the other tests.
    SessionLat(session::SessionLatArgs),
}

/// perftest's flags (those that mean something for the soft NIC, and a few accepted for
/// compatibility), and ferroce's own.
#[derive(Args, Debug, Clone)]
pub(crate) struct PerfArgs {
    /// The server to connect to; without it, wait for a client.
    server: Option<String>,
    /// Message size in bytes (default 65536 for bandwidth, 2 for latency; atomics are 8).
    #[arg(short = 's', long = "size")]
    size: Option<u64>,
    /// Iterations (default 5000 for write-bw, 1000 otherwise).
    #[arg(short = 'n', long = "iters")]
    iters: Option<u64>,
    /// Run sizes from 2 to 2^23 bytes.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration")]
    duration: Option<u64>,
    /// Number of queue pairs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    qps: u32,
    /// Send queue depth: requests in flight (default 128 for bandwidth, 1 for latency).
    #[arg(short = 't', long = "tx-depth")]
    tx_depth: Option<u32>,
    /// Receive queue depth of the SEND tests.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 512)]
    rx_depth: u32,
    /// Ask for a completion every this many requests (CQ moderation).
    #[arg(short = 'Q', long = "cq-mod", default_value_t = 100)]
    cq_mod: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096 (the smaller of both sides' wins). Default:
    /// the NIC's active MTU, from its link (1024 at 1500 bytes, 4096 on loopback), as
    /// perftest takes the port's.
    #[arg(short = 'm', long = "mtu")]
    mtu: Option<u32>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// Report bandwidth in Gb/s instead of MB/s.
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Write the results as JSON (to --out_json_file).
    #[arg(long = "out_json")]
    out_json: bool,
    /// The JSON file (implies --out_json).
    #[arg(long = "out_json_file")]
    out_json_file: Option<PathBuf>,
    /// Device: `ferroce0` (the soft NIC) or a verbs device (`rxe0`, `mlx5_0`).
    #[arg(short = 'd', long = "ib-dev", default_value = "ferroce0")]
    ib_dev: String,
    /// Port of the device.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index on a verbs device (default: the RoCE v2 GID of --local, or the first IPv4
    /// one); the soft NIC's GID is its address.
    #[arg(short = 'x', long = "gid-index")]
    gid_index: Option<u32>,
    /// Do not fail on CPU frequency scaling (accepted; nothing to check).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Connection type: RC; UC for the WRITE and SEND tests; UD for the SEND tests.
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    connection: String,
    /// SEND tests: the receiving side's queue pairs share one receive queue of `-r`
    /// receives.
    #[arg(long = "use-srq")]
    use_srq: bool,
    /// Connect the queue pairs with rdma_cm, and exchange over an rdma_cm connection on the
    /// same port rather than TCP (RC; UD by SIDR for the SEND tests; the soft NIC only).
    #[arg(short = 'R', long = "rdma_cm")]
    rdma_cm: bool,
    /// Atomic operation: FETCH_AND_ADD or CMP_AND_SWAP.
    #[arg(short = 'A', long = "atomic_type", default_value = "FETCH_AND_ADD")]
    atomic_type: String,
    /// READs and atomics outstanding at once (default: what the device takes, as perftest
    /// asks `max_qp_rd_atom`; 128 on the soft NIC, as on rxe).
    #[arg(short = 'o', long = "outs")]
    outs: Option<u8>,
    /// ACK timeout exponent: 4.096 µs × 2^timeout.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    qp_timeout: u8,
    /// Do not compute the peak bandwidth.
    #[arg(short = 'N', long = "no_peak")]
    no_peak: bool,
    /// The local address: the soft NIC's (127.0.0.1 unless given), or on a verbs device the
    /// address whose RoCE v2 GID to use (`-x` picks one by index instead).
    #[arg(long = "local")]
    local: Option<IpAddr>,
    /// Verify every byte that arrived: receive buffers, targets of WRITEs (read back),
    /// destinations of READs, atomic results.
    #[arg(long = "check")]
    check: bool,
    /// Write every packet sent and received to this pcap file.
    #[arg(long = "pcap")]
    pcap: Option<PathBuf>,
    /// Inject faults on every packet sent: loss=P,dup=P,reorder=P,corrupt=P,delay=US,seed=N.
    #[arg(long = "fault")]
    fault: Option<ferroce::nic::Faults>,
    /// Send every packet as its own datagram: no UDP GSO, even where the path allows it.
    #[arg(long = "no-gso")]
    no_gso: bool,
    /// Receive without UDP GRO: the kernel splits a peer's GSO trains into datagrams.
    #[arg(long = "no-gro")]
    no_gro: bool,
    /// Print the NIC's counters at exit, as `rdma statistic show` does.
    #[arg(long = "stats")]
    stats: bool,
}

/// The verb a test exercises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    /// SEND/RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// Atomics.
    Atomic,
}

/// Bandwidth or latency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Bandwidth: many requests in flight.
    Bw,
    /// Latency: one at a time.
    Lat,
}

/// The transport of the queue pairs (`-c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Connection {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Unreliable datagram.
    Ud,
}

impl Connection {
    /// perftest's name (`connStr`).
    fn name(self) -> &'static str {
        match self {
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Ud => "UD",
        }
    }

    /// Whether a message may be lost for good: nothing acknowledges or resends it.
    fn lossy(self) -> bool {
        self != Self::Rc
    }
}

/// The Q_Key of perftest's UD queue pairs and of the datagrams they send (`DEF_QKEY`).
const UD_QKEY: u32 = 0x1111_1111;

/// Where a UD receive's payload starts in its area: one cache line in, the GRH just before
/// it, as perftest places it (`cache_line_size - UD_ADDITION`).
const UD_PAYLOAD_AT: u64 = CACHE_LINE as u64;

/// The atomic operation of the atomic tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtomicType {
    /// Fetch-and-add of 1.
    FetchAdd,
    /// Compare-and-swap of 0 with 0 (the value stays).
    CmpSwap,
}

impl AtomicType {
    /// perftest's name.
    fn name(self) -> &'static str {
        match self {
            Self::FetchAdd => "FETCH_AND_ADD",
            Self::CmpSwap => "CMP_AND_SWAP",
        }
    }
}

/// The resolved parameters of a run.
#[derive(Clone, Debug)]
struct Settings {
    verb: Verb,
    kind: Kind,
    server: Option<String>,
    sizes: Vec<u64>,
    /// `-a`: a sweep of sizes.
    all: bool,
    /// Whether `-s` was given (perftest's `req_size`).
    size_given: bool,
    iters: u64,
    duration: Option<Duration>,
    qps: usize,
    tx_depth: u32,
    rx_depth: u32,
    cq_mod: u32,
    /// `None`: the NIC's active MTU.
    mtu: Option<Mtu>,
    port: u16,
    gbits: bool,
    json: Option<PathBuf>,
    device: String,
    ib_port: u8,
    /// As asked; the index in use is the NIC's (`Nic::gid_index`).
    gid_index: Option<u32>,
    connection: Connection,
    /// `--use-srq`.
    use_srq: bool,
    /// `-R`: rdma_cm connects the queue pairs and carries the exchange.
    rdma_cm: bool,
    atomic: AtomicType,
    /// As asked; the NIC's most when `None` (resolved once it is open).
    out_reads: Option<u8>,
    timeout: u8,
    no_peak: bool,
    local: Option<IpAddr>,
    check: bool,
    pcap: Option<PathBuf>,
    fault: Option<ferroce::nic::Faults>,
    gso: bool,
    gro: bool,
    stats: bool,
}

/// perftest's `MIN_ITER`.
const MIN_ITERS: u64 = 5;
/// The largest size of `-a`: 2^23.
const MAX_SWEEP_EXP: u32 = 23;
/// perftest's default receive depth of the SEND tests (`DEF_RX_SEND`).
const DEF_RX_DEPTH: u32 = 512;
/// The receive depth perftest gives UD and UC at most when `-r` is left at its default
/// (`UC_MAX_RX`).
const UC_MAX_RX: u64 = 16000;
/// The largest message the soft NIC takes.
const MAX_SIZE: u64 = 1 << 31;
/// perftest's cycle buffer (the page size) and cache line, as exchanged.
const CYCLE_BUFFER: u32 = 4096;
const CACHE_LINE: u32 = 64;

impl Settings {
    fn resolve(verb: Verb, kind: Kind, a: &PerfArgs) -> Result<Self, String> {
        let sizes = if a.all {
            if verb == Verb::Atomic {
                return Err(" -a (all sizes) is not available for atomic tests".into());
            }
            if a.duration.is_some() {
                return Err(" -a (all sizes) and -D (duration) cannot be used together".into());
            }
            (1..=MAX_SWEEP_EXP).map(|e| 1u64 << e).collect()
        } else if verb == Verb::Atomic {
            if a.size.is_some_and(|s| s != 8) {
                eprintln!(" Atomic operations are 8 bytes: ignoring -s");
            }
            vec![8]
        } else {
            vec![a.size.unwrap_or(match kind {
                Kind::Bw => 65536,
                Kind::Lat => 2,
            })]
        };
        if sizes.iter().any(|&s| s == 0 || s > MAX_SIZE) {
            return Err(format!(" Message size must be 1 to {MAX_SIZE} bytes"));
        }
        let iters = a
            .iters
            .unwrap_or(if verb == Verb::Write && kind == Kind::Bw {
                5000
            } else {
                1000
            });
        if iters < MIN_ITERS {
            return Err(format!(" Iterations must be at least {MIN_ITERS}"));
        }
        if iters >= 1 << 32 {
            return Err(" Iterations must be below 2^32".into());
        }
        let duration = match a.duration {
            Some(0) => return Err(" Duration must be at least 1 second".into()),
            d => d.map(Duration::from_secs),
        };
        if a.qps == 0 || (kind == Kind::Lat && a.qps != 1) {
            return Err(" Latency tests use one queue pair; bandwidth tests at least one".into());
        }
        let mtu = match a.mtu.map(|m| (m, Mtu::from_bytes(m))) {
            None => None,
            Some((_, Some(mtu))) => Some(mtu),
            Some((m, None)) => {
                return Err(format!(
                    " Invalid MTU {m}: use 256, 512, 1024, 2048 or 4096"
                ))
            }
        };
        // perftest's words (`change_conn_type`).
        let connection = match a.connection.to_ascii_uppercase().as_str() {
            "RC" => Connection::Rc,
            "UC" if matches!(verb, Verb::Read | Verb::Atomic) => {
                return Err(" UC connection not possible in READ/ATOMIC verbs".into())
            }
            "UC" => Connection::Uc,
            "UD" if verb != Verb::Send => {
                return Err(" UD connection only possible in SEND verb".into())
            }
            "UD" => Connection::Ud,
            _ => {
                return Err(
                    " Invalid Connection type. Please choose from {RC,UC,UD} (the soft NIC runs no XRC, DC or SRD)"
                        .into(),
                )
            }
        };
        if a.rdma_cm && connection == Connection::Uc {
            return Err(format!(
                "{}\n UC is not supported in librdmacm",
                RESULT_LINE
            ));
        }
        let atomic = match a.atomic_type.to_ascii_uppercase().as_str() {
            "FETCH_AND_ADD" => AtomicType::FetchAdd,
            "CMP_AND_SWAP" => AtomicType::CmpSwap,
            other => return Err(format!(" Unknown atomic type {other}")),
        };
        // perftest clips the queue depths to the iterations, and moderation to the depth
        // (`force_dependecies`); UD and UC, which lose what finds no receive, keep a receive
        // posted for every message (up to 16000) unless -r is given.
        let mut tx_depth = a.tx_depth.unwrap_or(match kind {
            Kind::Bw => 128,
            Kind::Lat => 1,
        });
        let mut rx_depth = a.rx_depth;
        if duration.is_none() {
            tx_depth = tx_depth.min(iters as u32);
            rx_depth = rx_depth.min(iters as u32);
            if connection.lossy() && rx_depth == DEF_RX_DEPTH {
                rx_depth = iters.min(UC_MAX_RX) as u32;
            }
        }
        if tx_depth == 0 || rx_depth == 0 {
            return Err(" Queue depths must be at least 1".into());
        }
        let cq_mod = a.cq_mod.clamp(1, tx_depth);
        if a.use_srq && verb != Verb::Send {
            return Err(" Using SRQ only avavilible in SEND tests.".into());
        }
        if a.use_srq && a.qps > rx_depth {
            return Err(" Using SRQ depth should be greater than number of QPs.".into());
        }
        // perftest's "WA for a bug when rx_depth is odd in SEND".
        if verb == Verb::Send && rx_depth % 2 == 1 && !a.all {
            rx_depth += 1;
        }
        let json = match (&a.out_json_file, a.out_json) {
            (Some(path), _) => Some(path.clone()),
            (None, true) => return Err(" --out_json needs --out_json_file FILE".into()),
            (None, false) => None,
        };
        let _ = a.cpu_freq;
        Ok(Self {
            verb,
            kind,
            server: a.server.clone(),
            sizes,
            all: a.all,
            size_given: a.size.is_some(),
            iters,
            duration,
            qps: a.qps as usize,
            tx_depth,
            rx_depth,
            cq_mod,
            mtu,
            port: a.port,
            gbits: a.report_gbits,
            json,
            device: a.ib_dev.clone(),
            ib_port: a.ib_port,
            gid_index: a.gid_index,
            connection,
            use_srq: a.use_srq,
            rdma_cm: a.rdma_cm,
            atomic,
            out_reads: a.outs.map(|o| o.max(1)),
            timeout: a.qp_timeout,
            // perftest skips the peak of bandwidth runs above 20000 iterations.
            no_peak: a.no_peak || (kind == Kind::Bw && duration.is_none() && iters > 20000),
            local: a.local,
            check: a.check,
            pcap: a.pcap.clone(),
            fault: a.fault,
            gso: !a.no_gso,
            gro: !a.no_gro,
            stats: a.stats,
        })
    }

    /// Whether this side connects (names a server).
    fn is_client(&self) -> bool {
        self.server.is_some()
    }

    /// "RC", "UC" or "UD".
    fn connection_name(&self) -> &'static str {
        self.connection.name()
    }

    /// Whether this side's queue pairs take their receives from a shared receive queue:
    /// with `--use-srq`, the side that receives (perftest's `srq_exists`).
    fn has_srq(&self) -> bool {
        self.use_srq && (self.kind == Kind::Lat || !self.is_client())
    }

    /// The sizes as the MTU both sides agreed on allows them on UD (`check_mtu`): a larger
    /// `-s` is refused; the default size, and `-a`, are cut down to the MTU, with perftest's
    /// two lines on stderr.
    fn fit_datagrams(&self, mtu: Mtu) -> Result<Self, String> {
        let limit = u64::from(mtu.bytes());
        if self.connection != Connection::Ud || self.max_size() <= limit {
            return Ok(self.clone());
        }
        if !self.all && self.size_given {
            return Err(
                " Max message size in UD cannot be greater than MTU \n Couldn't get context for the device"
                    .into(),
            );
        }
        eprintln!(" Max msg size in UD is MTU {limit}");
        eprintln!(" Changing to this MTU");
        let sizes = if self.all {
            (1..=limit.trailing_zeros()).map(|e| 1u64 << e).collect()
        } else {
            vec![limit]
        };
        Ok(Self {
            sizes,
            ..self.clone()
        })
    }

    fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(8)
    }
}

/// The byte at offset `at` of a buffer both sides agree on, so that each can check what
/// the other sent without being told.
fn pattern_byte(at: u64) -> u8 {
    PERIODS[(at % PERIOD as u64) as usize]
}

/// The pattern's period: a prime, so that no power-of-two stride lines it up with itself.
const PERIOD: usize = 251;

/// Seventeen periods of the pattern from offset 0: sixteen of them start at any phase.
static PERIODS: [u8; PERIOD * 17] = periods();

const fn periods() -> [u8; PERIOD * 17] {
    let mut bytes = [0; PERIOD * 17];
    let mut i = 0;
    while i < bytes.len() {
        bytes[i] = ((i % PERIOD) as u8) ^ 0x5a;
        i += 1;
    }
    bytes
}

/// `len` bytes of the pattern from offset 0.
fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(pattern_byte).collect()
}

/// The NIC and everything a test runs on: a send and a receive CQ, the queue pairs (and
/// their shared receive queue, with `--use-srq`), and one registered buffer holding, per
/// queue pair, a local area (what is sent, or where READs and atomic results land) and a
/// target area (what the peer addresses, or where its SENDs land), as perftest lays out its
/// buffer.
struct TestResources {
    nic: Nic,
    send_cq: Cq,
    recv_cq: Cq,
    qps: Vec<Qp>,
    srq: Option<Srq>,
    region: Region,
    base: u64,
    area: u64,
    /// UD: where each queue pair's datagrams go (the peer's QPN and GID), once connected.
    dests: Vec<UdDest>,
    /// UD: receives carry the 40-byte GRH before the payload.
    ud: bool,
}

impl TestResources {
    fn new(s: &Settings) -> Result<Self, String> {
        let config = NicConfig {
            faults: s.fault,
            pcap: s.pcap.clone(),
            gso: s.gso,
            gro: s.gro,
            ..NicConfig::on(s.local.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)))
        };
        let device = DeviceOptions {
            port: s.ib_port,
            gid_index: s.gid_index,
            local: s.local,
        };
        let nic = Nic::open_device(&s.device, &device, &config)
            .map_err(|e| format!(" Couldn't get device {}: {e}", s.device))?;
        crate::refuse_soft_only(&nic, s.fault.is_some(), s.pcap.is_some())
            .map_err(|e| format!(" {e}"))?;
        let q = s.qps;
        let ud = s.connection == Connection::Ud;
        // UD: a cache line more, for the GRH before the payload.
        let area = s.max_size().max(u64::from(CYCLE_BUFFER)) + if ud { UD_PAYLOAD_AT } else { 0 };
        let cq_error = |e| format!(" Couldn't create CQ: {e}");
        let send_cq = Cq::new(&nic, q * (s.tx_depth as usize + 2) + 16).map_err(cq_error)?;
        let recv_cq = Cq::new(&nic, q * (s.rx_depth as usize + 2) + 16).map_err(cq_error)?;
        // perftest's SRQ: as deep as -r, one receive SGE.
        let srq = if s.has_srq() {
            Some(Srq::new(&nic, s.rx_depth).map_err(|e| format!("Couldn't create SRQ: {e}"))?)
        } else {
            None
        };
        let caps = QpCaps {
            sq_depth: s.tx_depth + 1,
            rq_depth: if s.verb == Verb::Send && srq.is_none() {
                s.rx_depth
            } else {
                1
            },
            max_inline: 0,
        };
        let qp_type = match s.connection {
            Connection::Rc => QpType::Rc,
            Connection::Uc => QpType::Uc,
            Connection::Ud => QpType::Ud,
        };
        let qps = (0..q)
            .map(|_| match &srq {
                Some(srq) => Qp::with_srq(&nic, qp_type, &send_cq, &recv_cq, srq, caps),
                None => Qp::new(&nic, qp_type, &send_cq, &recv_cq, caps),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| format!(" Couldn't create QP: {e}"))?;
        let len = 64 + 2 * q as u64 * area;
        let len = usize::try_from(len).map_err(|_| " Buffer too large".to_owned())?;
        let region = Region::register(
            &nic,
            grant(s),
            WriteOrder::InOrder,
            RegionMemory::Host(vec![0; len]),
        )
        .map_err(|e| format!(" Couldn't allocate MR: {e}"))?;
        // Every page written once before the exchange, as perftest zeroes its buffer: the
        // allocator's zeroed pages are untouched, and the peer's first WRITEs would fault
        // their target pages in on the way to the first answer.
        let zeros = vec![0u8; len.min(1 << 20)];
        for at in (0..len).step_by(zeros.len()) {
            let n = (len - at).min(zeros.len());
            region
                .write(at as u64, &zeros[..n])
                .map_err(|e| format!(" Couldn't write the MR: {e}"))?;
        }
        // Atomic targets must be 8-aligned; start the areas on a cache line.
        let base = (64 - region.va() % 64) % 64;
        let res = Self {
            nic,
            send_cq,
            recv_cq,
            qps,
            srq,
            region,
            base,
            area,
            dests: Vec::new(),
            ud,
        };
        let pat = pattern(area);
        for i in 0..q {
            match s.verb {
                Verb::Write | Verb::Send => res.fill(res.local_off(i), &pat)?,
                Verb::Read => res.fill(res.target_off(i), &pat)?,
                Verb::Atomic => {}
            }
        }
        Ok(res)
    }

    /// Offset of queue pair `i`'s local area.
    fn local_off(&self, i: usize) -> u64 {
        self.base + i as u64 * self.area
    }

    /// Offset of queue pair `i`'s target area, which the peer addresses.
    fn target_off(&self, i: usize) -> u64 {
        self.base + (self.qps.len() + i) as u64 * self.area
    }

    /// The receive buffer of queue pair `i`'s area: where it starts and how long it is. On
    /// UD it starts 40 bytes before a cache line, so that the payload, after the GRH, starts
    /// on one.
    fn recv_buffer(&self, i: usize) -> (u64, u64) {
        if self.ud {
            let skip = UD_PAYLOAD_AT - UD_GRH_LEN as u64;
            (self.target_off(i) + skip, self.area - skip)
        } else {
            (self.target_off(i), self.area)
        }
    }

    /// Where a message received into queue pair `i`'s receive buffer begins.
    fn payload_off(&self, i: usize) -> u64 {
        self.target_off(i) + if self.ud { UD_PAYLOAD_AT } else { 0 }
    }

    /// Bytes a receive completion counts for a message of `size` bytes: the GRH too on UD.
    fn received_len(&self, size: u64) -> u64 {
        size + if self.ud { UD_GRH_LEN as u64 } else { 0 }
    }

    /// Where queue pair `i`'s datagrams go, on UD.
    fn dest(&self, i: usize) -> Option<UdDest> {
        self.dests.get(i).copied()
    }

    /// Copies `bytes` to offset `at`.
    fn fill(&self, at: u64, bytes: &[u8]) -> Result<(), String> {
        self.region.write(at, bytes).map_err(|e| e.to_string())
    }

    /// Copies `len` bytes from offset `at`.
    fn read(&self, at: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len as usize];
        self.region.read(at, &mut out).map_err(|e| e.to_string())?;
        Ok(out)
    }
}

/// Where the first difference from the pattern is, if any, for `bytes` that begin at the
/// pattern's offset `start`. Compares sixteen periods at a time (a `memcmp` each), and only
/// a chunk that differs byte by byte: `--check` reads every message a SEND test receives,
/// and the byte-by-byte look (a division a byte) bounded the receiving side to about
/// 500 MB/s.
fn mismatch(bytes: &[u8], start: u64) -> Option<usize> {
    let mut at = 0;
    for chunk in bytes.chunks(PERIOD * 16) {
        let phase = ((start + at as u64) % PERIOD as u64) as usize;
        let expected = &PERIODS[phase..phase + chunk.len()];
        if chunk != expected {
            return chunk
                .iter()
                .zip(expected)
                .position(|(got, want)| got != want)
                .map(|i| at + i);
        }
        at += chunk.len();
    }
    None
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{message}");
    ExitCode::FAILURE
}

/// Runs one of the tests.
pub(crate) fn run(command: &PerfCommand) -> ExitCode {
    let (verb, kind, args) = match command {
        PerfCommand::WriteBw(a) => (Verb::Write, Kind::Bw, a),
        PerfCommand::WriteLat(a) => (Verb::Write, Kind::Lat, a),
        PerfCommand::ReadBw(a) => (Verb::Read, Kind::Bw, a),
        PerfCommand::ReadLat(a) => (Verb::Read, Kind::Lat, a),
        PerfCommand::SendBw(a) => (Verb::Send, Kind::Bw, a),
        PerfCommand::SendLat(a) => (Verb::Send, Kind::Lat, a),
        PerfCommand::AtomicBw(a) => (Verb::Atomic, Kind::Bw, a),
        PerfCommand::AtomicLat(a) => (Verb::Atomic, Kind::Lat, a),
        PerfCommand::SessionLat(a) => {
            return match session::run(a) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
    };
    let settings = match Settings::resolve(verb, kind, args) {
        Ok(s) => s,
        Err(e) => return fail(format!("{e}\n Parser function exited with Error")),
    };
    match execute(&settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// What the out-of-band exchange leaves for the traffic: its channel (for the closing key line
/// and the reports) and the key lines each side sent, one per queue pair.
struct KeyExchange {
    comm: Comm,
    local: Vec<KeyLine>,
    remote: Vec<KeyLine>,
}

fn execute(s: &Settings) -> Result<(), String> {
    let mut res = TestResources::new(s)?;
    // The report names the GID index: the one asked for (which a verbs device then uses, and
    // which the soft NIC, whose one GID is its address, echoes), else the one the NIC chose.
    let s = &Settings {
        gid_index: Some(s.gid_index.unwrap_or_else(|| res.nic.gid_index())),
        out_reads: Some(s.out_reads.unwrap_or(res.nic.caps().max_rd_atomic).max(1)),
        ..s.clone()
    };
    let mut comm = match (&s.server, s.rdma_cm) {
        (Some(server), false) => Comm::connect(server, s.port),
        (None, false) => Comm::accept(s.port),
        (Some(server), true) => resolve(server, s.port)
            .and_then(|ip| CmChannel::connect(&res.nic, ip, s.port))
            .map(Comm::over_rdma_cm),
        (None, true) => CmChannel::accept(&res.nic, s.port).map(Comm::over_rdma_cm),
    }
    .map_err(|e| format!("{e}\n Unable to init the socket connection"))?;
    comm.exchange_versions()?;
    comm.check_sys_data(CYCLE_BUFFER, CACHE_LINE)?;
    let mtu = comm.check_mtu(s.mtu.unwrap_or_else(|| res.nic.active_mtu()))?;
    let s = &s.fit_datagrams(mtu)?;
    // -R: an empty key line each way, the queue pairs' connections, another empty key line
    // (`create_rdma_cm_connection`).
    if s.rdma_cm {
        comm.hand_shake(&KeyLine::default())?;
        let cm = comm.rdma_cm().ok_or(" No rdma_cm connection")?;
        res.dests = cm.connect_queue_pairs(s, &res, mtu)?;
        comm.hand_shake(&KeyLine::default())?;
    }
    report::print_header(s, mtu.bytes());

    let gid = match res.nic.addr().ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
    .octets();
    let out_reads = if matches!(s.verb, Verb::Read | Verb::Atomic) {
        u32::from(s.out_reads.unwrap_or(1))
    } else {
        1
    };
    let local: Vec<KeyLine> = res
        .qps
        .iter()
        .enumerate()
        .map(|(i, qp)| {
            let endpoint = qp.endpoint();
            KeyLine {
                lid: 0,
                out_reads,
                qpn: endpoint.qpn.value(),
                psn: endpoint.psn.value(),
                rkey: res.region.rkey(),
                vaddr: res.region.va() + res.target_off(i),
                gid,
                srqn: 0,
                gid_index: s.gid_index.unwrap_or(0),
            }
        })
        .collect();

    // ib_write_lat, ib_read_lat and ib_atomic_lat shake hands once more first; ib_send_lat
    // does not.
    if s.kind == Kind::Lat && s.verb != Verb::Send {
        comm.hand_shake(&local[0])?;
    }
    let mut remote = Vec::with_capacity(local.len());
    for key in &local {
        remote.push(comm.hand_shake(key)?);
    }
    let mapped = |g: &[u8; 16]| std::net::Ipv6Addr::from(*g).to_ipv4_mapped().is_some();
    // With -R the connection manager connected the queue pairs already; perftest compares
    // no GIDs then.
    if !s.rdma_cm && mapped(&local[0].gid) != mapped(&remote[0].gid) {
        return Err(
            "\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.\n"
                .into(),
        );
    }
    if s.rdma_cm {
        // Connected by the connection manager already.
    } else if s.connection == Connection::Ud {
        res.dests = res
            .qps
            .iter()
            .zip(&remote)
            .map(|(qp, peer)| ready_ud(qp, peer))
            .collect::<Result<_, _>>()?;
    } else {
        for (qp, peer) in res.qps.iter().zip(&remote) {
            connect(qp, peer, s, mtu, out_reads)?;
        }
    }
    let res = res;
    // One more key line once the queue pairs are connected ("after RTR"): send-bw and
    // send-lat shake hands right away, the other tests after the remote address lines. With
    // more than one queue pair the order tells which key line is which.
    if s.verb == Verb::Send {
        comm.hand_shake(&local[0])?;
    }
    for key in &local {
        println!("{}", report::address_lines("local", key, s.verb));
    }
    for (i, key) in local.iter().enumerate() {
        remote[i] = comm.hand_shake(key)?;
        println!("{}", report::address_lines("remote", &remote[i], s.verb));
    }
    if s.verb != Verb::Send {
        comm.hand_shake(&local[0])?;
    }

    let exchange = KeyExchange {
        comm,
        local,
        remote,
    };
    let results = match (s.kind, s.verb) {
        (Kind::Bw, Verb::Send) => send_bw(s, &res, exchange),
        (Kind::Bw, _) => one_sided_bw(s, &res, exchange),
        (Kind::Lat, Verb::Write) => write_lat(s, &res, exchange),
        (Kind::Lat, Verb::Send) => send_lat(s, &res, exchange),
        (Kind::Lat, _) => one_sided_lat(s, &res, exchange),
    }?;
    if let Some(path) = &s.json {
        report::write_json(path, s, mtu.bytes(), &results)?;
    }
    if s.stats {
        println!("{}", res.nic.statistics_line(&s.device));
    }
    Ok(())
}

/// The server's address, for rdma_cm (perftest resolves an IPv4 one).
fn resolve(server: &str, port: u16) -> Result<IpAddr, String> {
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = (server, port)
        .to_socket_addrs()
        .map_err(|e| format!(" Problem in resolving basic address and port ({server}: {e})"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(SocketAddr::ip)
        .ok_or_else(|| format!(" Problem in resolving basic address and port ({server})"))
}

/// The address of the NIC a key line's GID names.
fn peer_ip(peer: &KeyLine) -> IpAddr {
    let gid = peer.gid_addr();
    gid.to_ipv4_mapped().map_or(IpAddr::V6(gid), IpAddr::V4)
}

/// Moves a UD queue pair to RTS with perftest's Q_Key, and names where its datagrams go: the
/// queue pair of the peer's key line, at its GID, with the same Q_Key (`ctx_connect`,
/// `ctx_set_send_reg_wqes`).
fn ready_ud(qp: &Qp, peer: &KeyLine) -> Result<UdDest, String> {
    qp.ready_ud(UD_QKEY).map_err(|e| {
        format!(
            " Failed to modify QP to RTR/RTS: {e}\n Unable to Connect the HCA's through the link"
        )
    })?;
    Ok(AddressHandle::new(peer_ip(peer)).dest(Qpn::from_low_bits(peer.qpn), UD_QKEY))
}

/// What peers may do to this side's buffer and through its queue pairs: what the perftest
/// twin grants (`ib_write_*` remote write, `ib_read_*` remote read, `ib_atomic_*` atomics,
/// `ib_send_*` nothing), so a request the test does not make is refused as perftest's peer
/// refuses it (an invalid request NAK). `--check` on a write test also grants remote read,
/// for the client's read-back of what it wrote (ferroce's own check; give it on both sides).
fn grant(s: &Settings) -> RegionAccess {
    match s.verb {
        Verb::Send => RegionAccess::Local,
        Verb::Write if s.check => RegionAccess::Remote,
        Verb::Write => RegionAccess::RemoteWrite,
        Verb::Read => RegionAccess::RemoteRead,
        Verb::Atomic => RegionAccess::RemoteAtomic,
    }
}

/// Moves a queue pair to RTR and RTS towards the peer its key line names.
fn connect(qp: &Qp, peer: &KeyLine, s: &Settings, mtu: Mtu, out_reads: u32) -> Result<(), String> {
    let endpoint = QpEndpoint {
        qpn: Qpn::from_low_bits(peer.qpn),
        psn: Psn::from_low_bits(peer.psn),
        addr: SocketAddr::new(peer_ip(peer), ROCE_PORT),
    };
    let rd_atomic = out_reads.min(peer.out_reads.max(1)).min(255) as u8;
    let options = ConnectOptions {
        mtu,
        access: grant(s),
        timeout: s.timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: rd_atomic,
    };
    qp.connect(&endpoint, &options).map_err(|e| {
        format!(
            " Failed to modify QP to RTR/RTS: {e}\n Unable to Connect the HCA's through the link"
        )
    })
}

/// The bandwidth report of a run, and its line.
fn print_bw(s: &Settings, r: &BwReport) {
    println!("{}", report::bw_line(r, s.gbits));
}

/// write-bw, read-bw, atomic-bw: the client runs, the server waits in a key line; then the
/// client's report goes over and the connection closes.
fn one_sided_bw(
    s: &Settings,
    res: &TestResources,
    exchange: KeyExchange,
) -> Result<Vec<Outcome>, String> {
    let KeyExchange {
        mut comm,
        local,
        remote,
        ..
    } = exchange;
    println!("{RESULT_LINE}");
    println!("{}", report::bw_columns(s.gbits));
    if !s.is_client() {
        comm.hand_shake(&local[0])?;
        if s.check {
            bw::check_target(s, res)?;
        }
        let theirs = comm.xchg_bw_reports(&BwReport::default())?;
        print_bw(s, &theirs);
        comm.close_connection(&local[0])?;
        println!("{RESULT_LINE}");
        return Ok(vec![Outcome::Bw(theirs)]);
    }
    let mut results = Vec::new();
    let mut last = BwReport::default();
    for &size in &s.sizes {
        last = bw::client(s, res, &remote, size)?;
        print_bw(s, &last);
        results.push(Outcome::Bw(last));
    }
    println!("{RESULT_LINE}");
    comm.hand_shake(&local[0])?;
    comm.xchg_bw_reports(&last)?;
    comm.close_connection(&local[0])?;
    Ok(results)
}

/// send-bw: per size, the server posts its receives, a key line syncs both sides, the
/// client sends and the server counts; both report.
fn send_bw(
    s: &Settings,
    res: &TestResources,
    exchange: KeyExchange,
) -> Result<Vec<Outcome>, String> {
    let KeyExchange {
        mut comm,
        local,
        remote,
        ..
    } = exchange;
    println!("{RESULT_LINE}");
    println!("{}", report::bw_columns(s.gbits));
    let mut results = Vec::new();
    let sweep = s.sizes.len() > 1;
    for &size in &s.sizes {
        let mut receiver = if s.is_client() {
            None
        } else {
            Some(bw::Receiver::post(s, res)?)
        };
        comm.hand_shake(&local[0])?;
        let r = match receiver.as_mut() {
            None => bw::client(s, res, &remote, size)?,
            Some(receiver) => receiver.run(s, res, size, &remote, &comm)?,
        };
        print_bw(s, &r);
        results.push(Outcome::Bw(r));
        if sweep {
            comm.hand_shake(&local[0])?;
        }
    }
    println!("{RESULT_LINE}");
    comm.close_connection(&local[0])?;
    Ok(results)
}

/// write-lat: both sides ping-pong by writing into each other's buffer; no closing
/// handshake.
fn write_lat(
    s: &Settings,
    res: &TestResources,
    exchange: KeyExchange,
) -> Result<Vec<Outcome>, String> {
    let KeyExchange { comm, remote, .. } = exchange;
    println!("{RESULT_LINE}");
    println!("{}", report::lat_columns(s.duration.is_some()));
    let mut results = Vec::new();
    for &size in &s.sizes {
        let r = lat::write_pingpong(s, res, &remote[0], size, &comm)?;
        println!("{}", report::lat_line(&r));
        results.push(Outcome::Lat(r));
    }
    println!("{RESULT_LINE}");
    write_turn_steps()?;
    comm.finish();
    Ok(results)
}

/// Where `FERROCE_TURN_STEPS` names a file: this thread's timed marks along the soft NIC's
/// path (`ferroce::steps`, kept only in a build with the `turn-steps` feature), one
/// `step nanoseconds` a line, for scripts/bench-turn-steps.sh.
pub(super) fn write_turn_steps() -> Result<(), String> {
    let Some(path) = std::env::var_os("FERROCE_TURN_STEPS") else {
        return Ok(());
    };
    if !cfg!(feature = "turn-steps") {
        return Err(concat!(
            "FERROCE_TURN_STEPS is set, but this ferroce was built without the turn-steps ",
            "feature (cargo build --release -p ferroce-cli --features turn-steps)"
        )
        .into());
    }
    let mut lines = String::new();
    for (step, at) in ferroce::steps::take() {
        lines.push_str(&format!("{} {at}\n", step.name()));
    }
    std::fs::write(&path, lines).map_err(|e| {
        format!(
            "cannot write {}: {e}",
            std::path::Path::new(&path).display()
        )
    })
}

/// send-lat: per size, receives are posted and a key line syncs both sides; then SEND
/// ping-pong.
fn send_lat(
    s: &Settings,
    res: &TestResources,
    exchange: KeyExchange,
) -> Result<Vec<Outcome>, String> {
    let KeyExchange {
        mut comm,
        local,
        remote,
    } = exchange;
    println!("{RESULT_LINE}");
    println!("{}", report::lat_columns(s.duration.is_some()));
    let mut results = Vec::new();
    for &size in &s.sizes {
        let mut pingpong = lat::SendPingpong::post(s, res)?;
        comm.hand_shake(&local[0])?;
        let r = pingpong.run(s, res, size, &remote[0], &comm)?;
        println!("{}", report::lat_line(&r));
        results.push(Outcome::Lat(r));
    }
    println!("{RESULT_LINE}");
    comm.close_connection(&local[0])?;
    Ok(results)
}

/// read-lat, atomic-lat: the client issues one request at a time; the server waits in the
/// closing handshake.
fn one_sided_lat(
    s: &Settings,
    res: &TestResources,
    exchange: KeyExchange,
) -> Result<Vec<Outcome>, String> {
    let KeyExchange {
        comm,
        local,
        remote,
        ..
    } = exchange;
    if !s.is_client() {
        comm.close_connection(&local[0])?;
        println!("{RESULT_LINE}");
        return Ok(Vec::new());
    }
    println!("{RESULT_LINE}");
    println!("{}", report::lat_columns(s.duration.is_some()));
    let mut results = Vec::new();
    for &size in &s.sizes {
        let r = lat::one_at_a_time(s, res, &remote[0], size)?;
        println!("{}", report::lat_line(&r));
        results.push(Outcome::Lat(r));
    }
    println!("{RESULT_LINE}");
    comm.close_connection(&local[0])?;
    Ok(results)
}

/// The server's banner, once it listens (perftest prints it just before).
pub(super) fn print_banner() {
    println!();
    println!("************************************");
    println!("* Waiting for client to connect... *");
    println!("************************************");
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked comparison finds what a byte-by-byte look finds: nothing in the pattern at
    /// any phase and length, and the first of two flipped bytes wherever they are.
    #[test]
    fn mismatch_finds_the_first_wrong_byte() {
        // The pattern both sides write and check, older builds included.
        for at in 0..2000u64 {
            assert_eq!(pattern_byte(at), ((at % 251) as u8) ^ 0x5a, "byte {at}");
        }
        for start in [0u64, 1, 250, 251, 1000, 4093] {
            for len in [
                0usize,
                1,
                250,
                251,
                252,
                PERIOD * 16,
                PERIOD * 16 + 1,
                65536,
            ] {
                let mut bytes: Vec<u8> = (0..len as u64).map(|i| pattern_byte(start + i)).collect();
                assert_eq!(mismatch(&bytes, start), None, "start {start} len {len}");
                if len == 0 {
                    continue;
                }
                for wrong in [0, len / 2, len - 1] {
                    bytes[wrong] ^= 1;
                    let later = (wrong + 7).min(len - 1);
                    bytes[later] ^= 2;
                    assert_eq!(
                        mismatch(&bytes, start),
                        Some(wrong),
                        "start {start} len {len}"
                    );
                    bytes[wrong] ^= 1;
                    bytes[later] ^= 2;
                }
            }
        }
        // A pattern from the wrong offset is wrong at its first byte.
        let bytes: Vec<u8> = (0..100).map(|i| pattern_byte(i + 1)).collect();
        assert_eq!(mismatch(&bytes, 0), Some(0));
    }
}
