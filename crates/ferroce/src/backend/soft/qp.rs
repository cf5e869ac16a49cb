//! A soft queue pair: a number in the engine, brought up and posted to under the NIC's lock.
//! The packets a post produces leave on the caller's thread before the call returns.

use std::sync::Arc;

use ferroce_proto::memory::Access;
use ferroce_proto::qp::{ModifyError, PostError, QpAttr, QpCaps, QpState, RecvWr, SendWr};
use ferroce_proto::wire::Qpn;
use ferroce_proto::{Psn, WriteFilter};

use super::cq::Cq;
use super::driver::Driver;
use super::srq::Srq;
use crate::attr::ConnectAttrs;
use crate::steps::{self, Step};

/// A soft QP. It keeps its CQs and SRQ alive while it reports to them and takes from it.
pub(crate) struct Qp {
    driver: Arc<Driver>,
    qpn: Qpn,
    psn: Psn,
    caps: QpCaps,
    _srq: Option<Arc<Srq>>,
    _cqs: (Arc<Cq>, Arc<Cq>),
}

impl Qp {
    pub(super) fn new(
        driver: &Arc<Driver>,
        qpn: Qpn,
        psn: Psn,
        caps: QpCaps,
        srq: Option<Arc<Srq>>,
        cqs: (Arc<Cq>, Arc<Cq>),
    ) -> Self {
        Self {
            driver: Arc::clone(driver),
            qpn,
            psn,
            caps,
            _srq: srq,
            _cqs: cqs,
        }
    }

    pub(crate) fn qpn(&self) -> Qpn {
        self.qpn
    }

    pub(crate) fn psn(&self) -> Psn {
        self.psn
    }

    /// As asked: the engine takes any capacity.
    pub(crate) fn caps(&self) -> QpCaps {
        self.caps
    }

    pub(crate) fn state(&self) -> Option<QpState> {
        self.driver.lock().engine.qp_state(self.qpn)
    }

    /// INIT → RTR → RTS with every attribute given.
    pub(crate) fn connect(&self, a: &ConnectAttrs) -> Result<(), ModifyError> {
        let mut state = self.driver.lock();
        let engine = &mut state.engine;
        engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Init),
                access: Some(a.access),
                ..QpAttr::default()
            },
        )?;
        engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(a.mtu),
                dest_qpn: Some(a.dest_qpn),
                peer: Some(a.peer),
                rq_psn: Some(a.rq_psn),
                max_dest_rd_atomic: Some(a.max_dest_rd_atomic),
                min_rnr_timer: Some(a.min_rnr_timer),
                ..QpAttr::default()
            },
        )?;
        engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(a.sq_psn),
                timeout: Some(a.timeout),
                retry_cnt: Some(a.retry_cnt),
                rnr_retry: Some(a.rnr_retry),
                max_rd_atomic: Some(a.max_rd_atomic),
                ..QpAttr::default()
            },
        )
    }

    /// `ibv_modify_qp`: the engine checks the transition and what it requires.
    pub(crate) fn modify(&self, attr: &QpAttr) -> Result<(), ModifyError> {
        let mut state = self.driver.lock();
        let result = state.engine.modify_qp(self.qpn, attr);
        // A move to ERR flushes the queues, and RTS may let queued requests go.
        self.driver.after_command(state);
        result
    }

    /// `ibv_query_qp`: every attribute as the engine holds it now.
    pub(crate) fn query(&self) -> QpAttr {
        self.driver
            .lock()
            .engine
            .query_qp(self.qpn)
            .unwrap_or_default()
    }

    /// A UD QP's INIT → RTR → RTS with `qkey`, as `ibv_ud_pingpong` does.
    pub(crate) fn ready_ud(&self, qkey: u32) -> Result<(), ModifyError> {
        let mut state = self.driver.lock();
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
                sq_psn: Some(self.psn),
                ..QpAttr::default()
            },
        ] {
            state.engine.modify_qp(self.qpn, &attr)?;
        }
        Ok(())
    }

    pub(crate) fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        steps::mark(Step::Posting);
        let (mut state, now, first) = self.driver.enter();
        let behind = state.engine.sq_len(self.qpn);
        state.engine.post_send(self.qpn, wr)?;
        steps::mark(Step::Posted);
        self.driver.sent(state, first, now, behind);
        steps::mark(Step::Returned);
        Ok(())
    }

    /// Queues every request up to the first refused, then sends what they produced together.
    pub(crate) fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, PostError)> {
        let (mut state, now, first) = self.driver.enter();
        let behind = state.engine.sq_len(self.qpn);
        let mut result = Ok(());
        for (i, wr) in wrs.into_iter().enumerate() {
            if let Err(e) = state.engine.post_send(self.qpn, wr) {
                result = Err((i, e));
                break;
            }
        }
        self.driver.sent(state, first, now, behind);
        result
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let (mut state, now, _) = self.driver.enter();
        state.engine.post_recv(self.qpn, wr)?;
        self.driver.after_command_at(state, now);
        Ok(())
    }

    /// To ERR: what is outstanding completes with a flush error.
    pub(crate) fn shutdown(&self) {
        let mut state = self.driver.lock();
        let _ = state.engine.modify_qp(
            self.qpn,
            &QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            },
        );
        self.driver.after_command(state);
    }

    /// Shows `filter` every WRITE this QP's responder places, before it lands.
    pub(crate) fn set_write_filter(&self, filter: Box<dyn WriteFilter>) {
        self.driver
            .lock()
            .engine
            .set_write_filter(self.qpn, Some(filter));
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let mut state = self.driver.lock();
        state.engine.destroy_qp(self.qpn);
        // What the QP already owes its peer leaves now, an ACK held back for the polling
        // application's next packet above all: a program that destroys the QP the moment
        // its last receive completes (ibv_rc_pingpong) has acknowledged that receive.
        self.driver.after_close(state);
    }
}
