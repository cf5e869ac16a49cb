//! A region on a verbs device: `ibv_reg_mr` on host or mapped memory (pinned, whatever it
//! was asked), `ibv_reg_dmabuf_mr` on a dma-buf, with the access flags and errors translated.

use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use ferroce_proto::memory::{RegionInfo, WriteOrder};

use super::abi::*;
use super::device::Device;
use super::ffi::Mr;
use crate::attr::RegionAccess;
use crate::error::{memlock_error, RegionError};
use crate::memory::{show_copied, MappedMemory, RegionMemory, PIECE};
use crate::sys;

/// A registration on a verbs device, which owns the host bytes.
pub(crate) struct Region {
    /// `None` once deregistered.
    mr: Option<Mr>,
    /// The descriptor and offset of a dma-buf region.
    dmabuf: Option<(RawFd, u64)>,
    /// The device, whose registry of regions this one leaves when it goes.
    device: Arc<Device>,
    lkey: u32,
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
    /// `ibv_reg_mr` (or `ibv_reg_dmabuf_mr`) on `memory` with `access`, addressed from
    /// `iova` when given (`ibv_reg_mr_iova2`; a dma-buf from 0 otherwise); the keys and address
    /// peers use come back as a `RegionInfo`.
    pub(super) fn register(
        device: &Arc<Device>,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: Option<u64>,
    ) -> Result<(Self, RegionInfo), RegionError> {
        let flags = region_access(access, order);
        let (mr, dmabuf) = match memory {
            RegionMemory::Host(bytes) | RegionMemory::Pageable(bytes) => {
                if bytes.is_empty() {
                    return Err(RegionError::Empty);
                }
                let len = bytes.len();
                let mr = device
                    .pd
                    .reg_host(bytes.into_boxed_slice(), iova, flags)
                    .map_err(|(e, _)| pin_refused(device, len, e))?;
                (mr, None)
            }
            RegionMemory::Mapped(memory) => {
                let len = memory.len();
                let mr = device
                    .pd
                    .reg_mapped(memory.0, iova, flags)
                    .map_err(|e| pin_refused(device, len, e))?;
                (mr, None)
            }
            RegionMemory::Dmabuf { fd, offset, bytes } => {
                let mr = register_dmabuf(device, fd, offset, bytes, iova.unwrap_or(0), flags)?;
                (mr, Some((fd, offset)))
            }
        };
        let remote = !matches!(access, RegionAccess::Local);
        let info = RegionInfo {
            id: ferroce_proto::memory::RegionId(0),
            pd: ferroce_proto::memory::PdId(0),
            // Addressed from the IOVA asked for; a dma-buf by default from 0.
            va: match (iova, dmabuf) {
                (Some(iova), _) => iova,
                (None, Some(_)) => 0,
                (None, None) => mr.addr(),
            },
            len: mr.len() as u64,
            access: access.rights(),
            order,
            lkey: mr.lkey(),
            rkey: if remote { mr.rkey() } else { 0 },
        };
        lock(&device.regions).insert(info.lkey, info);
        let region = Self {
            lkey: info.lkey,
            mr: Some(mr),
            dmabuf,
            device: Arc::clone(device),
        };
        Ok((region, info))
    }

    /// Copies out; the caller has checked the range.
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) {
        if let Some(mr) = &self.mr {
            mr.read(at as usize, out);
        }
    }

    /// Copies out a piece at a time, showing each to `seen` once copied (the device writes
    /// the memory itself: no lock to leave between pieces, only the cache to use).
    pub(crate) fn read_with(&self, at: u64, out: &mut [u8], seen: &mut dyn FnMut(&[u8])) {
        for (i, piece) in out.chunks_mut(PIECE).enumerate() {
            self.read(at + (i * PIECE) as u64, piece);
            seen(piece);
        }
    }

    /// Shows `len` bytes a piece at a time, each copied into a buffer of one piece that
    /// stays in the cache: the device may write the memory at any moment, so it is never
    /// shown as a `&[u8]`. The caller has checked the range.
    pub(crate) fn inspect(&self, at: u64, len: u64, seen: &mut dyn FnMut(&[u8])) {
        let read = |off, piece: &mut [u8]| {
            self.read(at + off, piece);
            Ok::<_, std::convert::Infallible>(())
        };
        let Ok(()) = show_copied(len, read, seen);
    }

    /// Copies in; the caller has checked the range.
    pub(crate) fn write(&self, at: u64, data: &[u8]) {
        if let Some(mr) = &self.mr {
            mr.write(at as usize, data);
        }
    }

    /// `ibv_dereg_mr`, and the memory back as it was registered.
    pub(crate) fn deregister(mut self, len: u64) -> RegionMemory {
        lock(&self.device.regions).remove(&self.lkey);
        let (Some(mr), dmabuf) = (self.mr.take(), self.dmabuf) else {
            return RegionMemory::Host(Vec::new());
        };
        if mr.is_mapped() {
            return mr
                .into_mapped()
                .map_or(RegionMemory::Host(Vec::new()), |map| {
                    RegionMemory::Mapped(MappedMemory(map))
                });
        }
        match (mr.into_host(), dmabuf) {
            // Pinned, whatever it was registered as.
            (Some(bytes), _) => RegionMemory::Host(bytes.into_vec()),
            (None, Some((fd, offset))) => RegionMemory::Dmabuf {
                fd,
                offset,
                bytes: len,
            },
            (None, None) => RegionMemory::Host(Vec::new()),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        lock(&self.device.regions).remove(&self.lkey);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `ibv_reg_dmabuf_mr` on `bytes` bytes at `offset` of `fd`, addressed by peers from `iova`
/// (Hololink registers its frame memory at 0).
fn register_dmabuf(
    device: &Device,
    fd: RawFd,
    offset: u64,
    bytes: u64,
    iova: u64,
    flags: u32,
) -> Result<Mr, RegionError> {
    if bytes == 0 {
        return Err(RegionError::Empty);
    }
    let len = usize::try_from(bytes).map_err(|_| RegionError::Dmabuf {
        fd,
        offset,
        bytes,
        reason: "too large for this host".into(),
    })?;
    device
        .pd
        .reg_dmabuf(fd, offset, len, iova, flags)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS) => {
                RegionError::DmabufUnsupported {
                    device: device.name.clone(),
                }
            }
            _ => RegionError::Device {
                device: device.name.clone(),
                call: "ibv_reg_dmabuf_mr",
                bytes,
                source,
            },
        })
}

/// Why `ibv_reg_mr` refused `len` bytes: the locked-memory limit, when there is one and the
/// device said ENOMEM or EPERM (it pins what it registers), or what it said.
fn pin_refused(device: &Device, len: usize, source: std::io::Error) -> RegionError {
    if matches!(source.raw_os_error(), Some(libc::ENOMEM | libc::EPERM))
        && sys::memlock_limit().is_some()
    {
        return memlock_error(len, source);
    }
    RegionError::Device {
        device: device.name.clone(),
        call: "ibv_reg_mr",
        bytes: len as u64,
        source,
    }
}

/// The access flags of a region: the local write every region gets, what peers may do, and
/// relaxed ordering (optional: ignored by a device without it) for [`WriteOrder::AnyOrder`].
fn region_access(access: RegionAccess, order: WriteOrder) -> u32 {
    let relaxed = match order {
        WriteOrder::AnyOrder => IBV_ACCESS_RELAXED_ORDERING,
        WriteOrder::InOrder => 0,
    };
    u32::from(access.rights().ibv_bits()) | relaxed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_follows_the_region_and_its_order() {
        assert_eq!(
            region_access(RegionAccess::Local, WriteOrder::InOrder),
            IBV_ACCESS_LOCAL_WRITE
        );
        assert_eq!(
            region_access(RegionAccess::RemoteWrite, WriteOrder::AnyOrder),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING
        );
        assert_eq!(
            region_access(RegionAccess::Remote, WriteOrder::InOrder),
            IBV_ACCESS_LOCAL_WRITE
                | IBV_ACCESS_REMOTE_WRITE
                | IBV_ACCESS_REMOTE_READ
                | IBV_ACCESS_REMOTE_ATOMIC
        );
        // A QP's rights carry no local write.
        assert_eq!(
            u32::from(RegionAccess::Remote.qp_rights().ibv_bits()),
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
        );
        assert_eq!(RegionAccess::Local.qp_rights().ibv_bits(), 0);
    }
}
