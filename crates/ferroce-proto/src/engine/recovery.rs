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

/// The send window in PSNs. It starts at [`MAX_UNACKED_PSNS`] and, until the first retry,
/// widens by one PSN per two acknowledged up to [`WIDEST_UNACKED_PSNS`], a slower TCP slow
/// start (at one per PSN, the loss model's 1 % row lost 15 % of its goodput); each retry
/// halves it (down to [`MIN_WINDOW_PSNS`], and from then on never above
/// [`MAX_UNACKED_PSNS`]), and it widens again by one PSN per window's worth acknowledged, as
/// TCP's congestion avoidance does. Go-back-N resends everything behind a lost packet, so on a
/// lossy path a full window multiplies each loss into up to that many packets; a window that
/// follows the loss keeps goodput up. A path that never loses keeps the widest window, unless
/// its ACKs come too far apart: see [`Window::waited`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Window {
    psns: u32,
    /// PSNs acknowledged towards the next widening.
    credit: u32,
    /// No retry yet: the window widens by half of what is acknowledged, past the usual full
    /// one.
    lossless: bool,
}

impl Window {
    /// The full window, where every QP starts.
    pub(super) const FULL: Self = Self {
        psns: MAX_UNACKED_PSNS,
        credit: 0,
        lossless: true,
    };

    /// How many PSNs may be outstanding now.
    pub(super) const fn psns(self) -> u32 {
        self.psns
    }

    /// A retry: half as wide (and no wider than [`MAX_UNACKED_PSNS`] from now on), no nearer
    /// the next widening.
    pub(super) fn narrow(&mut self) {
        self.psns = (self.psns / 2).clamp(MIN_WINDOW_PSNS, MAX_UNACKED_PSNS);
        self.credit = 0;
        self.lossless = false;
    }

    /// `acked` more PSNs acknowledged: half as many PSNs wider before the first retry, then
    /// one PSN wider per window's worth.
    pub(super) fn acked(&mut self, acked: u32) {
        if self.lossless {
            self.credit = self.credit.saturating_add(acked);
            self.psns = self
                .psns
                .saturating_add(self.credit / 2)
                .min(WIDEST_UNACKED_PSNS);
            self.credit %= 2;
            return;
        }
        self.credit = self.credit.saturating_add(acked);
        while self.psns < MAX_UNACKED_PSNS && self.credit >= self.psns {
            self.credit -= self.psns;
            self.psns += 1;
        }
    }

    /// An ACK made progress after the ACK timer had run for `wait`: past `ceiling`
    /// ([`QUEUE_CEILING_DIVISOR`] of the ACK timeout; an infinite one arms no timer) the
    /// window narrows to what would have waited the ceiling (`psns × ceiling / wait`), by half
    /// at most, whether or not anything was lost. Returns whether it narrowed.
    ///
    /// The ACK timer restarts at each ACK that makes progress, so it fires on a gap between
    /// ACKs, and the window sets how long a gap a peer that drains slower than the requester
    /// sends can leave. An emulated rxe drains about 10 MB/s and serves its queue pairs in
    /// turns, each turn what waited for one QP: two QPs at the lossless 512-PSN window queued a
    /// megabyte there, one waited 96 ms for an ACK while the other was served, its 67 ms ACK
    /// timeout fired, and it sent its whole window again behind the originals (BENCHMARKS.md,
    /// the data path's thirty-fifth and thirty-sixth steps). Its window then halved, but the
    /// queue was the peer's pace, not a loss, and the next windows built it again.
    ///
    /// A queue served in order leaves only the gaps of the ACK cadence, however long it is:
    /// an ACK every [`MAX_PKT_PER_ACK`] packets or half a window, whichever is fewer (15 ms
    /// of 4 KiB packets at a guest's 17 MB/s). Where even those pass the ceiling, the window
    /// narrows until half of it fits. A window cut by the round trip instead (tried: narrowed
    /// once a round trip passed a quarter of the ACK timeout) cost a guest's `ib_write_bw`
    /// and `ib_send_bw` at MTU 4096 about a fifth of their bandwidth, where a 2 MB queue in
    /// order keeps a guest that is often descheduled busy.
    pub(super) fn waited(&mut self, wait: Duration, ceiling: Duration) -> bool {
        if wait <= ceiling {
            return false;
        }
        let scaled = u128::from(self.psns) * ceiling.as_nanos() / wait.as_nanos();
        let psns = u32::try_from(scaled)
            .unwrap_or(u32::MAX)
            .max(self.psns / 2)
            .max(MIN_WINDOW_PSNS)
            .min(self.psns);
        let narrowed = psns < self.psns;
        self.psns = psns;
        self.credit = 0;
        narrowed
    }
}

/// The smoothed round trip and its mean deviation (RFC 6298), from packets that asked for
/// an answer and were sent once. Kept in nanoseconds: each ACK takes a sample, and
/// `Duration`'s division by 4 and 8 are integer divisions where these are shifts; the results
/// are the same to the nanosecond.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RttEstimate {
    srtt: Option<u64>,
    rttvar: u64,
}

impl RttEstimate {
    /// Takes one measured round trip.
    pub(super) fn sample(&mut self, rtt: Duration) {
        let rtt = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX / 8);
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(srtt) => {
                let dev = rtt.abs_diff(srtt);
                self.rttvar = (self.rttvar.saturating_mul(3).saturating_add(dev)) / 4;
                self.srtt = Some(srtt.saturating_mul(7).saturating_add(rtt) / 8);
            }
        }
    }

    /// RFC 6298's timeout, `srtt + 4 × rttvar`; `None` before the first sample.
    pub(super) fn timeout(self) -> Option<Duration> {
        self.srtt
            .map(|srtt| Duration::from_nanos(srtt.saturating_add(self.rttvar.saturating_mul(4))))
    }
}

/// Round trips an [`RttMedian`] keeps: its median is recomputed each time it has taken as
/// many new ones.
const MEDIAN_OF: usize = 32;

/// The usual round trip: the median of each window of [`MEDIAN_OF`] samples, the lesser of
/// the last two windows' (none before the first window is full: a queue pair's first round
/// trips pay for its setup), so that taking a sample costs a store. Where a mean follows a
/// stalled peer or a queue, whose round trips of milliseconds come and go on a loaded host,
/// this keeps the path's round trip and the peer's usual turn: it rises once they have been
/// slower for half of two windows in a row, and falls with the first quicker window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct RttMedian {
    samples: [u64; MEDIAN_OF],
    taken: u64,
    /// The medians of the last full window and of the one before it.
    medians: [Option<u64>; 2],
}

impl RttMedian {
    /// Takes one measured round trip.
    pub(super) fn sample(&mut self, rtt: Duration) {
        let rtt = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
        self.samples[(self.taken % MEDIAN_OF as u64) as usize] = rtt;
        self.taken += 1;
        if self.taken % MEDIAN_OF as u64 == 0 {
            let mut sorted = self.samples;
            let (_, median, _) = sorted.select_nth_unstable(MEDIAN_OF / 2);
            self.medians = [Some(*median), self.medians[0]];
        }
    }

    /// The lesser of the last two windows' medians; `None` before the first full window.
    pub(super) fn usual(self) -> Option<Duration> {
        let [last, before] = self.medians;
        last.map(|last| Duration::from_nanos(before.map_or(last, |before| last.min(before))))
    }
}

/// How much later than the estimate an early resend waits: doubled per early resend in the
/// current stall, and doubled once more for each early resend this QP found needless (the
/// originals were answered), once less for each that found a loss. A peer whose answers come
/// late and unevenly (an emulated rxe) is soon left alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Backoff {
    /// Early resends since the last progress.
    in_stall: u32,
    /// Doublings learnt from needless and useful early resends, at most `MAX_EARLY_SHIFT`.
    learnt: u32,
}

impl Backoff {
    /// The factor on the estimate, `2^(in_stall + learnt)`, capped at 2^16.
    pub(super) fn factor(self) -> u32 {
        1 << (self.in_stall + self.learnt).min(16)
    }

    /// An early resend was made.
    pub(super) fn resent(&mut self) {
        self.in_stall += 1;
    }

    /// The peer made progress: the stall is over.
    pub(super) fn progress(&mut self) {
        self.in_stall = 0;
    }

    /// An early resend was needless: later ones wait twice as long.
    pub(super) fn needless(&mut self) {
        self.learnt = (self.learnt + 1).min(MAX_EARLY_SHIFT);
    }

    /// An early resend found a real loss: later ones wait half as long again. Returns
    /// whether they do (not when they already wait no longer than the estimate).
    pub(super) fn found_loss(&mut self) -> bool {
        let halved = self.learnt > 0;
        self.learnt = self.learnt.saturating_sub(1);
        halved
    }

    /// Takes back a [`Backoff::found_loss`] that halved the wait.
    pub(super) fn not_a_loss(&mut self) {
        self.learnt = (self.learnt + 1).min(MAX_EARLY_SHIFT);
    }
}

impl Qp {
    /// Rewinds the requester to resend from `to` (go-back-N), past READ pieces whose
    /// responses from there on are held ([`Qp::skip_held_responses`]).
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
        self.early_resume = None;
        self.read_upto = None;
        if !self.read_ahead.is_empty() {
            // Sending again from `to`: past what is held already.
            self.skip_held_responses();
        }
    }

    /// A retry after a timeout, a sequence NAK or an implied NAK: counts it, or gives up.
    ///
    /// Only the first signal of a loss starts a retry: the responses already in flight
    /// behind a gap (a long READ's, or later requests' ACKs implying the loss again) each
    /// signal it anew, and retrying on every one would spend all of `retry_cnt` on one lost
    /// packet (rxe's completer ignores them the same way until the retry makes progress).
    /// A timeout always retries.
    pub(super) fn retry(&mut self, dev: &mut DeviceState, from: Psn, cause: RetryCause) {
        if cause == RetryCause::Signal && self.retrying_from == Some(from) {
            dev.counters.stale_response += 1;
            return;
        }
        self.retrying_from = Some(from);
        // A loss signalled or timed out: whatever an early probe was waiting to learn, this
        // retry is the answer.
        self.early_probe = None;
        self.early_read_watches.clear();
        self.early_ack_watch = None;
        self.early_past = None;
        if self.retries_left == 0 {
            dev.counters.retry_exceeded_err += 1;
            self.fail_front(dev, WcStatus::RetryExcErr);
            return;
        }
        self.retries_left -= 1;
        dev.counters.completer_retry_err += 1;
        self.window.narrow();
        self.rewind(from);
        self.timers.retransmit = None;
    }

    /// The peer acknowledged or answered `acked` PSNs more: the retry counts start over, the
    /// requester leaves probing, the send window widens by one PSN per window acked, and the
    /// QP has been [`answered`](Qp::answered).
    pub(super) fn made_progress(&mut self, acked: u32) {
        self.answered = true;
        self.window.acked(acked);
        self.retries_left = self.retry_cnt;
        self.rnr_left = self.rnr_retry;
        self.timed_out = false;
        self.probing = false;
        self.backoff.progress();
    }

    /// Takes the round-trip sample if its packet is now answered, and updates the estimate.
    /// Returns the sample taken.
    pub(super) fn sample_rtt(&mut self, now: Instant) -> Option<Duration> {
        let (psn, sent) = self.rtt_sample?;
        if !psn.precedes(self.comp_psn) {
            return None;
        }
        self.rtt_sample = None;
        let rtt = now.saturating_duration_since(sent);
        self.rtt.sample(rtt);
        Some(rtt)
    }

    /// When an early resend would be due if nothing is answered from `now` on: the RFC 6298
    /// timeout from the measured round trip, or before there is a measurement (a loss in the
    /// first window leaves none) a sixteenth of the ACK timeout, a quarter while nothing on
    /// this QP has been answered; at least [`MIN_EARLY_RESEND`] and doubled per early resend
    /// already made in this stall; `None` when it would not come well before the ACK timeout.
    ///
    /// A fresh QP waits longer because a responder's first answer on it is its slowest:
    /// against a sixteenth of perftest's ACK timeout (4.2 ms), rxe in a guest answered a
    /// first READ 7.6 ms after it left and a first SEND 10.1 ms after, and a guest's ferroce
    /// a first window of WRITEs up to 9 ms after (BENCHMARKS.md, the data path's thirtieth
    /// and thirty-fourth steps). Once anything is answered, requests lost before the first
    /// measurement are resent after the sixteenth.
    pub(super) fn early_resend_at(&self, now: Instant) -> Option<Instant> {
        let timeout = self.timeout?;
        let estimate = self.rtt.timeout().unwrap_or(if self.answered {
            timeout / 16
        } else {
            timeout / 4
        });
        let after = estimate
            .max(MIN_EARLY_RESEND)
            .checked_mul(self.backoff.factor())?;
        (after * 2 <= timeout).then(|| now + after)
    }

    pub(super) fn rearm(&mut self, now: Instant) {
        let waiting = self.comp_psn != self.req_psn && self.state == QpState::Rts;
        self.timers.retransmit = if waiting {
            self.timeout.map(|t| now + t)
        } else {
            None
        };
        self.timers.early = if waiting {
            self.early_resend_at(now)
        } else {
            None
        };
    }

    /// The requests built at `built` that armed this QP's timers left at `left`, later: the
    /// timers and the round trip's sample run from then, if it still waits.
    pub(super) fn left_at(&mut self, built: Instant, left: Instant) {
        if self.timers.retransmit.is_none() {
            return;
        }
        self.rearm(left);
        if let Some((_, sent)) = &mut self.rtt_sample {
            if *sent == built {
                *sent = left;
            }
        }
    }

    /// The early resend is due (see [`Qp::early_at`]). It spends no `retry_cnt`. A stall
    /// can be a slow peer rather than a loss (an emulated rxe working through a window), so
    /// it costs as little as it can when it turns out needless:
    ///
    /// - Behind a SEND or WRITE, it goes back to the oldest unanswered PSN as a retry would,
    ///   but probes: it resends only the oldest [`PROBE_PSNS`] packets, each asking for an
    ///   ACK, until an ACK makes progress. After a real loss, go-back-N then carries on; if
    ///   the ACK covers packets the probe did not resend, the originals got through.
    /// - Behind a READ, it asks again for the rest of the piece in flight, or up to the first
    ///   response taken past it ([`ReadAhead`]; rxe's responder cannot serve a later part
    ///   first and an earlier one after: a replay moves the start of its record), and for
    ///   nothing after it ([`Qp::early_resume`]), unless the last one
    ///   asked for the piece before and its answers stopped at that piece's end: then what
    ///   was sent after it goes again too. If a response arrives twice, or a later request is
    ///   answered first, the resend was needless ([`ReadWatch`]).
    ///
    /// Either finding of a needless resend doubles this QP's later early-resend delays.
    pub(super) fn resend_early(&mut self, dev: &mut DeviceState, now: Instant) {
        self.backoff.resent();
        dev.counters.early_resends += 1;
        // A stall again after an ACK past the last probe: what was left was lost.
        self.early_past = None;
        let from = self.comp_psn;
        // Behind a READ: the PSNs from `from` to the end of its piece, or to the first
        // response taken ahead in it, whose responses it asks for again.
        let read = self
            .sq
            .front()
            .filter(|w| matches!(w.op, SendOp::Read(_)) && w.contains(from))
            .map(|w| w.first_psn.add(w.piece_end(w.first_psn.steps_to(from))))
            .map(|end| match self.read_ahead.next_held(from, from) {
                Some(held) if held.precedes(end) => held,
                _ => end,
            })
            .map(|end| from.steps_to(end));
        // The last READ resend's piece answered to its end, and then nothing of the requests
        // after it: they or their answers were lost too, and go-back-N asks for them all.
        let lost_after = self.early_read_watches.stalled_at(from);
        self.early_read_watches.stall_again();
        self.early_copies = if self.early_probe == Some(from) {
            self.early_copies + 1
        } else {
            1
        };
        self.early_probe = read.is_none().then_some(from);
        // Where this pass of sending had got to: it goes on from there after the one request.
        let resume = self.req_psn;
        if let Some(len) = read {
            // Responses after the rest asked for, taken already: it was lost, and no answer
            // past it can show otherwise.
            let shown_lost = self.read_ahead.next_held(from, from.add(len)).is_some();
            self.early_read_watches.push(ReadWatch {
                from,
                len,
                // Requests after the piece that went before this resend and do not go again:
                // their answers come ahead of the copies.
                ahead: !lost_after && !shown_lost && from.add(len).precedes(resume),
                halved: None,
            });
        }
        self.probing = read.is_none();
        self.retrying_from = Some(from);
        self.rewind(from);
        if let Some(len) = read {
            self.read_upto = Some(ReadUpto {
                end: from.add(len),
                lost: false,
            });
            if !lost_after {
                self.early_resume = Some(resume);
            }
        }
        self.timers.early = self.early_resend_at(now);
    }

    /// How many packets an early resend behind a SEND or WRITE probes with from `from`:
    /// [`PROBE_PSNS`], or fewer where the message that holds `from` ends within that many, so
    /// that the probe stops one packet short of its end. A responder acknowledges the end of
    /// each message, so an ACK through a probe that ended there could answer the original as
    /// well as the probe: a slow responder's ACK for the original was taken for the probe's
    /// answer, and the rest of the window went again (a host's requester behind a guest's
    /// soft NIC resent thousands of packets in a run of 300 4 KiB WRITEs; BENCHMARKS.md, the
    /// data path's thirty-third step). An ACK through a packet inside the message is the
    /// answer to the probe's own requests for one; an ACK past it shows that the original got
    /// there. Where `from` is a message's last packet (one-packet messages) nothing can be
    /// told apart this way: where everything sent is answered the ACKs are counted instead
    /// (`Qp::early_ack_watch`), and behind a longer burst such an ACK is still taken for the
    /// probe's.
    pub(super) fn probe_psns(&self, from: Psn) -> u32 {
        let before_end = self
            .sq
            .iter()
            .find(|w| w.contains(from))
            .map(|w| from.steps_to(w.last_psn()));
        match before_end {
            Some(n) if (1..PROBE_PSNS).contains(&n) => n,
            _ => PROBE_PSNS,
        }
    }

    /// Asks again for the next run of lost READ responses that responses taken after it show
    /// lost ([`ReadAhead`]): one READ request from the run's first PSN to the next response
    /// taken or the end of its piece, after which sending goes on where it had got to. Each
    /// request so sent lets the next run go (from [`Qp::next_request`]).
    ///
    /// Nothing while another such request waits to go, or while as many as are remembered
    /// wait for their answers ([`ReadAhead::may_ask`]), or while sending has not yet got past
    /// the run again (a go-back-N on its way asks for it), or when an earlier run of the same
    /// piece was asked for again and is still missing: rxe's responder serves no part of a
    /// READ that starts before the part it served last, so the parts of one piece are asked
    /// for in order and a lost answer asked for again from the same place. Lost responses with
    /// nothing taken after them (the end of the answer lost) are the early resend's.
    pub(super) fn reask_read(&mut self, dev: &mut DeviceState) {
        if self.read_ahead.is_empty()
            || self.read_upto.is_some()
            || !self.read_ahead.may_ask()
            || self.state != QpState::Rts
        {
            return;
        }
        let comp = self.comp_psn;
        let from = self.read_ahead.first_unasked(comp);
        let Some(held) = self.read_ahead.next_held(comp, from) else {
            return;
        };
        let resume = self.early_resume.unwrap_or(self.req_psn);
        if !from.precedes(resume) {
            return;
        }
        let Some(w) = self.sq.iter().find(|w| w.contains(from)) else {
            return;
        };
        if !matches!(w.op, SendOp::Read(_)) {
            return;
        }
        let k = w.first_psn.steps_to(from);
        let piece_start = w.first_psn.add(k - k % w.piece);
        let piece_end = w.first_psn.add(w.piece_end(k));
        let oldest = if comp.precedes(piece_start) {
            piece_start
        } else {
            comp
        };
        if self.read_ahead.next_missing(comp, oldest) != from {
            // An earlier run of this piece, asked for again, is still missing.
            return;
        }
        let end = if held.precedes(piece_end) {
            held
        } else {
            piece_end
        };
        self.rewind(from);
        self.early_resume = Some(resume);
        self.read_upto = Some(ReadUpto { end, lost: true });
        // A loss all the same: the window narrows as for a retry, but no `retry_cnt` is
        // spent (the responses after the run show the responder alive).
        self.window.narrow();
        dev.counters.read_reasks += 1;
    }

    /// The early resend is due, but the peer has not read what was sent: the timer goes on
    /// as if the resend had been made (twice the delay to the next), and nothing is sent.
    /// A peer busy rather than descheduled, which always holds unread datagrams (other QPs'),
    /// thus costs a real loss no more than the ACK timeout.
    pub(super) fn put_off_early(&mut self, dev: &mut DeviceState, now: Instant) {
        dev.counters.early_put_off += 1;
        self.backoff.resent();
        self.timers.early = self.early_resend_at(now);
    }

    /// What the answers taken so far tell the READ early resends still watched.
    pub(super) fn read_watches_answered(&mut self, dev: &mut DeviceState) {
        while self.early_read_watches.take_passed(self.comp_psn).is_some() {
            // Answered past the piece asked for again, by a request sent before it: the
            // piece's rest had come from the originals.
            self.early_was_needless(dev);
        }
        for watch in self.early_read_watches.iter_mut() {
            if !watch.ahead && watch.halved.is_none() && watch.from.precedes(self.comp_psn) {
                // The first response asked for again is in: taken for a loss, which takes
                // back a doubling, until a second copy shows the first was on its way.
                watch.halved = Some(self.backoff.found_loss());
            }
        }
    }

    /// An early resend turned out needless: later ones of this QP wait twice as long.
    pub(super) fn early_was_needless(&mut self, dev: &mut DeviceState) {
        dev.counters.early_needless += 1;
        self.backoff.needless();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_without_losses_widens_by_what_is_acked_up_to_the_widest() {
        let mut w = Window::FULL;
        assert_eq!(w.psns(), MAX_UNACKED_PSNS);
        w.acked(64);
        assert_eq!(w.psns(), MAX_UNACKED_PSNS + 32);
        w.acked(1);
        w.acked(1);
        assert_eq!(w.psns(), MAX_UNACKED_PSNS + 33, "single ACKs add up");
        w.acked(u32::MAX);
        assert_eq!(w.psns(), WIDEST_UNACKED_PSNS);
        // The first retry ends it: half, but no wider than the usual full window.
        w.narrow();
        assert_eq!(w.psns(), MAX_UNACKED_PSNS);
        w.acked(u32::MAX);
        assert_eq!(w.psns(), MAX_UNACKED_PSNS);
    }

    #[test]
    fn the_window_halves_per_retry_and_widens_one_psn_per_window_acked() {
        let mut w = Window::FULL;
        assert_eq!(w.psns(), MAX_UNACKED_PSNS);
        w.narrow();
        assert_eq!(w.psns(), 64);
        for _ in 0..10 {
            w.narrow();
        }
        assert_eq!(w.psns(), MIN_WINDOW_PSNS, "never below the floor");
        w.acked(MIN_WINDOW_PSNS - 1);
        assert_eq!(w.psns(), MIN_WINDOW_PSNS);
        w.acked(1);
        assert_eq!(w.psns(), MIN_WINDOW_PSNS + 1, "one PSN per window's worth");
        w.acked(u32::MAX);
        assert_eq!(w.psns(), MAX_UNACKED_PSNS, "never above the full window");
        w.narrow();
        w.acked(63);
        assert_eq!(w.psns(), 64, "a retry forgets the credit");
    }

    #[test]
    fn an_ack_past_the_ceiling_narrows_the_window_to_fit_it() {
        let ms = Duration::from_millis;
        let ceiling = ms(16);
        let mut w = Window::FULL;
        w.acked(u32::MAX);
        assert_eq!(w.psns(), WIDEST_UNACKED_PSNS);
        // Within the ceiling: nothing changes.
        assert!(!w.waited(ms(16), ceiling));
        assert_eq!(w.psns(), WIDEST_UNACKED_PSNS);
        // A fifth over it: a fifth narrower.
        assert!(w.waited(ms(20), ceiling));
        assert_eq!(w.psns(), WIDEST_UNACKED_PSNS * 16 / 20);
        // Far over it: half at most.
        let before = w.psns();
        assert!(w.waited(ms(100), ceiling));
        assert_eq!(w.psns(), before / 2);
        // It widens as before (no retry has happened), from no credit.
        w.acked(1);
        w.acked(100);
        assert_eq!(w.psns(), before / 2 + 50);
        // Never below the floor.
        for _ in 0..20 {
            w.waited(ms(1000), ceiling);
        }
        assert_eq!(w.psns(), MIN_WINDOW_PSNS);
        assert!(!w.waited(ms(1000), ceiling), "nothing left to narrow");
    }

    #[test]
    fn the_usual_round_trip_is_a_median_that_stalls_do_not_move() {
        let us = Duration::from_micros;
        let mut m = RttMedian::default();
        // A window of quick answers with a few stalls among them, after a slow first one.
        let window = |m: &mut RttMedian, slow: usize, slow_us: u64, fast_us: u64| {
            for i in 0..MEDIAN_OF {
                m.sample(us(if i < slow { slow_us } else { fast_us }));
            }
        };
        m.sample(us(900));
        for _ in 1..MEDIAN_OF - 1 {
            m.sample(us(15));
        }
        assert_eq!(m.usual(), None, "not before a whole window");
        m.sample(us(4000));
        assert_eq!(
            m.usual(),
            Some(us(15)),
            "the setup and a stall do not move it"
        );
        // Slower for less than half of a window: still 15.
        window(&mut m, MEDIAN_OF / 2 - 1, 700, 15);
        assert_eq!(m.usual(), Some(us(15)));
        // Slower for all of one window: the lesser of the two is still the quick one's.
        window(&mut m, MEDIAN_OF, 700, 15);
        assert_eq!(m.usual(), Some(us(15)), "one slow window does not move it");
        // And for the next: the slower path's.
        window(&mut m, MEDIAN_OF, 700, 15);
        assert_eq!(m.usual(), Some(us(700)));
        // One quick window brings it back.
        window(&mut m, 0, 700, 20);
        assert_eq!(m.usual(), Some(us(20)));
    }

    #[test]
    fn the_rtt_estimate_follows_rfc_6298() {
        let mut e = RttEstimate::default();
        assert_eq!(e.timeout(), None);
        let ms = Duration::from_millis;
        e.sample(ms(8));
        // srtt 8, rttvar 4: 8 + 16.
        assert_eq!(e.timeout(), Some(ms(24)));
        e.sample(ms(16));
        // rttvar = (3×4 + |16−8|)/4 = 5, srtt = (7×8 + 16)/8 = 9: 9 + 20.
        assert_eq!(e.timeout(), Some(ms(29)));

        // Kept in nanoseconds, it truncates where `Duration` arithmetic does.
        let (mut srtt, mut rttvar) = (None::<Duration>, Duration::ZERO);
        let mut e = RttEstimate::default();
        for ns in [
            7_777_777u64,
            3_000_001,
            12_345,
            999_999_999,
            1_000_000_007,
            5,
        ] {
            let rtt = Duration::from_nanos(ns);
            e.sample(rtt);
            match srtt {
                None => (srtt, rttvar) = (Some(rtt), rtt / 2),
                Some(s) => {
                    rttvar = (rttvar * 3 + rtt.abs_diff(s)) / 4;
                    srtt = Some((s * 7 + rtt) / 8);
                }
            }
            assert_eq!(e.timeout(), srtt.map(|s| s + 4 * rttvar), "after {ns} ns");
        }
    }

    #[test]
    fn backoff_doubles_per_resend_and_learns_from_needless_ones() {
        let mut b = Backoff::default();
        assert_eq!(b.factor(), 1);
        b.resent();
        b.resent();
        assert_eq!(b.factor(), 4);
        b.progress();
        assert_eq!(b.factor(), 1, "a new stall starts over");
        for _ in 0..20 {
            b.needless();
        }
        assert_eq!(b.factor(), 1 << MAX_EARLY_SHIFT, "learning is capped");
        b.found_loss();
        assert_eq!(b.factor(), 1 << (MAX_EARLY_SHIFT - 1));
        for _ in 0..20 {
            b.resent();
        }
        assert_eq!(b.factor(), 1 << 16, "the factor is capped");
    }
}
