//! `ferroce udaddy`: librdmacm's `udaddy`, same flags, exchange and output, over ferroce's
//! connection manager: the client resolves the server's UD queue pair by SIDR on port 7174 of
//! rdma_cm's UDP space, sends `-C` datagrams with its QPN as immediate data, and the server
//! answers each through the address its first receive names.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ferroce::cm::{self, CmError, Listener, UdPeer, RDMA_UDP_QKEY_DEFAULT};
use ferroce::cq::{Completion, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::Qpn;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::ud::{AddressHandle, UD_GRH_LEN};
use ferroce::{Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

use crate::common::cm::{event_of, route_source};

/// udaddy's port: fixed; its `-p` chooses the port space.
const PORT: u16 = 7174;
/// How long any one step may take.
const STEP: Duration = Duration::from_secs(60);

/// Flags of `udaddy`, with its defaults.
#[derive(Args, Debug)]
pub(crate) struct UdaddyArgs {
    /// The server to resolve; without it, be the server.
    #[arg(short = 's')]
    server: Option<IpAddr>,
    /// The address to bind to: the soft NIC's.
    #[arg(short = 'b')]
    bind: Option<IpAddr>,
    /// Endpoints.
    #[arg(short = 'c', default_value_t = 1)]
    connections: u32,
    /// Datagrams each way per endpoint.
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Datagram size: at most the port's MTU.
    #[arg(short = 'S', default_value_t = 100)]
    size: u32,
    /// Type of service (accepted; the soft NIC sends TOS 0).
    #[arg(short = 't')]
    tos: Option<u8>,
    /// Port space, as a number (accepted for compatibility: only UDP, 0x111, is supported).
    #[arg(short = 'p')]
    port_space_number: Option<String>,
    /// Port space (only udp is supported).
    #[arg(short = 'P')]
    port_space: Option<String>,
    /// Address format (accepted: addresses are IP addresses here).
    #[arg(short = 'f')]
    format: Option<String>,
}

struct Node {
    cq: Cq,
    qp: Qp,
    buf: Region,
    peer: Option<UdPeer>,
}

impl Node {
    fn new(nic: &Nic, count: u32, size: u32) -> Result<Self, String> {
        let depth = count.max(1);
        let cq = Cq::new(nic, 2 * depth as usize)
            .map_err(|e| format!("udaddy: unable to create CQ: {e}"))?;
        let caps = QpCaps {
            sq_depth: depth,
            rq_depth: depth,
            max_inline: 0,
        };
        let qp = Qp::new(nic, QpType::Ud, &cq, &cq, caps)
            .map_err(|e| format!("udaddy: unable to create QP: {e}"))?;
        // rdma_cm gives UD QPs of its UDP port space this Q_Key.
        qp.ready_ud(RDMA_UDP_QKEY_DEFAULT)
            .map_err(|e| format!("udaddy: unable to create QP: {e}"))?;
        let buf = Region::register(
            nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Host(vec![0; size as usize + UD_GRH_LEN]),
        )
        .map_err(|e| format!("failed to reg MR: {e}"))?;
        for _ in 0..count {
            let sge = buf
                .local(0, size + UD_GRH_LEN as u32)
                .map_err(|e| e.to_string())?;
            qp.post_recv(RecvWr {
                wr_id: 0,
                sges: vec![sge],
            })
            .map_err(|e| format!("failed to post receives: {e}"))?;
        }
        Ok(Self {
            cq,
            qp,
            buf,
            peer: None,
        })
    }

    /// `count` SENDs with immediate (our QPN) to the peer.
    fn post_sends(&self, count: u32, size: u32, signaled: bool) -> Result<(), String> {
        let Some(peer) = self.peer else {
            return Ok(());
        };
        let dest = peer.address.dest(peer.qpn, peer.qkey);
        for _ in 0..count {
            let sge = self.buf.local(0, size).map_err(|e| e.to_string())?;
            let wr = SendWr {
                signaled,
                ..SendWr::to(
                    0,
                    SendOp::SendWithImm(self.qp.qpn().value()),
                    Payload::Sge(sge),
                    dest,
                )
            };
            self.qp
                .post_send(wr)
                .map_err(|e| format!("failed to post sends: {e}"))?;
        }
        Ok(())
    }

    /// Waits for `count` completions; the first receive tells a server whom to answer.
    fn poll(&mut self, count: u32) -> Result<(), String> {
        for _ in 0..count {
            let wc = self
                .cq
                .wait(STEP)
                .ok_or("udaddy: failed polling CQ: no completion")?;
            if wc.status != WcStatus::Success {
                return Err(format!("udaddy: failed polling CQ: {}", wc.status));
            }
            if self.peer.is_none() {
                self.peer = reply_peer(&wc);
            }
        }
        Ok(())
    }
}

/// `ibv_create_ah_from_wc` and the QPN in the immediate: where to answer a datagram.
fn reply_peer(wc: &Completion) -> Option<UdPeer> {
    Some(UdPeer {
        address: AddressHandle::from_completion(wc)?,
        qpn: Qpn::from_low_bits(wc.imm?),
        qkey: RDMA_UDP_QKEY_DEFAULT,
    })
}

pub(crate) fn run(args: &UdaddyArgs) -> ExitCode {
    let status = match args.server {
        Some(server) => client(args, server),
        None => server(args),
    };
    println!("test complete");
    println!("return status {status}");
    ExitCode::from(status as u8)
}

fn open(addr: IpAddr, size: u32) -> Result<Nic, String> {
    let nic =
        Nic::open(&NicConfig::on(addr)).map_err(|e| format!("udaddy: bind address failed: {e}"))?;
    let mtu = nic.active_mtu().bytes();
    if size > mtu {
        return Err(format!(
            "udaddy: message_size {size} is larger than active mtu {mtu}"
        ));
    }
    Ok(nic)
}

fn client(args: &UdaddyArgs, server: IpAddr) -> i32 {
    println!("udaddy: starting client");
    let Some(local) = args.bind.or_else(|| route_source(server)) else {
        println!("udaddy: getaddrinfo error: no route to {server}");
        return -1;
    };
    let nic = match open(local, args.size) {
        Ok(nic) => nic,
        Err(e) => {
            println!("{e}");
            return -22;
        }
    };
    println!("udaddy: connecting");
    let count = if args.size == 0 { 0 } else { args.count };
    let mut nodes = Vec::new();
    for _ in 0..args.connections {
        let mut node = match Node::new(&nic, count, args.size) {
            Ok(node) => node,
            Err(e) => {
                println!("{e}");
                return -1;
            }
        };
        match cm::resolve_ud(&nic, server, PORT, &[], STEP) {
            Ok(peer) => node.peer = Some(peer),
            Err(e) => {
                let (event, code) = event_of(&e);
                println!("udaddy: event: {event}, error: {code}");
                return code;
            }
        }
        nodes.push(node);
    }
    if count > 0 {
        println!("initiating data transfers");
        for node in &nodes {
            if let Err(e) = node.post_sends(count, args.size, false) {
                println!("{e}");
                return -1;
            }
        }
        println!("receiving data transfers");
        for node in &mut nodes {
            if let Err(e) = node.poll(count) {
                println!("{e}");
                return -1;
            }
        }
        println!("data transfers complete");
    }
    0
}

fn server(args: &UdaddyArgs) -> i32 {
    println!("udaddy: starting server");
    let local = args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let nic = match open(local, args.size) {
        Ok(nic) => nic,
        Err(e) => {
            println!("{e}");
            return -22;
        }
    };
    let listener = match Listener::bind_udp(&nic, PORT) {
        Ok(listener) => listener,
        Err(e) => {
            println!("udaddy: failure trying to listen: {e}");
            return -1;
        }
    };
    let count = if args.size == 0 { 0 } else { args.count };
    let mut nodes = Vec::new();
    while nodes.len() < args.connections as usize {
        let request = match listener.get_sidr_request(Duration::from_secs(3600)) {
            Ok(request) => request,
            Err(CmError::Timeout { .. }) => continue,
            Err(e) => {
                println!("udaddy: {e}");
                return -1;
            }
        };
        // Receives are posted before the answer: UD has no RNR to cover a late one.
        let node = match Node::new(&nic, count, args.size) {
            Ok(node) => node,
            Err(e) => {
                println!("{e}");
                println!("udaddy: failing connection request");
                let _ = request.reject();
                continue;
            }
        };
        if let Err(e) = request.accept(&node.qp, RDMA_UDP_QKEY_DEFAULT) {
            println!("udaddy: failure accepting: {e}");
            continue;
        }
        nodes.push(node);
    }
    if count > 0 {
        println!("receiving data transfers");
        for node in &mut nodes {
            if let Err(e) = node.poll(count) {
                println!("{e}");
                return -1;
            }
        }
        println!("sending replies");
        for node in &nodes {
            if let Err(e) = node.post_sends(count, args.size, true) {
                println!("{e}");
                return -1;
            }
        }
        for node in &mut nodes {
            if let Err(e) = node.poll(count) {
                println!("{e}");
                return -1;
            }
        }
        println!("data transfers complete");
    }
    0
}
