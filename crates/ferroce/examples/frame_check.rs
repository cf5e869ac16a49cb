//! What checking a 4K frame's CRC costs the application, by the way it reaches the bytes: the
//! frame copied out of the ring first (`Region::read_with`, the check `stream recv` made until
//! the sixteenth data-path step), shown a piece at a time where it landed (`Region::inspect`:
//! in place for host memory, through one 64 KiB piece for a mapped ring such as the frame
//! receiver's), and the CRC of a plain buffer in place, the floor. Each way reads frames from
//! a ring of four pages in turn, as a receiver's check does, so no frame is in the cache when
//! its check begins. Prints milliseconds per frame, the median of five rounds of 40 frames.
//!
//! `cargo run --release -p ferroce --example frame_check -- [frame bytes]` (12,441,600, a 4K
//! RAW12 frame, by default). Opens a soft NIC on 127.0.9.1; sends nothing.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

use ferroce::proto::memory::WriteOrder;
use ferroce::{MappedMemory, Nic, NicConfig, Region, RegionAccess, RegionMemory};

const PAGES: usize = 4;
const FRAMES: usize = 40;
const ROUNDS: usize = 5;

/// Milliseconds per frame of `check(page)`, the median of the rounds.
fn per_frame(mut check: impl FnMut(usize) -> u32) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUNDS)
        .map(|_| {
            let started = Instant::now();
            let mut sum = 0u32;
            for frame in 0..FRAMES {
                sum = sum.wrapping_add(check(frame % PAGES));
            }
            std::hint::black_box(sum);
            started.elapsed().as_secs_f64() * 1e3 / FRAMES as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUNDS / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let frame: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 12_441_600,
    };
    let nic = Nic::open(&NicConfig::on(IpAddr::V4(Ipv4Addr::new(127, 0, 9, 1))))?;
    let bytes: Vec<u8> = (0..PAGES * frame)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    let heap = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Host(bytes.clone()),
    )?;
    let mapped_memory = MappedMemory::new(PAGES * frame)?;
    let mapped = Region::register(
        &nic,
        RegionAccess::Local,
        WriteOrder::InOrder,
        RegionMemory::Mapped(mapped_memory),
    )?;
    mapped.write(0, &bytes)?;
    let at = |page: usize| (page * frame) as u64;

    let mut out = vec![1u8; frame];
    let copied = |region: &Region, out: &mut Vec<u8>| {
        per_frame(|page| {
            let mut crc = crc32fast::Hasher::new();
            region
                .read_with(at(page), out, |piece| crc.update(piece))
                .expect("in range");
            crc.finalize()
        })
    };
    let inspected = |region: &Region| {
        per_frame(|page| {
            let mut crc = crc32fast::Hasher::new();
            region
                .inspect(at(page), frame as u64, |piece| crc.update(piece))
                .expect("in range");
            crc.finalize()
        })
    };
    println!("CRC of a {frame}-byte frame, ring of {PAGES} pages, ms per frame (median of {ROUNDS} rounds of {FRAMES}):");
    println!(
        "  host ring:   copied out {:.2}, inspected in place {:.2}",
        copied(&heap, &mut out),
        inspected(&heap)
    );
    println!(
        "  mapped ring: copied out {:.2}, inspected through a piece {:.2}",
        copied(&mapped, &mut out),
        inspected(&mapped)
    );
    let floor = per_frame(|page| crc32fast::hash(&bytes[page * frame..(page + 1) * frame]));
    println!("  a plain buffer's CRC in place: {floor:.2}");
    Ok(())
}
