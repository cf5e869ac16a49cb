//! Many hosts at once (issue 16): sixteen network namespaces on one Linux bridge, each a host
//! with its own soft NIC, every pair of them joined by an RC connection made with
//! `ferroce::cm` (120 connections), all transferring at once in both directions while
//! nftables in every namespace drops 2 % of the RoCE datagrams it receives. Every byte is
//! checked where it lands.
//!
//! The namespaces, the bridge (in a seventeenth namespace, so nothing touches the host's
//! own) and the loss rules are the test's: created with names unique to this process and
//! removed on drop whatever happens. Only 10.88.0.0/24 inside them is ever addressed.
//!
//! A process binds only in the namespace it runs in, so each host is this test binary again,
//! started with `ip netns exec` to run [`mesh_node`] alone: an ignored test, so a plain
//! `cargo test` lists it as ignored rather than passing it, and it refuses to run unless
//! `FERROCE_MESH_NODE` says which host it is. Needs root, iproute2 and nftables; without
//! them the test says why it skips, and `scripts/test.sh` sets `FERROCE_REQUIRE_NETNS=1` so
//! CI fails instead.

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ferroce::cm::{self, CmError, ConnParam, Connection, Listener};
use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

/// Hosts on the bridge: 120 pairs.
const HOSTS: usize = 16;
/// Bytes each host writes to each other host (each connection carries this both ways).
const BYTES: usize = 1 << 20;
/// The size of one RDMA WRITE.
const CHUNK: usize = 64 << 10;
/// Loss on every host's input, in thousandths.
const LOSS_PER_MILLE: u32 = 20;
/// The rdma_cm port every host listens on.
const PORT: u16 = 7300;
/// How long a node gives its whole run before it reports failure.
const NODE_DEADLINE: Duration = Duration::from_secs(150);
/// How long the test waits for every node (they give up before this).
const TEST_DEADLINE: Duration = Duration::from_secs(200);

const READY: &str = "FERROCE-MESH-READY";
const RESULT: &str = "FERROCE-MESH-RESULT";

/// Host `i`'s address (0-based).
fn host_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, 0, i as u8 + 1)
}

/// The byte pattern host `src` writes to host `dst`: every 8-byte word a hash of
/// (src, dst, word index), so a byte from another host, another pair or another offset
/// does not pass.
fn fill_pattern(src: usize, dst: usize, out: &mut [u8]) {
    for (w, chunk) in out.chunks_mut(8).enumerate() {
        let mut z = ((src as u64) << 56 | (dst as u64) << 48 | w as u64)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

fn pattern(src: usize, dst: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    fill_pattern(src, dst, &mut v);
    v
}

// ---------------------------------------------------------------------------------------
// The node: one host, run inside its namespace.
// ---------------------------------------------------------------------------------------

/// Why one connection of a node failed.
#[derive(Debug, thiserror::Error)]
enum PairError {
    #[error("NIC: {0}")]
    Nic(#[from] ferroce::NicError),
    #[error("region: {0}")]
    Region(#[from] ferroce::RegionError),
    #[error("connection management: {0}")]
    Cm(#[from] CmError),
    #[error("post: {0}")]
    Post(String),
    #[error("the peer's private data is not a mesh host's: {0:02x?}")]
    PrivateData(Vec<u8>),
    #[error("work request {wr_id} completed with {status:?}")]
    Completion { wr_id: u64, status: WcStatus },
    #[error("the peer's closing message is wrong: {0:02x?}")]
    Message(Vec<u8>),
    #[error("{what} did not come within {NODE_DEADLINE:?}")]
    Timeout { what: &'static str },
    #[error("{mismatched} of {len} bytes differ from the pattern, the first at offset {first}")]
    Mismatch {
        mismatched: usize,
        len: usize,
        first: usize,
    },
}

/// A host's receive region, as its half of the private data names it: magic, host index,
/// address, key and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Keys {
    host: usize,
    va: u64,
    rkey: u32,
    len: u64,
}

const MAGIC: &[u8; 3] = b"FMH";

impl Keys {
    fn encode(&self) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.push(self.host as u8);
        v.extend_from_slice(&self.va.to_le_bytes());
        v.extend_from_slice(&self.rkey.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v
    }

    fn decode(b: &[u8]) -> Result<Self, PairError> {
        let bad = || PairError::PrivateData(b.to_vec());
        if b.len() < 24 || &b[..3] != MAGIC {
            return Err(bad());
        }
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        Ok(Self {
            host: b[3].into(),
            va: u64_at(4),
            rkey: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            len: u64_at(16),
        })
    }
}

/// What one connection did.
#[derive(Debug)]
struct PairReport {
    peer: usize,
    verified: usize,
}

/// Work request IDs: WRITEs are numbered from 0.
const WR_DONE: u64 = 1000;
const WR_FIN: u64 = 1001;
const WR_RECV_DONE: u64 = 2000;
const WR_RECV_FIN: u64 = 2001;
/// The message that follows the WRITEs: magic, source, destination and length.
fn done_message(src: usize, dst: usize) -> Vec<u8> {
    let mut v = b"DONE".to_vec();
    v.extend_from_slice(&[src as u8, dst as u8, 0, 0]);
    v.extend_from_slice(&(BYTES as u64).to_le_bytes());
    v
}

/// One connection's resources, created before the CM exchange so the receives are posted
/// before any SEND can come.
struct Pair {
    me: usize,
    cq: Cq,
    qp: Qp,
    rx: Region,
    tx: Region,
    msgs: Region,
}

impl Pair {
    fn new(nic: &Nic, me: usize, peer: usize) -> Result<Self, PairError> {
        let cq = Cq::new(nic, 64)?;
        let qp = Qp::new(nic, QpType::Rc, &cq, &cq, QpCaps::default())?;
        let rx = Region::register(
            nic,
            RegionAccess::RemoteWrite,
            WriteOrder::InOrder,
            RegionMemory::Pageable(vec![0; BYTES]),
        )?;
        let tx = Region::register(
            nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Pageable(pattern(me, peer, BYTES)),
        )?;
        let msgs = Region::register(
            nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Pageable(vec![0; 256]),
        )?;
        let pair = Self {
            me,
            cq,
            qp,
            rx,
            tx,
            msgs,
        };
        for (wr_id, at) in [(WR_RECV_DONE, 0), (WR_RECV_FIN, 64)] {
            pair.qp
                .post_recv(RecvWr {
                    wr_id,
                    sges: vec![pair.msgs.local(at, 64)?],
                })
                .map_err(|e| PairError::Post(e.to_string()))?;
        }
        Ok(pair)
    }

    fn keys(&self) -> Keys {
        Keys {
            host: self.me,
            va: self.rx.va(),
            rkey: self.rx.rkey(),
            len: BYTES as u64,
        }
    }

    fn param(&self) -> ConnParam {
        ConnParam {
            private_data: self.keys().encode(),
            timeout: Duration::from_secs(60),
            ..ConnParam::default()
        }
    }

    /// Writes the pattern into the peer's region, follows it with a SEND, waits for both to
    /// complete and for the peer's SEND, and checks every byte the peer wrote. The active
    /// side (`active`) also waits for the passive side's last message, after which it may
    /// close: the passive side's data and its acknowledgements are all in by then.
    fn transfer(&self, peer: Keys, deadline: Instant, active: bool) -> Result<usize, PairError> {
        let post = |wr: SendWr| {
            self.qp
                .post_send(wr)
                .map_err(|e| PairError::Post(e.to_string()))
        };
        let writes = BYTES.div_ceil(CHUNK);
        for w in 0..writes {
            let at = w * CHUNK;
            let len = CHUNK.min(BYTES - at);
            post(SendWr::new(
                w as u64,
                SendOp::Write(ferroce::qp::RemoteAddr {
                    va: peer.va + at as u64,
                    rkey: peer.rkey,
                }),
                Payload::Sge(self.tx.local(at as u64, len as u32)?),
            ))?;
        }
        let done = done_message(self.me, peer.host);
        self.msgs.write(128, &done)?;
        post(SendWr::new(
            WR_DONE,
            SendOp::Send,
            Payload::Sge(self.msgs.local(128, done.len() as u32)?),
        ))?;
        let (mut sent, mut got_done, mut got_fin) = (0, false, !active);
        let mut verified = 0;
        while sent < writes + 1 || !got_done || !got_fin {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(c) = self.cq.wait(left) else {
                return Err(PairError::Timeout {
                    what: if sent < writes + 1 {
                        "the completion of our WRITEs and SEND"
                    } else {
                        "the peer's SEND"
                    },
                });
            };
            if c.status != WcStatus::Success {
                return Err(PairError::Completion {
                    wr_id: c.wr_id,
                    status: c.status,
                });
            }
            match c.wr_id {
                WR_RECV_DONE => {
                    let mut msg = vec![0; c.byte_len as usize];
                    self.msgs.read(0, &mut msg)?;
                    if msg != done_message(peer.host, self.me) {
                        return Err(PairError::Message(msg));
                    }
                    got_done = true;
                    // RC delivers in order: every WRITE before this SEND has landed.
                    verified = self.verify(peer.host)?;
                }
                WR_RECV_FIN => {
                    let mut msg = vec![0; c.byte_len as usize];
                    self.msgs.read(64, &mut msg)?;
                    if msg != b"FIN" {
                        return Err(PairError::Message(msg));
                    }
                    got_fin = true;
                }
                _ => sent += 1,
            }
        }
        Ok(verified)
    }

    fn verify(&self, from: usize) -> Result<usize, PairError> {
        let mut got = vec![0; BYTES];
        self.rx.read(0, &mut got)?;
        let want = pattern(from, self.me, BYTES);
        let mut bad = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (a, b))| a != b);
        if let Some((first, _)) = bad.next() {
            return Err(PairError::Mismatch {
                mismatched: 1 + bad.count(),
                len: BYTES,
                first,
            });
        }
        Ok(BYTES)
    }

    /// The passive side's last word: its data is all acknowledged and the peer's all
    /// checked, so the active side may close. Whether this SEND's own acknowledgement comes
    /// back before the close does not matter, so it is not waited for.
    fn send_fin(&self) -> Result<(), PairError> {
        self.msgs.write(192, b"FIN")?;
        self.qp
            .post_send(SendWr::new(
                WR_FIN,
                SendOp::Send,
                Payload::Sge(self.msgs.local(192, 3)?),
            ))
            .map_err(|e| PairError::Post(e.to_string()))
    }
}

/// Connects to `peer` (a higher-numbered host), transfers both ways, closes.
fn active(nic: &Nic, me: usize, peer: usize, deadline: Instant) -> Result<PairReport, PairError> {
    let pair = Pair::new(nic, me, peer)?;
    let conn = Connection::connect(nic, &pair.qp, host_ip(peer).into(), PORT, &pair.param())?;
    let keys = Keys::decode(conn.private_data())?;
    if keys.host != peer || keys.len != BYTES as u64 {
        return Err(PairError::PrivateData(conn.private_data().to_vec()));
    }
    let verified = pair.transfer(keys, deadline, true)?;
    conn.disconnect(Duration::from_secs(30))?;
    Ok(PairReport { peer, verified })
}

/// Accepts one request from a lower-numbered host, transfers both ways, and waits for the
/// peer to close.
fn passive(
    nic: &Nic,
    me: usize,
    request: cm::ConnectRequest,
    deadline: Instant,
) -> Result<PairReport, PairError> {
    let keys = Keys::decode(request.private_data())?;
    if keys.host >= me || request.from() != IpAddr::V4(host_ip(keys.host)) {
        return Err(PairError::PrivateData(request.private_data().to_vec()));
    }
    let pair = Pair::new(nic, me, keys.host)?;
    let conn = request.accept(&pair.qp, &pair.param())?;
    conn.wait_established(Duration::from_secs(30))?;
    let verified = pair.transfer(keys, deadline, false)?;
    pair.send_fin()?;
    conn.wait_disconnected(Duration::from_secs(60))?;
    Ok(PairReport {
        peer: keys.host,
        verified,
    })
}

/// One host of the mesh, run only when `FERROCE_MESH_NODE` names it (the test below starts
/// sixteen of them, one in each namespace). It opens a NIC on its address, listens, says
/// it is ready, waits for `go` on its standard input, then connects to every higher-numbered
/// host and accepts every lower-numbered one, all at once; each connection carries the
/// pattern both ways, every byte checked. It prints one result line and fails unless every
/// connection succeeded.
#[test]
#[ignore = "one host of the mesh: the mesh test starts it in its namespace"]
fn mesh_node() {
    let me = std::env::var("FERROCE_MESH_NODE")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .expect("FERROCE_MESH_NODE names the host this node is (the mesh test sets it)");
    let deadline = Instant::now() + NODE_DEADLINE;
    let nic = Nic::open(&NicConfig::on(host_ip(me).into())).expect("open the NIC");
    let listener = Listener::bind(&nic, PORT).expect("listen");
    println!("{READY} {me}");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).expect("read go");
    assert_eq!(go.trim(), "go", "the test's word to start");
    let started = Instant::now();

    let results: Vec<Result<PairReport, (usize, PairError)>> = std::thread::scope(|s| {
        let nic = &nic;
        let listener = &listener;
        let accepting = s.spawn(move || {
            let mut handlers = Vec::new();
            for _ in 0..me {
                let left = deadline.saturating_duration_since(Instant::now());
                match listener.get_request(left) {
                    Ok(request) => handlers.push(s.spawn(move || {
                        let from = request.from();
                        passive(nic, me, request, deadline).map_err(|e| {
                            let peer = match from {
                                IpAddr::V4(v4) => usize::from(v4.octets()[3]) - 1,
                                IpAddr::V6(_) => usize::MAX,
                            };
                            (peer, e)
                        })
                    })),
                    Err(e) => return vec![Err((usize::MAX, PairError::Cm(e)))],
                }
            }
            handlers
                .into_iter()
                .map(|h| h.join().expect("a passive connection's thread"))
                .collect::<Vec<_>>()
        });
        let connecting: Vec<_> = (me + 1..HOSTS)
            .map(|peer| s.spawn(move || active(nic, me, peer, deadline).map_err(|e| (peer, e))))
            .collect();
        let mut all: Vec<_> = connecting
            .into_iter()
            .map(|h| h.join().expect("an active connection's thread"))
            .collect();
        all.extend(accepting.join().expect("the accepting thread"));
        all
    });
    let transfer_s = started.elapsed().as_secs_f64();
    // Peers whose DREQ we answered may need us again if our DREP was lost.
    let lingered = cm::linger(&nic, cm::LINGER);
    let linger_s = started.elapsed().as_secs_f64() - transfer_s;

    let mut verified = 0;
    let mut peers = Vec::new();
    let mut errors = Vec::new();
    for r in &results {
        match r {
            Ok(report) => {
                verified += report.verified;
                peers.push(report.peer);
            }
            Err((peer, e)) => errors.push(format!("peer {peer}: {e}")),
        }
    }
    peers.sort_unstable();
    let c = nic.counters();
    let cm = cm::counters(&nic).unwrap_or_default();
    let summary = serde_json::json!({
        "node": me,
        "peers": peers,
        "bytes_verified": verified,
        "errors": errors,
        "sent_pkts": c.sent_pkts,
        "rcvd_pkts": c.rcvd_pkts,
        "completer_retry_err": c.completer_retry_err,
        "early_resends": c.early_resends,
        "rcvd_seq_err": c.rcvd_seq_err,
        "out_of_seq_request": c.out_of_seq_request,
        "duplicate_request": c.duplicate_request,
        "retry_exceeded_err": c.retry_exceeded_err,
        "icrc_err": c.icrc_err,
        "cm_resends": cm.resends,
        "cm_duplicates": cm.duplicates,
        "lingered": lingered,
        "transfer_s": (transfer_s * 10.0).round() / 10.0,
        "linger_s": (linger_s * 10.0).round() / 10.0,
    });
    println!("{RESULT} {summary}");
    assert!(errors.is_empty(), "node {me}: {errors:?}");
    assert_eq!(verified, (HOSTS - 1) * BYTES, "node {me}");
}

// ---------------------------------------------------------------------------------------
// The harness: namespaces, bridge, loss, and the sixteen nodes.
// ---------------------------------------------------------------------------------------

fn ip_cmd(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("run ip")
}

fn must(args: &[&str]) {
    let out = ip_cmd(args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces: one per host and a hub holding the bridge, all removed on drop.
struct Mesh {
    hub: String,
    hosts: Vec<String>,
}

impl Mesh {
    fn new() -> Self {
        let pid = std::process::id();
        let mesh = Self {
            hub: format!("ferroce-mesh-{pid}-hub"),
            hosts: (0..HOSTS)
                .map(|i| format!("ferroce-mesh-{pid}-{i}"))
                .collect(),
        };
        // Created one by one, so a failure part-way leaves only what drop removes.
        must(&["netns", "add", &mesh.hub]);
        must(&["-n", &mesh.hub, "link", "add", "br0", "type", "bridge"]);
        must(&["-n", &mesh.hub, "link", "set", "br0", "up"]);
        for (i, ns) in mesh.hosts.iter().enumerate() {
            must(&["netns", "add", ns]);
            let port = format!("p{i}");
            must(&[
                "-n", &mesh.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ]);
            must(&["-n", &mesh.hub, "link", "set", &port, "master", "br0"]);
            must(&["-n", &mesh.hub, "link", "set", &port, "up"]);
            let addr = format!("{}/24", host_ip(i));
            must(&["-n", ns, "addr", "add", &addr, "dev", "eth0"]);
            must(&["-n", ns, "link", "set", "eth0", "up"]);
            must(&["-n", ns, "link", "set", "lo", "up"]);
        }
        mesh
    }

    /// Drops `LOSS_PER_MILLE` of the RoCE datagrams each host receives, counting what it
    /// drops and what it lets through.
    fn add_loss(&self) {
        let rules = format!(
            "table inet ferroce_mesh {{ chain input {{ type filter hook input priority 0; \
             udp dport 4791 numgen random mod 1000 < {LOSS_PER_MILLE} counter drop; \
             udp dport 4791 counter; }}; }}"
        );
        for ns in &self.hosts {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "nft", &rules])
                .output()
                .expect("run nft");
            assert!(
                out.status.success(),
                "nft in {ns}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// (dropped, passed) datagrams of host `i`'s loss rule.
    fn loss_counters(&self, i: usize) -> (u64, u64) {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.hosts[i],
                "nft",
                "list",
                "table",
                "inet",
                "ferroce_mesh",
            ])
            .output()
            .expect("run nft");
        let text = String::from_utf8_lossy(&out.stdout);
        let counts: Vec<u64> = text
            .split("counter packets ")
            .skip(1)
            .map(|rest| {
                rest.split_whitespace()
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("nft counters of host {i}: {text}"))
            })
            .collect();
        assert_eq!(counts.len(), 2, "nft counters of host {i}: {text}");
        (counts[0], counts[1])
    }

    fn node(&self, i: usize) -> Command {
        let exe = std::env::current_exe().expect("this test binary");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.hosts[i]])
            .arg(exe)
            .args([
                "mesh_node",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FERROCE_MESH_NODE", i.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and with it the pair; the hub takes
        // the bridge with it.
        for ns in self.hosts.iter().chain([&self.hub]) {
            let _ = ip_cmd(&["netns", "del", ns]);
        }
    }
}

/// The nodes, killed (each by its PID) if the test ends before they do.
struct Nodes(Vec<Child>);

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn can_run() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let has_ip = Command::new("ip").arg("-V").output().is_ok();
    let has_nft = Command::new("nft").arg("--version").output().is_ok();
    if root && has_ip && has_nft {
        return true;
    }
    assert!(
        std::env::var_os("FERROCE_REQUIRE_NETNS").is_none(),
        "FERROCE_REQUIRE_NETNS is set but this test needs root, iproute2 and nftables \
         (root: {root}, ip: {has_ip}, nft: {has_nft})"
    );
    eprintln!(
        "SKIPPED the mesh test: it needs root, iproute2 and nftables to create network \
         namespaces, a bridge and loss"
    );
    false
}

/// One line of a node's standard output or error, as the reader threads pass them on.
enum Line {
    Out(usize, String),
    Err(usize, String),
}

#[test]
fn sixteen_hosts_all_pairs_at_once_under_loss() {
    if !can_run() {
        return;
    }
    let mesh = Mesh::new();
    mesh.add_loss();
    let mut nodes = Nodes(Vec::new());
    let (tx, rx) = mpsc::channel();
    for i in 0..HOSTS {
        let mut child = mesh.node(i).spawn().expect("start a node");
        let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let t = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = t.send(Line::Out(i, line));
            }
        });
        let t = tx.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = BufReader::new(err).read_to_string(&mut text);
            let _ = t.send(Line::Err(i, text));
        });
        nodes.0.push(child);
    }
    drop(tx);

    // Every node listens before any connects.
    let start = Instant::now();
    let mut ready = vec![false; HOSTS];
    let mut results: Vec<Option<serde_json::Value>> = vec![None; HOSTS];
    let mut stderr = vec![String::new(); HOSTS];
    // libtest prints `test mesh_node ... ` before the node's first line: look for the
    // markers anywhere in a line.
    let mut take = |line: Line, ready: &mut Vec<bool>| match line {
        Line::Out(i, l) => {
            if l.contains(READY) {
                ready[i] = true;
            }
            if let Some((_, json)) = l.split_once(RESULT) {
                results[i] = Some(serde_json::from_str(json.trim()).expect("a result line"));
            }
        }
        Line::Err(i, text) => stderr[i] = text,
    };
    while !ready.iter().all(|r| *r) {
        let left = Duration::from_secs(60).saturating_sub(start.elapsed());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| {
            panic!("nodes not ready within 60 s: {ready:?}");
        });
        take(line, &mut ready);
    }
    for child in &mut nodes.0 {
        writeln!(child.stdin.as_mut().unwrap(), "go").expect("tell a node to go");
    }
    let go = Instant::now();

    // Then wait for all of them.
    let deadline = go + TEST_DEADLINE;
    let mut statuses = [None; HOSTS];
    while statuses.iter().any(Option::is_none) && Instant::now() < deadline {
        for (i, child) in nodes.0.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = child.try_wait().expect("wait for a node");
            }
        }
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            take(line, &mut ready);
        }
    }
    drop(nodes); // kills any still running
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
        take(line, &mut ready);
    }
    let took = go.elapsed();

    let mut report = String::new();
    for i in 0..HOSTS {
        let result = results[i].as_ref();
        let ok = statuses[i].is_some_and(|s| s.success());
        assert!(
            ok && result.is_some(),
            "node {i} ({:?}): {result:?}\n{}",
            statuses[i],
            stderr[i]
        );
        let r = result.unwrap();
        assert_eq!(r["errors"], serde_json::json!([]), "node {i}: {r}");
        let peers: Vec<usize> = (0..HOSTS).filter(|p| *p != i).collect();
        assert_eq!(r["peers"], serde_json::json!(peers), "node {i}: {r}");
        assert_eq!(
            r["bytes_verified"].as_u64(),
            Some(((HOSTS - 1) * BYTES) as u64),
            "node {i}: {r}"
        );
        assert_eq!(r["icrc_err"], 0, "node {i}: {r}");
        assert_eq!(r["retry_exceeded_err"], 0, "node {i}: {r}");
        report.push_str(&format!("{r}\n"));
    }
    // The loss was real: every host's rule dropped datagrams, and the senders resent.
    let mut dropped_total = 0;
    let mut passed_total = 0;
    for i in 0..HOSTS {
        let (dropped, passed) = mesh.loss_counters(i);
        assert!(dropped > 0, "host {i} dropped nothing ({passed} passed)");
        dropped_total += dropped;
        passed_total += passed;
    }
    let resends: u64 = results
        .iter()
        .flatten()
        .map(|r| r["completer_retry_err"].as_u64().unwrap() + r["early_resends"].as_u64().unwrap())
        .sum();
    assert!(resends > 0, "loss without a resend: {report}");
    eprintln!(
        "mesh: {HOSTS} hosts, {} connections, {} bytes verified in {:.1} s; nftables dropped \
         {dropped_total} of {} datagrams; {resends} resends\n{report}",
        HOSTS * (HOSTS - 1) / 2,
        HOSTS * (HOSTS - 1) * BYTES,
        took.as_secs_f64(),
        dropped_total + passed_total,
    );
}

#[test]
fn the_pattern_tells_pairs_and_offsets_apart() {
    let a = pattern(1, 2, 4096);
    assert_ne!(a, pattern(2, 1, 4096));
    assert_ne!(a, pattern(1, 3, 4096));
    assert_ne!(a[..2048], a[2048..]);
    assert_eq!(a, pattern(1, 2, 4096));
    let k = Keys {
        host: 7,
        va: 0x1234_5678_9abc,
        rkey: 0xdead_beef,
        len: BYTES as u64,
    };
    assert_eq!(Keys::decode(&k.encode()).unwrap(), k);
    assert!(Keys::decode(b"FMX").is_err());
    // The CM's limit on a REQ's private data.
    assert!(k.encode().len() <= cm::MAX_REQ_PRIVATE);
}
