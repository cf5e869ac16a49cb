//! librdmacm's C entry points (rdma-core v44's `librdmacm.so.1`, versions `RDMACM_1.0` …
//! `RDMACM_1.3`), in the same shared object as the drop-in libibverbs so that an id's
//! `verbs`, its PD, CQs and QP are this library's own objects: `scripts/build-dropin.sh`
//! links `librdmacm.so.1` to the same file, and the loader maps it once for a program that
//! needs both names. The state and threads behind them are `crate::cm`'s.
//!
//! Offered: event channels (pollable fd), ids in the TCP port space (`RDMA_PS_TCP`: RC)
//! and the UDP one (`RDMA_PS_UDP`: UD), `rdma_bind_addr`, `rdma_resolve_addr`/`_route` (both
//! complete at once: the soft NIC has one address and every peer is reached through UDP),
//! `rdma_listen`, `rdma_connect`, `rdma_accept`, `rdma_reject`, `rdma_disconnect`,
//! `rdma_get_cm_event`/`rdma_ack_cm_event`, `rdma_create_qp`/`_ex`/`rdma_destroy_qp` (the CQs made
//! per id when the attributes name none, as librdmacm does), `rdma_set_option` (the id
//! options are accepted and ignored), `rdma_migrate_id`, `rdma_getaddrinfo`/`rdma_freeaddrinfo`,
//! `rdma_event_str`, `rdma_get_src_port`/`_dst_port`, `rdma_get_devices`/`rdma_free_devices`.
//! An id with a QP has it brought up by the CM; one without names `conn_param->qp_num` on
//! the wire and leaves that QP to its program, as librdmacm does: `CONNECT_RESPONSE`,
//! `rdma_init_qp_attr` for INIT, RTR and RTS, and `rdma_establish` (UCX's rdmacm connection
//! manager works this way).
//! UD ids resolve the peer's QP by SIDR (`rdma_connect` → `ESTABLISHED` with `param.ud`;
//! `rdma_accept` on the listener's child sends the SIDR reply). Synchronous ids (made without
//! a channel) wait in each call for its event, as librdmacm's do: `rdma_create_ep`,
//! `rdma_get_request`, `rdma_destroy_ep`. Everything else fails with -1 (or NULL) and errno
//! `ENOSYS`: multicast, SRQs on ids, ECE and rsockets; `rdma_notify` is 0.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::net::SocketAddr;
use std::ptr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ferroce::cm::Listener;

use crate::abi::*;
use crate::cm::{self, EventInfo, IdState, ListenInfo, EVENT_CHANNELS, IDS};
use crate::cm_abi::*;
use crate::context::{self, ContextState};
use crate::convert;
use crate::entry::{cq, device, qp};
use crate::fence;
use crate::objects::QPS;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The errno the last call set.
fn last_errno(otherwise: c_int) -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .filter(|&e| e != 0)
        .unwrap_or(otherwise)
}

/// The context every id uses (librdmacm opens each device once): `ferroce0`'s, opened on
/// first use.
static CM_CONTEXT: Mutex<usize> = Mutex::new(0);
/// The PD `rdma_create_qp` uses when given none.
static CM_PD: Mutex<usize> = Mutex::new(0);

fn cm_context() -> Result<(usize, Arc<ContextState>), c_int> {
    let mut at = lock(&CM_CONTEXT);
    if *at == 0 {
        let ctx = device::open_ferroce0();
        if ctx.is_null() {
            return Err(last_errno(libc::ENODEV));
        }
        *at = ctx as usize;
    }
    let state = context::context(*at).ok_or(libc::ENODEV)?;
    Ok((*at, state))
}

fn default_pd(ctx: *mut ibv_context) -> Result<*mut ibv_pd, c_int> {
    let mut at = lock(&CM_PD);
    if *at == 0 {
        // SAFETY: `ctx` is a live context of this library (an id's `verbs`).
        let pd = unsafe { device::alloc_pd(ctx) };
        if pd.is_null() {
            return Err(last_errno(libc::ENOMEM));
        }
        *at = pd as usize;
    }
    Ok(*at as *mut ibv_pd)
}

/// Local rdma_cm ports for ids bound to port 0 (the kernel's ephemeral range).
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

fn ephemeral_port() -> u16 {
    let n = NEXT_PORT.fetch_add(1, Ordering::Relaxed);
    0xc000 | ((std::process::id() as u16).wrapping_mul(97).wrapping_add(n) & 0x3fff)
}

fn id_state(id: *mut rdma_cm_id) -> Result<Arc<IdState>, c_int> {
    IDS.get(id as usize).ok_or(libc::EINVAL)
}

/// What librdmacm's synchronous ids (made without a channel) do after each call that
/// starts something: acknowledge the id's last event, wait for the next on its own channel
/// and keep it in `id->event`; its failure (`REJECTED`: `ECONNREFUSED`; else the status) is
/// the call's. Asynchronous ids return at once.
fn complete(id: *mut rdma_cm_id, state: &IdState) -> Result<c_int, c_int> {
    if !state.own_channel.load(Ordering::Acquire) {
        return Ok(0);
    }
    // SAFETY: `id` is a live id of this library, used by this thread alone meanwhile (the
    // synchronous API's contract).
    let c = unsafe { &mut *id };
    if !c.event.is_null() {
        // SAFETY: `c.event` is an event this library handed out (or `ack` refuses it).
        unsafe { ack_cm_event(c.event) };
        c.event = ptr::null_mut();
    }
    let channel = EVENT_CHANNELS.get(c.channel as usize).ok_or(libc::EINVAL)?;
    let at = take_event(&channel).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
    c.event = at as *mut rdma_cm_event;
    // SAFETY: the queue holds live events of `crate::cm::post`.
    let (kind, status) = unsafe { ((*c.event).event, (*c.event).status) };
    match status {
        0 => Ok(0),
        _ if kind == RDMA_CM_EVENT_REJECTED => Err(libc::ECONNREFUSED),
        s => Err(s.abs()),
    }
}

/// The address at `p`: `Ok(None)` for NULL, `EAFNOSUPPORT` for a family other than
/// `AF_INET`/`AF_INET6`.
///
/// # Safety
///
/// `p` must be NULL or a readable `struct sockaddr` of its family's length.
unsafe fn read_sockaddr(p: *const c_void) -> Result<Option<SocketAddr>, c_int> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller vouches for a sockaddr, which starts with its family.
    let family = unsafe { p.cast::<u16>().read_unaligned() };
    let len = match c_int::from(family) {
        libc::AF_INET => 16,
        libc::AF_INET6 => 28,
        _ => return Err(libc::EAFNOSUPPORT),
    };
    let mut s = sockaddr_storage::default();
    // SAFETY: the caller vouches for `len` bytes (its family's sockaddr); `s` holds 128.
    unsafe { ptr::copy_nonoverlapping(p.cast::<u8>(), s.0.as_mut_ptr(), len) };
    s.addr().map(Some).ok_or(libc::EAFNOSUPPORT)
}

/// `rdma_create_event_channel`: a channel whose `fd` is readable while an event waits.
pub(crate) unsafe extern "C" fn create_event_channel() -> *mut rdma_event_channel {
    fence::pointer(|| cm::new_channel().map(|(c, _)| c))
}

/// Frees a channel `cm::new_channel` made.
fn free_channel(channel: *mut rdma_event_channel) -> Result<(), c_int> {
    let gone = EVENT_CHANNELS
        .remove(channel as usize)
        .ok_or(libc::EINVAL)?;
    cm::channel_destroyed(channel as usize, crate::sys::is_nonblocking(gone.fd()));
    // SAFETY: the table held `channel` from `Box::into_raw` in `cm::new_channel` and has just
    // forgotten it.
    drop(unsafe { Box::from_raw(channel) });
    Ok(())
}

/// `rdma_destroy_event_channel`: events not acknowledged stay valid until they are.
pub(crate) unsafe extern "C" fn destroy_event_channel(channel: *mut rdma_event_channel) {
    fence::unit(|| {
        let _ = free_channel(channel);
    });
}

/// `rdma_create_id`: an id in `ps` (`RDMA_PS_TCP`; others `ENOSYS`) whose events go to
/// `channel` (NULL: a channel of its own).
pub(crate) unsafe extern "C" fn create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: c_uint,
) -> c_int {
    fence::minus_one(|| {
        if id.is_null() {
            return Err(libc::EINVAL);
        }
        let qp_type = match ps {
            RDMA_PS_TCP => IBV_QPT_RC,
            RDMA_PS_UDP => IBV_QPT_UD,
            _ => return Err(libc::EINVAL),
        };
        let (channel, own) = if channel.is_null() {
            (cm::new_channel()?.0, true)
        } else {
            EVENT_CHANNELS.get(channel as usize).ok_or(libc::EINVAL)?;
            (channel, false)
        };
        let c = Box::into_raw(Box::new(rdma_cm_id {
            verbs: ptr::null_mut(),
            channel,
            context,
            qp: ptr::null_mut(),
            route: cm::route(None, None),
            ps,
            port_num: 0,
            event: ptr::null_mut(),
            send_cq_channel: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq_channel: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            srq: ptr::null_mut(),
            pd: ptr::null_mut(),
            qp_type,
        }));
        IDS.add(
            c as usize,
            Arc::new(IdState::new(ps, channel as usize, own)),
        );
        // SAFETY: the caller passes where to put the id.
        unsafe { id.write(c) };
        Ok(0)
    })
}

/// `rdma_destroy_id`: stops listening, rejects a request not answered, disconnects a
/// connection still up, and frees the id (its QP must be destroyed first, as librdmacm
/// requires).
pub(crate) unsafe extern "C" fn destroy_id(id: *mut rdma_cm_id) -> c_int {
    fence::minus_one(|| {
        let state = IDS.remove(id as usize).ok_or(libc::EINVAL)?;
        state.stop.store(true, Ordering::Release);
        // Nothing more of this id's is handed out; what was, the program acknowledges first
        // (librdmacm's rule: its CM thread may hold the id's last event).
        let (request, sidr, conn, listening) = {
            let mut inner = state.inner();
            (
                inner.request.take(),
                inner.sidr.take(),
                inner.conn.take(),
                inner.listening.take(),
            )
        };
        if let Some(thread) = listening {
            // It sees `stop` within a tick and drops the listener: the port is free after.
            let _ = thread.join();
        }
        drop(request);
        drop(sidr);
        drop(conn);
        // SAFETY: the table held `id` from `Box::into_raw` (`create_id`, or a connection
        // request in `crate::cm`) and has just forgotten it.
        let c = unsafe { Box::from_raw(id) };
        if !c.event.is_null() {
            // SAFETY: a synchronous id's last event, handed out by this library.
            unsafe { ack_cm_event(c.event) };
        }
        state.events.destroy_and_wait();
        lock(&EP_ATTRS).remove(&(id as usize));
        if state.own_channel.load(Ordering::Acquire) {
            let _ = free_channel(c.channel);
        }
        Ok(0)
    })
}

/// `rdma_bind_addr`: the soft NIC's address or the wildcard, and a port (0: one is chosen).
/// A loopback address other than the NIC's counts as the wildcard, as the kernel's rdma_cm
/// takes it: the id stays without a device (`verbs` NULL), which libfabric's verbs provider
/// reads as "any interface" when it binds `localhost` to find its addresses.
/// `EADDRNOTAVAIL` for another address.
pub(crate) unsafe extern "C" fn bind_addr(id: *mut rdma_cm_id, addr: *const c_void) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        // SAFETY: the caller passes a sockaddr.
        let a = unsafe { read_sockaddr(addr)? }.ok_or(libc::EINVAL)?;
        let (ctx, cstate) = cm_context()?;
        let any = a.ip() != cstate.ip && (a.ip().is_unspecified() || a.ip().is_loopback());
        if !any && a.ip() != cstate.ip {
            return Err(libc::EADDRNOTAVAIL);
        }
        let port = if a.port() == 0 {
            ephemeral_port()
        } else {
            a.port()
        };
        let bound = SocketAddr::new(a.ip(), port);
        let mut inner = state.inner();
        inner.src = Some(bound);
        // SAFETY: `id` is a live id of this library; the program does not use it meanwhile.
        let c = unsafe { &mut *id };
        c.route = cm::route(Some(bound), inner.dst);
        if !any {
            c.verbs = ctx as *mut ibv_context;
            c.port_num = 1;
            if c.pd.is_null() {
                c.pd = default_pd(c.verbs)?;
            }
        }
        Ok(0)
    })
}

/// `rdma_resolve_addr`: completes at once with `RDMA_CM_EVENT_ADDR_RESOLVED`, the id on
/// `ferroce0` (its `verbs`) at the soft NIC's address.
pub(crate) unsafe extern "C" fn resolve_addr(
    id: *mut rdma_cm_id,
    src: *const c_void,
    dst: *const c_void,
    _timeout_ms: c_int,
) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        // SAFETY: the caller passes NULL or a sockaddr for each.
        let (src, dst) = unsafe { (read_sockaddr(src)?, read_sockaddr(dst)?) };
        let dst = dst.ok_or(libc::EINVAL)?;
        let (ctx, cstate) = cm_context()?;
        if src.is_some_and(|s| !s.ip().is_unspecified() && s.ip() != cstate.ip) {
            return Err(libc::EADDRNOTAVAIL);
        }
        let mut inner = state.inner();
        let port = inner
            .src
            .map(|s| s.port())
            .or(src.map(|s| s.port()))
            .filter(|&p| p != 0)
            .unwrap_or_else(ephemeral_port);
        let local = SocketAddr::new(cstate.ip, port);
        inner.src = Some(local);
        inner.dst = Some(dst);
        drop(inner);
        // SAFETY: `id` is a live id of this library; the program does not use it meanwhile.
        let c = unsafe { &mut *id };
        c.verbs = ctx as *mut ibv_context;
        c.port_num = 1;
        c.route = cm::route(Some(local), Some(dst));
        if c.pd.is_null() {
            c.pd = default_pd(c.verbs)?;
        }
        cm::post(
            id as usize,
            &state,
            RDMA_CM_EVENT_ADDR_RESOLVED,
            &EventInfo::default(),
        );
        complete(id, &state)
    })
}

/// `rdma_resolve_route`: completes at once with `RDMA_CM_EVENT_ROUTE_RESOLVED`.
pub(crate) unsafe extern "C" fn resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        {
            let mut inner = state.inner();
            if inner.dst.is_none() {
                return Err(libc::EINVAL);
            }
            inner.routed = true;
        }
        cm::post(
            id as usize,
            &state,
            RDMA_CM_EVENT_ROUTE_RESOLVED,
            &EventInfo::default(),
        );
        complete(id, &state)
    })
}

/// `rdma_listen`: takes connection requests on the bound port (an unbound id is bound to
/// the wildcard and a port chosen); each comes as `RDMA_CM_EVENT_CONNECT_REQUEST` with a new
/// id.
pub(crate) unsafe extern "C" fn listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        let (ctx, cstate) = cm_context()?;
        let mut inner = state.inner();
        if inner.listening.is_some() {
            return Ok(0);
        }
        let src = inner.src.unwrap_or_else(|| {
            SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), ephemeral_port())
        });
        let listener = if state.ps == RDMA_PS_UDP {
            Listener::bind_udp(&cstate.nic, src.port())
        } else {
            Listener::bind(&cstate.nic, src.port())
        }
        .map_err(|e| cm::errno_of(&e))?;
        let local = if src.ip().is_unspecified() {
            SocketAddr::new(cstate.ip, src.port())
        } else {
            src
        };
        // SAFETY: `id` is a live id of this library.
        let (context, pd) = unsafe { ((*id).context as usize, (*id).pd) };
        let pd = if pd.is_null() {
            default_pd(ctx as *mut ibv_context)?
        } else {
            pd
        } as usize;
        let thread = cm::spawn_listener(
            Arc::clone(&state),
            listener,
            ListenInfo {
                id: id as usize,
                verbs: ctx,
                pd,
                context,
                local,
            },
        )?;
        inner.src = Some(src);
        inner.listening = Some(thread);
        Ok(0)
    })
}

/// The private data a `struct rdma_conn_param` names.
///
/// # Safety
///
/// `p` must be a readable `rdma_conn_param` whose data pointer names its length in bytes.
unsafe fn private_of(p: &rdma_conn_param) -> Vec<u8> {
    if p.private_data.is_null() || p.private_data_len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller vouches for the bytes.
    unsafe {
        std::slice::from_raw_parts(p.private_data.cast::<u8>(), usize::from(p.private_data_len))
    }
    .to_vec()
}

/// `rdma_connect`: sends the REQ; the outcome comes as `ESTABLISHED` (with the REP's private
/// data), `REJECTED` (status: the REJ's reason, 8 when nobody listens; its private data),
/// `UNREACHABLE` or `CONNECT_ERROR`. An id with a QP (`rdma_create_qp`) has it brought up by
/// the CM; an id without one names `conn_param->qp_num` in the REQ and gets
/// `CONNECT_RESPONSE` instead of `ESTABLISHED`: the program brings its QP up itself
/// (`rdma_init_qp_attr`) and calls `rdma_establish`, as with librdmacm.
pub(crate) unsafe extern "C" fn connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        // SAFETY: `id` is a live id of this library; `param` is NULL or readable.
        let (c, p) = unsafe { (&*id, param.as_ref().copied()) };
        if state.ps == RDMA_PS_UDP {
            // SAFETY: the caller's parameters name their private data.
            let private = p.map(|p| unsafe { private_of(&p) }).unwrap_or_default();
            return connect_ud(id, &state, c, private);
        }
        let qp = id_qp(c, p)?;
        let nic = context::context(c.verbs as usize)
            .ok_or(libc::EINVAL)?
            .nic
            .clone();
        let mut param = match p {
            Some(p) => cm::conn_param(
                p.responder_resources,
                p.initiator_depth,
                p.rnr_retry_count,
                // SAFETY: the caller's parameters name their private data.
                unsafe { private_of(&p) },
            ),
            None => cm::conn_param(1, 1, 7, Vec::new()),
        };
        if param.private_data.len() > ferroce::cm::MAX_REQ_PRIVATE {
            return Err(libc::EINVAL);
        }
        let to = {
            let mut inner = state.inner();
            // The peer's rdma_get_peer_addr names the port this id is bound to.
            param.src_port = inner.src.map(|s| s.port());
            if !inner.routed || inner.connecting || inner.conn.is_some() || inner.replied.is_some()
            {
                return Err(libc::EINVAL);
            }
            inner.connecting = true;
            inner.dst.ok_or(libc::EINVAL)?
        };
        let id_at = id as usize;
        match qp {
            IdQp::Ours(qp) => cm::spawn_connect(id_at, Arc::clone(&state), nic, qp, to, param)?,
            IdQp::Programs(qpn) => {
                cm::spawn_connect_own(id_at, Arc::clone(&state), nic, qpn, to, param)?;
            }
        }
        complete(id, &state)
    })
}

/// `rdma_establish`: after `CONNECT_RESPONSE` on an id without a QP, whose program has
/// brought its QP to RTS, sends the RTU; no event follows (librdmacm's). `EINVAL` for an id
/// with no connect response waiting.
pub(crate) unsafe extern "C" fn establish(id: *mut rdma_cm_id) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        cm::establish(id as usize, &state)?;
        Ok(0)
    })
}

/// The QP an RC connection of an id carries.
enum IdQp {
    /// The id's own (`rdma_create_qp`): the CM brings it up.
    Ours(Arc<crate::objects::QpState>),
    /// The one `conn_param->qp_num` names, which its program brings up itself; it may be
    /// any number (UCX's reserves one with a QP it never uses).
    Programs(ferroce::proto::wire::Qpn),
}

/// Which QP `rdma_connect` or `rdma_accept` on `c` with parameters `p` carries: the id's,
/// else `p.qp_num` (`EINVAL` without parameters, for number 0, or for an id QP that is not
/// this library's).
fn id_qp(c: &rdma_cm_id, p: Option<rdma_conn_param>) -> Result<IdQp, c_int> {
    if c.qp.is_null() {
        let n = p.ok_or(libc::EINVAL)?.qp_num;
        Ok(IdQp::Programs(
            ferroce::proto::wire::Qpn::new(n).ok_or(libc::EINVAL)?,
        ))
    } else {
        Ok(IdQp::Ours(QPS.get(c.qp as usize).ok_or(libc::EINVAL)?))
    }
}

/// `rdma_connect` on a `RDMA_PS_UDP` id: a SIDR request for the QP behind the destination;
/// the answer comes as `ESTABLISHED` (its `param.ud`) or `UNREACHABLE`.
fn connect_ud(
    id: *mut rdma_cm_id,
    state: &Arc<IdState>,
    c: &rdma_cm_id,
    private: Vec<u8>,
) -> Result<c_int, c_int> {
    if private.len() > ferroce::cm::MAX_SIDR_PRIVATE {
        return Err(libc::EINVAL);
    }
    let nic = context::context(c.verbs as usize)
        .ok_or(libc::EINVAL)?
        .nic
        .clone();
    let to = {
        let mut inner = state.inner();
        if !inner.routed || inner.connecting {
            return Err(libc::EINVAL);
        }
        inner.connecting = true;
        inner.dst.ok_or(libc::EINVAL)?
    };
    cm::spawn_resolve_ud(id as usize, Arc::clone(state), nic, to, private)?;
    complete(id, state)
}

/// `rdma_accept` on a UD child: a SIDR reply naming the id's QP (or `qp_num`'s) and
/// `RDMA_UDP_QKEY`; no event follows, as with librdmacm.
fn accept_ud(
    c: &rdma_cm_id,
    p: Option<rdma_conn_param>,
    req: ferroce::cm::SidrRequest,
) -> Result<c_int, c_int> {
    let qp = if c.qp.is_null() {
        let n = p.ok_or(libc::EINVAL)?.qp_num;
        QPS.find(|q| q.qp.qpn().value() == n).ok_or(libc::EINVAL)?.1
    } else {
        QPS.get(c.qp as usize).ok_or(libc::EINVAL)?
    };
    req.accept(&qp.qp, RDMA_UDP_QKEY)
        .map_err(|e| cm::errno_of(&e))?;
    Ok(0)
}

/// `rdma_accept`: answers a connection request with a REP, the id's QP brought to RTS; the
/// RTU comes as `RDMA_CM_EVENT_ESTABLISHED`. `param` NULL: the REQ's depths, mirrored. An id
/// without a QP names `param->qp_num` in the REP and leaves that QP to its program, which
/// brings it up with `rdma_init_qp_attr`, as with librdmacm.
pub(crate) unsafe extern "C" fn accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        // SAFETY: `id` is a live id of this library; `param` is NULL or readable.
        let (c, p) = unsafe { (&mut *id, param.as_ref().copied()) };
        let sidr = state.inner().sidr.take();
        if let Some(req) = sidr {
            return accept_ud(c, p, req);
        }
        let qp = id_qp(c, p)?;
        let mut inner = state.inner();
        let req = inner.request.take().ok_or(libc::EINVAL)?;
        let param = accept_param(&req, p);
        let conn = match qp {
            IdQp::Ours(qp) => {
                let conn = req.accept(&qp.qp, &param).map_err(|e| cm::errno_of(&e))?;
                // SAFETY: `c.qp` is a live QP of this library (just looked up).
                unsafe { (*c.qp).state = IBV_QPS_RTS };
                conn
            }
            IdQp::Programs(qpn) => {
                let settled = req.settle(inner.psn, &param);
                let conn = req
                    .accept_own(qpn, inner.psn, &param)
                    .map_err(|e| cm::errno_of(&e))?;
                inner.settled = settled.ok();
                conn
            }
        };
        let conn = Arc::new(conn);
        inner.conn = Some(Arc::clone(&conn));
        drop(inner);
        cm::spawn_accepted(id as usize, Arc::clone(&state), conn)?;
        complete(id, &state)
    })
}

/// The parameters `rdma_accept` answers `req` with: the caller's, or with `p` NULL the REQ's
/// depths mirrored.
fn accept_param(
    req: &ferroce::cm::ConnectRequest,
    p: Option<rdma_conn_param>,
) -> ferroce::cm::ConnParam {
    let r = req.req();
    match p {
        Some(p) => cm::conn_param(
            p.responder_resources,
            p.initiator_depth,
            p.rnr_retry_count,
            // SAFETY: the caller's parameters name their private data.
            unsafe { private_of(&p) },
        ),
        None => cm::conn_param(r.initiator_depth, r.responder_resources, 7, Vec::new()),
    }
}

/// `rdma_reject`: a REJ (reason 28, consumer defined) with `private_data`.
pub(crate) unsafe extern "C" fn reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    len: u8,
) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        let sidr = state.inner().sidr.take();
        if let Some(req) = sidr {
            req.reject().map_err(|e| cm::errno_of(&e))?;
            return Ok(0);
        }
        let data = if private_data.is_null() {
            Vec::new()
        } else {
            // SAFETY: the caller passes `len` readable bytes.
            unsafe { std::slice::from_raw_parts(private_data.cast::<u8>(), usize::from(len)) }
                .to_vec()
        };
        // A connect response is refused as a request is (the kernel's REJ for a REP).
        let replied = state.inner().replied.take();
        if let Some(replied) = replied {
            replied.reject(&data).map_err(|e| cm::errno_of(&e))?;
            return Ok(0);
        }
        let req = state.inner().request.take().ok_or(libc::EINVAL)?;
        req.reject(&data).map_err(|e| cm::errno_of(&e))?;
        Ok(0)
    })
}

/// `rdma_disconnect`: the QP to ERR and a DREQ; `RDMA_CM_EVENT_DISCONNECTED` follows with the
/// DREP. A connection the peer closed already gives 0.
pub(crate) unsafe extern "C" fn disconnect(id: *mut rdma_cm_id) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        let conn = state.inner().conn.clone().ok_or(libc::EINVAL)?;
        let _ = conn.disconnect(Duration::ZERO);
        complete(id, &state)
    })
}

/// `rdma_get_cm_event`: waits for the channel's next event (or fails with `EAGAIN` on a
/// non-blocking `fd`). On a channel the program has just destroyed it waits for good (`EBADF`
/// on a non-blocking `fd`, librdmacm's read of a closed one); on an address that was never a
/// channel it fails with `EINVAL`.
pub(crate) unsafe extern "C" fn get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    fence::minus_one(|| {
        let Some(ch) = EVENT_CHANNELS.get(channel as usize) else {
            return match cm::destroyed_lately(channel as usize) {
                Some(true) => Err(libc::EBADF),
                Some(false) => loop {
                    std::thread::park();
                },
                None => Err(libc::EINVAL),
            };
        };
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let at = take_event(&ch).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        // SAFETY: the caller passes where to put the event.
        unsafe { event.write(at as *mut rdma_cm_event) };
        Ok(0)
    })
}

/// The channel's next event of an id still alive; those of ids destroyed since they were
/// queued are freed on the way (`cm::claim`).
fn take_event(channel: &crate::objects::Channel) -> std::io::Result<usize> {
    loop {
        let at = channel.next()?;
        if cm::claim(at) {
            return Ok(at);
        }
        // SAFETY: the event was queued from `Box::into_raw` of an `EventBlock` in
        // `crate::cm::queue`, and `claim` has just forgotten it: nobody else frees it.
        drop(unsafe { Box::from_raw(at as *mut cm::EventBlock) });
    }
}

/// `rdma_ack_cm_event`: frees an event (and its private data).
pub(crate) unsafe extern "C" fn ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    fence::minus_one(|| {
        if !cm::forget_event(event as usize) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the live set held `event` from `Box::into_raw` of an `EventBlock` (whose
        // first field it is) in `crate::cm::post`, and has just forgotten it.
        drop(unsafe { Box::from_raw(event.cast::<cm::EventBlock>()) });
        Ok(0)
    })
}

/// Moves a new QP as librdmacm does: RC/UC to INIT (port 1, P_Key index 0, remote READ and
/// WRITE), UD to RTS with `RDMA_UDP_QKEY`.
fn init_qp(q: *mut ibv_qp, qp_type: c_uint) -> c_int {
    let mut attr = ibv_qp_attr {
        qp_state: IBV_QPS_INIT,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
        qkey: RDMA_UDP_QKEY,
        ..ibv_qp_attr::default()
    };
    let common = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if qp_type != IBV_QPT_UD {
        // SAFETY: `q` is a live QP of this library; `attr` lives across the call.
        return unsafe { qp::modify_qp(q, &raw mut attr, common | IBV_QP_ACCESS_FLAGS) };
    }
    // SAFETY: as above, each step.
    unsafe {
        let r = qp::modify_qp(q, &raw mut attr, common | IBV_QP_QKEY);
        if r != 0 {
            return r;
        }
        attr.qp_state = IBV_QPS_RTR;
        let r = qp::modify_qp(q, &raw mut attr, IBV_QP_STATE);
        if r != 0 {
            return r;
        }
        attr.qp_state = IBV_QPS_RTS;
        qp::modify_qp(q, &raw mut attr, IBV_QP_STATE | IBV_QP_SQ_PSN)
    }
}

/// Frees the CQs and channels `rdma_create_qp` made for the id.
///
/// # Safety
///
/// `c` must be a live id whose CQ fields are this library's objects or NULL.
unsafe fn free_own_cqs(c: &mut rdma_cm_id) {
    // SAFETY: the caller vouches for the fields; each destroy checks its pointer.
    unsafe {
        if !c.send_cq.is_null() {
            cq::destroy_cq(c.send_cq);
        }
        if !c.recv_cq.is_null() && c.recv_cq != c.send_cq {
            cq::destroy_cq(c.recv_cq);
        }
        if !c.send_cq_channel.is_null() {
            cq::destroy_comp_channel(c.send_cq_channel);
        }
        if !c.recv_cq_channel.is_null() && c.recv_cq_channel != c.send_cq_channel {
            cq::destroy_comp_channel(c.recv_cq_channel);
        }
    }
    c.send_cq = ptr::null_mut();
    c.recv_cq = ptr::null_mut();
    c.send_cq_channel = ptr::null_mut();
    c.recv_cq_channel = ptr::null_mut();
}

/// `rdma_create_qp`: a QP of the drop-in libibverbs on the id's context (`pd` NULL: the id's,
/// or one the library keeps), moved to INIT; CQs and completion channels are made for the id
/// when `attr` names none.
pub(crate) unsafe extern "C" fn create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `id` is a live id of this library; `attr` the caller's.
        let (c, a) = unsafe { (&mut *id, &mut *attr) };
        if c.verbs.is_null() || !c.qp.is_null() {
            return Err(libc::EINVAL);
        }
        let pd = if !pd.is_null() {
            pd
        } else if !c.pd.is_null() {
            c.pd
        } else {
            default_pd(c.verbs)?
        };
        let own = a.send_cq.is_null() || a.recv_cq.is_null();
        if own {
            // SAFETY: `c.verbs` is the live context the id resolved to.
            unsafe {
                for (channel, cq_at, depth, slot) in [
                    (
                        &mut c.send_cq_channel,
                        &mut c.send_cq,
                        a.cap.max_send_wr,
                        &mut a.send_cq,
                    ),
                    (
                        &mut c.recv_cq_channel,
                        &mut c.recv_cq,
                        a.cap.max_recv_wr,
                        &mut a.recv_cq,
                    ),
                ] {
                    if !slot.is_null() {
                        continue;
                    }
                    *channel = cq::create_comp_channel(c.verbs);
                    if channel.is_null() {
                        break;
                    }
                    // The CQ's context is the id, as librdmacm makes it (`rdma_get_*_comp`
                    // asserts so).
                    *cq_at = cq::create_cq(
                        c.verbs,
                        c_int::try_from(depth.max(1)).unwrap_or(c_int::MAX),
                        id.cast(),
                        *channel,
                        0,
                    );
                    *slot = *cq_at;
                }
            }
            if a.send_cq.is_null() || a.recv_cq.is_null() {
                let e = last_errno(libc::ENOMEM);
                // SAFETY: the fields hold what was just made, or NULL.
                unsafe { free_own_cqs(c) };
                return Err(e);
            }
        }
        // SAFETY: `pd` is a PD of this library (checked by `create_qp`); `attr` the caller's.
        let q = unsafe { qp::create_qp(pd, attr) };
        let fail = |c: &mut rdma_cm_id, e: c_int| {
            if own {
                // SAFETY: the fields hold what this call made.
                unsafe { free_own_cqs(c) };
            }
            Err(e)
        };
        if q.is_null() {
            return fail(c, last_errno(libc::ENOMEM));
        }
        let r = init_qp(q, a.qp_type);
        if r != 0 {
            // SAFETY: `q` was just made.
            unsafe { qp::destroy_qp(q) };
            return fail(c, r);
        }
        c.qp = q;
        state.inner().own_cqs = own;
        Ok(0)
    })
}

/// `IBV_QP_INIT_ATTR_PD`: `ibv_qp_init_attr_ex.pd` is set.
const IBV_QP_INIT_ATTR_PD: u32 = 1;
/// Where `struct ibv_qp_init_attr_ex` keeps `comp_mask` and `pd` (after the fields it shares
/// with `struct ibv_qp_init_attr`; `comp_mask` in that structure's tail padding).
const QP_INIT_EX_COMP_MASK: usize = 60;
const QP_INIT_EX_PD: usize = 64;

/// `rdma_create_qp_ex`: `rdma_create_qp` with the extended attributes; only the PD may be
/// given among the extensions (`EOPNOTSUPP` for the others, as on a device without them).
pub(crate) unsafe extern "C" fn create_qp_ex(id: *mut rdma_cm_id, attr: *mut c_void) -> c_int {
    fence::minus_one(|| {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let bytes = attr.cast::<u8>();
        // SAFETY: the caller passes a `struct ibv_qp_init_attr_ex` (136 bytes), which starts
        // with a `struct ibv_qp_init_attr`'s fields and holds `comp_mask` and `pd` at these
        // offsets.
        let (comp_mask, pd, mut plain) = unsafe {
            (
                bytes
                    .add(QP_INIT_EX_COMP_MASK)
                    .cast::<u32>()
                    .read_unaligned(),
                bytes
                    .add(QP_INIT_EX_PD)
                    .cast::<*mut ibv_pd>()
                    .read_unaligned(),
                attr.cast::<ibv_qp_init_attr>().read_unaligned(),
            )
        };
        if comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            pd
        } else {
            ptr::null_mut()
        };
        // SAFETY: `plain` lives across the call.
        if unsafe { create_qp(id, pd, &raw mut plain) } != 0 {
            return Err(last_errno(libc::EINVAL));
        }
        let a = attr.cast::<ibv_qp_init_attr>();
        // SAFETY: as above; only the fields `rdma_create_qp` fills are written back.
        unsafe {
            (*a).cap = plain.cap;
            (*a).send_cq = plain.send_cq;
            (*a).recv_cq = plain.recv_cq;
        }
        Ok(0)
    })
}

/// `rdma_destroy_qp`: destroys the id's QP, and the CQs `rdma_create_qp` made for it.
pub(crate) unsafe extern "C" fn destroy_qp(id: *mut rdma_cm_id) {
    fence::unit(|| {
        let Ok(state) = id_state(id) else {
            return;
        };
        // SAFETY: `id` is a live id of this library.
        let c = unsafe { &mut *id };
        if !c.qp.is_null() {
            // SAFETY: the id's QP is this library's (or already gone: then EINVAL).
            unsafe { qp::destroy_qp(c.qp) };
            c.qp = ptr::null_mut();
        }
        let own = std::mem::take(&mut state.inner().own_cqs);
        if own {
            // SAFETY: the fields hold what `create_qp` made.
            unsafe { free_own_cqs(c) };
        }
    });
}

/// `rdma_init_qp_attr`: the attributes and mask that bring a program's own QP to the state
/// `attr->qp_state` asks, as the kernel's CM gives them: INIT (port 1, P_Key index 0, remote
/// READ and WRITE) on any id; RTR and RTS once the id knows its peer: a connection request
/// not yet answered (its REQ, with the first PSN this id's REP will announce), a connect
/// response, or a connection accepted or made that way. `EINVAL` before that, as the kernel
/// answers an id in the wrong state.
pub(crate) unsafe extern "C" fn init_qp_attr(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        if attr.is_null() || mask.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes both.
        let want = unsafe { (*attr).qp_state };
        if want == IBV_QPS_INIT {
            // SAFETY: as above.
            unsafe {
                (*attr).pkey_index = 0;
                (*attr).port_num = 1;
                (*attr).qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
                mask.write(IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
            }
            return Ok(0);
        }
        let settled = {
            let inner = state.inner();
            match (&inner.request, inner.settled) {
                (Some(req), _) => req.settle(inner.psn, &accept_param(req, None)).ok(),
                (None, settled) => settled,
            }
        }
        .ok_or(libc::EINVAL)?;
        let wanted = match want {
            IBV_QPS_RTR => settled.rtr(),
            IBV_QPS_RTS => settled.rts(),
            _ => return Err(libc::EINVAL),
        };
        let (value, bits) = convert::ibv_qp_attr_of(&wanted);
        // SAFETY: as above.
        unsafe {
            attr.write(value);
            mask.write(bits);
        }
        Ok(0)
    })
}

/// `rdma_event_str`.
pub(crate) unsafe extern "C" fn event_str(event: c_uint) -> *const c_char {
    fence::value(
        || c"UNKNOWN EVENT".as_ptr(),
        || {
            EVENT_NAMES
                .get(event as usize)
                .map_or(c"UNKNOWN EVENT".as_ptr(), |s| s.as_ptr())
        },
    )
}

/// The port (network order, as stored) of an id's source or destination address.
fn port_of(id: *mut rdma_cm_id, dst: bool) -> u16 {
    if id_state(id).is_err() {
        return 0;
    }
    // SAFETY: `id` is a live id of this library.
    let s = unsafe {
        if dst {
            (*id).route.addr.dst
        } else {
            (*id).route.addr.src
        }
    };
    u16::from_ne_bytes([s.0[2], s.0[3]])
}

/// `rdma_get_src_port`.
pub(crate) unsafe extern "C" fn get_src_port(id: *mut rdma_cm_id) -> u16 {
    fence::value(|| 0, || port_of(id, false))
}

/// `rdma_get_dst_port`.
pub(crate) unsafe extern "C" fn get_dst_port(id: *mut rdma_cm_id) -> u16 {
    fence::value(|| 0, || port_of(id, true))
}

/// `rdma_set_option`: the id options (TOS, REUSEADDR, AFONLY, ACK_TIMEOUT) are accepted and
/// have no effect on the soft NIC; others `ENOSYS`.
pub(crate) unsafe extern "C" fn set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    _optval: *mut c_void,
    _optlen: usize,
) -> c_int {
    fence::minus_one(|| {
        id_state(id)?;
        if level == RDMA_OPTION_ID && (0..=RDMA_OPTION_ID_ACK_TIMEOUT).contains(&optname) {
            Ok(0)
        } else {
            Err(libc::ENOSYS)
        }
    })
}

/// `rdma_notify`: a program passing on an async event of its QP (`IBV_EVENT_COMM_EST`, data
/// before the RTU); ferroce's CM sees that data itself, so there is nothing to do: 0 for a
/// live id.
pub(crate) unsafe extern "C" fn notify(id: *mut rdma_cm_id, _event: c_uint) -> c_int {
    fence::minus_one(|| id_state(id).map(|_| 0))
}

/// `rdma_migrate_id`: later events of the id go to `channel`; the id is asynchronous from
/// then on, and a channel of its own (a synchronous id's) is freed. `channel` NULL makes it
/// synchronous, with a new channel of its own, as librdmacm does. libfabric's verbs provider
/// creates its ids without a channel and migrates them to its event queue's.
pub(crate) unsafe extern "C" fn migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    fence::minus_one(|| {
        let state = id_state(id)?;
        let (channel, own) = if channel.is_null() {
            (cm::new_channel()?.0, true)
        } else {
            EVENT_CHANNELS.get(channel as usize).ok_or(libc::EINVAL)?;
            (channel, false)
        };
        // SAFETY: `id` is a live id of this library, not used by the program meanwhile.
        let c = unsafe { &mut *id };
        if !c.event.is_null() {
            // SAFETY: a synchronous id's last event, handed out by this library.
            unsafe { ack_cm_event(c.event) };
            c.event = ptr::null_mut();
        }
        let old = c.channel;
        state.channel.store(channel as usize, Ordering::Release);
        c.channel = channel;
        if state.own_channel.swap(own, Ordering::AcqRel) {
            let _ = free_channel(old);
        }
        Ok(0)
    })
}

/// `rdma_getaddrinfo`'s answer, freed whole by `rdma_freeaddrinfo`.
#[repr(C)]
struct AddrInfoBlock {
    ai: rdma_addrinfo,
    src: sockaddr_storage,
    dst: sockaddr_storage,
}

/// Answers `rdma_getaddrinfo` handed out and not yet freed.
static LIVE_ADDRINFO: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `rdma_getaddrinfo`: `node` and `service` resolved by the system's `getaddrinfo`, as the
/// destination (or, with `RAI_PASSIVE`, the source); with neither, the hints' own source and
/// destination. Failures are `EAI_*` codes as `getaddrinfo` returns them, errno set to the
/// same, as librdmacm does.
pub(crate) unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    fence::value(
        || libc::EAI_SYSTEM,
        || {
            if res.is_null() {
                return eai(libc::EAI_NONAME);
            }
            // SAFETY: the caller passes NULL or its hints.
            let h = unsafe { hints.as_ref().copied() };
            let flags = h.map_or(0, |h| h.ai_flags);
            let passive = flags & RAI_PASSIVE != 0;
            let hinted = |p: *mut sockaddr_storage| -> Option<SocketAddr> {
                // SAFETY: the hints' addresses are NULL or sockaddrs.
                (!p.is_null())
                    .then(|| unsafe { read_sockaddr(p.cast()) }.ok().flatten())
                    .flatten()
            };
            if node.is_null() && service.is_null() {
                // Nothing to resolve: the hints' own addresses, as librdmacm answers
                // (libfabric's verbs provider asks this way with a destination in the hints).
                let (src, dst) = h.map_or((None, None), |h| {
                    (hinted(h.ai_src_addr), hinted(h.ai_dst_addr))
                });
                if src.is_none() && dst.is_none() {
                    return eai(libc::EAI_NONAME);
                }
                // SAFETY: checked non-NULL above.
                unsafe { res.write(addrinfo_block(h, flags, src, dst)) };
                return 0;
            }
            // SAFETY: all-zero is a valid `struct addrinfo` (NULL pointers, no flags).
            let mut gh: libc::addrinfo = unsafe { std::mem::zeroed() };
            gh.ai_flags = if passive { libc::AI_PASSIVE } else { 0 }
                | if flags & 2 != 0 {
                    libc::AI_NUMERICHOST
                } else {
                    0
                };
            gh.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
            gh.ai_socktype = libc::SOCK_STREAM;
            let mut out: *mut libc::addrinfo = ptr::null_mut();
            // SAFETY: `node` and `service` are NULL or C strings, `gh` and `out` live across
            // the call.
            let rc = unsafe { libc::getaddrinfo(node, service, &raw const gh, &raw mut out) };
            if rc != 0 {
                return eai(rc);
            }
            let mut found = None;
            let mut cur = out;
            while let Some(a) = {
                // SAFETY: `cur` is NULL or an entry of the list getaddrinfo returned.
                unsafe { cur.as_ref() }
            } {
                // SAFETY: each entry's `ai_addr` is a sockaddr of its family.
                if let Ok(Some(s)) = unsafe { read_sockaddr(a.ai_addr.cast()) } {
                    found = Some(s);
                    break;
                }
                cur = a.ai_next;
            }
            // SAFETY: `out` is the list getaddrinfo returned, freed once.
            unsafe { libc::freeaddrinfo(out) };
            let Some(found) = found else {
                return eai(libc::EAI_FAMILY);
            };
            let src = h.and_then(|h| hinted(h.ai_src_addr));
            let src = if passive { Some(found) } else { src };
            let dst = (!passive).then_some(found);
            // SAFETY: checked non-NULL above.
            unsafe { res.write(addrinfo_block(h, flags, src, dst)) };
            0
        },
    )
}

/// An `EAI_*` failure of `rdma_getaddrinfo`, with errno set to it as librdmacm sets it.
fn eai(code: c_int) -> c_int {
    crate::sys::set_errno(code);
    code
}

/// A new `rdma_getaddrinfo` answer naming `src` and `dst`, the hints' types and flags kept.
fn addrinfo_block(
    h: Option<rdma_addrinfo>,
    flags: c_int,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
) -> *mut rdma_addrinfo {
    let Some(either) = dst.or(src) else {
        return ptr::null_mut();
    };
    let mut block = Box::new(AddrInfoBlock {
        ai: rdma_addrinfo {
            ai_flags: flags,
            ai_family: if either.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            },
            ai_qp_type: h
                .map(|h| h.ai_qp_type)
                .filter(|&t| t != 0)
                .unwrap_or(IBV_QPT_RC as c_int),
            ai_port_space: h
                .map(|h| h.ai_port_space)
                .filter(|&p| p != 0)
                .unwrap_or(RDMA_PS_TCP as c_int),
            ai_src_len: src.map_or(0, sockaddr_storage::len),
            ai_dst_len: dst.map_or(0, sockaddr_storage::len),
            ai_src_addr: ptr::null_mut(),
            ai_dst_addr: ptr::null_mut(),
            ai_src_canonname: ptr::null_mut(),
            ai_dst_canonname: ptr::null_mut(),
            ai_route_len: 0,
            ai_route: ptr::null_mut(),
            ai_connect_len: 0,
            ai_connect: ptr::null_mut(),
            ai_next: ptr::null_mut(),
        },
        src: src.map(sockaddr_storage::of).unwrap_or_default(),
        dst: dst.map(sockaddr_storage::of).unwrap_or_default(),
    });
    if src.is_some() {
        block.ai.ai_src_addr = &raw mut block.src;
    }
    if dst.is_some() {
        block.ai.ai_dst_addr = &raw mut block.dst;
    }
    let at = Box::into_raw(block);
    lock(&LIVE_ADDRINFO).push(at as usize);
    at.cast()
}

/// `rdma_freeaddrinfo`: frees what `rdma_getaddrinfo` returned (anything else is ignored).
pub(crate) unsafe extern "C" fn freeaddrinfo(res: *mut rdma_addrinfo) {
    fence::unit(|| {
        let mut live = lock(&LIVE_ADDRINFO);
        if let Some(i) = live.iter().position(|&a| a == res as usize) {
            live.swap_remove(i);
            // SAFETY: the list held `res` from `Box::into_raw` of an `AddrInfoBlock` (whose
            // first field it is) in `getaddrinfo`, and has just forgotten it.
            drop(unsafe { Box::from_raw(res.cast::<AddrInfoBlock>()) });
        }
    });
}

/// Arrays `rdma_get_devices` handed out and `rdma_free_devices` has not freed.
static DEVICE_LISTS: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// `rdma_get_devices`: the NULL-terminated list of the CM's contexts (`ferroce0`'s, opened
/// once for the process); `*num_devices` (when given) is 1. NULL with errno set when the
/// device cannot be opened.
pub(crate) unsafe extern "C" fn get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    fence::pointer(|| {
        let opened = cm_context();
        if !num_devices.is_null() {
            // SAFETY: the caller passes NULL or a pointer to an int it owns.
            unsafe { num_devices.write(c_int::from(opened.is_ok())) };
        }
        let (ctx, _) = opened?;
        let list: Box<[*mut ibv_context; 2]> = Box::new([ctx as *mut ibv_context, ptr::null_mut()]);
        let list = Box::into_raw(list).cast::<*mut ibv_context>();
        lock(&DEVICE_LISTS).push(list as usize);
        Ok(list)
    })
}

/// `rdma_free_devices`: frees a list `rdma_get_devices` returned (the contexts stay open, as
/// librdmacm keeps them); anything else is ignored.
pub(crate) unsafe extern "C" fn free_devices(list: *mut *mut ibv_context) {
    fence::unit(|| {
        let mut lists = lock(&DEVICE_LISTS);
        if let Some(i) = lists.iter().position(|&l| l == list as usize) {
            lists.swap_remove(i);
            // SAFETY: the list held `list` from `Box::into_raw` of this type in `get_devices`
            // and has just forgotten it.
            drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_context; 2]>()) });
        }
    });
}

/// The QP attributes a passive endpoint (`rdma_create_ep` with `RAI_PASSIVE`) gives the ids
/// `rdma_get_request` returns, by the listening id's address.
#[derive(Clone, Copy, Debug)]
struct EpAttr {
    qp_context: usize,
    send_cq: usize,
    recv_cq: usize,
    srq: usize,
    cap: ibv_qp_cap,
    qp_type: c_uint,
    sq_sig_all: c_int,
}

static EP_ATTRS: Mutex<std::collections::BTreeMap<usize, EpAttr>> =
    Mutex::new(std::collections::BTreeMap::new());

/// `rdma_create_ep`: a synchronous id for `res`: bound (`RAI_PASSIVE`; the QP attributes kept
/// for `rdma_get_request`), or resolved to the destination with a QP made on it.
pub(crate) unsafe extern "C" fn create_ep(
    id: *mut *mut rdma_cm_id,
    res: *const rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    fence::minus_one(|| {
        if id.is_null() || res.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes an answer of `rdma_getaddrinfo` (or its like).
        let r = unsafe { *res };
        let mut new = ptr::null_mut();
        // SAFETY: a pointer to fill.
        if unsafe {
            create_id(
                ptr::null_mut(),
                &raw mut new,
                ptr::null_mut(),
                r.ai_port_space as c_uint,
            )
        } != 0
        {
            return Err(last_errno(libc::EINVAL));
        }
        let check = |rc: c_int| {
            if rc == 0 {
                Ok(())
            } else {
                Err(last_errno(libc::EINVAL))
            }
        };
        // SAFETY: `new` is the id just made; the addresses are the answer's; `qp_init_attr`
        // is NULL or the caller's.
        let made = unsafe {
            if r.ai_flags & RAI_PASSIVE != 0 {
                check(bind_addr(new, r.ai_src_addr.cast())).map(|()| {
                    if !pd.is_null() {
                        (*new).pd = pd;
                    }
                    if let Some(a) = qp_init_attr.as_ref() {
                        lock(&EP_ATTRS).insert(
                            new as usize,
                            EpAttr {
                                qp_context: a.qp_context as usize,
                                send_cq: a.send_cq as usize,
                                recv_cq: a.recv_cq as usize,
                                srq: a.srq as usize,
                                cap: a.cap,
                                qp_type: r.ai_qp_type as c_uint,
                                sq_sig_all: a.sq_sig_all,
                            },
                        );
                    }
                })
            } else {
                check(resolve_addr(
                    new,
                    r.ai_src_addr.cast(),
                    r.ai_dst_addr.cast(),
                    2000,
                ))
                .and_then(|()| check(resolve_route(new, 2000)))
                .and_then(|()| match qp_init_attr.as_mut() {
                    Some(a) => {
                        a.qp_type = r.ai_qp_type as c_uint;
                        check(create_qp(new, pd, qp_init_attr))
                    }
                    None => Ok(()),
                })
            }
        };
        if let Err(e) = made {
            // SAFETY: `new` is the id just made.
            unsafe { destroy_ep(new) };
            return Err(e);
        }
        // SAFETY: the caller's pointer to fill.
        unsafe { id.write(new) };
        Ok(0)
    })
}

/// `rdma_destroy_ep`: the id's QP (and the CQs made for it), then the id.
pub(crate) unsafe extern "C" fn destroy_ep(id: *mut rdma_cm_id) {
    fence::unit(|| {
        if id_state(id).is_err() {
            return;
        }
        // SAFETY: `id` is a live id of this library.
        unsafe {
            if !(*id).qp.is_null() {
                destroy_qp(id);
            }
            destroy_id(id);
        }
    });
}

/// `rdma_get_request`: on a synchronous listening id, waits for the next connection request
/// and returns its new id (with a QP made as `rdma_create_ep` was asked, and the request in
/// its `event`).
pub(crate) unsafe extern "C" fn get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    fence::minus_one(|| {
        let state = id_state(listen)?;
        if !state.own_channel.load(Ordering::Acquire) || id.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: `listen` is a live id of this library.
        let c = unsafe { &mut *listen };
        if !c.event.is_null() {
            // SAFETY: its last event, handed out by this library.
            unsafe { ack_cm_event(c.event) };
            c.event = ptr::null_mut();
        }
        let channel = EVENT_CHANNELS.get(c.channel as usize).ok_or(libc::EINVAL)?;
        let event = channel
            .next()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?
            as *mut rdma_cm_event;
        // SAFETY: the queue holds live events of `crate::cm::post`.
        let e = unsafe { *event };
        let failed = if e.event == RDMA_CM_EVENT_REJECTED {
            Some(libc::ECONNREFUSED)
        } else if e.status != 0 {
            Some(e.status.abs())
        } else if e.event != RDMA_CM_EVENT_CONNECT_REQUEST {
            Some(libc::EINVAL)
        } else {
            None
        };
        if let Some(errno) = failed {
            c.event = event;
            return Err(errno);
        }
        let attr = lock(&EP_ATTRS).get(&(listen as usize)).copied();
        if let Some(a) = attr {
            let mut init = ibv_qp_init_attr {
                qp_context: a.qp_context as *mut c_void,
                send_cq: a.send_cq as *mut ibv_cq,
                recv_cq: a.recv_cq as *mut ibv_cq,
                srq: a.srq as *mut ibv_srq,
                cap: a.cap,
                qp_type: a.qp_type,
                sq_sig_all: a.sq_sig_all,
            };
            // SAFETY: the request's id is live; `init` lives across the call.
            if unsafe { create_qp(e.id, c.pd, &raw mut init) } != 0 {
                c.event = event;
                return Err(last_errno(libc::ENOMEM));
            }
        }
        // SAFETY: the request's id is live, and the caller's pointer to fill.
        unsafe {
            (*e.id).event = event;
            id.write(e.id);
        }
        Ok(0)
    })
}

/// What librdmacm exports and ferroce does not offer: -1 (as `int` or `ssize_t`) and errno
/// `ENOSYS`.
pub(crate) unsafe extern "C" fn unsupported() -> isize {
    fence::value(
        || -1,
        || {
            crate::sys::set_errno(libc::ENOSYS);
            -1
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn event_names_and_ports() {
        // SAFETY: `event_str` returns static C strings.
        let name = unsafe { CStr::from_ptr(event_str(RDMA_CM_EVENT_CONNECT_REQUEST)) };
        assert_eq!(name, c"RDMA_CM_EVENT_CONNECT_REQUEST");
        // SAFETY: as above.
        let name = unsafe { CStr::from_ptr(event_str(99)) };
        assert_eq!(name, c"UNKNOWN EVENT");
        assert_eq!(port_of(ptr::null_mut(), false), 0);
    }

    #[test]
    fn getaddrinfo_resolves_numeric_hosts() {
        let mut res = ptr::null_mut();
        // SAFETY: C strings and a pointer to fill.
        let rc = unsafe {
            getaddrinfo(
                c"127.0.11.9".as_ptr(),
                c"7174".as_ptr(),
                ptr::null(),
                &raw mut res,
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: `res` was just filled.
        let ai = unsafe { *res };
        // SAFETY: its destination points into the same block.
        let dst = unsafe { *ai.ai_dst_addr };
        assert_eq!(dst.addr(), Some("127.0.11.9:7174".parse().unwrap()));
        assert!(ai.ai_src_addr.is_null());
        assert_eq!(ai.ai_port_space, RDMA_PS_TCP as c_int);
        // SAFETY: freed once.
        unsafe { freeaddrinfo(res) };
    }

    /// rping's CM thread acks `DISCONNECTED` and calls `rdma_get_cm_event` again while its
    /// main thread destroys the id and then the channel: whichever comes first, the CM thread
    /// must not fail (rping exits with its error).
    #[test]
    fn a_late_caller_on_a_destroyed_channel_waits_as_an_early_one() {
        // SAFETY: a channel made, then destroyed once.
        let ch = unsafe { create_event_channel() };
        assert!(!ch.is_null());
        let at = ch as usize;
        // SAFETY: as above.
        unsafe { destroy_event_channel(ch) };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut event = ptr::null_mut();
            // SAFETY: the channel is only looked up; `event` is where an event would go.
            let rc = unsafe { get_cm_event(at as *mut rdma_event_channel, &raw mut event) };
            let _ = tx.send(rc);
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(200)).ok(),
            None,
            "a blocking caller on a destroyed channel returned"
        );

        // A non-blocking fd reads as librdmacm's closed one; a never-made channel is EINVAL.
        // SAFETY: as above; the fd is the channel's own while it lives.
        unsafe {
            let ch = create_event_channel();
            assert!(!ch.is_null());
            let fd = (*ch).fd;
            let flags = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK), 0);
            destroy_event_channel(ch);
            let mut event = ptr::null_mut();
            assert_eq!(get_cm_event(ch, &raw mut event), -1);
            assert_eq!(last_errno(0), libc::EBADF);
            assert_eq!(
                get_cm_event(0x20 as *mut rdma_event_channel, &raw mut event),
                -1
            );
            assert_eq!(last_errno(0), libc::EINVAL);
        }
    }

    #[test]
    fn calls_on_unknown_ids_fail_with_einval() {
        // SAFETY: the pointers are only looked up, never read.
        unsafe {
            assert_eq!(resolve_route(0x10 as *mut rdma_cm_id, 0), -1);
            assert_eq!(disconnect(0x10 as *mut rdma_cm_id), -1);
            assert_eq!(notify(0x10 as *mut rdma_cm_id, 3), -1);
            assert_eq!(unsupported(), -1);
        }
    }
}
