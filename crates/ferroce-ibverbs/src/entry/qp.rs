//! Queue pairs: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`, `ibv_destroy_qp`, and the
//! context's `post_send` and `post_recv` operations (work requests are read from the C chains
//! into ferroce's [`SendWr`] and [`RecvWr`]).
//!
//! A QP is created in RESET, as verbs creates it, and its state is the engine's. Each
//! `ibv_modify_qp` is checked against the kernel's table of required attributes first
//! (`crate::convert::required_mask`), then against ferroce's own.
//!
//! Posting: a chain is read up to the first request that cannot be expressed (an unknown
//! opcode, too many scatter entries, an unknown address handle), the requests before it are
//! posted, and `bad_wr` names the first one refused; a full queue gives `ENOMEM`, anything
//! else `EINVAL`, as rxe's provider answers.

use std::ffi::c_int;
use std::ptr;
use std::sync::{Arc, Mutex};

use ferroce::proto::qp::{
    Payload, PostError, QpCaps, QpType, RecvWr, RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce::proto::wire::Qpn;
use ferroce::{Qp, QpConfig};

use crate::abi::*;
use crate::attrs;
use crate::context;
use crate::convert;
use crate::fence;
use crate::objects::{QpState, QpVerbs, AHS, CQS, QPS, SRQS};

/// The errno of a refused post.
pub(crate) fn post_errno(e: &PostError) -> c_int {
    match e {
        PostError::QueueFull(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// `ibv_create_qp`: an RC, UC or UD QP in RESET; `init_attr->cap` is updated with what was
/// granted (as asked, the scatter entries included; `max_inline_data` as asked).
pub(crate) unsafe extern "C" fn create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    fence::pointer(|| {
        let (ctx, state) = context::pd_context(pd as usize)?;
        if init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct ibv_qp_init_attr`.
        let init = unsafe { &mut *init_attr };
        let qp_type = match init.qp_type {
            IBV_QPT_RC => QpType::Rc,
            IBV_QPT_UC => QpType::Uc,
            IBV_QPT_UD => QpType::Ud,
            _ => return Err(libc::EOPNOTSUPP),
        };
        let send_cq = CQS.get(init.send_cq as usize).ok_or(libc::EINVAL)?;
        let recv_cq = CQS.get(init.recv_cq as usize).ok_or(libc::EINVAL)?;
        let srq = if init.srq.is_null() {
            None
        } else {
            Some(SRQS.get(init.srq as usize).ok_or(libc::EINVAL)?)
        };
        let cap = init.cap;
        let max_sge = attrs::MAX_SGE as u32;
        if cap.max_send_wr > attrs::MAX_QP_WR
            || cap.max_recv_wr > attrs::MAX_QP_WR
            || cap.max_send_sge > max_sge
            || cap.max_recv_sge > max_sge
        {
            return Err(libc::EINVAL);
        }
        let caps = QpCaps {
            sq_depth: cap.max_send_wr.max(1),
            rq_depth: if srq.is_some() {
                0
            } else {
                cap.max_recv_wr.max(1)
            },
            max_inline: cap.max_inline_data,
        };
        let qp = Qp::create(
            &state.nic,
            &QpConfig {
                qp_type,
                send_cq: &send_cq.cq,
                recv_cq: &recv_cq.cq,
                srq: srq.as_ref().map(|s| &s.srq),
                caps,
                sq_sig_all: init.sq_sig_all != 0,
                in_reset: true,
            },
        )
        .map_err(|_| libc::ENOMEM)?;
        let granted = qp.caps();
        let cap = ibv_qp_cap {
            max_send_wr: granted.sq_depth,
            max_recv_wr: if srq.is_some() { 0 } else { granted.rq_depth },
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: granted.max_inline,
        };
        init.cap = cap;
        let c = Box::into_raw(Box::new(ibv_qp {
            context: ctx as *mut ibv_context,
            qp_context: init.qp_context,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            handle: qp.qpn().value(),
            qp_num: qp.qpn().value(),
            state: IBV_QPS_RESET,
            qp_type: init.qp_type,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        }));
        QPS.add(
            c as usize,
            Arc::new(QpState {
                qp,
                ctx,
                pd: pd as usize,
                qp_type: init.qp_type,
                send_cq: init.send_cq as usize,
                recv_cq: init.recv_cq as usize,
                srq: init.srq as usize,
                cap,
                sq_sig_all: init.sq_sig_all != 0,
                verbs: Mutex::new(QpVerbs {
                    access_flags: 0,
                    qkey: 0,
                }),
            }),
        );
        Ok(c)
    })
}

/// `ibv_modify_qp`: the attributes `mask` selects. `EINVAL` for a transition the state
/// machine forbids, a required attribute missing, or a value out of range; the QP is then
/// unchanged.
pub(crate) unsafe extern "C" fn modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    fence::errno(|| {
        let state = QPS.get(qp as usize).ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct ibv_qp_attr`.
        let attr = unsafe { ptr::read_unaligned(attr) };
        let mut verbs = state
            .verbs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let from = state
            .qp
            .query()
            .state
            .map_or(IBV_QPS_RESET, ferroce::qp::QpState::ibv_value);
        let to = if mask & IBV_QP_STATE != 0 {
            attr.qp_state
        } else {
            from
        };
        let required = convert::required_mask(state.qp_type, from, to).ok_or(libc::EINVAL)?;
        if mask & required != required {
            return Err(libc::EINVAL);
        }
        let mut ours = convert::qp_attr(&attr, mask)?;
        ours.state = Some(ferroce::qp::QpState::from_ibv_value(to).ok_or(libc::EINVAL)?);
        state.qp.modify(&ours).map_err(|_| libc::EINVAL)?;
        if mask & IBV_QP_ACCESS_FLAGS != 0 {
            verbs.access_flags = attr.qp_access_flags;
        }
        if mask & IBV_QP_QKEY != 0 {
            verbs.qkey = attr.qkey;
        }
        // SAFETY: `qp` is a live QP of this library.
        unsafe { (*qp).state = to };
        Ok(())
    })
}

/// `ibv_query_qp`: every attribute (whatever `mask` asks, as providers answer), and the
/// creation attributes, `cap.max_inline_data` included.
pub(crate) unsafe extern "C" fn query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    fence::errno(|| {
        let state = QPS.get(qp as usize).ok_or(libc::EINVAL)?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let verbs = *state
            .verbs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let q = state.qp.query();
        let qp_state = q
            .state
            .map_or(IBV_QPS_RESET, ferroce::qp::QpState::ibv_value);
        let value = ibv_qp_attr {
            qp_state,
            cur_qp_state: qp_state,
            path_mtu: q.path_mtu.map_or(0, |m| m.ibv_value().into()),
            qkey: q.qkey.unwrap_or(verbs.qkey),
            rq_psn: q.rq_psn.map_or(0, |p| p.value()),
            sq_psn: q.sq_psn.map_or(0, |p| p.value()),
            dest_qp_num: q.dest_qpn.map_or(0, Qpn::value),
            qp_access_flags: verbs.access_flags,
            cap: state.cap,
            ah_attr: q.peer.map(convert::ah_attr).unwrap_or_default(),
            port_num: attrs::PORT,
            max_rd_atomic: q.max_rd_atomic.unwrap_or(0),
            max_dest_rd_atomic: q.max_dest_rd_atomic.unwrap_or(0),
            min_rnr_timer: q.min_rnr_timer.map_or(0, |t| t.code()),
            timeout: q.timeout.unwrap_or(0),
            retry_cnt: q.retry_cnt.unwrap_or(0),
            rnr_retry: q.rnr_retry.unwrap_or(0),
            ..ibv_qp_attr::default()
        };
        // SAFETY: `qp` is a live QP of this library; the caller passes both structures.
        unsafe {
            attr.write_unaligned(value);
            init_attr.write_unaligned(ibv_qp_init_attr {
                qp_context: (*qp).qp_context,
                send_cq: state.send_cq as *mut ibv_cq,
                recv_cq: state.recv_cq as *mut ibv_cq,
                srq: state.srq as *mut ibv_srq,
                cap: state.cap,
                qp_type: state.qp_type,
                sq_sig_all: c_int::from(state.sq_sig_all),
            });
        }
        Ok(())
    })
}

/// `ibv_destroy_qp`: outstanding requests are dropped with the QP. `EINVAL` for a pointer
/// that is not a live QP.
pub(crate) unsafe extern "C" fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    fence::errno(|| {
        let state = QPS.remove(qp as usize).ok_or(libc::EINVAL)?;
        drop(state);
        // SAFETY: the table held `qp` from `Box::into_raw` in `create_qp`, and has just
        // forgotten it.
        drop(unsafe { Box::from_raw(qp) });
        Ok(())
    })
}

/// The scatter/gather list of a request.
///
/// # Safety
///
/// `list` must point to `n` readable `ibv_sge`s when `n` > 0.
unsafe fn sges(list: *const ibv_sge, n: c_int, max: u32) -> Result<Vec<Sge>, c_int> {
    let n = u32::try_from(n).map_err(|_| libc::EINVAL)?;
    if n > max.max(1) || (n > 0 && list.is_null()) {
        return Err(libc::EINVAL);
    }
    Ok((0..n as usize)
        .map(|i| {
            // SAFETY: the caller vouches for `n` entries.
            let s = unsafe { list.add(i).read_unaligned() };
            Sge {
                addr: s.addr,
                len: s.length,
                lkey: s.lkey,
            }
        })
        .collect())
}

/// ferroce's send request for one C request.
///
/// # Safety
///
/// `wr` must be a readable `ibv_send_wr` whose scatter list (and, for an inline send, the
/// bytes it names) are readable.
unsafe fn send_wr(wr: &ibv_send_wr, state: &QpState) -> Result<SendWr, c_int> {
    // SAFETY: the caller vouches for the list.
    let list = unsafe { sges(wr.sg_list, wr.num_sge, state.cap.max_send_sge)? };
    let words = wr.wr;
    // The `wr` union on a little-endian 64-bit ABI: rdma {remote_addr, rkey}, atomic
    // {remote_addr, compare_add, swap, rkey}, ud {ah, remote_qpn, remote_qkey}.
    let low = |w: u64| w as u32;
    let high = |w: u64| (w >> 32) as u32;
    let rdma = RemoteAddr {
        va: words[0],
        rkey: low(words[1]),
    };
    let imm = u32::from_be(wr.imm_data);
    let op = match wr.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm(imm),
        IBV_WR_RDMA_WRITE => SendOp::Write(rdma),
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::WriteWithImm(rdma, imm),
        IBV_WR_RDMA_READ => SendOp::Read(rdma),
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::CompareSwap {
            remote: RemoteAddr {
                va: words[0],
                rkey: low(words[3]),
            },
            compare: words[1],
            swap: words[2],
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote: RemoteAddr {
                va: words[0],
                rkey: low(words[3]),
            },
            add: words[1],
        },
        _ => return Err(libc::EINVAL),
    };
    let inline = wr.send_flags & IBV_SEND_INLINE != 0
        && matches!(
            op,
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write(_) | SendOp::WriteWithImm(..)
        );
    let local = if inline {
        let total: u64 = list.iter().map(|s| u64::from(s.len)).sum();
        if total > u64::from(state.cap.max_inline_data) {
            return Err(libc::EINVAL);
        }
        let mut bytes = Vec::with_capacity(total as usize);
        for s in &list {
            if s.len > 0 {
                // SAFETY: an inline entry names `len` readable bytes of the program's memory
                // at `addr` (its key is not used), as `IBV_SEND_INLINE` requires.
                bytes.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.len as usize)
                });
            }
        }
        Payload::Inline(bytes)
    } else if list.len() == 1 {
        Payload::Sge(list[0])
    } else {
        Payload::Sges(list)
    };
    let dest = if state.qp_type == IBV_QPT_UD {
        let ah = AHS.get(words[0] as usize).ok_or(libc::EINVAL)?;
        let qpn = Qpn::new(low(words[1]) & 0x00ff_ffff).ok_or(libc::EINVAL)?;
        Some(ah.ah.dest(qpn, high(words[1])))
    } else {
        None
    };
    Ok(SendWr {
        wr_id: wr.wr_id,
        op,
        local,
        signaled: wr.send_flags & IBV_SEND_SIGNALED != 0,
        fence: wr.send_flags & IBV_SEND_FENCE != 0,
        solicited: wr.send_flags & IBV_SEND_SOLICITED != 0,
        dest,
    })
}

/// `ops.post_send`: posts the chain at `wr`; on failure `*bad_wr` is the first request not
/// posted.
pub(crate) unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let fail = |at: *mut ibv_send_wr, e: c_int| {
        if !bad_wr.is_null() {
            // SAFETY: `verbs.h`'s `ibv_post_send` passes the address of the caller's `bad_wr`.
            unsafe { bad_wr.write(at) };
        }
        Err(e)
    };
    fence::errno(|| {
        let Some(state) = QPS.get(qp as usize) else {
            return fail(wr, libc::EINVAL);
        };
        let mut wrs = Vec::new();
        let mut at = Vec::new();
        let mut refused = None;
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the chain is the caller's, each request readable until posted.
            let c = unsafe { &*cur };
            // SAFETY: as above, for its scatter list and inline bytes.
            match unsafe { send_wr(c, &state) } {
                Ok(w) => {
                    wrs.push(w);
                    at.push(cur);
                }
                Err(e) => {
                    refused = Some((cur, e));
                    break;
                }
            }
            cur = c.next;
        }
        if let Err((i, e)) = state.qp.post_send_list(wrs) {
            return fail(at[i], post_errno(&e));
        }
        match refused {
            Some((cur, e)) => fail(cur, e),
            None => Ok(()),
        }
    })
}

/// ferroce's receive requests for a C chain, posted one by one with `post`; on failure
/// `*bad_wr` is the first request not posted.
///
/// # Safety
///
/// `wr` must be NULL or a readable chain of `ibv_recv_wr`s with readable scatter lists;
/// `bad_wr` NULL or writable.
pub(crate) unsafe fn post_recv_chain(
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    max_sge: u32,
    post: impl Fn(RecvWr) -> Result<(), PostError>,
) -> Result<(), c_int> {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: the caller vouches for the chain.
        let c = unsafe { &*cur };
        // SAFETY: and for its scatter lists.
        let result = unsafe { sges(c.sg_list, c.num_sge, max_sge) }.and_then(|sges| {
            post(RecvWr {
                wr_id: c.wr_id,
                sges,
            })
            .map_err(|e| post_errno(&e))
        });
        if let Err(e) = result {
            if !bad_wr.is_null() {
                // SAFETY: the caller vouches for `bad_wr`.
                unsafe { bad_wr.write(cur) };
            }
            return Err(e);
        }
        cur = c.next;
    }
    Ok(())
}

/// `ops.post_recv`.
pub(crate) unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    fence::errno(|| {
        let Some(state) = QPS.get(qp as usize) else {
            if !bad_wr.is_null() {
                // SAFETY: `verbs.h`'s `ibv_post_recv` passes the address of its `bad_wr`.
                unsafe { bad_wr.write(wr) };
            }
            return Err(libc::EINVAL);
        };
        // SAFETY: the chain and `bad_wr` are the caller's, as `ibv_post_recv` requires.
        unsafe {
            post_recv_chain(wr, bad_wr, state.cap.max_recv_sge, |w| {
                state.qp.post_recv(w)
            })
        }
    })
}
