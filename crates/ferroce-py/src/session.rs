//! The session face (Catalyst's `TransportSession`): `Controller` and
//! `Coprocessor`, each over a run-time-checked `ferroce::session::AnySession`, so a call out
//! of the lifecycle's order raises `OutOfOrder` naming the missing step.
//!
//! The handshake steps (`connect`, `exchange_keys`, `establish_channel`) wait for the peer;
//! they run on a helper thread while the caller waits in slices, so Ctrl-C gets through.
//! A Python coprocessor function runs on the coprocessor's engine thread, attached to the
//! interpreter; an exception it raises becomes the request's error reply, which the
//! controller's `collect` raises as `CoprocessorFailed` with the exception's text.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use ferroce::session::{self as rs, AnySession, Session};

use crate::errors::Error;
use crate::memory;
use crate::util;
use crate::wait;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where the peer is and how long to wait for it (Catalyst's `ConnectInfo`).
#[pyclass(module = "ferroce.session", frozen)]
pub(crate) struct ConnectInfo {
    inner: rs::ConnectInfo,
}

#[pymethods]
impl ConnectInfo {
    /// `nic`: this side's NIC (`"ip"` or `"ip:port"`); `oob`: the out-of-band TCP address
    /// the controller dials and the coprocessor listens on.
    #[new]
    #[pyo3(signature = (nic, oob, *, device="ferroce0", ib_port=1, timeout=10.0, peer_timeout=3.0, mtu=None, ack_timeout=14, retry_cnt=7, faults=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        nic: &str,
        oob: &str,
        device: &str,
        ib_port: u8,
        timeout: f64,
        peer_timeout: f64,
        mtu: Option<u32>,
        ack_timeout: u8,
        retry_cnt: u8,
        faults: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let nic = crate::nic::roce_addr(nic)?;
        let oob = util::socket_addr(oob, 0)?;
        let mut inner = rs::ConnectInfo::new(nic.ip(), oob)
            .on_device(device)
            .with_timeout(util::seconds("timeout", timeout)?)
            .with_peer_timeout(util::seconds("peer_timeout", peer_timeout)?)
            .with_nic_port(nic.port());
        if let Some(m) = mtu {
            inner = inner.with_mtu(ferroce::qp::Mtu::from_bytes(m).ok_or_else(|| {
                Error::invalid(format!("mtu {m} is not 256, 512, 1024, 2048 or 4096"))
            })?);
        }
        if let Some(f) = crate::nic::faults_arg(faults)? {
            inner = inner.with_faults(f);
        }
        inner.ib_port = ib_port;
        inner.ack_timeout = ack_timeout;
        inner.retry_cnt = retry_cnt;
        Ok(Self { inner })
    }

    fn __repr__(&self) -> String {
        format!(
            "ConnectInfo(nic={}, oob={})",
            self.inner.nic, self.inner.oob
        )
    }
}

/// What the channel carries (Catalyst's `ChannelDesc`); both sides establish the same.
#[pyclass(module = "ferroce.session", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct ChannelDesc {
    inner: rs::ChannelDesc,
}

#[pymethods]
impl ChannelDesc {
    #[new]
    fn new(slots: u16, request_bytes: u32, reply_bytes: u32) -> Self {
        Self {
            inner: rs::ChannelDesc::new(slots, request_bytes, reply_bytes),
        }
    }

    #[getter]
    fn slots(&self) -> u16 {
        self.inner.slots
    }

    #[getter]
    fn request_bytes(&self) -> u32 {
        self.inner.request_bytes
    }

    #[getter]
    fn reply_bytes(&self) -> u32 {
        self.inner.reply_bytes
    }

    /// The bytes each side's region needs.
    fn region_bytes(&self) -> u64 {
        self.inner.region_bytes()
    }

    fn __repr__(&self) -> String {
        format!(
            "ChannelDesc(slots={}, request_bytes={}, reply_bytes={})",
            self.inner.slots, self.inner.request_bytes, self.inner.reply_bytes
        )
    }
}

/// A registered region of a session (Catalyst's `MemRegion`), as `alloc_memory` returns it.
#[pyclass(module = "ferroce.session", frozen)]
pub(crate) struct MemRegion {
    inner: rs::MemRegion,
}

#[pymethods]
impl MemRegion {
    fn __len__(&self) -> usize {
        self.inner.len() as usize
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    /// `"host"`, `"cuda:N"` or `"device"`.
    fn kind(&self) -> String {
        kind_name(self.inner.kind())
    }

    fn va(&self) -> u64 {
        self.inner.va()
    }

    fn rkey(&self) -> u32 {
        self.inner.rkey()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ferroce.session.MemRegion {} bytes of {} va={:#x}>",
            self.inner.len(),
            kind_name(self.inner.kind()),
            self.inner.va()
        )
    }
}

fn kind_name(k: rs::MemoryKind) -> String {
    match k {
        rs::MemoryKind::Host => "host".to_owned(),
        rs::MemoryKind::Cuda { device } => format!("cuda:{device}"),
        _ => "device".to_owned(),
    }
}

fn memory_kind(kind: &str) -> Result<rs::MemoryKind, Error> {
    match kind {
        "host" | "cpu" => Ok(rs::MemoryKind::Host),
        k if k.starts_with("cuda") => {
            let device = match k.strip_prefix("cuda") {
                Some("") => 0,
                Some(n) => n
                    .strip_prefix(':')
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| {
                        Error::invalid(format!("memory kind {k:?}: write \"host\" or \"cuda:N\""))
                    })?,
                None => 0,
            };
            Ok(rs::MemoryKind::Cuda { device })
        }
        k => Err(Error::invalid(format!(
            "memory kind {k:?}: write \"host\" or \"cuda:N\""
        ))),
    }
}

/// The peer's region as `exchange_keys` learnt it (Catalyst's `PeerRef`).
#[pyclass(module = "ferroce.session", frozen, get_all)]
pub(crate) struct PeerRef {
    va: u64,
    rkey: u32,
    len: u64,
}

impl PeerRef {
    fn rust(&self) -> rs::PeerRef {
        rs::PeerRef {
            va: self.va,
            rkey: self.rkey,
            len: self.len,
        }
    }
}

#[pymethods]
impl PeerRef {
    fn __repr__(&self) -> String {
        format!(
            "PeerRef(va={:#x}, rkey={:#x}, len={})",
            self.va, self.rkey, self.len
        )
    }
}

/// What `collect_into` delivered: which request, and how many bytes it wrote.
#[pyclass(module = "ferroce.session", frozen, get_all)]
pub(crate) struct Collected {
    request: u64,
    bytes: usize,
}

#[pymethods]
impl Collected {
    fn __repr__(&self) -> String {
        format!("Collected(request={}, bytes={})", self.request, self.bytes)
    }
}

/// What both roles share: the session under a lock, and the channel once established.
struct Shared {
    session: Arc<Mutex<AnySession>>,
    desc: Mutex<Option<rs::ChannelDesc>>,
}

impl Shared {
    fn new(session: AnySession) -> Self {
        Self {
            session: Arc::new(Mutex::new(session)),
            desc: Mutex::new(None),
        }
    }

    /// Runs a quick step under the lock, without the GIL.
    fn quick<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut AnySession) -> Result<T, rs::SessionError> + Send,
    ) -> Result<T, Error> {
        let session = &self.session;
        Ok(py.detach(|| f(&mut lock(session)))?)
    }

    /// Runs a step that waits for the peer on a helper thread (see the module doc).
    fn waiting<T: Send + 'static>(
        &self,
        py: Python<'_>,
        name: &str,
        f: impl FnOnce(&mut AnySession) -> Result<T, rs::SessionError> + Send + 'static,
    ) -> PyResult<T> {
        let session = Arc::clone(&self.session);
        Ok(wait::off_thread(py, name, move || f(&mut lock(&session)))?.map_err(Error::from)?)
    }

    fn connect(&self, py: Python<'_>, info: &ConnectInfo) -> PyResult<()> {
        let info = info.inner.clone();
        self.waiting(py, "session-connect", move |s| s.connect(&info))
    }

    fn alloc_memory(&self, py: Python<'_>, size: usize, kind: &str) -> PyResult<MemRegion> {
        let kind = memory_kind(kind)?;
        let inner = self.quick(py, |s| s.alloc_memory(size, kind))?;
        Ok(MemRegion { inner })
    }

    fn exchange_keys(&self, py: Python<'_>, local: &MemRegion) -> PyResult<PeerRef> {
        let local = local.inner.clone();
        let p = self.waiting(py, "session-exchange", move |s| s.exchange_keys(&local))?;
        Ok(PeerRef {
            va: p.va,
            rkey: p.rkey,
            len: p.len,
        })
    }

    fn establish_channel(
        &self,
        py: Python<'_>,
        desc: ChannelDesc,
        local: &MemRegion,
        peer: &PeerRef,
    ) -> PyResult<()> {
        let (d, local, peer) = (desc.inner, local.inner.clone(), peer.rust());
        self.waiting(py, "session-establish", move |s| {
            s.establish_channel(&d, &local, &peer)
        })?;
        *lock(&self.desc) = Some(desc.inner);
        Ok(())
    }

    fn reply_capacity(&self, role: rs::Role) -> usize {
        lock(&self.desc).map_or(0, |d| match role {
            rs::Role::Controller => d.reply_bytes as usize,
            _ => d.reply_bytes.max(d.request_bytes) as usize,
        })
    }

    /// `collect_timeout` in slices until a reply comes or `timeout` passes.
    fn collect_sliced(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        out: &mut [u8],
    ) -> PyResult<rs::Collected> {
        let t = wait::timeout(timeout)?;
        let session = &self.session;
        let got = wait::sliced(py, t, |slice| {
            let mut bufs = [&mut out[..]];
            match lock(session).collect_timeout(&mut bufs, slice.max(Duration::from_millis(1))) {
                Err(rs::SessionError::Timeout { .. }) => None,
                other => Some(other),
            }
        })?;
        match got {
            Some(r) => Ok(r.map_err(Error::from)?),
            None => Err(Error::from(rs::SessionError::Timeout {
                what: "waiting for a result",
                after: t.unwrap_or_default(),
            })
            .into()),
        }
    }

    fn collect<'py>(
        &self,
        py: Python<'py>,
        role: rs::Role,
        timeout: Option<f64>,
    ) -> PyResult<(u64, Bound<'py, PyBytes>)> {
        let mut out = vec![0u8; self.reply_capacity(role)];
        let got = self.collect_sliced(py, timeout, &mut out)?;
        Ok((got.request.0, PyBytes::new(py, &out[..got.bytes])))
    }

    fn collect_into(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Collected> {
        // The copy target is borrowed only for the copy: collect into our own buffer first,
        // without the GIL, then copy over holding it.
        let capacity = memory::with_writable(out, |s| s.len())?;
        let mut staging = vec![0u8; capacity];
        let got = self.collect_sliced(py, timeout, &mut staging)?;
        memory::with_writable(out, |s| {
            let n = got.bytes.min(s.len());
            s[..n].copy_from_slice(&staging[..n]);
        })?;
        Ok(Collected {
            request: got.request.0,
            bytes: got.bytes,
        })
    }

    fn stop(&self, py: Python<'_>) {
        let session = &self.session;
        py.detach(|| lock(session).stop());
    }

    fn last_rtt_ns(&self, py: Python<'_>) -> u64 {
        let session = &self.session;
        py.detach(|| lock(session).last_rtt_ns())
    }

    fn served(&self, py: Python<'_>) -> u64 {
        let session = &self.session;
        py.detach(|| lock(session).served())
    }

    fn peer_gone(&self, py: Python<'_>) -> Option<String> {
        let session = &self.session;
        py.detach(|| lock(session).peer_gone())
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Stopping joins the engine thread, which may be waiting to attach to the
        // interpreter for a coprocessor call: stop without the GIL.
        let session = Arc::clone(&self.session);
        let stop = move || lock(&session).stop();
        // Finalizing: the engine thread cannot attach either, so it stops without waiting.
        let _ = Python::try_attach(|py| py.detach(stop));
    }
}

/// The controller (Catalyst's `ControllerSession`): `connect`, `alloc_memory`,
/// `exchange_keys`, `establish_channel`, `start`, then `submit`/`collect`, then `stop`.
#[pyclass(module = "ferroce.session", frozen)]
pub(crate) struct Controller {
    shared: Shared,
}

#[pymethods]
impl Controller {
    #[new]
    fn new() -> Self {
        Self {
            shared: Shared::new(AnySession::controller()),
        }
    }

    /// Catalyst's `connect`: opens the NIC, dials the coprocessor (again and again within the
    /// timeout) and takes the queue pair to RTS.
    fn connect(&self, py: Python<'_>, info: PyRef<'_, ConnectInfo>) -> PyResult<()> {
        self.shared.connect(py, &info)
    }

    /// Catalyst's `alloc_memory`: `size` bytes of `kind` (`"host"` or `"cuda:N"`), registered.
    #[pyo3(signature = (size, kind="host"))]
    fn alloc_memory(&self, py: Python<'_>, size: usize, kind: &str) -> PyResult<MemRegion> {
        self.shared.alloc_memory(py, size, kind)
    }

    /// Catalyst's `exchange_keys`: advertises `local`, returns the peer's region.
    fn exchange_keys(&self, py: Python<'_>, local: PyRef<'_, MemRegion>) -> PyResult<PeerRef> {
        self.shared.exchange_keys(py, &local)
    }

    /// Catalyst's `establish_channel`.
    fn establish_channel(
        &self,
        py: Python<'_>,
        desc: ChannelDesc,
        local: PyRef<'_, MemRegion>,
        peer: PyRef<'_, PeerRef>,
    ) -> PyResult<()> {
        self.shared.establish_channel(py, desc, &local, &peer)
    }

    /// Catalyst's `start`: returns at once.
    fn start(&self, py: Python<'_>) -> Result<(), Error> {
        self.shared.quick(py, |s| s.start())
    }

    /// Submits a request (bytes-like); returns its number.
    fn submit(&self, py: Python<'_>, request: &Bound<'_, PyAny>) -> PyResult<u64> {
        let bytes = memory::bytes_of(request)?;
        Ok(self.shared.quick(py, |s| s.submit(&bytes))?.0)
    }

    /// Catalyst's `collect`: waits up to `timeout` seconds (`None`: for ever) for the oldest
    /// reply; returns `(request, reply_bytes)`.
    #[pyo3(signature = (timeout=None))]
    fn collect<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<(u64, Bound<'py, PyBytes>)> {
        self.shared.collect(py, rs::Role::Controller, timeout)
    }

    /// `collect` into `out` (a bytearray or writable array); returns `Collected`.
    #[pyo3(signature = (out, timeout=None))]
    fn collect_into(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Collected> {
        self.shared.collect_into(py, out, timeout)
    }

    /// Catalyst's `stop`: idempotent.
    fn stop(&self, py: Python<'_>) {
        self.shared.stop(py);
    }

    /// Catalyst's `last_rtt_ns`.
    fn last_rtt_ns(&self, py: Python<'_>) -> u64 {
        self.shared.last_rtt_ns(py)
    }

    /// Why the coprocessor is gone, once the session's watchdog has noticed; `None` while it
    /// answers (and before `start`).
    fn peer_gone(&self, py: Python<'_>) -> Option<String> {
        self.shared.peer_gone(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.stop(py);
        false
    }
}

/// The coprocessor (Catalyst's `CoprocessorSession`): as the controller, with
/// `set_coprocessor_fn` before `start`; its engine serves requests on a thread of its own.
#[pyclass(module = "ferroce.session", frozen)]
pub(crate) struct Coprocessor {
    shared: Shared,
}

fn describe_exception(py: Python<'_>, e: &PyErr) -> String {
    let name = e
        .get_type(py)
        .name()
        .map_or_else(|_| "Exception".to_owned(), |n| n.to_string());
    format!("{name}: {}", e.value(py))
}

#[pymethods]
impl Coprocessor {
    #[new]
    fn new() -> Self {
        Self {
            shared: Shared::new(AnySession::coprocessor()),
        }
    }

    /// Catalyst's `connect`: opens the NIC and listens for the controller.
    fn connect(&self, py: Python<'_>, info: PyRef<'_, ConnectInfo>) -> PyResult<()> {
        self.shared.connect(py, &info)
    }

    /// Catalyst's `alloc_memory`.
    #[pyo3(signature = (size, kind="host"))]
    fn alloc_memory(&self, py: Python<'_>, size: usize, kind: &str) -> PyResult<MemRegion> {
        self.shared.alloc_memory(py, size, kind)
    }

    /// Catalyst's `exchange_keys`.
    fn exchange_keys(&self, py: Python<'_>, local: PyRef<'_, MemRegion>) -> PyResult<PeerRef> {
        self.shared.exchange_keys(py, &local)
    }

    /// Catalyst's `establish_channel`.
    fn establish_channel(
        &self,
        py: Python<'_>,
        desc: ChannelDesc,
        local: PyRef<'_, MemRegion>,
        peer: PyRef<'_, PeerRef>,
    ) -> PyResult<()> {
        self.shared.establish_channel(py, desc, &local, &peer)
    }

    /// Catalyst's `set_coprocessor_fn`: `function(request: bytes) -> bytes-like` (or `None`
    /// for an empty reply), run on the engine's thread for every request. What it raises
    /// becomes the request's error reply (`CoprocessorFailed` at the controller), and the
    /// engine goes on serving.
    fn set_coprocessor_fn(&self, py: Python<'_>, function: Py<PyAny>) -> PyResult<()> {
        if !function.bind(py).is_callable() {
            return Err(Error::invalid("the coprocessor function must be callable").into());
        }
        let call = move |request: &[u8], reply: &mut [u8]| -> Result<usize, String> {
            Python::try_attach(|py| {
                let out = function
                    .call1(py, (PyBytes::new(py, request),))
                    .map_err(|e| describe_exception(py, &e))?;
                let out = out.bind(py);
                if out.is_none() {
                    return Ok(0);
                }
                let bytes = memory::bytes_of(out).map_err(|e| describe_exception(py, &e))?;
                if bytes.len() > reply.len() {
                    return Err(format!(
                        "the function's reply has {} bytes; a reply slot holds {}",
                        bytes.len(),
                        reply.len()
                    ));
                }
                reply[..bytes.len()].copy_from_slice(&bytes);
                Ok(bytes.len())
            })
            .unwrap_or_else(|| Err("the Python interpreter is shutting down".to_owned()))
        };
        self.shared
            .quick(py, move |s| s.set_coprocessor_fn(Box::new(call)))?;
        Ok(())
    }

    /// Catalyst's `start`: starts the engine thread, which serves until `stop`.
    fn start(&self, py: Python<'_>) -> Result<(), Error> {
        self.shared.quick(py, |s| s.start())
    }

    /// Catalyst's `collect` on the coprocessor: the next request served, as
    /// `(request, reply_bytes)` (the reply it sent).
    #[pyo3(signature = (timeout=None))]
    fn collect<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<(u64, Bound<'py, PyBytes>)> {
        self.shared.collect(py, rs::Role::Coprocessor, timeout)
    }

    /// `collect` into `out`; returns `Collected`.
    #[pyo3(signature = (out, timeout=None))]
    fn collect_into(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<Collected> {
        self.shared.collect_into(py, out, timeout)
    }

    /// Catalyst's `stop`: stops the engine and joins it. Idempotent.
    fn stop(&self, py: Python<'_>) {
        self.shared.stop(py);
    }

    /// Catalyst's `last_rtt_ns`.
    fn last_rtt_ns(&self, py: Python<'_>) -> u64 {
        self.shared.last_rtt_ns(py)
    }

    /// How many requests the engine has served (0 before `start`).
    fn served(&self, py: Python<'_>) -> u64 {
        self.shared.served(py)
    }

    /// Why the controller is gone, once the session's watchdog has noticed; `None` while it
    /// is there (and before `start`).
    fn peer_gone(&self, py: Python<'_>) -> Option<String> {
        self.shared.peer_gone(py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.stop(py);
        false
    }
}
