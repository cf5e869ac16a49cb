//! The bytes of the soft NIC's regions: host memory or a mapping ([`Storage`]), reached only
//! under a lock ([`HostBuf`]), by copying or by a look that ends with the lock, and the
//! engine's view of them all ([`HostMemory`]), which lends one region's bytes to the kernel
//! while a batch of packets is built and sent ([`Lender`]).

use std::cell::{Cell, RefCell};
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

    /// Applies an atomic operation to the 8 bytes at `at`; the caller holds the lock.
    fn atomic(&mut self, at: usize, op: AtomicOp) -> u64 {
        let mut word = [0; 8];
        self.read(at, &mut word);
        let old = u64::from_ne_bytes(word);
        self.write(at, &op.apply(old).to_ne_bytes());
        old
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
        self.lock()
            .atomic(usize::try_from(at).unwrap_or(usize::MAX), op)
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

/// The engine's view of the regions while the driver fills one batch of packets: as
/// [`HostMemory`], and lending payloads of [`LEND_MIN`] bytes or more from one region of host
/// memory, the first a packet asks for, to the batch ([`Memory::can_lend`]), which then leaves
/// with that region's bytes ([`Lender::send`]): the kernel copies them from the region, with
/// no copy into the batch first. That region stays locked from the first lent payload until
/// the batch has left, so the ICRCs and the kernel's copies see the same bytes; an
/// application that writes it meanwhile waits for the send.
pub(crate) struct Lender<'a> {
    mem: &'a HostMemory,
    lent: RefCell<Option<(RegionId, MutexGuard<'a, Storage>)>>,
}

/// The smallest payload lent: a smaller one is copied, so that the latency-bound exchanges
/// of small messages (8-64 B ping-pongs, the session) keep a packet written whole and its
/// plain `sendto`. Lending a lone 1 KiB or 4 KiB packet measured within the noise of copying
/// it (BENCHMARKS.md, the data path's twentieth step).
pub(crate) const LEND_MIN: usize = 512;

impl<'a> Lender<'a> {
    pub(crate) fn new(mem: &'a HostMemory) -> Self {
        Self {
            mem,
            lent: RefCell::new(None),
        }
    }

    /// Runs `f` (the batch's send) with the lent region's bytes, under its lock, or with none
    /// when nothing was lent, then unlocks it: the next batch may borrow from another region.
    pub(crate) fn send<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self.lent.take() {
            Some((_, storage)) => match &*storage {
                Storage::Heap(bytes) => f(bytes),
                Storage::Mapped(_) => f(&[]),
            },
            None => f(&[]),
        }
    }

    /// Runs `f` on the lent region's storage when `region` is it.
    fn with_lent<R>(&self, region: RegionId, f: impl FnOnce(&mut Storage) -> R) -> Option<R> {
        match &mut *self.lent.borrow_mut() {
            Some((lent, storage)) if *lent == region => Some(f(storage)),
            _ => None,
        }
    }
}

/// The lent region through the lock the lender holds (taking it again would deadlock), any
/// other as [`HostMemory`] reaches it.
impl Memory for Lender<'_> {
    fn read(&self, region: RegionId, offset: u64, out: &mut [u8]) {
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if self.with_lent(region, |s| s.read(at, out)).is_none() {
            self.mem.read(region, offset, out);
        }
    }

    fn write(&mut self, region: RegionId, offset: u64, data: &[u8]) {
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if self.with_lent(region, |s| s.write(at, data)).is_none() {
            if let Some(buf) = self.mem.regions.get(&region) {
                buf.write(offset, data);
            }
        }
    }

    fn atomic(&mut self, region: RegionId, offset: u64, op: AtomicOp) -> u64 {
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        self.with_lent(region, |s| s.atomic(at, op))
            .unwrap_or_else(|| {
                self.mem
                    .regions
                    .get(&region)
                    .map_or(0, |buf| buf.atomic(offset, op))
            })
    }

    fn can_lend(&self, region: RegionId, offset: u64, len: usize) -> bool {
        // A batch's packets name their bodies by 32-bit offsets into the bytes sent with it.
        if len < LEND_MIN || offset.saturating_add(len as u64) > u64::from(u32::MAX) {
            return false;
        }
        let mut lent = self.lent.borrow_mut();
        if let Some((r, _)) = &*lent {
            return *r == region;
        }
        let Some(buf) = self.mem.regions.get(&region) else {
            return false;
        };
        let storage = buf.lock();
        if !matches!(*storage, Storage::Heap(_)) {
            return false;
        }
        *lent = Some((region, storage));
        true
    }

    fn look(&self, region: RegionId, offset: u64, len: usize, seen: &mut dyn FnMut(&[u8])) {
        let shown = self.with_lent(region, |s| {
            let at = usize::try_from(offset).unwrap_or(usize::MAX);
            if let (Storage::Heap(bytes), Some(end)) = (&*s, at.checked_add(len)) {
                if let Some(piece) = bytes.get(at..end) {
                    seen(piece);
                }
            }
        });
        if shown.is_none() {
            if let Some(buf) = self.mem.regions.get(&region) {
                buf.inspect(offset, len as u64, seen);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(regions: &[(u32, usize)]) -> HostMemory {
        let mut mem = HostMemory::default();
        for &(id, len) in regions {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let buf = HostBuf::new(Storage::Heap(bytes.into_boxed_slice()), false);
            mem.regions.insert(RegionId(id), Arc::new(buf));
        }
        mem
    }

    #[test]
    fn a_batch_borrows_from_one_region_and_reads_it_through_the_held_lock() {
        let mem = memory(&[(1, 8192), (2, 8192)]);
        let mut lender = Lender::new(&mem);
        // Too small to be worth it, then the first region asked for, then not another.
        assert!(!lender.can_lend(RegionId(1), 0, LEND_MIN - 1));
        assert!(lender.can_lend(RegionId(1), 100, 1024));
        assert!(lender.can_lend(RegionId(1), 4096, 2048));
        assert!(!lender.can_lend(RegionId(2), 0, 1024));
        assert!(!lender.can_lend(RegionId(3), 0, 1024));
        // The lent region is locked: reads, writes and looks go through the lock it holds
        // (taking it again would deadlock), and other regions as usual.
        let mut out = [0; 4];
        lender.read(RegionId(1), 251, &mut out);
        assert_eq!(out, [0, 1, 2, 3]);
        lender.write(RegionId(1), 0, &[9; 4]);
        let old = lender.atomic(RegionId(1), 0, AtomicOp::FetchAdd { add: 1 });
        assert_eq!(old, u64::from_ne_bytes([9, 9, 9, 9, 4, 5, 6, 7]));
        let mut seen = Vec::new();
        lender.look(RegionId(1), 2, 3, &mut |p| seen.extend_from_slice(p));
        assert_eq!(seen, [9, 9, 4]);
        lender.read(RegionId(2), 1, &mut out);
        assert_eq!(out, [1, 2, 3, 4]);
        // The send sees the whole region and unlocks it; the next batch starts afresh.
        let len = lender.send(|bytes| bytes.len());
        assert_eq!(len, 8192);
        let mut word = [0; 8];
        mem.regions[&RegionId(1)].read(0, &mut word);
        assert_eq!(u64::from_ne_bytes(word), old + 1);
        assert!(lender.can_lend(RegionId(2), 0, 1024));
        assert_eq!(lender.send(|bytes| bytes[1]), 1);
        assert_eq!(lender.send(|bytes| bytes.len()), 0);
    }
}
