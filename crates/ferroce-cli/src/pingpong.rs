//! `ferroce pingpong`: rdma-core's `ibv_rc_pingpong`, same flags, same out-of-band message on
//! TCP 18515, same output, over the soft NIC.

use std::process::ExitCode;

use clap::Args;
use ferroce::exchange::PingpongDest;
use ferroce::proto::memory::WriteOrder;
use ferroce::qp::{Mtu, Payload, QpCaps, QpType, SendOp, SendWr};
use ferroce::{ConnectOptions, Cq, Qp, Region, RegionAccess, RegionMemory};

use crate::common::pingpong::{
    client_exchange, exchange_loop, fail, post_receives, print_result, server_exchange, NicFlags,
    SEND_WRID,
};

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
