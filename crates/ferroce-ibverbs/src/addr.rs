//! Which address the soft NIC binds: `FERROCE_ADDR` when set, otherwise the IPv4 address of
//! the interface that holds the default route, as rxe is bound to a network device (read
//! from `/proc/net/route` and `getifaddrs`). A host with no default route (a container with
//! only loopback) gets 127.0.0.1.
//!
//! One process has one soft NIC on one address: programs that run many processes on one
//! host (MPI ranks, both ends of a ping-pong) give each its own `FERROCE_ADDR`, a loopback
//! (`127.0.0.N`, all of 127/8 is local) or alias address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

use crate::sys;

/// The environment variable that names the address.
pub(crate) const ENV: &str = "FERROCE_ADDR";

/// Where the address came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// `FERROCE_ADDR`.
    Env,
    /// The default route's interface, named.
    DefaultRoute(String),
    /// No default route with an IPv4 address: loopback.
    Fallback,
}

/// The address the soft NIC binds and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Choice {
    pub(crate) ip: IpAddr,
    pub(crate) source: Source,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Source::Env => write!(f, "{} ({ENV})", self.ip),
            Source::DefaultRoute(dev) => write!(f, "{} (the default route's {dev})", self.ip),
            Source::Fallback => write!(f, "{} (no default route; set {ENV})", self.ip),
        }
    }
}

/// `FERROCE_ADDR` was set to something that is not an IP address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BadAddr(pub(crate) String);

impl fmt::Display for BadAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{ENV}={:?} is not an IPv4 or IPv6 address (such as 127.0.0.2)",
            self.0
        )
    }
}

/// The address to bind, from the environment or the routing table.
pub(crate) fn choose() -> Result<Choice, BadAddr> {
    match std::env::var(ENV) {
        Ok(value) if !value.trim().is_empty() => parse(&value).map(|ip| Choice {
            ip,
            source: Source::Env,
        }),
        _ => Ok(default_route_address().unwrap_or(Choice {
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            source: Source::Fallback,
        })),
    }
}

/// `FERROCE_ADDR`'s value as an address.
pub(crate) fn parse(value: &str) -> Result<IpAddr, BadAddr> {
    value
        .trim()
        .parse::<IpAddr>()
        .map_err(|_| BadAddr(value.to_owned()))
}

/// The IPv4 address of the interface that holds the default route, if there is one.
fn default_route_address() -> Option<Choice> {
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    let dev = default_route_interface(&table)?;
    let addrs = sys::interface_addresses().ok()?;
    addrs.into_iter().find_map(|(name, ip)| {
        (name == dev && ip.is_ipv4()).then(|| Choice {
            ip,
            source: Source::DefaultRoute(dev.clone()),
        })
    })
}

/// The interface of the default route in `/proc/net/route`'s text: destination and mask 0,
/// up (`RTF_UP`), the lowest metric of those.
fn default_route_interface(table: &str) -> Option<String> {
    const RTF_UP: u32 = 1;
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask …
            if f.len() < 8 || f[1] != "00000000" || f[7] != "00000000" {
                return None;
            }
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            let metric: u32 = f[6].parse().ok()?;
            (flags & RTF_UP != 0).then(|| (metric, f[0].to_owned()))
        })
        .min()
        .map(|(_, dev)| dev)
}

/// The index of the interface holding `ip` (the GID's `ndev_ifindex`), 0 when none does.
pub(crate) fn interface_index_of(ip: IpAddr) -> u32 {
    let Ok(addrs) = sys::interface_addresses() else {
        return 0;
    };
    match addrs.iter().find(|(_, a)| *a == ip) {
        Some((name, _)) => sys::interface_index(name),
        // All of 127/8 (and ::1) reaches the loopback device, which holds only 127.0.0.1.
        None if ip.is_loopback() => sys::interface_index("lo"),
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_addresses_and_refuses_the_rest() {
        assert_eq!(
            parse("127.0.0.7"),
            Ok(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 7)))
        );
        assert_eq!(parse(" ::1 "), Ok("::1".parse().unwrap()));
        assert!(parse("127.0.0.7:4791").is_err());
        assert!(parse("eth0").is_err());
        assert!(BadAddr("x".into()).to_string().contains("FERROCE_ADDR"));
    }

    #[test]
    fn finds_the_default_route_with_the_lowest_metric() {
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth1\t00000000\t0102A8C0\t0003\t0\t0\t200\t00000000\t0\t0\t0\n\
            eth0\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n\
            eth0\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n\
            down0\t00000000\t0103A8C0\t0002\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert_eq!(default_route_interface(table), Some("eth0".to_owned()));
        assert_eq!(default_route_interface("Iface\tDestination\n"), None);
    }

    #[test]
    fn loopback_has_an_interface_index() {
        assert_ne!(interface_index_of(IpAddr::V4(Ipv4Addr::LOCALHOST)), 0);
        // 127.0.0.2 is not an address of lo, but lo is where it lives.
        assert_eq!(
            interface_index_of(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))),
            sys::interface_index("lo")
        );
    }
}
