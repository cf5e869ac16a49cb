//! Queue pairs: create, connect to a peer's endpoint, post work.
//!
//! A queue pair is usable from several threads. On the soft NIC every call takes the NIC's
//! lock for as long as the engine needs, and packets a post produces are sent on the caller's
//! thread; on a verbs device a post is one call into the provider through libibverbs' ops
//! table, as C's inline `ibv_post_send` makes it.

use std::net::SocketAddr;

use ferroce_proto::memory::Access;
pub use ferroce_proto::qp::{
    AsyncEvent, Mtu, Payload, PostError, QpCaps, QpState, QpType, RecvWr, RemoteAddr, SendOp,
    SendWr, Sge,
};
use ferroce_proto::qp::{ModifyError, QpAttr, QpInit};
use ferroce_proto::wire::{Qpn, RnrTimer};
use ferroce_proto::Psn;

use crate::cq::CqInner;
use crate::nic::NicError;
use crate::region::RegionAccess;
use crate::srq::Srq;
use crate::verbs::queue::VerbsQp;
use crate::{Cq, Nic};

/// What a peer needs to reach a queue pair: its number, its first PSN and its NIC's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    /// The queue pair number.
    pub qpn: Qpn,
    /// The first PSN its requester sends.
    pub psn: Psn,
    /// Its NIC's address and UDP port.
    pub addr: SocketAddr,
}

/// How to connect a queue pair; the defaults are those of `ibv_rc_pingpong` and perftest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Path MTU (1024, as rxe on a 1500-byte link).
    pub mtu: Mtu,
    /// What the peer may do through this queue pair.
    pub access: RegionAccess,
    /// ACK timeout exponent: 4.096 µs × 2^timeout (14: 67 ms).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs (7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7: forever).
    pub rnr_retry: u8,
    /// The RNR timer asked of the peer (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// READs and atomics outstanding each way (16).
    pub max_rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            mtu: Mtu::M1024,
            access: RegionAccess::Remote,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
        }
    }
}

/// Everything INIT → RTR → RTS sets on the soft NIC.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BringUp {
    pub(crate) peer: SocketAddr,
    pub(crate) dest_qpn: Qpn,
    pub(crate) sq_psn: Psn,
    pub(crate) rq_psn: Psn,
    pub(crate) mtu: Mtu,
    pub(crate) access: Access,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: RnrTimer,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
}

/// A queue pair of a [`Nic`].
pub struct Qp {
    nic: Nic,
    inner: QpInner,
}

enum QpInner {
    Soft {
        qpn: Qpn,
        psn: Psn,
        caps: QpCaps,
        /// Keeps the shared receive queue alive while the QP takes from it.
        _srq: Option<Srq>,
        /// Keeps its completion queues alive while it reports to them.
        _cqs: Option<(Cq, Cq)>,
    },
    Verbs(VerbsQp),
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("nic", &self.nic.device_name())
            .field("qpn", &self.qpn())
            .finish_non_exhaustive()
    }
}

impl Qp {
    /// A queue pair of `qp_type` whose completions go to `send_cq` and `recv_cq`, in INIT:
    /// receives may be posted before [`Qp::connect`] (`ibv_create_qp`, then INIT). Its first
    /// PSN is random, as `ibv_rc_pingpong` chooses it. On a verbs device the capacities are
    /// what the device granted ([`Qp::caps`]), and the CQs grow to hold the new queues.
    ///
    /// A UD queue pair is brought up with [`Qp::ready_ud`] rather than [`Qp::connect`].
    ///
    /// # Errors
    ///
    /// [`NicError::OtherNic`] when a CQ belongs to another NIC; [`NicError::Verbs`] when a
    /// verbs device refuses the QP (the message says which capacity, where it can tell);
    /// [`NicError::SoftOnly`] for UD on a verbs device. The soft NIC never refuses one.
    pub fn new(
        nic: &Nic,
        qp_type: QpType,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
    ) -> Result<Self, NicError> {
        Self::create(nic, qp_type, send_cq, recv_cq, caps, None)
    }

    /// A queue pair that takes its receives from `srq` (`ibv_qp_init_attr.srq`), as
    /// [`Qp::new`] otherwise; posting receives to the QP itself is then refused.
    ///
    /// # Errors
    ///
    /// As [`Qp::new`], and [`NicError::OtherNic`] when the SRQ belongs to another NIC.
    pub fn with_srq(
        nic: &Nic,
        qp_type: QpType,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: &Srq,
        caps: QpCaps,
    ) -> Result<Self, NicError> {
        Self::create(nic, qp_type, send_cq, recv_cq, caps, Some(srq))
    }

    fn create(
        nic: &Nic,
        qp_type: QpType,
        send_cq: &Cq,
        recv_cq: &Cq,
        caps: QpCaps,
        srq: Option<&Srq>,
    ) -> Result<Self, NicError> {
        if !nic.same(&send_cq.nic) || !nic.same(&recv_cq.nic) {
            return Err(NicError::OtherNic("a completion queue"));
        }
        if srq.is_some_and(|s| !nic.same(&s.inner.nic)) {
            return Err(NicError::OtherNic("a shared receive queue"));
        }
        if nic.verbs().is_some() && qp_type == QpType::Ud {
            return Err(NicError::SoftOnly("UD queue pairs"));
        }
        // The first PSN from the OS's CSPRNG, as the NIC's keys: not guessable by a peer.
        let seed = crate::nic::os_random().map_err(|source| NicError::Socket {
            addr: nic.addr(),
            source,
        })? as u32;
        if let (Some(device), CqInner::Verbs(scq), CqInner::Verbs(rcq)) =
            (nic.verbs(), &send_cq.inner, &recv_cq.inner)
        {
            let qp = VerbsQp::new(device, qp_type, scq, rcq, caps, Psn::from_low_bits(seed))?;
            return Ok(Self {
                nic: nic.clone(),
                inner: QpInner::Verbs(qp),
            });
        }
        let (Some(soft), Some(scq), Some(rcq)) = (nic.soft(), send_cq.soft_id(), recv_cq.soft_id())
        else {
            return Err(NicError::OtherNic("a completion queue"));
        };
        let mut state = soft.shared.lock();
        let qpn = state
            .engine
            .create_qp(QpInit {
                qp_type,
                pd: soft.pd,
                send_cq: scq,
                recv_cq: rcq,
                caps,
                sq_sig_all: false,
                srq: srq.map(|s| s.inner.id),
            })
            .map_err(|_| NicError::OtherNic("a shared receive queue"))?;
        // INIT at once, so receives can be posted before connecting (as ibv_rc_pingpong does);
        // the access peers get is set by `connect`, a UD QP's Q_Key by `ready_ud`. RESET →
        // INIT with an access (and for UD a Q_Key) cannot fail.
        let init = QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::NONE),
            qkey: (qp_type == QpType::Ud).then_some(0),
            ..QpAttr::default()
        };
        let _ = state.engine.modify_qp(qpn, &init);
        drop(state);
        Ok(Self {
            nic: nic.clone(),
            inner: QpInner::Soft {
                qpn,
                psn: Psn::from_low_bits(seed),
                caps,
                _srq: srq.cloned(),
                _cqs: Some((send_cq.clone(), recv_cq.clone())),
            },
        })
    }

    /// The soft NIC's internals and this QP's number, or `None` on a verbs device.
    fn soft(&self) -> Option<(&crate::nic::SoftNic, Qpn)> {
        match (&self.inner, self.nic.soft()) {
            (QpInner::Soft { qpn, .. }, Some(s)) => Some((s, *qpn)),
            _ => None,
        }
    }

    /// This queue pair's endpoint, for the peer.
    #[must_use]
    pub fn endpoint(&self) -> QpEndpoint {
        let psn = match &self.inner {
            QpInner::Soft { psn, .. } => *psn,
            QpInner::Verbs(qp) => qp.psn(),
        };
        QpEndpoint {
            qpn: self.qpn(),
            psn,
            addr: self.nic.addr(),
        }
    }

    /// The queue pair number.
    #[must_use]
    pub fn qpn(&self) -> Qpn {
        match &self.inner {
            QpInner::Soft { qpn, .. } => *qpn,
            QpInner::Verbs(qp) => qp.qpn(),
        }
    }

    /// The capacities: as asked on the soft NIC; as the device granted them on a verbs
    /// device (`max_inline` in particular, which no query reports otherwise).
    #[must_use]
    pub fn caps(&self) -> QpCaps {
        match &self.inner {
            QpInner::Soft { caps, .. } => *caps,
            QpInner::Verbs(qp) => qp.caps(),
        }
    }

    /// The current state. On a verbs device, the last state ferroce set, or ERR once an
    /// async event reported the QP failed.
    #[must_use]
    pub fn state(&self) -> Option<QpState> {
        match &self.inner {
            QpInner::Verbs(qp) => qp.state(),
            QpInner::Soft { qpn, .. } => self.nic.soft()?.shared.lock().engine.qp_state(*qpn),
        }
    }

    /// Why the QP failed, if a verbs device's async event said so (QP fatal, a request or
    /// access error at the responder, or an overrun of one of its CQs). `None` on the soft
    /// NIC, whose errors arrive as completions.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        match &self.inner {
            QpInner::Verbs(qp) => qp.failure(),
            QpInner::Soft { .. } => None,
        }
    }

    /// Connects to `peer`: INIT → RTR → RTS with `options` (`ibv_modify_qp` three times, with
    /// the attributes `ibv_rc_pingpong` uses; on a verbs device the address handle is the
    /// peer's IPv4-mapped GID and ours of [`Nic::gid_index`]).
    ///
    /// # Errors
    ///
    /// [`ModifyError`] when the queue pair is not in INIT or an option is out of range; from
    /// a verbs device, [`ModifyError::Device`] with what it returned (ETIMEDOUT at RTR: the
    /// peer's address could not be resolved).
    pub fn connect(&self, peer: &QpEndpoint, options: &ConnectOptions) -> Result<(), ModifyError> {
        if let QpInner::Verbs(qp) = &self.inner {
            return qp.connect(peer, options);
        }
        let rnr = RnrTimer::new(options.min_rnr_timer).ok_or(ModifyError::InvalidValue {
            attr: "min_rnr_timer",
            value: options.min_rnr_timer.into(),
            expected: "0 to 31",
        })?;
        self.bring_up(&BringUp {
            peer: peer.addr,
            dest_qpn: peer.qpn,
            sq_psn: self.endpoint().psn,
            rq_psn: peer.psn,
            mtu: options.mtu,
            access: options.access.qp_rights(),
            timeout: options.timeout,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
            min_rnr_timer: rnr,
            max_rd_atomic: options.max_rd_atomic,
            max_dest_rd_atomic: options.max_rd_atomic,
        })
    }

    /// INIT → RTR → RTS on the soft NIC with every attribute given (connection management
    /// settles each side's separately).
    pub(crate) fn bring_up(&self, b: &BringUp) -> Result<(), ModifyError> {
        let Some((soft, qpn)) = self.soft() else {
            return Err(ModifyError::Device(
                "a verbs device's QPs are connected by Qp::connect".into(),
            ));
        };
        let mut state = soft.shared.lock();
        let engine = &mut state.engine;
        engine.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Init),
                access: Some(b.access),
                ..QpAttr::default()
            },
        )?;
        engine.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(b.mtu),
                dest_qpn: Some(b.dest_qpn),
                peer: Some(b.peer),
                rq_psn: Some(b.rq_psn),
                max_dest_rd_atomic: Some(b.max_dest_rd_atomic),
                min_rnr_timer: Some(b.min_rnr_timer),
                ..QpAttr::default()
            },
        )?;
        engine.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(b.sq_psn),
                timeout: Some(b.timeout),
                retry_cnt: Some(b.retry_cnt),
                rnr_retry: Some(b.rnr_retry),
                max_rd_atomic: Some(b.max_rd_atomic),
                ..QpAttr::default()
            },
        )
    }

    /// Brings a UD queue pair up to send and receive datagrams with `qkey`: INIT → RTR → RTS
    /// (`ibv_modify_qp` three times, as `ibv_ud_pingpong` does). Its sends then name their
    /// destination ([`SendWr::to`], [`crate::ud::AddressHandle::dest`]).
    ///
    /// # Errors
    ///
    /// [`ModifyError`] when the queue pair is not a UD one in INIT.
    pub fn ready_ud(&self, qkey: u32) -> Result<(), ModifyError> {
        let Some((soft, qpn)) = self.soft() else {
            return Err(ModifyError::Device(
                "UD queue pairs run on the soft NIC only".into(),
            ));
        };
        let mut state = soft.shared.lock();
        let engine = &mut state.engine;
        let psn = self.endpoint().psn;
        for attr in [
            QpAttr {
                state: Some(QpState::Init),
                access: Some(Access::NONE),
                qkey: Some(qkey),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(psn),
                ..QpAttr::default()
            },
        ] {
            engine.modify_qp(qpn, &attr)?;
        }
        Ok(())
    }

    /// Posts a send work request (`ibv_post_send`); its packets leave before this returns.
    ///
    /// # Errors
    ///
    /// [`PostError`] when it cannot be queued.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        if let QpInner::Verbs(qp) = &self.inner {
            return qp.post_send(wr);
        }
        let Some((soft, qpn)) = self.soft() else {
            return Err(PostError::InvalidState(QpState::Err));
        };
        let mut state = soft.shared.lock();
        state.engine.post_send(qpn, wr)?;
        soft.shared.after_command(state);
        Ok(())
    }

    /// Posts several send work requests at once, as `ibv_post_send` takes a chain of them
    /// (`wr.next`): their packets leave together once all are queued, so a run of small
    /// requests shares system calls and UDP GSO sends instead of costing one each. Stops at
    /// the first request that cannot be queued; those before it are posted and sent.
    ///
    /// # Errors
    ///
    /// The index of the request that could not be queued (verbs' `bad_wr`), and why.
    pub fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, PostError)> {
        if let QpInner::Verbs(qp) = &self.inner {
            return qp.post_send_list(wrs);
        }
        let Some((soft, qpn)) = self.soft() else {
            return Err((0, PostError::InvalidState(QpState::Err)));
        };
        let mut state = soft.shared.lock();
        let mut result = Ok(());
        for (i, wr) in wrs.into_iter().enumerate() {
            if let Err(e) = state.engine.post_send(qpn, wr) {
                result = Err((i, e));
                break;
            }
        }
        soft.shared.after_command(state);
        result
    }

    /// Posts a receive work request (`ibv_post_recv`).
    ///
    /// # Errors
    ///
    /// [`PostError`] when it cannot be queued.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        if let QpInner::Verbs(qp) = &self.inner {
            return qp.post_recv(wr);
        }
        let Some((soft, qpn)) = self.soft() else {
            return Err(PostError::InvalidState(QpState::Err));
        };
        let mut state = soft.shared.lock();
        state.engine.post_recv(qpn, wr)?;
        soft.shared.after_command(state);
        Ok(())
    }

    /// Moves the queue pair to ERR: everything outstanding completes with a flush error.
    pub fn shutdown(&self) {
        let (soft, qpn) = match (&self.inner, self.soft()) {
            (QpInner::Verbs(qp), _) => return qp.shutdown(),
            (_, Some(s)) => s,
            (_, None) => return,
        };
        let mut state = soft.shared.lock();
        let _ = state.engine.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            },
        );
        soft.shared.after_command(state);
    }

    /// QP 1 of a soft NIC, the GSI, in RTS with its fixed Q_Key: connection management's
    /// MADs travel on it. One per NIC at a time.
    pub(crate) fn gsi(nic: &Nic, cq: &Cq, caps: QpCaps) -> Result<Self, NicError> {
        let (Some(soft), Some(cq_id)) = (nic.soft(), cq.soft_id()) else {
            return Err(NicError::SoftOnly(
                "connection management's own GSI endpoints",
            ));
        };
        let mut state = soft.shared.lock();
        let qpn = state
            .engine
            .create_gsi_qp(QpInit {
                qp_type: QpType::Ud,
                pd: soft.pd,
                send_cq: cq_id,
                recv_cq: cq_id,
                caps,
                sq_sig_all: false,
                srq: None,
            })
            .map_err(|_| NicError::SoftOnly("a second GSI on one NIC"))?;
        drop(state);
        let qp = Self {
            nic: nic.clone(),
            inner: QpInner::Soft {
                qpn,
                psn: Psn::default(),
                caps,
                _srq: None,
                _cqs: Some((cq.clone(), cq.clone())),
            },
        };
        qp.ready_ud(ferroce_proto::qp::GSI_QKEY)
            .map_err(|_| NicError::SoftOnly("a GSI that cannot be brought up"))?;
        Ok(qp)
    }

    /// The soft engine's number for this QP, for the faces that attach to the engine.
    pub(crate) fn soft_qpn(&self) -> Option<Qpn> {
        self.soft().map(|(_, qpn)| qpn)
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Some((soft, qpn)) = self.soft() {
            soft.shared.lock().engine.destroy_qp(qpn);
        }
    }
}
