//! The pure core of ferroce: everything about RoCEv2 that can be decided without a socket,
//! a thread or a clock.
//!
//! This crate owns the wire format ([`wire`]: every RC, UC, UD and CNP opcode, the Base
//! Transport Header and its extension headers, IPv4/IPv6 + UDP framing and the invariant CRC),
//! 24-bit packet sequence number arithmetic ([`psn`]), the region table ([`memory`]), the
//! RC/UC protocol engine ([`engine`], with the verbs vocabulary in [`qp`] and the counters in
//! [`counters`]) and the connection management messages ([`cm`]: CM MADs and the rdma_cm
//! header). It performs no I/O and reads no clock, so the same code runs in the UDP driver,
//! in captures, in fuzzers and in simulations.
//!
//! Everything that parses bytes treats them as hostile: parsing never panics, whatever the
//! input, and a malformed packet is reported as a [`wire::Error`] (or, for a CM MAD, a
//! [`cm::CmError`]) that says what is wrong.

#![forbid(unsafe_code)]

pub mod cm;
pub mod counters;
pub mod engine;
pub mod memory;
pub mod psn;
pub mod qp;
pub mod wire;

pub use counters::Counters;
pub use engine::{
    Census, CreateQpError, Engine, EngineConfig, InboundWrite, SrqAttr, SrqError, Transmit,
    WriteFilter,
};
pub use psn::Psn;
