//! Registered memory (Rig_mlx5's `Region`): bytes the NIC may read and write, with the
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
//!
//! This file documents, checks ranges and delegates to the backend (`crate::backend::Region`);
//! the memory types are in `crate::memory`, re-exported here.

use ferroce_proto::memory::{RegionInfo, WriteOrder};
use ferroce_proto::qp::{RemoteAddr, Sge};

pub use crate::attr::{AccessFlagsError, RegionAccess};
use crate::backend;
pub use crate::error::RegionError;
pub use crate::memory::{MappedMemory, RegionMemory};
use crate::nic::Nic;

/// A registered region. Dropping it without [`Region::deregister`] deregisters it too.
pub struct Region {
    nic: Nic,
    info: RegionInfo,
    /// `None` once deregistered.
    backend: Option<backend::Region>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("nic", &self.nic.device_name())
            .field("va", &self.info.va)
            .field("len", &self.info.len)
            .field("rkey", &self.info.rkey)
            .finish_non_exhaustive()
    }
}

impl Region {
    /// Registers `memory` with `nic` for `access` and write order `order` (Rig_mlx5's
    /// `Region.register`). Host bytes are locked in RAM. On a verbs device, `ibv_reg_mr` pins every
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
        Self::registered(nic, access, order, memory, None)
    }

    /// Registers `memory` as [`Region::register`] does, but addressed from `iova`: peers'
    /// remote addresses and this process's scatter entries name its first byte `iova`, not
    /// where the bytes are (`ibv_reg_mr_iova2`; Hololink registers its frame memory at 0).
    /// [`Region::va`] is then `iova`.
    ///
    /// # Errors
    ///
    /// Those of [`Region::register`], and [`RegionError::Refused`] when `iova` + the length
    /// runs past the end of the address space; on a verbs device whose libibverbs has no
    /// `ibv_reg_mr_iova2` (before rdma-core 29), [`RegionError::Device`] with EOPNOTSUPP.
    pub fn register_at(
        nic: &Nic,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: u64,
    ) -> Result<Self, RegionError> {
        Self::registered(nic, access, order, memory, Some(iova))
    }

    fn registered(
        nic: &Nic,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: Option<u64>,
    ) -> Result<Self, RegionError> {
        let (backend, info) = nic.backend.register(access, order, memory, iova)?;
        Ok(Self {
            nic: nic.clone(),
            info,
            backend: Some(backend),
        })
    }

    /// Deregisters the region (Rig_mlx5's `Region.deregister`): once this returns, the NIC reads
    /// and writes it no more, and the memory comes back as it was registered: host bytes with
    /// what peers wrote, or the dma-buf's descriptor and range (now unmapped).
    ///
    /// # Errors
    ///
    /// None today; the `Result` keeps Rig_mlx5's `Region.deregister` contract for backends
    /// that can fail.
    pub fn deregister(mut self) -> Result<RegionMemory, RegionError> {
        Ok(self
            .backend
            .take()
            .map_or(RegionMemory::Host(Vec::new()), |b| {
                b.deregister(self.info.len)
            }))
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

    /// The `n` bytes at offset `at`, as this process's work requests name them (Rig_mlx5's
    /// `Region.local`).
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

    /// Offset `at`, as a peer's work requests name it (Rig_mlx5's `Region.remote`).
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
        if let Some(backend) = &self.backend {
            backend.read(at, out);
        }
        Ok(())
    }

    /// [`Region::read`], showing each piece of the copy (64 KiB) to `seen` as soon as it is
    /// copied, while it is still in the cache: a checksum of what was read then costs no
    /// second pass over memory (`ferroce stream recv` checks every frame's CRC this way).
    /// Nothing is shown for a range that is refused.
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`].
    pub fn read_with(
        &self,
        at: u64,
        out: &mut [u8],
        mut seen: impl FnMut(&[u8]),
    ) -> Result<(), RegionError> {
        self.check(at, out.len() as u64)?;
        if let Some(backend) = &self.backend {
            backend.read_with(at, out, &mut seen);
        }
        Ok(())
    }

    /// Shows `len` bytes from offset `at` to `seen`, a piece (64 KiB) at a time, without
    /// copying them out where the NIC allows: a checksum of a frame this way reads each byte
    /// from memory once and writes none (`ferroce stream recv` checks every frame's CRC so).
    /// On the soft NIC's host memory each piece is shown where it lies, under the lock its
    /// writes take: a piece is never seen half-written, and a packet landing in the region
    /// waits while `seen` looks. A mapped region's pieces, and a verbs device's (which may
    /// write its memory at any moment), are copied into a buffer of one piece, which stays in
    /// the cache, and shown from there. Nothing is shown for a range that is refused.
    ///
    /// `seen` must not use this region, nor poll a CQ of its NIC: shown the soft NIC's host
    /// memory, that would take the lock it is shown under, which panics rather than deadlock.
    ///
    /// # Errors
    ///
    /// [`RegionError::OutOfRange`].
    pub fn inspect(
        &self,
        at: u64,
        len: u64,
        mut seen: impl FnMut(&[u8]),
    ) -> Result<(), RegionError> {
        self.check(at, len)?;
        if let Some(backend) = &self.backend {
            backend.inspect(at, len, &mut seen);
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
        if let Some(backend) = &self.backend {
            backend.write(at, data);
        }
        Ok(())
    }
}
