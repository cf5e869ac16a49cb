//! The sockets of this host as the kernel's socket diagnostics show them: whether a socket on
//! this host would take a datagram sent to an address, and whether it holds datagrams it has
//! not read. The connection manager asks whether a peer on this host is still there
//! ([`crate::cm::linger`]); the soft NIC's driver, before an early resend, whether such a peer
//! has read what it was sent. It asks the kernel (`crate::sys::udp_receive_queue`) and sends
//! nothing.

use std::net::{SocketAddr, UdpSocket};

use crate::sys;

/// Whether a socket on this host would take a datagram sent to `addr`: one bound to it, or to
/// its port on the unspecified address. `None` when `addr` is not an address of this host (its
/// sockets are elsewhere) or the kernel does not say.
pub(crate) fn held_here(addr: SocketAddr) -> Option<bool> {
    Some(receive_queue_here(addr)?.is_some())
}

/// Whether the socket on this host that would take a datagram sent to `addr` holds datagrams
/// it has not read: its process is descheduled or behind. `None` as for [`held_here`], and
/// when no socket would take the datagram.
pub(crate) fn unread_here(addr: SocketAddr) -> Option<bool> {
    Some(receive_queue_here(addr)?? > 0)
}

/// The unread bytes of the socket on this host that would take a datagram sent to `addr`
/// (`Some(None)`: none would).
fn receive_queue_here(addr: SocketAddr) -> Option<Option<u32>> {
    // An address of this host is one a socket can be bound to (port 0: no port is taken).
    // Without this, a socket on the unspecified address here would answer for another host.
    let probe = UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).ok()?;
    match sys::udp_receive_queue(addr).ok()? {
        Some(bytes) => Some(Some(bytes)),
        // A kernel without udp_diag answers every lookup as one for no socket (ENOENT): the
        // answer stands only if the probe just bound is found.
        None => {
            sys::udp_receive_queue(probe.local_addr().ok()?).ok()??;
            Some(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_socket_is_held_and_a_closed_one_is_not() {
        let socket = UdpSocket::bind("127.0.23.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        assert_eq!(held_here(addr), Some(true));
        // The same port on another loopback address is free.
        let other = SocketAddr::new("127.0.23.2".parse().unwrap(), addr.port());
        assert_eq!(held_here(other), Some(false));
        drop(socket);
        assert_eq!(held_here(addr), Some(false));
    }

    #[test]
    fn a_socket_on_the_unspecified_address_holds_the_port_of_every_local_one() {
        let socket = UdpSocket::bind("0.0.0.0:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        assert_eq!(
            held_here(SocketAddr::new("127.0.23.5".parse().unwrap(), port)),
            Some(true)
        );
    }

    #[test]
    fn a_datagram_not_yet_read_shows_in_the_queue() {
        let socket = UdpSocket::bind("127.0.23.3:0").unwrap();
        let addr = socket.local_addr().unwrap();
        assert_eq!(unread_here(addr), Some(false));
        UdpSocket::bind("127.0.23.4:0")
            .unwrap()
            .send_to(b"unread", addr)
            .unwrap();
        assert_eq!(unread_here(addr), Some(true));
        let mut buf = [0u8; 16];
        assert_eq!(socket.recv(&mut buf).unwrap(), 6);
        assert_eq!(unread_here(addr), Some(false));
        drop(socket);
        assert_eq!(unread_here(addr), None);
    }

    #[test]
    fn ipv6_sockets_are_found_too() {
        let Ok(socket) = UdpSocket::bind("[::1]:0") else {
            eprintln!("no IPv6 loopback on this host: the IPv6 lookup is not checked");
            return;
        };
        let addr = socket.local_addr().unwrap();
        assert_eq!(held_here(addr), Some(true));
        UdpSocket::bind("[::1]:0")
            .unwrap()
            .send_to(b"unread", addr)
            .unwrap();
        assert_eq!(unread_here(addr), Some(true));
    }

    #[test]
    fn an_address_of_another_host_is_not_known() {
        // TEST-NET-1 (RFC 5737) is no address of this host; nothing is sent to it.
        assert_eq!(held_here("192.0.2.1:4791".parse().unwrap()), None);
    }
}
