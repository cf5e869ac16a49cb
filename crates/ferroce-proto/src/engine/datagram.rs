//! UD queue pairs, both ways: a send is one SEND ONLY packet with a DETH to the destination its
//! work request names, complete once it leaves; a receive is checked for its Q_Key and length
//! and lands after the 40-byte header that verbs applications read the sender from. Nothing is
//! acknowledged or resent, and a datagram with no receive posted is dropped and counted.

use super::*;

impl Qp {
    /// Builds the next datagram into `buf` and says where it goes; its request completes now.
    pub(super) fn next_datagram(
        &mut self,
        dev: &mut DeviceState,
        mem: &dyn Memory,
        buf: &mut [u8],
    ) -> Option<(usize, SocketAddr)> {
        if self.state != QpState::Rts {
            return None;
        }
        let wqe = self.sq.front()?;
        if let Some(status) = wqe.fault {
            self.fail_front(dev, status);
            return None;
        }
        // Every UD request has a destination: `post_send` refuses one without.
        let dest = wqe.dest?;
        let imm = match wqe.op {
            SendOp::SendWithImm(imm) => Some(imm),
            _ => None,
        };
        let opcode = if imm.is_some() {
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
        } else {
            Opcode::UD_SEND_ONLY
        };
        let mut bth = Bth::new(opcode, dest.qpn, self.req_psn);
        bth.solicited = wqe.solicited;
        // rxe asks for an ACK on QP 1's MADs (receivers ignore it); captures then compare.
        bth.ack_req = self.is_gsi();
        let qkey = if self.is_gsi() {
            GSI_QKEY
        } else if dest.qkey & 0x8000_0000 != 0 {
            // IBTA C10-15: a Q_Key with the top bit set means the QP's own.
            self.qkey
        } else {
            dest.qkey
        };
        let mut repr = PacketRepr::new(bth);
        repr.deth = Some(Deth {
            qkey,
            src_qp: self.qpn,
        });
        repr.imm = imm;
        repr.payload_len = wqe.len as usize;
        let header_len = repr.emit_headers(buf).ok()?;
        let end = header_len + repr.payload_len;
        match &wqe.data {
            WqeData::Segs(segs) => gather(segs, 0, &mut buf[header_len..end], mem),
            WqeData::Inline(bytes) => buf[header_len..end].copy_from_slice(bytes),
        }
        let len = repr.buffer_len();
        buf[end..len].fill(0);
        self.req_psn = self.req_psn.next();
        self.sent_psn = self.req_psn;
        self.comp_psn = self.req_psn;
        let wqe = self.sq.pop_front()?;
        self.complete_send(dev, &wqe, WcStatus::Success);
        Some((len, dest.peer))
    }

    /// A datagram for this UD queue pair, its ICRC checked; `ip` is the IP header it arrived
    /// with (the IPv4 ID as sent).
    pub(super) fn handle_datagram(
        &mut self,
        packet: &Packet<&[u8]>,
        ip: &IpHeader,
        dev: &mut DeviceState,
        mem: &mut dyn Memory,
    ) {
        let Some(deth) = packet.deth() else {
            dev.counters.malformed_pkts += 1;
            return;
        };
        if deth.qkey != self.qkey {
            dev.counters.qkey_err += 1;
            return;
        }
        let payload = packet.payload();
        if payload.len() > dev.port_mtu as usize {
            dev.counters.ud_too_long += 1;
            return;
        }
        let Some(wqe) = self.take_recv(dev) else {
            dev.counters.ud_no_recv += 1;
            return;
        };
        let total = (UD_GRH_LEN + payload.len()) as u64;
        let status = if let Some(fault) = wqe.fault {
            fault
        } else if total > wqe.len {
            dev.counters.ud_len_err += 1;
            WcStatus::LocLenErr
        } else {
            scatter(
                &wqe.segs,
                0,
                &received_header(ip, packet.as_bytes().len()),
                mem,
            );
            scatter(&wqe.segs, UD_GRH_LEN as u64, payload, mem);
            dev.counters.rdma_recvs += 1;
            WcStatus::Success
        };
        let success = status == WcStatus::Success;
        let completion = Completion {
            wr_id: wqe.wr_id,
            status,
            opcode: WcOpcode::Recv,
            byte_len: if success { total as u32 } else { 0 },
            imm: packet.imm().filter(|_| success),
            qpn: self.qpn,
            ud: Some(UdSource {
                qpn: deth.src_qp,
                ip: ip.src(),
            }),
        };
        self.push_recv_completion(dev, completion, packet.solicited());
    }
}

/// The 40 bytes a UD receive begins with (rxe's layout, which `ibv_init_ah_from_wc` reads):
/// for IPv4, 20 zero bytes and the IPv4 header as it arrived, checksum included; for IPv6,
/// the IPv6 header. `roce_len` is the UDP payload's length (BTH to ICRC).
pub(super) fn received_header(ip: &IpHeader, roce_len: usize) -> [u8; UD_GRH_LEN] {
    let mut headers = [0; UD_GRH_LEN + UdpHeader::LEN];
    let udp = UdpHeader {
        src_port: 0,
        dst_port: ROCE_PORT,
    };
    let mut out = [0; UD_GRH_LEN];
    if Datagram::emit_headers(ip, &udp, roce_len, &mut headers).is_ok() {
        match ip {
            IpHeader::V4(_) => out[20..].copy_from_slice(&headers[..20]),
            IpHeader::V6(_) => out.copy_from_slice(&headers[..UD_GRH_LEN]),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Ipv4Header;
    use std::net::Ipv4Addr;

    #[test]
    fn an_ipv4_receive_header_is_twenty_zeros_then_the_header_with_its_checksum() {
        let mut v4 = Ipv4Header::new(Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        v4.id = 0x1234;
        let grh = received_header(&IpHeader::V4(v4), 100);
        assert_eq!(grh[..20], [0; 20]);
        let h = &grh[20..];
        assert_eq!(h[0], 0x45);
        assert_eq!(
            u16::from_be_bytes([h[2], h[3]]),
            20 + 8 + 100,
            "total length"
        );
        assert_eq!(
            u16::from_be_bytes([h[4], h[5]]),
            0x1234,
            "the ID as it arrived"
        );
        assert_eq!(h[6], 0x40, "DF");
        assert_eq!((h[8], h[9]), (64, 17));
        assert_eq!(h[12..16], [10, 0, 0, 1]);
        assert_eq!(h[16..20], [10, 0, 0, 2]);
        // A valid header sums to 0xffff (libibverbs checks it when byte 0 is ambiguous).
        let sum = h
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum::<u32>();
        let folded = (sum & 0xffff) + (sum >> 16);
        assert_eq!(folded, 0xffff);
    }

    #[test]
    fn an_ipv6_receive_header_is_the_ipv6_header() {
        let src = "fd00::1".parse().unwrap();
        let dst = "fd00::2".parse().unwrap();
        let grh = received_header(&IpHeader::V6(crate::wire::Ipv6Header::new(src, dst)), 64);
        assert_eq!(grh[0] >> 4, 6);
        assert_eq!(
            u16::from_be_bytes([grh[4], grh[5]]),
            8 + 64,
            "payload length"
        );
        assert_eq!(grh[6], 17);
        assert_eq!(grh[8..24], src.octets());
        assert_eq!(grh[24..40], dst.octets());
    }
}
