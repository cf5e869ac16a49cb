//! perftest's out-of-band exchange over TCP (protocol.md §6, as perftest 6.06 does it), or,
//! with `-R`, over an RC connection that rdma_cm made ([`super::rdma_cm`]).
//!
//! Every step is symmetric and of the same length both ways: the client writes and then
//! reads, the server reads and then writes. The steps are the version (16 bytes), the cycle
//! buffer and cache line size (4 bytes each, big-endian, when the peer is 5.32 or newer), the
//! MTU (`"%d"` of `enum ibv_mtu`, 2 bytes from 5.31 on), the key lines (`ctx_hand_shake`), the
//! bandwidth report (`xchg_bw_reports`) and the closing key line (`ctx_close_connection`),
//! which TCP follows with `"done\0"`. Over TCP a key line is 108 bytes of text; over rdma_cm
//! each step is one SEND, and a key line is `struct pingpong_dest` itself, 56 bytes,
//! big-endian (`rdma_write_keys`).

use std::io::{self, Read, Write};
use std::net::{Ipv6Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use ferroce::qp::Mtu;

use super::rdma_cm::CmChannel;

/// The version we advertise: Debian 12's perftest, older than 6.28, so that peers skip
/// `negotiate_params`.
pub(super) const VERSION: &str = "6.06";

/// The length of a key line with a GID: 107 characters and a NUL.
pub(super) const KEY_LINE_LEN: usize = 108;

/// The length of a key line over rdma_cm: `struct pingpong_dest` as it lies in memory.
pub(super) const KEY_STRUCT_LEN: usize = 56;

/// What `ctx_close_connection` writes after its last key line (over TCP).
const DONE: &[u8; 5] = b"done\0";

/// One side's key line: `struct pingpong_dest` as `ethernet_write_keys` prints it,
/// `LID:OUT_READS:QPN:PSN:RKEY:VADDR:GID(16 × %02x:):SRQN:`, or as `rdma_write_keys` sends it.
/// The default, all zeros, is the key line perftest's `-R` exchanges around the connection of
/// its queue pairs, before it has filled its own in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct KeyLine {
    /// The LID; 0 on RoCE.
    pub(super) lid: u16,
    /// READs and atomics this side lets the peer keep outstanding.
    pub(super) out_reads: u32,
    /// The queue pair number.
    pub(super) qpn: u32,
    /// The first PSN.
    pub(super) psn: u32,
    /// The remote key of the buffer.
    pub(super) rkey: u32,
    /// The buffer address peers target.
    pub(super) vaddr: u64,
    /// The GID: IPv4-mapped or IPv6.
    pub(super) gid: [u8; 16],
    /// The SRQ number (0: none).
    pub(super) srqn: u32,
    /// The GID index (sent over rdma_cm only).
    pub(super) gid_index: u32,
}

impl KeyLine {
    /// The 108 bytes on the wire.
    pub(super) fn to_wire(self) -> [u8; KEY_LINE_LEN] {
        let mut text = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for byte in self.gid {
            text.push_str(&format!("{byte:02x}:"));
        }
        text.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; KEY_LINE_LEN];
        let n = text.len().min(KEY_LINE_LEN - 1);
        out[..n].copy_from_slice(&text.as_bytes()[..n]);
        out
    }

    /// Parses a peer's key line, as leniently as perftest's `strtol` does.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, String> {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
        let fields: Vec<&str> = text.split(':').collect();
        let bad = || format!("Couldn't parse line <{text}>");
        if fields.len() < 23 {
            return Err(bad());
        }
        let hex = |s: &str| u64::from_str_radix(s.trim(), 16).map_err(|_| bad());
        let mut gid = [0u8; 16];
        for (i, byte) in gid.iter_mut().enumerate() {
            *byte = hex(fields[6 + i])? as u8;
        }
        Ok(Self {
            lid: hex(fields[0])? as u16,
            out_reads: hex(fields[1])? as u32,
            qpn: hex(fields[2])? as u32 & 0x00ff_ffff,
            psn: hex(fields[3])? as u32 & 0x00ff_ffff,
            rkey: hex(fields[4])? as u32,
            vaddr: hex(fields[5])?,
            gid,
            srqn: hex(fields[22])? as u32,
            gid_index: 0,
        })
    }

    /// The 56 bytes over rdma_cm: every field big-endian, the 4 bytes of padding before the
    /// address zero (`rdma_write_keys`).
    pub(super) fn to_struct(self) -> [u8; KEY_STRUCT_LEN] {
        let mut out = [0u8; KEY_STRUCT_LEN];
        out[0..4].copy_from_slice(&u32::from(self.lid).to_be_bytes());
        out[4..8].copy_from_slice(&self.out_reads.to_be_bytes());
        out[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        out[12..16].copy_from_slice(&self.psn.to_be_bytes());
        out[16..20].copy_from_slice(&self.rkey.to_be_bytes());
        out[24..32].copy_from_slice(&self.vaddr.to_be_bytes());
        out[32..48].copy_from_slice(&self.gid);
        out[48..52].copy_from_slice(&self.srqn.to_be_bytes());
        out[52..56].copy_from_slice(&self.gid_index.to_be_bytes());
        out
    }

    /// Reads a peer's 56 bytes, as `rdma_read_keys` does (it leaves the padding, and perftest
    /// the SRQ number and GID index, unread).
    pub(super) fn parse_struct(bytes: &[u8]) -> Result<Self, String> {
        let Some(b) = bytes.get(..KEY_STRUCT_LEN) else {
            return Err(format!("A key line of {} bytes, not 56", bytes.len()));
        };
        let be32 = |at: usize| u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        Ok(Self {
            lid: be32(0) as u16,
            out_reads: be32(4),
            qpn: be32(8) & 0x00ff_ffff,
            psn: be32(12) & 0x00ff_ffff,
            rkey: be32(16),
            vaddr: u64::from_be_bytes(b[24..32].try_into().expect("8 bytes")),
            gid: b[32..48].try_into().expect("16 bytes"),
            srqn: be32(48),
            gid_index: be32(52),
        })
    }

    /// The GID as an address.
    pub(super) fn gid_addr(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.gid)
    }
}

/// A bandwidth report as `xchg_bw_reports` sends it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct BwReport {
    /// Message size in bytes.
    pub(super) size: u64,
    /// Iterations (per queue pair).
    pub(super) iters: u64,
    /// Peak bandwidth, in the report's unit.
    pub(super) peak: f64,
    /// Average bandwidth, in the report's unit.
    pub(super) avg: f64,
    /// Message rate in Mpps.
    pub(super) msg_rate: f64,
}

/// The connection of the exchange and what it learnt about the peer.
#[derive(Debug)]
pub(super) struct Comm {
    channel: OobChannel,
    client: bool,
    remote_version: String,
}

/// The out-of-band channel the exchange runs over: perftest's TCP connection, or with `-R`
/// the control connection rdma_cm made.
#[derive(Debug)]
enum OobChannel {
    /// perftest's default: a TCP connection.
    Tcp(TcpStream),
    /// `-R`: SENDs over an RC connection made by rdma_cm.
    Cm(Box<CmChannel>),
}

const XCHG_FAILED: &str = "Failed to exchange data between server and clients";

impl Comm {
    /// The client's side: connects to the server.
    pub(super) fn connect(server: &str, port: u16) -> Result<Self, String> {
        let stream = TcpStream::connect((server, port))
            .map_err(|e| format!("Couldn't connect to {server}:{port} ({e})"))?;
        let _ = stream.set_nodelay(true);
        Ok(Self {
            channel: OobChannel::Tcp(stream),
            client: true,
            remote_version: String::new(),
        })
    }

    /// `-R`: the exchange over `cm`'s control connection.
    pub(super) fn over_rdma_cm(cm: CmChannel) -> Self {
        Self {
            client: cm.is_client(),
            channel: OobChannel::Cm(Box::new(cm)),
            remote_version: String::new(),
        }
    }

    /// The rdma_cm side of the exchange, with `-R`.
    pub(super) fn rdma_cm(&mut self) -> Option<&mut CmChannel> {
        match &mut self.channel {
            OobChannel::Cm(cm) => Some(cm),
            OobChannel::Tcp(_) => None,
        }
    }

    /// The server's side: listens on `port` (printing perftest's banner once listening) and
    /// takes one client.
    pub(super) fn accept(port: u16) -> Result<Self, String> {
        let listener = TcpListener::bind(("::", port))
            .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
            .map_err(|e| format!("Couldn't listen to port {port} ({e})"))?;
        super::print_banner();
        let (stream, _) = listener
            .accept()
            .map_err(|e| format!("accept() failed ({e})"))?;
        let _ = stream.set_nodelay(true);
        Ok(Self {
            channel: OobChannel::Tcp(stream),
            client: false,
            remote_version: String::new(),
        })
    }

    fn remote_at_least(&self, version: f64) -> bool {
        atof(&self.remote_version) >= version - 1e-9
    }

    /// `ctx_xchg_data`: the client writes then reads, the server reads then writes; over
    /// rdma_cm each write is one SEND and each read one receive.
    fn xchg(&mut self, mine: &[u8], theirs: &mut [u8]) -> io::Result<()> {
        match (&mut self.channel, self.client) {
            (OobChannel::Tcp(stream), true) => {
                stream.write_all(mine)?;
                stream.read_exact(theirs)
            }
            (OobChannel::Tcp(stream), false) => {
                stream.read_exact(theirs)?;
                stream.write_all(mine)
            }
            (OobChannel::Cm(cm), true) => {
                cm.send(mine)?;
                cm.recv(theirs)
            }
            (OobChannel::Cm(cm), false) => {
                cm.recv(theirs)?;
                cm.send(mine)
            }
        }
    }

    /// `exchange_versions`: 16 bytes, NUL-padded.
    pub(super) fn exchange_versions(&mut self) -> Result<(), String> {
        let mut mine = [0u8; 16];
        mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; 16];
        self.xchg(&mine, &mut theirs)
            .map_err(|e| format!(" {XCHG_FAILED} (versions: {e})"))?;
        let end = theirs.iter().position(|&b| b == 0).unwrap_or(16);
        self.remote_version = String::from_utf8_lossy(&theirs[..end]).into_owned();
        Ok(())
    }

    /// `check_sys_data`: cycle buffer and cache line size, each side takes the larger, when
    /// the peer is 5.32 or newer.
    pub(super) fn check_sys_data(&mut self, cycle: u32, cache: u32) -> Result<(u32, u32), String> {
        if !self.remote_at_least(5.32) {
            return Ok((cycle, cache));
        }
        let mut theirs = [0u8; 4];
        self.xchg(&cycle.to_be_bytes(), &mut theirs).map_err(|e| {
            format!(" Failed to exchange Page Size data between server and client ({e})")
        })?;
        let rem_cycle = u32::from_be_bytes(theirs);
        self.xchg(&cache.to_be_bytes(), &mut theirs).map_err(|e| {
            format!(" Failed to exchange Cache Line Size data between server and client ({e})")
        })?;
        let rem_cache = u32::from_be_bytes(theirs);
        Ok((cycle.max(rem_cycle), cache.max(rem_cache)))
    }

    /// `check_mtu`: the MTU enum as text, the smaller valid one wins (from 5.1 on; 2 bytes
    /// from 5.31 on, `sizeof(int)` before).
    pub(super) fn check_mtu(&mut self, mine: Mtu) -> Result<Mtu, String> {
        if !self.remote_at_least(5.1) {
            return Ok(mine);
        }
        let len = if self.remote_at_least(5.31) { 2 } else { 4 };
        let mut out = [0u8; 4];
        out[0] = b'0' + mine.ibv_value();
        let mut theirs = [0u8; 4];
        self.xchg(&out[..len], &mut theirs[..len])
            .map_err(|e| format!(" {XCHG_FAILED} (MTU: {e})"))?;
        let end = theirs[..len].iter().position(|&b| b == 0).unwrap_or(len);
        let rem: i64 = String::from_utf8_lossy(&theirs[..end])
            .trim()
            .parse()
            .unwrap_or(0);
        let theirs = Mtu::from_ibv_value(rem);
        Ok(theirs.map_or(mine, |t| t.min(mine)))
    }

    /// `ctx_hand_shake`: one key line each way, as text over TCP, as the struct over rdma_cm.
    pub(super) fn hand_shake(&mut self, mine: &KeyLine) -> Result<KeyLine, String> {
        let cm = matches!(self.channel, OobChannel::Cm(_));
        let (ours, len) = if cm {
            (mine.to_struct().to_vec(), KEY_STRUCT_LEN)
        } else {
            (mine.to_wire().to_vec(), KEY_LINE_LEN)
        };
        let mut theirs = vec![0u8; len];
        self.xchg(&ours, &mut theirs).map_err(|e| {
            let what = if e.kind() == io::ErrorKind::UnexpectedEof {
                "the peer closed the connection".to_owned()
            } else {
                e.to_string()
            };
            format!(" {XCHG_FAILED} ({what})")
        })?;
        if cm {
            KeyLine::parse_struct(&theirs)
        } else {
            KeyLine::parse(&theirs)
        }
    }

    /// `xchg_bw_reports`: size, iterations, peak, average and message rate, each a big-endian
    /// 8-byte value (iterations 4 bytes for peers older than 5.33).
    pub(super) fn xchg_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, String> {
        let fail = |e: io::Error| format!(" {XCHG_FAILED} (reports: {e})");
        let mut theirs = [0u8; 8];
        self.xchg(&mine.size.to_be_bytes(), &mut theirs)
            .map_err(fail)?;
        let size = u64::from_be_bytes(theirs);
        let iters = if self.remote_at_least(5.33) {
            self.xchg(&mine.iters.to_be_bytes(), &mut theirs)
                .map_err(fail)?;
            u64::from_be_bytes(theirs)
        } else {
            let mut four = [0u8; 4];
            self.xchg(&(mine.iters as u32).to_be_bytes(), &mut four)
                .map_err(fail)?;
            u64::from(u32::from_be_bytes(four))
        };
        let mut double = |value: f64| -> Result<f64, String> {
            let mut theirs = [0u8; 8];
            self.xchg(&value.to_bits().to_be_bytes(), &mut theirs)
                .map_err(fail)?;
            Ok(f64::from_bits(u64::from_be_bytes(theirs)))
        };
        let peak = double(mine.peak)?;
        let avg = double(mine.avg)?;
        let msg_rate = double(mine.msg_rate)?;
        Ok(BwReport {
            size,
            iters,
            peak,
            avg,
            msg_rate,
        })
    }

    /// `ctx_close_connection`: a last key line each way, then over TCP `"done\0"` and close.
    /// perftest never reads the peer's `"done"`; we drain it (briefly) so that closing sends no
    /// reset. Over rdma_cm the connections close instead ([`CmChannel::close`]).
    pub(super) fn close_connection(mut self, mine: &KeyLine) -> Result<(), String> {
        self.hand_shake(mine)
            .map_err(|e| format!("{e}\nFailed to close connection between server and client"))?;
        if let OobChannel::Tcp(stream) = &mut self.channel {
            stream
                .write_all(DONE)
                .map_err(|e| format!("Couldn't write to socket ({e})"))?;
        }
        self.finish();
        Ok(())
    }

    /// Ends the connection without a closing handshake (the latency tests that have none):
    /// says we are done (FIN) and waits, a while at most, for the peer to say so too, so that
    /// neither side's NIC goes away while the other still needs its acknowledgements. Over
    /// rdma_cm the connections close as perftest closes them ([`CmChannel::close`]).
    pub(super) fn finish(self) {
        let stream = match self.channel {
            OobChannel::Tcp(stream) => stream,
            OobChannel::Cm(cm) => return cm.close(),
        };
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sink = [0u8; 256];
        let mut stream = &stream;
        while Instant::now() < deadline {
            match stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    }

    /// Whether the peer has written something or closed the connection: how a side that
    /// cannot know the iteration count (duration mode, an echoing server) learns that the
    /// other side has stopped.
    pub(super) fn peer_spoke(&self) -> bool {
        let stream = match &self.channel {
            OobChannel::Tcp(stream) => stream,
            OobChannel::Cm(cm) => return cm.peer_spoke(),
        };
        if stream.set_nonblocking(true).is_err() {
            return true;
        }
        let mut byte = [0u8; 1];
        let spoke = match stream.peek(&mut byte) {
            Ok(_) => true,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        };
        let _ = stream.set_nonblocking(false);
        spoke
    }
}

/// C's `atof` for version strings: the leading number, 0 if none.
fn atof(text: &str) -> f64 {
    let end = text
        .char_indices()
        .take_while(|&(i, c)| c.is_ascii_digit() || (c == '.' && !text[..i].contains('.')))
        .last()
        .map_or(0, |(i, c)| i + c.len_utf8());
    text[..end].parse().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_line_of_the_capture() {
        let wire = b"0000:0001:000035:b0f50e:00001acf:000055ba7c2e5000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:";
        let key = KeyLine::parse(wire).unwrap();
        assert_eq!(key.qpn, 0x35);
        assert_eq!(key.psn, 0xb0f50e);
        assert_eq!(key.rkey, 0x1acf);
        assert_eq!(key.vaddr, 0x55ba_7c2e_5000);
        assert_eq!(key.out_reads, 1);
        assert_eq!(
            key.gid_addr().to_ipv4_mapped(),
            Some("10.77.0.12".parse().unwrap())
        );
        let round = key.to_wire();
        assert_eq!(&round[..107], &wire[..]);
        assert_eq!(round[107], 0);
    }

    #[test]
    fn the_key_struct_is_big_endian_with_padding_before_the_address() {
        let key = KeyLine {
            lid: 0,
            out_reads: 0x80,
            qpn: 0x11,
            psn: 0x00ab_cdef,
            rkey: 0x1234,
            vaddr: 0x55ba_7c2e_5000,
            gid: "::ffff:10.77.0.11".parse::<Ipv6Addr>().unwrap().octets(),
            srqn: 0,
            gid_index: 1,
        };
        let bytes = key.to_struct();
        assert_eq!(
            &bytes[..24],
            &[
                0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0x11, 0, 0xab, 0xcd, 0xef, 0, 0, 0x12, 0x34, 0,
                0, 0, 0
            ]
        );
        assert_eq!(&bytes[24..32], &[0, 0, 0x55, 0xba, 0x7c, 0x2e, 0x50, 0]);
        assert_eq!(&bytes[32..48], &key.gid);
        assert_eq!(&bytes[48..], &[0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(KeyLine::parse_struct(&bytes).unwrap(), key);
        assert_eq!(KeyLine::default().to_struct(), [0; KEY_STRUCT_LEN]);
        assert!(KeyLine::parse_struct(&bytes[..40]).is_err());
    }

    #[test]
    fn versions_compare_as_perftest_does() {
        assert!((atof("6.06") - 6.06).abs() < 1e-9);
        assert!((atof("5.33\0") - 5.33).abs() < 1e-9);
        assert!(atof("junk") == 0.0);
        assert!((atof("6.1.2") - 6.1).abs() < 1e-9);
    }
}
