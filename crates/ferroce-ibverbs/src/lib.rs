//! ferroce's soft NIC as a drop-in `libibverbs.so.1`: a program built against rdma-core's
//! libibverbs, run with this library first on its search path
//! (`LD_LIBRARY_PATH=target/release`, after `scripts/build-dropin.sh`), sees one RDMA device,
//! `ferroce0`, port 1, whose soft NIC binds the address in `FERROCE_ADDR` (by default the
//! address of the interface holding the default route) on UDP port 4791. No kernel module,
//! no `/dev/infiniband`, no privileges.
//! `FERROCE_FAULT`, `FERROCE_PCAP` and `FERROCE_STATS` put that NIC under injected loss,
//! capture its packets and print its counters at close (`settings`).
//!
//! Stage 0 of issue 23: the library carries rdma-core v44's whole exported ABI, each symbol
//! at its version node, so that stock Debian 12 binaries and the provider libraries they
//! pull in (libmlx5, libefa, librdmacm) load; and device `ferroce0` can be listed, opened,
//! queried (device, port, GID with its RoCE v2 type, P_Key), given PDs and asked for async
//! events. Stage 1, the data path: memory regions on the program's own memory (with an IOVA
//! where asked), completion channels and CQs, RC, UC and UD QPs brought up attribute by
//! attribute, SRQs, address handles, and posting and polling through the context's ops
//! table — enough for rdma-core's pingpongs. Everything else fails cleanly with
//! `EOPNOTSUPP`, as on a device without it.
//!
//! Modules, and what each owns:
//! - `exports`: the symbol table and its version nodes (assembly trampolines);
//! - `entry`: the C entry points and the C memory of every object a program holds;
//! - `context`: the process's one soft NIC, each context's state, the registry of live
//!   objects;
//! - `objects`: the data path's objects (regions, channels, CQs, QPs, SRQs, address
//!   handles) and the thread that forwards CQ events to completion channels;
//! - `convert`: C values to ferroce's and back (access flags, QP attributes, completions);
//! - `attrs`: what the device says of itself (limits, GUID, GID, port);
//! - `addr`: which address the soft NIC binds;
//! - `settings`: what else the environment asks of it (faults, a capture, its counters);
//! - `cm`, `cm_abi`: librdmacm (issue 24): the same file is the drop-in `librdmacm.so.1`;
//!   its ids, event channels and the threads that drive `ferroce::cm`, and its C layouts;
//! - `enums`: rdma-core's strings and rate tables;
//! - `abi`: the C layouts, asserted;
//! - `fence`: the panic fence and the return conventions;
//! - `sys`: the operating system calls.
//!
//! `unsafe` is denied but in `entry`, `exports` and `sys`.

#![deny(unsafe_code)]

mod abi;
mod addr;
mod attrs;
mod cm;
mod cm_abi;
mod context;
mod convert;
mod entry;
mod enums;
mod exports;
mod fence;
mod objects;
mod settings;
mod sys;
