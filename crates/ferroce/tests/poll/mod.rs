//! Waiting on descriptors as an event loop does, for the tests of completion channels and
//! async events (kept out of `support`, which test files that forbid `unsafe` include).

/// Whether `fd` turns readable within `within`, by poll(2), as an event loop waits on it.
pub(crate) fn readable(fd: std::os::fd::BorrowedFd<'_>, within: std::time::Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, for the length given.
    let n = unsafe { libc::poll(&mut p, 1, within.as_millis() as i32) };
    n == 1 && p.revents & libc::POLLIN != 0
}
