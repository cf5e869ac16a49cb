//! Memory regions: keys, bounds and access rights — the decision, not the bytes.
//!
//! The table hands out random 32-bit keys, remembers each region's protection domain, address
//! range, access rights and write order, and answers one question for every local gather list
//! and every remote request: may these bytes be touched, and where are they? The bytes
//! themselves live with the I/O layer, which implements [`Memory`]; the engine calls it only
//! with ranges this table has approved, so nothing a peer sends can reach outside a region
//! that granted it access.
//!
//! Checks follow IBTA Vol. 1 §10.6 and rxe (`rxe_mr.c`): the full 32-bit key must match, the
//! protection domain must be the QP's, the requested access bit must be granted, and
//! `va ≥ base && len ≤ region.len && va − base ≤ region.len − len`.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};
use std::fmt;

/// Access rights of a region (the `IBV_ACCESS_*` flags ferroce implements).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u8);

impl Access {
    /// Local reads only: usable as a source of SEND and WRITE data.
    pub const NONE: Self = Self(0);
    /// The local NIC may write: receive buffers, READ and atomic destinations.
    pub const LOCAL_WRITE: Self = Self(1);
    /// Peers may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Self = Self(2);
    /// Peers may RDMA READ from the region.
    pub const REMOTE_READ: Self = Self(4);
    /// Peers may run atomic operations on the region.
    pub const REMOTE_ATOMIC: Self = Self(8);
    /// Rig_mlx5's `Local`: the local NIC may read and write, peers nothing.
    pub const LOCAL: Self = Self::LOCAL_WRITE;
    /// Rig_mlx5's `RemoteWrite`: local access plus remote WRITE.
    pub const REMOTE_WRITE_ONLY: Self = Self(1 | 2);
    /// Rig_mlx5's `Remote`: local access plus remote WRITE, READ and atomics.
    pub const REMOTE: Self = Self(1 | 2 | 4 | 8);

    /// The union of two sets of rights.
    #[must_use]
    pub const fn with(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether every right of `other` is granted.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// The rights as `IBV_ACCESS_*` bits (`LOCAL_WRITE` 1, `REMOTE_WRITE` 2, `REMOTE_READ` 4,
    /// `REMOTE_ATOMIC` 8), which the constants above are by construction: what a verbs
    /// device is given for a region or a queue pair.
    ///
    /// ```
    /// use ferroce_proto::memory::Access;
    /// assert_eq!(Access::REMOTE_WRITE_ONLY.ibv_bits(), 1 | 2);
    /// ```
    #[must_use]
    pub const fn ibv_bits(self) -> u8 {
        self.0
    }

    /// Whether any remote right is granted (the region then has an rkey).
    #[must_use]
    pub const fn is_remote(self) -> bool {
        self.0 & (2 | 4 | 8) != 0
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Self::LOCAL_WRITE, "LOCAL_WRITE"),
            (Self::REMOTE_WRITE, "REMOTE_WRITE"),
            (Self::REMOTE_READ, "REMOTE_READ"),
            (Self::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let mut set = f.debug_set();
        for (flag, name) in names {
            if self.contains(flag) {
                set.entry(&format_args!("{name}"));
            }
        }
        set.finish()
    }
}

/// Whether writes into a region must become visible in order (Rig_mlx5's write order).
///
/// The software engine always places data in PSN order, so both behave the same here; the
/// value is kept so that a hardware backend can map `AnyOrder` to relaxed ordering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum WriteOrder {
    /// Writes land in the order they were sent.
    #[default]
    InOrder,
    /// Writes may land in any order (relaxed ordering).
    AnyOrder,
}

/// A protection domain: regions and queue pairs of one domain only see each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdId(pub u32);

/// The table's handle for a region, passed to [`Memory`] so the I/O layer finds its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u32);

/// What the table knows about one registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// The handle the I/O layer knows the bytes by.
    pub id: RegionId,
    /// The protection domain.
    pub pd: PdId,
    /// The address peers and gather lists use for the region's first byte.
    pub va: u64,
    /// Length in bytes.
    pub len: u64,
    /// Access rights.
    pub access: Access,
    /// Write order.
    pub order: WriteOrder,
    /// The key for local gather/scatter lists.
    pub lkey: u32,
    /// The key peers use; 0 (never valid) when no remote right is granted.
    pub rkey: u32,
}

/// Why a region could not be registered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// `va + len` overflows the 64-bit address space.
    #[error("region at {va:#x} of {len} bytes wraps the address space")]
    Wraps {
        /// The start address.
        va: u64,
        /// The length.
        len: u64,
    },
    /// Remote access other than atomics without local write is meaningless for atomics:
    /// IBTA requires LOCAL_WRITE with REMOTE_WRITE or REMOTE_ATOMIC.
    #[error("remote write and atomic access need local write access too (IBTA 10.6.3.1)")]
    RemoteWithoutLocalWrite,
}

/// Why a key and range were refused. Each maps to a remote access error NAK for a peer's
/// request, or to a local protection error completion for a gather/scatter list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessFault {
    /// No region has this key (never registered, or deregistered).
    #[error("no region has key {0:#x}")]
    UnknownKey(u32),
    /// The region belongs to another protection domain.
    #[error("key {0:#x} belongs to another protection domain")]
    WrongPd(u32),
    /// The region does not grant the access asked for.
    #[error("key {key:#x} does not grant {needed:?}")]
    NotPermitted {
        /// The key.
        key: u32,
        /// The access that was needed.
        needed: Access,
    },
    /// The range is not inside the region.
    #[error("{len} bytes at {va:#x} are outside the region of key {key:#x}")]
    OutOfBounds {
        /// The key.
        key: u32,
        /// The start of the range.
        va: u64,
        /// The length of the range.
        len: u64,
    },
}

/// Where the engine's identifiers come from: memory keys and queue pair numbers. A NIC gives
/// its engine the operating system's CSPRNG ([`Engine::set_entropy`]), so a peer cannot
/// predict a key or QP number from the ones it was told (ReDMArk). Without one an engine
/// draws from [`SeededEntropy`], reproducibly, as simulations and tests want.
///
/// [`Engine::set_entropy`]: crate::Engine::set_entropy
pub trait Entropy: Send {
    /// 64 random bits.
    fn next_u64(&mut self) -> u64;
}

/// A small, fast, seedable generator (SplitMix64): reproducible, and predictable to anyone
/// who sees one output, so for simulations and tests only.
#[derive(Clone, Debug)]
pub struct SeededEntropy(u64);

impl SeededEntropy {
    /// The generator seeded with `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
}

impl Entropy for SeededEntropy {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// How many deregistered keys are kept out of use: a key that was just given up is not
/// handed out again while a peer may still hold it.
pub const KEY_QUARANTINE: usize = 4096;

/// The region table: keys to regions, with their checks.
pub struct MemoryTable {
    regions: FxHashMap<RegionId, RegionInfo>,
    by_lkey: FxHashMap<u32, RegionId>,
    by_rkey: FxHashMap<u32, RegionId>,
    next_id: u32,
    entropy: Box<dyn Entropy>,
    /// Keys recently deregistered, oldest first, and the same as a set.
    quarantine: VecDeque<u32>,
    quarantined: FxHashSet<u32>,
}

impl fmt::Debug for MemoryTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTable")
            .field("regions", &self.regions.len())
            .finish_non_exhaustive()
    }
}

impl MemoryTable {
    /// An empty table whose keys come from [`SeededEntropy`] seeded with `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self::with_entropy(Box::new(SeededEntropy::new(seed)))
    }

    /// An empty table whose keys come from `entropy`.
    #[must_use]
    pub fn with_entropy(entropy: Box<dyn Entropy>) -> Self {
        Self {
            regions: FxHashMap::default(),
            by_lkey: FxHashMap::default(),
            by_rkey: FxHashMap::default(),
            next_id: 1,
            entropy,
            quarantine: VecDeque::new(),
            quarantined: FxHashSet::default(),
        }
    }

    /// Replaces where keys come from (the engine's [`Entropy`]).
    pub fn set_entropy(&mut self, entropy: Box<dyn Entropy>) {
        self.entropy = entropy;
    }

    /// 64 bits from the table's entropy, for the engine's other identifiers.
    pub(crate) fn random(&mut self) -> u64 {
        self.entropy.next_u64()
    }

    fn fresh_key(&mut self) -> u32 {
        loop {
            let key = (self.entropy.next_u64() >> 32) as u32;
            if key != 0
                && !self.by_lkey.contains_key(&key)
                && !self.by_rkey.contains_key(&key)
                && !self.quarantined.contains(&key)
            {
                return key;
            }
        }
    }

    fn quarantine(&mut self, key: u32) {
        if key == 0 || !self.quarantined.insert(key) {
            return;
        }
        self.quarantine.push_back(key);
        if self.quarantine.len() > KEY_QUARANTINE {
            if let Some(old) = self.quarantine.pop_front() {
                self.quarantined.remove(&old);
            }
        }
    }

    /// Registers `len` bytes that the I/O layer will find as region id returned, addressed
    /// by peers and gather lists from `va`.
    ///
    /// # Errors
    ///
    /// [`RegisterError::Wraps`] when the range overflows, and
    /// [`RegisterError::RemoteWithoutLocalWrite`] for remote write or atomic rights without
    /// local write.
    pub fn register(
        &mut self,
        pd: PdId,
        va: u64,
        len: u64,
        access: Access,
        order: WriteOrder,
    ) -> Result<RegionInfo, RegisterError> {
        if va.checked_add(len).is_none() {
            return Err(RegisterError::Wraps { va, len });
        }
        let needs_local = Access::REMOTE_WRITE.with(Access::REMOTE_ATOMIC);
        if access.0 & needs_local.0 != 0 && !access.contains(Access::LOCAL_WRITE) {
            return Err(RegisterError::RemoteWithoutLocalWrite);
        }
        let id = RegionId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let lkey = self.fresh_key();
        self.by_lkey.insert(lkey, id);
        let rkey = if access.is_remote() {
            let rkey = self.fresh_key();
            self.by_rkey.insert(rkey, id);
            rkey
        } else {
            0
        };
        let info = RegionInfo {
            id,
            pd,
            va,
            len,
            access,
            order,
            lkey,
            rkey,
        };
        self.regions.insert(id, info);
        Ok(info)
    }

    /// Removes a region: its keys stop working at once. Returns what it was, or `None` if
    /// the id is unknown.
    pub fn deregister(&mut self, id: RegionId) -> Option<RegionInfo> {
        let info = self.regions.remove(&id)?;
        self.by_lkey.remove(&info.lkey);
        if info.rkey != 0 {
            self.by_rkey.remove(&info.rkey);
        }
        self.quarantine(info.lkey);
        self.quarantine(info.rkey);
        Some(info)
    }

    /// The region with this id.
    #[must_use]
    pub fn get(&self, id: RegionId) -> Option<&RegionInfo> {
        self.regions.get(&id)
    }

    /// How many regions are registered.
    #[must_use]
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether no region is registered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The region whose local key is `lkey`, if one is registered.
    #[must_use]
    pub fn by_lkey(&self, lkey: u32) -> Option<&RegionInfo> {
        self.by_lkey.get(&lkey).and_then(|id| self.regions.get(id))
    }

    /// The region whose remote key is `rkey`, if one is registered (a Local region has none).
    #[must_use]
    pub fn by_rkey(&self, rkey: u32) -> Option<&RegionInfo> {
        self.by_rkey.get(&rkey).and_then(|id| self.regions.get(id))
    }

    /// Finds `key` in one of the key maps, then checks the range and rights against its region.
    fn lookup(
        &self,
        keys: &FxHashMap<u32, RegionId>,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<(RegionId, u64), AccessFault> {
        let info = keys
            .get(&key)
            .and_then(|id| self.regions.get(id))
            .ok_or(AccessFault::UnknownKey(key))?;
        Self::check(info, key, pd, va, len, needed)
    }

    fn check(
        info: &RegionInfo,
        key: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<(RegionId, u64), AccessFault> {
        if info.pd != pd {
            return Err(AccessFault::WrongPd(key));
        }
        if !info.access.contains(needed) {
            return Err(AccessFault::NotPermitted { key, needed });
        }
        let inside = va >= info.va && len <= info.len && va - info.va <= info.len - len;
        if !inside {
            return Err(AccessFault::OutOfBounds { key, va, len });
        }
        Ok((info.id, va - info.va))
    }

    /// Checks a peer's request: `len` bytes at `va` under `rkey`, needing `needed` (one of
    /// the remote rights). Returns the region and the offset of `va` in it.
    ///
    /// # Errors
    ///
    /// An [`AccessFault`] saying which check failed.
    pub fn check_remote(
        &self,
        rkey: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<(RegionId, u64), AccessFault> {
        self.lookup(&self.by_rkey, rkey, pd, va, len, needed)
    }

    /// Checks a local gather/scatter entry: `len` bytes at `va` under `lkey`; `needed` is
    /// [`Access::LOCAL_WRITE`] when the NIC will write them, [`Access::NONE`] to read.
    ///
    /// # Errors
    ///
    /// An [`AccessFault`] saying which check failed.
    pub fn check_local(
        &self,
        lkey: u32,
        pd: PdId,
        va: u64,
        len: u64,
        needed: Access,
    ) -> Result<(RegionId, u64), AccessFault> {
        self.lookup(&self.by_lkey, lkey, pd, va, len, needed)
    }
}

/// The bytes behind the regions, supplied by the I/O layer.
///
/// The engine calls these only with a region the [`MemoryTable`] knows and a range it has
/// checked against that region's length, so an implementation may treat an out-of-range call
/// as a bug; it must still not corrupt memory (slice indexing that panics is acceptable).
pub trait Memory {
    /// Copies `out.len()` bytes from `offset` of the region into `out`.
    fn read(&self, region: RegionId, offset: u64, out: &mut [u8]);
    /// Copies `data` into the region at `offset`.
    fn write(&mut self, region: RegionId, offset: u64, data: &[u8]);
    /// Atomically reads the 8-byte host-endian value at `offset` (8-aligned in the region's
    /// address space), applies `op`, writes the result and returns the original value.
    fn atomic(&mut self, region: RegionId, offset: u64, op: AtomicOp) -> u64;

    /// Whether a packet may leave its payload, the `len` bytes at `offset` of the region (a
    /// request's data or a READ response's), out of its buffer, for the sender to hand the
    /// kernel where they lie ([`Lent`]): one copy fewer per payload byte. Memory that cannot
    /// lend says no, the default, and the engine copies the payload in. An implementation
    /// that says yes must keep those bytes as they are until the packet has left.
    ///
    /// [`Lent`]: crate::engine::Lent
    fn can_lend(&self, region: RegionId, offset: u64, len: usize) -> bool {
        let _ = (region, offset, len);
        false
    }

    /// Shows `len` bytes from `offset` of the region to `seen`, in order, a piece at a time:
    /// how the engine computes a lent payload's ICRC. The default copies each piece out with
    /// [`Memory::read`].
    fn look(&self, region: RegionId, offset: u64, len: usize, seen: &mut dyn FnMut(&[u8])) {
        let mut piece = [0u8; 4096];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(piece.len());
            self.read(region, offset + done as u64, &mut piece[..n]);
            seen(&piece[..n]);
            done += n;
        }
    }
}

/// An atomic operation on an 8-byte target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Store `swap` if the target equals `compare`.
    CompareSwap {
        /// The value to compare with.
        compare: u64,
        /// The value to store.
        swap: u64,
    },
    /// Add `add`, wrapping.
    FetchAdd {
        /// The value to add.
        add: u64,
    },
}

impl AtomicOp {
    /// The new value of a target that held `old`.
    #[must_use]
    pub const fn apply(self, old: u64) -> u64 {
        match self {
            Self::CompareSwap { compare, swap } => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            Self::FetchAdd { add } => old.wrapping_add(add),
        }
    }
}

/// Regions backed by plain vectors: for tests, simulations and fuzzing.
#[derive(Clone, Debug, Default)]
pub struct HeapMemory {
    regions: FxHashMap<RegionId, Vec<u8>>,
}

impl HeapMemory {
    /// No regions.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Gives region `id` its bytes.
    pub fn insert(&mut self, id: RegionId, bytes: Vec<u8>) {
        self.regions.insert(id, bytes);
    }

    /// The bytes of region `id`.
    #[must_use]
    pub fn bytes(&self, id: RegionId) -> Option<&[u8]> {
        self.regions.get(&id).map(Vec::as_slice)
    }

    /// The bytes of region `id`, writable.
    pub fn bytes_mut(&mut self, id: RegionId) -> Option<&mut [u8]> {
        self.regions.get_mut(&id).map(Vec::as_mut_slice)
    }

    fn range(offset: u64, len: usize) -> std::ops::Range<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        start..start.saturating_add(len)
    }
}

impl Memory for HeapMemory {
    fn read(&self, region: RegionId, offset: u64, out: &mut [u8]) {
        let bytes = &self.regions[&region];
        out.copy_from_slice(&bytes[Self::range(offset, out.len())]);
    }

    fn write(&mut self, region: RegionId, offset: u64, data: &[u8]) {
        let bytes = self.regions.get_mut(&region).expect("region registered");
        bytes[Self::range(offset, data.len())].copy_from_slice(data);
    }

    fn atomic(&mut self, region: RegionId, offset: u64, op: AtomicOp) -> u64 {
        let bytes = self.regions.get_mut(&region).expect("region registered");
        let target = &mut bytes[Self::range(offset, 8)];
        let mut word = [0; 8];
        word.copy_from_slice(target);
        let old = u64::from_ne_bytes(word);
        target.copy_from_slice(&op.apply(old).to_ne_bytes());
        old
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_bounds_access_and_pd() {
        let mut table = MemoryTable::new(7);
        let pd = PdId(1);
        let r = table
            .register(
                pd,
                0x1000,
                256,
                Access::REMOTE_WRITE_ONLY,
                WriteOrder::InOrder,
            )
            .unwrap();
        assert_ne!(r.rkey, 0);
        assert_ne!(r.lkey, r.rkey);
        let ok = table.check_remote(r.rkey, pd, 0x1010, 16, Access::REMOTE_WRITE);
        assert_eq!(ok, Ok((r.id, 0x10)));
        assert_eq!(
            table.check_remote(r.rkey, pd, 0x10f0, 16, Access::REMOTE_WRITE),
            Ok((r.id, 0xf0))
        );
        assert!(matches!(
            table.check_remote(r.rkey, pd, 0x10f1, 16, Access::REMOTE_WRITE),
            Err(AccessFault::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.check_remote(r.rkey, pd, 0xfff, 1, Access::REMOTE_WRITE),
            Err(AccessFault::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.check_remote(r.rkey, pd, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(AccessFault::OutOfBounds { .. })
        ));
        assert!(matches!(
            table.check_remote(r.rkey, pd, 0x1000, 8, Access::REMOTE_READ),
            Err(AccessFault::NotPermitted { .. })
        ));
        assert_eq!(
            table.check_remote(r.rkey, PdId(2), 0x1000, 8, Access::REMOTE_WRITE),
            Err(AccessFault::WrongPd(r.rkey))
        );
        // The lkey is not an rkey, and vice versa.
        assert_eq!(
            table.check_remote(r.lkey, pd, 0x1000, 8, Access::REMOTE_WRITE),
            Err(AccessFault::UnknownKey(r.lkey))
        );
        assert_eq!(
            table.check_local(r.lkey, pd, 0x1000, 256, Access::LOCAL_WRITE),
            Ok((r.id, 0))
        );
        table.deregister(r.id).unwrap();
        assert_eq!(
            table.check_remote(r.rkey, pd, 0x1000, 8, Access::REMOTE_WRITE),
            Err(AccessFault::UnknownKey(r.rkey))
        );
    }

    #[test]
    fn local_only_regions_have_no_rkey() {
        let mut table = MemoryTable::new(1);
        let r = table
            .register(PdId(0), 0, 64, Access::LOCAL, WriteOrder::AnyOrder)
            .unwrap();
        assert_eq!(r.rkey, 0);
        assert_eq!(
            table.check_remote(0, PdId(0), 0, 1, Access::REMOTE_READ),
            Err(AccessFault::UnknownKey(0))
        );
        assert_eq!(
            table.register(PdId(0), 0, 64, Access::REMOTE_WRITE, WriteOrder::InOrder),
            Err(RegisterError::RemoteWithoutLocalWrite)
        );
        assert!(matches!(
            table.register(PdId(0), u64::MAX, 2, Access::LOCAL, WriteOrder::InOrder),
            Err(RegisterError::Wraps { .. })
        ));
    }

    #[test]
    fn atomics() {
        assert_eq!(AtomicOp::FetchAdd { add: 2 }.apply(u64::MAX), 1);
        assert_eq!(
            AtomicOp::CompareSwap {
                compare: 5,
                swap: 9
            }
            .apply(5),
            9
        );
        assert_eq!(
            AtomicOp::CompareSwap {
                compare: 5,
                swap: 9
            }
            .apply(6),
            6
        );
    }

    /// Hands out the values it was given, in turn.
    struct Scripted(Vec<u64>, usize);

    impl Entropy for Scripted {
        fn next_u64(&mut self) -> u64 {
            let v = self.0[self.1 % self.0.len()];
            self.1 += 1;
            v
        }
    }

    #[test]
    fn a_deregistered_key_is_not_handed_out_again_soon() {
        let key = |k: u32| u64::from(k) << 32;
        let script = vec![key(7), key(7), key(9), key(7), key(11)];
        let mut table = MemoryTable::with_entropy(Box::new(Scripted(script, 0)));
        let pd = PdId(1);
        let a = table
            .register(pd, 0x1000, 64, Access::LOCAL, WriteOrder::InOrder)
            .unwrap();
        assert_eq!(a.lkey, 7);
        table.deregister(a.id).unwrap();
        // The generator offers 7 again, twice: it is quarantined, so 9 and then 11 are taken.
        let b = table
            .register(pd, 0x1000, 64, Access::LOCAL, WriteOrder::InOrder)
            .unwrap();
        assert_eq!(b.lkey, 9);
        let c = table
            .register(pd, 0x2000, 64, Access::LOCAL, WriteOrder::InOrder)
            .unwrap();
        assert_eq!(c.lkey, 11);
        // After KEY_QUARANTINE later keys have gone through quarantine, 7 may come back.
        let mut table = MemoryTable::new(3);
        let first = table
            .register(pd, 0, 8, Access::LOCAL, WriteOrder::InOrder)
            .unwrap();
        table.deregister(first.id);
        for i in 0..KEY_QUARANTINE as u64 {
            let r = table
                .register(pd, i * 8, 8, Access::LOCAL, WriteOrder::InOrder)
                .unwrap();
            assert_ne!(r.lkey, first.lkey);
            table.deregister(r.id);
        }
        assert!(!table.quarantined.contains(&first.lkey));
        assert_eq!(table.quarantine.len(), KEY_QUARANTINE);
    }
}
