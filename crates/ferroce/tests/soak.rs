//! The soak (issue 16, "long runs"): verbs, sensor frames, request/reply sessions and
//! connection-manager churn run at once in one process for `FERROCE_SOAK_SECS` seconds (20 by
//! default, which is what CI runs; `scripts/soak.sh` runs it for tens of minutes), with 2 %
//! of the packets every soft NIC and the frame sender send dropped at random, and every byte
//! checked.
//!
//! What runs, each on loopback addresses of its own (127.0.0.186–193):
//! - verbs: one RC queue pair between two NICs, in rounds of a WRITE of 1 B to 256 KiB read
//!   back by a READ, a fetch-and-add and two compare-and-swaps against a model of the remote
//!   word, and a SEND with immediate each way; every byte and every atomic result checked;
//! - frames: a device-side `Sender` streaming frames into a `Receiver`; every complete frame
//!   byte for byte, and every packet-sized piece of an incomplete one equal to the same piece
//!   of this frame or of an earlier frame sent to that page (nothing else ever lands);
//! - sessions: controller and coprocessor made, used for 1500 requests of 0–4096 bytes with
//!   every slot in flight (each reply checked) and stopped, over and over, both sides' NICs
//!   dropping 2 % too (`ConnectInfo::with_faults`);
//! - CM churn: RC connections made with private data both ways, a SEND over each, and closed.
//!
//! Asserted: every byte and every atomic result; no request failing, no retry exhausted, no
//! ICRC error; that the loss really happened (resends on the verbs NICs, packets lost at the
//! frame receiver). Flatness: after a warm-up and again at the end, once traffic stops and
//! the timers have run out, the process's open descriptors and threads are exactly what they
//! were after the warm-up, its live heap (counted by this binary's allocator) at most
//! `HEAP_ALLOWANCE_KIB` above, its RSS at most `RSS_ALLOWANCE_KIB` above the most it reached
//! during the warm-up, and each NIC's census (queue pairs, CQs, regions, armed timers, queued
//! completions) and CM connection count the same. The test runs itself in a child process with `MALLOC_ARENA_MAX=2` (why: at the
//! test function). Printed, not asserted: the report (bytes and operations per kind, every
//! NIC's non-zero counters, and the first, largest and last resource samples).

// The one `unsafe` is the counting allocator's `GlobalAlloc` impl.
#![deny(unsafe_code)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use ferroce::cm::{self, ConnParam, Connection, Listener};
use ferroce::cq::{WcOpcode, WcStatus};
use ferroce::frames::{FrameInfo, FrameReadError, Pattern, Receiver, ReceiverConfig, Sender};
use ferroce::proto::memory::WriteOrder;
use ferroce::proto::{Census, Counters};
use ferroce::qp::{Payload, QpCaps, QpType, RecvWr, SendOp, SendWr};
use ferroce::session::{
    ChannelDesc, ConnectInfo, Controller, Coprocessor, MemoryKind, SessionError,
};
use ferroce::{ConnectOptions, Cq, Faults, Nic, NicConfig, Qp, Region, RegionAccess, RegionMemory};

/// What RSS may grow between the end of the warm-up and the end of the run.
const RSS_ALLOWANCE_KIB: u64 = 16 * 1024;
/// What the heap (bytes allocated and not freed) may grow meanwhile.
const HEAP_ALLOWANCE_KIB: u64 = 1024;
/// The arenas glibc's malloc may make (see `soak_mixed_traffic_under_loss_stays_flat`).
const ARENAS: &str = "2";
/// Longest wait for one completion, one frame-less stretch or one handshake step.
const WAIT: Duration = Duration::from_secs(60);
/// Longest wait, once traffic stops, for timers, timewait and exiting threads to settle.
const SETTLE: Duration = Duration::from_secs(90);
const SESSION_PORT: u16 = 19_430;
const CM_PORT: u16 = 19_440;
const LOSS: f64 = 0.02;

fn ip(host: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, host))
}

fn faults(seed: u64) -> Faults {
    format!("loss={LOSS},seed={seed}").parse().unwrap()
}

/// A soft NIC on 127.0.0.`host` dropping 2 % of what it sends.
fn lossy_nic(host: u8) -> Nic {
    Nic::open(&NicConfig {
        faults: Some(faults(u64::from(host))),
        ..NicConfig::on(ip(host))
    })
    .unwrap_or_else(|e| panic!("open a soft NIC on 127.0.0.{host}: {e}"))
}

fn region(nic: &Nic, access: RegionAccess, len: usize) -> Region {
    Region::register(
        nic,
        access,
        WriteOrder::InOrder,
        RegionMemory::Host(vec![0; len]),
    )
    .unwrap()
}

/// Fills `out` with a pattern of `seed`.
fn fill(out: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in out {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// A small deterministic generator for sizes and offsets.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Sets the stop flag if the thread holding it panics, so the others end early.
struct StopOnPanic(Arc<AtomicBool>);

impl Drop for StopOnPanic {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

/// When a workload stops: at `until` or when another one failed.
#[derive(Clone)]
struct Run {
    until: Instant,
    stop: Arc<AtomicBool>,
}

impl Run {
    fn going(&self) -> bool {
        Instant::now() < self.until && !self.stop.load(Ordering::SeqCst)
    }
}

/// What a workload did.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    bytes: u64,
    ops: u64,
    /// Frames: delivered incomplete (checked piece by piece); CM: connections.
    partial: u64,
    /// Frames sent whose end never arrived.
    missing: u64,
}

impl std::ops::AddAssign for Tally {
    fn add_assign(&mut self, o: Self) {
        self.bytes += o.bytes;
        self.ops += o.ops;
        self.partial += o.partial;
        self.missing += o.missing;
    }
}

// ---------------------------------------------------------------- verbs

const VERBS_MAX: usize = 256 * 1024;

struct Verbs {
    a: Nic,
    b: Nic,
    cq_a: Cq,
    cq_b: Cq,
    qp_a: Qp,
    qp_b: Qp,
    src: Region,    // a: what A writes and sends
    sink: Region,   // a: what A reads back, and what B sends lands in
    dst: Region,    // b: what A writes into and reads from
    recv: Region,   // b: what A sends lands in
    back: Region,   // b: what B sends
    word: Region,   // b: the atomic target
    result: Region, // a: the atomic results
    model: u64,
    round: u64,
    buf: Vec<u8>,
    got: Vec<u8>,
}

impl Verbs {
    fn new() -> Self {
        let (a, b) = (lossy_nic(186), lossy_nic(187));
        let (cq_a, cq_b) = (Cq::new(&a, 256).unwrap(), Cq::new(&b, 256).unwrap());
        let qp_a = Qp::new(&a, QpType::Rc, &cq_a, &cq_a, QpCaps::default()).unwrap();
        let qp_b = Qp::new(&b, QpType::Rc, &cq_b, &cq_b, QpCaps::default()).unwrap();
        let options = ConnectOptions::default();
        qp_a.connect(&qp_b.endpoint(), &options).unwrap();
        qp_b.connect(&qp_a.endpoint(), &options).unwrap();
        let word = region(&b, RegionAccess::Remote, 8);
        let model: u64 = 0x5eed_0000_0000_0001;
        word.write(0, &model.to_ne_bytes()).unwrap();
        Self {
            src: region(&a, RegionAccess::Local, VERBS_MAX),
            sink: region(&a, RegionAccess::Local, VERBS_MAX),
            dst: region(&b, RegionAccess::Remote, VERBS_MAX + 64),
            recv: region(&b, RegionAccess::Local, VERBS_MAX),
            back: region(&b, RegionAccess::Local, VERBS_MAX),
            result: region(&a, RegionAccess::Local, 24),
            word,
            model,
            round: 0,
            buf: vec![0; VERBS_MAX],
            got: vec![0; VERBS_MAX],
            a,
            b,
            cq_a,
            cq_b,
            qp_a,
            qp_b,
        }
    }

    fn expect(cq: &Cq, side: &str, wr_id: u64, opcode: WcOpcode, round: u64) -> u32 {
        let c = cq.wait(WAIT).unwrap_or_else(|| {
            panic!("verbs round {round}: no completion on {side} within {WAIT:?} (wr {wr_id})")
        });
        assert_eq!(
            (c.wr_id, c.status, c.opcode),
            (wr_id, WcStatus::Success, opcode),
            "verbs round {round} on {side}: {c:?}"
        );
        c.byte_len
    }

    /// One round: WRITE, READ back, three atomics, a SEND with immediate each way.
    fn round(&mut self, rng: &mut Rng) -> Tally {
        let r = self.round;
        self.round += 1;
        let len = 1 + rng.below(VERBS_MAX as u64) as usize;
        let at = rng.below(64);
        let data = &mut self.buf[..len];
        fill(data, r);
        self.src.write(0, data).unwrap();
        let send_len = 1 + rng.below(VERBS_MAX as u64) as usize;
        let add = 1 + rng.below(1 << 20);
        let swap = rng.below(u64::MAX);

        self.qp_b
            .post_recv(RecvWr {
                wr_id: 6,
                sges: vec![self.recv.local(0, VERBS_MAX as u32).unwrap()],
            })
            .unwrap();
        let remote_word = self.word.remote(0).unwrap();
        let wrs = [
            SendWr::new(
                1,
                SendOp::Write(self.dst.remote(at).unwrap()),
                Payload::Sges(vec![self.src.local(0, len as u32).unwrap()]),
            ),
            SendWr::new(
                2,
                SendOp::Read(self.dst.remote(at).unwrap()),
                Payload::Sges(vec![self.sink.local(0, len as u32).unwrap()]),
            ),
            SendWr::new(
                3,
                SendOp::FetchAdd {
                    remote: remote_word,
                    add,
                },
                Payload::Sges(vec![self.result.local(0, 8).unwrap()]),
            ),
            // Succeeds: compares with the value after the add.
            SendWr::new(
                4,
                SendOp::CompareSwap {
                    remote: remote_word,
                    compare: self.model.wrapping_add(add),
                    swap,
                },
                Payload::Sges(vec![self.result.local(8, 8).unwrap()]),
            ),
            // Fails: compares with something else, leaves the word.
            SendWr::new(
                5,
                SendOp::CompareSwap {
                    remote: remote_word,
                    compare: swap ^ 1,
                    swap: 0xdead,
                },
                Payload::Sges(vec![self.result.local(16, 8).unwrap()]),
            ),
            SendWr::new(
                7,
                SendOp::SendWithImm(r as u32),
                Payload::Sges(vec![self.src.local(0, send_len.min(len) as u32).unwrap()]),
            ),
        ];
        for wr in wrs {
            self.qp_a.post_send(wr).unwrap();
        }
        Self::expect(&self.cq_a, "A", 1, WcOpcode::RdmaWrite, r);
        Self::expect(&self.cq_a, "A", 2, WcOpcode::RdmaRead, r);
        Self::expect(&self.cq_a, "A", 3, WcOpcode::FetchAdd, r);
        Self::expect(&self.cq_a, "A", 4, WcOpcode::CompSwap, r);
        Self::expect(&self.cq_a, "A", 5, WcOpcode::CompSwap, r);
        Self::expect(&self.cq_a, "A", 7, WcOpcode::Send, r);
        let sent = send_len.min(len);
        let c = self.cq_b.wait(WAIT).expect("B's receive completes");
        assert_eq!(
            (c.wr_id, c.status, c.opcode, c.byte_len as usize, c.imm),
            (6, WcStatus::Success, WcOpcode::Recv, sent, Some(r as u32)),
            "verbs round {r}: the SEND to B"
        );

        // Every byte: where the WRITE landed, what the READ brought back, what the SEND did.
        let data = &self.buf[..len];
        let got = &mut self.got[..len];
        self.dst.read(at, got).unwrap();
        assert!(
            got == data,
            "verbs round {r}: the {len}-byte WRITE at {at} landed wrong"
        );
        self.sink.read(0, got).unwrap();
        assert!(
            got == data,
            "verbs round {r}: the {len}-byte READ brought back wrong bytes"
        );
        self.recv.read(0, &mut got[..sent]).unwrap();
        assert!(
            got[..sent] == data[..sent],
            "verbs round {r}: the {sent}-byte SEND landed wrong"
        );
        let mut words = [0u8; 24];
        self.result.read(0, &mut words).unwrap();
        let word = |i: usize| u64::from_ne_bytes(words[i * 8..i * 8 + 8].try_into().unwrap());
        let after_add = self.model.wrapping_add(add);
        assert_eq!(
            word(0),
            self.model,
            "verbs round {r}: fetch-and-add's original value"
        );
        assert_eq!(
            word(1),
            after_add,
            "verbs round {r}: the swapping CAS's original value"
        );
        assert_eq!(
            word(2),
            swap,
            "verbs round {r}: the failing CAS's original value"
        );
        self.model = swap;
        let mut remote = [0u8; 8];
        self.word.read(0, &mut remote).unwrap();
        assert_eq!(
            u64::from_ne_bytes(remote),
            swap,
            "verbs round {r}: the remote word"
        );

        // B sends back: lands in A's sink.
        let back_len = 1 + rng.below(VERBS_MAX as u64) as usize;
        let back = &mut self.buf[..back_len];
        fill(back, !r);
        self.back.write(0, back).unwrap();
        self.qp_a
            .post_recv(RecvWr {
                wr_id: 8,
                sges: vec![self.sink.local(0, VERBS_MAX as u32).unwrap()],
            })
            .unwrap();
        self.qp_b
            .post_send(SendWr::new(
                9,
                SendOp::Send,
                Payload::Sges(vec![self.back.local(0, back_len as u32).unwrap()]),
            ))
            .unwrap();
        let n = Self::expect(&self.cq_a, "A", 8, WcOpcode::Recv, r);
        assert_eq!(
            n as usize, back_len,
            "verbs round {r}: the SEND to A's length"
        );
        Self::expect(&self.cq_b, "B", 9, WcOpcode::Send, r);
        let got = &mut self.got[..back_len];
        self.sink.read(0, got).unwrap();
        assert!(
            got == &self.buf[..back_len],
            "verbs round {r}: the {back_len}-byte SEND to A landed wrong"
        );

        Tally {
            bytes: (2 * len + sent + back_len + 24) as u64,
            ops: 7,
            ..Tally::default()
        }
    }

    fn run(&mut self, run: &Run) -> Tally {
        let _guard = StopOnPanic(Arc::clone(&run.stop));
        let mut rng = Rng(0x1234_5678_9abc_def1 ^ self.round);
        let mut tally = Tally::default();
        while run.going() {
            tally += self.round(&mut rng);
        }
        tally
    }
}

// ---------------------------------------------------------------- frames

const FRAME: usize = 48 * 1024 + 100;
const PAGES: u32 = 4;
const PAYLOAD: usize = 4096;

struct Frames {
    nic: Nic,
    rx: Receiver,
    monitor: Option<thread::JoinHandle<Result<(), ferroce::frames::MonitorError>>>,
    tx: Sender,
    next: u32,
    /// The last frame reported.
    last: Option<u64>,
    /// Per page, the frames sent to it since (and including) the last complete frame read
    /// there: what a piece of an incomplete frame may hold.
    history: Vec<Vec<u32>>,
    /// Per page, whether a complete frame was ever read there (before that, zeros may be).
    written: Vec<bool>,
    got: Vec<u8>,
}

impl Frames {
    fn new() -> Self {
        let nic = lossy_nic(188);
        let rx = Receiver::new();
        let mut config = ReceiverConfig::for_frames(FRAME, PAGES, ip(189));
        config.queue_size = PAGES as usize;
        rx.start(&nic, config).expect("start the frame receiver");
        let monitor = {
            let rx = rx.clone();
            thread::spawn(move || rx.blocking_monitor())
        };
        let target = support::target(&rx, PAYLOAD);
        let mut tx = Sender::new(SocketAddr::new(ip(189), 0), target).expect("frame sender");
        tx.set_faults(Some(faults(189)));
        Self {
            nic,
            rx,
            monitor: Some(monitor),
            tx,
            next: 0,
            last: None,
            history: vec![Vec::new(); PAGES as usize],
            written: vec![false; PAGES as usize],
            got: vec![0; FRAME],
        }
    }

    fn pattern(n: u32) -> Vec<u8> {
        let mut data = vec![0; FRAME];
        Pattern::Counter.fill(n, &mut data);
        data
    }

    /// Checks a reported frame: whole, or piece by piece against what may be in its page.
    fn check(&mut self, f: &FrameInfo, tally: &mut Tally) {
        let m = f.frame_number;
        let page = f.page as usize;
        assert_eq!(
            u64::from(f.page),
            m % u64::from(PAGES),
            "frame {m}'s page: {f:?}"
        );
        assert_eq!(
            f.metadata.bytes_written, FRAME as u64,
            "frame {m}'s metadata: {f:?}"
        );
        match self.rx.read_frame(f, &mut self.got) {
            Ok(()) => {}
            // Reported so late that the next frame for its page is landing: gone, and said so.
            Err(FrameReadError::Overwritten { .. }) if m < u64::from(self.next) - 1 => {
                tally.missing += 1;
                return;
            }
            Err(e) => panic!("frame {m}: read_frame: {e}"),
        }
        let data = Self::pattern(m as u32);
        if f.is_complete() {
            assert!(
                self.got == data,
                "frame {m} is complete but its bytes differ: {f:?}"
            );
            tally.bytes += FRAME as u64;
            self.history[page].retain(|&x| u64::from(x) >= m);
            self.written[page] = true;
            return;
        }
        tally.partial += 1;
        let history = &self.history[page];
        let earlier: Vec<Vec<u8>> = history
            .iter()
            .filter(|&&x| u64::from(x) != m)
            .map(|&x| Self::pattern(x))
            .collect();
        let fresh = !self.written[page];
        for (i, piece) in self.got.chunks(PAYLOAD).enumerate() {
            let at = i * PAYLOAD;
            let same = |d: &[u8]| piece == &d[at..at + piece.len()];
            if same(&data) {
                tally.bytes += piece.len() as u64;
            } else {
                assert!(
                    (fresh && piece.iter().all(|&b| b == 0)) || earlier.iter().any(|d| same(d)),
                    "frame {m}, piece {i}: bytes of no frame sent to page {page} (frames \
                     sent there since its last complete one: {history:?}): {f:?}"
                );
            }
        }
    }

    fn run(&mut self, run: &Run) -> Tally {
        let _guard = StopOnPanic(Arc::clone(&run.stop));
        let mut tally = Tally::default();
        let mut sent = 0u64;
        while run.going() {
            let n = self.next;
            self.next += 1;
            self.history[(n % PAGES) as usize].push(n);
            self.tx
                .send_frame(&Self::pattern(n), None)
                .expect("send a frame");
            self.tx.flush().unwrap();
            sent += 1;
            // Take what is reported until this frame is, or nothing more comes for 250 ms
            // (its metadata packet was lost, or it is late: then it is taken later).
            while let Some(f) = self
                .rx
                .next_frame(Duration::from_millis(250))
                .expect("the receiver runs")
            {
                let m = f.frame_number;
                assert!(
                    m <= u64::from(n) && self.last.is_none_or(|l| m > l),
                    "frame {m} reported after frame {:?}, with {n} the last sent: {f:?}",
                    self.last
                );
                self.last = Some(m);
                tally.ops += 1;
                self.check(&f, &mut tally);
                if m == u64::from(n) {
                    break;
                }
            }
            assert!(
                !self.rx.receive_path_failed(),
                "the receive path failed: {:?}",
                self.rx.failure()
            );
        }
        // Frames never reported (their metadata packet lost), and those overtaken.
        tally.missing += sent - tally.ops;
        tally
    }

    fn close(mut self) {
        self.rx.close();
        let ended = self.monitor.take().unwrap().join().unwrap();
        assert_eq!(ended, Ok(()), "the frame monitor ended with an error");
    }
}

// ---------------------------------------------------------------- sessions

const SLOTS: u16 = 16;
const REQUESTS_PER_SESSION: usize = 1500;

fn session_info(own: u8) -> ConnectInfo {
    ConnectInfo::new(ip(own), SocketAddr::new(ip(191), SESSION_PORT))
        .with_faults(faults(u64::from(own)))
        .with_timeout(WAIT)
        .with_peer_timeout(Duration::from_secs(10))
}

/// The coprocessor's answer: the request reversed, each byte complemented.
fn answer(request: &[u8], reply: &mut [u8]) -> usize {
    for (r, q) in reply.iter_mut().zip(request.iter().rev()) {
        *r = !*q;
    }
    request.len()
}

/// One session's life: made, `REQUESTS_PER_SESSION` requests with every slot in flight,
/// stopped. Returns what it verified.
fn one_session(epoch: u64) -> Tally {
    let desc = ChannelDesc::new(SLOTS, 4096, 4096);
    let size = desc.region_bytes() as usize;
    let coprocessor = thread::spawn(move || -> Result<_, SessionError> {
        let s = Coprocessor::new().connect(&session_info(191))?;
        let (s, mem) = s.alloc_memory(size, MemoryKind::Host)?;
        let (s, peer) = s.exchange_keys(&mem)?;
        s.establish_channel(&desc, &mem, &peer)?
            .set_coprocessor_fn(|request: &[u8], reply: &mut [u8]| Ok(answer(request, reply)))?
            .start()
    });
    let controller = (|| -> Result<_, SessionError> {
        let s = Controller::new().connect(&session_info(190))?;
        let (s, mem) = s.alloc_memory(size, MemoryKind::Host)?;
        let (s, peer) = s.exchange_keys(&mem)?;
        s.establish_channel(&desc, &mem, &peer)?.start()
    })();
    let mut coprocessor = coprocessor
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("session {epoch}: the coprocessor: {e}"));
    let mut controller =
        controller.unwrap_or_else(|e| panic!("session {epoch}: the controller: {e}"));

    let mut rng = Rng(0xabcd_ef01_2345_6789 ^ epoch);
    let mut tally = Tally::default();
    let mut expected = HashMap::new();
    let (mut next, mut done) = (0usize, 0usize);
    let mut reply = vec![0u8; 4096];
    let mut want = vec![0u8; 4096];
    // A session that began runs its requests to the end, even past the deadline.
    while done < REQUESTS_PER_SESSION {
        while next < REQUESTS_PER_SESSION && expected.len() < usize::from(SLOTS) {
            let len = rng.below(4097) as usize;
            let mut request = vec![0u8; len];
            fill(&mut request, epoch << 32 | next as u64);
            let id = controller
                .submit(&request)
                .unwrap_or_else(|e| panic!("session {epoch}: submit {next}: {e}"));
            expected.insert(id, request);
            next += 1;
        }
        let got = controller
            .collect(&mut [&mut reply[..]])
            .unwrap_or_else(|e| panic!("session {epoch}: collect after {done}: {e}"));
        let request = expected.remove(&got.request).unwrap_or_else(|| {
            panic!(
                "session {epoch}: a reply to {:?}, not in flight",
                got.request
            )
        });
        let n = answer(&request, &mut want);
        assert_eq!(got.bytes, n, "session {epoch}: the reply's length");
        assert!(
            reply[..n] == want[..n],
            "session {epoch}: the reply to a {}-byte request differs",
            request.len()
        );
        tally.bytes += 2 * n as u64;
        tally.ops += 1;
        done += 1;
    }

    // The coprocessor counts a request after posting its reply, which may land first.
    let waited = Instant::now();
    while coprocessor.served() < REQUESTS_PER_SESSION as u64 && waited.elapsed() < WAIT {
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        coprocessor.served(),
        REQUESTS_PER_SESSION as u64,
        "session {epoch}: served"
    );
    controller.stop();
    coprocessor.stop();
    drop(controller);
    drop(coprocessor);
    tally.partial += 1;
    tally
}

fn sessions(run: &Run, first_epoch: u64) -> Tally {
    let _guard = StopOnPanic(Arc::clone(&run.stop));
    let mut tally = Tally::default();
    let mut epoch = first_epoch;
    while run.going() {
        tally += one_session(epoch);
        epoch += 1;
    }
    tally
}

// ---------------------------------------------------------------- CM churn

struct Churn {
    client: Nic,
    server: Nic,
    cq_c: Cq,
    cq_s: Cq,
    rx: Region,
    tx: Region,
    listener: Option<Listener>,
    n: u64,
}

impl Churn {
    fn new() -> Self {
        let (client, server) = (lossy_nic(192), lossy_nic(193));
        let listener = Listener::bind(&server, CM_PORT).unwrap();
        Self {
            cq_c: Cq::new(&client, 64).unwrap(),
            cq_s: Cq::new(&server, 64).unwrap(),
            rx: region(&server, RegionAccess::Local, 256),
            tx: region(&client, RegionAccess::Local, 256),
            listener: Some(listener),
            client,
            server,
            n: 0,
        }
    }

    /// One connection: made with private data both ways, one SEND over it, closed by the
    /// client.
    fn once(&mut self) -> Tally {
        let n = self.n;
        self.n += 1;
        let qp_c = Qp::new(
            &self.client,
            QpType::Rc,
            &self.cq_c,
            &self.cq_c,
            QpCaps::default(),
        )
        .unwrap();
        let qp_s = Qp::new(
            &self.server,
            QpType::Rc,
            &self.cq_s,
            &self.cq_s,
            QpCaps::default(),
        )
        .unwrap();
        let hello = format!("hello {n}").into_bytes();
        let welcome = format!("welcome {n}").into_bytes();
        let listener = self.listener.as_ref().unwrap();
        let (client, server) = thread::scope(|s| {
            let server = s.spawn(|| {
                let request = listener
                    .get_request(WAIT)
                    .unwrap_or_else(|e| panic!("CM {n}: no request: {e}"));
                assert_eq!(&request.private_data()[..hello.len()], &hello[..], "CM {n}");
                let param = ConnParam {
                    private_data: welcome.clone(),
                    ..ConnParam::default()
                };
                let conn = request.accept(&qp_s, &param).unwrap();
                conn.wait_established(WAIT)
                    .unwrap_or_else(|e| panic!("CM {n}: not established: {e}"));
                conn
            });
            let param = ConnParam {
                private_data: hello.clone(),
                timeout: WAIT,
                ..ConnParam::default()
            };
            let client = Connection::connect(&self.client, &qp_c, ip(193), CM_PORT, &param)
                .unwrap_or_else(|e| panic!("CM {n}: connect: {e}"));
            (client, server.join().unwrap())
        });
        assert_eq!(
            &client.private_data()[..welcome.len()],
            &welcome[..],
            "CM {n}"
        );

        let len = 1 + (n as usize * 37) % 256;
        let mut data = vec![0; len];
        fill(&mut data, n ^ 0xc0ffee);
        self.tx.write(0, &data).unwrap();
        qp_s.post_recv(RecvWr {
            wr_id: n,
            sges: vec![self.rx.local(0, 256).unwrap()],
        })
        .unwrap();
        qp_c.post_send(SendWr::new(
            n,
            SendOp::Send,
            Payload::Sges(vec![self.tx.local(0, len as u32).unwrap()]),
        ))
        .unwrap();
        for (cq, side) in [(&self.cq_c, "client"), (&self.cq_s, "server")] {
            let c = cq
                .wait(WAIT)
                .unwrap_or_else(|| panic!("CM {n}: no completion on the {side}"));
            assert_eq!(
                (c.wr_id, c.status),
                (n, WcStatus::Success),
                "CM {n} {side}: {c:?}"
            );
        }
        let mut got = vec![0; len];
        self.rx.read(0, &mut got).unwrap();
        assert!(
            got == data,
            "CM {n}: the SEND over the connection landed wrong"
        );

        client
            .disconnect(WAIT)
            .unwrap_or_else(|e| panic!("CM {n}: disconnect: {e}"));
        server
            .wait_disconnected(WAIT)
            .unwrap_or_else(|e| panic!("CM {n}: the server never saw the disconnect: {e}"));
        Tally {
            bytes: len as u64,
            ops: 1,
            partial: 1,
            missing: 0,
        }
    }

    fn run(&mut self, run: &Run) -> Tally {
        let _guard = StopOnPanic(Arc::clone(&run.stop));
        let mut tally = Tally::default();
        while run.going() {
            tally += self.once();
        }
        tally
    }
}

// ---------------------------------------------------------------- resources

/// The system allocator, counting the bytes allocated and not yet freed: the heap's own
/// measure of a leak, which RSS blurs (glibc keeps freed memory in per-thread arenas).
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

#[allow(unsafe_code)]
// SAFETY: every call is forwarded to `System` with the same arguments; the counter is only
// arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            LIVE.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The process and its NICs at one moment.
#[derive(Clone, Debug)]
struct Sample {
    at: Duration,
    rss_kib: u64,
    /// Heap bytes allocated and not freed, in KiB.
    heap_kib: u64,
    fds: usize,
    threads: usize,
    census: Vec<(String, Census)>,
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {dir}: {e}"))
        .count()
}

fn sample(started: Instant, nics: &[(&str, &Nic)]) -> Sample {
    Sample {
        at: started.elapsed(),
        rss_kib: rss_kib(),
        heap_kib: (LIVE.load(Ordering::Relaxed) / 1024) as u64,
        fds: count("/proc/self/fd"),
        threads: count("/proc/self/task"),
        census: nics
            .iter()
            .map(|(name, nic)| ((*name).to_owned(), nic.census().expect("a soft NIC")))
            .collect(),
    }
}

fn quiet(nics: &[(&str, &Nic)]) -> bool {
    nics.iter().all(|(_, nic)| {
        let c = nic.census().unwrap();
        c.armed_timers == 0 && c.queued_completions == 0 && cm::connections(nic) == Some(0)
    })
}

/// Waits, at most `SETTLE`, until every timer has run out, timewait is over, and (with a
/// reference) the process's threads and descriptors are back to it; then samples.
fn settle(started: Instant, nics: &[(&str, &Nic)], like: Option<&Sample>) -> Sample {
    let end = Instant::now() + SETTLE;
    loop {
        let s = sample(started, nics);
        let back = like.is_none_or(|l| l.threads == s.threads && l.fds == s.fds);
        if (quiet(nics) && back) || Instant::now() >= end {
            return s;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------- the soak

struct World {
    verbs: Verbs,
    frames: Frames,
    churn: Churn,
    session_epoch: u64,
}

/// Runs every workload at once until `until`, sampling every `every` meanwhile.
fn phase(
    world: &mut World,
    until: Instant,
    started: Instant,
    every: Duration,
    samples: &Mutex<Vec<Sample>>,
) -> [Tally; 4] {
    let run = Run {
        until,
        stop: Arc::new(AtomicBool::new(false)),
    };
    let World {
        verbs,
        frames,
        churn,
        session_epoch,
    } = world;
    let nics = [
        ("verbs A .186", &verbs.a),
        ("verbs B .187", &verbs.b),
        ("frames .188", &frames.nic),
        ("CM client .192", &churn.client),
        ("CM server .193", &churn.server),
    ];
    let nic_handles: Vec<(String, Nic)> = nics
        .iter()
        .map(|(n, nic)| ((*n).to_owned(), (*nic).clone()))
        .collect();
    let epoch = *session_epoch;
    let tallies = thread::scope(|s| {
        let v = s.spawn(|| {
            if on("verbs") {
                verbs.run(&run)
            } else {
                Tally::default()
            }
        });
        let f = s.spawn(|| {
            if on("frames") {
                frames.run(&run)
            } else {
                Tally::default()
            }
        });
        let c = s.spawn(|| {
            if on("cm") {
                churn.run(&run)
            } else {
                Tally::default()
            }
        });
        let se = s.spawn(|| {
            if on("sessions") {
                sessions(&run, epoch)
            } else {
                Tally::default()
            }
        });
        let sampler = s.spawn(|| {
            let named: Vec<(&str, &Nic)> = nic_handles
                .iter()
                .map(|(n, nic)| (n.as_str(), nic))
                .collect();
            let mut next = Instant::now() + every;
            while run.going() {
                if Instant::now() >= next {
                    samples.lock().unwrap().push(sample(started, &named));
                    next += every;
                }
                thread::sleep(Duration::from_millis(100));
            }
        });
        let results = [v.join(), f.join(), se.join(), c.join()];
        sampler.join().unwrap();
        let mut out = [Tally::default(); 4];
        let names = ["verbs", "frames", "sessions", "CM churn"];
        for ((r, o), name) in results.into_iter().zip(&mut out).zip(names) {
            match r {
                Ok(t) => *o = t,
                Err(e) => std::panic::panic_any(format!(
                    "the {name} workload failed: {}",
                    e.downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| e.downcast_ref::<&str>().copied())
                        .unwrap_or("?")
                )),
            }
        }
        out
    });
    *session_epoch += tallies[2].partial;
    tallies
}

/// Whether the workload `name` runs: all do unless `FERROCE_SOAK_ONLY` names some
/// (`verbs,frames,sessions,cm`), to find which one a failure belongs to.
fn on(name: &str) -> bool {
    std::env::var("FERROCE_SOAK_ONLY").map_or(true, |only| only.split(',').any(|o| o == name))
}

fn nonzero(c: &Counters) -> String {
    c.iter()
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the soak in a child process of this binary with `MALLOC_ARENA_MAX=2`, unless the
/// variable is set already (then here). glibc's malloc gives threads arenas of their own, up
/// to eight per core, and keeps what each arena once held: with a session's threads coming
/// and going several times a second, RSS climbs for minutes (20 to 55 MB in 20 s here) while
/// the heap stays flat to the kilobyte. Two arenas keep RSS a measure of what ferroce holds;
/// the heap itself is counted by the allocator above either way.
#[test]
fn soak_mixed_traffic_under_loss_stays_flat() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "soak_mixed_traffic_under_loss_stays_flat",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("MALLOC_ARENA_MAX", ARENAS)
            .output()
            .expect("run the soak in a child process");
        eprint!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success(),
            "the soak (child process, MALLOC_ARENA_MAX={ARENAS}) failed: {}",
            out.status
        );
        return;
    }
    let secs: u64 = std::env::var("FERROCE_SOAK_SECS")
        .ok()
        .map(|v| v.parse().expect("FERROCE_SOAK_SECS is a number of seconds"))
        .unwrap_or(20);
    let started = Instant::now();
    let every = Duration::from_secs((secs / 30).clamp(1, 30));
    let samples = Mutex::new(Vec::new());
    let mut world = World {
        verbs: Verbs::new(),
        frames: Frames::new(),
        churn: Churn::new(),
        session_epoch: 0,
    };

    // Warm-up: everything once (a session, connections, frames, verbs), then quiet.
    let warm_samples = Mutex::new(Vec::new());
    let warm = phase(
        &mut world,
        Instant::now() + Duration::from_secs(3),
        started,
        Duration::from_millis(250),
        &warm_samples,
    );
    let nic_list = |w: &World| -> Vec<(String, Nic)> {
        [
            ("verbs A .186", &w.verbs.a),
            ("verbs B .187", &w.verbs.b),
            ("frames .188", &w.frames.nic),
            ("CM client .192", &w.churn.client),
            ("CM server .193", &w.churn.server),
        ]
        .iter()
        .map(|(n, nic)| ((*n).to_owned(), (*nic).clone()))
        .collect()
    };
    let owned = nic_list(&world);
    let nics: Vec<(&str, &Nic)> = owned.iter().map(|(n, nic)| (n.as_str(), nic)).collect();
    let base = settle(started, &nics, None);
    assert!(
        quiet(&nics),
        "the warm-up did not settle within {SETTLE:?}: {base:?}"
    );
    samples.lock().unwrap().push(base.clone());
    let warm_rss = warm_samples
        .into_inner()
        .unwrap()
        .iter()
        .map(|s| s.rss_kib)
        .chain([base.rss_kib])
        .max()
        .unwrap();

    let run_start = Instant::now();
    let main = phase(
        &mut world,
        run_start + Duration::from_secs(secs),
        started,
        every,
        &samples,
    );
    let ran = run_start.elapsed();
    let end = settle(started, &nics, Some(&base));
    samples.lock().unwrap().push(end.clone());

    // The report.
    let names = ["verbs", "frames", "sessions", "CM churn"];
    let mut report = format!(
        "soak: {:.0} s of traffic ({secs} s asked), 2 % loss on every soft NIC and the frame \
         sender (not on the sessions' own NICs), MALLOC_ARENA_MAX={}\n",
        ran.as_secs_f64(),
        std::env::var("MALLOC_ARENA_MAX").unwrap_or_default()
    );
    for (name, (t, w)) in names.iter().zip(main.iter().zip(&warm)) {
        let extra = match *name {
            "verbs" => format!("{} rounds of 7 operations", t.ops / 7),
            "frames" => format!(
                "{} frames delivered ({} incomplete, checked piece by piece), {} never ended \
                 (metadata lost)",
                t.ops, t.partial, t.missing
            ),
            "sessions" => format!("{} requests over {} sessions", t.ops, t.partial),
            _ => format!("{} connections made, used and closed", t.ops),
        };
        report += &format!(
            "  {name:9} {:>14} bytes verified; {extra} (warm-up: {} bytes)\n",
            t.bytes, w.bytes
        );
    }
    for (name, nic) in &nics {
        report += &format!(
            "  {name:15} counters (warm-up included): {}\n",
            nonzero(&nic.counters())
        );
        if let Some(c) = cm::counters(nic) {
            if c.resends + c.duplicates + c.unexpected > 0 {
                report += &format!("  {name:15} CM: {c:?}\n");
            }
        }
    }
    let fc = world.frames.rx.counters();
    report += &format!(
        "  frame receiver: frames {} incomplete {} packets {} lost {} late {} dropped {}\n",
        fc.frames,
        fc.incomplete_frames,
        fc.packets,
        fc.packets_lost,
        fc.late_packets,
        fc.frames_dropped
    );
    let all = samples.lock().unwrap().clone();
    let first = &all[0];
    let last = all.last().unwrap();
    let max = |f: fn(&Sample) -> u64| all.iter().map(f).max().unwrap();
    report += &format!(
        "  resources ({} samples): RSS {} / {} / {} KiB, heap {} / {} / {} KiB, fds {} / {} / {}, \
         threads {} / {} / {} (after warm-up / largest / end); RSS at most {warm_rss} KiB \
         during the warm-up\n",
        all.len(),
        first.rss_kib,
        max(|s| s.rss_kib),
        last.rss_kib,
        first.heap_kib,
        max(|s| s.heap_kib),
        last.heap_kib,
        first.fds,
        max(|s| s.fds as u64),
        last.fds,
        first.threads,
        max(|s| s.threads as u64),
        last.threads
    );
    report += "  RSS KiB / heap KiB / fds / threads over time:";
    for s in &all {
        report += &format!(
            " {:.0}s:{}/{}/{}/{}",
            s.at.as_secs_f64(),
            s.rss_kib,
            s.heap_kib,
            s.fds,
            s.threads
        );
    }
    report += "\n";
    for (i, (name, c)) in first.census.iter().enumerate() {
        let most = |f: fn(&Census) -> usize| all.iter().map(|s| f(&s.census[i].1)).max().unwrap();
        report += &format!(
            "  {name:15} census after warm-up {c:?}; largest: qps {} regions {} timers {} \
             queued {}; end {:?}\n",
            most(|c| c.qps),
            most(|c| c.regions),
            most(|c| c.armed_timers),
            most(|c| c.queued_completions),
            last.census[i].1
        );
    }
    eprintln!("{report}");

    // Traffic of every kind, and the loss really happened.
    for ((name, t), key) in names
        .iter()
        .zip(&main)
        .zip(["verbs", "frames", "sessions", "cm"])
    {
        if !on(key) {
            continue;
        }
        assert!(
            t.ops > 0 && t.bytes > 0,
            "no {name} traffic was verified: {t:?}"
        );
    }
    assert!(
        !on("frames") || fc.packets_lost > 0,
        "2 % loss lost no frame packet"
    );
    for (name, nic) in &nics {
        let c = nic.counters();
        assert_eq!(c.icrc_err, 0, "{name}: ICRC errors");
        assert_eq!(c.retry_exceeded_err, 0, "{name}: a request gave up");
        assert_eq!(c.send_err, 0, "{name}: a request failed");
        assert_eq!(c.cq_overflow, 0, "{name}: a CQ overflowed");
    }
    for (name, nic) in nics[..2].iter().filter(|_| on("verbs")) {
        let c = nic.counters();
        assert!(
            c.completer_retry_err + c.early_resends > 0,
            "{name}: 2 % loss drew no resend: {}",
            nonzero(&c)
        );
    }

    // Flat.
    assert_eq!(
        end.fds, base.fds,
        "open descriptors after the run vs after the warm-up"
    );
    assert_eq!(
        end.threads, base.threads,
        "threads after the run vs after the warm-up"
    );
    // RSS against the most it reached during the warm-up: once quiet, glibc may have handed
    // some back, which the run then takes again (8.6 to 14.8 MB after the same warm-up).
    assert!(
        end.rss_kib <= warm_rss + RSS_ALLOWANCE_KIB,
        "RSS grew from {warm_rss} KiB (the most during the warm-up) to {} KiB, over the {} KiB \
         allowed",
        end.rss_kib,
        RSS_ALLOWANCE_KIB
    );
    assert!(
        end.heap_kib <= base.heap_kib + HEAP_ALLOWANCE_KIB,
        "the heap grew from {} KiB to {} KiB, over the {} KiB allowed",
        base.heap_kib,
        end.heap_kib,
        HEAP_ALLOWANCE_KIB
    );
    for ((name, b), (_, e)) in base.census.iter().zip(&end.census) {
        assert_eq!(e, b, "{name}: census after the run vs after the warm-up");
    }
    assert!(
        quiet(&nics),
        "timers, completions or CM connections left after {SETTLE:?}"
    );

    drop(nics);
    drop(owned);
    let World { frames, churn, .. } = world;
    frames.close();
    drop(churn.listener);
}
