//! The bytes of the soft NIC's regions: host memory or a mapping ([`Storage`]), reached only
//! under a lock ([`HostBuf`]), by copying or by a look that ends with the lock, and the
//! engine's view of them all ([`HostMemory`]).

use std::cell::Cell;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferroce_proto::memory::{AtomicOp, Memory, RegionId};
use rustc_hash::FxHashMap;

use crate::memory::{show_copied, PIECE};
use crate::sys;

/// Where a region's bytes live.
#[derive(Debug)]
pub(crate) enum Storage {
    /// Host memory the region owns.
    Heap(Box<[u8]>),
    /// A shared mapping of a dma-buf (or any mappable descriptor).
    Mapped(Arc<sys::Mapping>),
}

impl Storage {
    fn read(&self, at: usize, out: &mut [u8]) {
        match self {
            Self::Heap(bytes) => {
                if let Some(src) = at.checked_add(out.len()).and_then(|end| bytes.get(at..end)) {
                    out.copy_from_slice(src);
                }
            }
            Self::Mapped(map) => map.read(at, out),
        }
    }

    fn write(&mut self, at: usize, data: &[u8]) {
        match self {
            Self::Heap(bytes) => {
                if let Some(dst) = at
                    .checked_add(data.len())
                    .and_then(|end| bytes.get_mut(at..end))
                {
                    dst.copy_from_slice(data);
                }
            }
            Self::Mapped(map) => map.write(at, data),
        }
    }
}

/// The bytes of one region, shared by the application's handle and the engine. They are only
/// ever reached through this lock, by copying: never as a `&[u8]` a peer could change.
#[derive(Debug)]
pub(crate) struct HostBuf {
    storage: Mutex<Storage>,
    locked: bool,
}

impl HostBuf {
    pub(crate) fn new(storage: Storage, locked: bool) -> Self {
        Self {
            storage: Mutex::new(storage),
            locked,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Storage> {
        // A std mutex taken again by the thread that holds it deadlocks: say why instead.
        assert!(
            INSPECTING.get() != self.id(),
            "a region was used, or its NIC polled, from inside its own inspect: \
             the region's lock is held while the bytes are shown"
        );
        self.storage.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This buffer's identity for [`INSPECTING`]: its address.
    fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Copies `out.len()` bytes from offset `at`; the caller has checked the range. A long
    /// copy takes the lock a piece at a time, so the engine's writes of arriving packets
    /// wait microseconds, not the milliseconds a whole frame takes; each piece (and so each
    /// packet's placement) is still seen whole.
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) {
        self.read_with(at, out, &mut |_| {});
    }

    /// [`HostBuf::read`], showing each piece to `seen` once it is copied, out of the lock
    /// and while it is still in the cache.
    pub(crate) fn read_with(&self, at: u64, out: &mut [u8], seen: &mut dyn FnMut(&[u8])) {
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        for (i, piece) in out.chunks_mut(PIECE).enumerate() {
            self.lock().read(at.saturating_add(i * PIECE), piece);
            seen(piece);
        }
    }

    /// Shows `len` bytes from offset `at` to `seen`, a piece at a time; the caller has
    /// checked the range. Host memory's pieces are shown where they lie, under the lock, so
    /// that a piece is seen whole and the engine's writes wait for no more than one piece's
    /// look. A mapping is shared with a device or another process, so never shown as a
    /// `&[u8]`: each piece is copied out under the lock into a buffer of one piece, which
    /// stays in the cache, and shown after.
    ///
    /// # Panics
    ///
    /// When `seen`, shown host memory, uses this buffer (a region call, a poll of the NIC
    /// that lands a packet in it): the lock it is shown under would deadlock.
    pub(crate) fn inspect(&self, at: u64, len: u64, seen: &mut dyn FnMut(&[u8])) {
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        // A buffer's storage is one kind for its life.
        if matches!(*self.lock(), Storage::Mapped(_)) {
            let read = |off, piece: &mut [u8]| {
                let off = usize::try_from(off).unwrap_or(usize::MAX);
                self.lock().read(at.saturating_add(off), piece);
                Ok::<_, std::convert::Infallible>(())
            };
            let Ok(()) = show_copied(len, read, seen);
            return;
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(PIECE);
            let storage = self.lock();
            let _mark = Inspecting::mark(self.id());
            let start = at.saturating_add(done);
            if let (Storage::Heap(bytes), Some(end)) = (&*storage, start.checked_add(n)) {
                if let Some(piece) = bytes.get(start..end) {
                    seen(piece);
                }
            }
            done += n;
        }
    }

    /// Copies `data` to offset `at`; the caller has checked the range. Long copies go a
    /// piece at a time, as reads do.
    pub(crate) fn write(&self, at: u64, data: &[u8]) {
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        for (i, piece) in data.chunks(PIECE).enumerate() {
            self.lock().write(at.saturating_add(i * PIECE), piece);
        }
    }

    /// Applies an atomic operation to the 8 bytes at `at`, under the lock.
    fn atomic(&self, at: u64, op: AtomicOp) -> u64 {
        let at = usize::try_from(at).unwrap_or(usize::MAX);
        let mut storage = self.lock();
        let mut word = [0; 8];
        storage.read(at, &mut word);
        let old = u64::from_ne_bytes(word);
        storage.write(at, &op.apply(old).to_ne_bytes());
        old
    }

    /// Gives the storage back, unlocked from RAM (a mapping is unmapped when dropped).
    pub(crate) fn into_storage(self) -> Storage {
        let storage = self
            .storage
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        if let (true, Storage::Heap(bytes)) = (self.locked, &storage) {
            sys::munlock(bytes);
        }
        storage
    }
}

thread_local! {
    /// The [`HostBuf`] whose lock this thread holds while [`HostBuf::inspect`] shows its bytes
    /// (its address; 0 when none), so that taking that lock again panics with a reason.
    static INSPECTING: Cell<usize> = const { Cell::new(0) };
}

/// Marks this thread as inside an inspect of one buffer until dropped, even when `seen`
/// panics (a C caller's panic is caught, and the thread goes on).
struct Inspecting {
    outer: usize,
}

impl Inspecting {
    fn mark(id: usize) -> Self {
        Self {
            outer: INSPECTING.replace(id),
        }
    }
}

impl Drop for Inspecting {
    fn drop(&mut self) {
        INSPECTING.set(self.outer);
    }
}

/// The engine's view of the NIC's regions.
#[derive(Debug, Default)]
pub(crate) struct HostMemory {
    pub(crate) regions: FxHashMap<RegionId, Arc<HostBuf>>,
}

impl Memory for HostMemory {
    fn read(&self, region: RegionId, offset: u64, out: &mut [u8]) {
        if let Some(buf) = self.regions.get(&region) {
            buf.read(offset, out);
        }
    }

    fn write(&mut self, region: RegionId, offset: u64, data: &[u8]) {
        if let Some(buf) = self.regions.get(&region) {
            buf.write(offset, data);
        }
    }

    fn atomic(&mut self, region: RegionId, offset: u64, op: AtomicOp) -> u64 {
        self.regions
            .get(&region)
            .map_or(0, |buf| buf.atomic(offset, op))
    }
}
