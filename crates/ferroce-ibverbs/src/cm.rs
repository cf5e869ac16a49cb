//! The Rust side of the drop-in `librdmacm.so.1` (the C entry points are
//! `crate::entry::cm`): event channels, the state of each `rdma_cm_id`, and the threads that
//! run `ferroce::cm`'s blocking calls and turn their outcomes into events.
//!
//! librdmacm is asynchronous: a call starts something and its outcome comes later as an event
//! on the id's channel. ferroce's CM is blocking, so each id that waits on the wire has a
//! thread: a listening id one that takes connection requests and queues
//! `RDMA_CM_EVENT_CONNECT_REQUEST` with a new child id; a connecting id one that runs
//! [`Connection::connect`] and queues `ESTABLISHED`, `REJECTED` (the REJ's reason as the
//! status, its private data), `UNREACHABLE` or `CONNECT_ERROR`; an accepted id one that waits
//! for the RTU (`ESTABLISHED`). Both then wait for the peer's DREQ or our own DREP
//! (`DISCONNECTED`). Each thread looks at its id's `stop` flag every [`TICK`] and ends once
//! the id is destroyed.
//!
//! An event channel is a [`Channel`] (an eventfd, the C channel's `fd`, and a queue), each
//! event a boxed [`EventBlock`] whose address the queue holds until `rdma_ack_cm_event`.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_int, c_uint};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ferroce::cm::{
    CmError, ConnParam, ConnectRequest, Connection, Listener, Replied, Settled, SidrRequest,
};
use ferroce::proto::cm::CmaHeader;
use ferroce::proto::wire::Qpn;
use ferroce::proto::Psn;
use ferroce::Nic;

use crate::abi::{ibv_ah_attr, IBV_QPT_RC, IBV_QPT_UD};
use crate::cm_abi::*;
use crate::convert;
use crate::objects::{Channel, QpState, Table};

/// How often the threads look at their id's `stop` flag.
pub(crate) const TICK: Duration = Duration::from_millis(100);
/// How long an accepted connection waits for the RTU.
const RTU_WAIT: Duration = Duration::from_secs(30);
/// The most private data an event carries (a REP's 196 bytes).
const PRIVATE_MAX: usize = 256;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// An event as handed to the program: the C event, then the bytes its private data points to.
#[repr(C)]
pub(crate) struct EventBlock {
    pub(crate) event: rdma_cm_event,
    private: [u8; PRIVATE_MAX],
}

/// The event channels, by the address of their C `rdma_event_channel`.
pub(crate) static EVENT_CHANNELS: Table<Channel> = Table::new();
/// The ids, by the address of their C `rdma_cm_id`.
pub(crate) static IDS: Table<IdState> = Table::new();
/// Events queued or handed out and not yet acknowledged, with the count of the id they were
/// reported for (none for a connection request, which belongs to the new id).
static LIVE_EVENTS: Mutex<BTreeMap<usize, Option<Arc<EventCount>>>> = Mutex::new(BTreeMap::new());

/// Forgets the event at `at` (acknowledged); false when it is not a live event. An event
/// that was handed out counts as acknowledged for its id's `rdma_destroy_id`.
pub(crate) fn forget_event(at: usize) -> bool {
    match lock(&LIVE_EVENTS).remove(&at) {
        Some(owner) => {
            if let Some(count) = owner {
                count.acknowledged();
            }
            true
        }
        None => false,
    }
}

/// The events of one id handed to the program and not yet acknowledged: librdmacm's
/// `rdma_destroy_id` returns only once each is, and an event not yet handed out when the id
/// is destroyed is never handed out (the kernel drops it). Without this, rping's CM thread,
/// handed its `DISCONNECTED` while the main thread tore the id and then the channel down,
/// came back to `rdma_get_cm_event` on a channel already gone and exited with an error.
#[derive(Default)]
pub(crate) struct EventCount {
    /// Events handed out and not acknowledged; whether the id is destroyed.
    state: Mutex<(usize, bool)>,
    acknowledged: Condvar,
}

impl EventCount {
    /// Marks an event of the id as handed out; false (and nothing counted) once the id is
    /// destroyed, when the event must be dropped instead.
    fn handed_out(&self) -> bool {
        let mut state = lock(&self.state);
        if state.1 {
            return false;
        }
        state.0 += 1;
        true
    }

    fn acknowledged(&self) {
        let mut state = lock(&self.state);
        state.0 = state.0.saturating_sub(1);
        if state.0 == 0 {
            self.acknowledged.notify_all();
        }
    }

    /// The id is destroyed: no more of its events are handed out. Returns once every event
    /// handed out has been acknowledged.
    pub(crate) fn destroy_and_wait(&self) {
        let mut state = lock(&self.state);
        state.1 = true;
        while state.0 > 0 {
            state = self
                .acknowledged
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Whether the event at `at`, just taken from its channel, may be handed to the program: it
/// then counts for its id. False for an event of an id destroyed since it was queued, which
/// is forgotten here and must be freed by the caller (the kernel drops such events).
pub(crate) fn claim(at: usize) -> bool {
    let mut live = lock(&LIVE_EVENTS);
    match live.get(&at) {
        Some(Some(count)) if !count.handed_out() => {
            live.remove(&at);
            false
        }
        _ => true,
    }
}

/// How many destroyed channels [`DESTROYED_CHANNELS`] remembers.
const DESTROYED_KEPT: usize = 16;

/// The channels the program destroyed last, by the address of their C `rdma_event_channel`,
/// with whether the program had made their `fd` non-blocking.
static DESTROYED_CHANNELS: Mutex<VecDeque<(usize, bool)>> = Mutex::new(VecDeque::new());

/// Remembers that the channel at `at` was destroyed (see [`destroyed_lately`]).
pub(crate) fn channel_destroyed(at: usize, nonblocking: bool) {
    let mut destroyed = lock(&DESTROYED_CHANNELS);
    destroyed.retain(|&(a, _)| a != at);
    if destroyed.len() == DESTROYED_KEPT {
        destroyed.pop_front();
    }
    destroyed.push_back((at, nonblocking));
}

/// Whether the channel at `at` is one of the last the program destroyed, and if so whether
/// its `fd` was non-blocking. A thread already waiting in `rdma_get_cm_event` when its channel
/// is destroyed goes on waiting, as a reader of librdmacm's closed `fd` does; one that comes a
/// moment later is the same thread losing the same race (rping's CM thread, back from acking
/// `DISCONNECTED` while the main thread tears down), and `rdma_get_cm_event` lets it wait too
/// rather than fail.
pub(crate) fn destroyed_lately(at: usize) -> Option<bool> {
    lock(&DESTROYED_CHANNELS)
        .iter()
        .find(|&&(a, _)| a == at)
        .map(|&(_, nonblocking)| nonblocking)
}

/// What one `rdma_cm_id` holds.
pub(crate) struct IdState {
    /// `enum rdma_port_space`.
    pub(crate) ps: c_uint,
    /// The address of its C event channel.
    pub(crate) channel: AtomicUsize,
    /// Whether that channel is the id's own (`rdma_create_id` without one).
    pub(crate) own_channel: AtomicBool,
    /// Set when the id is destroyed: its thread ends.
    pub(crate) stop: AtomicBool,
    /// Its events handed out and not acknowledged (`rdma_destroy_id` waits for them).
    pub(crate) events: Arc<EventCount>,
    pub(crate) inner: Mutex<IdInner>,
}

/// An id's mutable state.
#[derive(Default)]
pub(crate) struct IdInner {
    /// The local address (`rdma_bind_addr`, `rdma_resolve_addr`).
    pub(crate) src: Option<SocketAddr>,
    /// The peer's (`rdma_resolve_addr`, a connection request).
    pub(crate) dst: Option<SocketAddr>,
    /// `rdma_resolve_route` done.
    pub(crate) routed: bool,
    /// A connection request not yet answered (a child id).
    pub(crate) request: Option<ConnectRequest>,
    /// A SIDR request not yet answered (a child id of a UDP-space listener).
    pub(crate) sidr: Option<SidrRequest>,
    /// The connection, once accepted or made.
    pub(crate) conn: Option<Arc<Connection>>,
    /// A connect thread runs.
    pub(crate) connecting: bool,
    /// The listen thread, joined when the id is destroyed so that its port is free again
    /// when `rdma_destroy_id` returns.
    pub(crate) listening: Option<std::thread::JoinHandle<()>>,
    /// `rdma_create_qp` made the id's CQs and channels (freed with its QP).
    pub(crate) own_cqs: bool,
    /// The first PSN this side expects on a connection whose QP the application brings up
    /// itself (the REQ's or REP's starting PSN): random, as the kernel's `seq_num`.
    pub(crate) psn: Psn,
    /// A REP for such a connection, until `rdma_establish` (`CONNECT_RESPONSE`).
    pub(crate) replied: Option<Replied>,
    /// What such a connection settled, for `rdma_init_qp_attr` after the answer.
    pub(crate) settled: Option<Settled>,
}

impl IdState {
    pub(crate) fn new(ps: c_uint, channel: usize, own_channel: bool) -> Self {
        Self {
            ps,
            channel: AtomicUsize::new(channel),
            own_channel: AtomicBool::new(own_channel),
            stop: AtomicBool::new(false),
            events: Arc::default(),
            inner: Mutex::new(IdInner {
                psn: random_psn(),
                ..IdInner::default()
            }),
        }
    }

    pub(crate) fn inner(&self) -> MutexGuard<'_, IdInner> {
        lock(&self.inner)
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

/// A random first PSN: 24 bits of a hash keyed afresh by the standard library's random
/// state, over the time.
fn random_psn() -> Psn {
    use std::hash::BuildHasher;
    let bits = std::collections::hash_map::RandomState::new().hash_one(std::time::Instant::now());
    Psn::from_low_bits(bits as u32)
}

/// What an event says beyond its type and id.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventInfo {
    pub(crate) listen_id: usize,
    pub(crate) status: c_int,
    pub(crate) private: Vec<u8>,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) qp_num: u32,
    /// A UD peer (`param.ud` rather than `param.conn`): its address vector, QPN and Q_Key.
    pub(crate) ud: Option<(ibv_ah_attr, u32, u32)>,
}

/// Queues an event of `kind` for the id at `id` on its channel (dropped if the channel is
/// gone).
pub(crate) fn post(id: usize, state: &IdState, kind: c_uint, info: &EventInfo) {
    let channel = state.channel.load(Ordering::Acquire);
    queue(channel, id, kind, info, Some(Arc::clone(&state.events)));
}

/// A new event channel: its C `rdma_event_channel` (the address the program holds) and the
/// queue behind it.
pub(crate) fn new_channel() -> Result<(*mut rdma_event_channel, Arc<Channel>), c_int> {
    let channel = Arc::new(Channel::new(0).map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?);
    let c = Box::into_raw(Box::new(rdma_event_channel {
        fd: channel.raw_fd(),
    }));
    lock(&DESTROYED_CHANNELS).retain(|&(a, _)| a != c as usize);
    EVENT_CHANNELS.add(c as usize, Arc::clone(&channel));
    Ok((c, channel))
}

/// Queues an event of `kind` for the id at `id` on the channel at `channel` (dropped if the
/// channel is gone).
pub(crate) fn post_on(channel: usize, id: usize, kind: c_uint, info: &EventInfo) {
    queue(channel, id, kind, info, None);
}

/// Queues the event on the channel at `channel`, counted for `owner`'s id when handed out.
fn queue(
    channel: usize,
    id: usize,
    kind: c_uint,
    info: &EventInfo,
    owner: Option<Arc<EventCount>>,
) {
    let Some(channel) = EVENT_CHANNELS.get(channel) else {
        return;
    };
    let ud = rdma_ud_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        ah_attr: ibv_ah_attr::default(),
        qp_num: 0,
        qkey: 0,
    };
    let mut block = Box::new(EventBlock {
        event: rdma_cm_event {
            id: id as *mut rdma_cm_id,
            listen_id: info.listen_id as *mut rdma_cm_id,
            event: kind,
            status: info.status,
            param: rdma_event_param { ud },
        },
        private: [0; PRIVATE_MAX],
    });
    let n = info.private.len().min(PRIVATE_MAX);
    block.private[..n].copy_from_slice(&info.private[..n]);
    let private_data = if n == 0 {
        std::ptr::null()
    } else {
        block.private.as_ptr().cast()
    };
    block.event.param.conn = rdma_conn_param {
        private_data,
        private_data_len: u8::try_from(n).unwrap_or(u8::MAX),
        responder_resources: info.responder_resources,
        initiator_depth: info.initiator_depth,
        flow_control: 0,
        retry_count: info.retry_count,
        rnr_retry_count: info.rnr_retry_count,
        srq: 0,
        qp_num: info.qp_num,
    };
    if let Some((ah_attr, qp_num, qkey)) = info.ud {
        block.event.param.ud = rdma_ud_param {
            private_data,
            private_data_len: u8::try_from(n).unwrap_or(u8::MAX),
            ah_attr,
            qp_num,
            qkey,
        };
    }
    let at = Box::into_raw(block) as usize;
    lock(&LIVE_EVENTS).insert(at, owner);
    channel.push(at);
}

/// The errno of a failed CM call.
pub(crate) fn errno_of(e: &CmError) -> c_int {
    match e {
        CmError::InUse(_) => libc::EADDRINUSE,
        CmError::PrivateData { .. } => libc::EINVAL,
        CmError::NotSoft(_) => libc::ENODEV,
        CmError::Rejected { .. } => libc::ECONNREFUSED,
        CmError::Unreachable | CmError::Timeout { .. } => libc::ETIMEDOUT,
        CmError::Nic(_) => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// The event a failed connection gives, as the kernel's rdma_cm reports it.
fn failure(e: CmError) -> (c_uint, EventInfo) {
    match e {
        CmError::Rejected {
            reason,
            private_data,
        } => (
            RDMA_CM_EVENT_REJECTED,
            EventInfo {
                status: c_int::from(reason.code()),
                private: private_data,
                ..EventInfo::default()
            },
        ),
        CmError::Unreachable | CmError::Timeout { .. } => (
            RDMA_CM_EVENT_UNREACHABLE,
            EventInfo {
                status: -libc::ETIMEDOUT,
                ..EventInfo::default()
            },
        ),
        other => (
            RDMA_CM_EVENT_CONNECT_ERROR,
            EventInfo {
                status: -errno_of(&other),
                ..EventInfo::default()
            },
        ),
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), c_int> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(|_| libc::EAGAIN)
}

/// The established connections whose `DISCONNECTED` is not queued yet: the id, its state
/// and its connection. The id's watcher thread queues it when it wakes; a request's
/// `CONNECT_REQUEST` first queues every one the CM has already closed
/// ([`post_closed_before`]), since the watcher may not have woken yet.
type Watched = Vec<(usize, Arc<IdState>, Arc<Connection>)>;
static WATCHED: Mutex<Watched> = Mutex::new(Vec::new());

fn watched() -> MutexGuard<'static, Watched> {
    WATCHED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the id at `id` off [`WATCHED`], queueing its `DISCONNECTED` when `post_it` unless the id
/// is destroyed; once only, whoever comes first.
fn settle(list: &mut Watched, id: usize, post_it: bool) {
    if let Some(at) = list.iter().position(|(i, ..)| *i == id) {
        let (_, state, _) = list.swap_remove(at);
        if post_it && !state.stopped() {
            post(
                id,
                &state,
                RDMA_CM_EVENT_DISCONNECTED,
                &EventInfo::default(),
            );
        }
    }
}

/// Queues the `DISCONNECTED` of every watched connection the CM has closed, before what the
/// caller queues next: a DREQ handled before a connection request comes before it, as the
/// kernel's CM queues them (a client that disconnects and connects again at once otherwise
/// had its new request reach the server's program before the old connection's end).
fn post_closed_before() {
    let mut list = watched();
    let closed: Vec<usize> = list
        .iter()
        .filter(|(_, _, conn)| conn.is_closed())
        .map(|(id, ..)| *id)
        .collect();
    for id in closed {
        settle(&mut list, id, true);
    }
}

/// Waits for the connection to close (the peer's DREQ, or the DREP of ours) and queues
/// `DISCONNECTED`, unless [`post_closed_before`] did; ends early when the id is destroyed.
fn watch_disconnect(id: usize, state: &Arc<IdState>, conn: &Arc<Connection>) {
    watched().push((id, Arc::clone(state), Arc::clone(conn)));
    loop {
        if state.stopped() {
            settle(&mut watched(), id, false);
            return;
        }
        match conn.wait_disconnected(TICK) {
            Err(CmError::Timeout { .. }) => {}
            _ => {
                settle(&mut watched(), id, true);
                return;
            }
        }
    }
}

/// The IPv4-mapped GID of an address, as `rdma_ib_addr` holds it (two big-endian words as
/// memory has them).
pub(crate) fn gid_words(ip: IpAddr) -> [u64; 2] {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let o = v6.octets();
    let mut w = [0u64; 2];
    for (i, word) in w.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&o[i * 8..i * 8 + 8]);
        *word = u64::from_ne_bytes(b);
    }
    w
}

/// The route of an id from `src` to `dst`.
pub(crate) fn route(src: Option<SocketAddr>, dst: Option<SocketAddr>) -> rdma_route {
    let mut addr = rdma_addr::default();
    if let Some(s) = src {
        addr.src = sockaddr_storage::of(s);
        addr.ibaddr.sgid = gid_words(s.ip());
    }
    if let Some(d) = dst {
        addr.dst = sockaddr_storage::of(d);
        addr.ibaddr.dgid = gid_words(d.ip());
    }
    addr.ibaddr.pkey = 0xffff_u16.to_be();
    rdma_route {
        addr,
        path_rec: std::ptr::null_mut(),
        num_paths: 0,
    }
}

/// What a listening id's children inherit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ListenInfo {
    /// The address of the C id listening.
    pub(crate) id: usize,
    /// Its `verbs` (the CM's context), `pd` (the one its children get) and `context` (the
    /// program's pointer).
    pub(crate) verbs: usize,
    pub(crate) pd: usize,
    pub(crate) context: usize,
    /// The address it listens on (its own address when bound to the wildcard).
    pub(crate) local: SocketAddr,
}

/// Starts the thread that takes connection requests on `listener` for the id `info.id`; it
/// ends (and the port is free) within [`TICK`] of the id's `stop`.
pub(crate) fn spawn_listener(
    state: Arc<IdState>,
    listener: Listener,
    info: ListenInfo,
) -> Result<std::thread::JoinHandle<()>, c_int> {
    std::thread::Builder::new()
        .name("ferroce-cm-listen".into())
        .spawn(move || {
            while !state.stopped() {
                let next = if state.ps == RDMA_PS_UDP {
                    listener
                        .get_sidr_request(TICK)
                        .map(|req| sidr_request(&state, req, info))
                } else {
                    listener
                        .get_request(TICK)
                        .map(|req| request(&state, req, info))
                };
                match next {
                    Ok(()) | Err(CmError::Timeout { .. }) => {}
                    Err(e) => {
                        eprintln!("ferroce-rdmacm: the listener on {} stops: {e}", info.local);
                        return;
                    }
                }
            }
        })
        .map_err(|_| libc::EAGAIN)
}

/// A connection request: a child id holding it, and `CONNECT_REQUEST` on the listener's
/// channel.
fn request(parent: &IdState, req: ConnectRequest, info: ListenInfo) {
    let peer = CmaHeader::parse(&req.req().private_data.0).map_or_else(
        |_| SocketAddr::new(req.from(), 0),
        |h| SocketAddr::new(h.src, h.src_port),
    );
    let r = req.req();
    let event = EventInfo {
        listen_id: info.id,
        private: req.private_data().to_vec(),
        responder_resources: r.responder_resources,
        initiator_depth: r.initiator_depth,
        retry_count: r.retry_count,
        rnr_retry_count: r.rnr_retry_count,
        qp_num: r.local_qpn.value(),
        ..EventInfo::default()
    };
    child(parent, info, peer, &event, |inner| {
        inner.request = Some(req)
    });
}

/// A SIDR request (a UD peer resolving the listener's QP): a child id holding it, and
/// `CONNECT_REQUEST` on the listener's channel.
fn sidr_request(parent: &IdState, req: SidrRequest, info: ListenInfo) {
    let peer = req.peer().unwrap_or(SocketAddr::new(req.from(), 0));
    let event = EventInfo {
        listen_id: info.id,
        private: req.private_data().to_vec(),
        ud: Some((convert::ah_attr(SocketAddr::new(req.from(), 4791)), 0, 0)),
        ..EventInfo::default()
    };
    child(parent, info, peer, &event, |inner| inner.sidr = Some(req));
}

/// A new id for a request on the listener `info.id`, from `peer`, holding what `hold` puts
/// in it; `event` (`CONNECT_REQUEST`) is queued for it.
fn child(
    parent: &IdState,
    info: ListenInfo,
    peer: SocketAddr,
    event: &EventInfo,
    hold: impl FnOnce(&mut IdInner),
) {
    // A synchronous listener's children are synchronous too: each has a channel of its own
    // (librdmacm migrates them to one); the request itself comes on the listener's.
    let sync = parent.own_channel.load(Ordering::Acquire);
    let parent_channel = parent.channel.load(Ordering::Acquire);
    let channel = if sync {
        match new_channel() {
            Ok((c, _)) => c as usize,
            Err(_) => return,
        }
    } else {
        parent_channel
    };
    let c = Box::into_raw(Box::new(rdma_cm_id {
        verbs: info.verbs as *mut _,
        channel: channel as *mut _,
        context: info.context as *mut _,
        qp: std::ptr::null_mut(),
        route: route(Some(info.local), Some(peer)),
        ps: parent.ps,
        port_num: 1,
        event: std::ptr::null_mut(),
        send_cq_channel: std::ptr::null_mut(),
        send_cq: std::ptr::null_mut(),
        recv_cq_channel: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        srq: std::ptr::null_mut(),
        pd: info.pd as *mut _,
        qp_type: if parent.ps == RDMA_PS_UDP {
            IBV_QPT_UD
        } else {
            IBV_QPT_RC
        },
    })) as usize;
    let child = Arc::new(IdState::new(parent.ps, channel, sync));
    {
        let mut inner = child.inner();
        inner.src = Some(info.local);
        inner.dst = Some(peer);
        inner.routed = true;
        hold(&mut inner);
    }
    IDS.add(c, Arc::clone(&child));
    post_closed_before();
    post_on(parent_channel, c, RDMA_CM_EVENT_CONNECT_REQUEST, event);
}

/// The connection parameters of `rdma_connect` or `rdma_accept`.
pub(crate) fn conn_param(
    responder_resources: u8,
    initiator_depth: u8,
    rnr_retry_count: u8,
    private_data: Vec<u8>,
) -> ConnParam {
    ConnParam {
        responder_resources,
        initiator_depth,
        rnr_retry_count,
        private_data,
        ..ConnParam::default()
    }
}

/// Starts the thread that connects the id at `id` to `to` with `qp`.
pub(crate) fn spawn_connect(
    id: usize,
    state: Arc<IdState>,
    nic: Nic,
    qp: Arc<QpState>,
    to: SocketAddr,
    param: ConnParam,
) -> Result<(), c_int> {
    spawn("ferroce-cm-connect", move || {
        let (rr, depth) = (param.responder_resources, param.initiator_depth);
        match Connection::connect(&nic, &qp.qp, to.ip(), to.port(), &param) {
            Ok(conn) => {
                let conn = Arc::new(conn);
                state.inner().conn = Some(Arc::clone(&conn));
                if state.stopped() {
                    return;
                }
                let info = EventInfo {
                    private: conn.private_data().to_vec(),
                    responder_resources: rr,
                    initiator_depth: depth,
                    ..EventInfo::default()
                };
                post(id, &state, RDMA_CM_EVENT_ESTABLISHED, &info);
                watch_disconnect(id, &state, &conn);
            }
            Err(e) => {
                state.inner().connecting = false;
                if !state.stopped() {
                    let (kind, info) = failure(e);
                    post(id, &state, kind, &info);
                }
            }
        }
    })
}

/// Starts the thread that connects the id at `id` to `to` for the QP numbered `qpn`, which
/// its application brings up itself (an id without a QP): `CONNECT_RESPONSE` with the REP's
/// private data, after which the application moves its QP with `rdma_init_qp_attr` and
/// sends the RTU with `rdma_establish`; or the failure, as [`spawn_connect`] reports it.
pub(crate) fn spawn_connect_own(
    id: usize,
    state: Arc<IdState>,
    nic: Nic,
    qpn: Qpn,
    to: SocketAddr,
    param: ConnParam,
) -> Result<(), c_int> {
    let psn = state.inner().psn;
    spawn("ferroce-cm-connect", move || match Connection::connect_own(
        &nic,
        qpn,
        psn,
        to.ip(),
        to.port(),
        &param,
    ) {
        Ok(replied) => {
            let settled = *replied.settled();
            let info = EventInfo {
                private: replied.private_data().to_vec(),
                responder_resources: settled.params.max_dest_rd_atomic,
                initiator_depth: settled.params.max_rd_atomic,
                qp_num: settled.params.dest_qpn.value(),
                ..EventInfo::default()
            };
            {
                let mut inner = state.inner();
                inner.connecting = false;
                inner.settled = Some(settled);
                inner.replied = Some(replied);
            }
            if !state.stopped() {
                post(id, &state, RDMA_CM_EVENT_CONNECT_RESPONSE, &info);
            }
        }
        Err(e) => {
            state.inner().connecting = false;
            if !state.stopped() {
                let (kind, info) = failure(e);
                post(id, &state, kind, &info);
            }
        }
    })
}

/// `rdma_establish`: the RTU for the REP the id holds; the connection then closes as any
/// other (`DISCONNECTED`).
pub(crate) fn establish(id: usize, state: &Arc<IdState>) -> Result<(), c_int> {
    let replied = state.inner().replied.take().ok_or(libc::EINVAL)?;
    let conn = Arc::new(replied.establish().map_err(|e| errno_of(&e))?);
    state.inner().conn = Some(Arc::clone(&conn));
    let state = Arc::clone(state);
    spawn("ferroce-cm-established", move || {
        watch_disconnect(id, &state, &conn);
    })
}

/// How long a SIDR request waits for its reply.
const SIDR_WAIT: Duration = Duration::from_secs(10);

/// Starts the thread that resolves the UD QP behind `to` by SIDR (`rdma_connect` on a
/// `RDMA_PS_UDP` id): `ESTABLISHED` with the peer's address vector, QPN and Q_Key in
/// `param.ud`, or `UNREACHABLE` (status: the SIDR status, or `-ETIMEDOUT`).
pub(crate) fn spawn_resolve_ud(
    id: usize,
    state: Arc<IdState>,
    nic: Nic,
    to: SocketAddr,
    private: Vec<u8>,
) -> Result<(), c_int> {
    spawn("ferroce-cm-sidr", move || {
        let src_port = state.inner().src.map(|s| s.port());
        let result =
            ferroce::cm::resolve_ud_from(&nic, src_port, to.ip(), to.port(), &private, SIDR_WAIT);
        state.inner().connecting = false;
        if state.stopped() {
            return;
        }
        match result {
            Ok(peer) => {
                let info = EventInfo {
                    ud: Some((
                        convert::ah_attr(peer.address.peer()),
                        peer.qpn.value(),
                        peer.qkey,
                    )),
                    ..EventInfo::default()
                };
                post(id, &state, RDMA_CM_EVENT_ESTABLISHED, &info);
            }
            Err(e) => {
                let status = match e {
                    CmError::Sidr(s) => c_int::from(s.code()),
                    _ => -libc::ETIMEDOUT,
                };
                let info = EventInfo {
                    status,
                    ..EventInfo::default()
                };
                post(id, &state, RDMA_CM_EVENT_UNREACHABLE, &info);
            }
        }
    })
}

/// Starts the thread that waits for an accepted connection's RTU, then its end.
pub(crate) fn spawn_accepted(
    id: usize,
    state: Arc<IdState>,
    conn: Arc<Connection>,
) -> Result<(), c_int> {
    spawn("ferroce-cm-accepted", move || {
        match conn.wait_established(RTU_WAIT) {
            Ok(()) => {
                if state.stopped() {
                    return;
                }
                post(id, &state, RDMA_CM_EVENT_ESTABLISHED, &EventInfo::default());
                watch_disconnect(id, &state, &conn);
            }
            Err(e) => {
                if !state.stopped() {
                    let (kind, info) = failure(e);
                    post(id, &state, kind, &info);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_queue_on_their_channel_and_are_freed_once() {
        let channel = Arc::new(Channel::new(0).unwrap());
        EVENT_CHANNELS.add(0x4000, Arc::clone(&channel));
        let state = IdState::new(RDMA_PS_TCP, 0x4000, false);
        let info = EventInfo {
            status: 8,
            private: b"no".to_vec(),
            ..EventInfo::default()
        };
        post(0x5000, &state, RDMA_CM_EVENT_REJECTED, &info);
        let at = channel.next().unwrap();
        assert!(forget_event(at));
        assert!(!forget_event(at), "an event is acknowledged once");
        EVENT_CHANNELS.remove(0x4000);
    }

    /// librdmacm's rule for `rdma_destroy_id`: it returns once the id's events handed out are
    /// acknowledged, and an event queued but not yet handed out is never handed out after.
    #[test]
    fn a_destroyed_id_waits_for_its_events_and_hands_out_no_more() {
        let channel = Arc::new(Channel::new(0).unwrap());
        EVENT_CHANNELS.add(0x4100, Arc::clone(&channel));
        let state = IdState::new(RDMA_PS_TCP, 0x4100, false);
        post(
            0x5100,
            &state,
            RDMA_CM_EVENT_DISCONNECTED,
            &EventInfo::default(),
        );
        let held = channel.next().unwrap();
        assert!(claim(held), "a live id's event is handed out");
        post(
            0x5100,
            &state,
            RDMA_CM_EVENT_ESTABLISHED,
            &EventInfo::default(),
        );

        let (done, destroyed) = std::sync::mpsc::channel();
        let events = Arc::clone(&state.events);
        let destroyer = std::thread::spawn(move || {
            events.destroy_and_wait();
            let _ = done.send(());
        });
        assert!(
            destroyed.recv_timeout(Duration::from_millis(200)).is_err(),
            "rdma_destroy_id returned with an event of the id unacknowledged"
        );
        assert!(forget_event(held));
        destroyed.recv().unwrap();
        destroyer.join().unwrap();

        let queued = channel.next().unwrap();
        assert!(
            !claim(queued),
            "an event queued before the destroy is not handed out"
        );
        assert!(
            !forget_event(queued),
            "and is forgotten, for the caller to free"
        );
        EVENT_CHANNELS.remove(0x4100);
    }

    #[test]
    fn a_rej_becomes_rejected_with_its_reason() {
        let (kind, info) = failure(CmError::Rejected {
            reason: ferroce::cm::RejectReason::ConsumerDefined,
            private_data: b"nope".to_vec(),
        });
        assert_eq!(kind, RDMA_CM_EVENT_REJECTED);
        assert_eq!(info.status, 28);
        assert_eq!(info.private, b"nope");
        let (kind, info) = failure(CmError::Rejected {
            reason: ferroce::cm::RejectReason::InvalidServiceId,
            private_data: Vec::new(),
        });
        assert_eq!((kind, info.status), (RDMA_CM_EVENT_REJECTED, 8));
        let (kind, info) = failure(CmError::Unreachable);
        assert_eq!(kind, RDMA_CM_EVENT_UNREACHABLE);
        assert_eq!(info.status, -libc::ETIMEDOUT);
    }

    #[test]
    fn routes_hold_both_addresses() {
        let s: SocketAddr = "127.0.11.1:7174".parse().unwrap();
        let d: SocketAddr = "127.0.11.2:49152".parse().unwrap();
        let r = route(Some(s), Some(d));
        assert_eq!(r.addr.src.addr(), Some(s));
        assert_eq!(r.addr.dst.addr(), Some(d));
    }
}
