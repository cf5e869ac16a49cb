//! The C entry points: `extern "C"` functions that `crate::exports` publishes under
//! rdma-core's names and version nodes, and the operations put in a context's tables. Each
//! runs its body inside the panic fence (`crate::fence`), checks every pointer it is given
//! against the registry (`crate::context`) before reading through it, and fails as
//! rdma-core's function fails (errno returned, or NULL/-1 with errno set).
//!
//! - [`device`]: device list, open/close, the queries (device, port, GID, P_Key), PDs and
//!   async events; the C memory of devices, contexts and PDs.
//! - [`misc`]: what needs no device: the `*_str` helpers, rate conversions, fork control,
//!   sysfs helpers, and the private entry points providers call at load.
//! - [`mr`], [`cq`], [`qp`], [`srq`], [`ah`]: the data path (stage 1): memory regions,
//!   completion channels and CQs, QPs and their work requests, SRQs, address handles.
//! - [`cm`]: librdmacm's entry points (the drop-in `librdmacm.so.1`, the same file).
//! - [`stubs`]: what ferroce does not offer yet (or ever): fails cleanly with `EOPNOTSUPP`.
//!
//! This module and its children own the library's C-facing `unsafe`; `crate::sys` owns the
//! operating system's.

#![allow(unsafe_code)]

pub(crate) mod ah;
pub(crate) mod cm;
pub(crate) mod cq;
pub(crate) mod device;
pub(crate) mod misc;
pub(crate) mod mr;
pub(crate) mod qp;
pub(crate) mod srq;
pub(crate) mod stubs;
