//! CUDA device memory for the faces (the `cuda` feature), through the CUDA driver API.
//!
//! The driver (`libcuda.so`) is loaded when first used, not linked: a build with the feature
//! runs on any host, and where there is no driver or no such device every call answers
//! [`DeviceError::Unavailable`] saying so. [`CudaMemory`] is an allocation on one device,
//! used through [`DeviceMemory`]; every copy is complete when the call returns. The driver
//! bindings panic on a missing library or symbol, so each call into them is fenced and a
//! panic becomes an error.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use crate::device::{check_range, DeviceAllocator, DeviceError, DeviceMemory};

/// Whether the CUDA driver library can be loaded, and if not, why.
fn driver() -> Result<(), DeviceError> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    let present = *PRESENT.get_or_init(|| {
        #[allow(unsafe_code)]
        // SAFETY: loading the driver library runs its initialisers, which is what loading
        // it for any later call does too; nothing else is touched.
        let present = unsafe { cudarc::driver::sys::is_culib_present() };
        present
    });
    if present {
        Ok(())
    } else {
        Err(DeviceError::Unavailable(
            "no CUDA driver on this host (libcuda.so could not be loaded): install the NVIDIA \
             driver or use host memory"
                .into(),
        ))
    }
}

/// Runs a driver call, turning its error or a panic in the bindings into `wrap(reason)`.
fn fenced<T, E: std::fmt::Debug>(
    call: impl FnOnce() -> Result<T, E>,
    wrap: impl FnOnce(String) -> DeviceError,
) -> Result<T, DeviceError> {
    match catch_unwind(AssertUnwindSafe(call)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(wrap(format!("{e:?}"))),
        Err(panic) => Err(wrap(
            crate::panic_message(panic.as_ref())
                .unwrap_or_else(|| "the driver bindings panicked".into()),
        )),
    }
}

/// The CUDA devices on this host.
///
/// # Errors
///
/// [`DeviceError::Unavailable`] without a driver or when it cannot start.
pub fn device_count() -> Result<u32, DeviceError> {
    driver()?;
    let count = fenced(CudaContext::device_count, |reason| {
        DeviceError::Unavailable(format!("the CUDA driver cannot start: {reason}"))
    })?;
    Ok(u32::try_from(count).unwrap_or(0))
}

fn context(ordinal: u32) -> Result<Arc<CudaContext>, DeviceError> {
    let count = device_count()?;
    if ordinal >= count {
        return Err(DeviceError::Unavailable(format!(
            "no CUDA device {ordinal}: this host has {count}"
        )));
    }
    fenced(
        || CudaContext::new(ordinal as usize),
        |reason| DeviceError::Unavailable(format!("CUDA device {ordinal}: {reason}")),
    )
}

/// A stream of ferroce's own on device `ordinal`'s primary context.
fn new_stream(ordinal: u32) -> Result<Arc<CudaStream>, DeviceError> {
    let ctx = context(ordinal)?;
    fenced(
        || ctx.new_stream(),
        |reason| DeviceError::Failed {
            device: format!("CUDA device {ordinal}"),
            operation: "creating a stream",
            reason,
        },
    )
}

/// An allocation on one CUDA device (Hololink's `cu_buffer`, Catalyst's `MemKind` CUDA, neuray's
/// `gpu_id`), owned ([`CudaMemory::alloc`], [`CudaMemory::from_slice`]) or borrowed from the caller
/// ([`CudaMemory::from_raw`]).
pub struct CudaMemory {
    ordinal: u32,
    size: u64,
    address: u64,
    stream: Arc<CudaStream>,
    /// `None` only while dropping a borrowed allocation.
    slice: Mutex<Option<CudaSlice<u8>>>,
    /// Whether the allocation is the caller's, to be left alone on drop.
    borrowed: bool,
}

impl std::fmt::Debug for CudaMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaMemory")
            .field("device", &self.ordinal)
            .field("size", &self.size)
            .field("address", &format_args!("{:#x}", self.address))
            .finish()
    }
}

impl CudaMemory {
    /// Allocates `size` zeroed bytes on CUDA device `ordinal`.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Unavailable`] without a driver or that device;
    /// [`DeviceError::Allocation`] when the device has no room (or `size` is 0).
    pub fn alloc(ordinal: u32, size: usize) -> Result<Self, DeviceError> {
        let device = format!("CUDA device {ordinal}");
        if size == 0 {
            return Err(DeviceError::Allocation {
                device,
                size,
                reason: "an allocation needs at least one byte".into(),
            });
        }
        let stream = new_stream(ordinal)?;
        let slice = fenced(
            || stream.alloc_zeros::<u8>(size),
            |reason| DeviceError::Allocation {
                device: device.clone(),
                size,
                reason,
            },
        )?;
        Self::with_slice(ordinal, stream, slice, false)
    }

    /// Borrows `size` bytes at `ptr`, a `CUdeviceptr` the caller allocated on device `ordinal`
    /// in its primary context (what CuPy, PyTorch and `cuMemAlloc` after
    /// `cuDevicePrimaryCtxRetain` give): Hololink's `start(cu_buffer, cu_buffer_size, …)`.
    /// Copies go through a stream of ferroce's own; dropping the value frees nothing.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` must be device memory of that context, allocated for at least as
    /// long as this value (and any clone of an `Arc` holding it) lives, and not freed or
    /// reused meanwhile. ferroce writes it whenever a frame or a cache transfer lands, so
    /// the caller must not rely on its contents between those writes either.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Unavailable`] without a driver or that device;
    /// [`DeviceError::Allocation`] for a null pointer or no bytes.
    #[allow(unsafe_code)]
    pub unsafe fn from_raw(ordinal: u32, ptr: u64, size: usize) -> Result<Self, DeviceError> {
        let device = format!("CUDA device {ordinal}");
        if ptr == 0 || size == 0 {
            return Err(DeviceError::Allocation {
                device,
                size,
                reason: "borrowed memory needs a non-null pointer and at least one byte".into(),
            });
        }
        let stream = new_stream(ordinal)?;
        // SAFETY: the caller promises `ptr..ptr + size` is live memory of this device's
        // primary context for as long as this value; `borrowed` makes drop leak the slice
        // rather than free the caller's memory.
        let slice = unsafe { stream.upgrade_device_ptr::<u8>(ptr, size) };
        Self::with_slice(ordinal, stream, slice, true)
    }

    /// Takes over memory the application allocated with cudarc, with the stream that
    /// orders its copies.
    ///
    /// # Errors
    ///
    /// [`DeviceError::Failed`] when its address cannot be read.
    pub fn from_slice(stream: Arc<CudaStream>, slice: CudaSlice<u8>) -> Result<Self, DeviceError> {
        let ordinal = stream.context().ordinal() as u32;
        Self::with_slice(ordinal, stream, slice, false)
    }

    fn with_slice(
        ordinal: u32,
        stream: Arc<CudaStream>,
        slice: CudaSlice<u8>,
        borrowed: bool,
    ) -> Result<Self, DeviceError> {
        let address = fenced(
            || {
                let (address, _sync) = slice.device_ptr(&stream);
                Ok::<_, DeviceError>(address)
            },
            |reason| DeviceError::Failed {
                device: format!("CUDA device {ordinal}"),
                operation: "reading the address",
                reason,
            },
        )?;
        Ok(Self {
            ordinal,
            size: slice.len() as u64,
            address,
            stream,
            slice: Mutex::new(Some(slice)),
            borrowed,
        })
    }

    /// The device's ordinal.
    #[must_use]
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The stream its copies are ordered on; a kernel that reads the memory after a copy
    /// belongs on it.
    #[must_use]
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Whether the memory is the caller's ([`CudaMemory::from_raw`]).
    #[must_use]
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    fn failed(&self, operation: &'static str) -> impl FnOnce(String) -> DeviceError {
        let device = self.describe();
        move |reason| DeviceError::Failed {
            device,
            operation,
            reason,
        }
    }
}

impl DeviceMemory for CudaMemory {
    fn size(&self) -> u64 {
        self.size
    }

    fn address(&self) -> u64 {
        self.address
    }

    fn describe(&self) -> String {
        format!("CUDA device {}", self.ordinal)
    }

    fn cuda_ordinal(&self) -> Option<u32> {
        Some(self.ordinal)
    }

    fn write(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
        check_range(self.size, offset, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let mut slice = self.slice.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slice) = slice.as_mut() else {
            return Err(self.failed("copy to the device")(
                "the memory is being dropped".into(),
            ));
        };
        let start = offset as usize;
        fenced(
            || {
                let mut view = slice.slice_mut(start..start + src.len());
                self.stream.memcpy_htod(src, &mut view)?;
                self.stream.synchronize()
            },
            self.failed("copy to the device"),
        )
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        check_range(self.size, offset, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let slice = self.slice.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slice) = slice.as_ref() else {
            return Err(self.failed("copy from the device")(
                "the memory is being dropped".into(),
            ));
        };
        let start = offset as usize;
        let len = dst.len();
        fenced(
            || {
                let view = slice.slice(start..start + len);
                self.stream.memcpy_dtoh(&view, dst)?;
                self.stream.synchronize()
            },
            self.failed("copy from the device"),
        )
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        if self.borrowed {
            let slice = self
                .slice
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            // The caller's allocation: let cudarc forget it rather than free it. A driver
            // that is gone by now is no reason to panic in drop.
            let _ = catch_unwind(AssertUnwindSafe(|| slice.map(CudaSlice::leak)));
        }
    }
}

/// Allocates [`CudaMemory`] by device ordinal: the cache's GPU buffers.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaAllocator;

impl DeviceAllocator for CudaAllocator {
    fn alloc(&self, device: u32, size: usize) -> Result<Arc<dyn DeviceMemory>, DeviceError> {
        Ok(Arc::new(CudaMemory::alloc(device, size)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU the answer is a typed error that says what is missing; with one, the
    /// bytes go there and back. `FERROCE_REQUIRE_GPU=1` turns the skip into a failure.
    #[test]
    fn memory_round_trips_or_says_why_not() {
        match CudaMemory::alloc(0, 1 << 20) {
            Ok(memory) => {
                let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
                memory.write(12345, &data).unwrap();
                let mut back = vec![0; data.len()];
                memory.read(12345, &mut back).unwrap();
                assert_eq!(back, data);
                assert!(matches!(
                    memory.write((1 << 20) - 1, &[1, 2]),
                    Err(DeviceError::OutOfRange { .. })
                ));
                assert_ne!(memory.address(), 0);
            }
            Err(DeviceError::Unavailable(why)) => {
                assert!(
                    std::env::var_os("FERROCE_REQUIRE_GPU").is_none(),
                    "a GPU was required: {why}"
                );
                eprintln!("skipping the CUDA round trip: {why}");
                assert!(why.contains("CUDA"), "{why}");
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Borrowed memory is read and written like owned memory, and dropping it leaves the
    /// owner's allocation usable. Without a GPU, the refusal says why.
    #[test]
    #[allow(unsafe_code)]
    fn borrowed_memory_is_used_and_left_alone() {
        // SAFETY: a null pointer is refused before the driver is asked anything.
        let null = unsafe { CudaMemory::from_raw(0, 0, 64) };
        assert!(
            matches!(null, Err(DeviceError::Allocation { .. })),
            "{null:?}"
        );
        let owner = match CudaMemory::alloc(0, 1 << 16) {
            Ok(owner) => owner,
            Err(DeviceError::Unavailable(why)) => {
                assert!(
                    std::env::var_os("FERROCE_REQUIRE_GPU").is_none(),
                    "a GPU was required: {why}"
                );
                eprintln!("skipping the borrowed-memory round trip: {why}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
        {
            // SAFETY: `owner` holds the allocation and outlives `borrowed`.
            let borrowed =
                unsafe { CudaMemory::from_raw(0, owner.address() + 4096, 8192) }.unwrap();
            assert!(borrowed.is_borrowed());
            borrowed.write(100, &data).unwrap();
            assert!(matches!(
                borrowed.write(8000, &data),
                Err(DeviceError::OutOfRange { .. })
            ));
        }
        let mut back = vec![0; data.len()];
        owner.read(4096 + 100, &mut back).unwrap();
        assert_eq!(
            back, data,
            "the owner sees the borrowed writes, and is still allocated"
        );
    }

    #[test]
    fn missing_devices_are_named() {
        match CudaMemory::alloc(4095, 64) {
            Err(DeviceError::Unavailable(why)) => assert!(why.contains("CUDA"), "{why}"),
            other => panic!("device 4095 should not exist: {other:?}"),
        }
        assert!(matches!(
            CudaMemory::alloc(0, 0),
            Err(DeviceError::Allocation { .. })
        ));
    }
}
