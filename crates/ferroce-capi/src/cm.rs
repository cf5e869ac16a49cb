//! Connection management as librdmacm does it, with private data: `ferroce_listener`
//! (`rdma_listen`), `ferroce_conn_request` (`RDMA_CM_EVENT_CONNECT_REQUEST`, answered by
//! `rdma_accept` or `rdma_reject`), `ferroce_connection` (`rdma_connect`,
//! `RDMA_CM_EVENT_ESTABLISHED`, `rdma_disconnect`, `RDMA_CM_EVENT_DISCONNECTED`), and UD
//! peers resolved by SIDR (`rdma_connect` on an `RDMA_PS_UDP` id).
//!
//! The soft NIC runs the CM on its QP 1, so these work between ferroce NICs and with the
//! kernel's rdma_cm users (`rping`, `ucmatose`, `udaddy`). Ports are rdma_cm's: the TCP port
//! space for RC (`ferroce_cm_listen`), the UDP one for SIDR (`ferroce_cm_listen_udp`).
//! Addresses are a peer NIC's IP address on the RoCE port 4791.
//!
//! Private data is fixed-size on the wire: a REQ carries 56 bytes after rdma_cm's header, a
//! REP 196, a REJ 148, a SIDR request 180; what the sender did not fill arrives as zeros, so
//! the readers here give the whole field.
//!
//! Result codes: `REJECTED` when the peer refused (its reason and private data in the
//! `ferroce_cm_reject` the call fills), `UNREACHABLE` when it never answered, `TIMEOUT` when
//! the time given ran out, `ADDRESS_IN_USE` for a port already listened on, `INVALID` for
//! too much private data or a queue pair that cannot be brought up, `CLOSED` for a request
//! already answered or a connection already closed, `UNSUPPORTED` on a verbs device (whose
//! CM is the kernel's).

use std::ffi::c_char;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use ferroce::cm::{self, CmError, ConnParam, ConnectRequest, Connection, Listener, SidrRequest};
use ferroce::qp::Mtu;

use crate::fence::{
    check_struct_size, copy_text, fence, fence_result, free_handle, handle, into_handle,
    struct_size_of, text_arg, versioned, write_out, Failure,
};
use crate::ferroce_result;
use crate::nic::{ferroce_nic, nic_failure};
use crate::qp::{addr_text, ferroce_qp, modify_failure};

/// The most private-data bytes a REQ carries (`ferroce_cm_connect`).
pub const FERROCE_CM_REQ_PRIVATE: u32 = 56;
/// The most private-data bytes a REP carries (`ferroce_conn_request_accept`).
pub const FERROCE_CM_REP_PRIVATE: u32 = 196;
/// The most private-data bytes a REJ carries (`ferroce_conn_request_reject`).
pub const FERROCE_CM_REJ_PRIVATE: u32 = 148;
/// The most private-data bytes a SIDR request carries (`ferroce_cm_resolve_ud`).
pub const FERROCE_CM_SIDR_PRIVATE: u32 = 180;

// The C values are the Rust crate's limits (cbindgen needs them as literals).
const _: () = {
    assert!(FERROCE_CM_REQ_PRIVATE as usize == cm::MAX_REQ_PRIVATE);
    assert!(FERROCE_CM_REP_PRIVATE as usize == cm::MAX_REP_PRIVATE);
    assert!(FERROCE_CM_REJ_PRIVATE as usize == cm::MAX_REJ_PRIVATE);
    assert!(FERROCE_CM_SIDR_PRIVATE as usize == cm::MAX_SIDR_PRIVATE);
};

/// Listens on a port of a soft NIC (`rdma_listen`). Freed, it stops: later requests are
/// refused with REJ 8 (no such service).
pub struct ferroce_listener {
    listener: Listener,
}

/// A connection request waiting for an answer (`RDMA_CM_EVENT_CONNECT_REQUEST`). Freed
/// unanswered, it is rejected.
pub struct ferroce_conn_request {
    request: Mutex<Option<ConnectRequest>>,
    from: IpAddr,
    private: Vec<u8>,
}

/// An established (or establishing) connection; its queue pair is the caller's. Freed while
/// established, it disconnects. Thread-safe.
pub struct ferroce_connection {
    conn: Connection,
}

/// A SIDR request waiting for an answer; freed unanswered, it is refused.
pub struct ferroce_sidr_request {
    request: Mutex<Option<SidrRequest>>,
    from: IpAddr,
    private: Vec<u8>,
}

/// Options of a connection (`struct rdma_conn_param`). Versioned: set `struct_size` to
/// `sizeof`. A NULL pointer takes the defaults: 1 READ each way, 7 retries, MTU 4096 (capped
/// at the link's), no private data, a 10 s timeout.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_conn_param {
    /// `sizeof(ferroce_conn_param)`.
    pub struct_size: u32,
    /// READs and atomics this side serves at once; 0 grants the peer no READ or atomics
    /// (`responder_resources`).
    pub responder_resources: u8,
    /// READs and atomics this side issues at once (`initiator_depth`).
    pub initiator_depth: u8,
    /// Retries after timeouts (`retry_count`, 0 to 7).
    pub retry_count: u8,
    /// Retries after RNR NAKs (`rnr_retry_count`, 7: forever).
    pub rnr_retry_count: u8,
    /// Path MTU asked for by the active side: 256 to 4096, or 0 for 4096.
    pub mtu: u32,
    /// How long `ferroce_cm_connect` waits for the whole exchange, in ms; 0 for 10 s.
    pub timeout_ms: u32,
    /// The application's private data (`private_data`), or NULL when `private_data_len` is
    /// 0: at most `FERROCE_CM_REQ_PRIVATE` bytes when connecting, `FERROCE_CM_REP_PRIVATE`
    /// when accepting.
    pub private_data: *const u8,
    /// Its length (`private_data_len`).
    pub private_data_len: usize,
}

/// Why a peer refused (`RDMA_CM_EVENT_REJECTED`), filled when a call returns `REJECTED`.
/// Versioned: set `struct_size` to `sizeof`; the call fills the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_cm_reject {
    /// `sizeof(ferroce_cm_reject)`.
    pub struct_size: u32,
    /// The REJ's reason (IBTA Vol. 1 Table 112: 8 nobody listens on that port, 28 the
    /// application refused, as `ferroce_conn_request_reject` does); for a SIDR request, its
    /// status (1 nobody listens, 2 refused).
    pub reason: u32,
    /// How many bytes of `private_data` the peer's message carried (148 for a REJ, 0 for a
    /// SIDR answer).
    pub private_data_len: u32,
    /// The peer's private data; what it did not fill is zero.
    pub private_data: [u8; 148],
}

/// A UD peer found by SIDR: where to send and with which Q_Key. Versioned: set
/// `struct_size` to `sizeof`; the call fills the rest.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_ud_peer {
    /// `sizeof(ferroce_ud_peer)`.
    pub struct_size: u32,
    /// Its UD queue pair (`remote_qpn`).
    pub qpn: u32,
    /// Its Q_Key (`remote_qkey`).
    pub qkey: u32,
    /// Its NIC's address and port as NUL-terminated text, for `ferroce_ah_new`.
    pub addr: [c_char; 64],
}

pub(crate) fn cm_failure(e: &CmError) -> Failure {
    let code = match e {
        CmError::Nic(n) => return nic_failure(n),
        CmError::NotSoft(_) => ferroce_result::Unsupported,
        CmError::InUse(_) => ferroce_result::AddressInUse,
        CmError::Rejected { .. } | CmError::Sidr(_) => ferroce_result::Rejected,
        CmError::Unreachable => ferroce_result::Unreachable,
        CmError::Timeout { .. } => ferroce_result::Timeout,
        CmError::Modify(m) => return modify_failure(m),
        CmError::PrivateData { .. } => ferroce_result::Invalid,
        CmError::Closed => ferroce_result::Closed,
        _ => ferroce_result::Failed,
    };
    Failure::new(code, e)
}

fn millis(ms: u32) -> Duration {
    Duration::from_millis(ms.into())
}

/// The private data `(ptr, len)` points to.
///
/// # Safety
///
/// `ptr` is NULL (with `len` 0) or valid for reads of `len` bytes.
unsafe fn bytes_arg<'a>(ptr: *const u8, len: usize, name: &str) -> Result<&'a [u8], Failure> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Failure::null(name));
    }
    // SAFETY: not NULL; the caller promises `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// The `ConnParam` behind `param`, or the defaults for NULL.
///
/// # Safety
///
/// `param` is NULL or a `ferroce_conn_param` of at least its `struct_size` bytes whose
/// `private_data` holds `private_data_len` bytes.
unsafe fn conn_param(param: *const ferroce_conn_param) -> Result<ConnParam, Failure> {
    let mut out = ConnParam {
        timeout: Duration::from_secs(10),
        ..ConnParam::default()
    };
    if param.is_null() {
        return Ok(out);
    }
    // SAFETY: not NULL; the caller promises at least its struct_size bytes.
    let p = unsafe { versioned(param, "param", "ferroce_conn_param") }?;
    out.responder_resources = p.responder_resources;
    out.initiator_depth = p.initiator_depth;
    out.retry_count = p.retry_count;
    out.rnr_retry_count = p.rnr_retry_count;
    out.mtu = match p.mtu {
        0 | 4096 => Mtu::M4096,
        256 => Mtu::M256,
        512 => Mtu::M512,
        1024 => Mtu::M1024,
        2048 => Mtu::M2048,
        other => {
            return Err(Failure::invalid(format_args!(
                "param.mtu {other}: give 256, 512, 1024, 2048, 4096 or 0"
            )))
        }
    };
    if p.timeout_ms != 0 {
        out.timeout = millis(p.timeout_ms);
    }
    // SAFETY: the caller's promise about private_data.
    out.private_data =
        unsafe { bytes_arg(p.private_data, p.private_data_len, "param.private_data") }?.to_vec();
    Ok(out)
}

/// Checks the caller's `rejected` before anything is sent, so that a refusal is never lost
/// to a struct too small for it: its `struct_size`, or `None` for NULL.
///
/// # Safety
///
/// `rejected` is NULL or a `ferroce_cm_reject` whose `struct_size` is set.
unsafe fn reject_slot(rejected: *const ferroce_cm_reject) -> Result<Option<u32>, Failure> {
    if rejected.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL; the caller promises struct_size is set.
    let given = unsafe { struct_size_of(rejected, "rejected") }?;
    check_struct_size("ferroce_cm_reject", given, size_of::<ferroce_cm_reject>())?;
    Ok(Some(given))
}

/// Fills `rejected` from a refusal; other failures leave it as it was.
///
/// # Safety
///
/// `rejected` is NULL (then `given` is `None`) or a `ferroce_cm_reject` writable for its
/// `given` bytes, at least a whole struct ([`reject_slot`] checked).
unsafe fn report_reject(e: &CmError, rejected: *mut ferroce_cm_reject, given: Option<u32>) {
    let Some(given) = given else { return };
    let (reason, data): (u32, &[u8]) = match e {
        CmError::Rejected {
            reason,
            private_data,
        } => (reason.code().into(), private_data),
        CmError::Sidr(status) => (status.code().into(), &[]),
        _ => return,
    };
    let n = data.len().min(cm::MAX_REJ_PRIVATE);
    let mut value = ferroce_cm_reject {
        struct_size: given,
        reason,
        private_data_len: n as u32,
        private_data: [0; cm::MAX_REJ_PRIVATE],
    };
    value.private_data[..n].copy_from_slice(&data[..n]);
    // SAFETY: not NULL (given is Some), and at least a whole struct is writable.
    unsafe { rejected.write(value) };
}

fn ip_text(ip: IpAddr) -> String {
    ip.to_string()
}

/// Listens on `port` of `nic` for RC connection requests, in rdma_cm's TCP port space
/// (`rdma_bind_addr` and `rdma_listen` on an `RDMA_PS_TCP` id); `*out` receives the listener.
///
/// `ADDRESS_IN_USE` when another listener holds the port on this NIC; `UNSUPPORTED` on a
/// verbs device.
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cm_listen(
    nic: *const ferroce_nic,
    port: u16,
    out: *mut *mut ferroce_listener,
) -> ferroce_result {
    fence_result("ferroce_cm_listen", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let listener = Listener::bind(&nic.nic, port).map_err(|e| cm_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_listener { listener }), "out") }
    })
}

/// Listens on `port` of `nic` for SIDR requests of UD peers, in rdma_cm's UDP port space
/// (`rdma_listen` on an `RDMA_PS_UDP` id); as `ferroce_cm_listen` otherwise.
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cm_listen_udp(
    nic: *const ferroce_nic,
    port: u16,
    out: *mut *mut ferroce_listener,
) -> ferroce_result {
    fence_result("ferroce_cm_listen_udp", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let listener = Listener::bind_udp(&nic.nic, port).map_err(|e| cm_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_listener { listener }), "out") }
    })
}

/// The next connection request on the listener (`rdma_get_request`), waiting up to
/// `timeout_ms`; `*out` receives it. Answer it with `ferroce_conn_request_accept` or
/// `_reject`, then free it. `TIMEOUT` when none came.
///
/// # Safety
///
/// `listener` is NULL or a live listener; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_listener_get_request(
    listener: *const ferroce_listener,
    timeout_ms: u32,
    out: *mut *mut ferroce_conn_request,
) -> ferroce_result {
    fence_result("ferroce_listener_get_request", || {
        // SAFETY: the caller promises NULL or a live listener.
        let listener = unsafe { handle(listener, "listener") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let request = listener
            .listener
            .get_request(millis(timeout_ms))
            .map_err(|e| cm_failure(&e))?;
        let value = ferroce_conn_request {
            from: request.from(),
            private: request.private_data().to_vec(),
            request: Mutex::new(Some(request)),
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(value), "out") }
    })
}

/// The request's private data (after rdma_cm's header: `FERROCE_CM_REQ_PRIVATE` bytes, zero
/// past what the peer wrote), copied into `buf` up to `len` bytes; returns its full length,
/// so a call with `len` 0 sizes the buffer. 0 for a NULL `request`.
///
/// # Safety
///
/// `request` is NULL or a live request; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_conn_request_private_data(
    request: *const ferroce_conn_request,
    buf: *mut u8,
    len: usize,
) -> usize {
    fence("ferroce_conn_request_private_data", || {
        // SAFETY: the caller promises NULL or a live request.
        match unsafe { handle(request, "request") } {
            // SAFETY: the caller's promise about buf and len.
            Ok(r) => unsafe { copy_bytes(&r.private, buf, len) },
            Err(_) => 0,
        }
    })
}

/// The requesting NIC's IP address as text (`"127.0.0.2"`), copied into `buf` as `snprintf`
/// does; returns its full length, 0 for a NULL `request`.
///
/// # Safety
///
/// `request` is NULL or a live request; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_conn_request_peer(
    request: *const ferroce_conn_request,
    buf: *mut c_char,
    len: usize,
) -> usize {
    fence("ferroce_conn_request_peer", || {
        // SAFETY: the caller promises NULL or a live request.
        match unsafe { handle(request, "request") } {
            // SAFETY: the caller's promise about buf and len.
            Ok(r) => unsafe { copy_text(&ip_text(r.from), buf, len) },
            Err(_) => 0,
        }
    })
}

/// Copies up to `len` of `data` into `buf`; returns `data.len()`.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
unsafe fn copy_bytes(data: &[u8], buf: *mut u8, len: usize) -> usize {
    if !buf.is_null() {
        let n = data.len().min(len);
        // SAFETY: the caller promises `len` writable bytes at `buf`; n <= len.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf, n) };
    }
    data.len()
}

/// The request itself, once: a second answer is `CLOSED`.
fn take<T>(slot: &Mutex<Option<T>>) -> Result<T, Failure> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .ok_or_else(|| Failure::new(ferroce_result::Closed, "the request was answered already"))
}

/// Accepts the request with `qp` (`rdma_accept`): brings `qp` (an RC queue pair in INIT, its
/// receives posted as wanted) to RTS with what the REQ and `param` settle, and sends the REP
/// with `param`'s private data (at most `FERROCE_CM_REP_PRIVATE` bytes). `*out` receives the
/// connection, established once the peer's RTU (or first data) comes:
/// `ferroce_connection_wait_established`. `param` may be NULL.
///
/// `INVALID` for too much private data or a queue pair that cannot be brought up (the
/// request is then rejected), `CLOSED` when the request was answered already or the peer
/// gave up.
///
/// # Safety
///
/// `request` and `qp` are NULL or live; `param` is NULL or a `ferroce_conn_param` of at
/// least its `struct_size` bytes with `private_data_len` bytes at `private_data`; `out` is
/// NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_conn_request_accept(
    request: *const ferroce_conn_request,
    qp: *const ferroce_qp,
    param: *const ferroce_conn_param,
    out: *mut *mut ferroce_connection,
) -> ferroce_result {
    fence_result("ferroce_conn_request_accept", || {
        // SAFETY: the caller promises NULL or live objects.
        let (request, qp) = unsafe { (handle(request, "request")?, handle(qp, "qp")?) };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller's promise about param.
        let param = unsafe { conn_param(param) }?;
        if param.private_data.len() > cm::MAX_REP_PRIVATE {
            return Err(cm_failure(&CmError::PrivateData {
                len: param.private_data.len(),
                max: cm::MAX_REP_PRIVATE,
                message: "REP",
            }));
        }
        let conn = take(&request.request)?
            .accept(&qp.qp, &param)
            .map_err(|e| cm_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_connection { conn }), "out") }
    })
}

/// Refuses the request (`rdma_reject`): REJ reason 28 (consumer defined) carrying `len`
/// bytes of private data at `data` (at most `FERROCE_CM_REJ_PRIVATE`; `data` may be NULL
/// when `len` is 0). The peer's `ferroce_cm_connect` returns `REJECTED` with them.
///
/// `INVALID` for more than 148 bytes (the request stays unanswered), `CLOSED` when it was
/// answered already or the peer gave up.
///
/// # Safety
///
/// `request` is NULL or live; `data` is NULL or valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_conn_request_reject(
    request: *const ferroce_conn_request,
    data: *const u8,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_conn_request_reject", || {
        // SAFETY: the caller promises NULL or a live request.
        let request = unsafe { handle(request, "request") }?;
        // SAFETY: the caller's promise about data and len.
        let data = unsafe { bytes_arg(data, len, "data") }?;
        if data.len() > cm::MAX_REJ_PRIVATE {
            return Err(cm_failure(&CmError::PrivateData {
                len: data.len(),
                max: cm::MAX_REJ_PRIVATE,
                message: "REJ",
            }));
        }
        take(&request.request)?
            .reject(data)
            .map_err(|e| cm_failure(&e))
    })
}

/// Frees the request; one left unanswered is rejected (REJ 28, no private data). NULL does
/// nothing.
///
/// # Safety
///
/// `request` is NULL or a request from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_conn_request_free(request: *mut ferroce_conn_request) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_conn_request_free", || unsafe {
        free_handle(request)
    });
}

/// Connects `qp` (an RC queue pair in INIT, its receives posted as wanted) to the listener on
/// `port` at `addr` (`rdma_resolve_addr`, `rdma_resolve_route`, `rdma_connect`): sends the REQ
/// with `param`'s private data (at most `FERROCE_CM_REQ_PRIVATE` bytes), and on the REP brings
/// `qp` to RTS and sends the RTU. Returns once established (`RDMA_CM_EVENT_ESTABLISHED`),
/// within `param->timeout_ms`; `*out` receives the connection, whose
/// `ferroce_connection_private_data` is the REP's. `param` may be NULL.
///
/// `REJECTED` when the peer refused: when `rejected` is not NULL it receives the reason (8:
/// nobody listens on `port`; 28: the application refused) and the REJ's private data.
/// `UNREACHABLE` when no answer came through the retries, `TIMEOUT` after `timeout_ms`,
/// `INVALID` for a bad address, too much private data or a queue pair that cannot be brought
/// up, `UNSUPPORTED` on a verbs device.
///
/// # Safety
///
/// `nic` and `qp` are NULL or live; `addr` is NULL or a NUL-terminated string; `param` is
/// NULL or a `ferroce_conn_param` of at least its `struct_size` bytes with
/// `private_data_len` bytes at `private_data`; `rejected` is NULL or a `ferroce_cm_reject`
/// whose `struct_size` is set, writable for that many bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cm_connect(
    nic: *const ferroce_nic,
    qp: *const ferroce_qp,
    addr: *const c_char,
    port: u16,
    param: *const ferroce_conn_param,
    rejected: *mut ferroce_cm_reject,
    out: *mut *mut ferroce_connection,
) -> ferroce_result {
    fence_result("ferroce_cm_connect", || {
        // SAFETY: the caller promises NULL or live objects.
        let (nic, qp) = unsafe { (handle(nic, "nic")?, handle(qp, "qp")?) };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller promises NULL or a NUL-terminated string.
        let text = unsafe { text_arg(addr, "addr") }?;
        let to: IpAddr = text.trim().parse().map_err(|_| {
            Failure::invalid(format_args!(
                "addr {text:?} is not an IP address (the peer NIC's, \"192.0.2.1\")"
            ))
        })?;
        // SAFETY: the caller's promise about param.
        let param = unsafe { conn_param(param) }?;
        // SAFETY: the caller's promise about rejected.
        let slot = unsafe { reject_slot(rejected) }?;
        match Connection::connect(&nic.nic, &qp.qp, to, port, &param) {
            // SAFETY: checked not NULL; the caller promises it is writable.
            Ok(conn) => unsafe { write_out(out, into_handle(ferroce_connection { conn }), "out") },
            Err(e) => {
                // SAFETY: reject_slot checked `rejected` for `slot`.
                unsafe { report_reject(&e, rejected, slot) };
                Err(cm_failure(&e))
            }
        }
    })
}

/// The private data of the peer's REP (the active side: `FERROCE_CM_REP_PRIVATE` bytes, zero
/// past what the peer wrote; none on the passive side), copied into `buf` up to `len` bytes;
/// returns its full length. 0 for a NULL `conn`.
///
/// # Safety
///
/// `conn` is NULL or a live connection; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_connection_private_data(
    conn: *const ferroce_connection,
    buf: *mut u8,
    len: usize,
) -> usize {
    fence("ferroce_connection_private_data", || {
        // SAFETY: the caller promises NULL or a live connection.
        match unsafe { handle(conn, "conn") } {
            // SAFETY: the caller's promise about buf and len.
            Ok(c) => unsafe { copy_bytes(c.conn.private_data(), buf, len) },
            Err(_) => 0,
        }
    })
}

/// The peer NIC's IP address as text, copied into `buf` as `snprintf` does; returns its full
/// length, 0 for a NULL `conn`.
///
/// # Safety
///
/// `conn` is NULL or a live connection; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_connection_peer(
    conn: *const ferroce_connection,
    buf: *mut c_char,
    len: usize,
) -> usize {
    fence("ferroce_connection_peer", || {
        // SAFETY: the caller promises NULL or a live connection.
        match unsafe { handle(conn, "conn") } {
            // SAFETY: the caller's promise about buf and len.
            Ok(c) => unsafe { copy_text(&ip_text(c.conn.peer()), buf, len) },
            Err(_) => 0,
        }
    })
}

/// Waits up to `timeout_ms` until the connection is established (`RDMA_CM_EVENT_ESTABLISHED`
/// on the passive side; at once on the active side). `TIMEOUT`; `REJECTED` when the active
/// side refused the REP; `UNREACHABLE` when no RTU or data ever came; `CLOSED` when it was
/// closed.
///
/// # Safety
///
/// `conn` is NULL or a live connection.
#[no_mangle]
pub unsafe extern "C" fn ferroce_connection_wait_established(
    conn: *const ferroce_connection,
    timeout_ms: u32,
) -> ferroce_result {
    fence_result("ferroce_connection_wait_established", || {
        // SAFETY: the caller promises NULL or a live connection.
        let conn = unsafe { handle(conn, "conn") }?;
        conn.conn
            .wait_established(millis(timeout_ms))
            .map_err(|e| cm_failure(&e))
    })
}

/// Disconnects (`rdma_disconnect`): the queue pair goes to ERR (its outstanding work
/// flushed), then the DREQ; waits up to `timeout_ms` for the peer's DREP. A connection the
/// peer closed already returns `OK` at once. `TIMEOUT` when the DREP did not come in time (the
/// DREQ is still resent).
///
/// # Safety
///
/// `conn` is NULL or a live connection.
#[no_mangle]
pub unsafe extern "C" fn ferroce_connection_disconnect(
    conn: *const ferroce_connection,
    timeout_ms: u32,
) -> ferroce_result {
    fence_result("ferroce_connection_disconnect", || {
        // SAFETY: the caller promises NULL or a live connection.
        let conn = unsafe { handle(conn, "conn") }?;
        conn.conn
            .disconnect(millis(timeout_ms))
            .map_err(|e| cm_failure(&e))
    })
}

/// Waits up to `timeout_ms` for the peer to disconnect (`RDMA_CM_EVENT_DISCONNECTED`); the
/// queue pair is in ERR after. `TIMEOUT` when the peer kept the connection.
///
/// # Safety
///
/// `conn` is NULL or a live connection.
#[no_mangle]
pub unsafe extern "C" fn ferroce_connection_wait_disconnected(
    conn: *const ferroce_connection,
    timeout_ms: u32,
) -> ferroce_result {
    fence_result("ferroce_connection_wait_disconnected", || {
        // SAFETY: the caller promises NULL or a live connection.
        let conn = unsafe { handle(conn, "conn") }?;
        conn.conn
            .wait_disconnected(millis(timeout_ms))
            .map_err(|e| cm_failure(&e))
    })
}

/// Frees the connection; one still established is disconnected (the DREQ goes out, nobody
/// waits for the DREP). NULL does nothing. The queue pair is the caller's to free.
///
/// # Safety
///
/// `conn` is NULL or a connection from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_connection_free(conn: *mut ferroce_connection) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_connection_free", || unsafe { free_handle(conn) });
}

/// Frees the listener (`rdma_destroy_id`): later requests to its port are refused. NULL does
/// nothing.
///
/// # Safety
///
/// `listener` is NULL or a listener from this library not freed before, which no other
/// thread uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_listener_free(listener: *mut ferroce_listener) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_listener_free", || unsafe { free_handle(listener) });
}

/// Resolves the UD queue pair listening on `port` at `addr` by SIDR (`rdma_connect` on an
/// `RDMA_PS_UDP` id, then `RDMA_CM_EVENT_ESTABLISHED`'s `ud` parameters): sends a SIDR
/// request with `len` bytes of private data at `data` (at most `FERROCE_CM_SIDR_PRIVATE`),
/// waits up to `timeout_ms` for the answer; `*out` receives the peer's queue pair, Q_Key and
/// address (for `ferroce_ah_new`).
///
/// `REJECTED` when the peer answered with a failure status (`rejected->reason` 1: nobody
/// listens; 2: refused), `UNREACHABLE`, `TIMEOUT`, `INVALID` for a bad address or too much
/// private data; `INVALID` also when `out->struct_size` is too small.
///
/// # Safety
///
/// `nic` is NULL or live; `addr` is NULL or a NUL-terminated string; `data` is NULL or valid
/// for reads of `len` bytes; `rejected` is NULL or a `ferroce_cm_reject` whose `struct_size`
/// is set; `out` is NULL or a `ferroce_ud_peer` whose `struct_size` is set, writable for that
/// many bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_cm_resolve_ud(
    nic: *const ferroce_nic,
    addr: *const c_char,
    port: u16,
    data: *const u8,
    len: usize,
    timeout_ms: u32,
    rejected: *mut ferroce_cm_reject,
    out: *mut ferroce_ud_peer,
) -> ferroce_result {
    fence_result("ferroce_cm_resolve_ud", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        // SAFETY: the caller promises NULL or a struct whose struct_size is set.
        let given = unsafe { struct_size_of(out, "out") }?;
        check_struct_size("ferroce_ud_peer", given, size_of::<ferroce_ud_peer>())?;
        // SAFETY: the caller promises NULL or a NUL-terminated string.
        let text = unsafe { text_arg(addr, "addr") }?;
        let to: IpAddr = text.trim().parse().map_err(|_| {
            Failure::invalid(format_args!(
                "addr {text:?} is not an IP address (the peer NIC's, \"192.0.2.1\")"
            ))
        })?;
        // SAFETY: the caller's promise about data and len.
        let data = unsafe { bytes_arg(data, len, "data") }?;
        // SAFETY: the caller's promise about rejected.
        let slot = unsafe { reject_slot(rejected) }?;
        match cm::resolve_ud(&nic.nic, to, port, data, millis(timeout_ms)) {
            Ok(peer) => {
                let value = ferroce_ud_peer {
                    struct_size: given,
                    qpn: peer.qpn.value(),
                    qkey: peer.qkey,
                    addr: addr_text(peer.address.peer()),
                };
                // SAFETY: not NULL (struct_size_of checked) and a whole struct is writable.
                unsafe { out.write(value) };
                Ok(())
            }
            Err(e) => {
                // SAFETY: reject_slot checked `rejected` for `slot`.
                unsafe { report_reject(&e, rejected, slot) };
                Err(cm_failure(&e))
            }
        }
    })
}

/// The next SIDR request on a listener from `ferroce_cm_listen_udp`, waiting up to
/// `timeout_ms`; `*out` receives it. Answer it with `ferroce_sidr_request_accept` or
/// `_reject`, then free it. `TIMEOUT` when none came. (Connection requests reaching a UDP
/// listener are refused.)
///
/// # Safety
///
/// `listener` is NULL or a live listener; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_listener_get_sidr_request(
    listener: *const ferroce_listener,
    timeout_ms: u32,
    out: *mut *mut ferroce_sidr_request,
) -> ferroce_result {
    fence_result("ferroce_listener_get_sidr_request", || {
        // SAFETY: the caller promises NULL or a live listener.
        let listener = unsafe { handle(listener, "listener") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let request = listener
            .listener
            .get_sidr_request(millis(timeout_ms))
            .map_err(|e| cm_failure(&e))?;
        let value = ferroce_sidr_request {
            from: request.from(),
            private: request.private_data().to_vec(),
            request: Mutex::new(Some(request)),
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(value), "out") }
    })
}

/// The SIDR request's private data (after rdma_cm's header, `FERROCE_CM_SIDR_PRIVATE` bytes,
/// zero past what the peer wrote), copied into `buf` up to `len` bytes; returns its full
/// length, 0 for a NULL `request`.
///
/// # Safety
///
/// `request` is NULL or a live request; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sidr_request_private_data(
    request: *const ferroce_sidr_request,
    buf: *mut u8,
    len: usize,
) -> usize {
    fence("ferroce_sidr_request_private_data", || {
        // SAFETY: the caller promises NULL or a live request.
        match unsafe { handle(request, "request") } {
            // SAFETY: the caller's promise about buf and len.
            Ok(r) => unsafe { copy_bytes(&r.private, buf, len) },
            Err(_) => 0,
        }
    })
}

/// The requesting NIC's IP address as text, copied into `buf` as `snprintf` does; returns
/// its full length, 0 for a NULL `request`.
///
/// # Safety
///
/// `request` is NULL or a live request; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sidr_request_peer(
    request: *const ferroce_sidr_request,
    buf: *mut c_char,
    len: usize,
) -> usize {
    fence("ferroce_sidr_request_peer", || {
        // SAFETY: the caller promises NULL or a live request.
        match unsafe { handle(request, "request") } {
            // SAFETY: the caller's promise about buf and len.
            Ok(r) => unsafe { copy_text(&ip_text(r.from), buf, len) },
            Err(_) => 0,
        }
    })
}

/// Answers the SIDR request with our UD queue pair `qp` and its Q_Key `qkey` (`rdma_accept`
/// on a UD id). `CLOSED` when it was answered already or is no longer known.
///
/// # Safety
///
/// `request` and `qp` are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sidr_request_accept(
    request: *const ferroce_sidr_request,
    qp: *const ferroce_qp,
    qkey: u32,
) -> ferroce_result {
    fence_result("ferroce_sidr_request_accept", || {
        // SAFETY: the caller promises NULL or live objects.
        let (request, qp) = unsafe { (handle(request, "request")?, handle(qp, "qp")?) };
        take(&request.request)?
            .accept(&qp.qp, qkey)
            .map_err(|e| cm_failure(&e))
    })
}

/// Refuses the SIDR request (status 2, rejected): the peer's `ferroce_cm_resolve_ud` returns
/// `REJECTED`. `CLOSED` when it was answered already.
///
/// # Safety
///
/// `request` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sidr_request_reject(
    request: *const ferroce_sidr_request,
) -> ferroce_result {
    fence_result("ferroce_sidr_request_reject", || {
        // SAFETY: the caller promises NULL or a live request.
        let request = unsafe { handle(request, "request") }?;
        take(&request.request)?.reject().map_err(|e| cm_failure(&e))
    })
}

/// Frees the SIDR request; one left unanswered is refused. NULL does nothing.
///
/// # Safety
///
/// `request` is NULL or a request from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_sidr_request_free(request: *mut ferroce_sidr_request) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_sidr_request_free", || unsafe {
        free_handle(request)
    });
}
