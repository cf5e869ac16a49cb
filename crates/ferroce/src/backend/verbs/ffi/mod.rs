//! Every call into libibverbs: loading it (`library`) and the handles that own what it allocates
//! (`objects`).
//!
//! The library is opened with `dlopen` on first use (`libibverbs.so.1`, or the path in
//! `FERROCE_IBVERBS`) and each symbol found with `dlvsym` at the version rdma-core released it
//! under (verbs.md §1.1), so the build needs no rdma-core and the binary has no `NEEDED
//! libibverbs`. The four hot-path calls go through the context's ops table, one indirect call
//! each, as `verbs.h`'s inline functions do.
//!
//! The handles ([`Context`], [`Pd`], [`Mr`], [`RawCq`], [`RawQp`]) hold `Arc`s to their
//! parents, so Rust's drop order is libibverbs' destroy order: QP, MR and CQ before the PD and
//! the channel, all before the device. The files here are the backend's only `unsafe`; each
//! block says why it holds.

#![allow(unsafe_code)]

mod library;
mod objects;

pub(crate) use library::{lib, Lib};
pub(crate) use objects::{AsyncEvent, Context, Mr, Opened, Pd, RawCq, RawQp};
