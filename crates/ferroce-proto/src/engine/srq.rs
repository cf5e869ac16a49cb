//! Shared receive queues (`ibv_create_srq`): one queue of receive requests that any number of
//! queue pairs take from, with the limit event, and where a responder takes its receives from
//! (its own queue or its SRQ).
//!
//! A receive is taken when a message that needs one begins, and stays with that QP until the
//! message ends; its completion goes to that QP's receive CQ and names that QP. An empty SRQ is
//! answered as an empty receive queue is: an RNR NAK on RC, a drop on UC and UD.

use super::*;

/// What [`Engine::query_srq`] reports (`struct ibv_srq_attr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receive requests the queue holds at most.
    pub max_wr: u32,
    /// The armed limit, 0 when not armed.
    pub limit: u32,
    /// Receive requests queued now.
    pub queued: u32,
}

/// Why a shared receive queue could not be changed or destroyed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SrqError {
    /// No shared receive queue has this number.
    #[error("no shared receive queue {0:?}")]
    Unknown(SrqId),
    /// Queue pairs still take receives from it: destroy them first.
    #[error("{0} queue pairs still use this shared receive queue")]
    Busy(u32),
    /// The new size is smaller than what is queued, or the limit is not below the size.
    #[error("{what} = {value} is out of range ({expected})")]
    InvalidValue {
        /// The attribute.
        what: &'static str,
        /// The value given.
        value: u32,
        /// What is allowed now.
        expected: String,
    },
}

#[derive(Debug)]
pub(super) struct Srq {
    pd: PdId,
    max_wr: u32,
    /// Raise [`AsyncEvent::SrqLimitReached`] when fewer than this many remain; 0: disarmed.
    limit: u32,
    queue: VecDeque<RecvWqe>,
    /// Queue pairs created on it.
    pub(super) attached: u32,
}

impl Engine {
    /// A shared receive queue of up to `max_wr` receive requests, checked against `pd`
    /// (`ibv_create_srq`; its limit starts disarmed).
    pub fn create_srq(&mut self, pd: PdId, max_wr: u32) -> SrqId {
        let id = SrqId(self.next_srq);
        self.next_srq += 1;
        self.dev.srqs.insert(
            id,
            Srq {
                pd,
                max_wr: max_wr.max(1),
                limit: 0,
                queue: VecDeque::new(),
                attached: 0,
            },
        );
        id
    }

    /// Posts a receive request to a shared receive queue (`ibv_post_srq_recv`).
    ///
    /// # Errors
    ///
    /// [`PostError::UnknownSrq`], or [`PostError::QueueFull`] when `max_wr` are queued.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: RecvWr) -> Result<(), PostError> {
        let queue = self
            .dev
            .srqs
            .get_mut(&srq)
            .ok_or(PostError::UnknownSrq(srq))?;
        if queue.queue.len() >= queue.max_wr as usize {
            return Err(PostError::QueueFull(queue.max_wr));
        }
        let (segs, len, fault) =
            Self::resolve(&self.dev.table, queue.pd, &wr.sges, Access::LOCAL_WRITE);
        queue.queue.push_back(RecvWqe {
            wr_id: wr.wr_id,
            segs,
            len,
            fault,
        });
        Ok(())
    }

    /// Resizes a shared receive queue and arms or disarms its limit (`ibv_modify_srq` with
    /// `IBV_SRQ_MAX_WR` and `IBV_SRQ_LIMIT`); `None` leaves a value as it is. Once armed with
    /// `limit` n, the first time a receive taken leaves fewer than n queued raises
    /// [`AsyncEvent::SrqLimitReached`] and disarms it.
    ///
    /// # Errors
    ///
    /// [`SrqError::Unknown`], or [`SrqError::InvalidValue`] for a size below what is queued or
    /// a limit not below the size; nothing changes then.
    pub fn modify_srq(
        &mut self,
        srq: SrqId,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), SrqError> {
        let queue = self.dev.srqs.get_mut(&srq).ok_or(SrqError::Unknown(srq))?;
        let queued = queue.queue.len() as u32;
        let size = max_wr.unwrap_or(queue.max_wr);
        if size == 0 || size < queued {
            return Err(SrqError::InvalidValue {
                what: "max_wr",
                value: size,
                expected: format!("at least {} (queued now), and not 0", queued.max(1)),
            });
        }
        if let Some(n) = limit.filter(|&n| n >= size) {
            return Err(SrqError::InvalidValue {
                what: "srq_limit",
                value: n,
                expected: format!("below max_wr {size}"),
            });
        }
        queue.max_wr = size;
        if let Some(n) = limit {
            queue.limit = n;
        }
        Ok(())
    }

    /// A shared receive queue's size, armed limit and queued requests (`ibv_query_srq`).
    #[must_use]
    pub fn query_srq(&self, srq: SrqId) -> Option<SrqAttr> {
        self.dev.srqs.get(&srq).map(|q| SrqAttr {
            max_wr: q.max_wr,
            limit: q.limit,
            queued: q.queue.len() as u32,
        })
    }

    /// Destroys a shared receive queue; its queued requests are discarded without
    /// completions (`ibv_destroy_srq`).
    ///
    /// # Errors
    ///
    /// [`SrqError::Busy`] while queue pairs use it (as verbs refuses), [`SrqError::Unknown`].
    pub fn destroy_srq(&mut self, srq: SrqId) -> Result<(), SrqError> {
        let queue = self.dev.srqs.get(&srq).ok_or(SrqError::Unknown(srq))?;
        if queue.attached > 0 {
            return Err(SrqError::Busy(queue.attached));
        }
        self.dev.srqs.remove(&srq);
        Ok(())
    }
}

impl Qp {
    /// Whether a receive request waits for this QP: in its own queue or in its SRQ.
    pub(super) fn has_recv(&self, dev: &DeviceState) -> bool {
        match self.init.srq {
            Some(id) => dev.srqs.get(&id).is_some_and(|q| !q.queue.is_empty()),
            None => !self.resp.rq.is_empty(),
        }
    }

    /// Takes the next receive request for a message beginning now, from the QP's own queue or
    /// its SRQ, raising the SRQ's limit event when that leaves it below its limit.
    pub(super) fn take_recv(&mut self, dev: &mut DeviceState) -> Option<RecvWqe> {
        let Some(id) = self.init.srq else {
            return self.resp.rq.pop_front();
        };
        let queue = dev.srqs.get_mut(&id)?;
        let wqe = queue.queue.pop_front()?;
        if queue.limit != 0 && (queue.queue.len() as u32) < queue.limit {
            queue.limit = 0;
            dev.raise(AsyncEvent::SrqLimitReached(id));
        }
        Some(wqe)
    }

    /// Puts back a receive request taken for a message that was abandoned, first in line.
    pub(super) fn return_recv(&mut self, dev: &mut DeviceState, wqe: RecvWqe) {
        match self.init.srq {
            None => self.resp.rq.push_front(wqe),
            Some(id) => {
                if let Some(queue) = dev.srqs.get_mut(&id) {
                    queue.queue.push_front(wqe);
                }
            }
        }
    }
}
