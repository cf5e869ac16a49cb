//! Queue pairs: create, connect to a peer's endpoint, post work.
//!
//! A queue pair is usable from several threads. On the soft NIC every call takes the NIC's
//! lock for as long as the engine needs, and packets a post produces are sent on the caller's
//! thread; on a verbs device a post is one call into the provider through libibverbs' ops
//! table, as C's inline `ibv_post_send` makes it. This file documents, checks arguments and
//! delegates to the backend (`crate::backend::Qp`).

pub use ferroce_proto::qp::{
    AsyncEvent, ModifyError, Mtu, Payload, PostError, QpAttr, QpCaps, QpState, QpType, RecvWr,
    RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce_proto::wire::Qpn;
use ferroce_proto::{Psn, WriteFilter};

use crate::attr::{ConnectAttrs, QpSetup};
pub use crate::attr::{ConnectOptions, QpEndpoint};
use crate::backend;
use crate::cq::Cq;
use crate::error::{NicError, Unsupported};
use crate::nic::Nic;
use crate::srq::Srq;

/// Everything a queue pair is created with (`struct ibv_qp_init_attr`), for [`Qp::create`].
#[derive(Clone, Copy, Debug)]
pub struct QpConfig<'a> {
    /// RC, UC or UD.
    pub qp_type: QpType,
    /// Where its send completions go.
    pub send_cq: &'a Cq,
    /// Where its receive completions go.
    pub recv_cq: &'a Cq,
    /// The shared receive queue it takes its receives from, if any.
    pub srq: Option<&'a Srq>,
    /// Its queues' capacities.
    pub caps: QpCaps,
    /// Every send completes with a completion, signaled or not (`sq_sig_all`).
    pub sq_sig_all: bool,
    /// Leave it in RESET, as `ibv_create_qp` does, for a caller that brings it up attribute
    /// by attribute with [`Qp::modify`] (RESET → INIT names the access, or a UD Q_Key);
    /// otherwise it is created in INIT, ready for receives and for [`Qp::connect`].
    pub in_reset: bool,
}

/// A queue pair of a [`Nic`].
pub struct Qp {
    nic: Nic,
    backend: backend::Qp,
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
        Self::create(
            nic,
            &QpConfig {
                qp_type,
                send_cq,
                recv_cq,
                srq: None,
                caps,
                sq_sig_all: false,
                in_reset: false,
            },
        )
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
        Self::create(
            nic,
            &QpConfig {
                qp_type,
                send_cq,
                recv_cq,
                srq: Some(srq),
                caps,
                sq_sig_all: false,
                in_reset: false,
            },
        )
    }

    /// A queue pair as `config` describes it (`ibv_create_qp` with a whole
    /// `ibv_qp_init_attr`); [`Qp::new`] and [`Qp::with_srq`] are its common cases.
    ///
    /// # Errors
    ///
    /// As [`Qp::with_srq`].
    pub fn create(nic: &Nic, config: &QpConfig<'_>) -> Result<Self, NicError> {
        let QpConfig {
            qp_type,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all,
            in_reset,
        } = *config;
        if !nic.same(&send_cq.nic) || !nic.same(&recv_cq.nic) {
            return Err(NicError::OtherNic("a completion queue"));
        }
        if srq.is_some_and(|s| !nic.same(&s.nic)) {
            return Err(NicError::OtherNic("a shared receive queue"));
        }
        // The first PSN from the OS's CSPRNG, as the NIC's keys: not guessable by a peer.
        let seed = crate::sys::random_u64().map_err(|source| NicError::Socket {
            addr: nic.addr(),
            source,
        })? as u32;
        let setup = QpSetup {
            qp_type,
            caps,
            sq_sig_all,
            psn: Psn::from_low_bits(seed),
            in_reset,
        };
        let backend = nic.backend.create_qp(
            setup,
            &send_cq.backend,
            &recv_cq.backend,
            srq.map(|s| &*s.backend),
        )?;
        Ok(Self {
            nic: nic.clone(),
            backend,
        })
    }

    /// This queue pair's endpoint, for the peer.
    #[must_use]
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qpn: self.qpn(),
            psn: self.backend.psn(),
            addr: self.nic.addr(),
        }
    }

    /// The queue pair number.
    #[must_use]
    pub fn qpn(&self) -> Qpn {
        self.backend.qpn()
    }

    /// The capacities: as asked on the soft NIC; as the device granted them on a verbs
    /// device (`max_inline` in particular, which no query reports otherwise).
    #[must_use]
    pub fn caps(&self) -> QpCaps {
        self.backend.caps()
    }

    /// The current state. On a verbs device, the last state ferroce set, or ERR once an
    /// async event reported the QP failed.
    #[must_use]
    pub fn state(&self) -> Option<QpState> {
        self.backend.state()
    }

    /// Why the QP failed, if a verbs device's async event said so (QP fatal, a request or
    /// access error at the responder, or an overrun of one of its CQs). `None` on the soft
    /// NIC, whose errors arrive as completions.
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.backend.failure()
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
        self.backend
            .connect(&ConnectAttrs::new(peer, self.backend.psn(), options)?)
    }

    /// INIT → RTR → RTS with every attribute given (connection management settles each
    /// side's separately).
    pub(crate) fn connect_with(&self, attrs: &ConnectAttrs) -> Result<(), ModifyError> {
        self.backend.connect(attrs)
    }

    /// Changes the attributes `attr` holds, and only those (`ibv_modify_qp`: its mask is the
    /// fields that are `Some`), for programs that bring a queue pair up step by step as the
    /// verbs do: RESET → INIT with `access` (and a UD QP's `qkey`), INIT → RTR with the peer,
    /// path MTU, its QPN and first PSN (and for RC the responder's resources and RNR timer),
    /// RTR → RTS with our first PSN (and for RC the timeout, retries and READ depth); any
    /// state to ERR or RESET. [`Qp::connect`] does all three at once.
    ///
    /// # Errors
    ///
    /// [`ModifyError::InvalidTransition`] for a move the state machine does not allow,
    /// [`ModifyError::Missing`] naming an attribute the move requires,
    /// [`ModifyError::InvalidValue`] for one out of range; the QP is then unchanged. On a verbs
    /// device, [`ModifyError::Device`] with what `ibv_modify_qp` returned.
    pub fn modify(&self, attr: &QpAttr) -> Result<(), ModifyError> {
        self.backend.modify(attr)
    }

    /// The queue pair's attributes now (`ibv_query_qp`): every field of the [`QpAttr`] that
    /// is set, with the PSNs the requester sends and the responder expects next. On a verbs
    /// device, the attributes ferroce set and the state as [`Qp::state`] gives it. Its
    /// capacities, `max_inline` included, are [`Qp::caps`].
    #[must_use]
    pub fn query(&self) -> QpAttr {
        self.backend.query()
    }

    /// Brings a UD queue pair up to send and receive datagrams with `qkey`: INIT → RTR → RTS
    /// (`ibv_modify_qp` three times, as `ibv_ud_pingpong` does). Its sends then name their
    /// destination ([`SendWr::to`], [`crate::ud::AddressHandle::dest`]).
    ///
    /// # Errors
    ///
    /// [`ModifyError`] when the queue pair is not a UD one in INIT.
    pub fn ready_ud(&self, qkey: u32) -> Result<(), ModifyError> {
        self.backend.ready_ud(qkey)
    }

    /// Posts a send work request (`ibv_post_send`); its packets leave before this returns.
    ///
    /// # Errors
    ///
    /// [`PostError`] when it cannot be queued.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        self.backend.post_send(wr)
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
        self.backend.post_send_list(wrs)
    }

    /// Posts a receive work request (`ibv_post_recv`).
    ///
    /// # Errors
    ///
    /// [`PostError`] when it cannot be queued.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.backend.post_recv(wr)
    }

    /// Moves the queue pair to ERR: everything outstanding completes with a flush error.
    pub fn shutdown(&self) {
        self.backend.shutdown();
    }

    /// QP 1 of a soft NIC, the GSI, in RTS with its fixed Q_Key: connection management's
    /// MADs travel on it. One per NIC at a time.
    pub(crate) fn gsi(nic: &Nic, cq: &Cq, caps: QpCaps) -> Result<Self, NicError> {
        Ok(Self {
            nic: nic.clone(),
            backend: nic.backend.create_gsi(&cq.backend, caps)?,
        })
    }

    /// Shows `filter` every WRITE this QP's responder places, before it lands (the frame
    /// receiver's page checks). [`Unsupported`] on a verbs device, which places WRITEs in
    /// hardware.
    pub(crate) fn set_write_filter(&self, filter: Box<dyn WriteFilter>) -> Result<(), Unsupported> {
        self.backend.set_write_filter(filter)
    }
}
