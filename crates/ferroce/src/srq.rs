//! Shared receive queues: one pool of receive requests for many queue pairs
//! (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq`, `ibv_query_srq`).
//!
//! A queue pair created with [`crate::Qp::with_srq`] takes every receive from the pool; its
//! completions still go to its own receive CQ and name it ([`crate::cq::Completion::qpn`]), so
//! an application serving many connections posts receives in one place and tells them apart
//! by QP. When the pool runs dry, RC peers get an RNR NAK and retry, as with an empty receive
//! queue. The limit event ([`Srq::arm`]) tells the application to refill before that happens.
//! The soft NIC only, so far. This file documents and delegates to the backend
//! (`crate::backend::Srq`).

use std::sync::Arc;

pub use ferroce_proto::qp::SrqId;
pub use ferroce_proto::{SrqAttr, SrqError};

use crate::backend;
use crate::error::NicError;
use crate::nic::Nic;
use ferroce_proto::qp::{PostError, RecvWr};

/// A shared receive queue of a soft [`Nic`]. Clones are handles of the same queue; it is
/// destroyed when the last handle, and the last queue pair on it, is gone.
#[derive(Clone)]
pub struct Srq {
    pub(crate) nic: Nic,
    pub(crate) backend: Arc<backend::Srq>,
}

impl std::fmt::Debug for Srq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Srq")
            .field("id", &self.id())
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
        Ok(Self {
            nic: nic.clone(),
            backend: Arc::new(nic.backend.create_srq(max_wr)?),
        })
    }

    /// Posts a receive request to the pool (`ibv_post_srq_recv`).
    ///
    /// # Errors
    ///
    /// [`PostError::QueueFull`] when `max_wr` wait already.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.backend.post_recv(wr)
    }

    /// Arms the limit: the first time taking a receive leaves fewer than `limit` queued, the
    /// NIC raises [`ferroce_proto::qp::AsyncEvent::SrqLimitReached`] ([`Nic::poll_event`])
    /// once and disarms it (`ibv_modify_srq` with `IBV_SRQ_LIMIT`). 0 disarms it.
    ///
    /// # Errors
    ///
    /// [`SrqError::InvalidValue`] when `limit` is not below the queue's size.
    pub fn arm(&self, limit: u32) -> Result<(), SrqError> {
        self.backend.modify(None, Some(limit))
    }

    /// Changes how many receive requests the queue holds (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR`).
    ///
    /// # Errors
    ///
    /// [`SrqError::InvalidValue`] for a size below what is queued now.
    pub fn resize(&self, max_wr: u32) -> Result<(), SrqError> {
        self.backend.modify(Some(max_wr), None)
    }

    /// Its size, armed limit and the receive requests queued now (`ibv_query_srq`).
    #[must_use]
    pub fn query(&self) -> SrqAttr {
        self.backend.query().unwrap_or(SrqAttr {
            max_wr: 0,
            limit: 0,
            queued: 0,
        })
    }

    /// Its number on the NIC.
    #[must_use]
    pub fn id(&self) -> SrqId {
        self.backend.id()
    }
}
