//! Connection management as librdmacm offers it, over `ferroce::cm`: `Listener`
//! (`rdma_listen`), `ConnectRequest` (`RDMA_CM_EVENT_CONNECT_REQUEST`, `rdma_accept`,
//! `rdma_reject`), `Connection` (`rdma_connect`, `rdma_disconnect` and the events that follow)
//! with private data both ways, and SIDR for UD queue pairs (`resolve_ud`, `SidrRequest`).
//!
//! Every wait is cut into slices or runs on a helper thread (module `wait`), so the GIL is
//! free meanwhile and Ctrl-C ends it; every `ferroce::cm::CmError` becomes a typed exception
//! (`Rejected` with the peer's reason and private data, `Unreachable`, `Timeout`, …).

use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use ferroce::cm::{self as rcm, CmError, ConnParam};
use ferroce::qp::Mtu;

use crate::errors::Error;
use crate::nic::Nic;
use crate::ud::{AddressHandle, UdDest};
use crate::util;
use crate::verbs::Qp;
use crate::wait;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A wait in seconds from Python as the Rust calls take it: `None` is for ever (as long as
/// a `Duration` added to now can be).
fn patience(seconds: Option<f64>) -> Result<Duration, Error> {
    Ok(wait::timeout(seconds)?.unwrap_or(Duration::from_secs(1_000_000_000)))
}

/// The connection options of `accept` and `connect`, as `struct rdma_conn_param` holds them.
#[allow(clippy::too_many_arguments)]
fn conn_param(
    qp: &Qp,
    private_data: &[u8],
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    mtu: u32,
    min_rnr_timer: u8,
) -> Result<ConnParam, Error> {
    let mtu = Mtu::from_bytes(mtu)
        .ok_or_else(|| Error::invalid(format!("mtu {mtu} is not 256, 512, 1024, 2048 or 4096")))?;
    Ok(ConnParam {
        responder_resources,
        initiator_depth,
        retry_count,
        rnr_retry_count,
        srq: qp.on_srq,
        private_data: private_data.to_vec(),
        mtu,
        min_rnr_timer,
        ..ConnParam::default()
    })
}

/// Listens for connection requests on a port of a soft NIC (`rdma_bind_addr` and
/// `rdma_listen`): in rdma_cm's TCP port space for RC and UC, or with `udp=True` in its UDP
/// port space for the SIDR requests of UD peers. Raises `AddressInUse` when another
/// listener of this NIC holds the port, `NotSupported` on a verbs device (whose connections
/// are the kernel's rdma_cm's). `close()` (or the end of a `with` block, or the last
/// reference going) stops it; later requests are refused (REJ 8, no listener).
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Listener {
    inner: Mutex<Option<Arc<rcm::Listener>>>,
    port: u16,
    udp: bool,
}

impl Listener {
    fn get(&self) -> Result<Arc<rcm::Listener>, Error> {
        lock(&self.inner)
            .clone()
            .ok_or_else(|| Error::closed("the listener is closed"))
    }
}

/// The next request `get` takes from `listener`, waited for in slices up to `timeout`
/// seconds (`None`: for ever); `Timeout`, naming `what`, when none came.
fn next_request<T: Send>(
    py: Python<'_>,
    listener: &rcm::Listener,
    timeout: Option<f64>,
    what: &'static str,
    get: fn(&rcm::Listener, Duration) -> Result<T, CmError>,
) -> PyResult<T> {
    let t = wait::timeout(timeout)?;
    let got = wait::sliced(py, t, |slice| match get(listener, slice) {
        Err(CmError::Timeout { .. }) => None,
        other => Some(other),
    })?;
    match got {
        Some(Ok(req)) => Ok(req),
        Some(Err(e)) => Err(Error::from(e).into()),
        None => Err(Error::from(CmError::Timeout {
            what,
            after: t.unwrap_or_default(),
        })
        .into()),
    }
}

#[pymethods]
impl Listener {
    #[new]
    #[pyo3(signature = (nic, port, *, udp=false))]
    fn new(py: Python<'_>, nic: PyRef<'_, Nic>, port: u16, udp: bool) -> Result<Self, Error> {
        let nic = nic.get()?;
        let inner = py.detach(|| {
            if udp {
                rcm::Listener::bind_udp(&nic, port)
            } else {
                rcm::Listener::bind(&nic, port)
            }
        })?;
        Ok(Self {
            inner: Mutex::new(Some(Arc::new(inner))),
            port,
            udp,
        })
    }

    /// The port listened on.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The next connection request (`rdma_get_request`), waiting up to `timeout` seconds
    /// (`None`: for ever). Returns a `ConnectRequest` to `accept` or `reject`; raises
    /// `Timeout` when none came, `Closed` after `close()`.
    #[pyo3(signature = (timeout=None))]
    fn get_request(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<ConnectRequest> {
        let listener = self.get()?;
        let req = next_request(
            py,
            &listener,
            timeout,
            "connection request",
            rcm::Listener::get_request,
        )?;
        Ok(ConnectRequest::wrap(req))
    }

    /// The next SIDR request of a UD peer on a `udp=True` listener (its `resolve_ud`),
    /// waiting up to `timeout` seconds (`None`: for ever). Returns a `SidrRequest` to
    /// `accept` with a UD queue pair or `reject`; raises `Timeout` when none came.
    #[pyo3(signature = (timeout=None))]
    fn get_sidr_request(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<SidrRequest> {
        let listener = self.get()?;
        if !self.udp {
            return Err(Error::invalid(
                "SIDR requests come to a listener in the UDP port space: Listener(nic, port, udp=True)",
            )
            .into());
        }
        let req = next_request(
            py,
            &listener,
            timeout,
            "SIDR request",
            rcm::Listener::get_sidr_request,
        )?;
        Ok(SidrRequest::wrap(req))
    }

    /// Stops listening; idempotent.
    fn close(&self, py: Python<'_>) {
        if let Some(l) = lock(&self.inner).take() {
            py.detach(move || drop(l));
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        let space = if self.udp { "udp" } else { "tcp" };
        format!("<ferroce.Listener {space} port {}>", self.port)
    }
}

/// A connection request waiting for an answer (`RDMA_CM_EVENT_CONNECT_REQUEST`): `peer` is
/// the requesting NIC's address, `private_data` the application's bytes of the REQ (up to
/// 56, after rdma_cm's header). Answer it once, with `accept` or `reject`; dropped
/// unanswered, it is rejected.
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct ConnectRequest {
    pending: Pending<rcm::ConnectRequest>,
}

impl ConnectRequest {
    fn wrap(req: rcm::ConnectRequest) -> Self {
        let (from, private) = (req.from(), req.private_data().to_vec());
        Self {
            pending: Pending::new(req, from, private),
        }
    }

    fn take(&self) -> Result<rcm::ConnectRequest, Error> {
        self.pending
            .take("the connection request was answered already")
    }
}

/// A request waiting for its one answer, as `ConnectRequest` and `SidrRequest` hold it: the
/// request until it is answered, and who sent it with what private data.
struct Pending<T> {
    request: Mutex<Option<T>>,
    from: IpAddr,
    private: Vec<u8>,
}

impl<T> Pending<T> {
    fn new(request: T, from: IpAddr, private: Vec<u8>) -> Self {
        Self {
            request: Mutex::new(Some(request)),
            from,
            private,
        }
    }

    /// The request, to answer; `Closed`, saying `answered`, when it was answered already.
    fn take(&self, answered: &'static str) -> Result<T, Error> {
        lock(&self.request)
            .take()
            .ok_or_else(|| Error::closed(answered))
    }

    fn answered(&self) -> bool {
        lock(&self.request).is_none()
    }

    fn peer(&self) -> String {
        self.from.to_string()
    }

    fn private_data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.private)
    }
}

#[pymethods]
impl ConnectRequest {
    /// The requesting NIC's IP address.
    #[getter]
    fn peer(&self) -> String {
        self.pending.peer()
    }

    /// The application's private data of the REQ (what the peer's `Connection.connect`
    /// gave, zero-padded to the 56 bytes a REQ carries).
    #[getter]
    fn private_data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.pending.private_data(py)
    }

    /// Accepts (`rdma_accept`): brings `qp` (an RC queue pair in INIT) to RTS with the
    /// attributes the REQ and these options settle, then sends the REP with `private_data`
    /// (at most 196 bytes). Returns the `Connection`, established once the peer's RTU (or
    /// first data) comes: `wait_established()`. Raises `InvalidArgument` for too much
    /// private data, `ModifyError` when the QP cannot be brought up (the request is then
    /// rejected), `Closed` when the request was answered already or the peer gave up.
    #[pyo3(
        signature = (qp, private_data=b"".as_slice(), *, responder_resources=1, initiator_depth=1, retry_count=7, rnr_retry_count=7, mtu=4096, min_rnr_timer=12),
        text_signature = "($self, qp, private_data=b'', *, responder_resources=1, initiator_depth=1, retry_count=7, rnr_retry_count=7, mtu=4096, min_rnr_timer=12)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn accept(
        &self,
        py: Python<'_>,
        qp: PyRef<'_, Qp>,
        private_data: &[u8],
        responder_resources: u8,
        initiator_depth: u8,
        retry_count: u8,
        rnr_retry_count: u8,
        mtu: u32,
        min_rnr_timer: u8,
    ) -> Result<Connection, Error> {
        let param = conn_param(
            &qp,
            private_data,
            responder_resources,
            initiator_depth,
            retry_count,
            rnr_retry_count,
            mtu,
            min_rnr_timer,
        )?;
        let req = self.take()?;
        let q = Arc::clone(&qp.inner);
        let conn = py.detach(move || req.accept(&q, &param))?;
        Ok(Connection::wrap(conn))
    }

    /// Refuses (`rdma_reject`): a REJ with reason 28 (consumer defined) and `private_data`
    /// (at most 148 bytes), which the peer's `connect` raises as `Rejected`. Raises
    /// `InvalidArgument` for too much private data, `Closed` when answered already.
    #[pyo3(
        signature = (private_data=b"".as_slice()),
        text_signature = "($self, private_data=b'')"
    )]
    fn reject(&self, py: Python<'_>, private_data: &[u8]) -> Result<(), Error> {
        if private_data.len() > rcm::MAX_REJ_PRIVATE {
            return Err(CmError::PrivateData {
                len: private_data.len(),
                max: rcm::MAX_REJ_PRIVATE,
                message: "REJ",
            }
            .into());
        }
        let req = self.take()?;
        py.detach(move || req.reject(private_data))?;
        Ok(())
    }

    /// Whether `accept` or `reject` was called.
    #[getter]
    fn answered(&self) -> bool {
        self.pending.answered()
    }

    fn __repr__(&self) -> String {
        format!("<ferroce.ConnectRequest from {}>", self.pending.from)
    }
}

/// A connection made by connection management: the active side's `Connection.connect`, or a
/// passive side's `ConnectRequest.accept`. Its queue pair is the caller's, in RTS; `peer` is
/// the other NIC's address, `private_data` the bytes of the peer's REP (on the active side;
/// empty on the passive one). `disconnect()` closes it (`rdma_disconnect`); so does the last
/// reference going.
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Connection {
    inner: Arc<rcm::Connection>,
}

impl Connection {
    fn wrap(conn: rcm::Connection) -> Self {
        Self {
            inner: Arc::new(conn),
        }
    }
}

#[pymethods]
impl Connection {
    /// Connects `qp` (an RC queue pair of `nic`, in INIT) to the listener on `port` at the
    /// NIC `addr` (`"ip"`), as `rdma_resolve_addr`, `rdma_resolve_route` and `rdma_connect`
    /// do: sends the REQ with `private_data` (at most 56 bytes), waits up to `timeout`
    /// seconds for the REP (`None`: 120 s, as long as the REQ's retries last), brings the QP
    /// to RTS and sends the RTU. Returns the established `Connection`, whose `private_data`
    /// is the REP's. Raises `Rejected` when the peer refused (its `reason`, `reason_code`
    /// and `private_data`), `Unreachable` when nobody answered, `Timeout`,
    /// `InvalidArgument` for too much private data, `ModifyError`, `NotSupported` on a verbs
    /// device.
    #[staticmethod]
    #[pyo3(
        signature = (nic, qp, addr, port, private_data=b"".as_slice(), *, timeout=None, responder_resources=1, initiator_depth=1, retry_count=7, rnr_retry_count=7, mtu=4096, min_rnr_timer=12),
        text_signature = "(nic, qp, addr, port, private_data=b'', *, timeout=None, responder_resources=1, initiator_depth=1, retry_count=7, rnr_retry_count=7, mtu=4096, min_rnr_timer=12)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        py: Python<'_>,
        nic: PyRef<'_, Nic>,
        qp: PyRef<'_, Qp>,
        addr: &str,
        port: u16,
        private_data: &[u8],
        timeout: Option<f64>,
        responder_resources: u8,
        initiator_depth: u8,
        retry_count: u8,
        rnr_retry_count: u8,
        mtu: u32,
        min_rnr_timer: u8,
    ) -> PyResult<Self> {
        let mut param = conn_param(
            &qp,
            private_data,
            responder_resources,
            initiator_depth,
            retry_count,
            rnr_retry_count,
            mtu,
            min_rnr_timer,
        )?;
        if let Some(t) = wait::timeout(timeout)? {
            param.timeout = t;
        }
        let to = util::ip(addr)?;
        let nic = nic.get()?;
        let q = Arc::clone(&qp.inner);
        let conn = wait::off_thread(py, "cm-connect", move || {
            rcm::Connection::connect(&nic, &q, to, port, &param)
        })?
        .map_err(Error::from)?;
        Ok(Self::wrap(conn))
    }

    /// The peer NIC's IP address.
    #[getter]
    fn peer(&self) -> String {
        self.inner.peer().to_string()
    }

    /// The private data of the peer's REP (the active side: what the peer's `accept` gave,
    /// zero-padded to the 196 bytes a REP carries); empty on the passive side.
    #[getter]
    fn private_data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.inner.private_data())
    }

    /// Waits up to `timeout` seconds (`None`: for ever) until the connection is established
    /// (`RDMA_CM_EVENT_ESTABLISHED` on the passive side; at once on the active side). Returns
    /// `None`; raises `Timeout` (the attempt is then given up), `Rejected` or `Unreachable`
    /// when it failed, `Closed` when it was closed.
    #[pyo3(signature = (timeout=None))]
    fn wait_established(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let t = patience(timeout)?;
        let conn = Arc::clone(&self.inner);
        wait::off_thread(py, "cm-wait", move || conn.wait_established(t))?
            .map_err(|e| Error::from(e).into())
    }

    /// Waits up to `timeout` seconds (`None`: for ever) for the peer to disconnect
    /// (`RDMA_CM_EVENT_DISCONNECTED`); the QP is in ERR after, its outstanding work flushed.
    /// Returns `None` (at once if it is closed already); raises `Timeout` while the peer
    /// keeps the connection.
    #[pyo3(signature = (timeout=None))]
    fn wait_disconnected(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let t = patience(timeout)?;
        let conn = Arc::clone(&self.inner);
        wait::off_thread(py, "cm-wait", move || conn.wait_disconnected(t))?
            .map_err(|e| Error::from(e).into())
    }

    /// Disconnects (`rdma_disconnect`): the QP goes to ERR, the DREQ goes out, and this waits
    /// up to `timeout` seconds for the peer's DREP. Returns `None`, at once when the peer
    /// closed first; raises `Timeout` when the DREP did not come in time (the DREQ is still
    /// resent until its retries run out).
    #[pyo3(signature = (timeout=10.0))]
    fn disconnect(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = patience(Some(timeout))?;
        let conn = Arc::clone(&self.inner);
        wait::off_thread(py, "cm-disconnect", move || conn.disconnect(t))?
            .map_err(|e| Error::from(e).into())
    }

    fn __repr__(&self) -> String {
        format!("<ferroce.Connection to {}>", self.inner.peer())
    }
}

/// A SIDR request of a UD peer's `resolve_ud`, waiting for an answer; `peer` is its NIC's
/// address, `private_data` its application bytes (up to 180). Answer once, with `accept`
/// or `reject`; dropped unanswered, it is refused.
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct SidrRequest {
    pending: Pending<rcm::SidrRequest>,
}

impl SidrRequest {
    fn wrap(req: rcm::SidrRequest) -> Self {
        let (from, private) = (req.from(), req.private_data().to_vec());
        Self {
            pending: Pending::new(req, from, private),
        }
    }

    fn take(&self) -> Result<rcm::SidrRequest, Error> {
        self.pending.take("the SIDR request was answered already")
    }
}

#[pymethods]
impl SidrRequest {
    /// The requesting NIC's IP address.
    #[getter]
    fn peer(&self) -> String {
        self.pending.peer()
    }

    /// The application's private data of the request (zero-padded to 180 bytes).
    #[getter]
    fn private_data<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.pending.private_data(py)
    }

    /// Answers with `qp`, a UD queue pair, and its Q_Key (`rdma_accept` on a UD id): the
    /// peer's `resolve_ud` returns them. Raises `Closed` when answered already or no longer
    /// known.
    #[pyo3(
        signature = (qp, qkey=ferroce::ud::RDMA_UDP_QKEY),
        text_signature = "($self, qp, qkey=0x1234567)"
    )]
    fn accept(&self, py: Python<'_>, qp: PyRef<'_, Qp>, qkey: u32) -> Result<(), Error> {
        let req = self.take()?;
        let q = Arc::clone(&qp.inner);
        py.detach(move || req.accept(&q, qkey))?;
        Ok(())
    }

    /// Refuses (SIDR status 2), which the peer's `resolve_ud` raises as `Rejected`.
    fn reject(&self, py: Python<'_>) -> Result<(), Error> {
        let req = self.take()?;
        py.detach(move || req.reject())?;
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<ferroce.SidrRequest from {}>", self.pending.from)
    }
}

/// A UD peer `resolve_ud` found: its NIC (`address`, an `AddressHandle`), its UD queue
/// pair (`qpn`) and Q_Key (`qkey`). `SendWr(..., dest=peer)` sends to it.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct UdPeer {
    inner: rcm::UdPeer,
}

impl UdPeer {
    pub(crate) fn dest_inner(&self) -> ferroce::ud::UdDest {
        self.inner.address.dest(self.inner.qpn, self.inner.qkey)
    }
}

#[pymethods]
impl UdPeer {
    #[getter]
    fn address(&self) -> AddressHandle {
        AddressHandle {
            inner: self.inner.address,
        }
    }

    #[getter]
    fn qpn(&self) -> u32 {
        self.inner.qpn.value()
    }

    #[getter]
    fn qkey(&self) -> u32 {
        self.inner.qkey
    }

    /// The destination of a UD send to this peer.
    fn dest(&self) -> UdDest {
        UdDest {
            inner: self.dest_inner(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "UdPeer(address={:?}, qpn={:#x}, qkey={:#x})",
            self.inner.address.peer().to_string(),
            self.inner.qpn.value(),
            self.inner.qkey
        )
    }
}

/// Resolves the UD queue pair behind `port` at the NIC `addr` (`"ip"`) by SIDR, as
/// rdma_cm's `rdma_connect` on an `RDMA_PS_UDP` id does: sends the SIDR request with
/// `private_data` (at most 180 bytes) and waits up to `timeout` seconds for the reply.
/// Returns a `UdPeer` (address handle, QPN, Q_Key). Raises `Rejected` when the peer answered
/// with a failure status (`reason` `"Unsupported"`: nobody listens; `"Reject"`: refused),
/// `Unreachable`, `Timeout`, `InvalidArgument`, `NotSupported` on a verbs device.
#[pyfunction]
#[pyo3(
    signature = (nic, addr, port, private_data=b"".as_slice(), *, timeout=5.0),
    text_signature = "(nic, addr, port, private_data=b'', *, timeout=5.0)"
)]
pub(crate) fn resolve_ud(
    py: Python<'_>,
    nic: PyRef<'_, Nic>,
    addr: &str,
    port: u16,
    private_data: &[u8],
    timeout: f64,
) -> PyResult<UdPeer> {
    let t = patience(Some(timeout))?;
    let to = util::ip(addr)?;
    let nic = nic.get()?;
    let data = private_data.to_vec();
    let peer = wait::off_thread(py, "cm-sidr", move || {
        rcm::resolve_ud(&nic, to, port, &data, t)
    })?
    .map_err(Error::from)?;
    Ok(UdPeer { inner: peer })
}
