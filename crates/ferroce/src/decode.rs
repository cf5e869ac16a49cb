//! Decoding the RoCEv2 packets of a capture into records: what `ferroce decode` prints.
//!
//! [`decode_frame`] picks out UDP datagrams to the RoCE port, parses them with the wire layer
//! and checks each ICRC against the IP and UDP headers the capture holds. A [`Record`] prints
//! as one line of text (its `Display`) or serialises to one JSON object whose keys are the
//! ones `ferroce decode --json` documents; a packet that does not parse keeps the fields that
//! could be read and says why in `error`.

use std::fmt;
use std::net::IpAddr;

use ferroce_proto::wire::{self, icrc, Datagram, Packet, Syndrome};
use serde::Serialize;

use crate::capture::Frame;

/// Whether a packet's ICRC matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IcrcStatus {
    /// The carried ICRC equals the one computed from the headers and payload.
    Ok,
    /// It does not (or the packet is too short to carry one).
    Bad,
}

/// The RETH fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct RethFields {
    pub va: u64,
    pub rkey: u32,
    pub len: u32,
}

/// The AETH fields of a record: the raw syndrome byte and the MSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct AethFields {
    pub syndrome: u8,
    pub msn: u32,
}

/// The AtomicETH fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct AtomicFields {
    pub va: u64,
    pub rkey: u32,
    pub swap_add: u64,
    pub compare: u64,
}

/// The AtomicAckETH fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct AtomicAckFields {
    pub orig: u64,
}

/// The DETH fields of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[allow(missing_docs)]
pub struct DethFields {
    pub qkey: u32,
    pub src_qp: u32,
}

/// One decoded RoCE packet. Absent headers are `None` and left out of the JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Record {
    /// The frame's number in the capture, from 1.
    pub index: u64,
    /// IP source address.
    pub src: IpAddr,
    /// IP destination address.
    pub dst: IpAddr,
    /// UDP source port.
    pub udp_src: u16,
    /// UDP destination port (the RoCE port the capture was filtered on; not in the JSON).
    #[serde(skip)]
    pub udp_dst: u16,
    /// The BTH opcode byte.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opcode: Option<u8>,
    /// The opcode's name, e.g. `RC_RDMA_WRITE_FIRST`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opcode_name: Option<&'static str>,
    /// Destination QP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dest_qp: Option<u32>,
    /// PSN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psn: Option<u32>,
    /// AckReq.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack_req: Option<bool>,
    /// Solicited event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub se: Option<bool>,
    /// Pad count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad: Option<u8>,
    /// P_Key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pkey: Option<u16>,
    /// RETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<RethFields>,
    /// AETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<AethFields>,
    /// Immediate data, the big-endian value of its 4 bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imm: Option<u32>,
    /// AtomicETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic: Option<AtomicFields>,
    /// AtomicAckETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack: Option<AtomicAckFields>,
    /// IETH: the R_Key to invalidate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<u32>,
    /// DETH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<DethFields>,
    /// Payload bytes, without pad and ICRC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload_len: Option<usize>,
    /// The ICRC check; absent only when the IP or UDP header itself is unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub icrc: Option<IcrcStatus>,
    /// Why the packet did not parse.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Record {
    fn empty(index: u64, src: IpAddr, dst: IpAddr, udp_src: u16, udp_dst: u16) -> Self {
        Self {
            index,
            src,
            dst,
            udp_src,
            udp_dst,
            opcode: None,
            opcode_name: None,
            dest_qp: None,
            psn: None,
            ack_req: None,
            se: None,
            pad: None,
            pkey: None,
            reth: None,
            aeth: None,
            imm: None,
            atomic: None,
            atomic_ack: None,
            ieth: None,
            deth: None,
            payload_len: None,
            icrc: None,
            error: None,
        }
    }

    /// Whether this packet counts against `ferroce decode`'s exit status: a bad ICRC or a
    /// parse error.
    #[must_use]
    pub fn is_faulty(&self) -> bool {
        self.error.is_some() || self.icrc != Some(IcrcStatus::Ok)
    }

    fn fill(&mut self, packet: &Packet<&[u8]>) {
        let bth = packet.bth();
        self.dest_qp = Some(bth.dest_qp.value());
        self.psn = Some(bth.psn.value());
        self.ack_req = Some(bth.ack_req);
        self.se = Some(bth.solicited);
        self.pad = Some(packet.pad());
        self.pkey = Some(bth.pkey);
        self.reth = packet.reth().map(|r| RethFields {
            va: r.va,
            rkey: r.rkey,
            len: r.len,
        });
        self.aeth = packet.aeth().map(|a| AethFields {
            syndrome: a.syndrome.to_byte(),
            msn: a.msn,
        });
        self.imm = packet.imm();
        self.atomic = packet.atomic_eth().map(|a| AtomicFields {
            va: a.va,
            rkey: a.rkey,
            swap_add: a.swap_add,
            compare: a.compare,
        });
        self.atomic_ack = packet
            .atomic_ack()
            .map(|a| AtomicAckFields { orig: a.orig });
        self.ieth = packet.ieth();
        self.deth = packet.deth().map(|d| DethFields {
            qkey: d.qkey,
            src_qp: d.src_qp.value(),
        });
        self.payload_len = Some(packet.payload().len());
    }
}

/// The addresses and UDP ports of an IP packet, read from fixed offsets without validating
/// anything else: enough to tell a RoCE packet from other traffic even when its headers are
/// damaged.
fn peek(ip: &[u8]) -> Option<(IpAddr, IpAddr, u16, u16)> {
    let octets4 = |at: usize| -> Option<[u8; 4]> { ip.get(at..at + 4)?.try_into().ok() };
    let octets16 = |at: usize| -> Option<[u8; 16]> { ip.get(at..at + 16)?.try_into().ok() };
    let port = |at: usize| Some(u16::from_be_bytes([*ip.get(at)?, *ip.get(at + 1)?]));
    match ip.first()? >> 4 {
        4 => {
            let udp = usize::from(ip[0] & 0x0f) * 4;
            if *ip.get(9)? != 17 || udp < 20 {
                return None;
            }
            let (src, dst) = (octets4(12)?, octets4(16)?);
            Some((src.into(), dst.into(), port(udp)?, port(udp + 2)?))
        }
        6 => {
            if *ip.get(6)? != 17 {
                return None;
            }
            let (src, dst) = (octets16(8)?, octets16(24)?);
            Some((src.into(), dst.into(), port(40)?, port(42)?))
        }
        _ => None,
    }
}

/// Decodes one frame: `None` when it is not a UDP datagram to `port`, else the record of the
/// RoCE packet it carries (with `error` set when it does not parse).
#[must_use]
pub fn decode_frame(frame: &Frame, port: u16) -> Option<Record> {
    let ip = frame.ip_packet()?;
    let (src, dst, udp_src, udp_dst) = peek(ip)?;
    if udp_dst != port {
        return None;
    }
    let mut record = Record::empty(frame.index, src, dst, udp_src, udp_dst);
    let datagram = match Datagram::parse(ip) {
        Ok(d) => d,
        Err(e) => {
            let snapped = frame.data.len() < frame.original_len as usize;
            record.error = Some(if snapped {
                format!("{e} (the capture's snap length cut the frame)")
            } else {
                e.to_string()
            });
            return Some(record);
        }
    };
    let bytes = datagram.payload;
    record.opcode = bytes.first().copied();
    record.opcode_name = record
        .opcode
        .and_then(wire::Opcode::new)
        .map(wire::Opcode::name);
    record.icrc = Some(if icrc::verify(&datagram.ip, &datagram.udp, bytes) {
        IcrcStatus::Ok
    } else {
        IcrcStatus::Bad
    });
    match Packet::new_checked(bytes) {
        Ok(packet) => record.fill(&packet),
        Err(e) => record.error = Some(e.to_string()),
    }
    Some(record)
}

fn hex_or_dash(v: Option<u32>, width: usize) -> String {
    v.map_or_else(|| "-".into(), |v| format!("0x{v:0width$x}"))
}

impl fmt::Display for Record {
    /// One line: index, endpoints, opcode, QP, PSN, AckReq, extension headers, payload
    /// length, ICRC and any error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let endpoint = |ip: IpAddr, port: u16| match ip {
            IpAddr::V6(a) => format!("[{a}]:{port}"),
            IpAddr::V4(a) => format!("{a}:{port}"),
        };
        write!(
            f,
            "{:>6} {} → {} ",
            self.index,
            endpoint(self.src, self.udp_src),
            endpoint(self.dst, self.udp_dst),
        )?;
        match (self.opcode_name, self.opcode) {
            (Some(name), _) => write!(f, "{name}")?,
            (None, Some(op)) => write!(f, "opcode 0x{op:02x}")?,
            (None, None) => write!(f, "-")?,
        }
        if self.dest_qp.is_some() {
            write!(
                f,
                " qp={} psn={} ack={}",
                hex_or_dash(self.dest_qp, 6),
                hex_or_dash(self.psn, 6),
                u8::from(self.ack_req == Some(true)),
            )?;
        }
        if self.se == Some(true) {
            write!(f, " se=1")?;
        }
        if let Some(d) = &self.deth {
            write!(f, " deth{{qkey=0x{:x} src_qp=0x{:06x}}}", d.qkey, d.src_qp)?;
        }
        if let Some(r) = &self.reth {
            write!(
                f,
                " reth{{va=0x{:x} rkey=0x{:x} len={}}}",
                r.va, r.rkey, r.len
            )?;
        }
        if let Some(a) = &self.atomic {
            write!(
                f,
                " atomic{{va=0x{:x} rkey=0x{:x} swap_add=0x{:x} compare=0x{:x}}}",
                a.va, a.rkey, a.swap_add, a.compare
            )?;
        }
        if let Some(a) = &self.aeth {
            let syndrome = Syndrome::from_byte(a.syndrome);
            write!(f, " aeth{{{syndrome} msn={}}}", a.msn)?;
        }
        if let Some(a) = &self.atomic_ack {
            write!(f, " atomic_ack{{orig=0x{:x}}}", a.orig)?;
        }
        if let Some(imm) = self.imm {
            write!(f, " imm=0x{imm:08x}")?;
        }
        if let Some(rkey) = self.ieth {
            write!(f, " ieth{{rkey=0x{rkey:x}}}")?;
        }
        if let Some(len) = self.payload_len {
            write!(f, " payload={len}")?;
        }
        match self.icrc {
            Some(IcrcStatus::Ok) => write!(f, " icrc=ok")?,
            Some(IcrcStatus::Bad) => write!(f, " icrc=bad")?,
            None => {}
        }
        if let Some(e) = &self.error {
            write!(f, " error: {e}")?;
        }
        Ok(())
    }
}
