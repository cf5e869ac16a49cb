//! The request/reply session (Catalyst's `TransportSession`): `ferroce_session`.
//!
//! Catalyst's order holds: `connect`, `alloc_memory`, `exchange_keys`, `establish_channel`,
//! on the coprocessor `set_coprocessor_fn`, then `start`, `submit`/`collect`, `stop`. A call
//! out of order returns `INVALID`, and the text names the step that is missing.
//!
//! A session's calls are serialised: one at a time, from any thread. `ferroce_session_stop`
//! from another thread waits for a `collect` in progress, which gives up after its timeout
//! (or the peer timeout, when the peer falls silent).

use std::ffi::{c_char, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ferroce::session::{
    AnySession, ChannelDesc, ConnectInfo, MemRegion, MemoryKind, PeerRef, Session, SessionError,
};

use crate::fence::{
    fence, fence_result, free_handle, handle, into_handle, text_arg, versioned, write_out, Failure,
};
use crate::ferroce_result;
use crate::nic::{nic_failure, parse_addr};
use crate::region::region_failure;

/// `ferroce_session_new`'s role: submits requests and collects replies (Catalyst's
/// `ControllerSession`).
pub const FERROCE_ROLE_CONTROLLER: u32 = 0;
/// `ferroce_session_new`'s role: turns each request into a reply with its function (Catalyst's
/// `CoprocessorSession`).
pub const FERROCE_ROLE_COPROCESSOR: u32 = 1;

/// A session of either role (Catalyst's `TransportSession`). Thread-safe; calls are
/// serialised.
pub struct ferroce_session {
    session: Mutex<AnySession>,
}

/// A registered region of a session (Catalyst's `MemRegion`), as `alloc_memory` returns it.
/// The session keeps the region alive while its channel uses it, so the handle may be freed
/// after `establish_channel`.
pub struct ferroce_mem_region {
    region: MemRegion,
}

/// Where the peer is and how long to wait for it (Catalyst's `ConnectInfo`). Versioned: set
/// `struct_size` to `sizeof`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_session_config {
    /// `sizeof(ferroce_session_config)`.
    pub struct_size: u32,
    /// How long `connect` and the other handshake steps wait for the peer, in ms (0: 10 s).
    pub timeout_ms: u32,
    /// This side's NIC: `"127.0.0.2"` (port 4791) or with a port.
    pub nic: *const c_char,
    /// The out-of-band TCP address, `"127.0.0.2:19500"`: the controller dials it, the
    /// coprocessor listens on it.
    pub oob: *const c_char,
    /// How long the peer may stay silent once established before it counts as gone, in ms
    /// (0: 3 s).
    pub peer_timeout_ms: u32,
}

/// The peer's region as `exchange_keys` learnt it (Catalyst's `PeerRef`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_peer_ref {
    /// The address of its first byte.
    pub va: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
}

/// What the channel carries (Catalyst's `ChannelDesc`); both sides establish the same.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_channel_desc {
    /// Requests in flight at once, 1 to 1024.
    pub slots: u32,
    /// The largest request, in bytes.
    pub request_bytes: u32,
    /// The largest reply, in bytes.
    pub reply_bytes: u32,
}

/// What `ferroce_session_collect` delivered.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferroce_collected {
    /// The request the reply answers, as `submit` numbered it.
    pub request: u64,
    /// The bytes written, from the first buffer on (Catalyst's return value).
    pub bytes: u64,
}

/// The coprocessor's function (Catalyst's coprocessor function): gets the request's
/// `request_len` bytes and a reply slot of `reply_capacity` bytes, writes the reply at the
/// slot's start and returns its length; a negative return is an error reply. Runs on the
/// session's engine thread.
pub type ferroce_coprocessor_fn = Option<
    unsafe extern "C" fn(
        user: *mut c_void,
        request: *const u8,
        request_len: usize,
        reply: *mut u8,
        reply_capacity: usize,
    ) -> i64,
>;

fn session_failure(e: &SessionError) -> Failure {
    let code = match e {
        SessionError::Timeout { .. } => ferroce_result::Timeout,
        SessionError::Stopped { .. } | SessionError::PeerGone { .. } => ferroce_result::Closed,
        SessionError::Unsupported(_) => ferroce_result::Unsupported,
        SessionError::Device(_) => ferroce_result::Device,
        SessionError::Nic(n) => nic_failure(n).code,
        SessionError::Region(r) => region_failure(r).code,
        SessionError::OutOfOrder { .. }
        | SessionError::AlreadyDone { .. }
        | SessionError::TooLate { .. }
        | SessionError::WrongRole { .. }
        | SessionError::InvalidArgument(_)
        | SessionError::ForeignRegion
        | SessionError::RegionTooSmall { .. }
        | SessionError::ChannelMismatch { .. }
        | SessionError::RequestTooLarge { .. }
        | SessionError::NoFreeSlot { .. }
        | SessionError::NothingInFlight
        | SessionError::ReplyTooLarge { .. } => ferroce_result::Invalid,
        _ => ferroce_result::Failed,
    };
    Failure::new(code, e)
}

fn lock(s: &ferroce_session) -> MutexGuard<'_, AnySession> {
    s.session.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A session of `role` (`FERROCE_ROLE_CONTROLLER` or `FERROCE_ROLE_COPROCESSOR`) that has
/// taken no step.
///
/// # Safety
///
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_new(
    role: u32,
    out: *mut *mut ferroce_session,
) -> ferroce_result {
    fence_result("ferroce_session_new", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let session = match role {
            FERROCE_ROLE_CONTROLLER => AnySession::controller(),
            FERROCE_ROLE_COPROCESSOR => AnySession::coprocessor(),
            other => {
                return Err(Failure::invalid(format_args!(
                    "role {other} is not FERROCE_ROLE_CONTROLLER (0) or \
                     FERROCE_ROLE_COPROCESSOR (1)"
                )))
            }
        };
        let s = ferroce_session {
            session: Mutex::new(session),
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(s), "out") }
    })
}

/// Catalyst's `connect`: opens the NIC, the out-of-band connection (the controller dials,
/// the coprocessor listens and waits), and takes the queue pair to RTS.
///
/// # Safety
///
/// `session` is NULL or live; `config` is NULL or a `ferroce_session_config` of at least
/// its `struct_size` bytes whose strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_connect(
    session: *const ferroce_session,
    config: *const ferroce_session_config,
) -> ferroce_result {
    fence_result("ferroce_session_connect", || {
        // SAFETY: the caller promises NULL or live / readable.
        let (s, c) = unsafe {
            (
                handle(session, "session")?,
                versioned(config, "config", "ferroce_session_config")?,
            )
        };
        // SAFETY: the caller promises NULL or NUL-terminated strings.
        let (nic, oob) = unsafe {
            (
                text_arg(c.nic, "config.nic")?,
                text_arg(c.oob, "config.oob")?,
            )
        };
        let nic = parse_addr(nic, "config.nic")?;
        let oob = oob.trim().parse().map_err(|_| {
            Failure::invalid(format_args!(
                "config.oob {oob:?} is not an address and port (\"127.0.0.2:19500\")"
            ))
        })?;
        let mut info = ConnectInfo::new(nic.ip(), oob).with_nic_port(nic.port());
        if c.timeout_ms != 0 {
            info = info.with_timeout(Duration::from_millis(c.timeout_ms.into()));
        }
        if c.peer_timeout_ms != 0 {
            info = info.with_peer_timeout(Duration::from_millis(c.peer_timeout_ms.into()));
        }
        lock(s).connect(&info).map_err(|e| session_failure(&e))
    })
}

/// Catalyst's `alloc_memory`: `size` bytes of host memory, registered; `*out` receives the
/// region. (`MemKind` for GPU memory is not offered here yet.)
///
/// # Safety
///
/// `session` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_alloc_memory(
    session: *const ferroce_session,
    size: usize,
    out: *mut *mut ferroce_mem_region,
) -> ferroce_result {
    fence_result("ferroce_session_alloc_memory", || {
        // SAFETY: the caller promises NULL or live.
        let s = unsafe { handle(session, "session") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let region = lock(s)
            .alloc_memory(size, MemoryKind::Host)
            .map_err(|e| session_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_mem_region { region }), "out") }
    })
}

/// The region's length in bytes; 0 for NULL.
///
/// # Safety
///
/// `region` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_mem_region_len(region: *const ferroce_mem_region) -> u64 {
    fence("ferroce_mem_region_len", || {
        // SAFETY: the caller promises NULL or live.
        unsafe { handle(region, "region") }.map_or(0, |r| r.region.len())
    })
}

/// The key the peer uses for the region; 0 for NULL.
///
/// # Safety
///
/// `region` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_mem_region_rkey(region: *const ferroce_mem_region) -> u32 {
    fence("ferroce_mem_region_rkey", || {
        // SAFETY: the caller promises NULL or live.
        unsafe { handle(region, "region") }.map_or(0, |r| r.region.rkey())
    })
}

/// Frees the handle; NULL does nothing. The session keeps the region while it uses it.
///
/// # Safety
///
/// `region` is NULL or a region from this library not freed before.
#[no_mangle]
pub unsafe extern "C" fn ferroce_mem_region_free(region: *mut ferroce_mem_region) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_mem_region_free", || unsafe { free_handle(region) });
}

/// Catalyst's `exchange_keys`: advertises `local` and writes the peer's region to `*peer`.
///
/// # Safety
///
/// `session` and `local` are NULL or live; `peer` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_exchange_keys(
    session: *const ferroce_session,
    local: *const ferroce_mem_region,
    peer: *mut ferroce_peer_ref,
) -> ferroce_result {
    fence_result("ferroce_session_exchange_keys", || {
        // SAFETY: the caller promises NULL or live.
        let (s, local) = unsafe { (handle(session, "session")?, handle(local, "local")?) };
        if peer.is_null() {
            return Err(Failure::null("peer"));
        }
        let p = lock(s)
            .exchange_keys(&local.region)
            .map_err(|e| session_failure(&e))?;
        let value = ferroce_peer_ref {
            va: p.va,
            len: p.len,
            rkey: p.rkey,
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(peer, value, "peer") }
    })
}

/// Catalyst's `establish_channel`: posts the receives and agrees on `desc` with the peer
/// (both sides must give the same).
///
/// # Safety
///
/// `session` and `local` are NULL or live; `desc` and `peer` are NULL or readable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_establish_channel(
    session: *const ferroce_session,
    desc: *const ferroce_channel_desc,
    local: *const ferroce_mem_region,
    peer: *const ferroce_peer_ref,
) -> ferroce_result {
    fence_result("ferroce_session_establish_channel", || {
        // SAFETY: the caller promises NULL or live / readable.
        let (s, desc, local, peer) = unsafe {
            (
                handle(session, "session")?,
                handle(desc, "desc")?,
                handle(local, "local")?,
                handle(peer, "peer")?,
            )
        };
        let slots = u16::try_from(desc.slots)
            .map_err(|_| Failure::invalid(format_args!("desc.slots {}: 1 to 1024", desc.slots)))?;
        let d = ChannelDesc::new(slots, desc.request_bytes, desc.reply_bytes);
        let p = PeerRef {
            va: peer.va,
            rkey: peer.rkey,
            len: peer.len,
        };
        lock(s)
            .establish_channel(&d, &local.region, &p)
            .map_err(|e| session_failure(&e))
    })
}

/// A coprocessor function and its user data, carried to the engine's thread.
struct CoprocessorCall {
    function: unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut u8, usize) -> i64,
    user: *mut c_void,
}

// SAFETY: `ferroce_session_set_coprocessor_fn` makes the caller promise that the function
// may run on the engine's thread with `user`; the pointer is only handed back to it.
unsafe impl Send for CoprocessorCall {}

/// Catalyst's `set_coprocessor_fn`, on a coprocessor after `establish_channel` and before
/// `start`: `function` turns each request into a reply, called with `user` on the session's
/// engine thread.
///
/// The function must return (not `longjmp` out) and must not throw a C++ exception.
///
/// # Safety
///
/// `session` is NULL or live; `function` is NULL or a function that may be called from
/// another thread with `user` until the session is stopped.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_set_coprocessor_fn(
    session: *const ferroce_session,
    function: ferroce_coprocessor_fn,
    user: *mut c_void,
) -> ferroce_result {
    fence_result("ferroce_session_set_coprocessor_fn", || {
        // SAFETY: the caller promises NULL or live.
        let s = unsafe { handle(session, "session") }?;
        let Some(function) = function else {
            return Err(Failure::null("function"));
        };
        let call = CoprocessorCall { function, user };
        let boxed = Box::new(move |request: &[u8], reply: &mut [u8]| {
            let call = &call;
            // SAFETY: the caller of set_coprocessor_fn promised the function may run here
            // with `user`; the slices are valid for their lengths during the call.
            let n = unsafe {
                (call.function)(
                    call.user,
                    request.as_ptr(),
                    request.len(),
                    reply.as_mut_ptr(),
                    reply.len(),
                )
            };
            match usize::try_from(n) {
                Ok(n) if n <= reply.len() => Ok(n),
                Ok(n) => Err(format!(
                    "the coprocessor function returned {n} bytes for a slot of {}",
                    reply.len()
                )),
                Err(_) => Err(format!("the coprocessor function returned {n}")),
            }
        });
        lock(s)
            .set_coprocessor_fn(boxed)
            .map_err(|e| session_failure(&e))
    })
}

/// Catalyst's `start`: returns at once; a coprocessor's engine serves until `stop`.
///
/// # Safety
///
/// `session` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_start(session: *const ferroce_session) -> ferroce_result {
    fence_result("ferroce_session_start", || {
        // SAFETY: the caller promises NULL or live.
        let s = unsafe { handle(session, "session") }?;
        lock(s).start().map_err(|e| session_failure(&e))
    })
}

/// Submits a request (controller only): copies `len` bytes from `request` into a free slot
/// and WRITEs them to the coprocessor; `*id` (may be NULL) receives its number.
///
/// # Safety
///
/// `session` is NULL or live; `request` is NULL or valid for reads of `len` bytes; `id` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_submit(
    session: *const ferroce_session,
    request: *const c_void,
    len: usize,
    id: *mut u64,
) -> ferroce_result {
    fence_result("ferroce_session_submit", || {
        // SAFETY: the caller promises NULL or live.
        let s = unsafe { handle(session, "session") }?;
        if request.is_null() && len > 0 {
            return Err(Failure::null("request"));
        }
        let bytes = if len == 0 {
            &[][..]
        } else {
            // SAFETY: not NULL; the caller promises `len` readable bytes.
            unsafe { std::slice::from_raw_parts(request.cast::<u8>(), len) }
        };
        let request_id = lock(s).submit(bytes).map_err(|e| session_failure(&e))?;
        if !id.is_null() {
            // SAFETY: not NULL; the caller promises it is writable.
            unsafe { write_out(id, request_id.0, "id") }?;
        }
        Ok(())
    })
}

/// Catalyst's `collect`: waits up to `timeout_ms` for a result and scatters it over the `n`
/// buffers `replies` of `replies_bytes` bytes each, in order; `*out` (may be NULL) receives
/// which request it answers and the bytes written. On a coprocessor, the next request
/// served, with the reply it sent.
///
/// `TIMEOUT`; `INVALID` when the buffers are too small (the reply stays for a later call) or
/// nothing is in flight; `FAILED` for the coprocessor's error reply; `CLOSED` when the peer
/// is gone.
///
/// # Safety
///
/// `session` is NULL or live; `replies` and `replies_bytes` are NULL or arrays of `n`, each
/// buffer valid for writes of its size; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_collect(
    session: *const ferroce_session,
    replies: *const *mut c_void,
    replies_bytes: *const u64,
    n: usize,
    timeout_ms: u32,
    out: *mut ferroce_collected,
) -> ferroce_result {
    fence_result("ferroce_session_collect", || {
        // SAFETY: the caller promises NULL or live.
        let s = unsafe { handle(session, "session") }?;
        if n > 0 && (replies.is_null() || replies_bytes.is_null()) {
            return Err(Failure::null("replies"));
        }
        let mut buffers: Vec<&mut [u8]> = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: i < n, and the caller promises arrays of n.
            let (ptr, size) = unsafe { (*replies.add(i), *replies_bytes.add(i)) };
            let size = usize::try_from(size)
                .map_err(|_| Failure::invalid(format_args!("replies_bytes[{i}] is too large")))?;
            if size == 0 {
                continue;
            }
            if ptr.is_null() {
                return Err(Failure::new(
                    ferroce_result::NullParameter,
                    format_args!("replies[{i}] is NULL"),
                ));
            }
            // SAFETY: not NULL; the caller promises `size` writable bytes, not overlapping
            // the other buffers.
            buffers.push(unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), size) });
        }
        let got = lock(s)
            .collect_timeout(&mut buffers, Duration::from_millis(timeout_ms.into()))
            .map_err(|e| session_failure(&e))?;
        if !out.is_null() {
            let value = ferroce_collected {
                request: got.request.0,
                bytes: got.bytes as u64,
            };
            // SAFETY: not NULL; the caller promises it is writable.
            unsafe { write_out(out, value, "out") }?;
        }
        Ok(())
    })
}

/// Catalyst's `stop`: stops the engine, says bye to the peer and joins. Idempotent.
///
/// # Safety
///
/// `session` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_stop(session: *const ferroce_session) {
    fence("ferroce_session_stop", || {
        // SAFETY: the caller promises NULL or live.
        if let Ok(s) = unsafe { handle(session, "session") } {
            lock(s).stop();
        }
    });
}

/// Catalyst's `last_rtt_ns`: the last round trip in nanoseconds, 0 before the first.
///
/// # Safety
///
/// `session` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_last_rtt_ns(session: *const ferroce_session) -> u64 {
    fence("ferroce_session_last_rtt_ns", || {
        // SAFETY: the caller promises NULL or live.
        unsafe { handle(session, "session") }.map_or(0, |s| lock(s).last_rtt_ns())
    })
}

/// Stops the session if running and frees it; NULL does nothing.
///
/// # Safety
///
/// `session` is NULL or a session from this library not freed before, which no other
/// thread uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_session_free(session: *mut ferroce_session) {
    fence("ferroce_session_free", || {
        // SAFETY: the caller promises NULL or a live session only this thread uses.
        if let Ok(s) = unsafe { handle(session.cast_const(), "session") } {
            lock(s).stop();
        }
        // SAFETY: the caller's promise is free_handle's.
        unsafe { free_handle(session) }
    });
}
