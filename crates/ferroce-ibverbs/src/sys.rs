//! The operating system calls the library makes, each behind a safe function: `errno`, the
//! async event file descriptor (an eventfd), and the host's interface addresses
//! (`getifaddrs`, `if_nametoindex`). This module owns every `unsafe` block that is not a C
//! entry point.

#![allow(unsafe_code)]

use std::ffi::{c_int, CStr, CString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Sets the calling thread's `errno`, as rdma-core's functions do before returning NULL or -1.
pub(crate) fn set_errno(value: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for writes for
    // the thread's lifetime.
    unsafe { *libc::__errno_location() = value };
}

/// A new eventfd in semaphore mode, close-on-exec, blocking: readable while its count is
/// above zero, and each read takes one. The async event queue's file descriptor.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative return is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Takes one count from an eventfd ([`eventfd`]): blocks while it is zero, unless the
/// program made the descriptor non-blocking, when it fails with `EAGAIN`.
pub(crate) fn eventfd_take(fd: &OwnedFd) -> io::Result<()> {
    let mut value = 0u64;
    loop {
        // SAFETY: `value` is 8 writable bytes that live across the call; `fd` is open.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                std::ptr::from_mut(&mut value).cast(),
                size_of::<u64>(),
            )
        };
        if n == 8 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if n < 0 && error.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(error);
    }
}

/// Whether the program made `fd` non-blocking (`O_NONBLOCK`); false if it cannot be read.
pub(crate) fn is_nonblocking(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: F_GETFL takes no pointer and only reads the open descriptor's flags.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// Adds one to an eventfd's count, making it readable.
pub(crate) fn eventfd_give(fd: &OwnedFd) -> io::Result<()> {
    let value = 1u64;
    // SAFETY: `value` is 8 readable bytes that live across the call; `fd` is open.
    let n = unsafe {
        libc::write(
            fd.as_raw_fd(),
            std::ptr::from_ref(&value).cast(),
            size_of::<u64>(),
        )
    };
    if n == 8 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A new epoll instance, close-on-exec: the async events' poller
/// (`crate::objects`).
pub(crate) fn epoll() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 takes no pointers; a non-negative return is a new descriptor.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watches `fd` for readability (level-triggered) in `epoll`, reporting `data`.
pub(crate) fn epoll_add(epoll: &OwnedFd, fd: BorrowedFd<'_>, data: u64) -> io::Result<()> {
    let mut event = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: data,
    };
    // SAFETY: `event` is a valid epoll_event that lives across the call; both fds are open.
    let rc = unsafe {
        libc::epoll_ctl(
            epoll.as_raw_fd(),
            libc::EPOLL_CTL_ADD,
            fd.as_raw_fd(),
            &raw mut event,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Waits (without limit) for watched descriptors to be readable; their `data` go to `out`,
/// and the count is returned (0 after a signal interrupted the wait).
pub(crate) fn epoll_wait(epoll: &OwnedFd, out: &mut [u64; 16]) -> io::Result<usize> {
    let mut events = [libc::epoll_event { events: 0, u64: 0 }; 16];
    // SAFETY: `events` has room for 16 entries and lives across the call; `epoll` is open.
    let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), 16, -1) };
    if n < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(error)
        };
    }
    let n = n as usize;
    for (o, e) in out.iter_mut().zip(&events[..n]) {
        *o = e.u64;
    }
    Ok(n)
}

/// Every address of every interface: (interface name, address), IPv4 and IPv6.
pub(crate) fn interface_addresses() -> io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `head` is a valid place for getifaddrs to store its list.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*at };
        at = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: `ifa_addr` is non-null and starts with a `sockaddr`'s family field.
        let family = c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: the family says the address is a `sockaddr_in`.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the address is a `sockaddr_in6`.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        out.push((name, ip));
    }
    // SAFETY: `head` came from getifaddrs and nothing refers to the list any more.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The index of the interface called `name`, 0 when there is none.
pub(crate) fn interface_index(name: &str) -> u32 {
    let Ok(name) = CString::new(name) else {
        return 0;
    };
    // SAFETY: `name` is a NUL-terminated string that lives across the call.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_counts_events() {
        let fd = eventfd().expect("eventfd");
        eventfd_give(&fd).expect("give");
        eventfd_give(&fd).expect("give");
        eventfd_take(&fd).expect("first");
        eventfd_take(&fd).expect("second");
    }

    #[test]
    fn loopback_is_listed() {
        let all = interface_addresses().expect("getifaddrs");
        assert!(all
            .iter()
            .any(|(_, ip)| *ip == IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert_ne!(interface_index("lo"), 0);
    }
}
