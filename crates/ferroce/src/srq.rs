//! Shared receive queues: one pool of receive requests for many queue pairs
//! (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq`, `ibv_query_srq`).
//!
//! A queue pair created with [`crate::Qp::with_srq`] takes every receive from the pool; its
//! completions still go to its own receive CQ and name it ([`crate::cq::Completion::qpn`]), so
//! an application serving many connections posts receives in one place and tells them apart
//! by QP. When the pool runs dry, RC peers get an RNR NAK and retry, as with an empty receive
//! queue. The limit event ([`Srq::arm`]) tells the application to refill before that happens.
//! The soft NIC only, so far.

use std::sync::Arc;

pub use ferroce_proto::qp::SrqId;
pub use ferroce_proto::{SrqAttr, SrqError};

use crate::nic::NicError;
use crate::qp::{PostError, RecvWr};
use crate::Nic;

/// A shared receive queue of a soft [`Nic`]. Clones are handles of the same queue; it is
/// destroyed when the last handle, and the last queue pair on it, is gone.
#[derive(Clone)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

pub(crate) struct SrqInner {
    pub(crate) nic: Nic,
    pub(crate) id: SrqId,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("id", &self.inner.id)
            .finish_non_exhaustive()
    }
}

impl Srq {
    /// A shared receive queue holding up to `max_wr` receive requests, its limit disarmed
    /// (`ibv_create_srq`).
    ///
    /// # Errors
    ///
    /// [`NicError::SoftOnly`] on a verbs device.
    pub fn new(nic: &Nic, max_wr: u32) -> Result<Self, NicError> {
        let soft = nic
            .soft()
            .ok_or(NicError::SoftOnly("shared receive queues"))?;
        let id = soft.shared.lock().engine.create_srq(soft.pd, max_wr);
        Ok(Self {
            inner: Arc::new(SrqInner {
                nic: nic.clone(),
                id,
            }),
        })
    }

    /// Posts a receive request to the pool (`ibv_post_srq_recv`).
    ///
    /// # Errors
    ///
    /// [`PostError::QueueFull`] when `max_wr` wait already.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let soft = self.inner.soft()?;
        let mut state = soft.shared.lock();
        state.engine.post_srq_recv(self.inner.id, wr)?;
        soft.shared.after_command(state);
        Ok(())
    }

    /// Arms the limit: the first time taking a receive leaves fewer than `limit` queued, the
    /// NIC raises [`ferroce_proto::qp::AsyncEvent::SrqLimitReached`] ([`Nic::poll_event`])
    /// once and disarms it (`ibv_modify_srq` with `IBV_SRQ_LIMIT`). 0 disarms it.
    ///
    /// # Errors
    ///
    /// [`SrqError::InvalidValue`] when `limit` is not below the queue's size.
    pub fn arm(&self, limit: u32) -> Result<(), SrqError> {
        self.modify(None, Some(limit))
    }

    /// Changes how many receive requests the queue holds (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR`).
    ///
    /// # Errors
    ///
    /// [`SrqError::InvalidValue`] for a size below what is queued now.
    pub fn resize(&self, max_wr: u32) -> Result<(), SrqError> {
        self.modify(Some(max_wr), None)
    }

    fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<(), SrqError> {
        let soft = self
            .inner
            .soft()
            .map_err(|_| SrqError::Unknown(self.inner.id))?;
        let result = soft
            .shared
            .lock()
            .engine
            .modify_srq(self.inner.id, max_wr, limit);
        result
    }

    /// Its size, armed limit and the receive requests queued now (`ibv_query_srq`).
    #[must_use]
    pub fn query(&self) -> SrqAttr {
        let empty = SrqAttr {
            max_wr: 0,
            limit: 0,
            queued: 0,
        };
        self.inner.soft().map_or(empty, |soft| {
            soft.shared
                .lock()
                .engine
                .query_srq(self.inner.id)
                .unwrap_or(empty)
        })
    }

    /// Its number on the NIC.
    #[must_use]
    pub fn id(&self) -> SrqId {
        self.inner.id
    }
}

impl SrqInner {
    fn soft(&self) -> Result<&crate::nic::SoftNic, PostError> {
        self.nic.soft().ok_or(PostError::UnknownSrq(self.id))
    }
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        // Every queue pair on it holds a handle, so none is left to make this fail.
        if let Some(soft) = self.nic.soft() {
            let _ = soft.shared.lock().engine.destroy_srq(self.id);
        }
    }
}
