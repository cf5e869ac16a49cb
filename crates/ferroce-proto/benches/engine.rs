//! The engine alone: requester → responder → completer for 64 B and 4 KiB RDMA WRITEs between
//! two engines in one thread, packets handed over in memory (`pair`). This is the ceiling the
//! UDP driver works under. Run with `cargo bench -p ferroce-proto --bench engine`.

#![allow(missing_docs)] // criterion_group! generates undocumented items

mod pair;

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ferroce_proto::engine::MAX_PACKET;

const BATCH: u64 = 64;

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("engine_write");
    for size in [64u32, 4096] {
        let (mut a, mut b) = pair::pair(size as usize);
        let mut buf = vec![0u8; MAX_PACKET];
        let now = Instant::now();
        group.throughput(Throughput::Elements(BATCH));
        group.bench_function(BenchmarkId::new("packets", size), |bench| {
            bench.iter(|| pair::write_batch(&mut a, &mut b, size, BATCH, now, &mut buf, |_, _| {}))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
