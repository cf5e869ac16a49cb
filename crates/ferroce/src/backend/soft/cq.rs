//! A soft completion queue: a number in the engine, polled under the NIC's lock. Polling drives
//! the engine on the caller's thread when nothing is there; waiting sleeps on the CQ's own
//! condition variable, which the driver signals only when this CQ holds a completion, or on the
//! socket itself (`drive`).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Condvar, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::qp::{Completion, CqId, WcOpcode};

use super::driver::{Announce, Driver};
use crate::error::NicError;
use crate::steps::{self, Step};
use crate::sys::EventFd;

/// A soft CQ; destroyed in the engine with its last handle (queue pairs hold one while they
/// report to it).
pub(crate) struct Cq {
    id: CqId,
    driver: Arc<Driver>,
    /// Its completion channel: signalled by the driver when the armed CQ fires.
    channel: Arc<EventFd>,
    /// What threads blocked in [`Cq::wait`] on this CQ sleep on (`Locked::waiting`).
    wake: Arc<Condvar>,
}

impl Cq {
    pub(super) fn new(driver: &Arc<Driver>, depth: usize) -> Result<Self, NicError> {
        let channel = EventFd::new()
            .map(Arc::new)
            .map_err(|source| NicError::Descriptor {
                what: "a completion channel",
                source,
            })?;
        let mut state = driver.lock();
        let id = state.engine.create_cq(depth);
        state
            .cq_channels
            .insert(id, Announce::Channel(Arc::clone(&channel)));
        drop(state);
        Ok(Self {
            id,
            driver: Arc::clone(driver),
            channel,
            wake: Arc::new(Condvar::new()),
        })
    }

    /// Arms the CQ (`ibv_req_notify_cq`): its channel is signalled at its next completion, or
    /// with `solicited_only` its next solicited or failed one.
    pub(crate) fn req_notify(&self, solicited_only: bool) {
        let mut state = self.driver.lock();
        state.engine.req_notify_cq(self.id, solicited_only);
        // Whoever arms a channel waits on it next, and polls no more until it fires: what its
        // posts left held goes now.
        self.driver.send_held(&mut state);
        drop(state);
        self.driver.release_poller();
    }

    /// The channel's events since the last take (`ibv_get_cq_event` and its acknowledgement).
    pub(crate) fn take_events(&self) -> u64 {
        self.channel.take()
    }

    /// From now on the CQ's events are announced by `call` (run with the NIC's lock held, or
    /// by the progress thread just after it lets go: `Announce::Call`), and its descriptor
    /// stays quiet.
    pub(crate) fn announce_events(&self, call: Arc<dyn Fn() + Send + Sync>) {
        self.driver
            .lock()
            .cq_channels
            .insert(self.id, Announce::Call(call));
    }

    /// The channel's descriptor: readable while an event waits.
    pub(crate) fn channel_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    pub(super) fn id(&self) -> CqId {
        self.id
    }

    /// As asked at creation or by the last resize: the engine takes any depth.
    pub(crate) fn depth(&self) -> usize {
        self.driver
            .lock()
            .engine
            .cq_depth(self.id)
            .unwrap_or_default()
    }

    /// `ibv_resize_cq`: `false` when the CQ holds more completions than `depth` now.
    pub(crate) fn resize(&self, depth: usize) -> bool {
        self.driver.lock().engine.resize_cq(self.id, depth)
    }

    /// The oldest completion; when there is none, drives the engine here first.
    pub(crate) fn poll(&self) -> Option<Completion> {
        let seen = self.driver.returned();
        let mut state = self.driver.lock();
        let found = match state.engine.poll_completion(self.id) {
            Some(c) => Some(c),
            None => {
                // A poll of an armed CQ is the verbs idiom's last look before the program
                // waits on the channel (arm, poll what came before the arm, wait): it drives
                // the engine but does not claim the socket, or the progress thread would nap
                // through the packet whose completion fires the channel.
                let claims = !state.engine.cq_armed(self.id);
                self.driver.progress_here(&mut state, seen, claims);
                state.engine.poll_completion(self.id)
            }
        };
        if let Some(c) = &found {
            // A received message is what its program waited for; only its own request's
            // completion may come before the WRITE it waits for.
            let own_request = !matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
            self.driver.poll_satisfied(state, own_request);
            steps::mark(Step::Completed);
        }
        found
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
                // This thread receives: the progress thread stays away until it is back. It
                // runs the timers once this wait gives up (POLLER_WATCH_MAX, 2 ms, is the
                // longest a poller holds them).
                self.driver.hold_socket(now + Duration::from_millis(1));
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

    /// Waits on the CQ's condition variable, which the progress thread, posting threads and
    /// polling threads signal when they leave a completion on this CQ.
    pub(crate) fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let driver = &self.driver;

        let mut state = driver.lock();
        driver.send_held(&mut state);
        loop {
            if let Some(c) = state.engine.poll_completion(self.id) {
                return Some(c);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // Registered while holding the lock, so a completion queued after the check above
            // cannot be announced to nobody: its producer takes the lock first.
            state.waiting.push((self.id, Arc::clone(&self.wake)));
            state = self
                .wake
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            if let Some(at) = state
                .waiting
                .iter()
                .position(|(id, wake)| *id == self.id && Arc::ptr_eq(wake, &self.wake))
            {
                state.waiting.swap_remove(at);
            }
        }
    }

    /// Wakes every thread waiting on any CQ of the NIC (to see a stop flag).
    pub(crate) fn wake_waiters(&self) {
        let state = self.driver.lock();
        self.driver.wake_all(&state);
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        let mut state = self.driver.lock();
        state.engine.destroy_cq(self.id);
        state.cq_channels.remove(&self.id);
    }
}
