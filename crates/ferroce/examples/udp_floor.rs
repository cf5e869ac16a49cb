//! The floor under an RC ping-pong over UDP (issue 26 item 1): a busy-polled UDP ping-pong on
//! loopback that sends, per turn, what an RC write-lat turn puts on the wire, with nothing of
//! RDMA in it. With one datagram per turn it is `sockperf ping-pong --nonblocked`; with two,
//! each side hands the kernel, in one `sendmmsg`, a 20-byte datagram (a RoCE ACK: BTH, AETH,
//! ICRC) and a 40-byte one (an 8-byte WRITE: BTH, RETH, payload, ICRC), and answers only when
//! it holds both, as perftest's write-lat with one WRITE outstanding does: its next WRITE waits
//! for its last one's ACK and for the peer's WRITE. With `gso`, the two leave as one UDP GSO
//! send (the WRITE, then the ACK as its shorter last segment) to a socket that receives with
//! UDP GRO, as ferroce's soft NIC sends a held ACK behind the reply: one trip through each
//! kernel's stack for both. With `nic`, the same turn goes through the system calls the soft
//! NIC makes for it (`sendmsg` with the segment size in a control message, `recvmsg` with the
//! sender's address and the GRO control message), which cost more than `send_to` and `recv`:
//! the floor of the soft NIC's system calls, with nothing of RDMA in it.
//! Both ends spin on non-blocking receives, each on its own thread
//! (one core each here). Prints the half round trip's median and 99th percentile, as sockperf
//! does, so `scripts/bench-softnic.sh` can set ferroce's write-lat beside the floor as well as
//! beside sockperf.
//!
//! `cargo run --release -p ferroce --example udp_floor -- [1 | 2 | gso | nic] [seconds]`

use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const SERVER: &str = "127.0.7.72:47910";
const CLIENT: &str = "127.0.7.73:47911";
/// Turns before the clock starts, so that first-touch costs stay out of the figures.
const WARMUP: usize = 10_000;
/// A RoCE ACK's UDP payload (BTH 12, AETH 4, ICRC 4) and an 8-byte WRITE's (BTH 12, RETH 16,
/// payload 8, ICRC 4).
const ACK_LEN: usize = 20;
const WRITE_LEN: usize = 40;

/// What one turn puts on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Turn {
    /// One 16-byte datagram (sockperf's).
    One,
    /// An ACK and a WRITE, two datagrams in one `sendmmsg`.
    Two,
    /// A WRITE and an ACK, two segments of one GSO send, received by GRO.
    Gso,
    /// The same GSO turn through the system calls the soft NIC makes for it: `sendmsg` with
    /// a `UDP_SEGMENT` control message (its packets are gathered from pieces, and their
    /// segment size changes from send to send), `recvmsg` into a 64 KiB room with the sender's
    /// address (the ICRC covers it) and the GRO control message (where a train's segments
    /// end).
    Nic,
}

impl Turn {
    /// The bytes that make a whole turn at the receiver.
    fn bytes(self) -> usize {
        match self {
            Self::One => 16,
            Self::Two | Self::Gso | Self::Nic => ACK_LEN + WRITE_LEN,
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let turn_kind = match args.first().map_or("2", String::as_str) {
        "1" => Turn::One,
        "2" => Turn::Two,
        "gso" => Turn::Gso,
        "nic" => Turn::Nic,
        other => panic!("per turn: 1, 2, gso or nic, not {other}"),
    };
    let seconds: f64 = args.get(1).map_or(5.0, |a| a.parse().expect("seconds"));
    let server = bind(SERVER, turn_kind);
    let client = bind(CLIENT, turn_kind);
    let (server_addr, client_addr) = (server.local_addr().unwrap(), client.local_addr().unwrap());
    let echo = std::thread::spawn(move || serve(&server, client_addr, turn_kind));

    let deadline = Duration::from_secs_f64(seconds);
    let mut halves = Vec::with_capacity(1 << 20);
    let mut buf = [0u8; 64];
    let mut turn = 0usize;
    let started = Instant::now();
    loop {
        let timed = turn >= WARMUP;
        if timed && started.elapsed() >= deadline {
            break;
        }
        let sent = Instant::now();
        send_turn(&client, server_addr, turn_kind, turn as u8);
        if !receive_turn(&client, &mut buf, turn_kind) {
            break;
        }
        if timed {
            halves.push(sent.elapsed().as_nanos() as f64 / 2000.0);
        }
        turn += 1;
    }
    // An empty datagram ends the server.
    client.send_to(&[], server_addr).expect("send the end");
    echo.join().expect("the server thread");
    if halves.is_empty() {
        eprintln!("udp floor: no timed turn within {seconds} s (after {WARMUP} untimed ones)");
        std::process::exit(1);
    }
    halves.sort_by(f64::total_cmp);
    let at = |p: f64| halves[((halves.len() - 1) as f64 * p) as usize];
    println!(
        "udp floor, {turn_kind:?} per turn, {} turns: median {:.3} us, p99 {:.3} us",
        halves.len(),
        at(0.50),
        at(0.99)
    );
}

fn bind(addr: &str, turn: Turn) -> UdpSocket {
    let socket = UdpSocket::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    socket.set_nonblocking(true).expect("non-blocking");
    if turn == Turn::Gso {
        sockopt::set_udp_option(&socket, libc::UDP_SEGMENT, WRITE_LEN as libc::c_int)
            .expect("UDP_SEGMENT");
    }
    if matches!(turn, Turn::Gso | Turn::Nic) {
        sockopt::set_udp_option(&socket, libc::UDP_GRO, 1).expect("UDP_GRO");
    }
    socket
}

/// Answers every turn with a turn of its own until an empty datagram arrives.
fn serve(socket: &UdpSocket, peer: SocketAddr, turn_kind: Turn) {
    let mut buf = [0u8; 64];
    let mut turn = 0u8;
    while receive_turn(socket, &mut buf, turn_kind) {
        send_turn(socket, peer, turn_kind, turn);
        turn = turn.wrapping_add(1);
    }
}

/// Spins until a whole turn's bytes have arrived (one buffer by GRO, or one per datagram);
/// false when an empty datagram (the end) arrives.
fn receive_turn(socket: &UdpSocket, buf: &mut [u8], turn: Turn) -> bool {
    let mut got = 0;
    while got < turn.bytes() {
        let received = if turn == Turn::Nic {
            sys::ROOM.with_borrow_mut(|room| room.receive(socket))
        } else {
            socket.recv(buf)
        };
        match received {
            Ok(0) => return false,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => panic!("recv: {e}"),
        }
    }
    true
}

/// One turn's datagrams: a 16-byte one alone (sockperf's); an ACK and a WRITE in one
/// `sendmmsg`; or the WRITE and the ACK as one send, which the socket's `UDP_SEGMENT` cuts
/// after the WRITE.
fn send_turn(socket: &UdpSocket, to: SocketAddr, turn: Turn, tag: u8) {
    match turn {
        Turn::One => {
            socket.send_to(&[tag; 16], to).expect("send");
        }
        Turn::Two => {
            let (ack, write) = ([tag; ACK_LEN], [tag; WRITE_LEN]);
            sys::send_both(socket, to, &ack, &write).expect("sendmmsg");
        }
        Turn::Gso => {
            socket
                .send_to(&[tag; WRITE_LEN + ACK_LEN], to)
                .expect("GSO send");
        }
        Turn::Nic => {
            sys::send_gso(socket, to, &[tag; WRITE_LEN + ACK_LEN], WRITE_LEN as u16)
                .expect("sendmsg");
        }
    }
}

/// Socket options std does not offer, shared with `udp_pair`.
#[path = "common/sockopt.rs"]
mod sockopt;

/// The system calls std does not offer.
mod sys {
    use std::cell::RefCell;
    use std::io;
    use std::net::{SocketAddr, UdpSocket};
    use std::os::fd::AsRawFd;

    /// `to` as a C IPv4 address.
    fn sockaddr_v4(to: SocketAddr) -> io::Result<libc::sockaddr_in> {
        let SocketAddr::V4(v4) = to else {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        };
        Ok(libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*v4.ip()).to_be(),
            },
            sin_zero: [0; 8],
        })
    }

    /// Sends `a` then `b` to `to` (IPv4) in one `sendmmsg`.
    pub(crate) fn send_both(
        socket: &UdpSocket,
        to: SocketAddr,
        a: &[u8],
        b: &[u8],
    ) -> io::Result<()> {
        let addr = sockaddr_v4(to)?;
        let mut iov = [a, b].map(|bytes| libc::iovec {
            iov_base: bytes.as_ptr().cast_mut().cast(),
            iov_len: bytes.len(),
        });
        let mut msgs: [libc::mmsghdr; 2] = [0, 1].map(|i| {
            // SAFETY: msghdr is plain data (integers and pointers) for which all-zero is a
            // valid value: no name, no iovecs, no control data.
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_name = std::ptr::addr_of!(addr).cast_mut().cast();
            hdr.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
            hdr.msg_iov = std::ptr::addr_of_mut!(iov[i]);
            hdr.msg_iovlen = 1;
            libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            }
        });
        // SAFETY: both headers point at `addr` and at one iovec each, which point at `a` and
        // `b`; all of them outlive the call, and the kernel only reads them (and writes each
        // header's msg_len, which `msgs` owns).
        let sent = unsafe { libc::sendmmsg(socket.as_raw_fd(), msgs.as_mut_ptr(), 2, 0) };
        match sent {
            2 => Ok(()),
            -1 => Err(io::Error::last_os_error()),
            n => Err(io::Error::other(format!("sendmmsg sent {n} of 2"))),
        }
    }

    /// Sends `bytes` to `to` (IPv4) as one GSO send cut every `segment` bytes, the cut given
    /// in a `UDP_SEGMENT` control message of a `sendmsg`, as the soft NIC sends one message.
    pub(crate) fn send_gso(
        socket: &UdpSocket,
        to: SocketAddr,
        bytes: &[u8],
        segment: u16,
    ) -> io::Result<()> {
        let addr = sockaddr_v4(to)?;
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr().cast_mut().cast(),
            iov_len: bytes.len(),
        };
        let mut control = Control([0; 32]);
        // SAFETY: msghdr is plain data for which all-zero is a valid value.
        let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
        h.msg_name = std::ptr::addr_of!(addr).cast_mut().cast();
        h.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        h.msg_iov = &raw mut iov;
        h.msg_iovlen = 1;
        h.msg_control = (&raw mut control).cast();
        // SAFETY: CMSG_SPACE only computes a size.
        h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
        // SAFETY: msg_control points at 32 aligned bytes, more than CMSG_SPACE(2), so the
        // first header and its data lie inside.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = libc::UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
        }
        // SAFETY: the header points at `addr`, `iov` (which points at `bytes`) and `control`,
        // all alive for the call; the kernel only reads them.
        match unsafe { libc::sendmsg(socket.as_raw_fd(), &raw const h, 0) } {
            -1 => Err(io::Error::last_os_error()),
            _ => Ok(()),
        }
    }

    /// Room for a control message (`UDP_SEGMENT` or `UDP_GRO`).
    #[repr(C, align(8))]
    #[derive(Clone, Copy)]
    struct Control([u8; 32]);

    /// The soft NIC's receive of one buffer: a 64 KiB room (a GRO train fits), the sender's
    /// address and a control message.
    pub(crate) struct Room {
        buf: Vec<u8>,
        addr: libc::sockaddr_storage,
        control: Control,
    }

    thread_local! {
        /// Each thread's room (the client's and the server's).
        pub(crate) static ROOM: RefCell<Room> = RefCell::new(Room {
            buf: vec![1; 65536],
            // SAFETY: an all-zero sockaddr_storage is a valid value.
            addr: unsafe { std::mem::zeroed() },
            control: Control([0; 32]),
        });
    }

    impl Room {
        /// Takes a datagram or GRO train if one has arrived: its length (0 for the empty
        /// datagram that ends the run), `WouldBlock` when none is waiting.
        pub(crate) fn receive(&mut self, socket: &UdpSocket) -> io::Result<usize> {
            let mut iov = libc::iovec {
                iov_base: self.buf.as_mut_ptr().cast(),
                iov_len: self.buf.len(),
            };
            // SAFETY: msghdr is plain data for which all-zero is a valid value.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = (&raw mut self.addr).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &raw mut iov;
            h.msg_iovlen = 1;
            h.msg_control = (&raw mut self.control).cast();
            h.msg_controllen = size_of::<Control>() as _;
            // SAFETY: the header points at `buf` (through `iov`), `addr` and `control`, each
            // with its size, all alive for the call; the kernel writes only within them.
            match unsafe { libc::recvmsg(socket.as_raw_fd(), &raw mut h, libc::MSG_DONTWAIT) } {
                -1 => Err(io::Error::last_os_error()),
                n => Ok(n as usize),
            }
        }
    }
}
