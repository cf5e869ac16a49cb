//! A region on a verbs device: `ibv_reg_mr` on host or mapped memory (pinned, whatever it
//! was asked), `ibv_reg_dmabuf_mr` on a dma-buf, with the access flags and errors translated.

use std::os::fd::RawFd;

use ferroce_proto::memory::{RegionInfo, WriteOrder};

use super::abi::*;
use super::device::Device;
use super::ffi::Mr;
use crate::attr::RegionAccess;
use crate::error::{memlock_error, RegionError};
use crate::memory::{MappedMemory, RegionMemory};
use crate::sys;

/// A registration on a verbs device, which owns the host bytes.
pub(crate) struct Region {
    mr: Mr,
    /// The descriptor and offset of a dma-buf region.
    dmabuf: Option<(RawFd, u64)>,
    /// Always: a verbs device pins every host region.
    pinned: bool,
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
    pub(super) fn register(
        device: &Device,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
    ) -> Result<(Self, RegionInfo), RegionError> {
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
        Ok((
            Self {
                mr,
                dmabuf,
                pinned: true,
            },
            info,
        ))
    }

    /// Copies out; the caller has checked the range.
    pub(crate) fn read(&self, at: u64, out: &mut [u8]) {
        self.mr.read(at as usize, out);
    }

    /// Copies in; the caller has checked the range.
    pub(crate) fn write(&self, at: u64, data: &[u8]) {
        self.mr.write(at as usize, data);
    }

    /// `ibv_dereg_mr`, and the memory back as it was registered.
    pub(crate) fn deregister(self, len: u64) -> RegionMemory {
        let Self { mr, dmabuf, pinned } = self;
        if mr.is_mapped() {
            return mr
                .into_mapped()
                .map_or(RegionMemory::Host(Vec::new()), |map| {
                    RegionMemory::Mapped(MappedMemory(map))
                });
        }
        match (mr.into_host(), dmabuf) {
            (Some(bytes), _) if pinned => RegionMemory::Host(bytes.into_vec()),
            (Some(bytes), _) => RegionMemory::Pageable(bytes.into_vec()),
            (None, Some((fd, offset))) => RegionMemory::Dmabuf {
                fd,
                offset,
                bytes: len,
            },
            (None, None) => RegionMemory::Host(Vec::new()),
        }
    }
}

/// The access flags of a region: the local write every region gets, what peers may do, and
/// relaxed ordering (optional: ignored by a device without it) for [`WriteOrder::AnyOrder`].
fn region_access(access: RegionAccess, order: WriteOrder) -> i32 {
    let relaxed = match order {
        WriteOrder::AnyOrder => IBV_ACCESS_RELAXED_ORDERING,
        WriteOrder::InOrder => 0,
    };
    i32::from(access.rights().ibv_bits()) | relaxed
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
            i32::from(RegionAccess::Remote.qp_rights().ibv_bits()),
            IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
        );
        assert_eq!(RegionAccess::Local.qp_rights().ibv_bits(), 0);
    }
}
