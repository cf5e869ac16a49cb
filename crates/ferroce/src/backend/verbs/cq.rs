//! A completion queue on a verbs device, with its own completion channel, so that `wait`
//! sleeps in `poll(2)` as rdma-core's `-e` mode does (arm, poll, wait, read the event, re-arm,
//! drain). A CQ is grown with `ibv_resize_cq` whenever the queues feeding it could hold more
//! completions than it has room for, so it never overruns (rxe errors the QP when one does).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::qp::{Completion, WcOpcode, WcStatus};
use ferroce_proto::wire::Qpn;

use super::abi::*;
use super::device::Device;
use super::ffi::RawCq;
use crate::error::VerbsError;

/// A completion queue on a verbs device.
pub(crate) struct Cq {
    pub(super) raw: Arc<RawCq>,
    device: Arc<Device>,
    /// Completions the queues on this CQ may hold at once.
    committed: Mutex<u32>,
    /// Set by a `CQ_ERR` event.
    overrun: Arc<Mutex<Option<String>>>,
}

impl Cq {
    pub(super) fn new(device: &Arc<Device>, depth: usize) -> Result<Self, VerbsError> {
        let depth = u32::try_from(depth.max(1)).unwrap_or(u32::MAX);
        let raw = device
            .ctx
            .create_cq(depth.min(device.attr.max_cqe.max(1) as u32))
            .map_err(|e| device.error("ibv_create_cq", e, None))?;
        let overrun = device.health.watch(raw.key());
        Ok(Self {
            raw: Arc::new(raw),
            device: Arc::clone(device),
            committed: Mutex::new(0),
            overrun,
        })
    }

    /// Makes room for `more` completions, growing the CQ if it must.
    pub(super) fn commit(&self, more: u32) -> Result<(), VerbsError> {
        let mut committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let want = committed.saturating_add(more);
        if want > self.raw.cqe() {
            self.raw.resize(want).map_err(|e| {
                self.device.error(
                    "ibv_resize_cq",
                    e,
                    Some("the queue pairs on this CQ could overrun it; give it more entries"),
                )
            })?;
        }
        *committed = want;
        Ok(())
    }

    pub(super) fn release(&self, less: u32) {
        let mut committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *committed = committed.saturating_sub(less);
    }

    /// `ibv_resize_cq` to at least `depth`, and never below what the queues on it may hold:
    /// the CQ must not overrun.
    pub(crate) fn resize(&self, depth: usize) -> Result<(), VerbsError> {
        let committed = *self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let want = u32::try_from(depth)
            .unwrap_or(u32::MAX)
            .max(committed)
            .max(1);
        self.raw
            .resize(want)
            .map_err(|e| self.device.error("ibv_resize_cq", e, None))
    }

    /// What the device granted (`cqe`), grown as queue pairs joined it.
    pub(crate) fn depth(&self) -> usize {
        self.raw.cqe() as usize
    }

    /// The oldest completion, if any.
    pub(crate) fn poll(&self) -> Option<Completion> {
        let mut wc = [ibv_wc::default()];
        match self.raw.poll(&mut wc) {
            Ok(1) => Some(completion(&wc[0])),
            _ => None,
        }
    }

    /// Up to `out.len()` completions in one `poll_cq`; returns how many.
    pub(crate) fn poll_into(&self, out: &mut [Completion]) -> usize {
        let mut wcs = [ibv_wc::default(); 32];
        let n = out.len().min(wcs.len());
        let got = self.raw.poll(&mut wcs[..n]).unwrap_or(0);
        for (o, wc) in out.iter_mut().zip(&wcs[..got]) {
            *o = completion(wc);
        }
        got
    }

    /// Waits up to `timeout` on the completion channel.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(c) = self.poll() {
                return Some(c);
            }
            // Arm, then look again: a completion that arrived before the arm raised no event.
            if self.raw.arm().is_err() {
                return None;
            }
            if let Some(c) = self.poll() {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let _ = crate::sys::poll_readable([self.raw.fd()], Some(deadline - now));
            self.raw.take_events();
        }
    }

    /// Arms the CQ's completion channel (`ibv_req_notify_cq`).
    pub(crate) fn req_notify(&self, solicited_only: bool) -> std::io::Result<()> {
        self.raw.arm_for(solicited_only)
    }

    /// The channel's events since the last take, read and acknowledged.
    pub(crate) fn take_events(&self) -> u64 {
        self.raw.take_events() as u64
    }

    /// The completion channel's descriptor.
    pub(crate) fn channel_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.raw.channel_fd()
    }

    /// Why the CQ failed, if an event said so.
    pub(crate) fn failure(&self) -> Option<String> {
        self.overrun
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// A libibverbs completion in ferroce's terms. An error completion's opcode is undefined
/// (only `wr_id`, `status` and `qp_num` are), so it reads as whatever the provider left.
fn completion(wc: &ibv_wc) -> Completion {
    let opcode = match wc.opcode {
        IBV_WC_SEND => WcOpcode::Send,
        IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        IBV_WC_RECV => WcOpcode::Recv,
        IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    };
    Completion {
        wr_id: wc.wr_id,
        status: WcStatus::from_ibv_value(wc.status),
        opcode,
        byte_len: wc.byte_len,
        imm: (wc.wc_flags & IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
        qpn: Qpn::from_low_bits(wc.qp_num),
        ud: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_with_immediate_completion_maps_its_fields() {
        let wc = ibv_wc {
            wr_id: 0x1005,
            status: 0,
            opcode: IBV_WC_RECV_RDMA_WITH_IMM,
            byte_len: 4096,
            imm_data: 0x0102_0304u32.to_be(),
            qp_num: 0x11,
            wc_flags: IBV_WC_WITH_IMM,
            ..ibv_wc::default()
        };
        let c = completion(&wc);
        assert_eq!(c.wr_id, 0x1005);
        assert_eq!(c.status, WcStatus::Success);
        assert_eq!(c.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(c.imm, Some(0x0102_0304));
        assert_eq!(c.qpn.value(), 0x11);
    }

    #[test]
    fn error_statuses_keep_rdma_cores_numbers() {
        for s in 0..=21 {
            let wc = ibv_wc {
                status: s,
                ..ibv_wc::default()
            };
            let c = completion(&wc);
            assert_eq!(c.status.ibv_value(), s, "status {s}");
            assert_eq!(c.imm, None);
        }
        let wc = ibv_wc {
            status: 12,
            ..ibv_wc::default()
        };
        assert_eq!(completion(&wc).status, WcStatus::RetryExcErr);
    }
}
