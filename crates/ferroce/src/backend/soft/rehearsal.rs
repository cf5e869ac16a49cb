//! A rehearsal of the data path when a soft NIC opens, so that its first live packet does
//! not run the code for the first time: two scratch engines in memory, one RC queue pair
//! each, send each other one of every request (SEND, SEND and WRITE with immediate, a WRITE
//! of three packets, READ, both atomics) and answer them, through the engine code live
//! packets take, into one region on the heap and one mapped. Every other packet is handed
//! over as the second segment of a coalesced train, whose ICRC the engine checks by finding
//! the IP ID it left with: the path of a GRO buffer's segments, and of every packet from rxe
//! and RoCE NICs. Nothing leaves the process; the NIC's own engine, counters and queue pair
//! numbers are untouched. The driver then rehearses the socket's side
//! (`udp::Port::rehearse`, a lone datagram and a train sent to a scratch socket and taken
//! back).
//!
//! Why: natively the first run of a path costs tens of microseconds, but under emulation (a
//! QEMU TCG guest translates each block of code the first time it runs) a fresh responder's
//! first answer took 8–17 ms against rxe's 1–7 ms, and every stage of it (receive, handle,
//! build the answer, send) took 1–6 ms the first time and tens of microseconds after. With
//! the rehearsal the first answer takes 1.2–4.9 ms (BENCHMARKS.md, "A fresh responder's
//! first answer, rehearsed"). Natively it costs 0.2–0.4 ms of the progress thread's time
//! per NIC opened, the scratch port's part included, before the thread first waits for a
//! packet; the application does not wait for it.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use ferroce_proto::engine::MAX_PACKET;
use ferroce_proto::memory::{Access, RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    CqId, Mtu, Payload, QpAttr, QpCaps, QpInit, QpState, QpType, RecvWr, RemoteAddr, SendOp,
    SendWr, Sge,
};
use ferroce_proto::wire::{Qpn, RnrTimer};
use ferroce_proto::{Engine, EngineConfig, Psn};

use super::memory::{HostBuf, HostMemory, Storage};
use crate::sys;

/// The rehearsal's path MTU, whatever the NIC's: its packets take the same code at any MTU,
/// and at this one its WRITE has a FIRST, a MIDDLE and a LAST.
const MTU: Mtu = Mtu::M1024;

/// Each scratch region's size: room for every request's bytes at its own offset.
const REGION: u64 = 8192;

/// Rounds of the exchange before giving up: every request and answer takes one each way,
/// so a handful suffices; the bound keeps a broken rehearsal from spinning.
const ROUNDS: usize = 16;

/// One side of the rehearsal.
struct Side {
    engine: Engine,
    mem: HostMemory,
    addr: SocketAddr,
    cq: CqId,
    qp: Qpn,
    region: RegionInfo,
}

impl Side {
    /// A side at `ip` and `port` whose region's bytes are `storage`.
    fn new(ip: IpAddr, port: u16, seed: u64, storage: Storage) -> Option<Self> {
        let mut engine = Engine::new(EngineConfig { local_ip: ip, seed });
        engine.set_local_port(port);
        engine.set_port_mtu(MTU);
        engine.set_batch_holding(true);
        let pd = engine.alloc_pd();
        let cq = engine.create_cq(64);
        let region = engine
            .register(pd, 0x10_0000, REGION, Access::REMOTE, WriteOrder::default())
            .ok()?;
        let mut mem = HostMemory::default();
        mem.regions
            .insert(region.id, Arc::new(HostBuf::new(storage, false)));
        let qp = engine
            .create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                caps: QpCaps::default(),
                sq_sig_all: false,
                srq: None,
            })
            .ok()?;
        Some(Self {
            engine,
            mem,
            addr: SocketAddr::new(ip, port),
            cq,
            qp,
            region,
        })
    }

    /// INIT, RTR and RTS, facing `peer`.
    fn connect(&mut self, peer: &Self) -> Option<()> {
        let psn = |v| Psn::new(v).expect("below 2^24");
        let steps = [
            QpAttr {
                state: Some(QpState::Init),
                access: Some(Access::REMOTE),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(MTU),
                dest_qpn: Some(peer.qp),
                peer: Some(peer.addr),
                rq_psn: Some(psn(0x10)),
                max_dest_rd_atomic: Some(4),
                min_rnr_timer: Some(RnrTimer::new(1).expect("a valid timer code")),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(psn(0x10)),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(4),
                ..QpAttr::default()
            },
        ];
        steps
            .iter()
            .try_for_each(|attr| self.engine.modify_qp(self.qp, attr).ok())
    }

    /// Posts three receives and one of each request to `peer`; how many completions follow
    /// on this side.
    fn post_all(&mut self, peer: &Self) -> Option<usize> {
        let sge = |at: u64, len: u32| {
            Payload::Sges(vec![Sge {
                addr: self.region.va + at,
                len,
                lkey: self.region.lkey,
            }])
        };
        let remote = |at: u64| RemoteAddr {
            va: peer.region.va + at,
            rkey: peer.region.rkey,
        };
        let receives = [(100, 0), (101, 64), (102, 512)];
        for (wr_id, at) in receives {
            self.engine
                .post_recv(
                    self.qp,
                    RecvWr {
                        wr_id,
                        sges: vec![Sge {
                            addr: self.region.va + at,
                            len: 64,
                            lkey: self.region.lkey,
                        }],
                    },
                )
                .ok()?;
        }
        let requests = [
            (SendOp::Send, sge(128, 64)),
            (SendOp::SendWithImm(1), sge(192, 64)),
            // FIRST, MIDDLE and LAST at the rehearsal's MTU.
            (SendOp::Write(remote(4096)), sge(4096, 3072)),
            (SendOp::WriteWithImm(remote(64), 2), sge(256, 0)),
            (SendOp::Read(remote(4096)), sge(2048, 64)),
            (
                SendOp::FetchAdd {
                    remote: remote(7680),
                    add: 1,
                },
                sge(7680, 8),
            ),
            (
                SendOp::CompareSwap {
                    remote: remote(7680),
                    compare: 1,
                    swap: 2,
                },
                sge(7688, 8),
            ),
        ];
        let n = requests.len();
        for (wr_id, (op, local)) in requests.into_iter().enumerate() {
            self.engine
                .post_send(self.qp, SendWr::new(wr_id as u64, op, local))
                .ok()?;
        }
        // Each request completes here, and each receive here when the peer's SEND, SEND with
        // immediate and WRITE with immediate consume them.
        Some(n + receives.len())
    }

    /// Sends what this side has ready to `peer`, as the NIC's drain would hand it over, every
    /// other packet as segment 1 of a GRO buffer ([`Engine::handle_segment`]): sealed for IP
    /// ID 0, it is checked for ID 1 first and its ID then found from the ICRC. That search
    /// cost a guest's fresh responder about a millisecond the first time, in its first
    /// answer (BENCHMARKS.md, the data path's thirty-fourth step).
    fn transmit_to(&mut self, peer: &mut Self, now: Instant, buf: &mut [u8]) -> usize {
        let mut sent = 0;
        while let Some(t) = self.engine.poll_transmit(now, &self.mem, buf) {
            peer.engine.handle_segment(
                now,
                self.addr,
                peer.addr.ip(),
                &buf[..t.len],
                u16::from(sent % 2 == 1),
                &mut peer.mem,
            );
            sent += 1;
        }
        peer.engine.end_batch(now, &mut peer.mem);
        sent
    }

    fn completions(&mut self) -> usize {
        std::iter::from_fn(|| self.engine.poll_completion(self.cq)).count()
    }
}

/// Runs the rehearsal for a NIC at `ip`. Best effort: a step refused ends it early, having
/// warmed less.
pub(crate) fn rehearse(ip: IpAddr) {
    choose_crc();
    let _ = run(ip);
}

/// Sets the ICRC's CRC-32 implementation to whichever of `crc32fast` and the tables computed a
/// 4 KiB CRC faster on this machine (the best of seven interleaved runs of each), once a
/// process, before the rehearsal warms the chosen one (`icrc::set_crc_implementation`). The
/// engine's core reads no clock, so the timing is the driver's. Natively `crc32fast`'s
/// carry-less multiply is several times faster and wins whatever the noise; under QEMU's TCG,
/// which turns each carry-less multiply into a call, the tables win by about two. It costs
/// about 45 µs natively and 0.8 ms under `qemu-x86_64`, four fifths of that the code's first
/// run, which the rehearsal is for (BENCHMARKS.md, the data path's twenty-seventh step).
fn choose_crc() {
    use ferroce_proto::wire::icrc::{crc32_on, set_crc_implementation, CrcImplementation};
    static CHOSEN: std::sync::Once = std::sync::Once::new();
    CHOSEN.call_once(|| {
        let bytes: Vec<u8> = (0..4096u32).map(|i| ((i * 131) >> 3) as u8).collect();
        let time = |imp| {
            let start = Instant::now();
            std::hint::black_box(crc32_on(imp, std::hint::black_box(&bytes)));
            start.elapsed()
        };
        let (mut fast, mut tables) = (std::time::Duration::MAX, std::time::Duration::MAX);
        for _ in 0..7 {
            fast = fast.min(time(CrcImplementation::Crc32fast));
            tables = tables.min(time(CrcImplementation::Tables));
        }
        if tables < fast {
            set_crc_implementation(CrcImplementation::Tables);
        }
    });
}

/// What a rehearsal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rehearsed {
    /// Completions its requests were owed.
    owed: usize,
    /// Completions that came.
    completed: usize,
    /// Packets whose IP ID the ICRC check found (`icrc_id_recovered`).
    ids_found: u64,
}

/// The rehearsal, and what it did.
fn run(ip: IpAddr) -> Option<Rehearsed> {
    // One region on the heap (the tools' and the Rust API's), one mapped (the drop-in's,
    // which borrows the program's memory).
    let heap = Storage::Heap(vec![0; REGION as usize].into_boxed_slice());
    let mapped = Storage::Mapped(Arc::new(sys::Mapping::anonymous(REGION as usize).ok()?));
    // Ports no socket holds: the engines only stamp them into headers and ICRCs.
    let mut a = Side::new(ip, 1, 0x5eed_0001, heap)?;
    let mut b = Side::new(ip, 2, 0x5eed_0002, mapped)?;
    a.connect(&b)?;
    b.connect(&a)?;
    let want = a.post_all(&b)? + b.post_all(&a)?;
    let mut buf = vec![0; MAX_PACKET];
    let mut got = 0;
    for _ in 0..ROUNDS {
        let now = Instant::now();
        let moved = a.transmit_to(&mut b, now, &mut buf) + b.transmit_to(&mut a, now, &mut buf);
        got += a.completions() + b.completions();
        if got >= want || moved == 0 {
            break;
        }
    }
    let ids_found = a.engine.counters().icrc_id_recovered + b.engine.counters().icrc_id_recovered;
    Some(Rehearsed {
        owed: want,
        completed: got,
        ids_found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rehearsal completes every request it posts, on IPv4 and IPv6: a step refused or
    /// an answer lost would leave the paths it is for cold. On IPv4 the packets handed over
    /// as a train's second segment run the search for their IP ID, and are accepted.
    #[test]
    fn every_request_of_the_rehearsal_completes() {
        for ip in ["127.0.0.1", "::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            let done = run(ip).expect("every step taken");
            assert_eq!((done.owed, done.completed), (20, 20), "{ip}");
            // Half the packets at least: each side sends every other one as a second segment.
            if ip.is_ipv4() {
                assert!(
                    done.ids_found >= 10,
                    "{ip}: {} IP IDs found",
                    done.ids_found
                );
            } else {
                assert_eq!(done.ids_found, 0, "{ip}: IPv6 has no IP ID");
            }
        }
    }
}
