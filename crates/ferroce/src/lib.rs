//! ferroce: RDMA over Converged Ethernet v2 in Rust.
//!
//! This crate is what applications depend on. Today it holds the pieces that sit directly on
//! the wire layer of [`ferroce_proto`]: reading packet captures ([`capture`]) and decoding the
//! RoCEv2 packets in them ([`decode`]), which the `ferroce decode` tool prints. The software
//! NIC, regions, queue pairs and the faces built on them arrive on top of the protocol engine.

#![forbid(unsafe_code)]

pub mod capture;
pub mod decode;

pub use ferroce_proto as proto;
