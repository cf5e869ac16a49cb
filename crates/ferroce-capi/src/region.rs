//! Registered memory: `ferroce_region` (Rig_mlx5's `Region`).
//!
//! The library allocates and owns a region's bytes, as the Rust API does: the caller asks for
//! a size and copies in and out (`ferroce_region_write`, `ferroce_region_read`), or, for
//! `FERROCE_MEMORY_MAPPED`, reaches the bytes where they are (`ferroce_region_host_pointer`).
//! Registering memory the caller owns is not offered: the soft NIC must know that nothing
//! frees or remaps those pages while a peer may write them, which a C pointer cannot promise.

use std::ffi::c_void;

use ferroce::proto::memory::WriteOrder;
use ferroce::{MappedMemory, Region, RegionAccess, RegionError, RegionMemory};

use crate::fence::{
    fence, fence_result, free_handle, handle, into_handle, write_out, Failure, Outcome,
};
use crate::ferroce_result;
use crate::nic::ferroce_nic;

/// Peers neither read nor write the region (Rig_mlx5's `Local`): no flag bit.
///
/// The `FERROCE_ACCESS_REMOTE_*` values are distinct bits, to be ORed as `IBV_ACCESS_*` are:
/// `FERROCE_ACCESS_REMOTE_WRITE | FERROCE_ACCESS_REMOTE_READ` grants exactly those two rights.
/// `ferroce.h` checks at compile time that no two share a bit; any other bit is `INVALID`.
pub const FERROCE_ACCESS_LOCAL: u32 = 0;
/// Peers may RDMA WRITE (Rig_mlx5's `Remote_write`).
pub const FERROCE_ACCESS_REMOTE_WRITE: u32 = 1;
/// Peers may RDMA READ.
pub const FERROCE_ACCESS_REMOTE_READ: u32 = 2;
/// Peers may run atomics.
pub const FERROCE_ACCESS_REMOTE_ATOMIC: u32 = 4;
/// Peers read, write and run atomics: the three bits ORed (Rig_mlx5's `Remote`).
pub const FERROCE_ACCESS_REMOTE: u32 = 7;

// The C values are the Rust flags, so that one conversion serves both.
const _: () = {
    assert!(FERROCE_ACCESS_REMOTE_WRITE == RegionAccess::FLAG_REMOTE_WRITE);
    assert!(FERROCE_ACCESS_REMOTE_READ == RegionAccess::FLAG_REMOTE_READ);
    assert!(FERROCE_ACCESS_REMOTE_ATOMIC == RegionAccess::FLAG_REMOTE_ATOMIC);
    assert!(FERROCE_ACCESS_REMOTE == RegionAccess::FLAGS_ALL);
    assert!(FERROCE_ACCESS_LOCAL == RegionAccess::Local.flags());
};

/// Page-aligned memory whose address the caller may use (`ferroce_region_host_pointer`);
/// not locked in RAM.
pub const FERROCE_MEMORY_MAPPED: u32 = 0;
/// Heap memory locked in RAM (`mlock`): `RLIMIT_MEMLOCK` bounds it. Copy in and out only.
pub const FERROCE_MEMORY_PINNED: u32 = 1;
/// Heap memory that stays pageable. Copy in and out only.
pub const FERROCE_MEMORY_PAGEABLE: u32 = 2;

/// A registered region. Thread-safe. Frees its memory with `ferroce_region_free`, after
/// which no work request may name it.
pub struct ferroce_region {
    pub(crate) region: Region,
    /// For `FERROCE_MEMORY_MAPPED`: keeps the mapping where `host_pointer` said it is.
    mapped: Option<MappedMemory>,
}

pub(crate) fn access_arg(access: u32) -> Result<RegionAccess, Failure> {
    RegionAccess::from_flags(access).map_err(|e| {
        Failure::invalid(format_args!(
            "{e}: access is FERROCE_ACCESS_LOCAL or an OR of FERROCE_ACCESS_REMOTE_WRITE, \
             FERROCE_ACCESS_REMOTE_READ and FERROCE_ACCESS_REMOTE_ATOMIC"
        ))
    })
}

pub(crate) fn region_failure(e: &RegionError) -> Failure {
    let code = match e {
        RegionError::Empty | RegionError::OutOfRange { .. } | RegionError::NotRemote => {
            ferroce_result::Invalid
        }
        RegionError::MemlockLimit { .. }
        | RegionError::Device { .. }
        | RegionError::Dmabuf { .. }
        | RegionError::DmabufUnsupported { .. } => ferroce_result::Device,
        _ => ferroce_result::Failed,
    };
    Failure::new(code, e)
}

/// Registers `len` fresh zeroed bytes with `nic` for `access` (`FERROCE_ACCESS_*` bits ORed),
/// of kind `memory` (a `FERROCE_MEMORY_*` value), writes landing in order (Rig_mlx5's
/// `Region.register`); `*out` receives the region.
///
/// `INVALID` for 0 bytes or an unknown value; `DEVICE` when the locked-memory limit cannot
/// hold `FERROCE_MEMORY_PINNED` bytes (the text says how to raise it).
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_register(
    nic: *const ferroce_nic,
    len: usize,
    access: u32,
    memory: u32,
    out: *mut *mut ferroce_region,
) -> ferroce_result {
    fence_result("ferroce_region_register", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let access = access_arg(access)?;
        if len == 0 {
            return Err(Failure::invalid(
                "a region needs at least one byte (len is 0)",
            ));
        }
        let (memory, mapped) = match memory {
            FERROCE_MEMORY_MAPPED => {
                let m = MappedMemory::new(len).map_err(|e| region_failure(&e))?;
                (RegionMemory::Mapped(m.clone()), Some(m))
            }
            FERROCE_MEMORY_PINNED | FERROCE_MEMORY_PAGEABLE => {
                let mut bytes = Vec::new();
                bytes
                    .try_reserve_exact(len)
                    .map_err(|_| Failure::failed(format_args!("cannot allocate {len} bytes")))?;
                bytes.resize(len, 0);
                if memory == FERROCE_MEMORY_PINNED {
                    (RegionMemory::Host(bytes), None)
                } else {
                    (RegionMemory::Pageable(bytes), None)
                }
            }
            other => {
                return Err(Failure::invalid(format_args!(
                    "memory {other} is not a FERROCE_MEMORY_* value (0 to 2)"
                )))
            }
        };
        let region = Region::register(&nic.nic, access, WriteOrder::InOrder, memory)
            .map_err(|e| region_failure(&e))?;
        // SAFETY: checked not NULL above; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_region { region, mapped }), "out") }
    })
}

/// Registers `len` bytes at `addr` that the caller owns (Rig_mlx5's `Region.register` of the
/// application's memory, as NIXL's and Mooncake's `register_memory` take it), for `access`,
/// writes landing in order; `*out` receives the region. What peers write lands in the
/// caller's bytes; `ferroce_region_host_pointer` is `addr`.
///
/// `NULL_PARAMETER` for a NULL `addr`; `INVALID` for 0 bytes or an unknown access value;
/// `DEVICE` when a verbs device cannot pin the memory (the locked-memory limit, say).
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `out` is NULL or writable. `addr..addr + len` is readable and
/// writable memory of this process that stays allocated, neither freed nor unmapped, until
/// the region is freed with `ferroce_region_free`. The NIC writes it whenever a peer's
/// WRITE lands: reading it meanwhile is the caller's race, as with any RDMA buffer.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_register_user(
    nic: *const ferroce_nic,
    addr: *mut c_void,
    len: usize,
    access: u32,
    out: *mut *mut ferroce_region,
) -> ferroce_result {
    fence_result("ferroce_region_register_user", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        if addr.is_null() {
            return Err(Failure::null("addr"));
        }
        let access = access_arg(access)?;
        // SAFETY: the caller promises `len` bytes at `addr` that stay allocated until the
        // region is freed, which drops the last handle on them.
        let m = unsafe { MappedMemory::borrow(addr as u64, len, Box::new(())) }
            .map_err(|e| region_failure(&e))?;
        let region = Region::register(
            &nic.nic,
            access,
            WriteOrder::InOrder,
            RegionMemory::Mapped(m.clone()),
        )
        .map_err(|e| region_failure(&e))?;
        // SAFETY: checked not NULL above; the caller promises it is writable.
        unsafe {
            write_out(
                out,
                into_handle(ferroce_region {
                    region,
                    mapped: Some(m),
                }),
                "out",
            )
        }
    })
}

/// # Safety
///
/// `region` is NULL or a live region; `bytes` is NULL or valid for `len` bytes.
unsafe fn copy_args<'a>(
    region: *const ferroce_region,
    bytes: *const u8,
    len: usize,
) -> Result<(&'a ferroce_region, &'a [u8]), Failure> {
    // SAFETY: the caller promises NULL or a live region.
    let region = unsafe { handle(region, "region") }?;
    if bytes.is_null() {
        return Err(Failure::null("data"));
    }
    // SAFETY: not NULL; the caller promises `len` readable bytes.
    Ok((region, unsafe { std::slice::from_raw_parts(bytes, len) }))
}

/// Copies `len` bytes from `data` to offset `at` of the region.
///
/// `INVALID` when they run past the region's end (nothing is copied).
///
/// # Safety
///
/// `region` is NULL or a live region; `data` is NULL or valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_write(
    region: *const ferroce_region,
    at: u64,
    data: *const c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_region_write", || {
        // SAFETY: the caller's promises are copy_args'.
        let (region, data) = unsafe { copy_args(region, data.cast(), len) }?;
        region
            .region
            .write(at, data)
            .map_err(|e| region_failure(&e))
    })
}

/// Copies `len` bytes from offset `at` of the region into `out`.
///
/// `INVALID` when they run past the region's end (nothing is copied).
///
/// # Safety
///
/// `region` is NULL or a live region; `out` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_read(
    region: *const ferroce_region,
    at: u64,
    out: *mut c_void,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_region_read", || -> Outcome {
        // SAFETY: the caller promises NULL or a live region.
        let region = unsafe { handle(region, "region") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: not NULL; the caller promises `len` writable bytes that nothing else
        // touches during the call.
        let out = unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), len) };
        region.region.read(at, out).map_err(|e| region_failure(&e))
    })
}

/// The address work requests and peers use for the region's first byte (Rig_mlx5's `Region.local`
/// and `remote` start here); 0 for a NULL `region`.
///
/// # Safety
///
/// `region` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_addr(region: *const ferroce_region) -> u64 {
    fence("ferroce_region_addr", || {
        // SAFETY: the caller promises NULL or a live region.
        unsafe { handle(region, "region") }.map_or(0, |r| r.region.va())
    })
}

/// The region's length in bytes; 0 for a NULL `region`.
///
/// # Safety
///
/// `region` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_len(region: *const ferroce_region) -> u64 {
    fence("ferroce_region_len", || {
        // SAFETY: the caller promises NULL or a live region.
        unsafe { handle(region, "region") }.map_or(0, |r| r.region.len())
    })
}

/// The key this process's work requests name the region by (Rig_mlx5's `Region.local`); 0 for a
/// NULL `region`.
///
/// # Safety
///
/// `region` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_lkey(region: *const ferroce_region) -> u32 {
    fence("ferroce_region_lkey", || {
        // SAFETY: the caller promises NULL or a live region.
        unsafe { handle(region, "region") }
            .ok()
            .and_then(|r| r.region.local(0, 0).ok())
            .map_or(0, |sge| sge.lkey)
    })
}

/// The key peers present (Rig_mlx5's `Region.remote`); 0 for a `FERROCE_ACCESS_LOCAL` region or a
/// NULL `region`.
///
/// # Safety
///
/// `region` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_rkey(region: *const ferroce_region) -> u32 {
    fence("ferroce_region_rkey", || {
        // SAFETY: the caller promises NULL or a live region.
        unsafe { handle(region, "region") }.map_or(0, |r| r.region.rkey())
    })
}

/// Where a `FERROCE_MEMORY_MAPPED` region's bytes are, for the caller to read and write in
/// place until `ferroce_region_free`; NULL for the other kinds.
///
/// The NIC writes these bytes whenever a peer's WRITE or this process's READ or receive
/// lands, as a device's DMA would: read what a completion announced, and expect bytes to
/// change under a reader while a peer may write them.
///
/// # Safety
///
/// `region` is NULL or a live region.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_host_pointer(region: *const ferroce_region) -> *mut u8 {
    fence("ferroce_region_host_pointer", || {
        // SAFETY: the caller promises NULL or a live region.
        unsafe { handle(region, "region") }
            .ok()
            .and_then(|r| r.mapped.as_ref())
            .map_or(std::ptr::null_mut(), |m| m.addr() as usize as *mut u8)
    })
}

/// Deregisters the region (Rig_mlx5's `Region.deregister`) and frees its memory; NULL does nothing.
/// Work requests that name it must have completed.
///
/// # Safety
///
/// `region` is NULL or a region from this library not freed before, which no other thread
/// uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_free(region: *mut ferroce_region) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_region_free", || unsafe { free_handle(region) });
}
