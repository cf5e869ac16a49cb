//! The few system calls the soft NIC needs that std does not offer: locking pages in memory,
//! reading the locked-memory limit, and the IP socket options RoCEv2 depends on. Every
//! `unsafe` block of the crate is here, each with its reason.

#![allow(unsafe_code)]

use std::io;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;

/// Locks the pages of `bytes` in RAM (`mlock(2)`).
pub(crate) fn mlock(bytes: &[u8]) -> io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: the pointer and length describe a live slice the caller holds; mlock only
    // changes the residency of those pages, never their contents.
    let rc = unsafe { libc::mlock(bytes.as_ptr().cast(), bytes.len()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Unlocks pages locked by [`mlock`].
pub(crate) fn munlock(bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: as for `mlock`; unlocking pages that are not locked is harmless.
    unsafe {
        libc::munlock(bytes.as_ptr().cast(), bytes.len());
    }
}

/// The soft limit on locked memory (`RLIMIT_MEMLOCK`), in bytes; `None` when unlimited.
pub(crate) fn memlock_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` into the struct it is given, which lives on this
    // stack frame.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

fn set_int_option(
    socket: &UdpSocket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the descriptor is the socket's own and stays open for the call; the option value
    // is a c_int on this stack frame whose size is passed alongside.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// IPv4: set DF and never fragment (`IP_PMTUDISC_DO`). On an unconnected socket Linux then
/// sends IP ID 0, which the ICRC covers, so peers can verify it.
pub(crate) fn set_dont_fragment(socket: &UdpSocket) -> io::Result<()> {
    set_int_option(
        socket,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
    )
}

/// IPv6: accept datagrams with a zero UDP checksum, which RoCEv2 peers send
/// (`UDP_NO_CHECK6_RX`).
pub(crate) fn accept_zero_checksum6(socket: &UdpSocket) -> io::Result<()> {
    const UDP_NO_CHECK6_RX: libc::c_int = 102;
    set_int_option(socket, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
}

/// IPv6: send with a zero UDP checksum, as RoCEv2 does (`UDP_NO_CHECK6_TX`).
pub(crate) fn send_zero_checksum6(socket: &UdpSocket) -> io::Result<()> {
    const UDP_NO_CHECK6_TX: libc::c_int = 101;
    set_int_option(socket, libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)
}
