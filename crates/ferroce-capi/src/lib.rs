//! The C ABI of ferroce: `include/ferroce.h`, generated from this crate by cbindgen.
//!
//! One module per face, each item naming the call it answers in Hololink's
//! `RoceReceiverInterfaceV2`, Catalyst's `TransportSession`, neuray's `IRDMA_context` or Rig_mlx5's
//! `Region`:
//! - [`nic`]: the soft NIC, opened on an address or on a bound UDP socket;
//! - [`region`]: registered memory (Rig_mlx5's `Region`);
//! - [`qp`]: queue pairs and completion queues, the verbs under the faces;
//! - [`post`]: work requests as libibverbs shapes them: scatter/gather lists, chains with
//!   `bad_wr`, UD destinations, completions that name a datagram's sender;
//! - [`events`]: a CQ's completion channel and the NIC's async events, as descriptors;
//! - [`cm`]: connection management with private data, as librdmacm does it, and SIDR;
//! - [`ud`]: UD queue pairs' address handles and Q_Keys;
//! - [`srq`]: shared receive queues;
//! - [`wire`]: a remote buffer and an endpoint as fixed big-endian bytes;
//! - [`frames`]: the sensor-frame receiver (Hololink's `RoceReceiverInterfaceV2`),
//!   zero-copy frame views, and the device-side sender;
//! - [`session`]: the controller/coprocessor session (Catalyst's `TransportSession`);
//! - [`cache`]: the registered-buffer cache (neuray's `IRDMA_context`);
//! - [`fence`]: the result codes, the thread's last error, and the panic fence every
//!   exported function runs in.
//!
//! Objects are opaque handles, each freed by its `_free` (which accepts NULL). Calls that can
//! fail return a [`ferroce_result`] and leave a text for [`fence::ferroce_last_error`]; a
//! panic inside the library is caught at the boundary and comes back as
//! `FERROCE_RESULT_PANIC`, never as an unwind into C. Structs the caller fills start with a
//! `uint32_t struct_size` so they can grow without breaking older callers.
//!
//! Every `extern "C"` function that takes a pointer is `unsafe`: its `# Safety` section says
//! what the caller promises. NULL pointers are checked and refused with
//! `FERROCE_RESULT_NULL_PARAMETER`; what cannot be checked (a dangling pointer, a buffer
//! shorter than its length) is the promise.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
// The C names: `ferroce_nic`, `ferroce_result`, as a C header spells them.
#![allow(non_camel_case_types)]

use std::ffi::c_char;

pub mod cache;
pub mod cm;
pub mod events;
pub mod fence;
pub mod frames;
pub mod nic;
pub mod post;
pub mod qp;
pub mod region;
pub mod session;
pub mod srq;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
pub mod ud;
pub mod wire;

pub use fence::ferroce_result;

/// The library's version, `"0.1.0"`: a static string. Compare with the header's
/// `FERROCE_VERSION_*` to catch a header and library from different builds.
#[no_mangle]
pub extern "C" fn ferroce_version() -> *const c_char {
    fence::fence("ferroce_version", || {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
    })
}
