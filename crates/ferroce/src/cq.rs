//! Completion queues: where finished work requests are reported. A CQ can be polled, a thread
//! can block on it until a completion arrives ([`Cq::wait`]), or an event loop can wait on its
//! completion channel: [`Cq::req_notify`] arms it, the CQ's descriptor ([`AsFd`]) becomes
//! readable at the next completion, and [`Cq::take_events`] reads the events, as
//! `ibv_req_notify_cq`, `poll(2)` on the channel and `ibv_get_cq_event` do. This file documents, checks arguments and
//! delegates to the backend (`crate::backend::Cq`).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

pub use ferroce_proto::qp::{Completion, WcOpcode, WcStatus};

use crate::backend;
use crate::error::NicError;
use crate::nic::Nic;

mod spin;
pub use spin::Spin;

/// A completion queue of a [`Nic`].
#[derive(Clone)]
pub struct Cq {
    pub(crate) nic: Nic,
    pub(crate) backend: backend::Cq,
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
        Ok(Self {
            nic: nic.clone(),
            backend: nic.backend.create_cq(depth)?,
        })
    }

    /// Up to `out.len()` completions at once (`ibv_poll_cq` with an array); returns how many
    /// were written. Like [`Cq::poll`], it drives the soft engine when it finds none.
    pub fn poll_into(&self, out: &mut [Completion]) -> usize {
        self.backend.poll_into(out)
    }

    /// The completions the CQ holds: as asked on the soft NIC; on a verbs device what the
    /// device granted (`cqe`), grown as queue pairs joined it.
    #[must_use]
    pub fn depth(&self) -> usize {
        self.backend.depth()
    }

    /// Changes how many completions the CQ holds (`ibv_resize_cq`): `depth` at least, as the
    /// device grants it ([`Cq::depth`] says what it holds now).
    ///
    /// # Errors
    ///
    /// [`NicError::CqTooSmall`] when the CQ holds more completions than `depth` now; on a
    /// verbs device, [`NicError::Verbs`] with what `ibv_resize_cq` returned. A verbs CQ never
    /// shrinks below what the queues on it may hold.
    pub fn resize(&self, depth: usize) -> Result<(), NicError> {
        if self.backend.resize(depth)? {
            Ok(())
        } else {
            Err(NicError::CqTooSmall { depth })
        }
    }

    /// Why the CQ failed, if it did: on a verbs device, a `CQ_ERR` event (an overrun, which
    /// loses completions).
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.backend.failure()
    }

    /// The oldest completion, if any (`ibv_poll_cq` for one entry). When there is none, the
    /// call first drives the soft engine on this thread (receives what has arrived, runs
    /// timers, sends what is ready), so a polling application makes progress without waiting
    /// for the NIC's progress thread to be scheduled. On a verbs device: one `poll_cq`.
    #[must_use]
    pub fn poll(&self) -> Option<Completion> {
        self.backend.poll()
    }

    /// Waits up to `timeout` for a completion, driving the engine on this thread meanwhile:
    /// it waits on the NIC's socket itself and handles what arrives, so the thread that waits
    /// is the thread that receives (the frame receiver's `blocking_monitor`). While it is
    /// busy, and while it waits on the socket (a millisecond at a time), the progress thread
    /// stays off the socket; after 20 ms without a completion it waits in longer steps, so an
    /// idle stream costs next to no CPU. On a verbs device the device progresses by itself,
    /// and this is [`Cq::wait`].
    #[must_use]
    pub fn drive(&self, timeout: Duration) -> Option<Completion> {
        self.backend.drive(timeout)
    }

    /// Waits up to `timeout` for a completion; on a verbs device, asleep on the CQ's
    /// completion channel (`ibv_req_notify_cq`, `poll`, `ibv_get_cq_event`), as rdma-core's
    /// tools do with `-e`.
    #[must_use]
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        self.backend.wait(timeout)
    }

    /// Arms the completion channel (`ibv_req_notify_cq`): at the CQ's next completion, or with
    /// `solicited_only` its next receive that the sender marked solicited
    /// ([`crate::qp::SendWr::solicited`]) or its next failed one, the channel gets one event
    /// and the CQ's descriptor becomes readable. It fires once: arm again after taking the
    /// events, then poll the CQ dry, since completions that arrived before arming raise
    /// nothing. On the soft NIC a completion is noticed by whichever thread handles its
    /// packet, the NIC's progress thread when nobody polls.
    ///
    /// # Errors
    ///
    /// On a verbs device, what `ibv_req_notify_cq` returned; never on the soft NIC.
    pub fn req_notify(&self, solicited_only: bool) -> io::Result<()> {
        self.backend.req_notify(solicited_only)
    }

    /// Takes the completion channel's events (`ibv_get_cq_event`, acknowledged as
    /// `ibv_ack_cq_events` does): how many arrived since the last take, 0 when none did. It
    /// never blocks; wait for the descriptor to be readable first.
    #[must_use = "the events say whether to poll the CQ"]
    pub fn take_events(&self) -> u64 {
        self.backend.take_events()
    }

    /// Has the soft NIC announce the channel's events by calling `announce`, once per event,
    /// instead of making the CQ's descriptor readable: for a completion channel that several
    /// CQs share, as libibverbs' `ibv_comp_channel` is, so that the event goes straight onto
    /// that channel without a thread woken to forward it (the drop-in libibverbs queues the
    /// CQ on its C channel from here). After it, [`Cq::take_events`] returns 0.
    ///
    /// `announce` runs on whichever thread handled the completion (the NIC's progress
    /// thread, or one polling or posting), possibly with the NIC locked: it must be quick,
    /// and must not call into the NIC.
    ///
    /// # Errors
    ///
    /// [`NicError::SoftOnly`] on a verbs device, whose events come through its own channel.
    pub fn announce_events(
        &self,
        announce: impl Fn() + Send + Sync + 'static,
    ) -> Result<(), NicError> {
        Ok(self
            .backend
            .announce_events(std::sync::Arc::new(announce))?)
    }

    /// Wakes the threads waiting on this CQ (the CM's thread, to see that it must stop).
    pub(crate) fn wake_waiters(&self) {
        self.backend.wake_waiters();
    }
}

/// The completion channel's descriptor (non-blocking): readable while an event waits, for
/// `poll(2)`, epoll or tokio's `AsyncFd`. Read it only through [`Cq::take_events`].
impl AsFd for Cq {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.backend.channel_fd()
    }
}
