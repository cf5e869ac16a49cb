//! `Srq`, the shared receive queue (`ibv_create_srq`), and `AsyncEvent`, what
//! `Nic.poll_event` returns (`struct ibv_async_event`).

use pyo3::prelude::*;

use ferroce::qp::AsyncEvent as RustEvent;

use crate::errors::Error;
use crate::nic::Nic;
use crate::verbs::RecvWr;

/// A shared receive queue of a soft NIC (`ibv_create_srq`): one pool of receives for many
/// queue pairs (`Qp(..., srq=srq)`). A receive taken from it completes on the receive CQ of
/// the queue pair the message came in on, whose `qpn` the completion names. When it runs dry,
/// RC peers get an RNR NAK and retry; `arm(limit)` raises an `AsyncEvent` on the NIC
/// (`Nic.poll_event`) before that happens. Raises `NotSupported` on a verbs device.
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Srq {
    pub(crate) inner: ferroce::Srq,
}

#[pymethods]
impl Srq {
    /// A shared receive queue of `nic` holding up to `max_wr` receives, its limit disarmed.
    #[new]
    #[pyo3(signature = (nic, max_wr=256))]
    fn new(py: Python<'_>, nic: PyRef<'_, Nic>, max_wr: u32) -> Result<Self, Error> {
        let nic = nic.get()?;
        let inner = py.detach(|| ferroce::Srq::new(&nic, max_wr))?;
        Ok(Self { inner })
    }

    /// Posts a receive work request to the pool (`ibv_post_srq_recv`). Raises `PostError`
    /// when `max_wr` receives wait already.
    fn post_recv(&self, py: Python<'_>, wr: PyRef<'_, RecvWr>) -> Result<(), Error> {
        let wr = wr.inner.clone();
        py.detach(|| self.inner.post_recv(wr))?;
        Ok(())
    }

    /// Arms the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): the first time taking a
    /// receive leaves fewer than `limit` queued, the NIC raises one `AsyncEvent` of kind
    /// `"SrqLimitReached"` naming this queue's `id`, and disarms it. 0 disarms. Raises
    /// `InvalidArgument` when `limit` is not below the queue's size.
    fn arm(&self, limit: u32) -> Result<(), Error> {
        Ok(self.inner.arm(limit)?)
    }

    /// Changes how many receives the queue holds (`ibv_modify_srq` with `IBV_SRQ_MAX_WR`).
    /// Raises `InvalidArgument` for a size below what is queued now.
    fn resize(&self, max_wr: u32) -> Result<(), Error> {
        Ok(self.inner.resize(max_wr)?)
    }

    /// `(max_wr, limit, queued)` (`ibv_query_srq`): its size, the armed limit (0: disarmed)
    /// and the receives queued now.
    fn query(&self, py: Python<'_>) -> (u32, u32, u32) {
        let a = py.detach(|| self.inner.query());
        (a.max_wr, a.limit, a.queued)
    }

    /// Its number on the NIC, as `AsyncEvent.srq_id` names it.
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id().0
    }

    fn __repr__(&self) -> String {
        format!("<ferroce.Srq {}>", self.inner.id().0)
    }
}

/// An asynchronous event of the NIC (`struct ibv_async_event`), from `Nic.poll_event()`.
/// `kind` is `"SrqLimitReached"` (`IBV_EVENT_SRQ_LIMIT_REACHED`: `srq_id` fell below its
/// armed limit, now disarmed) or `"QpLastWqeReached"` (`IBV_EVENT_QP_LAST_WQE_REACHED`:
/// queue pair `qpn`, on an SRQ, entered ERR and takes no more of its receives); the field
/// the kind does not use is `None`.
#[pyclass(module = "ferroce", frozen, get_all)]
pub(crate) struct AsyncEvent {
    kind: &'static str,
    srq_id: Option<u32>,
    qpn: Option<u32>,
}

impl From<RustEvent> for AsyncEvent {
    fn from(e: RustEvent) -> Self {
        match e {
            RustEvent::SrqLimitReached(id) => Self {
                kind: "SrqLimitReached",
                srq_id: Some(id.0),
                qpn: None,
            },
            RustEvent::QpLastWqeReached(qpn) => Self {
                kind: "QpLastWqeReached",
                srq_id: None,
                qpn: Some(qpn.value()),
            },
        }
    }
}

#[pymethods]
impl AsyncEvent {
    fn __repr__(&self) -> String {
        match (self.srq_id, self.qpn) {
            (Some(id), _) => format!("AsyncEvent({}, srq_id={id})", self.kind),
            (_, Some(qpn)) => format!("AsyncEvent({}, qpn={qpn:#x})", self.kind),
            _ => format!("AsyncEvent({})", self.kind),
        }
    }
}
