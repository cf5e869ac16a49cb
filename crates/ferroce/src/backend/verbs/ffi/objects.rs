//! The handles that own what libibverbs allocates: the device context, the PD, memory
//! regions (and the host bytes they own), completion channels and CQs, and QPs, with the
//! hot-path calls through the context's ops table and the translation of ferroce's work
//! requests into `ibv_send_wr` and `ibv_recv_wr` chains.

#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_void};
use std::io;
use std::mem::size_of;
use std::os::fd::{BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, PoisonError};

use ferroce_proto::qp::{Payload, RecvWr, SendOp, SendWr};

use super::super::abi::*;
use super::library::{errno, returned, Lib};

/// An open device (`struct ibv_context`).
pub(crate) struct Context {
    pub(super) lib: &'static Lib,
    pub(super) ctx: NonNull<ibv_context>,
}

// SAFETY: libibverbs contexts may be used from any thread; ferroce reads only the
// immutable prefix (ops, fds) itself.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

/// An asynchronous event, copied out and already acknowledged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AsyncEvent {
    /// `enum ibv_event_type`.
    pub(crate) kind: c_uint,
    /// The QP, CQ or SRQ the event names, as an address to compare with a handle's
    /// [`RawQp::key`] or [`RawCq::key`]; for port events the port number.
    pub(crate) element: usize,
}

impl Context {
    pub(crate) fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open; async_fd is in its public prefix and never changes.
        unsafe { (*self.ctx.as_ptr()).async_fd }
    }

    pub(crate) fn query_device(&self) -> io::Result<ibv_device_attr> {
        let mut attr = ibv_device_attr::default();
        // SAFETY: an open context and a whole, writable ibv_device_attr.
        returned(unsafe { (self.lib.query_device)(self.ctx.as_ptr(), &mut attr) })?;
        Ok(attr)
    }

    pub(crate) fn query_port(&self, port: u8) -> io::Result<ibv_port_attr> {
        let mut attr = ibv_port_attr::default();
        // SAFETY: the buffer is larger than any release's ibv_port_attr; the compat export
        // fills its prefix.
        returned(unsafe { (self.lib.query_port)(self.ctx.as_ptr(), port, &mut attr) })?;
        Ok(attr)
    }

    /// Entry `index` of the port's GID table: `Ok(None)` for an empty slot. Without
    /// `_ibv_query_gid_ex` (rdma-core before 32) the type and interface are `None`, for the
    /// caller to read from sysfs.
    pub(crate) fn query_gid(&self, port: u8, index: u32) -> io::Result<Option<ibv_gid_entry>> {
        if let Some(query) = self.lib.query_gid_ex {
            let mut e = ibv_gid_entry::default();
            // SAFETY: an open context and a whole ibv_gid_entry, whose size is passed.
            let rc = unsafe {
                query(
                    self.ctx.as_ptr(),
                    u32::from(port),
                    index,
                    &mut e,
                    0,
                    size_of::<ibv_gid_entry>(),
                )
            };
            return match returned(rc) {
                Ok(()) => Ok(Some(e)),
                Err(err) if err.raw_os_error() == Some(libc::ENODATA) => Ok(None),
                Err(err) => Err(err),
            };
        }
        let mut gid = ibv_gid::default();
        let index_c = c_int::try_from(index).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: an open context and a 16-byte union ibv_gid.
        returned(unsafe { (self.lib.query_gid)(self.ctx.as_ptr(), port, index_c, &mut gid) })?;
        if gid.raw == [0; 16] {
            return Ok(None);
        }
        Ok(Some(ibv_gid_entry {
            gid,
            gid_index: index,
            port_num: u32::from(port),
            gid_type: u32::MAX,
            ndev_ifindex: 0,
        }))
    }

    /// The next asynchronous event, if one is waiting (the fd is non-blocking). It is
    /// acknowledged before this returns, so no destroy ever waits on it.
    pub(crate) fn next_event(&self) -> Option<AsyncEvent> {
        let mut ev = ibv_async_event::default();
        // SAFETY: an open context with a non-blocking async fd; the event is written into `ev`.
        if unsafe { (self.lib.get_async_event)(self.ctx.as_ptr(), &mut ev) } != 0 {
            return None;
        }
        let copied = AsyncEvent {
            kind: ev.event_type,
            element: ev.element as usize,
        };
        // SAFETY: the event get_async_event just returned, acknowledged once.
        unsafe { (self.lib.ack_async_event)(&mut ev) };
        Some(copied)
    }

    pub(crate) fn alloc_pd(self: &Arc<Self>) -> io::Result<Pd> {
        // SAFETY: an open context.
        let pd = unsafe { (self.lib.alloc_pd)(self.ctx.as_ptr()) };
        Ok(Pd {
            ctx: Arc::clone(self),
            pd: NonNull::new(pd).ok_or_else(errno)?,
        })
    }

    /// A CQ of at least `depth` entries with its own completion channel (non-blocking).
    pub(crate) fn create_cq(self: &Arc<Self>, depth: u32) -> io::Result<RawCq> {
        // SAFETY: an open context.
        let ch = unsafe { (self.lib.create_comp_channel)(self.ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(errno)?;
        let channel = CompChannel {
            ctx: Arc::clone(self),
            ch,
        };
        crate::sys::set_nonblocking(channel.fd())?;
        let cqe = c_int::try_from(depth.max(1)).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: an open context and its live channel; no cq_context.
        let cq = unsafe {
            (self.lib.create_cq)(self.ctx.as_ptr(), cqe, ptr::null_mut(), ch.as_ptr(), 0)
        };
        let cq = NonNull::new(cq).ok_or_else(errno)?;
        Ok(RawCq {
            channel,
            cq,
            unacked: Mutex::new(0),
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child holds an Arc to this context, so none is left.
        unsafe { (self.lib.close_device)(self.ctx.as_ptr()) };
    }
}

/// A protection domain.
pub(crate) struct Pd {
    ctx: Arc<Context>,
    pd: NonNull<c_void>,
}

// SAFETY: a PD is an opaque handle the library locks itself.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: every MR and QP of this PD holds an Arc to it, so none is left.
        unsafe { (self.ctx.lib.dealloc_pd)(self.pd.as_ptr()) };
    }
}

/// Host bytes handed to the device: DMA may write them at any time, so they are reached only
/// through raw copies, never as a Rust reference.
struct HostBytes {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the bytes are owned (a leaked Box) and only copied through raw pointers.
unsafe impl Send for HostBytes {}
// SAFETY: as above; concurrent copies are the same race any RDMA buffer has with the NIC.
unsafe impl Sync for HostBytes {}

impl HostBytes {
    fn new(bytes: Box<[u8]>) -> Self {
        let len = bytes.len();
        let ptr = NonNull::new(Box::into_raw(bytes).cast::<u8>()).unwrap_or(NonNull::dangling());
        Self { ptr, len }
    }

    fn into_box(self) -> Box<[u8]> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: ptr and len came from Box::into_raw of a boxed slice of this length, and
        // the MR that let the device write it is gone (the caller deregistered first).
        unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(this.ptr.as_ptr(), this.len)) }
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        drop(Self::into_box(Self {
            ptr: self.ptr,
            len: self.len,
        }));
    }
}

/// A memory region: registered host bytes it owns, a mapping it shares, or a range of a
/// dma-buf.
pub(crate) struct Mr {
    pd: Arc<Pd>,
    mr: Option<NonNull<ibv_mr>>,
    host: Option<HostBytes>,
    mapped: Option<Arc<crate::sys::Mapping>>,
}

// SAFETY: an MR handle is immutable once registered; see HostBytes for the bytes.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Pd {
    /// `ibv_reg_mr` of `len` bytes at `addr`, or `ibv_reg_mr_iova2` when peers and local
    /// entries are to address them from `iova` (rdma-core 29 and later).
    ///
    /// # Safety
    ///
    /// `addr..addr + len` is memory of this process that stays mapped while the MR lives.
    unsafe fn reg_mr(
        &self,
        addr: *mut c_void,
        len: usize,
        iova: Option<u64>,
        access: c_uint,
    ) -> io::Result<*mut ibv_mr> {
        match iova {
            None => {
                // SAFETY: a live PD; the caller keeps the range mapped. `ibv_reg_mr` takes the
                // access flags as an `int`: the same bits.
                Ok(unsafe { (self.ctx.lib.reg_mr)(self.pd.as_ptr(), addr, len, access as c_int) })
            }
            Some(iova) => {
                let reg = self
                    .ctx
                    .lib
                    .reg_mr_iova2
                    .ok_or_else(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
                // SAFETY: as above; the access flags are the same bits.
                Ok(unsafe { reg(self.pd.as_ptr(), addr, len, iova, access) })
            }
        }
    }

    /// Registers `bytes`, which the MR owns from now on.
    ///
    /// # Errors
    ///
    /// What `ibv_reg_mr` set errno to (ENOMEM: the locked-memory limit; EOPNOTSUPP: an IOVA
    /// and no `ibv_reg_mr_iova2`), with the bytes back.
    pub(crate) fn reg_host(
        self: &Arc<Self>,
        bytes: Box<[u8]>,
        iova: Option<u64>,
        access: c_uint,
    ) -> Result<Mr, (io::Error, Box<[u8]>)> {
        let host = HostBytes::new(bytes);
        // SAFETY: `host.len` bytes at `host.ptr` that the MR will own, so they outlive the
        // registration.
        let mr = unsafe { self.reg_mr(host.ptr.as_ptr().cast(), host.len, iova, access) };
        let mr = match mr {
            Ok(mr) => mr,
            Err(e) => return Err((e, host.into_box())),
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Mr {
                pd: Arc::clone(self),
                mr: Some(mr),
                host: Some(host),
                mapped: None,
            }),
            None => {
                let e = errno();
                Err((e, host.into_box()))
            }
        }
    }

    /// Registers `len` bytes at `offset` of dma-buf `fd`, addressed from `iova`.
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` when the library or the device has no dma-buf registration; otherwise
    /// what `ibv_reg_dmabuf_mr` set errno to.
    pub(crate) fn reg_dmabuf(
        self: &Arc<Self>,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: c_uint,
    ) -> io::Result<Mr> {
        let reg = self
            .ctx
            .lib
            .reg_dmabuf_mr
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
        // SAFETY: a live PD; the kernel checks the descriptor and the range itself and takes
        // its own reference to the dma-buf.
        let mr = unsafe { reg(self.pd.as_ptr(), offset, len, iova, fd, access as c_int) };
        Ok(Mr {
            pd: Arc::clone(self),
            mr: Some(NonNull::new(mr).ok_or_else(errno)?),
            host: None,
            mapped: None,
        })
    }

    /// Registers a mapping the MR shares with whoever else holds it (the region's
    /// `MappedMemory`), which stays mapped at least as long as the MR.
    ///
    /// # Errors
    ///
    /// What `ibv_reg_mr` set errno to (ENOMEM: the locked-memory limit).
    pub(crate) fn reg_mapped(
        self: &Arc<Self>,
        map: Arc<crate::sys::Mapping>,
        iova: Option<u64>,
        access: c_uint,
    ) -> io::Result<Mr> {
        // SAFETY: `map.len()` mapped bytes at `map.addr()`, kept mapped by the Arc the MR
        // holds until after it deregisters (see Drop).
        let mr = unsafe { self.reg_mr(map.addr() as *mut c_void, map.len(), iova, access)? };
        Ok(Mr {
            pd: Arc::clone(self),
            mr: Some(NonNull::new(mr).ok_or_else(errno)?),
            host: None,
            mapped: Some(map),
        })
    }

    /// A QP on `send` and `recv`; `caps` is read back as the device granted it.
    pub(crate) fn create_qp(
        self: &Arc<Self>,
        qp_type: c_uint,
        send: &Arc<RawCq>,
        recv: &Arc<RawCq>,
        sq_sig_all: bool,
        caps: &mut ibv_qp_cap,
    ) -> io::Result<RawQp> {
        let mut init = ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: send.cq.as_ptr(),
            recv_cq: recv.cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: *caps,
            qp_type,
            sq_sig_all: c_int::from(sq_sig_all),
        };
        // SAFETY: a live PD, live CQs of the same context, and a whole init attr that the
        // call updates with the granted capacities.
        let qp = unsafe { (self.ctx.lib.create_qp)(self.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(errno)?;
        *caps = init.cap;
        Ok(RawQp {
            pd: Arc::clone(self),
            qp,
            _send: Arc::clone(send),
            _recv: Arc::clone(recv),
            scratch: Mutex::new(Scratch::default()),
        })
    }
}

impl Mr {
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: a registered MR; lkey is in its public prefix and never changes.
        self.mr.map_or(0, |mr| unsafe { (*mr.as_ptr()).lkey })
    }

    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as for `lkey`.
        self.mr.map_or(0, |mr| unsafe { (*mr.as_ptr()).rkey })
    }

    /// The registered length.
    pub(crate) fn len(&self) -> usize {
        // SAFETY: as for `lkey`.
        self.mr.map_or(0, |mr| unsafe { (*mr.as_ptr()).length })
    }

    /// The address work requests name the first byte by.
    pub(crate) fn addr(&self) -> u64 {
        // SAFETY: as for `lkey`.
        self.mr
            .map_or(0, |mr| unsafe { (*mr.as_ptr()).addr } as u64)
    }

    /// Copies `out.len()` bytes from `at` of the host bytes; the caller checked the range.
    pub(crate) fn read(&self, at: usize, out: &mut [u8]) {
        if let Some(map) = &self.mapped {
            map.read(at, out);
        }
        if let Some(h) = &self.host {
            if at.checked_add(out.len()).is_some_and(|end| end <= h.len) {
                // SAFETY: the range is inside the owned allocation; `out` is a distinct
                // Rust buffer.
                unsafe {
                    ptr::copy_nonoverlapping(h.ptr.as_ptr().add(at), out.as_mut_ptr(), out.len());
                }
            }
        }
    }

    /// Copies `data` to `at` of the host bytes; the caller checked the range.
    pub(crate) fn write(&self, at: usize, data: &[u8]) {
        if let Some(map) = &self.mapped {
            map.write(at, data);
        }
        if let Some(h) = &self.host {
            if at.checked_add(data.len()).is_some_and(|end| end <= h.len) {
                // SAFETY: as for `read`.
                unsafe {
                    ptr::copy_nonoverlapping(data.as_ptr(), h.ptr.as_ptr().add(at), data.len());
                }
            }
        }
    }

    fn deregister(&mut self) {
        if let Some(mr) = self.mr.take() {
            // SAFETY: registered once, deregistered once.
            unsafe { (self.pd.ctx.lib.dereg_mr)(mr.as_ptr()) };
        }
    }

    /// Deregisters, then gives the host bytes back (with what peers wrote).
    pub(crate) fn into_host(mut self) -> Option<Box<[u8]>> {
        self.deregister();
        self.host.take().map(HostBytes::into_box)
    }

    /// Whether the MR shares a mapping (rather than owning bytes or naming a dma-buf).
    pub(crate) fn is_mapped(&self) -> bool {
        self.mapped.is_some()
    }

    /// Deregisters, then gives the shared mapping back.
    pub(crate) fn into_mapped(mut self) -> Option<Arc<crate::sys::Mapping>> {
        self.deregister();
        self.mapped.take()
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Deregister before the bytes (dropped after this) are freed.
        self.deregister();
    }
}

/// A completion channel.
struct CompChannel {
    ctx: Arc<Context>,
    ch: NonNull<ibv_comp_channel>,
}

impl CompChannel {
    fn fd(&self) -> RawFd {
        // SAFETY: a live channel; fd is in its public prefix.
        unsafe { (*self.ch.as_ptr()).fd }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the CQ on this channel was destroyed first (RawCq's field order).
        unsafe { (self.ctx.lib.destroy_comp_channel)(self.ch.as_ptr()) };
    }
}

/// A CQ with its completion channel.
pub(crate) struct RawCq {
    cq: NonNull<ibv_cq>,
    /// CQ events read but not yet acknowledged; all are acked before destroy.
    unacked: Mutex<c_uint>,
    // Dropped after the CQ (fields drop in order, and Drop below destroys the CQ first).
    channel: CompChannel,
}

// SAFETY: the provider locks its CQ; `unacked` is behind a mutex.
unsafe impl Send for RawCq {}
// SAFETY: as above.
unsafe impl Sync for RawCq {}

impl RawCq {
    /// Polls up to `wcs.len()` completions (one indirect call through the ops table).
    pub(crate) fn poll(&self, wcs: &mut [ibv_wc]) -> io::Result<usize> {
        let n = c_int::try_from(wcs.len()).unwrap_or(c_int::MAX);
        // SAFETY: the context of a live CQ; ops are filled by every provider (verbs_set_ops
        // plugs holes with EOPNOTSUPP stubs), so the pointer is not NULL in practice; a NULL
        // is an error rather than a call.
        let poll_cq = unsafe { (*(*self.cq.as_ptr()).context).ops.poll_cq }
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOSYS))?;
        // SAFETY: a live CQ and `n` writable ibv_wc of the exact layout.
        let rc = unsafe { poll_cq(self.cq.as_ptr(), n, wcs.as_mut_ptr()) };
        usize::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EIO))
    }

    /// Arms the CQ: the next completion writes an event to the channel.
    pub(crate) fn arm(&self) -> io::Result<()> {
        self.arm_for(false)
    }

    /// `ibv_req_notify_cq`: the channel gets an event at the next completion, or with
    /// `solicited_only` the next solicited or failed one.
    pub(crate) fn arm_for(&self, solicited_only: bool) -> io::Result<()> {
        // SAFETY: as for `poll`.
        let notify = unsafe { (*(*self.cq.as_ptr()).context).ops.req_notify_cq }
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOSYS))?;
        // SAFETY: a live CQ; the flag is verbs' `solicited_only`.
        returned(unsafe { notify(self.cq.as_ptr(), c_int::from(solicited_only)) })
    }

    /// The channel's descriptor (non-blocking), to wait on with poll(2).
    pub(crate) fn fd(&self) -> RawFd {
        self.channel.fd()
    }

    /// The channel's descriptor, borrowed for as long as the CQ lives.
    pub(crate) fn channel_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel owns the descriptor and outlives this borrow of the CQ, which
        // holds the channel until it is dropped.
        unsafe { BorrowedFd::borrow_raw(self.channel.fd()) }
    }

    /// Reads the channel's pending events; returns how many there were. Acknowledged in
    /// batches, and all before destroy.
    pub(crate) fn take_events(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: a live, non-blocking channel; the call writes the two out pointers.
            let rc = unsafe {
                (self.channel.ctx.lib.get_cq_event)(self.channel.ch.as_ptr(), &mut cq, &mut cq_ctx)
            };
            if rc != 0 {
                break;
            }
            n += 1;
        }
        if n > 0 {
            let mut unacked = self.unacked.lock().unwrap_or_else(PoisonError::into_inner);
            *unacked += n as c_uint;
            if *unacked >= 64 {
                // SAFETY: a live CQ; acknowledges events that were read from its channel.
                unsafe { (self.channel.ctx.lib.ack_cq_events)(self.cq.as_ptr(), *unacked) };
                *unacked = 0;
            }
        }
        n
    }

    /// The entries the device granted.
    pub(crate) fn cqe(&self) -> u32 {
        // SAFETY: a live CQ; cqe is in its public prefix (updated by resize under our lock).
        u32::try_from(unsafe { (*self.cq.as_ptr()).cqe }).unwrap_or(0)
    }

    /// Grows the CQ to at least `depth` entries.
    pub(crate) fn resize(&self, depth: u32) -> io::Result<()> {
        let cqe = c_int::try_from(depth).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a live CQ.
        returned(unsafe { (self.channel.ctx.lib.resize_cq)(self.cq.as_ptr(), cqe) })
    }

    /// An address that names this CQ in async events.
    pub(crate) fn key(&self) -> usize {
        self.cq.as_ptr() as usize
    }
}

impl Drop for RawCq {
    fn drop(&mut self) {
        let lib = self.channel.ctx.lib;
        let unacked = *self
            .unacked
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        // SAFETY: a live CQ whose QPs are gone (each holds an Arc to it); every event read
        // is acknowledged, then the CQ destroyed once.
        unsafe {
            if unacked > 0 {
                (lib.ack_cq_events)(self.cq.as_ptr(), unacked);
            }
            (lib.destroy_cq)(self.cq.as_ptr());
        }
    }
}

/// Reused per-QP room to build work-request chains without allocating once warm.
#[derive(Default)]
struct Scratch {
    send: Vec<ibv_send_wr>,
    recv: Vec<ibv_recv_wr>,
    sges: Vec<ibv_sge>,
}

/// A queue pair.
pub(crate) struct RawQp {
    pd: Arc<Pd>,
    qp: NonNull<ibv_qp>,
    _send: Arc<RawCq>,
    _recv: Arc<RawCq>,
    scratch: Mutex<Scratch>,
}

// SAFETY: providers lock their QPs; the scratch is behind a mutex.
unsafe impl Send for RawQp {}
// SAFETY: as above.
unsafe impl Sync for RawQp {}

/// Gather entries a single post keeps on the stack; longer lists take the chain's way.
const STACK_SGES: usize = 4;

/// A work request that chains to the next through `next`.
trait Chained: Sized {
    fn set_next(&mut self, next: *mut Self);
}

impl Chained for ibv_send_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

impl Chained for ibv_recv_wr {
    fn set_next(&mut self, next: *mut Self) {
        self.next = next;
    }
}

/// Links `chain` in order (the last `next` stays NULL) and returns its head. `chain` must not
/// move or grow until the post that reads it has returned.
fn link<T: Chained>(chain: &mut [T]) -> *mut T {
    let base = chain.as_mut_ptr();
    for i in 1..chain.len() {
        // SAFETY: `i - 1` and `i` are indices of `chain`, and no reference into it is live
        // while the pointers taken from its base are written through.
        unsafe { (*base.add(i - 1)).set_next(base.add(i)) };
    }
    base
}

/// A post's result: `Ok` for 0; else the index of the request `bad` names in `chain` (0 when
/// the provider left it NULL) and the errno.
fn refused_at<T>(rc: c_int, bad: *mut T, chain: &[T]) -> Result<(), PostFailure> {
    if rc == 0 {
        return Ok(());
    }
    let base = chain.as_ptr() as usize;
    let at = (bad as usize).wrapping_sub(base) / size_of::<T>().max(1);
    let index = if bad.is_null() || at >= chain.len() {
        0
    } else {
        at
    };
    let errno = returned(rc)
        .err()
        .unwrap_or_else(|| io::ErrorKind::Other.into());
    Err((index, errno))
}

/// How a post failed: the index of the first request not posted and the errno.
pub(crate) type PostFailure = (usize, io::Error);

fn sge_of(s: &ferroce_proto::qp::Sge) -> ibv_sge {
    ibv_sge {
        addr: s.addr,
        length: s.len,
        lkey: s.lkey,
    }
}

/// The opcode, flags and `wr` union of one send request.
fn send_header(wr: &SendWr) -> (c_uint, c_uint, u32, [u64; 4]) {
    let mut flags = 0;
    if wr.signaled {
        flags |= IBV_SEND_SIGNALED;
    }
    if wr.fence {
        flags |= IBV_SEND_FENCE;
    }
    if wr.solicited {
        flags |= IBV_SEND_SOLICITED;
    }
    if matches!(wr.local, Payload::Inline(_)) {
        flags |= IBV_SEND_INLINE;
    }
    let rdma = |r: &ferroce_proto::qp::RemoteAddr| [r.va, u64::from(r.rkey), 0, 0];
    let (opcode, imm, words) = match &wr.op {
        SendOp::Send => (IBV_WR_SEND, 0, [0; 4]),
        SendOp::SendWithImm(imm) => (IBV_WR_SEND_WITH_IMM, imm.to_be(), [0; 4]),
        SendOp::Write(r) => (IBV_WR_RDMA_WRITE, 0, rdma(r)),
        SendOp::WriteWithImm(r, imm) => (IBV_WR_RDMA_WRITE_WITH_IMM, imm.to_be(), rdma(r)),
        SendOp::Read(r) => (IBV_WR_RDMA_READ, 0, rdma(r)),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => (
            IBV_WR_ATOMIC_CMP_AND_SWP,
            0,
            [remote.va, *compare, *swap, u64::from(remote.rkey)],
        ),
        SendOp::FetchAdd { remote, add } => (
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            0,
            [remote.va, *add, 0, u64::from(remote.rkey)],
        ),
    };
    (opcode, flags, imm, words)
}

impl RawQp {
    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: a live QP; qp_num is in its public prefix and never changes.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// An address that names this QP in async events.
    pub(crate) fn key(&self) -> usize {
        self.qp.as_ptr() as usize
    }

    /// `ibv_modify_qp` with `attr` and `mask`.
    pub(crate) fn modify(&self, attr: &ibv_qp_attr, mask: c_int) -> io::Result<()> {
        let mut attr = *attr;
        // SAFETY: a live QP and a whole attr; the library only reads the fields in `mask`.
        returned(unsafe { (self.pd.ctx.lib.modify_qp)(self.qp.as_ptr(), &mut attr, mask) })
    }

    /// Posts one request with its gather list on the stack: no lock, no scratch, what C's
    /// `ibv_post_send` of a single request costs plus the translation. A list longer than
    /// [`STACK_SGES`] goes the way of a chain.
    pub(crate) fn post_send_one(&self, wr: &SendWr) -> io::Result<()> {
        let mut sges = [ibv_sge::default(); STACK_SGES];
        let n = match &wr.local {
            Payload::Sge(s) => {
                sges[0] = sge_of(s);
                1
            }
            Payload::Inline(bytes) => {
                sges[0] = ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: bytes.len() as u32,
                    lkey: 0,
                };
                1
            }
            Payload::Sges(list) if list.len() <= STACK_SGES => {
                for (d, s) in sges.iter_mut().zip(list) {
                    *d = sge_of(s);
                }
                list.len()
            }
            Payload::Sges(_) => {
                return self.post_send(std::slice::from_ref(wr)).map_err(|(_, e)| e)
            }
        };
        let (opcode, send_flags, imm_data, words) = send_header(wr);
        let mut one = ibv_send_wr {
            wr_id: wr.wr_id,
            sg_list: if n == 0 {
                ptr::null_mut()
            } else {
                sges.as_mut_ptr()
            },
            num_sge: n as c_int,
            opcode,
            send_flags,
            imm_data,
            wr: words,
            ..ibv_send_wr::default()
        };
        // SAFETY: as for RawCq::poll.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_send }
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOSYS))?;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: a live QP and one request (next NULL) whose gather list is `sges` on this
        // stack frame, or inline bytes `wr` keeps alive for the call.
        returned(unsafe { post(self.qp.as_ptr(), &mut one, &mut bad) })
    }

    /// Posts `wrs` as one chain (`ibv_post_send` with `next` links). Inline payloads are
    /// copied by the provider during the call, so they only need to live until it returns.
    pub(crate) fn post_send(&self, wrs: &[SendWr]) -> Result<(), PostFailure> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut guard = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        let Scratch { send, sges, .. } = &mut *guard;
        send.clear();
        sges.clear();
        // First every gather entry, so `sges` does not move once pointers into it are taken.
        for wr in wrs {
            match &wr.local {
                Payload::Sge(s) => sges.push(sge_of(s)),
                Payload::Sges(list) => sges.extend(list.iter().map(sge_of)),
                Payload::Inline(bytes) => sges.push(ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: bytes.len() as u32,
                    lkey: 0,
                }),
            }
        }
        let mut at = 0;
        for wr in wrs {
            let n = match &wr.local {
                Payload::Sges(list) => list.len(),
                Payload::Sge(_) | Payload::Inline(_) => 1,
            };
            let (opcode, send_flags, imm_data, words) = send_header(wr);
            let sg_list = if n == 0 {
                ptr::null_mut()
            } else {
                // SAFETY: `at + n <= sges.len()`: the entries pushed above, in this order.
                unsafe { sges.as_mut_ptr().add(at) }
            };
            send.push(ibv_send_wr {
                wr_id: wr.wr_id,
                sg_list,
                num_sge: n as c_int,
                opcode,
                send_flags,
                imm_data,
                wr: words,
                ..ibv_send_wr::default()
            });
            at += n;
        }
        let base = link(send);
        // SAFETY: as for RawCq::poll.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_send }
            .ok_or((0, io::Error::from_raw_os_error(libc::ENOSYS)))?;
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: a live QP and a NULL-terminated chain of requests whose gather lists point
        // into `sges` and at inline bytes the caller's `wrs` keep alive for the call.
        let rc = unsafe { post(self.qp.as_ptr(), base, &mut bad) };
        refused_at(rc, bad, send)
    }

    /// Posts `wrs` as one chain (`ibv_post_recv`); an empty scatter list is allowed (WRITE
    /// with immediate needs no buffer).
    pub(crate) fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), PostFailure> {
        if wrs.is_empty() {
            return Ok(());
        }
        let mut guard = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        let Scratch { recv, sges, .. } = &mut *guard;
        recv.clear();
        sges.clear();
        for wr in wrs {
            sges.extend(wr.sges.iter().map(sge_of));
        }
        let mut at = 0;
        for wr in wrs {
            let n = wr.sges.len();
            let sg_list = if n == 0 {
                ptr::null_mut()
            } else {
                // SAFETY: as in post_send.
                unsafe { sges.as_mut_ptr().add(at) }
            };
            recv.push(ibv_recv_wr {
                wr_id: wr.wr_id,
                next: ptr::null_mut(),
                sg_list,
                num_sge: n as c_int,
            });
            at += n;
        }
        let base = link(recv);
        // SAFETY: as for RawCq::poll.
        let post = unsafe { (*(*self.qp.as_ptr()).context).ops.post_recv }
            .ok_or((0, io::Error::from_raw_os_error(libc::ENOSYS)))?;
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: a live QP and a NULL-terminated chain whose scatter lists are in `sges`.
        let rc = unsafe { post(self.qp.as_ptr(), base, &mut bad) };
        refused_at(rc, bad, recv)
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: a live QP, destroyed once; its CQs and PD outlive it (Arcs held here).
        unsafe { (self.pd.ctx.lib.destroy_qp)(self.qp.as_ptr()) };
    }
}

/// What looking for a device by name found.
pub(crate) enum Opened {
    /// The device, open.
    Context(Context),
    /// No device has the name; these are the names there are.
    NotFound(Vec<String>),
    /// The device is there but would not open (`ibv_open_device` set this errno).
    Refused(io::Error),
}

impl Lib {
    /// Opens the device called `name`, from one look at the device list.
    ///
    /// # Errors
    ///
    /// As for the device list (ENOSYS: no RDMA in the kernel); a device that is there but
    /// does not open is [`Opened::Refused`].
    pub(crate) fn open(&'static self, name: &str) -> io::Result<Opened> {
        let opened = self.with_devices(|devices| {
            let Some(&(dev, _)) = devices.iter().find(|(_, n)| n == name) else {
                return Err(devices.iter().map(|(_, n)| n.clone()).collect());
            };
            // SAFETY: a device of the live list, opened before the list is freed.
            let ctx = unsafe { (self.open_device)(dev) };
            Ok(NonNull::new(ctx).ok_or_else(errno))
        })?;
        Ok(match opened {
            Err(names) => Opened::NotFound(names),
            Ok(Err(e)) => Opened::Refused(e),
            Ok(Ok(ctx)) => {
                let context = Context { lib: self, ctx };
                match crate::sys::set_nonblocking(context.async_fd()) {
                    Ok(()) => Opened::Context(context),
                    Err(e) => Opened::Refused(e),
                }
            }
        })
    }
}
