//! The soak's verbs round in virtual time: a WRITE, a READ of it back, a fetch-and-add, two
//! compare-and-swaps and a SEND with immediate, all posted at once on one RC QP, round after
//! round at 2 % loss, over many seeds. Every request must complete successfully and every
//! atomic must act exactly once: at 2 % loss, seven retries running out is a recovery bug,
//! not bad luck (the wall-clock soak in `ferroce`'s tests met one such bug 1 run in 16; here
//! it is found at once and replayed exactly from its seed).

mod fabric;

use fabric::{ConnectOptions, Fabric, Rng};
use ferroce_proto::memory::{Access, RegionInfo};
use ferroce_proto::qp::{Payload, QpType, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus};

/// The largest WRITE, READ and SEND: 256 packets at MTU 1024, as in the soak.
const MAX: usize = 256 * 1024;
const SEEDS: u64 = 16;
const ROUNDS: u64 = 120;

fn sge(region: &RegionInfo, at: u64, len: u32) -> Payload {
    Payload::Sges(vec![Sge {
        addr: region.va + at,
        len,
        lkey: region.lkey,
    }])
}

/// Runs `ROUNDS` rounds with the loss drawn from `seed`; panics with the round and the
/// counters of both ends at the first one that goes wrong.
fn rounds(seed: u64) {
    let mut f = Fabric::new(2, 0xabc0_0000 + seed);
    f.link.loss = 0.02;
    let opts = ConnectOptions {
        timeout: 14,
        max_rd_atomic: 16,
        ..ConnectOptions::default()
    };
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, MAX, Access::LOCAL, 0);
    let sink = f.region(0, MAX, Access::LOCAL, 0);
    let result = f.region(0, 24, Access::LOCAL, 0);
    let dst = f.region(1, MAX + 64, Access::REMOTE, 0);
    let recv = f.region(1, MAX, Access::LOCAL, 0);
    let word = f.region(1, 8, Access::REMOTE, 0);
    let mut rng = Rng::new(seed * 7 + 1);
    let mut model = 0u64;
    for r in 0..ROUNDS {
        let len = 1 + rng.below(MAX as u64) as usize;
        let at = rng.below(64);
        let send_len = (1 + rng.below(MAX as u64) as usize).min(len);
        let add = 1 + rng.below(1 << 20);
        let swap = rng.below(u64::MAX);
        let fill = r as u8 ^ seed as u8;
        f.bytes_mut(0, &src)[..len].fill(fill);
        f.post_recv(1, qb, 6, &recv, 0, MAX as u32);
        let word_at = RemoteAddr {
            va: word.va,
            rkey: word.rkey,
        };
        let dst_at = RemoteAddr {
            va: dst.va + at,
            rkey: dst.rkey,
        };
        let after_add = model.wrapping_add(add);
        let wrs = [
            SendWr::new(1, SendOp::Write(dst_at), sge(&src, 0, len as u32)),
            SendWr::new(2, SendOp::Read(dst_at), sge(&sink, 0, len as u32)),
            SendWr::new(
                3,
                SendOp::FetchAdd {
                    remote: word_at,
                    add,
                },
                sge(&result, 0, 8),
            ),
            SendWr::new(
                4,
                SendOp::CompareSwap {
                    remote: word_at,
                    compare: after_add,
                    swap,
                },
                sge(&result, 8, 8),
            ),
            SendWr::new(
                5,
                SendOp::CompareSwap {
                    remote: word_at,
                    compare: swap ^ 1,
                    swap: 0xdead,
                },
                sge(&result, 16, 8),
            ),
            SendWr::new(
                7,
                SendOp::SendWithImm(r as u32),
                sge(&src, 0, send_len as u32),
            ),
        ];
        for wr in wrs {
            f.nodes[0].engine.post_send(qa, wr).unwrap();
        }
        f.run();

        let a = f.completions(0);
        let b = f.completions(1);
        let got: Vec<_> = a.iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<_> = [1, 2, 3, 4, 5, 7]
            .into_iter()
            .map(|id| (id, WcStatus::Success))
            .collect();
        let recv_ok = b.len() == 1
            && b[0].status == WcStatus::Success
            && b[0].opcode == WcOpcode::Recv
            && b[0].byte_len as usize == send_len
            && b[0].imm == Some(r as u32);
        assert!(
            got == want && recv_ok,
            "seed {seed} round {r}: A {a:?}\nB {b:?}\nA's counters {:?}\nB's counters {:?}",
            f.nodes[0].engine.counters(),
            f.nodes[1].engine.counters()
        );
        // The bytes, and each atomic once: the add, the swap that matched, the one that did
        // not.
        assert!(
            f.bytes(1, &dst)[at as usize..][..len]
                .iter()
                .all(|&b| b == fill),
            "seed {seed} round {r}: the WRITE landed wrong"
        );
        assert!(
            f.bytes(0, &sink)[..len].iter().all(|&b| b == fill),
            "seed {seed} round {r}: the READ brought back something else"
        );
        let results = f.bytes(0, &result);
        let word_was = |i: usize| u64::from_ne_bytes(results[i * 8..][..8].try_into().unwrap());
        assert_eq!(
            [word_was(0), word_was(1), word_was(2)],
            [model, after_add, swap],
            "seed {seed} round {r}: the atomics' original values"
        );
        let now = u64::from_ne_bytes(f.bytes(1, &word).try_into().unwrap());
        assert_eq!(
            now, swap,
            "seed {seed} round {r}: the word after the atomics"
        );
        model = swap;
    }
}

#[test]
fn every_request_of_every_round_completes_at_two_percent_loss() {
    for seed in 0..SEEDS {
        rounds(seed);
    }
}
