//! The session's out-of-band handshake: the versioned hello, one line each way,
//! `ferroce-session/1 role=<role> mtu=<bytes>`, before
//! [`PeerInfo`](crate::exchange::PeerInfo)'s own versioned exchange; the lines it and the
//! channel description travel as; and the words the session's errors give the out-of-band
//! steps. Once the channel is established the connection belongs to the
//! [watchdog](super::watchdog).

use std::io;
use std::net::TcpStream;
use std::time::Duration;

use ferroce_proto::qp::Mtu;

use super::types::{Role, SessionError};
pub(super) use crate::oob::field;
use crate::oob::{self, LineError, OpenWords, MAX_LINE};

/// The version of the session's hello; a peer with another is refused by name.
pub const SESSION_VERSION: u32 = 1;

/// Turns a socket error while `what` was under way into the session's.
pub(super) fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> SessionError {
    move |source| SessionError::Io { what, source }
}

/// How the session words the out-of-band steps' failures.
impl oob::FaceError for SessionError {
    const OPEN_WORDS: OpenWords = OpenWords {
        waiting: "waiting for the controller to connect",
        dialling: "connecting to the coprocessor",
        listening: "listening for the controller",
        accepting: "accepting the controller",
        configuring: "configuring the out-of-band connection",
    };

    fn timed_out(what: &'static str, after: Duration) -> Self {
        Self::Timeout { what, after }
    }

    fn io(what: &'static str, source: io::Error) -> Self {
        Self::Io { what, source }
    }
}

/// Reads one `\n`-terminated line (without it); `what` names the step, for errors.
pub(super) fn read_line(
    stream: &mut TcpStream,
    what: &'static str,
) -> Result<String, SessionError> {
    oob::read_line(stream).map_err(|e| match e {
        LineError::Closed => SessionError::PeerGone {
            reason: format!("the peer closed the out-of-band connection during {what}"),
        },
        LineError::Silent => SessionError::PeerGone {
            reason: format!("the peer said nothing during {what}"),
        },
        LineError::TooLong => {
            SessionError::Protocol(format!("a line longer than {MAX_LINE} bytes during {what}"))
        }
        LineError::Io(source) => SessionError::Io { what, source },
    })
}

/// Writes one line.
pub(super) fn write_line(
    stream: &mut TcpStream,
    line: &str,
    what: &'static str,
) -> Result<(), SessionError> {
    oob::write_line(stream, line).map_err(io_error(what))
}

/// The hello line `role` sends: `ferroce-session/<SESSION_VERSION> role=<role> mtu=<mtu>`,
/// without its `\n`.
#[must_use]
pub fn hello_line(role: Role, mtu: u32) -> String {
    format!(
        "ferroce-session/{SESSION_VERSION} role={} mtu={mtu}",
        role.name()
    )
}

/// Reads a peer's hello line (without its `\n`), as [`hello_line`] writes it: returns the
/// role the peer says it has and its path MTU in bytes. Words other than the version, `role=`
/// and `mtu=` are ignored.
///
/// # Errors
///
/// [`SessionError::Version`] when the line starts `ferroce-session/<n>` with another version;
/// [`SessionError::Protocol`] when it does not start `ferroce-session/<n>`, or names no role
/// (`controller` or `coprocessor`) or no MTU (a decimal `u32`).
pub fn parse_hello(line: &str) -> Result<(Role, u32), SessionError> {
    let bad = || SessionError::Protocol(format!("malformed hello {line:?}"));
    let version = oob::version(line, "ferroce-session").ok_or_else(bad)?;
    if version != SESSION_VERSION {
        return Err(SessionError::Version {
            ours: SESSION_VERSION,
            theirs: version,
        });
    }
    let role = match field(line, "role") {
        Some("controller") => Role::Controller,
        Some("coprocessor") => Role::Coprocessor,
        _ => return Err(bad()),
    };
    let mtu = field(line, "mtu")
        .and_then(|m| m.parse().ok())
        .ok_or_else(bad)?;
    Ok((role, mtu))
}

/// Says hello with the MTU `ours` and checks the peer's: the same version, the other role, an
/// MTU RoCE knows. Returns the peer's MTU.
pub(super) fn hello(stream: &mut TcpStream, role: Role, ours: Mtu) -> Result<Mtu, SessionError> {
    write_line(stream, &hello_line(role, ours.bytes()), "the hello")?;
    let line = read_line(stream, "the hello")?;
    let (theirs, mtu) = parse_hello(&line)?;
    if theirs == role {
        return Err(SessionError::RoleMismatch { role });
    }
    Mtu::from_bytes(mtu).ok_or_else(|| {
        SessionError::Protocol(format!("the peer's MTU {mtu} is not one of 256 … 4096"))
    })
}

#[cfg(test)]
mod tests {
    use super::super::types::ChannelDesc;
    use super::*;

    #[test]
    fn hello_and_channel_lines_parse_back() {
        for role in [Role::Controller, Role::Coprocessor] {
            let line = hello_line(role, 4096);
            assert_eq!(line, format!("ferroce-session/1 role={role} mtu=4096"));
            assert_eq!(parse_hello(&line).unwrap(), (role, 4096));
        }
        assert!(matches!(
            parse_hello("ferroce-session/2 role=controller mtu=1024"),
            Err(SessionError::Version { ours: 1, theirs: 2 })
        ));
        for bad in [
            "ferroce-session/1 mtu=1024",
            "ferroce-session/1 role=peer mtu=1024",
            "ferroce-session/1 role=controller mtu=-1",
            "ferroce-cache/1 role=controller mtu=1024",
        ] {
            assert!(
                matches!(parse_hello(bad), Err(SessionError::Protocol(_))),
                "{bad}"
            );
        }
        let desc = ChannelDesc::new(8, 4096, 1 << 30);
        assert_eq!(
            desc.to_line(),
            "channel slots=8 request=4096 reply=1073741824"
        );
        assert_eq!(ChannelDesc::parse_line(&desc.to_line()).unwrap(), desc);
        assert!(matches!(
            ChannelDesc::parse_line("channel slots=65536 request=1 reply=1"),
            Err(SessionError::Protocol(_))
        ));
    }
}
