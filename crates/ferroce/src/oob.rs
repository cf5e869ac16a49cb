//! The out-of-band TCP connection the session and the cache open before any RDMA: one side
//! listens, the other dials until a deadline, and they trade one-line hellos of the form
//! `name/version key=value …`. Errors here say what went wrong at the socket level; each
//! face names the steps in its own words ([`OpenWords`]) and its error type says how they
//! become its errors ([`FaceError`]).
//!
//! [`connect_rc`] is the bring-up both faces share on top of it: the NIC, the connection, the
//! face's hello, an RC queue pair and its endpoint exchange, connected at the smaller MTU.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use ferroce_proto::qp::{ModifyError, Mtu, QpCaps, QpType};

use crate::exchange::{ExchangeError, PeerInfo};
use crate::{ConnectOptions, Cq, Faults, Nic, NicError, Qp};

/// The longest line accepted.
pub(crate) const MAX_LINE: usize = 256;

/// Why [`open`] found no peer.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// Nobody came (or answered) within the timeout.
    TimedOut,
    /// The address could not be listened on.
    Listen(io::Error),
    /// Accepting the peer failed.
    Accept(io::Error),
    /// Dialling failed other than by the peer not listening yet.
    Connect(io::Error),
    /// The connection could not be configured.
    Configure(io::Error),
}

/// A face's error type, as the out-of-band steps build it.
pub(crate) trait FaceError {
    /// How the face names the steps of [`open`].
    const OPEN_WORDS: OpenWords;
    /// Nothing came within `after` while `what` was under way.
    fn timed_out(what: &'static str, after: Duration) -> Self;
    /// The socket failed while `what` was under way.
    fn io(what: &'static str, source: io::Error) -> Self;
}

/// How a face names the steps of [`open`] in its errors.
#[derive(Debug)]
pub(crate) struct OpenWords {
    /// Listening, when nobody came in time.
    pub(crate) waiting: &'static str,
    /// Dialling, when nobody answered in time or the dial failed.
    pub(crate) dialling: &'static str,
    /// Binding the listener.
    pub(crate) listening: &'static str,
    /// Accepting the peer.
    pub(crate) accepting: &'static str,
    /// Configuring the connection.
    pub(crate) configuring: &'static str,
}

impl OpenError {
    /// The face's error for this one, for a side that listened (or dialled) for `timeout`.
    pub(crate) fn into_face_error<E: FaceError>(self, listen: bool, timeout: Duration) -> E {
        let words = &E::OPEN_WORDS;
        match self {
            Self::TimedOut if listen => E::timed_out(words.waiting, timeout),
            Self::TimedOut => E::timed_out(words.dialling, timeout),
            Self::Listen(source) => E::io(words.listening, source),
            Self::Accept(source) => E::io(words.accepting, source),
            Self::Connect(source) => E::io(words.dialling, source),
            Self::Configure(source) => E::io(words.configuring, source),
        }
    }
}

/// Opens the connection: listens on `addr` and takes one peer, or dials it again and again
/// (the peer may start later) until `timeout`. The stream blocks, reads time out after
/// `timeout`, and Nagle is off.
pub(crate) fn open(
    listen: bool,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, OpenError> {
    let deadline = Instant::now() + timeout;
    let stream = if listen {
        let listener = TcpListener::bind(addr).map_err(OpenError::Listen)?;
        listener.set_nonblocking(true).map_err(OpenError::Listen)?;
        loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(OpenError::TimedOut);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(OpenError::Accept(e)),
            }
        }
    } else {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
                Ok(stream) => break stream,
                Err(e)
                    if Instant::now() < deadline
                        && matches!(
                            e.kind(),
                            io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
                        ) =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) if e.kind() == io::ErrorKind::TimedOut || Instant::now() >= deadline => {
                    return Err(OpenError::TimedOut)
                }
                Err(e) => return Err(OpenError::Connect(e)),
            }
        }
    };
    stream
        .set_nonblocking(false)
        .map_err(OpenError::Configure)?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(OpenError::Configure)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// What a face asks of [`connect_rc`].
#[derive(Debug)]
pub(crate) struct RcPlan<'a> {
    /// The device (`ferroce0` or a verbs device).
    pub(crate) device: &'a str,
    /// Its port.
    pub(crate) ib_port: u8,
    /// The local address the queue pair sends from.
    pub(crate) local: SocketAddr,
    /// Faults the soft NIC injects on what it sends.
    pub(crate) faults: Option<Faults>,
    /// Where the soft NIC writes a capture of what it sends and receives.
    pub(crate) pcap: Option<&'a Path>,
    /// Whether this side listens on `oob` (or dials it).
    pub(crate) listen: bool,
    /// The out-of-band address.
    pub(crate) oob: SocketAddr,
    /// How long to wait for the peer, and for each of its lines.
    pub(crate) timeout: Duration,
    /// The MTU this side offers; the NIC's active MTU when `None`.
    pub(crate) mtu: Option<Mtu>,
    /// The send completion queue's depth.
    pub(crate) send_cq: usize,
    /// The receive completion queue's depth.
    pub(crate) recv_cq: usize,
    /// The queue pair's capacities.
    pub(crate) caps: QpCaps,
    /// How to connect; its MTU gives way to the one both sides support.
    pub(crate) options: ConnectOptions,
}

/// An RC queue pair connected to one peer, with what it was made from.
#[derive(Debug)]
pub(crate) struct RcConnection {
    /// The NIC.
    pub(crate) nic: Nic,
    /// The out-of-band connection, its hello and exchange over.
    pub(crate) stream: TcpStream,
    /// The queue pair's send completion queue.
    pub(crate) send_cq: Cq,
    /// Its receive completion queue.
    pub(crate) recv_cq: Cq,
    /// The queue pair, ready to send.
    pub(crate) qp: Qp,
}

/// Brings up an RC queue pair to one peer: opens the NIC and the out-of-band connection, runs
/// the face's `hello` (given this side's MTU, it trades hellos and returns the peer's MTU and
/// whatever else the face learnt), makes the CQs and the queue pair, trades endpoints with
/// [`PeerInfo`], and connects at the smaller of the two MTUs.
pub(crate) fn connect_rc<E, T>(
    plan: &RcPlan<'_>,
    hello: impl FnOnce(&mut TcpStream, Mtu) -> Result<(Mtu, T), E>,
) -> Result<(RcConnection, T), E>
where
    E: FaceError + From<NicError> + From<ExchangeError> + From<ModifyError>,
{
    let nic = Nic::open_for_face(
        plan.device,
        plan.ib_port,
        plan.local,
        plan.faults,
        plan.pcap,
    )?;
    let mut stream = open(plan.listen, plan.oob, plan.timeout)
        .map_err(|e| e.into_face_error::<E>(plan.listen, plan.timeout))?;
    let ours = plan.mtu.unwrap_or_else(|| nic.active_mtu());
    let (theirs, learnt) = hello(&mut stream, ours)?;
    let send_cq = Cq::new(&nic, plan.send_cq)?;
    let recv_cq = Cq::new(&nic, plan.recv_cq)?;
    let qp = Qp::new(&nic, QpType::Rc, &send_cq, &recv_cq, plan.caps)?;
    let mine = PeerInfo {
        endpoint: qp.endpoint(),
        regions: Vec::new(),
    };
    let peer = mine.exchange(&mut stream)?;
    let options = ConnectOptions {
        mtu: theirs.min(ours),
        ..plan.options
    };
    qp.connect(&peer.endpoint, &options)?;
    let connection = RcConnection {
        nic,
        stream,
        send_cq,
        recv_cq,
        qp,
    };
    Ok((connection, learnt))
}

/// Why [`read_line`] returned no line.
#[derive(Debug)]
pub(crate) enum LineError {
    /// The peer closed the connection.
    Closed,
    /// The peer said nothing within the read timeout.
    Silent,
    /// The line ran past [`MAX_LINE`] bytes.
    TooLong,
    /// The socket failed.
    Io(io::Error),
}

/// Reads one `\n`-terminated line (without it).
pub(crate) fn read_line(stream: &mut TcpStream) -> Result<String, LineError> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => return Err(LineError::Closed),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => line.push(byte[0]),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(LineError::Silent)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(LineError::Io(e)),
        }
        if line.len() > MAX_LINE {
            return Err(LineError::TooLong);
        }
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Writes `line` and its `\n` in one write.
pub(crate) fn write_line(stream: &mut TcpStream, line: &str) -> io::Result<()> {
    let mut bytes = Vec::with_capacity(line.len() + 1);
    bytes.extend_from_slice(line.as_bytes());
    bytes.push(b'\n');
    stream.write_all(&bytes)
}

/// The version of a hello line that starts `name/<version>`.
pub(crate) fn version(line: &str, name: &str) -> Option<u32> {
    line.split_whitespace()
        .next()?
        .strip_prefix(name)?
        .strip_prefix('/')?
        .parse()
        .ok()
}

/// The value of `key=` in a line of `key=value` words.
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that says which word it was given.
    #[derive(Debug, PartialEq)]
    struct Said(String);

    impl FaceError for Said {
        const OPEN_WORDS: OpenWords = OpenWords {
            waiting: "waiting",
            dialling: "dialling",
            listening: "listening",
            accepting: "accepting",
            configuring: "configuring",
        };

        fn timed_out(what: &'static str, after: Duration) -> Self {
            Self(format!("{what} for {} ms", after.as_millis()))
        }

        fn io(what: &'static str, source: io::Error) -> Self {
            Self(format!("{what}: {source}"))
        }
    }

    #[test]
    fn open_errors_take_the_faces_words() {
        let timeout = Duration::from_millis(7);
        let said = |e: OpenError, listen| e.into_face_error::<Said>(listen, timeout).0;
        let os = || io::Error::other("no");
        assert_eq!(said(OpenError::TimedOut, true), "waiting for 7 ms");
        assert_eq!(said(OpenError::TimedOut, false), "dialling for 7 ms");
        assert_eq!(said(OpenError::Listen(os()), true), "listening: no");
        assert_eq!(said(OpenError::Accept(os()), true), "accepting: no");
        assert_eq!(said(OpenError::Connect(os()), false), "dialling: no");
        assert_eq!(said(OpenError::Configure(os()), false), "configuring: no");
    }

    #[test]
    fn hello_lines_parse() {
        let line = "ferroce-cache/3 max_message=4096 mtu=1024";
        assert_eq!(version(line, "ferroce-cache"), Some(3));
        assert_eq!(version(line, "ferroce-session"), None);
        assert_eq!(version("ferroce-cache/x", "ferroce-cache"), None);
        assert_eq!(field(line, "mtu"), Some("1024"));
        assert_eq!(field(line, "max_message"), Some("4096"));
        assert_eq!(field(line, "max"), None);
        assert_eq!(field(line, "role"), None);
    }
}
