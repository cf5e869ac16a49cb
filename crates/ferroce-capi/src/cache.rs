//! The registered-buffer cache (neuray's `IRDMA_context`): `ferroce_context` and
//! `ferroce_buffer`.
//!
//! A context is bound to one remote host. It hands out registered buffers
//! (`ferroce_context_write_memory`, `ferroce_context_read_memory`, neuray's
//! `get_write_memory` and `get_read_memory`), sends one there as a whole
//! (`ferroce_context_flush`, neuray's `flush`), and takes what the remote host flushed
//! here (`ferroce_context_receive`). Freeing a buffer returns it to the context's cache
//! rather than deregistering it. A context is thread-safe: any number of threads may take
//! buffers, flush and receive at once.
//!
//! neuray's codes map to results: its -1 ("invalid parameters") is `INVALID`, its -2
//! ("not supported") is `UNSUPPORTED`, and where it returns NULL for an allocation failure
//! this returns `DEVICE` (the locked-memory limit, most often) with the reason.

use std::ffi::{c_char, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use ferroce::cache::{Buffer, CacheError, Context, ContextConfig, Device};

use crate::fence::{
    fence, fence_result, free_handle, handle, into_handle, text_arg, versioned, write_out, Failure,
    Outcome,
};
use crate::ferroce_result;
use crate::nic::{nic_failure, parse_addr};

/// A context bound to one remote host (neuray's `IRDMA_context`). Thread-safe.
pub struct ferroce_context {
    context: Context,
}

/// A registered buffer of a context (neuray's `IRDMA_buffer`). Calls on one buffer are
/// serialised.
pub struct ferroce_buffer {
    buffer: Mutex<Buffer>,
}

/// How to bind a context to its remote host. Versioned: set `struct_size` to `sizeof`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_context_config {
    /// `sizeof(ferroce_context_config)`.
    pub struct_size: u32,
    /// How long connecting and a blocked flush wait, in ms (0: 10 s).
    pub timeout_ms: u32,
    /// This side's NIC: `"127.0.0.2"` (port 4791) or with a port.
    pub nic: *const c_char,
    /// The out-of-band TCP address, `"127.0.0.2:19600"`.
    pub oob: *const c_char,
    /// The size of the read buffers this side keeps posted: the largest buffer the remote
    /// host may flush here (0: 1 MiB).
    pub max_message: usize,
    /// Read buffers kept posted (0: 16).
    pub receive_depth: u16,
    /// Whether this side listens on `oob` (one side listens, the other dials).
    pub listen: bool,
}

fn cache_failure(e: &CacheError) -> Failure {
    let code = match e {
        CacheError::InvalidParameters(_) | CacheError::TooLargeForRemote { .. } => {
            ferroce_result::Invalid
        }
        CacheError::NotSupported(_) => ferroce_result::Unsupported,
        CacheError::Device(_) | CacheError::Allocation { .. } => ferroce_result::Device,
        CacheError::Timeout { .. } => ferroce_result::Timeout,
        CacheError::Closed(_) => ferroce_result::Closed,
        CacheError::Nic(n) => nic_failure(n).code,
        _ => ferroce_result::Failed,
    };
    Failure::new(code, e)
}

fn lock(b: &ferroce_buffer) -> MutexGuard<'_, Buffer> {
    b.buffer.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Connects a context to its remote host: opens the NIC, meets the peer on `oob` (dialling,
/// or listening when `listen`), and brings up the queue pair; `*out` receives it.
///
/// # Safety
///
/// `config` is NULL or a `ferroce_context_config` of at least its `struct_size` bytes whose
/// strings are NULL or NUL-terminated; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_connect(
    config: *const ferroce_context_config,
    out: *mut *mut ferroce_context,
) -> ferroce_result {
    fence_result("ferroce_context_connect", || {
        // SAFETY: the caller promises NULL or readable.
        let c = unsafe { versioned(config, "config", "ferroce_context_config") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller promises NULL or NUL-terminated strings.
        let (nic, oob) = unsafe {
            (
                text_arg(c.nic, "config.nic")?,
                text_arg(c.oob, "config.oob")?,
            )
        };
        let nic = parse_addr(nic, "config.nic")?;
        let oob = oob.trim().parse().map_err(|_| {
            Failure::invalid(format_args!(
                "config.oob {oob:?} is not an address and port (\"127.0.0.2:19600\")"
            ))
        })?;
        let mut config = ContextConfig::new(nic.ip(), oob, c.listen);
        config.nic = nic;
        if c.timeout_ms != 0 {
            config = config.with_timeout(Duration::from_millis(c.timeout_ms.into()));
        }
        if c.max_message != 0 {
            config = config.with_max_message(c.max_message);
        }
        if c.receive_depth != 0 {
            config.receive_depth = c.receive_depth;
        }
        let context = Context::connect(&config).map_err(|e| cache_failure(&e))?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_context { context }), "out") }
    })
}

fn device_arg(gpu_id: i32) -> Result<Device, Failure> {
    Device::from_seed_id(gpu_id).map_err(|e| cache_failure(&e))
}

/// # Safety
///
/// `context` is NULL or live; `out` is NULL or writable.
unsafe fn take_buffer(
    context: *const ferroce_context,
    out: *mut *mut ferroce_buffer,
    get: impl FnOnce(&Context) -> Result<Buffer, CacheError>,
) -> Outcome {
    // SAFETY: the caller promises NULL or live.
    let ctx = unsafe { handle(context, "context") }?;
    if out.is_null() {
        return Err(Failure::null("out"));
    }
    let buffer = get(&ctx.context).map_err(|e| cache_failure(&e))?;
    let handle = into_handle(ferroce_buffer {
        buffer: Mutex::new(buffer),
    });
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { write_out(out, handle, "out") }
}

/// A buffer of `size` bytes to write locally and flush to the remote host (neuray's
/// `get_write_memory`); `gpu_id` -1 for main memory, 0 and up for a GPU (`UNSUPPORTED`
/// without one). Taken from the cache when one of its size class is free.
///
/// # Safety
///
/// `context` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_write_memory(
    context: *const ferroce_context,
    size: usize,
    gpu_id: i32,
    out: *mut *mut ferroce_buffer,
) -> ferroce_result {
    fence_result("ferroce_context_write_memory", || {
        let device = device_arg(gpu_id)?;
        // SAFETY: the caller's promises are take_buffer's.
        unsafe { take_buffer(context, out, |c| c.write_memory(size, device)) }
    })
}

/// A buffer of `size` bytes for reading what the remote host writes (neuray's
/// `get_read_memory`); `gpu_id` as for `ferroce_context_write_memory`.
///
/// # Safety
///
/// `context` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_read_memory(
    context: *const ferroce_context,
    size: usize,
    gpu_id: i32,
    out: *mut *mut ferroce_buffer,
) -> ferroce_result {
    fence_result("ferroce_context_read_memory", || {
        let device = device_arg(gpu_id)?;
        // SAFETY: the caller's promises are take_buffer's.
        unsafe { take_buffer(context, out, |c| c.read_memory(size, device)) }
    })
}

/// Sends the buffer's bytes (its length, `ferroce_buffer_len`) to the remote host as one
/// message and waits until its NIC acknowledged them (neuray's `flush`). The remote host
/// takes it with `ferroce_context_receive`.
///
/// `INVALID` for a buffer of another context or larger than the remote's read buffers.
///
/// # Safety
///
/// `context` and `buffer` are NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_flush(
    context: *const ferroce_context,
    buffer: *const ferroce_buffer,
) -> ferroce_result {
    fence_result("ferroce_context_flush", || {
        // SAFETY: the caller promises NULL or live.
        let (ctx, buffer) = unsafe { (handle(context, "context")?, handle(buffer, "buffer")?) };
        let buffer = lock(buffer);
        ctx.context.flush(&buffer).map_err(|e| cache_failure(&e))
    })
}

/// Waits up to `timeout_ms` for the next buffer the remote host flushed here; `*out`
/// receives it (free it to recycle it). `TIMEOUT` when none came.
///
/// # Safety
///
/// `context` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_receive(
    context: *const ferroce_context,
    timeout_ms: u32,
    out: *mut *mut ferroce_buffer,
) -> ferroce_result {
    fence_result("ferroce_context_receive", || {
        let timeout = Duration::from_millis(timeout_ms.into());
        // SAFETY: the caller's promises are take_buffer's.
        unsafe { take_buffer(context, out, |c| c.receive(timeout)) }
    })
}

/// The largest buffer the remote host receives; 0 for NULL.
///
/// # Safety
///
/// `context` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_remote_max_message(
    context: *const ferroce_context,
) -> usize {
    fence("ferroce_context_remote_max_message", || {
        // SAFETY: the caller promises NULL or live.
        unsafe { handle(context, "context") }.map_or(0, |c| c.context.remote_max_message())
    })
}

/// Frees the context; NULL does nothing. Its buffers stay usable as plain memory until
/// freed.
///
/// # Safety
///
/// `context` is NULL or a context from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_context_free(context: *mut ferroce_context) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_context_free", || unsafe { free_handle(context) });
}

/// Copies `len` bytes from `data` to offset `at` of the buffer.
///
/// # Safety
///
/// `buffer` is NULL or live; `data` is NULL or valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_buffer_write(
    buffer: *const ferroce_buffer,
    at: usize,
    data: *const c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_buffer_write", || {
        // SAFETY: the caller promises NULL or live.
        let buffer = unsafe { handle(buffer, "buffer") }?;
        if data.is_null() {
            return Err(Failure::null("data"));
        }
        // SAFETY: not NULL; the caller promises `len` readable bytes.
        let data = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
        lock(buffer).write(at, data).map_err(|e| cache_failure(&e))
    })
}

/// Copies `len` bytes from offset `at` of the buffer into `out`.
///
/// # Safety
///
/// `buffer` is NULL or live; `out` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_buffer_read(
    buffer: *const ferroce_buffer,
    at: usize,
    out: *mut c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_buffer_read", || {
        // SAFETY: the caller promises NULL or live.
        let buffer = unsafe { handle(buffer, "buffer") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: not NULL; the caller promises `len` writable bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        lock(buffer).read(at, out).map_err(|e| cache_failure(&e))
    })
}

/// The buffer's length: what was asked for, or what arrived; 0 for NULL.
///
/// # Safety
///
/// `buffer` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_buffer_len(buffer: *const ferroce_buffer) -> usize {
    fence("ferroce_buffer_len", || {
        // SAFETY: the caller promises NULL or live.
        unsafe { handle(buffer, "buffer") }.map_or(0, |b| lock(b).len())
    })
}

/// Sets the buffer's length, up to its capacity: how much of a write buffer to flush.
///
/// # Safety
///
/// `buffer` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn ferroce_buffer_set_len(
    buffer: *const ferroce_buffer,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_buffer_set_len", || {
        // SAFETY: the caller promises NULL or live.
        let buffer = unsafe { handle(buffer, "buffer") }?;
        lock(buffer).set_len(len).map_err(|e| cache_failure(&e))
    })
}

/// Returns the buffer to its context's cache (or deregisters it when the cache is full);
/// NULL does nothing.
///
/// # Safety
///
/// `buffer` is NULL or a buffer from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_buffer_free(buffer: *mut ferroce_buffer) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_buffer_free", || unsafe { free_handle(buffer) });
}
