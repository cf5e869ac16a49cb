//! Decoding the RoCEv2 packets of a capture into records: what `ferroce decode` prints.
//!
//! [`decode_frame`] picks out UDP datagrams to the RoCE port, parses them with the wire layer
//! and checks each ICRC against the IP and UDP headers the capture holds. A [`Record`] prints
//! as one line of text (its `Display`) or serialises to one JSON object whose keys are the
//! ones `ferroce decode --json` documents; a packet that does not parse keeps the fields that
//! could be read and says why in `error`.
//!
//! A UD SEND to QP 1 whose payload is a MAD of the CM class is also read as a CM message
//! ([`CmFields`]); a MAD that does not parse as one gets `cm_error`, and the packet still
//! counts as a good RoCE packet.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use ferroce_proto::cm::{CmMessage, CmaHeader, MadHeader, ServiceId, MGMT_CLASS_CM};
use ferroce_proto::wire::{icrc, Datagram, Opcode, Packet, Qpn, Syndrome};
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

/// The rdma_cm header at the start of a REQ's or SIDR_REQ's private data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CmaFields {
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's address.
    pub src: IpAddr,
    /// The address it connects to.
    pub dst: IpAddr,
}

/// A CM message carried in a MAD to QP 1: its name, its IDs and its main fields. Fields the
/// message does not have are `None` and left out of the JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CmFields {
    /// The message as IBTA names it: `REQ`, `MRA`, `REJ`, `REP`, `RTU`, `DREQ`, `DREP`,
    /// `SIDR_REQ`, `SIDR_REP`, `LAP` or `APR`.
    pub message: &'static str,
    /// The MAD's transaction ID.
    pub transaction_id: u64,
    /// The sender's communication ID (all but SIDR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_comm_id: Option<u32>,
    /// The receiver's communication ID (all but REQ and SIDR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_comm_id: Option<u32>,
    /// The SIDR request ID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<u32>,
    /// The service ID (REQ, SIDR_REQ, SIDR_REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_id: Option<u64>,
    /// The sender's CA GUID (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_guid: Option<u64>,
    /// The sender's QPN (REQ, REP), or the QPN resolved (SIDR_REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qpn: Option<u32>,
    /// The QPN being disconnected (DREQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_qpn: Option<u32>,
    /// The sender's Q_Key (REQ, REP), or the Q_Key resolved (SIDR_REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qkey: Option<u32>,
    /// The starting PSN (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starting_psn: Option<u32>,
    /// Responder resources (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub responder_resources: Option<u8>,
    /// Initiator depth (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initiator_depth: Option<u8>,
    /// The transport retry count (REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_count: Option<u8>,
    /// The RNR retry count (REQ, REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rnr_retry_count: Option<u8>,
    /// The path MTU in bytes (REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The partition key (REQ, SIDR_REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pkey: Option<u16>,
    /// The primary path's local GID (REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_gid: Option<Ipv6Addr>,
    /// The primary path's remote GID (REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_gid: Option<Ipv6Addr>,
    /// The primary path's hop limit (REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hop_limit: Option<u8>,
    /// The primary path's local ACK timeout code (REQ).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_ack_timeout: Option<u8>,
    /// The target ACK delay code (REP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_ack_delay: Option<u8>,
    /// Which message is rejected (REJ) or acknowledged (MRA): 0 REQ, 1 REP, 2 other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_code: Option<u8>,
    /// The MRA's service timeout code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_timeout: Option<u8>,
    /// The REJ reason code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<u16>,
    /// The REJ reason in words, e.g. `invalid service ID`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_name: Option<String>,
    /// The SIDR_REP status code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u8>,
    /// The SIDR_REP status in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_name: Option<String>,
    /// The rdma_cm header of a REQ or SIDR_REQ whose service ID is rdma_cm's and whose
    /// private data starts with a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cma: Option<CmaFields>,
}

impl CmFields {
    /// The fields of a parsed CM MAD.
    #[must_use]
    pub fn new(header: &MadHeader, message: &CmMessage) -> Self {
        let mut f = Self {
            message: message.name(),
            transaction_id: header.transaction_id,
            local_comm_id: message.local_comm_id(),
            remote_comm_id: message.remote_comm_id(),
            request_id: message.request_id(),
            service_id: message.service_id().map(u64::from),
            ca_guid: None,
            qpn: None,
            remote_qpn: None,
            qkey: None,
            starting_psn: None,
            responder_resources: None,
            initiator_depth: None,
            retry_count: None,
            rnr_retry_count: None,
            mtu: None,
            pkey: None,
            local_gid: None,
            remote_gid: None,
            hop_limit: None,
            local_ack_timeout: None,
            target_ack_delay: None,
            message_code: None,
            service_timeout: None,
            reason: None,
            reason_name: None,
            status: None,
            status_name: None,
            cma: None,
        };
        let cma = |sid: ServiceId, private: &[u8]| {
            sid.port_space()?;
            let h = CmaHeader::parse(private).ok()?;
            Some(CmaFields {
                src_port: h.src_port,
                src: h.src,
                dst: h.dst,
            })
        };
        match message {
            CmMessage::Req(m) => {
                f.ca_guid = Some(m.local_ca_guid);
                f.qpn = Some(m.local_qpn.value());
                f.qkey = Some(m.local_qkey);
                f.starting_psn = Some(m.starting_psn.value());
                f.responder_resources = Some(m.responder_resources);
                f.initiator_depth = Some(m.initiator_depth);
                f.retry_count = Some(m.retry_count);
                f.rnr_retry_count = Some(m.rnr_retry_count);
                f.mtu = Some(m.path_mtu.bytes());
                f.pkey = Some(m.pkey);
                f.local_gid = Some(m.primary_path.local_gid);
                f.remote_gid = Some(m.primary_path.remote_gid);
                f.hop_limit = Some(m.primary_path.hop_limit);
                f.local_ack_timeout = Some(m.primary_path.local_ack_timeout);
                f.cma = cma(m.service_id, &m.private_data.0);
            }
            CmMessage::Rep(m) => {
                f.ca_guid = Some(m.local_ca_guid);
                f.qpn = Some(m.local_qpn.value());
                f.qkey = Some(m.local_qkey);
                f.starting_psn = Some(m.starting_psn.value());
                f.responder_resources = Some(m.responder_resources);
                f.initiator_depth = Some(m.initiator_depth);
                f.rnr_retry_count = Some(m.rnr_retry_count);
                f.target_ack_delay = Some(m.target_ack_delay);
            }
            CmMessage::Rej(m) => {
                f.message_code = Some(m.message_rejected.code());
                f.reason = Some(m.reason.code());
                f.reason_name = Some(m.reason.to_string());
            }
            CmMessage::Mra(m) => {
                f.message_code = Some(m.message_mraed.code());
                f.service_timeout = Some(m.service_timeout);
            }
            CmMessage::Dreq(m) => f.remote_qpn = Some(m.remote_qpn.value()),
            CmMessage::SidrReq(m) => {
                f.pkey = Some(m.pkey);
                f.cma = cma(m.service_id, &m.private_data.0);
            }
            CmMessage::SidrRep(m) => {
                f.qpn = Some(m.qpn.value());
                f.qkey = Some(m.qkey);
                f.status = Some(m.status.code());
                f.status_name = Some(m.status.to_string());
            }
            CmMessage::Rtu(_) | CmMessage::Drep(_) | CmMessage::Lap(_) | CmMessage::Apr(_) => {}
        }
        f
    }
}

impl fmt::Display for CmFields {
    /// The short form: `cm{REQ lcid=0x… sid=0x… qpn=0x… psn=0x…}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cm{{{}", self.message)?;
        if let Some(id) = self.local_comm_id {
            write!(f, " lcid=0x{id:08x}")?;
        }
        if let Some(id) = self.remote_comm_id {
            write!(f, " rcid=0x{id:08x}")?;
        }
        if let Some(id) = self.request_id {
            write!(f, " rid=0x{id:08x}")?;
        }
        if let Some(sid) = self.service_id {
            write!(f, " sid=0x{sid:016x}")?;
        }
        if let Some(qpn) = self.qpn {
            write!(f, " qpn=0x{qpn:06x}")?;
        }
        if let Some(qpn) = self.remote_qpn {
            write!(f, " rqpn=0x{qpn:06x}")?;
        }
        if let Some(psn) = self.starting_psn {
            write!(f, " psn=0x{psn:06x}")?;
        }
        if let Some(timeout) = self.service_timeout {
            write!(f, " timeout={timeout}")?;
        }
        if let (Some(code), Some(name)) = (self.reason, &self.reason_name) {
            write!(f, " reason={code} ({name})")?;
        }
        if let (Some(code), Some(name)) = (self.status, &self.status_name) {
            write!(f, " status={code} ({name})")?;
        }
        write!(f, "}}")
    }
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
    /// The CM message of a UD SEND to QP 1 that carries a CM MAD.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cm: Option<CmFields>,
    /// Why a MAD of the CM class sent to QP 1 is not a valid CM message. It does not make
    /// the packet faulty: the RoCE packet itself parsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cm_error: Option<String>,
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
            cm: None,
            cm_error: None,
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
        self.fill_cm(packet);
    }

    /// Reads a CM message from a UD SEND to QP 1 whose payload has the CM management class
    /// (MAD byte 1); other MADs to QP 1 and other packets are left alone.
    fn fill_cm(&mut self, packet: &Packet<&[u8]>) {
        let opcode = packet.opcode();
        let ud_send =
            opcode == Opcode::UD_SEND_ONLY || opcode == Opcode::UD_SEND_ONLY_WITH_IMMEDIATE;
        let payload = packet.payload();
        if !ud_send || packet.dest_qp() != Qpn::GSI || payload.get(1) != Some(&MGMT_CLASS_CM) {
            return;
        }
        match CmMessage::parse(payload) {
            Ok((header, message)) => self.cm = Some(CmFields::new(&header, &message)),
            Err(e) => self.cm_error = Some(e.to_string()),
        }
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
    record.opcode_name = record.opcode.and_then(Opcode::new).map(Opcode::name);
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
        if let Some(cm) = &self.cm {
            write!(f, " {cm}")?;
        }
        if let Some(e) = &self.cm_error {
            write!(f, " cm_error: {e}")?;
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
