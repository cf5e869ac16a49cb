//! Small conversions shared by the classes: addresses, durations and hashes.

use std::hash::{Hash, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;

use crate::errors::Error;

/// An IP address from its text (`"127.0.1.1"`, `"::1"`).
pub(crate) fn ip(text: &str) -> Result<IpAddr, Error> {
    text.trim()
        .parse()
        .map_err(|_| Error::invalid(format!("{text:?} is not an IPv4 or IPv6 address")))
}

/// A socket address from `"ip"` (taking `default_port`), `"ip:port"` or `"[v6]:port"`.
pub(crate) fn socket_addr(text: &str, default_port: u16) -> Result<SocketAddr, Error> {
    let text = text.trim();
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok(addr);
    }
    match text.parse::<IpAddr>() {
        Ok(ip) => Ok(SocketAddr::new(ip, default_port)),
        Err(_) => Err(Error::invalid(format!(
            "{text:?} is not an address: write \"ip\" or \"ip:port\" (\"[v6]:port\" for IPv6)"
        ))),
    }
}

/// A RoCE address from Python: `(host, port)` as the socket module and `QpEndpoint.addr`
/// write it, or text as [`socket_addr`] reads it (port 4791 when left out).
pub(crate) fn addr_arg(obj: &Bound<'_, PyAny>) -> PyResult<SocketAddr> {
    if let Ok(text) = obj.extract::<String>() {
        return Ok(socket_addr(&text, ferroce::proto::wire::ROCE_PORT)?);
    }
    if let Ok((host, port)) = obj.extract::<(String, u16)>() {
        return Ok(SocketAddr::new(ip(&host)?, port));
    }
    Err(pyo3::exceptions::PyTypeError::new_err(
        "an address is a (host, port) tuple or a string (\"ip\", \"ip:port\")",
    ))
}

/// `(host, port)`, as Python's socket module writes addresses.
pub(crate) fn addr_tuple(addr: SocketAddr) -> (String, u16) {
    (addr.ip().to_string(), addr.port())
}

/// Seconds from Python as a duration: finite and not negative.
pub(crate) fn seconds(what: &str, s: f64) -> Result<Duration, Error> {
    if s.is_finite() && s >= 0.0 {
        Ok(Duration::from_secs_f64(s.min(1e9)))
    } else {
        Err(Error::invalid(format!(
            "{what} {s} is not a number of seconds from 0 up"
        )))
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A `__hash__` from a value's `Hash`, through the standard library's `DefaultHasher`.
pub(crate) fn hash_of(value: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}
