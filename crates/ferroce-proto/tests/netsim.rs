//! Goodput against loss, as a snapshot: a recovery regression shows up as a diff.
//!
//! Sixteen 64 KiB RDMA WRITEs (1 MiB) over one RC QP, MTU 1024, on a simulated 10 Gbit/s link
//! with 5 µs of delay each way, a 1 ms ACK timeout (`timeout` 8) and `retry_cnt` 7, for each
//! loss rate. Everything is seeded and in virtual time, so the table is exact.

mod fabric;

use std::fmt::Write as _;

use fabric::{ConnectOptions, Fabric};
use ferroce_proto::memory::Access;
use ferroce_proto::qp::{Payload, QpType, RemoteAddr, SendOp, SendWr, Sge, WcStatus};

const WRITES: usize = 16;
const SIZE: usize = 64 * 1024;

fn run(loss_percent: u32) -> String {
    let mut f = Fabric::new(2, 0x600d_0000 + u64::from(loss_percent));
    f.link.bits_per_sec = 10_000_000_000;
    f.link.loss = f64::from(loss_percent) / 100.0;
    let (qa, _) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, SIZE, Access::LOCAL, 0x5a);
    let dst = f.region(1, WRITES * SIZE, Access::REMOTE, 0);
    for i in 0..WRITES {
        let local = Payload::Sges(vec![Sge {
            addr: src.va,
            len: SIZE as u32,
            lkey: src.lkey,
        }]);
        let remote = RemoteAddr {
            va: dst.va + (i * SIZE) as u64,
            rkey: dst.rkey,
        };
        f.nodes[0]
            .engine
            .post_send(qa, SendWr::new(i as u64, SendOp::Write(remote), local))
            .unwrap();
    }
    f.run();
    let done = f.completions(0);
    let ok = done
        .iter()
        .filter(|c| c.status == WcStatus::Success)
        .count();
    let landed = f.bytes(1, &dst).iter().filter(|&&b| b == 0x5a).count();
    let secs = f.elapsed().as_secs_f64();
    let c = *f.nodes[0].engine.counters();
    let r = *f.nodes[1].engine.counters();
    format!(
        "| {loss_percent:>3}% | {:>8.3} | {:>9.3} | {ok:>2}/{WRITES} | {:>7} | {:>7} | {:>6} | {:>6} |",
        (landed * 8) as f64 / secs / 1e9,
        secs * 1e3,
        c.sent_pkts,
        c.completer_retry_err,
        c.rcvd_seq_err,
        r.duplicate_request,
    )
}

#[test]
fn goodput_versus_loss() {
    let mut table = String::from(
        "| loss | Gbit/s | ms | done | packets | retries | seqNAK | dups |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for loss in [0, 1, 5, 10, 20, 30] {
        writeln!(table, "{}", run(loss)).unwrap();
    }
    insta::assert_snapshot!(table);
}
