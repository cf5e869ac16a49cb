//! The soft backend: the `ferroce-proto` engine driven over the datagram layer
//! ([`crate::udp`]), with no kernel module and no privileges.
//!
//! `driver` owns the engine behind its lock and the progress thread; `memory` the regions'
//! bytes. Each object of the contract (see [`crate::backend`]) has its file, named as in the
//! verbs backend: `nic`, `cq`, `qp`, `srq`, `region`. They import the driver and the shared
//! data below the backends (`crate::attr`, `crate::error`, `crate::memory`), never the public
//! modules above.

mod cq;
mod driver;
mod memory;
mod nic;
mod qp;
mod region;
mod rehearsal;
mod srq;

pub(crate) use cq::Cq;
pub(crate) use nic::Nic;
pub(crate) use qp::Qp;
pub(crate) use region::Region;
pub(crate) use srq::Srq;
