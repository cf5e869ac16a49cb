//! ferroce: RDMA over Converged Ethernet v2 in Rust.
//!
//! This crate is what applications depend on: the soft [`Nic`] (the protocol engine of
//! [`ferroce_proto`] over a UDP socket), registered [`Region`]s (Rig_mlx5's `Region`), completion
//! queues ([`Cq`]) and queue pairs ([`Qp`]), the same types on a kernel RDMA device through
//! libibverbs loaded at run time ([`verbs`], [`Nic::open_device`]); and, for tools, reading packet
//! captures ([`capture`]) and decoding their RoCEv2 packets ([`decode`]). Above them, the faces:
//! sensor [`frames`] (Hololink's `RoceReceiverInterfaceV2`), the request/reply [`session`]
//! (Catalyst's `TransportSession`) and the registered-buffer [`cache`] (neuray's `IRDMA_context`).
//!
//! Under the soft NIC and the frame sender lies one datagram layer (`udp`, private): batched
//! sends with UDP GSO where the path segments in software, each segment's ICRC sealed for the
//! IPv4 ID it will carry, batched receives with UDP GRO, and fault injection and capture as
//! layers over whole batches ([`Nic::gso_status`] says whether GSO is in use).
//!
//! GPU memory: the faces take [`device::DeviceMemory`] and stage through host pages; the
//! `cuda` feature provides it for CUDA devices (`cuda::CudaMemory`), loading the driver at run
//! time so the same build runs, and says why, on a host without one.
//!
//! `unsafe` is denied everywhere but `sys`, the few system calls std lacks (`mlock`,
//! `getrlimit`, socket options, batched sends and receives with GSO and GRO), `verbs::ffi`,
//! every call into libibverbs, and the one call in `cuda` that probes for the driver, each
//! with its reason.

#![deny(unsafe_code)]

// The layers, each importing only those above it in this list's reverse (tests/layers.rs
// checks it): the machine (`sys`, `udp`, and `steps`, marks timing a turn through them); the
// data the API and the backends share (`attr`, `error`, `memory`); the backends and their
// contract (`backend`); the public objects (`nic`, `cq`, `qp`, `srq`, `region`, `ud`,
// `verbs`); the services on them and the composition root (`cm`, `oob`, `exchange`, `open`);
// the faces and the tools' helpers.
mod attr;
mod backend;
pub mod cache;
pub mod capture;
pub mod cm;
pub mod cq;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod decode;
pub mod device;
mod error;
pub mod exchange;
pub mod frames;
mod memory;
pub mod nic;
mod oob;
mod open;
pub mod qp;
pub mod region;
pub mod session;
pub mod srq;
pub mod steps;
mod sys;
pub mod ud;
mod udp;
pub mod verbs;

pub(crate) use error::panic_message;

pub use cq::Cq;
pub use ferroce_proto as proto;
pub use nic::{Faults, GsoStatus, Nic, NicCaps, NicConfig, NicError};
pub use qp::{ConnectOptions, Qp, QpConfig, QpEndpoint};
pub use region::{AccessFlagsError, MappedMemory, Region, RegionAccess, RegionError, RegionMemory};
pub use srq::Srq;
pub use ud::AddressHandle;
pub use verbs::{DeviceOptions, VerbsError};
