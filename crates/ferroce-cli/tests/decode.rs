//! `ferroce decode` end to end: the real captures, tshark's reading of them, damaged and
//! re-encapsulated copies, and the exit statuses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferroce::capture::{CaptureReader, Frame};
use ferroce_proto::wire::{icrc, Datagram};
use serde_json::Value;

fn testdata(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata")
        .join(name)
}

/// The rxe and bridge captures with the number of RoCE packets each holds.
const CAPTURES: &[(&str, usize)] = &[
    ("hsb_a_f10000_p4.pcap", 160),
    ("rc_atomic_fadd.pcap", 40),
    ("rc_read_bw_4KB.pcap", 100),
    ("rc_rnr_nak.pcap", 110),
    ("rc_send_64B.pcap", 20),
    ("rc_send_mtu1024_5000B.pcap", 60),
    ("rc_write_bw_4KB.pcap", 100),
    ("uc_send_2500B.pcap", 30),
    ("ud_send_512B.pcap", 10),
];

fn ferroce(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(args)
        .output()
        .expect("run ferroce")
}

fn decode_json(path: &Path, extra: &[&str]) -> (i32, Vec<Value>, String) {
    let mut args = vec!["decode", "--json", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = ferroce(&args);
    let records = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let stderr = String::from_utf8(out.stderr).unwrap();
    (out.status.code().expect("exit code"), records, stderr)
}

#[test]
fn every_capture_decodes_with_good_icrcs() {
    for &(name, count) in CAPTURES {
        let (code, records, stderr) = decode_json(&testdata(name), &[]);
        assert_eq!(code, 0, "{name}: {stderr}");
        assert_eq!(records.len(), count, "{name}");
        for r in &records {
            assert_eq!(r["icrc"], "ok", "{name}: {r}");
            assert!(r.get("error").is_none(), "{name}: {r}");
        }
    }
}

#[test]
fn json_keys_are_the_documented_ones() {
    let (_, records, _) = decode_json(&testdata("rc_write_bw_4KB.pcap"), &[]);
    let first = records
        .iter()
        .find(|r| r["opcode_name"] == "RC_RDMA_WRITE_FIRST")
        .unwrap();
    let keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = vec![
        "index",
        "src",
        "dst",
        "udp_src",
        "opcode",
        "opcode_name",
        "dest_qp",
        "psn",
        "ack_req",
        "se",
        "pad",
        "pkey",
        "reth",
        "payload_len",
        "icrc",
    ];
    expected.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(first["opcode"], 6);
    assert_eq!(first["reth"]["len"], 4096);
    assert_eq!(first["payload_len"], 1024);
    assert!(first["dest_qp"].is_u64() && first["psn"].is_u64());

    let (_, records, _) = decode_json(&testdata("rc_atomic_fadd.pcap"), &[]);
    let ack = records
        .iter()
        .find(|r| r["opcode_name"] == "RC_ATOMIC_ACKNOWLEDGE")
        .unwrap();
    assert_eq!(ack["aeth"]["syndrome"], 0x1f);
    assert!(ack["atomic_ack"]["orig"].is_u64());
    assert!(ack.get("reth").is_none());
}

#[test]
fn text_output_is_one_line_per_packet() {
    let out = ferroce(&["decode", testdata("rc_send_64B.pcap").to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 20);
    for line in lines {
        assert!(line.contains(" → "), "{line}");
        assert!(line.contains(":4791 "), "{line}");
        assert!(
            line.contains(" qp=0x") && line.contains(" psn=0x"),
            "{line}"
        );
        assert!(line.ends_with("icrc=ok"), "{line}");
    }
    assert!(text.contains("RC_SEND_ONLY") && text.contains("RC_ACKNOWLEDGE"));
    assert!(text.contains("aeth{ACK credits=31 msn="));
}

/// tshark's view of each RoCE frame, as the JSON field names `ferroce decode` uses.
fn tshark_fields(path: &Path) -> Option<BTreeMap<u64, BTreeMap<&'static str, u64>>> {
    const FIELDS: &[(&str, &str)] = &[
        ("frame.number", "index"),
        ("infiniband.bth.opcode", "opcode"),
        ("infiniband.bth.destqp", "dest_qp"),
        ("infiniband.bth.psn", "psn"),
        ("infiniband.reth.va", "va"),
        ("infiniband.reth.r_key", "rkey"),
        ("infiniband.reth.dmalen", "reth.len"),
        ("infiniband.aeth.syndrome", "aeth.syndrome"),
        ("infiniband.aeth.msn", "aeth.msn"),
        ("infiniband.atomiceth.swapdt", "atomic.swap_add"),
        ("infiniband.atomiceth.cmpdt", "atomic.compare"),
        ("infiniband.atomicacketh.origremdt", "atomic_ack.orig"),
        ("infiniband.deth.q_key", "deth.qkey"),
        ("infiniband.deth.srcqp", "deth.src_qp"),
    ];
    let mut cmd = Command::new("tshark");
    cmd.args(["-r", path.to_str()?, "-d", "udp.port==4791,infiniband"])
        .args(["-Y", "infiniband", "-T", "fields", "-E", "separator=|"]);
    for (field, _) in FIELDS {
        cmd.args(["-e", field]);
    }
    let out = cmd.output().ok()?;
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut frames = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut map = BTreeMap::new();
        for (value, (_, key)) in line.split('|').zip(FIELDS) {
            if value.is_empty() {
                continue;
            }
            let n = match value.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
                None => value.parse().unwrap(),
            };
            map.insert(*key, n);
        }
        frames.insert(map["index"], map);
    }
    Some(frames)
}

fn ours(record: &Value) -> BTreeMap<&'static str, u64> {
    let mut map = BTreeMap::new();
    let mut put = |key: &'static str, v: &Value| {
        if let Some(n) = v.as_u64() {
            map.insert(key, n);
        }
    };
    for key in ["index", "opcode", "dest_qp", "psn"] {
        put(key, &record[key]);
    }
    // tshark shows the AtomicETH's address and key in the RETH fields.
    put("va", &record["reth"]["va"]);
    put("rkey", &record["reth"]["rkey"]);
    put("va", &record["atomic"]["va"]);
    put("rkey", &record["atomic"]["rkey"]);
    put("reth.len", &record["reth"]["len"]);
    put("aeth.syndrome", &record["aeth"]["syndrome"]);
    put("aeth.msn", &record["aeth"]["msn"]);
    put("atomic.swap_add", &record["atomic"]["swap_add"]);
    put("atomic.compare", &record["atomic"]["compare"]);
    put("atomic_ack.orig", &record["atomic_ack"]["orig"]);
    put("deth.qkey", &record["deth"]["qkey"]);
    put("deth.src_qp", &record["deth"]["src_qp"]);
    map
}

#[test]
fn json_agrees_with_tshark() {
    let have_tshark = Command::new("tshark").arg("--version").output().is_ok();
    if !have_tshark {
        assert!(
            std::env::var_os("FERROCE_REQUIRE_TSHARK").is_none(),
            "FERROCE_REQUIRE_TSHARK is set but tshark is not installed (apt-get install tshark)"
        );
        eprintln!(
            "SKIPPED json_agrees_with_tshark: tshark is not installed (apt-get install tshark)"
        );
        return;
    }
    for &(name, count) in CAPTURES {
        let path = testdata(name);
        let theirs = tshark_fields(&path).unwrap();
        let (_, records, _) = decode_json(&path, &[]);
        assert_eq!(theirs.len(), count, "{name}: tshark's packet count");
        for r in &records {
            let index = r["index"].as_u64().unwrap();
            assert_eq!(ours(r), theirs[&index], "{name} frame {index}");
        }
    }
}

/// The byte offset in a classic pcap file of the data of frame `index` (from 1).
fn pcap_frame_offset(bytes: &[u8], index: u64) -> usize {
    let mut at = 24;
    for i in 1.. {
        let incl = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        if i == index {
            return at + 16;
        }
        at += 16 + incl;
    }
    unreachable!()
}

#[test]
fn a_flipped_payload_byte_is_marked_bad_and_exits_1() {
    let original = std::fs::read(testdata("rc_write_bw_4KB.pcap")).unwrap();
    let (_, records, _) = decode_json(&testdata("rc_write_bw_4KB.pcap"), &[]);
    let target = records
        .iter()
        .find(|r| r["opcode_name"] == "RC_RDMA_WRITE_MIDDLE")
        .unwrap()["index"]
        .as_u64()
        .unwrap();
    let mut damaged = original.clone();
    // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12, then 100 bytes into the payload.
    damaged[pcap_frame_offset(&original, target) + 14 + 20 + 8 + 12 + 100] ^= 0x04;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flipped.pcap");
    std::fs::write(&path, &damaged).unwrap();

    let (code, after, stderr) = decode_json(&path, &[]);
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(after.len(), records.len());
    for r in &after {
        let expect = if r["index"].as_u64() == Some(target) {
            "bad"
        } else {
            "ok"
        };
        assert_eq!(r["icrc"], expect, "{r}");
    }
    let text = ferroce(&["decode", path.to_str().unwrap()]);
    assert_eq!(text.status.code(), Some(1));
    let text = String::from_utf8(text.stdout).unwrap();
    assert_eq!(text.lines().filter(|l| l.ends_with("icrc=bad")).count(), 1);
}

/// Writes `frames` (IP packets with the given link header) as a classic pcap.
fn write_pcap(path: &Path, link_type: u32, frames: &[(Vec<u8>, u32)]) {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(&65535u32.to_le_bytes());
    out.extend_from_slice(&link_type.to_le_bytes());
    for (i, (data, orig)) in frames.iter().enumerate() {
        out.extend_from_slice(&(i as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(data.len() as u32).to_le_bytes());
        out.extend_from_slice(&orig.to_le_bytes());
        out.extend_from_slice(data);
    }
    std::fs::write(path, out).unwrap();
}

/// Writes `frames` as a pcapng section with one interface of `link_type`.
fn write_pcapng(path: &Path, link_type: u16, frames: &[(Vec<u8>, u32)]) {
    fn block(out: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let len = 12 + body.len().next_multiple_of(4);
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(body);
        out.resize(out.len() + body.len().next_multiple_of(4) - body.len(), 0);
        out.extend_from_slice(&(len as u32).to_le_bytes());
    }
    let mut out = Vec::new();
    let mut shb = Vec::new();
    shb.extend_from_slice(&0x1a2b_3c4du32.to_le_bytes());
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut out, 0x0a0d_0d0a, &shb);
    let mut idb = Vec::new();
    idb.extend_from_slice(&link_type.to_le_bytes());
    idb.extend_from_slice(&0u16.to_le_bytes());
    idb.extend_from_slice(&65535u32.to_le_bytes());
    block(&mut out, 1, &idb);
    for (i, (data, orig)) in frames.iter().enumerate() {
        let mut epb = Vec::new();
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&0u32.to_le_bytes());
        epb.extend_from_slice(&(i as u32).to_le_bytes());
        epb.extend_from_slice(&(data.len() as u32).to_le_bytes());
        epb.extend_from_slice(&orig.to_le_bytes());
        epb.extend_from_slice(data);
        epb.resize(epb.len().next_multiple_of(4), 0);
        block(&mut out, 6, &epb);
    }
    std::fs::write(path, out).unwrap();
}

fn frames(name: &str) -> Vec<Frame> {
    CaptureReader::open(testdata(name))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn pcapng_and_other_link_types_decode_the_same() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["rc_read_bw_4KB.pcap", "ud_send_512B.pcap"] {
        let (_, reference, _) = decode_json(&testdata(name), &[]);
        let frames = frames(name);
        // Every frame is Ethernet: 12 address bytes, then the ethertype and the packet.
        let ethertype = |f: &Frame| f.data[12..14].to_vec();
        let orig = |f: &Frame, len: usize| (f.original_len as usize - f.data.len() + len) as u32;

        let sll: Vec<_> = frames
            .iter()
            .map(|f| {
                let mut d = vec![0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0];
                d.extend_from_slice(&ethertype(f));
                d.extend_from_slice(&f.data[14..]);
                let n = d.len();
                (d, orig(f, n))
            })
            .collect();
        let sll2: Vec<_> = frames
            .iter()
            .map(|f| {
                let mut d = ethertype(f);
                d.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 1, 4, 6, 2, 0, 0, 0, 0, 1, 0, 0]);
                d.extend_from_slice(&f.data[14..]);
                let n = d.len();
                (d, orig(f, n))
            })
            .collect();
        let vlan: Vec<_> = frames
            .iter()
            .map(|f| {
                let mut d = f.data[..12].to_vec();
                d.extend_from_slice(&[0x81, 0x00, 0x00, 0x07]);
                d.extend_from_slice(&f.data[12..]);
                let n = d.len();
                (d, orig(f, n))
            })
            .collect();
        // Raw IP can only hold IP packets: keep the frame count by replacing the others
        // (ARP) with an IPv4 TCP packet, which decode skips.
        let raw: Vec<_> = frames
            .iter()
            .map(|f| {
                let d = match f.ip_packet() {
                    Some(ip) => ip.to_vec(),
                    None => {
                        let mut tcp = vec![0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6];
                        tcp.resize(40, 0);
                        tcp
                    }
                };
                let n = d.len();
                (d, orig(f, n))
            })
            .collect();

        let variants = [
            (
                "pcapng-ethernet.pcapng",
                None,
                frames
                    .iter()
                    .map(|f| (f.data.clone(), f.original_len))
                    .collect::<Vec<_>>(),
            ),
            ("pcapng-sll.pcapng", None, sll.clone()),
            ("pcapng-sll2.pcapng", None, sll2),
            ("pcap-sll.pcap", Some(113), sll),
            ("pcap-raw.pcap", Some(101), raw),
            ("pcap-vlan.pcap", Some(1), vlan),
        ];
        for (file, pcap_link, data) in variants {
            let path = dir.path().join(file);
            match (pcap_link, file) {
                (Some(link), _) => write_pcap(&path, link, &data),
                (None, f) if f.contains("sll2") => write_pcapng(&path, 276, &data),
                (None, f) if f.contains("sll") => write_pcapng(&path, 113, &data),
                (None, _) => write_pcapng(&path, 1, &data),
            }
            let (code, records, stderr) = decode_json(&path, &[]);
            assert_eq!(code, 0, "{name} as {file}: {stderr}");
            assert_eq!(records, reference, "{name} as {file}");
        }
    }
}

#[test]
fn another_port_is_decoded_when_asked() {
    // Move every RoCE packet to UDP port 5000 and re-seal its ICRC, which covers the port.
    let frames = frames("rc_send_64B.pcap");
    let moved: Vec<_> = frames
        .iter()
        .map(|f| {
            let mut data = f.data.clone();
            let is_roce = f
                .ip_packet()
                .and_then(|ip| Datagram::parse(ip).ok())
                .is_some_and(|d| d.udp.dst_port == 4791);
            if is_roce {
                data[14 + 22..14 + 24].copy_from_slice(&5000u16.to_be_bytes());
                let ip = Datagram::parse(&data[14..]).unwrap();
                let (ip, udp) = (ip.ip, ip.udp);
                icrc::seal(&ip, &udp, &mut data[14 + 28..]).unwrap();
            }
            (data, f.original_len)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("port5000.pcap");
    write_pcap(&path, 1, &moved);

    let (code, records, _) = decode_json(&path, &["--port", "5000"]);
    assert_eq!(code, 0);
    assert_eq!(records.len(), 20);
    assert!(records.iter().all(|r| r["icrc"] == "ok"));
    let (code, records, _) = decode_json(&path, &[]);
    assert_eq!((code, records.len()), (0, 0));
}

#[test]
fn unparsable_packets_get_an_error_and_decoding_goes_on() {
    let original = std::fs::read(testdata("rc_send_64B.pcap")).unwrap();
    let (_, records, _) = decode_json(&testdata("rc_send_64B.pcap"), &[]);
    let target = records[3]["index"].as_u64().unwrap();
    let mut damaged = original.clone();
    // An opcode no transport defines (0x1f), in the BTH's first byte.
    damaged[pcap_frame_offset(&original, target) + 14 + 28] = 0x1f;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad-opcode.pcap");
    std::fs::write(&path, &damaged).unwrap();
    let (code, after, _) = decode_json(&path, &[]);
    assert_eq!(code, 1);
    assert_eq!(after.len(), records.len());
    let bad = &after[3];
    assert_eq!(bad["error"], "unknown opcode 0x1f");
    assert_eq!(bad["opcode"], 0x1f);
    assert_eq!(bad["icrc"], "bad");
    assert!(bad.get("dest_qp").is_none());
    assert!(after
        .iter()
        .enumerate()
        .all(|(i, r)| i == 3 || r.get("error").is_none()));
}

#[test]
fn unreadable_files_exit_2_with_a_reason() {
    let out = ferroce(&["decode", "/nonexistent/capture.pcap"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("cannot read /nonexistent/capture.pcap"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a capture\n").unwrap();
    let out = ferroce(&["decode", text.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("is not a pcap or pcapng capture"), "{err}");

    // A capture cut in the middle of a record: the frames before the cut are printed.
    let whole = std::fs::read(testdata("rc_send_64B.pcap")).unwrap();
    let cut = dir.path().join("cut.pcap");
    std::fs::write(&cut, &whole[..whole.len() - 30]).unwrap();
    let (code, records, stderr) = decode_json(&cut, &[]);
    assert_eq!(code, 2, "{stderr}");
    assert!(!records.is_empty() && records.len() < 20);
    assert!(stderr.contains("is damaged after frame"), "{stderr}");
}

/// The communication IDs, QPNs and transaction ID of the CM test connection: the active side
/// 10.77.0.12 (QP 0x3c) connects to rping's port on 10.77.0.11 (QP 0x3b).
const ACTIVE_ID: u32 = 0x58bc_a909;
const PASSIVE_ID: u32 = 0x1122_3344;
const CM_TID: u64 = 0x0000_0002_09a9_bc58;

/// A CM MAD as rxe sends it: Ethernet, IPv4 (DF, TTL 64), UDP from QP 1's port 55410 to 4791,
/// BTH UD SEND_ONLY to QP 1 (P_Key 0xFFFF, AckReq), DETH (the QP 1 Q_Key, source QP 1), the
/// 256-byte MAD and the ICRC.
fn cm_frame(src: [u8; 4], dst: [u8; 4], psn: u32, mad: &[u8; 256]) -> Vec<u8> {
    use ferroce_proto::cm::IB_QP1_QKEY;
    use ferroce_proto::wire::{Bth, Deth, IpHeader, Opcode, PacketRepr, Qpn, UdpHeader};
    use ferroce_proto::Psn;

    let mut repr = PacketRepr::new(Bth {
        opcode: Opcode::UD_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: Qpn::GSI,
        ack_req: true,
        psn: Psn::new(psn).unwrap(),
    });
    repr.deth = Some(Deth {
        qkey: IB_QP1_QKEY,
        src_qp: Qpn::GSI,
    });
    repr.payload_len = mad.len();
    let mut roce = vec![0; repr.buffer_len()];
    repr.emit(mad, &mut roce).unwrap();
    let ip = IpHeader::between(src.into(), dst.into()).unwrap();
    let udp = UdpHeader {
        src_port: 55410,
        dst_port: 4791,
    };
    icrc::seal(&ip, &udp, &mut roce).unwrap();
    let mut frame = vec![
        0x52, 0x54, 0x00, 0x77, 0x00, 0x11, 0x52, 0x54, 0x00, 0x77, 0x00, 0x12,
    ];
    frame.extend_from_slice(&[0x08, 0x00]);
    let mut headers = [0; 28];
    Datagram::emit_headers(&ip, &udp, roce.len(), &mut headers).unwrap();
    frame.extend_from_slice(&headers);
    frame.extend_from_slice(&roce);
    frame
}

/// One rping-like connection's CM messages, built with ferroce's encoder: REQ (with an
/// rdma_cm header in its private data), REP, RTU, a REJ of another REQ, DREQ and DREP.
fn cm_messages() -> Vec<ferroce_proto::cm::CmMessage> {
    use ferroce_proto::cm::*;
    use ferroce_proto::wire::Qpn;
    use ferroce_proto::Psn;

    let mut private_data = FixedBytes::<92>::from_slice(&[0; 36]).unwrap();
    CmaHeader {
        src_port: 0xe5be,
        src: [10, 77, 0, 12].into(),
        dst: [10, 77, 0, 11].into(),
    }
    .emit(&mut private_data.0)
    .unwrap();
    private_data.0[36..40].copy_from_slice(b"ping");
    let gid = |last: u8| std::net::Ipv4Addr::new(10, 77, 0, last).to_ipv6_mapped();
    let req = Req {
        local_comm_id: ACTIVE_ID,
        service_id: ServiceId::rdma_cm(PortSpace::Tcp, 7174),
        local_ca_guid: 0x5054_00ff_fe77_0012,
        local_qkey: 0,
        local_qpn: Qpn::new(0x3c).unwrap(),
        responder_resources: 1,
        local_eecn: 0,
        initiator_depth: 1,
        remote_eecn: 0,
        remote_cm_response_timeout: 20,
        transport_type: TransportType::Rc,
        end_to_end_flow_control: false,
        starting_psn: Psn::new(0x10_36e6).unwrap(),
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: Mtu::M1024,
        rdc_exists: false,
        rnr_retry_count: 7,
        max_cm_retries: 15,
        srq: false,
        extended_transport_type: 0,
        primary_path: PathInfo {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: gid(12),
            remote_gid: gid(11),
            flow_label: 0xb_ee08,
            packet_rate: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            subnet_local: false,
            local_ack_timeout: 0x13,
        },
        alternate_path: PathInfo::NONE,
        private_data,
    };
    let rep = Rep {
        local_comm_id: PASSIVE_ID,
        remote_comm_id: ACTIVE_ID,
        local_qkey: 0,
        local_qpn: Qpn::new(0x3b).unwrap(),
        local_eecn: 0,
        starting_psn: Psn::new(0x0a_6f23).unwrap(),
        responder_resources: 1,
        initiator_depth: 1,
        target_ack_delay: 15,
        failover_accepted: 0,
        end_to_end_flow_control: false,
        rnr_retry_count: 7,
        srq: false,
        local_ca_guid: 0x5054_00ff_fe77_0011,
        private_data: FixedBytes::ZERO,
    };
    vec![
        CmMessage::Req(req),
        CmMessage::Rep(rep),
        CmMessage::Rtu(Rtu {
            local_comm_id: ACTIVE_ID,
            remote_comm_id: PASSIVE_ID,
            private_data: FixedBytes::ZERO,
        }),
        CmMessage::Rej(Rej {
            local_comm_id: 0,
            remote_comm_id: ACTIVE_ID + 1,
            message_rejected: MessageKind::Req,
            reject_info_length: 0,
            reason: RejectReason::InvalidServiceId,
            ari: FixedBytes::ZERO,
            private_data: FixedBytes::ZERO,
        }),
        CmMessage::Dreq(Dreq {
            local_comm_id: ACTIVE_ID,
            remote_comm_id: PASSIVE_ID,
            remote_qpn: Qpn::new(0x3b).unwrap(),
            private_data: FixedBytes::ZERO,
        }),
        CmMessage::Drep(Drep {
            local_comm_id: PASSIVE_ID,
            remote_comm_id: ACTIVE_ID,
            private_data: FixedBytes::ZERO,
        }),
    ]
}

/// Writes the CM messages as an Ethernet pcap, alternating direction as the exchange does;
/// `damage` may change each MAD before it is sealed.
fn write_cm_pcap(path: &Path, damage: impl Fn(usize, &mut [u8; 256])) {
    let (active, passive) = ([10, 77, 0, 12], [10, 77, 0, 11]);
    let frames: Vec<_> = cm_messages()
        .iter()
        .enumerate()
        .map(|(i, message)| {
            let mut mad = [0; 256];
            message.emit(&message.header(CM_TID), &mut mad).unwrap();
            damage(i, &mut mad);
            let from_active = matches!(message.name(), "REQ" | "RTU" | "DREQ");
            let (src, dst) = if from_active {
                (active, passive)
            } else {
                (passive, active)
            };
            let frame = cm_frame(src, dst, 2 + i as u32, &mad);
            let len = frame.len() as u32;
            (frame, len)
        })
        .collect();
    write_pcap(path, 1, &frames);
}

#[test]
fn cm_mads_to_qp1_decode_as_cm_messages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cm.pcap");
    write_cm_pcap(&path, |_, _| {});
    let (code, records, stderr) = decode_json(&path, &[]);
    assert_eq!(code, 0, "{stderr}");
    let names: Vec<_> = records.iter().map(|r| r["cm"]["message"].clone()).collect();
    assert_eq!(names, ["REQ", "REP", "RTU", "REJ", "DREQ", "DREP"]);
    for r in &records {
        assert_eq!(r["icrc"], "ok", "{r}");
        assert_eq!(r["payload_len"], 256, "{r}");
        assert_eq!(r["cm"]["transaction_id"], CM_TID, "{r}");
        assert!(r.get("cm_error").is_none(), "{r}");
    }
    let req = &records[0]["cm"];
    assert_eq!(req["local_comm_id"], ACTIVE_ID);
    assert!(req.get("remote_comm_id").is_none());
    assert_eq!(req["service_id"], 0x0106_1c06);
    assert_eq!(req["qpn"], 0x3c);
    assert_eq!(req["starting_psn"], 0x10_36e6);
    assert_eq!(req["mtu"], 1024);
    assert_eq!(req["local_gid"], "::ffff:10.77.0.12");
    assert_eq!(req["local_ack_timeout"], 0x13);
    assert_eq!(
        req["cma"],
        serde_json::json!({"src_port": 0xe5be, "src": "10.77.0.12", "dst": "10.77.0.11"})
    );
    let rep = &records[1]["cm"];
    assert_eq!(rep["remote_comm_id"], ACTIVE_ID);
    assert_eq!(
        (rep["qpn"].as_u64(), rep["starting_psn"].as_u64()),
        (Some(0x3b), Some(0x0a_6f23))
    );
    assert_eq!(rep["target_ack_delay"], 15);
    let rej = &records[3]["cm"];
    assert_eq!(rej["reason"], 8);
    assert_eq!(rej["reason_name"], "invalid service ID");
    assert_eq!(records[4]["cm"]["remote_qpn"], 0x3b);

    let text = ferroce(&["decode", path.to_str().unwrap()]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains(
            " deth{qkey=0x80010000 src_qp=0x000001} payload=256 \
             cm{REQ lcid=0x58bca909 sid=0x0000000001061c06 qpn=0x00003c psn=0x1036e6} icrc=ok"
        ),
        "{}",
        lines[0]
    );
    assert!(
        lines[3].contains("cm{REJ lcid=0x00000000 rcid=0x58bca90a reason=8 (invalid service ID)}"),
        "{}",
        lines[3]
    );
    assert!(
        lines[4].contains("cm{DREQ lcid=0x58bca909 rcid=0x11223344 rqpn=0x00003b}"),
        "{}",
        lines[4]
    );
}

#[test]
fn a_mad_that_is_not_a_cm_message_gets_cm_error_and_decoding_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cm-damaged.pcap");
    // The RTU claims class version 1, the DREQ an attribute no CM message has; the REP is
    // moved to another management class (SA, 0x03), which is no business of the CM decoder.
    write_cm_pcap(&path, |i, mad| match i {
        1 => mad[1] = 0x03,
        2 => mad[2] = 1,
        4 => mad[17] = 0x30,
        _ => {}
    });
    let (code, records, stderr) = decode_json(&path, &[]);
    assert_eq!(code, 0, "a bad MAD is not a bad RoCE packet: {stderr}");
    assert_eq!(records.len(), 6);
    assert!(records
        .iter()
        .all(|r| r["icrc"] == "ok" && r.get("error").is_none()));
    assert!(records[1].get("cm").is_none() && records[1].get("cm_error").is_none());
    assert_eq!(records[2]["cm_error"], "CM class version 1, expected 2");
    assert!(records[2].get("cm").is_none());
    assert_eq!(records[4]["cm_error"], "unknown CM attribute ID 0x0030");
    assert_eq!(records[5]["cm"]["message"], "DREP");

    let text = ferroce(&["decode", path.to_str().unwrap()]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text
        .lines()
        .nth(2)
        .unwrap()
        .contains(" cm_error: CM class version 1, expected 2"));
}

/// tshark's reading of the CM messages of a capture, keyed by frame: each field's value as
/// a decimal number (hex fields converted) or, for addresses, as text.
fn tshark_cm_fields(path: &Path) -> BTreeMap<u64, BTreeMap<&'static str, String>> {
    // tshark 4.0 names the REQ's and REP's local communication IDs after the message alone,
    // and the DREQ's remote QPN as a REQ field.
    // Not compared: the flow label, which tshark 4.0 reads from the wrong bits (rdmacm.md
    // §1.3), and the message-specific fields that `ferroce decode` does not print.
    const FIELDS: &[(&str, &str)] = &[
        ("frame.number", "index"),
        ("infiniband.mad.attributeid", "attribute"),
        ("infiniband.mad.transactionid", "transaction_id"),
        ("infiniband.cm.req", "local_comm_id"),
        ("infiniband.cm.req.serviceid", "service_id"),
        ("infiniband.cm.req.localcaguid", "ca_guid"),
        ("infiniband.cm.req.localqkey", "qkey"),
        ("infiniband.cm.req.localqpn", "qpn"),
        ("infiniband.cm.req.responderres", "responder_resources"),
        ("infiniband.cm.req.initdepth", "initiator_depth"),
        ("infiniband.cm.req.startpsn", "starting_psn"),
        ("infiniband.cm.req.retrcount", "retry_count"),
        ("infiniband.cm.req.rnrretrcount", "rnr_retry_count"),
        ("infiniband.cm.req.pppmtu", "mtu_code"),
        ("infiniband.cm.req.pkey", "pkey"),
        ("infiniband.cm.req.prim_localgid", "local_gid"),
        ("infiniband.cm.req.prim_remotegid", "remote_gid"),
        ("infiniband.cm.req.prim_localgid_ipv4", "local_gid"),
        ("infiniband.cm.req.prim_remotegid_ipv4", "remote_gid"),
        ("infiniband.cm.req.prim_hoplim", "hop_limit"),
        ("infiniband.cm.req.prim_localacktout", "local_ack_timeout"),
        ("infiniband.cm.req.ip_cm.sport", "cma.src_port"),
        ("infiniband.cm.req.ip_cm.sip4", "cma.src"),
        ("infiniband.cm.req.ip_cm.dip4", "cma.dst"),
        ("infiniband.cm.rep", "local_comm_id"),
        ("infiniband.cm.rep.remotecommid", "remote_comm_id"),
        ("infiniband.cm.rep.localqkey", "qkey"),
        ("infiniband.cm.rep.localqpn", "qpn"),
        ("infiniband.cm.rep.startpsn", "starting_psn"),
        ("infiniband.cm.rep.respres", "responder_resources"),
        ("infiniband.cm.rep.initdepth", "initiator_depth"),
        ("infiniband.cm.rep.tgtackdelay", "target_ack_delay"),
        ("infiniband.cm.rep.rnrretrcount", "rnr_retry_count"),
        ("infiniband.cm.rep.localcaguid", "ca_guid"),
        ("infiniband.cm.rtu.localcommid", "local_comm_id"),
        ("infiniband.cm.rtu.remotecommid", "remote_comm_id"),
        ("infiniband.cm.rej.localcommid", "local_comm_id"),
        ("infiniband.cm.rej.remotecommid", "remote_comm_id"),
        ("infiniband.cm.rej.msgrej", "message_code"),
        ("infiniband.cm.rej.reason", "reason"),
        ("infiniband.cm.dreq.localcommid", "local_comm_id"),
        ("infiniband.cm.dreq.remotecommid", "remote_comm_id"),
        ("infiniband.cm.req.remoteqpneecn", "remote_qpn"),
        ("infiniband.cm.drsp.localcommid", "local_comm_id"),
        ("infiniband.cm.drsp.remotecommid", "remote_comm_id"),
    ];
    let mut cmd = Command::new("tshark");
    cmd.args([
        "-r",
        path.to_str().unwrap(),
        "-d",
        "udp.port==4791,infiniband",
    ])
    .args(["-Y", "infiniband", "-T", "fields", "-E", "separator=|"]);
    for (field, _) in FIELDS {
        cmd.args(["-e", field]);
    }
    let out = cmd.output().expect("run tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut frames = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut map = BTreeMap::new();
        for (value, (field, key)) in line.split('|').zip(FIELDS) {
            if value.is_empty() {
                continue;
            }
            let value = match value.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16).unwrap().to_string(),
                None => value.to_string(),
            };
            // tshark shows an IPv4-mapped GID as the IPv4 address, in a field of its own.
            let value = match value.parse::<std::net::Ipv4Addr>() {
                Ok(a) if key.ends_with("_gid") => a.to_ipv6_mapped().to_string(),
                _ => value,
            };
            if let Some(old) = map.insert(*key, value.clone()) {
                panic!("{field}: two values for {key}: {old} and {value}");
            }
        }
        frames.insert(map["index"].parse().unwrap(), map);
    }
    frames
}

/// The same fields from `ferroce decode --json`.
fn ours_cm(record: &Value) -> BTreeMap<&'static str, String> {
    let cm = &record["cm"];
    let mut map = BTreeMap::new();
    map.insert("index", record["index"].to_string());
    let attribute = match cm["message"].as_str().unwrap() {
        "REQ" => 0x10,
        "REJ" => 0x12,
        "REP" => 0x13,
        "RTU" => 0x14,
        "DREQ" => 0x15,
        "DREP" => 0x16,
        other => panic!("no tshark fields for {other}"),
    };
    map.insert("attribute", attribute.to_string());
    for key in [
        "transaction_id",
        "local_comm_id",
        "remote_comm_id",
        "service_id",
        "ca_guid",
        "qkey",
        "qpn",
        "responder_resources",
        "initiator_depth",
        "starting_psn",
        "retry_count",
        "rnr_retry_count",
        "pkey",
        "hop_limit",
        "local_ack_timeout",
        "target_ack_delay",
        "message_code",
        "reason",
        "remote_qpn",
    ] {
        if let Some(n) = cm.get(key).and_then(Value::as_u64) {
            map.insert(key, n.to_string());
        }
    }
    for key in ["local_gid", "remote_gid"] {
        if let Some(gid) = cm.get(key).and_then(Value::as_str) {
            map.insert(key, gid.to_string());
        }
    }
    if let Some(mtu) = cm.get("mtu").and_then(Value::as_u64) {
        map.insert("mtu_code", (mtu.trailing_zeros() - 7).to_string());
    }
    if let Some(cma) = cm.get("cma") {
        map.insert("cma.src_port", cma["src_port"].to_string());
        map.insert("cma.src", cma["src"].as_str().unwrap().to_string());
        map.insert("cma.dst", cma["dst"].as_str().unwrap().to_string());
    }
    map
}

#[test]
fn cm_json_agrees_with_tshark() {
    let have_tshark = Command::new("tshark").arg("--version").output().is_ok();
    if !have_tshark {
        assert!(
            std::env::var_os("FERROCE_REQUIRE_TSHARK").is_none(),
            "FERROCE_REQUIRE_TSHARK is set but tshark is not installed (apt-get install tshark)"
        );
        eprintln!(
            "SKIPPED cm_json_agrees_with_tshark: tshark is not installed (apt-get install tshark)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cm.pcap");
    write_cm_pcap(&path, |_, _| {});
    let theirs = tshark_cm_fields(&path);
    let (code, records, stderr) = decode_json(&path, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(theirs.len(), records.len(), "tshark's packet count");
    for r in &records {
        let index = r["index"].as_u64().unwrap();
        assert_eq!(ours_cm(r), theirs[&index], "frame {index}");
    }
}

/// The golden CM captures (kernel rxe to kernel rxe, `testdata/cm/README.md`) with their
/// number of MADs. `crates/ferroce/tests/cm_captures.rs` checks their bytes; here the command.
const CM_CAPTURES: &[(&str, usize)] = &[
    ("rping", 5),
    ("ucmatose", 10),
    ("udaddy", 2),
    ("ib_send_bw-rc", 10),
    ("ib_send_bw-rc-dreqs-crossed", 12),
    ("rping-rej8", 2),
    ("ib_send_bw-ud", 7),
    ("udaddy-unreachable", 2),
];

#[test]
fn the_kernels_cm_captures_decode_and_agree_with_tshark() {
    let have_tshark = Command::new("tshark").arg("--version").output().is_ok();
    for &(name, count) in CM_CAPTURES {
        let path = testdata("cm").join(format!("{name}.pcap"));
        assert!(path.is_file(), "{}: missing", path.display());
        let (code, records, stderr) = decode_json(&path, &[]);
        assert_eq!(code, 0, "{name}: {stderr}");
        assert_eq!(records.len(), count, "{name}");
        for r in &records {
            assert_eq!(r["icrc"], "ok", "{name}: {r}");
            assert!(
                r.get("error").is_none() && r.get("cm_error").is_none(),
                "{name}: {r}"
            );
            assert!(r["cm"]["message"].is_string(), "{name}: {r}");
        }
        if !have_tshark {
            continue;
        }
        // tshark 4.0 names no SIDR field: those frames are compared by the test above only
        let theirs = tshark_cm_fields(&path);
        assert_eq!(theirs.len(), count, "{name}: tshark's packet count");
        for r in &records {
            if r["cm"]["message"].as_str().unwrap().starts_with("SIDR") {
                continue;
            }
            let index = r["index"].as_u64().unwrap();
            assert_eq!(ours_cm(r), theirs[&index], "{name} frame {index}");
        }
    }
    if !have_tshark {
        assert!(
            std::env::var_os("FERROCE_REQUIRE_TSHARK").is_none(),
            "FERROCE_REQUIRE_TSHARK is set but tshark is not installed (apt-get install tshark)"
        );
        eprintln!(
            "SKIPPED the tshark half of the_kernels_cm_captures_decode_and_agree_with_tshark: \
             tshark is not installed (apt-get install tshark)"
        );
    }
}
