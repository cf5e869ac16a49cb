//! Work requests as libibverbs shapes them: several scatter/gather entries per request
//! (`sg_list`, `num_sge`), a chain of requests in one post (`wr->next`) with the failing one
//! reported back (`bad_wr`), UD destinations in the request (`wr.ud`), and completions that
//! say who sent a datagram (`ibv_wc.src_qp`).
//!
//! The rule for a chain, as `ibv_post_send`'s: every request before `*bad_wr` was posted,
//! none from it on. A malformed request (an unknown opcode, too many entries) stops the
//! chain there as a refused one does.

use ferroce::qp::{Payload, RecvWr, SendWr, Sge};

use crate::fence::{fence_result, handle, Failure, Outcome};
use crate::ferroce_result;
use crate::qp::{
    completion, ferroce_completion, ferroce_cq, ferroce_qp, poll_into, post_failure, send_flags,
    send_op, wait_into,
};
use crate::srq::ferroce_srq;
use crate::ud::ferroce_ah;

/// The most scatter/gather entries one request may carry.
pub const FERROCE_MAX_SGE: u32 = 32;
/// The most requests one chain may hold (a longer one, or a cycle, is refused as `INVALID`).
pub const FERROCE_MAX_CHAIN: usize = 65536;
/// The bytes at the start of every UD receive buffer, before the payload: the Global Route
/// Header as rxe writes it, 20 zero bytes then the sender's IPv4 header (its source address
/// at bytes 32 to 35), or the IPv6 header.
pub const FERROCE_UD_GRH_LEN: u32 = 40;
const _: () = assert!(FERROCE_UD_GRH_LEN as usize == ferroce::ud::UD_GRH_LEN);

/// `ferroce_completion_ex.flags`: the receive buffer begins with the 40-byte GRH
/// (`IBV_WC_GRH`), and `src_qp`/`src_addr` say who sent it.
pub const FERROCE_WC_GRH: u32 = 2;

/// One scatter/gather entry (`struct ibv_sge`): `length` bytes at `addr` of the region with
/// `lkey`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_sge {
    /// The bytes' address in a region (`ferroce_region_addr` + offset).
    pub addr: u64,
    /// Their length.
    pub length: u32,
    /// The region's key (`ferroce_region_lkey`).
    pub lkey: u32,
}

/// A send work request with a gather list, in a chain (`struct ibv_send_wr`). Versioned: set
/// `struct_size` to `sizeof` in every request of the chain.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_send_request {
    /// `sizeof(ferroce_send_request)`.
    pub struct_size: u32,
    /// `FERROCE_WR_*`.
    pub opcode: u32,
    /// Returned in the completion.
    pub wr_id: u64,
    /// The next request of the chain, or NULL (`wr->next`).
    pub next: *const Self,
    /// The local bytes, gathered in order for SEND and WRITE, scattered for READ
    /// (`sg_list`); NULL when `num_sge` is 0.
    pub sg_list: *const ferroce_sge,
    /// How many entries `sg_list` holds, 0 to `FERROCE_MAX_SGE` (`num_sge`).
    pub num_sge: u32,
    /// `FERROCE_SEND_*` flags.
    pub flags: u32,
    /// For WRITE and READ: the peer's address.
    pub remote_addr: u64,
    /// For WRITE and READ: the peer's key.
    pub rkey: u32,
    /// For the `_WITH_IMM` opcodes: the immediate data.
    pub imm: u32,
    /// For a UD queue pair: where the datagram goes (`wr.ud.ah`); NULL on RC and UC.
    pub ah: *const ferroce_ah,
    /// For a UD queue pair: the destination queue pair (`wr.ud.remote_qpn`).
    pub remote_qpn: u32,
    /// For a UD queue pair: the Q_Key to send (`wr.ud.remote_qkey`); a value with the top
    /// bit set sends the queue pair's own.
    pub remote_qkey: u32,
}

/// A receive work request with a scatter list, in a chain (`struct ibv_recv_wr`). Versioned:
/// set `struct_size` to `sizeof` in every request of the chain.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_recv_request {
    /// `sizeof(ferroce_recv_request)`.
    pub struct_size: u32,
    /// How many entries `sg_list` holds, 0 to `FERROCE_MAX_SGE` (0 for WRITE with
    /// immediate, which lands no bytes here).
    pub num_sge: u32,
    /// Returned in the completion.
    pub wr_id: u64,
    /// The next request of the chain, or NULL (`wr->next`).
    pub next: *const Self,
    /// Where an incoming SEND's bytes go, filled in order; NULL when `num_sge` is 0.
    pub sg_list: *const ferroce_sge,
}

/// A work completion with what a UD receive adds (`ibv_wc.src_qp`, `IBV_WC_GRH`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_completion_ex {
    /// The common fields, as `ferroce_cq_poll` gives them.
    pub wc: ferroce_completion,
    /// For a UD receive: the sending queue pair (`src_qp`); 0 otherwise.
    pub src_qp: u32,
    /// `FERROCE_WC_*` flags: `FERROCE_WC_GRH` for a UD receive.
    pub flags: u32,
    /// For a UD receive: the sender's address as a GID (`sgid`): IPv6, or IPv4 mapped
    /// (`::ffff:a.b.c.d`); zero otherwise.
    pub src_gid: [u8; 16],
}

/// The entries of a request, checked.
///
/// # Safety
///
/// `list` is NULL or valid for reads of `n` entries.
unsafe fn sges(list: *const ferroce_sge, n: u32, name: &str) -> Result<Vec<Sge>, Failure> {
    if n > FERROCE_MAX_SGE {
        return Err(Failure::invalid(format_args!(
            "{name}.num_sge {n} exceeds FERROCE_MAX_SGE ({FERROCE_MAX_SGE})"
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    if list.is_null() {
        return Err(Failure::null(&format!("{name}.sg_list")));
    }
    // SAFETY: not NULL; the caller promises `n` readable entries.
    let list = unsafe { std::slice::from_raw_parts(list, n as usize) };
    Ok(list
        .iter()
        .map(|s| Sge {
            addr: s.addr,
            len: s.length,
            lkey: s.lkey,
        })
        .collect())
}

/// One C send request as the engine's.
///
/// # Safety
///
/// `wr` is a `ferroce_send_request` of at least `sizeof` bytes (checked by the caller),
/// whose `sg_list` is valid for `num_sge` entries and whose `ah` is NULL or live.
unsafe fn send_wr(wr: &ferroce_send_request) -> Result<SendWr, Failure> {
    send_flags(wr.flags, "wr")?;
    let op = send_op(wr.opcode, wr.remote_addr, wr.rkey, wr.imm, "wr")?;
    // SAFETY: the caller's promise about `sg_list`.
    let list = unsafe { sges(wr.sg_list, wr.num_sge, "wr") }?;
    let local = match <[Sge; 1]>::try_from(list) {
        Ok([one]) => Payload::Sge(one),
        Err(list) => Payload::Sges(list),
    };
    let mut send = SendWr::new(wr.wr_id, op, local);
    send.signaled = wr.flags & crate::qp::FERROCE_SEND_SIGNALED != 0;
    send.fence = wr.flags & crate::qp::FERROCE_SEND_FENCE != 0;
    send.solicited = wr.flags & crate::qp::FERROCE_SEND_SOLICITED != 0;
    // SAFETY: the caller promises NULL or a live address handle.
    if let Some(ah) = unsafe { wr.ah.as_ref() } {
        let qpn = ferroce::proto::wire::Qpn::new(wr.remote_qpn).ok_or_else(|| {
            Failure::invalid(format_args!(
                "wr.remote_qpn {:#x} does not fit 24 bits",
                wr.remote_qpn
            ))
        })?;
        send.dest = Some(ah.ah.dest(qpn, wr.remote_qkey));
    }
    Ok(send)
}

/// Walks a chain from `first`, converting each request with `convert` until one fails or
/// the chain ends: the requests converted, and the index and failure of the one that did not.
///
/// # Safety
///
/// Every request reachable from `first` through `next` is NULL or readable for its
/// `struct_size` bytes (`next` of the last NULL).
unsafe fn walk<C, T>(
    first: *const C,
    next: impl Fn(&C) -> *const C,
    what: &str,
    convert: impl Fn(&C) -> Result<T, Failure>,
) -> (Vec<T>, Vec<*const C>, Option<Failure>) {
    let mut out = Vec::new();
    let mut ptrs = Vec::new();
    let mut at = first;
    while !at.is_null() {
        if ptrs.len() == FERROCE_MAX_CHAIN {
            let f = Failure::invalid(format_args!(
                "the chain holds more than FERROCE_MAX_CHAIN ({FERROCE_MAX_CHAIN}) requests \
                 (a cycle in next?)"
            ));
            ptrs.push(at);
            return (out, ptrs, Some(f));
        }
        ptrs.push(at);
        // SAFETY: the caller's promise: not NULL, readable for its struct_size.
        let wr = match unsafe { crate::fence::versioned(at, "wr", what) } {
            Ok(wr) => wr,
            Err(f) => return (out, ptrs, Some(f)),
        };
        match convert(wr) {
            Ok(t) => out.push(t),
            Err(f) => return (out, ptrs, Some(f)),
        }
        at = next(wr);
    }
    (out, ptrs, None)
}

/// Records the failing request's address in `bad_wr` (when given) and names its index.
///
/// # Safety
///
/// `bad_wr` is NULL or writable.
unsafe fn report_bad<C>(
    bad_wr: *mut *const C,
    at: *const C,
    index: usize,
    mut f: Failure,
) -> Outcome {
    if !bad_wr.is_null() {
        // SAFETY: not NULL; the caller promises it is writable.
        unsafe { bad_wr.write(at) };
    }
    f.message = format!("request {index} of the chain: {}", f.message);
    Err(f)
}

/// Posts a chain of send requests (`ibv_post_send` with `wr->next`): each with its gather
/// list, their packets leaving together once all are queued. On a UD queue pair each names
/// its destination (`ah`, `remote_qpn`, `remote_qkey`); on RC and UC `ah` is NULL. The local
/// bytes must stay registered until each completes.
///
/// On failure `*bad_wr` (when `bad_wr` is not NULL) is the request that was not posted: every
/// one before it was, none from it on; the last error names its index. `INVALID` for a
/// malformed request (unknown opcode or flags, more than `FERROCE_MAX_SGE` entries, a UD
/// request without `ah` or an RC one with it, a queue pair not ready), `FAILED` when the send
/// queue is full, `NULL_PARAMETER` for a NULL `qp` or `first` (then `*bad_wr` is `first`).
///
/// # Safety
///
/// `qp` is NULL or a live queue pair; every request of the chain is a
/// `ferroce_send_request` of at least its `struct_size` bytes, whose `sg_list` holds
/// `num_sge` entries and whose `ah` is NULL or live; `bad_wr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_post_send_list(
    qp: *const ferroce_qp,
    first: *const ferroce_send_request,
    bad_wr: *mut *const ferroce_send_request,
) -> ferroce_result {
    fence_result("ferroce_qp_post_send_list", || {
        // SAFETY: the caller promises NULL or a live QP.
        let qp = match unsafe { handle(qp, "qp") } {
            Ok(qp) => qp,
            // SAFETY: the caller's promise about bad_wr.
            Err(f) => return unsafe { report_bad(bad_wr, first, 0, f) },
        };
        if first.is_null() {
            // SAFETY: the caller's promise about bad_wr.
            return unsafe { report_bad(bad_wr, first, 0, Failure::null("first")) };
        }
        // SAFETY: the caller promises every request of the chain is readable; `send_wr`'s
        // promise (entries, address handle) is the caller's too.
        let (wrs, ptrs, failure) =
            unsafe { walk(first, |w| w.next, "ferroce_send_request", |w| send_wr(w)) };
        let converted = wrs.len();
        if let Err((index, e)) = qp.qp.post_send_list(wrs) {
            // SAFETY: the caller's promise about bad_wr.
            return unsafe { report_bad(bad_wr, ptrs[index], index, post_failure(&e)) };
        }
        match failure {
            // SAFETY: the caller's promise about bad_wr.
            Some(f) => unsafe { report_bad(bad_wr, ptrs[converted], converted, f) },
            None => Ok(()),
        }
    })
}

/// Posts a chain of receive requests, each with its scatter list, one by one with `post`.
///
/// # Safety
///
/// As `ferroce_qp_post_recv_list`'s chain and `bad_wr`.
unsafe fn post_recvs(
    first: *const ferroce_recv_request,
    bad_wr: *mut *const ferroce_recv_request,
    post: impl Fn(RecvWr) -> Result<(), ferroce::qp::PostError>,
) -> Outcome {
    if first.is_null() {
        // SAFETY: the caller's promise about bad_wr.
        return unsafe { report_bad(bad_wr, first, 0, Failure::null("first")) };
    }
    // SAFETY: the caller promises every request of the chain is readable, with `num_sge`
    // entries at `sg_list`.
    let (wrs, ptrs, failure) = unsafe {
        walk(
            first,
            |w| w.next,
            "ferroce_recv_request",
            |w| {
                let sges = sges(w.sg_list, w.num_sge, "wr")?;
                Ok(RecvWr {
                    wr_id: w.wr_id,
                    sges,
                })
            },
        )
    };
    let converted = wrs.len();
    for (index, wr) in wrs.into_iter().enumerate() {
        if let Err(e) = post(wr) {
            // SAFETY: the caller's promise about bad_wr.
            return unsafe { report_bad(bad_wr, ptrs[index], index, post_failure(&e)) };
        }
    }
    match failure {
        // SAFETY: the caller's promise about bad_wr.
        Some(f) => unsafe { report_bad(bad_wr, ptrs[converted], converted, f) },
        None => Ok(()),
    }
}

/// Posts a chain of receive requests (`ibv_post_recv` with `wr->next`), each filling its
/// scatter list in order.
///
/// On failure `*bad_wr` (when `bad_wr` is not NULL) is the request that was not posted: every
/// one before it was, none from it on. `INVALID` for a malformed request or a queue pair on a
/// shared receive queue (post there), `FAILED` when the receive queue is full.
///
/// # Safety
///
/// `qp` is NULL or a live queue pair; every request of the chain is a
/// `ferroce_recv_request` of at least its `struct_size` bytes whose `sg_list` holds `num_sge`
/// entries; `bad_wr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_post_recv_list(
    qp: *const ferroce_qp,
    first: *const ferroce_recv_request,
    bad_wr: *mut *const ferroce_recv_request,
) -> ferroce_result {
    fence_result("ferroce_qp_post_recv_list", || {
        // SAFETY: the caller promises NULL or a live QP.
        let qp = match unsafe { handle(qp, "qp") } {
            Ok(qp) => qp,
            // SAFETY: the caller's promise about bad_wr.
            Err(f) => return unsafe { report_bad(bad_wr, first, 0, f) },
        };
        // SAFETY: the caller's promises are post_recvs'.
        unsafe { post_recvs(first, bad_wr, |wr| qp.qp.post_recv(wr)) }
    })
}

/// Posts a chain of receive requests to a shared receive queue (`ibv_post_srq_recv`), for
/// any queue pair on it to take; as `ferroce_qp_post_recv_list` otherwise.
///
/// # Safety
///
/// `srq` is NULL or a live shared receive queue; the chain and `bad_wr` as
/// `ferroce_qp_post_recv_list`'s.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_post_recv_list(
    srq: *const ferroce_srq,
    first: *const ferroce_recv_request,
    bad_wr: *mut *const ferroce_recv_request,
) -> ferroce_result {
    fence_result("ferroce_srq_post_recv_list", || {
        // SAFETY: the caller promises NULL or a live SRQ.
        let srq = match unsafe { handle(srq, "srq") } {
            Ok(srq) => srq,
            // SAFETY: the caller's promise about bad_wr.
            Err(f) => return unsafe { report_bad(bad_wr, first, 0, f) },
        };
        // SAFETY: the caller's promises are post_recvs'.
        unsafe { post_recvs(first, bad_wr, |wr| srq.srq.post_recv(wr)) }
    })
}

fn completion_ex(c: &ferroce::proto::qp::Completion) -> ferroce_completion_ex {
    let (src_qp, flags, src_gid) = match c.ud {
        Some(source) => {
            let gid = match source.ip {
                std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                std::net::IpAddr::V6(v6) => v6.octets(),
            };
            (source.qpn.value(), FERROCE_WC_GRH, gid)
        }
        None => (0, 0, [0; 16]),
    };
    ferroce_completion_ex {
        wc: completion(c),
        src_qp,
        flags,
        src_gid,
    }
}

/// As `ferroce_cq_poll` (`ibv_poll_cq`), with what a UD receive adds: who sent it
/// (`src_qp`, `src_gid`) and `FERROCE_WC_GRH`.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is NULL or valid for writes of `n` completions; `polled`
/// is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_poll_ex(
    cq: *const ferroce_cq,
    wc: *mut ferroce_completion_ex,
    n: usize,
    polled: *mut usize,
) -> ferroce_result {
    fence_result("ferroce_cq_poll_ex", || {
        // SAFETY: the caller promises what `poll_into` asks of `cq`, `wc`, `n` and `polled`.
        unsafe { poll_into(cq, wc, n, polled, completion_ex) }
    })
}

/// As `ferroce_cq_wait`, filling a `ferroce_completion_ex`: waits up to `timeout_ms` for one
/// completion, making progress on this thread meanwhile; `TIMEOUT` when none came.
///
/// # Safety
///
/// `cq` is NULL or a live CQ; `wc` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_wait_ex(
    cq: *const ferroce_cq,
    timeout_ms: u32,
    wc: *mut ferroce_completion_ex,
) -> ferroce_result {
    fence_result("ferroce_cq_wait_ex", || {
        // SAFETY: the caller promises what `wait_into` asks of `cq` and `wc`.
        unsafe { wait_into(cq, timeout_ms, wc, completion_ex) }
    })
}
