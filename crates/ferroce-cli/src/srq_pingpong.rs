//! `ferroce srq-pingpong`: rdma-core's `ibv_srq_pingpong`, same flags, same out-of-band lines
//! on TCP 18515 (always 256 of them, the unused ones zero), same output: `-q` RC queue pairs
//! ping-pong at once, every receive taken from one shared receive queue, each completion told
//! apart by the QP it names.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use ferroce::cq::WcStatus;
use ferroce::exchange::PingpongDest;
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::wire::Qpn;
use ferroce::proto::Psn;
use ferroce::qp::{Mtu, Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Qp, Region, RegionAccess, RegionMemory, Srq};

use crate::common::pingpong::{
    client_exchange, fail, post_receives, print_result, server_exchange, NicFlags, Waiter,
    RECV_WRID, SEND_WRID,
};
/// The lines `ibv_srq_pingpong` exchanges, whatever `-q` says.
const MAX_QP: usize = 256;

/// Flags of `ibv_srq_pingpong`, with its defaults.
#[derive(Args, Debug)]
pub(crate) struct SrqPingpongArgs {
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
    /// Queue pairs, at most 256.
    #[arg(short = 'q', long = "num-qp", default_value_t = 16)]
    num_qp: u32,
    /// Receives to keep posted in the shared receive queue.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// Iterations, over all queue pairs together.
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// Service level (accepted for compatibility).
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long = "events")]
    events: bool,
}

pub(crate) fn run(args: &SrqPingpongArgs) -> ExitCode {
    match ping_pong(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

fn ping_pong(args: &SrqPingpongArgs) -> Result<(), String> {
    let Some(mtu) = Mtu::from_bytes(args.mtu) else {
        return Err(format!(
            "Invalid MTU {}: use 256, 512, 1024, 2048 or 4096",
            args.mtu
        ));
    };
    let num_qp = args.num_qp as usize;
    if num_qp == 0 || num_qp > MAX_QP {
        return Err(format!("-q {num_qp}: use 1 to {MAX_QP} queue pairs"));
    }
    if args.size == 0 {
        return Err("-s 0: the size must be at least 1".into());
    }
    if args.num_qp > args.rx_depth {
        return Err(format!(
            "rx_depth {} is too small for {} QPs -- must have at least one receive per QP.",
            args.rx_depth, args.num_qp
        ));
    }
    let nic = args.nic.open()?;
    let cq = Cq::new(&nic, (args.rx_depth + args.num_qp) as usize)
        .map_err(|e| format!("Couldn't create CQ: {e}"))?;
    let srq = Srq::new(&nic, args.rx_depth).map_err(|e| format!("Couldn't create SRQ: {e}"))?;
    let caps = QpCaps {
        sq_depth: 1,
        rq_depth: 0,
        max_inline: 0,
    };
    let qps = (0..num_qp)
        .map(|i| {
            Qp::with_srq(&nic, QpType::Rc, &cq, &cq, &srq, caps)
                .map_err(|e| format!("Couldn't create QP[{i}]: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // As the original: one zeroed buffer that every send goes from and every receive lands in.
    let buf = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; args.size as usize]),
    )
    .map_err(|e| format!("Couldn't register MR: {e}"))?;
    let sge = buf
        .local(0, args.size)
        .map_err(|_| "Couldn't register MR")?;
    let post_recv = |n: u32| post_receives(n, sge, |wr| srq.post_recv(wr));
    let mut routs = post_recv(args.rx_depth);
    if routs < args.rx_depth {
        return Err(format!("Couldn't post receive ({routs})"));
    }

    let mut locals = vec![
        PingpongDest {
            lid: 0,
            qpn: Qpn::default(),
            psn: Psn::default(),
            gid: std::net::Ipv6Addr::UNSPECIFIED,
        };
        MAX_QP
    ];
    for (local, qp) in locals.iter_mut().zip(&qps) {
        *local = PingpongDest::from_endpoint(&qp.endpoint());
        println!("  local address:  {local}");
    }
    let connect = |remotes: &[PingpongDest]| -> Result<(), String> {
        let options = ConnectOptions {
            mtu,
            access: RegionAccess::Local,
            max_rd_atomic: 1,
            ..ConnectOptions::default()
        };
        for (i, (qp, remote)) in qps.iter().zip(remotes).enumerate() {
            // The original addresses every QP by the first line's GID.
            let mut endpoint = remote.endpoint();
            endpoint.addr = remotes[0].endpoint().addr;
            qp.connect(&endpoint, &options)
                .map_err(|e| format!("Failed to modify QP[{i}] to RTR/RTS: {e}"))?;
        }
        Ok(())
    };
    let remotes = match &args.server {
        Some(server) => client_exchange(server, args.port, &locals, MAX_QP)?,
        None => server_exchange(args.port, &locals, MAX_QP, connect)?,
    };
    for remote in &remotes[..num_qp] {
        println!("  remote address: {remote}");
    }
    if args.server.is_some() {
        connect(&remotes)?;
    }

    let send = |i: usize| {
        qps[i]
            .post_send(SendWr::new(SEND_WRID, SendOp::Send, Payload::Sge(sge)))
            .map_err(|e| format!("Couldn't post send: {e}"))
    };
    let mut pending = vec![RECV_WRID; num_qp];
    if args.server.is_some() {
        for (i, pending) in pending.iter_mut().enumerate() {
            send(i)?;
            *pending = SEND_WRID | RECV_WRID;
        }
    }
    let index: std::collections::HashMap<Qpn, usize> = qps
        .iter()
        .enumerate()
        .map(|(i, qp)| (qp.qpn(), i))
        .collect();
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let start = Instant::now();
    let mut waiter = Waiter::new(args.events, start);
    while rcnt < args.iters || scnt < args.iters {
        let Some(wc) = waiter
            .next(&cq)
            .map_err(|e| format!("{e}: the peer stopped answering"))?
        else {
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
        let Some(&i) = index.get(&wc.qpn) else {
            return Err(format!("Couldn't find QPN {:06x}", wc.qpn.value()));
        };
        match wc.wr_id {
            SEND_WRID => scnt += 1,
            RECV_WRID => {
                routs -= 1;
                if routs <= args.num_qp {
                    routs += post_recv(args.rx_depth - routs);
                    if routs < args.rx_depth {
                        return Err(format!("Couldn't post receive ({routs})"));
                    }
                }
                rcnt += 1;
            }
            other => return Err(format!("Completion for unknown wr_id {other}")),
        }
        pending[i] &= !wc.wr_id;
        if scnt < args.iters && pending[i] == 0 {
            send(i)?;
            pending[i] = RECV_WRID | SEND_WRID;
        }
    }
    print_result(start, args.size, args.iters);
    args.nic.finish(&nic);
    let _ = args.sl;
    Ok(())
}
