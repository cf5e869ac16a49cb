//! A soft region: bytes the engine reaches through the region table, locked in RAM unless
//! pageable or mapped. Registering maps a dma-buf, as a CPU reaches device memory.

use std::os::fd::RawFd;
use std::sync::Arc;

use ferroce_proto::memory::{PdId, RegionId, RegionInfo, WriteOrder};

use super::driver::Driver;
use super::memory::{HostBuf, Storage};
use crate::attr::RegionAccess;
use crate::error::{memlock_error, RegionError};
use crate::memory::{MappedMemory, RegionMemory};
use crate::sys;

/// A soft region's bytes and where they came from; deregistered with its last handle.
pub(crate) struct Region {
    driver: Arc<Driver>,
    id: RegionId,
    /// `None` once deregistered.
    buf: Option<Arc<HostBuf>>,
    /// The descriptor and offset of a dma-buf region.
    dmabuf: Option<(RawFd, u64)>,
    /// Whether the bytes are locked in RAM.
    pinned: bool,
}

impl Region {
    /// Registers `memory` in the engine's table of `pd`, addressed from `iova` when given
    /// (from where its bytes are otherwise, as verbs do); returns the region and what the
    /// engine made of it (keys, address).
    pub(super) fn register(
        driver: &Arc<Driver>,
        pd: PdId,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: Option<u64>,
    ) -> Result<(Self, RegionInfo), RegionError> {
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
        // The engine reaches the bytes by region and offset, so any address will do.
        let va = iova.unwrap_or(va);
        let mut state = driver.lock();
        let info = state.engine.register(pd, va, len, access.rights(), order)?;
        state.mem.regions.insert(info.id, Arc::clone(&buf));
        drop(state);
        let region = Self {
            driver: Arc::clone(driver),
            id: info.id,
            buf: Some(buf),
            dmabuf,
            pinned,
        };
        Ok((region, info))
    }

    /// Copies out; the caller has checked the range.
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) {
        if let Some(buf) = &self.buf {
            buf.read(at, out);
        }
    }

    /// Copies out a piece at a time, showing each to `seen` once copied.
    pub(crate) fn read_with(&self, at: u64, out: &mut [u8], seen: &mut dyn FnMut(&[u8])) {
        if let Some(buf) = &self.buf {
            buf.read_with(at, out, seen);
        }
    }

    /// Shows the bytes a piece at a time without copying them out ([`HostBuf::inspect`]);
    /// the caller has checked the range.
    pub(crate) fn inspect(&self, at: u64, len: u64, seen: &mut dyn FnMut(&[u8])) {
        if let Some(buf) = &self.buf {
            buf.inspect(at, len, seen);
        }
    }

    /// Copies in; the caller has checked the range.
    pub(crate) fn write(&self, at: u64, data: &[u8]) {
        if let Some(buf) = &self.buf {
            buf.write(at, data);
        }
    }

    /// Out of the engine's table, and the memory back as it was registered.
    pub(crate) fn deregister(mut self, len: u64) -> RegionMemory {
        let dmabuf = self.dmabuf;
        match (self.release(), dmabuf) {
            (Some(Storage::Heap(bytes)), _) if self.pinned => RegionMemory::Host(bytes.into_vec()),
            (Some(Storage::Heap(bytes)), _) => RegionMemory::Pageable(bytes.into_vec()),
            (Some(Storage::Mapped(map)), None) => RegionMemory::Mapped(MappedMemory(map)),
            (_, Some((fd, offset))) => RegionMemory::Dmabuf {
                fd,
                offset,
                bytes: len,
            },
            _ => RegionMemory::Host(Vec::new()),
        }
    }

    fn release(&mut self) -> Option<Storage> {
        let buf = self.buf.take()?;
        let mut state = self.driver.lock();
        state.engine.deregister(self.id);
        state.mem.regions.remove(&self.id);
        drop(state);
        // The engine's reference is gone with the table entry; ours is the last one.
        Arc::try_unwrap(buf).ok().map(HostBuf::into_storage)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        drop(self.release());
    }
}
