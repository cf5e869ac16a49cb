//! `ferroce rping`: librdmacm's `rping`, same flags, same exchange, same output, over a
//! connection made by ferroce's connection manager, so either side can be the real tool.
//!
//! Each ping: the client SENDs where its ping buffer is (`{be64 addr, be32 rkey, be32 len}`);
//! the server READs it and SENDs a go-ahead; the client SENDs where its sink is; the server
//! WRITEs the ping back there and SENDs a go-ahead; the client compares (`-V`). Then the
//! client disconnects.

use std::net::{IpAddr, Ipv4Addr};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use ferroce::cm::{CmError, ConnParam, Connection, Listener};
use ferroce::cq::{Completion, WcOpcode, WcStatus};
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, RemoteAddr, SendOp, SendWr};
use ferroce::{Cq, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

use crate::common::cm::route_source;

/// The largest ping (`RPING_BUFSIZE` − 1).
const MAX_SIZE: u32 = 64 * 1024 - 1;
/// The smallest ping: room for "rdma-ping-2147483647: " and its NUL.
const MIN_SIZE: u32 = 26;
/// The 16-byte advertisement each SEND carries.
const INFO_LEN: u32 = 16;
/// How long a ping may take before the run counts as stuck.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// Flags of `rping`, with its defaults.
#[derive(Args, Debug)]
#[command(disable_version_flag = true)]
pub(crate) struct RpingArgs {
    /// Server side.
    #[arg(short = 's')]
    server: bool,
    /// Client side.
    #[arg(short = 'c')]
    client: bool,
    /// The address: the server binds to it (the soft NIC's address), the client connects to
    /// it.
    #[arg(short = 'a')]
    addr: Option<IpAddr>,
    /// The client's source address (its soft NIC's); by default the route's to `-a`.
    #[arg(short = 'I')]
    source: Option<IpAddr>,
    /// The rdma_cm port.
    #[arg(short = 'p', default_value_t = 7174)]
    port: u16,
    /// Pings; 0 pings until stopped.
    #[arg(short = 'C', default_value_t = 0)]
    count: u32,
    /// Ping data size.
    #[arg(short = 'S', default_value_t = 64)]
    size: u32,
    /// Print the ping data.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    verbose: u8,
    /// Validate the ping data.
    #[arg(short = 'V', action = clap::ArgAction::Count)]
    validate: u8,
    /// Debug output.
    #[arg(short = 'd', action = clap::ArgAction::Count)]
    debug: u8,
    /// Persistent server: serve one client after another.
    #[arg(short = 'P')]
    persistent: bool,
    /// Use a self-created, self-modified QP (what ferroce always does; accepted).
    #[arg(short = 'q')]
    self_create_qp: bool,
    /// Type of service (accepted; the soft NIC sends TOS 0).
    #[arg(short = 't')]
    tos: Option<u8>,
    /// The soft NIC's address, where -a (server) or -I (client) does not give it.
    #[arg(long = "local")]
    local: Option<IpAddr>,
}

pub(crate) fn run(args: &RpingArgs) -> ExitCode {
    if args.server == args.client {
        eprintln!("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]");
        eprintln!("rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]");
        return ExitCode::from(22);
    }
    if !(MIN_SIZE..=MAX_SIZE).contains(&args.size) {
        eprintln!(
            "Invalid size {} (valid range is {MIN_SIZE} to {})",
            args.size,
            MAX_SIZE + 1
        );
        return ExitCode::from(22);
    }
    let result = if args.server { serve(args) } else { ping(args) };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            // rping returns its -1, which the shell sees as 255.
            ExitCode::from(255)
        }
    }
}

fn open(addr: IpAddr) -> Result<Nic, String> {
    Nic::open(&NicConfig::on(addr)).map_err(|e| format!("rdma_bind_addr: {e}"))
}

/// The buffers and queues of one connection, as rping sets them up.
struct Side {
    cq: Cq,
    qp: Qp,
    recv: Region,
    send: Region,
    rdma: Region,
    size: u32,
    debug: bool,
}

impl Side {
    fn new(nic: &Nic, size: u32, debug: bool) -> Result<Self, String> {
        let cq = Cq::new(nic, 32).map_err(|e| format!("ibv_create_cq failed: {e}"))?;
        let caps = QpCaps {
            sq_depth: 16,
            rq_depth: 2,
            max_inline: 0,
        };
        let qp =
            Qp::new(nic, QpType::Rc, &cq, &cq, caps).map_err(|e| format!("rdma_create_qp: {e}"))?;
        let register = |access, bytes| {
            Region::register(nic, access, WriteOrder::InOrder, RegionMemory::Host(bytes))
                .map_err(|e| format!("reg_mr failed: {e}"))
        };
        let side = Self {
            recv: register(RegionAccess::Local, vec![0; INFO_LEN as usize])?,
            send: register(RegionAccess::Local, vec![0; INFO_LEN as usize])?,
            rdma: register(RegionAccess::Remote, vec![0; size as usize])?,
            cq,
            qp,
            size,
            debug,
        };
        side.post_recv()?;
        Ok(side)
    }

    fn post_recv(&self) -> Result<(), String> {
        let sge = self.recv.local(0, INFO_LEN).map_err(|e| e.to_string())?;
        self.qp
            .post_recv(RecvWr {
                wr_id: 0,
                sges: vec![sge],
            })
            .map_err(|e| format!("post recv error: {e}"))
    }

    /// SENDs `{addr, rkey, len}` of `region`.
    fn advertise(&self, region: &Region, len: u32) -> Result<(), String> {
        let mut info = [0; INFO_LEN as usize];
        info[..8].copy_from_slice(&region.va().to_be_bytes());
        info[8..12].copy_from_slice(&region.rkey().to_be_bytes());
        info[12..].copy_from_slice(&len.to_be_bytes());
        self.send.write(0, &info).map_err(|e| e.to_string())?;
        if self.debug {
            println!(
                "RDMA addr {:x} rkey {:x} len {len}",
                region.va(),
                region.rkey()
            );
        }
        self.go_ahead()
    }

    /// SENDs the 16-byte buffer as it is (the server's go-ahead).
    fn go_ahead(&self) -> Result<(), String> {
        let sge = self.send.local(0, INFO_LEN).map_err(|e| e.to_string())?;
        self.qp
            .post_send(SendWr::new(1, SendOp::Send, Payload::Sge(sge)))
            .map_err(|e| format!("post send error {e}"))
    }

    /// Waits for the next completion of `opcode`, passing over SEND completions; `None` when
    /// the QP was flushed (the peer disconnected).
    fn wait_for(&self, opcode: WcOpcode) -> Result<Option<Completion>, String> {
        loop {
            let Some(wc) = self.cq.wait(STEP_TIMEOUT) else {
                return Err(format!("no completion within {STEP_TIMEOUT:?}"));
            };
            if wc.status == WcStatus::WrFlushErr {
                return Ok(None);
            }
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "cq completion failed status {}",
                    wc.status.ibv_value()
                ));
            }
            if wc.opcode == WcOpcode::Recv {
                if wc.byte_len != INFO_LEN {
                    return Err(format!("Received bogus data, size {}", wc.byte_len));
                }
                self.post_recv()?;
            }
            if wc.opcode == opcode {
                return Ok(Some(wc));
            }
        }
    }

    /// The peer's advertisement in the receive buffer.
    fn received(&self) -> Result<RemoteAddr, String> {
        let mut info = [0; INFO_LEN as usize];
        self.recv.read(0, &mut info).map_err(|e| e.to_string())?;
        let va = u64::from_be_bytes(info[..8].try_into().unwrap_or_default());
        let rkey = u32::from_be_bytes(info[8..12].try_into().unwrap_or_default());
        let len = u32::from_be_bytes(info[12..].try_into().unwrap_or_default());
        if self.debug {
            println!("Received rkey {rkey:x} addr {va:x} len {len} from peer");
        }
        if len > self.size {
            return Err(format!(
                "the peer's {len}-byte ping does not fit this side's {} bytes",
                self.size
            ));
        }
        Ok(RemoteAddr { va, rkey })
    }

    fn received_len(&self) -> Result<u32, String> {
        let mut len = [0; 4];
        self.recv.read(12, &mut len).map_err(|e| e.to_string())?;
        Ok(u32::from_be_bytes(len))
    }

    /// The NUL-ended text at the start of `region`.
    fn text(region: &Region, size: u32) -> String {
        let mut bytes = vec![0; size as usize];
        let _ = region.read(0, &mut bytes);
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }
}

/// The ping buffer's content: "rdma-ping-N: " then letters from `start` on, NUL-ended.
fn ping_data(ping: u32, start: u8, size: usize) -> Vec<u8> {
    let mut buf = format!("rdma-ping-{ping}: ").into_bytes();
    buf.truncate(size);
    let mut c = start;
    while buf.len() < size {
        buf.push(c);
        c = if c >= 122 { 65 } else { c + 1 };
    }
    buf[size - 1] = 0;
    buf
}

fn connect_error(e: &CmError) -> String {
    match e {
        CmError::Rejected { reason, .. } => format!(
            "cma event RDMA_CM_EVENT_REJECTED, error {}\nwait for CONNECTED state 10\nconnect error -1",
            reason.code()
        ),
        CmError::Unreachable => "cma event RDMA_CM_EVENT_UNREACHABLE, error -110\nwait for CONNECTED state 10\nconnect error -1".into(),
        other => format!("rdma_connect: {other}\nconnect error -1"),
    }
}

fn ping(args: &RpingArgs) -> Result<(), String> {
    let Some(server) = args.addr else {
        return Err("rping -c needs -a: the server's address".into());
    };
    let local = args
        .source
        .or(args.local)
        .or_else(|| route_source(server))
        .ok_or("no route to the server's address")?;
    let nic = open(local)?;
    let side = Side::new(&nic, args.size, args.debug > 0)?;
    let start_buf = Region::register(
        &nic,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; args.size as usize]),
    )
    .map_err(|e| format!("start_buf reg_mr failed: {e}"))?;
    let conn = Connection::connect(&nic, &side.qp, server, args.port, &ConnParam::default())
        .map_err(|e| connect_error(&e))?;
    let mut start = 65u8;
    let mut ping = 0;
    while args.count == 0 || ping < args.count {
        let data = ping_data(ping, start, args.size as usize);
        start = if start >= 122 { 65 } else { start + 1 };
        start_buf.write(0, &data).map_err(|e| e.to_string())?;
        side.advertise(&start_buf, args.size)?;
        if side.wait_for(WcOpcode::Recv)?.is_none() {
            break;
        }
        side.advertise(&side.rdma, args.size)?;
        if side.wait_for(WcOpcode::Recv)?.is_none() {
            break;
        }
        if args.validate > 0 {
            let mut back = vec![0; args.size as usize];
            side.rdma.read(0, &mut back).map_err(|e| e.to_string())?;
            if back != data {
                return Err("data mismatch!\nrping client failed: -1".into());
            }
        }
        if args.verbose > 0 {
            println!("ping data: {}", Side::text(&side.rdma, args.size));
        }
        ping += 1;
    }
    // rping's exit status does not wait on the DREP (the kernel resends a lost DREQ after the
    // process is gone); ferroce's DREQ lives in this process, so wait for it a while.
    match conn.disconnect(Duration::from_secs(30)) {
        Ok(()) => eprintln!("client DISCONNECT EVENT..."),
        Err(e) => eprintln!("rdma_disconnect: {e}"),
    }
    Ok(())
}

fn serve(args: &RpingArgs) -> Result<(), String> {
    let local = args
        .addr
        .filter(|a| !a.is_unspecified())
        .or(args.local)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let nic = open(local)?;
    let listener = Listener::bind(&nic, args.port).map_err(|e| format!("rdma_listen: {e}"))?;
    loop {
        let request = loop {
            match listener.get_request(Duration::from_secs(3600)) {
                Ok(request) => break request,
                Err(CmError::Timeout { .. }) => continue,
                Err(e) => return Err(format!("rdma_get_request: {e}")),
            }
        };
        let result = serve_one(&nic, args, request);
        if !args.persistent {
            // The client disconnected: stay to answer its DREQ again should the DREP have
            // been lost (a persistent server stays anyway).
            ferroce::cm::linger(&nic, ferroce::cm::LINGER);
            return result;
        }
        if let Err(e) = result {
            eprintln!("{e}");
        }
    }
}

fn serve_one(
    nic: &Nic,
    args: &RpingArgs,
    request: ferroce::cm::ConnectRequest,
) -> Result<(), String> {
    let side = Side::new(nic, args.size, args.debug > 0)?;
    // rdma_accept(NULL): the REQ's initiator depth and responder resources, swapped.
    let param = ConnParam {
        responder_resources: request.req().initiator_depth,
        initiator_depth: request.req().responder_resources,
        ..ConnParam::default()
    };
    let conn = request
        .accept(&side.qp, &param)
        .map_err(|e| format!("rdma_accept: {e}\nconnect error -1"))?;
    conn.wait_established(STEP_TIMEOUT)
        .map_err(|e| format!("wait for CONNECTED state: {e}"))?;
    let sink = &side.rdma;
    loop {
        // The client's ping buffer, or its disconnect.
        if side.wait_for(WcOpcode::Recv)?.is_none() {
            break;
        }
        let remote = side.received()?;
        let len = side.received_len()?;
        let sge = sink.local(0, len).map_err(|e| e.to_string())?;
        side.qp
            .post_send(SendWr::new(2, SendOp::Read(remote), Payload::Sge(sge)))
            .map_err(|e| format!("post send error {e}"))?;
        if side.wait_for(WcOpcode::RdmaRead)?.is_none() {
            break;
        }
        if args.verbose > 0 {
            println!("server ping data: {}", Side::text(sink, args.size));
        }
        side.go_ahead()?;
        if side.wait_for(WcOpcode::Recv)?.is_none() {
            break;
        }
        let remote = side.received()?;
        let text_len = Side::text(sink, args.size).len() as u32 + 1;
        let sge = sink
            .local(0, text_len.min(args.size))
            .map_err(|e| e.to_string())?;
        side.qp
            .post_send(SendWr::new(3, SendOp::Write(remote), Payload::Sge(sge)))
            .map_err(|e| format!("post send error {e}"))?;
        if side.wait_for(WcOpcode::RdmaWrite)?.is_none() {
            break;
        }
        side.go_ahead()?;
    }
    conn.wait_disconnected(Duration::from_secs(10))
        .map_err(|e| format!("rping server failed: {e}"))?;
    eprintln!("server DISCONNECT EVENT...");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ping_data_is_rpings() {
        let data = ping_data(3, 65, 30);
        assert_eq!(&data[..13], b"rdma-ping-3: ");
        assert_eq!(&data[13..16], b"ABC");
        assert_eq!(data[29], 0);
        let wrapped = ping_data(0, 121, 20);
        assert_eq!(&wrapped[13..16], b"yzA");
    }
}
