//! Connection management as librdmacm does it: listen on a port, accept or reject with
//! private data, connect, disconnect, and resolve UD endpoints by SIDR, over the soft NIC's
//! GSI (QP 1), so that ferroce is a peer of `rping`, `ucmatose`, `udaddy`, `perftest -R` and
//! the kernel's own rdma_cm users.
//!
//! The protocol is [`ferroce_proto::cm::machine`]'s; this module gives it a thread and
//! queue pairs. Every soft NIC runs it from [`Nic::open`], as every RDMA device has a CM: QP 1
//! with 512 receives posted, as the kernel's MAD layer posts, and a thread that takes MADs
//! in, runs the resend timers and hands each event to the object it concerns, so a REQ for a
//! port nobody listens on is refused (REJ 8) rather than left unanswered. The queue pair a
//! connection carries is the caller's ordinary [`Qp`], brought to RTS with the attributes the
//! REQ and REP settle ([`QpParams`]).
//!
//! Addresses are rdma_cm's: a port in the TCP port space (RC, UC) or the UDP one (UD), the
//! 36-byte rdma_cm header in a REQ's private data, then up to 56 bytes of the application's
//! (180 in a SIDR request). On a verbs device the kernel's rdma_cm owns QP 1; every call here
//! says so ([`CmError::NotSoft`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferroce_proto::cm::machine::{AcceptParams, CmEndpoint, ConnectParams};
pub use ferroce_proto::cm::machine::{CmCounters, CmEvent, CommId, QpParams};
use ferroce_proto::cm::{CmaHeader, FixedBytes, Req, TransportType, MAD_LEN};
pub use ferroce_proto::cm::{PortSpace, RejectReason, ServiceId, SidrStatus};
use ferroce_proto::memory::{Access, WriteOrder};
use ferroce_proto::qp::ModifyError;
use ferroce_proto::wire::{Qpn, RnrTimer, ROCE_PORT};
use ferroce_proto::Psn;

use crate::attr::{rnr_timer, ConnectAttrs};
use crate::backend::soft;
use crate::qp::{Mtu, Payload, QpAttr, QpCaps, QpState, RecvWr, SendOp, SendWr};
use crate::ud::{AddressHandle, GSI_QKEY, UD_GRH_LEN};
use crate::{Cq, Nic, NicError, Qp, Region, RegionAccess, RegionMemory};

/// Receives kept posted on QP 1.
const GSI_RECEIVES: u64 = 512;
/// One receive: the 40-byte header and a MAD.
const SLOT: u64 = (UD_GRH_LEN + MAD_LEN) as u64;
/// The work request ID of MADs sent, apart from the receive slots.
const SEND_WRID: u64 = u64::MAX;
/// The agent thread looks at its timers at least this often (it is woken to stop).
const TICK: Duration = Duration::from_millis(100);
/// The most application bytes a REQ carries after rdma_cm's header.
pub const MAX_REQ_PRIVATE: usize = 56;
/// The most application bytes a REP carries.
pub const MAX_REP_PRIVATE: usize = 196;
/// The most application bytes a REJ carries.
pub const MAX_REJ_PRIVATE: usize = 148;
/// The most application bytes a SIDR request carries after rdma_cm's header.
pub const MAX_SIDR_PRIVATE: usize = 180;

/// Why a connection-management call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The NIC refused a resource (QP 1, its CQ or its buffers).
    #[error(transparent)]
    Nic(#[from] NicError),
    /// A verbs device: its QP 1 and connections belong to the kernel's rdma_cm.
    #[error(
        "{0} is a verbs device: its connections are the kernel's rdma_cm's; ferroce's CM runs on the soft NIC (-d ferroce0)"
    )]
    NotSoft(String),
    /// Another listener holds this port on this NIC.
    #[error("port {0} is already listened on on this NIC")]
    InUse(u16),
    /// The peer refused: REJ with this reason (`RDMA_CM_EVENT_REJECTED`, status = the code).
    #[error("the peer rejected the connection: {reason} (REJ reason {})", reason.code())]
    Rejected {
        /// The reason.
        reason: RejectReason,
        /// The peer's private data.
        private_data: Vec<u8>,
    },
    /// The peer never answered through all the retries (`RDMA_CM_EVENT_UNREACHABLE`).
    #[error("the peer did not answer (no reply after every retry)")]
    Unreachable,
    /// A SIDR request was answered with a status other than success.
    #[error("the peer answered the SIDR request with status {0:?}")]
    Sidr(SidrStatus),
    /// Nothing came within the time given.
    #[error("no {what} within {after:?}")]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// The queue pair could not be brought up with the attributes the exchange settled.
    #[error("the QP could not be brought up: {0}")]
    Modify(#[from] ModifyError),
    /// Private data longer than the message carries.
    #[error("{len} bytes of private data exceed the {max} a {message} carries")]
    PrivateData {
        /// The bytes given.
        len: usize,
        /// The most allowed.
        max: usize,
        /// The message.
        message: &'static str,
    },
    /// The connection was closed, or the request answered, already.
    #[error("the connection is closed")]
    Closed,
}

fn check_private(data: &[u8], max: usize, message: &'static str) -> Result<(), CmError> {
    if data.len() > max {
        Err(CmError::PrivateData {
            len: data.len(),
            max,
            message,
        })
    } else {
        Ok(())
    }
}

fn fixed<const N: usize>(data: &[u8]) -> FixedBytes<N> {
    let mut out = [0; N];
    let n = data.len().min(N);
    out[..n].copy_from_slice(&data[..n]);
    FixedBytes(out)
}

/// A request a listener received, with where it came from.
enum Incoming {
    Connect {
        id: CommId,
        from: IpAddr,
        req: Req,
    },
    Sidr {
        id: u32,
        from: IpAddr,
        private: FixedBytes<216>,
    },
}

struct Routes {
    machine: CmEndpoint,
    /// Each connection's events, boxed: a channel allocates its slots in blocks of the
    /// message's size, and an event holds a whole REQ or REP (a block of unboxed events is
    /// 9 KB per connection). Beside each, the flag [`Connection::is_closed`] reads, set here
    /// as the close is handled.
    conns: HashMap<CommId, (Sender<Box<CmEvent>>, Arc<AtomicBool>)>,
    sidr: HashMap<u32, Sender<Box<CmEvent>>>,
    listeners: HashMap<ServiceId, Sender<Incoming>>,
    /// Passive connections waiting for their RTU: the QP and the PSN it expects first; the
    /// first data packet establishes them if the RTU was lost.
    awaiting_rtu: HashMap<CommId, (Qpn, Psn)>,
    /// Each connection's QP, moved to ERR when the peer disconnects.
    qps: HashMap<CommId, Qpn>,
}

struct AgentShared {
    /// The soft NIC it is attached to (an internal handle), for what the CM does to QPs it
    /// knows by number: move one to ERR, see a passive one's first data.
    soft: soft::Nic,
    local: IpAddr,
    gsi: Qp,
    cq: Cq,
    rx: Region,
    routes: Mutex<Routes>,
    stop: AtomicBool,
}

/// The connection manager of one soft NIC: QP 1, its receives and its thread. The NIC owns
/// it from [`Nic::open`] to its last handle (or [`Nic::close`]).
pub(crate) struct Agent {
    shared: Arc<AgentShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Agent {
    /// The CM attached to `nic`: [`CmError::NotSoft`] on a verbs device, whose kernel runs
    /// its own; [`CmError::Closed`] once the NIC closed.
    fn of(nic: &Nic) -> Result<Arc<Self>, CmError> {
        let soft = nic
            .backend
            .cm_host()
            .map_err(|_| CmError::NotSoft(nic.device_name().to_owned()))?;
        soft.client::<Self>().ok_or(CmError::Closed)
    }

    /// QP 1 with its receives, and the thread; `nic` is an internal handle.
    pub(crate) fn start(nic: &Nic) -> std::io::Result<Self> {
        let nic_error = |e: NicError| std::io::Error::other(e.to_string());
        let soft = nic
            .backend
            .cm_host()
            .map_err(|u| nic_error(u.into()))?
            .clone();
        let cq = Cq::new(nic, GSI_RECEIVES as usize + 16).map_err(nic_error)?;
        let caps = QpCaps {
            sq_depth: 4096,
            rq_depth: GSI_RECEIVES as u32,
            max_inline: MAD_LEN as u32,
        };
        let gsi = Qp::gsi(nic, &cq, caps).map_err(nic_error)?;
        // Pageable: 150 KB per NIC need not count against the locked-memory limit.
        let rx = Region::register(
            nic,
            RegionAccess::Local,
            WriteOrder::InOrder,
            RegionMemory::Pageable(vec![0; (GSI_RECEIVES * SLOT) as usize]),
        )
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        for slot in 0..GSI_RECEIVES {
            post_slot(&gsi, &rx, slot);
        }
        let local = nic.addr().ip();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| {
                d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(20)
            })
            ^ std::process::id().rotate_left(8);
        let guid = ca_guid(local);
        let shared = Arc::new(AgentShared {
            soft,
            local,
            gsi,
            cq,
            rx,
            routes: Mutex::new(Routes {
                machine: CmEndpoint::new(local, guid, seed),
                conns: HashMap::new(),
                sidr: HashMap::new(),
                listeners: HashMap::new(),
                awaiting_rtu: HashMap::new(),
                qps: HashMap::new(),
            }),
            stop: AtomicBool::new(false),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ferroce-cm".into())
            .spawn(move || worker.run())?;
        Ok(Self {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // The thread sleeps on QP 1's CQ: wake it to see the flag.
        self.shared.cq.wake_waiters();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// The CA GUID a NIC's REQs and REPs carry: the same for the same address, non-zero, and
/// locally administered (0x02 in its top byte) above the address's last six bytes, as rxe
/// derives one from its MAC.
fn ca_guid(ip: IpAddr) -> u64 {
    let o = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    };
    u64::from_be_bytes([0x02, 0, o[10], o[11], o[12], o[13], o[14], o[15]])
}

fn post_slot(gsi: &Qp, rx: &Region, slot: u64) {
    if let Ok(sge) = rx.local(slot * SLOT, SLOT as u32) {
        let _ = gsi.post_recv(RecvWr {
            wr_id: slot,
            sges: vec![sge],
        });
    }
}

impl AgentShared {
    fn run(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            let wait = {
                let routes = lock(&self.routes);
                let until = routes.machine.poll_timeout();
                // While a passive connection waits for its RTU, look for its first data
                // (COMM_EST) every 10 ms.
                let tick = if routes.awaiting_rtu.is_empty() {
                    TICK
                } else {
                    Duration::from_millis(10)
                };
                until.map_or(tick, |t| {
                    t.saturating_duration_since(Instant::now()).min(tick)
                })
            };
            let mut completion = self.cq.wait(wait);
            let mut routes = lock(&self.routes);
            let now = Instant::now();
            while let Some(c) = completion {
                self.take_mad(&mut routes.machine, now, &c);
                completion = self.cq.wait(Duration::ZERO);
            }
            routes.machine.handle_timeout(now);
            self.notice_data(&mut routes);
            self.send_and_dispatch(&mut routes);
        }
    }

    fn take_mad(&self, machine: &mut CmEndpoint, now: Instant, c: &crate::cq::Completion) {
        let slot = c.wr_id;
        if slot >= GSI_RECEIVES {
            // A send's error completion: the MAD is lost, and the machine resends it.
            return;
        }
        if c.status == crate::cq::WcStatus::Success && c.byte_len as u64 == SLOT {
            let mut mad = [0; MAD_LEN];
            if let (Some(source), Ok(())) = (
                c.ud,
                self.rx.read(slot * SLOT + UD_GRH_LEN as u64, &mut mad),
            ) {
                machine.handle_mad(now, source.ip, &mad);
            }
        } else if c.status == crate::cq::WcStatus::Success {
            // Not a MAD's length: the machine counts it as malformed.
            machine.handle_mad(now, self.local, &[]);
        }
        if c.status != crate::cq::WcStatus::WrFlushErr {
            post_slot(&self.gsi, &self.rx, slot);
        }
    }

    /// Refuses connection `id` (a REQ received, or a REP) with REJ 28 and `private_data`;
    /// [`CmError::Closed`] when the machine no longer knows it.
    fn send_rej(&self, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let mut routes = lock(&self.routes);
        let result = routes
            .machine
            .reject(id, fixed(private_data))
            .map_err(|_| CmError::Closed);
        self.send_and_dispatch(&mut routes);
        result
    }

    /// Sends what the machine has queued and hands its events to their owners.
    fn send_and_dispatch(&self, routes: &mut Routes) {
        while let Some((to, mad)) = routes.machine.poll_transmit() {
            let dest = AddressHandle::new(to).dest(Qpn::from_low_bits(1), GSI_QKEY);
            let wr = SendWr {
                signaled: false,
                ..SendWr::to(SEND_WRID, SendOp::Send, Payload::Inline(mad.to_vec()), dest)
            };
            // A full send queue loses the MAD; the machine's resend covers it.
            let _ = self.gsi.post_send(wr);
        }
        while let Some(event) = routes.machine.poll_event() {
            self.dispatch(routes, event);
        }
    }

    fn dispatch(&self, routes: &mut Routes, event: CmEvent) {
        match event {
            CmEvent::ConnectRequest { id, from, req } => {
                let delivered = routes
                    .listeners
                    .get(&req.service_id)
                    .is_some_and(|tx| tx.send(Incoming::Connect { id, from, req }).is_ok());
                if !delivered {
                    let _ = routes.machine.reject(id, FixedBytes::ZERO);
                }
            }
            CmEvent::SidrRequest { id, from, req } => {
                let delivered = routes.listeners.get(&req.service_id).is_some_and(|tx| {
                    tx.send(Incoming::Sidr {
                        id,
                        from,
                        private: req.private_data,
                    })
                    .is_ok()
                });
                if !delivered {
                    let _ = routes.machine.sidr_reply(
                        id,
                        SidrStatus::Reject,
                        Qpn::default(),
                        0,
                        FixedBytes::ZERO,
                    );
                }
            }
            CmEvent::SidrReply { id, .. } | CmEvent::SidrUnreachable { id } => {
                if let Some(tx) = routes.sidr.remove(&id) {
                    let _ = tx.send(Box::new(event));
                }
            }
            CmEvent::Reply { id, .. }
            | CmEvent::Established { id }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::Disconnected { id } => {
                if matches!(
                    event,
                    CmEvent::Disconnected { .. } | CmEvent::Rejected { .. }
                ) {
                    // The peer closed: the QP stops, as the kernel moves it to ERR.
                    if let Some(qpn) = routes.qps.remove(&id) {
                        self.qp_to_err(qpn);
                    }
                }
                if !matches!(event, CmEvent::Reply { .. }) {
                    routes.awaiting_rtu.remove(&id);
                }
                if let Some((tx, closed)) = routes.conns.get(&id) {
                    if matches!(
                        event,
                        CmEvent::Disconnected { .. } | CmEvent::Rejected { .. }
                    ) {
                        closed.store(true, Ordering::Release);
                    }
                    let _ = tx.send(Box::new(event));
                }
            }
        }
    }

    /// Where the RTU was lost, the first data on the passive QP establishes the connection.
    fn notice_data(&self, routes: &mut Routes) {
        if routes.awaiting_rtu.is_empty() {
            return;
        }
        let moved: Vec<CommId> = routes
            .awaiting_rtu
            .iter()
            .filter(|(_, (qpn, psn))| {
                self.soft
                    .qp_psns(*qpn)
                    .is_some_and(|(_, expected)| expected != *psn)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in moved {
            routes.awaiting_rtu.remove(&id);
            routes.machine.data_arrived(id);
        }
    }

    fn qp_to_err(&self, qpn: Qpn) {
        self.soft.qp_to_error(qpn);
    }
}

/// Options of a connection, as `struct rdma_conn_param` holds them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// READs and atomics this side serves at once; 0 gives the peer no remote READ or atomic
    /// access (rping and ucmatose ask 1).
    pub responder_resources: u8,
    /// READs and atomics this side issues at once.
    pub initiator_depth: u8,
    /// Retries after timeouts the peer's QP makes (the REQ's; 7).
    pub retry_count: u8,
    /// Retries after RNR NAKs the peer's QP makes (7: forever).
    pub rnr_retry_count: u8,
    /// Whether the QP takes its receives from an SRQ (informational on the wire).
    pub srq: bool,
    /// The application's private data: at most 56 bytes in a REQ, 196 in a REP.
    pub private_data: Vec<u8>,
    /// The path MTU asked for (the active side; capped at what the NIC's link carries).
    pub mtu: Mtu,
    /// The RNR timer this side asks of the peer (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// How long `connect` waits for the whole exchange.
    pub timeout: Duration,
    /// The source port the REQ's rdma_cm header names, which the peer's
    /// `rdma_get_peer_addr` reports: the port the connecting id was bound to, as the kernel
    /// sends it. `None`: one derived from the QP number.
    pub src_port: Option<u16>,
}

impl Default for ConnParam {
    fn default() -> Self {
        Self {
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            private_data: Vec::new(),
            mtu: Mtu::M4096,
            min_rnr_timer: 12,
            timeout: Duration::from_secs(120),
            src_port: None,
        }
    }
}

/// Listens for connection requests (or SIDR requests) on a port of a soft NIC
/// (`rdma_listen`); dropped, it stops and later requests are refused with REJ 8.
pub struct Listener {
    agent: Arc<Agent>,
    service: ServiceId,
    port: u16,
    rx: Mutex<Receiver<Incoming>>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// Listens on `port` in rdma_cm's TCP port space, for RC and UC connections
    /// (`rdma_bind_addr` and `rdma_listen` on an `RDMA_PS_TCP` id).
    ///
    /// # Errors
    ///
    /// [`CmError::NotSoft`] on a verbs device, [`CmError::InUse`] when the port is taken,
    /// [`CmError::Nic`] when QP 1 or its buffers cannot be had.
    pub fn bind(nic: &Nic, port: u16) -> Result<Self, CmError> {
        Self::bind_in(nic, PortSpace::Tcp, port)
    }

    /// Listens on `port` in rdma_cm's UDP port space, for SIDR requests of UD peers
    /// (`RDMA_PS_UDP`).
    ///
    /// # Errors
    ///
    /// As [`Listener::bind`].
    pub fn bind_udp(nic: &Nic, port: u16) -> Result<Self, CmError> {
        Self::bind_in(nic, PortSpace::Udp, port)
    }

    fn bind_in(nic: &Nic, space: PortSpace, port: u16) -> Result<Self, CmError> {
        let agent = Agent::of(nic)?;
        let service = ServiceId::rdma_cm(space, port);
        let (tx, rx) = mpsc::channel();
        {
            let mut routes = lock(&agent.shared.routes);
            routes
                .machine
                .listen(service)
                .map_err(|_| CmError::InUse(port))?;
            routes.listeners.insert(service, tx);
        }
        Ok(Self {
            agent,
            service,
            port,
            rx: Mutex::new(rx),
        })
    }

    /// The port listened on.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The next connection request (`rdma_get_request`), waiting up to `timeout`.
    ///
    /// # Errors
    ///
    /// [`CmError::Timeout`] when none came.
    pub fn get_request(&self, timeout: Duration) -> Result<ConnectRequest, CmError> {
        loop {
            let next = lock(&self.rx).recv_timeout(timeout);
            match next {
                Ok(Incoming::Connect { id, from, req }) => {
                    return Ok(ConnectRequest {
                        agent: Arc::clone(&self.agent),
                        id,
                        from,
                        req,
                        answered: false,
                    })
                }
                Ok(Incoming::Sidr { .. }) => continue,
                Err(_) => {
                    return Err(CmError::Timeout {
                        what: "connection request",
                        after: timeout,
                    })
                }
            }
        }
    }

    /// The next SIDR request on a UDP-space listener, waiting up to `timeout`.
    ///
    /// # Errors
    ///
    /// [`CmError::Timeout`] when none came.
    pub fn get_sidr_request(&self, timeout: Duration) -> Result<SidrRequest, CmError> {
        loop {
            let next = lock(&self.rx).recv_timeout(timeout);
            match next {
                Ok(Incoming::Sidr { id, from, private }) => {
                    return Ok(SidrRequest {
                        agent: Arc::clone(&self.agent),
                        id,
                        from,
                        private,
                        answered: false,
                    })
                }
                Ok(Incoming::Connect { id, .. }) => {
                    let _ = lock(&self.agent.shared.routes)
                        .machine
                        .reject(id, FixedBytes::ZERO);
                }
                Err(_) => {
                    return Err(CmError::Timeout {
                        what: "SIDR request",
                        after: timeout,
                    })
                }
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut routes = lock(&self.agent.shared.routes);
        routes.machine.unlisten(self.service);
        routes.listeners.remove(&self.service);
    }
}

/// The user part of a REQ's or SIDR request's private data, after rdma_cm's header.
fn user_private(data: &[u8]) -> &[u8] {
    data.get(CmaHeader::LEN..).unwrap_or(&[])
}

/// A connection request waiting for an answer (`RDMA_CM_EVENT_CONNECT_REQUEST`). Dropped
/// unanswered, it is rejected.
pub struct ConnectRequest {
    agent: Arc<Agent>,
    id: CommId,
    from: IpAddr,
    req: Req,
    answered: bool,
}

impl std::fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("from", &self.from)
            .field("qpn", &self.req.local_qpn)
            .finish_non_exhaustive()
    }
}

impl ConnectRequest {
    /// The requesting NIC's address.
    #[must_use]
    pub fn from(&self) -> IpAddr {
        self.from
    }

    /// The REQ as it came, every field (its private data holds rdma_cm's header first).
    #[must_use]
    pub fn req(&self) -> &Req {
        &self.req
    }

    /// The application's private data: the 56 bytes after rdma_cm's header.
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        user_private(&self.req.private_data.0)
    }

    /// Accepts (`rdma_accept`): brings `qp` to RTS with the attributes the REQ and `param`
    /// settle, then sends the REP. The connection is established when the RTU (or the first
    /// data) comes: [`Connection::wait_established`].
    ///
    /// # Errors
    ///
    /// [`CmError::PrivateData`] for more than 196 bytes, [`CmError::Modify`] when the QP
    /// cannot be brought up (it is then rejected), [`CmError::Closed`] when the peer gave up
    /// meanwhile.
    pub fn accept(self, qp: &Qp, param: &ConnParam) -> Result<Connection, CmError> {
        self.answer(qp.qpn(), qp.endpoint().psn, param, Some(qp))
    }

    /// What a queue pair that its application brings up itself needs to connect to the
    /// requester (librdmacm's `rdma_init_qp_attr` on a request's id): the REQ's side of the
    /// exchange, with `psn` the first PSN this side will expect, as [`Self::accept_own`]
    /// will announce it, and `param` as it will accept.
    ///
    /// # Errors
    ///
    /// [`CmError::Modify`] for an RNR timer above 31 in `param`.
    pub fn settle(&self, psn: Psn, param: &ConnParam) -> Result<Settled, CmError> {
        self.settled(&self.accept_params(Qpn::default(), psn, param), param)
    }

    /// What the REQ and an answer of `accept` settle.
    fn settled(&self, accept: &AcceptParams, param: &ConnParam) -> Result<Settled, CmError> {
        Settled::new(
            peer_of(&self.req, self.from),
            QpParams::passive(&self.req, accept),
            param,
        )
    }

    /// Accepts for a queue pair its application brings up itself (`rdma_accept` on an id
    /// without a QP, with `conn_param->qp_num`): sends the REP naming `qpn` and `psn`, the
    /// first PSN it expects, and leaves the queue pair alone; the caller moves it to RTR
    /// and RTS with [`Self::settle`]'s attributes, as librdmacm's users do with
    /// `rdma_init_qp_attr`. The RTU establishes the connection
    /// ([`Connection::wait_established`]); a DREQ does not move the queue pair to ERR.
    /// `qpn` may be a queue pair of another NIC, or none at all (UCX reserves a number for
    /// the REP and connects its own queue pairs with what the private data carries).
    ///
    /// # Errors
    ///
    /// As [`Self::accept`], but never [`CmError::Modify`].
    pub fn accept_own(self, qpn: Qpn, psn: Psn, param: &ConnParam) -> Result<Connection, CmError> {
        self.answer(qpn, psn, param, None)
    }

    fn accept_params(&self, qpn: Qpn, psn: Psn, param: &ConnParam) -> AcceptParams {
        AcceptParams {
            qpn,
            starting_psn: psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            rnr_retry_count: param.rnr_retry_count,
            srq: param.srq,
            private_data: fixed(&param.private_data),
        }
    }

    /// Sends the REP for `qpn`, having brought `qp` up first when the CM owns it.
    fn answer(
        mut self,
        qpn: Qpn,
        psn: Psn,
        param: &ConnParam,
        qp: Option<&Qp>,
    ) -> Result<Connection, CmError> {
        check_private(&param.private_data, MAX_REP_PRIVATE, "REP")?;
        let accept = self.accept_params(qpn, psn, param);
        let settled = self.settled(&accept, param)?;
        let (tx, rx) = mpsc::channel();
        let shared = &self.agent.shared;
        let mut routes = lock(&shared.routes);
        if let Some(qp) = qp {
            if let Err(e) = bring_up(qp, &settled) {
                let _ = routes.machine.reject(self.id, FixedBytes::ZERO);
                self.answered = true;
                shared.send_and_dispatch(&mut routes);
                return Err(e);
            }
        }
        routes
            .machine
            .accept(Instant::now(), self.id, &accept)
            .map_err(|_| CmError::Closed)?;
        self.answered = true;
        let closed = Arc::new(AtomicBool::new(false));
        routes.conns.insert(self.id, (tx, Arc::clone(&closed)));
        if qp.is_some() {
            // The CM's own QP: moved to ERR when the peer leaves, and its first data
            // stands in for a lost RTU.
            routes.qps.insert(self.id, qpn);
            routes
                .awaiting_rtu
                .insert(self.id, (qpn, settled.params.rq_psn));
        }
        shared.send_and_dispatch(&mut routes);
        drop(routes);
        Ok(Connection {
            agent: Arc::clone(&self.agent),
            id: self.id,
            rx: Mutex::new(rx),
            peer: self.from,
            private: Vec::new(),
            state: Mutex::new(ConnState::Connecting),
            closed,
        })
    }

    /// Refuses (`rdma_reject`): REJ 28, consumer defined, with `private_data` (at most 148
    /// bytes).
    ///
    /// # Errors
    ///
    /// [`CmError::PrivateData`]; [`CmError::Closed`] when the peer gave up meanwhile.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        check_private(private_data, MAX_REJ_PRIVATE, "REJ")?;
        self.answered = true;
        self.agent.shared.send_rej(self.id, private_data)
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if !self.answered {
            let shared = &self.agent.shared;
            let mut routes = lock(&shared.routes);
            let _ = routes.machine.reject(self.id, FixedBytes::ZERO);
            shared.send_and_dispatch(&mut routes);
        }
    }
}

/// The peer's address as a REQ names it: its primary path's local GID when that is an
/// address, else where the REQ came from (the kernel answers the GID, not the UDP source).
fn peer_of(req: &Req, from: IpAddr) -> SocketAddr {
    let gid = req.primary_path.local_gid;
    let ip = match gid.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None if !gid.is_unspecified() => IpAddr::V6(gid),
        None => from,
    };
    SocketAddr::new(ip, ROCE_PORT)
}

/// Brings `qp` to RTS with what the exchange settled, as `rdma_accept` and `rdma_connect`
/// do for an id's own QP.
fn bring_up(qp: &Qp, settled: &Settled) -> Result<(), CmError> {
    qp.connect_with(&settled.attrs())?;
    Ok(())
}

/// What a connection settled for a queue pair that its application brings up itself, as
/// librdmacm's `rdma_init_qp_attr` gives it: the attributes of INIT → RTR ([`Self::rtr`]) and
/// RTR → RTS ([`Self::rts`]) for [`Qp::modify`] (or `ibv_modify_qp`). From
/// [`ConnectRequest::settle`] on the passive side and [`Replied::settled`] on the active one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The peer NIC's address and RoCE port.
    pub peer: SocketAddr,
    /// What the REQ and REP settled.
    pub params: QpParams,
    /// The RNR timer this side asks of the peer.
    pub min_rnr_timer: RnrTimer,
}

impl Settled {
    fn new(peer: SocketAddr, params: QpParams, param: &ConnParam) -> Result<Self, CmError> {
        Ok(Self {
            peer,
            params,
            min_rnr_timer: rnr_timer(param.min_rnr_timer)?,
        })
    }

    /// The rights rdma_cm gives the peer (the INIT attributes' `access`): remote WRITE
    /// always; READ and atomics only when this side serves them.
    #[must_use]
    pub fn access(&self) -> Access {
        if self.params.max_dest_rd_atomic == 0 {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC)
        }
    }

    /// Every attribute at once, as the CM brings its own QPs up (`Qp::connect_with`). The
    /// READ depths are at least 1, as the kernel's CM sets them.
    fn attrs(&self) -> ConnectAttrs {
        let p = &self.params;
        ConnectAttrs {
            peer: self.peer,
            dest_qpn: p.dest_qpn,
            sq_psn: p.sq_psn,
            rq_psn: p.rq_psn,
            mtu: p.mtu,
            access: self.access(),
            timeout: p.timeout,
            retry_cnt: p.retry_count,
            rnr_retry: p.rnr_retry_count,
            min_rnr_timer: self.min_rnr_timer,
            max_rd_atomic: p.max_rd_atomic.max(1),
            max_dest_rd_atomic: p.max_dest_rd_atomic.max(1),
        }
    }

    /// INIT → RTR: the peer, path MTU, peer QPN, the first PSN expected, the READs served
    /// and the RNR timer.
    #[must_use]
    pub fn rtr(&self) -> QpAttr {
        let a = self.attrs();
        QpAttr {
            state: Some(QpState::Rtr),
            peer: Some(a.peer),
            path_mtu: Some(a.mtu),
            dest_qpn: Some(a.dest_qpn),
            rq_psn: Some(a.rq_psn),
            max_dest_rd_atomic: Some(a.max_dest_rd_atomic),
            min_rnr_timer: Some(a.min_rnr_timer),
            ..QpAttr::default()
        }
    }

    /// RTR → RTS: the first PSN sent, the ACK timeout, both retry counts and the READs
    /// issued.
    #[must_use]
    pub fn rts(&self) -> QpAttr {
        let a = self.attrs();
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(a.sq_psn),
            timeout: Some(a.timeout),
            retry_cnt: Some(a.retry_cnt),
            rnr_retry: Some(a.rnr_retry),
            max_rd_atomic: Some(a.max_rd_atomic),
            ..QpAttr::default()
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ConnState {
    Connecting,
    Established,
    Closed,
}

/// A connection made by [`Connection::connect`] or [`ConnectRequest::accept`]; its queue
/// pair is the caller's. Dropped while established, it disconnects. Its calls may come from
/// several threads (each waits its turn for the connection's events); locks are taken in
/// one order, the connection's state before the agent's routes.
pub struct Connection {
    agent: Arc<Agent>,
    id: CommId,
    rx: Mutex<Receiver<Box<CmEvent>>>,
    peer: IpAddr,
    private: Vec<u8>,
    state: Mutex<ConnState>,
    /// Set by the CM's thread as it handles the close (`is_closed`).
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Connects `qp` to the listener on `port` at `to` (`rdma_resolve_addr`,
    /// `rdma_resolve_route`, `rdma_connect`): sends the REQ, and on the REP brings `qp` to
    /// RTS and sends the RTU. Returns once established.
    ///
    /// # Errors
    ///
    /// [`CmError::Rejected`] with the peer's reason (8: nobody listens there; 28: the
    /// application refused), [`CmError::Unreachable`], [`CmError::Timeout`] after
    /// `param.timeout`, [`CmError::Modify`], [`CmError::PrivateData`] for more than 56
    /// bytes, [`CmError::NotSoft`] on a verbs device.
    pub fn connect(
        nic: &Nic,
        qp: &Qp,
        to: IpAddr,
        port: u16,
        param: &ConnParam,
    ) -> Result<Self, CmError> {
        let (conn, settled) = Self::request(nic, qp.qpn(), qp.endpoint().psn, to, port, param)?;
        let shared = &conn.agent.shared;
        let mut routes = lock(&shared.routes);
        if let Err(e) = bring_up(qp, &settled) {
            let _ = routes.machine.reject(conn.id, FixedBytes::ZERO);
            shared.send_and_dispatch(&mut routes);
            drop(routes);
            *lock(&conn.state) = ConnState::Closed;
            return Err(e);
        }
        routes
            .machine
            .establish(conn.id)
            .map_err(|_| CmError::Closed)?;
        routes.qps.insert(conn.id, qp.qpn());
        shared.send_and_dispatch(&mut routes);
        drop(routes);
        *lock(&conn.state) = ConnState::Established;
        Ok(conn)
    }

    /// Connects for a queue pair its application brings up itself (`rdma_connect` on an id
    /// without a QP, with `conn_param->qp_num`): sends a REQ naming `qpn`, whose first
    /// expected PSN is `psn`, and returns at the REP (rdma_cm's
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`) without touching any queue pair. The caller moves
    /// its QP to RTR and RTS with [`Replied::settled`], then sends the RTU with
    /// [`Replied::establish`] (`rdma_establish`).
    ///
    /// # Errors
    ///
    /// As [`Self::connect`], but never [`CmError::Modify`].
    pub fn connect_own(
        nic: &Nic,
        qpn: Qpn,
        psn: Psn,
        to: IpAddr,
        port: u16,
        param: &ConnParam,
    ) -> Result<Replied, CmError> {
        let (conn, settled) = Self::request(nic, qpn, psn, to, port, param)?;
        Ok(Replied {
            conn: Some(conn),
            settled,
        })
    }

    /// Sends the REQ for `qpn` and waits for the REP: the connection (its private data the
    /// REP's) and what the REQ and REP settled.
    fn request(
        nic: &Nic,
        qpn: Qpn,
        psn: Psn,
        to: IpAddr,
        port: u16,
        param: &ConnParam,
    ) -> Result<(Self, Settled), CmError> {
        check_private(&param.private_data, MAX_REQ_PRIVATE, "REQ")?;
        rnr_timer(param.min_rnr_timer)?;
        let agent = Agent::of(nic)?;
        let shared = &agent.shared;
        let header = CmaHeader {
            src_port: param.src_port.unwrap_or_else(|| ephemeral_port(qpn)),
            src: shared.local,
            dst: to,
        };
        let mtu = if param.mtu.bytes() > nic.active_mtu().bytes() {
            nic.active_mtu()
        } else {
            param.mtu
        };
        let asked = ConnectParams {
            to,
            service_id: ServiceId::rdma_cm(PortSpace::Tcp, port),
            qpn,
            starting_psn: psn,
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            retry_count: param.retry_count,
            rnr_retry_count: param.rnr_retry_count,
            mtu,
            transport: TransportType::Rc,
            srq: param.srq,
            private_data: ferroce_proto::cm::machine::rdma_cm_private(&header, &param.private_data),
        };
        let (tx, rx) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let id = {
            let mut routes = lock(&shared.routes);
            let id = routes.machine.connect(Instant::now(), &asked);
            routes.conns.insert(id, (tx, Arc::clone(&closed)));
            shared.send_and_dispatch(&mut routes);
            id
        };
        let mut conn = Self {
            agent: Arc::clone(&agent),
            id,
            rx: Mutex::new(rx),
            peer: to,
            private: Vec::new(),
            state: Mutex::new(ConnState::Connecting),
            closed,
        };
        let deadline = Instant::now() + param.timeout;
        let event = conn.next_event(deadline, "connection reply")?;
        let rep = match event {
            CmEvent::Reply { rep, .. } => rep,
            other => return Err(conn.failed(other)),
        };
        conn.private = rep.private_data.0.to_vec();
        let settled = Settled::new(
            SocketAddr::new(to, ROCE_PORT),
            QpParams::active(&asked, &rep),
            param,
        )?;
        Ok((conn, settled))
    }

    fn next_event(&self, deadline: Instant, what: &'static str) -> Result<CmEvent, CmError> {
        let left = deadline.saturating_duration_since(Instant::now());
        let next = lock(&self.rx).recv_timeout(left);
        match next {
            Ok(event) => Ok(*event),
            Err(RecvTimeoutError::Timeout) => {
                lock(&self.agent.shared.routes).machine.abandon(self.id);
                *lock(&self.state) = ConnState::Closed;
                Err(CmError::Timeout { what, after: left })
            }
            Err(RecvTimeoutError::Disconnected) => Err(CmError::Closed),
        }
    }

    fn failed(&self, event: CmEvent) -> CmError {
        *lock(&self.state) = ConnState::Closed;
        match event {
            CmEvent::Rejected {
                reason,
                private_data,
                ..
            } => CmError::Rejected {
                reason,
                private_data: private_data.0.to_vec(),
            },
            CmEvent::Unreachable { .. } => CmError::Unreachable,
            _ => CmError::Closed,
        }
    }

    /// Sends a REJ for a connection still being made, and closes it.
    fn refuse(&self, private_data: &[u8]) -> Result<(), CmError> {
        *lock(&self.state) = ConnState::Closed;
        self.agent.shared.send_rej(self.id, private_data)
    }

    /// The peer's address.
    #[must_use]
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// The private data of the peer's REP (the active side; empty on the passive one).
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        &self.private
    }

    /// Waits until the connection is established (`RDMA_CM_EVENT_ESTABLISHED` on the
    /// passive side; at once on the active side, whose `connect` returned established).
    ///
    /// # Errors
    ///
    /// [`CmError::Timeout`], or why it failed ([`CmError::Rejected`] when the active side
    /// refused the REP, [`CmError::Unreachable`] when no RTU or data ever came).
    pub fn wait_established(&self, timeout: Duration) -> Result<(), CmError> {
        match *lock(&self.state) {
            ConnState::Established => return Ok(()),
            ConnState::Closed => return Err(CmError::Closed),
            ConnState::Connecting => {}
        }
        let event = self.next_event(Instant::now() + timeout, "RTU")?;
        match event {
            CmEvent::Established { .. } => {
                *lock(&self.state) = ConnState::Established;
                Ok(())
            }
            other => Err(self.failed(other)),
        }
    }

    /// Whether the CM has handled this connection's close (the peer's DREQ, the DREP of
    /// ours, a REJ), whoever waits for it: true from the moment the CM's thread handled it,
    /// before a thread in [`Connection::wait_disconnected`] wakes, and so before anything the
    /// CM handles after it (a later connection request on the same NIC). The drop-in
    /// librdmacm looks here to queue `DISCONNECTED` before such a request's
    /// `CONNECT_REQUEST`, in the order the kernel's CM queues them.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Waits for the peer to disconnect (`RDMA_CM_EVENT_DISCONNECTED`); the QP is in ERR
    /// after, its outstanding work flushed.
    ///
    /// # Errors
    ///
    /// [`CmError::Timeout`] when the peer kept the connection.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<(), CmError> {
        if *lock(&self.state) == ConnState::Closed {
            return Ok(());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = lock(&self.rx).recv_timeout(left).map(|event| *event);
            match next {
                Ok(CmEvent::Disconnected { .. } | CmEvent::Rejected { .. }) => {
                    *lock(&self.state) = ConnState::Closed;
                    return Ok(());
                }
                Ok(CmEvent::Established { .. }) => {
                    *lock(&self.state) = ConnState::Established;
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(CmError::Timeout {
                        what: "disconnect",
                        after: timeout,
                    })
                }
                Err(RecvTimeoutError::Disconnected) => return Err(CmError::Closed),
            }
        }
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR, then the DREQ; waits up to
    /// `timeout` for the DREP. Closing a connection the peer closed already returns at once.
    ///
    /// # Errors
    ///
    /// [`CmError::Timeout`] when the DREP did not come in time (the DREQ is still resent
    /// until its retries run out).
    pub fn disconnect(&self, timeout: Duration) -> Result<(), CmError> {
        {
            let mut state = lock(&self.state);
            if *state == ConnState::Closed {
                return Ok(());
            }
            let shared = &self.agent.shared;
            let mut routes = lock(&shared.routes);
            if let Some(qpn) = routes.qps.remove(&self.id) {
                shared.qp_to_err(qpn);
            }
            routes.awaiting_rtu.remove(&self.id);
            if routes.machine.disconnect(Instant::now(), self.id).is_err() {
                // Not established (the peer closed first, or it never was): nothing to say.
                *state = ConnState::Closed;
                return Ok(());
            }
            shared.send_and_dispatch(&mut routes);
        }
        self.wait_disconnected(timeout)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let state = *lock(&self.state);
        let shared = &self.agent.shared;
        if state != ConnState::Closed {
            let mut routes = lock(&shared.routes);
            if let Some(qpn) = routes.qps.remove(&self.id) {
                shared.qp_to_err(qpn);
            }
            if routes.machine.disconnect(Instant::now(), self.id).is_err() {
                routes.machine.abandon(self.id);
            }
            shared.send_and_dispatch(&mut routes);
        }
        let mut routes = lock(&shared.routes);
        routes.conns.remove(&self.id);
        routes.awaiting_rtu.remove(&self.id);
        routes.qps.remove(&self.id);
    }
}

/// A connection whose REP has come, for a queue pair its application brings up itself
/// (rdma_cm's `RDMA_CM_EVENT_CONNECT_RESPONSE`), from [`Connection::connect_own`]: the
/// application moves its QP to RTR and RTS with [`Self::settled`], then
/// [`Self::establish`]es. Dropped unanswered, it is rejected, as the kernel's CM rejects a
/// REP whose id is destroyed.
#[derive(Debug)]
pub struct Replied {
    conn: Option<Connection>,
    settled: Settled,
}

impl Replied {
    /// The attributes the REQ and REP settled for the caller's queue pair.
    #[must_use]
    pub fn settled(&self) -> &Settled {
        &self.settled
    }

    /// The private data of the peer's REP.
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        self.conn.as_ref().map_or(&[], |c| c.private_data())
    }

    /// Sends the RTU (`rdma_establish`): the connection is established on both sides.
    ///
    /// # Errors
    ///
    /// [`CmError::Closed`] when the peer gave up meanwhile (its REP's retries ran out).
    pub fn establish(mut self) -> Result<Connection, CmError> {
        let conn = self.conn.take().ok_or(CmError::Closed)?;
        let shared = &conn.agent.shared;
        let mut routes = lock(&shared.routes);
        if routes.machine.establish(conn.id).is_err() {
            drop(routes);
            *lock(&conn.state) = ConnState::Closed;
            return Err(CmError::Closed);
        }
        shared.send_and_dispatch(&mut routes);
        drop(routes);
        *lock(&conn.state) = ConnState::Established;
        Ok(conn)
    }

    /// Refuses the REP (`rdma_reject` after a connect response): REJ 28 with `private_data`
    /// (at most 148 bytes).
    ///
    /// # Errors
    ///
    /// [`CmError::PrivateData`]; [`CmError::Closed`] when the peer gave up meanwhile.
    pub fn reject(mut self, private_data: &[u8]) -> Result<(), CmError> {
        check_private(private_data, MAX_REJ_PRIVATE, "REJ")?;
        let conn = self.conn.take().ok_or(CmError::Closed)?;
        conn.refuse(private_data)
    }
}

impl Drop for Replied {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            let _ = conn.refuse(&[]);
        }
    }
}

/// rdma_cm's source port for a connection: an ephemeral one, told apart per QP.
fn ephemeral_port(qpn: Qpn) -> u16 {
    0xc000 | (qpn.value() as u16 & 0x3fff)
}

/// A UD peer found by SIDR: where to send and with which Q_Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdPeer {
    /// The peer NIC.
    pub address: AddressHandle,
    /// Its UD queue pair.
    pub qpn: Qpn,
    /// Its Q_Key.
    pub qkey: u32,
}

/// Resolves the UD queue pair behind `port` at `to` (rdma_cm's `rdma_connect` on an
/// `RDMA_PS_UDP` id: SIDR_REQ, SIDR_REP); `private_data` goes after rdma_cm's header.
///
/// # Errors
///
/// [`CmError::Sidr`] when the peer answered with a failure status (1: nobody listens),
/// [`CmError::Unreachable`], [`CmError::Timeout`], [`CmError::PrivateData`] for more than
/// 180 bytes, [`CmError::NotSoft`].
pub fn resolve_ud(
    nic: &Nic,
    to: IpAddr,
    port: u16,
    private_data: &[u8],
    timeout: Duration,
) -> Result<UdPeer, CmError> {
    resolve_ud_from(nic, None, to, port, private_data, timeout)
}

/// As [`resolve_ud`], naming `src_port` (the resolving id's bound port, as the kernel sends
/// it) in the request's rdma_cm header; `None`: one derived from the process.
///
/// # Errors
///
/// As [`resolve_ud`].
pub fn resolve_ud_from(
    nic: &Nic,
    src_port: Option<u16>,
    to: IpAddr,
    port: u16,
    private_data: &[u8],
    timeout: Duration,
) -> Result<UdPeer, CmError> {
    check_private(private_data, MAX_SIDR_PRIVATE, "SIDR request")?;
    let agent = Agent::of(nic)?;
    let shared = &agent.shared;
    let header = CmaHeader {
        src_port: src_port
            .unwrap_or_else(|| ephemeral_port(Qpn::from_low_bits(std::process::id()))),
        src: shared.local,
        dst: to,
    };
    let private = ferroce_proto::cm::machine::rdma_cm_private(&header, private_data);
    let (tx, rx) = mpsc::channel();
    let id = {
        let mut routes = lock(&shared.routes);
        let id = routes.machine.resolve(
            Instant::now(),
            to,
            ServiceId::rdma_cm(PortSpace::Udp, port),
            private,
        );
        routes.sidr.insert(id, tx);
        shared.send_and_dispatch(&mut routes);
        id
    };
    let result = match rx.recv_timeout(timeout).map(|event| *event) {
        Ok(CmEvent::SidrReply { rep, .. }) if rep.status == SidrStatus::Success => Ok(UdPeer {
            address: AddressHandle::new(to),
            qpn: rep.qpn,
            qkey: rep.qkey,
        }),
        Ok(CmEvent::SidrReply { rep, .. }) => Err(CmError::Sidr(rep.status)),
        Ok(_) => Err(CmError::Unreachable),
        Err(_) => Err(CmError::Timeout {
            what: "SIDR reply",
            after: timeout,
        }),
    };
    lock(&shared.routes).sidr.remove(&id);
    result
}

/// A SIDR request waiting for an answer; dropped unanswered, it is refused.
pub struct SidrRequest {
    agent: Arc<Agent>,
    id: u32,
    from: IpAddr,
    private: FixedBytes<216>,
    answered: bool,
}

impl std::fmt::Debug for SidrRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidrRequest")
            .field("from", &self.from)
            .finish_non_exhaustive()
    }
}

impl SidrRequest {
    /// The requesting NIC's address.
    #[must_use]
    pub fn from(&self) -> IpAddr {
        self.from
    }

    /// The application's private data, after rdma_cm's header.
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        user_private(&self.private.0)
    }

    /// The requester's address and port as rdma_cm's header names them (what the passive
    /// side's `rdma_get_peer_addr` reports); `None` when the request carries no such header.
    #[must_use]
    pub fn peer(&self) -> Option<SocketAddr> {
        CmaHeader::parse(&self.private.0)
            .ok()
            .map(|h| SocketAddr::new(h.src, h.src_port))
    }

    /// Answers with our UD queue pair and its Q_Key (`rdma_accept` on a UD id).
    ///
    /// # Errors
    ///
    /// [`CmError::Closed`] when the request is no longer known.
    pub fn accept(mut self, qp: &Qp, qkey: u32) -> Result<(), CmError> {
        self.answer(SidrStatus::Success, qp.qpn(), qkey)
    }

    /// Refuses (status 2, rejected).
    ///
    /// # Errors
    ///
    /// [`CmError::Closed`] when the request is no longer known.
    pub fn reject(mut self) -> Result<(), CmError> {
        self.answer(SidrStatus::Reject, Qpn::default(), 0)
    }

    fn answer(&mut self, status: SidrStatus, qpn: Qpn, qkey: u32) -> Result<(), CmError> {
        self.answered = true;
        let shared = &self.agent.shared;
        let mut routes = lock(&shared.routes);
        let result = routes
            .machine
            .sidr_reply(self.id, status, qpn, qkey, FixedBytes::ZERO)
            .map_err(|_| CmError::Closed);
        shared.send_and_dispatch(&mut routes);
        result
    }
}

impl Drop for SidrRequest {
    fn drop(&mut self) {
        if !self.answered {
            let _ = self.answer(SidrStatus::Reject, Qpn::default(), 0);
        }
    }
}

/// The Q_Key rdma_cm gives UD queue pairs (`RDMA_UDP_QKEY`), which udaddy and perftest's
/// `-R -c UD` use.
pub const RDMA_UDP_QKEY_DEFAULT: u32 = crate::ud::RDMA_UDP_QKEY;

fn running(nic: &Nic) -> Option<Arc<Agent>> {
    Agent::of(nic).ok()
}

/// The counters of the NIC's connection manager (the soft NIC's; `None` on a verbs device).
#[must_use]
pub fn counters(nic: &Nic) -> Option<CmCounters> {
    let agent = running(nic)?;
    let counters = *lock(&agent.shared.routes).machine.counters();
    Some(counters)
}

/// How long the tools [`linger`] at most: the kernel rdma_cm's longest resend interval
/// (about 6 s, an active side's) and a quarter, rounded up.
pub const LINGER: Duration = Duration::from_secs(10);

/// Keeps the NIC's connection manager answering, for at most `max`, until no peer can still
/// need it; call it before closing the NIC (or exiting) after a peer disconnected.
///
/// A peer whose DREQ this NIC answered resends it if the DREP was lost, one interval later
/// (4 to 6 s for the kernel's rdma_cm), and waits through every retry (about a minute) for
/// its `RDMA_CM_EVENT_DISCONNECTED` if nobody answers. The kernel's CM outlives the process
/// that used it; this one lives in the process, so the process waits instead. A peer on this
/// host whose RoCE port nobody holds any more (a ferroce peer whose process has exited; the
/// host's UDP table says so, nothing is sent to ask) can resend nothing: the wait for it
/// ends then. Returns `true` when nothing is owed any more (at once, if this NIC closed its
/// connections itself, or none), `false` when `max` ran out first or the NIC is not a soft
/// one.
pub fn linger(nic: &Nic, max: Duration) -> bool {
    let Some(agent) = running(nic) else {
        return false;
    };
    let end = Instant::now() + max;
    loop {
        let now = Instant::now();
        let owed: Vec<_> = lock(&agent.shared.routes).machine.owed_peers(now).collect();
        // The table is read out of the lock: the agent goes on answering meanwhile.
        let gone: Vec<_> = owed
            .into_iter()
            .filter(|&(peer, _)| {
                crate::udp::table::held_here(SocketAddr::new(peer, ROCE_PORT)) == Some(false)
            })
            .collect();
        let mut routes = lock(&agent.shared.routes);
        for (peer, until) in gone {
            routes.machine.peer_gone(peer, until);
        }
        let until = routes.machine.linger_until(now);
        drop(routes);
        let Some(until) = until else {
            return true;
        };
        if now >= end {
            return false;
        }
        // The agent's thread answers; this one only waits (a resent DREQ moves `until` on).
        std::thread::sleep(until.min(end).saturating_duration_since(now).min(TICK));
    }
}

/// How many connections the NIC's connection manager holds in any state, timewait included
/// (the soft NIC's; `None` on a verbs device).
#[must_use]
pub fn connections(nic: &Nic) -> Option<usize> {
    let agent = running(nic)?;
    let n = lock(&agent.shared.routes).machine.connections();
    Some(n)
}
