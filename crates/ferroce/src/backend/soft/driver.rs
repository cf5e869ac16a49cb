//! The soft NIC's driver: the `ferroce-proto` engine, its regions' bytes and the datagram
//! link behind one lock ([`Locked`]), and the progress thread that drives them ([`Driver`]).
//!
//! One progress thread per NIC receives datagrams, runs timers and sends what the engine has
//! ready; application threads post work and send the packets it produces themselves, so a post
//! does not wait for the progress thread. The thread sleeps in `poll` until a datagram or the
//! engine's next timer; when a post arms an earlier timer than the one it sleeps for, or the
//! NIC closes, a byte on a private socket pair (the doorbell) wakes it. The doorbell is not a
//! datagram to the NIC's own address: a firewall that drops RoCE traffic would drop that too,
//! and a lost wake-up would leave the thread asleep for good. An idle NIC costs no CPU.
//!
//! While an application polls a CQ, its own thread receives and runs the timers instead
//! (`Driver::progress_here`), and the progress thread keeps off the socket: it naps on the
//! doorbell and a timer, waking only to look whether the application still polls; once it
//! has seen the application poll through a few looks, the application's polls push the timer
//! on, so that the thread wakes only after the polls have stopped. It publishes which of the
//! two sleeps it is in, under the lock, with the timers it saw (`Locked::thread_sleep`), so
//! that a post knows whether its timer needs the doorbell.
//!
//! What the application does between polls is learned from when it comes back: one that
//! leaves after each completion to wait elsewhere gets the progress thread back at once, and
//! one that answers each WRITE its peer sends (it watches its memory for them) has the poll
//! that found its completion stay for the next WRITE (`Driver::linger`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::steps::{self, Step};

/// The round trip at which the driver's timing of the application and its peer holds as
/// written ([`POLLER_GRACE`], [`LEAVES_AFTER`], [`POLLER_WATCH_MAX`], [`ANSWERS_WITHIN`],
/// [`LINGER_MAX`], [`ACK_HOLD`]): they were measured on loopback on the 2-core development
/// host, where a write-lat round trip takes 12-16 µs. Where the engine's usual round trip (the median of
/// its recent ones, [`Engine::round_trip`]) is n times this, they are n times as long, up to
/// [`MAX_TIME_SCALE`]: the application's turn and its peer's answer take longer with it. In a
/// guest under emulation (round trips of 0.6-1 ms) the native timing took every return of a
/// polling application for a leave and every answer for a late one, and the progress thread
/// received up to half the packets that the application's polls should have; scaled, it
/// receives a few dozen in a run (BENCHMARKS.md, the data path's nineteenth step).
///
/// The median, not a mean: on a loaded host a descheduled peer stretches single round trips
/// to milliseconds, and a grace stretched with them would keep the progress thread away while
/// the application is off its core. Nor the least, which in a guest is a quick exception and
/// left the stay too short for the usual answer.
const REFERENCE_ROUND_TRIP: Duration = Duration::from_micros(16);

/// The most the timing stretches: 64 × `POLLER_WATCH_MAX` is 128 ms, the longest that what
/// arrives for a program that stops polling without a word can wait, once.
const MAX_TIME_SCALE: u32 = 64;

/// How long after its last poll that found nothing an application is taken to be still
/// polling: the progress thread keeps off the socket meanwhile (one thread woken per packet,
/// not two). A busy poller polls again within microseconds; one that stops to sleep on a
/// channel arms its CQ, which gives the thread back at once (`release_poller`); one that
/// leaves after each completion to wait elsewhere (`ib_write_lat` spins on the memory its
/// peer writes) gives it back at each completion (`poll_satisfied`). What is left is a
/// program that stops polling unannounced and unlearned (a block in `Cq::wait` is one: the
/// connection manager's thread blocks there after every wake-up, and releasing there cost
/// the 64 B message rate a third), which waits this long once.
const POLLER_GRACE: Duration = Duration::from_micros(200);

/// After a poll that returned a completion: a time to the application's next call into the
/// NIC (a poll, or a post of its reply) longer than this is a leave. An application whose
/// returns are mostly leaves waits elsewhere after its completions, and for it such a poll
/// hands the socket back to the progress thread.
const LEAVES_AFTER: Duration = Duration::from_micros(4);

/// `Driver::leaving` in full: every return lately came after a leave.
const ALL_LEAVES: u32 = 1024;

/// The longest the progress thread naps between looks at whether a polling application is
/// still polling. Each look costs a context switch on a core that the application spins on,
/// so the nap doubles from [`POLLER_GRACE`] to this while the application keeps polling, and
/// from then on each poll pushes the nap's end on to this long after it (when less than an
/// eighth of it is left, `Driver::progress_here`): the thread wakes only once the polls have
/// stopped.
/// A program that stops polling without arming a CQ or blocking in `Cq::wait` has what
/// arrives next wait up to this long, once.
const POLLER_WATCH_MAX: Duration = Duration::from_millis(2);

/// The longest that nap lasts while the application holds ACKs for its next packet
/// ([`ACK_HOLD`]), at the reference round trip: half the earliest early resend. An
/// application that takes a request in a poll and then stops calling into the NIC without
/// answering (a ping-pong's last turn, a server that goes off to compute) leaves its held ACK
/// to this thread, which sends it at the nap's end; at [`POLLER_WATCH_MAX`] that end came after
/// the peer's early resend, and every quiet write-lat run ended with one needless resend and a
/// duplicate (BENCHMARKS.md, the data path's thirty-third step). Each poll that pushes the nap
/// on costs two system calls and one reprogramming of the CPU's timer (`sys::MovingTimer`),
/// made while it waits for the peer: one push in 440 µs of polling, where the nap's end would
/// otherwise have to follow every held ACK.
///
/// Only at the reference round trip (a time scale of 1, [`REFERENCE_ROUND_TRIP`]). Where the
/// round trip is tens of times longer (a guest under emulation), the peer's early resend comes
/// a few of those round trips after its request, sooner than any nap that spares the
/// application a look every few turns; this unscaled, the polls came too far apart to push the
/// nap on, the thread's looks took the application's CPU, and `ib_write_lat`'s typical round
/// trip went from 1.03 to 1.55 times rxe's. There the full watch stays.
const HELD_ACK_WATCH: Duration =
    Duration::from_nanos(ferroce_proto::engine::MIN_EARLY_RESEND.as_nanos() as u64 / 2);

/// A send this soon after a peer's WRITE landed answers it. An application whose sends
/// mostly do answers the WRITEs it is sent, and watches its memory for them (`ib_write_lat`
/// spins on the last byte of its buffer after each completion and makes no call into the NIC
/// until the peer's bytes are there). A send that is the application's first call after its
/// own request's completion answers a WRITE that landed in between, however late, if it
/// landed soon enough for the poll's stay to have placed it ([`LINGER_MAX`],
/// `Locked::own_completion`): where the progress thread placed that WRITE, the send comes
/// after the thread's turn and a switch back, 20-50 µs on this host.
const ANSWERS_WITHIN: Duration = Duration::from_micros(10);

/// `Locked::answering` in full: every send lately answered a WRITE.
const ALL_ANSWERS: u32 = 1024;

/// How long a poll that found a completion stays to receive the peer's next WRITE for such
/// an application, when none has landed since its last send (`Driver::linger`): the peer's
/// answer on this host takes a few microseconds; one later than this is left to the progress
/// thread.
const LINGER_MAX: Duration = Duration::from_micros(50);

/// The progress thread's time slice: the shortest the scheduler takes (0.1 ms), so that it
/// may preempt a spinning application thread when a packet wakes it
/// (`sys::progress_scheduling`).
const PROGRESS_SLICE: Duration = Duration::from_micros(100);

/// The progress thread's nice value where the process may raise it
/// (`NicConfig::progress_priority`).
const PROGRESS_NICE: i32 = -10;

/// Packets handled between two looks at what the engine has to send while a receive batch is
/// handled: half the send window of the tools' requesters (128 packets), so that ACKs leave at
/// least twice per window even when GRO hands over a window's worth at once.
const ACK_EVERY: usize = 64;

/// Nor does handling a batch keep ACKs back for longer than this: on a slow host (a guest
/// under emulation) 64 packets take milliseconds.
const ACK_WITHIN: Duration = Duration::from_micros(100);

/// Buffers the progress thread's first `recvmmsg` takes after it woke; whole batches follow.
/// Where handling is slow enough for [`ACK_WITHIN`] to send between buffers, a burst that woke
/// the thread is then answered after a few buffers, not after a whole batch has been copied
/// in: in a guest under emulation, a fresh NIC's first `recvmmsg` of 32 buffers took 1.3 ms,
/// all of it ahead of the first ACK. Natively it costs one more system call per wake-up.
const WOKEN_BATCH: usize = 4;

/// How long a look that emptied the socket spares the next poll its own (`Locked::drained_dry`):
/// a few looks' time (about 1 µs each on this host). A program that polls until a poll comes
/// back empty makes that poll within a few microseconds; one that polls now and then, with
/// other work between, has each poll look.
const DRY_FOR: Duration = Duration::from_micros(10);

/// How long ACKs wait for the polling application's next packet, to leave with it in one
/// system call: a fraction of the shortest ACK timeout in use (4.096 µs × 2^timeout; the
/// tools' default of 14 is 67 ms, and 1 ms is already a short one). Scaled with the round
/// trip ([`REFERENCE_ROUND_TRIP`]): in a guest under emulation an application's turn from a
/// WRITE landing to its reply outlasts 20 µs, and `perf write-lat` sent the ACK alone in 1,250
/// to 1,620 of 2,000 turns, each a send through the emulated kernel and a datagram more for
/// the peer to take (BENCHMARKS.md, the data path's twenty-sixth step). Scaled, it stays
/// under a quarter of the earliest early resend ([`ACK_HOLD_MAX`]): an ACK held while the
/// application does not answer must reach the peer before its early resend would.
const ACK_HOLD: Duration = Duration::from_micros(20);

/// The longest an ACK is held however slow the round trip: a quarter of
/// [`ferroce_proto::engine::MIN_EARLY_RESEND`].
const ACK_HOLD_MAX: Duration =
    Duration::from_nanos(ferroce_proto::engine::MIN_EARLY_RESEND.as_nanos() as u64 / 4);

/// A post to a queue pair that already holds this many unfinished send requests, or that
/// follows this many posts in a row with no other call into the NIC between them (UC and UD
/// requests finish as they leave, so their queues stay short), is held in the engine
/// (`Locked::posts_held`), to leave with the posts after it in one system call: a program
/// that posts one request a call (perftest's bandwidth tests, UCX; each post a doorbell) paid
/// a send per request. A latency test (one request in flight, a poll between posts) sends
/// each post at once.
const POSTS_BEHIND: usize = 8;

/// The most posts held before the next one sends them all (a GSO send takes 64 segments).
const POSTS_HELD_MAX: u32 = 32;

/// How long held posts wait for the application's next call into the NIC, which sends them;
/// the progress thread sends them at this time otherwise, as it sends held ACKs. Beside an
/// application that was polling a moment before, the thread naps on, and they wait for the
/// nap's end instead (at most [`POLLER_WATCH_MAX`]), as held ACKs and timers do: what a
/// program pays that polls, posts a run of requests, then waits without a word to the NIC.
const POST_HOLD: Duration = Duration::from_micros(20);

use ferroce_proto::qp::CqId;
use ferroce_proto::Engine;
use rustc_hash::FxHashMap;

use super::memory::{HostMemory, Lender};
use super::rehearsal;
use crate::sys::{self, EventFd};
use crate::udp::{self, tap};

/// How a CQ announces its channel's events.
pub(crate) enum Announce {
    /// Its own descriptor turns readable (`Cq::take_events` reads it).
    Channel(Arc<EventFd>),
    /// A call (`Cq::announce_events`), made on the thread that handled the completion: with
    /// the lock held, or, on the progress thread, once its turn has let go of it, so that
    /// the program it wakes does not find the lock taken.
    Call(Arc<dyn Fn() + Send + Sync>),
}

/// The engine and its memory, behind the NIC's lock, with the datagram link (batches and
/// taps) it sends and receives through.
pub(crate) struct Locked {
    pub(crate) engine: Engine,
    pub(crate) mem: HostMemory,
    /// How each CQ announces that it fired, when the engine says an armed CQ did.
    pub(crate) cq_channels: FxHashMap<CqId, Announce>,
    /// How many events the engine held when last looked at: more now means a new one.
    pub(crate) events_seen: usize,
    /// The threads blocked in `Cq::wait`: the CQ each waits on and its condition variable,
    /// once per thread. Only a CQ that holds a completion has its waiters woken, so a thread
    /// waiting on one CQ (the CM's, on QP 1's) sleeps through the traffic of the others.
    pub(crate) waiting: Vec<(CqId, Arc<Condvar>)>,
    /// While the progress thread handles what it received: the CQs' announcing calls, made
    /// once it has let go of the lock (`Driver::progress`).
    deferred_calls: Option<Vec<Arc<dyn Fn() + Send + Sync>>>,
    link: udp::Link,
    /// While ACKs wait in the link for the application's next packet: when they go anyway.
    acks_due: Option<Instant>,
    /// Posts left in the engine unsent ([`POSTS_BEHIND`]), and when they go anyway: the next
    /// call that runs the engine sends them.
    posts_held: u32,
    posts_due: Option<Instant>,
    /// Send posts since the application's last other call into the NIC ([`POSTS_BEHIND`]).
    posts_in_a_row: u32,
    /// WRITE messages received (`Counters::rdma_writes_rcvd`) when the application last sent.
    writes_at_send: u64,
    /// When a drain last saw a WRITE land.
    landed_at: Option<Instant>,
    /// When the last look at the socket took datagrams and found none behind them, or took
    /// the one buffer a look after an empty one asks for (`found_empty`): a poll that drives
    /// the engine within [`DRY_FOR`] of it does not look again (`Driver::progress_here`).
    drained_dry: Option<Instant>,
    /// Whether the last look at the socket found it empty: a poll's next look asks for one
    /// buffer, not a batch (`Driver::progress_here`).
    found_empty: bool,
    /// When a poll last returned the completion of the application's own request, and the
    /// WRITE messages received then; `None` after a receive's, or where the poll stayed for
    /// the peer's WRITE and it did not come (a late peer: the send that follows is no sign
    /// either way).
    own_completion: Option<(Instant, u64)>,
    /// How many of the application's sends lately answered a WRITE ([`ANSWERS_WITHIN`]), out
    /// of [`ALL_ANSWERS`]: a moving average, ¼ weight to the newest, so that a send that came
    /// late (the application was descheduled) does not undo what the others taught.
    answering: u32,
    /// How the progress thread sleeps next, set under this lock with the timers it saw, so
    /// that a post that arms an earlier one knows whether to ring (`Driver::after_command`).
    thread_sleep: ThreadSleep,
}

/// The progress thread's two sleeps.
#[derive(Clone, Copy, Debug)]
enum ThreadSleep {
    /// On the socket and the doorbell, until a datagram, a ring, or the engine's next timer
    /// (`None`: none is armed).
    Socket(Option<Instant>),
    /// On the doorbell and `Driver::nap_timer` beside a polling application, until `until`
    /// (or a longer nap after it, begun without the lock while the application was inside
    /// the NIC): to look whether it still polls, or to send the ACKs it holds
    /// (`Locked::acks_due`). Its polls run the engine's timers (`Driver::progress_here`), so
    /// the nap does not end for them. With `pushed_on`, a nap at [`POLLER_WATCH_MAX`] that
    /// each poll may push on.
    Nap { until: Instant, pushed_on: bool },
}

impl Locked {
    /// When something is next due: an engine timer or a delayed packet.
    fn next_due(&self) -> Option<Instant> {
        [
            self.engine.poll_timeout(),
            self.link.next_due(),
            self.acks_due,
            self.posts_due,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn writes_rcvd(&self) -> u64 {
        self.engine.counters().rdma_writes_rcvd
    }

    /// Whether the application, by what it did lately, answers each WRITE it is sent, and
    /// none has landed since its last send: what a poll that finds a completion should
    /// stay for.
    fn awaits_write(&self) -> bool {
        self.answering > ALL_ANSWERS / 2 && self.writes_rcvd() == self.writes_at_send
    }
}

/// The engine behind its lock, the socket, the doorbell and the progress thread of one soft
/// NIC; every soft object holds an `Arc` of it.
pub(crate) struct Driver {
    state: Mutex<Locked>,
    /// The time base of `poller_until`.
    epoch: Instant,
    /// The end of the progress thread's nap beside a poller (`ThreadSleep::Nap`), set under
    /// the lock by the thread and by the polls that push it on, and by the thread without the
    /// lock for the nap after a look that found the lock taken (`busy_looks`).
    nap_timer: sys::MovingTimer,
    /// Until when (nanoseconds after `epoch`) an application is taken to be polling.
    poller_until: AtomicU64,
    /// When (nanoseconds after `epoch`) a poll last returned a completion; 0 once the next
    /// poll has been seen.
    satisfied_at: AtomicU64,
    /// How many of the application's returns after such a poll lately came after a leave
    /// ([`LEAVES_AFTER`]), out of [`ALL_LEAVES`]: a moving average, ¼ weight to the newest,
    /// so that one return delayed by a preemption does not make a busy poller look like one
    /// that leaves (a mean of the gaps did, and each flip rang the doorbell twice).
    leaving: AtomicU32,
    /// The timing's scale: the engine's usual round trip over [`REFERENCE_ROUND_TRIP`], 1 to
    /// [`MAX_TIME_SCALE`], followed at each completion an application polls
    /// ([`Driver::scaled`]).
    time_scale: AtomicU32,
    /// The sockets: everything is received on `port.socket()`.
    pub(crate) port: udp::Port,
    pub(crate) local: SocketAddr,
    /// The doorbell: a byte written to `bell` makes `bell_rx` readable, which wakes the
    /// progress thread. Both ends are non-blocking; a full doorbell has already rung.
    bell: UnixDatagram,
    bell_rx: UnixDatagram,
    /// Whether a byte waits in the doorbell unanswered: ringing again would only cost a
    /// system call that fails with EAGAIN once the doorbell is full.
    rung: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Why the receive path died, if it did.
    pub(crate) failure: Mutex<Option<io::Error>>,
    /// The NIC's async-event descriptor: readable while the engine holds events.
    pub(crate) async_events: EventFd,
    /// Packets the progress thread received and handled (`progress_thread_rcvd`); the rest
    /// were received by application threads that polled a CQ ([`Driver::progress_here`]).
    pub(crate) progress_rcvd: AtomicU64,
    /// Polls that did not look at the socket because the look before them had emptied it
    /// (`dry_polls`, [`Driver::progress_here`]).
    pub(crate) dry_polls: AtomicU64,
    /// The progress thread's looks at a polling application that found it inside the NIC
    /// (the lock taken) and began the next nap without waiting for the lock (`busy_looks`).
    pub(crate) busy_looks: AtomicU64,
    /// When (nanoseconds after `epoch`) ACKs were last held for the application's next
    /// packet: within [`POLLER_WATCH_MAX`] of it, the progress thread's nap lasts at most
    /// [`HELD_ACK_WATCH`] at the reference round trip ([`Driver::watch_max`]). Read by the
    /// progress thread without the lock, at its looks.
    held_acks_at: AtomicU64,
}

impl Driver {
    pub(crate) fn new(
        port: udp::Port,
        engine: Engine,
        faults: Option<tap::Faults>,
        pcap: Option<tap::PcapWriter>,
    ) -> io::Result<Arc<Self>> {
        let (bell, bell_rx) = UnixDatagram::pair()?;
        bell.set_nonblocking(true)?;
        bell_rx.set_nonblocking(true)?;
        Ok(Arc::new(Self {
            state: Mutex::new(Locked {
                engine,
                mem: HostMemory::default(),
                cq_channels: FxHashMap::default(),
                events_seen: 0,
                waiting: Vec::new(),
                deferred_calls: None,
                link: udp::Link::new(faults, pcap),
                acks_due: None,
                posts_held: 0,
                posts_due: None,
                posts_in_a_row: 0,
                writes_at_send: 0,
                landed_at: None,
                drained_dry: None,
                found_empty: false,
                own_completion: None,
                answering: 0,
                thread_sleep: ThreadSleep::Socket(None),
            }),
            epoch: Instant::now(),
            nap_timer: sys::MovingTimer::new()?,
            poller_until: AtomicU64::new(0),
            satisfied_at: AtomicU64::new(0),
            leaving: AtomicU32::new(0),
            time_scale: AtomicU32::new(1),
            local: port.local(),
            port,
            bell,
            bell_rx,
            rung: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            failure: Mutex::new(None),
            async_events: EventFd::new()?,
            progress_rcvd: AtomicU64::new(0),
            dry_polls: AtomicU64::new(0),
            busy_looks: AtomicU64::new(0),
            held_acks_at: AtomicU64::new(0),
        }))
    }

    /// Wakes the threads blocked on a CQ that now holds a completion. Called under the lock
    /// after anything that may have completed work, so that a waiter, which registers under
    /// the lock before it sleeps, cannot miss it.
    pub(crate) fn wake_waiters(&self, state: &Locked) {
        for (id, wake) in &state.waiting {
            if state.engine.cq_pending(*id) > 0 {
                wake.notify_all();
            }
        }
    }

    /// Wakes every thread blocked on a CQ, to see that the NIC or its client stops.
    pub(crate) fn wake_all(&self, state: &Locked) {
        for (_, wake) in &state.waiting {
            wake.notify_all();
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Locked> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The application enters the NIC for a command (a post): [`Driver::returned`], then the
    /// NIC's lock with the time to run the engine at, and whether this is its first call since
    /// a poll returned a completion. The time is the clock `returned` read, when it read one
    /// and the lock was free at once; otherwise a read made once the lock is held (a caller
    /// that waited for the lock finds the engine run meanwhile, at a later time than its
    /// read). A free lock can still leave that read a moment behind the engine's last time,
    /// where another thread held the lock at the read and left it before the look, as the
    /// progress thread's own turns, which read the clock before taking the lock, can be; the
    /// engine's time arithmetic saturates, so a time a moment behind moves a timer by that
    /// moment. A clock read is about 30 ns here (BENCHMARKS.md, the eighteenth step), the one
    /// a post after each completion saves.
    pub(crate) fn enter(&self) -> (MutexGuard<'_, Locked>, Instant, bool) {
        let Some(seen) = self.returned() else {
            let state = self.lock();
            return (state, Instant::now(), false);
        };
        let state = match self.state.try_lock() {
            Ok(state) => return (state, seen, true),
            Err(TryLockError::Poisoned(p)) => return (p.into_inner(), seen, true),
            Err(TryLockError::WouldBlock) => self.lock(),
        };
        (state, Instant::now(), true)
    }

    /// Sends everything the engine has ready (and held packets now due), a batch at a time,
    /// through the taps. With `hold_acks`, a batch of nothing but bare positive ACKs
    /// (`Transmit::ack`) stays in the link
    /// for up to [`ACK_HOLD`], so that it leaves in one system call with the packet the
    /// polling application posts next (its reply, in a latency test or a session). The data
    /// those ACKs acknowledge is already in memory and its completion already queued: the
    /// application sees it first, and its reply is not behind an ACK's system call.
    fn transmit_ready(&self, state: &mut Locked, now: Instant, hold_acks: bool) {
        let Locked {
            engine,
            mem,
            link,
            acks_due,
            posts_held,
            posts_due,
            thread_sleep,
            ..
        } = state;
        // Held posts are among what the engine has ready: they leave now.
        (*posts_held, *posts_due) = (0, None);
        // Payloads (requests', READ responses') go from their regions to the kernel, not
        // through the batch.
        let lender = Lender::new(mem);
        while let Some(t) = engine.poll_transmit(now, &lender, link.tx.slot()) {
            steps::mark(Step::Built);
            match t.lent {
                None => link.tx.push_written(t.dst, t.len, t.ack),
                Some(l) => {
                    let body = l.offset as usize..l.offset as usize + l.len;
                    link.tx.push_written_around(t.dst, t.len, l.at, body);
                }
            }
            if link.tx.is_full() {
                lender.send(|ext| link.transmit(&self.port, now, ext));
            }
        }
        if hold_acks
            && link.tx.only_deferrable()
            && acks_due.is_none_or(|due| now < due)
            && link.next_due().is_none_or(|due| now < due)
        {
            if acks_due.is_none() {
                let due = now + self.ack_hold();
                *acks_due = Some(due);
                self.ack_held(thread_sleep, now, due);
            }
        } else {
            *acks_due = None;
            if link.tx.len() > 0 || link.next_due().is_some_and(|due| due <= now) {
                lender.send(|ext| link.transmit(&self.port, now, ext));
            }
        }
        // Nothing is lent while ACKs wait: a held batch is bare ACKs.
        drop(lender);
        // A request that armed its QP's timers (a ping-pong's every one) runs them from when
        // it left, not from `now`: a thread descheduled between the two would otherwise find
        // its early resend due before the peer could answer. One clock read per such pass.
        if engine.armed_on_send() {
            engine.transmitted(Instant::now());
        }
        // Completions the command or the packets made are signalled whether or not ACKs wait.
        self.signal(state);
    }

    /// Sends the posts held for the application's next call ([`POSTS_BEHIND`]): a thread
    /// about to sleep until a completion (`Cq::wait`, or arming a CQ to wait on its channel)
    /// makes that call now, and ends a run of posts.
    pub(crate) fn send_held(&self, state: &mut Locked) {
        state.posts_in_a_row = 0;
        if state.posts_held > 0 {
            self.transmit_ready(state, Instant::now(), true);
        }
    }

    /// Signals the channel of every armed CQ that fired since the last look, and the async
    /// descriptor when the engine raised an event.
    fn signal(&self, state: &mut Locked) {
        while let Some(id) = state.engine.poll_cq_event() {
            match state.cq_channels.get(&id) {
                Some(Announce::Channel(channel)) => channel.signal(),
                Some(Announce::Call(call)) => match &mut state.deferred_calls {
                    Some(later) => later.push(Arc::clone(call)),
                    None => call(),
                },
                None => {}
            }
        }
        let pending = state.engine.pending_events();
        if pending > state.events_seen {
            self.async_events.signal();
        }
        state.events_seen = pending;
    }

    /// After the application changed the engine: send what it produced, wake waiters, and
    /// ring the doorbell if a timer now fires before the progress thread would wake and no
    /// polling application runs it first.
    ///
    /// ACKs a poll held stay held through a command that sends nothing (perftest's send-lat
    /// posts the next receive between taking a message and answering it), so that they still
    /// leave with the answer; the doorbell below covers their due time as any timer's.
    pub(crate) fn after_command(&self, state: MutexGuard<'_, Locked>) {
        self.after_command_at(state, Instant::now());
    }

    /// [`Driver::after_command`] for a command that ends a queue pair: what it owes its peer
    /// leaves now, ACKs held for the application's next packet too. A program that destroys
    /// the queue pair the moment its last receive completes (`ibv_rc_pingpong`) sends nothing
    /// more on it, and may exit next.
    pub(crate) fn after_close(&self, mut state: MutexGuard<'_, Locked>) {
        let now = Instant::now();
        self.transmit_ready(&mut state, now, false);
        self.after_command_at(state, now);
    }

    /// [`Driver::after_command`] at `now`, read under the lock or given by
    /// [`Driver::enter`].
    pub(crate) fn after_command_at(&self, mut state: MutexGuard<'_, Locked>, now: Instant) {
        state.posts_in_a_row = 0;
        self.finish_command(state, now, true);
    }

    /// [`Driver::after_command_at`], sending what the engine has ready only with
    /// `transmit`: a held post ([`POSTS_BEHIND`]) leaves it there, its due time among the
    /// timers the doorbell below looks at.
    fn finish_command(&self, mut state: MutexGuard<'_, Locked>, now: Instant, transmit: bool) {
        self.learn_leave_gap(self.nanos(now));
        if transmit {
            self.transmit_ready(&mut state, now, true);
        }
        // The thread published its sleep under this lock with the timers it saw then: either
        // it saw this change, or what it published is what it sleeps on (a nap beside a
        // polling application may since have been followed by a longer one, taken without
        // the lock; `progress`).
        let ring = state
            .next_due()
            .is_some_and(|next| match state.thread_sleep {
                ThreadSleep::Socket(until) => until.is_none_or(|until| next < until),
                // A poller that stops without a word has the timer wait for the nap's end, at
                // most `POLLER_WATCH_MAX`.
                ThreadSleep::Nap { until, .. } => {
                    next < until && self.poller_until.load(Ordering::Relaxed) <= self.nanos(now)
                }
            });
        self.wake_waiters(&state);
        drop(state);
        if ring {
            self.ring();
        }
    }

    /// The application posted sends: whether they answer a WRITE that landed since its last
    /// ([`ANSWERS_WITHIN`]), into `Locked::answering`; then [`Driver::after_command`], both
    /// at `now`. `now` and `first` are what [`Driver::enter`] gave: the time to run the engine
    /// at, and whether the post is the application's first call since a poll returned a
    /// completion.
    ///
    /// Timing alone let a run lock itself out of the poll's stay: once the progress thread
    /// placed the WRITEs, every answer came too late to count, so the polls no longer stayed,
    /// so the thread kept placing them (one run in six of `tests/memory_watchers.rs` on two
    /// cores, every run beside two CPU hogs). A WRITE that landed later than a stay lasts
    /// after the completion teaches nothing: the stay would have run out first (in a guest
    /// under emulation, where the peer's answer takes hundreds of microseconds).
    ///
    /// `behind`: the send requests the queue pair held before this post. Behind
    /// [`POSTS_BEHIND`] of them, or as many posts in a row, the post is held, up to
    /// [`POSTS_HELD_MAX`] posts or [`POST_HOLD`], or until the application's next call that
    /// runs the engine or goes to sleep (a poll that finds nothing, a posted receive or other
    /// command, arming a CQ, `Cq::wait`).
    pub(crate) fn sent(
        &self,
        mut state: MutexGuard<'_, Locked>,
        first: bool,
        now: Instant,
        behind: usize,
    ) {
        let writes = state.writes_rcvd();
        let (linger_max, answers_within) = (self.scaled(LINGER_MAX), self.scaled(ANSWERS_WITHIN));
        let stay_would_place = |(at, writes_then): (Instant, u64)| {
            writes > writes_then
                && state
                    .landed_at
                    .is_some_and(|landed| landed.saturating_duration_since(at) < linger_max)
        };
        let answer = writes != state.writes_at_send
            && (state
                .landed_at
                .is_some_and(|at| now.saturating_duration_since(at) < answers_within)
                || first && state.own_completion.is_some_and(stay_would_place));
        state.writes_at_send = writes;
        state.answering = (3 * state.answering + if answer { ALL_ANSWERS } else { 0 }) / 4;
        let in_a_row = state.posts_in_a_row as usize;
        state.posts_in_a_row = state.posts_in_a_row.saturating_add(1);
        let hold = (behind >= POSTS_BEHIND || in_a_row >= POSTS_BEHIND)
            && state.posts_held < POSTS_HELD_MAX;
        if hold {
            state.posts_held += 1;
            state.posts_due.get_or_insert(now + POST_HOLD);
        }
        self.finish_command(state, now, !hold);
    }

    /// Rings the doorbell: the progress thread wakes and looks at its timers and `stop`.
    pub(crate) fn ring(&self) {
        // The progress thread empties the doorbell, then clears `rung`, then looks at the
        // engine's timers: a change made before this call is seen either way, and `rung` is
        // only ever set while a byte waits or is about to.
        if self.rung.swap(true, Ordering::SeqCst) {
            return;
        }
        match self.bell.send(&[1]) {
            // A full doorbell is one that has rung and not yet been answered.
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => {
                udp::UdpCounters::add(&self.port.counters.send_errors, 1);
            }
            _ => {}
        }
    }

    /// Wakes a thread blocked on the NIC's socket itself (a frame receiver's monitor in
    /// [`crate::Cq::drive`]) with a zero-length datagram to the NIC's own address. Best
    /// effort: such a thread also wakes on its own within 50 ms, so a datagram lost on the
    /// way (a firewall rule) only delays it.
    pub(crate) fn poke_socket(&self) {
        if self.port.socket().send_to(&[], self.local).is_err() {
            udp::UdpCounters::add(&self.port.counters.send_errors, 1);
        }
    }

    /// Takes every byte waiting on the doorbell, so that `poll` blocks again.
    fn answer_bell(&self) {
        let mut sink = [0u8; 64];
        while matches!(self.bell_rx.recv(&mut sink), Ok(n) if n > 0) {}
        // Only now: cleared before the bytes were taken, a ring in between would write a byte
        // this loop then swallows, and leave `rung` set with the doorbell empty, so that no
        // ring would ever be written again (a NIC that never closed found it).
        self.rung.store(false, Ordering::SeqCst);
    }

    /// Starts the progress thread, above the application's threads with `raise`
    /// (`NicConfig::progress_priority`).
    pub(crate) fn start(self: &Arc<Self>, raise: bool) -> io::Result<()> {
        let shared = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name(format!("ferroce {}", self.local))
            .spawn(move || {
                sys::precise_timers();
                let own = sys::progress_scheduling(PROGRESS_SLICE, None);
                // Before the first packet, so that it does not run the code for the first
                // time (`rehearsal`): the engine's paths in memory, the send and receive
                // paths (a lone packet and a coalesced train) through a scratch socket, and
                // this socket's wake-up with a datagram to itself; and so that its burst does
                // not land in receive pages never touched.
                rehearsal::rehearse(shared.local.ip());
                shared.port.rehearse();
                shared.lock().link.prefault();
                shared.poke_socket();
                shared.progress(raise.then_some(own))
            })?;
        *self.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
        Ok(())
    }

    /// Stops and joins the progress thread, then sends what is held back (ACKs waiting for
    /// the application's next packet, held posts) and what the fault injector still delays,
    /// each when due (it was asked to delay those packets, not to lose them; with the thread
    /// gone nothing adds to them, so this ends after the longest delay), and flushes the
    /// capture. Idempotent.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ring();
        let handle = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(handle) = handle {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
        loop {
            let mut state = self.lock();
            let now = Instant::now();
            self.transmit_ready(&mut state, now, false);
            let Some(due) = state.link.next_due() else {
                if state.link.flush_capture().is_err() {
                    udp::UdpCounters::add(&self.port.counters.pcap_errors, 1);
                }
                break;
            };
            drop(state);
            std::thread::sleep(due.saturating_duration_since(now));
        }
        self.wake_all(&self.lock());
    }

    /// Handles up to two batches' worth of datagrams that have already arrived, without
    /// blocking.
    /// The caller holds the lock, so datagrams are handled in the order they arrived, except
    /// that one ahead of sequence waits for the rest of the batches (GRO may reorder two
    /// flows; `Engine::set_batch_holding`). With
    /// GRO one batch can hold thousands of packets: every [`ACK_EVERY`] packets handled, or
    /// [`ACK_WITHIN`], what the engine has to send (ACKs, READ responses) goes out, so that a
    /// peer's window keeps moving while the rest is handled; `hold_acks` as for
    /// [`Driver::transmit_ready`]. The first `recvmmsg` takes up to `first` buffers, the
    /// others a whole batch. Where it took datagrams, `Locked::drained_dry` says whether its
    /// last look came back short of a batch (the socket was empty then), or, asked for one
    /// buffer (`first` 1), took it: a ping-pong's message, presumed alone.
    fn drain(&self, state: &mut Locked, now: Instant, hold_acks: bool, first: usize) -> usize {
        let dst = self.local.ip();
        let writes = state.writes_rcvd();
        let (mut handled, mut since_sent, mut sent_at) = (0, 0, now);
        let (mut want, mut taken) = (first, 0);
        // Until the first buffer is handled, the time since `now` is that of nothing: the
        // clock is looked at from the second on.
        let mut past_first = false;
        let mut dry = false;
        while taken < 2 * sys::RECV_BATCH {
            let n = state.link.receive_batch(&self.port, want);
            if n > 0 {
                steps::mark(Step::Received);
            }
            taken += n;
            for i in 0..n {
                let Locked {
                    engine, mem, link, ..
                } = &mut *state;
                let got = link.handle_buffer(&self.port, i, &mut |from, bytes, index| {
                    engine.handle_segment(now, from, dst, bytes, index, mem);
                    steps::mark(Step::Handled);
                });
                handled += got;
                since_sent += got;
                let due = since_sent >= ACK_EVERY
                    || since_sent > 0 && past_first && sent_at.elapsed() >= ACK_WITHIN;
                past_first = true;
                if due {
                    self.transmit_ready(state, now, hold_acks);
                    since_sent = 0;
                    sent_at = Instant::now();
                }
            }
            if n < want {
                dry = taken > 0;
                break;
            }
            if want == 1 {
                // A look after one that found the socket empty (`Locked::found_empty`) took the
                // one datagram it asked for: what a ping-pong receives. The next poll is spared
                // its look as if the kernel had said the socket was empty; the look after that
                // takes a whole batch, so that a queue that grew meanwhile is taken in batches.
                dry = true;
                break;
            }
            want = sys::RECV_BATCH;
        }
        // What arrived ahead of sequence was held for the rest of the batch, in case GRO
        // handed it over before what it follows (`Engine::set_batch_holding`).
        let Locked { engine, mem, .. } = &mut *state;
        engine.end_batch(now, mem);
        if taken > 0 {
            steps::mark(Step::Drained);
        }
        // What a capture recorded of these goes to its file now, as what is sent does
        // (`Link::transmit`).
        if taken > 0 && state.link.flush_capture().is_err() {
            udp::UdpCounters::add(&self.port.counters.pcap_errors, 1);
        }
        state.found_empty = taken == 0;
        // A look that took nothing leaves the mark as it was: it found the socket empty too.
        if taken > 0 {
            state.drained_dry = dry.then_some(now);
        }
        if state.writes_rcvd() != writes {
            // One buffer (a ping-pong's message) landed within its look of `now`: no clock
            // read for it on the way to the application.
            state.landed_at = Some(if taken == 1 { now } else { Instant::now() });
        }
        handled
    }

    /// Drives the engine on the caller's thread: takes what has arrived, runs due timers and
    /// sends what is ready. Polling a CQ calls this, so an application that polls needs no
    /// other thread to make progress (the lowest latency on few cores).
    ///
    /// `seen`: the clock as this poll read it before it took the lock ([`Driver::returned`]),
    /// if it did; a poll the dry mark spares needs no other read.
    ///
    /// `claims`: the caller will poll again soon (a program polling its CQ), so the progress
    /// thread keeps off the socket meanwhile; a last look before the program waits elsewhere
    /// (a poll of an armed CQ) leaves the socket to the thread.
    ///
    /// Returns the time it ran at, its one clock read.
    pub(crate) fn progress_here(
        &self,
        state: &mut Locked,
        seen: Option<Instant>,
        claims: bool,
    ) -> Instant {
        steps::mark(Step::Look);
        state.posts_in_a_row = 0;
        // A poll right after a look that took datagrams and found the socket empty behind them
        // (within `DRY_FOR`) neither looks again nor runs the engine: the kernel said the
        // socket was empty a moment ago, a look is a system call (most of an empty poll's
        // cost, about 1 µs on this host), and the engine's timers and sends ran after that
        // look (a command since has sent what it made, or held posts, which are sent here).
        // Programs poll until a poll comes back empty (perf's reap, `while
        // (ibv_poll_cq(..) > 0)`), and that last poll, between taking a message and answering
        // it, paid a look for nothing each time; the poll after it does it all. That poll is
        // often the first call after a completion, which read the clock already.
        let (now, spared) = match state.drained_dry.take() {
            Some(at) => {
                let t = seen.unwrap_or_else(Instant::now);
                let spared = t.saturating_duration_since(at) < DRY_FOR;
                // The engine runs on a read made under the lock: `seen` may have waited for it.
                let now = if spared || seen.is_none() {
                    t
                } else {
                    Instant::now()
                };
                (now, spared)
            }
            None => (Instant::now(), false),
        };
        // While the application polls, the progress thread keeps off the socket (see
        // `progress`): one thread woken per packet instead of two.
        if claims {
            let since = now.saturating_duration_since(self.epoch);
            self.poller_until.store(
                (since + self.scaled(POLLER_GRACE)).as_nanos() as u64,
                Ordering::Relaxed,
            );
            if let ThreadSleep::Nap {
                until,
                pushed_on: true,
            } = state.thread_sleep
            {
                // Once in 1.75 ms of polling (in 440 µs while ACKs are held, `HELD_ACK_WATCH`):
                // two system calls and one reprogramming of the CPU's timer
                // (`sys::MovingTimer`), where a look would be a context switch on the core this
                // thread spins on. In a VM the reprogramming is an exit: a push cost about 2 µs
                // on the thirty-fifth step's host, and on the thirty-seventh's 12-17 µs with
                // one timerfd and about 7 µs with the pair, which is what sets write-lat's
                // 99th percentile there. Pushed at half the nap left, a ping-pong paid it every
                // 16 round trips, at an eighth every 30 to 36 (44 to 46 on the faster host)
                // (BENCHMARKS.md, the data path's thirty-fifth and thirty-seventh steps). The
                // eighth left, 62 µs at the shorter watch, is still many polls.
                let watch_max = self.watch_max(now);
                if until.saturating_duration_since(now) < watch_max / 8 {
                    state.thread_sleep = ThreadSleep::Nap {
                        until: now + watch_max,
                        pushed_on: true,
                    };
                    self.nap_timer.set_after(watch_max);
                }
            }
        }
        if spared {
            self.dry_polls.fetch_add(1, Ordering::Relaxed);
            if state.posts_held > 0 {
                // Posts held since that look have not left: they do now, without a look.
                self.transmit_ready(state, now, true);
            }
            return now;
        }
        // After a look that found nothing, the next asks for one buffer: `recvmmsg` that takes
        // a datagram goes on to try the next header, and that try, when the datagram came
        // alone, is a second trip into the socket before the first is handled (0.1-0.3 µs of
        // each write-lat turn here: BENCHMARKS.md, the data path's thirteenth step).
        let first = if state.found_empty {
            1
        } else {
            sys::RECV_BATCH
        };
        self.drain(state, now, true, first);
        state
            .engine
            .handle_timeout_with(now, |peer| self.unread(peer));
        self.transmit_ready(state, now, true);
        // What this thread received may complete another thread's wait (the CM's, say).
        self.wake_waiters(state);
        now
    }

    /// Whether an early resend to `peer` would only queue behind datagrams not yet read
    /// ([`Engine::handle_timeout_with`]): this NIC's own socket holds some (the answer may be
    /// among them: the thread that runs the timers has not taken them yet), or `peer` is a
    /// socket on this host that holds some (its process is descheduled with the request in
    /// its queue). Asked only when an early resend is due: one `poll(2)`, and for the peer one
    /// socket-diagnostics lookup (`udp::table`). A peer on another host reads as `false`, and
    /// is resent to as before.
    fn unread(&self, peer: SocketAddr) -> bool {
        sys::wait_readable(self.port.socket(), Some(Duration::ZERO)).unwrap_or(false)
            || udp::table::unread_here(peer) == Some(true)
    }

    /// `t` in the time base of `poller_until` and `satisfied_at`: nanoseconds
    /// after `epoch`.
    fn nanos(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// The application calls into the NIC (a poll or a post): if it comes back after a poll
    /// that returned a completion, how long it was away goes into the mean. Called before
    /// the lock is taken, so that waiting for the lock (while the progress thread holds it)
    /// is not counted as time spent elsewhere: counted, it kept a busy poller taken for one
    /// that leaves, and the progress thread, woken at each completion, kept it so.
    ///
    /// Returns, where this is the application's first call since such a poll, the clock it
    /// read to say so.
    pub(crate) fn returned(&self) -> Option<Instant> {
        if self.satisfied_at.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let now = Instant::now();
        self.learn_leave_gap(self.nanos(now));
        Some(now)
    }

    /// The application's first call into the NIC (a poll, a post, any verb) after a poll
    /// that returned a completion: whether it was away longer than [`LEAVES_AFTER`] in
    /// between, into `leaving`.
    fn learn_leave_gap(&self, at: u64) {
        let satisfied = self.satisfied_at.swap(0, Ordering::Relaxed);
        if satisfied != 0 {
            let left = at.saturating_sub(satisfied) > self.scaled(LEAVES_AFTER).as_nanos() as u64;
            let before = self.leaves_after_completions();
            let share = self.leaving.load(Ordering::Relaxed);
            let share = (3 * share + if left { ALL_LEAVES } else { 0 }) / 4;
            self.leaving.store(share, Ordering::Relaxed);
            if self.leaves_after_completions() != before {
                // The progress thread's priority follows (`progress`): wake it to see.
                self.ring();
            }
        }
    }

    /// Whether the application, by what it did lately, leaves after each completion.
    fn leaves_after_completions(&self) -> bool {
        self.leaving.load(Ordering::Relaxed) > ALL_LEAVES / 2
    }

    /// A poll returned a completion. An application that, by what it did before, goes to
    /// wait elsewhere after one (spinning on memory a peer writes, as `ib_write_lat` does)
    /// makes no call that would drive the engine until its data is there: the progress thread
    /// takes the socket back now rather than after [`POLLER_GRACE`].
    ///
    /// An application that answers its peer's WRITEs (`Locked::awaits_write`) is awaiting
    /// one when the completion of its own request (`own_request`: not a receive) came alone:
    /// the poll stays to receive it first
    /// ([`Driver::linger`]), so that the bytes are in place when the application looks, its
    /// ACK leaves with the answer, and the progress thread is not woken for either.
    pub(crate) fn poll_satisfied<'a>(
        &'a self,
        mut state: MutexGuard<'a, Locked>,
        own_request: bool,
    ) {
        state.posts_in_a_row = 0;
        let now = Instant::now();
        self.follow_round_trip(&state);
        state.own_completion = own_request.then(|| (now, state.writes_rcvd()));
        // The application is away from when the poll returns: time spent here lingering is
        // not its own.
        let (hand_back, at) = if own_request && state.awaits_write() {
            state = self.linger(state, now + self.scaled(LINGER_MAX));
            if state.awaits_write() {
                state.own_completion = None;
            }
            // Still awaited: the peer is late, and the progress thread will place its WRITE.
            (state.awaits_write(), Instant::now())
        } else {
            (self.leaves_after_completions(), now)
        };
        drop(state);
        let at = self.nanos(at);
        self.satisfied_at.store(at.max(1), Ordering::Relaxed);
        if hand_back && self.poller_until.swap(0, Ordering::Relaxed) > at {
            self.ring();
        }
    }

    /// The timing's scale, from the engine's usual round trip now ([`REFERENCE_ROUND_TRIP`]).
    fn follow_round_trip(&self, state: &Locked) {
        let scale = state.engine.round_trip().map_or(1, |rtt| {
            (rtt.as_nanos() / REFERENCE_ROUND_TRIP.as_nanos()).clamp(1, u128::from(MAX_TIME_SCALE))
                as u32
        });
        self.time_scale.store(scale, Ordering::Relaxed);
    }

    /// How long bare ACKs wait for the application's next packet: [`ACK_HOLD`] on this NIC's
    /// scale, at most [`ACK_HOLD_MAX`].
    fn ack_hold(&self) -> Duration {
        self.scaled(ACK_HOLD).min(ACK_HOLD_MAX)
    }

    /// The longest nap beside a polling application at `now`: [`POLLER_WATCH_MAX`] on this
    /// NIC's scale, or [`HELD_ACK_WATCH`] where that applies and the application held ACKs
    /// within the last `POLLER_WATCH_MAX` (a ping-pong holds them every turn).
    fn watch_max(&self, now: Instant) -> Duration {
        let max = self.scaled(POLLER_WATCH_MAX);
        let held = self.held_acks_at.load(Ordering::Relaxed);
        let since = Duration::from_nanos(self.nanos(now).saturating_sub(held));
        match self.held_ack_watch() {
            Some(watch) if held != 0 && since < max => watch,
            _ => max,
        }
    }

    /// [`HELD_ACK_WATCH`] at the reference round trip; `None` on a slower one.
    fn held_ack_watch(&self) -> Option<Duration> {
        (self.time_scale.load(Ordering::Relaxed) == 1).then_some(HELD_ACK_WATCH)
    }

    /// ACKs are held from now until `due`: at the reference round trip, a nap beside the
    /// polling application that would end later than [`HELD_ACK_WATCH`] after that is cut to
    /// end then, so that they still leave before the peer's early resend if the application
    /// stops without a word. Only the first hold after a stretch without holds finds such a
    /// nap: from then on the polls push it on by the shorter watch ([`Driver::watch_max`]).
    fn ack_held(&self, thread_sleep: &mut ThreadSleep, now: Instant, due: Instant) {
        self.held_acks_at
            .store(self.nanos(now).max(1), Ordering::Relaxed);
        let (Some(watch), ThreadSleep::Nap { until, .. }) = (self.held_ack_watch(), thread_sleep)
        else {
            return;
        };
        let end = due + watch;
        if *until > end {
            *until = end;
            self.nap_timer
                .set_after(end.saturating_duration_since(Instant::now()));
        }
    }

    /// `base`, one of the timing constants, on this NIC's scale ([`REFERENCE_ROUND_TRIP`]).
    fn scaled(&self, base: Duration) -> Duration {
        base * self.time_scale.load(Ordering::Relaxed)
    }

    /// Drives the engine on the caller's thread until the peer's next WRITE lands or
    /// `until`, letting go of the lock between turns.
    fn linger<'a>(
        &'a self,
        mut state: MutexGuard<'a, Locked>,
        until: Instant,
    ) -> MutexGuard<'a, Locked> {
        loop {
            let now = self.progress_here(&mut state, None, true);
            if !state.awaits_write() || now >= until {
                return state;
            }
            drop(state);
            std::hint::spin_loop();
            state = self.lock();
        }
    }

    /// The polling thread is about to wait on the socket itself until `until` at the latest
    /// (`Cq::drive`), and will handle what arrives: the progress thread keeps off the socket
    /// until then, as beside a poller, rather than wake with it for every datagram and take
    /// its share of them.
    pub(crate) fn hold_socket(&self, until: Instant) {
        self.poller_until
            .fetch_max(self.nanos(until), Ordering::Relaxed);
    }

    /// The application has stopped polling (it arms a CQ's channel): the progress thread
    /// goes back to the socket now rather than after [`POLLER_GRACE`], so that what arrives
    /// meanwhile is handled, and signalled, at once.
    pub(crate) fn release_poller(&self) {
        if self.poller_until.swap(0, Ordering::Relaxed) > self.nanos(Instant::now()) {
            self.ring();
        }
    }

    /// Waits for a datagram or the doorbell until `due` (a timer), the progress thread's
    /// wait: first looking without sleeping for as long as `stay` says ([`Stay`]), handing
    /// the core between looks to any thread that wants it, then asleep. A polling
    /// application ends the looks: it receives for itself. Nor does the thread look beside
    /// an application that waits elsewhere after its completions (`ib_write_lat` spins on its
    /// memory): on a shared core a wake-up preempts that spin at once, where a look that
    /// yielded would wait for the end of its time slice.
    fn wait_socket(&self, stay: &Stay, due: Option<Instant>) -> io::Result<[bool; 2]> {
        let looks = stay
            .end(Instant::now())
            .filter(|_| !self.leaves_after_completions());
        if let Some(end) = looks {
            let end = due.map_or(end, |due| end.min(due));
            while Instant::now() < end && self.poller_until.load(Ordering::Relaxed) == 0 {
                let seen =
                    sys::wait_either(self.port.socket(), &self.bell_rx, Some(Duration::ZERO))?;
                if seen != [false, false] {
                    return Ok(seen);
                }
                std::thread::yield_now();
            }
        }
        let wait = due.map(|t| t.saturating_duration_since(Instant::now()));
        sys::wait_either(self.port.socket(), &self.bell_rx, wait)
    }

    /// The progress thread's loop. With `raise` (the thread's own nice value), it runs above the application's threads
    /// while the application leaves after its completions to wait elsewhere (then only this
    /// thread places the peer's bytes, and behind spinning threads it would wait for a time
    /// slice); while the application polls for itself, or does not poll at all, it keeps the
    /// application's priority, so that it does not take the CPU from the application's own
    /// sends and polls.
    fn progress(&self, raise: Option<i32>) {
        let mut raised = false;
        // How long the next nap beside a polling application lasts at least: it doubles
        // while the application keeps polling ([`POLLER_WATCH_MAX`]).
        let mut watch = self.scaled(POLLER_GRACE);
        let mut stay = Stay::default();
        let mut calls = Vec::new();
        while !self.stop.load(Ordering::SeqCst) {
            if let Some(own) = raise {
                if self.leaves_after_completions() != raised {
                    raised = !raised;
                    let nice = if raised { PROGRESS_NICE } else { own };
                    sys::progress_scheduling(PROGRESS_SLICE, Some(nice));
                }
            }
            let now = Instant::now();
            let (sleep, look) = {
                let mut state = self.lock();
                state
                    .engine
                    .handle_timeout_with(now, |peer| self.unread(peer));
                self.transmit_ready(&mut state, now, false);
                self.wake_waiters(&state);
                // An application polling its CQ receives for itself, and runs the timers;
                // waking this thread too for every packet or timer only adds a context switch
                // on a core it spins on (an early resend's timer, re-armed a millisecond ahead
                // by every WRITE, woke it a thousand times a second). Nap on the doorbell and
                // the nap timer until the poller has been quiet for POLLER_GRACE.
                let now = Instant::now();
                let poller_left = Duration::from_nanos(self.poller_until.load(Ordering::Relaxed))
                    .saturating_sub(now.saturating_duration_since(self.epoch));
                let look = now + poller_left.max(watch);
                let sleep = if poller_left.is_zero() {
                    ThreadSleep::Socket(state.next_due())
                } else {
                    // ACKs held for the application's next packet are the peer's to wait
                    // for: they go when due even if the application stopped without a word.
                    let until = [state.acks_due, state.posts_due]
                        .into_iter()
                        .flatten()
                        .fold(look, Instant::min);
                    self.nap_timer
                        .set_after(until.saturating_duration_since(now));
                    ThreadSleep::Nap {
                        until,
                        pushed_on: until == look && watch >= self.watch_max(now),
                    }
                };
                state.thread_sleep = sleep;
                (sleep, look)
            };
            let due = match sleep {
                ThreadSleep::Nap { until, .. } => {
                    // On the doorbell and the timer, so that a poller that stops polling to
                    // wait (`release_poller`), a post beside a poller that left, or a close
                    // gets the thread back at once.
                    // An error reads as the timer's end: the next turn looks again.
                    let [first, second] = self.nap_timer.fds();
                    let fds = [self.bell_rx.as_raw_fd(), first, second];
                    loop {
                        if sys::poll_readable(fds, None).is_ok_and(|[bell, ..]| bell) {
                            self.answer_bell();
                            break;
                        }
                        if until != look {
                            break;
                        }
                        watch = (watch * 2).min(self.watch_max(Instant::now()));
                        // The look. An application inside the NIC right now (its lock is
                        // taken) still polls: the next, longer nap begins without waiting for
                        // the lock. Waiting woke this thread a second time on the core the
                        // application spins on, and then handed that core to whatever else
                        // was runnable there (BENCHMARKS.md, the data path's seventeenth step).
                        // The nap published under the lock keeps its earlier end meanwhile:
                        // a post after the application has left, arming a timer due within
                        // this nap, does not ring, and the timer waits for the nap's end, at
                        // most `POLLER_WATCH_MAX`, as one for an application that stopped
                        // without a word does anyway. An application that holds the lock at
                        // every look keeps this thread looking every `POLLER_WATCH_MAX`
                        // rather than publish a nap its polls push on.
                        if !matches!(self.state.try_lock(), Err(TryLockError::WouldBlock)) {
                            break;
                        }
                        self.busy_looks.fetch_add(1, Ordering::Relaxed);
                        self.nap_timer.set_after(watch);
                    }
                    continue;
                }
                ThreadSleep::Socket(until) => until,
            };
            watch = self.scaled(POLLER_GRACE);
            match self.wait_socket(&stay, due) {
                Ok([socket, bell]) => {
                    if bell {
                        self.answer_bell();
                    }
                    if !socket {
                        continue;
                    }
                    // Receive only under the lock: two threads taking datagrams and then
                    // racing for the lock would reorder them.
                    let now = Instant::now();
                    let mut state = self.lock();
                    state.deferred_calls = Some(std::mem::take(&mut calls));
                    let handled = self.drain(&mut state, now, false, WOKEN_BATCH);
                    self.progress_rcvd
                        .fetch_add(handled as u64, Ordering::Relaxed);
                    self.transmit_ready(&mut state, now, false);
                    self.wake_waiters(&state);
                    calls = state.deferred_calls.take().unwrap_or_default();
                    drop(state);
                    // The program an announcement wakes calls into the NIC at once: woken
                    // while this thread still held the lock, it waited for it.
                    for call in calls.drain(..) {
                        call();
                    }
                    if handled > 0 {
                        stay.answered(now, Instant::now(), handled);
                    }
                }
                Err(e) => {
                    udp::UdpCounters::add(&self.port.counters.recv_errors, 1);
                    *self.failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                    break;
                }
            }
        }
    }
}

/// How long the progress thread stays on the socket after answering a request or two (not a
/// stream: [`STAY_BELOW`]), looking without sleeping, before it blocks. A passive responder
/// (`ib_read_lat`'s server, whose program makes no call while the peer READs) otherwise
/// sleeps between requests and pays a wake-up for each, which on a virtual machine's idle
/// core costs more than the answer: a READ round trip on loopback here took 20–27 µs with
/// the wake-ups, 9–13 without (BENCHMARKS.md, the data path's twenty-first step).
///
/// It stays only while the peer asks steadily and often: when the gap between the last two
/// wake-ups was at most [`STAY_MAX`], for twice that gap, at most `STAY_MAX`. A peer asking
/// now and then (a heartbeat) costs no looks at all, nor does one on a host where answers
/// come slower than a wake-up costs.
#[derive(Clone, Copy, Debug, Default)]
struct Stay {
    /// When the last wake-up that handled datagrams began.
    last: Option<Instant>,
    /// When the last one ended, if it answered a request rather than took a stream, and
    /// how long to stay after it.
    after: Option<(Instant, Duration)>,
}

/// A wake-up that handled this many datagrams or more took a stream, not a request: no stay
/// follows it. Asleep, the thread lets a stream's datagrams gather into the next `recvmmsg`;
/// looking, it would take them one or two a time (in the QEMU guests, where each system call
/// is emulated, a build that stayed after any wake-up ran `ib_write_bw` at MTU 4096 at
/// 30.6–31.9 MB/s against 33.4–33.8). One under [`WOKEN_BATCH`], the first look's size:
/// that look came back short.
const STAY_BELOW: usize = WOKEN_BATCH;

/// The longest gap between requests that a stay covers, and the longest stay: some ten
/// wake-ups' worth (one costs about 10 µs on this VM). Where requests come further apart
/// (a loaded host, a guest under emulation), looking between them buys little and takes a
/// core others need: in the QEMU guests, where each vCPU is a host thread and the host has
/// two cores, stays of 800 µs left `ib_read_lat`'s median where it was and doubled its
/// average.
const STAY_MAX: Duration = Duration::from_micros(100);

impl Stay {
    /// A wake-up began at `began`, handled `handled` datagrams, and ended at `ended`.
    fn answered(&mut self, began: Instant, ended: Instant, handled: usize) {
        let gap = self.last.map(|last| began.saturating_duration_since(last));
        self.last = Some(began);
        self.after = gap
            .filter(|&gap| gap <= STAY_MAX && handled < STAY_BELOW)
            .map(|gap| (ended, gap.saturating_mul(2).min(STAY_MAX)));
    }

    /// Until when to look without sleeping, from `now`; `None` to sleep at once.
    fn end(&self, now: Instant) -> Option<Instant> {
        let (done, stay) = self.after?;
        Some(done + stay).filter(|&end| end > now)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, UdpSocket};

    use ferroce_proto::EngineConfig;

    use super::*;

    /// A driver whose progress thread has not started (a test may start it): the test's
    /// calls are the only looks at its socket, so each can be counted by the packets the
    /// engine received.
    fn driver_alone(ip: Ipv4Addr) -> Arc<Driver> {
        driver_with(ip, None, None)
    }

    /// [`driver_alone`] with faults injected, or a capture.
    fn driver_with(
        ip: Ipv4Addr,
        faults: Option<tap::Faults>,
        pcap: Option<tap::PcapWriter>,
    ) -> Arc<Driver> {
        driver_on(SocketAddr::from((ip, 0)), faults, pcap)
    }

    /// [`driver_with`] on `addr`: at the RoCE port for one that talks to another driver (the
    /// ICRC covers the UDP ports, and the engine seals for that one).
    fn driver_on(
        addr: SocketAddr,
        faults: Option<tap::Faults>,
        pcap: Option<tap::PcapWriter>,
    ) -> Arc<Driver> {
        let options = udp::PortOptions {
            gso: false,
            gro: false,
            buffers: 1 << 20,
        };
        let port = udp::Port::open(addr, options).unwrap();
        let mut engine = Engine::new(EngineConfig {
            local_ip: addr.ip(),
            seed: 1,
        });
        engine.set_batch_holding(true);
        Driver::new(port, engine, faults, pcap).unwrap()
    }

    /// ACKs wait for the application's reply as long as its turn takes on this NIC's scale (a
    /// guest's turn is tens of times a loopback one), but never near the peer's earliest
    /// early resend.
    #[test]
    fn acks_wait_for_the_reply_on_the_round_trip_s_scale_within_a_cap() {
        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 9));
        let hold_at = |scale: u32| {
            driver.time_scale.store(scale, Ordering::Relaxed);
            driver.ack_hold()
        };
        assert_eq!(hold_at(1), ACK_HOLD);
        assert_eq!(hold_at(5), ACK_HOLD * 5);
        assert_eq!(hold_at(MAX_TIME_SCALE), ACK_HOLD_MAX);
        assert_eq!(ACK_HOLD_MAX, Duration::from_micros(250));
    }

    /// After an empty look a poll asks for one buffer (what a ping-pong's next message
    /// needs), and the poll after the one the dry mark spares asks for a whole batch again:
    /// datagrams that queued up behind the one buffer are taken by that poll, not one a poll.
    #[test]
    fn a_queue_grown_behind_a_one_buffer_look_is_taken_in_a_batch() {
        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 1));
        let peer = UdpSocket::bind((Ipv4Addr::new(127, 0, 14, 2), 0)).unwrap();
        let mut state = driver.lock();
        let rcvd = |state: &Locked| state.engine.counters().rcvd_pkts;

        driver.progress_here(&mut state, None, true);
        assert!(state.found_empty, "a look at an empty socket says so");
        // Loopback queues each datagram before `send_to` returns. Too short for a BTH: the
        // engine counts each as received and drops it.
        for _ in 0..5 {
            peer.send_to(&[0; 8], driver.local).unwrap();
        }

        driver.progress_here(&mut state, None, true);
        assert_eq!(
            rcvd(&state),
            1,
            "the look after an empty one takes one buffer"
        );
        let mark = state
            .drained_dry
            .expect("taking the one buffer sets the dry mark");

        driver.progress_here(&mut state, Some(mark), true);
        assert_eq!(
            (rcvd(&state), driver.dry_polls.load(Ordering::Relaxed)),
            (1, 1),
            "the poll within DRY_FOR of that look does not look"
        );

        driver.progress_here(&mut state, None, true);
        assert_eq!(
            rcvd(&state),
            5,
            "the next poll takes the four left in one batch"
        );
        assert!(!state.found_empty);
        driver.progress_here(&mut state, Some(Instant::now() + DRY_FOR), true);
        assert!(
            state.found_empty,
            "the look after the batch found the socket empty"
        );
    }

    /// A look at a polling application that finds it inside the NIC does not wait for the
    /// lock: the progress thread naps on. The test holds the lock as an application does
    /// while it polls, and keeps saying it polls (`hold_socket`, as `Cq::drive` does); the
    /// progress thread, once napping beside it, counts a look that found the lock taken.
    /// Waiting for the lock instead, it would count none before the lock is let go.
    #[test]
    fn a_look_beside_an_application_inside_the_nic_does_not_wait_for_its_lock() {
        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 3));
        driver.start(false).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let polls = |driver: &Driver| driver.hold_socket(Instant::now() + Duration::from_millis(5));
        // Until the thread naps beside the "application": it may first sleep on the socket,
        // from which a poke brings it back to see the poller. (Not a ring: one left on the
        // doorbell would end the nap, and the thread would then wait for the lock.)
        let state = loop {
            polls(&driver);
            let state = driver.lock();
            if matches!(state.thread_sleep, ThreadSleep::Nap { .. }) {
                break state;
            }
            drop(state);
            driver.poke_socket();
            assert!(
                Instant::now() < deadline,
                "the progress thread never napped"
            );
            std::thread::sleep(Duration::from_millis(1));
        };
        while driver.busy_looks.load(Ordering::Relaxed) == 0 {
            assert!(
                Instant::now() < deadline,
                "no look began its nap while the lock was taken"
            );
            polls(&driver);
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(state);
        driver.stop();
    }

    /// A queue pair of `driver` facing a socket at `peer_ip` that never answers (kept open
    /// beside it), and the CQ it reports to: what an RC one sends stays unfinished; a UC
    /// one's requests finish as they leave. Posts go through the QP's own `post_send`.
    fn qp_facing_nothing(
        driver: &Arc<Driver>,
        peer_ip: Ipv4Addr,
        qp_type: ferroce_proto::qp::QpType,
    ) -> (super::super::qp::Qp, Arc<super::super::cq::Cq>, UdpSocket) {
        use ferroce_proto::qp::{Mtu, QpAttr, QpState, QpType};
        use ferroce_proto::wire::{Qpn, RnrTimer};

        let peer = UdpSocket::bind((peer_ip, 0)).unwrap();
        let (qp, cq) = new_qp(driver, qp_type);
        let (qpn, psn) = (qp.qpn(), qp.psn());
        let rc = qp_type == QpType::Rc;
        let mut state = driver.lock();
        let engine = &mut state.engine;
        let access = if rc {
            ferroce_proto::memory::Access::REMOTE
        } else {
            ferroce_proto::memory::Access::REMOTE_WRITE_ONLY
        };
        for attr in [
            QpAttr {
                state: Some(QpState::Init),
                access: Some(access),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(Mtu::M1024),
                dest_qpn: Some(Qpn::new(0x11).unwrap()),
                peer: Some(peer.local_addr().unwrap()),
                rq_psn: Some(psn),
                max_dest_rd_atomic: rc.then_some(4),
                min_rnr_timer: rc.then(|| RnrTimer::new(1).unwrap()),
                ..QpAttr::default()
            },
            QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(psn),
                timeout: rc.then_some(20),
                retry_cnt: rc.then_some(7),
                rnr_retry: rc.then_some(7),
                max_rd_atomic: rc.then_some(4),
                ..QpAttr::default()
            },
        ] {
            engine.modify_qp(qpn, &attr).unwrap();
        }
        drop(state);
        (qp, cq, peer)
    }

    /// A queue pair of `driver` in RESET, its requester to start at PSN 1, and the CQ it
    /// reports to.
    fn new_qp(
        driver: &Arc<Driver>,
        qp_type: ferroce_proto::qp::QpType,
    ) -> (super::super::qp::Qp, Arc<super::super::cq::Cq>) {
        use ferroce_proto::psn::Psn;
        use ferroce_proto::qp::{QpCaps, QpInit};

        let cq = Arc::new(super::super::cq::Cq::new(driver, 256).unwrap());
        let mut state = driver.lock();
        let pd = state.engine.alloc_pd();
        let qpn = state
            .engine
            .create_qp(QpInit {
                qp_type,
                pd,
                send_cq: cq.id(),
                recv_cq: cq.id(),
                caps: QpCaps::default(),
                sq_sig_all: false,
                srq: None,
            })
            .unwrap();
        drop(state);
        let psn = Psn::new(1).unwrap();
        let cqs = (Arc::clone(&cq), Arc::clone(&cq));
        let qp = super::super::qp::Qp::new(driver, qpn, psn, QpCaps::default(), None, cqs);
        (qp, cq)
    }

    /// A reliable-connected queue pair of `driver` facing `peer`'s, both ready to send: the
    /// pair a ping-pong runs on.
    fn rc_pair(
        driver: &Arc<Driver>,
        peer: &Arc<Driver>,
    ) -> [(super::super::qp::Qp, Arc<super::super::cq::Cq>); 2] {
        use ferroce_proto::memory::Access;
        use ferroce_proto::qp::{Mtu, QpType};
        use ferroce_proto::wire::RnrTimer;

        let [a, b] = [driver, peer].map(|d| new_qp(d, QpType::Rc));
        for ((qp, _), (other, _), to) in [(&a, &b, peer), (&b, &a, driver)] {
            qp.connect(&crate::attr::ConnectAttrs {
                peer: to.local,
                dest_qpn: other.qpn(),
                sq_psn: qp.psn(),
                rq_psn: other.psn(),
                mtu: Mtu::M1024,
                access: Access::REMOTE,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 7,
                min_rnr_timer: RnrTimer::new(1).unwrap(),
                max_rd_atomic: 4,
                max_dest_rd_atomic: 4,
            })
            .unwrap();
        }
        [a, b]
    }

    /// A responder and a requester whose zero-length SEND the responder's application has
    /// taken in a poll, beside the progress thread's nap (not started) at the full watch,
    /// published when the test began; the responder's time scale `scale` as the poll ran.
    /// Returns the two, their queue pairs and CQs (which close when dropped), and the nap's
    /// end as published.
    #[allow(clippy::type_complexity)]
    fn ack_held_beside_a_nap(
        hosts: [u8; 2],
        scale: u32,
    ) -> (
        [Arc<Driver>; 2],
        [(super::super::qp::Qp, Arc<super::super::cq::Cq>); 2],
        Instant,
    ) {
        use ferroce_proto::qp::{Payload, RecvWr, SendOp, SendWr};
        use ferroce_proto::wire::ROCE_PORT;

        let [responder, requester] = hosts.map(|host| {
            let addr = SocketAddr::from((Ipv4Addr::new(127, 0, 14, host), ROCE_PORT));
            driver_on(addr, None, None)
        });
        let pair = rc_pair(&responder, &requester);
        pair[0]
            .0
            .post_recv(RecvWr {
                wr_id: 1,
                sges: Vec::new(),
            })
            .unwrap();
        responder.time_scale.store(scale, Ordering::Relaxed);
        // As the progress thread publishes its nap beside an application that kept polling.
        let napped = Instant::now() + responder.scaled(POLLER_WATCH_MAX);
        responder.lock().thread_sleep = ThreadSleep::Nap {
            until: napped,
            pushed_on: true,
        };
        let wr = SendWr::new(2, SendOp::Send, Payload::Inline(Vec::new()));
        pair[1].0.post_send(wr).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        let received = loop {
            if let Some(c) = pair[0].1.poll() {
                break c;
            }
            assert!(
                Instant::now() < deadline,
                "the SEND never arrived: {:?} / {:?}",
                responder.lock().engine.counters(),
                requester.lock().engine.counters()
            );
        };
        assert_eq!(received.wr_id, 1);
        ([responder, requester], pair, napped)
    }

    /// A poll that takes a request and holds its ACK for the application's reply
    /// ([`ACK_HOLD`]) cuts the progress thread's nap beside it (published at
    /// [`POLLER_WATCH_MAX`]) to end within [`HELD_ACK_WATCH`] of the ACK's due time, and the
    /// polls after it push the nap on by no more than that: where the application then stops
    /// calling into the NIC without answering (a ping-pong's last turn), the thread wakes to
    /// send the ACK before the peer's earliest early resend. At the full watch every quiet
    /// write-lat run ended with a needless resend and a duplicate.
    #[test]
    fn an_ack_held_for_a_reply_goes_before_the_peer_s_early_resend() {
        let ([responder, requester], pair, napped) = ack_held_beside_a_nap([21, 22], 1);
        let state = responder.lock();
        let due = state.acks_due.expect("the ACK waits for the reply");
        let ThreadSleep::Nap { until, .. } = state.thread_sleep else {
            panic!("the thread's nap was replaced: {:?}", state.thread_sleep);
        };
        assert!(until < napped, "the nap kept its end");
        assert!(until <= due + HELD_ACK_WATCH, "the nap ends too late");
        drop(state);
        assert_eq!(responder.watch_max(Instant::now()), HELD_ACK_WATCH);
        // The application answers nothing: the thread sends the ACK.
        responder.start(false).unwrap();
        requester.start(false).unwrap();
        let sent = pair[1]
            .1
            .wait(Duration::from_secs(20))
            .expect("never acknowledged");
        assert_eq!(
            (sent.wr_id, sent.status),
            (2, ferroce_proto::qp::WcStatus::Success)
        );
        responder.stop();
        requester.stop();
    }

    /// A queue pair destroyed while it holds an ACK for the application's reply sends it at
    /// once: nothing more will leave on it. At a guest's scale the ACK would be held for up
    /// to a quarter millisecond more.
    #[test]
    fn closing_a_queue_pair_sends_the_ack_it_holds() {
        let ([responder, _requester], [ours, _theirs], _) = ack_held_beside_a_nap([25, 26], 30);
        assert!(
            responder.lock().acks_due.is_some(),
            "the ACK waits for the reply"
        );
        drop(ours);
        let state = responder.lock();
        assert_eq!(state.acks_due, None);
        assert_eq!(state.link.tx.len(), 0, "the ACK still waits");
    }

    /// At a guest's round trip (tens of times the reference one) the nap keeps its full
    /// watch: there a short one would not beat the peer's early resend, and cost the
    /// application the thread's looks (`HELD_ACK_WATCH`).
    #[test]
    fn at_a_guest_s_round_trip_a_held_ack_leaves_the_nap_as_it_was() {
        let ([responder, _requester], _pair, napped) = ack_held_beside_a_nap([23, 24], 30);
        let state = responder.lock();
        assert!(state.acks_due.is_some(), "the ACK waits for the reply");
        let ThreadSleep::Nap { until, .. } = state.thread_sleep else {
            panic!("the thread's nap was replaced: {:?}", state.thread_sleep);
        };
        assert_eq!(until, napped, "the nap was cut");
    }

    /// Posts an 8-byte inline SEND with `id` on `qp`.
    fn post_8(qp: &super::super::qp::Qp, id: u64) {
        use ferroce_proto::qp::{Payload, SendOp, SendWr};
        let wr = SendWr::new(id, SendOp::Send, Payload::Inline(vec![7; 8]));
        qp.post_send(wr).unwrap();
    }

    /// A peer on this host that has not read its queue is descheduled, not short of a
    /// packet: the early resend is put off while the request waits there unread, and made
    /// once the peer has read it and still not answered.
    #[test]
    fn an_early_resend_waits_while_the_peer_has_not_read() {
        use ferroce_proto::qp::QpType;

        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 15));
        driver.start(false).unwrap();
        let (qp, _cq, peer) = qp_facing_nothing(&driver, Ipv4Addr::new(127, 0, 14, 16), QpType::Rc);
        post_8(&qp, 1);
        let counters = || *driver.lock().engine.counters();
        let deadline = Instant::now() + Duration::from_secs(20);
        // The first early resend is due a quarter of the 4.3 s ACK timeout after the post
        // (nothing on this fresh QP was answered), the next a half after that.
        while counters().early_put_off == 0 {
            assert!(Instant::now() < deadline, "never put off: {:?}", counters());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(counters().early_resends, 0, "{:?}", counters());
        // The peer reads the request (and answers nothing): the next one is made.
        let mut buf = [0; 256];
        assert!(peer.recv(&mut buf).unwrap() > 12);
        while counters().early_resends == 0 {
            assert!(Instant::now() < deadline, "never resent: {:?}", counters());
            std::thread::sleep(Duration::from_millis(10));
        }
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert!(peer.recv(&mut buf).expect("no resent copy") > 12);
        driver.stop();
    }

    /// Datagrams waiting in the NIC's own socket may hold the answer (the thread running the
    /// timers has not taken them): an early resend due then is put off, and made once the
    /// socket has been read and still nothing answered.
    #[test]
    fn an_early_resend_waits_while_this_nic_has_not_read() {
        use ferroce_proto::qp::QpType;

        // Not started: no thread reads its socket.
        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 17));
        let (qp, _cq, peer) = qp_facing_nothing(&driver, Ipv4Addr::new(127, 0, 14, 18), QpType::Rc);
        post_8(&qp, 1);
        let mut buf = [0; 256];
        assert!(
            peer.recv(&mut buf).unwrap() > 12,
            "the peer read the request"
        );
        peer.send_to(b"not yet read", driver.local).unwrap();
        // Past the first early resend (a quarter of the 4.3 s ACK timeout, nothing on this
        // fresh QP answered), short of it.
        let due = Instant::now() + Duration::from_millis(1500);
        let timers = |at| {
            let mut state = driver.lock();
            state.engine.handle_timeout_with(at, |p| driver.unread(p));
            *state.engine.counters()
        };
        let c = timers(due);
        assert_eq!((c.early_put_off, c.early_resends), (1, 0), "{c:?}");
        assert_eq!(driver.port.socket().recv(&mut buf).unwrap(), 12);
        // The next, a half of it later: past that, short of the ACK timeout.
        let c = timers(due + Duration::from_millis(2500));
        assert_eq!((c.early_put_off, c.early_resends), (1, 1), "{c:?}");
    }

    /// What the fault injector delays (reordering, `delay`) still leaves when due if the NIC
    /// stops first: a program that closes its device right after its last completion must not
    /// turn a delayed packet (its peer's last ACK, say) into a lost one.
    #[test]
    fn stopping_sends_what_the_fault_injector_still_delays() {
        use ferroce_proto::qp::QpType;

        let faults = tap::Faults {
            reorder: 1.0,
            delay: Duration::from_millis(2),
            seed: 1,
            ..tap::Faults::default()
        };
        let driver = driver_with(Ipv4Addr::new(127, 0, 14, 11), Some(faults), None);
        let (qp, _cq, peer) = qp_facing_nothing(&driver, Ipv4Addr::new(127, 0, 14, 12), QpType::Uc);
        post_8(&qp, 1);
        // Every packet waits 6 ms in the injector, and no progress thread runs to send it.
        peer.set_nonblocking(true).unwrap();
        let mut buf = [0; 256];
        assert_eq!(
            peer.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "the packet was not held"
        );
        driver.stop();
        assert!(driver.lock().link.next_due().is_none(), "still held");
        peer.set_nonblocking(false).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let got = peer.recv(&mut buf).expect("the held packet never left");
        assert!(got > 12, "{got} bytes: not a RoCE packet");
    }

    /// A capture is in its file as soon as the packets are sent or received, not when the NIC
    /// closes: a program that exits without closing its device (an error path, often the one
    /// being debugged) leaves every packet it saw there.
    #[test]
    fn a_capture_is_written_as_packets_go() {
        use ferroce_proto::qp::QpType;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sent.pcap");
        let pcap = tap::PcapWriter::create(&path).unwrap();
        let driver = driver_with(Ipv4Addr::new(127, 0, 14, 13), None, Some(pcap));
        let (qp, _cq, _peer) =
            qp_facing_nothing(&driver, Ipv4Addr::new(127, 0, 14, 14), QpType::Uc);
        let header = std::fs::metadata(&path).unwrap().len();
        post_8(&qp, 1);
        let written = std::fs::metadata(&path).unwrap().len();
        // The pcap header (24 bytes), then a record (16) of an Ethernet frame.
        assert!(
            written > header.max(24) + 16 + 14,
            "{written} bytes in the file"
        );
        drop(driver);
    }

    /// A post behind `POSTS_BEHIND` unfinished requests waits in the engine for the
    /// application's next call, which sends it with the posts after it (a poll that finds
    /// nothing, arming a CQ); one after which the application makes no call is sent by the
    /// progress thread.
    #[test]
    fn posts_behind_a_full_queue_leave_together_at_the_next_call() {
        use ferroce_proto::qp::QpType;

        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 7));
        let (qp, cq, _peer) = qp_facing_nothing(&driver, Ipv4Addr::new(127, 0, 14, 8), QpType::Rc);
        let sent = || driver.lock().engine.counters().sent_pkts;
        let mut expected = POSTS_BEHIND as u64;

        for id in 0..expected {
            post_8(&qp, id);
        }
        assert_eq!(sent(), expected, "the first posts leave at once");
        for id in 0..3 {
            post_8(&qp, 100 + id);
        }
        assert_eq!(sent(), expected, "posts behind them are held");
        assert_eq!(driver.lock().posts_held, 3);

        // The application's next poll sends them.
        let mut state = driver.lock();
        driver.progress_here(&mut state, None, true);
        assert_eq!(state.posts_held, 0);
        drop(state);
        expected += 3;
        assert_eq!(sent(), expected, "the next call sends what was held");

        // No more than POSTS_HELD_MAX are held: the next post sends them all.
        for id in 0..u64::from(POSTS_HELD_MAX) + 1 {
            post_8(&qp, 200 + id);
        }
        expected += u64::from(POSTS_HELD_MAX) + 1;
        assert_eq!(sent(), expected);

        // Arming a CQ, the last call before a program sleeps on its channel, sends them.
        post_8(&qp, 300);
        assert_eq!(sent(), expected, "held");
        cq.req_notify(false);
        expected += 1;
        assert_eq!(sent(), expected, "arming sends what was held");

        // Held, and no call follows: the progress thread sends it.
        post_8(&qp, 400);
        assert_eq!(driver.lock().posts_held, 1);
        driver.start(false).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while driver.lock().posts_held > 0 {
            assert!(Instant::now() < deadline, "a held post never left");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sent(), expected + 1);
        driver.stop();
    }

    /// UC requests finish as they leave, so a UC queue pair's queue stays short: a run of
    /// posts with no other call between them is held from its `POSTS_BEHIND`-th on, and a
    /// poll ends the run.
    #[test]
    fn a_run_of_posts_without_a_poll_leaves_together() {
        use ferroce_proto::qp::QpType;

        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 9));
        let (qp, _cq, _peer) =
            qp_facing_nothing(&driver, Ipv4Addr::new(127, 0, 14, 10), QpType::Uc);
        let sent = || driver.lock().engine.counters().sent_pkts;
        let run = POSTS_BEHIND as u64;

        for id in 0..run {
            post_8(&qp, id);
        }
        assert_eq!(sent(), run, "a run's first posts leave at once");
        assert_eq!(
            driver.lock().engine.sq_len(qp.qpn()),
            0,
            "UC requests finish as they leave"
        );
        post_8(&qp, run);
        assert_eq!(sent(), run, "the next post in the run is held");

        let mut state = driver.lock();
        driver.progress_here(&mut state, None, true);
        drop(state);
        assert_eq!(sent(), run + 1, "a poll sends it");
        post_8(&qp, run + 1);
        assert_eq!(
            sent(),
            run + 2,
            "and begins a new run: the next post leaves at once"
        );
    }

    #[test]
    fn a_stay_follows_a_steady_peer_only() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut stay = Stay::default();
        assert_eq!(stay.end(t0), None, "nothing answered yet: sleep at once");
        // A first request: no gap known yet, so no stay.
        stay.answered(t0, t0 + us(2), 1);
        assert_eq!(stay.end(t0 + us(2)), None);
        // A peer asking every 10 µs: the stay covers two gaps.
        stay.answered(t0 + us(10), t0 + us(12), 1);
        assert_eq!(stay.end(t0 + us(12)), Some(t0 + us(32)));
        // Once it has passed, the thread sleeps.
        assert_eq!(stay.end(t0 + us(32)), None);
        // A peer asking every 80 µs: twice the gap is more than STAY_MAX, which bounds it.
        stay.answered(t0 + us(90), t0 + us(92), 1);
        assert_eq!(stay.end(t0 + us(92)), Some(t0 + us(92) + STAY_MAX));
        // A stream: a wake-up that took a batch sleeps at once, to let the next gather.
        stay.answered(t0 + us(100), t0 + us(150), STAY_BELOW);
        assert_eq!(stay.end(t0 + us(150)), None);
        // A heartbeat, or a slow host's requests, further apart than STAY_MAX: no stay.
        stay.answered(t0 + us(10_000), t0 + us(10_002), 1);
        assert_eq!(stay.end(t0 + us(10_002)), None);
        stay.answered(t0 + us(10_450), t0 + us(10_550), 1);
        assert_eq!(stay.end(t0 + us(10_550)), None);
    }

    #[test]
    fn a_poll_of_an_armed_cq_leaves_the_socket_to_the_progress_thread() {
        let driver = driver_alone(Ipv4Addr::new(127, 0, 14, 5));
        let cq = crate::backend::soft::cq::Cq::new(&driver, 16).unwrap();
        // A program polling its CQ keeps the progress thread off the socket for a while.
        assert!(cq.poll().is_none());
        assert_ne!(driver.poller_until.load(Ordering::Relaxed), 0);
        // Arming hands the socket back; the look after the arm (the verbs idiom: arm, poll
        // what came before, wait on the channel) must not take it again, or the thread naps
        // through the packet that fires the channel.
        cq.req_notify(false);
        assert_eq!(driver.poller_until.load(Ordering::Relaxed), 0);
        assert!(cq.poll().is_none());
        assert_eq!(driver.poller_until.load(Ordering::Relaxed), 0);
    }
}
