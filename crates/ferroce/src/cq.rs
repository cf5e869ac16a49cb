//! Completion queues: where finished work requests are reported. A CQ can be polled, or a
//! thread can block on it until a completion arrives (the completion-channel idea).

use std::sync::atomic::Ordering;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use ferroce_proto::qp::CqId;
pub use ferroce_proto::qp::{Completion, WcOpcode, WcStatus};

use crate::Nic;

/// A completion queue of a [`Nic`].
#[derive(Clone, Debug)]
pub struct Cq {
    pub(crate) nic: Nic,
    pub(crate) id: CqId,
}

impl Cq {
    /// A completion queue holding up to `depth` completions; when it overflows, the queue
    /// pairs feeding it go to the error state.
    #[must_use]
    pub fn new(nic: &Nic, depth: usize) -> Self {
        let id = nic.shared.lock().engine.create_cq(depth);
        Self {
            nic: nic.clone(),
            id,
        }
    }

    /// The oldest completion, if any (`ibv_poll_cq` for one entry). When there is none, the
    /// call first drives the engine on this thread (receives what has arrived, runs timers,
    /// sends what is ready), so a polling application makes progress without waiting for the
    /// NIC's progress thread to be scheduled.
    #[must_use]
    pub fn poll(&self) -> Option<Completion> {
        let shared = &self.nic.shared;
        let mut state = shared.lock();
        if let Some(c) = state.engine.poll_completion(self.id) {
            return Some(c);
        }
        shared.progress_here(&mut state);
        state.engine.poll_completion(self.id)
    }

    /// Waits up to `timeout` for a completion, driving the engine on this thread meanwhile:
    /// it waits on the NIC's socket itself and handles what arrives, so the thread that waits
    /// is the thread that receives (the frame receiver's `blocking_monitor`). While it is
    /// busy, the progress thread stays off the socket; after 20 ms without a completion it
    /// waits in longer steps, so an idle stream costs next to no CPU.
    #[must_use]
    pub fn drive(&self, timeout: Duration) -> Option<Completion> {
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
            if crate::sys::wait_readable(
                self.nic.shared.port.socket(),
                Some(step.min(deadline - now)),
            )
            .is_err()
            {
                std::thread::sleep(step.min(deadline - now));
            }
        }
    }

    /// Waits up to `timeout` for a completion.
    #[must_use]
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let shared = &self.nic.shared;
        let mut state = shared.lock();
        loop {
            if let Some(c) = state.engine.poll_completion(self.id) {
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
