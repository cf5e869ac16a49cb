//! Whether the engine's work grows with idle queue pairs (issue 16): two engines in one
//! thread, packets handed over in memory (the `engine` bench's `pair`), one busy RC connection moving `BATCHES` × 64 RDMA
//! WRITEs of 4 KiB while `IDLE` other connected queue pairs on each engine send nothing.
//! Count the busy part's instructions with callgrind, once with no idle queue pairs and once
//! with many (BENCHMARKS.md):
//!
//! ```sh
//! cargo build --release -p ferroce-proto --example idle_qps
//! valgrind --tool=callgrind --toggle-collect='idle_qps::transfer' \
//!     target/release/examples/idle_qps 10000
//! ```

#[path = "../benches/pair/mod.rs"]
mod pair;

use std::hint::black_box;
use std::time::Instant;

use ferroce_proto::engine::MAX_PACKET;
use pair::Side;

const BATCHES: u64 = 200;
const BATCH: u64 = 64;
const SIZE: u32 = 4096;

/// The busy part, which callgrind counts: every batch posted, carried, completed; the
/// engines asked for their next timer after each exchange, as a driver does.
#[inline(never)]
fn transfer(a: &mut Side, b: &mut Side, now: Instant) -> u64 {
    let mut buf = vec![0u8; MAX_PACKET];
    (0..BATCHES)
        .map(|_| {
            pair::write_batch(a, b, SIZE, BATCH, now, &mut buf, |a, b| {
                black_box((a.engine.poll_timeout(), b.engine.poll_timeout()));
            })
        })
        .sum()
}

fn main() {
    let idle: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000);
    let (mut a, mut b) = pair::pair(SIZE as usize);
    for _ in 0..idle {
        let init_a = pair::qp_init(&mut a.engine, a.cq);
        let qa = a.engine.create_qp(init_a).unwrap();
        let init_b = pair::qp_init(&mut b.engine, b.cq);
        let qb = b.engine.create_qp(init_b).unwrap();
        pair::connect(&mut a.engine, qa, qb, b.ip);
        pair::connect(&mut b.engine, qb, qa, a.ip);
    }
    let start = Instant::now();
    let packets = transfer(&mut a, &mut b, start);
    let took = start.elapsed();
    println!(
        "{idle} idle QPs on each engine: {packets} packets for {} WRITEs, {:.0} ns per WRITE",
        BATCHES * BATCH,
        took.as_nanos() as f64 / (BATCHES * BATCH) as f64
    );
}
