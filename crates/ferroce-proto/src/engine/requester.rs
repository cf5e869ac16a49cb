//! The requester: choosing the next request packet to send from the send queue within the
//! window, the READ and atomic credits, and the ACK-request cadence.

use super::*;

impl Qp {
    /// Work requests started ahead of index `upto` that are READs or atomics.
    pub(super) fn reads_outstanding(&self, upto: usize) -> usize {
        self.sq
            .iter()
            .take(upto)
            .filter(|w| w.op.is_read_or_atomic())
            .count()
    }

    /// How many response PSNs each request of a READ of `npkts` asks for: all of them, unless
    /// the READ is longer than the window every queue pair starts with; then the current
    /// window's worth.
    pub(super) fn read_piece(&self, npkts: u32) -> u32 {
        if npkts > MAX_UNACKED_PSNS {
            self.window.psns()
        } else {
            npkts
        }
    }

    /// READ and atomic requests (READ pieces counted one by one) ever sent and not fully
    /// answered: each holds one of the responder's `max_dest_rd_atomic` resources, even when
    /// a rewind means it will be asked for again.
    pub(super) fn requests_outstanding(&self) -> u32 {
        let mut n = 0;
        for w in self
            .sq
            .iter()
            .filter(|w| w.started && w.op.is_read_or_atomic())
        {
            if !w.first_psn.precedes(self.sent_psn) {
                break;
            }
            let issued = w.first_psn.steps_to(self.sent_psn).min(w.npkts);
            let answered = if w.first_psn.precedes(self.comp_psn) {
                w.first_psn.steps_to(self.comp_psn).min(w.npkts)
            } else {
                0
            };
            let done = if answered == w.npkts {
                w.npkts.div_ceil(w.piece)
            } else {
                answered / w.piece
            };
            n += issued.div_ceil(w.piece).saturating_sub(done);
        }
        n
    }

    /// Sending again (a go-back-N) over READ pieces whose responses were partly taken ahead
    /// ([`ReadAhead`]): moves past each piece whose rest is all held, and on to the first
    /// response missing in the next (whose request then ends at its last missing one).
    /// Besides the copies it spares, a piece is asked for from its first missing response
    /// because rxe's responder serves no part of a READ that starts before the part it served
    /// last: a go-back-N from a piece's start, after a later part of it was asked for again,
    /// went unanswered.
    pub(super) fn skip_held_responses(&mut self) {
        while let Some(w) = self.sq.get(self.req_index) {
            if !w.started
                || !matches!(w.op, SendOp::Read(_))
                || !self.req_psn.precedes(self.sent_psn)
            {
                return;
            }
            let piece_end = w.piece_end(self.req_pkt);
            let missing = self.read_ahead.next_missing(self.comp_psn, self.req_psn);
            let skip = self.req_psn.steps_to(missing);
            if self.req_pkt + skip < piece_end {
                self.req_pkt += skip;
                self.req_psn = missing;
                return;
            }
            self.req_psn = self.req_psn.add(piece_end - self.req_pkt);
            self.req_pkt = piece_end;
            if self.req_pkt >= w.npkts {
                self.req_pkt = 0;
                self.req_index += 1;
            }
        }
    }

    /// Builds the next request packet into `buf`, if one may be sent now.
    pub(super) fn next_request(
        &mut self,
        now: Instant,
        dev: &mut DeviceState,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<(usize, Option<Lent>)> {
        if self.state != QpState::Rts {
            return None;
        }
        if let Some(until) = self.timers.rnr_wait {
            if now < until {
                return None;
            }
            self.timers.rnr_wait = None;
        }
        let index = self.req_index;
        let wqe = self.sq.get(index)?;
        if let Some(status) = wqe.fault {
            // Local errors surface in order, when the request is the oldest.
            if index == 0 {
                self.fail_front(dev, status);
            }
            return None;
        }
        if self.is_rc() {
            // An early resend's probe (`early_probe`) may stop short of a message's end; a
            // timeout's, which forgets it, sends the oldest `PROBE_PSNS`.
            let window = if self.probing {
                self.early_probe
                    .map_or(PROBE_PSNS, |from| self.probe_psns(from))
            } else {
                self.window.psns()
            };
            // The window counts what is in flight: READ responses taken past a lost one are
            // not, though no new PSNs may be asked for beyond what can be held (asking again
            // for sent ones may always go: with nothing sent, no timer would run). A READ
            // asking again for lost responses asks for PSNs the window counts already.
            let outstanding = self.comp_psn.steps_to(self.req_psn);
            let new_psns = !self.req_psn.precedes(self.sent_psn);
            let in_flight = if self.read_ahead.is_empty() {
                outstanding
            } else if new_psns
                && self.comp_psn.steps_to(self.sent_psn) >= AHEAD_PSNS - WIDEST_UNACKED_PSNS
            {
                u32::MAX
            } else {
                outstanding - self.read_ahead.held_before(self.comp_psn, self.req_psn)
            };
            if self.read_upto.is_none() && in_flight >= window {
                return None;
            }
            // A new READ or atomic request takes a responder resource; asking again for one
            // already sent (after a rewind) reuses its own.
            if wqe.op.is_read_or_atomic()
                && !self.req_psn.precedes(self.sent_psn)
                && self.requests_outstanding() >= u32::from(self.max_rd_atomic.max(1))
            {
                return None;
            }
            if self.req_pkt == 0 && wqe.fence && self.reads_outstanding(index) > 0 {
                return None;
            }
        }
        let mtu = self.mtu;
        let transport = self.transport();
        let read_piece = self.read_piece(self.sq[index].npkts);
        let wqe = &mut self.sq[index];
        if !wqe.started {
            wqe.started = true;
            wqe.first_psn = self.req_psn;
            if matches!(wqe.op, SendOp::Read(_)) && transport == Transport::Rc {
                wqe.piece = read_piece;
            }
        }
        let k = self.req_pkt;
        let psn = self.req_psn;
        let reask = self.read_upto.take();
        // A READ request sent before, asked again, and the PSNs whose responses it asks for.
        let mut asked_again = false;
        let mut asked = 0;
        let mut known_lost = false;
        // A go-back-N's pass over READ pieces with responses taken ahead in them.
        let mut past_held = false;
        let mut bth = Bth::new(Opcode::RC_SEND_ONLY, self.dest_qpn, psn);
        let (repr, consumed, payload_at) = match wqe.op {
            SendOp::Read(remote) => {
                // From here to the end of the piece holding PSN k, or to the end of the run
                // of lost responses it asks for again.
                let done = u64::from(k) * u64::from(mtu);
                let piece_end = match reask {
                    Some(upto) if psn.precedes(upto.end) => wqe
                        .piece_end(k)
                        .min(k.saturating_add(psn.steps_to(upto.end))),
                    _ => wqe.piece_end(k),
                };
                asked_again = psn.precedes(self.sent_psn);
                // Sending again past responses taken ahead (a go-back-N): up to the piece's
                // last missing one, in one request (a lost answer to a first of two would go
                // unanswered at rxe once the second was served), and on with the next piece.
                // With a response taken after that one, every response it asks for and does
                // not hold is known lost, as for `Qp::reask_read`'s requests.
                let mut ask_end = piece_end;
                past_held = asked_again && reask.is_none() && !self.read_ahead.is_empty();
                if past_held {
                    let (ahead, comp) = (&mut self.read_ahead, self.comp_psn);
                    if let Some(last) = ahead.last_missing(comp, psn, wqe.first_psn.add(piece_end))
                    {
                        ask_end = k + psn.steps_to(last) + 1;
                        known_lost = ahead.next_held(comp, last).is_some();
                    }
                }
                asked = ask_end - k;
                let end = (u64::from(ask_end) * u64::from(mtu)).min(u64::from(wqe.len));
                bth.opcode = Opcode::RC_RDMA_READ_REQUEST;
                bth.ack_req = true;
                let mut repr = PacketRepr::new(bth);
                repr.reth = Some(Reth {
                    va: remote.va.wrapping_add(done),
                    rkey: remote.rkey,
                    len: (end - done) as u32,
                });
                (repr, piece_end - k, None)
            }
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            } => {
                bth.opcode = Opcode::RC_COMPARE_SWAP;
                bth.ack_req = true;
                let mut repr = PacketRepr::new(bth);
                repr.atomic = Some(AtomicEth {
                    va: remote.va,
                    rkey: remote.rkey,
                    swap_add: swap,
                    compare,
                });
                (repr, 1, None)
            }
            SendOp::FetchAdd { remote, add } => {
                bth.opcode = Opcode::RC_FETCH_ADD;
                bth.ack_req = true;
                let mut repr = PacketRepr::new(bth);
                repr.atomic = Some(AtomicEth {
                    va: remote.va,
                    rkey: remote.rkey,
                    swap_add: add,
                    compare: 0,
                });
                (repr, 1, None)
            }
            SendOp::Send | SendOp::SendWithImm(_) | SendOp::Write(_) | SendOp::WriteWithImm(..) => {
                let offset = u64::from(k) * u64::from(mtu);
                let n = (u64::from(wqe.len) - offset).min(u64::from(mtu)) as usize;
                let first = k == 0;
                let last = k + 1 == wqe.npkts;
                let (is_write, imm, remote) = match wqe.op {
                    SendOp::Send => (false, None, None),
                    SendOp::SendWithImm(imm) => (false, Some(imm), None),
                    SendOp::Write(r) => (true, None, Some(r)),
                    SendOp::WriteWithImm(r, imm) => (true, Some(imm), Some(r)),
                    _ => unreachable!("outer match"),
                };
                let imm = if last { imm } else { None };
                let operation = match (is_write, first, last, imm.is_some()) {
                    (false, true, true, false) => Operation::SendOnly,
                    (false, true, true, true) => Operation::SendOnlyWithImmediate,
                    (false, true, false, _) => Operation::SendFirst,
                    (false, false, false, _) => Operation::SendMiddle,
                    (false, false, true, false) => Operation::SendLast,
                    (false, false, true, true) => Operation::SendLastWithImmediate,
                    (true, true, true, false) => Operation::RdmaWriteOnly,
                    (true, true, true, true) => Operation::RdmaWriteOnlyWithImmediate,
                    (true, true, false, _) => Operation::RdmaWriteFirst,
                    (true, false, false, _) => Operation::RdmaWriteMiddle,
                    (true, false, true, false) => Operation::RdmaWriteLast,
                    (true, false, true, true) => Operation::RdmaWriteLastWithImmediate,
                };
                bth.opcode = Opcode::from_parts(transport, operation)?;
                bth.solicited = last && wqe.solicited && (!is_write || imm.is_some());
                if transport == Transport::Rc {
                    // Twice per window at least, so a narrowed window never waits for a
                    // timeout to open again.
                    let every = MAX_PKT_PER_ACK.min(self.window.psns() / 2).max(1);
                    bth.ack_req = last || self.probing || self.since_ack_req + 1 >= every;
                }
                let mut repr = PacketRepr::new(bth);
                if first {
                    if let Some(r) = remote {
                        repr.reth = Some(Reth {
                            va: r.va,
                            rkey: r.rkey,
                            len: wqe.len,
                        });
                    }
                }
                repr.imm = imm;
                repr.payload_len = n;
                (repr, 1, Some(offset))
            }
        };
        let header_len = repr.emit_headers(buf).ok()?;
        let n = repr.payload_len;
        // A payload that lies in one piece of memory that lends it stays there: the packet
        // holds the rest, and the driver gathers the two ([`Lent`]).
        let lent = match (&wqe.data, payload_at) {
            (WqeData::Segs(segs), Some(offset)) if n > 0 => {
                let mut it = pieces(segs, offset, n);
                match (it.next(), it.next()) {
                    (Some((region, at, range)), None) if range.len() == n => {
                        Lent::ask(mem, region, at, n, header_len)
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let in_buffer = if lent.is_some() { 0 } else { n };
        let end = header_len + in_buffer;
        if let (Some(offset), None) = (payload_at, lent) {
            match &wqe.data {
                WqeData::Segs(segs) => gather(segs, offset, &mut buf[header_len..end], mem),
                WqeData::Inline(bytes) => {
                    let start = offset as usize;
                    buf[header_len..end].copy_from_slice(&bytes[start..start + n]);
                }
            }
        }
        let len = repr.buffer_len() - (n - in_buffer);
        buf[end..len].fill(0);

        if asked_again {
            // Its answer comes after everything asked before it.
            let lost = known_lost || reask.is_some_and(|r| r.lost);
            self.read_ahead.record_ask(psn, psn.add(asked), lost);
        }
        if repr.bth.ack_req {
            self.since_ack_req = 0;
            // Time a packet sent for the first time (Karn: a resent one's answer could be
            // the first copy's).
            if self.is_rc() && self.rtt_sample.is_none() && !psn.precedes(self.sent_psn) {
                self.rtt_sample = Some((psn, now));
            }
        } else {
            self.since_ack_req += 1;
        }
        self.req_psn = psn.add(consumed);
        if self.sent_psn.precedes(self.req_psn) {
            self.sent_psn = self.req_psn;
        }
        self.req_pkt = k + consumed;
        if let Some(at) = self
            .early_resume
            .take()
            .filter(|at| self.req_psn.precedes(*at))
        {
            // An early resend's one READ request: on from where sending had got to.
            self.rewind(at);
        } else if self.req_pkt >= self.sq[index].npkts {
            self.req_pkt = 0;
            if self.is_rc() {
                self.req_index += 1;
            } else if let Some(wqe) = self.sq.pop_front() {
                // UC: nothing will acknowledge it; it is done once sent.
                self.complete_send(dev, &wqe, WcStatus::Success);
            }
        }
        if self.is_rc() && self.timers.retransmit.is_none() {
            self.timers.retransmit = self.timeout.map(|t| now + t);
            self.timers.early = self.early_resend_at(now);
        }
        if past_held {
            // On through the pass: past the next pieces whose rest is held.
            self.skip_held_responses();
        }
        if reask.is_some() {
            // The next run of lost responses may be asked for now.
            self.reask_read(dev);
        }
        Some((len, lent))
    }
}
