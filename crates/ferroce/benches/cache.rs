//! Cost per buffer: a buffer from the registered-buffer cache (neuray's `IRDMA_context`) against
//! registering (and deregistering) a fresh region every time, at 4 KiB and 1 MiB. Two contexts
//! bound to each other over loopback (127.0.0.78 and 127.0.0.79, ports 19540).

#![allow(missing_docs)] // criterion_group! generates undocumented items

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ferroce::cache::{Context, ContextConfig, Device};
use ferroce::proto::memory::WriteOrder;
use ferroce::{Region, RegionAccess, RegionMemory};

fn pair() -> (Context, Context) {
    let ip = |h| IpAddr::V4(Ipv4Addr::new(127, 0, 0, h));
    let oob = SocketAddr::new(ip(78), 19540);
    let config = move |host: u8, listen: bool| {
        let mut c = ContextConfig::new(ip(host), oob, listen)
            .with_max_message(1 << 20)
            .with_timeout(Duration::from_secs(10));
        c.nic.set_port(19540);
        c
    };
    let listener = std::thread::spawn(move || Context::connect(&config(78, true)).unwrap());
    let dialler = Context::connect(&config(79, false)).unwrap();
    (listener.join().unwrap(), dialler)
}

fn per_buffer(c: &mut Criterion) {
    let (a, _b) = pair();
    // The NIC a fresh registration goes to: the same one the context uses.
    let nic = ferroce::Nic::open(&ferroce::NicConfig {
        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 79)), 19541),
        ..ferroce::NicConfig::default()
    })
    .unwrap();
    let mut group = c.benchmark_group("buffer");
    for size in [4096usize, 1 << 20] {
        group.bench_with_input(BenchmarkId::new("cached", size), &size, |b, &size| {
            b.iter(|| {
                let buffer = a.write_memory(size, Device::Host).unwrap();
                buffer.write(0, &[1]).unwrap();
                drop(buffer);
            });
        });
        group.bench_with_input(
            BenchmarkId::new("register_each_time", size),
            &size,
            |b, &size| {
                b.iter(|| {
                    let region = Region::register(
                        &nic,
                        RegionAccess::Remote,
                        WriteOrder::InOrder,
                        RegionMemory::Host(vec![0; size]),
                    )
                    .unwrap();
                    region.write(0, &[1]).unwrap();
                    drop(region);
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, per_buffer);
criterion_main!(benches);
