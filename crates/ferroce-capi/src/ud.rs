//! Unreliable datagrams: address handles (`ibv_create_ah`) and UD queue pairs brought up
//! with a Q_Key (`ibv_modify_qp` as `ibv_ud_pingpong` does it).
//!
//! A UD queue pair (`FERROCE_QP_UD`) sends each message as one packet, at most the path MTU,
//! to the queue pair its request names: `ferroce_send_request.ah`, `remote_qpn` and
//! `remote_qkey` (`ferroce_qp_post_send_list`). Every receive buffer begins with
//! `FERROCE_UD_GRH_LEN` (40) bytes that say who sent it, then the payload, and the receive's
//! `byte_len` counts both; `ferroce_cq_poll_ex` gives the sender's queue pair. Nothing is
//! acknowledged or resent: a datagram that finds no receive posted is dropped.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ferroce::ud::AddressHandle;

use crate::fence::{
    fence, fence_result, free_handle, handle, into_handle, text_arg, write_out, Failure,
};
use crate::ferroce_result;
use crate::nic::{ferroce_nic, parse_addr};
use crate::post::{ferroce_completion_ex, FERROCE_WC_GRH};
use crate::qp::{ferroce_qp, modify_failure};

/// The Q_Key rdma_cm gives UD queue pairs (`RDMA_UDP_QKEY`), which `udaddy` and perftest use.
pub const FERROCE_RDMA_UDP_QKEY: u32 = 0x0123_4567;
const _: () = assert!(FERROCE_RDMA_UDP_QKEY == ferroce::ud::RDMA_UDP_QKEY);

/// Where datagrams go: a peer NIC's address (`struct ibv_ah`). Thread-safe and immutable.
pub struct ferroce_ah {
    pub(crate) ah: AddressHandle,
}

/// Brings a UD queue pair up to send and receive datagrams with `qkey`: INIT → RTR → RTS
/// (`ibv_modify_qp` three times, as `ibv_ud_pingpong` does). Datagrams arriving with another
/// Q_Key are dropped. `INVALID` when the queue pair is not a UD one in INIT.
///
/// # Safety
///
/// `qp` is NULL or a live queue pair.
#[no_mangle]
pub unsafe extern "C" fn ferroce_qp_ready_ud(qp: *const ferroce_qp, qkey: u32) -> ferroce_result {
    fence_result("ferroce_qp_ready_ud", || {
        // SAFETY: the caller promises NULL or a live QP.
        let qp = unsafe { handle(qp, "qp") }?;
        qp.qp.ready_ud(qkey).map_err(|e| modify_failure(&e))
    })
}

/// An address handle to the NIC at `addr` (`ibv_create_ah`): `"127.0.0.2"` for a NIC on the
/// RoCE port 4791, `"127.0.0.2:5000"` for a soft NIC opened on another port. `*out` receives
/// it; free it with `ferroce_ah_free` after the sends naming it have completed.
///
/// `INVALID` when `addr` is not an address or not of `nic`'s family (IPv4 or IPv6).
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `addr` is NULL or a NUL-terminated string; `out` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ah_new(
    nic: *const ferroce_nic,
    addr: *const std::ffi::c_char,
    out: *mut *mut ferroce_ah,
) -> ferroce_result {
    fence_result("ferroce_ah_new", || {
        // SAFETY: the caller promises NULL or a live NIC.
        let nic = unsafe { handle(nic, "nic") }?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: the caller promises NULL or a NUL-terminated string.
        let text = unsafe { text_arg(addr, "addr") }?;
        let peer: SocketAddr = parse_addr(text, "addr")?;
        if peer.is_ipv4() != nic.nic.addr().is_ipv4() {
            return Err(Failure::invalid(format_args!(
                "addr {peer} is not of the NIC's address family ({})",
                nic.nic.addr()
            )));
        }
        let ah = AddressHandle::with_port(peer);
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_ah { ah }), "out") }
    })
}

/// An address handle to answer the sender of a UD receive (`ibv_create_ah_from_wc`): its
/// NIC's address from `wc->src_gid`, on the RoCE port 4791. `*out` receives it.
///
/// `INVALID` when `wc` is not a UD receive (no `FERROCE_WC_GRH` in `wc->flags`) or its
/// sender is not of `nic`'s address family.
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `wc` is NULL or readable; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ah_from_completion(
    nic: *const ferroce_nic,
    wc: *const ferroce_completion_ex,
    out: *mut *mut ferroce_ah,
) -> ferroce_result {
    fence_result("ferroce_ah_from_completion", || {
        // SAFETY: the caller promises NULL or live / readable.
        let (nic, wc) = unsafe { (handle(nic, "nic")?, handle(wc, "wc")?) };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        if wc.flags & FERROCE_WC_GRH == 0 {
            return Err(Failure::invalid(
                "wc is not a UD receive (its flags lack FERROCE_WC_GRH)",
            ));
        }
        let v6 = Ipv6Addr::from(wc.src_gid);
        let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
        if ip.is_ipv4() != nic.nic.addr().is_ipv4() {
            return Err(Failure::invalid(format_args!(
                "the sender {ip} is not of the NIC's address family ({})",
                nic.nic.addr()
            )));
        }
        let ah = AddressHandle::new(ip);
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_ah { ah }), "out") }
    })
}

/// Frees the address handle (`ibv_destroy_ah`); NULL does nothing.
///
/// # Safety
///
/// `ah` is NULL or an address handle from this library not freed before, which no other
/// thread uses and no outstanding send names.
#[no_mangle]
pub unsafe extern "C" fn ferroce_ah_free(ah: *mut ferroce_ah) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_ah_free", || unsafe { free_handle(ah) });
}
