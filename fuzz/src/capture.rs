//! The `capture` target's checks: a capture file (pcap or pcapng) read by
//! `ferroce::capture::CaptureReader` and decoded by `ferroce::decode::decode_frame`.
//!
//! [`check_capture`] reads every frame of the input and holds the reader to its contract:
//! frames are numbered from 1 without gaps, no frame holds more bytes than the file, a damaged
//! record ends the iteration with one `Malformed` error naming the last good frame, and a file
//! that is no capture is refused with its first bytes. For each frame: `ip_packet` is a
//! non-empty tail of the frame's bytes; `decode_frame` agrees with the wire layer
//! (`Datagram::parse`, `Packet::new_checked`, `icrc::verify`) on what it reports, its line of
//! text is one line, and its JSON is an object with the frame's index. Then the frames that a
//! classic pcap can hold (the link type of the first frame, a known link type, a timestamp
//! within 32-bit seconds, no more bytes than the original length) are written out as a
//! nanosecond pcap whose snap length is the longest frame, as a capture cut to that length
//! would say, and read back: the same frames, in order.

use ferroce::capture::{CaptureError, CaptureReader, Frame, LinkType};
use ferroce::decode::{decode_frame, IcrcStatus, Record};
use ferroce_proto::wire::{icrc, Datagram, Packet, ROCE_PORT};

/// The name errors give the input.
const NAME: &str = "fuzz-input";

/// Runs the `capture` target's checks on one input.
pub fn check_capture(data: &[u8]) {
    let frames = read_all(data, true);
    let Some(frames) = frames else { return };
    for frame in &frames {
        check_frame(frame, data.len());
    }
    round_trip(&frames);
}

/// Reads every frame of `data`, checking the reader's contract; `None` when the input is not
/// a capture at all. With `strict`, the input is an arbitrary file (an error may end it);
/// without, it is one this module wrote, which must read back whole.
fn read_all(data: &[u8], strict: bool) -> Option<Vec<Frame>> {
    let mut reader = match CaptureReader::new(data, NAME) {
        Ok(r) => r,
        Err(CaptureError::NotACapture { magic, .. }) => {
            assert!(strict, "a written capture is not one: {magic:02x?}");
            assert_eq!(&magic[..], &data[..data.len().min(4)], "the magic reported");
            return None;
        }
        Err(CaptureError::Malformed { after_frame, .. }) => {
            assert!(strict, "a written capture's header is damaged");
            assert_eq!(after_frame, 0, "a header error after a frame");
            return None;
        }
        Err(e) => panic!("reading a byte slice failed: {e}"),
    };
    let mut frames: Vec<Frame> = Vec::new();
    let mut failed = false;
    for item in reader.by_ref() {
        match item {
            Ok(frame) => {
                assert_eq!(frame.index, frames.len() as u64 + 1, "frame numbers");
                assert!(
                    frame.data.len() <= data.len(),
                    "a {}-byte frame from a {}-byte file",
                    frame.data.len(),
                    data.len()
                );
                frames.push(frame);
            }
            Err(e) => {
                assert!(strict, "a written capture read back with an error: {e}");
                match e {
                    CaptureError::Malformed { after_frame, .. } => {
                        assert_eq!(after_frame, frames.len() as u64, "the last good frame");
                    }
                    other => panic!("an error other than Malformed mid-file: {other}"),
                }
                failed = true;
                break;
            }
        }
    }
    if failed {
        assert!(reader.next().is_none(), "the reader goes on after an error");
    }
    Some(frames)
}

/// The checks on one frame and its decoded record.
fn check_frame(frame: &Frame, file_len: usize) {
    let ip = frame.ip_packet();
    if let Some(ip) = ip {
        assert!(!ip.is_empty(), "an empty IP packet");
        let end = frame.data.as_ptr() as usize + frame.data.len();
        assert_eq!(
            ip.as_ptr() as usize + ip.len(),
            end,
            "the IP packet is not a tail of the frame"
        );
    }
    let Some(record) = decode_frame(frame, ROCE_PORT) else {
        return;
    };
    let ip = ip.expect("a record for a frame with no IP packet");
    assert_eq!(record.index, frame.index, "the record's index");
    assert_eq!(record.udp_dst, ROCE_PORT, "a record for another port");
    check_record(&record, ip, file_len);
}

fn check_record(record: &Record, ip: &[u8], file_len: usize) {
    // What the wire layer says of the same bytes.
    match Datagram::parse(ip) {
        Err(_) => {
            assert!(
                record.error.is_some(),
                "no error for an unparsable datagram"
            );
            assert!(
                record.icrc.is_none() && record.opcode.is_none(),
                "{record:?}"
            );
        }
        Ok(d) => {
            assert_eq!(
                (record.src, record.dst),
                (d.ip.src(), d.ip.dst()),
                "addresses"
            );
            assert_eq!(record.udp_src, d.udp.src_port, "UDP source port");
            let good = icrc::verify(&d.ip, &d.udp, d.payload);
            let want = if good {
                IcrcStatus::Ok
            } else {
                IcrcStatus::Bad
            };
            assert_eq!(record.icrc, Some(want), "the ICRC status");
            assert_eq!(record.opcode, d.payload.first().copied(), "the opcode byte");
            match Packet::new_checked(d.payload) {
                Err(_) => assert!(record.error.is_some(), "no error for a bad packet"),
                Ok(p) => {
                    assert!(record.error.is_none(), "an error for a good packet");
                    assert_eq!(record.dest_qp, Some(p.dest_qp().value()));
                    assert_eq!(record.psn, Some(p.psn().value()));
                    assert_eq!(record.payload_len, Some(p.payload().len()));
                    assert!(p.payload().len() <= file_len);
                }
            }
        }
    }
    assert!(
        record.cm.is_none() || record.cm_error.is_none(),
        "both a CM message and a CM error"
    );
    assert_eq!(
        record.is_faulty(),
        record.error.is_some() || record.icrc != Some(IcrcStatus::Ok)
    );
    let line = record.to_string();
    assert!(
        !line.contains('\n'),
        "a record printed on two lines: {line:?}"
    );
    let json = serde_json::to_value(record).expect("a record serialises");
    assert_eq!(
        json.get("index").and_then(serde_json::Value::as_u64),
        Some(record.index),
        "the JSON's index: {json}"
    );
}

/// The pcap `LINKTYPE_*` number that reads back as `link`; `None` for an unknown link type.
fn linktype(link: LinkType) -> Option<u32> {
    match link {
        LinkType::Ethernet => Some(1),
        LinkType::LinuxSll => Some(113),
        LinkType::LinuxSll2 => Some(276),
        LinkType::RawIp => Some(101),
        LinkType::Loopback => Some(0),
        _ => None,
    }
}

/// Writes the frames a classic pcap can hold as a little-endian nanosecond pcap cut at the
/// longest frame, reads it back and compares.
fn round_trip(frames: &[Frame]) {
    let Some(first) = frames.first() else { return };
    let Some(link) = linktype(first.link) else {
        return;
    };
    let kept: Vec<&Frame> = frames
        .iter()
        .filter(|f| {
            f.link == first.link
                && u32::try_from(f.timestamp.as_secs()).is_ok()
                && f.data.len() <= f.original_len as usize
        })
        .collect();
    if kept.is_empty() {
        return;
    }
    let snaplen = kept.iter().map(|f| f.data.len()).max().unwrap_or(0).max(1) as u32;
    let mut file = Vec::new();
    file.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes());
    file.extend_from_slice(&2u16.to_le_bytes());
    file.extend_from_slice(&4u16.to_le_bytes());
    file.extend_from_slice(&[0; 8]);
    file.extend_from_slice(&snaplen.to_le_bytes());
    file.extend_from_slice(&link.to_le_bytes());
    for f in &kept {
        file.extend_from_slice(&(f.timestamp.as_secs() as u32).to_le_bytes());
        file.extend_from_slice(&f.timestamp.subsec_nanos().to_le_bytes());
        file.extend_from_slice(&(f.data.len() as u32).to_le_bytes());
        file.extend_from_slice(&f.original_len.to_le_bytes());
        file.extend_from_slice(&f.data);
    }
    let back = read_all(&file, false).expect("a written capture reads");
    assert_eq!(back.len(), kept.len(), "frames read back");
    for (a, b) in kept.iter().zip(&back) {
        let same = |f: &Frame| (f.timestamp, f.link, f.original_len, f.data.clone());
        assert_eq!(
            same(a),
            same(b),
            "frame {} read back as frame {}",
            a.index,
            b.index
        );
    }
}
