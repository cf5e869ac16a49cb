//! The queue pair's state, one struct for all its roles, and what every role shares: creation,
//! reset, completing work requests, and entering the error state.

use super::*;

#[derive(Debug)]
pub(super) struct Qp {
    pub(super) qpn: Qpn,
    pub(super) init: QpInit,
    pub(super) state: QpState,
    pub(super) access: Access,
    pub(super) mtu: u32,
    pub(super) dest_qpn: Qpn,
    pub(super) peer: Option<SocketAddr>,
    pub(super) timeout: Option<Duration>,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) min_rnr_timer: RnrTimer,
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    /// A UD queue pair's Q_Key.
    pub(super) qkey: u32,

    // Requester and completer.
    pub(super) sq: VecDeque<SendWqe>,
    /// Index in `sq` of the request being transmitted.
    pub(super) req_index: usize,
    /// PSN offset within that request of the next packet.
    pub(super) req_pkt: u32,
    /// The next PSN to send.
    pub(super) req_psn: Psn,
    /// One past the newest PSN ever sent: `req_psn` before any rewind. An ACK up to here
    /// counts even when a go-back-N or a probe has moved `req_psn` back.
    pub(super) sent_psn: Psn,
    pub(super) since_ack_req: u32,
    /// The oldest PSN not yet acknowledged or answered.
    pub(super) comp_psn: Psn,
    pub(super) retries_left: u8,
    pub(super) rnr_left: u8,
    /// A retransmission timeout fired and no ACK has made progress since.
    pub(super) timed_out: bool,
    /// A second timeout in a row: the peer is slow (an emulated rxe can take longer than the
    /// ACK timeout to work through a 128-packet window) or gone. Until an ACK makes progress
    /// the requester resends only the oldest [`PROBE_PSNS`] packets, each asking for an ACK,
    /// instead of the whole window again: go-back-N bursts of duplicates only bury a slow
    /// responder deeper (it answers each with an ACK), until `retry_cnt` runs out.
    pub(super) probing: bool,
    /// Where the last retry went back to: further signals of the same loss are ignored.
    pub(super) retrying_from: Option<Psn>,
    /// The send window.
    pub(super) window: Window,
    /// The round-trip estimate.
    pub(super) rtt: RttEstimate,
    /// The peer has acknowledged or answered something on this QP: its first answer, which
    /// may pay for a cold start (see [`Qp::early_resend_at`]), is behind it.
    pub(super) answered: bool,
    /// The packet timing the next round-trip sample, and when it left.
    pub(super) rtt_sample: Option<(Psn, Instant)>,
    /// The oldest unanswered PSN when the last early resend probed behind a SEND or WRITE,
    /// until an answer shows whether the stall was a loss.
    pub(super) early_probe: Option<Psn>,
    /// What the last READ early resends asked for again, until answers show each needless or
    /// a retry ends the watch.
    pub(super) early_read_watches: ReadWatches,
    /// Where sending goes on once a READ early resend's one request has gone: where the
    /// current pass of sending had got to. The requests after it were sent and may be
    /// answered yet; a responder answers a copy of each only after everything queued before
    /// it, so asking for them again would only queue their whole answers twice. Any other
    /// rewind forgets it.
    pub(super) early_resume: Option<Psn>,
    /// An ACK answered past what the last probe resent, with more of the burst unanswered:
    /// the resend was needless if answers go past this PSN before another resend.
    pub(super) early_past: Option<Psn>,
    /// How many early resends in a row have probed from `early_probe`.
    pub(super) early_copies: u32,
    /// A probe was answered by an ACK that covers what it resent and no more, which the
    /// original could have drawn as well as the probe; it was taken for a loss, until the
    /// ACKs that follow say otherwise.
    pub(super) early_ack_watch: Option<AckWatch>,
    /// How much later than the estimate the next early resend waits.
    pub(super) backoff: Backoff,
    /// READ responses taken past a lost one, so that only the lost ones are asked for again.
    pub(super) read_ahead: ReadAhead,
    /// Where the READ request about to be sent ends, when it asks again for a run of
    /// responses rather than for the rest of a piece; any rewind forgets it.
    pub(super) read_upto: Option<ReadUpto>,

    /// The requester's three timers.
    pub(super) timers: Timers,
    /// Where the engine's schedule holds this queue pair.
    pub(super) sched: schedule::Sched,

    /// The responder's half.
    pub(super) resp: ResponderState,
}

/// What the responder keeps: the receive queue, where the inbound stream is, and what it owes
/// the requester.
#[derive(Debug)]
pub(super) struct ResponderState {
    /// Receive requests, oldest first.
    pub(super) rq: VecDeque<RecvWqe>,
    /// The PSN expected next.
    pub(super) epsn: Psn,
    /// The message sequence number of the last completed message (AETH's MSN).
    pub(super) msn: u32,
    /// A sequence NAK went out for `epsn` and is not re-sent until `epsn` arrives.
    pub(super) nak_sent: bool,
    /// The multi-packet message being received.
    pub(super) in_msg: Option<InMsg>,
    /// The READ and atomic results duplicates are replayed from.
    pub(super) resources: VecDeque<Resource>,
    /// ACKs, NAKs and READ and atomic responses waiting to go out.
    pub(super) responses: VecDeque<Response>,
    /// What refuses or counts inbound WRITEs (a frame receiver's page checks).
    pub(super) write_filter: FilterSlot,
}

/// A queue pair's timers, in one table: when each is due, `None` when not armed. The engine
/// sleeps until the earliest of all QPs' ([`Timers::next`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Timers {
    /// The retransmission timeout: `timeout` after the oldest unanswered request, rearmed at
    /// each progress.
    pub(super) retransmit: Option<Instant>,
    /// When to resend early: a stall of a few round trips with nothing answered means a lost
    /// tail packet, ACK or sequence NAK, which would otherwise cost a whole ACK timeout (67 ms
    /// at perftest's default). It goes back to the oldest unanswered PSN as a retry would,
    /// without spending `retry_cnt`; the responder answers duplicates with an ACK. Each
    /// further early resend of one stall waits twice as long, while that stays under half the
    /// ACK timeout, which still fires on its own schedule: a dead peer is found as soon as
    /// before.
    pub(super) early: Option<Instant>,
    /// The end of an RNR wait the responder asked for: nothing is sent before it.
    pub(super) rnr_wait: Option<Instant>,
}

impl Timers {
    /// The earliest armed timer.
    pub(super) fn next(&self) -> Option<Instant> {
        [self.retransmit, self.early, self.rnr_wait]
            .into_iter()
            .flatten()
            .min()
    }

    /// Disarms `timer` and says whether it was due at `now`.
    pub(super) fn take_due(timer: &mut Option<Instant>, now: Instant) -> bool {
        if timer.is_some_and(|t| t <= now) {
            *timer = None;
            true
        } else {
            false
        }
    }
}

/// What a requester listens for after an ambiguous probe ([`Qp::early_ack_watch`]): the peer
/// answers each packet of a probe (each asks for an ACK) with an ACK of its own, so one more
/// ACK for the last PSN than the probes resent packets shows the original had arrived.
#[derive(Clone, Copy, Debug)]
pub(super) struct AckWatch {
    /// The PSN the ambiguous ACK acknowledged.
    pub(super) psn: Psn,
    /// ACKs for it still to come before the resend counts as needless.
    pub(super) more: u32,
    /// Whether taking the probe for a loss shortened the backoff (undone if it was not one).
    pub(super) halved: bool,
}

/// The end of the READ request about to be sent again ([`Qp::read_upto`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadUpto {
    pub(super) end: Psn,
    /// Every response it asks for is known lost ([`Qp::reask_read`]); an early resend's may
    /// still be on its way.
    pub(super) lost: bool,
}

/// A READ early resend asked again for the responses of `len` PSNs from `from` (the rest of
/// a piece), which may still have been on their way. Two things show it needless:
///
/// - a second copy of one of them (a copy of another READ's response shows nothing of it);
/// - with requests after the piece sent before it (`ahead`), an answer to one of those
///   before another early resend: a responder answers in order, so the piece's rest had come
///   from the originals, ahead of them, and the copies are still to come (TCP's F-RTO reads
///   a spurious timeout so, from ACKs for data it did not resend).
///
/// Without requests ahead, when the first of them arrives the resend is taken for a loss, as
/// a probe answered is ([`AckWatch`]), until a copy says otherwise.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReadWatch {
    pub(super) from: Psn,
    pub(super) len: u32,
    /// Requests after the piece went before the resend and do not go again after it, and no
    /// early resend has come since: an answer to one of them, past the piece, shows the
    /// resend needless.
    pub(super) ahead: bool,
    /// `None` until the first response asked for again arrives; then whether taking the
    /// resend for a loss shortened the backoff (undone if it was not one).
    pub(super) halved: Option<bool>,
}

/// How many READ early resends are watched at once.
const READ_WATCHES: usize = 4;

/// The READ early resends of a stall or of stalls in a row that no copy has yet shown
/// needless, oldest first. A responder answers a READ request asked again only after
/// everything queued before it, the rest of that READ and the next ones, so the copies that
/// show a resend needless can come after several more stalls, each with a resend of its own;
/// watching only the last one, the requester never learnt to wait longer, and each stall of
/// a slow responder drew a resend.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReadWatches([Option<ReadWatch>; READ_WATCHES]);

impl ReadWatches {
    /// Watches one more, forgetting the oldest when all places are taken.
    pub(super) fn push(&mut self, watch: ReadWatch) {
        let free = self.0.iter().position(Option::is_none);
        let at = free.unwrap_or_else(|| {
            self.0.rotate_left(1);
            READ_WATCHES - 1
        });
        self.0[at] = Some(watch);
    }

    /// Another early resend: answers that come after it no longer tell whether the ones
    /// before it were needed.
    pub(super) fn stall_again(&mut self) {
        for watch in self.iter_mut() {
            watch.ahead = false;
        }
    }

    /// Whether a watch with requests ahead asked for the piece that ends at `psn`: its answers
    /// came to the end and none after.
    pub(super) fn stalled_at(&self, psn: Psn) -> bool {
        self.0
            .iter()
            .flatten()
            .any(|w| w.ahead && w.from.add(w.len) == psn)
    }

    /// Takes out the first watch with requests ahead whose piece `comp_psn` has passed (its
    /// last response and the first of a later request taken).
    pub(super) fn take_passed(&mut self, comp_psn: Psn) -> Option<ReadWatch> {
        self.take_first(|w| w.ahead && w.from.add(w.len).precedes(comp_psn))
    }

    /// Whether none is watched.
    pub(super) fn is_empty(&self) -> bool {
        // Kept packed: the watched ones come first.
        self.0[0].is_none()
    }

    /// Forgets them all.
    pub(super) fn clear(&mut self) {
        self.0 = [None; READ_WATCHES];
    }

    /// Takes out the oldest watch whose PSNs hold `psn`.
    pub(super) fn take(&mut self, psn: Psn) -> Option<ReadWatch> {
        self.take_first(|w| psn.in_window(w.from, w.len))
    }

    /// A response past a watched piece's rest was taken while part of that rest is still
    /// missing (`comp` the oldest unanswered PSN): a responder answers in order, so what is
    /// missing was lost, and the copies will bring it. An answer past the piece no longer
    /// shows the resend needless (it came ahead of the copies either way).
    pub(super) fn shown_lost(&mut self, comp: Psn, psn: Psn) {
        for watch in self.iter_mut() {
            let end = watch.from.add(watch.len);
            if watch.ahead && comp.precedes(end) && !psn.precedes(end) {
                watch.ahead = false;
            }
        }
    }

    /// Takes out the oldest watch that `hit` picks, keeping the rest packed.
    fn take_first(&mut self, hit: impl Fn(&ReadWatch) -> bool) -> Option<ReadWatch> {
        let at = self.0.iter().position(|w| w.as_ref().is_some_and(&hit))?;
        let watch = self.0[at].take();
        self.0[at..].rotate_left(1);
        watch
    }

    /// Those still watched.
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut ReadWatch> {
        self.0.iter_mut().flatten()
    }
}

impl Qp {
    pub(super) fn new(qpn: Qpn, init: QpInit) -> Self {
        Self {
            qpn,
            init,
            state: QpState::Reset,
            access: Access::NONE,
            mtu: 1024,
            dest_qpn: Qpn::default(),
            peer: None,
            timeout: None,
            retry_cnt: 0,
            rnr_retry: 0,
            min_rnr_timer: RnrTimer::default(),
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            qkey: if qpn.value() == 1 { GSI_QKEY } else { 0 },
            sq: VecDeque::new(),
            req_index: 0,
            req_pkt: 0,
            req_psn: Psn::default(),
            sent_psn: Psn::default(),
            since_ack_req: 0,
            comp_psn: Psn::default(),
            retries_left: 0,
            rnr_left: 0,
            timed_out: false,
            probing: false,
            retrying_from: None,
            window: Window::FULL,
            rtt: RttEstimate::default(),
            answered: false,
            rtt_sample: None,
            early_probe: None,
            early_read_watches: ReadWatches::default(),
            early_resume: None,
            early_past: None,
            early_copies: 0,
            early_ack_watch: None,
            backoff: Backoff::default(),
            read_ahead: ReadAhead::default(),
            read_upto: None,
            timers: Timers::default(),
            sched: schedule::Sched::default(),
            resp: ResponderState {
                rq: VecDeque::new(),
                epsn: Psn::default(),
                msn: 0,
                nak_sent: false,
                in_msg: None,
                resources: VecDeque::new(),
                responses: VecDeque::new(),
                write_filter: FilterSlot(None),
            },
        }
    }

    pub(super) fn is_rc(&self) -> bool {
        self.init.qp_type == QpType::Rc
    }

    pub(super) fn is_ud(&self) -> bool {
        self.init.qp_type == QpType::Ud
    }

    /// Whether the connected queue pair may have another packet to send after one just
    /// made: a response queued, or a request not yet sent whole. `false` is certain (its next
    /// turn would find nothing); `true` may not be (a closed window, an RNR wait).
    pub(super) fn may_send_more(&self) -> bool {
        !self.resp.responses.is_empty() || self.req_index < self.sq.len()
    }

    /// QP 1, whose Q_Key is fixed.
    pub(super) fn is_gsi(&self) -> bool {
        self.qpn.value() == 1
    }

    pub(super) fn transport(&self) -> Transport {
        match self.init.qp_type {
            QpType::Rc => Transport::Rc,
            QpType::Uc => Transport::Uc,
            QpType::Ud => Transport::Ud,
        }
    }

    pub(super) fn reset(&mut self) {
        // The schedule's bookkeeping outlives the reset: the engine's ready queue and timer
        // index may still hold this queue pair.
        let sched = std::mem::take(&mut self.sched);
        *self = Self::new(self.qpn, self.init);
        self.sched = sched;
    }

    // ---------------------------------------------------------------- completions, errors

    pub(super) fn complete_send(&mut self, dev: &mut DeviceState, wqe: &SendWqe, status: WcStatus) {
        if status == WcStatus::Success {
            if matches!(wqe.op, SendOp::Send | SendOp::SendWithImm(_)) {
                dev.counters.rdma_sends += 1;
            }
            if !(wqe.signaled || self.init.sq_sig_all) {
                return;
            }
        } else if status != WcStatus::WrFlushErr {
            dev.counters.send_err += 1;
        }
        let completion = Completion {
            wr_id: wqe.wr_id,
            status,
            opcode: wqe.wc_opcode(),
            byte_len: wqe.len,
            imm: None,
            qpn: self.qpn,
            ud: None,
        };
        if !dev.complete(self.init.send_cq, completion) && self.state != QpState::Err {
            self.enter_err(dev);
        }
    }

    pub(super) fn complete_recv(
        &mut self,
        dev: &mut DeviceState,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u64,
        imm: Option<u32>,
    ) {
        let completion = Completion {
            wr_id,
            status,
            opcode,
            byte_len: u32::try_from(len).unwrap_or(u32::MAX),
            imm,
            qpn: self.qpn,
            ud: None,
        };
        self.push_recv_completion(dev, completion, false);
    }

    /// A successful receive of `packet`'s message: its immediate, and its solicited-event bit
    /// for a CQ armed for solicited completions.
    pub(super) fn complete_recv_of(
        &mut self,
        dev: &mut DeviceState,
        wr_id: u64,
        opcode: WcOpcode,
        len: u64,
        packet: &Packet<&[u8]>,
    ) {
        let completion = Completion {
            wr_id,
            status: WcStatus::Success,
            opcode,
            byte_len: u32::try_from(len).unwrap_or(u32::MAX),
            imm: packet.imm(),
            qpn: self.qpn,
            ud: None,
        };
        self.push_recv_completion(dev, completion, packet.solicited());
    }

    /// Queues a receive completion (`solicited`: the peer asked for a solicited event); a
    /// full CQ moves the QP to ERR.
    pub(super) fn push_recv_completion(
        &mut self,
        dev: &mut DeviceState,
        completion: Completion,
        solicited: bool,
    ) {
        if !dev.complete_as(self.init.recv_cq, completion, solicited) && self.state != QpState::Err
        {
            self.enter_err(dev);
        }
    }

    /// Completes the oldest send request with `status` and moves the QP to ERR.
    pub(super) fn fail_front(&mut self, dev: &mut DeviceState, status: WcStatus) {
        if let Some(wqe) = self.sq.pop_front() {
            self.complete_send(dev, &wqe, status);
        }
        self.enter_err(dev);
    }

    /// Enters ERR: every outstanding request completes with a flush error. A NAK already
    /// queued is still sent. A QP on a shared receive queue flushes only the receive it was
    /// in the middle of, leaves the others to the queue's other QPs, and raises
    /// [`AsyncEvent::QpLastWqeReached`].
    pub(super) fn enter_err(&mut self, dev: &mut DeviceState) {
        self.state = QpState::Err;
        self.timers = Timers::default();
        while let Some(wqe) = self.sq.pop_front() {
            self.complete_send(dev, &wqe, WcStatus::WrFlushErr);
        }
        self.req_index = 0;
        self.req_pkt = 0;
        if let Some(InMsg::Send { wqe, .. }) = self.resp.in_msg.take() {
            self.resp.rq.push_front(wqe);
        }
        if self.init.srq.is_some() {
            dev.raise(AsyncEvent::QpLastWqeReached(self.qpn));
        }
        while let Some(wqe) = self.resp.rq.pop_front() {
            self.complete_recv(
                dev,
                wqe.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
                None,
            );
        }
        self.resp.responses.retain(|r| {
            matches!(
                r,
                Response::Ack {
                    syndrome: Syndrome::Nak(_),
                    ..
                }
            )
        });
        self.resp.resources.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_watches_keep_the_newest_and_answer_by_psn() {
        let psn = |v| Psn::new(v).unwrap();
        let watch = |from, len, ahead| ReadWatch {
            from: psn(from),
            len,
            ahead,
            halved: None,
        };
        let mut w = ReadWatches::default();
        for i in 0..READ_WATCHES as u32 + 1 {
            w.push(watch(100 * i, 10, true));
        }
        // The oldest, from 0, made room for the fifth.
        assert!(w.take(psn(5)).is_none());
        assert_eq!(w.take(psn(105)).map(|w| w.from), Some(psn(100)));
        assert!(w.take(psn(105)).is_none(), "taken once");
        // A watch with requests ahead ends at the PSN after its piece.
        assert!(w.stalled_at(psn(210)));
        assert!(!w.stalled_at(psn(205)));
        // Passed only once an answer past the piece is taken.
        assert!(w.take_passed(psn(210)).is_none());
        assert_eq!(w.take_passed(psn(211)).map(|w| w.from), Some(psn(200)));
        // Another stall: answers after it tell nothing of the ones before.
        w.stall_again();
        assert!(!w.stalled_at(psn(310)));
        assert!(w.take_passed(psn(999)).is_none());
        assert_eq!(w.iter_mut().count(), 2);
        w.push(watch(500, 10, true));
        assert_eq!(w.iter_mut().count(), 3, "a free place is used first");
        assert!(!w.is_empty());
        w.clear();
        assert_eq!(w.iter_mut().count(), 0);
        assert!(w.is_empty());
    }

    #[test]
    fn timers_report_the_earliest_and_disarm_only_when_due() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut timers = Timers::default();
        assert_eq!(timers.next(), None);
        timers.retransmit = Some(t0 + ms(67));
        timers.early = Some(t0 + ms(3));
        assert_eq!(timers.next(), Some(t0 + ms(3)));
        assert!(!Timers::take_due(&mut timers.early, t0 + ms(2)));
        assert!(timers.early.is_some(), "not due: still armed");
        assert!(Timers::take_due(&mut timers.early, t0 + ms(3)));
        assert_eq!(timers.early, None);
        assert_eq!(timers.next(), Some(t0 + ms(67)));
        assert!(
            !Timers::take_due(&mut timers.rnr_wait, t0 + ms(100)),
            "unarmed"
        );
    }
}
