//! A verbs device's asynchronous events, read on a thread of its own: QP and CQ errors are
//! flagged on the object they name, device and port failures on the device, and GID table
//! changes move the GID index in use.

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;

use super::abi::*;
use super::ffi::{self, Context};
use crate::attr::Gid;
use crate::sys::EventFd;

/// What the async events said: the device's failure (for good: the device or its port
/// failed), whether our GID is out of the table (for now: until the address comes back), and
/// the QPs and CQs that failed.
pub(super) struct Health {
    failure: Mutex<Option<String>>,
    pub(super) gid_gone: std::sync::atomic::AtomicBool,
    /// QPs and CQs by their handle's address, to the flag of their own that an event sets.
    watched: Mutex<HashMap<usize, Weak<Mutex<Option<String>>>>>,
    /// Signalled at every event handled, for the NIC's async descriptor.
    pub(super) signalled: EventFd,
}

impl Health {
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Self {
            failure: Mutex::new(None),
            gid_gone: std::sync::atomic::AtomicBool::new(false),
            watched: Mutex::new(HashMap::new()),
            signalled: EventFd::new()?,
        })
    }

    pub(super) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn fail(&self, why: String) {
        let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if f.is_none() {
            *f = Some(why);
        }
    }

    /// Watches the object at `key`: an event that names it sets the returned flag.
    pub(super) fn watch(&self, key: usize) -> Arc<Mutex<Option<String>>> {
        let flag = Arc::new(Mutex::new(None));
        let mut w = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        w.retain(|_, f| f.strong_count() > 0);
        w.insert(key, Arc::downgrade(&flag));
        flag
    }

    fn mark(&self, key: usize, why: String) -> bool {
        let w = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        match w.get(&key).and_then(Weak::upgrade) {
            Some(flag) => {
                *flag.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
                true
            }
            None => false,
        }
    }
}

pub(super) struct EventThread {
    pub(super) stop: UnixDatagram,
    pub(super) thread: JoinHandle<()>,
}

/// Reads the async fd until told to stop. Runs on its own thread so a QP that fails with no
/// traffic (no CQ wake-up) is still seen.
pub(super) struct EventWatcher {
    pub(super) ctx: Arc<Context>,
    pub(super) health: Arc<Health>,
    pub(super) device: String,
    pub(super) port: u8,
    pub(super) gid: Gid,
    pub(super) gid_index: Arc<std::sync::atomic::AtomicU32>,
    pub(super) table_len: i32,
}

impl EventWatcher {
    pub(super) fn run(&self, stop: &UnixDatagram) {
        let fds = [self.ctx.async_fd(), stop.as_raw_fd()];
        loop {
            match crate::sys::poll_readable(fds, None) {
                Ok([_, true]) => return,
                Ok(_) => {}
                Err(e) => {
                    self.health.fail(format!(
                        "{}: cannot wait for async events: {e}",
                        self.device
                    ));
                    return;
                }
            }
            while let Some(ev) = self.ctx.next_event() {
                self.handle(ev);
            }
        }
    }

    fn handle(&self, ev: ffi::AsyncEvent) {
        self.health.signalled.signal();
        let dev = &self.device;
        match ev.kind {
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
                let what = match ev.kind {
                    IBV_EVENT_QP_FATAL => "QP fatal error",
                    IBV_EVENT_QP_REQ_ERR => "invalid request at the responder",
                    _ => "access violation at the responder",
                };
                self.health.mark(ev.element, format!("{dev}: {what}"));
            }
            IBV_EVENT_CQ_ERR => {
                self.health.mark(
                    ev.element,
                    format!("{dev}: completion queue overrun: completions were lost"),
                );
            }
            IBV_EVENT_DEVICE_FATAL => self.health.fail(format!("{dev}: device fatal error")),
            IBV_EVENT_PORT_ERR if ev.element as u8 == self.port => self.health.fail(format!(
                "{dev} port {}: the port went down (PORT_ERR)",
                self.port
            )),
            IBV_EVENT_GID_CHANGE => {
                // Ours is gone when no entry of the table holds it any more; when it is back,
                // perhaps at another index, QPs connect through that one.
                let len = u32::try_from(self.table_len).unwrap_or(0).max(1);
                let found = (0..len).find(|&i| {
                    matches!(self.ctx.query_gid(self.port, i),
                        Ok(Some(e)) if Ipv6Addr::from(e.gid.raw) == self.gid.gid)
                });
                if let Some(i) = found {
                    self.gid_index
                        .store(i, std::sync::atomic::Ordering::Relaxed);
                }
                let ours = found.is_some();
                // Its absence ends when the address is added back, and then a fresh start
                // can receive again: `Nic::address_gone`, not a failure.
                self.health
                    .gid_gone
                    .store(!ours, std::sync::atomic::Ordering::SeqCst);
            }
            _ => {}
        }
    }
}
