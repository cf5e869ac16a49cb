//! Unreliable datagrams: `AddressHandle` (`ibv_ah`) and `UdDest`, where one UD send goes
//! (`ibv_send_wr.wr.ud`), one to one with `ferroce::ud`.

use std::net::SocketAddr;

use pyo3::prelude::*;

use ferroce::proto::wire::{Qpn, ROCE_PORT};
use ferroce::ud::UdDest as RustUdDest;

use crate::errors::Error;
use crate::util;
use crate::verbs::Completion;

/// Where datagrams go: a peer NIC (`ibv_create_ah`). On RoCE v2 the address is all an
/// address handle holds that matters (the GID is the IPv4-mapped address). `addr` is
/// `"ip"` (port 4791), `"ip:port"` or the `(host, port)` that `Nic.addr()` gives.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct AddressHandle {
    pub(crate) inner: ferroce::AddressHandle,
}

#[pymethods]
impl AddressHandle {
    #[new]
    fn new(addr: &Bound<'_, PyAny>) -> PyResult<Self> {
        let peer = util::addr_arg(addr)?;
        Ok(Self {
            inner: ferroce::AddressHandle::with_port(peer),
        })
    }

    /// The address handle that answers the sender of a UD receive (`ibv_create_ah_from_wc`),
    /// or `None` for a completion that is not a UD receive.
    #[staticmethod]
    fn from_completion(completion: PyRef<'_, Completion>) -> Option<Self> {
        let ip = completion.src_ip()?;
        Some(Self {
            inner: ferroce::AddressHandle::with_port(SocketAddr::new(ip, ROCE_PORT)),
        })
    }

    /// The peer's `(host, port)`.
    #[getter]
    fn addr(&self) -> (String, u16) {
        util::addr_tuple(self.inner.peer())
    }

    /// The destination of a UD send to queue pair `qpn` behind this handle with Q_Key
    /// `qkey` (a value with the top bit set sends the sending QP's own Q_Key, as verbs does).
    #[pyo3(
        signature = (qpn, qkey=ferroce::ud::RDMA_UDP_QKEY),
        text_signature = "($self, qpn, qkey=0x1234567)"
    )]
    fn dest(&self, qpn: u32, qkey: u32) -> Result<UdDest, Error> {
        Ok(UdDest {
            inner: self.inner.dest(qpn_arg(qpn)?, qkey),
        })
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        util::hash_of(&self.inner)
    }

    fn __repr__(&self) -> String {
        format!("AddressHandle({:?})", self.inner.peer().to_string())
    }
}

/// Where one UD send goes: a peer NIC's address, its queue pair and the Q_Key
/// (`ibv_send_wr.wr.ud`); `SendWr(..., dest=...)` takes it.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct UdDest {
    pub(crate) inner: RustUdDest,
}

#[pymethods]
impl UdDest {
    /// The destination `qpn` with `qkey` at the peer NIC `ah`.
    #[new]
    #[pyo3(
        signature = (ah, qpn, qkey=ferroce::ud::RDMA_UDP_QKEY),
        text_signature = "(ah, qpn, qkey=0x1234567)"
    )]
    fn new(ah: AddressHandle, qpn: u32, qkey: u32) -> Result<Self, Error> {
        ah.dest(qpn, qkey)
    }

    /// The peer NIC's `(host, port)`.
    #[getter]
    fn addr(&self) -> (String, u16) {
        util::addr_tuple(self.inner.peer)
    }

    #[getter]
    fn qpn(&self) -> u32 {
        self.inner.qpn.value()
    }

    #[getter]
    fn qkey(&self) -> u32 {
        self.inner.qkey
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __repr__(&self) -> String {
        format!(
            "UdDest(addr={:?}, qpn={:#x}, qkey={:#x})",
            self.inner.peer.to_string(),
            self.inner.qpn.value(),
            self.inner.qkey
        )
    }
}

/// A 24-bit queue pair number from Python.
pub(crate) fn qpn_arg(qpn: u32) -> Result<Qpn, Error> {
    Qpn::new(qpn).ok_or_else(|| Error::invalid(format!("QPN {qpn:#x} needs more than 24 bits")))
}

/// A UD destination from `SendWr`'s `dest`: a `UdDest`, or a `UdPeer` that `resolve_ud` found.
pub(crate) fn dest_arg(obj: &Bound<'_, PyAny>) -> PyResult<RustUdDest> {
    if let Ok(d) = obj.cast::<UdDest>() {
        return Ok(d.get().inner);
    }
    if let Ok(p) = obj.cast::<crate::cm::UdPeer>() {
        return Ok(p.get().dest_inner());
    }
    Err(pyo3::exceptions::PyTypeError::new_err(
        "dest is a UdDest (AddressHandle.dest(qpn, qkey)) or a UdPeer (resolve_ud)",
    ))
}
