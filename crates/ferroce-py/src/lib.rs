//! Python bindings for ferroce: the `ferroce._ferroce` extension module, which the `ferroce`
//! package (`python/ferroce/`) re-exports by face: `ferroce` (NIC and verbs objects),
//! `ferroce.frames`, `ferroce.cache` and `ferroce.session`.
//!
//! Three rules hold throughout:
//! - every wait gives up the GIL, in slices of at most 100 ms with a signal check between
//!   them, so other Python threads run and Ctrl-C ends the wait (module `wait`);
//! - Python code called from ferroce's threads (a frame-ready callback, a coprocessor
//!   function) attaches with `Python::try_attach` and is never called with a ferroce lock
//!   that a Python thread could be waiting for; its exceptions go to
//!   `sys.unraisablehook` or become the Rust error the face defines;
//! - every Rust error becomes an exception of the `FerroceError` family carrying its message
//!   (module `errors`); bad input never panics.
//!
//! The module is marked `gil_used = true`: it has not been audited for free-threaded Python.

#![deny(unsafe_code)]

mod cache;
mod cm;
mod enums;
mod errors;
mod frames;
mod memory;
mod nic;
mod session;
mod srq;
mod ud;
mod util;
mod verbs;
mod wait;

use pyo3::prelude::*;

/// The extension module.
#[pymodule(gil_used = true)]
fn _ferroce(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<nic::Nic>()?;
    m.add_function(wrap_pyfunction!(nic::devices, m)?)?;
    m.add_class::<nic::Faults>()?;
    enums::register(m)?;
    m.add_class::<verbs::Region>()?;
    m.add_class::<verbs::Sge>()?;
    m.add_class::<verbs::RemoteAddr>()?;
    m.add_class::<verbs::Completion>()?;
    m.add_class::<verbs::Cq>()?;
    m.add_class::<verbs::QpEndpoint>()?;
    m.add_class::<verbs::SendOp>()?;
    m.add_class::<verbs::SendWr>()?;
    m.add_class::<verbs::RecvWr>()?;
    m.add_class::<verbs::Qp>()?;
    m.add_class::<srq::Srq>()?;
    m.add_class::<srq::AsyncEvent>()?;
    m.add_class::<ud::AddressHandle>()?;
    m.add_class::<ud::UdDest>()?;
    m.add("UD_GRH_LEN", ferroce::ud::UD_GRH_LEN)?;
    m.add("RDMA_UDP_QKEY", ferroce::ud::RDMA_UDP_QKEY)?;
    m.add_class::<cm::Listener>()?;
    m.add_class::<cm::ConnectRequest>()?;
    m.add_class::<cm::Connection>()?;
    m.add_class::<cm::SidrRequest>()?;
    m.add_class::<cm::UdPeer>()?;
    m.add_function(wrap_pyfunction!(cm::resolve_ud, m)?)?;
    m.add_class::<frames::Metadata>()?;
    m.add_class::<frames::FrameInfo>()?;
    m.add_class::<frames::FrameCounters>()?;
    m.add_class::<frames::ReceiverConfig>()?;
    m.add_class::<frames::Frame>()?;
    m.add_class::<frames::Receiver>()?;
    m.add_class::<frames::Target>()?;
    m.add_class::<frames::FrameSent>()?;
    m.add_class::<frames::Sender>()?;
    m.add_class::<frames::RoceChannel>()?;
    m.add_class::<frames::DataChannel>()?;
    m.add_class::<frames::DeviceRegisters>()?;
    m.add_class::<cache::ContextConfig>()?;
    m.add_class::<cache::Buffer>()?;
    m.add_class::<cache::Context>()?;
    m.add_function(wrap_pyfunction!(cache::size_class, m)?)?;
    m.add_class::<session::ConnectInfo>()?;
    m.add_class::<session::ChannelDesc>()?;
    m.add_class::<session::MemRegion>()?;
    m.add_class::<session::PeerRef>()?;
    m.add_class::<session::Collected>()?;
    m.add_class::<session::Controller>()?;
    m.add_class::<session::Coprocessor>()?;
    Ok(())
}
