//! Memory outside the host — a GPU's — as the faces deliver into it.
//!
//! The soft NIC writes host memory only, so a face asked for device memory stages each
//! message or frame in registered host pages and copies it across once it is whole: frames
//! when their last packet lands, session messages before the function or `collect` sees them,
//! cache buffers on `receive` and before `flush`. [`DeviceMemory`] is the copy interface those
//! faces use; the `cuda` feature implements it for CUDA (`ferroce::cuda::CudaMemory`), and an
//! application may implement it for other devices. A failed copy is an error the face reports
//! (for frames, a fatal event of the receive path), never a panic.

use std::fmt;
use std::sync::Arc;

/// Device memory a face copies staged bytes into and out of.
///
/// Implementations check every range with [`check_range`] and answer errors, never panic;
/// each call completes the copy before it returns.
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// Its length in bytes.
    fn size(&self) -> u64;

    /// The device's address of its first byte (a `CUdeviceptr` for CUDA): what a kernel or
    /// Hololink's `cu_buffer` would use.
    fn address(&self) -> u64;

    /// Where it lives, for messages: "CUDA device 0", say.
    fn describe(&self) -> String;

    /// The CUDA device it is on, when it is CUDA memory: what a frame view tells DLPack and
    /// `__cuda_array_interface__` consumers. `None` (the default) for anything else.
    fn cuda_ordinal(&self) -> Option<u32> {
        None
    }

    /// Copies `src` to `offset`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::OutOfRange`] past the end; [`DeviceError::Failed`] when the device
    /// refused the copy.
    fn write(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError>;

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Errors
    ///
    /// As [`DeviceMemory::write`].
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError>;
}

/// Allocates device memory by device number: how the cache gets GPU buffers (neuray's
/// `gpu_id`). The `cuda` feature's `ferroce::cuda::CudaAllocator` allocates CUDA memory.
pub trait DeviceAllocator: Send + Sync + fmt::Debug {
    /// `size` bytes on device `device`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Unavailable`] when there is no such device;
    /// [`DeviceError::Allocation`] when it has no room.
    fn alloc(&self, device: u32, size: usize) -> Result<Arc<dyn DeviceMemory>, DeviceError>;
}

/// Why device memory could not be had or copied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// There is no such device here: no driver, no device with that ordinal, or a build
    /// without the feature.
    #[error("{0}")]
    Unavailable(String),
    /// A copy would run past the memory's end.
    #[error("{len} bytes at offset {offset} run past the {size} bytes of device memory")]
    OutOfRange {
        /// Where the copy starts.
        offset: u64,
        /// How many bytes it copies.
        len: usize,
        /// The memory's length.
        size: u64,
    },
    /// The memory could not be allocated.
    #[error("cannot allocate {size} bytes on {device}: {reason}")]
    Allocation {
        /// The device.
        device: String,
        /// The bytes asked for.
        size: usize,
        /// What the driver said.
        reason: String,
    },
    /// The device refused an operation.
    #[error("{operation} on {device} failed: {reason}")]
    Failed {
        /// The device.
        device: String,
        /// What was attempted ("copy to device", "copy from device").
        operation: &'static str,
        /// What the driver said.
        reason: String,
    },
}

/// Checks that `len` bytes at `offset` lie inside memory of `size` bytes.
///
/// # Errors
///
/// [`DeviceError::OutOfRange`] otherwise.
pub fn check_range(size: u64, offset: u64, len: usize) -> Result<(), DeviceError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DeviceError::OutOfRange { offset, len, size }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked_without_overflow() {
        assert!(check_range(100, 0, 100).is_ok());
        assert!(check_range(100, 100, 0).is_ok());
        assert_eq!(
            check_range(100, 99, 2),
            Err(DeviceError::OutOfRange {
                offset: 99,
                len: 2,
                size: 100
            })
        );
        assert!(check_range(100, u64::MAX, 1).is_err());
    }
}
