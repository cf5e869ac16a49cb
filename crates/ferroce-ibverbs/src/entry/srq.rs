//! Shared receive queues: `ibv_create_srq`, `ibv_modify_srq`, `ibv_query_srq`,
//! `ibv_destroy_srq` and the context's `post_srq_recv`.

use std::ffi::c_int;
use std::sync::Arc;

use ferroce::Srq;

use crate::abi::*;
use crate::attrs;
use crate::context;
use crate::entry::qp::post_recv_chain;
use crate::fence;
use crate::objects::{SrqState, QPS, SRQS};

/// `ibv_create_srq`: holds `attr.max_wr` receives, armed at `attr.srq_limit` when not 0;
/// `attr` is updated with what was granted.
pub(crate) unsafe extern "C" fn create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    fence::pointer(|| {
        let (ctx, state) = context::pd_context(pd as usize)?;
        if init.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct ibv_srq_init_attr`.
        let init = unsafe { &mut *init };
        let a = init.attr;
        if a.max_wr == 0 || a.max_wr > attrs::MAX_QP_WR || a.max_sge > attrs::MAX_SGE as u32 {
            return Err(libc::EINVAL);
        }
        let srq = Srq::new(&state.nic, a.max_wr).map_err(|_| libc::ENOMEM)?;
        if a.srq_limit > 0 {
            srq.arm(a.srq_limit).map_err(|_| libc::EINVAL)?;
        }
        init.attr.max_wr = srq.query().max_wr;
        let c = Box::into_raw(Box::new(ibv_srq {
            context: ctx as *mut ibv_context,
            srq_context: init.srq_context,
            pd,
            handle: srq.id().0,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            events_completed: 0,
        }));
        SRQS.add(
            c as usize,
            Arc::new(SrqState {
                srq,
                ctx,
                pd: pd as usize,
                max_sge: a.max_sge,
            }),
        );
        Ok(c)
    })
}

/// `ibv_modify_srq`: `IBV_SRQ_MAX_WR` resizes, `IBV_SRQ_LIMIT` arms.
pub(crate) unsafe extern "C" fn modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    fence::errno(|| {
        let state = SRQS.get(srq as usize).ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct ibv_srq_attr`.
        let a = unsafe { attr.read_unaligned() };
        if mask & IBV_SRQ_MAX_WR != 0 {
            state.srq.resize(a.max_wr).map_err(|_| libc::EINVAL)?;
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            state.srq.arm(a.srq_limit).map_err(|_| libc::EINVAL)?;
        }
        Ok(())
    })
}

/// `ibv_query_srq`.
pub(crate) unsafe extern "C" fn query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    fence::errno(|| {
        let state = SRQS.get(srq as usize).ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let q = state.srq.query();
        // SAFETY: the caller passes a `struct ibv_srq_attr`.
        unsafe {
            attr.write_unaligned(ibv_srq_attr {
                max_wr: q.max_wr,
                max_sge: state.max_sge,
                srq_limit: q.limit,
            });
        }
        Ok(())
    })
}

/// `ibv_destroy_srq`: `EBUSY` while a QP uses it.
pub(crate) unsafe extern "C" fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    fence::errno(|| {
        let at = srq as usize;
        SRQS.remove_unless(at, || QPS.any(|qp| qp.srq == at))?;
        // SAFETY: the table held `srq` from `Box::into_raw` in `create_srq`, and has just
        // forgotten it.
        drop(unsafe { Box::from_raw(srq) });
        Ok(())
    })
}

/// `ops.post_srq_recv`.
pub(crate) unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    fence::errno(|| {
        let Some(state) = SRQS.get(srq as usize) else {
            if !bad_wr.is_null() {
                // SAFETY: `verbs.h` passes the address of the caller's `bad_wr`.
                unsafe { bad_wr.write(wr) };
            }
            return Err(libc::EINVAL);
        };
        // SAFETY: the chain and `bad_wr` are the caller's, as `ibv_post_srq_recv` requires.
        unsafe { post_recv_chain(wr, bad_wr, state.max_sge, |w| state.srq.post_recv(w)) }
    })
}
