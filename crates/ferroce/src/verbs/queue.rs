//! Completion queues, queue pairs and regions on a verbs device: ferroce's work requests,
//! completions, attributes and errors in libibverbs' terms and back.
//!
//! A CQ has its own completion channel, so [`VerbsCq::wait`] sleeps in `poll(2)` as
//! rdma-core's `-e` mode does (arm, poll, wait, read the event, re-arm, drain). A CQ is grown
//! with `ibv_resize_cq` whenever the queues feeding it could hold more completions than it
//! has room for, so it never overruns (rxe errors the QP when one does).

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::memory::WriteOrder;
use ferroce_proto::qp::{
    Completion, ModifyError, PostError, QpCaps, QpState, QpType, RecvWr, SendOp, SendWr, WcOpcode,
    WcStatus,
};
use ferroce_proto::wire::Qpn;
use ferroce_proto::Psn;

use super::abi::*;
use super::{Device, VerbsError};
use crate::qp::{ConnectOptions, QpEndpoint};
use crate::region::RegionAccess;

/// The gather and scatter entries a QP is created with (or the device's maximum if lower).
const MAX_SGE: u32 = 16;

/// A completion queue on a verbs device.
pub(crate) struct VerbsCq {
    pub(crate) raw: Arc<super::RawCq>,
    device: Arc<Device>,
    /// Completions the queues on this CQ may hold at once.
    committed: Mutex<u32>,
    /// Set by a `CQ_ERR` event.
    overrun: Arc<Mutex<Option<String>>>,
}

impl VerbsCq {
    pub(crate) fn new(device: &Arc<Device>, depth: usize) -> Result<Self, VerbsError> {
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
    fn commit(&self, more: u32) -> Result<(), VerbsError> {
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

    fn release(&self, less: u32) {
        let mut committed = self
            .committed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *committed = committed.saturating_sub(less);
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
pub(crate) fn completion(wc: &ibv_wc) -> Completion {
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

const STATE_INIT: u8 = 1;
const STATE_RTR: u8 = 2;
const STATE_RTS: u8 = 3;
const STATE_ERR: u8 = 6;

/// A queue pair on a verbs device.
pub(crate) struct VerbsQp {
    raw: super::RawQp,
    device: Arc<Device>,
    qp_type: QpType,
    /// What the device granted.
    caps: ibv_qp_cap,
    send_cq: Arc<VerbsCq>,
    recv_cq: Arc<VerbsCq>,
    state: AtomicU8,
    /// Set by a QP error event.
    fatal: Arc<Mutex<Option<String>>>,
    psn: Psn,
    /// Reused to turn a list into one chain.
    list: Mutex<Vec<SendWr>>,
}

fn post_error(e: &io::Error, depth: u32, what: &str) -> PostError {
    match e.raw_os_error() {
        Some(libc::ENOMEM) => PostError::QueueFull(depth),
        _ => PostError::Device(format!("{what}: {e}")),
    }
}

impl VerbsQp {
    pub(crate) fn new(
        device: &Arc<Device>,
        qp_type: QpType,
        send_cq: &Arc<VerbsCq>,
        recv_cq: &Arc<VerbsCq>,
        caps: QpCaps,
        psn: Psn,
    ) -> Result<Self, VerbsError> {
        let max_sge = u32::try_from(device.attr.max_sge)
            .unwrap_or(1)
            .clamp(1, MAX_SGE);
        let mut granted = ibv_qp_cap {
            max_send_wr: caps.sq_depth.max(1),
            max_recv_wr: caps.rq_depth.max(1),
            max_send_sge: max_sge,
            max_recv_sge: max_sge,
            max_inline_data: caps.max_inline,
        };
        let kind = match qp_type {
            QpType::Rc => IBV_QPT_RC,
            QpType::Uc => IBV_QPT_UC,
            QpType::Ud => {
                return Err(VerbsError::Call {
                    call: "ibv_create_qp",
                    device: device.name.clone(),
                    source: io::Error::from_raw_os_error(libc::EOPNOTSUPP),
                    hint: Some("ferroce runs UD queue pairs on the soft NIC only so far"),
                })
            }
        };
        let raw = device
            .pd
            .create_qp(kind, &send_cq.raw, &recv_cq.raw, &mut granted)
            .map_err(|e| {
                let hint = match e.raw_os_error() {
                    Some(libc::EINVAL) => Some(
                        "a capacity is above the device's limit (max_inline is the usual one; rxe grants at most 400 bytes)",
                    ),
                    Some(libc::ENOMEM) => Some("the device is out of QPs or queue memory"),
                    _ => None,
                };
                device.error("ibv_create_qp", e, hint)
            })?;
        send_cq.commit(granted.max_send_wr)?;
        if let Err(e) = recv_cq.commit(granted.max_recv_wr) {
            send_cq.release(granted.max_send_wr);
            return Err(e);
        }
        let fatal = device.health.watch(raw.key());
        let qp = Self {
            raw,
            device: Arc::clone(device),
            qp_type,
            caps: granted,
            send_cq: Arc::clone(send_cq),
            recv_cq: Arc::clone(recv_cq),
            state: AtomicU8::new(0),
            fatal,
            psn,
            list: Mutex::new(Vec::new()),
        };
        // INIT at once, so receives may be posted before connecting, as on the soft NIC;
        // `connect` sets the access peers get.
        qp.to_init(0)
            .map_err(|e| device.error("ibv_modify_qp(INIT)", e, None))?;
        Ok(qp)
    }

    fn to_init(&self, access: i32) -> io::Result<()> {
        let attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.device.port,
            qp_access_flags: access as u32,
            ..ibv_qp_attr::default()
        };
        self.raw.modify(
            &attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )?;
        self.state.store(STATE_INIT, Ordering::Relaxed);
        Ok(())
    }

    pub(crate) fn qpn(&self) -> Qpn {
        Qpn::from_low_bits(self.raw.qp_num())
    }

    pub(crate) fn psn(&self) -> Psn {
        self.psn
    }

    /// The capacities granted: `max_inline` is what the device gave, not what was asked.
    pub(crate) fn caps(&self) -> QpCaps {
        QpCaps {
            sq_depth: self.caps.max_send_wr,
            rq_depth: self.caps.max_recv_wr,
            max_inline: self.caps.max_inline_data,
        }
    }

    pub(crate) fn state(&self) -> Option<QpState> {
        if self
            .fatal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
        {
            return Some(QpState::Err);
        }
        Some(match self.state.load(Ordering::Relaxed) {
            STATE_INIT => QpState::Init,
            STATE_RTR => QpState::Rtr,
            STATE_RTS => QpState::Rts,
            STATE_ERR => QpState::Err,
            _ => QpState::Reset,
        })
    }

    /// Why the QP failed, if an async event said so.
    pub(crate) fn failure(&self) -> Option<String> {
        self.fatal
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .or_else(|| self.send_cq.failure())
            .or_else(|| self.recv_cq.failure())
    }

    /// INIT → RTR → RTS, with `ibv_rc_pingpong`'s attributes (UC: only the PSNs).
    pub(crate) fn connect(
        &self,
        peer: &QpEndpoint,
        options: &ConnectOptions,
    ) -> Result<(), ModifyError> {
        let refused = |step: &str, e: io::Error| {
            let hint = match (step, e.raw_os_error()) {
                ("RTR", Some(libc::ENODATA)) => format!(
                    " — GID index {} of {} holds no address (was {} removed?)",
                    self.device.gid_index(),
                    self.device.name,
                    self.device.gid.ip()
                ),
                ("RTR", Some(libc::ETIMEDOUT | libc::ENETUNREACH | libc::EHOSTUNREACH)) => {
                    format!(
                        " — the kernel could not resolve {} from {} ({}): no route to it, no ARP \
                         reply, or the wrong GID index (ours is {}, {})",
                        peer.addr.ip(),
                        self.device.name,
                        self.device.gid.ip(),
                        self.device.gid_index(),
                        self.device.gid.gid
                    )
                }
                (_, Some(libc::EINVAL)) => {
                    " — an attribute is out of the device's range".to_owned()
                }
                _ => String::new(),
            };
            ModifyError::Device(format!(
                "{}: ibv_modify_qp to {step} failed: {e}{hint}",
                self.device.name
            ))
        };
        // UC has no READ or atomics: asking for them is refused by some providers.
        let mut access = i32::from(options.access.qp_rights().ibv_bits());
        if self.qp_type == QpType::Uc {
            access &= IBV_ACCESS_REMOTE_WRITE;
        }
        self.to_init(access).map_err(|e| refused("INIT", e))?;
        let dgid = match peer.addr.ip() {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        let mut rtr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: u32::from(options.mtu.ibv_value()),
            dest_qp_num: peer.qpn.value(),
            rq_psn: peer.psn.value(),
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: ibv_gid { raw: dgid },
                    flow_label: 0,
                    sgid_index: self.device.gid_index() as u8,
                    hop_limit: 64,
                    traffic_class: 0,
                },
                is_global: 1,
                port_num: self.device.port,
                ..ibv_ah_attr::default()
            },
            ..ibv_qp_attr::default()
        };
        let mut mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        if self.qp_type == QpType::Rc {
            rtr.max_dest_rd_atomic = options.max_rd_atomic;
            rtr.min_rnr_timer = options.min_rnr_timer;
            mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        }
        // RTR resolves the peer's address. Right after the table changed (an address added
        // back) the kernel may still say ENODATA or ETIMEDOUT; Hololink retries 5 × 200 ms.
        let mut tries = 0;
        loop {
            rtr.ah_attr.grh.sgid_index = self.device.gid_index() as u8;
            match self.raw.modify(&rtr, mask) {
                Ok(()) => break,
                Err(e)
                    if tries < 5
                        && matches!(e.raw_os_error(), Some(libc::ENODATA | libc::ETIMEDOUT)) =>
                {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(refused("RTR", e)),
            }
        }
        self.state.store(STATE_RTR, Ordering::Relaxed);
        let mut rts_attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            sq_psn: self.psn.value(),
            ..ibv_qp_attr::default()
        };
        let mut mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        if self.qp_type == QpType::Rc {
            rts_attr.timeout = options.timeout;
            rts_attr.retry_cnt = options.retry_cnt;
            rts_attr.rnr_retry = options.rnr_retry;
            rts_attr.max_rd_atomic = options.max_rd_atomic;
            mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        }
        self.raw
            .modify(&rts_attr, mask)
            .map_err(|e| refused("RTS", e))?;
        self.state.store(STATE_RTS, Ordering::Relaxed);
        Ok(())
    }

    /// What ferroce refuses before the provider sees it, so no request reaches C that the
    /// QP could not take.
    fn check(&self, wr: &SendWr) -> Result<(), PostError> {
        if self.qp_type == QpType::Uc && wr.op.is_read_or_atomic() {
            return Err(PostError::Unsupported(wr.op));
        }
        match &wr.local {
            ferroce_proto::qp::Payload::Inline(bytes)
                if bytes.len() > self.caps.max_inline_data as usize =>
            {
                Err(PostError::InlineTooLong {
                    len: bytes.len(),
                    max: self.caps.max_inline_data,
                })
            }
            ferroce_proto::qp::Payload::Sges(list)
                if list.len() > self.caps.max_send_sge as usize =>
            {
                Err(PostError::Length(list.len() as u64))
            }
            _ if matches!(wr.op, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
                && local_len(wr) != 8 =>
            {
                Err(PostError::Length(local_len(wr)))
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.check(&wr)?;
        self.raw
            .post_send_one(&wr)
            .map_err(|e| self.posting_failed(&e, "ibv_post_send"))
    }

    pub(crate) fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, PostError)> {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        list.clear();
        let mut refused = None;
        for (i, wr) in wrs.into_iter().enumerate() {
            if let Err(e) = self.check(&wr) {
                refused = Some((i, e));
                break;
            }
            list.push(wr);
        }
        let posted = self
            .raw
            .post_send(&list)
            .map_err(|(i, e)| (i, self.posting_failed(&e, "ibv_post_send")));
        list.clear();
        posted?;
        refused.map_or(Ok(()), Err)
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        if wr.sges.len() > self.caps.max_recv_sge as usize {
            return Err(PostError::Length(wr.sges.len() as u64));
        }
        self.raw
            .post_recv(std::slice::from_ref(&wr))
            .map_err(|(_, e)| post_error(&e, self.caps.max_recv_wr, "ibv_post_recv"))
    }

    fn posting_failed(&self, e: &io::Error, call: &str) -> PostError {
        if e.raw_os_error() == Some(libc::EINVAL) && self.state() != Some(QpState::Rts) {
            return PostError::InvalidState(self.state().unwrap_or(QpState::Reset));
        }
        post_error(e, self.caps.max_send_wr, call)
    }

    /// To ERR: what is outstanding completes with a flush error.
    pub(crate) fn shutdown(&self) {
        let attr = ibv_qp_attr {
            qp_state: IBV_QPS_ERR,
            ..ibv_qp_attr::default()
        };
        if self.raw.modify(&attr, IBV_QP_STATE).is_ok() {
            self.state.store(STATE_ERR, Ordering::Relaxed);
        }
    }
}

fn local_len(wr: &SendWr) -> u64 {
    match &wr.local {
        ferroce_proto::qp::Payload::Sge(s) => s.len.into(),
        ferroce_proto::qp::Payload::Sges(l) => l.iter().map(|s| u64::from(s.len)).sum(),
        ferroce_proto::qp::Payload::Inline(b) => b.len() as u64,
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        self.send_cq.release(self.caps.max_send_wr);
        self.recv_cq.release(self.caps.max_recv_wr);
    }
}

/// The access flags of a region: the local write every region gets, what peers may do, and
/// relaxed ordering (optional: ignored by a device without it) for [`WriteOrder::AnyOrder`].
pub(crate) fn region_access(access: RegionAccess, order: WriteOrder) -> i32 {
    let relaxed = match order {
        WriteOrder::AnyOrder => IBV_ACCESS_RELAXED_ORDERING,
        WriteOrder::InOrder => 0,
    };
    i32::from(access.rights().ibv_bits()) | relaxed
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

    #[test]
    fn access_follows_the_region_and_its_order() {
        assert_eq!(
            region_access(RegionAccess::Local, WriteOrder::InOrder),
            IBV_ACCESS_LOCAL_WRITE
        );
        assert_eq!(
            region_access(RegionAccess::RemoteWrite, WriteOrder::AnyOrder),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING
        );
        assert_eq!(
            region_access(RegionAccess::Remote, WriteOrder::InOrder),
            IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_ATOMIC
        );
        // A QP's rights carry no local write.
        assert_eq!(
            i32::from(RegionAccess::Remote.qp_rights().ibv_bits()),
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
        );
        assert_eq!(RegionAccess::Local.qp_rights().ibv_bits(), 0);
    }
}
