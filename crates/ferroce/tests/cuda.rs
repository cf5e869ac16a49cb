//! The faces on a real GPU (the `cuda` feature): frames delivered into CUDA memory, a
//! session over CUDA regions, and cache buffers by GPU id. Without a GPU each test checks
//! that the refusal says why, prints that it skipped the GPU part, and passes; with
//! `FERROCE_REQUIRE_GPU=1` (what `scripts/gpu-check.sh` sets) a missing GPU is a failure.
//!
//! Addresses: 127.0.0.130 to 127.0.0.135; TCP ports 19540 to 19541.

#![cfg(feature = "cuda")]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use ferroce::cache::{CacheError, Context, ContextConfig, Device};
use ferroce::cuda::{device_count, CudaMemory};
use ferroce::device::{DeviceError, DeviceMemory};
use ferroce::frames::{Pattern, Receiver, ReceiverConfig, Sender};
use ferroce::session::{ChannelDesc, ConnectInfo, DeviceCall, MemoryKind, SessionError};
use ferroce::{Nic, NicConfig};

mod support;
use support::{established_controller, established_coprocessor, target};

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

/// Whether there is a GPU; if not, checks the reason names CUDA and says the test skips.
fn gpu(test: &str) -> bool {
    match device_count() {
        Ok(n) if n > 0 => true,
        other => {
            let why = match other {
                Ok(_) => "the CUDA driver reports no device".to_string(),
                Err(e) => e.to_string(),
            };
            assert!(
                std::env::var_os("FERROCE_REQUIRE_GPU").is_none(),
                "{test}: a GPU was required: {why}"
            );
            assert!(why.contains("CUDA"), "{why}");
            eprintln!("{test}: skipping, no GPU: {why}");
            false
        }
    }
}

#[test]
fn frames_land_in_cuda_memory() {
    if !gpu("frames_land_in_cuda_memory") {
        assert!(matches!(
            CudaMemory::alloc(0, 4096),
            Err(DeviceError::Unavailable(_))
        ));
        return;
    }
    let nic = Nic::open(&NicConfig::on(ip(130))).unwrap();
    let config = ReceiverConfig::for_frames(1_000_000, 3, ip(131));
    let ring = config.page_size * 3;
    let memory: Arc<dyn DeviceMemory> = Arc::new(CudaMemory::alloc(0, ring).unwrap());
    let rx = Receiver::new();
    rx.start(&nic, config.with_device_memory(Arc::clone(&memory)))
        .unwrap();
    let monitor = {
        let rx = rx.clone();
        thread::spawn(move || rx.blocking_monitor())
    };
    let target = target(&rx, 4096);
    let mut tx = Sender::new(SocketAddr::new(ip(131), 0), target).unwrap();
    for n in 0..6u32 {
        let mut data = vec![0; 1_000_000];
        Pattern::Counter.fill(n, &mut data);
        tx.send_frame(&data, None).unwrap();
        let frame = rx
            .next_frame(Duration::from_secs(5))
            .unwrap()
            .expect("a frame");
        // Straight from the GPU, not through the receiver.
        let mut on_gpu = vec![0; data.len()];
        memory
            .read(u64::from(frame.page) * rx.page_size() as u64, &mut on_gpu)
            .unwrap();
        assert!(on_gpu == data, "frame {n} in CUDA memory");
    }
    rx.close();
    assert_eq!(monitor.join().unwrap(), Ok(()));
}

#[test]
fn a_session_runs_over_cuda_regions() {
    let desc = ChannelDesc::new(4, 4096, 4096);
    let info = |host: u8| {
        ConnectInfo::new(ip(host), SocketAddr::new(ip(133), 19540))
            .with_timeout(Duration::from_secs(10))
    };
    let size = desc.region_bytes() as usize;
    let cuda = MemoryKind::Cuda { device: 0 };
    let coprocessor = thread::spawn(move || {
        let (s, mem) = established_coprocessor(&info(133), &desc, |s| s.alloc_memory(size, cuda))?;
        s
            // Echo on the GPU: the request is read from and the reply left in CUDA memory.
            .set_device_coprocessor_fn(|call: DeviceCall<'_>| {
                let mut request = vec![0; call.request_len];
                call.memory
                    .read(call.request_offset, &mut request)
                    .map_err(|e| e.to_string())?;
                call.memory
                    .write(call.reply_offset, &request)
                    .map_err(|e| e.to_string())?;
                Ok(request.len())
            })?
            .start()
            .map(|s| (s, mem))
    });
    let established = established_controller(&info(132), &desc, |s| s.alloc_memory(size, cuda));
    let (s, mem) = match established {
        Ok(done) => done,
        Err(SessionError::Unsupported(why)) => {
            assert!(!gpu("a_session_runs_over_cuda_regions"), "{why}");
            assert!(matches!(
                coprocessor.join().unwrap(),
                Err(SessionError::Unsupported(_))
            ));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let mut controller = s.start().unwrap();
    let (mut served, served_mem) = coprocessor.join().unwrap().unwrap();
    let request: Vec<u8> = (0..3000u32).map(|i| (i * 13) as u8).collect();
    controller.submit(&request).unwrap();
    let mut reply = vec![0u8; 4096];
    let got = controller.collect(&mut [&mut reply[..]]).unwrap();
    assert_eq!(reply[..got.bytes], request[..]);
    // The request sits in the coprocessor's GPU memory (slot 0), the reply in ours.
    let mut on_gpu = vec![0u8; request.len()];
    served_mem
        .device_memory()
        .unwrap()
        .read(0, &mut on_gpu)
        .unwrap();
    assert_eq!(on_gpu, request);
    mem.device_memory().unwrap().read(0, &mut on_gpu).unwrap();
    assert_eq!(on_gpu, request);
    controller.stop();
    served.stop();
}

#[test]
fn cache_buffers_by_gpu_id() {
    let oob = SocketAddr::new(ip(134), 19541);
    let config = move |host: u8, listen: bool| {
        let mut c = ContextConfig::new(ip(host), oob, listen).with_max_message(1 << 16);
        c.nic.set_port(19541);
        c
    };
    let listener = thread::spawn(move || Context::connect(&config(134, true)));
    let b = Context::connect(&config(135, false)).unwrap();
    let a = listener.join().unwrap().unwrap();
    let buffer = match b.write_memory(40_000, Device::Gpu(0)) {
        Ok(buffer) => buffer,
        Err(CacheError::NotSupported(why)) => {
            assert!(!gpu("cache_buffers_by_gpu_id"), "{why}");
            assert!(why.contains("CUDA"), "{why}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let data: Vec<u8> = (0..40_000u32).map(|i| (i * 7) as u8).collect();
    buffer.write(0, &data).unwrap();
    b.flush(&buffer).unwrap();
    assert_eq!(a.receive(Duration::from_secs(5)).unwrap().to_vec(), data);
}
