//! The device side: a [`Sender`] streams frames into a receiver's pages exactly as a sensor
//! bridge does (hololink.md §1), so the whole pipeline runs and is tested without hardware.
//!
//! Each packet is a UC RDMA WRITE ONLY with its own RETH; the frame ends with a WRITE ONLY
//! WITH IMMEDIATE carrying the metadata block at `round_up(frame_size, 128)` of the page,
//! either alone (as the FPGA sends it) or folded behind the frame's tail (as the bridge's
//! emulator does). PSNs run on across frames and pages rotate. Packets leave through the
//! datagram layer ([`crate::udp`]): an unconnected socket with DF set, so IPv4 carries ID 0 and
//! the ICRC is computed over exactly what the receiver sees, and runs of equal-sized packets as
//! UDP GSO sends, each segment's ICRC sealed for the ID the kernel gives it.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferroce_proto::wire::{icrc, Bth, IpHeader, Opcode, PacketRepr, Qpn, Reth, UdpHeader};
use ferroce_proto::Psn;

use super::metadata::{round_up, ImmediateLayout, Metadata, FLAG_EARLY_END, METADATA_SIZE};
use crate::udp::{self, tap};
use crate::{Faults, GsoStatus};

/// The most packets a sender hands the datagram layer at once: four GSO sends of 4 KiB
/// segments.
const BURST: usize = 64;

/// The largest payload a RoCE path carries in one packet (IB MTU 4096).
const MAX_PAYLOAD: usize = 4096;

/// Bytes a bridge's data packet adds to its payload on Ethernet: Ethernet 14, IPv4 20, UDP 8,
/// BTH 12, RETH 16, ICRC 4.
const PACKET_OVERHEAD: usize = 74;

/// Where and how a [`Sender`] writes frames: what a device's data channel is programmed with
/// (`DP_QP`, `DP_RKEY`, `DP_PAGE_*`, `DP_MAX_BUFF`, `DP_BUFFER_LENGTH`, `DP_HOST_IP` and
/// `DP_HOST_UDP_PORT`, `DP_PACKET_SIZE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The receiver's NIC: its address and UDP port (4791).
    pub dest: SocketAddr,
    /// The receiver's queue pair.
    pub qp: u32,
    /// The receiver's key.
    pub rkey: u32,
    /// Where page 0 begins in the receiver's address space.
    pub address: u64,
    /// Bytes from one page to the next.
    pub page_size: usize,
    /// Pages to rotate through.
    pub pages: u32,
    /// Bytes of data per frame; the metadata goes at this rounded up to 128.
    pub frame_size: usize,
    /// Payload bytes per packet, a multiple of 128 ([`Target::payload_for_mtu`]).
    pub payload: usize,
    /// How the immediate names the page.
    pub immediate: ImmediateLayout,
    /// Fold the frame's tail, padding and metadata into the frame-ending packet when they
    /// fit (the emulator's habit); otherwise the metadata goes alone (the FPGA's).
    pub fold_metadata: bool,
}

impl Target {
    /// The payload a bridge puts in each packet on a link of `link_mtu` bytes: what is left
    /// after the headers, in 128-byte units, at most the 4096 bytes of a RoCE path MTU
    /// (1408 on a 1500-byte link).
    #[must_use]
    pub const fn payload_for_mtu(link_mtu: usize) -> usize {
        let fit = link_mtu.saturating_sub(PACKET_OVERHEAD) / METADATA_SIZE * METADATA_SIZE;
        if fit > MAX_PAYLOAD {
            MAX_PAYLOAD
        } else {
            fit
        }
    }

    /// Where the metadata block goes in each page.
    #[must_use]
    pub const fn metadata_offset(&self) -> usize {
        round_up(self.frame_size)
    }
}

/// Why a [`Sender`] could not send.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The target cannot be written as a bridge writes.
    #[error("invalid target: {0}")]
    Target(String),
    /// More data than the target's frame size.
    #[error("a frame of {len} bytes exceeds the target's frame size of {frame_size}")]
    FrameTooLarge {
        /// The data offered.
        len: usize,
        /// The target's frame size.
        frame_size: usize,
    },
    /// The socket failed.
    #[error("cannot send from {local}: {source}")]
    Io {
        /// The sender's address.
        local: SocketAddr,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

/// What [`Sender::send_frame`] sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameSent {
    /// The page written.
    pub page: u32,
    /// The frame number in the metadata.
    pub frame_number: u32,
    /// The PSN of the frame-ending packet.
    pub psn: u32,
    /// Packets sent, the frame-ending one included.
    pub packets: u64,
    /// Data bytes sent.
    pub bytes: u64,
    /// The frame's CRC-32 (`crc32fast`'s, over the data bytes).
    pub crc32: u32,
}

/// Test patterns a [`Sender`] fills frames with: each frame's bytes are a function of its
/// frame number, so any receiver can recompute them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pattern {
    /// A counter mixed with the frame number (the default).
    #[default]
    Counter,
    /// Every byte 0.
    Zeros,
}

impl Pattern {
    /// Fills `out` with frame `frame_number`'s bytes.
    pub fn fill(self, frame_number: u32, out: &mut [u8]) {
        self.fill_at(frame_number, 0, out);
    }

    /// Fills `out` with frame `frame_number`'s bytes from offset `at` on: a piece of what
    /// [`Pattern::fill`] writes, for [`Sender::send_frame_filled`].
    pub fn fill_at(self, frame_number: u32, at: usize, out: &mut [u8]) {
        match self {
            Self::Zeros => out.fill(0),
            Self::Counter => {
                let salt = counter_salt(frame_number);
                let (word, skew) = ((at / 8) as u64, at % 8);
                if skew == 0 {
                    counter_words(word, salt, out);
                } else {
                    // The rest of the word `at` falls in, then whole words.
                    let bytes = (counter_word(word) ^ salt).to_le_bytes();
                    let head = (8 - skew).min(out.len());
                    out[..head].copy_from_slice(&bytes[skew..skew + head]);
                    counter_words(word + 1, salt, &mut out[head..]);
                }
            }
        }
    }
}

/// The counter pattern's word `i` of a frame is `counter_word(i) ^ salt`: one salt per
/// frame, so that a frame's CRC follows from frame 0's without reading its bytes
/// ([`PatternCrcs`]).
fn counter_word(i: u64) -> u64 {
    (i ^ 0x2545_f491_4f6c_dd1d).wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

/// The salt of frame `frame_number`'s words; never 0, so no two frames are alike.
fn counter_salt(frame_number: u32) -> u64 {
    (u64::from(frame_number) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Fills `out` with the counter's words from word `first` on, each XORed with `salt`.
fn counter_words(first: u64, salt: u64, out: &mut [u8]) {
    // Whole words as single stores (a copy of a slice of unknown length per word was half
    // of `stream send`'s time), then the tail.
    let mut chunks = out.chunks_exact_mut(8);
    let mut n = first;
    for chunk in &mut chunks {
        chunk.copy_from_slice(&(counter_word(n) ^ salt).to_le_bytes());
        n += 1;
    }
    let tail = chunks.into_remainder();
    let len = tail.len();
    tail.copy_from_slice(&(counter_word(n) ^ salt).to_le_bytes()[..len]);
}

/// The CRC-32s of pieces of [`Pattern`] frames, worked out rather than read: a sender that
/// streams the counter pattern otherwise spends a third of its time on the CRC of every
/// payload (for its ICRC and the frame's CRC). CRC-32 is affine, so for pieces of equal
/// length `crc(a ^ b ^ c) = crc(a) ^ crc(b) ^ crc(c)`: a piece of a counter frame is the
/// counter's words (their CRC kept per offset after the first frame) XOR the frame's salt
/// repeated (one CRC per frame and length) XOR zeros (one per length).
#[derive(Debug, Default)]
pub struct PatternCrcs {
    /// The CRC of the counter's unsalted words, by offset and length.
    words: HashMap<(usize, usize), u32>,
    /// The CRC of `n` zero bytes, by `n`.
    zeros: HashMap<usize, u32>,
    /// The frame whose salts `salts` holds, and the CRC of its salt repeated, by length.
    frame: Option<u32>,
    salts: HashMap<usize, u32>,
    scratch: Vec<u8>,
}

impl PatternCrcs {
    /// A cache with nothing in it yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The CRC-32 (`crc32fast`'s) of `bytes`, which must be what `pattern.fill(frame_number,
    /// …)` wrote at offset `at` of its frame: for the counter pattern at a whole word's
    /// offset, worked out from what is cached (computed once per offset and length); else
    /// read from `bytes`.
    pub fn crc(&mut self, pattern: Pattern, frame_number: u32, at: usize, bytes: &[u8]) -> u32 {
        if pattern != Pattern::Counter || at % 8 != 0 {
            return crc32fast::hash(bytes);
        }
        let len = bytes.len();
        if self.frame != Some(frame_number) {
            self.frame = Some(frame_number);
            self.salts.clear();
        }
        let scratch = &mut self.scratch;
        let mut hash_of = |fill: &dyn Fn(&mut [u8])| {
            scratch.resize(len, 0);
            fill(scratch);
            crc32fast::hash(scratch)
        };
        let words = *self
            .words
            .entry((at, len))
            .or_insert_with(|| hash_of(&|out| counter_words(at as u64 / 8, 0, out)));
        let salt = counter_salt(frame_number).to_le_bytes();
        let salted = *self.salts.entry(len).or_insert_with(|| {
            hash_of(&|out| {
                for (i, b) in out.iter_mut().enumerate() {
                    *b = salt[i % 8];
                }
            })
        });
        let zeros = *self
            .zeros
            .entry(len)
            .or_insert_with(|| hash_of(&|out| out.fill(0)));
        let crc = words ^ salted ^ zeros;
        debug_assert_eq!(
            crc,
            crc32fast::hash(bytes),
            "not the pattern's bytes at {at}"
        );
        crc
    }
}

/// A sensor bridge's data plane in software.
#[derive(Debug)]
pub struct Sender {
    port: udp::Port,
    link: udp::Link,
    local: SocketAddr,
    target: Target,
    psn: Psn,
    page: u32,
    frame_number: u32,
    packet: Vec<u8>,
    scratch: Vec<u8>,
    /// Where [`Sender::send_frame_filled`] has each batch's bytes written.
    batch: Vec<u8>,
    packets_sent: u64,
    window: Option<Window>,
}

/// How many packets a receiver has taken, for [`Sender::set_window`].
pub type Taken = std::sync::Arc<dyn Fn() -> u64 + Send + Sync>;

/// A bound on packets in flight: see [`Sender::set_window`].
struct Window {
    packets: u64,
    taken: Taken,
    /// `taken()` when the window was set.
    base: u64,
    /// `packets_sent` when the window was set.
    sent_base: u64,
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("packets", &self.packets)
            .finish_non_exhaustive()
    }
}

fn now_parts() -> (u64, u32) {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs(), t.subsec_nanos())
}

fn check_target(t: &Target) -> Result<(), SendError> {
    let bad = |what: String| Err(SendError::Target(what));
    if t.payload == 0 || t.payload % METADATA_SIZE != 0 || t.payload > MAX_PAYLOAD {
        return bad(format!(
            "payload {} is not a multiple of 128 from 128 to {MAX_PAYLOAD}",
            t.payload
        ));
    }
    if t.pages == 0 || t.pages > t.immediate.max_pages() {
        return bad(format!(
            "{} pages; 1 to {} with this immediate layout",
            t.pages,
            t.immediate.max_pages()
        ));
    }
    if t.frame_size == 0 || t.page_size < t.metadata_offset() + METADATA_SIZE {
        return bad(format!(
            "a page of {} bytes cannot hold {} bytes of frame and the metadata",
            t.page_size, t.frame_size
        ));
    }
    Ok(())
}

impl Sender {
    /// A sender on `local` (a bridge sends from port [`super::BRIDGE_DATA_PORT`]) writing
    /// to `target`, starting at page 0, frame 0 and PSN 0.
    ///
    /// # Errors
    ///
    /// [`SendError::Target`] for a target no bridge could be programmed with;
    /// [`SendError::Io`] when the socket cannot be opened.
    pub fn new(local: SocketAddr, target: Target) -> Result<Self, SendError> {
        Self::open(local, target, true)
    }

    /// As [`Sender::new`], choosing whether runs of packets may leave as UDP GSO sends
    /// (`gso`; `stream send --no-gso` says `false`). GSO is used only where the path
    /// segments in software and a self-test passes ([`Sender::gso_status`]).
    ///
    /// # Errors
    ///
    /// As [`Sender::new`].
    pub fn open(local: SocketAddr, target: Target, gso: bool) -> Result<Self, SendError> {
        check_target(&target)?;
        let io = |source| SendError::Io { local, source };
        // A frame leaves in a burst; let the kernel queue it rather than refuse it.
        let options = udp::PortOptions {
            gso,
            gro: false,
            buffers: 8 << 20,
        };
        let port = udp::Port::open(local, options).map_err(io)?;
        let local = port.local();
        Ok(Self {
            port,
            link: udp::Link::new(None, None),
            local,
            target,
            psn: Psn::default(),
            page: 0,
            frame_number: 0,
            packet: vec![0; MAX_PAYLOAD + 128],
            scratch: Vec::with_capacity(MAX_PAYLOAD),
            batch: Vec::new(),
            packets_sent: 0,
            window: None,
        })
    }

    /// Whether frames leave by UDP GSO, and if not, why not.
    #[must_use]
    pub fn gso_status(&self) -> GsoStatus {
        self.port.gso_status()
    }

    /// Hands what the batch holds to the datagram layer (bodies from `ext`), and reports the
    /// first send the kernel refused.
    fn transmit(&mut self, ext: &[u8]) -> Result<(), SendError> {
        self.link.transmit(&self.port, Instant::now(), ext);
        match self.port.take_send_error() {
            Some(source) => Err(SendError::Io {
                local: self.local,
                source,
            }),
            None => Ok(()),
        }
    }

    /// The sender's own address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The target it writes to.
    #[must_use]
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Points the sender at a new target (a device reprogrammed); PSN and frame number run
    /// on, the page starts again at 0.
    ///
    /// # Errors
    ///
    /// [`SendError::Target`] as for [`Sender::new`].
    pub fn retarget(&mut self, target: Target) -> Result<(), SendError> {
        check_target(&target)?;
        self.target = target;
        self.page = 0;
        Ok(())
    }

    /// Packets sent so far.
    #[must_use]
    pub fn packets_sent(&self) -> u64 {
        self.packets_sent
    }

    /// Sets the next PSN (a bridge's is wherever its counter stands).
    pub fn set_psn(&mut self, psn: u32) {
        self.psn = Psn::from_low_bits(psn);
    }

    fn emit(
        &mut self,
        opcode: Opcode,
        va: u64,
        imm: Option<u32>,
        payload: &[u8],
    ) -> Result<(), SendError> {
        let t = &self.target;
        let mut repr = PacketRepr::new(Bth::new(opcode, Qpn::from_low_bits(t.qp), self.psn));
        repr.reth = Some(Reth {
            va,
            rkey: t.rkey,
            len: payload.len() as u32,
        });
        repr.imm = imm;
        repr.payload_len = payload.len();
        let io = |source| SendError::Io {
            local: self.local,
            source,
        };
        let len = repr
            .emit(payload, &mut self.packet)
            .map_err(|e| io(io::Error::other(e.to_string())))?;
        let ip = IpHeader::between(self.local.ip(), t.dest.ip())
            .ok_or_else(|| io(io::Error::other("address families differ")))?;
        let udp = UdpHeader {
            src_port: self.local.port(),
            dst_port: t.dest.port(),
        };
        icrc::seal(&ip, &udp, &mut self.packet[..len])
            .map_err(|e| io(io::Error::other(e.to_string())))?;
        self.link.tx.push_copy(t.dest, &self.packet[..len]);
        self.transmit(&[])?;
        self.psn = self.psn.next();
        self.packets_sent += 1;
        Ok(())
    }

    /// Sends `n` WRITE ONLY packets carrying chunks `first..first + n` of a frame to the page
    /// at `base` as one batch (GSO sends where the path allows); `data` is the frame's bytes
    /// from chunk `first` on. Each packet is gathered from its headers, its piece of `data`
    /// and its ICRC, so the payload is never copied in user space. Each payload's CRC-32 is
    /// combined into `frame_crc`, the CRC of the frame's data so far, on the way.
    fn send_batch(
        &mut self,
        base: u64,
        data: &[u8],
        first: usize,
        n: usize,
        frame_crc: &mut u32,
        crc_of: &mut dyn FnMut(usize, &[u8]) -> u32,
    ) -> Result<(), SendError> {
        const HEADERS: usize = Bth::LEN + Reth::LEN;
        let t = self.target;
        let local = self.local;
        let fail = |e: String| SendError::Io {
            local,
            source: io::Error::other(e),
        };
        let ip = IpHeader::between(local.ip(), t.dest.ip())
            .ok_or_else(|| fail("address families differ".into()))?;
        let udp = UdpHeader {
            src_port: local.port(),
            dst_port: t.dest.port(),
        };
        let mut head = [0u8; HEADERS];
        let mut trailer = [0u8; 8];
        let full = icrc::CrcShift::new(t.payload);
        for k in 0..n {
            // The packet's offset in `data`, and in the frame.
            let rel = k * t.payload;
            let end = (rel + t.payload).min(data.len());
            let payload = &data[rel..end];
            let off = first * t.payload + rel;
            let psn = self.psn.add(k as u32);
            let mut repr = PacketRepr::new(Bth::new(
                Opcode::UC_RDMA_WRITE_ONLY,
                Qpn::from_low_bits(t.qp),
                psn,
            ));
            repr.reth = Some(Reth {
                va: base + off as u64,
                rkey: t.rkey,
                len: payload.len() as u32,
            });
            repr.payload_len = payload.len();
            let len = repr
                .emit_headers(&mut head)
                .map_err(|e| fail(e.to_string()))?;
            let pad = usize::from(repr.pad());
            // One pass over the payload serves its ICRC and the frame's CRC (the metadata's).
            let payload_crc = crc_of(off, payload);
            let shift = if payload.len() == full.len() {
                full
            } else {
                icrc::CrcShift::new(payload.len())
            };
            *frame_crc = shift.combine(*frame_crc, payload_crc);
            let icrc = icrc::compute_with_payload_crc(
                &ip,
                &udp,
                &head[..len],
                payload_crc,
                &shift,
                &[0; 3][..pad],
            )
            .map_err(|e| fail(e.to_string()))?;
            trailer[..pad].fill(0);
            trailer[pad..pad + 4].copy_from_slice(&icrc.to_le_bytes());
            self.link
                .tx
                .push_gathered(t.dest, &head[..len], rel..end, &trailer[..pad + 4]);
        }
        self.transmit(data)?;
        self.psn = self.psn.add(n as u32);
        self.packets_sent += n as u64;
        Ok(())
    }

    /// Keeps at most `packets` packets in flight: before each burst the sender waits until
    /// `taken` (how many packets the receiver has taken so far) has caught up. A bridge on a
    /// real link is paced by the link; on loopback the only buffer is the receiver's socket,
    /// which for an unprivileged process is `net.core.rmem_max` (208 KiB on Debian), a
    /// fraction of a millisecond of a multi-gigabit stream. The demo uses this; a lost packet
    /// never blocks the sender for more than 100 ms. `None` removes the bound.
    pub fn set_window(&mut self, window: Option<(u32, Taken)>) {
        self.window = window.map(|(packets, taken)| Window {
            packets: u64::from(packets.max(1)),
            base: taken(),
            sent_base: self.packets_sent,
            taken,
        });
    }

    /// Waits until `n` more packets fit in the window, if there is one.
    fn wait_window(&self, n: u64) {
        let Some(w) = &self.window else {
            return;
        };
        let deadline = Instant::now() + Duration::from_millis(100);
        while (self.packets_sent - w.sent_base + n)
            > ((w.taken)().saturating_sub(w.base) + w.packets)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Injects `faults` (loss, duplication, reordering, corruption, delay) into every packet
    /// sent from now on, as `--fault` does; `None` stops.
    pub fn set_faults(&mut self, faults: Option<Faults>) {
        self.link.set_faults(faults);
    }

    /// Writes every packet sent from now on to a pcap capture at `path` (`--pcap`), with the
    /// IP and UDP headers the socket adds, so its ICRCs verify in tshark and `ferroce
    /// decode`.
    ///
    /// # Errors
    ///
    /// [`SendError::Io`] when the file cannot be created.
    pub fn set_pcap(&mut self, path: &std::path::Path) -> Result<(), SendError> {
        let pcap = tap::PcapWriter::create(path).map_err(|source| SendError::Io {
            local: self.local,
            source,
        })?;
        self.link.set_pcap(pcap);
        Ok(())
    }

    /// Sends every packet fault injection still holds back, waiting until each is due, and
    /// flushes the capture.
    ///
    /// # Errors
    ///
    /// [`SendError::Io`] when the socket fails.
    pub fn flush(&mut self) -> Result<(), SendError> {
        while let Some(due) = self.link.next_due() {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            self.transmit(&[])?;
        }
        self.link.flush_capture().map_err(|source| SendError::Io {
            local: self.local,
            source,
        })
    }

    /// Sends one frame of `data` (at most the target's frame size; less is an early end,
    /// flagged in the metadata) into the next page, spreading its packets evenly over
    /// `pace` when given (a sensor delivers a frame over its readout time), else as fast as
    /// the socket takes them.
    ///
    /// # Errors
    ///
    /// [`SendError::FrameTooLarge`]; [`SendError::Io`] when the socket fails.
    pub fn send_frame(
        &mut self,
        data: &[u8],
        pace: Option<Duration>,
    ) -> Result<FrameSent, SendError> {
        self.send_frame_with(data, pace, &mut |_, bytes| crc32fast::hash(bytes))
    }

    /// [`Sender::send_frame`] where `crc_of(offset, bytes)` gives the CRC-32 of each piece of
    /// `data` (its ICRC's and the frame CRC's part), for a caller that knows them without
    /// reading the bytes: [`PatternCrcs::crc`] for frames of a [`Pattern`]. A wrong CRC
    /// makes the receiver drop the packet (an ICRC error) or count a content error.
    ///
    /// # Errors
    ///
    /// As [`Sender::send_frame`].
    pub fn send_frame_with(
        &mut self,
        data: &[u8],
        pace: Option<Duration>,
        crc_of: &mut dyn FnMut(usize, &[u8]) -> u32,
    ) -> Result<FrameSent, SendError> {
        self.send_frame_of(FrameBytes::Slice(data), pace, crc_of)
    }

    /// [`Sender::send_frame_with`] for a frame of `len` bytes that `fill(offset, piece)`
    /// writes a batch of packets (at most 64) at a time, just before the batch leaves, as a
    /// sensor reads its lines out: the socket then copies bytes that are still in the cache,
    /// where a whole 4K frame written first (12 MB) has left it by the time it is sent, and
    /// is read from memory again. `stream send` sends its patterns so ([`Pattern::fill_at`]).
    ///
    /// # Errors
    ///
    /// As [`Sender::send_frame`], with `len` for the length of the data.
    pub fn send_frame_filled(
        &mut self,
        len: usize,
        pace: Option<Duration>,
        fill: &mut dyn FnMut(usize, &mut [u8]),
        crc_of: &mut dyn FnMut(usize, &[u8]) -> u32,
    ) -> Result<FrameSent, SendError> {
        self.send_frame_of(FrameBytes::Filled { len, fill }, pace, crc_of)
    }

    fn send_frame_of(
        &mut self,
        mut bytes: FrameBytes<'_>,
        pace: Option<Duration>,
        crc_of: &mut dyn FnMut(usize, &[u8]) -> u32,
    ) -> Result<FrameSent, SendError> {
        let mut batch = std::mem::take(&mut self.batch);
        let sent = self.send_frame_into(&mut bytes, &mut batch, pace, crc_of);
        self.batch = batch;
        sent
    }

    /// Sends the frame, the bytes of each batch from `bytes` (filled into `batch` if
    /// they are to be filled).
    fn send_frame_into(
        &mut self,
        bytes: &mut FrameBytes<'_>,
        batch: &mut Vec<u8>,
        pace: Option<Duration>,
        crc_of: &mut dyn FnMut(usize, &[u8]) -> u32,
    ) -> Result<FrameSent, SendError> {
        let t = self.target;
        let len = bytes.len();
        if len > t.frame_size {
            return Err(SendError::FrameTooLarge {
                len,
                frame_size: t.frame_size,
            });
        }
        let (timestamp_s, timestamp_ns) = now_parts();
        let start = Instant::now();
        let page = self.page;
        let base = t.address.wrapping_add(u64::from(page) * t.page_size as u64);
        let md_offset = t.metadata_offset();
        let chunks = len.div_ceil(t.payload);
        let total = chunks as u64 + 1;
        let first_psn = self.psn;
        let mut sent = 0u64;
        let pace_to = |sent: u64| {
            if let Some(pace) = pace {
                let due = start + pace.mul_f64(sent as f64 / total as f64);
                let now = Instant::now();
                if due > now + Duration::from_micros(200) {
                    std::thread::sleep(due - now);
                }
            }
        };
        // The last chunk folds into the frame-ending packet when it, the pad to the
        // metadata offset and the metadata fit in one payload.
        let tail_len = len - chunks.saturating_sub(1) * t.payload;
        let fold = t.fold_metadata
            && chunks > 0
            && tail_len + (md_offset - len) + METADATA_SIZE <= t.payload;
        let plain = if fold { chunks - 1 } else { chunks };
        // Packets are gathered straight from the bytes, a batch at a time; the taps, when
        // set, work on the batches.
        let burst = self
            .window
            .as_ref()
            .map_or(BURST, |w| (w.packets as usize).clamp(1, BURST));
        let mut frame_crc = 0;
        let mut first = 0;
        while first < plain {
            let n = (plain - first).min(burst);
            pace_to(sent);
            self.wait_window(n as u64);
            let span = first * t.payload..((first + n) * t.payload).min(len);
            let data = bytes.piece(span, batch);
            self.send_batch(base, data, first, n, &mut frame_crc, crc_of)?;
            first += n;
            sent += n as u64;
        }
        let end_psn = self.psn;
        // The frame's CRC: what the plain packets carried, then the tail the last one folds.
        let tail_at = (plain * t.payload).min(len);
        let tail = bytes.piece(tail_at..len, batch);
        let crc32 = icrc::CrcShift::new(tail.len()).combine(frame_crc, crc_of(tail_at, tail));
        let (metadata_s, metadata_ns) = now_parts();
        let metadata = Metadata {
            flags: if len < t.frame_size {
                FLAG_EARLY_END
            } else {
                0
            },
            psn: end_psn.value(),
            // The bridge's JAMCRC is CRC-32 without the final inversion.
            crc: !crc32,
            timestamp_s,
            timestamp_ns,
            bytes_written: len as u64,
            frame_number: self.frame_number,
            metadata_s,
            metadata_ns,
        }
        .to_bytes();
        let imm = Some(t.immediate.immediate(page, end_psn.value()));
        pace_to(sent);
        self.wait_window(1);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        let va = if fold {
            scratch.extend_from_slice(tail);
            scratch.resize(md_offset - tail_at, 0);
            base + tail_at as u64
        } else {
            base + md_offset as u64
        };
        scratch.extend_from_slice(&metadata);
        let result = self.emit(Opcode::UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, va, imm, &scratch);
        self.scratch = scratch;
        result?;
        let info = FrameSent {
            page,
            frame_number: self.frame_number,
            psn: end_psn.value(),
            packets: u64::from(first_psn.steps_to(self.psn)),
            bytes: len as u64,
            crc32,
        };
        self.page = (self.page + 1) % t.pages;
        self.frame_number = self.frame_number.wrapping_add(1);
        Ok(info)
    }
}

/// Where a frame's bytes come from: [`Sender::send_frame_with`]'s or
/// [`Sender::send_frame_filled`]'s.
enum FrameBytes<'a> {
    Slice(&'a [u8]),
    Filled {
        len: usize,
        fill: &'a mut dyn FnMut(usize, &mut [u8]),
    },
}

impl FrameBytes<'_> {
    fn len(&self) -> usize {
        match self {
            Self::Slice(data) => data.len(),
            Self::Filled { len, .. } => *len,
        }
    }

    /// The bytes of `span`: the slice's, or filled into `buf` now.
    fn piece<'b>(&'b mut self, span: std::ops::Range<usize>, buf: &'b mut Vec<u8>) -> &'b [u8] {
        match self {
            Self::Slice(data) => &data[span],
            Self::Filled { fill, .. } => {
                buf.resize(span.len(), 0);
                fill(span.start, buf);
                buf
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Pattern, PatternCrcs};

    /// A frame filled a piece at a time, at offsets whole words apart or not, is the frame
    /// filled at once, for both patterns.
    #[test]
    fn pieces_filled_at_their_offsets_make_the_frame() {
        for pattern in [Pattern::Counter, Pattern::Zeros] {
            let mut whole = vec![1; 1000];
            pattern.fill(7, &mut whole);
            for cuts in [
                &[0, 8, 4096][..],
                &[3, 5, 6, 17, 999],
                &[1, 2, 3, 4, 5, 6, 7],
            ] {
                let mut pieces = vec![1; 1000];
                let mut at = 0;
                for &cut in cuts.iter().chain(&[1000]) {
                    let cut = cut.min(1000);
                    pattern.fill_at(7, at, &mut pieces[at..cut.max(at)]);
                    at = cut.max(at);
                }
                assert!(pieces == whole, "{pattern:?} cut at {cuts:?}");
            }
        }
        let (mut one, mut other) = ([0; 64], [0; 64]);
        Pattern::Counter.fill(1, &mut one);
        Pattern::Counter.fill(2, &mut other);
        assert_ne!(one, other, "frames differ");
    }

    /// Worked-out CRCs equal read ones: whole-word offsets of several frames (the salt
    /// changes, the cached words do not), lengths of whole packets, a tail and a few bytes,
    /// and the other pattern and an odd offset, which are read.
    #[test]
    fn pattern_crcs_are_those_of_the_bytes() {
        let mut crcs = PatternCrcs::new();
        let mut frame = vec![0; 3 * 4096 + 21];
        for pattern in [Pattern::Counter, Pattern::Zeros] {
            for number in [0, 1, 7, u32::MAX] {
                pattern.fill(number, &mut frame);
                for (at, len) in [
                    (0, 4096),
                    (4096, 4096),
                    (8192, 4096 + 21),
                    (16, 3),
                    (5, 100),
                ] {
                    let bytes = &frame[at..at + len];
                    let crc = crcs.crc(pattern, number, at, bytes);
                    assert_eq!(
                        crc,
                        crc32fast::hash(bytes),
                        "{pattern:?} {number} {at}+{len}"
                    );
                }
            }
        }
    }

    /// No two frames of the counter are alike, nor two words of one frame.
    #[test]
    fn counter_frames_differ_everywhere() {
        let (mut a, mut b) = (vec![0; 4096], vec![0; 4096]);
        Pattern::Counter.fill(3, &mut a);
        Pattern::Counter.fill(4, &mut b);
        let words = |f: &[u8]| -> Vec<u64> {
            f.chunks(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
                .collect()
        };
        let (wa, wb) = (words(&a), words(&b));
        assert!(wa.iter().zip(&wb).all(|(x, y)| x != y));
        let mut sorted = wa.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), wa.len());
    }
}
