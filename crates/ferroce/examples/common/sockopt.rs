//! Socket options std does not offer, for the examples that measure plain UDP beside the soft
//! NIC (`udp_floor`, `udp_pair`): each includes this file as a module and uses what it needs.
#![allow(dead_code)]

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

fn set_option(
    socket: &UdpSocket,
    level: libc::c_int,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and the length passed is its size; the kernel only
    // reads it.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            option,
            std::ptr::addr_of!(value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets a `SOL_UDP` option to `value`.
pub(crate) fn set_udp_option(
    socket: &UdpSocket,
    option: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    set_option(socket, libc::SOL_UDP, option, value)
}

/// Asks for `bytes` of socket buffers each way: forced as root, else up to the limits.
pub(crate) fn grow_buffers(socket: &UdpSocket, bytes: libc::c_int) {
    for (forced, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if set_option(socket, libc::SOL_SOCKET, forced, bytes).is_err() {
            let _ = set_option(socket, libc::SOL_SOCKET, plain, bytes);
        }
    }
}
