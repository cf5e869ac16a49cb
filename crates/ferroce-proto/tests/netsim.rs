//! Goodput against loss, as snapshots: a recovery regression shows up as a diff.
//!
//! Sixteen 64 KiB RDMA WRITEs, or one 1 MiB RDMA READ (eight READ requests of 128 packets),
//! over one RC QP, MTU 1024, on a simulated 10 Gbit/s link
//! with 5 µs of delay each way, perftest's and `ibv_rc_pingpong`'s ACK timeout (`timeout` 14,
//! 67 ms) and `retry_cnt` 7, for each loss rate. One run hangs on where a handful of packets fall (a lost sequence NAK costs a
//! whole timeout), so each row is the mean of [`SEEDS`] runs with different losses. The
//! responder refuses what rxe's refuses of a READ asked again (`fabric::rxe_read_replay`).
//! Everything is seeded and in virtual time, so the table is exact.

mod fabric;

use std::fmt::Write as _;

use fabric::{ConnectOptions, Fabric};
use ferroce_proto::memory::Access;
use ferroce_proto::qp::{Payload, QpType, RemoteAddr, SendOp, SendWr, Sge, WcStatus};

const WRITES: usize = 16;
const SIZE: usize = 64 * 1024;

/// What a run moves: 1 MiB either way.
#[derive(Clone, Copy)]
enum Work {
    /// Sixteen 64 KiB WRITEs.
    Writes,
    /// One 1 MiB READ.
    Read,
}
impl Work {
    /// How many requests a run posts.
    fn requests(self) -> u64 {
        match self {
            Self::Writes => WRITES as u64,
            Self::Read => 1,
        }
    }
}

/// Runs per loss rate.
const SEEDS: u64 = 10;
/// Runs per loss rate of the wider tables ([`read_goodput_versus_loss_wide`]).
const WIDE_SEEDS: u64 = 200;

/// One run's figures: goodput, duration, completions, data packets sent (requests for the
/// WRITEs, responses for the READ), retries, early resends, sequence NAKs received and
/// duplicates the responder saw.
#[derive(Default)]
struct Figures {
    gbits: f64,
    ms: f64,
    ok: usize,
    packets: u64,
    retries: u64,
    early: u64,
    seq_naks: u64,
    dups: u64,
}

fn run(work: Work, loss_percent: u32, seed: u64) -> Figures {
    let mut f = Fabric::new(2, 0x600d_0000 + u64::from(loss_percent) + (seed << 32));
    f.link.bits_per_sec = 10_000_000_000;
    f.link.loss = f64::from(loss_percent) / 100.0;
    let opts = ConnectOptions {
        timeout: 14,
        ..ConnectOptions::default()
    };
    let (qa, _) = f.connect(0, 1, QpType::Rc, &opts);
    let (dst, data_side) = match work {
        Work::Writes => {
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
            ((1, dst), 0)
        }
        Work::Read => {
            let len = WRITES * SIZE;
            let src = f.region(1, len, Access::REMOTE, 0x5a);
            let dst = f.region(0, len, Access::LOCAL, 0);
            let local = Payload::Sges(vec![Sge {
                addr: dst.va,
                len: len as u32,
                lkey: dst.lkey,
            }]);
            let remote = RemoteAddr {
                va: src.va,
                rkey: src.rkey,
            };
            f.nodes[0]
                .engine
                .post_send(qa, SendWr::new(0, SendOp::Read(remote), local))
                .unwrap();
            ((0, dst), 1)
        }
    };
    let (filter, refused) = fabric::rxe_read_replay(1024);
    f.filter = Some(filter);
    f.run();
    assert_eq!(
        refused.get(),
        0,
        "asked again for a READ's part that rxe refuses ({loss_percent} % loss, seed {seed})"
    );
    let done = f.completions(0);
    let ok = done
        .iter()
        .filter(|c| c.status == WcStatus::Success)
        .count();
    let landed = f
        .bytes(dst.0, &dst.1)
        .iter()
        .filter(|&&b| b == 0x5a)
        .count();
    let secs = f.busy_for().as_secs_f64();
    let c = *f.nodes[0].engine.counters();
    let r = *f.nodes[1].engine.counters();
    Figures {
        gbits: (landed * 8) as f64 / secs / 1e9,
        ms: secs * 1e3,
        ok,
        packets: f.nodes[data_side].engine.counters().sent_pkts,
        retries: c.completer_retry_err,
        early: c.early_resends,
        seq_naks: c.rcvd_seq_err,
        dups: r.duplicate_request,
    }
}

/// A row of a table: the means over the runs of `seeds`, and the completions of all of them.
fn row(work: Work, loss_percent: u32, seeds: u64) -> String {
    let mut sum = Figures::default();
    for seed in 0..seeds {
        let f = run(work, loss_percent, seed);
        sum.gbits += f.gbits;
        sum.ms += f.ms;
        sum.ok += f.ok;
        sum.packets += f.packets;
        sum.retries += f.retries;
        sum.early += f.early;
        sum.seq_naks += f.seq_naks;
        sum.dups += f.dups;
    }
    let n = seeds as f64;
    let mean = |x: u64| x as f64 / n;
    format!(
        "| {loss_percent:>3}% | {:>8.3} | {:>9.3} | {:>3}/{} | {:>8.1} | {:>7.1} | {:>5.1} | {:>6.1} | {:>6.1} |",
        sum.gbits / n,
        sum.ms / n,
        sum.ok,
        work.requests() * seeds,
        mean(sum.packets),
        mean(sum.retries),
        mean(sum.early),
        mean(sum.seq_naks),
        mean(sum.dups),
    )
}

fn table(work: Work, losses: &[u32], seeds: u64) -> String {
    let mut table = String::from(
        "| loss | Gbit/s | ms | done | packets | retries | early | seqNAK | dups |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for &loss in losses {
        writeln!(table, "{}", row(work, loss, seeds)).unwrap();
    }
    table
}

#[test]
fn goodput_versus_loss() {
    insta::assert_snapshot!(table(Work::Writes, &[0, 1, 3, 5, 10, 20, 30], SEEDS));
}

#[test]
fn read_goodput_versus_loss() {
    insta::assert_snapshot!(table(Work::Read, &[0, 1, 3, 5, 10, 20], SEEDS));
}

/// The READ table over [`WIDE_SEEDS`] runs a row, for BENCHMARKS.md: where a change moves
/// what happens rarely (an ACK timeout), ten runs a row show noise. Not a snapshot (it takes
/// a few seconds in a release build); it checks that every READ completed, and each run
/// that nothing was asked for that rxe refuses.
/// `cargo test --release -p ferroce-proto --test netsim -- --ignored --nocapture`
#[test]
#[ignore = "a measurement for BENCHMARKS.md: the READ table over 200 seeds a row"]
fn read_goodput_versus_loss_wide() {
    wide_table(Work::Read, &[1, 3, 5, 10, 20]);
}

/// The WRITE table over [`WIDE_SEEDS`] runs a row, as [`read_goodput_versus_loss_wide`].
#[test]
#[ignore = "a measurement for BENCHMARKS.md: the WRITE table over 200 seeds a row"]
fn write_goodput_versus_loss_wide() {
    wide_table(Work::Writes, &[1, 3, 5, 10, 20, 30]);
}

/// Prints `work`'s table at `losses` over [`WIDE_SEEDS`] runs a row, and checks that every
/// run completed its work.
fn wide_table(work: Work, losses: &[u32]) {
    let table = table(work, losses, WIDE_SEEDS);
    println!("{table}");
    let all = WIDE_SEEDS * work.requests();
    let done = format!("{all}/{all}");
    assert_eq!(
        table.lines().filter(|l| l.contains(&done)).count(),
        losses.len(),
        "a request did not complete"
    );
}
