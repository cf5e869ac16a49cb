//! The out-of-band side of a session: the TCP connection, its versioned hello, and the
//! watchdog that keeps it alive with heartbeats once the channel is established.
//!
//! The hello is one line each way, `ferroce-session/1 role=<role> mtu=<bytes>`, before
//! [`PeerInfo`](crate::exchange::PeerInfo)'s own versioned exchange. After
//! `establish_channel` the connection carries only single bytes: `h` (heartbeat, every
//! [`heartbeat`] interval) and `b` (bye, sent by `stop`). A peer is gone when it says bye,
//! when its connection closes (its process ended) or when it stays silent longer than the
//! peer timeout (its host or network went away).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ferroce_proto::qp::Mtu;

use super::{Role, SessionError};
pub(super) use crate::oob::field;
use crate::oob::{self, LineError, OpenWords, MAX_LINE};

/// The version of the session's hello; a peer with another is refused by name.
pub const SESSION_VERSION: u32 = 1;

const HEARTBEAT: u8 = b'h';
const BYE: u8 = b'b';

/// How often a side says it is alive, for a peer timeout of `peer_timeout`.
pub(super) fn heartbeat(peer_timeout: Duration) -> Duration {
    (peer_timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(100))
}

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> SessionError {
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

/// Whether the peer is still there, as the watchdog sees it.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    gone: AtomicBool,
    reason: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Liveness {
    /// Why the peer is gone, if it is (cheap when it is not).
    pub(super) fn gone(&self) -> Option<String> {
        if !self.gone.load(Ordering::Acquire) {
            return None;
        }
        self.reason
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn mark_gone(&self, reason: String) {
        let mut slot = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.is_none() {
            *slot = Some(reason);
        }
        drop(slot);
        self.gone.store(true, Ordering::Release);
    }
}

/// The watchdog thread and what it watches.
#[derive(Debug)]
pub(super) struct Watchdog {
    liveness: Arc<Liveness>,
    stream: TcpStream,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts heartbeats on `stream` (whose hello and exchanges are over).
    pub(super) fn start(stream: TcpStream, peer_timeout: Duration) -> Result<Self, SessionError> {
        let liveness = Arc::new(Liveness::default());
        let beat = heartbeat(peer_timeout);
        let mut theirs = stream
            .try_clone()
            .map_err(io_error("starting the watchdog"))?;
        theirs
            .set_read_timeout(Some(beat))
            .map_err(io_error("starting the watchdog"))?;
        let watched = Arc::clone(&liveness);
        let thread = std::thread::Builder::new()
            .name("ferroce session watchdog".into())
            .spawn(move || watch(&mut theirs, &watched, beat, peer_timeout))
            .map_err(io_error("starting the watchdog"))?;
        Ok(Self {
            liveness,
            stream,
            thread: Some(thread),
        })
    }

    /// What the watchdog knows.
    pub(super) fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    /// Says bye to the peer, stops the thread and closes the connection. Idempotent.
    pub(super) fn stop(&mut self) {
        self.liveness.stop.store(true, Ordering::SeqCst);
        // Wakes the thread out of its read at once.
        let _ = self.stream.shutdown(Shutdown::Read);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch(stream: &mut TcpStream, liveness: &Liveness, beat: Duration, peer_timeout: Duration) {
    let mut last_heard = Instant::now();
    let mut last_sent: Option<Instant> = None;
    let mut buf = [0u8; 64];
    loop {
        if liveness.stop.load(Ordering::SeqCst) {
            let _ = stream.write_all(&[BYE]);
            return;
        }
        let now = Instant::now();
        if last_sent.is_none_or(|t| now.duration_since(t) >= beat) {
            if let Err(e) = stream.write_all(&[HEARTBEAT]) {
                liveness.mark_gone(format!("the out-of-band connection failed ({e})"));
                return;
            }
            last_sent = Some(now);
        }
        match stream.read(&mut buf) {
            Ok(0) => {
                if !liveness.stop.load(Ordering::SeqCst) {
                    liveness.mark_gone("the peer closed the out-of-band connection".into());
                    return;
                }
            }
            Ok(n) => {
                last_heard = Instant::now();
                if buf[..n].contains(&BYE) {
                    liveness.mark_gone("the peer stopped".into());
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                if !liveness.stop.load(Ordering::SeqCst) {
                    liveness.mark_gone(format!("the out-of-band connection failed ({e})"));
                    return;
                }
            }
        }
        if last_heard.elapsed() > peer_timeout {
            liveness.mark_gone(format!(
                "the peer has been silent for more than {} ms",
                peer_timeout.as_millis()
            ));
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ChannelDesc;
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
