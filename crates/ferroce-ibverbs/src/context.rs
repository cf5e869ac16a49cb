//! The Rust side of the objects a program holds: the process's one soft NIC, shared by every
//! open `ibv_context` (opened by the first `ibv_open_device`, closed with the last
//! `ibv_close_device`); each context's state (its address, its async event queue); and the
//! registry that says which pointers are live objects of this library, so that a verb given a
//! pointer it never handed out, or one already destroyed, fails with `EINVAL` instead of
//! reading freed memory. The C memory of those objects is `crate::entry`'s.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::c_int;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferroce::{Nic, NicError};

use crate::addr::{self, Choice};
use crate::settings::Settings;
use crate::sys;

/// Locks `m`, going on after a panic in another holder (the data are plain maps and counts,
/// left consistent at every step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The soft NIC, how many contexts use it, and whether its counters go to standard error
/// when the last closes (`FERROCE_STATS`).
struct Shared {
    nic: Option<Nic>,
    users: usize,
    stats: bool,
}

/// One process, one soft NIC, one address.
static SHARED: Mutex<Shared> = Mutex::new(Shared {
    nic: None,
    users: 0,
    stats: false,
});

/// Why `ibv_open_device` failed: the errno it sets, and a line for standard error.
#[derive(Debug)]
pub(crate) struct OpenError {
    pub(crate) errno: c_int,
    pub(crate) message: String,
}

/// The soft NIC for a new context: the one already open, or one opened on `choice` with
/// `settings`.
fn acquire(choice: &Choice, settings: &Settings) -> Result<Nic, OpenError> {
    let mut shared = lock(&SHARED);
    if let Some(nic) = shared.nic.clone() {
        shared.users += 1;
        return Ok(nic);
    }
    let nic = Nic::open(&settings.config(choice.ip)).map_err(|e| {
        let errno = match &e {
            NicError::AddressInUse { .. } => libc::EADDRINUSE,
            NicError::AddressNotAvailable(_) => libc::EADDRNOTAVAIL,
            NicError::Socket { source, .. } | NicError::Pcap { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
            _ => libc::EIO,
        };
        let hint = if errno == libc::EADDRINUSE {
            format!(
                "; give each process its own address with {}=127.0.0.N",
                addr::ENV
            )
        } else {
            String::new()
        };
        OpenError {
            errno,
            message: format!(
                "cannot open {} on {choice}: {e}{hint}",
                crate::attrs::DEVICE_NAME
            ),
        }
    })?;
    shared.nic = Some(nic.clone());
    shared.users = 1;
    shared.stats = settings.stats;
    Ok(nic)
}

/// The process's soft NIC, while a context has it open.
pub(crate) fn shared_nic() -> Option<Nic> {
    lock(&SHARED).nic.clone()
}

/// A context is gone: the last one closes the soft NIC.
fn release() {
    let mut shared = lock(&SHARED);
    shared.users = shared.users.saturating_sub(1);
    if shared.users == 0 {
        if let Some(nic) = shared.nic.take() {
            if shared.stats {
                eprintln!(
                    "ferroce-ibverbs: {}",
                    nic.statistics_line(crate::attrs::DEVICE_NAME)
                );
            }
            nic.close();
        }
    }
}

/// An asynchronous event as the queue keeps it: the C `ibv_async_event`'s two fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AsyncEvent {
    /// The object's address, or the port number for port events.
    pub(crate) element: usize,
    /// `enum ibv_event_type`.
    pub(crate) event_type: u32,
}

/// A context's asynchronous events: a queue and an eventfd (the context's `async_fd`)
/// whose count is the queue's length, so that `poll`/`epoll` on it wake when one waits.
struct AsyncEvents {
    fd: OwnedFd,
    queue: Mutex<VecDeque<AsyncEvent>>,
}

/// What one open `ibv_context` holds.
pub(crate) struct ContextState {
    /// The soft NIC, shared with the process's other contexts.
    pub(crate) nic: Nic,
    /// Its address.
    pub(crate) ip: IpAddr,
    /// The interface holding it (the GID's `ndev_ifindex`), 0 when none does.
    pub(crate) ndev_ifindex: u32,
    events: AsyncEvents,
}

impl ContextState {
    /// Opens a context on the address `choice` names, sharing the process's soft NIC (opened
    /// with `settings` where this is the first context).
    pub(crate) fn open(choice: &Choice, settings: &Settings) -> Result<Self, OpenError> {
        let fd = sys::eventfd().map_err(|e| OpenError {
            errno: e.raw_os_error().unwrap_or(libc::EMFILE),
            message: format!("cannot create the async event fd: {e}"),
        })?;
        let nic = acquire(choice, settings)?;
        let ip = nic.addr().ip();
        Ok(Self {
            nic,
            ip,
            ndev_ifindex: addr::interface_index_of(ip),
            events: AsyncEvents {
                fd,
                queue: Mutex::new(VecDeque::new()),
            },
        })
    }

    /// The `async_fd` to put in the C context.
    pub(crate) fn async_fd(&self) -> RawFd {
        self.events.fd.as_raw_fd()
    }

    /// Queues an event and makes `async_fd` readable (`crate::objects` raises the soft NIC's
    /// SRQ and QP events).
    pub(crate) fn raise(&self, event: AsyncEvent) -> io::Result<()> {
        lock(&self.events.queue).push_back(event);
        sys::eventfd_give(&self.events.fd)
    }

    /// `ibv_get_async_event`: waits (unless `async_fd` was made non-blocking, when it fails
    /// with `EAGAIN`) for the next event and takes it.
    pub(crate) fn next_event(&self) -> io::Result<AsyncEvent> {
        sys::eventfd_take(&self.events.fd)?;
        lock(&self.events.queue)
            .pop_front()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EAGAIN))
    }
}

impl Drop for ContextState {
    fn drop(&mut self) {
        release();
    }
}

/// The live objects, by the address the program holds.
struct Registry {
    /// `ibv_context *` → its state.
    contexts: BTreeMap<usize, Arc<ContextState>>,
    /// `ibv_pd *` → its `ibv_context *`.
    pds: BTreeMap<usize, usize>,
    /// Arrays `ibv_get_device_list` returned and `ibv_free_device_list` has not freed.
    device_lists: BTreeSet<usize>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    contexts: BTreeMap::new(),
    pds: BTreeMap::new(),
    device_lists: BTreeSet::new(),
});

/// Records a new context at `ctx`.
pub(crate) fn add_context(ctx: usize, state: Arc<ContextState>) {
    lock(&REGISTRY).contexts.insert(ctx, state);
}

/// The state of the live context at `ctx`.
pub(crate) fn context(ctx: usize) -> Option<Arc<ContextState>> {
    lock(&REGISTRY).contexts.get(&ctx).cloned()
}

/// Forgets the context at `ctx` and the PDs still in it (whose memory the caller frees).
/// `None` when `ctx` is not a live context.
pub(crate) fn remove_context(ctx: usize) -> Option<(Arc<ContextState>, Vec<usize>)> {
    let mut r = lock(&REGISTRY);
    let state = r.contexts.remove(&ctx)?;
    let pds: Vec<usize> = r
        .pds
        .iter()
        .filter(|&(_, &c)| c == ctx)
        .map(|(&pd, _)| pd)
        .collect();
    for pd in &pds {
        r.pds.remove(pd);
    }
    Some((state, pds))
}

/// Records a new PD at `pd` in the context at `ctx`.
pub(crate) fn add_pd(pd: usize, ctx: usize) {
    lock(&REGISTRY).pds.insert(pd, ctx);
}

/// The state of the context of the live PD at `pd`, or `EINVAL`.
pub(crate) fn pd_context(pd: usize) -> Result<(usize, Arc<ContextState>), c_int> {
    let r = lock(&REGISTRY);
    let &ctx = r.pds.get(&pd).ok_or(libc::EINVAL)?;
    let state = r.contexts.get(&ctx).cloned().ok_or(libc::EINVAL)?;
    Ok((ctx, state))
}

/// Forgets the PD at `pd`; false when it is not a live PD.
pub(crate) fn remove_pd(pd: usize) -> bool {
    lock(&REGISTRY).pds.remove(&pd).is_some()
}

/// Records a device list handed out.
pub(crate) fn add_device_list(list: usize) {
    lock(&REGISTRY).device_lists.insert(list);
}

/// Forgets a device list; false when it was not handed out or is already freed.
pub(crate) fn remove_device_list(list: usize) -> bool {
    lock(&REGISTRY).device_lists.remove(&list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn on(last: u8) -> Choice {
        Choice {
            ip: IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)),
            source: addr::Source::Env,
        }
    }

    #[test]
    fn contexts_share_one_nic_and_events_queue_in_order() {
        let a = ContextState::open(&on(92), &Settings::default()).expect("first context");
        let b = ContextState::open(&on(93), &Settings::default()).expect("second context");
        assert_eq!(a.ip, b.ip, "the second context shares the first's NIC");
        let first = AsyncEvent {
            element: 1,
            event_type: 9,
        };
        let second = AsyncEvent {
            element: 2,
            event_type: 10,
        };
        a.raise(first).unwrap();
        a.raise(second).unwrap();
        assert_eq!(a.next_event().unwrap(), first);
        assert_eq!(a.next_event().unwrap(), second);
        drop(a);
        drop(b);
        assert!(
            lock(&SHARED).nic.is_none(),
            "the last context closed the NIC"
        );
    }

    #[test]
    fn registry_refuses_unknown_pointers() {
        assert!(context(0x1234).is_none());
        assert!(!remove_pd(0x1234));
        assert!(!remove_device_list(0x1234));
        add_pd(0x10, 0x20);
        assert!(remove_pd(0x10));
        assert!(!remove_pd(0x10), "a PD is freed once");
    }
}
