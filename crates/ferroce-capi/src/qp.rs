//! Queue pairs and completion queues: `ferroce_qp`, `ferroce_cq`.
//!
//! The verbs under the faces: an RC (or UC) queue pair connected to a peer's endpoint, work
//! requests naming regions by address and key (Rig_mlx5's `Region.local` and `remote`), and
//! completions polled from a CQ. Numbers follow libibverbs where C users look for them: the
//! completion's `status` is `enum ibv_wc_status`, its `opcode` `enum ibv_wc_opcode`.

use std::ffi::{c_char, CString};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use ferroce::proto::qp::{Completion, ModifyError, WcOpcode, WcStatus};
use ferroce::proto::wire::Qpn;
use ferroce::proto::Psn;
use ferroce::qp::{
    Mtu, Payload, PostError, QpCaps, QpType, RecvWr, RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce::{ConnectOptions, Cq, Qp, QpEndpoint};

use crate::fence::{
    fence, fence_result, free_handle, handle, into_handle, versioned, write_out, Failure, Outcome,
};
use crate::ferroce_result;
use crate::nic::{ferroce_nic, nic_failure, parse_addr};
use crate::region::access_arg;

/// A completion queue. Thread-safe.
pub struct ferroce_cq {
    pub(crate) cq: Cq,
}

/// A queue pair. Thread-safe: work may be posted from several threads.
pub struct ferroce_qp {
    pub(crate) qp: Qp,
}

/// `ferroce_qp_new`'s `qp_type`: Reliable Connected (every verb, acknowledged).
pub const FERROCE_QP_RC: u32 = 0;
/// `ferroce_qp_new`'s `qp_type`: Unreliable Connected (SEND and WRITE, no acknowledgements).
pub const FERROCE_QP_UC: u32 = 1;
/// `ferroce_qp_new`'s `qp_type`: Unreliable Datagram (`IBV_QPT_UD`): one packet per SEND to
/// the queue pair each request names, brought up with `ferroce_qp_ready_ud`; every receive
/// buffer begins with the 40-byte GRH (`FERROCE_UD_GRH_LEN`).
pub const FERROCE_QP_UD: u32 = 2;

/// `ferroce_send_wr.opcode`: SEND.
pub const FERROCE_WR_SEND: u32 = 0;
/// `ferroce_send_wr.opcode`: SEND with immediate data (`imm`).
pub const FERROCE_WR_SEND_WITH_IMM: u32 = 1;
/// `ferroce_send_wr.opcode`: RDMA WRITE to `remote_addr`/`rkey`.
pub const FERROCE_WR_WRITE: u32 = 2;
/// `ferroce_send_wr.opcode`: RDMA WRITE, then immediate data that takes a receive.
pub const FERROCE_WR_WRITE_WITH_IMM: u32 = 3;
/// `ferroce_send_wr.opcode`: RDMA READ from `remote_addr`/`rkey` into the local bytes.
pub const FERROCE_WR_READ: u32 = 4;

/// `ferroce_send_wr.flags`: complete with a completion on success (`IBV_SEND_SIGNALED`).
pub const FERROCE_SEND_SIGNALED: u32 = 1;
/// `ferroce_send_wr.flags`: wait for earlier READs first (`IBV_SEND_FENCE`).
pub const FERROCE_SEND_FENCE: u32 = 2;
/// `ferroce_send_wr.flags`: ask the peer for a solicited event (`IBV_SEND_SOLICITED`).
pub const FERROCE_SEND_SOLICITED: u32 = 4;

/// `ferroce_completion.flags`: `imm` holds immediate data.
pub const FERROCE_WC_WITH_IMM: u32 = 1;

/// What a peer needs to reach a queue pair; exchange it out of band (a file, a pipe, TCP).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_endpoint {
    /// The queue pair number.
    pub qpn: u32,
    /// The first PSN its requester sends.
    pub psn: u32,
    /// Its NIC's address and port as NUL-terminated text, `"127.0.0.2:4791"`.
    pub addr: [c_char; 64],
}

/// A queue pair's capacities. Versioned: set `struct_size` to `sizeof`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_qp_caps {
    /// `sizeof(ferroce_qp_caps)`.
    pub struct_size: u32,
    /// Send work requests outstanding at once.
    pub sq_depth: u32,
    /// Receive work requests outstanding at once.
    pub rq_depth: u32,
    /// The largest inline send, in bytes.
    pub max_inline: u32,
}

/// How to connect a queue pair. Versioned: set `struct_size` to `sizeof`. A NULL options
/// pointer takes `ibv_rc_pingpong`'s defaults.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_connect_options {
    /// `sizeof(ferroce_connect_options)`.
    pub struct_size: u32,
    /// What the peer may do through this queue pair (`FERROCE_ACCESS_*`).
    pub access: u32,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    pub mtu: u32,
    /// ACK timeout exponent: 4.096 µs × 2^timeout (14).
    pub timeout: u8,
    /// Retries after timeouts (7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7: forever).
    pub rnr_retry: u8,
    /// READs outstanding each way (16).
    pub max_rd_atomic: u8,
}

/// A send work request (`struct ibv_send_wr` with one gather entry). Versioned: set
/// `struct_size` to `sizeof`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_send_wr {
    /// `sizeof(ferroce_send_wr)`.
    pub struct_size: u32,
    /// `FERROCE_WR_*`.
    pub opcode: u32,
    /// Returned in the completion.
    pub wr_id: u64,
    /// The local bytes: their address in a region (`ferroce_region_addr` + offset).
    pub local_addr: u64,
    /// Their length; 0 sends no bytes.
    pub length: u32,
    /// The local region's key (`ferroce_region_lkey`).
    pub lkey: u32,
    /// For WRITE and READ: the peer's address.
    pub remote_addr: u64,
    /// For WRITE and READ: the peer's key.
    pub rkey: u32,
    /// For the `_WITH_IMM` opcodes: the immediate data.
    pub imm: u32,
    /// `FERROCE_SEND_*` flags.
    pub flags: u32,
}

/// A work completion (`struct ibv_wc`, its common fields).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_completion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended: `enum ibv_wc_status` (0 is success).
    pub status: u32,
    /// What it was: `enum ibv_wc_opcode` (0 SEND, 1 RDMA_WRITE, 2 RDMA_READ, 128 RECV, 129
    /// RECV_RDMA_WITH_IMM).
    pub opcode: u32,
    /// Bytes received or transferred.
    pub byte_len: u32,
    /// Immediate data, when `flags` has `FERROCE_WC_WITH_IMM`.
    pub imm: u32,
    /// The local queue pair.
    pub qpn: u32,
    /// `FERROCE_WC_*` flags.
    pub flags: u32,
}

pub(crate) fn completion(c: &Completion) -> ferroce_completion {
    let opcode = match c.opcode {
        WcOpcode::Send => 0,
        WcOpcode::RdmaWrite => 1,
        WcOpcode::RdmaRead => 2,
        WcOpcode::CompSwap => 3,
        WcOpcode::FetchAdd => 4,
        WcOpcode::Recv => 128,
        WcOpcode::RecvRdmaWithImm => 129,
    };
    ferroce_completion {
        wr_id: c.wr_id,
        status: c.status.ibv_value(),
        opcode,
        byte_len: c.byte_len,
        imm: c.imm.unwrap_or(0),
        qpn: c.qpn.value(),
        flags: if c.imm.is_some() {
            FERROCE_WC_WITH_IMM
        } else {
            0
        },
    }
}

pub(crate) fn post_failure(e: &PostError) -> Failure {
    match e {
        PostError::Device(_) => Failure::new(ferroce_result::Device, e),
        PostError::QueueFull(_) => Failure::failed(e),
        _ => Failure::invalid(e),
    }
}

pub(crate) fn modify_failure(e: &ModifyError) -> Failure {
    match e {
        ModifyError::Device(_) => Failure::new(ferroce_result::Device, e),
        _ => Failure::invalid(e),
    }
}

/// A completion queue of `nic` holding at least `depth` completions (`ibv_create_cq`).
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_new(
    nic: *const ferroce_nic,
    depth: usize,
    out: *mut *mut ferroce_cq,
) -> ferroce_result {
    fence_result("ferroce_cq_new", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        if depth == 0 || depth > 1 << 20 {
            return Err(Failure::invalid(format_args!(
                "depth {depth}: a CQ holds 1 to 1048576 completions"
            )));
        }
        let cq = Cq::new(&nic.nic, depth).map_err(|e| nic_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_cq { cq }), "out") }
    })
}

/// Takes up to `n` completions into `wc` (`ibv_poll_cq`); `*polled` receives how many. When
/// there are none it first makes progress on this thread, so a polling loop needs nothing
/// else.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is NULL or valid for writes of `n` completions; `polled`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_poll(
    cq: *const ferroce_cq,
    wc: *mut ferroce_completion,
    n: usize,
    polled: *mut usize,
) -> ferroce_result {
    fence_result("ferroce_cq_poll", || {
        // SAFETY: the caller promises what `poll_into` asks of `cq`, `wc`, `n` and `polled`.
        unsafe { poll_into(cq, wc, n, polled, completion) }
    })
}

/// The body of `ferroce_cq_poll` and `ferroce_cq_poll_ex`: takes up to `n` completions of
/// `cq`, each shaped by `shape`, into `wc`; `*polled` receives how many.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is NULL or valid for writes of `n` values of `T`; `polled`
/// is NULL or writable.
pub(crate) unsafe fn poll_into<T>(
    cq: *const ferroce_cq,
    wc: *mut T,
    n: usize,
    polled: *mut usize,
    shape: fn(&Completion) -> T,
) -> Outcome {
    // SAFETY: the caller promises NULL or a live CQ.
    let cq = unsafe { handle(cq, "cq") }?;
    if wc.is_null() {
        return Err(Failure::null("wc"));
    }
    if polled.is_null() {
        return Err(Failure::null("polled"));
    }
    let mut got = 0;
    while got < n {
        let Some(c) = cq.cq.poll() else { break };
        // SAFETY: got < n, and the caller promises `n` writable values at `wc`.
        unsafe { wc.add(got).write(shape(&c)) };
        got += 1;
    }
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { write_out(polled, got, "polled") }
}

/// Waits up to `timeout_ms` for one completion, making progress on this thread meanwhile;
/// `TIMEOUT` when none came.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_wait(
    cq: *const ferroce_cq,
    timeout_ms: u32,
    wc: *mut ferroce_completion,
) -> ferroce_result {
    fence_result("ferroce_cq_wait", || {
        // SAFETY: the caller promises what `wait_into` asks of `cq` and `wc`.
        unsafe { wait_into(cq, timeout_ms, wc, completion) }
    })
}

/// The body of `ferroce_cq_wait` and `ferroce_cq_wait_ex`: waits up to `timeout_ms` for one
/// completion of `cq`, making progress on this thread meanwhile, and writes it to `*wc` as
/// `shape` makes it; `TIMEOUT` when none came.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is NULL or writable.
pub(crate) unsafe fn wait_into<T>(
    cq: *const ferroce_cq,
    timeout_ms: u32,
    wc: *mut T,
    shape: fn(&Completion) -> T,
) -> Outcome {
    // SAFETY: the caller promises NULL or a live CQ.
    let cq = unsafe { handle(cq, "cq") }?;
    if wc.is_null() {
        return Err(Failure::null("wc"));
    }
    match cq.cq.drive(Duration::from_millis(timeout_ms.into())) {
        // SAFETY: checked not NULL; the caller promises it is writable.
        Some(c) => unsafe { write_out(wc, shape(&c), "wc") },
        None => Err(Failure::new(
            ferroce_result::Timeout,
            format_args!("no completion within {timeout_ms} ms"),
        )),
    }
}

/// The completion statuses' texts, made once: `(ibv_wc_status_str, hint)` for each value of
/// `enum ibv_wc_status` (0 to 21).
fn status_texts() -> &'static [(CString, Option<CString>)] {
    static TEXTS: OnceLock<Vec<(CString, Option<CString>)>> = OnceLock::new();
    TEXTS.get_or_init(|| {
        (0..=21)
            .map(|v| {
                let status = WcStatus::from_ibv_value(v);
                let text = |t: &str| CString::new(t).unwrap_or_default();
                (text(&status.to_string()), status.hint().map(text))
            })
            .collect()
    })
}

/// rdma-core's text for a completion's `status` (`ibv_wc_status_str`), such as `"remote
/// access error"`: a static string, never NULL (`"unknown status"` past
/// `enum ibv_wc_status`).
#[no_mangle]
pub extern "C" fn ferroce_wc_status_str(status: u32) -> *const c_char {
    fence("ferroce_wc_status_str", || {
        status_texts()
            .get(status as usize)
            .map_or(c"unknown status".as_ptr(), |(text, _)| text.as_ptr())
    })
}

/// What most often causes a completion's `status`, and where to look, as a sentence (for
/// `REM_ACCESS_ERR`: the rkey, the range inside the peer's region, the rights it grants; for
/// `RETRY_EXC_ERR`: the peer's NIC, its QP's connection, the UDP port): a static string, or
/// NULL for a status whose text says enough (success among them).
#[no_mangle]
pub extern "C" fn ferroce_wc_status_hint(status: u32) -> *const c_char {
    fence("ferroce_wc_status_hint", || {
        status_texts()
            .get(status as usize)
            .and_then(|(_, hint)| hint.as_ref())
            .map_or(std::ptr::null(), |hint| hint.as_ptr())
    })
}

/// Frees the CQ handle; NULL does nothing. Queue pairs using it keep it alive.
///
/// # Safety
///
/// `cq` is NULL or a CQ from this library not freed before, which no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_free(cq: *mut ferroce_cq) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_cq_free", || unsafe { free_handle(cq) });
}

pub(crate) fn qp_type_arg(qp_type: u32) -> Result<QpType, Failure> {
    match qp_type {
        FERROCE_QP_RC => Ok(QpType::Rc),
        FERROCE_QP_UC => Ok(QpType::Uc),
        FERROCE_QP_UD => Ok(QpType::Ud),
        other => Err(Failure::invalid(format_args!(
            "qp_type {other} is not FERROCE_QP_RC (0), FERROCE_QP_UC (1) or FERROCE_QP_UD (2)"
        ))),
    }
}

/// The capacities behind `caps`, or the defaults for NULL.
///
/// # Safety
///
/// `caps` is NULL or a `ferroce_qp_caps` of at least its `struct_size` bytes.
pub(crate) unsafe fn caps_arg(caps: *const ferroce_qp_caps) -> Result<QpCaps, Failure> {
    if caps.is_null() {
        return Ok(QpCaps::default());
    }
    // SAFETY: not NULL; the caller promises a struct of at least its struct_size.
    let c = unsafe { versioned(caps, "caps", "ferroce_qp_caps") }?;
    if c.sq_depth == 0 || c.rq_depth == 0 {
        return Err(Failure::invalid(
            "ferroce_qp_caps: sq_depth and rq_depth must be at least 1",
        ));
    }
    Ok(QpCaps {
        sq_depth: c.sq_depth,
        rq_depth: c.rq_depth,
        max_inline: c.max_inline,
    })
}

/// A failure to create a queue pair or SRQ: a CQ or SRQ of another NIC is the caller's
/// mistake (`INVALID`); UD and SRQs on a verbs device are `UNSUPPORTED` (the soft NIC's so
/// far).
pub(crate) fn qp_failure(e: &ferroce::NicError) -> Failure {
    let mut f = nic_failure(e);
    match e {
        ferroce::NicError::OtherNic(_) => f.code = ferroce_result::Invalid,
        ferroce::NicError::SoftOnly(_) => f.code = ferroce_result::Unsupported,
        _ => {}
    }
    f
}

/// A queue pair of `qp_type` (`FERROCE_QP_RC`, `FERROCE_QP_UC` or `FERROCE_QP_UD`) on `nic`
/// (`ibv_create_qp`, then INIT), completing to `send_cq` and `recv_cq`: receives may be
/// posted before `ferroce_qp_connect` (or, for UD, `ferroce_qp_ready_ud`). `caps` may be NULL
/// (128 sends, 128 receives, 400 inline bytes).
///
/// `INVALID` for an unknown `qp_type` or a CQ of another NIC; `UNSUPPORTED` for UD on a
/// verbs device (the soft NIC's so far); `DEVICE` when a verbs device refuses the QP.
///
/// # Safety
///
/// `nic`, `send_cq`, `recv_cq` are NULL or live; `caps` is NULL or a `ferroce_qp_caps` of at
/// least its `struct_size` bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_new(
    nic: *const ferroce_nic,
    qp_type: u32,
    send_cq: *const ferroce_cq,
    recv_cq: *const ferroce_cq,
    caps: *const ferroce_qp_caps,
    out: *mut *mut ferroce_qp,
) -> ferroce_result {
    fence_result("ferroce_qp_new", || {
        // SAFETY: the caller promises NULL or live objects.
        let (nic, scq, rcq) = unsafe {
            (
                handle(nic, "nic")?,
                handle(send_cq, "send_cq")?,
                handle(recv_cq, "recv_cq")?,
            )
        };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let qp_type = qp_type_arg(qp_type)?;
        // SAFETY: the caller promises NULL or a struct of at least its struct_size.
        let caps = unsafe { caps_arg(caps) }?;
        let qp = Qp::new(&nic.nic, qp_type, &scq.cq, &rcq.cq, caps).map_err(|e| qp_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_qp { qp }), "out") }
    })
}

/// The queue pair's number; 0 for a NULL `qp`.
///
/// # Safety
///
/// `qp` is NULL or a live queue pair.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_qpn(qp: *const ferroce_qp) -> u32 {
    fence("ferroce_qp_qpn", || {
        // SAFETY: the caller promises NULL or a live QP.
        unsafe { handle(qp, "qp") }.map_or(0, |q| q.qp.qpn().value())
    })
}

/// The queue pair's endpoint, for the peer's `ferroce_qp_connect`.
///
/// # Safety
///
/// `qp` is NULL or a live queue pair; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_endpoint(
    qp: *const ferroce_qp,
    out: *mut ferroce_endpoint,
) -> ferroce_result {
    fence_result("ferroce_qp_endpoint", || {
        // SAFETY: the caller promises NULL or a live QP.
        let qp = unsafe { handle(qp, "qp") }?;
        let e = qp.qp.endpoint();
        let value = ferroce_endpoint {
            qpn: e.qpn.value(),
            psn: e.psn.value(),
            addr: addr_text(e.addr),
        };
        // SAFETY: the caller promises NULL or writable.
        unsafe { write_out(out, value, "out") }
    })
}

/// Connects the queue pair to `peer`: INIT → RTR → RTS (`ibv_modify_qp` three times).
/// `options` may be NULL for the defaults (MTU 1024, peers may read and write).
///
/// # Safety
///
/// `qp` is NULL or a live queue pair; `peer` is NULL or readable; `options` is NULL or a
/// `ferroce_connect_options` of at least its `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_connect(
    qp: *const ferroce_qp,
    peer: *const ferroce_endpoint,
    options: *const ferroce_connect_options,
) -> ferroce_result {
    fence_result("ferroce_qp_connect", || {
        // SAFETY: the caller promises NULL or live / readable.
        let (qp, peer) = unsafe { (handle(qp, "qp")?, handle(peer, "peer")?) };
        let addr = endpoint_addr(peer, "peer")?;
        let (Some(qpn), Some(psn)) = (Qpn::new(peer.qpn), Psn::new(peer.psn)) else {
            return Err(Failure::invalid(format_args!(
                "peer.qpn {:#x} and peer.psn {:#x} must fit 24 bits",
                peer.qpn, peer.psn
            )));
        };
        let mut opts = ConnectOptions::default();
        // SAFETY: the caller promises NULL or a struct of at least its struct_size.
        if !options.is_null() {
            // SAFETY: as above.
            let o = unsafe { versioned(options, "options", "ferroce_connect_options") }?;
            opts.access = access_arg(o.access)?;
            opts.mtu = match o.mtu {
                256 => Mtu::M256,
                512 => Mtu::M512,
                1024 => Mtu::M1024,
                2048 => Mtu::M2048,
                4096 => Mtu::M4096,
                other => {
                    return Err(Failure::invalid(format_args!(
                        "mtu {other}: give 256, 512, 1024, 2048 or 4096"
                    )))
                }
            };
            opts.timeout = o.timeout;
            opts.retry_cnt = o.retry_cnt;
            opts.rnr_retry = o.rnr_retry;
            opts.max_rd_atomic = o.max_rd_atomic;
        }
        let endpoint = QpEndpoint { qpn, psn, addr };
        qp.qp
            .connect(&endpoint, &opts)
            .map_err(|e| modify_failure(&e))
    })
}

/// Refuses `FERROCE_SEND_*` flags with unknown bits.
pub(crate) fn send_flags(flags: u32, name: &str) -> Result<(), Failure> {
    let known = FERROCE_SEND_SIGNALED | FERROCE_SEND_FENCE | FERROCE_SEND_SOLICITED;
    if flags & !known != 0 {
        return Err(Failure::invalid(format_args!(
            "{name}.flags {flags:#x} has unknown bits"
        )));
    }
    Ok(())
}

/// The operation a `FERROCE_WR_*` opcode names, with its remote address and immediate data.
pub(crate) fn send_op(
    opcode: u32,
    remote_addr: u64,
    rkey: u32,
    imm: u32,
    name: &str,
) -> Result<SendOp, Failure> {
    let remote = RemoteAddr {
        va: remote_addr,
        rkey,
    };
    Ok(match opcode {
        FERROCE_WR_SEND => SendOp::Send,
        FERROCE_WR_SEND_WITH_IMM => SendOp::SendWithImm(imm),
        FERROCE_WR_WRITE => SendOp::Write(remote),
        FERROCE_WR_WRITE_WITH_IMM => SendOp::WriteWithImm(remote, imm),
        FERROCE_WR_READ => SendOp::Read(remote),
        other => {
            return Err(Failure::invalid(format_args!(
                "{name}.opcode {other} is not a FERROCE_WR_* value (0 to 4)"
            )))
        }
    })
}

/// The socket address in an endpoint's NUL-terminated `addr` text.
pub(crate) fn endpoint_addr(e: &ferroce_endpoint, name: &str) -> Result<SocketAddr, Failure> {
    let len = e.addr.iter().position(|&c| c == 0).ok_or_else(|| {
        Failure::invalid(format_args!(
            "{name}.addr is not NUL-terminated within its 64 bytes"
        ))
    })?;
    let text: Vec<u8> = e.addr[..len].iter().map(|&c| c as u8).collect();
    let text = std::str::from_utf8(&text)
        .map_err(|_| Failure::invalid(format_args!("{name}.addr is not UTF-8")))?;
    parse_addr(text, &format!("{name}.addr"))
}

/// An endpoint's `addr` field holding `addr` as text.
pub(crate) fn addr_text(addr: SocketAddr) -> [c_char; 64] {
    let mut out = [0 as c_char; 64];
    // A socket address's text is at most 47 bytes ("[v6%scope]:port"), so it fits.
    for (slot, byte) in out.iter_mut().zip(addr.to_string().bytes().take(63)) {
        *slot = byte as c_char;
    }
    out
}

/// Posts a send work request (`ibv_post_send`). The local bytes must stay registered until
/// it completes.
///
/// # Safety
///
/// `qp` is NULL or a live queue pair; `wr` is NULL or a `ferroce_send_wr` of at least its
/// `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_post_send(
    qp: *const ferroce_qp,
    wr: *const ferroce_send_wr,
) -> ferroce_result {
    fence_result("ferroce_qp_post_send", || {
        // SAFETY: the caller promises NULL or live / readable.
        let (qp, wr) = unsafe { (handle(qp, "qp")?, versioned(wr, "wr", "ferroce_send_wr")?) };
        send_flags(wr.flags, "wr")?;
        let op = send_op(wr.opcode, wr.remote_addr, wr.rkey, wr.imm, "wr")?;
        let local = if wr.length == 0 {
            Payload::Sges(Vec::new())
        } else {
            Payload::Sge(Sge {
                addr: wr.local_addr,
                len: wr.length,
                lkey: wr.lkey,
            })
        };
        let mut send = SendWr::new(wr.wr_id, op, local);
        send.signaled = wr.flags & FERROCE_SEND_SIGNALED != 0;
        send.fence = wr.flags & FERROCE_SEND_FENCE != 0;
        send.solicited = wr.flags & FERROCE_SEND_SOLICITED != 0;
        qp.qp.post_send(send).map_err(|e| post_failure(&e))
    })
}

/// Posts a receive work request of one scatter entry (`ibv_post_recv`): `len` bytes at
/// `addr` of the region with `lkey`; `len` 0 posts one with no entry (for WRITE with
/// immediate).
///
/// # Safety
///
/// `qp` is NULL or a live queue pair.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_post_recv(
    qp: *const ferroce_qp,
    wr_id: u64,
    addr: u64,
    len: u32,
    lkey: u32,
) -> ferroce_result {
    fence_result("ferroce_qp_post_recv", || {
        // SAFETY: the caller promises NULL or a live QP.
        let qp = unsafe { handle(qp, "qp") }?;
        let sges = if len == 0 {
            Vec::new()
        } else {
            vec![Sge { addr, len, lkey }]
        };
        qp.qp
            .post_recv(RecvWr { wr_id, sges })
            .map_err(|e| post_failure(&e))
    })
}

/// Frees the queue pair; NULL does nothing. Outstanding work is flushed.
///
/// # Safety
///
/// `qp` is NULL or a queue pair from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_free(qp: *mut ferroce_qp) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_qp_free", || unsafe { free_handle(qp) });
}
