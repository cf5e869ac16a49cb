//! The backend contract: what a NIC's backend must provide, and the one place that chooses
//! between the backends.
//!
//! Each public object (`crate::Nic`, `Cq`, `Qp`, `Srq`, `Region`) holds one of the enums below
//! and calls it once per operation; each enum dispatches with one exhaustive `match` per
//! operation, as tokio's `IoStack` does, so the compiler lists every operation a new backend
//! has yet to provide. What a backend does not do answers [`Unsupported`] naming it, from the
//! matches here (rdma-core's `dummy_ops.c`), never by falling into another backend's path.
//!
//! # Required types
//!
//! A backend is a folder with the same file names as the others (as mio's `sys/unix` and
//! `sys/shell` are), each defining one type:
//! - `nic::Nic`: opened by the composition root (`crate::open`); says what it is
//!   (`caps`, `addr`, `active_mtu`, `failure`, statistics, async events and their
//!   descriptor) and creates the other objects
//!   (`create_cq`, `create_qp`, `register`, and where it can `create_srq`, `create_gsi`).
//! - `cq::Cq`: `poll`, `poll_into`, `wait`, `drive`, `depth`, `failure`, and its completion
//!   channel: `req_notify`, `take_events`, `channel_fd`.
//! - `qp::Qp`: `qpn`, `psn`, `caps`, `state`, `connect` (from [`ConnectAttrs`]), `modify` and
//!   `query` attribute by attribute, the posts, `shutdown`; where it can, `ready_ud` and
//!   `set_write_filter`.
//! - `srq::Srq` (the soft backend only so far).
//! - `region::Region`: `read`, `write`, `deregister`; its keys come back as a `RegionInfo` from
//!   `register`.
//!
//! A backend imports the data below it (`crate::attr`, `crate::error`, `crate::memory`,
//! `crate::sys`, `crate::udp`) and never the public modules above (`nic`, `qp`, `cq`, `region`,
//! `srq`, `ud`, `cm`): `tests/layers.rs` fails if one does.

pub(crate) mod soft;
pub(crate) mod verbs;

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use ferroce_proto::memory::{RegionInfo, WriteOrder};
use ferroce_proto::qp::{
    AsyncEvent, Completion, ModifyError, Mtu, PostError, QpAttr, QpCaps, QpState, QpType, RecvWr,
    SendWr, SrqId,
};
use ferroce_proto::wire::Qpn;
use ferroce_proto::{Census, Counters, Psn, SrqAttr, SrqError, WriteFilter};

use crate::attr::{ConnectAttrs, NicCaps, QpSetup, RegionAccess, SOFT_DEVICE};
use crate::error::{NicError, RegionError, Unsupported};
use crate::memory::RegionMemory;
use crate::udp::GsoStatus;

/// The verbs backend, as [`Unsupported`] names it.
const VERBS: &str = "a verbs device";

/// What [`Unsupported`] says of an operation the verbs backend leaves out.
fn on_verbs(what: &'static str) -> Unsupported {
    Unsupported {
        backend: VERBS,
        what,
    }
}

/// A NIC's backend. Cheap to clone: every clone is the same NIC.
#[derive(Clone)]
pub(crate) enum Nic {
    Soft(soft::Nic),
    Verbs(Arc<verbs::Nic>),
}

/// A completion queue of either backend.
#[derive(Clone)]
pub(crate) enum Cq {
    Soft(Arc<soft::Cq>),
    Verbs(Arc<verbs::Cq>),
}

/// A queue pair of either backend.
pub(crate) enum Qp {
    Soft(soft::Qp),
    Verbs(verbs::Qp),
}

/// A shared receive queue: the soft backend's only, so far.
pub(crate) enum Srq {
    Soft(Arc<soft::Srq>),
}

/// A registered region of either backend.
pub(crate) enum Region {
    Soft(soft::Region),
    Verbs(verbs::Region),
}

impl Nic {
    /// Whether `other` is a handle of this same NIC.
    pub(crate) fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Soft(a), Self::Soft(b)) => a.same(b),
            (Self::Verbs(a), Self::Verbs(b)) => a.same(b),
            (Self::Soft(_), Self::Verbs(_)) | (Self::Verbs(_), Self::Soft(_)) => false,
        }
    }

    /// The soft NIC, for the connection manager to attach to; a verbs device's connections
    /// are the kernel's rdma_cm's.
    pub(crate) fn cm_host(&self) -> Result<&soft::Nic, Unsupported> {
        match self {
            Self::Soft(s) => Ok(s),
            Self::Verbs(_) => Err(on_verbs("ferroce's own connection management")),
        }
    }

    pub(crate) fn device_name(&self) -> &str {
        match self {
            Self::Soft(_) => SOFT_DEVICE,
            Self::Verbs(v) => v.name(),
        }
    }

    pub(crate) fn gid_index(&self) -> u32 {
        match self {
            // One address, at index 0.
            Self::Soft(_) => 0,
            Self::Verbs(v) => v.gid_index(),
        }
    }

    pub(crate) fn caps(&self) -> NicCaps {
        match self {
            Self::Soft(_) => soft::Nic::caps(),
            Self::Verbs(v) => v.caps(),
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        match self {
            Self::Soft(s) => s.addr(),
            Self::Verbs(v) => v.addr(),
        }
    }

    pub(crate) fn active_mtu(&self) -> Mtu {
        match self {
            Self::Soft(s) => s.active_mtu(),
            Self::Verbs(v) => v.active_mtu(),
        }
    }

    /// Per-packet counters: all zeros on a verbs device, which counts in hardware.
    pub(crate) fn counters(&self) -> Counters {
        match self {
            Self::Soft(s) => s.counters(),
            Self::Verbs(_) => Counters::default(),
        }
    }

    /// The next async event; a verbs device's are handled by its event thread, so this
    /// only clears its descriptor.
    pub(crate) fn poll_event(&self) -> Option<AsyncEvent> {
        match self {
            Self::Soft(s) => s.poll_event(),
            Self::Verbs(v) => {
                v.take_async();
                None
            }
        }
    }

    /// The async-event descriptor.
    pub(crate) fn async_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Soft(s) => s.async_fd(),
            Self::Verbs(v) => v.async_fd(),
        }
    }

    pub(crate) fn census(&self) -> Option<Census> {
        match self {
            Self::Soft(s) => Some(s.census()),
            Self::Verbs(_) => None,
        }
    }

    pub(crate) fn statistics_line(&self, device: &str) -> String {
        match self {
            Self::Soft(s) => s.statistics_line(device),
            Self::Verbs(v) => v.statistics_line(),
        }
    }

    pub(crate) fn gso_status(&self) -> GsoStatus {
        match self {
            Self::Soft(s) => s.gso_status(),
            Self::Verbs(v) => GsoStatus::Hardware(v.name().to_owned()),
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        match self {
            Self::Soft(s) => s.failure(),
            Self::Verbs(v) => v.failure(),
        }
    }

    pub(crate) fn grow_buffers(&self, bytes: usize) -> std::io::Result<usize> {
        match self {
            Self::Soft(s) => s.grow_buffers(bytes),
            // The device's queues are its buffers.
            Self::Verbs(_) => Ok(bytes),
        }
    }

    /// Whether the backend knows its address is gone: a verbs device's GID out of its table.
    /// (Both also check the address itself; see `crate::Nic::address_gone`.)
    pub(crate) fn gid_gone(&self) -> bool {
        match self {
            Self::Soft(_) => false,
            Self::Verbs(v) => v.gid_gone(),
        }
    }

    /// Wakes a thread blocked on the soft NIC's socket; a verbs device has none.
    pub(crate) fn wake(&self) {
        match self {
            Self::Soft(s) => s.wake(),
            Self::Verbs(_) => {}
        }
    }

    pub(crate) fn close(&self) {
        match self {
            Self::Soft(s) => s.close(),
            Self::Verbs(v) => v.close(),
        }
    }

    pub(crate) fn create_cq(&self, depth: usize) -> Result<Cq, NicError> {
        Ok(match self {
            Self::Soft(s) => Cq::Soft(s.create_cq(depth)?),
            Self::Verbs(v) => Cq::Verbs(v.create_cq(depth)?),
        })
    }

    /// A QP whose CQs (and SRQ) are of this backend; the caller has checked they are of this
    /// NIC.
    pub(crate) fn create_qp(
        &self,
        setup: QpSetup,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
    ) -> Result<Qp, NicError> {
        match (self, send_cq, recv_cq, srq) {
            (Self::Soft(s), Cq::Soft(scq), Cq::Soft(rcq), srq) => {
                let srq = srq.map(|Srq::Soft(s)| s);
                Ok(Qp::Soft(s.create_qp(setup, scq, rcq, srq)?))
            }
            (Self::Verbs(_), _, _, Some(_)) => Err(on_verbs("shared receive queues").into()),
            (Self::Verbs(_), _, _, None) if setup.qp_type == QpType::Ud => {
                Err(on_verbs("UD queue pairs").into())
            }
            (Self::Verbs(v), Cq::Verbs(scq), Cq::Verbs(rcq), None) => {
                Ok(Qp::Verbs(v.create_qp(setup, scq, rcq)?))
            }
            (Self::Soft(_) | Self::Verbs(_), _, _, _) => {
                Err(NicError::OtherNic("a completion queue"))
            }
        }
    }

    /// QP 1, the GSI, on which a CM sends and receives its MADs.
    pub(crate) fn create_gsi(&self, cq: &Cq, caps: QpCaps) -> Result<Qp, NicError> {
        match (self, cq) {
            (Self::Soft(s), Cq::Soft(cq)) => Ok(Qp::Soft(s.create_gsi(cq, caps)?)),
            (Self::Verbs(_), _) => {
                Err(on_verbs("connection management's own GSI endpoints").into())
            }
            (Self::Soft(_), Cq::Verbs(_)) => Err(NicError::OtherNic("a completion queue")),
        }
    }

    pub(crate) fn create_srq(&self, max_wr: u32) -> Result<Srq, NicError> {
        match self {
            Self::Soft(s) => Ok(Srq::Soft(s.create_srq(max_wr))),
            Self::Verbs(_) => Err(on_verbs("shared receive queues").into()),
        }
    }

    /// The region registered with local key `lkey`: the soft engine's table; a verbs
    /// device keeps its keys in the kernel, so ferroce's own registry answers there.
    pub(crate) fn region_of_lkey(&self, lkey: u32) -> Option<RegionInfo> {
        match self {
            Self::Soft(s) => s.region_of_lkey(lkey),
            Self::Verbs(v) => v.region_of_lkey(lkey),
        }
    }

    pub(crate) fn register(
        &self,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: Option<u64>,
    ) -> Result<(Region, RegionInfo), RegionError> {
        Ok(match self {
            Self::Soft(s) => {
                let (region, info) = s.register(access, order, memory, iova)?;
                (Region::Soft(region), info)
            }
            Self::Verbs(v) => {
                let (region, info) = v.register(access, order, memory, iova)?;
                (Region::Verbs(region), info)
            }
        })
    }
}

impl Cq {
    pub(crate) fn depth(&self) -> usize {
        match self {
            Self::Soft(cq) => cq.depth(),
            Self::Verbs(cq) => cq.depth(),
        }
    }

    /// Changes the CQ's depth; `Ok(false)` when the soft engine refuses it.
    pub(crate) fn resize(&self, depth: usize) -> Result<bool, NicError> {
        match self {
            Self::Soft(cq) => Ok(cq.resize(depth)),
            Self::Verbs(cq) => cq.resize(depth).map(|()| true).map_err(NicError::from),
        }
    }

    pub(crate) fn poll(&self) -> Option<Completion> {
        match self {
            Self::Soft(cq) => cq.poll(),
            Self::Verbs(cq) => cq.poll(),
        }
    }

    pub(crate) fn poll_into(&self, out: &mut [Completion]) -> usize {
        match self {
            Self::Soft(cq) => cq.poll_into(out),
            Self::Verbs(cq) => cq.poll_into(out),
        }
    }

    /// Waits, receiving on this thread where the backend lets it (the soft NIC's socket); a
    /// verbs device progresses by itself, so this is its `wait`.
    pub(crate) fn drive(&self, timeout: Duration) -> Option<Completion> {
        match self {
            Self::Soft(cq) => cq.drive(timeout),
            Self::Verbs(cq) => cq.wait(timeout),
        }
    }

    pub(crate) fn wait(&self, timeout: Duration) -> Option<Completion> {
        match self {
            Self::Soft(cq) => cq.wait(timeout),
            Self::Verbs(cq) => cq.wait(timeout),
        }
    }

    /// Why the CQ failed: a verbs device's `CQ_ERR`; the soft NIC's errors are completions.
    pub(crate) fn failure(&self) -> Option<String> {
        match self {
            Self::Soft(_) => None,
            Self::Verbs(cq) => cq.failure(),
        }
    }

    /// Arms the CQ's completion channel for its next completion (or next solicited or
    /// failed one).
    pub(crate) fn req_notify(&self, solicited_only: bool) -> std::io::Result<()> {
        match self {
            Self::Soft(cq) => {
                cq.req_notify(solicited_only);
                Ok(())
            }
            Self::Verbs(cq) => cq.req_notify(solicited_only),
        }
    }

    /// The completion channel's events since the last take.
    pub(crate) fn take_events(&self) -> u64 {
        match self {
            Self::Soft(cq) => cq.take_events(),
            Self::Verbs(cq) => cq.take_events(),
        }
    }

    /// Has the soft NIC announce the CQ's events by a call instead of its descriptor.
    pub(crate) fn announce_events(
        &self,
        call: Arc<dyn Fn() + Send + Sync>,
    ) -> Result<(), Unsupported> {
        match self {
            Self::Soft(cq) => {
                cq.announce_events(call);
                Ok(())
            }
            Self::Verbs(_) => Err(on_verbs("completion events announced by a call")),
        }
    }

    /// The completion channel's descriptor.
    pub(crate) fn channel_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Soft(cq) => cq.channel_fd(),
            Self::Verbs(cq) => cq.channel_fd(),
        }
    }

    /// Wakes the threads waiting on it, to see a flag of their own.
    pub(crate) fn wake_waiters(&self) {
        match self {
            Self::Soft(cq) => cq.wake_waiters(),
            // A verbs wait is bounded by its caller's timeout; there is nothing to wake.
            Self::Verbs(_) => {}
        }
    }
}

impl Qp {
    pub(crate) fn qpn(&self) -> Qpn {
        match self {
            Self::Soft(qp) => qp.qpn(),
            Self::Verbs(qp) => qp.qpn(),
        }
    }

    pub(crate) fn psn(&self) -> Psn {
        match self {
            Self::Soft(qp) => qp.psn(),
            Self::Verbs(qp) => qp.psn(),
        }
    }

    pub(crate) fn caps(&self) -> QpCaps {
        match self {
            Self::Soft(qp) => qp.caps(),
            Self::Verbs(qp) => qp.caps(),
        }
    }

    pub(crate) fn state(&self) -> Option<QpState> {
        match self {
            Self::Soft(qp) => qp.state(),
            Self::Verbs(qp) => qp.state(),
        }
    }

    /// Why the QP failed: a verbs device's async event; the soft NIC's errors are completions.
    pub(crate) fn failure(&self) -> Option<String> {
        match self {
            Self::Soft(_) => None,
            Self::Verbs(qp) => qp.failure(),
        }
    }

    pub(crate) fn connect(&self, attrs: &ConnectAttrs) -> Result<(), ModifyError> {
        match self {
            Self::Soft(qp) => qp.connect(attrs),
            Self::Verbs(qp) => qp.connect(attrs),
        }
    }

    pub(crate) fn modify(&self, attr: &QpAttr) -> Result<(), ModifyError> {
        match self {
            Self::Soft(qp) => qp.modify(attr),
            Self::Verbs(qp) => qp.modify(attr),
        }
    }

    pub(crate) fn query(&self) -> QpAttr {
        match self {
            Self::Soft(qp) => qp.query(),
            Self::Verbs(qp) => qp.query(),
        }
    }

    pub(crate) fn ready_ud(&self, qkey: u32) -> Result<(), ModifyError> {
        match self {
            Self::Soft(qp) => qp.ready_ud(qkey),
            Self::Verbs(_) => Err(on_verbs("UD queue pairs").into()),
        }
    }

    pub(crate) fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        match self {
            Self::Soft(qp) => qp.post_send(wr),
            Self::Verbs(qp) => qp.post_send(wr),
        }
    }

    pub(crate) fn post_send_list(
        &self,
        wrs: impl IntoIterator<Item = SendWr>,
    ) -> Result<(), (usize, PostError)> {
        match self {
            Self::Soft(qp) => qp.post_send_list(wrs),
            Self::Verbs(qp) => qp.post_send_list(wrs),
        }
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        match self {
            Self::Soft(qp) => qp.post_recv(wr),
            Self::Verbs(qp) => qp.post_recv(wr),
        }
    }

    pub(crate) fn shutdown(&self) {
        match self {
            Self::Soft(qp) => qp.shutdown(),
            Self::Verbs(qp) => qp.shutdown(),
        }
    }

    /// Shows `filter` every WRITE the QP's responder places: only the soft engine sees each
    /// packet; a verbs device places WRITEs in hardware.
    pub(crate) fn set_write_filter(&self, filter: Box<dyn WriteFilter>) -> Result<(), Unsupported> {
        match self {
            Self::Soft(qp) => {
                qp.set_write_filter(filter);
                Ok(())
            }
            Self::Verbs(_) => Err(on_verbs("per-WRITE filters")),
        }
    }
}

impl Srq {
    pub(crate) fn id(&self) -> SrqId {
        match self {
            Self::Soft(srq) => srq.id(),
        }
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        match self {
            Self::Soft(srq) => srq.post_recv(wr),
        }
    }

    pub(crate) fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<(), SrqError> {
        match self {
            Self::Soft(srq) => srq.modify(max_wr, limit),
        }
    }

    pub(crate) fn query(&self) -> Option<SrqAttr> {
        match self {
            Self::Soft(srq) => srq.query(),
        }
    }
}

impl Region {
    /// Copies out; the caller has checked the range.
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) {
        match self {
            Self::Soft(r) => r.read(at, out),
            Self::Verbs(r) => r.read(at, out),
        }
    }

    /// Copies out a piece at a time, showing each to `seen` once copied; the caller has
    /// checked the range.
    pub(crate) fn read_with(&self, at: u64, out: &mut [u8], seen: &mut dyn FnMut(&[u8])) {
        match self {
            Self::Soft(r) => r.read_with(at, out, seen),
            Self::Verbs(r) => r.read_with(at, out, seen),
        }
    }

    /// Shows `len` bytes a piece at a time, without copying them out where the backend can;
    /// the caller has checked the range.
    pub(crate) fn inspect(&self, at: u64, len: u64, seen: &mut dyn FnMut(&[u8])) {
        match self {
            Self::Soft(r) => r.inspect(at, len, seen),
            Self::Verbs(r) => r.inspect(at, len, seen),
        }
    }

    /// Copies in; the caller has checked the range.
    pub(crate) fn write(&self, at: u64, data: &[u8]) {
        match self {
            Self::Soft(r) => r.write(at, data),
            Self::Verbs(r) => r.write(at, data),
        }
    }

    /// Deregisters, giving back the memory of `len` bytes as it was registered.
    pub(crate) fn deregister(self, len: u64) -> RegionMemory {
        match self {
            Self::Soft(r) => r.deregister(len),
            Self::Verbs(r) => r.deregister(len),
        }
    }
}
