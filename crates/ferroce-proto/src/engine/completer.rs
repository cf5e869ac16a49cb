//! The completer: acknowledgements, NAKs and READ and atomic responses from the responder,
//! which complete send work requests or start recovery.

use super::*;

/// What acknowledging PSNs found on the way: whether a READ or atomic before them had lost its
/// answer, so that the requester was rewound to it (an implied NAK).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Implied {
    /// Nothing was missing.
    Nothing,
    /// A retry from the unanswered READ or atomic has begun.
    Retried,
}

impl Qp {
    /// Completes the SEND and WRITE requests whose packets up to `psn` are acknowledged, and
    /// moves the completer past `psn`. A READ or atomic in the way whose PSN is covered was
    /// answered by its peer with an ACK instead: an implied NAK, so it is retried, and the
    /// answer is `Implied::Retried`.
    pub(super) fn ack_through(&mut self, dev: &mut DeviceState, psn: Psn) -> Implied {
        let start = self.comp_psn;
        let mut progressed = false;
        while let Some(front) = self.sq.front() {
            if !front.started || psn.precedes(front.first_psn) {
                break;
            }
            if front.op.is_read_or_atomic() {
                if psn.precedes(front.last_psn()) {
                    // Inside a READ's response PSNs: those responses are counted as they come.
                    return Implied::Nothing;
                }
                // The responder acknowledged a PSN at or past this request without answering
                // it: its response was lost (an implied NAK).
                if progressed {
                    self.comp_psn = front.first_psn;
                }
                self.retry(dev, self.comp_psn, RetryCause::Signal);
                return Implied::Retried;
            }
            if psn.precedes(front.last_psn()) {
                // Part of a long message: the completer moves on, the request stays.
                break;
            }
            let wqe = self.sq.pop_front().expect("front exists");
            self.req_index = self.req_index.saturating_sub(1);
            let after = wqe.last_psn().next();
            if self.comp_psn.precedes(after) {
                self.comp_psn = after;
            }
            self.complete_send(dev, &wqe, WcStatus::Success);
            progressed = true;
        }
        if self.comp_psn.precedes(psn.next()) {
            self.comp_psn = psn.next();
            progressed = true;
        }
        if progressed {
            self.made_progress(start.steps_to(self.comp_psn));
        }
        Implied::Nothing
    }

    /// As [`Qp::ack_through`] for the PSNs before `psn`, which a NAK, a READ response or an
    /// atomic ACK at `psn` acknowledges.
    pub(super) fn ack_before(&mut self, dev: &mut DeviceState, psn: Psn) -> Implied {
        let prev = psn.sub(1);
        if prev.precedes(self.comp_psn) {
            return Implied::Nothing;
        }
        self.ack_through(dev, prev)
    }

    /// A response (ACK, NAK, READ response, atomic ACK) reached the requester.
    pub(super) fn handle_response(
        &mut self,
        now: Instant,
        packet: &Packet<&[u8]>,
        dev: &mut DeviceState,
        mem: &mut dyn Memory,
    ) {
        let psn = packet.psn();
        // Only PSNs that were sent and not yet completed mean anything. A cumulative ACK counts
        // up to the newest PSN ever sent, and so does a READ response (placed by its PSN, one
        // answering the burst before a rewind is as good as its copy to come); an atomic ACK
        // beyond a rewind belongs to the abandoned burst (the rewind asks for it again).
        let limit = match packet.opcode().operation() {
            Operation::Acknowledge
            | Operation::RdmaReadResponseFirst
            | Operation::RdmaReadResponseMiddle
            | Operation::RdmaReadResponseLast
            | Operation::RdmaReadResponseOnly => self.sent_psn,
            _ => self.req_psn,
        };
        let sent = psn.precedes(limit) && !psn.precedes(self.comp_psn);
        if !sent || self.sq.is_empty() {
            dev.counters.stale_response += 1;
            let read_response = packet.opcode().operation().is_read_response();
            if read_response && self.timers.early.is_some() {
                // A copy of a READ response already taken: the responder is answering an
                // older ask again, in order, and what is unanswered waits behind it. An early
                // resend now would only queue more behind that, so its wait starts again.
                // (The ACK timeout does not: only progress restarts it.)
                self.timers.early = self.early_resend_at(now);
            }
            let watched = read_response && psn.precedes(self.comp_psn);
            if let Some(watch) = watched.then(|| self.early_read_watches.take(psn)).flatten() {
                // A second copy of a READ response an early resend asked for again, already
                // taken: it asked for responses that were on their way.
                if watch.halved == Some(true) {
                    self.backoff.not_a_loss();
                }
                self.early_was_needless(dev);
            }
            if let Some(watch) = &mut self.early_ack_watch {
                let ack = packet
                    .aeth()
                    .is_some_and(|a| matches!(a.syndrome, Syndrome::Ack { .. }));
                if ack && watch.psn == psn {
                    watch.more -= 1;
                }
                if watch.more == 0 {
                    // The peer acknowledged what the probes resent once more than there were
                    // probes: it had the original (a one-packet message in a ping-pong, held
                    // up by a descheduled peer).
                    let halved = watch.halved;
                    self.early_ack_watch = None;
                    if halved {
                        self.backoff.not_a_loss();
                    }
                    self.early_was_needless(dev);
                }
            }
            return;
        }
        let before = self.comp_psn;
        match packet.opcode().operation() {
            Operation::Acknowledge => {
                let Some(aeth) = packet.aeth() else { return };
                match aeth.syndrome {
                    Syndrome::Ack { .. } => {
                        self.ack_through(dev, psn);
                    }
                    Syndrome::RnrNak(timer) => {
                        dev.counters.rcvd_rnr_err += 1;
                        if self.ack_before(dev, psn) == Implied::Retried {
                            // An earlier READ or atomic lost its answer: the retry from it
                            // resends this request too, and the peer answers again.
                            return;
                        }
                        if self.state != QpState::Rts && self.state != QpState::Sqd {
                            return;
                        }
                        if self.rnr_retry != 7 {
                            if self.rnr_left == 0 {
                                dev.counters.retry_rnr_exceeded_err += 1;
                                self.fail_front(dev, WcStatus::RnrRetryExcErr);
                                return;
                            }
                            self.rnr_left -= 1;
                        }
                        self.rewind(psn);
                        // A receiver out of receives takes fewer requests at once: what was
                        // in flight behind this one met the same empty queue.
                        self.window.narrow();
                        self.timers.rnr_wait = Some(now + timer.duration());
                    }
                    Syndrome::Nak(NakCode::PsnSequenceError) => {
                        dev.counters.rcvd_seq_err += 1;
                        // The peer executed everything before `psn`. If an earlier READ or
                        // atomic lost its answer, the retry starts there, and is the only one:
                        // a second, from `psn`, would skip the unanswered request and spend
                        // two of the retry count on one loss.
                        let implied = self.ack_before(dev, psn);
                        // A NAK of what was in flight behind a request the peer RNR NAKed
                        // names that request again: the resend after the RNR timer answers
                        // both. Resending now would meet the same empty receive queue, and
                        // take a retry and a narrower window for what is no loss.
                        let rnr_waiting = self.timers.rnr_wait.is_some() && psn == self.req_psn;
                        if implied == Implied::Nothing
                            && !rnr_waiting
                            && (self.state == QpState::Rts || self.state == QpState::Sqd)
                        {
                            self.retry(dev, psn, RetryCause::Signal);
                        }
                    }
                    Syndrome::Nak(code) => {
                        // The NAK put the peer's QP in error: a READ or atomic before `psn`
                        // whose answer was lost cannot be asked again, and being first in
                        // line, it takes the error.
                        self.ack_before(dev, psn);
                        let status = match code {
                            NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                            NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                            _ => WcStatus::RemOpErr,
                        };
                        if self.state != QpState::Err {
                            self.fail_front(dev, status);
                        }
                    }
                    Syndrome::Reserved(_) => dev.counters.stale_response += 1,
                }
            }
            Operation::AtomicAcknowledge => {
                self.ack_before(dev, psn);
                let Some(front) = self.sq.front() else { return };
                if !front.op.is_read_or_atomic()
                    || matches!(front.op, SendOp::Read(_))
                    || !front.started
                    || front.first_psn != psn
                {
                    dev.counters.stale_response += 1;
                    return;
                }
                let Some(ack) = packet.atomic_ack() else {
                    return;
                };
                scatter(front.segs(), 0, &ack.orig.to_ne_bytes(), mem);
                let wqe = self.sq.pop_front().expect("front exists");
                self.req_index = self.req_index.saturating_sub(1);
                let acked = self.comp_psn.steps_to(psn.next());
                self.comp_psn = psn.next();
                self.made_progress(acked);
                self.complete_send(dev, &wqe, WcStatus::Success);
            }
            op @ (Operation::RdmaReadResponseFirst
            | Operation::RdmaReadResponseMiddle
            | Operation::RdmaReadResponseLast
            | Operation::RdmaReadResponseOnly) => {
                if !self.take_read_response(now, dev, mem, packet, op) {
                    return;
                }
            }
            _ => dev.counters.opcode_err += 1,
        }
        if !self.early_read_watches.is_empty() {
            self.read_watches_answered(dev);
        }
        if let Some(from) = self.early_probe {
            if self.comp_psn != from || self.state != QpState::Rts {
                self.early_probe = None;
                // The PSNs each probe resent: from `from` to where it had got.
                let probed = from.steps_to(self.req_psn);
                if self.sq.is_empty() && !self.comp_psn.precedes(self.req_psn) {
                    // Answered through everything sent, the probe's packets included: the
                    // last message of a burst, or a ping-pong's one. Its last packet was lost,
                    // or its ACK, or the responder was slow and had it all; only the ACKs can
                    // tell. The responder answers each probe packet (each asks for an ACK)
                    // with one of its own, so a loss brings at most `probed` ACKs for this
                    // PSN per probe, and a slow responder, which also answered the originals,
                    // one more. Taken for a loss until that one comes. (A lost ACK is a loss:
                    // without the probe, the ACK timeout would have ended the stall.)
                    let halved = self.backoff.found_loss();
                    self.early_ack_watch = Some(AckWatch {
                        psn: self.comp_psn.sub(1),
                        more: self.early_copies.saturating_mul(probed.max(1)),
                        halved,
                    });
                } else if self.req_psn.precedes(self.comp_psn) {
                    // Answered past what the probe resent, with more of the burst to answer:
                    // the originals up to here got through. The rest may be on its way (a
                    // slow peer), or its last packets lost (nothing after them drew a NAK).
                    // Carry on from where sending had got to rather than resend what may
                    // still come; answers past this one before another resend show it was
                    // a slow peer, and the next early resend that the stall would need, a loss.
                    self.early_past = Some(self.comp_psn);
                    self.rewind(self.sent_psn);
                } else {
                    // Answered through part of what the probe resent: the rest was lost.
                    self.backoff.found_loss();
                }
            }
        }
        if self.early_past.is_some_and(|at| at.precedes(self.comp_psn)) {
            // Answered past the ambiguous ACK with no resend between: the originals were on
            // their way.
            self.early_past = None;
            self.early_was_needless(dev);
        }
        if self.req_psn.precedes(self.comp_psn) {
            // Acknowledged past what a rewind left to resend: carry on from there, or from
            // where sending had got to if an early resend's READ request had yet to go.
            let to = self
                .early_resume
                .filter(|at| self.comp_psn.precedes(*at))
                .unwrap_or(self.comp_psn);
            self.rewind(to);
        }
        if !self.read_ahead.is_empty() {
            self.reask_read(dev);
        }
        if let Some(rtt) = self.sample_rtt(now) {
            dev.round_trip.sample(rtt);
        }
        if let (Some(at), Some(timeout)) = (self.timers.retransmit, self.timeout) {
            // Progress after the ACK timer had run this long (since the last progress, or the
            // first send after nothing was outstanding). Nothing here re-arms it, and a retry
            // this response started has stopped it and narrowed the window already.
            let wait = timeout.saturating_sub(at.saturating_duration_since(now));
            if self.comp_psn != before && self.window.waited(wait, timeout / QUEUE_CEILING_DIVISOR)
            {
                dev.counters.queue_narrowed += 1;
            }
        }
        self.rearm(now);
    }

    /// The started READ request holding response PSN `psn`, if every request before it is a
    /// started READ too: then nothing between the oldest unanswered PSN and `psn` waits for
    /// an ACK, and a response there may be taken ahead of lost ones.
    fn read_holding(&self, psn: Psn) -> Option<usize> {
        for (i, w) in self.sq.iter().enumerate() {
            if !w.started || !matches!(w.op, SendOp::Read(_)) {
                return None;
            }
            if w.contains(psn) {
                return Some(i);
            }
        }
        None
    }

    /// A READ response: placed where its PSN puts it, in order or past lost ones
    /// ([`ReadAhead`]). Returns whether it was taken; one that was not is counted.
    fn take_read_response(
        &mut self,
        now: Instant,
        dev: &mut DeviceState,
        mem: &mut dyn Memory,
        packet: &Packet<&[u8]>,
        op: Operation,
    ) -> bool {
        let psn = packet.psn();
        if psn == self.comp_psn || self.read_holding(psn).is_none() {
            // It acknowledges the SENDs and WRITEs before it.
            self.ack_before(dev, psn);
        }
        if self.state == QpState::Err {
            return false;
        }
        let in_order = psn == self.comp_psn;
        let index = if in_order {
            self.sq
                .front()
                .is_some_and(|w| matches!(w.op, SendOp::Read(_)) && w.contains(psn))
                .then_some(0)
        } else {
            self.read_holding(psn)
        };
        let Some(index) = index else {
            // Behind a lost response with a request between that is not a READ (whose
            // answer is an ACK), or answering nothing outstanding.
            dev.counters.stale_response += 1;
            return false;
        };
        let mtu = self.mtu;
        let wqe = &self.sq[index];
        let k = wqe.first_psn.steps_to(psn);
        let offset = u64::from(k) * u64::from(mtu);
        let remaining = u64::from(wqe.len) - offset;
        let last = k + 1 == wqe.npkts;
        // The PSN fixes the offset. Whether the packet says FIRST or MIDDLE depends on which
        // request (the original or one asking again) it answers, so only its length and
        // whether it ends a request are checked: the last PSN of a piece, or of a run asked
        // for again. Anything else is dropped; the retransmission timer recovers.
        let payload = packet.payload();
        let ends = matches!(
            op,
            Operation::RdmaReadResponseLast | Operation::RdmaReadResponseOnly
        );
        let piece_ends = last || (k + 1) % wqe.piece == 0;
        let ends_ok = ends == piece_ends || (ends && self.read_ahead.may_end(psn));
        if !ends_ok || payload.len() as u64 != remaining.min(u64::from(mtu)) {
            dev.counters.stale_response += 1;
            return false;
        }
        if !in_order {
            if self.read_ahead.take(self.comp_psn, psn) != Taken::New {
                // A copy of one taken already: the responder is answering an ask again, in
                // order, and the early resend's wait starts again (as for a copy behind). (Or
                // one too far ahead to hold, which the window never lets be asked for.)
                dev.counters.stale_response += 1;
                if self.timers.early.is_some() {
                    self.timers.early = self.early_resend_at(now);
                }
                return false;
            }
            dev.counters.read_taken_ahead += 1;
            scatter(wqe.segs(), offset, payload, mem);
            self.read_ahead.answered(psn);
            self.early_read_watches.shown_lost(self.comp_psn, psn);
            return true;
        }
        scatter(wqe.segs(), offset, payload, mem);
        self.read_ahead.answered(psn);
        // On past this one and the run of responses taken ahead of it.
        let run = self.read_ahead.take_run(psn.next());
        self.comp_psn = psn.next().add(run);
        self.made_progress(1 + run);
        while let Some(front) = self.sq.front() {
            let answered = front.started
                && matches!(front.op, SendOp::Read(_))
                && front.last_psn().precedes(self.comp_psn);
            if !answered {
                break;
            }
            let wqe = self.sq.pop_front().expect("front exists");
            self.req_index = self.req_index.saturating_sub(1);
            self.complete_send(dev, &wqe, WcStatus::Success);
        }
        true
    }
}
