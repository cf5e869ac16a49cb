//! Completion queues: where finished work requests are reported. A CQ can be polled, or a
//! thread can block on it until a completion arrives (the completion-channel idea; on a
//! verbs device, the completion channel itself).

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::qp::CqId;
pub use ferroce_proto::qp::{Completion, WcOpcode, WcStatus};

use crate::nic::{Backend, NicError};
use crate::verbs::queue::VerbsCq;
use crate::Nic;

/// A completion queue of a [`Nic`].
#[derive(Clone)]
pub struct Cq {
    pub(crate) nic: Nic,
    pub(crate) inner: CqInner,
}

#[derive(Clone)]
pub(crate) enum CqInner {
    Soft(Arc<SoftCq>, usize),
    Verbs(Arc<VerbsCq>),
}

/// A soft CQ's number in the engine; the CQ is destroyed with its last handle (queue pairs
/// hold one while they report to it).
pub(crate) struct SoftCq {
    id: CqId,
    shared: Arc<crate::soft::Shared>,
}

impl Drop for SoftCq {
    fn drop(&mut self) {
        self.shared.lock().engine.destroy_cq(self.id);
    }
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("nic", &self.nic.device_name())
            .finish_non_exhaustive()
    }
}

impl Cq {
    /// A completion queue holding at least `depth` completions (`ibv_create_cq`). On the soft
    /// NIC, when it overflows, the queue pairs feeding it go to the error state; on a verbs
    /// device it is grown as queue pairs join it, so the queues on it can never overrun it.
    ///
    /// # Errors
    ///
    /// [`NicError::Verbs`] when a verbs device refuses the CQ; never on the soft NIC.
    pub fn new(nic: &Nic, depth: usize) -> Result<Self, NicError> {
        let inner = match &nic.backend {
            Backend::Soft(s) => {
                let id = s.shared.lock().engine.create_cq(depth);
                let shared = Arc::clone(&s.shared);
                CqInner::Soft(Arc::new(SoftCq { id, shared }), depth)
            }
            Backend::Verbs(v) => CqInner::Verbs(Arc::new(VerbsCq::new(&v.device, depth)?)),
        };
        Ok(Self {
            nic: nic.clone(),
            inner,
        })
    }

    /// The soft CQ's id; `None` on a verbs device.
    pub(crate) fn soft_id(&self) -> Option<CqId> {
        match &self.inner {
            CqInner::Soft(cq, _) => Some(cq.id),
            CqInner::Verbs(_) => None,
        }
    }

    /// Up to `out.len()` completions at once (`ibv_poll_cq` with an array); returns how many
    /// were written. Like [`Cq::poll`], it drives the soft engine when it finds none.
    pub fn poll_into(&self, out: &mut [Completion]) -> usize {
        match &self.inner {
            CqInner::Verbs(cq) => cq.poll_into(out),
            CqInner::Soft(..) => {
                let mut n = 0;
                while n < out.len() {
                    match self.poll() {
                        Some(c) => {
                            out[n] = c;
                            n += 1;
                        }
                        None => break,
                    }
                }
                n
            }
        }
    }

    /// The completions the CQ holds: as asked on the soft NIC; on a verbs device what the
    /// device granted (`cqe`), grown as queue pairs joined it.
    #[must_use]
    pub fn depth(&self) -> usize {
        match &self.inner {
            CqInner::Soft(_, depth) => *depth,
            CqInner::Verbs(cq) => cq.raw.cqe() as usize,
        }
    }

    /// Why the CQ failed, if it did: on a verbs device, a `CQ_ERR` event (an overrun, which
    /// loses completions).
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        match &self.inner {
            CqInner::Verbs(cq) => cq.failure(),
            CqInner::Soft(..) => None,
        }
    }

    /// The oldest completion, if any (`ibv_poll_cq` for one entry). When there is none, the
    /// call first drives the soft engine on this thread (receives what has arrived, runs
    /// timers, sends what is ready), so a polling application makes progress without waiting
    /// for the NIC's progress thread to be scheduled. On a verbs device: one `poll_cq`.
    #[must_use]
    pub fn poll(&self) -> Option<Completion> {
        let id = match &self.inner {
            CqInner::Verbs(cq) => return cq.poll(),
            CqInner::Soft(cq, _) => cq.id,
        };
        let soft = self.nic.soft()?;
        let shared = &soft.shared;
        let mut state = shared.lock();
        if let Some(c) = state.engine.poll_completion(id) {
            return Some(c);
        }
        shared.progress_here(&mut state);
        state.engine.poll_completion(id)
    }

    /// Waits up to `timeout` for a completion, driving the engine on this thread meanwhile:
    /// it waits on the NIC's socket itself and handles what arrives, so the thread that waits
    /// is the thread that receives (the frame receiver's `blocking_monitor`). While it is
    /// busy, the progress thread stays off the socket; after 20 ms without a completion it
    /// waits in longer steps, so an idle stream costs next to no CPU. On a verbs device the
    /// device progresses by itself, and this is [`Cq::wait`].
    #[must_use]
    pub fn drive(&self, timeout: Duration) -> Option<Completion> {
        let soft = match (&self.inner, self.nic.soft()) {
            (CqInner::Soft(_, _), Some(soft)) => soft,
            (CqInner::Verbs(cq), _) => return cq.wait(timeout),
            (CqInner::Soft(..), None) => return None,
        };
        let start = Instant::now();
        let deadline = start + timeout;
        loop {
            if let Some(c) = self.poll() {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let step = if now - start < Duration::from_millis(20) {
                Duration::from_millis(1)
            } else {
                Duration::from_millis(50)
            };
            // Readable or not, the next poll takes what there is; a failed socket is the
            // progress thread's to report (`Nic::failure`), so only pace the loop here.
            if crate::sys::wait_readable(soft.shared.port.socket(), Some(step.min(deadline - now)))
                .is_err()
            {
                std::thread::sleep(step.min(deadline - now));
            }
        }
    }

    /// Waits up to `timeout` for a completion; on a verbs device, asleep on the CQ's
    /// completion channel (`ibv_req_notify_cq`, `poll`, `ibv_get_cq_event`), as rdma-core's
    /// tools do with `-e`.
    #[must_use]
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let (id, soft) = match (&self.inner, self.nic.soft()) {
            (CqInner::Soft(cq, _), Some(soft)) => (cq.id, soft),
            (CqInner::Verbs(cq), _) => return cq.wait(timeout),
            (CqInner::Soft(..), None) => return None,
        };
        let deadline = Instant::now() + timeout;
        let shared = &soft.shared;
        let mut state = shared.lock();
        loop {
            if let Some(c) = state.engine.poll_completion(id) {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // Counted while holding the lock, so a completion queued after the check above
            // cannot be announced to nobody: its producer takes the lock first.
            shared.waiters.fetch_add(1, Ordering::SeqCst);
            state = shared
                .completions
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            shared.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
