//! The verbs backend: a kernel RDMA device (a RoCE NIC, or kernel Soft-RoCE) through rdma-core's
//! libibverbs, loaded at run time.
//!
//! Files as in the soft backend, one per object of the contract (see [`crate::backend`]):
//! `nic`, `cq`, `qp`, `region`; and what only a kernel device has: `device` (the open
//! context, PD, port and GID every object holds), `discover` (finding and describing devices,
//! choosing the GID) and `events` (the async-event thread). The C layouts are in `abi`, and every call across the
//! boundary, with the only `unsafe` of the backend, is in `ffi`. Nothing here names the public
//! modules above; ferroce's work requests and completions are translated to libibverbs' and
//! back here.

mod abi;
mod cq;
mod device;
mod discover;
mod events;
mod ffi;
mod nic;
mod qp;
mod region;

pub(crate) use cq::Cq;
pub use discover::{describe, devices, library_path};
pub(crate) use nic::Nic;
pub(crate) use qp::Qp;
pub(crate) use region::Region;
