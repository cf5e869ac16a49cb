//! Completion channels and CQs: `ibv_create_comp_channel`, `ibv_destroy_comp_channel`,
//! `ibv_create_cq`, `ibv_resize_cq`, `ibv_destroy_cq`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`, and the context's `poll_cq` and `req_notify_cq` operations.
//!
//! The C objects are boxed and registered in `crate::objects`, which also forwards each
//! armed CQ's event to its channel (see that module).

use std::ffi::{c_int, c_void};
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::Arc;

use ferroce::proto::qp::{Completion, WcOpcode, WcStatus};
use ferroce::proto::wire::Qpn;
use ferroce::Cq;

use crate::abi::*;
use crate::context;
use crate::convert;
use crate::fence;
use crate::objects::{Channel, CqState, CHANNELS, CQS, QPS};

/// Completions taken from ferroce per step of a poll.
const POLL_STEP: usize = 32;

/// `ibv_create_comp_channel`: a channel whose `fd` is readable while an event waits.
pub(crate) unsafe extern "C" fn create_comp_channel(
    ctx: *mut ibv_context,
) -> *mut ibv_comp_channel {
    fence::pointer(|| {
        context::context(ctx as usize).ok_or(libc::EINVAL)?;
        let channel =
            Channel::new(ctx as usize).map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
        let c = Box::into_raw(Box::new(ibv_comp_channel {
            context: ctx,
            fd: channel.raw_fd(),
            refcnt: 0,
        }));
        CHANNELS.add(c as usize, Arc::new(channel));
        Ok(c)
    })
}

/// `ibv_destroy_comp_channel`: `EBUSY` while a CQ uses it, `EINVAL` for a pointer that is
/// not a live channel.
pub(crate) unsafe extern "C" fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    fence::errno(|| {
        let at = channel as usize;
        CHANNELS.remove_unless(at, || {
            CQS.any(|cq| cq.channel.as_ref().is_some_and(|(c, _)| *c == at))
        })?;
        // SAFETY: the table held `channel` from `Box::into_raw` in `create_comp_channel`, and
        // has just forgotten it.
        drop(unsafe { Box::from_raw(channel) });
        Ok(())
    })
}

/// `ibv_create_cq`: a CQ holding at least `cqe` completions, whose events go to `channel`
/// (NULL for none). `comp_vector` must be 0, the one vector.
pub(crate) unsafe extern "C" fn create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    fence::pointer(|| {
        let state = context::context(ctx as usize).ok_or(libc::EINVAL)?;
        let max = state.nic.caps().max_cqe.min(crate::attrs::MAX_CQE);
        let depth = usize::try_from(cqe).map_err(|_| libc::EINVAL)?;
        if depth == 0 || depth > max as usize || comp_vector != 0 {
            return Err(libc::EINVAL);
        }
        let c_channel = channel;
        let channel = if channel.is_null() {
            None
        } else {
            Some((
                channel as usize,
                CHANNELS.get(channel as usize).ok_or(libc::EINVAL)?,
            ))
        };
        let cq = Cq::new(&state.nic, depth).map_err(|_| libc::ENOMEM)?;
        let granted = c_int::try_from(cq.depth()).unwrap_or(c_int::MAX);
        let c = Box::into_raw(Box::new(ibv_cq {
            context: ctx,
            channel: c_channel,
            cq_context,
            handle: 0,
            cqe: granted,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            cond: libc::PTHREAD_COND_INITIALIZER,
            comp_events_completed: 0,
            async_events_completed: 0,
        }));
        if let Some((_, channel)) = &channel {
            // Each event goes onto the C channel from the thread that handled it: the
            // program's wait wakes once, with no thread between.
            let (channel, at) = (Arc::clone(channel), c as usize);
            if cq.announce_events(move || channel.push(at)).is_err() {
                // SAFETY: just allocated above, and in no table yet.
                drop(unsafe { Box::from_raw(c) });
                return Err(libc::EOPNOTSUPP);
            }
        }
        CQS.add(
            c as usize,
            Arc::new(CqState {
                cq,
                ctx: ctx as usize,
                channel,
            }),
        );
        Ok(c)
    })
}

/// `ibv_resize_cq`: holds at least `cqe` completions from now on (`cq->cqe` says how many);
/// `EINVAL` for fewer than it holds now or more than the device allows.
pub(crate) unsafe extern "C" fn resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    fence::errno(|| {
        let state = CQS.get(cq as usize).ok_or(libc::EINVAL)?;
        let depth = usize::try_from(cqe).map_err(|_| libc::EINVAL)?;
        if depth == 0 {
            return Err(libc::EINVAL);
        }
        state.cq.resize(depth).map_err(|_| libc::EINVAL)?;
        // SAFETY: `cq` is a live CQ of this library.
        unsafe { (*cq).cqe = c_int::try_from(state.cq.depth()).unwrap_or(c_int::MAX) };
        Ok(())
    })
}

/// `ibv_destroy_cq`: `EBUSY` while a QP uses it, `EINVAL` for a pointer that is not a live
/// CQ.
pub(crate) unsafe extern "C" fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    fence::errno(|| {
        let at = cq as usize;
        CQS.get(at).ok_or(libc::EINVAL)?;
        if QPS.any(|qp| qp.send_cq == at || qp.recv_cq == at) {
            return Err(libc::EBUSY);
        }
        CQS.remove(at);
        // SAFETY: the table held `cq` from `Box::into_raw` in `create_cq`, and has just
        // forgotten it.
        drop(unsafe { Box::from_raw(cq) });
        Ok(())
    })
}

/// `ibv_get_cq_event`: waits for a CQ of `channel` to fire (or fails with -1 and `EAGAIN`
/// when the program made the channel's fd non-blocking and none has), and says which, with
/// its `cq_context`.
pub(crate) unsafe extern "C" fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    fence::minus_one(|| {
        let state = CHANNELS.get(channel as usize).ok_or(libc::EINVAL)?;
        if cq.is_null() || cq_context.is_null() {
            return Err(libc::EINVAL);
        }
        let fired = state
            .next()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let fired = fired as *mut ibv_cq;
        // SAFETY: `fired` was a live CQ when its event was queued; the program may not destroy
        // a CQ with unacknowledged events. The out-pointers are the caller's.
        unsafe {
            let context = if CQS.get(fired as usize).is_some() {
                (*fired).cq_context
            } else {
                ptr::null_mut()
            };
            cq.write(fired);
            cq_context.write(context);
        }
        Ok(0)
    })
}

/// `ibv_ack_cq_events`: counts the events in `cq->comp_events_completed`, as rdma-core does.
pub(crate) unsafe extern "C" fn ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    fence::unit(|| {
        if CQS.get(cq as usize).is_some() {
            // SAFETY: `cq` is a live CQ of this library.
            unsafe {
                (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents);
            }
        }
    });
}

/// `ops.poll_cq`: up to `n` completions into `wc`; the count, or a negative errno for a
/// pointer that is not a live CQ.
pub(crate) unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    fence::value(
        || -libc::EIO,
        || {
            let Some(state) = CQS.get(cq as usize) else {
                return -libc::EINVAL;
            };
            let Ok(n) = usize::try_from(n) else {
                return -libc::EINVAL;
            };
            if n > 0 && wc.is_null() {
                return -libc::EINVAL;
            }
            let blank = Completion {
                wr_id: 0,
                status: WcStatus::Success,
                opcode: WcOpcode::Send,
                byte_len: 0,
                imm: None,
                qpn: Qpn::GSI,
                ud: None,
            };
            let mut buf = [blank; POLL_STEP];
            let mut done = 0;
            while done < n {
                let want = (n - done).min(POLL_STEP);
                let got = state.cq.poll_into(&mut buf[..want]);
                for (i, c) in buf[..got].iter().enumerate() {
                    // SAFETY: the caller passes room for `n` work completions; `done + i < n`.
                    unsafe {
                        wc.add(done + i)
                            .cast::<MaybeUninit<ibv_wc>>()
                            .write(MaybeUninit::new(convert::wc(c)))
                    };
                }
                done += got;
                if got < want {
                    break;
                }
            }
            c_int::try_from(done).unwrap_or(c_int::MAX)
        },
    )
}

/// `ops.req_notify_cq`: arms the CQ for its next completion (or, with `solicited_only`, its
/// next solicited or failed one).
pub(crate) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    fence::errno(|| {
        let state = CQS.get(cq as usize).ok_or(libc::EINVAL)?;
        state
            .cq
            .req_notify(solicited_only != 0)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    })
}
