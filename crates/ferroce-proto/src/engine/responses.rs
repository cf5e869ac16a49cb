//! What the responder sends back: ACKs, NAKs and RNR NAKs queued as it goes, and READ and
//! atomic responses built packet by packet.

use super::*;

#[derive(Clone, Debug)]
pub(super) enum Response {
    Ack {
        psn: Psn,
        syndrome: Syndrome,
        msn: u32,
    },
    AtomicAck {
        psn: Psn,
        orig: u64,
        msn: u32,
    },
    Read(ReadJob),
}

/// The outcome of a responder check that fails: the NAK to send.
pub(super) struct Nak(pub(super) NakCode);

impl Qp {
    pub(super) fn push_ack(&mut self, psn: Psn) {
        self.queue_ack(psn, false);
    }

    /// The ACK for a duplicate that asked for one (`own`): an ACK for the same PSN already
    /// queued does not take its place, however many there are.
    pub(super) fn push_own_ack(&mut self, psn: Psn) {
        self.queue_ack(psn, true);
    }

    fn queue_ack(&mut self, psn: Psn, own: bool) {
        let msn = self.resp.msn;
        let pending = self.resp.responses.len();
        let twice = pending >= 2
            && matches!(
                self.resp.responses.get(pending - 2),
                Some(Response::Ack { psn: p, syndrome: Syndrome::Ack { .. }, .. }) if *p == psn
            );
        if let Some(Response::Ack {
            psn: last,
            syndrome: Syndrome::Ack { .. },
            msn: m,
        }) = self.resp.responses.back_mut()
        {
            // Coalesce: a later cumulative ACK supersedes one not yet sent. An ACK for the
            // same PSN again answers a duplicate, and goes as a second ACK (once, unless each
            // copy asked for its own): it is how the requester learns that its early resend
            // was needless, the original having arrived, when both reach a responder that was
            // descheduled meanwhile.
            if *last != psn || twice && !own {
                *last = psn;
                *m = msn;
                return;
            }
        }
        self.resp.responses.push_back(Response::Ack {
            psn,
            syndrome: Syndrome::ACK,
            msn,
        });
    }

    /// No receive request for a SEND or a WRITE with immediate: ask the requester to wait
    /// the QP's RNR timer and retry from `psn`. Not fatal, and the packet is not executed.
    pub(super) fn push_rnr_nak(&mut self, dev: &mut DeviceState, psn: Psn) {
        dev.counters.send_rnr_err += 1;
        self.resp.responses.push_back(Response::Ack {
            psn,
            syndrome: Syndrome::RnrNak(self.min_rnr_timer),
            msn: self.resp.msn,
        });
    }

    pub(super) fn push_nak(&mut self, psn: Psn, code: NakCode) {
        self.resp.responses.push_back(Response::Ack {
            psn,
            syndrome: Syndrome::Nak(code),
            msn: self.resp.msn,
        });
    }

    /// Builds the next response packet (ACK, NAK, READ response, atomic ACK) into `buf`, a READ
    /// response's payload left in its region where the memory lends it.
    pub(super) fn next_response(
        &mut self,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<(usize, Option<Lent>)> {
        let mtu = self.mtu;
        let dest_qpn = self.dest_qpn;
        let repr = match self.resp.responses.front_mut()? {
            Response::Ack { psn, syndrome, msn } => {
                let mut repr = PacketRepr::new(Bth::new(Opcode::RC_ACKNOWLEDGE, dest_qpn, *psn));
                repr.aeth = Some(Aeth {
                    syndrome: *syndrome,
                    msn: *msn,
                });
                repr
            }
            Response::AtomicAck { psn, orig, msn } => {
                let mut repr =
                    PacketRepr::new(Bth::new(Opcode::RC_ATOMIC_ACKNOWLEDGE, dest_qpn, *psn));
                repr.aeth = Some(Aeth {
                    syndrome: Syndrome::ACK,
                    msn: *msn,
                });
                repr.atomic_ack = Some(AtomicAckEth { orig: *orig });
                repr
            }
            Response::Read(job) => {
                let offset = u64::from(job.sent) * u64::from(mtu);
                let remaining = u64::from(job.len) - offset;
                let n = remaining.min(u64::from(mtu)) as usize;
                let first = job.sent == 0;
                let last = remaining <= u64::from(mtu);
                let opcode = match (first, last) {
                    (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                    (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
                    (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
                    (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
                };
                let mut repr = PacketRepr::new(Bth::new(opcode, dest_qpn, job.psn.add(job.sent)));
                if opcode.headers().contains(HeaderSet::AETH) {
                    repr.aeth = Some(Aeth {
                        syndrome: Syndrome::ACK,
                        msn: job.msn,
                    });
                }
                repr.payload_len = n;
                let header_len = repr.emit_headers(buf).ok()?;
                let lent = match &job.source {
                    ReadSource::Region(region, at) => {
                        Lent::ask(mem, *region, at + offset, n, header_len)
                    }
                    _ => None,
                };
                let in_buffer = if lent.is_some() { 0 } else { n };
                let out = &mut buf[header_len..header_len + in_buffer];
                match (&job.source, lent) {
                    (ReadSource::Empty, _) | (_, Some(_)) => {}
                    (ReadSource::Region(region, at), None) => {
                        mem.read(*region, at + offset, out);
                    }
                    (ReadSource::Copied(bytes), None) => {
                        let start = offset as usize;
                        out.copy_from_slice(&bytes[start..start + n]);
                    }
                }
                let len = repr.buffer_len() - (n - in_buffer);
                buf[header_len + in_buffer..len].fill(0);
                job.sent += 1;
                if last {
                    self.resp.responses.pop_front();
                }
                return Some((len, lent));
            }
        };
        let len = repr.emit(&[], buf).ok()?;
        self.resp.responses.pop_front();
        Some((len, None))
    }
}
