//! The engine's hot path allocates nothing, per work request or per packet: two engines
//! joined by hand (every packet moved from one's `poll_transmit` to the other's
//! `handle_datagram` through one buffer), under a global allocator that counts.

mod fabric;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use fabric::{ConnectOptions, Fabric};
use ferroce_proto::engine::{roce_peer, MAX_PACKET};
use ferroce_proto::memory::Access;
use ferroce_proto::qp::{Mtu, Payload, QpType, RemoteAddr, SendOp, SendWr, Sge, WcStatus};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed straight to the system allocator; the count is a side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's promises are the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.load(Ordering::Relaxed)
}

/// Moves packets both ways until neither engine has one to send; returns how many moved.
fn shuttle(f: &mut Fabric, buf: &mut [u8]) -> u64 {
    let now = Instant::now();
    let mut moved = 0;
    loop {
        let mut any = false;
        for (from, to) in [(0, 1), (1, 0)] {
            while let Some(t) = {
                let node = &mut f.nodes[from];
                node.engine.poll_transmit(now, &node.mem, buf)
            } {
                let src = SocketAddr::new(f.nodes[from].ip, roce_peer(f.nodes[from].ip).port());
                let dst = f.nodes[to].ip;
                let node = &mut f.nodes[to];
                node.engine
                    .handle_datagram(now, src, dst, &buf[..t.len], &mut node.mem);
                moved += 1;
                any = true;
            }
        }
        if !any {
            return moved;
        }
    }
}

/// Posts `n` WRITEs of `size` bytes (one signaled, at the end) and moves every packet;
/// returns (allocations while posting, allocations while moving, packets moved).
fn writes(
    f: &mut Fabric,
    qp: ferroce_proto::wire::Qpn,
    n: u64,
    size: u32,
    buf: &mut [u8],
) -> (u64, u64, u64) {
    let src = f.region(0, size as usize, Access::LOCAL, 7);
    let dst = f.region(1, size as usize, Access::REMOTE_WRITE_ONLY, 0);
    let before = allocs();
    for i in 0..n {
        let mut wr = SendWr::new(
            i,
            SendOp::Write(RemoteAddr {
                va: dst.va,
                rkey: dst.rkey,
            }),
            Payload::Sge(Sge {
                addr: src.va,
                len: size,
                lkey: src.lkey,
            }),
        );
        wr.signaled = i + 1 == n;
        f.nodes[0].engine.post_send(qp, wr).unwrap();
        // Send as we go, as an application's posts do, so the send queue never holds all.
        shuttle(f, buf);
    }
    let posted = allocs() - before;
    let before = allocs();
    let moved = shuttle(f, buf);
    let moving = allocs() - before;
    let done = f.completions(0);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].status, WcStatus::Success);
    assert_eq!(f.bytes(1, &dst), f.bytes(0, &src));
    (posted, moving, moved)
}

#[test]
fn requests_and_packets_cost_no_allocations() {
    let mut f = Fabric::new(2, 11);
    let opts = ConnectOptions {
        mtu: Mtu::M1024,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let mut buf = vec![0u8; MAX_PACKET];
    // Warm up: queues and tables reach their working sizes.
    writes(&mut f, qa, 200, 65_536, &mut buf);

    let n = 100;
    let (small_post, _, _) = writes(&mut f, qa, n, 1024, &mut buf);
    let (large_post, _, _) = writes(&mut f, qa, n, 65_536, &mut buf);
    // Posting one request of one gather entry (`Payload::Sge`) and moving all of its packets
    // (1 for 1 KiB, 64 for 64 KiB at MTU 1024) costs no allocation at all. A per-request
    // allocation would show 1 here, a per-packet one 64 for the large requests.
    let per_request_small = small_post as f64 / n as f64;
    let per_request_large = large_post as f64 / n as f64;
    eprintln!("allocations per request: {per_request_small:.2} (1 packet), {per_request_large:.2} (64 packets)");
    assert!(per_request_small <= 1.0, "{per_request_small}");
    assert!(
        per_request_large <= per_request_small + 0.5,
        "{per_request_large}"
    );
}
