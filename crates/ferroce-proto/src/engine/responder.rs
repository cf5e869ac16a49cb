//! The responder: checking and executing inbound requests (SEND, WRITE, READ, atomics) for RC
//! and UC against the region table and the write filter, duplicates, and the responder
//! resources that READs and atomics are replayed from.

use super::*;

/// One inbound RDMA WRITE packet, as a [`WriteFilter`] sees it: it has passed every check of
/// the protocol (ICRC, QP, source, PSN, key, range and rights) and is about to be written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundWrite {
    /// The packet's PSN.
    pub psn: Psn,
    /// Where its payload lands, in the address space the RETH uses.
    pub va: u64,
    /// Payload bytes.
    pub len: u32,
    /// The immediate, on a WRITE that carries one.
    pub imm: Option<u32>,
    /// Whether the packet ends its message (LAST or ONLY).
    pub last: bool,
}

/// A queue pair's [`WriteFilter`], if it has one (filters need not be `Debug`).
pub(super) struct FilterSlot(pub(super) Option<Box<dyn WriteFilter>>);

impl std::fmt::Debug for FilterSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Some(..)" } else { "None" })
    }
}

/// A check an application adds to a queue pair's inbound RDMA WRITEs, beyond what the
/// region's key and bounds already enforce (the frame receiver keeps each packet inside one
/// page, and tallies packets per frame). It runs on the thread driving the engine.
pub trait WriteFilter: Send {
    /// Whether `write` may land. A refusal is handled like a refused key: RC answers with a
    /// remote access error NAK, UC drops the message; either way nothing is written.
    fn admit(&mut self, write: &InboundWrite) -> bool;
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Resource {
    Read {
        first: Psn,
        last: Psn,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: Psn,
        orig: u64,
    },
}

/// Where a READ response's bytes come from.
#[derive(Clone, Debug)]
pub(super) enum ReadSource {
    /// A zero-length READ.
    Empty,
    /// Registered memory, read as each response packet is built.
    Region(RegionId, u64),
    /// A copy of the bytes not yet sent, taken when a later request was about to change
    /// memory (see [`Qp::snapshot_reads`]).
    Copied(Vec<u8>),
}

#[derive(Clone, Debug)]
pub(super) struct ReadJob {
    pub(super) psn: Psn,
    pub(super) source: ReadSource,
    pub(super) sent: u32,
    pub(super) len: u32,
    pub(super) msn: u32,
}

impl From<Option<(RegionId, u64)>> for ReadSource {
    fn from(target: Option<(RegionId, u64)>) -> Self {
        match target {
            Some((region, at)) => Self::Region(region, at),
            None => Self::Empty,
        }
    }
}

pub(super) trait OpcodeExt {
    fn operation_is_send(self) -> bool;
}

impl OpcodeExt for Opcode {
    fn operation_is_send(self) -> bool {
        matches!(
            self.operation(),
            Operation::SendFirst
                | Operation::SendMiddle
                | Operation::SendLast
                | Operation::SendLastWithImmediate
                | Operation::SendOnly
                | Operation::SendOnlyWithImmediate
        )
    }
}

impl Qp {
    /// Whether `packet` (for this RC or UC queue pair) is ahead of what it expects: a request
    /// past the responder's expected PSN, or a READ response past the one the requester
    /// waits for and within what it asked. Handled now, the first would draw a sequence NAK
    /// (RC) or abandon the message (UC), the second a resend of the READ.
    pub(super) fn is_ahead(&self, packet: &Packet<&[u8]>) -> bool {
        let psn = packet.psn();
        let opcode = packet.opcode();
        if !opcode.is_response() {
            return self.resp.epsn.precedes(psn);
        }
        opcode.operation().is_read_response()
            && self.comp_psn.precedes(psn)
            && psn.precedes(self.req_psn)
    }

    /// A request reached the responder.
    pub(super) fn handle_request(
        &mut self,
        packet: &Packet<&[u8]>,
        dev: &mut DeviceState,
        mem: &mut dyn Memory,
    ) {
        let psn = packet.psn();
        if !self.is_rc() {
            self.handle_uc_request(packet, dev, mem);
            return;
        }
        let distance = self.resp.epsn.distance_to(psn);
        if distance > 0 {
            dev.counters.out_of_seq_request += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                self.push_nak(self.resp.epsn, NakCode::PsnSequenceError);
            }
            return;
        }
        if distance < 0 {
            dev.counters.duplicate_request += 1;
            self.handle_duplicate(packet, dev);
            return;
        }
        self.resp.nak_sent = false;
        if let Err(Nak(code)) = self.execute(packet, dev, mem) {
            match code {
                NakCode::RemoteAccessError => dev.counters.resp_access_err += 1,
                _ => dev.counters.resp_invalid_req += 1,
            }
            self.push_nak(psn, code);
            self.enter_err(dev);
        }
    }

    /// Checks the payload length of one packet of a SEND or WRITE message.
    pub(super) fn check_len(&self, opcode: Opcode, len: usize) -> Result<(), Nak> {
        let mtu = self.mtu as usize;
        let ok = match (opcode.is_first(), opcode.is_last()) {
            (_, false) => len == mtu,
            (true, true) => len <= mtu,
            (false, true) => len >= 1 && len <= mtu,
        };
        if ok {
            Ok(())
        } else {
            Err(Nak(NakCode::InvalidRequest))
        }
    }

    /// Copies the unsent bytes of every queued READ response out of registered memory. A
    /// responder executes requests in PSN order, so a READ must return memory as it was
    /// before any later request changed it; responses are built lazily at transmit time, so
    /// the bytes are copied only when a later request is about to write while they wait.
    pub(super) fn snapshot_reads(&mut self, mem: &dyn Memory) {
        let mtu = u64::from(self.mtu);
        for response in &mut self.resp.responses {
            if let Response::Read(job) = response {
                if let ReadSource::Region(region, at) = job.source {
                    let done = u64::from(job.sent) * mtu;
                    let mut bytes = vec![0; (u64::from(job.len) - done) as usize];
                    mem.read(region, at + done, &mut bytes);
                    job.source = ReadSource::Copied(bytes);
                    job.len -= done as u32;
                    job.psn = job.psn.add(job.sent);
                    job.sent = 0;
                }
            }
        }
    }

    /// Executes the request at the expected PSN. For RC an `Err` is answered with its NAK
    /// and moves the QP to ERR; `Ok` covers RNR NAKs, which are not fatal.
    pub(super) fn execute(
        &mut self,
        packet: &Packet<&[u8]>,
        dev: &mut DeviceState,
        mem: &mut dyn Memory,
    ) -> Result<(), Nak> {
        let opcode = packet.opcode();
        let psn = packet.psn();
        let op = opcode.operation();
        let payload = packet.payload();
        let invalid = || Nak(NakCode::InvalidRequest);
        if !matches!(op, Operation::RdmaReadRequest) {
            self.snapshot_reads(mem);
        }
        match op {
            Operation::SendFirst
            | Operation::SendMiddle
            | Operation::SendLast
            | Operation::SendLastWithImmediate
            | Operation::SendOnly
            | Operation::SendOnlyWithImmediate => {
                match (&self.resp.in_msg, opcode.is_first()) {
                    (None, true) | (Some(InMsg::Send { .. }), false) => {}
                    _ => return Err(invalid()),
                }
                self.check_len(opcode, payload.len())?;
                if opcode.is_first() {
                    let Some(wqe) = self.take_recv(dev) else {
                        self.push_rnr_nak(dev, psn);
                        return Ok(());
                    };
                    self.resp.in_msg = Some(InMsg::Send { wqe, offset: 0 });
                }
                let Some(InMsg::Send { wqe, offset }) = &mut self.resp.in_msg else {
                    return Err(invalid());
                };
                let end = *offset + payload.len() as u64;
                if end > wqe.len || wqe.fault.is_some() {
                    let (wr_id, status) = (wqe.wr_id, wqe.fault.unwrap_or(WcStatus::LocLenErr));
                    self.resp.in_msg = None;
                    self.complete_recv(dev, wr_id, status, WcOpcode::Recv, 0, None);
                    return Err(invalid());
                }
                scatter(&wqe.segs, *offset, payload, mem);
                *offset = end;
                self.resp.epsn = psn.next();
                if opcode.is_last() {
                    let Some(InMsg::Send { wqe, offset }) = self.resp.in_msg.take() else {
                        return Err(invalid());
                    };
                    self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                    dev.counters.rdma_recvs += 1;
                    self.complete_recv_of(dev, wqe.wr_id, WcOpcode::Recv, offset, packet);
                }
                if packet.ack_req() {
                    self.push_ack(psn);
                }
                Ok(())
            }
            Operation::RdmaWriteFirst
            | Operation::RdmaWriteMiddle
            | Operation::RdmaWriteLast
            | Operation::RdmaWriteLastWithImmediate
            | Operation::RdmaWriteOnly
            | Operation::RdmaWriteOnlyWithImmediate => {
                match (&self.resp.in_msg, opcode.is_first()) {
                    (None, true) | (Some(InMsg::Write { .. }), false) => {}
                    _ => return Err(invalid()),
                }
                self.check_len(opcode, payload.len())?;
                let with_imm = packet.imm().is_some();
                if with_imm && !self.has_recv(dev) {
                    self.push_rnr_nak(dev, psn);
                    return Ok(());
                }
                if opcode.is_first() {
                    let reth = packet.reth().ok_or_else(invalid)?;
                    if !self.access.contains(Access::REMOTE_WRITE)
                        || u64::from(reth.len) > MAX_MESSAGE
                    {
                        return Err(invalid());
                    }
                    let target = if reth.len == 0 {
                        None
                    } else {
                        let pd = self.init.pd;
                        let found = dev.table.check_remote(
                            reth.rkey,
                            pd,
                            reth.va,
                            reth.len.into(),
                            Access::REMOTE_WRITE,
                        );
                        Some(found.map_err(|_| Nak(NakCode::RemoteAccessError))?)
                    };
                    self.resp.in_msg = Some(InMsg::Write {
                        target,
                        va: reth.va,
                        written: 0,
                        total: reth.len,
                    });
                }
                let Some(InMsg::Write {
                    target,
                    va,
                    written,
                    total,
                }) = &mut self.resp.in_msg
                else {
                    return Err(invalid());
                };
                let end = u64::from(*written) + payload.len() as u64;
                if end > u64::from(*total) || (opcode.is_last() && end != u64::from(*total)) {
                    return Err(invalid());
                }
                if let Some(filter) = self.resp.write_filter.0.as_mut() {
                    let write = InboundWrite {
                        psn,
                        va: va.wrapping_add(u64::from(*written)),
                        len: payload.len() as u32,
                        imm: packet.imm(),
                        last: opcode.is_last(),
                    };
                    if !filter.admit(&write) {
                        dev.counters.write_filtered += 1;
                        return Err(Nak(NakCode::RemoteAccessError));
                    }
                }
                if let Some((region, offset)) = *target {
                    if !payload.is_empty() {
                        mem.write(region, offset + u64::from(*written), payload);
                    }
                }
                *written = end as u32;
                let total = *total;
                self.resp.epsn = psn.next();
                if opcode.is_last() {
                    self.resp.in_msg = None;
                    self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                    dev.counters.rdma_writes_rcvd += 1;
                    if with_imm {
                        let Some(wqe) = self.take_recv(dev) else {
                            return Err(invalid());
                        };
                        self.complete_recv_of(
                            dev,
                            wqe.wr_id,
                            WcOpcode::RecvRdmaWithImm,
                            total.into(),
                            packet,
                        );
                    }
                }
                if packet.ack_req() {
                    self.push_ack(psn);
                }
                Ok(())
            }
            Operation::RdmaReadRequest => {
                if self.resp.in_msg.is_some() || !self.access.contains(Access::REMOTE_READ) {
                    return Err(invalid());
                }
                let reth = packet.reth().ok_or_else(invalid)?;
                if u64::from(reth.len) > MAX_MESSAGE {
                    return Err(invalid());
                }
                let target = self.check_read(dev, reth)?;
                let n = reth.len.div_ceil(self.mtu).max(1);
                self.push_resource(Resource::Read {
                    first: psn,
                    last: psn.add(n - 1),
                    va: reth.va,
                    rkey: reth.rkey,
                    len: reth.len,
                });
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                self.resp.responses.push_back(Response::Read(ReadJob {
                    psn,
                    source: target.into(),
                    sent: 0,
                    len: reth.len,
                    msn: self.resp.msn,
                }));
                self.resp.epsn = psn.add(n);
                Ok(())
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                if self.resp.in_msg.is_some() || !self.access.contains(Access::REMOTE_ATOMIC) {
                    return Err(invalid());
                }
                let a = packet.atomic_eth().ok_or_else(invalid)?;
                if a.va % 8 != 0 {
                    return Err(invalid());
                }
                let (region, offset) = dev
                    .table
                    .check_remote(a.rkey, self.init.pd, a.va, 8, Access::REMOTE_ATOMIC)
                    .map_err(|_| Nak(NakCode::RemoteAccessError))?;
                let atomic = if op == Operation::CompareSwap {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = mem.atomic(region, offset, atomic);
                self.push_resource(Resource::Atomic { psn, orig });
                self.resp.msn = (self.resp.msn + 1) & 0x00ff_ffff;
                self.resp.responses.push_back(Response::AtomicAck {
                    psn,
                    orig,
                    msn: self.resp.msn,
                });
                self.resp.epsn = psn.next();
                Ok(())
            }
            // Invalidation, FLUSH and ATOMIC WRITE are not implemented: refused as invalid.
            _ => Err(invalid()),
        }
    }

    pub(super) fn check_read(
        &self,
        dev: &DeviceState,
        reth: Reth,
    ) -> Result<Option<(RegionId, u64)>, Nak> {
        if reth.len == 0 {
            return Ok(None);
        }
        dev.table
            .check_remote(
                reth.rkey,
                self.init.pd,
                reth.va,
                reth.len.into(),
                Access::REMOTE_READ,
            )
            .map(Some)
            .map_err(|_| Nak(NakCode::RemoteAccessError))
    }

    pub(super) fn push_resource(&mut self, resource: Resource) {
        let capacity = usize::from(self.max_dest_rd_atomic.max(1)).next_power_of_two();
        while self.resp.resources.len() >= capacity {
            self.resp.resources.pop_front();
        }
        self.resp.resources.push_back(resource);
    }

    /// A request with a PSN already executed: re-ACK a SEND or WRITE, replay a READ or an
    /// atomic from the resource ring, drop anything else.
    pub(super) fn handle_duplicate(&mut self, packet: &Packet<&[u8]>, dev: &DeviceState) {
        let psn = packet.psn();
        match packet.opcode().operation() {
            Operation::RdmaReadRequest => {
                let Some(reth) = packet.reth() else { return };
                let mtu = u64::from(self.mtu);
                let found = self.resp.resources.iter().rev().find_map(|r| match *r {
                    Resource::Read {
                        first,
                        last,
                        va,
                        rkey,
                        len,
                    } if psn.in_window(first, first.steps_to(last) + 1) => {
                        Some((first, va, rkey, len))
                    }
                    _ => None,
                });
                let Some((first, va, rkey, len)) = found else {
                    return;
                };
                // Any part of the READ from `psn` on, as IBTA lets a requester ask again for
                // only the responses it lost (rxe serves such parts too).
                let skip = u64::from(first.steps_to(psn)) * mtu;
                let expected_va = va.wrapping_add(skip);
                let fits = rkey == reth.rkey
                    && reth.va == expected_va
                    && (reth.len > 0 || len == 0)
                    && u64::from(reth.len) + skip <= u64::from(len);
                if !fits {
                    return;
                }
                // The region may have gone since: check again.
                let Ok(target) = self.check_read(dev, reth) else {
                    return;
                };
                self.resp.responses.push_back(Response::Read(ReadJob {
                    psn,
                    source: target.into(),
                    sent: 0,
                    len: reth.len,
                    msn: self.resp.msn,
                }));
            }
            Operation::CompareSwap | Operation::FetchAdd => {
                let orig = self.resp.resources.iter().rev().find_map(|r| match *r {
                    Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                    _ => None,
                });
                if let Some(orig) = orig {
                    self.resp.responses.push_back(Response::AtomicAck {
                        psn,
                        orig,
                        msn: self.resp.msn,
                    });
                }
            }
            // A copy that asks for an ACK gets one of its own, as rxe's responder answers
            // every duplicate SEND or WRITE packet: an early resend's probe asks on each of
            // its packets, and its requester counts the ACKs (one per probe packet when only
            // an ACK was lost, one more when the original also reached a slow responder).
            _ if packet.ack_req() => self.push_own_ack(self.resp.epsn.sub(1)),
            _ => self.push_ack(self.resp.epsn.sub(1)),
        }
    }

    /// UC: no ACKs; a gap or an out-of-sequence opcode abandons the message in progress.
    pub(super) fn handle_uc_request(
        &mut self,
        packet: &Packet<&[u8]>,
        dev: &mut DeviceState,
        mem: &mut dyn Memory,
    ) {
        let psn = packet.psn();
        let opcode = packet.opcode();
        if psn != self.resp.epsn {
            dev.counters.out_of_seq_request += 1;
            self.abandon_uc(dev);
        }
        self.resp.epsn = psn.next();
        if self.resp.in_msg.is_none() && !opcode.is_first() {
            // The rest of a message whose start was lost.
            return;
        }
        let with_imm = packet.imm().is_some();
        let needs_wqe = (opcode.is_first() && opcode.operation_is_send()) || with_imm;
        if needs_wqe && !self.has_recv(dev) && !matches!(self.resp.in_msg, Some(InMsg::Send { .. }))
        {
            dev.counters.uc_dropped_msgs += 1;
            self.resp.in_msg = None;
            return;
        }
        // UC reuses the RC execution, minus ACKs; failures drop the message silently.
        let before = self.resp.responses.len();
        let filtered = dev.counters.write_filtered;
        let result = self.execute(packet, dev, mem);
        self.resp.responses.truncate(before);
        if let Err(nak) = result {
            // A filter's refusal is counted as `write_filtered` already.
            if nak.0 == NakCode::RemoteAccessError && dev.counters.write_filtered == filtered {
                dev.counters.uc_access_err += 1;
            }
            dev.counters.uc_dropped_msgs += 1;
            self.abandon_uc(dev);
            self.resp.epsn = psn.next();
        }
    }

    pub(super) fn abandon_uc(&mut self, dev: &mut DeviceState) {
        match self.resp.in_msg.take() {
            Some(InMsg::Send { wqe, .. }) => {
                // The receive request is reused for the next message.
                self.return_recv(dev, wqe);
                dev.counters.uc_dropped_msgs += 1;
            }
            Some(InMsg::Write { .. }) => dev.counters.uc_dropped_msgs += 1,
            None => {}
        }
    }
}
