//! Kernel RDMA devices through rdma-core's libibverbs, loaded at run time, under the same
//! [`Nic`], [`Region`], [`Qp`] and [`Cq`] as the soft NIC ([`Nic::open_device`] with any name
//! but [`SOFT_DEVICE`]).
//!
//! This module is what users see of the verbs backend: finding devices ([`devices`],
//! [`describe`], [`library_path`]), how to open one ([`DeviceOptions`]), what a device and its
//! GID table look like, and why one cannot be used ([`VerbsError`]). The backend itself lives
//! below the public objects, in `crate::backend::verbs`.
//!
//! [`Nic`]: crate::Nic
//! [`Nic::open_device`]: crate::Nic::open_device
//! [`Region`]: crate::Region
//! [`Qp`]: crate::Qp
//! [`Cq`]: crate::Cq

pub use crate::attr::{DeviceInfo, DeviceOptions, Gid, GidTable, GidType, PortInfo, SOFT_DEVICE};
pub use crate::backend::verbs::{describe, devices, library_path};
pub use crate::error::VerbsError;
