//! Address handles: `ibv_create_ah`, `ibv_destroy_ah`, `ibv_create_ah_from_wc` and
//! `ibv_init_ah_from_wc`. On RoCE v2 an address handle is its destination GID, the peer's
//! address; a UD receive's 40-byte GRH area holds the sender's IP header
//! (`ferroce::proto::qp::UD_GRH_LEN`: 20 zero bytes then the IPv4 header, or the IPv6
//! header).

use std::ffi::{c_int, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ferroce::AddressHandle;

use crate::abi::*;
use crate::attrs;
use crate::context;
use crate::convert;
use crate::fence;
use crate::objects::{AhState, AHS};

/// `ibv_create_ah`: `EINVAL` without a GRH (RoCE needs one).
pub(crate) unsafe extern "C" fn create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    fence::pointer(|| {
        let (ctx, _) = context::pd_context(pd as usize)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct ibv_ah_attr`.
        let peer = convert::ah_peer(&unsafe { attr.read_unaligned() })?;
        Ok(new_ah(pd, ctx, peer.ip()))
    })
}

fn new_ah(pd: *mut ibv_pd, ctx: usize, ip: IpAddr) -> *mut ibv_ah {
    let c = Box::into_raw(Box::new(ibv_ah {
        context: ctx as *mut ibv_context,
        pd,
        handle: 0,
    }));
    AHS.add(
        c as usize,
        Arc::new(AhState {
            ctx,
            pd: pd as usize,
            ah: AddressHandle::new(ip),
        }),
    );
    c
}

/// `ibv_destroy_ah`.
pub(crate) unsafe extern "C" fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    fence::errno(|| {
        AHS.remove(ah as usize).ok_or(libc::EINVAL)?;
        // SAFETY: the table held `ah` from `Box::into_raw` in `new_ah`, and has just
        // forgotten it.
        drop(unsafe { Box::from_raw(ah) });
        Ok(())
    })
}

/// The sender's address in a received GRH area.
pub(crate) fn grh_source(grh: &[u8; 40]) -> IpAddr {
    if grh[..20].iter().all(|&b| b == 0) {
        IpAddr::V4(Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]))
    } else {
        let mut a = [0u8; 16];
        a.copy_from_slice(&grh[8..24]);
        IpAddr::V6(Ipv6Addr::from(a))
    }
}

/// The address vector back to the sender of a UD receive; `EINVAL` when `wc` has no GRH.
///
/// # Safety
///
/// `wc` must be a readable `ibv_wc`, `grh` 40 readable bytes.
unsafe fn from_wc(wc: *const ibv_wc, grh: *const c_void, port: u8) -> Result<ibv_ah_attr, c_int> {
    if wc.is_null() || grh.is_null() || port != attrs::PORT {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller vouches for both.
    let (wc, grh) = unsafe { (wc.read_unaligned(), grh.cast::<[u8; 40]>().read_unaligned()) };
    if wc.wc_flags & IBV_WC_GRH == 0 {
        return Err(libc::EINVAL);
    }
    Ok(convert::ah_attr(std::net::SocketAddr::new(
        grh_source(&grh),
        4791,
    )))
}

/// `ibv_init_ah_from_wc`: 0, or -1 with errno.
pub(crate) unsafe extern "C" fn init_ah_from_wc(
    ctx: *mut ibv_context,
    port: u8,
    wc: *const ibv_wc,
    grh: *const c_void,
    attr: *mut ibv_ah_attr,
) -> c_int {
    fence::minus_one(|| {
        context::context(ctx as usize).ok_or(libc::EINVAL)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's, per `ibv_init_ah_from_wc`.
        let value = unsafe { from_wc(wc, grh, port)? };
        // SAFETY: the caller passes a `struct ibv_ah_attr`.
        unsafe { attr.write_unaligned(value) };
        Ok(0)
    })
}

/// `ibv_create_ah_from_wc`.
pub(crate) unsafe extern "C" fn create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *const ibv_wc,
    grh: *const c_void,
    port: u8,
) -> *mut ibv_ah {
    fence::pointer(|| {
        let (ctx, _) = context::pd_context(pd as usize)?;
        // SAFETY: the caller's, per `ibv_create_ah_from_wc`.
        let attr = unsafe { from_wc(wc, grh, port)? };
        Ok(new_ah(pd, ctx, convert::gid_ip(&attr.grh.dgid)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grh_names_the_sender() {
        let mut grh = [0u8; 40];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[127, 0, 0, 72]);
        assert_eq!(grh_source(&grh), IpAddr::V4(Ipv4Addr::new(127, 0, 0, 72)));
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[23] = 1;
        assert_eq!(grh_source(&v6), IpAddr::V6(Ipv6Addr::LOCALHOST));
    }
}
