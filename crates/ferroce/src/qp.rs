//! Queue pairs over the soft NIC: create, connect to a peer's endpoint, post work.
//!
//! A queue pair is usable from several threads: every call takes the NIC's lock for as long
//! as the engine needs, and packets a post produces are sent on the caller's thread.

use std::net::SocketAddr;

use ferroce_proto::memory::Access;
use ferroce_proto::qp::{ModifyError, QpAttr, QpInit};
pub use ferroce_proto::qp::{
    Mtu, Payload, PostError, QpCaps, QpState, QpType, RecvWr, RemoteAddr, SendOp, SendWr, Sge,
};
use ferroce_proto::wire::{Qpn, RnrTimer};
use ferroce_proto::Psn;

use crate::region::RegionAccess;
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

/// A queue pair of a [`Nic`].
#[derive(Debug)]
pub struct Qp {
    nic: Nic,
    qpn: Qpn,
    psn: Psn,
}

impl Qp {
    /// A queue pair of `qp_type` whose completions go to `send_cq` and `recv_cq`, in INIT:
    /// receives may be posted before [`Qp::connect`]. Its first PSN is random, as
    /// `ibv_rc_pingpong` chooses it.
    #[must_use]
    pub fn new(nic: &Nic, qp_type: QpType, send_cq: &Cq, recv_cq: &Cq, caps: QpCaps) -> Self {
        let mut state = nic.shared.lock();
        let qpn = state.engine.create_qp(QpInit {
            qp_type,
            pd: nic.pd,
            send_cq: send_cq.id,
            recv_cq: recv_cq.id,
            caps,
            sq_sig_all: false,
        });
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos())
            .wrapping_mul(0x9e37_79b9)
            ^ qpn.value();
        // INIT at once, so receives can be posted before connecting (as ibv_rc_pingpong does);
        // the access peers get is set by `connect`. RESET → INIT with an access cannot fail.
        let init = QpAttr {
            state: Some(QpState::Init),
            access: Some(Access::NONE),
            ..QpAttr::default()
        };
        let _ = state.engine.modify_qp(qpn, &init);
        drop(state);
        Self {
            nic: nic.clone(),
            qpn,
            psn: Psn::from_low_bits(seed),
        }
    }

    /// This queue pair's endpoint, for the peer.
    #[must_use]
    pub fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            qpn: self.qpn,
            psn: self.psn,
            addr: self.nic.addr(),
        }
    }

    /// The queue pair number.
    #[must_use]
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The current state.
    #[must_use]
    pub fn state(&self) -> Option<QpState> {
        self.nic.shared.lock().engine.qp_state(self.qpn)
    }

    /// Connects to `peer`: INIT → RTR → RTS with `options`.
    ///
    /// # Errors
    ///
    /// [`ModifyError`] when the queue pair is not in INIT or an option is out of range.
    pub fn connect(&self, peer: &QpEndpoint, options: &ConnectOptions) -> Result<(), ModifyError> {
        let mut state = self.nic.shared.lock();
        let engine = &mut state.engine;
        let access = match options.access {
            RegionAccess::Local => Access::NONE,
            RegionAccess::RemoteWrite => Access::REMOTE_WRITE,
            RegionAccess::Remote => Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
        };
        let rnr = RnrTimer::new(options.min_rnr_timer).ok_or(ModifyError::InvalidValue {
            attr: "min_rnr_timer",
            value: options.min_rnr_timer.into(),
            expected: "0 to 31",
        })?;
        engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Init),
                access: Some(access),
                ..QpAttr::default()
            },
        )?;
        engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(options.mtu),
                dest_qpn: Some(peer.qpn),
                peer: Some(peer.addr),
                rq_psn: Some(peer.psn),
                max_dest_rd_atomic: Some(options.max_rd_atomic),
                min_rnr_timer: Some(rnr),
                ..QpAttr::default()
            },
        )?;
        engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(self.psn),
                timeout: Some(options.timeout),
                retry_cnt: Some(options.retry_cnt),
                rnr_retry: Some(options.rnr_retry),
                max_rd_atomic: Some(options.max_rd_atomic),
                ..QpAttr::default()
            },
        )
    }

    /// Posts a send work request (`ibv_post_send`); its packets leave before this returns.
    ///
    /// # Errors
    ///
    /// [`PostError`] when it cannot be queued.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        let mut state = self.nic.shared.lock();
        state.engine.post_send(self.qpn, wr)?;
        self.nic.shared.after_command(state);
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
        let mut state = self.nic.shared.lock();
        let mut result = Ok(());
        for (i, wr) in wrs.into_iter().enumerate() {
            if let Err(e) = state.engine.post_send(self.qpn, wr) {
                result = Err((i, e));
                break;
            }
        }
        self.nic.shared.after_command(state);
        result
    }

    /// Posts a receive work request (`ibv_post_recv`).
    ///
    /// # Errors
    ///
    /// [`PostError`] when it cannot be queued.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let mut state = self.nic.shared.lock();
        state.engine.post_recv(self.qpn, wr)?;
        self.nic.shared.after_command(state);
        Ok(())
    }

    /// Moves the queue pair to ERR: everything outstanding completes with a flush error.
    pub fn shutdown(&self) {
        let mut state = self.nic.shared.lock();
        let _ = state.engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            },
        );
        self.nic.shared.after_command(state);
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.nic.shared.lock().engine.destroy_qp(self.qpn);
    }
}
