//! `ferroce ud-pingpong`: rdma-core's `ibv_ud_pingpong`, same flags, same out-of-band lines on
//! TCP 18515, same output, over a UD queue pair of the soft NIC.
//!
//! Each message is one datagram of at most the port's MTU, with Q_Key 0x11111111, sent to the
//! peer's GID; each receive buffer holds the 40-byte header before the payload. UD does not
//! resend: a datagram lost on the way stops the ping-pong, which then says so after 10 s
//! instead of waiting forever as the original does. The loop is `ibv_rc_pingpong`'s
//! (`common::pingpong::exchange_loop`).

use std::process::ExitCode;

use clap::Args;
use ferroce::exchange::PingpongDest;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::ud::{AddressHandle, UD_GRH_LEN};
use ferroce::{Cq, Qp, Region, RegionAccess, RegionMemory};

use crate::common::pingpong::{
    client_exchange, exchange_loop, fail, post_receives, print_result, server_exchange, NicFlags,
    SEND_WRID,
};

/// The Q_Key `ibv_ud_pingpong` gives its QP and sends with.
const QKEY: u32 = 0x1111_1111;

/// Flags of `ibv_ud_pingpong`, with its defaults.
#[derive(Args, Debug)]
pub(crate) struct UdPingpongArgs {
    /// The server to connect to; without it, wait for a client.
    server: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    #[command(flatten)]
    nic: NicFlags,
    /// Message size in bytes: at most the port's MTU.
    #[arg(short = 's', long = "size", default_value_t = 2048)]
    size: u32,
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
}

pub(crate) fn run(args: &UdPingpongArgs) -> ExitCode {
    match ping_pong(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn ping_pong(args: &UdPingpongArgs) -> Result<(), String> {
    let nic = args.nic.open()?;
    let mtu = nic.active_mtu().bytes();
    if args.size > mtu {
        return Err(format!("Requested size larger than port MTU ({mtu})"));
    }
    let cq = Cq::new(&nic, args.rx_depth as usize + 1)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let caps = QpCaps {
        sq_depth: 1,
        rq_depth: args.rx_depth.max(1),
        max_inline: 0,
    };
    let qp = Qp::new(&nic, QpType::Ud, &cq, &cq, caps)
        .map_err(|e| format!("Couldn't create QP: {e}"))?;
    // As the original: one buffer of 40 + size bytes of 0x7b; receives land at its start (the
    // header, then the payload), sends go from byte 40.
    let len = args.size as usize + UD_GRH_LEN;
    let buf = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0x7b; len]),
    )
    .map_err(|e| format!("Couldn't register MR: {e}"))?;
    let recv_sge = buf
        .local(0, len as u32)
        .map_err(|_| "Couldn't register MR")?;
    let send_sge = buf
        .local(UD_GRH_LEN as u64, args.size)
        .map_err(|_| "Couldn't register MR")?;
    qp.ready_ud(QKEY)
        .map_err(|e| format!("Failed to modify QP to RTS: {e}"))?;
    let post_recv = |n: u32| post_receives(n, recv_sge, |wr| qp.post_recv(wr));
    let mut routs = post_recv(args.rx_depth);
    if routs < args.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }

    let local = PingpongDest::from_endpoint(&qp.endpoint());
    // The original's local line has a colon before the GID where the remote line has a comma.
    println!(
        "  local address:  LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}: GID {}",
        local.lid,
        local.qpn.value(),
        local.psn.value(),
        local.gid
    );
    let address = |remote: &PingpongDest| -> Result<AddressHandle, String> {
        let ip = remote.endpoint().addr.ip();
        if ip.is_unspecified() {
            return Err(
                "The peer sent no GID: run ibv_ud_pingpong with -g, RoCE reaches a peer by its GID"
                    .into(),
            );
        }
        Ok(AddressHandle::new(ip))
    };
    let mut ah = None;
    let remote = match &args.server {
        Some(server) => client_exchange(server, args.port, &[local], 1)?,
        None => server_exchange(args.port, &[local], 1, |remote| {
            ah = Some(address(&remote[0])?);
            Ok(())
        })?,
    }[0];
    println!("  remote address: {remote}");
    let ah = match ah {
        Some(ah) => ah,
        None => address(&remote)?,
    };
    let to = ah.dest(remote.qpn, QKEY);
    let send = || {
        qp.post_send(SendWr::to(
            SEND_WRID,
            SendOp::Send,
            Payload::Sge(send_sge),
            to,
        ))
        .map_err(|e| format!("Couldn't post send: {e}"))
    };

    let on_recv = |_| {
        routs -= 1;
        if routs <= 1 {
            routs += post_recv(args.rx_depth - routs);
            if routs < args.rx_depth {
                return Err(format!("Couldn't post receive ({routs})"));
            }
        }
        Ok(())
    };
    let start = exchange_loop(
        &cq,
        args.events,
        args.iters,
        args.server.is_some(),
        send,
        on_recv,
        "a datagram was lost, and UD does not resend (or the peer stopped answering)",
    )?;
    print_result(start, args.size, args.iters);
    args.nic.finish(&nic);
    let _ = args.sl;
    Ok(())
}
