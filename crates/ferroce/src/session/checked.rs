//! [`CheckedSession`], the machinery both faces of a session share: every step checked at
//! run time, the controller's slots and the coprocessor's serving thread.
//!
//! Layout of the channel (one region per side, `slots` slots of each kind):
//!
//! | side | `[0, slots × reply)` or `[0, slots × request)` | after it |
//! |---|---|---|
//! | controller | reply slots: the coprocessor WRITEs replies here | request staging |
//! | coprocessor | request slots: the controller WRITEs requests here | reply staging |
//!
//! Every message is an RDMA WRITE with immediate: the immediate's low 16 bits name the slot,
//! bits 16–23 say what the reply is ([`ReplyKind`]); the receive completion's length is the
//! message's length. Each side keeps `slots` receives posted and re-posts one per message,
//! before it answers, so a message never finds the receive queue empty.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferroce_proto::memory::WriteOrder;
use ferroce_proto::qp::{
    Completion, Payload, QpCaps, RecvWr, RemoteAddr, SendOp, SendWr, WcOpcode, WcStatus,
};

use super::handshake;
use super::types::{
    ChannelDesc, Collected, ConnectInfo, CoprocessorFn, DeviceCall, DeviceCoprocessorFn, MemRegion,
    MemoryKind, PeerRef, RequestId, Role, SessionError, Step,
};
use super::watchdog::{Liveness, Watchdog};
use crate::cq::Spin;
use crate::device::DeviceMemory;
use crate::exchange::{PeerInfo, RemoteRegion};
use crate::oob::{self, RcConnection, RcPlan};
use crate::{ConnectOptions, Cq, Nic, Qp, Region, RegionAccess, RegionMemory};

/// The coprocessor's function: on host copies of the messages, or in the device memory.
pub(super) enum Function {
    Host(Box<CoprocessorFn>),
    Device(Box<DeviceCoprocessorFn>),
}

/// How long a waiting thread polls (driving the soft NIC's protocol engine itself) before it
/// sleeps on the CQ.
const SPIN: Duration = Duration::from_millis(5);
/// How long one sleep on a CQ lasts before liveness and stop are checked again.
const NAP: Duration = Duration::from_millis(1);
/// Receives posted beyond one per slot. Each side posts the receive a message took again only
/// after it has answered it (the coprocessor once its reply has left, the controller in the
/// `collect` after the one that took the reply), so that the post is not on the round trip's
/// path; the spare is what the peer's next message lands in meanwhile. At most one taken
/// receive waits to be posted again on either side (each call handles one message), so a
/// message never finds the queue empty (no RNR NAK).
const SPARE_RECEIVES: u16 = 1;
/// How many served requests the coprocessor keeps for `collect`.
const HISTORY: usize = 64;

/// What a reply is, in bits 16–23 of its immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplyKind {
    /// The function's reply.
    Ok = 0,
    /// The function returned an error; the reply holds its message.
    Failed = 1,
    /// The function panicked; the reply holds the panic's message.
    Panicked = 2,
}

impl ReplyKind {
    fn from_imm(imm: u32) -> Self {
        match (imm >> 16) & 0xff {
            0 => Self::Ok,
            2 => Self::Panicked,
            _ => Self::Failed,
        }
    }
}

fn imm(slot: u16, kind: ReplyKind) -> u32 {
    u32::from(slot) | (kind as u32) << 16
}

/// A session's sequence number, so that a region of one session is refused by another.
static SESSIONS: AtomicU64 = AtomicU64::new(1);

/// What `connect` made: the NIC, completion queues, queue pair and out-of-band connection.
#[derive(Debug)]
struct Connection {
    nic: Nic,
    send_cq: Cq,
    recv_cq: Cq,
    qp: Arc<Qp>,
    /// The out-of-band connection until the watchdog takes it.
    stream: Option<std::net::TcpStream>,
    peer_timeout: Duration,
}

/// A message that arrived in a slot and waits for `collect`.
#[derive(Clone, Copy, Debug)]
struct Arrived {
    slot: u16,
    len: u32,
    kind: ReplyKind,
}

/// The controller's side of an established channel.
#[derive(Debug)]
struct Slots {
    /// What is in flight in each slot: the request and when it was posted.
    in_flight: Vec<Option<(RequestId, Instant)>>,
    free: Vec<u16>,
    arrived: VecDeque<Arrived>,
    next_id: u64,
    /// Receives taken by replies and not posted again yet: the next `collect` posts them, its
    /// request having left (see [`SPARE_RECEIVES`]).
    recvs_owed: u16,
}

/// An established channel.
#[derive(Debug)]
struct Channel {
    desc: ChannelDesc,
    region: Arc<Region>,
    /// Kept in step with `region` (CUDA or supplied device memory).
    device: Option<Arc<dyn DeviceMemory>>,
    peer: PeerRef,
    slots: Slots,
}

impl Channel {
    /// Offset of slot `slot` of the area peers write into.
    fn inbound(&self, role: Role, slot: u16) -> u64 {
        u64::from(slot) * u64::from(self.desc.inbound_bytes(role))
    }

    /// Offset of slot `slot` of the staging area this side sends from.
    fn staging(&self, role: Role, slot: u16) -> u64 {
        u64::from(self.desc.slots) * u64::from(self.desc.inbound_bytes(role))
            + u64::from(slot) * u64::from(self.desc.outbound_bytes(role))
    }

    /// The peer's slot `slot`.
    fn remote(&self, role: Role, slot: u16) -> RemoteAddr {
        RemoteAddr {
            va: self.peer.va + u64::from(slot) * u64::from(self.desc.outbound_bytes(role)),
            rkey: self.peer.rkey,
        }
    }
}

/// One request the coprocessor served, for its `collect`.
#[derive(Debug)]
struct Served {
    request: RequestId,
    outcome: Result<Vec<u8>, (ReplyKind, String)>,
}

/// What the coprocessor's serving thread shares with the session.
#[derive(Debug, Default)]
struct ServerShared {
    stop: AtomicBool,
    history: Mutex<VecDeque<Served>>,
    /// Why the server stopped on its own.
    failure: Mutex<Option<String>>,
    changed: Condvar,
    /// Threads waiting on `changed`: without any, a notification is a system call for nothing.
    waiters: std::sync::atomic::AtomicUsize,
    served: AtomicU64,
}

impl ServerShared {
    fn fail(&self, why: String) {
        *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
        self.changed.notify_all();
    }

    fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
    /// Wakes the threads waiting in `collect`, if there are any.
    fn wake_collectors(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }
}

/// A session of either role, every step checked at run time: what an `AnySession` is, and
/// what a `Controller` or `Coprocessor` holds behind its typestate.
pub(super) struct CheckedSession {
    role: Role,
    id: u64,
    connection: Option<Connection>,
    peer: Option<PeerRef>,
    channel: Option<Channel>,
    function: Option<Function>,
    watchdog: Option<Watchdog>,
    started: bool,
    stopped: bool,
    server: Option<(Arc<ServerShared>, JoinHandle<()>)>,
    rtt: Arc<AtomicU64>,
    /// The controller's wait for replies.
    spin: Spin,
}

impl std::fmt::Debug for CheckedSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckedSession")
            .field("role", &self.role)
            .field("connection", &self.connection)
            .field("peer", &self.peer)
            .field("started", &self.started)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl CheckedSession {
    pub(super) fn new(role: Role) -> Self {
        Self {
            role,
            id: SESSIONS.fetch_add(1, Ordering::Relaxed),
            connection: None,
            peer: None,
            channel: None,
            function: None,
            watchdog: None,
            started: false,
            stopped: false,
            server: None,
            rtt: Arc::new(AtomicU64::new(0)),
            spin: Spin::new(),
        }
    }

    pub(super) fn role(&self) -> Role {
        self.role
    }

    fn not_stopped(&self, call: Step) -> Result<(), SessionError> {
        if self.stopped {
            return Err(SessionError::Stopped { call });
        }
        Ok(())
    }

    /// The connection `call` needs, or why there is none (stopped, or not yet connected).
    fn connection(&self, call: Step) -> Result<&Connection, SessionError> {
        self.not_stopped(call)?;
        self.connection.as_ref().ok_or(SessionError::OutOfOrder {
            call,
            missing: Step::Connect,
        })
    }

    pub(super) fn connect(&mut self, info: &ConnectInfo) -> Result<(), SessionError> {
        self.not_stopped(Step::Connect)?;
        if self.connection.is_some() {
            return Err(SessionError::AlreadyDone {
                call: Step::Connect,
            });
        }
        if info.timeout.is_zero() || info.peer_timeout.is_zero() {
            return Err(SessionError::InvalidArgument(
                "the connect and peer timeouts must be above zero".into(),
            ));
        }
        // Room for every slot's message each way, plus a little.
        let depth = usize::from(super::types::MAX_SLOTS) + 8;
        let plan = RcPlan {
            device: &info.device,
            ib_port: info.ib_port,
            local: info.nic,
            faults: info.faults,
            pcap: info.pcap.as_deref(),
            listen: self.role == Role::Coprocessor,
            oob: info.oob,
            timeout: info.timeout,
            mtu: info.mtu,
            send_cq: depth * 2,
            recv_cq: depth * 2,
            caps: QpCaps {
                sq_depth: u32::from(super::types::MAX_SLOTS) + 8,
                rq_depth: u32::from(super::types::MAX_SLOTS) + 8,
                max_inline: 0,
            },
            options: ConnectOptions {
                access: RegionAccess::RemoteWrite,
                timeout: info.ack_timeout,
                retry_cnt: info.retry_cnt,
                ..ConnectOptions::default()
            },
        };
        let role = self.role;
        let hello =
            |stream: &mut _, ours| handshake::hello(stream, role, ours).map(|mtu| (mtu, ()));
        let (rc, ()) = oob::connect_rc(&plan, hello)?;
        let RcConnection {
            nic,
            stream,
            send_cq,
            recv_cq,
            qp,
        } = rc;
        self.connection = Some(Connection {
            nic,
            send_cq,
            recv_cq,
            qp: Arc::new(qp),
            stream: Some(stream),
            peer_timeout: info.peer_timeout,
        });
        Ok(())
    }

    pub(super) fn alloc_memory(
        &mut self,
        size: usize,
        kind: MemoryKind,
    ) -> Result<MemRegion, SessionError> {
        self.connection(Step::AllocMemory)?;
        if size == 0 {
            return Err(SessionError::InvalidArgument(
                "alloc_memory needs at least one byte".into(),
            ));
        }
        let device = match kind {
            MemoryKind::Host => None,
            MemoryKind::Cuda { device } => Some(cuda_memory(device, size)?),
            MemoryKind::Device => {
                return Err(SessionError::InvalidArgument(
                    "alloc_memory cannot allocate application-supplied device memory: use \
                     alloc_device_memory"
                        .into(),
                ))
            }
        };
        self.register(size, kind, device)
    }

    pub(super) fn alloc_device_memory(
        &mut self,
        memory: Arc<dyn DeviceMemory>,
    ) -> Result<MemRegion, SessionError> {
        self.connection(Step::AllocMemory)?;
        let size = usize::try_from(memory.size())
            .map_err(|_| SessionError::Allocation { size: usize::MAX })?;
        self.register(size, MemoryKind::Device, Some(memory))
    }

    /// Registers `size` bytes of host memory for the region, the staging of `device` if set.
    fn register(
        &mut self,
        size: usize,
        kind: MemoryKind,
        device: Option<Arc<dyn DeviceMemory>>,
    ) -> Result<MemRegion, SessionError> {
        let connection = self.connection(Step::AllocMemory)?;
        if size == 0 {
            return Err(SessionError::InvalidArgument(
                "alloc_memory needs at least one byte".into(),
            ));
        }
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(size)
            .map_err(|_| SessionError::Allocation { size })?;
        bytes.resize(size, 0);
        let region = Region::register(
            &connection.nic,
            RegionAccess::RemoteWrite,
            WriteOrder::InOrder,
            RegionMemory::Host(bytes),
        )?;
        Ok(MemRegion {
            region: Arc::new(region),
            session: self.id,
            kind,
            device,
        })
    }

    fn own(&self, region: &MemRegion) -> Result<(), SessionError> {
        if region.session != self.id {
            return Err(SessionError::ForeignRegion);
        }
        Ok(())
    }

    pub(super) fn exchange_keys(&mut self, local: &MemRegion) -> Result<PeerRef, SessionError> {
        self.connection(Step::ExchangeKeys)?;
        self.own(local)?;
        if self.channel.is_some() {
            return Err(SessionError::TooLate {
                call: Step::ExchangeKeys,
                after: Step::EstablishChannel,
            });
        }
        let connection = self.connection.as_mut().ok_or(SessionError::OutOfOrder {
            call: Step::ExchangeKeys,
            missing: Step::Connect,
        })?;
        let stream = connection.stream.as_mut().ok_or(SessionError::TooLate {
            call: Step::ExchangeKeys,
            after: Step::EstablishChannel,
        })?;
        let mine = PeerInfo {
            endpoint: connection.qp.endpoint(),
            regions: vec![RemoteRegion {
                va: local.region.va(),
                rkey: local.region.rkey(),
                len: local.region.len(),
            }],
        };
        let theirs = mine.exchange(stream)?;
        let region = theirs
            .regions
            .first()
            .ok_or_else(|| SessionError::Protocol("the peer advertised no region".into()))?;
        let peer = PeerRef {
            va: region.va,
            rkey: region.rkey,
            len: region.len,
        };
        self.peer = Some(peer);
        Ok(peer)
    }

    pub(super) fn establish_channel(
        &mut self,
        desc: &ChannelDesc,
        local: &MemRegion,
        peer: &PeerRef,
    ) -> Result<(), SessionError> {
        self.connection(Step::EstablishChannel)?;
        if self.peer.is_none() {
            return Err(SessionError::OutOfOrder {
                call: Step::EstablishChannel,
                missing: Step::ExchangeKeys,
            });
        }
        if self.channel.is_some() {
            return Err(SessionError::AlreadyDone {
                call: Step::EstablishChannel,
            });
        }
        self.own(local)?;
        desc.validate()?;
        let needed = desc.region_bytes();
        if local.region.len() < needed {
            return Err(SessionError::RegionTooSmall {
                whose: "local",
                len: local.region.len(),
                needed,
            });
        }
        let connection = self.connection.as_mut().ok_or(SessionError::OutOfOrder {
            call: Step::EstablishChannel,
            missing: Step::Connect,
        })?;
        // Receives first: once the peer has our answer below, it may send at once. The
        // descriptions are compared before the peer's region, so that a mismatch is named as
        // such on both sides. One per slot and a spare, so that a receive taken by a message
        // can be posted again after the answer to it has left.
        for slot in 0..desc.slots + SPARE_RECEIVES {
            connection.qp.post_recv(RecvWr {
                wr_id: u64::from(slot),
                sges: Vec::new(),
            })?;
        }
        let mut stream = connection.stream.take().ok_or(SessionError::AlreadyDone {
            call: Step::EstablishChannel,
        })?;
        handshake::write_line(&mut stream, &desc.to_line(), "the channel description")?;
        let line = handshake::read_line(&mut stream, "the channel description")?;
        let theirs = ChannelDesc::parse_line(&line)?;
        if theirs != *desc {
            return Err(SessionError::ChannelMismatch {
                ours: *desc,
                theirs,
            });
        }
        if peer.len < needed {
            return Err(SessionError::RegionTooSmall {
                whose: "the peer's",
                len: peer.len,
                needed,
            });
        }
        self.watchdog = Some(Watchdog::start(stream, connection.peer_timeout)?);
        self.channel = Some(Channel {
            desc: *desc,
            region: Arc::clone(&local.region),
            device: local.device.clone(),
            peer: *peer,
            slots: Slots {
                in_flight: vec![None; usize::from(desc.slots)],
                free: (0..desc.slots).rev().collect(),
                arrived: VecDeque::new(),
                next_id: 0,
                recvs_owed: 0,
            },
        });
        Ok(())
    }

    pub(super) fn set_coprocessor_fn(&mut self, function: Function) -> Result<(), SessionError> {
        self.not_stopped(Step::SetCoprocessorFn)?;
        if self.role != Role::Coprocessor {
            return Err(SessionError::WrongRole {
                call: Step::SetCoprocessorFn,
                role: self.role,
            });
        }
        if self.started {
            return Err(SessionError::TooLate {
                call: Step::SetCoprocessorFn,
                after: Step::Start,
            });
        }
        if self.channel.is_none() {
            return Err(SessionError::OutOfOrder {
                call: Step::SetCoprocessorFn,
                missing: if self.connection.is_none() {
                    Step::Connect
                } else if self.peer.is_none() {
                    Step::ExchangeKeys
                } else {
                    Step::EstablishChannel
                },
            });
        }
        let has_device = self.channel.as_ref().is_some_and(|c| c.device.is_some());
        if matches!(function, Function::Device(_)) && !has_device {
            return Err(SessionError::InvalidArgument(
                "a device coprocessor function needs a region with device memory: allocate it \
                 as MemoryKind::Cuda or with alloc_device_memory"
                    .into(),
            ));
        }
        self.function = Some(function);
        Ok(())
    }

    /// The first step not yet taken before `call`, if any.
    fn missing_before_start(&self, call: Step) -> Result<(), SessionError> {
        let missing = if self.connection.is_none() {
            Some(Step::Connect)
        } else if self.peer.is_none() {
            Some(Step::ExchangeKeys)
        } else if self.channel.is_none() {
            Some(Step::EstablishChannel)
        } else {
            None
        };
        match missing {
            Some(missing) => Err(SessionError::OutOfOrder { call, missing }),
            None => Ok(()),
        }
    }

    pub(super) fn start(&mut self) -> Result<(), SessionError> {
        self.not_stopped(Step::Start)?;
        if self.started {
            return Err(SessionError::AlreadyDone { call: Step::Start });
        }
        self.missing_before_start(Step::Start)?;
        if self.role == Role::Coprocessor {
            let Some(function) = self.function.take() else {
                return Err(SessionError::OutOfOrder {
                    call: Step::Start,
                    missing: Step::SetCoprocessorFn,
                });
            };
            let (Some(connection), Some(channel), Some(watchdog)) =
                (&self.connection, &self.channel, &self.watchdog)
            else {
                return Err(SessionError::OutOfOrder {
                    call: Step::Start,
                    missing: Step::EstablishChannel,
                });
            };
            let shared = Arc::new(ServerShared::default());
            let server = Server {
                qp: Arc::clone(&connection.qp),
                send_cq: connection.send_cq.clone(),
                recv_cq: connection.recv_cq.clone(),
                region: Arc::clone(&channel.region),
                device: channel.device.clone(),
                desc: channel.desc,
                peer: channel.peer,
                liveness: Arc::clone(watchdog.liveness()),
                shared: Arc::clone(&shared),
                rtt: Arc::clone(&self.rtt),
                function,
            };
            let thread = std::thread::Builder::new()
                .name("ferroce coprocessor".into())
                .spawn(move || server.run())
                .map_err(|source| SessionError::Io {
                    what: "starting the coprocessor's engine",
                    source,
                })?;
            self.server = Some((shared, thread));
        }
        self.started = true;
        Ok(())
    }

    fn running(&self, call: Step) -> Result<(), SessionError> {
        self.not_stopped(call)?;
        if !self.started {
            self.missing_before_start(call)?;
            if self.role == Role::Coprocessor && self.function.is_none() {
                return Err(SessionError::OutOfOrder {
                    call,
                    missing: Step::SetCoprocessorFn,
                });
            }
            return Err(SessionError::OutOfOrder {
                call,
                missing: Step::Start,
            });
        }
        Ok(())
    }

    pub(super) fn submit(&mut self, request: &[u8]) -> Result<RequestId, SessionError> {
        if self.role != Role::Controller {
            return Err(SessionError::WrongRole {
                call: Step::Submit,
                role: self.role,
            });
        }
        self.running(Step::Submit)?;
        let role = self.role;
        let (Some(connection), Some(channel)) = (&self.connection, &mut self.channel) else {
            return Err(SessionError::OutOfOrder {
                call: Step::Submit,
                missing: Step::EstablishChannel,
            });
        };
        if let Some(reason) = self.watchdog.as_ref().and_then(|w| w.liveness().gone()) {
            return Err(SessionError::PeerGone { reason });
        }
        let max = channel.desc.request_bytes;
        if request.len() > max as usize {
            return Err(SessionError::RequestTooLarge {
                len: request.len(),
                max,
            });
        }
        reap_sends(connection, channel)?;
        let Some(slot) = channel.slots.free.pop() else {
            return Err(SessionError::NoFreeSlot {
                slots: channel.desc.slots,
            });
        };
        let at = channel.staging(role, slot);
        let len = request.len() as u32;
        let payload = if len > 0 {
            channel.region.write(at, request)?;
            if let Some(device) = &channel.device {
                device.write(at, request)?;
            }
            Payload::Sge(channel.region.local(at, len)?)
        } else {
            Payload::Sges(Vec::new())
        };
        let id = RequestId(channel.slots.next_id);
        let wr = SendWr::new(
            u64::from(slot),
            SendOp::WriteWithImm(channel.remote(role, slot), imm(slot, ReplyKind::Ok)),
            payload,
        );
        channel.slots.in_flight[usize::from(slot)] = Some((id, Instant::now()));
        if let Err(e) = connection.qp.post_send(wr) {
            channel.slots.in_flight[usize::from(slot)] = None;
            channel.slots.free.push(slot);
            return Err(e.into());
        }
        channel.slots.next_id += 1;
        Ok(id)
    }

    pub(super) fn collect(
        &mut self,
        replies: &mut [&mut [u8]],
        timeout: Option<Duration>,
    ) -> Result<Collected, SessionError> {
        self.running(Step::Collect)?;
        match self.role {
            Role::Controller => self.collect_reply(replies, timeout),
            Role::Coprocessor => self.collect_served(replies, timeout),
        }
    }

    fn collect_reply(
        &mut self,
        replies: &mut [&mut [u8]],
        timeout: Option<Duration>,
    ) -> Result<Collected, SessionError> {
        let role = self.role;
        let (Some(connection), Some(channel)) = (&self.connection, &mut self.channel) else {
            return Err(SessionError::OutOfOrder {
                call: Step::Collect,
                missing: Step::EstablishChannel,
            });
        };
        // The receive the last reply took, posted again now that the next request has left.
        while channel.slots.recvs_owed > 0 {
            connection.qp.post_recv(RecvWr {
                wr_id: u64::from(channel.desc.slots),
                sges: Vec::new(),
            })?;
            channel.slots.recvs_owed -= 1;
        }
        let liveness = self.watchdog.as_ref().map(|w| Arc::clone(w.liveness()));
        // The wait is timed from its first check (32 empty polls in, `after_empty_poll`):
        // a reply that comes sooner, as most do, costs no clock read for it.
        let mut started = None;
        let spin = &mut self.spin;
        let mut spinning = true;
        loop {
            if let Some(arrived) = channel.slots.arrived.front().copied() {
                return take_reply(channel, role, arrived, replies);
            }
            if channel.slots.free.len() == usize::from(channel.desc.slots) {
                return Err(SessionError::NothingInFlight);
            }
            let wc = if spinning {
                connection.recv_cq.poll()
            } else {
                connection.recv_cq.wait(NAP)
            };
            if let Some(wc) = wc {
                if wc.status != WcStatus::Success {
                    // The queue pair failed; a request's send error says why and which.
                    reap_sends(connection, channel)?;
                    return Err(SessionError::Transport {
                        request: None,
                        status: wc.status,
                    });
                }
                let slot = (wc.imm.unwrap_or(0) & 0xffff) as u16;
                let Some(Some((_, posted))) = channel.slots.in_flight.get(usize::from(slot)) else {
                    return Err(SessionError::Protocol(format!(
                        "a reply in slot {slot}, which holds no request"
                    )));
                };
                self.rtt
                    .store(posted.elapsed().as_nanos() as u64, Ordering::Relaxed);
                channel.slots.recvs_owed += 1;
                channel.slots.arrived.push_back(Arrived {
                    slot,
                    len: wc.byte_len,
                    kind: ReplyKind::from_imm(wc.imm.unwrap_or(0)),
                });
                continue;
            }
            let Some(now) = after_empty_poll(spin, spinning) else {
                continue;
            };
            reap_sends(connection, channel)?;
            if let Some(reason) = liveness.as_ref().and_then(|l| l.gone()) {
                return Err(SessionError::PeerGone { reason });
            }
            let waited = now.saturating_duration_since(*started.get_or_insert(now));
            if let Some(timeout) = timeout {
                if waited >= timeout {
                    return Err(SessionError::Timeout {
                        what: "waiting for a reply",
                        after: timeout,
                    });
                }
            }
            if spinning && waited >= SPIN {
                spinning = false;
            }
        }
    }

    fn collect_served(
        &mut self,
        replies: &mut [&mut [u8]],
        timeout: Option<Duration>,
    ) -> Result<Collected, SessionError> {
        let Some((shared, _)) = &self.server else {
            return Err(SessionError::OutOfOrder {
                call: Step::Collect,
                missing: Step::Start,
            });
        };
        let liveness = self.watchdog.as_ref().map(|w| Arc::clone(w.liveness()));
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut history = shared
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(served) = history.front() {
                let request = served.request;
                return match &served.outcome {
                    Ok(reply) => {
                        let bytes = scatter_check(reply.len(), replies, request)?;
                        let mut at = 0;
                        for buf in replies.iter_mut() {
                            let n = (reply.len() - at).min(buf.len());
                            buf[..n].copy_from_slice(&reply[at..at + n]);
                            at += n;
                        }
                        history.pop_front();
                        Ok(Collected { request, bytes })
                    }
                    Err((kind, message)) => {
                        let error = failure(request, *kind, message.clone());
                        history.pop_front();
                        Err(error)
                    }
                };
            }
            if let Some(why) = shared.failure() {
                return Err(SessionError::Engine(why));
            }
            if let Some(reason) = liveness.as_ref().and_then(|l| l.gone()) {
                return Err(SessionError::PeerGone { reason });
            }
            let now = Instant::now();
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Err(SessionError::Timeout {
                        what: "waiting for a request to be served",
                        after: timeout.unwrap_or_default(),
                    });
                }
            }
            let nap = deadline.map_or(Duration::from_millis(10), |d| {
                (d - now).min(Duration::from_millis(10))
            });
            // Counted under the lock, so the server, which pushes under it, cannot miss us.
            shared.waiters.fetch_add(1, Ordering::SeqCst);
            history = shared
                .changed
                .wait_timeout(history, nap)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            shared.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Requests the coprocessor served so far (0 on a controller).
    pub(super) fn served(&self) -> u64 {
        self.server
            .as_ref()
            .map_or(0, |(shared, _)| shared.served.load(Ordering::Relaxed))
    }

    /// Why the peer is gone, if it is.
    pub(super) fn peer_gone(&self) -> Option<String> {
        self.watchdog.as_ref().and_then(|w| w.liveness().gone())
    }

    pub(super) fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Some((shared, thread)) = self.server.take() {
            shared.stop.store(true, Ordering::SeqCst);
            let _ = thread.join();
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            watchdog.stop();
        }
        if let Some(connection) = &self.connection {
            connection.qp.shutdown();
        }
    }

    pub(super) fn nic(&self) -> Option<&Nic> {
        self.connection.as_ref().map(|c| &c.nic)
    }

    pub(super) fn last_rtt_ns(&self) -> u64 {
        self.rtt.load(Ordering::Relaxed)
    }
}

impl Drop for CheckedSession {
    fn drop(&mut self) {
        self.stop();
    }
}

/// After an empty poll of a wait: the time for the wait's other checks (liveness, deadline,
/// send completions), or `None` to poll again at once. Spinning, they come at every 32nd
/// empty poll, with the clock the spin read; after a nap on the CQ, every time.
fn after_empty_poll(spin: &mut Spin, spinning: bool) -> Option<Instant> {
    if spinning {
        spin.empty_poll()
    } else {
        Some(Instant::now())
    }
}

/// The error a failed reply becomes.
fn failure(request: RequestId, kind: ReplyKind, message: String) -> SessionError {
    match kind {
        ReplyKind::Panicked => SessionError::CoprocessorPanicked { request, message },
        _ => SessionError::CoprocessorFailed { request, message },
    }
}

/// Checks that `len` bytes fit in `replies`.
fn scatter_check(
    len: usize,
    replies: &[&mut [u8]],
    request: RequestId,
) -> Result<usize, SessionError> {
    let capacity: usize = replies.iter().map(|b| b.len()).sum();
    if len > capacity {
        return Err(SessionError::ReplyTooLarge {
            request,
            len,
            capacity,
        });
    }
    Ok(len)
}

/// Hands the oldest arrived reply to the caller and frees its slot; a reply that does not
/// fit stays for a later `collect` with more room.
fn take_reply(
    channel: &mut Channel,
    role: Role,
    arrived: Arrived,
    replies: &mut [&mut [u8]],
) -> Result<Collected, SessionError> {
    let slot = usize::from(arrived.slot);
    let Some((request, _)) = channel.slots.in_flight[slot] else {
        channel.slots.arrived.pop_front();
        return Err(SessionError::Protocol(format!(
            "a reply in slot {slot}, which holds no request"
        )));
    };
    let at = channel.inbound(role, arrived.slot);
    let len = arrived.len as usize;
    let free = |channel: &mut Channel| {
        channel.slots.arrived.pop_front();
        channel.slots.in_flight[slot] = None;
        channel.slots.free.push(arrived.slot);
    };
    if arrived.kind != ReplyKind::Ok {
        let mut message = vec![0u8; len.min(channel.desc.reply_bytes as usize)];
        channel.region.read(at, &mut message)?;
        free(channel);
        return Err(failure(
            request,
            arrived.kind,
            String::from_utf8_lossy(&message).into_owned(),
        ));
    }
    let bytes = scatter_check(len, replies, request)?;
    let mut offset = 0usize;
    for buf in replies.iter_mut() {
        let n = (len - offset).min(buf.len());
        if n == 0 {
            break;
        }
        let at = at + offset as u64;
        channel.region.read(at, &mut buf[..n])?;
        // Device memory gets the reply from the caller's copy: no second read, no buffer.
        if let Some(device) = &channel.device {
            device.write(at, &buf[..n])?;
        }
        offset += n;
    }
    free(channel);
    Ok(Collected { request, bytes })
}

/// Takes the send completions that have arrived; a failed request WRITE is an error naming
/// the request.
fn reap_sends(connection: &Connection, channel: &Channel) -> Result<(), SessionError> {
    while let Some(wc) = connection.send_cq.poll() {
        if wc.status != WcStatus::Success {
            let request = channel
                .slots
                .in_flight
                .get(wc.wr_id as usize)
                .copied()
                .flatten()
                .map(|(id, _)| id);
            return Err(SessionError::Transport {
                request,
                status: wc.status,
            });
        }
    }
    Ok(())
}

/// The coprocessor's serving thread: takes requests from the request slots, runs the
/// function, and WRITEs the replies back.
struct Server {
    qp: Arc<Qp>,
    send_cq: Cq,
    recv_cq: Cq,
    region: Arc<Region>,
    device: Option<Arc<dyn DeviceMemory>>,
    desc: ChannelDesc,
    peer: PeerRef,
    liveness: Arc<Liveness>,
    shared: Arc<ServerShared>,
    rtt: Arc<AtomicU64>,
    function: Function,
}

/// What one call of the function came to: its return, or the panic it raised.
type Ran = std::thread::Result<Result<usize, String>>;

/// The serving loop's scratch: host copies of the request and the reply being served, and the
/// replies not yet acknowledged.
struct Scratch {
    request: Vec<u8>,
    reply: Vec<u8>,
    posted: Posted,
}

impl Scratch {
    fn new(desc: &ChannelDesc) -> Self {
        Self {
            request: vec![0u8; desc.request_bytes as usize],
            reply: vec![0u8; desc.reply_bytes as usize],
            posted: Posted {
                at: vec![None; usize::from(desc.slots)],
                waiting: 0,
            },
        }
    }
}

/// When each slot's last reply was posted, until its completion (for the round-trip time).
struct Posted {
    at: Vec<Option<Instant>>,
    /// How many slots hold a time: replies whose acknowledgement has not been taken.
    waiting: usize,
}

impl Posted {
    fn post(&mut self, slot: u16, now: Instant) {
        if self.at[usize::from(slot)].replace(now).is_none() {
            self.waiting += 1;
        }
    }

    /// When the reply that `wr_id` names was posted, if it still waited.
    fn take(&mut self, wr_id: u64) -> Option<Instant> {
        let at = self.at.get_mut(usize::try_from(wr_id).ok()?)?.take()?;
        self.waiting -= 1;
        Some(at)
    }
}

impl Server {
    /// Serves until the end; an error that ends it is kept for `collect`.
    fn run(mut self) {
        if let Err(why) = self.serve() {
            self.shared.fail(why);
        }
    }

    /// Serves requests as they arrive until stopped, until the controller leaves or the queue
    /// pair is torn down (`Ok`), or until a step fails (`Err`, which says why).
    fn serve(&mut self) -> Result<(), String> {
        let mut scratch = Scratch::new(&self.desc);
        let mut last_work = Instant::now();
        let mut spin = Spin::new();
        let mut spinning = true;
        while !self.shared.stop.load(Ordering::SeqCst) {
            let wc = if spinning {
                self.recv_cq.poll()
            } else {
                self.recv_cq.wait(NAP)
            };
            let Some(wc) = wc else {
                // A reply's acknowledgement is taken at the poll that brings it, so that its
                // round-trip time is the acknowledgement's; the rest waits for the spin.
                if scratch.posted.waiting > 0 {
                    self.reap_replies(&mut scratch.posted)?;
                }
                let Some(now) = after_empty_poll(&mut spin, spinning) else {
                    continue;
                };
                self.reap_replies(&mut scratch.posted)?;
                if self.liveness.gone().is_some() {
                    // The controller left; nothing more will come.
                    return Ok(());
                }
                spinning = now.saturating_duration_since(last_work) < SPIN;
                continue;
            };
            // The controller's ACK of the last reply usually came with this request.
            self.reap_replies(&mut scratch.posted)?;
            let Some((slot, len)) = self.take_request(&wc)? else {
                return Ok(());
            };
            last_work = self.answer(slot, len, &mut scratch)?;
            self.repost_recv(slot)?;
            spinning = true;
        }
        Ok(())
    }

    /// Takes the completions of reply WRITEs: a failed one ends serving, a good one gives the
    /// round-trip time from its posting.
    fn reap_replies(&self, posted: &mut Posted) -> Result<(), String> {
        while let Some(sent) = self.send_cq.poll() {
            if sent.status != WcStatus::Success {
                return Err(format!(
                    "a reply WRITE failed: {} (is the controller still there?)",
                    sent.status
                ));
            }
            if let Some(at) = posted.take(sent.wr_id) {
                self.rtt
                    .store(at.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Takes the request a receive completion announces. Returns its slot and length, or
    /// `None` when the queue pair is being torn down.
    fn take_request(&self, wc: &Completion) -> Result<Option<(u16, usize)>, String> {
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::RecvRdmaWithImm {
            if self.shared.stop.load(Ordering::SeqCst) || wc.status == WcStatus::WrFlushErr {
                return Ok(None);
            }
            return Err(format!(
                "a request arrived with status {} as {:?}",
                wc.status, wc.opcode
            ));
        }
        let slot = (wc.imm.unwrap_or(0) & 0xffff) as u16;
        if slot >= self.desc.slots {
            return Err(format!(
                "a request in slot {slot}, beyond the channel's {}",
                self.desc.slots
            ));
        }
        Ok(Some((slot, wc.byte_len as usize)))
    }

    /// Posts again the receive a request took, once its reply has left (the spare of
    /// [`SPARE_RECEIVES`] stood in for it meanwhile).
    fn repost_recv(&self, slot: u16) -> Result<(), String> {
        self.qp
            .post_recv(RecvWr {
                wr_id: u64::from(slot),
                sges: Vec::new(),
            })
            .map_err(|e| format!("cannot post a receive: {e}"))
    }

    /// Answers the request in `slot`, `len` bytes long: runs the function, stages the reply,
    /// counts the request served, posts the reply and wakes `collect`. The count comes before
    /// the post, so that a controller holding the reply never sees a count that lacks it.
    /// Returns when the reply was posted.
    fn answer(&mut self, slot: u16, len: usize, scratch: &mut Scratch) -> Result<Instant, String> {
        let (kind, n) = self.run_function(slot, len, scratch)?;
        let reply = &mut scratch.reply[..n];
        let payload = self.stage_reply(slot, kind, reply)?;
        self.record_served(kind, reply);
        let posted = self.post_reply(slot, kind, payload, &mut scratch.posted)?;
        self.shared.wake_collectors();
        Ok(posted)
    }

    /// Runs the function on the request in `slot`, `len` bytes long; returns what the reply is
    /// and its length. A request longer than the slot, the function's error or panic and a
    /// reply longer than the slot become an error reply in `scratch.reply`.
    fn run_function(
        &mut self,
        slot: u16,
        len: usize,
        scratch: &mut Scratch,
    ) -> Result<(ReplyKind, usize), String> {
        let Scratch { request, reply, .. } = scratch;
        if len > request.len() {
            let message = format!(
                "a request of {len} bytes is longer than the slot's {}",
                request.len()
            );
            return Ok((ReplyKind::Failed, put_message(reply, &message)));
        }
        let at = u64::from(slot) * u64::from(self.desc.request_bytes);
        let request = &mut request[..len];
        self.region.read(at, request).map_err(|e| e.to_string())?;
        if let Some(device) = &self.device {
            device
                .write(at, request)
                .map_err(|e| format!("request in slot {slot}: {e}"))?;
        }
        let ran = self.call_function(slot, at, request, reply)?;
        Ok(reply_of(ran, reply))
    }

    /// Calls the function, catching a panic: on the host copies of the request (read from
    /// offset `at`) and the reply, or where they lie in the device memory.
    fn call_function(
        &mut self,
        slot: u16,
        at: u64,
        request: &[u8],
        reply: &mut [u8],
    ) -> Result<Ran, String> {
        let staging = self.staging(slot);
        match (&mut self.function, &self.device) {
            (Function::Host(function), _) => {
                Ok(catch_unwind(AssertUnwindSafe(|| function(request, reply))))
            }
            (Function::Device(function), Some(device)) => {
                let call = DeviceCall {
                    memory: device.as_ref(),
                    request_offset: at,
                    request_len: request.len(),
                    reply_offset: staging,
                    reply_capacity: reply.len(),
                };
                Ok(catch_unwind(AssertUnwindSafe(|| function(call))))
            }
            (Function::Device(_), None) => {
                Err("a device function on a region without device memory".into())
            }
        }
    }

    /// Puts the reply in the slot's staging area and returns the payload that sends it.
    /// A device function's own reply is in the device memory already and is copied into
    /// `reply`; error replies and a host function's are in `reply` and are copied to the device
    /// memory, if there is one, to keep the two in step.
    fn stage_reply(&self, slot: u16, kind: ReplyKind, reply: &mut [u8]) -> Result<Payload, String> {
        if reply.is_empty() {
            return Ok(Payload::Sges(Vec::new()));
        }
        let staging = self.staging(slot);
        let on_device = kind == ReplyKind::Ok && matches!(self.function, Function::Device(_));
        if let (true, Some(device)) = (on_device, &self.device) {
            device
                .read(staging, reply)
                .map_err(|e| format!("reply in slot {slot}: {e}"))?;
        }
        self.region
            .write(staging, reply)
            .map_err(|e| e.to_string())?;
        if let (false, Some(device)) = (on_device, &self.device) {
            device
                .write(staging, reply)
                .map_err(|e| format!("reply in slot {slot}: {e}"))?;
        }
        let sge = self
            .region
            .local(staging, reply.len() as u32)
            .map_err(|e| e.to_string())?;
        Ok(Payload::Sge(sge))
    }

    /// Counts the request served and keeps its outcome for the coprocessor's `collect` (the
    /// last [`HISTORY`]).
    fn record_served(&self, kind: ReplyKind, reply: &[u8]) {
        let mut history = self
            .shared
            .history
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A full history drops its oldest, whose copy of a reply takes this one: a server
        // nobody collects from allocates nothing per request.
        let oldest = if history.len() == HISTORY {
            history.pop_front()
        } else {
            None
        };
        let outcome = match kind {
            ReplyKind::Ok => {
                let mut copy = oldest.and_then(|s| s.outcome.ok()).unwrap_or_default();
                copy.clear();
                copy.extend_from_slice(reply);
                Ok(copy)
            }
            _ => Err((kind, String::from_utf8_lossy(reply).into_owned())),
        };
        // Only this thread counts, so the count so far numbers this request.
        let request = RequestId(self.shared.served.load(Ordering::Relaxed));
        history.push_back(Served { request, outcome });
        drop(history);
        self.shared.served.fetch_add(1, Ordering::Relaxed);
    }

    /// WRITEs the staged reply, with an immediate naming the slot and what the reply is, into
    /// the controller's same-numbered reply slot, and notes when (for the round-trip time).
    /// Returns that time.
    fn post_reply(
        &self,
        slot: u16,
        kind: ReplyKind,
        payload: Payload,
        posted: &mut Posted,
    ) -> Result<Instant, String> {
        let remote = RemoteAddr {
            va: self.peer.va + u64::from(slot) * u64::from(self.desc.reply_bytes),
            rkey: self.peer.rkey,
        };
        let now = Instant::now();
        posted.post(slot, now);
        self.qp
            .post_send(SendWr::new(
                u64::from(slot),
                SendOp::WriteWithImm(remote, imm(slot, kind)),
                payload,
            ))
            .map_err(|e| format!("cannot post a reply: {e}"))?;
        Ok(now)
    }

    /// Offset of slot `slot` of the reply staging area, after the request slots.
    fn staging(&self, slot: u16) -> u64 {
        u64::from(self.desc.slots) * u64::from(self.desc.request_bytes)
            + u64::from(slot) * u64::from(self.desc.reply_bytes)
    }
}

/// What the function's return makes of the reply in `reply`: the function's own, of the
/// length it returned, or an error reply for an error, a panic or a length beyond the slot.
fn reply_of(ran: Ran, reply: &mut [u8]) -> (ReplyKind, usize) {
    match ran {
        Ok(Ok(n)) if n <= reply.len() => (ReplyKind::Ok, n),
        Ok(Ok(n)) => {
            let message = format!(
                "the coprocessor function returned {n} bytes for a reply slot of {}",
                reply.len()
            );
            (ReplyKind::Failed, put_message(reply, &message))
        }
        Ok(Err(message)) => (ReplyKind::Failed, put_message(reply, &message)),
        Err(panic) => {
            let message = crate::panic_message(panic.as_ref())
                .unwrap_or_else(|| "a panic without a message".into());
            let message = format!("the coprocessor function panicked: {message}");
            (ReplyKind::Panicked, put_message(reply, &message))
        }
    }
}

/// Writes `message` (cut to the reply slot) into `reply`; returns its length.
fn put_message(reply: &mut [u8], message: &str) -> usize {
    let n = message.len().min(reply.len());
    reply[..n].copy_from_slice(&message.as_bytes()[..n]);
    n
}

/// CUDA memory for `alloc_memory`.
#[cfg(feature = "cuda")]
fn cuda_memory(device: u32, size: usize) -> Result<Arc<dyn DeviceMemory>, SessionError> {
    use crate::device::DeviceError;
    match crate::cuda::CudaMemory::alloc(device, size) {
        Ok(memory) => Ok(Arc::new(memory)),
        Err(DeviceError::Unavailable(why)) => Err(SessionError::Unsupported(why)),
        Err(e) => Err(e.into()),
    }
}

/// CUDA memory for `alloc_memory`: not in this build.
#[cfg(not(feature = "cuda"))]
fn cuda_memory(device: u32, _size: usize) -> Result<Arc<dyn DeviceMemory>, SessionError> {
    Err(SessionError::Unsupported(format!(
        "CUDA memory (device {device}): this build of ferroce has no `cuda` feature"
    )))
}

#[cfg(test)]
mod tests {
    //! The receives each side keeps posted, seen in each side's NIC counters, which the public
    //! session does not show: so here, not in `tests/session.rs` (127.0.12.1 and 127.0.12.2,
    //! out-of-band port 19593).

    use super::*;
    use crate::session::state::Running;
    use crate::session::{ChannelDesc, ConnectInfo, Controller, Coprocessor, MemoryKind};
    use std::net::{IpAddr, Ipv4Addr, SocketAddr};

    fn info(host: u8) -> ConnectInfo {
        let ip = |host| IpAddr::V4(Ipv4Addr::new(127, 0, 12, host));
        ConnectInfo::new(ip(host), SocketAddr::new(ip(2), 19593))
            .with_timeout(Duration::from_secs(10))
    }

    fn counters(session: &CheckedSession) -> ferroce_proto::counters::Counters {
        session
            .connection
            .as_ref()
            .expect("a connected session")
            .nic
            .counters()
    }

    /// A controller posts again the receive a reply took only in its next `collect`; a reply
    /// that lands before that call finds the spare. Without it the controller's NIC answers
    /// with an RNR NAK and the coprocessor resends after the RNR timer: every reply arrives,
    /// late, and only the counters tell.
    #[test]
    fn a_reply_that_lands_before_collect_finds_a_receive() {
        let desc = ChannelDesc::new(1, 64, 64);
        let size = desc.region_bytes() as usize;
        let coprocessor = std::thread::spawn(move || {
            let (s, mem) = Coprocessor::new()
                .connect(&info(2))?
                .alloc_memory(size, MemoryKind::Host)?;
            let (s, peer) = s.exchange_keys(&mem)?;
            s.establish_channel(&desc, &mem, &peer)?
                .set_coprocessor_fn(|request: &[u8], reply: &mut [u8]| {
                    reply[..request.len()].copy_from_slice(request);
                    Ok(request.len())
                })?
                .start()
        });
        let (s, mem) = Controller::new()
            .connect(&info(1))
            .unwrap()
            .alloc_memory(size, MemoryKind::Host)
            .unwrap();
        let (s, peer) = s.exchange_keys(&mem).unwrap();
        let mut controller = s
            .establish_channel(&desc, &mem, &peer)
            .unwrap()
            .start()
            .unwrap();
        let mut coprocessor: Coprocessor<Running> = coprocessor.join().unwrap().unwrap();
        let mut reply = [0u8; 64];
        for i in 0..20u8 {
            let request = [i; 64];
            controller.submit(&request).unwrap();
            // Served, then a moment for the reply to land: the next collect comes after it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while coprocessor.served() < u64::from(i) + 1 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(100));
            }
            std::thread::sleep(Duration::from_millis(2));
            let got = controller
                .collect_timeout(&mut [&mut reply[..]], Duration::from_secs(10))
                .unwrap();
            assert_eq!((got.bytes, reply), (64, request));
        }
        let (c, p) = (
            counters(&controller.session),
            counters(&coprocessor.session),
        );
        assert_eq!(
            (c.send_rnr_err, p.rcvd_rnr_err),
            (0, 0),
            "RNR NAKs sent by the controller, and received by the coprocessor"
        );
        controller.stop();
        coprocessor.stop();
    }
}
