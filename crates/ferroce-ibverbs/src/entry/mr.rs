//! Memory regions: `ibv_reg_mr`, `ibv_reg_mr_iova`, `ibv_reg_mr_iova2` and `ibv_dereg_mr`.
//!
//! A region is the program's own memory, registered in place
//! ([`MappedMemory::borrow`]): what peers write lands where the program reads it, and the
//! program's scatter entries name it by address (or by the IOVA it gave). ferroce's rights
//! are coarser than the verbs' (`crate::convert::region_access` says how they map). The C
//! `ibv_mr` is boxed; its keys are the region's.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::{Arc, Mutex};

use ferroce::{MappedMemory, Region, RegionError, RegionMemory};

use crate::abi::*;
use crate::context;
use crate::convert;
use crate::fence;
use crate::objects::{MrState, MRS};

/// Registers `length` bytes at `addr`, addressed from `iova`.
fn register(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> Result<*mut ibv_mr, c_int> {
    let (ctx, state) = context::pd_context(pd as usize)?;
    if addr.is_null() || length == 0 {
        return Err(libc::EINVAL);
    }
    let (rights, order) = convert::region_access(access)?;
    // SAFETY: `ibv_reg_mr`'s contract: the program's `length` bytes at `addr` stay allocated
    // until `ibv_dereg_mr`, which deregisters the region (the NIC then touches them no more)
    // before returning. The owner is nothing: the program owns the memory.
    let memory = unsafe { MappedMemory::borrow(addr as u64, length, Box::new(())) }
        .map_err(|_| libc::EINVAL)?;
    let region = Region::register_at(
        &state.nic,
        rights,
        order,
        RegionMemory::Mapped(memory),
        iova,
    )
    .map_err(|e| match e {
        RegionError::MemlockLimit { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    })?;
    let lkey = region.local(0, 0).map_err(|_| libc::EINVAL)?.lkey;
    let mr = Box::into_raw(Box::new(ibv_mr {
        context: ctx as *mut ibv_context,
        pd,
        addr,
        length,
        handle: lkey,
        lkey,
        rkey: region.rkey(),
    }));
    MRS.add(
        mr as usize,
        Arc::new(MrState {
            ctx,
            pd: pd as usize,
            region: Mutex::new(Some(region)),
        }),
    );
    Ok(mr)
}

/// `ibv_reg_mr`: the region's IOVA is its address.
pub(crate) unsafe extern "C" fn reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    fence::pointer(|| register(pd, addr, length, addr as u64, access as c_uint))
}

/// `ibv_reg_mr_iova`: peers and scatter entries name the first byte `iova`.
pub(crate) unsafe extern "C" fn reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    fence::pointer(|| register(pd, addr, length, iova, access as c_uint))
}

/// `ibv_reg_mr_iova2` (what `verbs.h`'s `ibv_reg_mr` calls when the access flags are not a
/// constant or carry optional flags).
pub(crate) unsafe extern "C" fn reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    fence::pointer(|| register(pd, addr, length, iova, access))
}

/// `ibv_dereg_mr`: once it returns the NIC touches the memory no more; peers still aiming at
/// the key get a remote access error. `EINVAL` for a pointer that is not a live region.
pub(crate) unsafe extern "C" fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    fence::errno(|| {
        let state = MRS.remove(mr as usize).ok_or(libc::EINVAL)?;
        if let Some(region) = state.region.lock().map_or(None, |mut r| r.take()) {
            region.deregister().map_err(|_| libc::EIO)?;
        }
        // SAFETY: the table held `mr` as a live region from `Box::into_raw` in `register`, and
        // has just forgotten it.
        drop(unsafe { Box::from_raw(mr) });
        Ok(())
    })
}
