//! The C layouts of rdma-core v44's librdmacm (`<rdma/rdma_cma.h>`) that the drop-in
//! `librdmacm.so.1` hands to programs, with their sizes and offsets asserted against the
//! header as x86_64 and aarch64 lay them out.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::abi::{ibv_ah_attr, ibv_comp_channel, ibv_context, ibv_cq, ibv_pd, ibv_qp, ibv_srq};

/// `enum rdma_cm_event_type`.
pub(crate) const RDMA_CM_EVENT_ADDR_RESOLVED: c_uint = 0;
pub(crate) const RDMA_CM_EVENT_ROUTE_RESOLVED: c_uint = 2;
pub(crate) const RDMA_CM_EVENT_CONNECT_REQUEST: c_uint = 4;
pub(crate) const RDMA_CM_EVENT_CONNECT_RESPONSE: c_uint = 5;
pub(crate) const RDMA_CM_EVENT_CONNECT_ERROR: c_uint = 6;
pub(crate) const RDMA_CM_EVENT_UNREACHABLE: c_uint = 7;
pub(crate) const RDMA_CM_EVENT_REJECTED: c_uint = 8;
pub(crate) const RDMA_CM_EVENT_ESTABLISHED: c_uint = 9;
pub(crate) const RDMA_CM_EVENT_DISCONNECTED: c_uint = 10;

/// `rdma_event_str`'s names, by event number.
pub(crate) const EVENT_NAMES: [&std::ffi::CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

/// `enum rdma_port_space`.
pub(crate) const RDMA_PS_TCP: c_uint = 0x0106;
pub(crate) const RDMA_PS_UDP: c_uint = 0x0111;

/// `RDMA_UDP_QKEY`: the Q_Key of UD QPs rdma_cm makes.
pub(crate) const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `RAI_PASSIVE`: `rdma_getaddrinfo` resolves a local address to bind.
pub(crate) const RAI_PASSIVE: c_int = 1;

/// `RDMA_OPTION_ID` and its options (`TOS`, `REUSEADDR`, `AFONLY`, `ACK_TIMEOUT`).
pub(crate) const RDMA_OPTION_ID: c_int = 0;
pub(crate) const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

/// `struct sockaddr_storage`: 128 bytes, 8-aligned, read and written as bytes.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct sockaddr_storage(pub(crate) [u8; 128]);

impl Default for sockaddr_storage {
    fn default() -> Self {
        Self([0; 128])
    }
}

impl sockaddr_storage {
    /// `sockaddr_in` or `sockaddr_in6` of `addr`.
    pub(crate) fn of(addr: SocketAddr) -> Self {
        let mut s = Self::default();
        match addr {
            SocketAddr::V4(a) => {
                s.0[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
                s.0[2..4].copy_from_slice(&a.port().to_be_bytes());
                s.0[4..8].copy_from_slice(&a.ip().octets());
            }
            SocketAddr::V6(a) => {
                s.0[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
                s.0[2..4].copy_from_slice(&a.port().to_be_bytes());
                s.0[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
                s.0[8..24].copy_from_slice(&a.ip().octets());
                s.0[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
            }
        }
        s
    }

    /// The address, for `AF_INET` and `AF_INET6`.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        let family = u16::from_ne_bytes([self.0[0], self.0[1]]);
        let port = u16::from_be_bytes([self.0[2], self.0[3]]);
        if family == libc::AF_INET as u16 {
            let ip: [u8; 4] = self.0[4..8].try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port))
        } else if family == libc::AF_INET6 as u16 {
            let ip: [u8; 16] = self.0[8..24].try_into().ok()?;
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port))
        } else {
            None
        }
    }

    /// Its length as a `socklen_t` (`sockaddr_in` or `sockaddr_in6`).
    pub(crate) fn len(addr: SocketAddr) -> u32 {
        if addr.is_ipv4() {
            16
        } else {
            28
        }
    }
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct rdma_ib_addr {
    pub(crate) sgid: [u64; 2],
    pub(crate) dgid: [u64; 2],
    pub(crate) pkey: u16,
}

/// `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct rdma_addr {
    pub(crate) src: sockaddr_storage,
    pub(crate) dst: sockaddr_storage,
    pub(crate) ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct rdma_route {
    pub(crate) addr: rdma_addr,
    pub(crate) path_rec: *mut c_void,
    pub(crate) num_paths: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct rdma_event_channel {
    pub(crate) fd: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct rdma_cm_id {
    pub(crate) verbs: *mut ibv_context,
    pub(crate) channel: *mut rdma_event_channel,
    pub(crate) context: *mut c_void,
    pub(crate) qp: *mut ibv_qp,
    pub(crate) route: rdma_route,
    pub(crate) ps: c_uint,
    pub(crate) port_num: u8,
    pub(crate) event: *mut rdma_cm_event,
    pub(crate) send_cq_channel: *mut ibv_comp_channel,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq_channel: *mut ibv_comp_channel,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut ibv_srq,
    pub(crate) pd: *mut ibv_pd,
    pub(crate) qp_type: c_uint,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct rdma_conn_param {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
    pub(crate) srq: u8,
    pub(crate) qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct rdma_ud_param {
    pub(crate) private_data: *const c_void,
    pub(crate) private_data_len: u8,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) qp_num: u32,
    pub(crate) qkey: u32,
}

/// The `param` union of `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union rdma_event_param {
    pub(crate) conn: rdma_conn_param,
    pub(crate) ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct rdma_cm_event {
    pub(crate) id: *mut rdma_cm_id,
    pub(crate) listen_id: *mut rdma_cm_id,
    pub(crate) event: c_uint,
    pub(crate) status: c_int,
    pub(crate) param: rdma_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct rdma_addrinfo {
    pub(crate) ai_flags: c_int,
    pub(crate) ai_family: c_int,
    pub(crate) ai_qp_type: c_int,
    pub(crate) ai_port_space: c_int,
    pub(crate) ai_src_len: u32,
    pub(crate) ai_dst_len: u32,
    pub(crate) ai_src_addr: *mut sockaddr_storage,
    pub(crate) ai_dst_addr: *mut sockaddr_storage,
    pub(crate) ai_src_canonname: *mut c_char,
    pub(crate) ai_dst_canonname: *mut c_char,
    pub(crate) ai_route_len: usize,
    pub(crate) ai_route: *mut c_void,
    pub(crate) ai_connect_len: usize,
    pub(crate) ai_connect: *mut c_void,
    pub(crate) ai_next: *mut Self,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    // The numbers gcc gives for `<rdma/rdma_cma.h>` of rdma-core v44 on x86_64.
    assert!(size_of::<rdma_addr>() == 296);
    assert!(offset_of!(rdma_addr, dst) == 128);
    assert!(offset_of!(rdma_addr, ibaddr) == 256);
    assert!(size_of::<rdma_route>() == 312);
    assert!(offset_of!(rdma_route, path_rec) == 296);
    assert!(offset_of!(rdma_route, num_paths) == 304);
    assert!(size_of::<rdma_cm_id>() == 416);
    assert!(offset_of!(rdma_cm_id, route) == 32);
    assert!(offset_of!(rdma_cm_id, ps) == 344);
    assert!(offset_of!(rdma_cm_id, port_num) == 348);
    assert!(offset_of!(rdma_cm_id, event) == 352);
    assert!(offset_of!(rdma_cm_id, pd) == 400);
    assert!(offset_of!(rdma_cm_id, qp_type) == 408);
    assert!(size_of::<rdma_conn_param>() == 24);
    assert!(offset_of!(rdma_conn_param, qp_num) == 16);
    assert!(size_of::<rdma_ud_param>() == 56);
    assert!(offset_of!(rdma_ud_param, ah_attr) == 16);
    assert!(offset_of!(rdma_ud_param, qp_num) == 48);
    assert!(offset_of!(rdma_ud_param, qkey) == 52);
    assert!(size_of::<rdma_cm_event>() == 80);
    assert!(offset_of!(rdma_cm_event, event) == 16);
    assert!(offset_of!(rdma_cm_event, status) == 20);
    assert!(offset_of!(rdma_cm_event, param) == 24);
    assert!(size_of::<rdma_addrinfo>() == 96);
    assert!(offset_of!(rdma_addrinfo, ai_src_addr) == 24);
    assert!(offset_of!(rdma_addrinfo, ai_route_len) == 56);
    assert!(offset_of!(rdma_addrinfo, ai_next) == 88);
    assert!(size_of::<rdma_event_channel>() == 4);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip() {
        for a in ["127.0.11.1:7174", "[::1]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            assert_eq!(sockaddr_storage::of(a).addr(), Some(a));
        }
        assert_eq!(sockaddr_storage::default().addr(), None);
    }

    #[test]
    fn event_names_are_rdma_core_s() {
        assert_eq!(
            EVENT_NAMES[RDMA_CM_EVENT_ESTABLISHED as usize],
            c"RDMA_CM_EVENT_ESTABLISHED"
        );
    }
}
