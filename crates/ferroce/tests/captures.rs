//! Real kernel rxe traffic (and the sensor-bridge emulator's stream): every RoCE packet parses,
//! its ICRC verifies, and flipping any one byte the ICRC covers makes the packet fail.

use std::path::PathBuf;

use ferroce::capture::{CaptureReader, Frame};
use ferroce::decode::{decode_frame, IcrcStatus};
use ferroce_proto::wire::{icrc, Datagram, IpHeader, Ipv4Header, Packet, PacketRepr, ROCE_PORT};

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn captures() -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(testdata())
        .expect("testdata/ exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 9,
        "expected the rxe and bridge captures in testdata/"
    );
    files
}

/// The RoCE frames of a capture with their IP packet's offset in the frame.
fn roce_frames(path: &PathBuf) -> Vec<(Frame, usize)> {
    CaptureReader::open(path)
        .unwrap()
        .map(Result::unwrap)
        .filter_map(|f| {
            let ip = f.ip_packet()?;
            let offset = f.data.len() - ip.len();
            let d = Datagram::parse(ip).ok()?;
            (d.udp.dst_port == ROCE_PORT).then_some((f, offset))
        })
        .collect()
}

#[test]
fn every_captured_packet_parses_and_verifies() {
    let mut total = 0;
    for path in captures() {
        let frames = roce_frames(&path);
        assert!(!frames.is_empty(), "{}: no RoCE packets", path.display());
        for (frame, offset) in &frames {
            let d = Datagram::parse(&frame.data[*offset..]).unwrap();
            assert!(
                icrc::verify(&d.ip, &d.udp, d.payload),
                "{} frame {}: ICRC",
                path.display(),
                frame.index
            );
            let packet = Packet::new_checked(d.payload)
                .unwrap_or_else(|e| panic!("{} frame {}: {e}", path.display(), frame.index));
            // Re-emitting the parsed packet reproduces the captured bytes exactly, but for
            // the reserved bits of BTH byte 4, which ferroce sends as zero (the bridge
            // emulator sends 0xFF there; the ICRC masks that byte).
            let repr = PacketRepr::parse(&packet);
            let mut again = vec![0; repr.buffer_len()];
            repr.emit(packet.payload(), &mut again).unwrap();
            icrc::seal(&d.ip, &d.udp, &mut again).unwrap();
            assert_eq!(again[4] & 0xc0, d.payload[4] & 0xc0, "FECN/BECN");
            again[4] = d.payload[4];
            assert!(
                again == d.payload,
                "{} frame {}: re-emitted bytes differ",
                path.display(),
                frame.index
            );

            let record = decode_frame(frame, ROCE_PORT).unwrap();
            assert_eq!(record.icrc, Some(IcrcStatus::Ok));
            assert_eq!(record.error, None);
            total += 1;
        }
    }
    assert_eq!(total, 160 + 40 + 100 + 110 + 20 + 60 + 100 + 30 + 10);
}

/// Whether byte `i` of an IP packet (IPv4, no options) is covered by the ICRC. Masked: TOS (1),
/// TTL (8), header checksum (10–11), UDP checksum (26–27), BTH byte 4 (32).
fn covered_v4(i: usize) -> bool {
    !matches!(i, 1 | 8 | 10 | 11 | 26 | 27 | 32)
}

#[test]
fn flipping_any_covered_byte_fails_and_masked_bytes_do_not_matter() {
    let mut flips = 0u64;
    for path in captures() {
        for (frame, offset) in roce_frames(&path) {
            let original = &frame.data[offset..];
            let d = Datagram::parse(original).unwrap();
            let ip_len = 20 + 8 + d.payload.len();
            assert_eq!(original[0], 0x45, "the captures are IPv4 without options");
            let mut packet = original[..ip_len].to_vec();
            for i in 0..ip_len {
                for mask in [0x01u8, 0x80] {
                    packet[i] ^= mask;
                    let verifies = Datagram::parse(&packet)
                        .is_ok_and(|d| icrc::verify(&d.ip, &d.udp, d.payload));
                    packet[i] ^= mask;
                    assert_eq!(
                        verifies,
                        !covered_v4(i),
                        "{} frame {} byte {i} mask {mask:#x}",
                        path.display(),
                        frame.index
                    );
                    flips += 1;
                }
            }
        }
    }
    assert!(flips > 900_000, "{flips} flips");
}

/// A UDP socket never sees the IP ID the ICRC covers; rxe sends non-zero IDs. Every captured
/// IPv4 packet's ID is recovered from its ICRC alone, and a corrupted copy is refused.
#[test]
fn ipv4_ids_are_recovered_from_the_icrc() {
    let (mut recovered, mut nonzero) = (0, 0);
    for path in captures() {
        for (frame, offset) in roce_frames(&path) {
            let d = Datagram::parse(&frame.data[offset..]).unwrap();
            let IpHeader::V4(v4) = d.ip else { continue };
            let blind = Ipv4Header { id: 0, ..v4 };
            let got = icrc::recover_ipv4_id(&blind, &d.udp, d.payload);
            assert_eq!(got, Some(v4.id), "{} frame {}", path.display(), frame.index);
            recovered += 1;
            nonzero += usize::from(v4.id != 0);
            let mut corrupt = d.payload.to_vec();
            let at = corrupt.len() / 2;
            corrupt[at] ^= 0x10;
            let refused = icrc::recover_ipv4_id(&blind, &d.udp, &corrupt);
            assert_eq!(
                refused,
                None,
                "{} frame {}: corrupted copy accepted",
                path.display(),
                frame.index
            );
        }
    }
    assert_eq!(recovered, 630);
    // The rxe captures carry real, non-zero IDs; the bridge emulator's 160 packets send 0.
    assert_eq!(nonzero, 470);
}

/// Damaged captures end in an error, never a panic: a capture rewritten as pcapng, then
/// 3000 copies with a few random bytes changed and perhaps cut short, each read to its end
/// and every frame decoded.
#[test]
fn damaged_captures_are_errors_not_panics() {
    use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
    use pcap_file::pcapng::blocks::interface_description::InterfaceDescriptionBlock;
    use pcap_file::pcapng::PcapNgWriter;
    use pcap_file::DataLink;

    let pcap = testdata().join("rc_atomic_fadd.pcap");
    let mut writer = PcapNgWriter::new(Vec::new()).unwrap();
    writer
        .write_pcapng_block(InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 65535,
            options: vec![],
        })
        .unwrap();
    let mut frames = 0;
    for frame in CaptureReader::open(&pcap).unwrap() {
        let frame = frame.unwrap();
        writer
            .write_pcapng_block(EnhancedPacketBlock {
                interface_id: 0,
                timestamp: frame.timestamp,
                original_len: frame.data.len() as u32,
                data: frame.data.clone().into(),
                options: vec![],
            })
            .unwrap();
        frames += 1;
    }
    let pcapng = writer.into_inner();
    let read_all = |bytes: &[u8]| -> (u64, bool) {
        let Ok(reader) = CaptureReader::new(bytes, "damaged.pcapng") else {
            return (0, true);
        };
        let (mut read, mut failed) = (0, false);
        for frame in reader {
            match frame {
                Ok(frame) => {
                    read += 1;
                    let _ = decode_frame(&frame, ROCE_PORT);
                }
                Err(_) => failed = true,
            }
        }
        (read, failed)
    };
    assert_eq!(read_all(&pcapng), (frames, false));
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |below: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below as u64) as usize
    };
    let (mut errors, mut cut) = (0, 0);
    for _ in 0..3000 {
        let mut copy = pcapng.clone();
        for _ in 0..1 + next(8) {
            let at = next(copy.len());
            copy[at] = next(256) as u8;
        }
        if next(3) == 0 {
            copy.truncate(next(copy.len()));
            cut += 1;
        }
        errors += u32::from(read_all(&copy).1);
    }
    assert!(cut > 500 && errors > 500, "{cut} cut, {errors} errors");
}
