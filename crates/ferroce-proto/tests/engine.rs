//! The RC and UC engine on a simulated fabric: one short script per path.

mod fabric;

use std::time::Duration;

use fabric::{ConnectOptions, Fabric};
use ferroce_proto::engine::PROBE_PSNS;
use ferroce_proto::memory::{Access, Memory, RegionId, RegionInfo};
use ferroce_proto::qp::{
    Completion, ModifyError, Mtu, Payload, PostError, QpAttr, QpState, QpType, RemoteAddr, SendOp,
    SendWr, Sge, WcOpcode, WcStatus,
};
use ferroce_proto::wire::{NakCode, Operation, Qpn, RnrTimer, Syndrome};
use ferroce_proto::{Counters, Psn};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn sge(region: &RegionInfo, at: u64, len: u32) -> Payload {
    Payload::Sges(vec![Sge {
        addr: region.va + at,
        len,
        lkey: region.lkey,
    }])
}

fn remote(region: &RegionInfo, at: u64) -> RemoteAddr {
    RemoteAddr {
        va: region.va + at,
        rkey: region.rkey,
    }
}

fn only(completions: &[Completion]) -> Completion {
    assert_eq!(completions.len(), 1, "{completions:?}");
    completions[0]
}

/// Posts `wr` on node 0's QP `qp`, runs the fabric until it is idle, and checks that the
/// request completed, alone and successfully.
fn post_and_complete(f: &mut Fabric, qp: Qpn, wr: SendWr) {
    f.nodes[0].engine.post_send(qp, wr).unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
}

/// Drops the first packet node `sender` sends with operation `op`, and only that one.
fn drop_first(f: &mut Fabric, sender: usize, op: Operation) {
    let mut dropped = false;
    f.filter = Some(Box::new(move |from, p| {
        let hit = from == sender && !dropped && p.opcode().operation() == op;
        dropped |= hit;
        hit
    }));
}

#[test]
fn send_recv_single_and_multi_packet() {
    let mut f = Fabric::new(2, 1);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 8192, Access::LOCAL, 0);
    let dst = f.region(1, 8192, Access::LOCAL, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(8192, 3));
    f.post_recv(1, qb, 100, &dst, 0, 64);
    f.post_recv(1, qb, 101, &dst, 64, 8000);
    let engine = &mut f.nodes[0].engine;
    engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(2, SendOp::SendWithImm(0xdead_beef), sge(&src, 64, 5000)),
        )
        .unwrap();
    f.run();

    let sent = f.completions(0);
    assert_eq!(
        sent.iter()
            .map(|c| (c.wr_id, c.status, c.opcode))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, WcOpcode::Send),
            (2, WcStatus::Success, WcOpcode::Send),
        ]
    );
    let recvd = f.completions(1);
    assert_eq!(recvd.len(), 2);
    assert_eq!(
        (recvd[0].wr_id, recvd[0].byte_len, recvd[0].imm),
        (100, 64, None)
    );
    assert_eq!(
        (recvd[1].wr_id, recvd[1].byte_len, recvd[1].imm),
        (101, 5000, Some(0xdead_beef))
    );
    assert!(
        f.bytes(1, &dst)[..5064] == pattern(8192, 3)[..5064],
        "bytes differ"
    );
    assert_eq!(f.nodes[1].engine.counters().rdma_recvs, 2);
    // 1 + 5 packets, each MTU-sized but the last.
    assert_eq!(f.nodes[0].engine.counters().sent_pkts, 6);
}

/// The engine's usual round trip, by which the soft NIC's driver scales its timing, runs from
/// a request's sending to the ACK that answers it, over all of the engine's queue pairs.
#[test]
fn the_round_trip_runs_from_a_request_to_its_ack() {
    let mut f = Fabric::new(2, 3);
    f.link.delay = Duration::from_micros(300);
    let (qa, _) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 64, Access::LOCAL, 1);
    let dst = f.region(1, 64, Access::REMOTE, 0);
    // Taken over windows of 32 round trips: none before the first is full.
    for i in 0..32 {
        assert_eq!(f.nodes[0].engine.round_trip(), None);
        let wr = SendWr::new(i, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 64));
        post_and_complete(&mut f, qa, wr);
    }
    assert_eq!(
        f.nodes[0].engine.round_trip(),
        Some(Duration::from_micros(600))
    );
    // The responder sent no request: it has measured nothing.
    assert_eq!(f.nodes[1].engine.round_trip(), None);
}

#[test]
fn write_with_and_without_immediate_and_inline() {
    let mut f = Fabric::new(2, 2);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 70_000, Access::LOCAL, 0);
    let dst = f.region(1, 70_000, Access::REMOTE, 0xee);
    let recv = f.region(1, 16, Access::LOCAL, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(70_000, 9));
    f.post_recv(1, qb, 7, &recv, 0, 16);
    let engine = &mut f.nodes[0].engine;
    engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 100)), sge(&src, 0, 65_536)),
        )
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(
                2,
                SendOp::WriteWithImm(remote(&dst, 65_636), 42),
                sge(&src, 65_536, 3000),
            ),
        )
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(
                3,
                SendOp::Write(remote(&dst, 0)),
                Payload::Inline(b"inline!".to_vec()),
            ),
        )
        .unwrap();
    f.run();

    assert_eq!(
        f.completions(0)
            .iter()
            .map(|c| c.status)
            .collect::<Vec<_>>(),
        [WcStatus::Success; 3]
    );
    let c = only(&f.completions(1));
    assert_eq!(
        (c.wr_id, c.opcode, c.byte_len, c.imm),
        (7, WcOpcode::RecvRdmaWithImm, 3000, Some(42))
    );
    let got = f.bytes(1, &dst);
    assert_eq!(&got[..7], b"inline!");
    assert!(
        got[7..100].iter().all(|&b| b == 0xee),
        "bytes outside the writes are untouched"
    );
    assert!(
        got[100..100 + 68_536] == pattern(70_000, 9)[..68_536],
        "bytes differ"
    );
    assert!(got[68_636..].iter().all(|&b| b == 0xee));
}

#[test]
fn read_and_atomics() {
    let mut f = Fabric::new(2, 3);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let local = f.region(0, 16_384, Access::LOCAL, 0);
    let target = f.region(1, 16_384, Access::REMOTE, 0);
    f.bytes_mut(1, &target)
        .copy_from_slice(&pattern(16_384, 77));
    f.bytes_mut(1, &target)[..8].copy_from_slice(&5u64.to_ne_bytes());
    let engine = &mut f.nodes[0].engine;
    engine
        .post_send(
            qa,
            SendWr::new(
                1,
                SendOp::Read(remote(&target, 100)),
                sge(&local, 100, 10_000),
            ),
        )
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(
                2,
                SendOp::FetchAdd {
                    remote: remote(&target, 0),
                    add: 10,
                },
                sge(&local, 0, 8),
            ),
        )
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(
                3,
                SendOp::CompareSwap {
                    remote: remote(&target, 0),
                    compare: 15,
                    swap: 99,
                },
                sge(&local, 8, 8),
            ),
        )
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(4, SendOp::Read(remote(&target, 0)), sge(&local, 16, 0)),
        )
        .unwrap();
    f.run();

    let done = f.completions(0);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success),
        ]
    );
    assert_eq!(done[1].opcode, WcOpcode::FetchAdd);
    let local_bytes = f.bytes(0, &local);
    assert!(
        local_bytes[100..10_100] == pattern(16_384, 77)[100..10_100],
        "bytes differ"
    );
    assert_eq!(u64::from_ne_bytes(local_bytes[..8].try_into().unwrap()), 5);
    assert_eq!(
        u64::from_ne_bytes(local_bytes[8..16].try_into().unwrap()),
        15
    );
    assert_eq!(
        u64::from_ne_bytes(f.bytes(1, &target)[..8].try_into().unwrap()),
        99
    );
}

#[test]
fn remote_access_error_naks_flushes_and_writes_nothing() {
    let mut f = Fabric::new(2, 4);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 4096, Access::LOCAL, 1);
    let dst = f.region(1, 4096, Access::REMOTE, 0);
    let readonly = f.region(1, 4096, Access::LOCAL.with(Access::REMOTE_READ), 0);
    let recv = f.region(1, 64, Access::LOCAL, 0);
    f.post_recv(1, qb, 50, &recv, 0, 64);
    let engine = &mut f.nodes[0].engine;
    // A wrong key, then a range past the end, then a region that does not grant writes.
    let bad_key = RemoteAddr {
        va: dst.va,
        rkey: dst.rkey ^ 0x5555,
    };
    engine
        .post_send(qa, SendWr::new(1, SendOp::Write(bad_key), sge(&src, 0, 16)))
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(2, SendOp::Write(remote(&dst, 4090)), sge(&src, 0, 16)),
        )
        .unwrap();
    engine
        .post_send(
            qa,
            SendWr::new(3, SendOp::Write(remote(&readonly, 0)), sge(&src, 0, 16)),
        )
        .unwrap();
    f.run();

    let done = f.completions(0);
    assert_eq!(
        done.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::RemAccessErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr),
        ]
    );
    assert_eq!(f.nodes[0].engine.qp_state(qa), Some(QpState::Err));
    assert_eq!(f.nodes[1].engine.qp_state(qb), Some(QpState::Err));
    // The responder flushed its receive request too.
    assert_eq!(only(&f.completions(1)).status, WcStatus::WrFlushErr);
    assert!(f.bytes(1, &dst).iter().all(|&b| b == 0));
    assert_eq!(f.nodes[1].engine.counters().resp_access_err, 1);

    // Each kind of access fault, one QP pair each.
    for (wr, expect) in [
        (SendOp::Write(remote(&dst, 4090)), WcStatus::RemAccessErr),
        (SendOp::Write(remote(&readonly, 0)), WcStatus::RemAccessErr),
        (
            SendOp::Read(RemoteAddr {
                va: dst.va,
                rkey: 0,
            }),
            WcStatus::RemAccessErr,
        ),
        (
            SendOp::FetchAdd {
                remote: remote(&dst, 4),
                add: 1,
            },
            WcStatus::RemInvReqErr,
        ),
    ] {
        let (qa, _) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
        let local = if matches!(wr, SendOp::Write(_)) {
            sge(&src, 0, 16)
        } else {
            sge(&src, 0, 8)
        };
        let local_w = f.region(0, 64, Access::LOCAL, 0);
        let local = if matches!(wr, SendOp::Write(_)) {
            local
        } else {
            sge(&local_w, 0, 8)
        };
        f.nodes[0]
            .engine
            .post_send(qa, SendWr::new(9, wr, local))
            .unwrap();
        f.run();
        assert_eq!(only(&f.completions(0)).status, expect, "{wr:?}");
        f.completions(1);
    }
    assert!(f.bytes(1, &dst).iter().all(|&b| b == 0));
    assert!(f.bytes(1, &readonly).iter().all(|&b| b == 0));
}

#[test]
fn invalid_requests_nak_and_move_both_sides_to_err() {
    // A QP whose responder grants no remote write.
    let mut f = Fabric::new(2, 5);
    let opts = ConnectOptions {
        access: Access::NONE,
        ..ConnectOptions::default()
    };
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 4096, Access::LOCAL, 1);
    let dst = f.region(1, 4096, Access::REMOTE, 0);
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 8)),
        )
        .unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::RemInvReqErr);
    assert_eq!(f.nodes[1].engine.qp_state(qb), Some(QpState::Err));
    assert_eq!(f.nodes[1].engine.counters().resp_invalid_req, 1);

    // A SEND longer than the receive buffer: invalid request, and a length error on the
    // receive side.
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let recv = f.region(1, 100, Access::LOCAL, 0);
    f.post_recv(1, qb, 5, &recv, 0, 100);
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(2, SendOp::Send, sge(&src, 0, 2000)))
        .unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::RemInvReqErr);
    let c = only(&f.completions(1));
    assert_eq!((c.wr_id, c.status), (5, WcStatus::LocLenErr));
}

#[test]
fn rnr_nak_then_success_when_a_receive_is_posted() {
    let mut f = Fabric::new(2, 6);
    let opts = ConnectOptions {
        min_rnr_timer: RnrTimer::new(14).unwrap(),
        ..ConnectOptions::default()
    };
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 64, Access::LOCAL, 0x42);
    let dst = f.region(1, 64, Access::LOCAL, 0);
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    // Let the first attempt meet an empty receive queue.
    assert!(!f.run_for(Duration::from_micros(500)));
    assert!(f.nodes[1].engine.counters().send_rnr_err >= 1);
    assert!(f.nodes[0].engine.counters().rcvd_rnr_err >= 1);
    assert!(f.completions(0).is_empty());
    f.post_recv(1, qb, 9, &dst, 0, 64);
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    assert_eq!(only(&f.completions(1)).byte_len, 64);
    assert_eq!(f.bytes(1, &dst), &[0x42; 64]);
    // Timer code 14 is 1.28 ms: the retry waited at least that long.
    assert!(f.elapsed() >= Duration::from_micros(1280));
}

#[test]
fn rnr_retry_exhaustion() {
    let mut f = Fabric::new(2, 7);
    let opts = ConnectOptions {
        rnr_retry: 2,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 64, Access::LOCAL, 0);
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(2, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    f.run();
    let done = f.completions(0);
    assert_eq!(
        done.iter().map(|c| c.status).collect::<Vec<_>>(),
        [WcStatus::RnrRetryExcErr, WcStatus::WrFlushErr]
    );
    // The first try and two retries each met an RNR NAK.
    assert_eq!(f.nodes[0].engine.counters().rcvd_rnr_err, 3);
    assert_eq!(f.nodes[0].engine.counters().retry_rnr_exceeded_err, 1);
}

#[test]
fn retry_exhaustion_against_a_silent_peer_flushes_the_rest() {
    let mut f = Fabric::new(2, 8);
    let opts = ConnectOptions {
        retry_cnt: 3,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 64, Access::LOCAL, 0);
    f.link.loss = 1.0;
    for wr_id in 0..3 {
        f.nodes[0]
            .engine
            .post_send(qa, SendWr::new(wr_id, SendOp::Send, sge(&src, 0, 64)))
            .unwrap();
    }
    f.run();
    let done = f.completions(0);
    assert_eq!(
        done.iter().map(|c| c.status).collect::<Vec<_>>(),
        [
            WcStatus::RetryExcErr,
            WcStatus::WrFlushErr,
            WcStatus::WrFlushErr
        ]
    );
    let c = f.nodes[0].engine.counters();
    assert_eq!((c.completer_retry_err, c.retry_exceeded_err), (3, 1));
    // retry_cnt 3 means 3 retries after the first attempt of all three SENDs (the probes
    // after timeouts in a row are up to four packets: all three again).
    assert_eq!(c.sent_pkts, 4 * 3);
    // 4 timeouts of 4.096 µs × 2^8 each.
    assert!(f.elapsed() >= Duration::from_nanos(4 * 4096 * 256));
    assert_eq!(f.nodes[0].engine.qp_state(qa), Some(QpState::Err));
}

/// Early resends do not hide a dead peer: they back off, stop short of the ACK timeout, and
/// `retry_cnt` still runs out after the same number of ACK timeouts as without them.
#[test]
fn early_resends_back_off_and_a_dead_peer_is_still_found_by_the_ack_timeout() {
    let mut f = Fabric::new(2, 25);
    let opts = ConnectOptions {
        timeout: 14,
        retry_cnt: 3,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 64, Access::LOCAL, 0);
    f.link.loss = 1.0;
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::RetryExcErr);
    let c = f.nodes[0].engine.counters();
    assert_eq!((c.completer_retry_err, c.retry_exceeded_err), (3, 1));
    // Nothing on this fresh QP was ever answered: the first waits a quarter of the 67 ms ACK
    // timeout, then a half is still allowed; the whole is the ACK timeout's own.
    assert_eq!(c.early_resends, 2);
    let ack_timeout = Duration::from_nanos(4096 << 14);
    assert!(f.elapsed() >= ack_timeout * 4);
}

/// A peer descheduled on a busy host has the request in its socket, unread: an early resend
/// would only queue a copy behind it (item 6 of the data path's issue: a resend should follow
/// a loss, not a descheduled peer). A driver that can see so (a peer on the same host) puts
/// the early resend off; without that look the same stall draws resends and duplicates.
#[test]
fn an_early_resend_is_put_off_while_the_peer_has_not_read_the_request() {
    for look in [false, true] {
        let mut f = Fabric::new(2, 31);
        f.show_unread = look;
        let opts = ConnectOptions {
            timeout: 14,
            ..ConnectOptions::default()
        };
        let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
        let src = f.region(0, 64, Access::LOCAL, 0);
        let dst = f.region(1, 64, Access::REMOTE, 0);
        f.bytes_mut(0, &src).copy_from_slice(&pattern(64, 7));
        // Asleep 30 ms: past the first early resends (a sixteenth of the 67 ms ACK timeout,
        // doubling), short of the ACK timeout.
        f.nodes[1].asleep_until = Some(f.now + Duration::from_millis(30));
        post_and_complete(
            &mut f,
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 64)),
        );
        assert!(f.bytes(1, &dst) == &pattern(64, 7)[..], "bytes differ");
        let (a, b) = (f.nodes[0].engine.counters(), f.nodes[1].engine.counters());
        assert_eq!(a.completer_retry_err, 0, "{a:?}");
        if look {
            assert_eq!(
                (a.early_resends, b.duplicate_request),
                (0, 0),
                "{a:?} {b:?}"
            );
            assert!(a.early_put_off >= 1, "{a:?}");
        } else {
            assert!(a.early_resends >= 1, "{a:?}");
            assert_eq!(b.duplicate_request, a.early_resends, "{b:?}");
            assert_eq!(a.early_put_off, 0, "{a:?}");
        }
    }
}

/// A responder too slow to answer within the ACK timeout (an emulated rxe behind a 128-packet
/// burst): the first timeout resends the window, a second one in a row resends only the
/// oldest four packets, each asking for an ACK, and the ACK they draw (for PSNs sent before the
/// rewind) completes the request.
#[test]
fn timeouts_in_a_row_probe_with_a_few_packets_until_an_ack() {
    let mut f = Fabric::new(2, 19);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let len = 16 * 1024;
    let src = f.region(0, len, Access::LOCAL, 0);
    let dst = f.region(1, len, Access::REMOTE, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(len, 3));
    let sent = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let log = sent.clone();
    f.filter = Some(Box::new(move |from, p| {
        if from == 0 {
            log.borrow_mut().push((p.psn(), p.ack_req()));
            return false;
        }
        // Every answer is lost until the requester has sent two full windows (16 packets each).
        log.borrow().len() <= 32
    }));
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, len as u32)),
    );
    assert!(f.bytes(1, &dst) == &pattern(len, 3)[..], "bytes differ");
    let sent = sent.borrow();
    // 16 packets, 16 again after the first timeout, then a probe of four for the second.
    assert_eq!(sent.len(), 36, "{sent:?}");
    for (i, probe) in sent[32..].iter().enumerate() {
        assert_eq!(
            *probe,
            (sent[i].0, true),
            "probes: the oldest PSNs, asking for ACKs"
        );
    }
    assert_eq!(f.nodes[0].engine.counters().completer_retry_err, 2);
}

/// A fabric, node 0's queue pair, and a source region on node 0 and a target on node 1.
type Setup = (Fabric, Qpn, RegionInfo, RegionInfo);

/// Two nodes and an RC queue pair from node 0 to node 1 with `timeout` 14 (a 67 ms ACK
/// timeout, perftest's default), and 8 KiB regions on each end, the source filled with
/// `pattern(8192, seed)`: the lost-tail tests' setup.
fn tail_setup(fabric_seed: u64, seed: u8) -> Setup {
    recovery_setup(fabric_seed, seed, 8192)
}

/// [`tail_setup`] with regions of `len` bytes, the source filled with `pattern(len, seed)`.
fn recovery_setup(fabric_seed: u64, seed: u8, len: usize) -> Setup {
    let mut f = Fabric::new(2, fabric_seed);
    let opts = ConnectOptions {
        timeout: 14,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, len, Access::LOCAL, 0);
    let dst = f.region(1, len, Access::REMOTE, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(len, seed));
    (f, qa, src, dst)
}

/// [`recovery_setup`] the other way round, for READs: the responder's `dst` holds
/// `pattern(len, seed)`, and the requester's `src`, which it is read into, another pattern
/// (so that the check after the READ finds only what the READ brought).
fn read_setup(fabric_seed: u64, seed: u8, len: usize) -> Setup {
    let (mut f, qa, src, dst) = recovery_setup(fabric_seed, seed.wrapping_add(1), len);
    f.bytes_mut(1, &dst).copy_from_slice(&pattern(len, seed));
    (f, qa, src, dst)
}

/// Reads all of `dst` into `local` in one READ, and checks that it succeeded and that the
/// bytes are `pattern(len, seed)`.
fn read_all(f: &mut Fabric, qa: Qpn, local: &RegionInfo, dst: &RegionInfo, seed: u8) {
    let len = local.len as usize;
    let wr = SendWr::new(1, SendOp::Read(remote(dst, 0)), sge(local, 0, len as u32));
    post_and_complete(f, qa, wr);
    assert!(f.bytes(0, local) == pattern(len, seed), "bytes differ");
}

/// How long each of [`long_reads_posted`]'s READs is, and how many there are.
const LONG_READ: usize = 1 << 20;
const LONG_READS: u64 = 4;

/// Four 1 MiB READs posted, all of the responder's region (holding `pattern(LONG_READ,
/// seed)`) into the requester's, on a QP with perftest's ACK timeout (code 14) and
/// `max_rd_atomic` as given, over a link of `bits_per_sec`. The test adds its faults, runs
/// the fabric and checks with [`long_reads_landed`].
fn long_reads_posted(
    fabric_seed: u64,
    seed: u8,
    max_rd_atomic: u8,
    bits_per_sec: u64,
) -> (Fabric, RegionInfo) {
    let mut f = Fabric::new(2, fabric_seed);
    f.link.bits_per_sec = bits_per_sec;
    let opts = ConnectOptions {
        timeout: 14,
        max_rd_atomic,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let local = f.region(0, LONG_READ, Access::LOCAL, 0);
    let dst = f.region(1, LONG_READ, Access::REMOTE, 0);
    f.bytes_mut(1, &dst)
        .copy_from_slice(&pattern(LONG_READ, seed));
    for id in 0..LONG_READS {
        let wr = SendWr::new(
            id,
            SendOp::Read(remote(&dst, 0)),
            sge(&local, 0, LONG_READ as u32),
        );
        f.nodes[0].engine.post_send(qa, wr).unwrap();
    }
    (f, local)
}

/// A filter that loses READ responses by their place: for each `(k, times)`, the response `k`
/// PSNs after the first packet the fabric carries (the first READ request, where its responses
/// start), the first `times` times it is sent.
fn lose_responses<const N: usize>(mut losses: [(u32, u32); N]) -> fabric::Filter {
    let mut first = None;
    Box::new(move |from, p| {
        let first = *first.get_or_insert(p.psn());
        let k = first.steps_to(p.psn());
        let hit = losses
            .iter_mut()
            .find(|(at, times)| from == 1 && *at == k && *times > 0);
        hit.map(|(_, times)| *times -= 1).is_some()
    })
}

/// Checks that every READ [`long_reads_posted`] posted succeeded and brought the pattern.
fn long_reads_landed(f: &mut Fabric, local: &RegionInfo, seed: u8) {
    let done = f.completions(0);
    assert_eq!(
        done.len(),
        LONG_READS as usize,
        "{done:?} {:?}",
        f.nodes[0].engine.counters()
    );
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{done:?}"
    );
    assert!(
        f.bytes(0, local) == pattern(LONG_READ, seed),
        "bytes differ"
    );
}

/// Writes the second 4 KiB of `src` to `dst`, losing that WRITE's last packet once, and checks
/// that all 8 KiB landed and that the loss was recovered well before the ACK timeout, by one
/// early resend that spent no `retry_cnt`.
fn second_write_recovers_its_lost_tail_early(
    f: &mut Fabric,
    qa: Qpn,
    src: &RegionInfo,
    dst: &RegionInfo,
    seed: u8,
) {
    let before = f.elapsed();
    drop_first(f, 0, Operation::RdmaWriteLast);
    post_and_complete(
        f,
        qa,
        SendWr::new(2, SendOp::Write(remote(dst, 4096)), sge(src, 4096, 4096)),
    );
    assert!(f.bytes(1, dst) == &pattern(8192, seed)[..], "bytes differ");
    let took = f.elapsed() - before;
    let ack_timeout = Duration::from_nanos(4096 << 14);
    assert!(
        took < ack_timeout / 10,
        "{took:?}: recovered by the ACK timeout, not early"
    );
    let c = f.nodes[0].engine.counters();
    assert_eq!(c.early_resends, 1);
    assert_eq!(c.completer_retry_err, 0, "no retry_cnt spent");
}

/// A lost tail packet leaves nothing behind it to draw a sequence NAK: without the early
/// resend the requester would wait out the whole ACK timeout (67 ms at `timeout` 14, perftest's
/// default). Once a round trip is measured, it goes back a few round trips into the stall, and
/// spends no `retry_cnt` on it.
#[test]
fn a_lost_tail_is_resent_after_a_few_round_trips_not_the_ack_timeout() {
    let (mut f, qa, src, dst) = tail_setup(23, 5);
    // A first WRITE, answered: the round trip is measured.
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 4096)),
    );
    second_write_recovers_its_lost_tail_early(&mut f, qa, &src, &dst, 5);
}

/// The schedule files timers lazily: an ACK that disarms a request's timers leaves its entry
/// in the index, and the next request's later timers stay behind it. That entry comes due with
/// nothing to do, sends nothing, and must file the timer really armed then, or a loss behind
/// it would wait for nothing.
#[test]
fn a_timer_left_from_an_answered_request_files_the_next_one_when_it_comes_due() {
    let (mut f, qa, src, dst) = tail_setup(31, 9);
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 4096)),
        )
        .unwrap();
    // Answered within the first 200 us; its early-resend timer (a millisecond at least) is
    // disarmed but still filed.
    assert!(!f.run_for(Duration::from_micros(200)), "an entry is left");
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    let left = f.nodes[0].engine.poll_timeout().expect("an entry is left");
    // The second WRITE leaves just before that entry comes due, so that its own timers, a
    // millisecond or more later, stay filed behind it.
    assert!(!f.run_for(left - f.now - Duration::from_micros(100)));
    let sent = f.nodes[0].engine.counters().sent_pkts;
    second_write_recovers_its_lost_tail_early(&mut f, qa, &src, &dst, 9);
    // The second WRITE's four packets, and the four its early resend probed with: the left
    // entry's pass sent nothing.
    assert_eq!(f.nodes[0].engine.counters().sent_pkts - sent, 8);
    assert_eq!(
        f.nodes[0].engine.poll_timeout(),
        None,
        "idle: nothing filed"
    );
}

/// A peer that suddenly answers slowly (an emulated rxe working through a window) is not a
/// loss: the early resend probes with a few packets only, the ACKs for the originals show it
/// was needless, and the requester carries on from where it had got to instead of sending
/// the rest of the window again.
#[test]
fn a_needless_early_resend_costs_a_probe_not_a_window() {
    let mut f = Fabric::new(2, 27);
    let opts = ConnectOptions {
        timeout: 14,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let len = 128 * 1024;
    let src = f.region(0, 2 * len, Access::LOCAL, 0);
    let dst = f.region(1, 2 * len, Access::REMOTE, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(2 * len, 6));
    let write = |f: &mut Fabric, id: u64, at: usize| {
        let wr = SendWr::new(
            id,
            SendOp::Write(remote(&dst, at as u64)),
            sge(&src, at as u64, len as u32),
        );
        post_and_complete(f, qa, wr);
    };
    // Quick answers first: a round trip of about 10 µs is measured.
    write(&mut f, 1, 0);
    let sent_before = f.nodes[0].engine.counters().sent_pkts;
    // Then 4 ms each way: the stall outlasts the early-resend delay (1 ms at least).
    f.link.delay = Duration::from_millis(4);
    write(&mut f, 2, len);
    assert!(f.bytes(1, &dst) == &pattern(2 * len, 6)[..], "bytes differ");
    // ACKs asked for at the 64th and the 128th packets: the ACK for the first 64 must not
    // send the second 64 again.
    a_stall_cost_only_probes(&f, sent_before, 4);
}

/// Node 0's requester, which had sent `sent_before` packets before a stall that is not a
/// loss, resent early, found it needless, spent no retry, and sent the stall's 128 packets
/// with no more than a probe of `probe` packets per early resend.
fn a_stall_cost_only_probes(f: &Fabric, sent_before: u64, probe: u64) {
    let c = f.nodes[0].engine.counters();
    assert!(c.early_resends >= 1, "no early resend: {c:?}");
    assert!(c.early_needless >= 1, "not found needless: {c:?}");
    assert_eq!(c.completer_retry_err, 0);
    let sent = c.sent_pkts - sent_before;
    assert!(
        sent <= 128 + probe * c.early_resends,
        "{sent} packets for 128 with {} early resends",
        c.early_resends
    );
}

/// A burst of 4 KiB WRITEs (four packets each) to a responder that answers slowly, as a
/// guest's soft NIC behind a host's requester works through its socket: its first ACK comes
/// 7 ms after the burst, and each later one half a millisecond after the one before. The
/// first ACK after the early resend answers the first message, whose end a probe of four
/// packets would have ended on too. The probe stops one packet short of that end, so the ACK
/// shows that the original got there, and the rest of the window is not sent again. (A probe
/// of four took the ACK for its own, and the stall resent the rest of the window: 264
/// packets for 128 here, 136 of them duplicates at the responder, and the burst took 95 ms
/// where it now takes 31; a guest's run of 300 WRITEs resent thousands.)
#[test]
fn a_slow_responder_s_ack_for_a_message_end_is_not_taken_for_the_probe_s() {
    let (msg, n) = (4096, 32);
    let (mut f, qa, src, dst) = recovery_setup(28, 8, (n + 1) * msg);
    let write = |f: &mut Fabric, id: u64| {
        let at = id * msg as u64;
        let wr = SendWr::new(
            id,
            SendOp::Write(remote(&dst, at)),
            sge(&src, at, msg as u32),
        );
        f.nodes[0].engine.post_send(qa, wr).unwrap();
    };
    // Quick answers first: a round trip of about 10 µs is measured.
    write(&mut f, 0);
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    let sent_before = f.nodes[0].engine.counters().sent_pkts;
    // Then the slow answers, behind a burst of 32 messages, 128 packets. The responder's
    // socket hands it a packet every 50 µs (the requester's link carries them so, and
    // what is sent later queues behind), and its ACKs leave 7 ms after the burst, then half a
    // millisecond apart.
    let mut acks = 0u32;
    f.hold = Some(Box::new(move |from, p| {
        if from == 0 {
            return Duration::from_micros(50);
        }
        if p.opcode().operation() != Operation::Acknowledge {
            return Duration::ZERO;
        }
        acks += 1;
        if acks == 1 {
            Duration::from_millis(7)
        } else {
            Duration::from_micros(500)
        }
    }));
    for id in 1..=n as u64 {
        write(&mut f, id);
    }
    f.run();
    let done = f.completions(0);
    assert_eq!(done.len(), n, "{done:?}");
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{done:?}"
    );
    assert!(
        f.bytes(1, &dst) == &pattern((n + 1) * msg, 8)[..],
        "bytes differ"
    );
    a_stall_cost_only_probes(&f, sent_before, 3);
}

/// A ping-pong of WRITEs whose peer stalls for milliseconds at a time (a busy host): each
/// stall outlasts the early-resend delay, and the probe resends packets the peer already has.
/// The ACK that ends the stall cannot tell original from probe, but the peer answers each
/// probe packet with an ACK of its own, and the originals with one more; that shows the resend
/// was needless, so later stalls wait longer and the resends stop, where each stall used to
/// cost one or more.
fn stalled_ping_pong_teaches_the_requester_to_wait(len: u32, seed: u64) {
    let (mut f, qa, src, dst) = recovery_setup(seed, 0x5a, len as usize);
    let write = |f: &mut Fabric, id: u64| {
        let wr = SendWr::new(id, SendOp::Write(remote(&dst, 0)), sge(&src, 0, len));
        post_and_complete(f, qa, wr);
    };
    for id in 0..20 {
        write(&mut f, id);
    }
    // Now every round trip stalls for 3 ms each way, 200 times.
    f.link.delay = Duration::from_millis(3);
    for id in 20..220 {
        write(&mut f, id);
    }
    let a = f.nodes[0].engine.counters();
    let b = f.nodes[1].engine.counters();
    assert!(a.early_needless >= 1, "no needless resend found: {a:?}");
    assert_eq!(a.completer_retry_err, 0);
    assert!(
        a.early_resends <= 10,
        "{} early resends for 200 stalled round trips ({} duplicates at the peer)",
        a.early_resends,
        b.duplicate_request
    );
}

#[test]
fn a_peer_that_acks_the_probe_twice_teaches_the_requester_to_wait() {
    stalled_ping_pong_teaches_the_requester_to_wait(8, 33);
}

/// The same with four-packet WRITEs, whose probe resends all four.
#[test]
fn a_peer_that_acks_a_probe_of_four_and_the_original_teaches_the_requester_to_wait() {
    stalled_ping_pong_teaches_the_requester_to_wait(4096, 36);
}

/// A ping-pong of four-packet WRITEs (MTU 1024) whose ACK is lost now and then: the data
/// arrived, so nothing draws a sequence NAK, and only the early resend ends the stall. Its
/// probe's packets are all duplicates at the responder, each answered with an ACK of the same
/// PSN; no more than it resent, so it was a loss, and later losses are resent as early. (When
/// such a probe was taken for needless, the backoff doubled at each lost ACK until the ACK
/// timeout, 67 ms here, ended every stall.)
#[test]
fn a_lost_ack_behind_a_multi_packet_message_is_a_loss_not_a_slow_peer() {
    let (mut f, qa, src, dst) = tail_setup(37, 11);
    let mut acks = 0u32;
    f.filter = Some(Box::new(move |from, p| {
        let ack = from == 1 && p.opcode().operation() == Operation::Acknowledge;
        acks += u32::from(ack);
        // Every third ACK node 1 sends, up to the thirtieth (a probe's count too).
        ack && acks % 3 == 0 && acks <= 30
    }));
    for id in 0..30 {
        let wr = SendWr::new(id, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 4096));
        post_and_complete(&mut f, qa, wr);
    }
    losses_were_resent_early(&f, 5, "lost ACK");
}

/// Node 0's requester resent at least `losses` losses early (`what` they were), found none
/// of those resends needless, and never waited out the ACK timeout.
fn losses_were_resent_early(f: &Fabric, losses: u64, what: &str) {
    let c = f.nodes[0].engine.counters();
    assert!(c.early_resends >= losses, "{what}s not resent early: {c:?}");
    assert_eq!(c.early_needless, 0, "a {what} taken for a slow peer: {c:?}");
    assert_eq!(
        c.completer_retry_err, 0,
        "the ACK timeout ended a stall: {c:?}"
    );
}

/// A WRITE longer than a probe (16 packets) whose last packet is lost: the probe resends the
/// first four, the responder answers them with an ACK for the fifteenth, past all the probe
/// resent, and the last packet is still missing. That ACK shows the originals up to it got
/// through, not that the rest is on its way; only progress past it without a resend would.
/// Counted needless there, each such tail doubled the early-resend delay, until the ACK
/// timeout ended every one.
#[test]
fn a_lost_tail_behind_more_than_a_probe_is_a_loss_not_a_slow_peer() {
    let len = 16 * 1024;
    let (mut f, qa, src, dst) = recovery_setup(39, 13, len);
    let write = |f: &mut Fabric, id: u64| {
        let wr = SendWr::new(id, SendOp::Write(remote(&dst, 0)), sge(&src, 0, len as u32));
        post_and_complete(f, qa, wr);
    };
    write(&mut f, 0);
    for id in 1..13 {
        drop_first(&mut f, 0, Operation::RdmaWriteLast);
        write(&mut f, id);
        assert!(f.bytes(1, &dst) == &pattern(len, 13)[..], "bytes differ");
    }
    losses_were_resent_early(&f, 12, "lost tail");
}

/// A READ whose response was lost is asked for again early, and that was right. What shows a
/// READ's early resend needless is a second copy of a response it asked for again, as a
/// stalled responder sends; copies of later READs' responses (a path that duplicates) say
/// nothing of it. (Taken for its proof,
/// they doubled the early-resend delay at each, until the ACK timeout ended every stall.)
#[test]
fn only_a_copy_of_what_an_early_resend_asked_for_shows_it_needless() {
    let (mut f, qa, _src, dst) = tail_setup(38, 12);
    let local = f.region(0, 64, Access::LOCAL, 0);
    let read = |f: &mut Fabric, id: u64| {
        let wr = SendWr::new(id, SendOp::Read(remote(&dst, 0)), sge(&local, 0, 64));
        post_and_complete(f, qa, wr);
    };
    for id in 0..5 {
        read(&mut f, id);
    }
    drop_first(&mut f, 1, Operation::RdmaReadResponseOnly);
    read(&mut f, 5);
    let c = f.nodes[0].engine.counters();
    assert_eq!((c.early_resends, c.early_needless), (1, 0), "{c:?}");
    f.filter = None;
    // Every packet now arrives twice: each READ's response has a stale second copy.
    f.link.dup = 1.0;
    for id in 6..26 {
        read(&mut f, id);
    }
    let c = f.nodes[0].engine.counters();
    assert!(c.stale_response >= 20, "the copies did not arrive: {c:?}");
    assert_eq!(
        c.early_needless, 0,
        "a later READ's copy taken for the resend's: {c:?}"
    );
    // A responder that stalls 3 ms each way: the response asked for again comes a second
    // time, which shows the resend needless, and later stalls wait longer.
    f.link.dup = 0.0;
    f.link.delay = Duration::from_millis(3);
    for id in 26..126 {
        read(&mut f, id);
    }
    let c = f.nodes[0].engine.counters();
    assert!(c.early_needless >= 1, "no needless resend found: {c:?}");
    assert!(
        c.early_resends <= 11,
        "{} early resends for 100 stalled READs",
        c.early_resends
    );
}

/// A READ's early resend that brings back a response lost on the way found a loss, and takes
/// back one doubling of the delay that needless ones taught, as a SEND's or WRITE's probe
/// does. (READs only ever learnt: after a few needless resends every lost READ response
/// waited 2^n times the estimate, p99 4 ms against 0.5-1 ms for WRITEs under 2 % loss.)
#[test]
fn a_read_resent_early_for_a_real_loss_takes_back_a_doubling() {
    let (mut f, qa, _src, dst) = tail_setup(39, 13);
    let local = f.region(0, 64, Access::LOCAL, 0);
    let mut id = 0;
    let mut read = |f: &mut Fabric| {
        id += 1;
        let wr = SendWr::new(id, SendOp::Read(remote(&dst, 0)), sge(&local, 0, 64));
        post_and_complete(f, qa, wr);
    };
    // A quick responder that starts stalling 3 ms each way: needless early resends, each
    // doubling the delay.
    for _ in 0..10 {
        read(&mut f);
    }
    f.link.delay = Duration::from_millis(3);
    for _ in 0..30 {
        read(&mut f);
    }
    let learnt = f.nodes[0].engine.counters().early_needless;
    assert!(learnt >= 1, "no needless resend learnt");
    // Quick again: the estimate settles on the quick round trip.
    f.link.delay = Duration::ZERO;
    for _ in 0..300 {
        read(&mut f);
    }
    // Lose one READ response every so often: each stall is a real loss.
    let before = f.nodes[0].engine.counters().early_resends;
    let mut stalls = Vec::new();
    for _ in 0..learnt + 2 {
        for _ in 0..20 {
            read(&mut f);
        }
        drop_first(&mut f, 1, Operation::RdmaReadResponseOnly);
        // From the post to the last packet's arrival (the run goes on to timers left after).
        let at = f.elapsed();
        read(&mut f);
        stalls.push(f.busy_for() - at);
        f.filter = None;
    }
    let c = *f.nodes[0].engine.counters();
    assert_eq!(
        c.early_resends - before,
        learnt + 2,
        "one early resend a loss: {c:?}"
    );
    assert_eq!(c.early_needless, learnt, "{c:?}");
    // Each loss took back a doubling: the last waited the estimate (its 1 ms floor), not
    // 2^learnt times it.
    let last = *stalls.last().unwrap();
    assert!(
        last < Duration::from_millis(2),
        "stalls {stalls:?} after {learnt} needless resends"
    );
}

/// Long READs from a responder that answers slowly and pauses in the middle of its answers,
/// as rxe does in a TCG guest (8 MB/s, stopping 2.5 ms every 100 packets). A responder
/// answers requests in order, a duplicate READ request after everything queued before it, so
/// each early resend that asks again for what was only slow queues a whole piece's answer
/// again; asking again for the later pieces as well, or again while the duplicates stream in,
/// made a storm in which the last READ waited out `retry_cnt` ACK timeouts behind answers
/// nobody needed (the interop suite's `ib_read_bw-1MiB-ferroce-client`, 11,300 of 13,299
/// responses repeats).
#[test]
fn a_slow_pausing_read_responder_is_not_buried_in_duplicate_requests() {
    let (mut f, local) = long_reads_posted(41, 7, 128, 64_000_000);
    let mut answered = 0u64;
    f.hold = Some(Box::new(move |from, p| {
        let response = from == 1 && p.opcode().operation() != Operation::Acknowledge;
        answered += u64::from(response);
        if response && answered % 100 == 0 {
            Duration::from_micros(2500)
        } else {
            Duration::ZERO
        }
    }));
    f.run();
    long_reads_landed(&mut f, &local, 7);
    let a = *f.nodes[0].engine.counters();
    let b = *f.nodes[1].engine.counters();
    assert_eq!(a.completer_retry_err, 0, "a retry for no loss: {a:?}");
    assert!(a.early_resends >= 1, "no stall drew a resend: {a:?}");
    // Each early resend asked for one piece's rest, nothing after it, and was found
    // needless; the later stalls were left alone.
    assert_eq!(b.duplicate_request, a.early_resends, "{b:?}");
    assert_eq!(a.early_needless, a.early_resends, "{a:?}");
    assert!(a.early_resends <= 4, "{a:?}");
    let needed = LONG_READS * (LONG_READ as u64 / 1024);
    assert!(
        a.stale_response * 20 <= needed,
        "{} responses repeated for {needed}: {a:?}",
        a.stale_response
    );
}

/// Holds node `node`'s next packet for `by`: the responder's (node 1's) on a fresh QP is its
/// first answer, late; the requester's (node 0's) a request that leaves late.
fn hold_next_from(f: &mut Fabric, node: usize, by: Duration) {
    let mut first = true;
    f.hold = Some(Box::new(move |from, _| {
        if from == node && std::mem::take(&mut first) {
            by
        } else {
            Duration::ZERO
        }
    }));
}

/// A fresh QP's first READ, answered late: before any round trip is measured the requester
/// has only the ACK timeout to go by, and a responder's first answer is its slowest (rxe in a
/// guest took 7.6 ms, its code and the region it reads still cold). Asking again would cost
/// the whole piece, so until the QP's first answer the READ waits a quarter of the ACK
/// timeout, not the sixteenth it waits once answered.
#[test]
fn a_fresh_qps_first_read_answered_late_is_not_asked_again() {
    // Timeout code 14 (recovery_setup's): 67 ms; the first answer comes 8 ms late, twice a
    // sixteenth of it.
    let (mut f, qa, local, dst) = read_setup(43, 3, 64 << 10);
    hold_next_from(&mut f, 1, Duration::from_millis(8));
    read_all(&mut f, qa, &local, &dst, 3);
    let a = *f.nodes[0].engine.counters();
    let b = *f.nodes[1].engine.counters();
    assert_eq!(a.early_resends, 0, "{a:?}");
    assert_eq!(b.duplicate_request, 0, "{b:?}");
    assert_eq!(a.stale_response, 0, "{a:?}");
}

/// The other side of that wait: a fresh QP's first READ request lost is still asked for
/// again by an early resend, before the ACK timeout would retry it.
#[test]
fn a_fresh_qps_first_read_lost_is_asked_again_early() {
    let (mut f, qa, local, dst) = read_setup(44, 5, 64 << 10);
    drop_first(&mut f, 0, Operation::RdmaReadRequest);
    read_all(&mut f, qa, &local, &dst, 5);
    let a = *f.nodes[0].engine.counters();
    assert_eq!((a.early_resends, a.completer_retry_err), (1, 0), "{a:?}");
}

/// Writes all of `src` into `dst` in one WRITE, and checks that it succeeded and that the
/// bytes are `pattern(len, seed)`.
fn write_all(f: &mut Fabric, qa: Qpn, src: &RegionInfo, dst: &RegionInfo, seed: u8) {
    let len = src.len as usize;
    let wr = SendWr::new(1, SendOp::Write(remote(dst, 0)), sge(src, 0, len as u32));
    post_and_complete(f, qa, wr);
    assert!(f.bytes(1, dst) == pattern(len, seed), "bytes differ");
}

/// The same wait for a fresh QP's first WRITE, one packet whose ACK comes 8 ms late: rxe in
/// a guest answered a fresh QP's first SEND 10 ms after it left, a guest's ferroce a first
/// window of WRITEs up to 9 ms after. Resent after a sixteenth of the ACK timeout (4.2 ms),
/// it drew a duplicate at the responder and a second ACK.
#[test]
fn a_fresh_qps_first_write_answered_late_is_not_resent() {
    let (mut f, qa, src, dst) = recovery_setup(45, 6, 64);
    hold_next_from(&mut f, 1, Duration::from_millis(8));
    write_all(&mut f, qa, &src, &dst, 6);
    let a = *f.nodes[0].engine.counters();
    let b = *f.nodes[1].engine.counters();
    assert_eq!(a.early_resends, 0, "{a:?}");
    assert_eq!(b.duplicate_request, 0, "{b:?}");
}

/// And a fresh QP's first WRITE lost is still resent by an early resend, before the ACK
/// timeout would retry it.
#[test]
fn a_fresh_qps_first_write_lost_is_resent_early() {
    let (mut f, qa, src, dst) = recovery_setup(46, 7, 64);
    drop_first(&mut f, 0, Operation::RdmaWriteOnly);
    write_all(&mut f, qa, &src, &dst, 7);
    let a = *f.nodes[0].engine.counters();
    assert_eq!((a.early_resends, a.completer_retry_err), (1, 0), "{a:?}");
}

/// A requester's thread descheduled after its clock read and before its send: the WRITE
/// leaves 3 ms after the engine built it, three times the early-resend delay of a QP with a
/// measured round trip. Timers armed from the build fire before the peer can answer (here two
/// needless early resends and two duplicates at the responder; a quiet host's 50,000-round
/// `write-lat` showed one about once a run); a driver that reads its clock after the send
/// ([`Engine::transmitted`]) runs them from the departure instead.
#[test]
fn a_request_that_left_late_runs_its_timers_from_when_it_left() {
    for clock_after_send in [false, true] {
        let (mut f, qa, src, dst) = recovery_setup(47, 8, 64);
        f.clock_after_send = clock_after_send;
        // Enough round trips for a measured estimate: the delay is then its 1 ms floor.
        for _ in 0..3 {
            write_all(&mut f, qa, &src, &dst, 8);
        }
        hold_next_from(&mut f, 0, Duration::from_millis(3));
        write_all(&mut f, qa, &src, &dst, 8);
        let a = *f.nodes[0].engine.counters();
        let b = *f.nodes[1].engine.counters();
        let resent = (a.early_resends, b.duplicate_request);
        if clock_after_send {
            assert_eq!(resent, (0, 0), "{a:?} {b:?}");
        } else {
            assert!(resent.0 > 0 && resent.1 > 0, "{a:?} {b:?}");
        }
    }
}

/// Two queue pairs streaming 64 KiB WRITEs (MTU 1024, perftest's ACK timeout of 67 ms) to
/// a peer that drains one 1 KiB packet per 125 µs and serves its queue pairs in turns, as an
/// emulated rxe does (`ib_send_bw` over two QPs in the interop suite). The requester's window
/// sets the queue: at the lossless 512 PSNs each, a QP waits for its turn longer than the
/// ACK timeout and resends its whole window behind the originals (1,372 to 2,968 repeated
/// packets in 8 of 24 suite runs; here 7 timeouts and 1,349 duplicates). An ACK that comes
/// after the ACK timer ran past a quarter of its timeout narrows the window instead: no
/// timeout, and nothing sent twice but the early resends' probes of a few packets each (here
/// 9, as in the suite's capture: a QP waiting for its turn stalls past its early-resend delay).
#[test]
fn a_peer_serving_queue_pairs_in_turns_is_not_sent_its_queue_again() {
    const MSG: usize = 64 << 10;
    const PER_QP: usize = 40;
    let mut f = Fabric::new(2, 48);
    let opts = ConnectOptions {
        timeout: 14,
        ..ConnectOptions::default()
    };
    let qps = [
        f.connect(0, 1, QpType::Rc, &opts).0,
        f.connect(0, 1, QpType::Rc, &opts).0,
    ];
    let len = 2 * PER_QP * MSG;
    let src = f.region(0, len, Access::LOCAL, 0);
    let dst = f.region(1, len, Access::REMOTE, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(len, 9));
    f.turns = Some(fabric::Turns::new(1, Duration::from_micros(125), f.now));
    for i in 0..2 * PER_QP {
        let at = (i * MSG) as u64;
        let wr = SendWr::new(
            i as u64,
            SendOp::Write(remote(&dst, at)),
            sge(&src, at, MSG as u32),
        );
        f.nodes[0].engine.post_send(qps[i % 2], wr).unwrap();
    }
    f.run();
    let done = f.completions(0);
    assert_eq!(done.len(), 2 * PER_QP, "{done:?}");
    assert!(
        done.iter().all(|c| c.status == WcStatus::Success),
        "{done:?}"
    );
    assert!(f.bytes(1, &dst) == pattern(len, 9), "bytes differ");
    let a = *f.nodes[0].engine.counters();
    let b = *f.nodes[1].engine.counters();
    assert!(a.queue_narrowed > 0, "{a:?}");
    assert_eq!(a.completer_retry_err, 0, "{a:?}");
    assert!(
        b.duplicate_request <= a.early_resends * u64::from(PROBE_PSNS),
        "{a:?} {b:?}"
    );
}

/// An RNR NAK is the responder asking the requester to wait, not a loss: the stall while the
/// RNR timer runs starts no early resend.
#[test]
fn an_rnr_wait_starts_no_early_resend() {
    let mut f = Fabric::new(2, 24);
    let opts = ConnectOptions {
        timeout: 14,
        min_rnr_timer: RnrTimer::new(20).unwrap(),
        ..ConnectOptions::default()
    };
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 64, Access::LOCAL, 0x42);
    let dst = f.region(1, 128, Access::LOCAL, 0);
    // A first SEND, received: the round trip is measured.
    f.post_recv(1, qb, 8, &dst, 0, 64);
    post_and_complete(&mut f, qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 64)));
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(2, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    // The RNR timer (code 20: 10.24 ms) runs for many round trips.
    assert!(!f.run_for(Duration::from_millis(8)));
    assert!(f.nodes[0].engine.counters().rcvd_rnr_err >= 1);
    f.post_recv(1, qb, 9, &dst, 64, 64);
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    assert_eq!(f.nodes[0].engine.counters().early_resends, 0);
}

/// A responder that RNR NAKs a SEND then NAKs the SENDs in flight behind it as out of
/// sequence (rxe and ferroce both do): the requester waits out the RNR timer before it
/// resends, rather than resending at once on the sequence NAK into the same empty receive
/// queue.
#[test]
fn a_sequence_nak_behind_an_rnr_nak_waits_for_the_rnr_timer() {
    let mut f = Fabric::new(2, 25);
    let opts = ConnectOptions {
        min_rnr_timer: RnrTimer::new(14).unwrap(),
        ..ConnectOptions::default()
    };
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 64, Access::LOCAL, 0x42);
    let dst = f.region(1, 256, Access::LOCAL, 0);
    for id in 1..=4 {
        f.nodes[0]
            .engine
            .post_send(qa, SendWr::new(id, SendOp::Send, sge(&src, 0, 64)))
            .unwrap();
    }
    // Timer code 14 is 1.28 ms: nothing may be resent before it runs out.
    assert!(!f.run_for(Duration::from_millis(1)));
    let (a, b) = (f.nodes[0].engine.counters(), f.nodes[1].engine.counters());
    assert_eq!(b.send_rnr_err, 1, "{b:?}");
    assert!(
        a.rcvd_seq_err >= 1,
        "no sequence NAK behind the RNR NAK: {a:?}"
    );
    assert_eq!(
        a.completer_retry_err, 0,
        "resent inside the RNR wait: {a:?}"
    );
    for i in 0..4 {
        f.post_recv(1, qb, 10 + i, &dst, i * 64, 64);
    }
    f.run();
    let done = f.completions(0);
    assert_eq!(done.len(), 4);
    assert!(done.iter().all(|c| c.status == WcStatus::Success));
}

#[test]
fn lost_packet_gets_a_sequence_nak_and_go_back_n() {
    let mut f = Fabric::new(2, 9);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 8192, Access::LOCAL, 0);
    let dst = f.region(1, 8192, Access::REMOTE, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(8192, 1));
    drop_first(&mut f, 0, Operation::RdmaWriteMiddle);
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 8192)),
    );
    assert!(f.bytes(1, &dst) == &pattern(8192, 1)[..], "bytes differ");
    let (a, b) = (f.nodes[0].engine.counters(), f.nodes[1].engine.counters());
    assert_eq!(a.rcvd_seq_err, 1);
    assert_eq!(b.out_of_seq_request, 6, "the six packets after the gap");
    assert_eq!(b.duplicate_request, 0);
}

/// A READ response lost in the middle: the ones after it are taken where their PSNs put
/// them, and only the lost one is asked for again, a part of the READ the responder replays
/// from its resource ring (IBTA lets a retry reread only what was not answered).
#[test]
fn a_lost_middle_read_response_alone_is_asked_for_again() {
    let mut f = Fabric::new(2, 10);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let local = f.region(0, 4096, Access::LOCAL, 0);
    let target = f.region(1, 4096, Access::REMOTE, 0);
    f.bytes_mut(1, &target).copy_from_slice(&pattern(4096, 5));
    // Lose the third of four READ responses (the second MIDDLE) once.
    let mut middles = 0;
    f.filter = Some(Box::new(move |from, p| {
        if from == 1 && p.opcode().operation() == Operation::RdmaReadResponseMiddle {
            middles += 1;
            return middles == 2;
        }
        false
    }));
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(1, SendOp::Read(remote(&target, 0)), sge(&local, 0, 4096)),
    );
    assert!(f.bytes(0, &local) == &pattern(4096, 5)[..], "bytes differ");
    let (a, b) = (f.nodes[0].engine.counters(), f.nodes[1].engine.counters());
    // The LAST was taken ahead of the lost MIDDLE, which was asked for alone: a duplicate the
    // responder replayed, one packet long.
    assert_eq!((a.read_taken_ahead, a.read_reasks), (1, 1), "{a:?}");
    assert_eq!(b.duplicate_request, 1);
    assert_eq!(b.sent_pkts, 5, "four responses and the one asked for again");
    assert_eq!(a.completer_retry_err, 0, "no retry_cnt spent");
    assert_eq!(a.stale_response, 0, "{a:?}");
}

#[test]
fn duplicate_atomic_is_answered_from_the_saved_value() {
    let mut f = Fabric::new(2, 11);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let local = f.region(0, 8, Access::LOCAL, 0);
    let target = f.region(1, 8, Access::REMOTE, 0);
    drop_first(&mut f, 1, Operation::AtomicAcknowledge);
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(
            1,
            SendOp::FetchAdd {
                remote: remote(&target, 0),
                add: 3,
            },
            sge(&local, 0, 8),
        ),
    );
    // Executed once, though requested twice.
    assert_eq!(
        u64::from_ne_bytes(f.bytes(1, &target).try_into().unwrap()),
        3
    );
    assert_eq!(
        u64::from_ne_bytes(f.bytes(0, &local).try_into().unwrap()),
        0
    );
    assert_eq!(f.nodes[1].engine.counters().duplicate_request, 1);
}

/// An atomic ACK lost, then a packet of the SEND behind it: the sequence NAK for that packet
/// acknowledges the atomic's PSN without its answer (an implied NAK). One retry, from the
/// atomic, recovers both; the NAK's own PSN must not become a second rewind, which would skip
/// the atomic and spend the retry count twice on one loss.
#[test]
fn a_lost_atomic_answer_then_a_sequence_nak_is_one_retry_from_the_atomic() {
    let mut f = Fabric::new(2, 13);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let result = f.region(0, 8, Access::LOCAL, 0);
    let word = f.region(1, 8, Access::REMOTE, 0);
    let src = f.region(0, 3000, Access::LOCAL, 0);
    let dst = f.region(1, 3000, Access::LOCAL, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(3000, 9));
    f.post_recv(1, qb, 10, &dst, 0, 3000);
    let (mut ack_dropped, mut middle_dropped) = (false, false);
    f.filter = Some(Box::new(move |from, p| {
        let op = p.opcode().operation();
        let ack = from == 1 && op == Operation::AtomicAcknowledge && !ack_dropped;
        let middle = from == 0 && op == Operation::SendMiddle && !middle_dropped;
        ack_dropped |= ack;
        middle_dropped |= middle;
        ack || middle
    }));
    let engine = &mut f.nodes[0].engine;
    let add = SendOp::FetchAdd {
        remote: remote(&word, 0),
        add: 5,
    };
    engine
        .post_send(qa, SendWr::new(1, add, sge(&result, 0, 8)))
        .unwrap();
    engine
        .post_send(qa, SendWr::new(2, SendOp::Send, sge(&src, 0, 3000)))
        .unwrap();
    f.run();

    let done = f.completions(0);
    let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    let recv = only(&f.completions(1));
    assert_eq!((recv.status, recv.byte_len), (WcStatus::Success, 3000));
    assert!(
        f.bytes(1, &dst) == &pattern(3000, 9)[..],
        "the SEND landed wrong"
    );
    // Executed once, its answer replayed from the responder's resource.
    assert_eq!(u64::from_ne_bytes(f.bytes(1, &word).try_into().unwrap()), 5);
    let counters = f.nodes[0].engine.counters();
    assert_eq!(counters.rcvd_seq_err, 1);
    assert_eq!(counters.completer_retry_err, 1, "{counters:?}");
}

/// An atomic ACK lost, then an RNR NAK for the SEND behind it: the retry starts from the
/// atomic at once, rather than after the RNR wait skips it and an ACK timeout finds it.
#[test]
fn a_lost_atomic_answer_then_an_rnr_nak_is_one_retry_from_the_atomic() {
    let mut f = Fabric::new(2, 14);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let result = f.region(0, 8, Access::LOCAL, 0);
    let word = f.region(1, 8, Access::REMOTE, 0);
    let src = f.region(0, 64, Access::LOCAL, 0);
    let dst = f.region(1, 64, Access::LOCAL, 0);
    drop_first(&mut f, 1, Operation::AtomicAcknowledge);
    let engine = &mut f.nodes[0].engine;
    let add = SendOp::FetchAdd {
        remote: remote(&word, 0),
        add: 9,
    };
    engine
        .post_send(qa, SendWr::new(1, add, sge(&result, 0, 8)))
        .unwrap();
    engine
        .post_send(qa, SendWr::new(2, SendOp::Send, sge(&src, 0, 64)))
        .unwrap();
    // No receive yet: the SEND draws RNR NAKs.
    f.run_for(Duration::from_micros(100));
    assert!(f.nodes[0].engine.counters().rcvd_rnr_err >= 1);
    f.post_recv(1, qb, 10, &dst, 0, 64);
    f.run();

    let done = f.completions(0);
    let got: Vec<_> = done.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(only(&f.completions(1)).status, WcStatus::Success);
    assert_eq!(u64::from_ne_bytes(f.bytes(1, &word).try_into().unwrap()), 9);
    let counters = f.nodes[0].engine.counters();
    assert_eq!(counters.completer_retry_err, 1, "{counters:?}");
}

#[test]
fn psn_wraps_around_mid_message() {
    let mut f = Fabric::new(2, 12);
    let opts = ConnectOptions {
        psn_a: Psn::new(0xff_fffd).unwrap(),
        psn_b: Psn::new(0xff_ffff).unwrap(),
        ..ConnectOptions::default()
    };
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &opts);
    let src = f.region(0, 10_000, Access::LOCAL, 0);
    let dst = f.region(1, 10_000, Access::REMOTE, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(10_000, 8));
    f.link.loss = 0.1;
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 10_000)),
        )
        .unwrap();
    f.nodes[1]
        .engine
        .post_send(
            qb,
            SendWr::new(2, SendOp::Read(remote(&src, 0)), sge(&dst, 0, 0)),
        )
        .unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    assert_eq!(only(&f.completions(1)).status, WcStatus::Success);
    assert!(f.bytes(1, &dst) == &pattern(10_000, 8)[..], "bytes differ");
    let (next, _) = f.nodes[0].engine.qp_psns(qa).unwrap();
    assert_eq!(next, Psn::new(0xff_fffd).unwrap().add(10));
}

#[test]
fn uc_gap_abandons_the_message_and_the_next_one_lands() {
    let mut f = Fabric::new(2, 13);
    let (qa, qb) = f.connect(0, 1, QpType::Uc, &ConnectOptions::default());
    let src = f.region(0, 4096, Access::LOCAL, 0);
    let dst = f.region(1, 8192, Access::LOCAL, 0);
    f.bytes_mut(0, &src).copy_from_slice(&pattern(4096, 2));
    f.post_recv(1, qb, 1, &dst, 0, 4096);
    drop_first(&mut f, 0, Operation::SendMiddle);
    let engine = &mut f.nodes[0].engine;
    engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 4096)))
        .unwrap();
    engine
        .post_send(qa, SendWr::new(2, SendOp::Send, sge(&src, 0, 3000)))
        .unwrap();
    assert!(matches!(
        engine.post_send(
            qa,
            SendWr::new(3, SendOp::Read(remote(&dst, 0)), sge(&src, 0, 8))
        ),
        Err(PostError::Unsupported(_))
    ));
    f.run();
    // UC completes sends once sent; nothing is acknowledged or retransmitted.
    assert_eq!(f.completions(0).len(), 2);
    assert_eq!(f.nodes[1].engine.counters().sent_pkts, 0);
    // The first message was abandoned; its receive request took the second message.
    let c = only(&f.completions(1));
    assert_eq!((c.wr_id, c.byte_len), (1, 3000));
    assert!(
        f.bytes(1, &dst)[..3000] == pattern(4096, 2)[..3000],
        "bytes differ"
    );
    assert!(f.nodes[1].engine.counters().uc_dropped_msgs >= 1);
}

#[test]
fn modify_to_err_flushes_everything() {
    let mut f = Fabric::new(2, 14);
    let (qa, _) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let buf = f.region(0, 64, Access::LOCAL, 0);
    f.post_recv(0, qa, 10, &buf, 0, 64);
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(11, SendOp::Send, sge(&buf, 0, 8)))
        .unwrap();
    f.nodes[0]
        .engine
        .modify_qp(
            qa,
            &QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            },
        )
        .unwrap();
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(12, SendOp::Send, sge(&buf, 0, 8)))
        .unwrap();
    let mut done: Vec<_> = f
        .completions(0)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    done.sort_unstable_by_key(|d| d.0);
    assert_eq!(
        done,
        [
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr),
            (12, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn state_transitions_are_checked() {
    let mut f = Fabric::new(2, 15);
    let node = &mut f.nodes[0];
    let qp = node
        .engine
        .create_qp(ferroce_proto::qp::QpInit {
            qp_type: QpType::Rc,
            pd: node.pd,
            send_cq: node.cq,
            recv_cq: node.cq,
            caps: Default::default(),
            sq_sig_all: false,
            srq: None,
        })
        .unwrap();
    let to = |state| QpAttr {
        state: Some(state),
        ..QpAttr::default()
    };
    assert_eq!(
        node.engine.modify_qp(qp, &to(QpState::Rts)),
        Err(ModifyError::InvalidTransition {
            from: QpState::Reset,
            to: QpState::Rts
        })
    );
    assert_eq!(
        node.engine.modify_qp(qp, &to(QpState::Init)),
        Err(ModifyError::Missing {
            to: QpState::Init,
            attr: "access"
        })
    );
    node.engine
        .modify_qp(
            qp,
            &QpAttr {
                access: Some(Access::REMOTE),
                ..to(QpState::Init)
            },
        )
        .unwrap();
    assert_eq!(
        node.engine.modify_qp(qp, &to(QpState::Rtr)),
        Err(ModifyError::Missing {
            to: QpState::Rtr,
            attr: "peer"
        })
    );
    let buf_err = node
        .engine
        .post_send(qp, SendWr::new(1, SendOp::Send, Payload::Inline(vec![1])));
    assert_eq!(buf_err, Err(PostError::InvalidState(QpState::Init)));
    assert!(matches!(
        node.engine.modify_qp(
            qp,
            &QpAttr {
                retry_cnt: Some(8),
                ..QpAttr::default()
            }
        ),
        Err(ModifyError::InvalidValue {
            attr: "retry_cnt",
            ..
        })
    ));
    node.engine.modify_qp(qp, &to(QpState::Reset)).unwrap();
    assert_eq!(node.engine.qp_state(qp), Some(QpState::Reset));
    let _ = Mtu::M256;
}

/// Node 0 WRITEs 64 bytes of `fill` into a fresh region of node 1 over a new RC connection;
/// returns that WRITE as it left node 0 (packet and UDP source port), and the target region,
/// which nothing has reached yet.
fn a_write_as_it_leaves(f: &mut Fabric, fill: u8) -> (Vec<u8>, u16, RegionInfo) {
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 64, Access::LOCAL, fill);
    let dst = f.region(1, 64, Access::REMOTE, 0);
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 64)),
        )
        .unwrap();
    let mut buf = vec![0u8; ferroce_proto::engine::MAX_PACKET];
    let now = f.now;
    let node = &mut f.nodes[0];
    let t = node.engine.poll_transmit(now, &node.mem, &mut buf).unwrap();
    (buf[..t.len].to_vec(), t.src_port, dst)
}

#[test]
fn hostile_packets_are_dropped_and_counted() {
    let mut f = Fabric::new(3, 16);
    let (packet, src_port, dst) = a_write_as_it_leaves(&mut f, 7);
    let now = f.now;
    let from_a = std::net::SocketAddr::new(f.nodes[0].ip, src_port);
    let from_c = std::net::SocketAddr::new(f.nodes[2].ip, src_port);
    let b = &mut f.nodes[1];
    let dst_ip = b.ip;

    // From a third host: the wrong source. Its ICRC covers node 2's address, so re-seal it
    // as node 2 would.
    let mut spoofed = packet.clone();
    let ip = ferroce_proto::wire::IpHeader::between(from_c.ip(), dst_ip).unwrap();
    ferroce_proto::wire::icrc::seal(
        &ip,
        &ferroce_proto::wire::UdpHeader {
            src_port,
            dst_port: 4791,
        },
        &mut spoofed,
    )
    .unwrap();
    b.engine
        .handle_datagram(now, from_c, dst_ip, &spoofed, &mut b.mem);
    // A flipped payload byte.
    let mut corrupt = packet.clone();
    corrupt[40] ^= 1;
    b.engine
        .handle_datagram(now, from_a, dst_ip, &corrupt, &mut b.mem);
    // Garbage, and a truncated packet.
    b.engine
        .handle_datagram(now, from_a, dst_ip, &[0xff; 3], &mut b.mem);
    b.engine
        .handle_datagram(now, from_a, dst_ip, &packet[..20], &mut b.mem);
    let c = b.engine.counters();
    assert_eq!((c.wrong_source, c.icrc_err, c.malformed_pkts), (1, 1, 2));
    assert!(b.mem.bytes(dst.id).unwrap().iter().all(|&x| x == 0));
    // The genuine packet still lands.
    b.engine
        .handle_datagram(now, from_a, dst_ip, &packet, &mut b.mem);
    assert_eq!(b.mem.bytes(dst.id).unwrap(), &[7; 64]);
    let _ = (Syndrome::ACK, NakCode::InvalidRequest);
}

/// rxe and RoCE NICs give each packet an IP ID of their own, which the ICRC covers and a UDP
/// socket does not show, and a GRO buffer that begins inside a peer's GSO send numbers its
/// segments from 0 where their IDs do not: the ID is found from the ICRC (counted), a damaged
/// packet is still an ICRC error, and only the right packet lands.
#[test]
fn a_packet_with_another_ip_id_than_expected_lands_with_its_id_found() {
    use ferroce_proto::wire::{icrc, IpHeader, Ipv4Header, UdpHeader};

    let mut f = Fabric::new(2, 18);
    let (mut packet, src_port, dst) = a_write_as_it_leaves(&mut f, 9);
    let now = f.now;
    let from = std::net::SocketAddr::new(f.nodes[0].ip, src_port);
    let b = &mut f.nodes[1];
    let (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) = (from.ip(), b.ip) else {
        panic!("the fabric is IPv4")
    };
    // Sealed as rxe would have sent it: IP ID 0x4321.
    let ip = IpHeader::V4(Ipv4Header {
        id: 0x4321,
        ..Ipv4Header::new(s, d)
    });
    let udp = UdpHeader {
        src_port: from.port(),
        dst_port: 4791,
    };
    icrc::seal(&ip, &udp, &mut packet).unwrap();
    let mut corrupt = packet.clone();
    corrupt[40] ^= 1;
    b.engine
        .handle_segment(now, from, b.ip, &corrupt, 5, &mut b.mem);
    assert!(b.mem.bytes(dst.id).unwrap().iter().all(|&x| x == 0));
    // As segment 5 of a GRO buffer, where 5 is not its ID.
    b.engine
        .handle_segment(now, from, b.ip, &packet, 5, &mut b.mem);
    let c = b.engine.counters();
    assert_eq!((c.icrc_err, c.icrc_id_recovered), (1, 1));
    assert_eq!(b.mem.bytes(dst.id).unwrap(), &[9; 64]);
}

/// No path of ferroce's responder sends NAK code 3, but peers may: a hand-made one ends the
/// request with a remote operation error, and an RNR NAK or ACK for a PSN never sent is
/// ignored as stale.
#[test]
fn remote_operational_error_and_stale_responses() {
    use ferroce_proto::wire::{icrc, Aeth, Bth, IpHeader, Opcode, PacketRepr, UdpHeader};

    let mut f = Fabric::new(2, 17);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 64, Access::LOCAL, 0);
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(1, SendOp::Send, sge(&src, 0, 8)))
        .unwrap();
    let mut buf = vec![0u8; ferroce_proto::engine::MAX_PACKET];
    let now = f.now;
    let node = &mut f.nodes[0];
    let sent = node.engine.poll_transmit(now, &node.mem, &mut buf).unwrap();
    let sent_psn = ferroce_proto::wire::Packet::new_checked(&buf[..sent.len])
        .unwrap()
        .psn();

    let (a_ip, b_ip) = (f.nodes[0].ip, f.nodes[1].ip);
    let respond = |psn: Psn, syndrome: Syndrome| {
        let mut repr = PacketRepr::new(Bth::new(Opcode::RC_ACKNOWLEDGE, qa, psn));
        repr.aeth = Some(Aeth { syndrome, msn: 0 });
        let mut bytes = vec![0; repr.buffer_len()];
        repr.emit(&[], &mut bytes).unwrap();
        let udp = UdpHeader {
            src_port: 0xc001,
            dst_port: 4791,
        };
        icrc::seal(&IpHeader::between(b_ip, a_ip).unwrap(), &udp, &mut bytes).unwrap();
        bytes
    };
    let from_b = std::net::SocketAddr::new(b_ip, 0xc001);
    let node = &mut f.nodes[0];
    for stale in [
        respond(sent_psn.add(5), Syndrome::ACK),
        respond(sent_psn.sub(1), Syndrome::ACK),
    ] {
        node.engine
            .handle_datagram(now, from_b, a_ip, &stale, &mut node.mem);
    }
    assert_eq!(node.engine.counters().stale_response, 2);
    assert!(node.engine.poll_completion(node.cq).is_none());
    let nak = respond(sent_psn, Syndrome::Nak(NakCode::RemoteOperationalError));
    node.engine
        .handle_datagram(now, from_b, a_ip, &nak, &mut node.mem);
    assert_eq!(only(&f.completions(0)).status, WcStatus::RemOpErr);
    assert_eq!(f.nodes[0].engine.qp_state(qa), Some(QpState::Err));
    let _ = qb;
}

/// A long READ (1 MiB, 1024 responses) with one response lost: every response after the gap
/// is taken where it belongs, and the lost one is asked for once (going back for the rest on
/// each response after the gap would exhaust retry_cnt within a single burst, and going back
/// once asked for the rest of the piece and every piece after it).
#[test]
fn a_gap_in_a_long_read_costs_one_packet() {
    let mut f = Fabric::new(2, 18);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let len = 1 << 20;
    let local = f.region(0, len, Access::LOCAL, 0);
    let target = f.region(1, len, Access::REMOTE, 0);
    f.bytes_mut(1, &target).copy_from_slice(&pattern(len, 11));
    let mut middles = 0;
    f.filter = Some(Box::new(move |from, p| {
        if from == 1 && p.opcode().operation() == Operation::RdmaReadResponseMiddle {
            middles += 1;
            return middles == 100;
        }
        false
    }));
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(
            1,
            SendOp::Read(remote(&target, 0)),
            sge(&local, 0, len as u32),
        ),
    );
    assert!(f.bytes(0, &local) == &pattern(len, 11)[..], "bytes differ");
    let (a, b) = (f.nodes[0].engine.counters(), f.nodes[1].engine.counters());
    assert_eq!(a.read_reasks, 1, "{a:?}");
    assert_eq!(a.completer_retry_err, 0, "{a:?}");
    assert_eq!(
        b.sent_pkts,
        1024 + 1,
        "every response once, the lost one twice"
    );
}

/// Two responses lost in one piece of a READ: the second is asked for only once the first,
/// asked for earlier, has come. rxe's responder serves no part of a READ that starts before
/// the part it served last, so asking for the later one first would leave the earlier one
/// unservable if its answer were lost again.
#[test]
fn two_gaps_in_one_piece_are_asked_for_in_order() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let (mut f, qa, local, dst) = read_setup(45, 7, 64 << 10);
    // (what, response PSN offset): READ requests sent and responses delivered, in order.
    let log = Rc::new(RefCell::new(Vec::new()));
    let seen = log.clone();
    let mut first = None;
    let mut dropped = [false; 2];
    f.filter = Some(Box::new(move |from, p| {
        let first = *first.get_or_insert(p.psn());
        let k = first.steps_to(p.psn());
        if from == 0 {
            if let Some(reth) = p.reth() {
                seen.borrow_mut().push(("ask", k, reth.len >> 10));
            }
            return false;
        }
        for (i, at) in [10, 20].into_iter().enumerate() {
            if k == at && !dropped[i] {
                dropped[i] = true;
                return true;
            }
        }
        seen.borrow_mut().push(("got", k, 1));
        false
    }));
    read_all(&mut f, qa, &local, &dst, 7);
    let log = log.borrow();
    let at = |e: (&str, u32, u32)| log.iter().position(|x| *x == e);
    let ask_10 = at(("ask", 10, 1)).expect("10 asked for alone");
    let ask_20 = at(("ask", 20, 1)).expect("20 asked for alone");
    let got_10 = log.iter().rposition(|x| *x == ("got", 10, 1)).unwrap();
    assert!(ask_10 < got_10 && got_10 < ask_20, "{log:?}");
    let a = f.nodes[0].engine.counters();
    assert_eq!((a.read_reasks, a.early_resends), (2, 0), "{a:?}");
    assert_eq!(f.nodes[1].engine.counters().sent_pkts, 64 + 2);
}

/// A response asked for again and lost again: the answer to a later request asked again
/// shows it lost (a responder answers in order), and it is asked for a third time at once,
/// not after an early resend's wait.
#[test]
fn an_answer_to_a_later_ask_shows_an_earlier_one_lost() {
    let (mut f, qa, local, dst) = read_setup(46, 9, 1 << 20);
    // PSN 300 is lost twice, 600 once; the two are in different pieces.
    f.filter = Some(lose_responses([(300, 2), (600, 1)]));
    read_all(&mut f, qa, &local, &dst, 9);
    let a = f.nodes[0].engine.counters();
    assert_eq!((a.read_reasks, a.early_resends), (3, 0), "{a:?}");
    assert_eq!(a.completer_retry_err, 0, "{a:?}");
    assert_eq!(f.nodes[1].engine.counters().sent_pkts, 1024 + 3);
}

/// Many lost READ responses asked for again at once, more than the requester remembers asks
/// for: it waits for answers before asking for more. (It once forgot the oldest ask to make
/// room, took that one for unasked, asked for it again, and so forgot the next: against rxe a
/// loop of nine single-response asks, 295,000 requests in a second.)
#[test]
fn more_lost_responses_than_remembered_asks_are_asked_for_once_each() {
    // Sixteen pieces of 128 responses may be asked for at once (perftest asks for 128), on a
    // link slow enough that the asks wait behind them.
    let (mut f, local) = long_reads_posted(47, 11, 16, 1_000_000_000);
    // Every 23rd response, once: some 44 in each READ, and once the window has narrowed, in
    // pieces of a few dozen, one in most.
    let mut first = None;
    let mut dropped = std::collections::HashSet::new();
    f.filter = Some(Box::new(move |from, p| {
        let first = *first.get_or_insert(p.psn());
        let k = first.steps_to(p.psn());
        from == 1 && k % 23 == 22 && dropped.insert(k)
    }));
    assert!(f.run_for(Duration::from_secs(5)), "still busy after 5 s");
    long_reads_landed(&mut f, &local, 11);
    let lost = LONG_READS * LONG_READ as u64 / 1024 / 23;
    let (a, b) = (f.nodes[0].engine.counters(), f.nodes[1].engine.counters());
    assert!(a.read_reasks <= lost + 2, "{a:?}");
    assert!(b.sent_pkts <= LONG_READS * 1024 + lost + 8, "{b:?}");
}

/// A response lost again and again while the READs behind it go on: once what was sent
/// reaches as far past it as the requester can hold, no new request goes, but asking again
/// for what is missing still does. (A timeout's go-back-N was held back with the new
/// requests, and with nothing sent, no timer ran: against rxe, perf read-bw stopped for good.)
#[test]
fn a_response_lost_many_times_is_asked_for_while_new_requests_wait() {
    let (mut f, local) = long_reads_posted(48, 13, 16, 1_000_000_000);
    // Response PSN 10 of the first READ, and its first eight copies: the asks and early
    // resends run out, and the ACK timeout's go-back-N asks for it.
    f.filter = Some(lose_responses([(10, 9)]));
    f.run();
    long_reads_landed(&mut f, &local, 13);
    let a = f.nodes[0].engine.counters();
    assert!(a.completer_retry_err >= 1, "no ACK timeout: {a:?}");
    assert!(
        a.read_taken_ahead > 512,
        "held past the new requests' limit: {a:?}"
    );
}

/// Four 1 MiB READs (as [`long_reads_posted`]) from a responder that refuses what rxe's
/// refuses ([`fabric::rxe_read_replay`]), losing response PSN 10 of the first READ `losses`
/// times, and PSN 300, in a later piece, twice. From eight losses on, the asks and early
/// resends for PSN 10 run out and the ACK timeout's go-back-N asks for it (the ninth loss is
/// its answer's); PSN 300's ask is served, and its answer lost. Returns the requester's and
/// the responder's counters.
fn reads_past_a_timeout(losses: u32) -> (Counters, Counters) {
    let (mut f, local) = long_reads_posted(49, 15, 16, 1_000_000_000);
    let (mut rxe, refused) = fabric::rxe_read_replay(1024);
    let mut lose = lose_responses([(10, losses), (300, 2)]);
    f.filter = Some(Box::new(move |from, p| rxe(from, p) || lose(from, p)));
    f.run();
    long_reads_landed(&mut f, &local, 15);
    let (a, b) = (*f.nodes[0].engine.counters(), *f.nodes[1].engine.counters());
    assert_eq!(refused.get(), 0, "asked for what rxe refuses: {a:?}");
    // Every response once, and each lost one once more for each time it was lost: no copy of
    // one taken. (Going back from PSN 10 to the end of what was sent, it asked for a thousand
    // again.)
    let needed = LONG_READS * (LONG_READ as u64 / 1024);
    assert_eq!(b.sent_pkts, needed + u64::from(losses) + 2, "{a:?}");
    assert_eq!(a.stale_response, 0, "{a:?}");
    (a, b)
}

/// The ACK timeout's go-back-N over READs whose later responses were taken asks only for what
/// is missing, each piece from its first missing response (which rxe serves; a piece asked for
/// from its start after a later part was served goes unanswered there).
#[test]
fn a_timeouts_go_back_n_asks_only_for_the_missing_responses() {
    let (a, _) = reads_past_a_timeout(8);
    assert!(a.completer_retry_err >= 1, "no ACK timeout: {a:?}");
}

/// What a go-back-N asks for again past responses taken is known lost, as a lost run's ask
/// is: when its answer is lost again, the answer to the next piece's ask shows it, and it is
/// asked for once more at once, without another ACK timeout.
#[test]
fn a_go_back_n_answer_lost_again_is_asked_for_without_another_timeout() {
    let (eight, _) = reads_past_a_timeout(8);
    let (nine, _) = reads_past_a_timeout(9);
    assert_eq!(
        nine.completer_retry_err, eight.completer_retry_err,
        "{nine:?}"
    );
    assert_eq!(nine.read_reasks, eight.read_reasks + 1, "{nine:?}");
}

/// A READ of more packets than the largest window goes out in pieces of 128 response PSNs:
/// a 1 MiB READ at MTU 1024 is eight requests, at most `max_rd_atomic` of them unanswered at a
/// time (a piece with a response lost counts until it is answered). A response lost in the
/// third piece is asked for again alone, by a ninth request for that one PSN.
#[test]
fn a_long_read_goes_out_in_pieces_and_a_gap_costs_only_the_lost_response() {
    use std::cell::RefCell;
    use std::rc::Rc;
    let mut f = Fabric::new(2, 26);
    let opts = ConnectOptions {
        max_rd_atomic: 2,
        ..ConnectOptions::default()
    };
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &opts);
    let len = 1 << 20;
    let local = f.region(0, len, Access::LOCAL, 0);
    let target = f.region(1, len, Access::REMOTE, 0);
    f.bytes_mut(1, &target).copy_from_slice(&pattern(len, 12));
    // Each READ request as (response PSN offset, RETH va offset, RETH len), with the first
    // response PSN not yet delivered when it left.
    let requests = Rc::new(RefCell::new(Vec::new()));
    let log = requests.clone();
    let mut first = None;
    // Responses delivered, and the first PSN not yet delivered.
    let mut delivered = vec![false; 1025];
    let mut in_order = 0u32;
    let mut dropped = false;
    f.filter = Some(Box::new(move |from, p| {
        let first = *first.get_or_insert(p.psn());
        let k = first.steps_to(p.psn());
        if from == 0 {
            if let Some(reth) = p.reth() {
                let at = (k, reth.va - target.va, reth.len);
                log.borrow_mut().push((at, in_order));
            }
            return false;
        }
        // Response PSN 300 (in the third piece, 256..384) is lost once.
        let hit = k == 300 && !dropped;
        dropped |= hit;
        if !hit {
            delivered[k as usize] = true;
            while delivered[in_order as usize] {
                in_order += 1;
            }
        }
        hit
    }));
    post_and_complete(
        &mut f,
        qa,
        SendWr::new(
            1,
            SendOp::Read(remote(&target, 0)),
            sge(&local, 0, len as u32),
        ),
    );
    assert!(f.bytes(0, &local) == &pattern(len, 12)[..], "bytes differ");
    let requests = requests.borrow();
    let pieces: Vec<(u32, u64, u32)> = (0..8)
        .map(|i| (i * 128, u64::from(i) << 17, 1 << 17))
        .collect();
    let retry = (300, 300 << 10, 1 << 10);
    for (at, _) in requests.iter() {
        assert!(
            pieces.contains(at) || *at == retry,
            "{at:?} is neither a piece nor the rest of the third: {requests:?}"
        );
    }
    for piece in &pieces {
        assert!(
            requests.iter().any(|(at, _)| at == piece),
            "{piece:?} never asked for"
        );
    }
    assert_eq!(requests.iter().filter(|(at, _)| *at == retry).count(), 1);
    // Never more than max_rd_atomic (2) pieces asked for and not wholly answered.
    for &((k, _, len), in_order) in requests.iter() {
        let end = k + (len >> 10);
        let open = (0..8u32)
            .filter(|&i| i * 128 < end && (i + 1) * 128 > in_order)
            .count();
        assert!(open <= 2, "{open} pieces open at PSN {k}: {requests:?}");
    }
    // The gap cost the lost response.
    assert_eq!(f.nodes[1].engine.counters().sent_pkts, 1024 + 1);
    let a = f.nodes[0].engine.counters();
    assert_eq!((a.read_reasks, a.completer_retry_err), (1, 0), "{a:?}");
}

/// Refuses writes that reach past the first 1 KiB of the region, and records what it saw.
struct FirstKib {
    base: u64,
    seen: std::sync::Arc<std::sync::Mutex<Vec<ferroce_proto::InboundWrite>>>,
}

impl ferroce_proto::WriteFilter for FirstKib {
    fn admit(&mut self, write: &ferroce_proto::InboundWrite) -> bool {
        self.seen.lock().unwrap().push(*write);
        write.va + u64::from(write.len) <= self.base + 1024
    }
}

#[test]
fn a_write_filter_refuses_like_a_key_and_sees_every_packet() {
    let mut f = Fabric::new(2, 6);
    let (qa, qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 4096, Access::LOCAL, 3);
    let dst = f.region(1, 4096, Access::REMOTE, 0);
    let seen = std::sync::Arc::default();
    let filter = FirstKib {
        base: dst.va,
        seen: std::sync::Arc::clone(&seen),
    };
    assert!(f.nodes[1]
        .engine
        .set_write_filter(qb, Some(Box::new(filter))));
    let engine = &mut f.nodes[0].engine;
    engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 1024)),
        )
        .unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    assert!(f.bytes(1, &dst)[..1024].iter().all(|&b| b == 3));
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(
            (seen[0].va, seen[0].len, seen[0].last),
            (dst.va, 1024, true)
        );
    }
    // Two packets (MTU 1024): the second reaches past the first KiB and is refused, with a
    // remote access error NAK, as a bad key would be; nothing of it lands.
    let engine = &mut f.nodes[0].engine;
    engine
        .post_send(
            qa,
            SendWr::new(2, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 2048)),
        )
        .unwrap();
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::RemAccessErr);
    assert!(f.bytes(1, &dst)[1024..].iter().all(|&b| b == 0));
    let counters = f.nodes[1].engine.counters();
    assert_eq!((counters.write_filtered, counters.resp_access_err), (1, 1));
    assert_eq!(seen.lock().unwrap().len(), 3);
    assert!(!f.nodes[1]
        .engine
        .set_write_filter(Qpn::from_low_bits(0xabcd), None));
}

/// Moves node `from`'s next packet to node `to` by hand; returns what `poll_transmit` said.
fn move_one(f: &mut Fabric, from: usize, to: usize) -> ferroce_proto::Transmit {
    let now = f.now;
    let mut buf = vec![0; ferroce_proto::engine::MAX_PACKET];
    let node = &mut f.nodes[from];
    let t = node
        .engine
        .poll_transmit(now, &node.mem, &mut buf)
        .expect("a packet to send");
    let src = std::net::SocketAddr::new(node.ip, 4791);
    let dst = f.nodes[to].ip;
    let node = &mut f.nodes[to];
    node.engine
        .handle_datagram(now, src, dst, &buf[..t.len], &mut node.mem);
    t
}

/// `Transmit::ack` marks a bare positive ACK, which a driver may hold for the next packet, and
/// nothing else: not the request, not a NAK.
#[test]
fn only_bare_positive_acks_are_marked_as_such() {
    let mut f = Fabric::new(2, 12);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 64, Access::LOCAL, 1);
    let dst = f.region(1, 64, Access::REMOTE, 0);
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, 16)),
        )
        .unwrap();
    assert!(!move_one(&mut f, 0, 1).ack, "the WRITE");
    assert!(move_one(&mut f, 1, 0).ack, "its ACK");
    let bad_key = RemoteAddr {
        va: dst.va,
        rkey: dst.rkey ^ 0x5555,
    };
    f.nodes[0]
        .engine
        .post_send(qa, SendWr::new(2, SendOp::Write(bad_key), sge(&src, 0, 16)))
        .unwrap();
    assert!(!move_one(&mut f, 0, 1).ack, "the WRITE with a wrong key");
    assert!(!move_one(&mut f, 1, 0).ack, "its NAK");
}

/// Queue pair numbers are drawn, not counted: 2,000 QPs get 2,000 distinct numbers of 0x11 and
/// up, and hardly any follows the one before it (a counter would make every one do so).
#[test]
fn queue_pair_numbers_are_not_sequential() {
    let mut f = Fabric::new(1, 5);
    let node = &mut f.nodes[0];
    let qpns: Vec<u32> = (0..2000)
        .map(|_| {
            node.engine
                .create_qp(ferroce_proto::qp::QpInit {
                    qp_type: QpType::Rc,
                    pd: node.pd,
                    send_cq: node.cq,
                    recv_cq: node.cq,
                    caps: Default::default(),
                    sq_sig_all: false,
                    srq: None,
                })
                .unwrap()
                .value()
        })
        .collect();
    let distinct: std::collections::HashSet<_> = qpns.iter().collect();
    assert_eq!(distinct.len(), 2000);
    assert!(qpns.iter().all(|&q| (0x11..1 << 24).contains(&q)));
    let successors = qpns.windows(2).filter(|w| w[1] == w[0] + 1).count();
    assert!(
        successors < 5,
        "{successors} of 1999 follow their predecessor"
    );
}

/// Node 0's packets for one RDMA WRITE of `len` bytes (at MTU 1024), taken as they would
/// leave, and node 1's region it writes.
fn write_packets(f: &mut Fabric, len: u32) -> (Vec<Vec<u8>>, RegionInfo) {
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, len as usize, Access::LOCAL, 0);
    let dst = f.region(1, len as usize, Access::REMOTE, 0);
    f.bytes_mut(0, &src)
        .copy_from_slice(&pattern(len as usize, 7));
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 0, len)),
        )
        .unwrap();
    let now = f.now;
    let node = &mut f.nodes[0];
    let mut buf = vec![0; ferroce_proto::engine::MAX_PACKET];
    let mut packets = Vec::new();
    while let Some(t) = node.engine.poll_transmit(now, &node.mem, &mut buf) {
        packets.push(buf[..t.len].to_vec());
    }
    assert_eq!(packets.len(), len.div_ceil(1024) as usize);
    (packets, dst)
}

/// Hands `packets` to node 1 in the order given, then ends the batch; returns the syndromes
/// of what node 1 answers.
fn deliver_batch(f: &mut Fabric, packets: &[&[u8]]) -> Vec<Syndrome> {
    let now = f.now;
    let src = std::net::SocketAddr::new(f.nodes[0].ip, 4791);
    let node = &mut f.nodes[1];
    for p in packets {
        node.engine
            .handle_datagram(now, src, node.ip, p, &mut node.mem);
    }
    node.engine.end_batch(now, &mut node.mem);
    let mut buf = vec![0; ferroce_proto::engine::MAX_PACKET];
    let mut answers = Vec::new();
    while let Some(t) = node.engine.poll_transmit(now, &node.mem, &mut buf) {
        let packet = ferroce_proto::wire::Packet::new_checked(&buf[..t.len]).unwrap();
        answers.push(packet.aeth().expect("an ACK or NAK").syndrome);
    }
    answers
}

/// GRO can hand a receiver a message's MIDDLE…LAST train before its FIRST (two UDP flows).
/// A responder that holds what is ahead of sequence until the end of the receive batch lands
/// the message in order and acknowledges it without a NAK; one that does not, NAKs it.
#[test]
fn a_train_handed_over_before_its_first_is_acked_without_a_nak() {
    let is_nak = |s: &Syndrome| matches!(s, Syndrome::Nak(NakCode::PsnSequenceError));

    let mut f = Fabric::new(2, 31);
    let (packets, dst) = write_packets(&mut f, 8192);
    f.nodes[1].engine.set_batch_holding(true);
    let mut reordered: Vec<&[u8]> = packets[1..].iter().map(Vec::as_slice).collect();
    reordered.push(&packets[0]);
    let answers = deliver_batch(&mut f, &reordered);
    assert!(!answers.is_empty(), "the message is acknowledged");
    assert!(!answers.iter().any(is_nak), "{answers:?}");
    let b = f.nodes[1].engine.counters();
    assert_eq!((b.held_ahead, b.out_of_seq_request), (7, 0));
    assert!(f.bytes(1, &dst) == &pattern(8192, 7)[..], "bytes differ");

    // The same order without holding: the train draws a sequence NAK.
    let mut f = Fabric::new(2, 31);
    let (packets, _) = write_packets(&mut f, 8192);
    let mut reordered: Vec<&[u8]> = packets[1..].iter().map(Vec::as_slice).collect();
    reordered.push(&packets[0]);
    let answers = deliver_batch(&mut f, &reordered);
    assert!(answers.iter().any(is_nak), "{answers:?}");
    assert_eq!(f.nodes[1].engine.counters().out_of_seq_request, 7);

    // Holding, but the FIRST never comes in this batch: what was held is then handled as it
    // would have been, one sequence NAK for the gap.
    let mut f = Fabric::new(2, 31);
    let (packets, _) = write_packets(&mut f, 8192);
    f.nodes[1].engine.set_batch_holding(true);
    let train: Vec<&[u8]> = packets[1..].iter().map(Vec::as_slice).collect();
    let answers = deliver_batch(&mut f, &train);
    assert_eq!(
        answers.iter().filter(|s| is_nak(s)).count(),
        1,
        "{answers:?}"
    );
    let b = f.nodes[1].engine.counters();
    assert_eq!((b.held_ahead, b.out_of_seq_request), (7, 7));
}

/// A responder handed a request and its resends together (it was descheduled while the
/// requester's early resends went out) acknowledges each copy, not once coalesced: each copy
/// asks for an ACK, as a probe's packets do, and an ACK more than the probes sent is what tells
/// the requester its resend was needless. Copies that do not ask (a multi-packet message's
/// FIRST, resent by go-back-N) share one ACK.
#[test]
fn each_copy_that_asks_for_an_ack_draws_its_own() {
    let acks = |answers: &[Syndrome]| {
        answers
            .iter()
            .filter(|s| matches!(s, Syndrome::Ack { .. }))
            .count()
    };
    let mut f = Fabric::new(2, 34);
    let (packets, _) = write_packets(&mut f, 8);
    let write = &packets[0];
    assert_eq!(acks(&deliver_batch(&mut f, &[write, write])), 2);
    assert_eq!(f.nodes[1].engine.counters().duplicate_request, 1);
    assert_eq!(acks(&deliver_batch(&mut f, &[write, write, write])), 3);

    let mut f = Fabric::new(2, 35);
    let (packets, _) = write_packets(&mut f, 2048);
    let (first, last) = (&packets[0], &packets[1]);
    assert_eq!(acks(&deliver_batch(&mut f, &[first, last])), 1);
    assert_eq!(
        acks(&deliver_batch(&mut f, &[first, first, first])),
        2,
        "copies that do not ask share the second ACK"
    );
    assert_eq!(acks(&deliver_batch(&mut f, &[last, last])), 2);
}

/// Memory that lends every payload of `min` bytes or more, as the soft NIC's driver does.
struct Lending<'a> {
    mem: &'a ferroce_proto::memory::HeapMemory,
    min: usize,
}

impl Memory for Lending<'_> {
    fn read(&self, region: RegionId, offset: u64, out: &mut [u8]) {
        self.mem.read(region, offset, out);
    }
    fn write(&mut self, _: RegionId, _: u64, _: &[u8]) {
        unreachable!("nothing is written while packets are built");
    }
    fn atomic(&mut self, _: RegionId, _: u64, _: ferroce_proto::memory::AtomicOp) -> u64 {
        unreachable!("nothing is written while packets are built");
    }
    fn can_lend(&self, _: RegionId, _: u64, len: usize) -> bool {
        len >= self.min
    }
}

/// Sends node `from`'s next packet to node `to` through memory that lends payloads of 1,000
/// bytes or more, gathering a lent one as a driver would; returns what was lent.
fn move_lent(f: &mut Fabric, from: usize, to: usize) -> Option<(RegionId, u64, usize)> {
    let now = f.now;
    let mut buf = vec![0; ferroce_proto::engine::MAX_PACKET];
    let node = &mut f.nodes[from];
    let memory = Lending {
        mem: &node.mem,
        min: 1000,
    };
    let t = node
        .engine
        .poll_transmit(now, &memory, &mut buf)
        .expect("a packet to send");
    let packet = match t.lent {
        Some(l) => {
            let body = &node.mem.bytes(l.region).unwrap()[l.offset as usize..][..l.len];
            [&buf[..l.at], body, &buf[l.at..t.len]].concat()
        }
        None => buf[..t.len].to_vec(),
    };
    let src = std::net::SocketAddr::new(node.ip, 4791);
    let dst = f.nodes[to].ip;
    let peer = &mut f.nodes[to];
    peer.engine
        .handle_datagram(now, src, dst, &packet, &mut peer.mem);
    t.lent.map(|l| (l.region, l.offset, l.len))
}

/// A payload the memory lends stays out of the buffer (`Transmit::lent` says where it lies and
/// where it goes), and the packet gathered from the headers, the region's bytes and the rest
/// is whole: the peer checks its ICRC, lands the data and acknowledges it.
#[test]
fn a_lent_payload_gathered_is_a_packet_the_peer_takes() {
    let mut f = Fabric::new(2, 21);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let src = f.region(0, 4096, Access::LOCAL, 0);
    for (i, b) in f.bytes_mut(0, &src).iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let dst = f.region(1, 4096, Access::REMOTE, 0);
    // 2,500 bytes at MTU 1024: two full packets lent, and a last of 452 copied (under `min`).
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Write(remote(&dst, 0)), sge(&src, 100, 2500)),
        )
        .unwrap();
    let lent: Vec<_> = (0..3).map(|_| move_lent(&mut f, 0, 1)).collect();
    let src_id = src.id;
    assert_eq!(
        lent,
        [Some((src_id, 100, 1024)), Some((src_id, 1124, 1024)), None]
    );
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    assert_eq!(f.bytes(1, &dst)[..2500], f.bytes(0, &src)[100..2600]);
    let counters = f.nodes[1].engine.counters();
    assert_eq!((counters.icrc_err, counters.rcvd_seq_err), (0, 0));
}

/// The same for READ responses: the responder's memory lends each full response's payload.
#[test]
fn a_lent_read_response_is_a_packet_the_requester_takes() {
    let mut f = Fabric::new(2, 22);
    let (qa, _qb) = f.connect(0, 1, QpType::Rc, &ConnectOptions::default());
    let dst = f.region(0, 4096, Access::LOCAL, 0);
    let src = f.region(1, 4096, Access::REMOTE, 0);
    for (i, b) in f.bytes_mut(1, &src).iter_mut().enumerate() {
        *b = (i * 5 + 1) as u8;
    }
    f.nodes[0]
        .engine
        .post_send(
            qa,
            SendWr::new(1, SendOp::Read(remote(&src, 200)), sge(&dst, 0, 2500)),
        )
        .unwrap();
    let request = move_one(&mut f, 0, 1);
    assert_eq!(request.lent, None, "a READ request carries no payload");
    let lent: Vec<_> = (0..3).map(|_| move_lent(&mut f, 1, 0)).collect();
    assert_eq!(
        lent,
        [Some((src.id, 200, 1024)), Some((src.id, 1224, 1024)), None]
    );
    f.run();
    assert_eq!(only(&f.completions(0)).status, WcStatus::Success);
    assert_eq!(f.bytes(0, &dst)[..2500], f.bytes(1, &src)[200..2700]);
    assert_eq!(f.nodes[0].engine.counters().icrc_err, 0);
}
