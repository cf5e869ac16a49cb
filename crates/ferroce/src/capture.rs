//! Reading packet captures: classic pcap and pcapng, with the link layers RoCE traffic is
//! captured on.
//!
//! [`CaptureReader`] yields every frame of a file, numbered from 1 as Wireshark numbers them,
//! and [`Frame::ip_packet`] strips the link layer: Ethernet (with 802.1Q/802.1ad tags), Linux
//! cooked capture v1 and v2 (`tcpdump -i any`), raw IP, and BSD loopback. Files come from
//! users and other tools, so nothing here panics on malformed input: a damaged file ends the
//! iteration with a [`CaptureError`] that names the file and the frame.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Chain, Cursor, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pcap_file::pcap::{PcapReader, RawPcapPacket};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, TsResolution};

/// Why a capture could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with a pcap or pcapng magic number.
    #[error("{} is not a pcap or pcapng capture (it starts with {magic:02x?})", path.display())]
    NotACapture {
        /// The file.
        path: PathBuf,
        /// Its first bytes.
        magic: Vec<u8>,
    },
    /// The file is damaged (truncated, or a block or record header is invalid).
    #[error("{} is damaged after frame {after_frame}: {reason}", path.display())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The last frame read intact.
        after_frame: u64,
        /// What the capture parser said.
        reason: String,
    },
}

/// The link-layer type of a capture's frames (the pcap `LINKTYPE_*` values ferroce strips).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkType {
    /// Ethernet II (1).
    Ethernet,
    /// Linux cooked capture v1, `tcpdump -i any` (113).
    LinuxSll,
    /// Linux cooked capture v2 (276).
    LinuxSll2,
    /// Raw IPv4 or IPv6 with no link header (101, and 228/229 for one family).
    RawIp,
    /// BSD loopback: a 4-byte address family in host order (0) or network order (108).
    Loopback,
    /// Any other link type; its frames are not decoded.
    Other(u32),
}

impl From<DataLink> for LinkType {
    fn from(link: DataLink) -> Self {
        match link {
            DataLink::ETHERNET => Self::Ethernet,
            DataLink::LINUX_SLL => Self::LinuxSll,
            DataLink::LINUX_SLL2 => Self::LinuxSll2,
            DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => Self::RawIp,
            DataLink::NULL | DataLink::LOOP => Self::Loopback,
            other => Self::Other(u32::from(other)),
        }
    }
}

/// One frame of a capture.
#[derive(Clone, Debug)]
pub struct Frame {
    /// The frame's number, from 1, counting every frame of the file as Wireshark does.
    pub index: u64,
    /// The capture timestamp, since the Unix epoch.
    pub timestamp: Duration,
    /// The link-layer type the frame starts with.
    pub link: LinkType,
    /// The frame's length on the wire; more than `data.len()` when the snap length cut it.
    pub original_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;

impl Frame {
    /// The IP packet inside the frame, or `None` when the frame carries something else (ARP,
    /// another link type) or is too short to say.
    #[must_use]
    pub fn ip_packet(&self) -> Option<&[u8]> {
        let d = &self.data[..];
        let ethertype = |at: usize| Some(u16::from_be_bytes([*d.get(at)?, *d.get(at + 1)?]));
        let (kind, offset) = match self.link {
            LinkType::Ethernet => {
                let mut at = 12;
                let mut kind = ethertype(at)?;
                while kind == ETHERTYPE_VLAN || kind == ETHERTYPE_QINQ {
                    at += 4;
                    kind = ethertype(at)?;
                }
                (kind, at + 2)
            }
            LinkType::LinuxSll => (ethertype(14)?, 16),
            LinkType::LinuxSll2 => (ethertype(0)?, 20),
            LinkType::RawIp => return (!d.is_empty()).then_some(d),
            LinkType::Loopback => {
                let family = d.get(..4)?;
                // AF_INET is 2 everywhere; AF_INET6 is 10, 24, 28 or 30 depending on the OS.
                // The value is in the capturing host's byte order, so accept either.
                let v = u32::from_le_bytes([family[0], family[1], family[2], family[3]]);
                let v = if v > 0xffff { v.swap_bytes() } else { v };
                let kind = match v {
                    2 => ETHERTYPE_IPV4,
                    10 | 24 | 28 | 30 => ETHERTYPE_IPV6,
                    _ => return None,
                };
                (kind, 4)
            }
            LinkType::Other(_) => return None,
        };
        match kind {
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => d.get(offset..).filter(|ip| !ip.is_empty()),
            _ => None,
        }
    }
}

type Source<R> = Chain<Cursor<[u8; 4]>, R>;

/// The reader of the capture's format, until it ends.
enum FormatReader<R: Read> {
    Pcap(PcapReader<Source<R>>, LinkType),
    PcapNg(PcapNgReader<Source<R>>),
    Done,
}

/// Reads the frames of a pcap or pcapng capture, in order.
///
/// The iterator yields `Ok(frame)` for each frame; after a damaged record it yields one
/// `Err` and then ends.
pub struct CaptureReader<R: Read> {
    reader: FormatReader<R>,
    path: PathBuf,
    frames: u64,
}

impl CaptureReader<BufReader<File>> {
    /// Opens a capture file; the format is recognised from its magic number.
    ///
    /// # Errors
    ///
    /// [`CaptureError::Io`] when the file cannot be opened or read, [`CaptureError::NotACapture`]
    /// when it is not pcap or pcapng, [`CaptureError::Malformed`] when its header is invalid.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| CaptureError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::new(BufReader::new(file), path)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads a capture from `reader`; `name` is used in error messages.
    ///
    /// # Errors
    ///
    /// As [`CaptureReader::open`].
    pub fn new(mut reader: R, name: impl AsRef<Path>) -> Result<Self, CaptureError> {
        let path = name.as_ref().to_owned();
        let mut magic = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match reader.read(&mut magic[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(source) => return Err(CaptureError::Io { path, source }),
            }
        }
        let malformed = |e: pcap_file::PcapError| CaptureError::Malformed {
            path: path.clone(),
            after_frame: 0,
            reason: e.to_string(),
        };
        let source = Cursor::new(magic).chain(reader);
        let reader = match (got, u32::from_be_bytes(magic)) {
            (4, 0xa1b2_c3d4 | 0xd4c3_b2a1 | 0xa1b2_3c4d | 0x4d3c_b2a1) => {
                let reader = PcapReader::new(source).map_err(malformed)?;
                let link = reader.header().datalink.into();
                FormatReader::Pcap(reader, link)
            }
            (4, 0x0a0d_0d0a) => FormatReader::PcapNg(PcapNgReader::new(source).map_err(malformed)?),
            _ => {
                return Err(CaptureError::NotACapture {
                    magic: magic[..got].to_vec(),
                    path,
                })
            }
        };
        Ok(Self {
            reader,
            path,
            frames: 0,
        })
    }

    fn frame(
        &mut self,
        timestamp: Duration,
        link: LinkType,
        orig: u32,
        data: Cow<'_, [u8]>,
    ) -> Frame {
        self.frames += 1;
        Frame {
            index: self.frames,
            timestamp,
            link,
            original_len: orig,
            data: data.into_owned(),
        }
    }

    fn fail(&mut self, e: &pcap_file::PcapError) -> CaptureError {
        self.fail_because(e.to_string())
    }

    fn fail_because(&mut self, reason: String) -> CaptureError {
        self.reader = FormatReader::Done;
        CaptureError::Malformed {
            path: self.path.clone(),
            after_frame: self.frames,
            reason,
        }
    }
}

/// The timestamp of a classic pcap record, or why the record is invalid: a fraction of a
/// second out of range, or more bytes captured than the snap length or the original length.
///
/// `pcap_file`'s own check also refuses an original length over the snap length, which is
/// what every frame cut by the snap length has (`tcpdump -s 64` writes a snap length of 64
/// and the frames' whole lengths): such a record is valid here.
fn pcap_timestamp(
    raw: &RawPcapPacket<'_>,
    resolution: TsResolution,
    snaplen: u32,
) -> Result<Duration, String> {
    let nanos = match resolution {
        TsResolution::MicroSecond => raw.ts_frac.checked_mul(1000),
        TsResolution::NanoSecond => Some(raw.ts_frac),
    }
    .filter(|&n| n < 1_000_000_000)
    .ok_or_else(|| format!("a timestamp fraction of {} is out of range", raw.ts_frac))?;
    if raw.incl_len > snaplen {
        return Err(format!(
            "a record of {} bytes in a capture with a snap length of {snaplen}",
            raw.incl_len
        ));
    }
    if raw.incl_len > raw.orig_len {
        return Err(format!(
            "a record of {} bytes from a {}-byte frame",
            raw.incl_len, raw.orig_len
        ));
    }
    Ok(Duration::new(u64::from(raw.ts_sec), nanos))
}

impl<R: Read> Iterator for CaptureReader<R> {
    type Item = Result<Frame, CaptureError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match &mut self.reader {
                FormatReader::Done => return None,
                FormatReader::Pcap(reader, link) => {
                    let link = *link;
                    let header = reader.header();
                    // Raw records, checked here: see `pcap_timestamp`.
                    return match reader.next_raw_packet()? {
                        Ok(p) => match pcap_timestamp(&p, header.ts_resolution, header.snaplen) {
                            Ok(ts) => {
                                let orig = p.orig_len;
                                let data = p.data.into_owned();
                                Some(Ok(self.frame(ts, link, orig, data.into())))
                            }
                            Err(reason) => Some(Err(self.fail_because(reason))),
                        },
                        Err(e) => Some(Err(self.fail(&e))),
                    };
                }
                FormatReader::PcapNg(reader) => {
                    let block = match reader.next_block()? {
                        Ok(block) => block.into_owned(),
                        Err(e) => return Some(Err(self.fail(&e))),
                    };
                    let link_of = |id: u32| {
                        reader
                            .interfaces()
                            .get(id as usize)
                            .map_or(LinkType::Other(u32::MAX), |i| i.linktype.into())
                    };
                    match block {
                        Block::EnhancedPacket(p) => {
                            let link = link_of(p.interface_id);
                            return Some(Ok(self.frame(p.timestamp, link, p.original_len, p.data)));
                        }
                        Block::SimplePacket(p) => {
                            let link = link_of(0);
                            return Some(Ok(self.frame(
                                Duration::ZERO,
                                link,
                                p.original_len,
                                p.data,
                            )));
                        }
                        Block::Packet(p) => {
                            let link = link_of(u32::from(p.interface_id));
                            let ts = Duration::from_micros(p.timestamp);
                            return Some(Ok(self.frame(ts, link, p.original_len, p.data)));
                        }
                        // Section headers, interface descriptions, statistics, name
                        // resolution: not frames.
                        _ => continue,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian microsecond pcap of Ethernet frames cut at `snaplen`: (original
    /// length, captured bytes) per frame.
    fn pcap(snaplen: u32, frames: &[(u32, &[u8])]) -> Vec<u8> {
        let mut file = Vec::new();
        file.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        file.extend_from_slice(&2u16.to_le_bytes());
        file.extend_from_slice(&4u16.to_le_bytes());
        file.extend_from_slice(&[0; 8]);
        file.extend_from_slice(&snaplen.to_le_bytes());
        file.extend_from_slice(&1u32.to_le_bytes());
        for (i, (orig, data)) in frames.iter().enumerate() {
            file.extend_from_slice(&(1_700_000_000 + i as u32).to_le_bytes());
            file.extend_from_slice(&250_000u32.to_le_bytes());
            file.extend_from_slice(&(data.len() as u32).to_le_bytes());
            file.extend_from_slice(&orig.to_le_bytes());
            file.extend_from_slice(data);
        }
        file
    }

    /// Found by the `capture` fuzz target: a capture cut at its snap length, as
    /// `tcpdump -s 64` writes it (frames longer on the wire than the snap length), was
    /// refused as damaged after frame 0 ("PacketHeader orig_len > snap_len").
    #[test]
    fn a_capture_cut_at_its_snap_length_reads() {
        let cut = [0x5au8; 64];
        let whole = [0xa5u8; 60];
        let file = pcap(64, &[(1078, &cut), (60, &whole), (9000, &cut)]);
        let frames: Vec<Frame> = CaptureReader::new(&file[..], "snapped.pcap")
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(frames.len(), 3);
        assert_eq!((frames[0].original_len, frames[0].data.len()), (1078, 64));
        assert_eq!(
            (frames[1].original_len, &frames[1].data[..]),
            (60, &whole[..])
        );
        assert_eq!((frames[2].original_len, frames[2].index), (9000, 3));
        assert_eq!(
            frames[1].timestamp,
            Duration::new(1_700_000_001, 250_000_000)
        );
    }

    /// The checks `pcap_file` made that still hold: a fraction of a second out of range, more
    /// bytes than the snap length, or more bytes than the frame had, end the capture with an
    /// error after the last good frame.
    #[test]
    fn invalid_records_are_still_refused() {
        let good = [1u8; 16];
        let mut bad_fraction = pcap(64, &[(16, &good), (16, &good)]);
        // The second record's fraction: 24 + 16 + 16 bytes in, then 4.
        bad_fraction[60..64].copy_from_slice(&1_000_000u32.to_le_bytes());
        for (file, why) in [
            (bad_fraction, "fraction"),
            (pcap(8, &[(16, &good[..8]), (16, &good)]), "snap length"),
            (pcap(64, &[(16, &good), (8, &good)]), "-byte frame"),
        ] {
            let mut reader = CaptureReader::new(&file[..], "bad.pcap").unwrap();
            assert!(reader.next().unwrap().is_ok());
            match reader.next() {
                Some(Err(CaptureError::Malformed {
                    after_frame,
                    reason,
                    ..
                })) => {
                    assert_eq!(after_frame, 1);
                    assert!(reason.contains(why), "{reason}");
                }
                other => panic!("{why}: {other:?}"),
            }
            assert!(reader.next().is_none());
        }
    }
}
