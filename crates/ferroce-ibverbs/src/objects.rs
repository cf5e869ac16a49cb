//! The Rust side of the data path's objects (stage 1): memory regions, completion channels,
//! CQs, QPs, SRQs and address handles, each in a table under the address of the C object the
//! program holds (as `crate::context` keeps contexts and PDs), so that a verb given a pointer
//! it never handed out, or one already destroyed, fails with `EINVAL`. The C memory of these
//! objects is `crate::entry`'s.
//!
//! Completion channels: in C one channel's fd serves several CQs. A [`Channel`] is an eventfd
//! (the C channel's `fd`) and a queue of the CQs that fired; each CQ with a channel has the
//! soft NIC announce its events by queueing it there ([`Cq::announce_events`]), on the thread
//! that handled the completion, so that a program asleep on the channel is the one thread
//! woken. `ibv_get_cq_event` takes the queue's oldest entry, waiting on the eventfd (or
//! failing with `EAGAIN` where the program made it non-blocking).
//!
//! A process-wide poller thread watches the soft NIC's async event fd
//! ([`ferroce::Nic::async_fd`]) and raises each event (an SRQ below its limit, a QP's last
//! WQE) on the context of the object it names, whose `async_fd` then turns readable
//! (`ibv_get_async_event`). It starts with the first context and lives as long as the
//! process.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_int, c_uint};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use ferroce::{AddressHandle, Cq, Qp, Region, Srq};

use crate::abi::ibv_qp_cap;
use crate::context::{self, AsyncEvent};
use crate::sys;

/// Locks `m`, going on after a panic in another holder (the data stay consistent).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Live objects of one kind, by the address of their C object.
pub(crate) struct Table<T>(Mutex<BTreeMap<usize, Arc<T>>>);

impl<T> Table<T> {
    pub(crate) const fn new() -> Self {
        Self(Mutex::new(BTreeMap::new()))
    }

    /// Records `state` for the object at `at`.
    pub(crate) fn add(&self, at: usize, state: Arc<T>) {
        lock(&self.0).insert(at, state);
    }

    /// The state of the live object at `at`.
    pub(crate) fn get(&self, at: usize) -> Option<Arc<T>> {
        lock(&self.0).get(&at).cloned()
    }

    /// Forgets the object at `at`, if it is live.
    pub(crate) fn remove(&self, at: usize) -> Option<Arc<T>> {
        lock(&self.0).remove(&at)
    }

    /// Forgets the object at `at` unless `busy` says another object still uses it:
    /// `Err(EBUSY)` then, `Err(EINVAL)` for no live object.
    pub(crate) fn remove_unless(
        &self,
        at: usize,
        busy: impl FnOnce() -> bool,
    ) -> Result<Arc<T>, c_int> {
        let mut map = lock(&self.0);
        if !map.contains_key(&at) {
            return Err(libc::EINVAL);
        }
        if busy() {
            return Err(libc::EBUSY);
        }
        map.remove(&at).ok_or(libc::EINVAL)
    }

    /// The address of a live object that satisfies `f`, and its state.
    pub(crate) fn find(&self, f: impl Fn(&T) -> bool) -> Option<(usize, Arc<T>)> {
        lock(&self.0)
            .iter()
            .find(|(_, s)| f(s))
            .map(|(&at, s)| (at, s.clone()))
    }

    /// Forgets every live object that satisfies `f`, and returns them.
    pub(crate) fn drain(&self, f: impl Fn(&T) -> bool) -> Vec<(usize, Arc<T>)> {
        let mut map = lock(&self.0);
        let gone: Vec<usize> = map
            .iter()
            .filter(|(_, s)| f(s))
            .map(|(&at, _)| at)
            .collect();
        gone.into_iter()
            .filter_map(|at| map.remove(&at).map(|s| (at, s)))
            .collect()
    }

    /// Whether a live object satisfies `f`.
    pub(crate) fn any(&self, f: impl Fn(&T) -> bool) -> bool {
        lock(&self.0).values().any(|s| f(s))
    }
}

/// A registered memory region (`ibv_mr`).
pub(crate) struct MrState {
    /// The C addresses of its context and PD.
    pub(crate) ctx: usize,
    pub(crate) pd: usize,
    /// `None` once deregistered.
    pub(crate) region: Mutex<Option<Region>>,
}

/// A completion channel (`ibv_comp_channel`): its fd, and the CQs that fired.
pub(crate) struct Channel {
    /// The C address of its context.
    pub(crate) ctx: usize,
    fd: OwnedFd,
    queue: Mutex<VecDeque<usize>>,
}

impl Channel {
    /// A channel with nothing queued.
    pub(crate) fn new(ctx: usize) -> io::Result<Self> {
        Ok(Self {
            ctx,
            fd: sys::eventfd()?,
            queue: Mutex::new(VecDeque::new()),
        })
    }

    /// The fd to put in the C channel.
    pub(crate) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The channel's fd, to read its flags.
    pub(crate) fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Queues the CQ at `cq` (or, on an rdma_cm event channel, the event at `cq`) and makes
    /// the fd readable.
    pub(crate) fn push(&self, cq: usize) {
        lock(&self.queue).push_back(cq);
        // The count only fails at 2^64 - 1 events.
        let _ = sys::eventfd_give(&self.fd);
    }

    /// `ibv_get_cq_event`: waits for (or, on a non-blocking fd, fails with `EAGAIN` before)
    /// the next CQ that fired, and takes it.
    pub(crate) fn next(&self) -> io::Result<usize> {
        sys::eventfd_take(&self.fd)?;
        lock(&self.queue)
            .pop_front()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EAGAIN))
    }
}

/// A completion queue (`ibv_cq`).
pub(crate) struct CqState {
    pub(crate) cq: Cq,
    /// The C address of its context.
    pub(crate) ctx: usize,
    /// The channel's C address and state, if the CQ has one.
    pub(crate) channel: Option<(usize, Arc<Channel>)>,
}

/// A queue pair (`ibv_qp`).
pub(crate) struct QpState {
    pub(crate) qp: Qp,
    /// The C addresses of its context (where its async events go) and PD.
    pub(crate) ctx: usize,
    pub(crate) pd: usize,
    /// `enum ibv_qp_type`.
    pub(crate) qp_type: c_uint,
    /// The C addresses of its CQs and SRQ (0 for none), for `ibv_query_qp` and the busy checks.
    pub(crate) send_cq: usize,
    pub(crate) recv_cq: usize,
    pub(crate) srq: usize,
    /// The capacities granted, as `ibv_query_qp` reports them.
    pub(crate) cap: ibv_qp_cap,
    pub(crate) sq_sig_all: bool,
    /// What the program set that ferroce's [`Qp::query`] does not keep.
    pub(crate) verbs: Mutex<QpVerbs>,
}

/// What a queue pair's attributes hold that ferroce keeps in its own terms: the flags and
/// Q_Key as the program gave them, for `ibv_query_qp`. Its state is the engine's own
/// ([`ferroce::Qp::query`]), since the QP is created in RESET as verbs creates it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpVerbs {
    /// `qp_access_flags` as given.
    pub(crate) access_flags: c_uint,
    /// `qkey` as given (UD).
    pub(crate) qkey: u32,
}

/// A shared receive queue (`ibv_srq`).
pub(crate) struct SrqState {
    pub(crate) srq: Srq,
    /// The C addresses of its context (where its async events go) and PD.
    pub(crate) ctx: usize,
    pub(crate) pd: usize,
    /// `max_sge` as asked.
    pub(crate) max_sge: u32,
}

/// An address handle (`ibv_ah`).
pub(crate) struct AhState {
    /// The C addresses of its context and PD.
    pub(crate) ctx: usize,
    pub(crate) pd: usize,
    pub(crate) ah: AddressHandle,
}

/// Whether a region, QP, SRQ or address handle of the PD at `pd` is live
/// (`ibv_dealloc_pd` then fails with `EBUSY`, as the kernel refuses it).
pub(crate) fn pd_in_use(pd: usize) -> bool {
    MRS.any(|s| s.pd == pd)
        || QPS.any(|s| s.pd == pd)
        || SRQS.any(|s| s.pd == pd)
        || AHS.any(|s| s.pd == pd)
}

pub(crate) static MRS: Table<MrState> = Table::new();
pub(crate) static CHANNELS: Table<Channel> = Table::new();
pub(crate) static CQS: Table<CqState> = Table::new();
pub(crate) static QPS: Table<QpState> = Table::new();
pub(crate) static SRQS: Table<SrqState> = Table::new();
pub(crate) static AHS: Table<AhState> = Table::new();

/// The poller thread's epoll instance, or the errno of failing to start it.
static POLLER: OnceLock<Result<OwnedFd, c_int>> = OnceLock::new();

fn poller() -> Result<&'static OwnedFd, c_int> {
    POLLER
        .get_or_init(|| {
            let epoll = sys::epoll().map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
            let fd = epoll
                .try_clone()
                .map_err(|e| e.raw_os_error().unwrap_or(libc::EMFILE))?;
            std::thread::Builder::new()
                .name("ferroce-events".into())
                .spawn(move || forward(&fd))
                .map_err(|_| libc::EAGAIN)?;
            Ok(epoll)
        })
        .as_ref()
        .map_err(|&e| e)
}

/// The poller thread: raises the NIC's async events on their contexts.
fn forward(epoll: &OwnedFd) {
    let mut ready = [0u64; 16];
    loop {
        let n = match sys::epoll_wait(epoll, &mut ready) {
            Ok(n) => n,
            Err(e) => {
                eprintln!("ferroce-ibverbs: async events stop: epoll_wait: {e}");
                return;
            }
        };
        if ready[..n].contains(&ASYNC) {
            forward_async();
        }
    }
}

/// The epoll tag of the soft NIC's async event fd (no C object is at this address).
const ASYNC: u64 = u64::MAX;

/// `enum ibv_event_type`: `IBV_EVENT_SRQ_LIMIT_REACHED`, `IBV_EVENT_QP_LAST_WQE_REACHED`.
const IBV_EVENT_SRQ_LIMIT_REACHED: c_uint = 15;
const IBV_EVENT_QP_LAST_WQE_REACHED: c_uint = 16;

/// The soft NIC's async events, each raised on the context of the SRQ or QP it names, with
/// that object's C address (`ibv_async_event.element`). An event for an object already
/// destroyed is dropped.
fn forward_async() {
    let Some(nic) = context::shared_nic() else {
        return;
    };
    while let Some(event) = nic.poll_event() {
        let target = match event {
            ferroce::proto::qp::AsyncEvent::SrqLimitReached(id) => SRQS
                .find(|s| s.srq.id() == id)
                .map(|(at, s)| (at, s.ctx, IBV_EVENT_SRQ_LIMIT_REACHED)),
            ferroce::proto::qp::AsyncEvent::QpLastWqeReached(qpn) => QPS
                .find(|q| q.qp.qpn() == qpn)
                .map(|(at, q)| (at, q.ctx, IBV_EVENT_QP_LAST_WQE_REACHED)),
        };
        if let Some((element, ctx, event_type)) = target {
            if let Some(state) = context::context(ctx) {
                let _ = state.raise(AsyncEvent {
                    element,
                    event_type,
                });
            }
        }
    }
}

/// Starts raising the soft NIC's async events on the C contexts (each call after the first
/// for the same NIC changes nothing).
pub(crate) fn watch_async(nic: &ferroce::Nic) -> Result<(), c_int> {
    match sys::epoll_add(poller()?, nic.async_fd(), ASYNC) {
        Err(e) if e.raw_os_error() != Some(libc::EEXIST) => {
            Err(e.raw_os_error().unwrap_or(libc::EIO))
        }
        _ => Ok(()),
    }
}
