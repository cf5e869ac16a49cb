//! The engine's schedule, so that its work grows with the queue pairs that are busy rather than
//! with all it holds: which queue pairs may have a packet to send (the ready queue, served in
//! turn) and when each one's earliest timer fires (an ordered index).
//!
//! Every input that reaches a queue pair ends in [`Schedule::touch`] or [`Schedule::sync`],
//! which bring the queue pair's entries up to date from its state, and each pass of the
//! timers in [`Schedule::refile`]; nothing else writes them.
//!
//! The timer index is filed lazily: a queue pair's entry is at or before its earliest timer,
//! or left behind when no timer is armed, and moves only when a timer comes due earlier than
//! it. A request's timers are armed when it leaves and disarmed by its ACK, so a latency-bound
//! exchange moved its entry out and back at each round trip (two ordered-set updates and the
//! syncs around them: about 340 of the 9,800 instructions a write-lat round trip ran on the
//! client, BENCHMARKS.md's eighteenth step); now an entry comes due at most once
//! per early-resend delay (a millisecond or more), finds what is really armed, and is filed
//! again there. An engine's [`Engine::poll_timeout`] may so name a time at which nothing is
//! due: its caller wakes once for nothing, as it would for a timer disarmed while it slept.
//!
//! Nothing here shares a budget of packets in flight across the queue pairs towards one peer.
//! One was tried (four windows per peer): a thousand queue pairs then had half a packet each
//! in flight, drew an ACK per packet and early resends while they queued, and moved 206 MB/s
//! where without it they move over 1,000 with 4 % of their packets dropped by the receiver's
//! socket and resent (BENCHMARKS.md).

use super::*;

/// A queue pair's entries in the schedule, kept in the queue pair.
#[derive(Debug, Default)]
pub(super) struct Sched {
    /// In the ready queue.
    pub(super) queued: bool,
    /// The deadline under which the timer index holds it: at or before its earliest armed
    /// timer, or left from an earlier one (see the module documentation).
    pub(super) filed: Option<Instant>,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(super) struct Schedule {
    ready: VecDeque<u32>,
    deadlines: BTreeSet<(Instant, u32)>,
}

impl Schedule {
    /// Something reached queue pair `qpn`: it may have a packet to send (it joins the ready
    /// queue, once), and its timers may have moved.
    pub(super) fn touch(&mut self, qpn: u32, qp: &mut Qp) {
        if !qp.sched.queued {
            qp.sched.queued = true;
            self.ready.push_back(qpn);
        }
        self.sync(qpn, qp);
    }

    /// Files `qp`'s earliest timer again where it comes due before its entry, or has none;
    /// an entry at or before it stays (see the module documentation).
    pub(super) fn sync(&mut self, qpn: u32, qp: &mut Qp) {
        match (qp.timers.next(), qp.sched.filed) {
            (Some(next), Some(filed)) if filed <= next => {}
            (None, _) => {}
            (next, _) => self.file(qpn, qp, next),
        }
    }

    /// Files `qp` under exactly its earliest timer, or takes it out of the index: after a
    /// pass of the timers that found its entry due, whether or not anything was.
    pub(super) fn refile(&mut self, qpn: u32, qp: &mut Qp) {
        let next = qp.timers.next();
        if next != qp.sched.filed {
            self.file(qpn, qp, next);
        }
    }

    fn file(&mut self, qpn: u32, qp: &mut Qp, next: Option<Instant>) {
        if let Some(old) = qp.sched.filed {
            self.deadlines.remove(&(old, qpn));
        }
        if let Some(new) = next {
            self.deadlines.insert((new, qpn));
        }
        qp.sched.filed = next;
    }

    /// The next queue pair in line; the caller skips one that is no longer there or no longer
    /// [`Sched::queued`] (destroyed while in line, or served from an earlier place in it).
    pub(super) fn pop(&mut self) -> Option<u32> {
        self.ready.pop_front()
    }

    /// `qpn` sent a packet and may have more: back to the end of the line.
    pub(super) fn again(&mut self, qpn: u32) {
        self.ready.push_back(qpn);
    }

    /// `qp` has nothing to send now: out of line until something reaches it.
    pub(super) fn idle(qp: &mut Qp) {
        qp.sched.queued = false;
    }

    /// `qp` is being destroyed: its timer leaves the index (a stale place in line is skipped
    /// when its turn comes).
    pub(super) fn forget(&mut self, qpn: u32, qp: &Qp) {
        if let Some(t) = qp.sched.filed {
            self.deadlines.remove(&(t, qpn));
        }
    }

    /// The earliest deadline of any queue pair, which may have nothing left due at it.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(t, _)| t)
    }

    /// The queue pairs whose deadline is at or before `now`.
    pub(super) fn due(&self, now: Instant) -> Vec<u32> {
        self.deadlines
            .iter()
            .take_while(|&&(t, _)| t <= now)
            .map(|&(_, qpn)| qpn)
            .collect()
    }
}
