//! A soft completion queue: a number in the engine, polled under the NIC's lock. Polling drives
//! the engine on the caller's thread when nothing is there; waiting sleeps on the driver's
//! condition variable, or on the socket itself (`drive`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::qp::{Completion, CqId};

use super::driver::Driver;

/// A soft CQ; destroyed in the engine with its last handle (queue pairs hold one while they
/// report to it).
pub(crate) struct Cq {
    id: CqId,
    depth: usize,
    driver: Arc<Driver>,
}

impl Cq {
    pub(super) fn new(driver: &Arc<Driver>, depth: usize) -> Self {
        let id = driver.lock().engine.create_cq(depth);
        Self {
            id,
            depth,
            driver: Arc::clone(driver),
        }
    }

    pub(super) fn id(&self) -> CqId {
        self.id
    }

    /// As asked at creation: the engine takes any depth.
    pub(crate) fn depth(&self) -> usize {
        self.depth
    }

    /// The oldest completion; when there is none, drives the engine here first.
    pub(crate) fn poll(&self) -> Option<Completion> {
        let mut state = self.driver.lock();
        if let Some(c) = state.engine.poll_completion(self.id) {
            return Some(c);
        }
        self.driver.progress_here(&mut state);
        state.engine.poll_completion(self.id)
    }

    /// Up to `out.len()` completions, one `poll` each.
    pub(crate) fn poll_into(&self, out: &mut [Completion]) -> usize {
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

    /// Polls, and between polls waits on the NIC's socket: the waiting thread receives.
    pub(crate) fn drive(&self, timeout: Duration) -> Option<Completion> {
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
            if crate::sys::wait_readable(self.driver.port.socket(), Some(step.min(deadline - now)))
                .is_err()
            {
                std::thread::sleep(step.min(deadline - now));
            }
        }
    }

    /// Waits on the driver's condition variable, which the progress thread and posting
    /// threads signal after handling packets.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let driver = &self.driver;
        let mut state = driver.lock();
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
            driver.waiters.fetch_add(1, Ordering::SeqCst);
            state = driver
                .completions
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            driver.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Wakes every thread waiting on any CQ of the NIC (to see a stop flag).
    pub(crate) fn wake_waiters(&self) {
        let _state = self.driver.lock();
        self.driver.wake_waiters();
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.driver.lock().engine.destroy_cq(self.id);
    }
}
