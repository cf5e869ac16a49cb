//! Shared receive queues: `ferroce_srq` (`ibv_create_srq`, `ibv_post_srq_recv`,
//! `ibv_modify_srq`), one pool of receives for many queue pairs.
//!
//! A queue pair made with `ferroce_qp_new_with_srq` takes every receive from the pool; its
//! completions still go to its own receive CQ and carry its `qpn`, so one place posts the
//! receives and the completions tell the queue pairs apart. When the pool runs dry RC peers
//! get an RNR NAK and retry; an armed limit raises `FERROCE_EVENT_SRQ_LIMIT_REACHED` on the
//! NIC's async descriptor first (`ferroce_nic_poll_event`).

use ferroce::qp::{RecvWr, Sge};
use ferroce::{Qp, Srq};

use crate::fence::{fence, fence_result, free_handle, handle, into_handle, write_out, Failure};
use crate::ferroce_result;
use crate::nic::ferroce_nic;
use crate::qp::{
    caps_arg, ferroce_cq, ferroce_qp, ferroce_qp_caps, post_failure, qp_failure, qp_type_arg,
};

/// A shared receive queue. Thread-safe; queue pairs on it keep it alive after
/// `ferroce_srq_free`.
pub struct ferroce_srq {
    pub(crate) srq: Srq,
}

fn arm(srq: &Srq, limit: u32) -> Result<(), Failure> {
    srq.arm(limit).map_err(Failure::invalid)
}

/// A shared receive queue of `nic` holding up to `max_wr` receive requests
/// (`ibv_create_srq`); `limit` 0 leaves its limit disarmed, another value arms it as
/// `ferroce_srq_arm` does. `*out` receives it.
///
/// `INVALID` for `max_wr` 0 or a `limit` not below `max_wr`; `UNSUPPORTED` on a verbs
/// device (shared receive queues are the soft NIC's so far, and it never refuses one).
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_new(
    nic: *const ferroce_nic,
    max_wr: u32,
    limit: u32,
    out: *mut *mut ferroce_srq,
) -> ferroce_result {
    fence_result("ferroce_srq_new", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        if max_wr == 0 {
            return Err(Failure::invalid(
                "max_wr is 0: an SRQ holds at least one receive",
            ));
        }
        let srq = Srq::new(&nic.nic, max_wr).map_err(|e| qp_failure(&e))?;
        if limit != 0 {
            arm(&srq, limit)?;
        }
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_srq { srq }), "out") }
    })
}

/// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the first time taking a receive
/// leaves fewer than `limit` queued, the NIC raises `FERROCE_EVENT_SRQ_LIMIT_REACHED` once
/// and disarms it. 0 disarms it. `INVALID` when `limit` is not below the queue's size.
///
/// # Safety
///
/// `srq` is NULL or a live shared receive queue.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_arm(srq: *const ferroce_srq, limit: u32) -> ferroce_result {
    fence_result("ferroce_srq_arm", || {
        // SAFETY: the caller promises NULL or a live SRQ.
        let srq = unsafe { handle(srq, "srq") }?;
        arm(&srq.srq, limit)
    })
}

/// The SRQ's number on its NIC, as `ferroce_async_event.srq` names it; 0 for NULL.
///
/// # Safety
///
/// `srq` is NULL or a live shared receive queue.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_id(srq: *const ferroce_srq) -> u32 {
    fence("ferroce_srq_id", || {
        // SAFETY: the caller promises NULL or a live SRQ.
        unsafe { handle(srq, "srq") }.map_or(0, |s| s.srq.id().0)
    })
}

/// The receive requests queued in the pool now (`ibv_query_srq`); 0 for NULL.
///
/// # Safety
///
/// `srq` is NULL or a live shared receive queue.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_queued(srq: *const ferroce_srq) -> u32 {
    fence("ferroce_srq_queued", || {
        // SAFETY: the caller promises NULL or a live SRQ.
        unsafe { handle(srq, "srq") }.map_or(0, |s| s.srq.query().queued)
    })
}

/// Posts one receive of one scatter entry to the pool (`ibv_post_srq_recv`): `len` bytes at
/// `addr` of the region with `lkey` (`len` 0: no entry). `FAILED` when `max_wr` wait already.
/// `ferroce_srq_post_recv_list` posts chains with scatter lists.
///
/// # Safety
///
/// `srq` is NULL or a live shared receive queue.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_post_recv(
    srq: *const ferroce_srq,
    wr_id: u64,
    addr: u64,
    len: u32,
    lkey: u32,
) -> ferroce_result {
    fence_result("ferroce_srq_post_recv", || {
        // SAFETY: the caller promises NULL or a live SRQ.
        let srq = unsafe { handle(srq, "srq") }?;
        let sges = if len == 0 {
            Vec::new()
        } else {
            vec![Sge { addr, len, lkey }]
        };
        srq.srq
            .post_recv(RecvWr { wr_id, sges })
            .map_err(|e| post_failure(&e))
    })
}

/// A queue pair as `ferroce_qp_new` makes it, taking its receives from `srq`
/// (`ibv_qp_init_attr.srq`); posting receives to the queue pair itself is then `INVALID`.
/// `INVALID` also when the SRQ or a CQ belongs to another NIC; `UNSUPPORTED` on a verbs
/// device.
///
/// # Safety
///
/// `nic`, `send_cq`, `recv_cq`, `srq` are NULL or live; `caps` is NULL or a
/// `ferroce_qp_caps` of at least its `struct_size` bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_new_with_srq(
    nic: *const ferroce_nic,
    qp_type: u32,
    send_cq: *const ferroce_cq,
    recv_cq: *const ferroce_cq,
    srq: *const ferroce_srq,
    caps: *const ferroce_qp_caps,
    out: *mut *mut ferroce_qp,
) -> ferroce_result {
    fence_result("ferroce_qp_new_with_srq", || {
        // SAFETY: the caller promises NULL or live objects.
        let (nic, scq, rcq, srq) = unsafe {
            (
                handle(nic, "nic")?,
                handle(send_cq, "send_cq")?,
                handle(recv_cq, "recv_cq")?,
                handle(srq, "srq")?,
            )
        };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let qp_type = qp_type_arg(qp_type)?;
        // SAFETY: the caller promises NULL or a struct of at least its struct_size.
        let caps = unsafe { caps_arg(caps) }?;
        let qp = Qp::with_srq(&nic.nic, qp_type, &scq.cq, &rcq.cq, &srq.srq, caps)
            .map_err(|e| qp_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_qp { qp }), "out") }
    })
}

/// Frees the SRQ handle; NULL does nothing. Queue pairs on it keep it alive.
///
/// # Safety
///
/// `srq` is NULL or an SRQ from this library not freed before, which no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_srq_free(srq: *mut ferroce_srq) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_srq_free", || unsafe { free_handle(srq) });
}
