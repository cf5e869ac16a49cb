//! The registered-buffer cache (neuray's `IRDMA_context`) over real UDP sockets on loopback: two
//! contexts in one process, bound to each other. Each test has its own addresses (127.0.0.78,
//! 127.0.0.79) and UDP and TCP ports (19520 and up), so they run in parallel. GPU buffers come from
//! a stand-in allocator whose device memory lives in host RAM.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use ferroce::cache::{size_class, CacheError, Context, ContextConfig, Device};
use ferroce::device::{DeviceAllocator, DeviceMemory};

mod support;
use support::{FakeAllocator, FakeDevice};

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

/// Two contexts bound to each other: one on 127.0.0.78 listening on TCP `port`, one on
/// 127.0.0.79 dialling it; both NICs on UDP `port`.
fn pair(port: u16, max_message: usize) -> (Context, Context) {
    let oob = SocketAddr::new(ip(78), port);
    let config = move |host: u8, listen: bool| {
        let mut c = ContextConfig::new(ip(host), oob, listen).with_max_message(max_message);
        c.nic.set_port(port);
        c.timeout = Duration::from_secs(10);
        c
    };
    let listener = thread::spawn(move || Context::connect(&config(78, true)));
    let dialler = Context::connect(&config(79, false)).unwrap();
    (listener.join().unwrap().unwrap(), dialler)
}

/// As [`pair`], with GPU buffers from `allocator`, and the dialler's read buffers on
/// `receive_device`.
fn pair_with(
    port: u16,
    max_message: usize,
    allocator: &Arc<FakeAllocator>,
    receive_device: Device,
) -> (Context, Context) {
    let oob = SocketAddr::new(ip(78), port);
    let config = move |host: u8, listen: bool| {
        let mut c = ContextConfig::new(ip(host), oob, listen).with_max_message(max_message);
        c.nic.set_port(port);
        c.timeout = Duration::from_secs(10);
        c
    };
    let listener = {
        let allocator = Arc::clone(allocator) as Arc<dyn DeviceAllocator>;
        thread::spawn(move || Context::connect_with_allocator(&config(78, true), Some(allocator)))
    };
    let dialler = Context::connect_with_allocator(
        &config(79, false).with_receive_device(receive_device),
        Some(Arc::clone(allocator) as Arc<dyn DeviceAllocator>),
    )
    .unwrap();
    (listener.join().unwrap().unwrap(), dialler)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(17).wrapping_add(seed))
        .collect()
}

#[test]
fn flush_lands_in_a_remote_read_buffer() {
    let (a, b) = pair(19520, 8192);
    assert_eq!(a.remote_max_message(), 8192);
    for (len, seed) in [(1usize, 1u8), (100, 2), (4096, 3), (8192, 4)] {
        let buffer = a.write_memory(len, Device::Host).unwrap();
        assert_eq!(buffer.len(), len);
        assert_eq!(buffer.capacity(), size_class(len));
        buffer.write(0, &pattern(len, seed)).unwrap();
        a.flush(&buffer).unwrap();
        let got = b.receive(Duration::from_secs(10)).unwrap();
        assert_eq!(got.len(), len);
        assert!(got.to_vec() == pattern(len, seed));
    }
    // The other way, from a wrapped user buffer, which comes back afterwards.
    let user = b.wrap_user_buffer(pattern(3000, 9), Device::Host).unwrap();
    b.flush(&user).unwrap();
    let got = a.receive(Duration::from_secs(10)).unwrap();
    assert!(got.to_vec() == pattern(3000, 9));
    assert!(user.into_user_buffer().unwrap() == pattern(3000, 9));
    // A write buffer shortened before the flush sends only its length.
    let mut buffer = a.write_memory(1000, Device::Host).unwrap();
    buffer.write(0, &pattern(1000, 5)).unwrap();
    buffer.set_len(10).unwrap();
    a.flush(&buffer).unwrap();
    assert!(b.receive(Duration::from_secs(10)).unwrap().to_vec() == pattern(10, 5));
    assert!(buffer.set_len(size_class(1000) + 1).is_err());
    // Nothing more came.
    assert!(matches!(
        b.receive(Duration::from_millis(50)),
        Err(CacheError::Timeout { .. })
    ));
}

#[test]
fn buffers_are_recycled_by_size_class_and_registered_once() {
    let (a, _b) = pair(19521, 4096);
    let first = a.read_memory(1000, Device::Host).unwrap();
    let before = a.stats();
    drop(first);
    assert_eq!(a.stats().cached_buffers, before.cached_buffers + 1);
    for size in [1000, 1024, 600, 513] {
        // All in the 1024-byte class: the same registration every time.
        let again = a.read_memory(size, Device::Host).unwrap();
        assert_eq!(again.capacity(), 1024);
        assert_eq!(again.len(), size);
    }
    let after = a.stats();
    assert_eq!(after.registrations, before.registrations);
    assert_eq!(after.hits, before.hits + 4);
    // Another class registers.
    drop(a.read_memory(2000, Device::Host).unwrap());
    assert_eq!(a.stats().registrations, after.registrations + 1);
    assert_eq!(size_class(1), 64);
    assert_eq!(size_class(65), 128);
}

#[test]
fn seed_codes_map_to_typed_errors() {
    let (a, b) = pair(19522, 4096);
    let zero = a.write_memory(0, Device::Host).unwrap_err();
    assert!(matches!(zero, CacheError::InvalidParameters(_)), "{zero}");
    assert_eq!(zero.seed_code(), Some(-1));
    // No GPU 4095 here, whatever the build: without the `cuda` feature there is no
    // allocator, with it no such device.
    let gpu = a.read_memory(64, Device::Gpu(4095)).unwrap_err();
    assert!(matches!(gpu, CacheError::NotSupported(_)), "{gpu}");
    assert_eq!(gpu.seed_code(), Some(-2));
    assert!(gpu.to_string().contains("not supported in this context"));
    assert!(matches!(
        a.wrap_user_buffer(vec![1; 8], Device::Gpu(1)),
        Err(CacheError::NotSupported(_))
    ));
    assert_eq!(Device::from_seed_id(-1).unwrap(), Device::Host);
    assert_eq!(Device::from_seed_id(2).unwrap(), Device::Gpu(2));
    assert_eq!(Device::from_seed_id(-2).unwrap_err().seed_code(), Some(-1));
    // Larger than the remote's read buffers: refused up front (neuray's NULL).
    assert!(matches!(
        a.write_memory(4097, Device::Host),
        Err(CacheError::TooLargeForRemote {
            size: 4097,
            max: 4096
        })
    ));
    let big = a.read_memory(5000, Device::Host).unwrap();
    assert!(matches!(
        a.flush(&big),
        Err(CacheError::TooLargeForRemote { .. })
    ));
    // A buffer of another context is an invalid parameter (-1).
    let foreign = b.write_memory(10, Device::Host).unwrap();
    let err = a.flush(&foreign).unwrap_err();
    assert_eq!(err.seed_code(), Some(-1), "{err}");
    // Ranges outside a buffer.
    let small = a.write_memory(10, Device::Host).unwrap();
    assert!(small.write(5, &[0; 6]).is_err());
    assert!(small.read(usize::MAX, &mut [0; 2]).is_err());
    assert!(matches!(
        small.into_user_buffer(),
        Err(buffer) if buffer.len() == 10
    ));
}

#[test]
fn concurrent_use_from_several_threads() {
    let (a, b) = pair(19523, 16384);
    let threads = 4;
    let per_thread = 50;
    let receiver = {
        let b = b.clone();
        thread::spawn(move || {
            let mut seen = Vec::new();
            for _ in 0..threads * per_thread {
                let got = b.receive(Duration::from_secs(20)).unwrap();
                let bytes = got.to_vec();
                // Each message says who sent it and how long it is.
                let (t, i) = (bytes[0], bytes[1]);
                let len = 2 + (usize::from(t) * 1000 + usize::from(i) * 37) % 16000;
                assert_eq!(bytes.len(), len);
                assert!(bytes[2..] == pattern(len - 2, t ^ i)[..]);
                seen.push((t, i));
            }
            seen
        })
    };
    let a = Arc::new(a);
    let senders: Vec<_> = (0..threads)
        .map(|t| {
            let a = Arc::clone(&a);
            thread::spawn(move || {
                for i in 0..per_thread {
                    let (t, i) = (t as u8, i as u8);
                    let len = 2 + (usize::from(t) * 1000 + usize::from(i) * 37) % 16000;
                    let buffer = a.write_memory(len, Device::Host).unwrap();
                    buffer.write(0, &[t, i]).unwrap();
                    buffer.write(2, &pattern(len - 2, t ^ i)).unwrap();
                    a.flush(&buffer).unwrap();
                    // Read buffers too, from the same cache at the same time.
                    drop(a.read_memory(len, Device::Host).unwrap());
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let mut seen = receiver.join().unwrap();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(
        seen.len(),
        threads * per_thread,
        "every message exactly once"
    );
    let stats = a.stats();
    // 400 buffers handed out; far fewer registered.
    assert!(
        stats.registrations < 100,
        "{stats:?}: registration should be paid once per buffer, not per message"
    );
    assert!(stats.hits > 300, "{stats:?}");
}

#[test]
fn a_full_cache_deregisters_what_comes_back() {
    let oob = SocketAddr::new(ip(78), 19524);
    let config = move |host: u8, listen: bool| {
        let mut c = ContextConfig::new(ip(host), oob, listen)
            .with_max_message(64)
            .with_max_cached_bytes(64 * 16 + 4096);
        c.nic.set_port(19524);
        c
    };
    let listener = thread::spawn(move || Context::connect(&config(78, true)).unwrap());
    let a = Context::connect(&config(79, false)).unwrap();
    let _b = listener.join().unwrap();
    let held: Vec<_> = (0..4)
        .map(|_| a.read_memory(4096, Device::Host).unwrap())
        .collect();
    drop(held);
    let stats = a.stats();
    assert_eq!(stats.evictions, 3, "{stats:?}");
    assert!(stats.cached_bytes <= 64 * 16 + 4096, "{stats:?}");
}

#[test]
fn a_remote_that_disappears_fails_the_flush() {
    let (a, b) = pair(19525, 4096);
    drop(b);
    let buffer = a.write_memory(100, Device::Host).unwrap();
    let err = a.flush(&buffer).unwrap_err();
    assert!(
        matches!(err, CacheError::Transport(_) | CacheError::Timeout { .. }),
        "{err}"
    );
}

#[test]
fn gpu_buffers_flush_from_and_receive_into_device_memory() {
    let allocator = Arc::new(FakeAllocator::default());
    let (a, b) = pair_with(19526, 8192, &allocator, Device::Gpu(1));
    // The dialler's 16 read buffers are on GPU 1, registered once.
    assert_eq!(allocator.allocations.load(Ordering::SeqCst), 16);

    let data = pattern(3000, 5);
    let buffer = b.write_memory(3000, Device::Gpu(0)).unwrap();
    assert_eq!(buffer.device(), Device::Gpu(0));
    buffer.write(0, &data).unwrap();
    let mut back = vec![0; 3000];
    buffer.read(0, &mut back).unwrap();
    assert_eq!(back, data);
    b.flush(&buffer).unwrap();
    let got = a.receive(Duration::from_secs(5)).unwrap();
    assert_eq!(got.device(), Device::Host);
    assert_eq!(got.to_vec(), data, "flush sent the device's bytes");

    // The other way: into a read buffer on GPU 1, copied there before receive returns.
    let reply = pattern(5000, 9);
    let out = a.write_memory(5000, Device::Host).unwrap();
    out.write(0, &reply).unwrap();
    a.flush(&out).unwrap();
    let got = b.receive(Duration::from_secs(5)).unwrap();
    assert_eq!(got.device(), Device::Gpu(1));
    let device = got
        .device_memory()
        .expect("a GPU read buffer has device memory");
    let mut on_device = vec![0; 5000];
    device.read(0, &mut on_device).unwrap();
    assert_eq!(on_device, reply);
    assert_eq!(got.to_vec(), reply);
    drop(got);

    // Registration and allocation are paid once per buffer: the same class comes back.
    drop(buffer);
    let before = allocator.allocations.load(Ordering::SeqCst);
    let hits = b.stats().hits;
    let again = b.write_memory(2500, Device::Gpu(0)).unwrap();
    assert_eq!(b.stats().hits, hits + 1);
    assert_eq!(allocator.allocations.load(Ordering::SeqCst), before);
    drop(again);

    // A device the allocator does not have is neuray's -2, and no miss: nothing was
    // registered for it.
    let misses = b.stats().misses;
    let err = b.write_memory(64, Device::Gpu(9)).unwrap_err();
    assert_eq!(b.stats().misses, misses);
    assert_eq!(err.seed_code(), Some(-2), "{err}");
    assert!(err.to_string().contains("no fake device 9"), "{err}");

    // The application's own device memory, wrapped; and a device that refuses a copy.
    let own = FakeDevice::new(700, usize::MAX);
    own.write(0, &pattern(700, 1)).unwrap();
    let wrapped = b.wrap_device_memory(own, 3).unwrap();
    assert_eq!((wrapped.len(), wrapped.device()), (700, Device::Gpu(3)));
    b.flush(&wrapped).unwrap();
    assert_eq!(
        a.receive(Duration::from_secs(5)).unwrap().to_vec(),
        pattern(700, 1)
    );
    assert!(
        wrapped.into_user_buffer().is_err(),
        "device memory is not host bytes"
    );
    let broken = b.wrap_device_memory(FakeDevice::new(64, 1), 3).unwrap();
    let err = broken.write(0, &[1; 8]).unwrap_err();
    assert!(matches!(err, CacheError::Device(_)), "{err}");
    assert!(err.to_string().contains("illegal address"), "{err}");
}
