//! The connection manager's state machine, sans I/O: the exchanges of IBTA chapter 12 as
//! Linux's `ib_cm` runs them, driven like the engine by MADs, time and commands in, and MADs,
//! events and a next timeout out.
//!
//! One [`CmEndpoint`] serves one NIC's GSI. A connection is identified by its local
//! communication ID ([`CommId`]). The active side [`CmEndpoint::connect`]s (REQ), gets
//! [`CmEvent::Reply`] (REP), brings its QP up and calls [`CmEndpoint::establish`] (RTU). The
//! passive side [`CmEndpoint::listen`]s, gets [`CmEvent::ConnectRequest`], brings its QP up
//! and [`CmEndpoint::accept`]s (REP) or [`CmEndpoint::reject`]s (REJ); an RTU, or its first
//! data packet when the RTU is lost ([`CmEndpoint::data_arrived`]), makes it
//! [`CmEvent::Established`]. Either side [`CmEndpoint::disconnect`]s (DREQ, DREP). UD
//! endpoints are resolved by SIDR ([`CmEndpoint::resolve`], [`CmEndpoint::sidr_reply`]).
//!
//! Unanswered requests are resent at the kernel's intervals until their retries run out; an
//! MRA stretches the wait; a duplicate REQ that finds the application still deciding draws an
//! MRA; a closed connection waits out timewait, during which a REQ reusing its peer's QP
//! number is refused as stale (REJ 10). Every MAD that fits no state is counted by name, never
//! a panic.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::{
    CmMessage, CmaHeader, Drep, Dreq, FixedBytes, MessageKind, Mra, Mtu, PathInfo, PortSpace, Rej,
    RejectReason, Rep, Req, Rtu, ServiceId, SidrRep, SidrReq, SidrStatus, TransportType, MAD_LEN,
};
use crate::wire::Qpn;
use crate::Psn;

/// The packet lifetime rdma_cm assumes on RoCE (Debian 12's kernel: `CMA_IBOE_PACKET_LIFETIME`
/// 18, about 1 s).
pub const PACKET_LIFETIME: u8 = 18;
/// The CM response timeout ferroce announces and expects (4.096 µs × 2^20, about 4 s).
pub const CM_RESPONSE_TIMEOUT: u8 = 20;
/// How often a request is resent before the peer counts as unreachable (the kernel's 15).
pub const MAX_CM_RETRIES: u8 = 15;
/// The local ACK timeout a REQ carries for the path: the kernel's for a packet lifetime of 18
/// (0x13, about 2.1 s).
pub const PATH_ACK_TIMEOUT: u8 = 19;
/// How often a DREQ is resent before the connection counts as closed anyway. Fewer than a
/// REQ's: a DREQ is a courtesy (the peer's QP times out by itself), and the kernel was seen,
/// in the lab under loss, to answer a first DREQ whose DREP was lost and none of its resends,
/// which cost its closer the whole REQ budget (a minute) for nothing.
pub const DREQ_RETRIES: u8 = 3;
/// The MRA service timeout ferroce sends while its application decides (2^24 × 4.096 µs,
/// about 69 s, as rdma_cm's delayed MRA).
pub const MRA_SERVICE_TIMEOUT: u8 = 24;
/// How long a closed connection's peer QP number stays stale.
pub const TIMEWAIT: Duration = Duration::from_millis(2048);

/// A time in IBTA's encoding (4.096 µs × 2^t) the way the kernel rounds it: 2^(t−8) ms.
#[must_use]
pub fn cm_time(t: u8) -> Duration {
    Duration::from_millis(1 << t.saturating_sub(8).min(31))
}

/// A connection's local communication ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommId(pub u32);

/// What the active side puts in its REQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectParams {
    /// Whom to connect to (its GSI); the REQ's remote GID.
    pub to: IpAddr,
    /// The service (rdma_cm: port space and port).
    pub service_id: ServiceId,
    /// The connecting QP.
    pub qpn: Qpn,
    /// The PSN the connecting QP expects to receive first (the kernel's `rq_psn`): the PSN
    /// the passive side will send with.
    pub starting_psn: Psn,
    /// READs and atomics the connecting QP serves at once (responder resources).
    pub responder_resources: u8,
    /// READs and atomics the connecting QP issues at once (initiator depth).
    pub initiator_depth: u8,
    /// Retries the passive QP makes after timeouts (0–7).
    pub retry_count: u8,
    /// Retries the passive QP makes after RNR NAKs towards the connecting one (0–7).
    pub rnr_retry_count: u8,
    /// The path MTU: at most what the connecting side's link carries.
    pub mtu: Mtu,
    /// RC or UC.
    pub transport: TransportType,
    /// Whether the connecting QP takes its receives from an SRQ.
    pub srq: bool,
    /// Private data: up to 92 bytes (rdma_cm's 36-byte header and 56 of the application's).
    pub private_data: FixedBytes<92>,
}

/// What the passive side puts in its REP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcceptParams {
    /// The accepting QP.
    pub qpn: Qpn,
    /// The PSN the accepting QP expects to receive first: the PSN the active side will send
    /// with.
    pub starting_psn: Psn,
    /// READs and atomics the accepting QP serves at once.
    pub responder_resources: u8,
    /// READs and atomics the accepting QP issues at once.
    pub initiator_depth: u8,
    /// Retries the active QP makes after RNR NAKs towards the accepting one (0–7).
    pub rnr_retry_count: u8,
    /// Whether the accepting QP takes its receives from an SRQ.
    pub srq: bool,
    /// Private data: up to 196 bytes.
    pub private_data: FixedBytes<196>,
}

/// What the machine tells its driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ for a service listened on: bring a QP up ([`QpParams::passive`]), then accept
    /// or reject.
    ConnectRequest {
        /// The new connection.
        id: CommId,
        /// Who sent it.
        from: IpAddr,
        /// The request.
        req: Req,
    },
    /// The passive side's REP: bring the QP up ([`QpParams::active`]), then
    /// [`CmEndpoint::establish`].
    Reply {
        /// The connection.
        id: CommId,
        /// The reply.
        rep: Rep,
    },
    /// The connection is up on the passive side (RTU, or the first data).
    Established {
        /// The connection.
        id: CommId,
    },
    /// The peer refused (or the connection failed on its side).
    Rejected {
        /// The connection.
        id: CommId,
        /// Why.
        reason: RejectReason,
        /// The peer's private data.
        private_data: FixedBytes<148>,
    },
    /// A request of ours went unanswered through all its retries.
    Unreachable {
        /// The connection.
        id: CommId,
    },
    /// The connection is closed: by the peer's DREQ, or ours answered or unanswered.
    Disconnected {
        /// The connection.
        id: CommId,
    },
    /// A SIDR request for a UD service listened on: answer it with
    /// [`CmEndpoint::sidr_reply`].
    SidrRequest {
        /// The request's ID, to answer with.
        id: u32,
        /// Who sent it.
        from: IpAddr,
        /// The request.
        req: SidrReq,
    },
    /// The answer to our [`CmEndpoint::resolve`].
    SidrReply {
        /// Our request's ID.
        id: u32,
        /// The answer.
        rep: SidrRep,
    },
    /// Our SIDR request went unanswered.
    SidrUnreachable {
        /// Our request's ID.
        id: u32,
    },
}

/// The queue pair attributes a REQ and REP settle for one side (rdmacm.md §1.4): PSNs,
/// READ resources and retry counts cross over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpParams {
    /// The peer QP.
    pub dest_qpn: Qpn,
    /// The first PSN this side sends.
    pub sq_psn: Psn,
    /// The first PSN this side expects.
    pub rq_psn: Psn,
    /// The path MTU.
    pub mtu: Mtu,
    /// READs and atomics this side issues at once (`max_rd_atomic`).
    pub max_rd_atomic: u8,
    /// READs and atomics this side serves at once (`max_dest_rd_atomic`).
    pub max_dest_rd_atomic: u8,
    /// Retries after timeouts.
    pub retry_count: u8,
    /// Retries after RNR NAKs.
    pub rnr_retry_count: u8,
    /// The ACK timeout exponent.
    pub timeout: u8,
}

impl QpParams {
    /// The passive side's attributes from the REQ and what it accepts with.
    #[must_use]
    pub fn passive(req: &Req, accept: &AcceptParams) -> Self {
        Self {
            dest_qpn: req.local_qpn,
            sq_psn: req.starting_psn,
            rq_psn: accept.starting_psn,
            mtu: req.path_mtu,
            max_rd_atomic: accept.initiator_depth.min(req.responder_resources),
            max_dest_rd_atomic: accept.responder_resources,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            timeout: req.primary_path.local_ack_timeout,
        }
    }

    /// The active side's attributes from what it asked and the REP.
    #[must_use]
    pub fn active(asked: &ConnectParams, rep: &Rep) -> Self {
        Self {
            dest_qpn: rep.local_qpn,
            sq_psn: rep.starting_psn,
            rq_psn: asked.starting_psn,
            mtu: asked.mtu,
            max_rd_atomic: rep.responder_resources,
            max_dest_rd_atomic: rep.initiator_depth,
            retry_count: asked.retry_count,
            rnr_retry_count: rep.rnr_retry_count,
            timeout: PATH_ACK_TIMEOUT,
        }
    }
}

/// Why a command was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmCommandError {
    /// No connection has this ID (it was closed, rejected or never made).
    #[error("no connection {0:?}")]
    Unknown(CommId),
    /// The connection is not in a state the command applies to.
    #[error("connection {id:?} is {state}, which does not allow this")]
    WrongState {
        /// The connection.
        id: CommId,
        /// Its state.
        state: &'static str,
    },
    /// Someone listens on this service already.
    #[error("service {0} is listened on already")]
    InUse(ServiceId),
    /// No SIDR request of a peer has this ID.
    #[error("no SIDR request {0}")]
    UnknownSidr(u32),
}

/// MADs the machine refused or had no use for, by why.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CmCounters {
    /// MADs that did not parse as CM messages.
    pub malformed: u64,
    /// Duplicates of a message already handled (a resent REQ, REP or DREQ).
    pub duplicates: u64,
    /// Messages for no connection we know, or in a state that expects none (dropped, or
    /// answered with a REJ or DREP as the kernel does).
    pub unexpected: u64,
    /// DREQs naming a QP number other than the connection's (dropped, as the kernel does).
    pub dreq_wrong_qpn: u64,
    /// REQs refused: no listener (REJ 8).
    pub rej_no_listener: u64,
    /// REQs refused: a peer QP still in timewait or connected (REJ 10).
    pub rej_stale: u64,
    /// Requests resent after a timeout.
    pub resends: u64,
    /// MRAs sent and received.
    pub mras_sent: u64,
    /// MRAs received.
    pub mras_received: u64,
    /// LAP and APR messages (ignored, as the kernel does on RoCE).
    pub path_migration: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: REP received, waiting for the application's RTU.
    RepRcvd,
    /// Passive: REQ received, waiting for the application.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU (or data).
    RepSent,
    Established,
    DreqSent,
    TimeWait,
}

impl State {
    const fn name(self) -> &'static str {
        match self {
            Self::ReqSent => "REQ_SENT",
            Self::RepRcvd => "REP_RCVD",
            Self::ReqRcvd => "REQ_RCVD",
            Self::RepSent => "REP_SENT",
            Self::Established => "ESTABLISHED",
            Self::DreqSent => "DREQ_SENT",
            Self::TimeWait => "TIMEWAIT",
        }
    }
}

#[derive(Debug)]
struct Conn {
    state: State,
    peer: IpAddr,
    /// The peer's communication ID, once known.
    remote_id: u32,
    /// The TID of the REQ, which REP, RTU, MRA and REJ carry.
    tid: u64,
    /// The TID of the DREQ in flight (ours or the peer's).
    dreq_tid: u64,
    local_qpn: Qpn,
    remote_qpn: Qpn,
    /// What we last sent that is resent until answered, and when next.
    resend: Option<(CmMessage, u64)>,
    due: Option<Instant>,
    retries_left: u8,
    interval: Duration,
    /// Whether we have sent an MRA for the peer's REQ (resent on each further duplicate).
    mra_sent: bool,
    /// How long the peer waits for our answer before it resends (its DREQ, say): the kernel's
    /// `timeout_ms`, worked out from the REQ as the kernel works it out.
    peer_interval: Duration,
}

#[derive(Debug)]
struct SidrOut {
    peer: IpAddr,
    req: SidrReq,
    due: Instant,
    retries_left: u8,
}

/// The connection manager of one NIC: see the module documentation.
#[derive(Debug)]
pub struct CmEndpoint {
    ca_guid: u64,
    local: IpAddr,
    conns: HashMap<CommId, Conn>,
    /// (peer, peer's communication ID) → ours.
    by_remote: HashMap<(IpAddr, u32), CommId>,
    listeners: HashSet<ServiceId>,
    next_id: u32,
    tid_high: u32,
    sidr_out: HashMap<u32, SidrOut>,
    /// SIDR requests of peers waiting for the application: ID → (peer, TID, service).
    sidr_in: HashMap<u32, (IpAddr, u64, ServiceId)>,
    /// (peer, their request ID) → our local ID for it, to drop duplicates.
    sidr_seen: HashMap<(IpAddr, u32), u32>,
    outbox: VecDeque<(IpAddr, [u8; MAD_LEN])>,
    events: VecDeque<CmEvent>,
    counters: CmCounters,
    /// Each peer whose DREQ we answered, and until when it may resend it
    /// ([`CmEndpoint::linger_until`]).
    owes: HashMap<IpAddr, Instant>,
}

impl CmEndpoint {
    /// The connection manager of a NIC on `local`, with the CA GUID its REQs and REPs carry;
    /// `seed` picks the first communication ID (random, so a restarted peer's IDs do not
    /// collide with its old ones).
    #[must_use]
    pub fn new(local: IpAddr, ca_guid: u64, seed: u32) -> Self {
        Self {
            ca_guid,
            local,
            conns: HashMap::new(),
            by_remote: HashMap::new(),
            listeners: HashSet::new(),
            next_id: seed.max(1),
            tid_high: seed.rotate_left(16) | 1,
            sidr_out: HashMap::new(),
            sidr_in: HashMap::new(),
            sidr_seen: HashMap::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
            owes: HashMap::new(),
        }
    }

    /// The counters.
    #[must_use]
    pub fn counters(&self) -> &CmCounters {
        &self.counters
    }

    /// Connections known, in any state (timewait included).
    #[must_use]
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The next MAD to send and to whom (the peer's GSI, QP 1).
    pub fn poll_transmit(&mut self) -> Option<(IpAddr, [u8; MAD_LEN])> {
        self.outbox.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// When [`CmEndpoint::handle_timeout`] should next run.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.conns.values().filter_map(|c| c.due);
        let sidr = self.sidr_out.values().map(|s| s.due);
        conns.chain(sidr).min()
    }

    /// Accepts REQs for `service_id` from now on.
    ///
    /// # Errors
    ///
    /// [`CmCommandError::InUse`] when it is listened on already.
    pub fn listen(&mut self, service_id: ServiceId) -> Result<(), CmCommandError> {
        if self.listeners.insert(service_id) {
            Ok(())
        } else {
            Err(CmCommandError::InUse(service_id))
        }
    }

    /// Stops accepting REQs for `service_id` (later ones get REJ 8).
    pub fn unlisten(&mut self, service_id: ServiceId) {
        self.listeners.remove(&service_id);
    }

    fn new_id(&mut self) -> CommId {
        loop {
            let id = CommId(self.next_id);
            self.next_id = self.next_id.wrapping_add(1).max(1);
            if !self.conns.contains_key(&id) && !self.sidr_out.contains_key(&id.0) {
                return id;
            }
        }
    }

    fn tid(&self, id: u32) -> u64 {
        (u64::from(self.tid_high) << 32) | u64::from(id)
    }

    fn send(&mut self, to: IpAddr, message: &CmMessage, tid: u64) {
        let mut mad = [0; MAD_LEN];
        // Every message built here has fields within their widths.
        if message.emit(&message.header(tid), &mut mad).is_ok() {
            self.outbox.push_back((to, mad));
        }
    }

    fn gid(ip: IpAddr) -> Ipv6Addr {
        match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        }
    }

    /// Starts a connection: sends a REQ to `params.to` and resends it until answered.
    pub fn connect(&mut self, now: Instant, params: &ConnectParams) -> CommId {
        let id = self.new_id();
        let tid = self.tid(id.0);
        let path = PathInfo {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: Self::gid(self.local),
            remote_gid: Self::gid(params.to),
            flow_label: 0,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: PATH_ACK_TIMEOUT,
        };
        let req = Req {
            local_comm_id: id.0,
            service_id: params.service_id,
            local_ca_guid: self.ca_guid,
            local_qkey: 0,
            local_qpn: params.qpn,
            responder_resources: params.responder_resources,
            local_eecn: 0,
            initiator_depth: params.initiator_depth,
            remote_eecn: 0,
            remote_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            transport_type: params.transport,
            end_to_end_flow_control: false,
            starting_psn: params.starting_psn,
            local_cm_response_timeout: CM_RESPONSE_TIMEOUT,
            retry_count: params.retry_count.min(7),
            pkey: 0xffff,
            path_mtu: params.mtu,
            rdc_exists: false,
            rnr_retry_count: params.rnr_retry_count.min(7),
            max_cm_retries: MAX_CM_RETRIES,
            srq: params.srq,
            extended_transport_type: 0,
            primary_path: path,
            alternate_path: PathInfo::NONE,
            private_data: params.private_data,
        };
        let message = CmMessage::Req(req);
        self.send(params.to, &message, tid);
        let interval = cm_time(PACKET_LIFETIME) * 2 + cm_time(CM_RESPONSE_TIMEOUT);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqSent,
                peer: params.to,
                remote_id: 0,
                tid,
                dreq_tid: 0,
                local_qpn: params.qpn,
                remote_qpn: Qpn::default(),
                resend: Some((message, tid)),
                due: Some(now + interval),
                retries_left: MAX_CM_RETRIES,
                interval,
                mra_sent: false,
                // The passive kernel waits the response time our REQ announces.
                peer_interval: cm_time(CM_RESPONSE_TIMEOUT),
            },
        );
        id
    }

    fn conn(&mut self, id: CommId) -> Result<&mut Conn, CmCommandError> {
        self.conns.get_mut(&id).ok_or(CmCommandError::Unknown(id))
    }

    fn expect(conn: &Conn, id: CommId, state: State) -> Result<(), CmCommandError> {
        if conn.state == state {
            Ok(())
        } else {
            Err(CmCommandError::WrongState {
                id,
                state: conn.state.name(),
            })
        }
    }

    /// Accepts a connection request: sends the REP and resends it until the RTU (or the
    /// first data) comes. The QP must already be ready to receive.
    ///
    /// # Errors
    ///
    /// [`CmCommandError`] when the connection is unknown or not waiting for an answer.
    pub fn accept(
        &mut self,
        now: Instant,
        id: CommId,
        params: &AcceptParams,
    ) -> Result<(), CmCommandError> {
        let ca_guid = self.ca_guid;
        let conn = self.conn(id)?;
        Self::expect(conn, id, State::ReqRcvd)?;
        let rep = CmMessage::Rep(Rep {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            local_qkey: 0,
            local_qpn: params.qpn,
            local_eecn: 0,
            starting_psn: params.starting_psn,
            responder_resources: params.responder_resources,
            initiator_depth: params.initiator_depth,
            target_ack_delay: 15,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: params.rnr_retry_count.min(7),
            srq: params.srq,
            local_ca_guid: ca_guid,
            private_data: params.private_data,
        });
        conn.state = State::RepSent;
        conn.local_qpn = params.qpn;
        conn.resend = Some((rep, conn.tid));
        conn.due = Some(now + conn.interval);
        conn.retries_left = MAX_CM_RETRIES;
        let (peer, tid) = (conn.peer, conn.tid);
        self.send(peer, &rep, tid);
        Ok(())
    }

    /// Refuses a connection request (REJ 28, consumer defined, with `private_data`) or a
    /// reply (the active side refusing the REP); the connection is gone after.
    ///
    /// # Errors
    ///
    /// [`CmCommandError`] when the connection is unknown or past the handshake.
    pub fn reject(
        &mut self,
        id: CommId,
        private_data: FixedBytes<148>,
    ) -> Result<(), CmCommandError> {
        let conn = self.conn(id)?;
        let rejected = match conn.state {
            State::ReqRcvd => MessageKind::Req,
            State::RepRcvd => MessageKind::Rep,
            state => {
                return Err(CmCommandError::WrongState {
                    id,
                    state: state.name(),
                })
            }
        };
        let rej = CmMessage::Rej(Rej {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            message_rejected: rejected,
            reject_info_length: 0,
            reason: RejectReason::ConsumerDefined,
            ari: FixedBytes::ZERO,
            private_data,
        });
        let (peer, tid) = (conn.peer, conn.tid);
        self.send(peer, &rej, tid);
        self.forget(id);
        Ok(())
    }

    /// The active side's QP is up after the REP: sends the RTU; the connection is
    /// established.
    ///
    /// # Errors
    ///
    /// [`CmCommandError`] when the connection is unknown or did not just get its REP.
    pub fn establish(&mut self, id: CommId) -> Result<(), CmCommandError> {
        let conn = self.conn(id)?;
        Self::expect(conn, id, State::RepRcvd)?;
        conn.state = State::Established;
        conn.resend = None;
        conn.due = None;
        let rtu = CmMessage::Rtu(Rtu {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            private_data: FixedBytes::ZERO,
        });
        let (peer, tid) = (conn.peer, conn.tid);
        self.send(peer, &rtu, tid);
        Ok(())
    }

    /// A data packet arrived on the passive side's QP: where the RTU was lost, this
    /// establishes the connection (IBTA's COMM_EST). Does nothing in any other state.
    pub fn data_arrived(&mut self, id: CommId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            if conn.state == State::RepSent {
                conn.state = State::Established;
                conn.resend = None;
                conn.due = None;
                self.events.push_back(CmEvent::Established { id });
            }
        }
    }

    /// Closes an established connection: sends a DREQ and resends it until the DREP; then
    /// [`CmEvent::Disconnected`] and timewait. The caller moves its QP to ERR first.
    ///
    /// # Errors
    ///
    /// [`CmCommandError`] when the connection is unknown or not established.
    pub fn disconnect(&mut self, now: Instant, id: CommId) -> Result<(), CmCommandError> {
        let tid = self.tid(id.0);
        let conn = self.conn(id)?;
        if !matches!(conn.state, State::Established | State::RepSent) {
            return Err(CmCommandError::WrongState {
                id,
                state: conn.state.name(),
            });
        }
        let dreq = CmMessage::Dreq(Dreq {
            local_comm_id: id.0,
            remote_comm_id: conn.remote_id,
            remote_qpn: conn.remote_qpn,
            private_data: FixedBytes::ZERO,
        });
        conn.state = State::DreqSent;
        conn.dreq_tid = tid;
        conn.resend = Some((dreq, tid));
        conn.due = Some(now + conn.interval);
        conn.retries_left = DREQ_RETRIES;
        let peer = conn.peer;
        self.send(peer, &dreq, tid);
        Ok(())
    }

    /// Forgets a connection the application gave up on without closing (the peer learns of
    /// it by its own timeouts). Returns whether it was known.
    pub fn abandon(&mut self, id: CommId) -> bool {
        self.forget(id)
    }

    fn forget(&mut self, id: CommId) -> bool {
        match self.conns.remove(&id) {
            Some(conn) => {
                self.by_remote.remove(&(conn.peer, conn.remote_id));
                true
            }
            None => false,
        }
    }

    fn enter_timewait(&mut self, now: Instant, id: CommId) {
        if let Some(conn) = self.conns.get_mut(&id) {
            conn.state = State::TimeWait;
            conn.resend = None;
            conn.due = Some(now + TIMEWAIT);
        }
    }

    /// After a DREP: the peer resends its DREQ one interval later if the DREP was lost, so
    /// someone must be here to answer until then, with a quarter of an interval to spare for
    /// a slow peer (the lab's emulated kernels resent 6 % late). A DREQ is answered in
    /// timewait and after it alike.
    fn owe_drep(&mut self, now: Instant, peer: IpAddr, peer_interval: Duration) {
        let until = now + peer_interval + peer_interval / 4;
        self.owes.retain(|_, t| *t > now);
        let owed = self.owes.entry(peer).or_insert(until);
        *owed = (*owed).max(until);
    }

    /// Until when a peer may still need this endpoint: the last moment one of them could
    /// resend a DREQ whose DREP we sent (and it may have lost). `None` when none can after
    /// `now`.
    ///
    /// The kernel's CM outlives the process that used it; a user-space one does not, and a
    /// peer whose resent DREQ goes unanswered waits through all its retries (a minute) for
    /// its `DISCONNECTED` event. A process about to exit keeps answering until then.
    #[must_use]
    pub fn linger_until(&self, now: Instant) -> Option<Instant> {
        self.owes.values().copied().filter(|t| *t > now).max()
    }

    /// The peers [`CmEndpoint::linger_until`] waits for, each with until when: those that may
    /// still resend a DREQ after `now`.
    pub fn owed_peers(&self, now: Instant) -> impl Iterator<Item = (IpAddr, Instant)> + '_ {
        self.owes
            .iter()
            .filter(move |(_, t)| **t > now)
            .map(|(peer, t)| (*peer, *t))
    }

    /// `peer`'s connection manager is gone (the process that ran it closed its port), as
    /// seen while it was owed until `until` ([`CmEndpoint::owed_peers`]): it resends nothing,
    /// so nothing is owed to it any more. A DREQ answered since (a later `until`) is owed
    /// still; one that comes from it later is answered as before, and owed again.
    pub fn peer_gone(&mut self, peer: IpAddr, until: Instant) {
        if self.owes.get(&peer) == Some(&until) {
            self.owes.remove(&peer);
        }
    }

    /// Asks `to` which UD QP serves `service_id` (SIDR_REQ, resent until answered); the
    /// answer comes as [`CmEvent::SidrReply`] or [`CmEvent::SidrUnreachable`].
    pub fn resolve(
        &mut self,
        now: Instant,
        to: IpAddr,
        service_id: ServiceId,
        private_data: FixedBytes<216>,
    ) -> u32 {
        let id = self.new_id().0;
        let req = SidrReq {
            request_id: id,
            pkey: 0xffff,
            service_id,
            private_data,
        };
        self.send(to, &CmMessage::SidrReq(req), self.tid(id));
        self.sidr_out.insert(
            id,
            SidrOut {
                peer: to,
                req,
                due: now + cm_time(CM_RESPONSE_TIMEOUT),
                retries_left: MAX_CM_RETRIES,
            },
        );
        id
    }

    /// Answers a peer's SIDR request: `status` with our UD QP and Q_Key.
    ///
    /// # Errors
    ///
    /// [`CmCommandError::UnknownSidr`] when no such request waits.
    pub fn sidr_reply(
        &mut self,
        id: u32,
        status: SidrStatus,
        qpn: Qpn,
        qkey: u32,
        private_data: FixedBytes<136>,
    ) -> Result<(), CmCommandError> {
        let (peer, tid, service_id) = self
            .sidr_in
            .remove(&id)
            .ok_or(CmCommandError::UnknownSidr(id))?;
        let rep = SidrRep {
            request_id: (tid & 0xffff_ffff) as u32,
            status,
            additional_info_length: 0,
            qpn,
            service_id,
            qkey,
            additional_info: FixedBytes::ZERO,
            private_data,
        };
        self.send(peer, &CmMessage::SidrRep(rep), tid);
        Ok(())
    }

    /// Runs the timers due at `now`: resends, retries running out, timewait ending.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<CommId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.due.is_some_and(|t| t <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let Some(conn) = self.conns.get_mut(&id) else {
                continue;
            };
            if conn.state == State::TimeWait {
                self.forget(id);
                continue;
            }
            let Some((message, tid)) = conn.resend else {
                conn.due = None;
                continue;
            };
            if conn.retries_left == 0 {
                let state = conn.state;
                match state {
                    State::DreqSent => {
                        self.events.push_back(CmEvent::Disconnected { id });
                        self.enter_timewait(now, id);
                    }
                    State::RepSent => {
                        // The kernel tells the active side with a REJ (timeout).
                        let peer = conn.peer;
                        let rej = self.timeout_rej(id, MessageKind::Rep);
                        self.send(peer, &rej, tid);
                        self.events.push_back(CmEvent::Unreachable { id });
                        self.forget(id);
                    }
                    _ => {
                        self.events.push_back(CmEvent::Unreachable { id });
                        self.forget(id);
                    }
                }
                continue;
            }
            conn.retries_left -= 1;
            conn.due = Some(now + conn.interval);
            let peer = conn.peer;
            self.counters.resends += 1;
            self.send(peer, &message, tid);
        }
        let sidr_due: Vec<u32> = self
            .sidr_out
            .iter()
            .filter(|(_, s)| s.due <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in sidr_due {
            let Some(out) = self.sidr_out.get_mut(&id) else {
                continue;
            };
            if out.retries_left == 0 {
                self.sidr_out.remove(&id);
                self.events.push_back(CmEvent::SidrUnreachable { id });
                continue;
            }
            out.retries_left -= 1;
            out.due = now + cm_time(CM_RESPONSE_TIMEOUT);
            let (peer, req) = (out.peer, out.req);
            self.counters.resends += 1;
            self.send(peer, &CmMessage::SidrReq(req), self.tid(id));
        }
    }

    fn timeout_rej(&self, id: CommId, rejected: MessageKind) -> CmMessage {
        let remote = self.conns.get(&id).map_or(0, |c| c.remote_id);
        let mut ari = [0; 72];
        ari[..8].copy_from_slice(&self.ca_guid.to_be_bytes());
        CmMessage::Rej(Rej {
            local_comm_id: id.0,
            remote_comm_id: remote,
            message_rejected: rejected,
            reject_info_length: 8,
            reason: RejectReason::Timeout,
            ari: FixedBytes(ari),
            private_data: FixedBytes::ZERO,
        })
    }

    /// A MAD arrived on the GSI from `from` (a 256-byte UD payload after its 40-byte header).
    pub fn handle_mad(&mut self, now: Instant, from: IpAddr, mad: &[u8]) {
        let Ok((header, message)) = CmMessage::parse(mad) else {
            self.counters.malformed += 1;
            return;
        };
        let tid = header.transaction_id;
        match message {
            CmMessage::Req(req) => self.on_req(now, from, tid, &req),
            CmMessage::Mra(mra) => self.on_mra(now, &mra),
            CmMessage::Rej(rej) => self.on_rej(now, &rej),
            CmMessage::Rep(rep) => self.on_rep(from, tid, &rep),
            CmMessage::Rtu(rtu) => self.on_rtu(rtu.remote_comm_id),
            CmMessage::Dreq(dreq) => self.on_dreq(now, from, tid, &dreq),
            CmMessage::Drep(drep) => self.on_drep(now, drep.remote_comm_id),
            CmMessage::SidrReq(req) => self.on_sidr_req(from, tid, &req),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(&rep),
            CmMessage::Lap(_) | CmMessage::Apr(_) => self.counters.path_migration += 1,
        }
    }

    fn reply_rej(&mut self, to: IpAddr, tid: u64, remote_id: u32, reason: RejectReason) {
        let rej = CmMessage::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: remote_id,
            message_rejected: MessageKind::Req,
            reject_info_length: 0,
            reason,
            ari: FixedBytes::ZERO,
            private_data: FixedBytes::ZERO,
        });
        self.send(to, &rej, tid);
    }

    fn on_req(&mut self, now: Instant, from: IpAddr, tid: u64, req: &Req) {
        if let Some(&id) = self.by_remote.get(&(from, req.local_comm_id)) {
            self.counters.duplicates += 1;
            let Some(conn) = self.conns.get_mut(&id) else {
                return;
            };
            if conn.state == State::ReqRcvd {
                // The application is still deciding: ask the peer to wait (rdma_cm's delayed
                // MRA), and again on each further duplicate.
                conn.mra_sent = true;
                let mra = CmMessage::Mra(Mra {
                    local_comm_id: id.0,
                    remote_comm_id: req.local_comm_id,
                    message_mraed: MessageKind::Req,
                    service_timeout: MRA_SERVICE_TIMEOUT,
                    private_data: FixedBytes::ZERO,
                });
                let tid = conn.tid;
                self.counters.mras_sent += 1;
                self.send(from, &mra, tid);
            }
            return;
        }
        // A REQ from a QP we are connected to, or that closed within timewait, is stale: the
        // peer restarted or reused the QP too soon. Refuse it, and close the old connection.
        let stale: Vec<CommId> = self
            .conns
            .iter()
            .filter(|(_, c)| {
                c.peer == from
                    && c.remote_qpn == req.local_qpn
                    && c.state != State::ReqSent
                    && c.remote_qpn != Qpn::default()
            })
            .map(|(id, _)| *id)
            .collect();
        if !stale.is_empty() {
            self.counters.rej_stale += 1;
            self.reply_rej(from, tid, req.local_comm_id, RejectReason::StaleConnection);
            for id in stale {
                if self
                    .conns
                    .get(&id)
                    .is_some_and(|c| c.state == State::Established)
                {
                    let _ = self.disconnect(now, id);
                    self.events.push_back(CmEvent::Disconnected { id });
                }
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.rej_no_listener += 1;
            self.reply_rej(from, tid, req.local_comm_id, RejectReason::InvalidServiceId);
            return;
        }
        let id = self.new_id();
        let interval = cm_time(req.local_cm_response_timeout);
        // The active kernel waits twice the packet lifetime (its path's, one step below the
        // ACK timeout its REQ carries) and the response time it asked of us.
        let lifetime = req.primary_path.local_ack_timeout.saturating_sub(1);
        let peer_interval = cm_time(lifetime) * 2 + cm_time(req.remote_cm_response_timeout);
        self.conns.insert(
            id,
            Conn {
                state: State::ReqRcvd,
                peer: from,
                remote_id: req.local_comm_id,
                tid,
                dreq_tid: 0,
                local_qpn: Qpn::default(),
                remote_qpn: req.local_qpn,
                resend: None,
                due: None,
                retries_left: req.max_cm_retries,
                interval,
                mra_sent: false,
                peer_interval,
            },
        );
        self.by_remote.insert((from, req.local_comm_id), id);
        self.events.push_back(CmEvent::ConnectRequest {
            id,
            from,
            req: *req,
        });
    }

    fn on_mra(&mut self, now: Instant, mra: &Mra) {
        let id = CommId(mra.remote_comm_id);
        self.counters.mras_received += 1;
        match self.conns.get_mut(&id) {
            Some(conn) if matches!(conn.state, State::ReqSent | State::RepSent) => {
                // The peer is alive and slow: wait out its service timeout before resending.
                conn.remote_id = mra.local_comm_id;
                let wait = cm_time(mra.service_timeout) + cm_time(PACKET_LIFETIME);
                conn.due = Some(now + wait);
            }
            _ => self.counters.unexpected += 1,
        }
    }

    fn on_rej(&mut self, now: Instant, rej: &Rej) {
        let id = CommId(rej.remote_comm_id);
        let Some(conn) = self.conns.get(&id) else {
            self.counters.unexpected += 1;
            return;
        };
        match conn.state {
            State::ReqSent | State::RepSent | State::RepRcvd | State::ReqRcvd => {
                self.events.push_back(CmEvent::Rejected {
                    id,
                    reason: rej.reason,
                    private_data: rej.private_data,
                });
                self.forget(id);
            }
            State::Established | State::DreqSent => {
                // The peer dropped the connection (its REP timed out after we had the REP).
                self.events.push_back(CmEvent::Disconnected { id });
                self.enter_timewait(now, id);
            }
            State::TimeWait => self.counters.unexpected += 1,
        }
    }

    fn on_rep(&mut self, from: IpAddr, tid: u64, rep: &Rep) {
        let id = CommId(rep.remote_comm_id);
        let Some(conn) = self.conns.get_mut(&id) else {
            // A REP for a connection we do not have: say so, as the kernel does (REJ 6).
            self.counters.unexpected += 1;
            let rej = CmMessage::Rej(Rej {
                local_comm_id: 0,
                remote_comm_id: rep.local_comm_id,
                message_rejected: MessageKind::Rep,
                reject_info_length: 0,
                reason: RejectReason::InvalidCommId,
                ari: FixedBytes::ZERO,
                private_data: FixedBytes::ZERO,
            });
            self.send(from, &rej, tid);
            return;
        };
        match conn.state {
            State::ReqSent => {
                conn.state = State::RepRcvd;
                conn.remote_id = rep.local_comm_id;
                conn.remote_qpn = rep.local_qpn;
                conn.resend = None;
                conn.due = None;
                self.by_remote.insert((conn.peer, rep.local_comm_id), id);
                self.events.push_back(CmEvent::Reply { id, rep: *rep });
            }
            State::Established => {
                // Our RTU was lost: send it again.
                self.counters.duplicates += 1;
                let rtu = CmMessage::Rtu(Rtu {
                    local_comm_id: id.0,
                    remote_comm_id: conn.remote_id,
                    private_data: FixedBytes::ZERO,
                });
                let (peer, tid) = (conn.peer, conn.tid);
                self.send(peer, &rtu, tid);
            }
            _ => self.counters.duplicates += 1,
        }
    }

    fn on_rtu(&mut self, remote_comm_id: u32) {
        let id = CommId(remote_comm_id);
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::RepSent) => self.data_arrived(id),
            Some(State::Established) => self.counters.duplicates += 1,
            _ => self.counters.unexpected += 1,
        }
    }

    fn on_dreq(&mut self, now: Instant, from: IpAddr, tid: u64, dreq: &Dreq) {
        let id = CommId(dreq.remote_comm_id);
        let drep = |local: u32| {
            CmMessage::Drep(Drep {
                local_comm_id: local,
                remote_comm_id: dreq.local_comm_id,
                private_data: FixedBytes::ZERO,
            })
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            // Long gone (timewait over, or never): the kernel answers anyway. Its interval is
            // unknown now: owe the longer of the two sides'.
            self.counters.unexpected += 1;
            self.send(from, &drep(dreq.remote_comm_id), tid);
            self.owe_drep(
                now,
                from,
                cm_time(PACKET_LIFETIME) * 2 + cm_time(CM_RESPONSE_TIMEOUT),
            );
            return;
        };
        if conn.local_qpn != dreq.remote_qpn {
            self.counters.dreq_wrong_qpn += 1;
            return;
        }
        match conn.state {
            State::Established | State::RepSent | State::RepRcvd | State::DreqSent => {
                let (peer, interval) = (conn.peer, conn.peer_interval);
                self.send(peer, &drep(id.0), tid);
                self.events.push_back(CmEvent::Disconnected { id });
                self.enter_timewait(now, id);
                self.owe_drep(now, peer, interval);
            }
            State::TimeWait => {
                // Our DREP was lost: answer again, and be here for a further resend.
                self.counters.duplicates += 1;
                let (peer, interval) = (conn.peer, conn.peer_interval);
                self.send(peer, &drep(id.0), tid);
                self.owe_drep(now, peer, interval);
            }
            State::ReqSent | State::ReqRcvd => self.counters.unexpected += 1,
        }
    }

    fn on_drep(&mut self, now: Instant, remote_comm_id: u32) {
        let id = CommId(remote_comm_id);
        match self.conns.get(&id).map(|c| c.state) {
            Some(State::DreqSent) => {
                self.events.push_back(CmEvent::Disconnected { id });
                self.enter_timewait(now, id);
            }
            Some(State::TimeWait) => self.counters.duplicates += 1,
            _ => self.counters.unexpected += 1,
        }
    }

    fn on_sidr_req(&mut self, from: IpAddr, tid: u64, req: &SidrReq) {
        if self.sidr_seen.contains_key(&(from, req.request_id)) {
            self.counters.duplicates += 1;
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            self.counters.rej_no_listener += 1;
            let rep = SidrRep {
                request_id: req.request_id,
                status: SidrStatus::Unsupported,
                additional_info_length: 0,
                qpn: Qpn::default(),
                service_id: req.service_id,
                qkey: 0,
                additional_info: FixedBytes::ZERO,
                private_data: FixedBytes::ZERO,
            };
            self.send(from, &CmMessage::SidrRep(rep), tid);
            return;
        }
        let id = self.new_id().0;
        // Bounded: request IDs are remembered until 4,096 are, then all forgotten at once;
        // dropping a duplicate saves the application work, it guards nothing.
        if self.sidr_seen.len() >= 4096 {
            self.sidr_seen.clear();
        }
        self.sidr_seen.insert((from, req.request_id), id);
        let tid = (tid & !0xffff_ffff) | u64::from(req.request_id);
        self.sidr_in.insert(id, (from, tid, req.service_id));
        self.events.push_back(CmEvent::SidrRequest {
            id,
            from,
            req: *req,
        });
    }

    fn on_sidr_rep(&mut self, rep: &SidrRep) {
        if self.sidr_out.remove(&rep.request_id).is_some() {
            self.events.push_back(CmEvent::SidrReply {
                id: rep.request_id,
                rep: *rep,
            });
        } else {
            self.counters.unexpected += 1;
        }
    }
}

/// The rdma_cm private data of a REQ or SIDR_REQ: its 36-byte address header, then up to 56
/// (REQ) or 180 (SIDR_REQ) bytes of the application's.
///
/// # Panics
///
/// Never: `N` is 92 or 216 at the call sites, and the user data is cut to fit.
#[must_use]
pub fn rdma_cm_private<const N: usize>(header: &CmaHeader, user: &[u8]) -> FixedBytes<N> {
    let mut out = [0; N];
    if header.emit(&mut out).is_ok() {
        let room = N.saturating_sub(CmaHeader::LEN);
        let n = user.len().min(room);
        out[CmaHeader::LEN..CmaHeader::LEN + n].copy_from_slice(&user[..n]);
    }
    FixedBytes(out)
}

/// The rdma_cm service ID for a port in the TCP port space (RC and UC) or the UDP one (UD).
#[must_use]
pub const fn service(space: PortSpace, port: u16) -> ServiceId {
    ServiceId::rdma_cm(space, port)
}
