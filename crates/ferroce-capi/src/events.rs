//! Descriptors to wait on: a CQ's completion channel (`ibv_req_notify_cq`,
//! `ibv_get_cq_event`, `ibv_ack_cq_events`) and the NIC's async events
//! (`ibv_context.async_fd`, `ibv_get_async_event`), for `poll(2)`, epoll or an event loop.
//!
//! The descriptors are the library's, non-blocking, and stay open while their object lives:
//! wait on them, never read, write or close them; take what they announce with
//! `ferroce_cq_take_events` and `ferroce_nic_poll_event`.

use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use ferroce::qp::AsyncEvent;

use crate::fence::{check_struct_size, fence, fence_result, handle, struct_size_of, Failure};
use crate::ferroce_result;
use crate::nic::ferroce_nic;
use crate::qp::ferroce_cq;

/// `ferroce_async_event.event_type`: an armed SRQ fell below its limit
/// (`IBV_EVENT_SRQ_LIMIT_REACHED`, the same value); `srq` names it, and its limit is now
/// disarmed.
pub const FERROCE_EVENT_SRQ_LIMIT_REACHED: u32 = 15;
/// `ferroce_async_event.event_type`: a queue pair on an SRQ entered ERR and takes no more of
/// its receives (`IBV_EVENT_QP_LAST_WQE_REACHED`, the same value); `qpn` names it.
pub const FERROCE_EVENT_QP_LAST_WQE_REACHED: u32 = 16;

/// An asynchronous event of the NIC (`struct ibv_async_event`). Versioned: set
/// `struct_size` to `sizeof`; the call fills the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_async_event {
    /// `sizeof(ferroce_async_event)`.
    pub struct_size: u32,
    /// `FERROCE_EVENT_*`: which event.
    pub event_type: u32,
    /// For `FERROCE_EVENT_QP_LAST_WQE_REACHED`: the queue pair's number; 0 otherwise.
    pub qpn: u32,
    /// For `FERROCE_EVENT_SRQ_LIMIT_REACHED`: the SRQ's number (`ferroce_srq_id`); 0
    /// otherwise.
    pub srq: u32,
}

/// Arms the CQ's completion channel (`ibv_req_notify_cq`): at its next completion, or with
/// `solicited_only` its next receive the sender marked `FERROCE_SEND_SOLICITED` (or its next
/// failed one), the channel gets one event and `ferroce_cq_fd` turns readable. It fires
/// once: take the events, arm again, then poll the CQ dry, since completions that came
/// before arming raise nothing.
///
/// `DEVICE` when a verbs device refuses (never on the soft NIC).
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_req_notify(
    cq: *const ferroce_cq,
    solicited_only: bool,
) -> ferroce_result {
    fence_result("ferroce_cq_req_notify", || {
        // SAFETY: the caller promises NULL or a live CQ.
        let cq = unsafe { handle(cq, "cq") }?;
        cq.cq
            .req_notify(solicited_only)
            .map_err(|e| Failure::new(ferroce_result::Device, e))
    })
}

/// The CQ's completion-channel descriptor (`ibv_comp_channel.fd`): readable (`POLLIN`) while
/// an event waits for `ferroce_cq_take_events`. -1 for a NULL `cq`. The library owns it: do
/// not read or close it.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_fd(cq: *const ferroce_cq) -> i32 {
    fence("ferroce_cq_fd", || {
        // SAFETY: the caller promises NULL or a live CQ.
        unsafe { handle(cq, "cq") }.map_or(-1, |c| c.cq.as_fd().as_raw_fd())
    })
}

/// Takes the channel's events (`ibv_get_cq_event`, acknowledged as `ibv_ack_cq_events`
/// does): how many arrived since the last take, 0 when none did (or `cq` is NULL). It never
/// blocks; the descriptor is not readable after it until the channel fires again.
///
/// # Safety
///
/// `cq` is NULL or a live CQ.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cq_take_events(cq: *const ferroce_cq) -> u64 {
    fence("ferroce_cq_take_events", || {
        // SAFETY: the caller promises NULL or a live CQ.
        unsafe { handle(cq, "cq") }.map_or(0, |c| c.cq.take_events())
    })
}

/// The NIC's async-event descriptor (`ibv_context.async_fd`): readable (`POLLIN`) while an
/// event waits for `ferroce_nic_poll_event`, which clears it with the last one. -1 for a NULL
/// `nic`. The library owns it: do not read or close it.
///
/// # Safety
///
/// `nic` is NULL or a live NIC.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_async_fd(nic: *const ferroce_nic) -> i32 {
    fence("ferroce_nic_async_fd", || {
        // SAFETY: the caller promises NULL or a live NIC.
        unsafe { handle(nic, "nic") }.map_or(-1, |n| n.nic.async_fd().as_raw_fd())
    })
}

/// The NIC's next asynchronous event (`ibv_get_async_event`, acknowledged at once as
/// `ibv_ack_async_event` does), waiting up to `timeout_ms` for one (0: only look); `*out`
/// receives it.
///
/// `TIMEOUT` when none came; `INVALID` when `out->struct_size` is smaller than this
/// version's struct.
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or a `ferroce_async_event` whose `struct_size`
/// is set and which is writable for that many bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_poll_event(
    nic: *const ferroce_nic,
    timeout_ms: u32,
    out: *mut ferroce_async_event,
) -> ferroce_result {
    fence_result("ferroce_nic_poll_event", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        // SAFETY: the caller promises NULL or a struct whose struct_size is set.
        let given = unsafe { struct_size_of(out, "out") }?;
        check_struct_size(
            "ferroce_async_event",
            given,
            size_of::<ferroce_async_event>(),
        )?;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
        let event = loop {
            if let Some(event) = nic.nic.poll_event() {
                break event;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::new(
                    ferroce_result::Timeout,
                    format_args!("no async event within {timeout_ms} ms"),
                ));
            }
            let mut pfd = libc::pollfd {
                fd: nic.nic.async_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, 100) as libc::c_int;
            // SAFETY: one valid pollfd for the call's duration; the descriptor is the NIC's,
            // open while `nic` lives. An error (EINTR) only ends this wait early.
            let _ = unsafe { libc::poll(&raw mut pfd, 1, ms) };
        };
        let value = match event {
            AsyncEvent::SrqLimitReached(id) => ferroce_async_event {
                struct_size: given,
                event_type: FERROCE_EVENT_SRQ_LIMIT_REACHED,
                qpn: 0,
                srq: id.0,
            },
            AsyncEvent::QpLastWqeReached(qpn) => ferroce_async_event {
                struct_size: given,
                event_type: FERROCE_EVENT_QP_LAST_WQE_REACHED,
                qpn: qpn.value(),
                srq: 0,
            },
        };
        // SAFETY: not NULL (struct_size_of checked), and the caller promises `given` bytes,
        // at least a whole ferroce_async_event (checked), are writable.
        unsafe { out.write(value) };
        Ok(())
    })
}
