//! A queue pair on a verbs device: created with the capacities the device grants, brought up
//! INIT → RTR → RTS with `ibv_modify_qp`, and posted to through libibverbs' ops table, with
//! what the provider would refuse checked first.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ferroce_proto::qp::{
    ModifyError, Payload, PostError, QpAttr, QpCaps, QpState, QpType, RecvWr, SendOp, SendWr,
};
use ferroce_proto::wire::Qpn;
use ferroce_proto::Psn;

use super::abi::*;
use super::cq::Cq;
use super::device::Device;
use super::ffi::RawQp;
use crate::attr::{ConnectAttrs, QpSetup};
use crate::error::VerbsError;

/// The gather and scatter entries a QP is created with (or the device's maximum if lower).
const MAX_SGE: u32 = 16;

const STATE_INIT: u8 = 1;
const STATE_RTR: u8 = 2;
const STATE_RTS: u8 = 3;
const STATE_ERR: u8 = 6;

/// A queue pair on a verbs device.
pub(crate) struct Qp {
    raw: RawQp,
    device: Arc<Device>,
    qp_type: QpType,
    /// What the device granted.
    caps: ibv_qp_cap,
    send_cq: Arc<Cq>,
    recv_cq: Arc<Cq>,
    state: AtomicU8,
    /// Set by a QP error event.
    fatal: Arc<Mutex<Option<String>>>,
    psn: Psn,
    /// Reused to turn a list into one chain.
    list: Mutex<Vec<SendWr>>,
    /// Every attribute ferroce has set, merged: what `query` answers (the provider's own
    /// `ibv_query_qp` is not among the calls ferroce loads). Boxed: it is off the hot path.
    set: Box<Mutex<QpAttr>>,
}

fn post_error(e: &io::Error, depth: u32, what: &str) -> PostError {
    match e.raw_os_error() {
        Some(libc::ENOMEM) => PostError::QueueFull(depth),
        _ => PostError::Device(format!("{what}: {e}")),
    }
}

impl Qp {
    pub(super) fn new(
        device: &Arc<Device>,
        setup: QpSetup,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
    ) -> Result<Self, VerbsError> {
        let QpSetup {
            qp_type,
            caps,
            sq_sig_all,
            psn,
            in_reset,
        } = setup;
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
            .create_qp(kind, &send_cq.raw, &recv_cq.raw, sq_sig_all, &mut granted)
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
            set: Box::new(Mutex::new(QpAttr {
                sq_psn: Some(psn),
                ..QpAttr::default()
            })),
        };
        // INIT at once unless asked for RESET, so receives may be posted before connecting,
        // as on the soft NIC; `connect` sets the access peers get.
        if !in_reset {
            qp.to_init(0)
                .map_err(|e| device.error("ibv_modify_qp(INIT)", e, None))?;
        }
        Ok(qp)
    }

    fn to_init(&self, access: u32) -> io::Result<()> {
        let attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.device.port,
            qp_access_flags: access,
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
    pub(crate) fn connect(&self, a: &ConnectAttrs) -> Result<(), ModifyError> {
        // UC has no READ or atomics: asking for them is refused by some providers.
        let mut access = u32::from(a.access.ibv_bits());
        if self.qp_type == QpType::Uc {
            access &= IBV_ACCESS_REMOTE_WRITE;
        }
        self.to_init(access)
            .map_err(|e| self.modify_refused("INIT", e, a.peer.ip()))?;
        self.to_rtr(a)
            .map_err(|e| self.modify_refused("RTR", e, a.peer.ip()))?;
        self.state.store(STATE_RTR, Ordering::Relaxed);
        let mut rts = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            sq_psn: a.sq_psn.value(),
            ..ibv_qp_attr::default()
        };
        let mut mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
        if self.qp_type == QpType::Rc {
            rts.timeout = a.timeout;
            rts.retry_cnt = a.retry_cnt;
            rts.rnr_retry = a.rnr_retry;
            rts.max_rd_atomic = a.max_rd_atomic;
            mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
        }
        self.raw
            .modify(&rts, mask)
            .map_err(|e| self.modify_refused("RTS", e, a.peer.ip()))?;
        self.state.store(STATE_RTS, Ordering::Relaxed);
        self.remember(&QpAttr {
            state: Some(QpState::Rts),
            access: Some(a.access),
            path_mtu: Some(a.mtu),
            dest_qpn: Some(a.dest_qpn),
            peer: Some(a.peer),
            rq_psn: Some(a.rq_psn),
            sq_psn: Some(a.sq_psn),
            max_dest_rd_atomic: Some(a.max_dest_rd_atomic),
            max_rd_atomic: Some(a.max_rd_atomic),
            min_rnr_timer: Some(a.min_rnr_timer),
            timeout: Some(a.timeout),
            retry_cnt: Some(a.retry_cnt),
            rnr_retry: Some(a.rnr_retry),
            qkey: None,
        });
        Ok(())
    }

    /// `ibv_modify_qp` with the attributes `attr` holds: its mask is the fields that are
    /// `Some`. RESET → INIT adds the port and P_Key index, which only the device knows.
    pub(crate) fn modify(&self, attr: &QpAttr) -> Result<(), ModifyError> {
        let mut ibv = ibv_qp_attr::default();
        let mut mask = 0;
        let from = self.state().unwrap_or(QpState::Reset);
        if let Some(state) = attr.state {
            ibv.qp_state = state.ibv_value();
            mask |= IBV_QP_STATE;
            if state == QpState::Init && from == QpState::Reset {
                ibv.port_num = self.device.port;
                mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT;
            }
        }
        if let Some(access) = attr.access {
            ibv.qp_access_flags = u32::from(access.ibv_bits());
            mask |= IBV_QP_ACCESS_FLAGS;
        }
        if let Some(mtu) = attr.path_mtu {
            ibv.path_mtu = u32::from(mtu.ibv_value());
            mask |= IBV_QP_PATH_MTU;
        }
        if let Some(qpn) = attr.dest_qpn {
            ibv.dest_qp_num = qpn.value();
            mask |= IBV_QP_DEST_QPN;
        }
        if let Some(peer) = attr.peer {
            ibv.ah_attr = self.address_vector(peer.ip());
            mask |= IBV_QP_AV;
        }
        if let Some(psn) = attr.rq_psn {
            ibv.rq_psn = psn.value();
            mask |= IBV_QP_RQ_PSN;
        }
        if let Some(psn) = attr.sq_psn {
            ibv.sq_psn = psn.value();
            mask |= IBV_QP_SQ_PSN;
        }
        if let Some(n) = attr.max_dest_rd_atomic {
            ibv.max_dest_rd_atomic = n;
            mask |= IBV_QP_MAX_DEST_RD_ATOMIC;
        }
        if let Some(n) = attr.max_rd_atomic {
            ibv.max_rd_atomic = n;
            mask |= IBV_QP_MAX_QP_RD_ATOMIC;
        }
        if let Some(timer) = attr.min_rnr_timer {
            ibv.min_rnr_timer = timer.code();
            mask |= IBV_QP_MIN_RNR_TIMER;
        }
        if let Some(t) = attr.timeout {
            ibv.timeout = t;
            mask |= IBV_QP_TIMEOUT;
        }
        if let Some(n) = attr.retry_cnt {
            ibv.retry_cnt = n;
            mask |= IBV_QP_RETRY_CNT;
        }
        if let Some(n) = attr.rnr_retry {
            ibv.rnr_retry = n;
            mask |= IBV_QP_RNR_RETRY;
        }
        if let Some(qkey) = attr.qkey {
            ibv.qkey = qkey;
            mask |= IBV_QP_QKEY;
        }
        let step = attr.state.map_or("the same state", state_name);
        let peer = attr
            .peer
            .or(self.set.lock().unwrap_or_else(PoisonError::into_inner).peer)
            .map(|p| p.ip());
        self.raw
            .modify(&ibv, mask)
            .map_err(|e| self.modify_refused(step, e, peer.unwrap_or(self.device.gid.ip())))?;
        if let Some(state) = attr.state {
            self.state.store(
                match state {
                    QpState::Init => STATE_INIT,
                    QpState::Rtr => STATE_RTR,
                    QpState::Rts => STATE_RTS,
                    QpState::Err => STATE_ERR,
                    QpState::Reset | QpState::Sqd => 0,
                },
                Ordering::Relaxed,
            );
        }
        self.remember(attr);
        Ok(())
    }

    /// What ferroce has set on the QP, with the state as it is now (ERR after a fatal event).
    pub(crate) fn query(&self) -> QpAttr {
        QpAttr {
            state: self.state(),
            ..*self.set.lock().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// Merges what was just set into what `query` answers.
    fn remember(&self, attr: &QpAttr) {
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        macro_rules! merge {
            ($($field:ident),*) => { $( if attr.$field.is_some() { set.$field = attr.$field; } )* };
        }
        merge!(
            state,
            access,
            path_mtu,
            dest_qpn,
            peer,
            rq_psn,
            sq_psn,
            max_dest_rd_atomic,
            max_rd_atomic,
            min_rnr_timer,
            timeout,
            retry_cnt,
            rnr_retry,
            qkey
        );
    }

    /// INIT → RTR toward `a.peer`: the address handle is the peer's IPv4-mapped GID and ours
    /// of the device's GID index. RTR resolves the peer's address; right after the table
    /// changed (an address added back) the kernel may still say ENODATA or ETIMEDOUT, so it is
    /// tried 5 more times 200 ms apart, as Hololink does.
    fn to_rtr(&self, a: &ConnectAttrs) -> io::Result<()> {
        let mut rtr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: u32::from(a.mtu.ibv_value()),
            dest_qp_num: a.dest_qpn.value(),
            rq_psn: a.rq_psn.value(),
            ah_attr: self.address_vector(a.peer.ip()),
            ..ibv_qp_attr::default()
        };
        let mut mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
        if self.qp_type == QpType::Rc {
            rtr.max_dest_rd_atomic = a.max_dest_rd_atomic;
            rtr.min_rnr_timer = a.min_rnr_timer.code();
            mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        }
        let mut tries = 0;
        loop {
            rtr.ah_attr.grh.sgid_index = self.device.gid_index() as u8;
            match self.raw.modify(&rtr, mask) {
                Err(e)
                    if tries < 5
                        && matches!(e.raw_os_error(), Some(libc::ENODATA | libc::ETIMEDOUT)) =>
                {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                result => return result,
            }
        }
    }

    /// The address vector toward `peer`: its IPv4-mapped (or IPv6) GID, from ours at the
    /// device's GID index, on RoCE v2.
    fn address_vector(&self, peer: std::net::IpAddr) -> ibv_ah_attr {
        let dgid = match peer {
            std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            std::net::IpAddr::V6(v6) => v6.octets(),
        };
        ibv_ah_attr {
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
        }
    }

    /// `ibv_modify_qp` to `step` failed with `e`: the error, with what usually causes it
    /// (`peer`: the address the QP was aimed at).
    fn modify_refused(&self, step: &str, e: io::Error, peer: std::net::IpAddr) -> ModifyError {
        let device = &self.device;
        let hint = match (step, e.raw_os_error()) {
            ("RTR", Some(libc::ENODATA)) => format!(
                " — GID index {} of {} holds no address (was {} removed?)",
                device.gid_index(),
                device.name,
                device.gid.ip()
            ),
            ("RTR", Some(libc::ETIMEDOUT | libc::ENETUNREACH | libc::EHOSTUNREACH)) => format!(
                " — the kernel could not resolve {} from {} ({}): no route to it, no ARP reply, \
                 or the wrong GID index (ours is {}, {})",
                peer,
                device.name,
                device.gid.ip(),
                device.gid_index(),
                device.gid.gid
            ),
            (_, Some(libc::EINVAL)) => " — an attribute is out of the device's range".to_owned(),
            _ => String::new(),
        };
        ModifyError::Device(format!(
            "{}: ibv_modify_qp to {step} failed: {e}{hint}",
            device.name
        ))
    }

    /// What ferroce refuses before the provider sees it, so no request reaches C that the
    /// QP could not take.
    fn check(&self, wr: &SendWr) -> Result<(), PostError> {
        if self.qp_type == QpType::Uc && wr.op.is_read_or_atomic() {
            return Err(PostError::Unsupported(wr.op));
        }
        match &wr.local {
            Payload::Inline(bytes) if bytes.len() > self.caps.max_inline_data as usize => {
                Err(PostError::InlineTooLong {
                    len: bytes.len(),
                    max: self.caps.max_inline_data,
                })
            }
            Payload::Sges(list) if list.len() > self.caps.max_send_sge as usize => {
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
        Payload::Sge(s) => s.len.into(),
        Payload::Sges(l) => l.iter().map(|s| u64::from(s.len)).sum(),
        Payload::Inline(b) => b.len() as u64,
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.send_cq.release(self.caps.max_send_wr);
        self.recv_cq.release(self.caps.max_recv_wr);
    }
}

/// A state's name as `ibv_modify_qp`'s errors give it.
fn state_name(state: QpState) -> &'static str {
    match state {
        QpState::Reset => "RESET",
        QpState::Init => "INIT",
        QpState::Rtr => "RTR",
        QpState::Rts => "RTS",
        QpState::Sqd => "SQD",
        QpState::Err => "ERR",
    }
}
