//! Recovery of lost packets on the requester's side: go-back-N rewinds and retries, the
//! retransmission timer, the RTT estimate, the window's narrowing and widening, and early
//! resends with their back-off.

use super::*;

/// What started a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RetryCause {
    /// The retransmission timer.
    Timeout,
    /// A sequence NAK, an implied NAK or a gap in READ responses.
    Signal,
}

impl Qp {
    /// Rewinds the requester to resend from `to` (go-back-N).
    pub(super) fn rewind(&mut self, to: Psn) {
        // The request holding `to`, or else the first one after it (which restarts whole).
        let index = self
            .sq
            .iter()
            .position(|w| w.contains(to) || !w.started || to.precedes(w.first_psn))
            .unwrap_or(self.sq.len());
        let (pkt, psn) = match self.sq.get(index) {
            Some(w) if w.contains(to) => (w.first_psn.steps_to(to), to),
            Some(w) if w.started => (0, w.first_psn),
            _ => (0, to),
        };
        self.req_index = index;
        self.req_pkt = pkt;
        self.req_psn = psn;
        self.since_ack_req = 0;
        self.rtt_sample = None;
    }

    /// A retry after a timeout, a sequence NAK or an implied NAK: counts it, or gives up.
    ///
    /// Only the first signal of a loss starts a retry: the responses already in flight
    /// behind a gap (a long READ's, or later requests' ACKs implying the loss again) each
    /// signal it anew, and retrying on every one would spend all of `retry_cnt` on one lost
    /// packet (rxe's completer ignores them the same way until the retry makes progress).
    /// A timeout always retries.
    pub(super) fn retry(&mut self, ctx: &mut Ctx, from: Psn, cause: RetryCause) {
        if cause == RetryCause::Signal && self.retrying_from == Some(from) {
            ctx.counters.stale_response += 1;
            return;
        }
        self.retrying_from = Some(from);
        // A loss signalled or timed out: whatever an early probe was waiting to learn, this
        // retry is the answer.
        self.early_probe = None;
        self.early_read_watch = false;
        if self.retries_left == 0 {
            ctx.counters.retry_exceeded_err += 1;
            self.fail_front(ctx, WcStatus::RetryExcErr);
            return;
        }
        self.retries_left -= 1;
        ctx.counters.completer_retry_err += 1;
        self.cwnd = (self.cwnd / 2).max(MIN_WINDOW_PSNS);
        self.cwnd_credit = 0;
        self.rewind(from);
        self.retransmit_at = None;
    }

    /// The peer acknowledged or answered `acked` PSNs more: the retry counts start over, the
    /// requester leaves probing, and the send window widens by one PSN per window acked.
    pub(super) fn made_progress(&mut self, acked: u32) {
        self.cwnd_credit = self.cwnd_credit.saturating_add(acked);
        while self.cwnd < MAX_UNACKED_PSNS && self.cwnd_credit >= self.cwnd {
            self.cwnd_credit -= self.cwnd;
            self.cwnd += 1;
        }
        self.retries_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.timed_out = false;
        self.probing = false;
        self.early_count = 0;
    }

    /// Takes the round-trip sample if its packet is now answered, and updates the estimate.
    pub(super) fn sample_rtt(&mut self, now: Instant) {
        let Some((psn, sent)) = self.rtt_sample else {
            return;
        };
        if !psn.precedes(self.comp_psn) {
            return;
        }
        self.rtt_sample = None;
        let rtt = now.saturating_duration_since(sent);
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let dev = rtt.abs_diff(srtt);
                self.rttvar = (self.rttvar * 3 + dev) / 4;
                self.srtt = Some((srtt * 7 + rtt) / 8);
            }
        }
    }

    /// When an early resend would be due if nothing is answered from `now` on: the RFC 6298
    /// timeout from the measured round trip, or a sixteenth of the ACK timeout before there is
    /// a measurement (a loss in the first window leaves none), at least [`MIN_EARLY_RESEND`]
    /// and doubled per early resend already made in this stall; `None` when it would not come
    /// well before the ACK timeout.
    pub(super) fn early_resend_at(&self, now: Instant) -> Option<Instant> {
        let timeout = self.timeout?;
        let estimate = match self.srtt {
            Some(srtt) => srtt + 4 * self.rttvar,
            None => timeout / 16,
        };
        let after = estimate
            .max(MIN_EARLY_RESEND)
            .checked_mul(1 << (self.early_count + self.early_shift).min(16))?;
        (after * 2 <= timeout).then(|| now + after)
    }

    pub(super) fn rearm(&mut self, now: Instant) {
        let waiting = self.comp_psn != self.req_psn && self.state == QpState::Rts;
        self.retransmit_at = if waiting {
            self.timeout.map(|t| now + t)
        } else {
            None
        };
        self.early_at = if waiting {
            self.early_resend_at(now)
        } else {
            None
        };
    }

    /// The early resend is due (see [`Qp::early_at`]). It spends no `retry_cnt`. A stall
    /// can be a slow peer rather than a loss (an emulated rxe working through a window), so
    /// it costs as little as it can when it turns out needless:
    ///
    /// - Behind a SEND or WRITE, it goes back to the oldest unanswered PSN as a retry would,
    ///   but probes: it resends only the oldest [`PROBE_PSNS`] packets, each asking for an
    ///   ACK, until an ACK makes progress. After a real loss, go-back-N then carries on; if
    ///   the ACK covers packets the probe did not resend, the originals got through.
    /// - Behind a READ, it asks again for the rest of the piece in flight (rxe's responder
    ///   cannot serve a smaller part first and the rest later: a replay moves the start of
    ///   its record). If a response then arrives twice, the originals were on their way.
    ///
    /// Either finding of a needless resend doubles this QP's later early-resend delays.
    pub(super) fn resend_early(&mut self, ctx: &mut Ctx, now: Instant) {
        self.early_count += 1;
        ctx.counters.early_resends += 1;
        let from = self.comp_psn;
        let read = self
            .sq
            .front()
            .is_some_and(|w| matches!(w.op, SendOp::Read(_)) && w.contains(from));
        self.early_probe = (!read).then_some(from);
        self.early_read_watch = read;
        self.probing = !read;
        self.retrying_from = Some(from);
        self.rewind(from);
        self.early_at = self.early_resend_at(now);
    }

    /// An early resend turned out needless: later ones of this QP wait twice as long.
    pub(super) fn early_was_needless(&mut self, ctx: &mut Ctx) {
        ctx.counters.early_needless += 1;
        self.early_shift = (self.early_shift + 1).min(MAX_EARLY_SHIFT);
    }
}
