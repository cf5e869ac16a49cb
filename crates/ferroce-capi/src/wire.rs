//! A remote buffer's address and key, and a queue pair's endpoint, as fixed-size big-endian
//! bytes, so that any channel (a socket, a file, a CM's private data, a key-value store) can
//! carry them between processes and hosts of either byte order.
//!
//! `FERROCE_REMOTE_BYTES` (24) bytes for a `ferroce_remote`:
//!
//! | bytes  | field                                    |
//! |--------|------------------------------------------|
//! | 0      | `0x52` (`'R'`), the kind                 |
//! | 1      | `1`, the layout's version                |
//! | 2..4   | zero                                     |
//! | 4..8   | `rkey`                                   |
//! | 8..16  | `addr`                                   |
//! | 16..24 | `len`                                    |
//!
//! `FERROCE_ENDPOINT_BYTES` (32) bytes for a `ferroce_endpoint`:
//!
//! | bytes  | field                                                           |
//! |--------|-----------------------------------------------------------------|
//! | 0      | `0x45` (`'E'`), the kind                                        |
//! | 1      | `1`, the layout's version                                       |
//! | 2..4   | the NIC's UDP port                                              |
//! | 4..8   | `qpn` (24 bits; the top byte zero)                              |
//! | 8..12  | `psn` (24 bits; the top byte zero)                              |
//! | 12..28 | the NIC's IP address: IPv6, or IPv4 mapped (`::ffff:a.b.c.d`)  |
//! | 28..32 | zero                                                            |
//!
//! Every integer is big-endian. `_from_bytes` refuses, as `INVALID`, a length other than the
//! layout's, another kind or version, non-zero reserved bytes and numbers out of range, so
//! that bytes of a newer layout are never misread.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::fence::{fence_result, handle, write_out, Failure};
use crate::ferroce_result;
use crate::qp::{addr_text, endpoint_addr, ferroce_endpoint};
use crate::region::ferroce_region;

/// The bytes `ferroce_remote_to_bytes` writes and `ferroce_remote_from_bytes` takes.
pub const FERROCE_REMOTE_BYTES: usize = 24;
/// The bytes `ferroce_endpoint_to_bytes` writes and `ferroce_endpoint_from_bytes` takes.
pub const FERROCE_ENDPOINT_BYTES: usize = 32;
/// The layout version both write (byte 1).
pub const FERROCE_WIRE_VERSION: u8 = 1;

/// One of the two layouts: its length, its kind (byte 0) and the struct it carries.
struct Layout {
    len: usize,
    kind: u8,
    what: &'static str,
}

const REMOTE: Layout = Layout {
    len: FERROCE_REMOTE_BYTES,
    kind: b'R',
    what: "ferroce_remote",
};
const ENDPOINT: Layout = Layout {
    len: FERROCE_ENDPOINT_BYTES,
    kind: b'E',
    what: "ferroce_endpoint",
};

/// A buffer a peer may reach by RDMA WRITE or READ: Rig_mlx5's `Region.remote`, what
/// `ferroce_send_request.remote_addr` and `rkey` name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ferroce_remote {
    /// The buffer's first byte, in the owner's region addresses (`ferroce_region_addr`).
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The key the owner's region grants (`ferroce_region_rkey`).
    pub rkey: u32,
}

/// The whole of `region` as a remote buffer: its address, length and rkey. `INVALID` for a
/// `FERROCE_ACCESS_LOCAL` region, which peers cannot reach.
///
/// # Safety
///
/// `region` is NULL or a live region; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_region_remote(
    region: *const ferroce_region,
    out: *mut ferroce_remote,
) -> ferroce_result {
    fence_result("ferroce_region_remote", || {
        // SAFETY: the caller promises NULL or a live region.
        let region = unsafe { handle(region, "region") }?;
        let rkey = region.region.rkey();
        if rkey == 0 {
            return Err(Failure::invalid(
                "the region is FERROCE_ACCESS_LOCAL: peers cannot reach it",
            ));
        }
        let value = ferroce_remote {
            addr: region.region.va(),
            len: region.region.len(),
            rkey,
        };
        // SAFETY: the caller promises NULL or writable.
        unsafe { write_out(out, value, "out") }
    })
}

/// The caller's output buffer, once it holds at least the layout's bytes: those first bytes,
/// zeroed but for the header, the layout's kind and version 1.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
unsafe fn out_bytes<'a>(
    buf: *mut u8,
    len: usize,
    layout: &Layout,
) -> Result<&'a mut [u8], Failure> {
    let need = layout.len;
    if buf.is_null() {
        return Err(Failure::null("buf"));
    }
    if len < need {
        return Err(Failure::invalid(format_args!(
            "buf holds {len} bytes, fewer than the {need} the layout needs"
        )));
    }
    // SAFETY: not NULL; the caller promises `len` >= `need` writable bytes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf, need) };
    out.fill(0);
    out[0] = layout.kind;
    out[1] = FERROCE_WIRE_VERSION;
    Ok(out)
}

/// The caller's input bytes for a `_from_bytes` call writing to `out`: once `out` is not NULL
/// and the bytes are exactly the layout's, of its kind, version 1.
///
/// # Safety
///
/// `buf` is NULL or valid for reads of `len` bytes.
unsafe fn in_bytes<'a, T>(
    buf: *const u8,
    len: usize,
    out: *mut T,
    layout: &Layout,
) -> Result<&'a [u8], Failure> {
    let Layout {
        len: need,
        kind,
        what,
    } = *layout;
    if out.is_null() {
        return Err(Failure::null("out"));
    }
    if buf.is_null() {
        return Err(Failure::null("buf"));
    }
    if len != need {
        return Err(Failure::invalid(format_args!(
            "{len} bytes are not a {what}: its layout is {need} bytes"
        )));
    }
    // SAFETY: not NULL; the caller promises `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(buf, len) };
    if bytes[0] != kind {
        return Err(Failure::invalid(format_args!(
            "byte 0 is {:#04x}, not {kind:#04x}: these bytes are not a {what}",
            bytes[0]
        )));
    }
    if bytes[1] != FERROCE_WIRE_VERSION {
        return Err(Failure::invalid(format_args!(
            "layout version {} is not {FERROCE_WIRE_VERSION}, the one this library reads",
            bytes[1]
        )));
    }
    Ok(bytes)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

/// Writes `remote` as its `FERROCE_REMOTE_BYTES` big-endian bytes into `buf` (which holds
/// `len` bytes, at least that many). `INVALID` when `len` is smaller.
///
/// # Safety
///
/// `remote` is NULL or readable; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_remote_to_bytes(
    remote: *const ferroce_remote,
    buf: *mut u8,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_remote_to_bytes", || {
        // SAFETY: the caller promises NULL or readable.
        let r = unsafe { handle(remote, "remote") }?;
        // SAFETY: the caller's promise about buf and len.
        let out = unsafe { out_bytes(buf, len, &REMOTE) }?;
        out[4..8].copy_from_slice(&r.rkey.to_be_bytes());
        out[8..16].copy_from_slice(&r.addr.to_be_bytes());
        out[16..24].copy_from_slice(&r.len.to_be_bytes());
        Ok(())
    })
}

/// Reads a `ferroce_remote` from exactly `FERROCE_REMOTE_BYTES` bytes that
/// `ferroce_remote_to_bytes` wrote; `*out` receives it. `INVALID` for another length, kind
/// or version, or non-zero reserved bytes.
///
/// # Safety
///
/// `buf` is NULL or valid for reads of `len` bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_remote_from_bytes(
    buf: *const u8,
    len: usize,
    out: *mut ferroce_remote,
) -> ferroce_result {
    fence_result("ferroce_remote_from_bytes", || {
        // SAFETY: the caller's promise about buf and len.
        let b = unsafe { in_bytes(buf, len, out, &REMOTE) }?;
        if b[2..4] != [0, 0] {
            return Err(Failure::invalid("reserved bytes 2..4 are not zero"));
        }
        let value = ferroce_remote {
            rkey: be32(b, 4),
            addr: be64(b, 8),
            len: be64(b, 16),
        };
        // SAFETY: in_bytes checked it is not NULL; the caller promises it is writable.
        unsafe { write_out(out, value, "out") }
    })
}

/// Writes `endpoint` as its `FERROCE_ENDPOINT_BYTES` big-endian bytes into `buf` (which
/// holds `len` bytes, at least that many). `INVALID` when `len` is smaller, or the endpoint's
/// `addr` is not an address and port or its `qpn`/`psn` exceed 24 bits.
///
/// # Safety
///
/// `endpoint` is NULL or readable; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_endpoint_to_bytes(
    endpoint: *const ferroce_endpoint,
    buf: *mut u8,
    len: usize,
) -> ferroce_result {
    fence_result("ferroce_endpoint_to_bytes", || {
        // SAFETY: the caller promises NULL or readable.
        let e = unsafe { handle(endpoint, "endpoint") }?;
        let addr = endpoint_addr(e, "endpoint")?;
        if e.qpn >> 24 != 0 || e.psn >> 24 != 0 {
            return Err(Failure::invalid(format_args!(
                "endpoint.qpn {:#x} and endpoint.psn {:#x} must fit 24 bits",
                e.qpn, e.psn
            )));
        }
        // SAFETY: the caller's promise about buf and len.
        let out = unsafe { out_bytes(buf, len, &ENDPOINT) }?;
        out[2..4].copy_from_slice(&addr.port().to_be_bytes());
        out[4..8].copy_from_slice(&e.qpn.to_be_bytes());
        out[8..12].copy_from_slice(&e.psn.to_be_bytes());
        let ip = match addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        out[12..28].copy_from_slice(&ip.octets());
        Ok(())
    })
}

/// Reads a `ferroce_endpoint` from exactly `FERROCE_ENDPOINT_BYTES` bytes that
/// `ferroce_endpoint_to_bytes` wrote; `*out` receives it, ready for `ferroce_qp_connect`.
/// `INVALID` for another length, kind or version, non-zero reserved bytes, or a `qpn`/`psn`
/// past 24 bits.
///
/// # Safety
///
/// `buf` is NULL or valid for reads of `len` bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_endpoint_from_bytes(
    buf: *const u8,
    len: usize,
    out: *mut ferroce_endpoint,
) -> ferroce_result {
    fence_result("ferroce_endpoint_from_bytes", || {
        // SAFETY: the caller's promise about buf and len.
        let b = unsafe { in_bytes(buf, len, out, &ENDPOINT) }?;
        if b[28..32] != [0; 4] {
            return Err(Failure::invalid("reserved bytes 28..32 are not zero"));
        }
        let (qpn, psn) = (be32(b, 4), be32(b, 8));
        if qpn >> 24 != 0 || psn >> 24 != 0 {
            return Err(Failure::invalid(format_args!(
                "qpn {qpn:#x} and psn {psn:#x} must fit 24 bits"
            )));
        }
        let mut octets = [0; 16];
        octets.copy_from_slice(&b[12..28]);
        let v6 = Ipv6Addr::from(octets);
        let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
        let port = u16::from_be_bytes([b[2], b[3]]);
        let value = ferroce_endpoint {
            qpn,
            psn,
            addr: addr_text(SocketAddr::new(ip, port)),
        };
        // SAFETY: in_bytes checked it is not NULL; the caller promises it is writable.
        unsafe { write_out(out, value, "out") }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(addr: &str, qpn: u32, psn: u32) -> ferroce_endpoint {
        ferroce_endpoint {
            qpn,
            psn,
            addr: addr_text(addr.parse().unwrap()),
        }
    }

    fn text(e: &ferroce_endpoint) -> String {
        let bytes: Vec<u8> = e
            .addr
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn an_ipv6_endpoint_round_trips_in_its_documented_layout() {
        let e = endpoint("[fd00::1:2]:4791", 0x12_3456, 0xab_cdef);
        let mut buf = [0xff; FERROCE_ENDPOINT_BYTES];
        // SAFETY: `e` is readable and `buf` holds the layout's bytes.
        let r = unsafe { ferroce_endpoint_to_bytes(&e, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(r, ferroce_result::Ok);
        assert_eq!(
            &buf[..12],
            &[b'E', 1, 0x12, 0xb7, 0, 0x12, 0x34, 0x56, 0, 0xab, 0xcd, 0xef]
        );
        assert_eq!(
            buf[12..28],
            "fd00::1:2".parse::<Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(buf[28..], [0; 4]);
        let mut back = endpoint("127.0.0.1:1", 0, 0);
        // SAFETY: `buf` is readable for its length; `back` is writable.
        let r = unsafe { ferroce_endpoint_from_bytes(buf.as_ptr(), buf.len(), &mut back) };
        assert_eq!(r, ferroce_result::Ok);
        assert_eq!((back.qpn, back.psn), (e.qpn, e.psn));
        assert_eq!(text(&back), "[fd00::1:2]:4791");
    }

    #[test]
    fn a_remote_round_trips_and_nonzero_reserved_bytes_are_refused() {
        let remote = ferroce_remote {
            addr: 0x0102_0304_0506_0708,
            len: 0x1122_3344_5566_7788,
            rkey: 0xdead_beef,
        };
        let mut buf = [0; FERROCE_REMOTE_BYTES];
        // SAFETY: `remote` is readable and `buf` holds the layout's bytes.
        let r = unsafe { ferroce_remote_to_bytes(&remote, buf.as_mut_ptr(), buf.len()) };
        assert_eq!(r, ferroce_result::Ok);
        assert_eq!(buf[..8], [b'R', 1, 0, 0, 0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(buf[8..16], remote.addr.to_be_bytes());
        assert_eq!(buf[16..], remote.len.to_be_bytes());
        let mut back = ferroce_remote::default();
        // SAFETY: `buf` is readable for its length; `back` is writable.
        let r = unsafe { ferroce_remote_from_bytes(buf.as_ptr(), buf.len(), &mut back) };
        assert_eq!((r, back), (ferroce_result::Ok, remote));
        buf[3] = 1;
        // SAFETY: as above.
        let r = unsafe { ferroce_remote_from_bytes(buf.as_ptr(), buf.len(), &mut back) };
        assert_eq!(r, ferroce_result::Invalid);
    }
}
