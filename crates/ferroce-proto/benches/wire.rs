//! Parse + ICRC verify of a 4 KiB RDMA WRITE packet, beside plain CRC-32 over the same bytes.
//!
//! The ratio of the two throughputs is the figure that matters: parsing and the ICRC's masked
//! headers should cost little beyond the CRC itself. Run with
//! `cargo bench -p ferroce-proto --bench wire`. A second group times re-sealing a packet for
//! another IPv4 ID and source port (what each GSO segment needs) against sealing it anew, and a
//! third the ICRC of a latency test's packets (an 8-byte WRITE, a bare ACK), mostly headers,
//! and a fourth the check of a 1 KiB packet that left with another IPv4 ID than expected (rxe's
//! and NICs' packets, a GRO buffer that began inside a GSO send): found in the check's one pass,
//! against a failed check and then a recovery, which the receive path did before.

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ferroce_proto::wire::{icrc, Bth, IpHeader, Opcode, Packet, PacketRepr, Qpn, Reth, UdpHeader};
use ferroce_proto::Psn;

fn write_packet() -> (IpHeader, UdpHeader, Vec<u8>) {
    write_packet_of(4096)
}

/// A sealed RDMA WRITE_ONLY of `len` bytes.
fn write_packet_of(len: u32) -> (IpHeader, UdpHeader, Vec<u8>) {
    let ip = IpHeader::between([10, 0, 0, 1].into(), [10, 0, 0, 2].into()).unwrap();
    let udp = UdpHeader::to_roce_port(0xd194);
    let mut bth = Bth::new(
        Opcode::RC_RDMA_WRITE_ONLY,
        Qpn::new(0x11).unwrap(),
        Psn::new(0x123456).unwrap(),
    );
    bth.ack_req = true;
    let mut repr = PacketRepr::new(bth);
    repr.reth = Some(Reth {
        va: 0x7f00_1234_5000,
        rkey: 0x1acf,
        len,
    });
    repr.payload_len = len as usize;
    let payload: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
    let mut buf = vec![0; repr.buffer_len()];
    repr.emit(&payload, &mut buf).unwrap();
    icrc::seal(&ip, &udp, &mut buf).unwrap();
    (ip, udp, buf)
}

fn bench(c: &mut Criterion) {
    let (ip, udp, packet) = write_packet();
    let mut group = c.benchmark_group("write_4k");
    group.throughput(Throughput::Bytes(packet.len() as u64));
    group.bench_function("crc32_only", |b| {
        b.iter(|| crc32fast::hash(black_box(&packet)))
    });
    // The receive path: validate the view, read what a responder needs, verify the ICRC.
    group.bench_function("parse_and_verify", |b| {
        b.iter(|| {
            let view = Packet::new_checked(black_box(&packet[..])).unwrap();
            assert!(icrc::verify(&ip, &udp, view.as_bytes()));
            (view.bth(), view.reth(), view.payload().len())
        })
    });
    // The parts on their own, and the owned representation (used by tools, not the data path).
    group.bench_function("view_only", |b| {
        b.iter(|| {
            let view = Packet::new_checked(black_box(&packet[..])).unwrap();
            (view.bth(), view.reth(), view.payload().len())
        })
    });
    group.bench_function("repr_only", |b| {
        b.iter(|| {
            let view = Packet::new_checked(black_box(&packet[..])).unwrap();
            PacketRepr::parse(&view)
        })
    });
    group.bench_function("verify_only", |b| {
        b.iter(|| icrc::verify(&ip, &udp, black_box(&packet[..])))
    });
    group.finish();

    // Re-sealing a packet for another IPv4 ID and UDP source port (each GSO segment): by the
    // CRC's linearity, against sealing it anew, and the one-off cost of a length's Reseal.
    let mut group = c.benchmark_group("reseal_4k");
    let mut moved = packet.clone();
    let at = moved.len() - 4;
    let reseal = icrc::Reseal::new(true, moved.len());
    group.bench_function("reseal_apply", |b| {
        b.iter(|| reseal.apply(black_box(&mut moved[at..]), black_box(7), black_box(0x4242)))
    });
    group.bench_function("seal_anew", |b| {
        b.iter(|| icrc::seal(&ip, &udp, black_box(&mut moved[..])).unwrap())
    });
    group.bench_function("reseal_new", |b| {
        b.iter(|| icrc::Reseal::new(true, black_box(packet.len())))
    });
    group.finish();

    // What a latency test's round trip verifies and seals: an 8-byte WRITE and a bare ACK,
    // where the headers are most of the bytes.
    let mut group = c.benchmark_group("small");
    let (ip, udp, mut write8) = write_packet_of(8);
    let mut ack = vec![0; Bth::LEN + 4 + 4];
    ack[..Bth::LEN].copy_from_slice(&write8[..Bth::LEN]);
    ack[0] = Opcode::RC_ACKNOWLEDGE.value();
    icrc::seal(&ip, &udp, &mut ack).unwrap();
    group.bench_function("verify_write8", |b| {
        b.iter(|| assert!(icrc::verify(&ip, &udp, black_box(&write8[..]))))
    });
    group.bench_function("verify_ack", |b| {
        b.iter(|| assert!(icrc::verify(&ip, &udp, black_box(&ack[..]))))
    });
    group.bench_function("seal_write8", |b| {
        b.iter(|| icrc::seal(&ip, &udp, black_box(&mut write8[..])).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("other_id_1k");
    let (ip, udp, mut packet) = write_packet_of(1024);
    let IpHeader::V4(expected) = ip else {
        unreachable!("an IPv4 packet")
    };
    let sent = IpHeader::V4(ferroce_proto::wire::Ipv4Header {
        id: 0x4321,
        ..expected
    });
    icrc::seal(&sent, &udp, &mut packet).unwrap();
    group.throughput(Throughput::Bytes(packet.len() as u64));
    group.bench_function("check_ipv4", |b| {
        b.iter(|| icrc::check_ipv4(&expected, &udp, black_box(&packet[..])))
    });
    group.bench_function("verify_then_recover", |b| {
        b.iter(|| {
            assert!(!icrc::verify(&ip, &udp, black_box(&packet[..])));
            icrc::recover_ipv4_id(&expected, &udp, black_box(&packet[..]))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
