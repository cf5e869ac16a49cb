//! The latency loops: WRITE ping-pong (`run_iter_lat_write`: each side writes into the
//! other's buffer and polls the last byte of its own for the peer's counter), SEND
//! ping-pong (`run_iter_lat_send`), and one READ or atomic at a time (`run_iter_lat`).
//!
//! The soft NIC never hands out its buffer's bytes, so "polling the last byte" is a
//! `Region::read` of that byte, between polls of the send CQ that drive the engine.

use std::time::{Duration, Instant};

use ferroce::cq::WcStatus;
use ferroce::qp::{RemoteAddr, SendOp};
use ferroce::steps::{self, Step};

use super::bw::{check_message, recv_error, request, send_error, STALL};
use super::oob::{Comm, KeyLine};
use super::report::{lat_report, LatReport};
use super::{mismatch, pattern, pattern_byte, AtomicType, Settings, TestResources, Verb};

const PEEK_EVERY: Duration = Duration::from_millis(2);

/// Round trips are halved for the ping-pong tests, as perftest does.
const PINGPONG_FACTOR: u64 = 2;

/// Idle turns between two looks at the clock in a wait that spins.
const LOOK_EVERY: u32 = 64;

/// The clock of a wait that spins: whether the peer has gone quiet ([`STALL`]) and, in a timed
/// run, when to look whether it ended the run ([`PEEK_EVERY`]). It reads the clock once every
/// [`LOOK_EVERY`] idle turns, not every turn: on a virtual machine whose clock read traps, a
/// read costs as much as the rest of a turn's own work, and the turns are what detects the
/// peer's message. A turn is at least one system call (the poll drives the engine), so the
/// looks stay microseconds apart.
#[derive(Default)]
struct Patience {
    turns: u32,
    /// The first look: the wait counts from there.
    since: Option<Instant>,
    peeked: Option<Instant>,
}

impl Patience {
    /// Counts one idle turn; every [`LOOK_EVERY`]th returns the time.
    fn turn(&mut self) -> Option<Instant> {
        self.turns = self.turns.wrapping_add(1);
        (self.turns % LOOK_EVERY == 0).then(Instant::now)
    }

    /// One idle turn: whether the wait has lasted longer than [`STALL`].
    fn exhausted(&mut self) -> bool {
        self.turn().is_some_and(|now| self.stalled_at(now))
    }

    /// Whether the wait, at a look at `now`, has lasted longer than [`STALL`].
    fn stalled_at(&mut self, now: Instant) -> bool {
        now - *self.since.get_or_insert(now) > STALL
    }
}

fn stalled(what: &str) -> String {
    format!(
        " No progress for {} s while {what}: is the peer still there?",
        STALL.as_secs()
    )
}

/// Samples (round trips or operations, in ns) from consecutive posting times.
fn samples(tposted: &[Instant]) -> Vec<u64> {
    tposted
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_nanos() as u64)
        .collect()
}

/// The report of a run: from every recorded sample for a fixed number of iterations, or only
/// the average for a run of a fixed duration (`tposted` is then empty).
fn finish(
    record: bool,
    size: u64,
    iters: u64,
    tposted: &[Instant],
    count: u64,
    elapsed: Duration,
    factor: u64,
) -> LatReport {
    if record {
        lat_report(size, iters, &samples(tposted), factor)
    } else {
        duration_report(size, count, elapsed, factor)
    }
}

/// The report of a duration run: only the average.
fn duration_report(size: u64, count: u64, elapsed: Duration, factor: u64) -> LatReport {
    let avg = if count == 0 {
        0.0
    } else {
        elapsed.as_secs_f64() * 1e6 / count as f64 / factor as f64
    };
    LatReport {
        size,
        iters: count,
        avg,
        duration: true,
        ..LatReport::default()
    }
}

/// Tracks the send completions of a latency loop.
struct Sends {
    posted: u64,
    completed: u64,
    /// When each request was posted, in a run of a fixed count (empty in a timed run).
    tposted: Vec<Instant>,
    /// Whether this is a run of a fixed count (per-iteration samples), not of a duration.
    record: bool,
}

impl Sends {
    fn new(s: &Settings) -> Self {
        let record = s.duration.is_none();
        Self {
            posted: 0,
            completed: 0,
            tposted: Vec::with_capacity(if record { s.iters as usize } else { 0 }),
            record,
        }
    }

    /// Posts the next signaled request on queue pair 0 once fewer than `depth` are
    /// outstanding, noting when; `prepare` runs just before (the buffer is free by then).
    fn post_next(
        &mut self,
        res: &TestResources,
        op: SendOp,
        size: u64,
        depth: u64,
        prepare: impl FnOnce() -> Result<(), String>,
    ) -> Result<(), String> {
        self.make_room(res, depth)?;
        if self.record {
            self.tposted.push(Instant::now());
        }
        prepare()?;
        let wr = request(res, 0, op, size, self.posted, true)?;
        res.qps[0]
            .post_send(wr)
            .map_err(|e| format!(" Couldn't post send: scnt={} ({e})", self.posted))?;
        self.posted += 1;
        Ok(())
    }

    /// One idle turn while waiting for the peer's next message: reaps sends; when none had
    /// completed, looks (in a timed run) whether the peer has ended the run, and gives up
    /// after [`STALL`]. Returns whether the peer has ended it.
    fn idle(
        &mut self,
        res: &TestResources,
        comm: &Comm,
        patience: &mut Patience,
        waiting_for: impl FnOnce() -> String,
    ) -> Result<bool, String> {
        if self.reap(res)? {
            return Ok(false);
        }
        if let Some(now) = patience.turn() {
            if !self.record && now - *patience.peeked.get_or_insert(now) >= PEEK_EVERY {
                patience.peeked = Some(now);
                if comm.peer_spoke() {
                    return Ok(true);
                }
            }
            if patience.stalled_at(now) {
                return Err(stalled(&waiting_for()));
            }
        }
        std::hint::spin_loop();
        Ok(false)
    }

    /// Waits for the last send and reports the ping-pong.
    fn finish(
        mut self,
        res: &TestResources,
        size: u64,
        iters: u64,
        start: Instant,
    ) -> Result<LatReport, String> {
        self.make_room(res, 1)?;
        Ok(finish(
            self.record,
            size,
            iters,
            &self.tposted,
            self.posted,
            start.elapsed(),
            PINGPONG_FACTOR,
        ))
    }

    /// Reaps what has completed; drives the engine when nothing has.
    fn reap(&mut self, res: &TestResources) -> Result<bool, String> {
        let mut any = false;
        while let Some(wc) = res.send_cq.poll() {
            if wc.status != WcStatus::Success {
                return Err(send_error(&wc, self.posted, self.completed));
            }
            self.completed += 1;
            any = true;
        }
        Ok(any)
    }

    /// Waits until fewer than `depth` sends are outstanding.
    fn make_room(&mut self, res: &TestResources, depth: u64) -> Result<(), String> {
        let mut patience = Patience::default();
        while self.posted - self.completed >= depth {
            if !self.reap(res)? {
                if patience.exhausted() {
                    return Err(stalled("waiting for a send to complete"));
                }
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

/// write-lat for one message size. The server writes first (perftest's order).
pub(super) fn write_pingpong(
    s: &Settings,
    res: &TestResources,
    peer: &KeyLine,
    size: u64,
    comm: &Comm,
) -> Result<LatReport, String> {
    let (local, target, last) = (res.local_off(0), res.target_off(0), size - 1);
    // Earlier sizes left counters in the local area: lay the pattern down again.
    res.fill(local, &pattern(size))?;
    let op = SendOp::Write(RemoteAddr {
        va: peer.vaddr,
        rkey: peer.rkey,
    });
    let server = !s.is_client();
    let iters = if s.duration.is_some() {
        u64::MAX
    } else {
        s.iters
    };
    let mut sends = Sends::new(s);
    let mut rcnt = 0u64;
    let start = Instant::now();
    let deadline = s.duration.map(|d| start + d);
    let depth = u64::from(s.tx_depth);
    'run: while sends.posted < iters || rcnt < iters {
        if rcnt < iters && !(sends.posted < 1 && server) {
            let want = (rcnt + 1) as u8;
            let mut patience = Patience::default();
            let mut byte = [0u8; 1];
            loop {
                res.region
                    .read(target + last, &mut byte)
                    .map_err(|e| e.to_string())?;
                if byte[0] == want {
                    steps::mark(Step::Seen);
                    break;
                }
                if sends.idle(res, comm, &mut patience, || {
                    format!("waiting for the peer's write {}", rcnt + 1)
                })? {
                    break 'run;
                }
            }
            rcnt += 1;
            if s.check && last > 0 {
                let got = res.read(target, last)?;
                if let Some(at) = mismatch(&got, 0) {
                    return Err(format!(
                        " Data check failed: byte {at} of write {rcnt} is {:#04x}, expected {:#04x}",
                        got[at],
                        pattern_byte(at as u64)
                    ));
                }
            }
        }
        if !server && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if sends.posted < iters {
            let counter = (sends.posted + 1) as u8;
            sends.post_next(res, op, size, depth, || res.fill(local + last, &[counter]))?;
        }
        sends.reap(res)?;
    }
    sends.finish(res, size, s.iters, start)
}

/// read-lat and atomic-lat for one message size: one request at a time, the next posted as
/// soon as the last completed.
pub(super) fn one_at_a_time(
    s: &Settings,
    res: &TestResources,
    peer: &KeyLine,
    size: u64,
) -> Result<LatReport, String> {
    let remote = RemoteAddr {
        va: peer.vaddr,
        rkey: peer.rkey,
    };
    let (op, len) = match (s.verb, s.atomic) {
        (Verb::Atomic, AtomicType::FetchAdd) => (SendOp::FetchAdd { remote, add: 1 }, 8),
        (Verb::Atomic, AtomicType::CmpSwap) => (
            SendOp::CompareSwap {
                remote,
                compare: 0,
                swap: 0,
            },
            8,
        ),
        _ => (SendOp::Read(remote), size),
    };
    let record = s.duration.is_none();
    let mut tposted = Vec::with_capacity(if record { s.iters as usize } else { 0 });
    let local = res.local_off(0);
    let zeros = vec![0u8; len as usize];
    let start = Instant::now();
    let deadline = s.duration.map(|d| start + d);
    let mut first_fetched = None;
    let mut count = 0u64;
    while if record {
        count < s.iters
    } else {
        deadline.is_some_and(|d| Instant::now() < d)
    } {
        if s.check {
            res.fill(local, &zeros)?;
        }
        if record {
            tposted.push(Instant::now());
        }
        let wr = request(res, 0, op, len, count, true)?;
        res.qps[0]
            .post_send(wr)
            .map_err(|e| format!(" Couldn't post send: scnt={count} ({e})"))?;
        let mut patience = Patience::default();
        loop {
            match res.send_cq.poll() {
                Some(wc) if wc.status != WcStatus::Success => {
                    return Err(send_error(&wc, count + 1, count))
                }
                Some(_) => break,
                None if patience.exhausted() => return Err(stalled("waiting for a completion")),
                None => std::hint::spin_loop(),
            }
        }
        if s.check {
            let got = res.read(local, len)?;
            if s.verb == Verb::Read {
                if let Some(at) = mismatch(&got, 0) {
                    return Err(format!(
                        " Data check failed: byte {at} of READ {count} is {:#04x}, expected {:#04x}",
                        got[at],
                        pattern_byte(at as u64)
                    ));
                }
            } else {
                let value = u64::from_ne_bytes(got.try_into().expect("8 bytes"));
                let expected = match s.atomic {
                    AtomicType::FetchAdd => *first_fetched.get_or_insert(value) + count,
                    AtomicType::CmpSwap => 0,
                };
                if value != expected {
                    return Err(format!(
                        " Data check failed: atomic {count} fetched {value}, expected {expected}"
                    ));
                }
            }
        }
        count += 1;
    }
    Ok(finish(
        record,
        size,
        s.iters,
        &tposted,
        count,
        start.elapsed(),
        1,
    ))
}

/// send-lat: receives posted before the sync key line (on the queue pair, or on its shared
/// receive queue), then SEND ping-pong. The client sends first (perftest's order).
pub(super) struct SendPingpong {
    posted: u64,
}

impl SendPingpong {
    /// Posts the first receives (`ctx_set_recv_wqes`).
    pub(super) fn post(s: &Settings, res: &TestResources) -> Result<Self, String> {
        let first = super::bw::first_receives(s, 1);
        for _ in 0..first {
            super::bw::post_recv(res, 0)?;
        }
        Ok(Self { posted: first })
    }

    /// The ping-pong of one message size with the queue pair of `peer`.
    pub(super) fn run(
        &mut self,
        s: &Settings,
        res: &TestResources,
        size: u64,
        peer: &KeyLine,
        comm: &Comm,
    ) -> Result<LatReport, String> {
        let client = s.is_client();
        let iters = if s.duration.is_some() {
            u64::MAX
        } else {
            s.iters
        };
        let mut sends = Sends::new(s);
        let mut rcnt = 0u64;
        let start = Instant::now();
        let deadline = s.duration.map(|d| start + d);
        let depth = u64::from(s.tx_depth);
        'run: while sends.posted < iters || rcnt < iters {
            if rcnt < iters && !(sends.posted < 1 && client) {
                let mut patience = Patience::default();
                let wc = loop {
                    if let Some(wc) = res.recv_cq.poll() {
                        break wc;
                    }
                    if sends.idle(res, comm, &mut patience, || {
                        format!("waiting for message {}", rcnt + 1)
                    })? {
                        break 'run;
                    }
                };
                if wc.status != WcStatus::Success {
                    return Err(recv_error(&wc, rcnt));
                }
                if s.check {
                    check_message(res, &wc, 0, size, peer, rcnt)?;
                }
                rcnt += 1;
                if !sends.record || self.posted < s.iters {
                    super::bw::post_recv(res, 0)?;
                    self.posted += 1;
                }
            }
            if client && deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
            if sends.posted < iters {
                sends.post_next(res, SendOp::Send, size, depth, || Ok(()))?;
            }
            sends.reap(res)?;
        }
        sends.finish(res, size, s.iters, start)
    }
}
