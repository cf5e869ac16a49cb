//! The NIC: `ferroce_nic`, opened on an address or on a UDP socket the caller bound.
//!
//! Answers the device half of Hololink's `start(ibv_name, …)`: where Hololink names an
//! InfiniBand device, a C caller opens the soft NIC on an address (`ferroce_nic_open`), or,
//! as `LinuxReceiverInterfaceV1::start(data_socket, …)` is handed a bound socket, adopts one
//! (`ferroce_nic_adopt_udp_socket`).

use std::ffi::c_char;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::FromRawFd;

use ferroce::{Nic, NicConfig, NicError};

use crate::fence::{
    copy_text, fence, fence_result, free_handle, handle, into_handle, text_arg, write_out, Failure,
    Outcome,
};
use crate::ferroce_result;

/// A soft RoCEv2 NIC: a UDP socket and the engine's progress thread. Thread-safe; regions,
/// queue pairs, receivers and senders made from it keep it running after
/// `ferroce_nic_free` until they are freed too.
pub struct ferroce_nic {
    pub(crate) nic: Nic,
}

/// `ferroce_nic_config.flags`: send every packet as its own datagram (no UDP GSO).
pub const FERROCE_NIC_NO_GSO: u32 = 1;
/// `ferroce_nic_config.flags`: receive without UDP GRO.
pub const FERROCE_NIC_NO_GRO: u32 = 2;

/// How to open a NIC beyond its address. Versioned: set `struct_size` to `sizeof`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ferroce_nic_config {
    /// `sizeof(ferroce_nic_config)`.
    pub struct_size: u32,
    /// `FERROCE_NIC_NO_GSO`, `FERROCE_NIC_NO_GRO`, or 0.
    pub flags: u32,
    /// A file to write every packet sent and received to as a pcap capture, or NULL.
    pub pcap_path: *const c_char,
}

pub(crate) fn nic_failure(e: &NicError) -> Failure {
    let code = match e {
        NicError::AddressInUse { .. } => ferroce_result::AddressInUse,
        NicError::AddressNotAvailable(_) => ferroce_result::Invalid,
        NicError::Verbs(_) => ferroce_result::Device,
        _ => ferroce_result::Failed,
    };
    Failure::new(code, e)
}

/// Parses `"192.0.2.1"`, `"192.0.2.1:4791"`, `"::1"` or `"[::1]:4791"`; port 4791 when none.
pub(crate) fn parse_addr(text: &str, name: &str) -> Result<SocketAddr, Failure> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    text.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, ferroce::proto::wire::ROCE_PORT))
        .map_err(|_| {
            Failure::invalid(format_args!(
                "{name} {text:?} is not an address: give an IP address (\"192.0.2.1\") or an \
                 address and port (\"192.0.2.1:4791\")"
            ))
        })
}

/// Reads the optional config into a `NicConfig` for `addr`.
///
/// # Safety
///
/// `config` is NULL or points to a `ferroce_nic_config` of at least its `struct_size`
/// bytes, whose `pcap_path` is NULL or a NUL-terminated string.
unsafe fn nic_config(
    addr: SocketAddr,
    config: *const ferroce_nic_config,
) -> Result<NicConfig, Failure> {
    let mut out = NicConfig::on(addr.ip());
    out.addr = addr;
    if config.is_null() {
        return Ok(out);
    }
    // SAFETY: the caller's promise about `config`.
    let config = unsafe { crate::fence::versioned(config, "config", "ferroce_nic_config") }?;
    if config.flags & !(FERROCE_NIC_NO_GSO | FERROCE_NIC_NO_GRO) != 0 {
        return Err(Failure::invalid(format_args!(
            "ferroce_nic_config.flags {:#x} has unknown bits",
            config.flags
        )));
    }
    out.gso = config.flags & FERROCE_NIC_NO_GSO == 0;
    out.gro = config.flags & FERROCE_NIC_NO_GRO == 0;
    if !config.pcap_path.is_null() {
        // SAFETY: not NULL; the caller promises a NUL-terminated string.
        let path = unsafe { text_arg(config.pcap_path, "ferroce_nic_config.pcap_path") }?;
        out.pcap = Some(path.into());
    }
    Ok(out)
}

/// The devices this host can open (`ibv_get_device_list`): their names, one per line,
/// `"ferroce0"` (the soft NIC, always there) first, then each RDMA device libibverbs lists
/// (this API opens the soft NIC; ferroce's Rust and Python APIs open the others). Copied into `buf` as `snprintf` does, NUL-terminated
/// and cut to `len - 1` bytes; returns the text's full length, so a call with `len` 0 (and
/// `buf` NULL) sizes the buffer.
///
/// # Safety
///
/// `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_devices(buf: *mut c_char, len: usize) -> usize {
    fence("ferroce_devices", || {
        let names = Nic::device_names().join("\n");
        // SAFETY: the caller's promise about `buf` and `len` is copy_text's.
        unsafe { copy_text(&names, buf, len) }
    })
}

/// Opens the soft NIC on `addr` (`"127.0.0.2"`, or `"127.0.0.2:4791"` for another port) and
/// starts its progress thread; `*out` receives the NIC.
///
/// `ADDRESS_IN_USE` when another socket holds the address and port, `INVALID` when the text
/// is not an address or not one of this host's.
///
/// # Safety
///
/// `addr` is NULL or a NUL-terminated string; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_open(
    addr: *const c_char,
    out: *mut *mut ferroce_nic,
) -> ferroce_result {
    // SAFETY: the caller's promises are ferroce_nic_open_with's, with no config.
    fence_result("ferroce_nic_open", || unsafe {
        open(addr, std::ptr::null(), out)
    })
}

/// As `ferroce_nic_open`, with `config` (or NULL for the defaults): GSO, GRO, a capture.
///
/// # Safety
///
/// As `ferroce_nic_open`; `config` is NULL or a `ferroce_nic_config` of at least its
/// `struct_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_open_with(
    addr: *const c_char,
    config: *const ferroce_nic_config,
    out: *mut *mut ferroce_nic,
) -> ferroce_result {
    // SAFETY: the caller's promises are open's.
    fence_result("ferroce_nic_open_with", || unsafe {
        open(addr, config, out)
    })
}

/// # Safety
///
/// As `ferroce_nic_open_with`.
unsafe fn open(
    addr: *const c_char,
    config: *const ferroce_nic_config,
    out: *mut *mut ferroce_nic,
) -> Outcome {
    if out.is_null() {
        return Err(Failure::null("out"));
    }
    // SAFETY: the caller promises a NUL-terminated string or NULL.
    let text = unsafe { text_arg(addr, "addr") }?;
    let addr = parse_addr(text, "addr")?;
    // SAFETY: the caller's promise about `config`.
    let config = unsafe { nic_config(addr, config) }?;
    let nic = Nic::open(&config).map_err(|e| nic_failure(&e))?;
    // SAFETY: checked not NULL above; the caller promises it is writable.
    unsafe { write_out(out, into_handle(ferroce_nic { nic }), "out") }
}

/// Opens the soft NIC on a UDP socket the caller already bound (Hololink's
/// `LinuxReceiverInterfaceV1::start(data_socket, …)`, whose socket the data channel
/// configured). The NIC works on a duplicate of `fd`: the caller keeps `fd` and may close it
/// at any time; the socket stays open until the NIC is gone. The NIC's address is the
/// socket's. `config` may be NULL.
///
/// `INVALID` when `fd` is negative, not a socket, not a datagram socket, or not bound.
///
/// # Safety
///
/// `fd` is a descriptor of this process or negative; `config` is NULL or a
/// `ferroce_nic_config` of at least its `struct_size` bytes; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_adopt_udp_socket(
    fd: i32,
    config: *const ferroce_nic_config,
    out: *mut *mut ferroce_nic,
) -> ferroce_result {
    fence_result("ferroce_nic_adopt_udp_socket", || {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        if fd < 0 {
            return Err(Failure::invalid(format_args!("fd {fd} is negative")));
        }
        let mut kind: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `kind` and `len` are valid for getsockopt's writes of an int; a bad fd is
        // an error return, not undefined behaviour.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_TYPE,
                (&raw mut kind).cast(),
                &raw mut len,
            )
        };
        if rc != 0 {
            return Err(Failure::invalid(format_args!(
                "fd {fd} is not a socket: {}",
                std::io::Error::last_os_error()
            )));
        }
        if kind != libc::SOCK_DGRAM {
            return Err(Failure::invalid(format_args!(
                "fd {fd} is not a UDP socket (SO_TYPE {kind})"
            )));
        }
        // SAFETY: duplicating a descriptor the caller owns; the copy is ours alone.
        let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(Failure::failed(format_args!(
                "cannot duplicate fd {fd}: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: `copy` is a fresh descriptor of a datagram socket that nothing else owns.
        let socket = unsafe { UdpSocket::from_raw_fd(copy) };
        let local = socket
            .local_addr()
            .map_err(|e| Failure::invalid(format_args!("fd {fd} has no local address: {e}")))?;
        // SAFETY: the caller's promise about `config`.
        let config = unsafe { nic_config(local, config) }?;
        let nic = Nic::from_udp_socket(socket, &config).map_err(|e| {
            let mut failure = nic_failure(&e);
            if failure.code == ferroce_result::Failed {
                failure.code = ferroce_result::Invalid;
            }
            failure
        })?;
        // SAFETY: checked not NULL above; the caller promises it is writable.
        unsafe { write_out(out, into_handle(ferroce_nic { nic }), "out") }
    })
}

/// The NIC's address and port as text (`"127.0.0.2:4791"`), copied into `buf` as
/// `snprintf` does; returns its full length, 0 for a NULL `nic`.
///
/// # Safety
///
/// `nic` is NULL or a live NIC; `buf` is NULL or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_addr(
    nic: *const ferroce_nic,
    buf: *mut c_char,
    len: usize,
) -> usize {
    fence("ferroce_nic_addr", || {
        // SAFETY: the caller promises NULL or a live NIC.
        match unsafe { handle(nic, "nic") } {
            // SAFETY: the caller's promise about `buf` and `len`.
            Ok(nic) => unsafe { copy_text(&nic.nic.addr().to_string(), buf, len) },
            Err(_) => 0,
        }
    })
}

/// The NIC's UDP port (4791 unless opened on another), 0 for a NULL `nic`.
///
/// # Safety
///
/// `nic` is NULL or a live NIC.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_port(nic: *const ferroce_nic) -> u16 {
    fence("ferroce_nic_port", || {
        // SAFETY: the caller promises NULL or a live NIC.
        unsafe { handle(nic, "nic") }.map_or(0, |n| n.nic.addr().port())
    })
}

/// Frees the handle; NULL does nothing. The NIC stops once nothing made from it is left.
///
/// # Safety
///
/// `nic` is NULL or a NIC from this library not freed before, which no other thread uses.
#[no_mangle]
pub unsafe extern "C" fn ferroce_nic_free(nic: *mut ferroce_nic) {
    // SAFETY: the caller's promise is free_handle's.
    fence("ferroce_nic_free", || unsafe { free_handle(nic) });
}
