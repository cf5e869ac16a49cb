//! Registered memory (seed 004, `Rig_mlx5.Region`): bytes the NIC may read and write, with the
//! access peers get and the order in which writes land.
//!
//! The region owns its bytes while registered; they are locked in RAM (`mlock`), so the
//! process's `RLIMIT_MEMLOCK` is a real limit and a refusal comes back as
//! [`RegionError::MemlockLimit`]. A dma-buf is mapped (the soft backend reaches device memory
//! as the CPU does; only a verbs backend can DMA into it directly). Peers may write at any
//! time, so the bytes are never handed out as `&[u8]`: [`Region::read`] and [`Region::write`]
//! copy, under the same lock the engine takes. [`Region::deregister`] returns the bytes once
//! nothing can touch them any more.
//!
//! [`MappedMemory`] is the one kind whose address may leave Rust: a mapping that Rust code
//! only ever copies in and out of, the way a NIC's DMA memory is used, so that C, Python or a
//! GPU kernel can read a frame where it landed.

use std::os::fd::RawFd;
use std::sync::Arc;

use ferroce_proto::memory::{Access, RegionInfo, WriteOrder};
use ferroce_proto::qp::{RemoteAddr, Sge};

use crate::soft::{HostBuf, Storage};
use crate::sys;
use crate::verbs::queue::region_access;
use crate::verbs::Mr;
use crate::Nic;

/// What peers may do to a region (seed 004's `access`: `Local`, `Remote_write`, `Remote`), and
/// through a queue pair ([`crate::ConnectOptions::access`]). The two single rights beyond the
/// seed's are what perftest's `ib_read_*` and `ib_atomic_*` grant, and no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionAccess {
    /// Peers neither read nor write (`Local`).
    Local,
    /// Peers write (`Remote_write`).
    RemoteWrite,
    /// Peers read, and nothing else.
    RemoteRead,
    /// Peers run atomics, and nothing else.
    RemoteAtomic,
    /// Peers read, write and run atomics (`Remote`).
    Remote,
}

impl RegionAccess {
    /// A region's rights: local write always, and what peers may do.
    pub(crate) fn rights(self) -> Access {
        match self {
            Self::Local => Access::LOCAL,
            Self::RemoteWrite => Access::REMOTE_WRITE_ONLY,
            Self::RemoteRead => Access::LOCAL.with(Access::REMOTE_READ),
            Self::RemoteAtomic => Access::LOCAL.with(Access::REMOTE_ATOMIC),
            Self::Remote => Access::REMOTE,
        }
    }

    /// A queue pair's rights (`qp_access_flags`): only what peers may do through it.
    pub(crate) fn qp_rights(self) -> Access {
        match self {
            Self::Local => Access::NONE,
            Self::RemoteWrite => Access::REMOTE_WRITE,
            Self::RemoteRead => Access::REMOTE_READ,
            Self::RemoteAtomic => Access::REMOTE_ATOMIC,
            Self::Remote => Access::REMOTE_WRITE
                .with(Access::REMOTE_READ)
                .with(Access::REMOTE_ATOMIC),
        }
    }
}

/// The memory to register (seed 004's `memory`).
#[derive(Debug)]
pub enum RegionMemory {
    /// Host bytes; the region owns them until [`Region::deregister`] gives them back. They
    /// are locked in RAM (`mlock`), as a NIC that DMAs into them needs.
    Host(Vec<u8>),
    /// Host bytes that stay pageable: the soft backend copies into them under a lock and
    /// needs no pinning, so large buffers (frame rings, say) work without raising
    /// `RLIMIT_MEMLOCK`. A hardware backend would refuse them.
    Pageable(Vec<u8>),
    /// `bytes` bytes at `offset` of a dma-buf a driver exported (any descriptor `mmap` can map
    /// shared, such as a memfd, works the same for the soft backend). The descriptor may be
    /// closed once `register` returns: the mapping keeps the memory.
    Dmabuf {
        /// The dma-buf's file descriptor.
        fd: RawFd,
        /// Offset into it.
        offset: u64,
        /// Length.
        bytes: u64,
    },
    /// Mapped memory whose address may be handed to code outside Rust (see [`MappedMemory`]):
    /// the soft backend copies into it without a lock and needs no pinning; a verbs device
    /// pins it as it pins any host memory. Keep a clone of the handle to reach the bytes.
    Mapped(MappedMemory),
}

impl RegionMemory {
    /// Its length in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        match self {
            Self::Host(v) | Self::Pageable(v) => v.len() as u64,
            Self::Dmabuf { bytes, .. } => *bytes,
            Self::Mapped(m) => m.len() as u64,
        }
    }

    /// Whether it has no bytes (which `Region::register` refuses).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Memory for a region ([`RegionMemory::Mapped`]) whose address may be handed to code outside
/// Rust (a C caller, a NumPy array, a DLPack consumer): fresh page-aligned zeroed memory
/// ([`MappedMemory::new`]), or memory the caller owns ([`MappedMemory::borrow`]).
///
/// This is the "DMA memory" contract. Rust never holds a reference to these bytes; the NIC
/// and every method here copy in and out through raw pointers, at any time, as a device's DMA
/// would. A foreign reader may therefore see a page change under it, or half-written, while
/// the NIC writes it: that is the reader's race to detect (the frame receiver's page epochs
/// do), not memory unsafety in Rust. The mapping stays valid, at the same address, while any
/// clone of this handle lives, even after the region is deregistered.
#[derive(Clone, Debug)]
pub struct MappedMemory(Arc<sys::Mapping>);

impl MappedMemory {
    /// Maps `len` fresh bytes (an anonymous private mapping, not locked in RAM).
    ///
    /// # Errors
    ///
    /// [`RegionError::Empty`] for no bytes; [`RegionError::Map`] when the kernel refuses the
    /// mapping (address space or overcommit limits).
    pub fn new(len: usize) -> Result<Self, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        sys::Mapping::anonymous(len)
            .map(|map| Self(Arc::new(map)))
            .map_err(|source| RegionError::Map { bytes: len, source })
    }

    /// Borrows `len` bytes at `addr` that the caller owns, as NIXL's and Mooncake's
    /// `register_memory` take a tensor's or an allocator's memory: a region registered on it
    /// is that memory, and what peers write lands there. `owner` is whatever keeps the memory
    /// allocated (a reference to the array, say); it is dropped, from whichever thread lets go
    /// last, once no handle and no region uses the memory any more.
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be readable and writable memory of this process that stays
    /// allocated, and is neither moved nor unmapped, until `owner` is dropped. Reading or
    /// writing it meanwhile from outside Rust is the caller's race with the NIC (see the type's
    /// contract), not undefined behaviour in Rust.
    ///
    /// # Errors
    ///
    /// [`RegionError::Empty`] for no bytes; [`RegionError::Map`] for a null address or a range
    /// past the end of the address space.
    #[allow(unsafe_code)]
    pub unsafe fn borrow(
        addr: u64,
        len: usize,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        // SAFETY: the caller's promise above is `Mapping::borrowed`'s precondition.
        unsafe { sys::Mapping::borrowed(addr, len, owner) }
            .map(|map| Self(Arc::new(map)))
            .map_err(|source| RegionError::Map { bytes: len, source })
    }

    /// Whether the memory is the caller's ([`MappedMemory::borrow`]).
    #[must_use]
    pub fn is_borrowed(&self) -> bool {
        self.0.is_borrowed()
    }

    /// The address of the first byte, stable for the handle's life.
    #[must_use]
    pub fn addr(&self) -> u64 {
        self.0.addr()
    }

    /// Its length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: the memory has at least one byte.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }

    /// Copies `out.len()` bytes from offset `at`.
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`] when the range runs past the end (nothing is copied).
    pub fn read(&self, at: u64, out: &mut [u8]) -> Result<(), RegionError> {
        let at = self.check(at, out.len())?;
        self.0.read(at, out);
        Ok(())
    }

    /// Copies `data` to offset `at`.
    ///
    /// # Errors
    ///
    /// As [`MappedMemory::read`].
    pub fn write(&self, at: u64, data: &[u8]) -> Result<(), RegionError> {
        let at = self.check(at, data.len())?;
        self.0.write(at, data);
        Ok(())
    }

    fn check(&self, at: u64, len: usize) -> Result<usize, RegionError> {
        usize::try_from(at)
            .ok()
            .filter(|at| at.checked_add(len).is_some_and(|end| end <= self.len()))
            .ok_or(RegionError::OutOfRange {
                at,
                len: len as u64,
                size: self.len() as u64,
            })
    }
}

/// Why a region could not be registered, used or deregistered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// The memory has no bytes (seed 004 refuses it).
    #[error("a region needs at least one byte")]
    Empty,
    /// The kernel refused to map memory for [`MappedMemory::new`].
    #[error(
        "cannot map {bytes} bytes of memory: {source} (the address space or vm.overcommit limits)"
    )]
    Map {
        /// The length asked for.
        bytes: usize,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// `mlock` refused: the process's locked-memory limit cannot hold the region.
    #[error(
        "cannot lock {bytes} bytes in memory: RLIMIT_MEMLOCK is {limit} ({reason}); raise it with \
         `ulimit -l unlimited`, a memlock line in /etc/security/limits.conf, or LimitMEMLOCK= in a \
         systemd unit"
    )]
    MemlockLimit {
        /// The region's size.
        bytes: usize,
        /// The limit, as text ("unlimited" or a byte count).
        limit: String,
        /// What the kernel said.
        reason: std::io::Error,
    },
    /// The device cannot register dma-bufs (rxe cannot; `Nic::caps().dmabuf` says so
    /// beforehand). Register host memory instead, staging through it.
    #[error("{device} cannot register dma-buf memory (no ibv_reg_dmabuf_mr in its driver or in this libibverbs); register host memory and stage through it")]
    DmabufUnsupported {
        /// The device.
        device: String,
    },
    /// A verbs device refused the registration.
    #[error("{device}: {call} refused {bytes} bytes: {source}")]
    Device {
        /// The device.
        device: String,
        /// The verb.
        call: &'static str,
        /// The region's size.
        bytes: u64,
        /// What it returned.
        source: std::io::Error,
    },
    /// The dma-buf cannot be used (the soft backend maps it; a verbs device registers it).
    #[error("cannot map dma-buf fd {fd} ({bytes} bytes at offset {offset}) for the soft backend: {reason}")]
    Dmabuf {
        /// The descriptor.
        fd: RawFd,
        /// The offset asked for.
        offset: u64,
        /// The length asked for.
        bytes: u64,
        /// Why.
        reason: String,
    },
    /// The engine refused the region.
    #[error("the NIC refused the region: {0}")]
    Refused(#[from] ferroce_proto::memory::RegisterError),
    /// A range outside the region.
    #[error("{len} bytes at offset {at} are outside the region of {size} bytes")]
    OutOfRange {
        /// The offset asked for.
        at: u64,
        /// The length asked for.
        len: u64,
        /// The region's size.
        size: u64,
    },
    /// A remote entry into a region that peers may not access.
    #[error("the region is Local: peers cannot address it")]
    NotRemote,
}

fn memlock_error(bytes: usize, reason: std::io::Error) -> RegionError {
    let limit =
        sys::memlock_limit().map_or_else(|| "unlimited".to_owned(), |l| format!("{l} bytes"));
    RegionError::MemlockLimit {
        bytes,
        limit,
        reason,
    }
}

/// A registered region. Dropping it without [`Region::deregister`] deregisters it too.
#[derive(Debug)]
pub struct Region {
    nic: Nic,
    info: RegionInfo,
    buf: Option<Arc<HostBuf>>,
    /// The descriptor and offset of a dma-buf region.
    dmabuf: Option<(RawFd, u64)>,
    /// Whether the bytes are locked in RAM.
    pinned: bool,
    /// The registration on a verbs device (which owns the host bytes).
    mr: Option<Mr>,
}

impl std::fmt::Debug for Mr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .finish_non_exhaustive()
    }
}

impl Region {
    /// Registers `memory` with `nic` for `access` and write order `order` (seed 004's
    /// `register`). Host bytes are locked in RAM. On a verbs device, `ibv_reg_mr` pins every
    /// host region, [`RegionMemory::Pageable`] included, and a dma-buf goes to
    /// `ibv_reg_dmabuf_mr`; [`WriteOrder::AnyOrder`] asks for relaxed ordering.
    ///
    /// # Errors
    ///
    /// [`RegionError::Empty`] for no bytes, [`RegionError::MemlockLimit`] when the
    /// locked-memory limit cannot hold the bytes, [`RegionError::Dmabuf`] for dma-buf memory
    /// that cannot be mapped (with the reason); on a verbs device,
    /// [`RegionError::DmabufUnsupported`] and [`RegionError::Device`].
    pub fn register(
        nic: &Nic,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
    ) -> Result<Self, RegionError> {
        if nic.verbs().is_some() {
            return Self::register_verbs(nic, access, order, memory);
        }
        let pinned = !matches!(memory, RegionMemory::Pageable(_) | RegionMemory::Mapped(_));
        let (storage, va, len, dmabuf) = match memory {
            RegionMemory::Host(bytes) | RegionMemory::Pageable(bytes) => {
                let bytes = bytes.into_boxed_slice();
                if bytes.is_empty() {
                    return Err(RegionError::Empty);
                }
                if pinned {
                    if let Err(reason) = sys::mlock(&bytes) {
                        return Err(memlock_error(bytes.len(), reason));
                    }
                }
                // Peers address the region by where its bytes are, as verbs do.
                let (va, len) = (bytes.as_ptr() as u64, bytes.len() as u64);
                (Storage::Heap(bytes), va, len, None)
            }
            RegionMemory::Dmabuf { fd, offset, bytes } => {
                let refuse = |reason: String| RegionError::Dmabuf {
                    fd,
                    offset,
                    bytes,
                    reason,
                };
                if fd < 0 {
                    return Err(refuse("the descriptor is negative".into()));
                }
                if bytes == 0 {
                    return Err(RegionError::Empty);
                }
                let len =
                    usize::try_from(bytes).map_err(|_| refuse("too large for this host".into()))?;
                // The soft backend reaches device memory by mapping it, as a CPU would.
                let map = sys::Mapping::new(fd, offset, len).map_err(|e| {
                    refuse(format!(
                        "mmap failed: {e} (is it a dma-buf its exporter lets the CPU map?)"
                    ))
                })?;
                if let Err(reason) = map.mlock() {
                    return Err(memlock_error(map.len(), reason));
                }
                let va = map.addr();
                (
                    Storage::Mapped(Arc::new(map)),
                    va,
                    bytes,
                    Some((fd, offset)),
                )
            }
            RegionMemory::Mapped(memory) => {
                let (va, len) = (memory.addr(), memory.len() as u64);
                (Storage::Mapped(memory.0), va, len, None)
            }
        };
        let buf = Arc::new(HostBuf::new(storage, pinned));
        let Some(soft) = nic.soft() else {
            return Err(RegionError::NotRemote);
        };
        let mut state = soft.shared.lock();
        let info = state
            .engine
            .register(soft.pd, va, len, access.rights(), order)?;
        state.mem.regions.insert(info.id, Arc::clone(&buf));
        Ok(Self {
            nic: nic.clone(),
            info,
            buf: Some(buf),
            dmabuf,
            pinned,
            mr: None,
        })
    }

    fn register_verbs(
        nic: &Nic,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
    ) -> Result<Self, RegionError> {
        let Some(device) = nic.verbs() else {
            return Err(RegionError::NotRemote);
        };
        let flags = region_access(access, order);
        let (mr, dmabuf) = match memory {
            RegionMemory::Host(bytes) | RegionMemory::Pageable(bytes) => {
                if bytes.is_empty() {
                    return Err(RegionError::Empty);
                }
                let len = bytes.len();
                match device.pd.reg_host(bytes.into_boxed_slice(), flags) {
                    Ok(mr) => (mr, None),
                    Err((e, _))
                        if matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EPERM))
                            && sys::memlock_limit().is_some() =>
                    {
                        return Err(memlock_error(len, e));
                    }
                    Err((source, _)) => {
                        return Err(RegionError::Device {
                            device: device.name.clone(),
                            call: "ibv_reg_mr",
                            bytes: len as u64,
                            source,
                        })
                    }
                }
            }
            RegionMemory::Mapped(memory) => {
                let len = memory.len();
                match device.pd.reg_mapped(memory.0, flags) {
                    Ok(mr) => (mr, None),
                    Err(e)
                        if matches!(e.raw_os_error(), Some(libc::ENOMEM | libc::EPERM))
                            && sys::memlock_limit().is_some() =>
                    {
                        return Err(memlock_error(len, e));
                    }
                    Err(source) => {
                        return Err(RegionError::Device {
                            device: device.name.clone(),
                            call: "ibv_reg_mr",
                            bytes: len as u64,
                            source,
                        })
                    }
                }
            }
            RegionMemory::Dmabuf { fd, offset, bytes } => {
                if bytes == 0 {
                    return Err(RegionError::Empty);
                }
                let len = usize::try_from(bytes).map_err(|_| RegionError::Dmabuf {
                    fd,
                    offset,
                    bytes,
                    reason: "too large for this host".into(),
                })?;
                // Peers address it from 0, as Hololink registers its frame memory.
                match device.pd.reg_dmabuf(fd, offset, len, 0, flags) {
                    Ok(mr) => (mr, Some((fd, offset))),
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS)
                        ) =>
                    {
                        return Err(RegionError::DmabufUnsupported {
                            device: device.name.clone(),
                        })
                    }
                    Err(source) => {
                        return Err(RegionError::Device {
                            device: device.name.clone(),
                            call: "ibv_reg_dmabuf_mr",
                            bytes,
                            source,
                        })
                    }
                }
            }
        };
        let remote = !matches!(access, RegionAccess::Local);
        let len = mr.len() as u64;
        let info = RegionInfo {
            id: ferroce_proto::memory::RegionId(0),
            pd: ferroce_proto::memory::PdId(0),
            // A dma-buf is addressed from the IOVA it was registered at (0).
            va: if dmabuf.is_some() { 0 } else { mr.addr() },
            len,
            access: access.rights(),
            order,
            lkey: mr.lkey(),
            rkey: if remote { mr.rkey() } else { 0 },
        };
        Ok(Self {
            nic: nic.clone(),
            info,
            buf: None,
            dmabuf,
            pinned: true,
            mr: Some(mr),
        })
    }

    /// Deregisters the region (seed 004's `deregister`): once this returns, the NIC reads and
    /// writes it no more, and the memory comes back as it was registered: host bytes with
    /// what peers wrote, or the dma-buf's descriptor and range (now unmapped).
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps the seed's contract for backends that can fail.
    pub fn deregister(mut self) -> Result<RegionMemory, RegionError> {
        let len = self.info.len;
        let dmabuf = self.dmabuf;
        if let Some(mr) = self.mr.take() {
            let pinned = self.pinned;
            if mr.is_mapped() {
                return Ok(mr
                    .into_mapped()
                    .map_or(RegionMemory::Host(Vec::new()), |map| {
                        RegionMemory::Mapped(MappedMemory(map))
                    }));
            }
            return Ok(match (mr.into_host(), dmabuf) {
                (Some(bytes), _) if pinned => RegionMemory::Host(bytes.into_vec()),
                (Some(bytes), _) => RegionMemory::Pageable(bytes.into_vec()),
                (None, Some((fd, offset))) => RegionMemory::Dmabuf {
                    fd,
                    offset,
                    bytes: len,
                },
                (None, None) => RegionMemory::Host(Vec::new()),
            });
        }
        Ok(match (self.release(), dmabuf) {
            (Some(Storage::Heap(bytes)), _) if self.pinned => RegionMemory::Host(bytes.into_vec()),
            (Some(Storage::Heap(bytes)), _) => RegionMemory::Pageable(bytes.into_vec()),
            (Some(Storage::Mapped(map)), None) => RegionMemory::Mapped(MappedMemory(map)),
            (_, Some((fd, offset))) => RegionMemory::Dmabuf {
                fd,
                offset,
                bytes: len,
            },
            _ => RegionMemory::Host(Vec::new()),
        })
    }

    fn release(&mut self) -> Option<Storage> {
        let buf = self.buf.take()?;
        if let Some(soft) = self.nic.soft() {
            let mut state = soft.shared.lock();
            state.engine.deregister(self.info.id);
            state.mem.regions.remove(&self.info.id);
        }
        // The engine's reference is gone with the table entry; ours is the last one.
        Arc::try_unwrap(buf).ok().map(HostBuf::into_storage)
    }

    /// The region's length in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// Always false: a region has at least one byte.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// The key peers use, 0 for a Local region.
    #[must_use]
    pub fn rkey(&self) -> u32 {
        self.info.rkey
    }

    /// The address peers and entries use for the first byte.
    #[must_use]
    pub fn va(&self) -> u64 {
        self.info.va
    }

    fn check(&self, at: u64, len: u64) -> Result<(), RegionError> {
        if at.checked_add(len).is_none_or(|end| end > self.info.len) {
            return Err(RegionError::OutOfRange {
                at,
                len,
                size: self.info.len,
            });
        }
        Ok(())
    }

    /// The `n` bytes at offset `at`, as this process's work requests name them (seed 004's
    /// `local`).
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`] when they are not all in the region.
    pub fn local(&self, at: u64, n: u32) -> Result<Sge, RegionError> {
        self.check(at, n.into())?;
        Ok(Sge {
            addr: self.info.va + at,
            len: n,
            lkey: self.info.lkey,
        })
    }

    /// Offset `at`, as a peer's work requests name it (seed 004's `remote`).
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`] when `at` is not in the region, [`RegionError::NotRemote`]
    /// for a Local region.
    pub fn remote(&self, at: u64) -> Result<RemoteAddr, RegionError> {
        if self.info.rkey == 0 {
            return Err(RegionError::NotRemote);
        }
        if at >= self.info.len {
            return Err(RegionError::OutOfRange {
                at,
                len: 1,
                size: self.info.len,
            });
        }
        Ok(RemoteAddr {
            va: self.info.va + at,
            rkey: self.info.rkey,
        })
    }

    /// Copies `out.len()` bytes from offset `at`, under the region's lock 64 KiB at a time,
    /// so arriving packets are not held up for a whole large copy. Bytes a peer writes while
    /// the copy runs may or may not be in it, as with any RDMA read of memory being written:
    /// wait for the completion that says the write is done.
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`].
    pub fn read(&self, at: u64, out: &mut [u8]) -> Result<(), RegionError> {
        self.check(at, out.len() as u64)?;
        if let Some(buf) = &self.buf {
            buf.read(at, out);
        }
        if let Some(mr) = &self.mr {
            mr.read(at as usize, out);
        }
        Ok(())
    }

    /// Copies `data` to offset `at`.
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`].
    pub fn write(&self, at: u64, data: &[u8]) -> Result<(), RegionError> {
        self.check(at, data.len() as u64)?;
        if let Some(buf) = &self.buf {
            buf.write(at, data);
        }
        if let Some(mr) = &self.mr {
            mr.write(at as usize, data);
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        drop(self.release());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Owns a buffer for a borrow and says when it is dropped.
    struct Owner {
        bytes: Box<[u8]>,
        dropped: Arc<AtomicBool>,
    }

    impl Drop for Owner {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn borrowed_memory_is_the_owners_and_the_owner_goes_with_the_last_handle() {
        let dropped = Arc::new(AtomicBool::new(false));
        let owner = Owner {
            bytes: vec![7; 4096].into_boxed_slice(),
            dropped: Arc::clone(&dropped),
        };
        let addr = owner.bytes.as_ptr() as u64;
        // SAFETY: the box is moved into the owner, not reallocated, and lives as long as it.
        let memory = unsafe { MappedMemory::borrow(addr, 4096, Box::new(owner)) }.unwrap();
        assert!(memory.is_borrowed());
        assert_eq!(memory.addr(), addr);
        memory.write(10, b"abc").unwrap();
        let mut back = [0; 5];
        memory.read(9, &mut back).unwrap();
        assert_eq!(&back, &[7, b'a', b'b', b'c', 7]);
        assert!(matches!(
            memory.read(4094, &mut back),
            Err(RegionError::OutOfRange { .. })
        ));
        let clone = memory.clone();
        drop(memory);
        assert!(!dropped.load(Ordering::SeqCst), "a handle is left");
        drop(clone);
        assert!(dropped.load(Ordering::SeqCst));
        // SAFETY: refused before anything is touched.
        let none = unsafe { MappedMemory::borrow(0, 64, Box::new(())) };
        assert!(matches!(none, Err(RegionError::Map { .. })));
        // SAFETY: as above.
        let empty = unsafe { MappedMemory::borrow(addr, 0, Box::new(())) };
        assert!(matches!(empty, Err(RegionError::Empty)));
    }
}
