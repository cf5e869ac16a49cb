//! The few system calls ferroce needs that std does not offer: locking pages in memory, reading
//! the locked-memory limit, the IP and UDP socket options RoCEv2 depends on, and sending and
//! receiving datagrams in batches (`sendmmsg` with UDP GSO, `recvmmsg` with UDP GRO). Every
//! OS `unsafe` block of the crate is here, each with its reason; the datagram layer above
//! (`crate::udp`) is safe code.

#![allow(unsafe_code)]

use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;

/// Puts a descriptor the caller owns (a verbs device's async or completion-channel fd) in
/// non-blocking mode.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL and F_SETFL read and write the descriptor's status flags only; a
    // descriptor that is not open makes them fail with EBADF, which is returned.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

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

/// IPv4: send with a zero UDP checksum (`SO_NO_CHECK`), as rxe and RoCE NICs do: the ICRC
/// already covers the payload, and the kernel's checksum is another pass over every byte.
pub(crate) fn send_zero_checksum4(socket: &UdpSocket) -> io::Result<()> {
    set_int_option(socket, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)
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

/// The most messages one [`send_messages`] call takes.
pub(crate) const MAX_MESSAGES: usize = 64;

/// IPv4 and IPv6: turn UDP generic receive offload on (`UDP_GRO`): a train of segments from
/// one GSO send arrives as one buffer, with the segment size in a control message.
pub(crate) fn enable_gro(socket: &UdpSocket) -> io::Result<()> {
    set_int_option(socket, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Room for the one control message ferroce sends or reads: `UDP_SEGMENT` (a `u16`) or
/// `UDP_GRO` (an `int`); `CMSG_SPACE` of either is 24 bytes on 64-bit Linux, 16 on 32-bit.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct Cmsg([u8; 32]);

/// One message for [`send_messages`]: a datagram gathered from `iov`, or with `segment` a GSO
/// send that the kernel cuts into datagrams of that many bytes (the last may be shorter).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutMessage<'a> {
    pub(crate) dst: std::net::SocketAddr,
    pub(crate) iov: &'a [io::IoSlice<'a>],
    pub(crate) segment: Option<u16>,
}

/// Sends up to [`MAX_MESSAGES`] messages in one `sendmmsg(2)` call, each to its own address,
/// gathered from its slices (headers, a payload in place, a trailer) without copying them
/// together, and each with its own `UDP_SEGMENT` control message when it is a GSO send.
/// Returns how many messages the kernel took, which may be fewer than offered; an error means
/// the first one was refused.
///
/// One message goes by `sendmsg(2)`: the kernel copies no `mmsghdr` array for it and takes
/// the plain path, some 50 ns less a send here (`recv-floor turn`), on a ping-pong's every
/// turn.
pub(crate) fn send_messages(socket: &UdpSocket, msgs: &[OutMessage<'_>]) -> io::Result<usize> {
    // The arrays are zeroed for every call: a latency-bound exchange of one or two packets
    // should not clear room for 64.
    if msgs.len() <= 4 {
        send_up_to::<4>(socket, msgs)
    } else {
        send_up_to::<MAX_MESSAGES>(socket, msgs)
    }
}

fn send_up_to<const N: usize>(socket: &UdpSocket, msgs: &[OutMessage<'_>]) -> io::Result<usize> {
    let n = msgs.len().min(N);
    // SAFETY: all-zero sockaddr_storages and mmsghdrs (null pointers, zero lengths) are valid
    // values of those plain C structs.
    let mut names: [libc::sockaddr_storage; N] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut headers: [libc::mmsghdr; N] = unsafe { std::mem::zeroed() };
    let mut controls = [Cmsg([0; 32]); N];
    for (i, m) in msgs[..n].iter().enumerate() {
        let name_len = sockaddr(m.dst, &mut names[i]);
        let h = &mut headers[i].msg_hdr;
        h.msg_name = (&raw mut names[i]).cast();
        h.msg_namelen = name_len;
        // IoSlice is guaranteed ABI-compatible with iovec on Unix.
        h.msg_iov = m.iov.as_ptr().cast_mut().cast();
        h.msg_iovlen = m.iov.len() as _;
        if let Some(segment) = m.segment {
            h.msg_control = (&raw mut controls[i]).cast();
            // SAFETY: CMSG_SPACE only computes a size.
            h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
            // SAFETY: msg_control points at 32 aligned bytes of `controls[i]`, more than the
            // CMSG_SPACE(2) set as its length, so the first header and its data lie inside.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
            }
        }
    }
    let sent = if n == 1 {
        // SAFETY: the first header points at `names[0]`, `controls[0]` and iovecs borrowed
        // from `msgs`, all alive for the call; the kernel only reads them.
        let bytes = unsafe { libc::sendmsg(socket.as_raw_fd(), &raw const headers[0].msg_hdr, 0) };
        if bytes < 0 {
            -1
        } else {
            1
        }
    } else {
        // SAFETY: the first `n` headers point at `names` and `controls` on this frame and at
        // iovecs borrowed from `msgs`, all alive for the call; the kernel only reads them (and
        // writes each header's msg_len, inside `headers`).
        unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                headers.as_mut_ptr(),
                n as libc::c_uint,
                0,
            )
        }
    };
    if sent < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(sent as usize)
    }
}

/// The segment size in a received message's `UDP_GRO` control message, if it has one.
///
/// # Safety
///
/// `h` is a header the kernel has just filled by `recvmsg`/`recvmmsg`: its `msg_control` and
/// `msg_controllen` describe control messages inside a buffer that is still alive.
unsafe fn gro_segment(h: &libc::msghdr) -> Option<usize> {
    if h.msg_control.is_null() || h.msg_controllen == 0 {
        return None;
    }
    // SAFETY: the caller's promise; CMSG_FIRSTHDR/CMSG_NXTHDR stay within msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let size = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                return usize::try_from(size).ok().filter(|&s| s > 0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    None
}

/// Writes `addr` as the C socket address the kernel expects, returning its length.
fn sockaddr(addr: std::net::SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&raw mut *out).cast(), sin) };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        std::net::SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&raw mut *out).cast(), sin6) };
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads the socket address the kernel wrote into `storage`.
fn socket_addr(storage: &libc::sockaddr_storage) -> io::Result<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    match libc::c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the kernel wrote a sockaddr_in, which fits in storage.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read((&raw const *storage).cast()) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Ok(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the kernel wrote a sockaddr_in6, which fits in storage.
            let sin6: libc::sockaddr_in6 = unsafe { std::ptr::read((&raw const *storage).cast()) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Ok(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        family => Err(io::Error::other(format!(
            "datagram from address family {family}"
        ))),
    }
}

/// Datagrams [`RecvBatch::receive`] takes in one call.
pub(crate) const RECV_BATCH: usize = 32;

/// Room for one received buffer: the largest UDP payload (65507 bytes over IPv4, about 65527
/// over IPv6) and then some, because with `UDP_GRO` a buffer is a train of coalesced
/// segments and a shorter room would lose the rest of it (`MSG_TRUNC`). A larger datagram is
/// cut short and reported as such, never overrun.
const DATAGRAM_ROOM: usize = 65536;

/// Buffers for receiving up to [`RECV_BATCH`] datagrams (or GRO trains) in one
/// `recvmmsg(2)` call, with the call's headers built once: a receive that finds one datagram
/// (or none) costs no setup.
pub(crate) struct RecvBatch {
    bufs: Box<[u8]>,
    addrs: Box<[libc::sockaddr_storage]>,
    iovs: Box<[libc::iovec]>,
    headers: Box<[libc::mmsghdr]>,
    controls: Box<[Cmsg]>,
    lens: [usize; RECV_BATCH],
    truncated: [bool; RECV_BATCH],
    segments: [Option<usize>; RECV_BATCH],
    /// The headers the kernel filled in the last call, whose sizes it shrank to what it wrote.
    filled: usize,
}

/// One received buffer of a [`RecvBatch`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Received<'a> {
    /// Its bytes; `None` when it did not fit and was cut short.
    pub(crate) bytes: Option<&'a [u8]>,
    /// Its sender.
    pub(crate) from: std::net::SocketAddr,
    /// With UDP GRO, the size of each coalesced segment (the last may be shorter); `None` for
    /// a plain datagram.
    pub(crate) segment: Option<usize>,
}

// SAFETY: the raw pointers in `iovs` and `headers` point only into the batch's own heap
// buffers, which move with it and are only touched through `&mut self`.
unsafe impl Send for RecvBatch {}

/// Gives a receive header its full name and control sizes, which the kernel shrinks to what
/// it wrote whenever it fills the header.
fn arm(h: &mut libc::mmsghdr) {
    h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    h.msg_hdr.msg_controllen = size_of::<Cmsg>() as _;
}

impl std::fmt::Debug for RecvBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBatch").finish_non_exhaustive()
    }
}

impl RecvBatch {
    /// Writes every page of the receive buffers once, so that the kernel's first copies into
    /// them do not fault each page in on the way to the first answer. The buffers come
    /// zeroed from the allocator, untouched: a 2 MiB batch is 512 first-touch faults, which
    /// in a guest under emulation cost milliseconds when a burst lands in them.
    pub(crate) fn prefault(&mut self) {
        self.bufs.fill(0);
    }

    pub(crate) fn new() -> Self {
        // SAFETY: all-zero sockaddr_storages, iovecs and mmsghdrs (null pointers, zero
        // lengths) are valid values of those plain C structs.
        let (zero_addr, zero_iov, zero_header) = unsafe {
            (
                std::mem::zeroed::<libc::sockaddr_storage>(),
                std::mem::zeroed::<libc::iovec>(),
                std::mem::zeroed::<libc::mmsghdr>(),
            )
        };
        let mut batch = Self {
            bufs: vec![0; RECV_BATCH * DATAGRAM_ROOM].into_boxed_slice(),
            addrs: vec![zero_addr; RECV_BATCH].into_boxed_slice(),
            iovs: vec![zero_iov; RECV_BATCH].into_boxed_slice(),
            headers: vec![zero_header; RECV_BATCH].into_boxed_slice(),
            controls: vec![Cmsg([0; 32]); RECV_BATCH].into_boxed_slice(),
            lens: [0; RECV_BATCH],
            truncated: [false; RECV_BATCH],
            segments: [None; RECV_BATCH],
            filled: 0,
        };
        let base = batch.bufs.as_mut_ptr();
        for i in 0..RECV_BATCH {
            // SAFETY: `i * DATAGRAM_ROOM` is inside `bufs`, which holds RECV_BATCH rooms.
            batch.iovs[i].iov_base = unsafe { base.add(i * DATAGRAM_ROOM) }.cast();
            batch.iovs[i].iov_len = DATAGRAM_ROOM;
            let h = &mut batch.headers[i].msg_hdr;
            h.msg_name = (&raw mut batch.addrs[i]).cast();
            h.msg_iov = &raw mut batch.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = (&raw mut batch.controls[i]).cast();
            arm(&mut batch.headers[i]);
        }
        batch
    }

    /// Takes up to `max` datagrams (at most [`RECV_BATCH`]) that have already arrived,
    /// without blocking (`recvmmsg` with `MSG_DONTWAIT`, whatever the socket's mode; for one,
    /// `recvmsg`, which the kernel serves some 35–80 ns sooner here, an empty look of a
    /// spinning poll too: `recv-floor empty` and `turn`). Returns how many; 0 when none is
    /// waiting.
    pub(crate) fn receive(&mut self, socket: &UdpSocket, max: usize) -> io::Result<usize> {
        let max = max.clamp(1, RECV_BATCH);
        // The kernel shrinks the sizes of the headers it fills to what it wrote: give those of
        // the last call their full room again. A busy poll's empty calls re-arm nothing.
        self.headers[..self.filled].iter_mut().for_each(arm);
        self.filled = 0;
        let n = if max == 1 {
            let h = &mut self.headers[0];
            // SAFETY: the first header points at the first room of `bufs` (DATAGRAM_ROOM
            // bytes, through its iovec), at the first sockaddr_storage of `addrs` and at the
            // first control buffer, each with its size, all owned by `self` and alive for the
            // call; the kernel writes only within them.
            let bytes = unsafe {
                libc::recvmsg(socket.as_raw_fd(), &raw mut h.msg_hdr, libc::MSG_DONTWAIT)
            };
            if bytes >= 0 {
                // recvmmsg reports each message's length here; recvmsg returns it.
                h.msg_len = bytes as libc::c_uint;
                1
            } else {
                -1
            }
        } else {
            // SAFETY: each of the first `max` headers points at one room of `bufs`
            // (DATAGRAM_ROOM bytes, through its iovec), at one sockaddr_storage of `addrs` and
            // at one control buffer of `controls`, each with its size, all owned by `self` and
            // alive for the call; the kernel writes only within them.
            unsafe {
                libc::recvmmsg(
                    socket.as_raw_fd(),
                    self.headers.as_mut_ptr(),
                    max as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        let n = n as usize;
        self.filled = n;
        for i in 0..n {
            let h = &self.headers[i];
            self.lens[i] = (h.msg_len as usize).min(DATAGRAM_ROOM);
            self.truncated[i] = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            // SAFETY: the kernel has just filled this header; its control buffer is
            // `controls[i]`, owned by `self`.
            self.segments[i] = unsafe { gro_segment(&h.msg_hdr) };
        }
        Ok(n)
    }

    /// Buffer `i` of the last [`RecvBatch::receive`].
    pub(crate) fn get(&self, i: usize) -> io::Result<Received<'_>> {
        let from = socket_addr(&self.addrs[i])?;
        let start = i * DATAGRAM_ROOM;
        let bytes = &self.bufs[start..start + self.lens[i]];
        Ok(Received {
            bytes: (!self.truncated[i]).then_some(bytes),
            from,
            segment: self.segments[i],
        })
    }
}

/// Waits until the socket has a datagram to read or `timeout` passes (`poll(2)`); `None`
/// waits without limit. Returns whether it is readable. The datagram stays queued, so the
/// caller can take it under its own lock and keep datagrams in arrival order.
pub(crate) fn wait_readable(
    socket: &UdpSocket,
    timeout: Option<std::time::Duration>,
) -> io::Result<bool> {
    Ok(poll_readable([socket.as_raw_fd()], timeout)?[0])
}

/// Waits until the socket or the doorbell has something to read, or `timeout` passes
/// (`None`: without limit). Returns which of the two is readable; neither is read.
pub(crate) fn wait_either(
    socket: &UdpSocket,
    doorbell: &UnixDatagram,
    timeout: Option<std::time::Duration>,
) -> io::Result<[bool; 2]> {
    poll_readable([socket.as_raw_fd(), doorbell.as_raw_fd()], timeout)
}

/// Lets the calling thread's timed waits end when asked, not up to the default 50 µs later
/// (`PR_SET_TIMERSLACK` of 1 ns): a progress thread that naps for microseconds needs that.
/// Best effort: a refusal leaves the default slack.
pub(crate) fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// How many times the scheduler has taken the core from the calling thread while it could
/// still run (`getrusage(RUSAGE_THREAD)`'s `ru_nivcsw`): preemptions, and yields that handed
/// the core to another thread (a yield with nobody waiting does not count). A spinning wait
/// reads it to learn whether it shares its core. 0 where the call fails.
pub(crate) fn involuntary_switches() -> u64 {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one `rusage` into `usage`, which lives across the call;
    // RUSAGE_THREAD reports the calling thread only.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &raw mut usage) };
    if rc == 0 {
        usage.ru_nivcsw as u64
    } else {
        0
    }
}

/// `struct sched_attr` as `sched_setattr(2)` takes it (`SCHED_ATTR_SIZE_VER1`, 56 bytes).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Schedules the calling thread as a progress thread (`sched_setattr(2)` under
/// `SCHED_OTHER`): short time slices (`sched_runtime`, a custom slice since Linux 6.12), so
/// that it may preempt a running application thread when a packet wakes it rather than wait
/// for that thread's slice to end; and, with `nice`, that nice value where the process may
/// raise its priority. Returns the nice value the thread had. Best effort: older kernels
/// ignore the slice, and a refused nice value leaves the thread's own.
pub(crate) fn progress_scheduling(slice: std::time::Duration, nice: Option<i32>) -> i32 {
    let mut attr = SchedAttr::default();
    let size = size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr fills at most `size` bytes of `attr`, which lives across the
    // call; pid 0 is this thread.
    let rc = unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0) };
    let own = attr.nice;
    if rc != 0 || attr.policy != libc::SCHED_OTHER as u32 {
        return own;
    }
    attr.size = size;
    attr.runtime = slice.as_nanos() as u64;
    for nice in [nice.unwrap_or(own), own] {
        attr.nice = nice;
        // SAFETY: a complete sched_attr of `size` bytes for this thread (pid 0), its policy
        // the thread's own, read above.
        if unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) } == 0 {
            break;
        }
    }
    own
}

/// `ppoll(2)` for readability on `N` descriptors; an interrupted wait reads as a timeout.
/// The timeout is kept to the nanosecond: `poll(2)` takes whole milliseconds, and a progress
/// thread due to send a packet the fault injector held for 100 µs slept a millisecond
/// (BENCHMARKS.md, the data path's twenty-fourth step); held posts and short RNR waits
/// rounded up the same way.
pub(crate) fn poll_readable<const N: usize>(
    fds: [RawFd; N],
    timeout: Option<std::time::Duration>,
) -> io::Result<[bool; N]> {
    let mut polled = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let timespec = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        // Below 10^9, which an `i32` and so a `c_long` of any width holds.
        tv_nsec: libc::c_long::from(i32::try_from(t.subsec_nanos()).unwrap_or(999_999_999)),
    });
    let wait = timespec
        .as_ref()
        .map_or(std::ptr::null(), std::ptr::from_ref);
    // SAFETY: `polled` is an array of N pollfds on this stack frame, and N is the count
    // passed; the kernel writes only their `revents`. `wait` is null (no limit) or points to
    // `timespec`, which outlives the call; a null signal mask leaves the thread's as it is.
    let rc = unsafe {
        libc::ppoll(
            polled.as_mut_ptr(),
            N as libc::nfds_t,
            wait,
            std::ptr::null(),
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok([false; N])
        } else {
            Err(e)
        };
    }
    Ok(polled.map(|p| p.revents != 0))
}

/// A shared mapping of `len` bytes of a file descriptor (a dma-buf, a memfd), or fresh
/// anonymous memory, unmapped on drop; or memory the caller owns, borrowed, which drop leaves
/// alone. Its bytes are only ever copied in and out with raw copies: no Rust reference to them
/// exists, since the exporting device (or foreign code) may change them at any time.
pub(crate) struct Mapping {
    base: std::ptr::NonNull<u8>,
    map_len: usize,
    /// Where the caller's offset lands inside the page-aligned mapping.
    skew: usize,
    len: usize,
    /// For borrowed memory, what keeps it allocated; dropped instead of unmapping.
    owner: Option<Box<dyn std::any::Any + Send + Sync>>,
}

impl std::fmt::Debug for Mapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapping")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("borrowed", &self.owner.is_some())
            .finish()
    }
}

// SAFETY: the mapping is plain memory owned by this value, reached only through raw copies
// (`read`/`write`), never through a Rust reference, so moving it between threads moves no
// borrowed state.
unsafe impl Send for Mapping {}
// SAFETY: `&Mapping` offers only raw copies in and out. Two threads copying at once may see
// each other's bytes torn, which is the race any DMA buffer has with its device and what the
// mapping is for (a dma-buf a device writes, a frame ring foreign code reads); no Rust
// reference to the bytes exists for such a race to invalidate.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes at `offset` of `fd`, readable and writable, shared.
    pub(crate) fn new(fd: RawFd, offset: u64, len: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .unwrap_or(4096)
            .max(1);
        let offset =
            usize::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let skew = offset % page;
        let map_len = skew
            .checked_add(len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let file_offset = libc::off_t::try_from(offset - skew)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh mapping chosen by the kernel (no fixed address), so no existing
        // memory is affected; failure is reported as MAP_FAILED and handled below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                file_offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable))?;
        Ok(Self {
            base,
            map_len,
            skew,
            len,
            owner: None,
        })
    }

    /// Maps `len` bytes of fresh, zero-filled, private memory (anonymous), page-aligned, and
    /// resident from the start (`MAP_POPULATE`), as a registration would pin it: memory a
    /// peer writes into must not take a page fault per 4 KiB under its first packets (a 4K
    /// frame is 3,000 pages, which delayed a frame receiver's first frames into drops).
    pub(crate) fn anonymous(len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: a fresh anonymous mapping chosen by the kernel (no fixed address, no file),
        // so no existing memory is affected; failure is MAP_FAILED, handled below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable))?;
        Ok(Self {
            base,
            map_len: len,
            skew: 0,
            len,
            owner: None,
        })
    }

    /// Borrows `len` bytes at `addr` that `owner` keeps allocated.
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be readable and writable memory of this process that stays
    /// allocated, unmoved, until `owner` is dropped.
    pub(crate) unsafe fn borrowed(
        addr: u64,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> io::Result<Self> {
        let base = std::ptr::NonNull::new(addr as usize as *mut u8)
            .filter(|_| len > 0 && addr.checked_add(len as u64).is_some())
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        Ok(Self {
            base,
            map_len: len,
            skew: 0,
            len,
            owner: Some(owner),
        })
    }

    /// The address of the first mapped byte the caller asked for.
    pub(crate) fn addr(&self) -> u64 {
        self.base.as_ptr() as u64 + self.skew as u64
    }

    /// Whether the memory is borrowed from an owner rather than mapped here.
    pub(crate) fn is_borrowed(&self) -> bool {
        self.owner.is_some()
    }

    /// The length the caller asked for.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    fn check(&self, at: usize, n: usize) -> bool {
        at.checked_add(n).is_some_and(|end| end <= self.len)
    }

    /// Copies `out.len()` bytes from `at`. Out-of-range requests copy nothing.
    pub(crate) fn read(&self, at: usize, out: &mut [u8]) {
        if self.check(at, out.len()) {
            // SAFETY: `at + out.len() <= len`, so the source lies inside the live mapping;
            // `out` is a distinct Rust buffer, so the ranges do not overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.as_ptr().add(self.skew + at),
                    out.as_mut_ptr(),
                    out.len(),
                )
            }
        }
    }

    /// Copies `data` to `at`. Out-of-range requests copy nothing.
    pub(crate) fn write(&self, at: usize, data: &[u8]) {
        if self.check(at, data.len()) {
            // SAFETY: `at + data.len() <= len`, so the destination lies inside the live,
            // writable mapping; `data` is a distinct Rust buffer.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr(),
                    self.base.as_ptr().add(self.skew + at),
                    data.len(),
                )
            }
        }
    }

    /// Locks the mapped pages in RAM.
    pub(crate) fn mlock(&self) -> io::Result<()> {
        // SAFETY: the range is the live mapping; mlock changes residency only.
        let rc = unsafe { libc::mlock(self.base.as_ptr().cast(), self.map_len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // Borrowed: the owner (dropped with the field) frees it, not we.
            return;
        }
        // SAFETY: `base`/`map_len` are exactly what mmap returned; nothing refers to the
        // mapping once its owner drops it.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

/// Asks for `bytes` of socket receive and send buffer. Root (CAP_NET_ADMIN) gets it whatever
/// `net.core.rmem_max` says (`SO_RCVBUFFORCE`); others get at most that limit. Returns the
/// receive buffer the kernel granted.
pub(crate) fn grow_buffers(socket: &UdpSocket, bytes: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if set_int_option(socket, libc::SOL_SOCKET, force, want).is_err() {
            set_int_option(socket, libc::SOL_SOCKET, plain, want)?;
        }
    }
    let mut granted: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `granted`, a c_int on this frame.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw mut granted).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(usize::try_from(granted).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// An event counter the kernel can wait on (`eventfd(2)`, non-blocking): readable while its
/// count is above zero. A soft CQ's completion channel and a NIC's async-event descriptor are
/// one each, so that `poll`, epoll and tokio can wait on them.
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a descriptor it returns is new and ours.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Adds one to the count: the descriptor is readable until `take`.
    pub(crate) fn signal(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our own descriptor. A full counter
        // (EAGAIN, at 2^64 − 2) is already readable, so the error is ignored.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// The count, reset to zero; 0 when nothing was signalled since the last take.
    pub(crate) fn take(&self) -> u64 {
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from our own non-blocking
        // descriptor; EAGAIN (count zero) leaves the buffer zero.
        let n = unsafe { libc::read(self.0.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        if n == 8 {
            u64::from_ne_bytes(count)
        } else {
            0
        }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// A one-shot timer on the monotonic clock that other threads move often (the end of the
/// progress thread's nap, pushed on by every few hundred microseconds of polling): readable
/// once it has expired, until it is set again. Setting it from one thread moves the wake-up
/// of another that waits on both of its descriptors ([`MovingTimer::fds`]), without waking
/// that thread.
///
/// Two `timerfd_create(2)` timers, one armed at a time. Re-arming one timer that is the CPU's
/// next expiry (a nap's end nearly always is: the 250 Hz tick comes later) reprograms the
/// CPU's timer twice, once as the kernel cancels it and once as it starts it again; in a
/// virtual machine each reprogramming is an exit to the hypervisor. Arming the idle timer
/// first, then disarming the one that was armed, reprograms it once either way: a later
/// deadline is not the CPU's next expiry while the old one is armed, so only the disarm
/// reprograms; an earlier one reprograms as it is armed, and the old one, no longer next, goes
/// without. On the development host (a Firecracker guest) a re-arm took 12.1–15.7 µs and the
/// pair 6.8–8.9 µs (`scripts/bench-timer-rearm.sh`; BENCHMARKS.md, the data path's
/// thirty-seventh step).
#[derive(Debug)]
pub(crate) struct MovingTimer {
    timers: [OwnedFd; 2],
    /// Which of `timers` holds the deadline. The lock makes each setting whole: a thread that
    /// sets the timer while another does (the progress thread, between naps, without the
    /// NIC's lock) leaves one timer armed with the later call's deadline, as one timerfd
    /// would.
    armed: std::sync::Mutex<usize>,
}

impl MovingTimer {
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            timers: [new_timerfd()?, new_timerfd()?],
            armed: std::sync::Mutex::new(0),
        })
    }

    /// Expires `after` from now (at once for zero), replacing any earlier setting and
    /// clearing an expiry not yet read. Best effort: it fails only for a bad descriptor.
    pub(crate) fn set_after(&self, after: std::time::Duration) {
        // A zero `it_value` would disarm the timer instead.
        let after = after.max(std::time::Duration::from_nanos(1));
        let mut armed = self
            .armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let idle = 1 - *armed;
        set_timerfd(&self.timers[idle], after);
        set_timerfd(&self.timers[*armed], std::time::Duration::ZERO);
        *armed = idle;
    }

    /// Both timers' descriptors, to wait on together: either is readable when the deadline
    /// has passed, and a disarmed one is never readable.
    pub(crate) fn fds(&self) -> [RawFd; 2] {
        self.timers.each_ref().map(AsRawFd::as_raw_fd)
    }
}

/// A non-blocking `timerfd_create(2)` timer on the monotonic clock, disarmed.
fn new_timerfd() -> io::Result<OwnedFd> {
    // SAFETY: timerfd_create takes no pointers; a descriptor it returns is new and ours.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by timerfd_create and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Arms `timer` to expire `after` from now, or disarms it for zero; either clears an expiry
/// not yet read.
fn set_timerfd(timer: &OwnedFd, after: std::time::Duration) {
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(after.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(after.subsec_nanos() as i32),
        },
    };
    // SAFETY: a live itimerspec to read; no old value is asked for.
    let _ = unsafe { libc::timerfd_settime(timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
}

/// 64 bits from the operating system's CSPRNG (`getrandom(2)`): memory keys, QP numbers and
/// first PSNs, which a peer must not be able to guess.
pub(crate) fn random_u64() -> io::Result<u64> {
    getrandom::u64().map_err(|e| io::Error::other(format!("getrandom: {e}")))
}

/// The MTU of the interface that holds `ip`, from sysfs; `None` when there is no such
/// interface or its MTU cannot be read.
pub(crate) fn interface_mtu(ip: std::net::IpAddr) -> Option<u32> {
    let name = interface_of(ip)?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The name of the network interface that holds `ip` (`getifaddrs(3)`): the one with that
/// very address, else one whose subnet contains it (127.0.0.2 is loopback's, through
/// 127.0.0.1/8). `None` when there is none, or the list cannot be had.
pub(crate) fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocates into `list`, which is ours
    // to read until freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return None;
    }
    let (mut exact, mut subnet) = (None, None);
    let mut entry = list;
    while !entry.is_null() && exact.is_none() {
        // SAFETY: `entry` is a non-null node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*entry };
        entry = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null socket address's family field says which structure it is, and
        // only that structure is read; the netmask, when present, has the same family.
        let (addr, mask) = unsafe { (ip_of(ifa.ifa_addr), ip_of(ifa.ifa_netmask)) };
        let Some(addr) = addr else { continue };
        let slot = if addr == ip {
            &mut exact
        } else if mask.is_some_and(|mask| same_subnet(addr, ip, mask)) && subnet.is_none() {
            &mut subnet
        } else {
            continue;
        };
        // SAFETY: ifa_name is a non-null, NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        *slot = Some(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` came from getifaddrs and is freed once; nothing read from it is kept
    // (the names were copied).
    unsafe { libc::freeifaddrs(list) };
    exact.or(subnet)
}

/// The IP address in a C socket address, if it is IPv4 or IPv6.
///
/// # Safety
///
/// `sa` is null or points to a socket address as large as its family says.
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<std::net::IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise: a readable socket address of the size its family says.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin = &*sa.cast::<libc::sockaddr_in>();
                Some(u32::from_be(sin.sin_addr.s_addr).to_be_bytes().into())
            }
            libc::AF_INET6 => Some((*sa.cast::<libc::sockaddr_in6>()).sin6_addr.s6_addr.into()),
            _ => None,
        }
    }
}

/// Whether `a` and `b` agree on the bits set in `mask` (all three of one family).
fn same_subnet(a: std::net::IpAddr, b: std::net::IpAddr, mask: std::net::IpAddr) -> bool {
    use std::net::IpAddr::{V4, V6};
    match (a, b, mask) {
        (V4(a), V4(b), V4(m)) => (a.to_bits() ^ b.to_bits()) & m.to_bits() == 0,
        (V6(a), V6(b), V6(m)) => (a.to_bits() ^ b.to_bits()) & m.to_bits() == 0,
        _ => false,
    }
}

/// Whether network device `name` segments UDP itself: its `tx-udp-segmentation` feature is
/// active. Read with the ethtool ioctls that need no privilege (`ETHTOOL_GSSET_INFO`,
/// `ETHTOOL_GSTRINGS`, `ETHTOOL_GFEATURES`); `None` when the kernel does not say.
pub(crate) fn udp_segmentation_offload(name: &str) -> Option<bool> {
    const ETHTOOL_GSTRINGS: u32 = 0x1b;
    const ETHTOOL_GSSET_INFO: u32 = 0x37;
    const ETHTOOL_GFEATURES: u32 = 0x3a;
    const ETH_SS_FEATURES: u32 = 4;
    const ETH_GSTRING_LEN: usize = 32;
    // SAFETY: socket() has no memory-safety preconditions; a valid descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The set's size: struct ethtool_sset_info { cmd, reserved, u64 sset_mask, data[] }.
    let mut info = [ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0, 0];
    ethtool(fd.as_raw_fd(), name, &mut info).ok()?;
    if info[2] & (1 << ETH_SS_FEATURES) == 0 {
        return None;
    }
    let count = info[4] as usize;
    // The names: struct ethtool_gstrings { cmd, string_set, len, data[len * 32] }.
    let mut strings = vec![0u32; 3 + count * ETH_GSTRING_LEN / 4];
    strings[..3].copy_from_slice(&[ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count as u32]);
    ethtool(fd.as_raw_fd(), name, &mut strings).ok()?;
    let bytes: Vec<u8> = strings[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    let bit = bytes
        .chunks(ETH_GSTRING_LEN)
        .position(|s| s.split(|&b| b == 0).next() == Some(b"tx-udp-segmentation"))?;
    // The features: struct ethtool_gfeatures { cmd, size, blocks[size] of four u32s:
    // available, requested, active, never_changed }.
    let blocks = count.div_ceil(32);
    let mut features = vec![0u32; 2 + 4 * blocks];
    features[..2].copy_from_slice(&[ETHTOOL_GFEATURES, blocks as u32]);
    ethtool(fd.as_raw_fd(), name, &mut features).ok()?;
    let active = features[2 + 4 * (bit / 32) + 2];
    Some(active & (1 << (bit % 32)) != 0)
}

/// The UDP socket of this network namespace that a datagram sent to `to` would reach,
/// as the kernel's socket diagnostics find it (`NETLINK_SOCK_DIAG`, `udp_diag`'s lookup of
/// one socket: the receive path's own, a hash lookup, no walk of the table): the bytes
/// waiting unread in its receive queue, or `None` when no socket would take the datagram.
/// Needs no privilege. Where the kernel has no `udp_diag` (a container that cannot load the
/// module) every lookup answers `None`: a caller that must tell the two apart looks up a
/// socket it knows is there (`crate::udp::table` does).
pub(crate) fn udp_receive_queue(to: std::net::SocketAddr) -> io::Result<Option<u32>> {
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLMSG_ERROR: u16 = libc::NLMSG_ERROR as u16;
    const HEADER: usize = 16;
    // struct nlmsghdr, then struct inet_diag_req_v2: family, protocol, extensions, padding,
    // the states, and the socket's id: the ports, the addresses (16 bytes each), the
    // interface and the cookie. udp_diag looks the socket up as the receive path would for a
    // datagram from the id's source to its destination; the source, left zero here, matters
    // only to a connected socket, which a RoCE port is not.
    let mut req = [0u8; HEADER + 56];
    let (family, to_ip) = match to.ip() {
        std::net::IpAddr::V4(v4) => {
            let mut out = [0u8; 16];
            out[..4].copy_from_slice(&v4.octets());
            (libc::AF_INET, out)
        }
        std::net::IpAddr::V6(v6) => (libc::AF_INET6, v6.octets()),
    };
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    req[HEADER] = family as u8;
    req[HEADER + 1] = libc::IPPROTO_UDP as u8;
    req[HEADER + 4..HEADER + 8].copy_from_slice(&u32::MAX.to_ne_bytes());
    let id = HEADER + 8;
    req[id + 2..id + 4].copy_from_slice(&to.port().to_be_bytes());
    req[id + 20..id + 36].copy_from_slice(&to_ip);
    // No cookie (INET_DIAG_NOCOOKIE).
    req[id + 40..id + 48].fill(0xff);

    // SAFETY: socket() has no memory-safety preconditions; a valid descriptor is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `req` is a live buffer of the length given; an unbound netlink socket sends to
    // the kernel.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut answer = [0u8; 512];
    // SAFETY: `answer` is a live, writable buffer of the length given. The kernel queues its
    // answer while handling the request, before `send` returns.
    let got = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            answer.as_mut_ptr().cast(),
            answer.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    let answer = &answer[..got as usize];
    let word = |at: usize| {
        answer
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "short sock_diag answer"))
    };
    match answer.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]])) {
        Some(NLMSG_ERROR) => match -(word(HEADER)? as i32) {
            libc::ENOENT => Ok(None),
            errno => Err(io::Error::from_raw_os_error(errno)),
        },
        // struct inet_diag_msg: family, state, timer, retransmits, the id (48 bytes),
        // expires, then the receive queue's bytes.
        Some(SOCK_DIAG_BY_FAMILY) => Ok(Some(word(HEADER + 56)?)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "unexpected sock_diag answer",
        )),
    }
}

/// One `SIOCETHTOOL` ioctl on device `name` with the command block `data`.
fn ethtool(fd: RawFd, name: &str, data: &mut [u32]) -> io::Result<()> {
    // SAFETY: an all-zero ifreq (a name of NULs, a null pointer) is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = name.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    for (dst, &src) in req.ifr_name.iter_mut().zip(name) {
        *dst = src as libc::c_char;
    }
    req.ifr_ifru.ifru_data = data.as_mut_ptr().cast();
    // SAFETY: `req` names the device and points at `data`, which holds the command block the
    // command word asks for and room for the kernel's answer (the caller sized it from the
    // counts the kernel gave); both live for the call.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCETHTOOL as _, &raw mut req) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Which of the timer's descriptors are readable after waiting up to `wait` for either.
    fn expired(timer: &MovingTimer, wait: Duration) -> [bool; 2] {
        poll_readable(timer.fds(), Some(wait)).expect("ppoll")
    }

    /// A deadline moved later does not fire at its old end, one moved earlier fires at its
    /// new end, and one that passed leaves exactly one descriptor readable until the timer
    /// is set again: the two timerfds behave as one.
    #[test]
    fn a_moving_timer_fires_once_at_its_last_deadline() {
        let timer = MovingTimer::new().expect("timerfd");
        assert_eq!(
            expired(&timer, Duration::ZERO),
            [false, false],
            "armed at birth"
        );

        timer.set_after(Duration::from_millis(1));
        timer.set_after(Duration::from_secs(60));
        assert_eq!(
            expired(&timer, Duration::from_millis(50)),
            [false, false],
            "the first deadline was not disarmed"
        );

        timer.set_after(Duration::from_millis(1));
        let fired = expired(&timer, Duration::from_secs(10));
        assert_eq!(
            fired.iter().filter(|&&f| f).count(),
            1,
            "the earlier deadline did not fire alone: {fired:?}"
        );
        assert_eq!(
            expired(&timer, Duration::ZERO),
            fired,
            "the expiry was cleared unread"
        );

        timer.set_after(Duration::from_secs(60));
        assert_eq!(
            expired(&timer, Duration::ZERO),
            [false, false],
            "setting the timer again did not clear its expiry"
        );
    }
}
