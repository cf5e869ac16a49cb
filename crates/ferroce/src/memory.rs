//! The memory a region is registered on ([`RegionMemory`]), and [`MappedMemory`], the one kind
//! whose address may leave Rust. Data for the API and both backends: no backend is named here;
//! also the piece a long read handles at a time ([`PIECE`], [`show_copied`]).

use std::os::fd::RawFd;
use std::sync::Arc;

use crate::error::RegionError;
use crate::sys;

/// The memory to register (Rig_mlx5's `Region.register` `memory`).
#[derive(Debug)]
pub enum RegionMemory {
    /// Host bytes; the region owns them until [`Region::deregister`](crate::Region::deregister)
    /// gives them back. They are locked in RAM (`mlock`), as a NIC that DMAs into them needs.
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
pub struct MappedMemory(pub(crate) Arc<sys::Mapping>);

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

/// The bytes a long read or look at memory handles at a time: small enough to stay in the
/// cache between being copied and being looked at, and on the soft NIC the most a region's
/// lock is held for.
pub(crate) const PIECE: usize = 64 * 1024;

/// Shows `len` bytes to `seen` a [`PIECE`] at a time, each copied by `read(offset, piece)`
/// into one buffer of one piece first: for memory that may change under a `&[u8]` (a
/// mapping, a device's), so that a look costs one read of memory and no write of it.
/// Stops at the first read that fails.
pub(crate) fn show_copied<E>(
    len: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> Result<(), E>,
    seen: &mut dyn FnMut(&[u8]),
) -> Result<(), E> {
    let mut piece = vec![0; usize::try_from(len).map_or(PIECE, |len| len.min(PIECE))];
    let mut done = 0;
    while done < len {
        let n = usize::try_from(len - done).map_or(PIECE, |left| left.min(PIECE));
        let piece = &mut piece[..n];
        read(done, piece)?;
        seen(piece);
        done += n as u64;
    }
    Ok(())
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
