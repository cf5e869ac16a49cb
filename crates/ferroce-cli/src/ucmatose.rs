//! `ferroce ucmatose`: librdmacm's `ucmatose` (cmatose), same flags, exchange and output, over
//! ferroce's connection manager: `-c` RC connections, then `-C` SENDs of `-S` bytes on each,
//! server first, then back, then the server disconnects them all.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ferroce::cm::{CmError, ConnParam, Connection, Listener};
use ferroce::cq::WcStatus;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::{Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

use crate::common::cm::{event_of, route_source};

/// How long any one step may take.
const STEP: Duration = Duration::from_secs(60);

/// Flags of `ucmatose`, with its defaults.
#[derive(Args, Debug)]
pub(crate) struct UcmatoseArgs {
    /// The server to connect to; without it, be the server.
    #[arg(short = 's')]
    server: Option<IpAddr>,
    /// The address to bind to: the soft NIC's.
    #[arg(short = 'b')]
    bind: Option<IpAddr>,
    /// Connections.
    #[arg(short = 'c', default_value_t = 1)]
    connections: u32,
    /// Messages each way on each connection.
    #[arg(short = 'C', default_value_t = 10)]
    count: u32,
    /// Message size.
    #[arg(short = 'S', default_value_t = 100)]
    size: u32,
    /// Type of service (accepted; the soft NIC sends TOS 0).
    #[arg(short = 't')]
    tos: Option<u8>,
    /// The rdma_cm port.
    #[arg(short = 'p', default_value_t = 7471)]
    port: u16,
    /// Address format (accepted: addresses are IP addresses here).
    #[arg(short = 'f')]
    format: Option<String>,
    /// Port space (only tcp is supported).
    #[arg(short = 'P')]
    port_space: Option<String>,
    /// Migrate to a new event channel (accepted; ferroce has one).
    #[arg(short = 'm')]
    migrate: bool,
}

/// One connection's queues and buffer.
struct Node {
    send_cq: Cq,
    recv_cq: Cq,
    qp: Qp,
    buf: Region,
    conn: Option<Connection>,
}

impl Node {
    fn new(nic: &Nic, count: u32, size: u32) -> Result<Self, String> {
        let depth = count.max(1);
        let send_cq = Cq::new(nic, depth as usize)
            .map_err(|e| format!("cmatose: unable to create CQ: {e}"))?;
        let recv_cq = Cq::new(nic, depth as usize)
            .map_err(|e| format!("cmatose: unable to create CQ: {e}"))?;
        let caps = QpCaps {
            sq_depth: depth,
            rq_depth: depth,
            max_inline: 0,
        };
        let qp = Qp::new(nic, QpType::Rc, &send_cq, &recv_cq, caps)
            .map_err(|e| format!("cmatose: unable to create QP: {e}"))?;
        let buf = Region::register(
            nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Host(vec![0; size.max(1) as usize]),
        )
        .map_err(|e| format!("failed to reg MR: {e}"))?;
        let node = Self {
            send_cq,
            recv_cq,
            qp,
            buf,
            conn: None,
        };
        if size > 0 {
            for _ in 0..count {
                let sge = node.buf.local(0, size).map_err(|e| e.to_string())?;
                node.qp
                    .post_recv(RecvWr {
                        wr_id: 0,
                        sges: vec![sge],
                    })
                    .map_err(|e| format!("failed to post receives: {e}"))?;
            }
        }
        Ok(node)
    }

    fn post_sends(&self, count: u32, size: u32) -> Result<(), String> {
        for _ in 0..count {
            let sge = self.buf.local(0, size).map_err(|e| e.to_string())?;
            self.qp
                .post_send(SendWr::new(0, SendOp::Send, Payload::Sge(sge)))
                .map_err(|e| format!("failed to post sends: {e}"))?;
        }
        Ok(())
    }

    fn poll(cq: &Cq, count: u32) -> Result<(), String> {
        for _ in 0..count {
            let wc = cq
                .wait(STEP)
                .ok_or("cmatose: failed polling CQ: no completion")?;
            if wc.status != WcStatus::Success {
                return Err(format!("cmatose: failed polling CQ: {}", wc.status));
            }
        }
        Ok(())
    }
}

pub(crate) fn run(args: &UcmatoseArgs) -> ExitCode {
    let status = match args.server {
        Some(server) => client(args, server),
        None => server(args),
    };
    println!("test complete");
    println!("return status {status}");
    ExitCode::from(status as u8)
}

fn open(addr: IpAddr) -> Result<Nic, String> {
    Nic::open(&NicConfig::on(addr)).map_err(|e| format!("cmatose: bind address failed: {e}"))
}

fn client(args: &UcmatoseArgs, server: IpAddr) -> i32 {
    println!("cmatose: starting client");
    let Some(local) = args.bind.or_else(|| route_source(server)) else {
        println!("cmatose: getaddrinfo error: no route to {server}");
        return -1;
    };
    let nic = match open(local) {
        Ok(nic) => nic,
        Err(e) => {
            println!("{e}");
            return -1;
        }
    };
    println!("cmatose: connecting");
    let count = if args.size == 0 { 0 } else { args.count };
    let mut nodes = Vec::new();
    let mut status = 0;
    for _ in 0..args.connections {
        let mut node = match Node::new(&nic, count, args.size) {
            Ok(node) => node,
            Err(e) => {
                println!("{e}");
                return -1;
            }
        };
        // cmatose's client: one READ resource each way, retry count 5, no RNR retries (its
        // receives are all posted first).
        let param = ConnParam {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 5,
            rnr_retry_count: 0,
            ..ConnParam::default()
        };
        match Connection::connect(&nic, &node.qp, server, args.port, &param) {
            Ok(conn) => node.conn = Some(conn),
            Err(e) => {
                let (event, code) = event_of(&e);
                println!("cmatose: event: {event}, error: {code}");
                status = code;
            }
        }
        nodes.push(node);
    }
    if status == 0 && count > 0 {
        println!("receiving data transfers");
        for node in nodes.iter().filter(|n| n.conn.is_some()) {
            if let Err(e) = Node::poll(&node.recv_cq, count) {
                println!("{e}");
                return -1;
            }
        }
        println!("sending replies");
        for node in nodes.iter().filter(|n| n.conn.is_some()) {
            if let Err(e) = node.post_sends(count, args.size) {
                println!("{e}");
                return -1;
            }
        }
        println!("data transfers complete");
    }
    // The server disconnects: wait for each connection's DREQ, then stay to answer it again
    // should a DREP have been lost.
    for node in &nodes {
        if let Some(conn) = &node.conn {
            if let Err(e) = conn.wait_disconnected(STEP) {
                println!("cmatose: failure in rdma_get_cm_event in disconnect events: {e}");
                return -1;
            }
        }
    }
    ferroce::cm::linger(&nic, ferroce::cm::LINGER);
    status
}

fn server(args: &UcmatoseArgs) -> i32 {
    println!("cmatose: starting server");
    let local = args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let nic = match open(local) {
        Ok(nic) => nic,
        Err(e) => {
            println!("{e}");
            return -1;
        }
    };
    let listener = match Listener::bind(&nic, args.port) {
        Ok(listener) => listener,
        Err(e) => {
            println!("cmatose: failure trying to listen: {e}");
            return -1;
        }
    };
    let count = if args.size == 0 { 0 } else { args.count };
    let mut nodes = Vec::new();
    while nodes.len() < args.connections as usize {
        let request = match listener.get_request(Duration::from_secs(3600)) {
            Ok(request) => request,
            Err(CmError::Timeout { .. }) => continue,
            Err(e) => {
                println!("cmatose: failure in rdma_get_cm_event in connect events: {e}");
                return -1;
            }
        };
        let mut node = match Node::new(&nic, count, args.size) {
            Ok(node) => node,
            Err(e) => {
                println!("{e}");
                println!("cmatose: failing connection request");
                let _ = request.reject(&[]);
                continue;
            }
        };
        // rdma_accept(NULL): the REQ's resources, swapped; RNR retries 7.
        let param = ConnParam {
            responder_resources: request.req().initiator_depth,
            initiator_depth: request.req().responder_resources,
            ..ConnParam::default()
        };
        match request.accept(&node.qp, &param) {
            Ok(conn) => match conn.wait_established(STEP) {
                Ok(()) => node.conn = Some(conn),
                Err(e) => println!("cmatose: event: RDMA_CM_EVENT_CONNECT_ERROR, error: {e}"),
            },
            Err(e) => println!("cmatose: failure accepting: {e}"),
        }
        nodes.push(node);
    }
    if count > 0 {
        println!("initiating data transfers");
        for node in nodes.iter().filter(|n| n.conn.is_some()) {
            if let Err(e) = node.post_sends(count, args.size) {
                println!("{e}");
                return -1;
            }
        }
        println!("completing sends");
        for node in nodes.iter().filter(|n| n.conn.is_some()) {
            if let Err(e) = Node::poll(&node.send_cq, count) {
                println!("{e}");
                return -1;
            }
        }
        println!("receiving data transfers");
        for node in nodes.iter().filter(|n| n.conn.is_some()) {
            if let Err(e) = Node::poll(&node.recv_cq, count) {
                println!("{e}");
                return -1;
            }
        }
        println!("data transfers complete");
    }
    println!("cmatose: disconnecting");
    // A further request is refused, as cmatose refuses one beyond -c.
    while let Ok(extra) = listener.get_request(Duration::ZERO) {
        println!("cmatose: failing connection request");
        let _ = extra.reject(&[]);
    }
    let mut status = 0;
    for node in &nodes {
        if let Some(conn) = &node.conn {
            if let Err(e) = conn.disconnect(STEP) {
                println!("cmatose: failure in rdma_get_cm_event in disconnect events: {e}");
                status = -1;
            }
        }
    }
    println!("disconnected");
    status
}
