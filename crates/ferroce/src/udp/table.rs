//! The host's UDP socket table, as the kernel lists it in `/proc/net/udp` and
//! `/proc/net/udp6` for this network namespace: whether any socket on this host would take a
//! datagram sent to an address. The connection manager asks it whether a peer on this host is
//! still there ([`crate::cm::linger`]); it reads the table and sends nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// Whether a socket on this host is bound to `addr`, or to its port on the unspecified
/// address (IPv4's, or IPv6's, which takes IPv4 too unless `IPV6_V6ONLY`). `None` when `addr`
/// is not an address of this host (its sockets are elsewhere) or the table cannot be read.
pub(crate) fn held_here(addr: SocketAddr) -> Option<bool> {
    // An address of this host is one a socket can be bound to (port 0: no port is taken).
    UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).ok()?;
    let mut wanted = vec![addr.ip(), IpAddr::V6(Ipv6Addr::UNSPECIFIED)];
    match addr.ip() {
        IpAddr::V4(v4) => {
            wanted.push(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            wanted.push(IpAddr::V6(v4.to_ipv6_mapped()));
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                wanted.push(IpAddr::V4(v4));
                wanted.push(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            }
        }
    }
    let mut read_any = false;
    for path in ["/proc/net/udp", "/proc/net/udp6"] {
        // A host without IPv6 has no udp6 table.
        let Ok(table) = std::fs::read_to_string(path) else {
            continue;
        };
        read_any = true;
        if table
            .lines()
            .filter_map(local_address)
            .any(|local| local.port() == addr.port() && wanted.contains(&local.ip()))
        {
            return Some(true);
        }
    }
    read_any.then_some(false)
}

/// The local address of one line of the table, `  sl  local_address rem_address …`: the
/// address in hex as the kernel holds it in memory (each 32-bit word in the host's byte
/// order), a colon, the port in hex. `None` for the heading or a line it cannot read.
fn local_address(line: &str) -> Option<SocketAddr> {
    let field = line.split_whitespace().nth(1)?;
    let (ip, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        ip.get(i * 8..i * 8 + 8)
            .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            .map(u32::to_ne_bytes)
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut octets = [0u8; 16];
            for (i, chunk) in octets.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(i)?);
            }
            IpAddr::V6(Ipv6Addr::from(octets))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
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
    fn an_address_of_another_host_is_not_known() {
        // TEST-NET-1 (RFC 5737) is no address of this host; nothing is sent to it.
        assert_eq!(held_here("192.0.2.1:4791".parse().unwrap()), None);
    }

    #[test]
    fn lines_of_the_table_read_as_the_kernel_wrote_them() {
        let v4 = "  12: 2000007F:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 0";
        let want: SocketAddr = "127.0.0.32:4791".parse().unwrap();
        // The kernel prints the address's 32-bit word as it lies in memory.
        let raw = u32::from_ne_bytes([127, 0, 0, 32]);
        let line = v4.replace("2000007F", &format!("{raw:08X}"));
        assert_eq!(local_address(&line), Some(want));
        let mapped = Ipv4Addr::new(127, 0, 0, 32).to_ipv6_mapped().octets();
        let words: String = mapped
            .chunks(4)
            .map(|w| format!("{:08X}", u32::from_ne_bytes(w.try_into().unwrap())))
            .collect();
        let v6 = format!("   3: {words}:12B7 00000000000000000000000000000000:0000 07 0 0");
        assert_eq!(
            local_address(&v6),
            Some(SocketAddr::new(
                IpAddr::V6(Ipv4Addr::new(127, 0, 0, 32).to_ipv6_mapped()),
                4791
            ))
        );
        assert_eq!(local_address("  sl  local_address rem_address   st"), None);
    }
}
