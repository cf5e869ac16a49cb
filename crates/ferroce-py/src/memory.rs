//! Memory across the Python boundary, by the dict and capsule protocols (an `abi3-py310`
//! module has no buffer protocol of its own): `__array_interface__` (NumPy),
//! `__cuda_array_interface__` (CuPy, Numba, PyTorch) and DLPack (`__dlpack__`).
//!
//! Out of ferroce: [`array_interface`], [`cuda_array_interface`] and [`dlpack_capsule`]
//! describe bytes ferroce keeps alive (a frame's page, say) without copying them.
//!
//! Into ferroce: [`borrow_of`] registers an array's or an address's memory in place,
//! [`borrowed_cuda`] a CUDA array as a receiver's device memory (both keep the object alive),
//! and [`bytes_of`] takes a copy of any object's bytes. Raw addresses from Python
//! (`(address, length)`, an interface's data pointer) are read through `/proc/self/mem`,
//! so a wrong address is an error, not a crash. [`Writable`] is where a checked copy goes:
//! a `bytearray`, or a writable, C-contiguous object with `__array_interface__`.

#![allow(unsafe_code)]

use std::any::Any;
use std::ffi::c_void;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyCapsule, PyDict, PyTuple};

use ferroce::device::DeviceMemory;

use crate::errors::Error;

/// DLPack's device types (`DLDeviceType`).
pub(crate) const KDL_CPU: i32 = 1;
pub(crate) const KDL_CUDA: i32 = 2;
const KDL_CUDA_HOST: i32 = 3;

/// Where exported bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    Host,
    Cuda(u32),
}

impl Place {
    /// `(device_type, device_id)`, as `__dlpack_device__` answers.
    pub(crate) fn dlpack_device(self) -> (i32, i32) {
        match self {
            Self::Host => (KDL_CPU, 0),
            Self::Cuda(ordinal) => (KDL_CUDA, ordinal as i32),
        }
    }
}

/// The version 3 `__array_interface__` of `len` bytes at `addr`, as one-dimensional uint8.
pub(crate) fn array_interface<'py>(
    py: Python<'py>,
    addr: u64,
    len: usize,
    readonly: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("version", 3)?;
    d.set_item("shape", (len,))?;
    d.set_item("typestr", "|u1")?;
    d.set_item("data", (addr, readonly))?;
    d.set_item("strides", py.None())?;
    Ok(d)
}

/// The version 3 `__cuda_array_interface__` of `len` bytes at device address `addr`. The
/// bytes are already in place when a frame is handed out (the copy to the device finished
/// before the frame was queued), so there is no stream to synchronise with.
pub(crate) fn cuda_array_interface<'py>(
    py: Python<'py>,
    addr: u64,
    len: usize,
    readonly: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let d = array_interface(py, addr, len, readonly)?;
    d.set_item("stream", py.None())?;
    Ok(d)
}

// DLPack's C structures (dlpack.h, the unversioned `DLManagedTensor` every consumer takes).

#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut Self)>,
}

/// An exported tensor and what keeps its bytes alive; `managed` comes first so that a
/// pointer to it is a pointer to the whole.
#[repr(C)]
struct Exported {
    managed: DlManagedTensor,
    shape: [i64; 1],
    strides: [i64; 1],
    _owner: Box<dyn Any + Send>,
}

/// The deleter of tensors [`dlpack_capsule`] made: frees the box and drops the owner (which
/// needs no interpreter: owners are Rust values).
unsafe extern "C" fn delete_exported(managed: *mut DlManagedTensor) {
    if managed.is_null() {
        return;
    }
    // SAFETY: `managed` is the first field of an `Exported` that `dlpack_capsule` leaked
    // with `Box::into_raw`, and DLPack calls the deleter once: either the consumer (which
    // renamed the capsule) or the capsule's destructor (which saw it unconsumed), never
    // both.
    drop(unsafe { Box::from_raw(managed.cast::<Exported>()) });
}

/// The capsule destructor: a capsule still named `dltensor` was never consumed, so its
/// tensor is ours to delete; a consumer renames it `used_dltensor` and deletes it itself.
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: CPython calls this with the capsule being destroyed, holding the GIL;
    // `PyCapsule_IsValid` sets no exception when the name differs.
    if unsafe { ffi::PyCapsule_IsValid(capsule, c"dltensor".as_ptr()) } != 1 {
        return;
    }
    // SAFETY: the capsule is valid under this name (checked just above).
    let pointer = unsafe { ffi::PyCapsule_GetPointer(capsule, c"dltensor".as_ptr()) };
    let managed = pointer.cast::<DlManagedTensor>();
    if managed.is_null() {
        return;
    }
    // SAFETY: an unconsumed capsule of ours holds a live tensor whose deleter is ours.
    unsafe {
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
}

/// A DLPack capsule (`dltensor`) of `len` uint8 bytes at `addr` in `place`, keeping `owner`
/// alive until the consumer is done with the bytes.
pub(crate) fn dlpack_capsule<'py>(
    py: Python<'py>,
    addr: u64,
    len: usize,
    place: Place,
    owner: Box<dyn Any + Send>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let (device_type, device_id) = place.dlpack_device();
    let exported = Box::new(Exported {
        managed: DlManagedTensor {
            dl_tensor: DlTensor {
                data: addr as usize as *mut c_void,
                device: DlDevice {
                    device_type,
                    device_id,
                },
                ndim: 1,
                dtype: DlDataType {
                    code: 1, // kDLUInt
                    bits: 8,
                    lanes: 1,
                },
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
        },
        shape: [len as i64],
        strides: [1],
        _owner: owner,
    });
    let raw = Box::into_raw(exported);
    // SAFETY: `raw` came from `Box::into_raw` just now; the shape and strides point into the
    // same allocation, which lives until the deleter frees it.
    unsafe {
        (*raw).managed.dl_tensor.shape = (*raw).shape.as_mut_ptr();
        (*raw).managed.dl_tensor.strides = (*raw).strides.as_mut_ptr();
        (*raw).managed.manager_ctx = raw.cast();
    }
    let pointer =
        NonNull::new(raw.cast::<c_void>()).ok_or_else(|| Error::invalid("null tensor"))?;
    // SAFETY: the pointer is a live `DlManagedTensor` (the first field of `Exported`); the
    // destructor deletes it only while the capsule is unconsumed, as DLPack prescribes.
    let made = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            pointer,
            c"dltensor",
            Some(capsule_destructor),
        )
    };
    if made.is_err() {
        // SAFETY: the capsule was not made, so nothing else owns the tensor.
        unsafe { delete_exported(raw.cast()) };
    }
    made
}

/// Copies `len` bytes at `addr` of this process, through `/proc/self/mem` so that a wrong
/// address answers an error instead of a segmentation fault.
pub(crate) fn read_address(addr: u64, len: usize) -> Result<Vec<u8>, Error> {
    let file = File::open("/proc/self/mem").map_err(|e| {
        Error::unsupported(format!(
            "cannot read memory by address here (/proc/self/mem: {e}); pass a bytes-like object"
        ))
    })?;
    let mut out = vec![0u8; len];
    file.read_exact_at(&mut out, addr).map_err(|e| {
        Error::invalid(format!(
            "cannot read {len} bytes at address {addr:#x}: {e} (not mapped in this process?)"
        ))
    })?;
    Ok(out)
}

/// The item size of an array-interface type string (`"<f4"`, `"|u1"`).
fn itemsize(typestr: &str) -> Result<usize, Error> {
    typestr
        .get(2..)
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| Error::invalid(format!("unknown array type string {typestr:?}")))
}

/// The data pointer, byte length and writability of a C-contiguous array interface.
struct Described {
    addr: u64,
    len: usize,
    readonly: bool,
}

fn describe_interface(iface: &Bound<'_, PyAny>) -> PyResult<Option<Described>> {
    let shape: Vec<usize> = iface.get_item("shape")?.extract()?;
    let typestr: String = iface.get_item("typestr")?.extract()?;
    let size = itemsize(&typestr)?;
    let len = shape
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::invalid("the array's size overflows"))?;
    if let Ok(strides) = iface.get_item("strides") {
        if !strides.is_none() {
            let strides: Vec<isize> = strides.extract()?;
            let mut expected = size as isize;
            for (i, &d) in shape.iter().enumerate().rev() {
                if d > 1 && strides[i] != expected {
                    return Err(Error::invalid(
                        "the array is not C-contiguous; pass a contiguous copy",
                    )
                    .into());
                }
                expected *= d as isize;
            }
        }
    }
    let data = iface.get_item("data")?;
    if data.is_none() {
        return Ok(None);
    }
    let (addr, readonly): (u64, bool) = data.extract()?;
    if let Ok(offset) = iface.get_item("offset") {
        if !offset.is_none() {
            let offset: u64 = offset.extract()?;
            return Ok(Some(Described {
                addr: addr + offset,
                len,
                readonly,
            }));
        }
    }
    Ok(Some(Described {
        addr,
        len,
        readonly,
    }))
}

fn interface_of<'py>(obj: &Bound<'py, PyAny>, name: &str) -> Option<Bound<'py, PyAny>> {
    obj.getattr(name).ok().filter(|i| !i.is_none())
}

/// The device pointer and byte length of an object's C-contiguous
/// `__cuda_array_interface__` (a CuPy array, a PyTorch CUDA tensor); `None` when it has none.
pub(crate) fn cuda_array_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<(u64, usize)>> {
    let Some(iface) = interface_of(obj, "__cuda_array_interface__") else {
        return Ok(None);
    };
    match describe_interface(&iface)? {
        Some(d) if d.readonly => Err(Error::invalid(
            "the CUDA array is read-only; frames need memory they may write",
        )
        .into()),
        Some(d) if d.addr != 0 && d.len > 0 => Ok(Some((d.addr, d.len))),
        _ => Err(Error::invalid("the CUDA array has no data (a null pointer or no bytes)").into()),
    }
}

/// Whether `obj` lives in GPU memory (it has a `__cuda_array_interface__`, or its DLPack
/// device is not the CPU).
pub(crate) fn is_device_object(obj: &Bound<'_, PyAny>) -> bool {
    if interface_of(obj, "__cuda_array_interface__").is_some() {
        return true;
    }
    obj.call_method0("__dlpack_device__")
        .and_then(|d| d.extract::<(i32, i32)>())
        .is_ok_and(|(t, _)| t != KDL_CPU && t != KDL_CUDA_HOST)
}

/// Copies the bytes of a DLPack producer in host memory.
fn dlpack_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let capsule = obj.call_method0("__dlpack__")?;
    let capsule = capsule
        .cast::<PyCapsule>()
        .map_err(|_| Error::invalid("__dlpack__ did not return a capsule"))?;
    let pointer = capsule
        .pointer_checked(Some(c"dltensor"))
        .map_err(|_| Error::invalid("__dlpack__ did not return an unused \"dltensor\" capsule"))?;
    let managed = pointer.as_ptr().cast::<DlManagedTensor>();
    // SAFETY: a producer's "dltensor" capsule holds a live DLManagedTensor until its deleter
    // runs; we read its description under the GIL while the capsule is alive.
    let (addr, len, device) = unsafe {
        let t = &(*managed).dl_tensor;
        let ndim = usize::try_from(t.ndim).unwrap_or(0);
        let shape = if ndim == 0 || t.shape.is_null() {
            &[][..]
        } else {
            std::slice::from_raw_parts(t.shape, ndim)
        };
        let item = usize::from(t.dtype.bits).div_ceil(8) * usize::from(t.dtype.lanes);
        let mut len = Some(item);
        for &d in shape {
            len = len.and_then(|n| n.checked_mul(usize::try_from(d).ok()?));
        }
        if !t.strides.is_null() {
            let strides = std::slice::from_raw_parts(t.strides, ndim);
            let mut expected = 1i64;
            for i in (0..ndim).rev() {
                if shape[i] > 1 && strides[i] != expected {
                    len = None;
                }
                expected *= shape[i];
            }
        }
        (
            (t.data as usize as u64).wrapping_add(t.byte_offset),
            len,
            t.device.device_type,
        )
    };
    let result = match (len, device) {
        (None, _) => Err(Error::invalid(
            "the DLPack tensor is not C-contiguous; pass a contiguous copy",
        )),
        (Some(_), d) if d != KDL_CPU && d != KDL_CUDA_HOST => Err(Error::unsupported(format!(
            "DLPack device type {d} is not host memory"
        ))),
        (Some(len), _) => read_address(addr, len),
    };
    // We consumed the tensor: rename the capsule so its destructor leaves it, and delete it.
    // SAFETY: the capsule holds the live tensor read above; renaming, then calling the
    // deleter once, is the consumer's part of the protocol.
    unsafe {
        ffi::PyCapsule_SetName(capsule.as_ptr(), c"used_dltensor".as_ptr());
        if let Some(deleter) = (*managed).deleter {
            deleter(managed);
        }
    }
    Ok(result?)
}

/// A copy of the bytes of `obj`: a `(address, length)` tuple, an object with
/// `__array_interface__` or `__dlpack__` in host memory, or anything `memoryview` takes.
/// GPU objects are refused with `NotSupported` (their bytes are not the CPU's to read).
pub(crate) fn bytes_of(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        let (addr, len): (u64, usize) = t
            .extract()
            .map_err(|_| Error::invalid("a memory tuple is (address, length), two integers"))?;
        return Ok(read_address(addr, len)?);
    }
    if is_device_object(obj) {
        return Err(Error::unsupported(
            "GPU memory cannot be read by the CPU here; copy it to the host first (or build \
             with the cuda feature and pass device memory where an API takes it)",
        )
        .into());
    }
    if let Some(iface) = interface_of(obj, "__array_interface__") {
        if let Some(d) = describe_interface(&iface)? {
            return Ok(read_address(d.addr, d.len)?);
        }
    }
    if obj.hasattr("__dlpack__")? && obj.hasattr("__dlpack_device__")? {
        return dlpack_bytes(obj);
    }
    let view = obj
        .py()
        .import("builtins")?
        .getattr("memoryview")?
        .call1((obj,))
        .map_err(|_| {
            Error::invalid(format!(
                "cannot take the bytes of a {}: pass a bytes-like object, an array (array \
                 interface or DLPack), or (address, length)",
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
    let bytes = view.call_method0("tobytes")?;
    Ok(bytes.cast::<PyBytes>()?.as_bytes().to_vec())
}

/// The caller's own memory for a region, without a copy, where it can be had soundly:
///
/// - an object with a writable, C-contiguous `__array_interface__` in host memory (a NumPy
///   array): a reference to the object is kept for as long as the region's memory lives, and
///   NumPy refuses to resize an array something else refers to, so its data stays put;
/// - `(address, length)`, as Mooncake's `register_memory(addr, capacity)` takes it: both ends
///   are checked to be mapped now, and the caller answers for the memory staying allocated
///   while the region lives (freeing it first lets peers write into whatever reuses it).
///
/// `None` for everything else (bytes are immutable; a `bytearray` can be resized under the
/// region, and an abi3 module for 3.10 cannot pin it through the buffer protocol; DLPack
/// exports are copied), which the caller then copies.
pub(crate) fn borrow_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<ferroce::MappedMemory>> {
    let (addr, len, owner): (u64, usize, Box<dyn Any + Send + Sync>) =
        if let Ok(t) = obj.cast::<PyTuple>() {
            let (addr, len): (u64, usize) = t
                .extract()
                .map_err(|_| Error::invalid("a memory tuple is (address, length), two integers"))?;
            (addr, len, Box::new(()))
        } else if let Some(iface) = interface_of(obj, "__array_interface__") {
            let Some(d) = describe_interface(&iface)? else {
                return Ok(None);
            };
            if d.readonly {
                return Ok(None);
            }
            (d.addr, d.len, Box::new(obj.clone().unbind()))
        } else {
            return Ok(None);
        };
    if len == 0 {
        return Err(Error::invalid("a region needs at least one byte; the memory has none").into());
    }
    // Both ends mapped in this process now; the rest is the caller's (or the array's) promise.
    read_address(addr, 1)?;
    read_address(addr.saturating_add(len as u64 - 1), 1)?;
    // SAFETY: `addr..addr + len` is mapped (checked just above) and is either an array's data,
    // kept allocated and unmoved by the reference `owner` holds, or memory the caller passed
    // by address and promised to keep (the documented contract of `Region`).
    let memory = unsafe { ferroce::MappedMemory::borrow(addr, len, owner) }.map_err(Error::from)?;
    Ok(Some(memory))
}

/// Where a checked copy goes: a `bytearray`, or a writable C-contiguous object with an
/// `__array_interface__` (a NumPy array). Borrowed for the copy only, with the GIL held, so
/// nothing can resize or free it meanwhile.
pub(crate) fn with_writable<R>(
    out: &Bound<'_, PyAny>,
    f: impl FnOnce(&mut [u8]) -> R,
) -> PyResult<R> {
    if let Ok(b) = out.cast::<PyByteArray>() {
        // SAFETY: we hold the GIL and run no Python code while the slice lives, so the
        // bytearray cannot be resized or freed (we also hold a reference to it).
        let slice = unsafe { b.as_bytes_mut() };
        return Ok(f(slice));
    }
    let Some(iface) = interface_of(out, "__array_interface__") else {
        return Err(Error::invalid(
            "out must be a bytearray or a writable array with __array_interface__ (a NumPy array)",
        )
        .into());
    };
    let Some(d) = describe_interface(&iface)? else {
        return Err(Error::invalid("out's array interface gives no data pointer").into());
    };
    if d.readonly {
        return Err(Error::invalid("out is read-only").into());
    }
    if d.len == 0 {
        return Ok(f(&mut []));
    }
    // Check the range is this process's memory before handing out a slice of it.
    read_address(d.addr, 1)?;
    read_address(d.addr + d.len as u64 - 1, 1)?;
    // SAFETY: the object's array interface promises `len` writable bytes at `addr` for as
    // long as the object lives; we hold a reference and the GIL and run no Python code while
    // the slice lives, so it can be neither freed nor resized.
    let slice = unsafe { std::slice::from_raw_parts_mut(d.addr as usize as *mut u8, d.len) };
    Ok(f(slice))
}

/// A caller's CUDA array as the receiver's device memory (Hololink's `cu_buffer`): frames
/// land there without ferroce allocating anything, and the array is kept alive meanwhile.
#[cfg(feature = "cuda")]
pub(crate) fn borrowed_cuda(
    object: &Bound<'_, PyAny>,
    ordinal: u32,
    addr: u64,
    len: usize,
) -> Result<std::sync::Arc<dyn DeviceMemory>, Error> {
    // SAFETY: the array's `__cuda_array_interface__` promises `len` bytes at `addr` on its
    // device for as long as the array lives, and `BorrowedCuda` holds a reference to it for
    // as long as the memory is used.
    let memory = unsafe { ferroce::cuda::CudaMemory::from_raw(ordinal, addr, len) }?;
    Ok(std::sync::Arc::new(BorrowedCuda {
        memory,
        _owner: object.clone().unbind(),
    }))
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn borrowed_cuda(
    _object: &Bound<'_, PyAny>,
    _ordinal: u32,
    _addr: u64,
    _len: usize,
) -> Result<std::sync::Arc<dyn DeviceMemory>, Error> {
    Err(Error::unsupported(
        "device_memory is a CUDA array: that needs ferroce built with the cuda feature (pip \
         install with MATURIN_PEP517_ARGS=\"--features cuda\")",
    ))
}

/// CUDA memory a Python object owns, borrowed with a reference to the object.
#[cfg(feature = "cuda")]
#[derive(Debug)]
struct BorrowedCuda {
    memory: ferroce::cuda::CudaMemory,
    _owner: Py<PyAny>,
}

#[cfg(feature = "cuda")]
impl DeviceMemory for BorrowedCuda {
    fn size(&self) -> u64 {
        self.memory.size()
    }

    fn address(&self) -> u64 {
        self.memory.address()
    }

    fn describe(&self) -> String {
        format!("{} (a caller's CUDA array)", self.memory.describe())
    }

    fn cuda_ordinal(&self) -> Option<u32> {
        self.memory.cuda_ordinal()
    }

    fn write(&self, offset: u64, src: &[u8]) -> Result<(), ferroce::device::DeviceError> {
        self.memory.write(offset, src)
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), ferroce::device::DeviceError> {
        self.memory.read(offset, dst)
    }
}
