//! The frames face (Hololink's `RoceReceiverInterfaceV2`): `Receiver`, `Frame` (a zero-copy view),
//! `Sender`, and the bridge's data channel (`DataChannel`, `DeviceRegisters`).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCapsule, PyDict, PyTuple};

use ferroce::device::{DeviceError, DeviceMemory};
use ferroce::frames::{
    self as rf, control, FrameReadError, FrameView, ImmediateLayout, MonitorError, ViewMemory,
};
use ferroce::{MappedMemory, RegionMemory};

use crate::errors::{Class, Error};
use crate::memory::{self, Place};
use crate::nic::Nic;
use crate::util;
use crate::wait;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn layout_name(l: ImmediateLayout) -> &'static str {
    match l {
        ImmediateLayout::Buffer8 => "buffer8",
        _ => "page12",
    }
}

fn layout(name: &str) -> Result<ImmediateLayout, Error> {
    match name.to_ascii_lowercase().as_str() {
        "page12" => Ok(ImmediateLayout::Page12),
        "buffer8" => Ok(ImmediateLayout::Buffer8),
        other => Err(Error::invalid(format!(
            "immediate layout {other:?} is neither \"page12\" nor \"buffer8\""
        ))),
    }
}

/// The metadata block the device writes after each frame, decoded.
#[pyclass(module = "ferroce.frames", frozen, get_all)]
pub(crate) struct Metadata {
    flags: u32,
    psn: u32,
    crc: u32,
    timestamp_s: u64,
    timestamp_ns: u32,
    bytes_written: u64,
    frame_number: u32,
    metadata_s: u64,
    metadata_ns: u32,
}

impl From<&rf::Metadata> for Metadata {
    fn from(m: &rf::Metadata) -> Self {
        Self {
            flags: m.flags,
            psn: m.psn,
            crc: m.crc,
            timestamp_s: m.timestamp_s,
            timestamp_ns: m.timestamp_ns,
            bytes_written: m.bytes_written,
            frame_number: m.frame_number,
            metadata_s: m.metadata_s,
            metadata_ns: m.metadata_ns,
        }
    }
}

#[pymethods]
impl Metadata {
    /// Whether the frame ended before its full size (`FLAG_EARLY_END`).
    #[getter]
    fn early_end(&self) -> bool {
        self.flags & rf::FLAG_EARLY_END != 0
    }

    fn __repr__(&self) -> String {
        format!(
            "Metadata(frame_number={}, bytes_written={}, psn={:#x}, flags={:#x})",
            self.frame_number, self.bytes_written, self.psn, self.flags
        )
    }
}

/// One completed frame (Hololink's `RoceReceiverFrameInfoV1`, with ferroce's additions):
/// `packets_lost` and `is_complete()` say what was lost.
#[pyclass(module = "ferroce.frames", frozen)]
pub(crate) struct FrameInfo {
    pub(crate) inner: rf::FrameInfo,
}

#[pymethods]
impl FrameInfo {
    #[getter]
    fn page(&self) -> u32 {
        self.inner.page
    }

    #[getter]
    fn received_frame_number(&self) -> u64 {
        self.inner.received_frame_number
    }

    #[getter]
    fn frame_number(&self) -> u64 {
        self.inner.frame_number
    }

    #[getter]
    fn imm(&self) -> u32 {
        self.inner.imm
    }

    /// When the receiver took the frame, in seconds since the Unix epoch.
    #[getter]
    fn received(&self) -> f64 {
        util::unix_seconds(self.inner.received)
    }

    #[getter]
    fn dropped(&self) -> u64 {
        self.inner.dropped
    }

    #[getter]
    fn metadata(&self) -> Metadata {
        Metadata::from(&self.inner.metadata)
    }

    #[getter]
    fn packets_received(&self) -> u64 {
        self.inner.packets_received
    }

    #[getter]
    fn packets_lost(&self) -> u64 {
        self.inner.packets_lost
    }

    #[getter]
    fn bytes_received(&self) -> u64 {
        self.inner.bytes_received
    }

    #[getter]
    fn metadata_psn_matches(&self) -> bool {
        self.inner.metadata_psn_matches
    }

    #[getter]
    fn page_epoch(&self) -> u64 {
        self.inner.page_epoch
    }

    #[getter]
    fn packets_counted(&self) -> bool {
        self.inner.packets_counted
    }

    /// Whether every byte the metadata announces arrived, with no packet lost.
    fn is_complete(&self) -> bool {
        self.inner.is_complete()
    }

    fn __repr__(&self) -> String {
        format!(
            "FrameInfo(page={}, frame_number={}, bytes={}, packets_lost={}, complete={})",
            self.inner.page,
            self.inner.frame_number,
            self.inner.metadata.bytes_written,
            self.inner.packets_lost,
            self.inner.is_complete()
        )
    }
}

/// The receiver's own counters.
#[pyclass(module = "ferroce.frames", frozen, get_all)]
pub(crate) struct FrameCounters {
    frames: u64,
    frames_dropped: u64,
    incomplete_frames: u64,
    packets_lost: u64,
    packets: u64,
    late_packets: u64,
    page_out_of_range: u64,
    write_crosses_page: u64,
    page_mismatch: u64,
    metadata_misplaced: u64,
    metadata_psn_mismatch: u64,
}

impl From<rf::FrameCounters> for FrameCounters {
    fn from(c: rf::FrameCounters) -> Self {
        Self {
            frames: c.frames,
            frames_dropped: c.frames_dropped,
            incomplete_frames: c.incomplete_frames,
            packets_lost: c.packets_lost,
            packets: c.packets,
            late_packets: c.late_packets,
            page_out_of_range: c.page_out_of_range,
            write_crosses_page: c.write_crosses_page,
            page_mismatch: c.page_mismatch,
            metadata_misplaced: c.metadata_misplaced,
            metadata_psn_mismatch: c.metadata_psn_mismatch,
        }
    }
}

#[pymethods]
impl FrameCounters {
    fn __repr__(&self) -> String {
        format!(
            "FrameCounters(frames={}, frames_dropped={}, incomplete_frames={}, packets_lost={}, packets={})",
            self.frames, self.frames_dropped, self.incomplete_frames, self.packets_lost, self.packets
        )
    }
}

/// Device memory implemented in Python: an object with `size()`, `address()`,
/// `describe()`, `write(offset, data)` and `read(offset, length) -> bytes`, the methods of
/// Rust's `DeviceMemory`. The receiver calls it from its monitor thread (attaching to the
/// interpreter); an exception is a failed copy, which fails the receive path.
struct PyDeviceMemory {
    object: Py<PyAny>,
    size: u64,
    address: u64,
    describe: String,
}

impl std::fmt::Debug for PyDeviceMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PyDeviceMemory")
            .field("describe", &self.describe)
            .finish_non_exhaustive()
    }
}

impl PyDeviceMemory {
    fn new(object: &Bound<'_, PyAny>) -> PyResult<Self> {
        let size: u64 = object.call_method0("size")?.extract()?;
        let address: u64 = object.call_method0("address")?.extract()?;
        let describe: String = object.call_method0("describe")?.extract()?;
        Ok(Self {
            object: object.clone().unbind(),
            size,
            address,
            describe,
        })
    }

    fn failed(&self, operation: &'static str, reason: String) -> DeviceError {
        DeviceError::Failed {
            device: self.describe.clone(),
            operation,
            reason,
        }
    }
}

impl DeviceMemory for PyDeviceMemory {
    fn size(&self) -> u64 {
        self.size
    }

    fn address(&self) -> u64 {
        self.address
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn write(&self, offset: u64, src: &[u8]) -> Result<(), DeviceError> {
        ferroce::device::check_range(self.size, offset, src.len())?;
        Python::try_attach(|py| {
            self.object
                .call_method1(py, "write", (offset, PyBytes::new(py, src)))
                .map(drop)
                .map_err(|e| self.failed("write", e.to_string()))
        })
        .unwrap_or_else(|| Err(self.failed("write", "the interpreter is shutting down".into())))
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), DeviceError> {
        ferroce::device::check_range(self.size, offset, dst.len())?;
        Python::try_attach(|py| {
            let got = self
                .object
                .call_method1(py, "read", (offset, dst.len()))
                .map_err(|e| self.failed("read", e.to_string()))?;
            let bytes =
                memory::bytes_of(got.bind(py)).map_err(|e| self.failed("read", e.to_string()))?;
            if bytes.len() != dst.len() {
                return Err(self.failed(
                    "read",
                    format!("read returned {} bytes, not {}", bytes.len(), dst.len()),
                ));
            }
            dst.copy_from_slice(&bytes);
            Ok(())
        })
        .unwrap_or_else(|| Err(self.failed("read", "the interpreter is shutting down".into())))
    }
}

/// How a `Receiver` is started (Hololink's `start` parameters). The defaults are the
/// bridge's own layout for `pages` frames of `frame_size` bytes (`for_frames`); the ring is
/// mapped memory, so frames can be viewed where they land.
///
/// `device`: `"cpu"` (the ring), `"cuda:N"` (CUDA memory on device N, the `cuda` feature), or
/// leave it and pass `device_memory`: a CUDA array of the caller's (CuPy, PyTorch: anything
/// with a writable `__cuda_array_interface__`; Hololink's `cu_buffer`, the `cuda` feature),
/// which frames land in and which the receiver keeps alive, or an object implementing the
/// device-memory methods in Python.
#[pyclass(module = "ferroce.frames", get_all, set_all)]
pub(crate) struct ReceiverConfig {
    frame_size: usize,
    page_size: usize,
    pages: u32,
    metadata_offset: usize,
    peer_ip: String,
    queue_size: usize,
    immediate: String,
    device: String,
    device_memory: Option<Py<PyAny>>,
}

#[pymethods]
impl ReceiverConfig {
    #[new]
    #[pyo3(
        signature = (frame_size, pages, peer_ip, *, page_size=None, metadata_offset=None, queue_size=None, immediate="page12".to_owned(), device="cpu".to_owned(), device_memory=None),
        text_signature = "(frame_size, pages, peer_ip, *, page_size=None, metadata_offset=None, queue_size=None, immediate='page12', device='cpu', device_memory=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        frame_size: usize,
        pages: u32,
        peer_ip: String,
        page_size: Option<usize>,
        metadata_offset: Option<usize>,
        queue_size: Option<usize>,
        immediate: String,
        device: String,
        device_memory: Option<Py<PyAny>>,
    ) -> Self {
        let metadata = metadata_offset.unwrap_or_else(|| rf::round_up(frame_size));
        Self {
            frame_size,
            page_size: page_size.unwrap_or(metadata.saturating_add(rf::METADATA_SIZE)),
            pages,
            metadata_offset: metadata,
            peer_ip,
            queue_size: queue_size.unwrap_or((pages as usize).clamp(1, 4)),
            immediate,
            device,
            device_memory,
        }
    }

    /// The bridge's own layout for `pages` frames of `frame_size` bytes.
    #[staticmethod]
    fn for_frames(frame_size: usize, pages: u32, peer_ip: String) -> Self {
        Self::new(
            frame_size,
            pages,
            peer_ip,
            None,
            None,
            None,
            "page12".into(),
            "cpu".into(),
            None,
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "ReceiverConfig(frame_size={}, pages={}, peer_ip={:?}, page_size={}, metadata_offset={}, queue_size={}, device={:?})",
            self.frame_size, self.pages, self.peer_ip, self.page_size, self.metadata_offset, self.queue_size, self.device
        )
    }
}

impl ReceiverConfig {
    fn to_rust(&self, py: Python<'_>) -> PyResult<rf::ReceiverConfig> {
        let peer = util::ip(&self.peer_ip)?;
        let ring = self
            .page_size
            .checked_mul(self.pages as usize)
            .ok_or_else(|| Error::invalid("page_size × pages overflows"))?;
        let memory = if ring == 0 {
            // Let the receiver's own checks name what is zero.
            RegionMemory::Pageable(Vec::new())
        } else {
            RegionMemory::Mapped(MappedMemory::new(ring).map_err(Error::from)?)
        };
        let device_memory: Option<Arc<dyn DeviceMemory>> =
            match (&self.device_memory, self.device.as_str()) {
                (Some(object), device) => match memory::cuda_array_of(object.bind(py))? {
                    Some((addr, len)) => {
                        let ordinal = device_of(object.bind(py), device)?;
                        Some(memory::borrowed_cuda(object.bind(py), ordinal, addr, len)?)
                    }
                    None => Some(Arc::new(PyDeviceMemory::new(object.bind(py))?)),
                },
                (None, "cpu" | "host") => None,
                (None, other) => Some(cuda_memory(other, ring)?),
            };
        Ok(rf::ReceiverConfig {
            memory,
            frame_size: self.frame_size,
            page_size: self.page_size,
            pages: self.pages,
            metadata_offset: self.metadata_offset,
            peer_ip: peer,
            queue_size: self.queue_size,
            immediate: layout(&self.immediate)?,
            device_memory,
        })
    }
}

/// The CUDA device an array is on: CuPy's `array.device.id`, PyTorch's `tensor.device.index`,
/// else the config's `"cuda:N"`, else device 0.
fn device_of(object: &Bound<'_, PyAny>, device: &str) -> Result<u32, Error> {
    if let Ok(d) = object.getattr("device") {
        for attr in ["id", "index"] {
            if let Ok(n) = d.getattr(attr).and_then(|n| n.extract::<u32>()) {
                return Ok(n);
            }
        }
    }
    if device.starts_with("cuda") {
        return cuda_ordinal(device);
    }
    Ok(0)
}

/// The ordinal in `"cuda:N"` (or `"cuda"`, device 0).
fn cuda_ordinal(device: &str) -> Result<u32, Error> {
    match device.strip_prefix("cuda") {
        Some("") => Ok(0),
        Some(n) => n
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                Error::invalid(format!("device {device:?}: write \"cpu\" or \"cuda:N\""))
            }),
        None => Err(Error::invalid(format!(
            "device {device:?}: write \"cpu\" or \"cuda:N\""
        ))),
    }
}

#[cfg(feature = "cuda")]
fn cuda_memory(device: &str, size: usize) -> Result<Arc<dyn DeviceMemory>, Error> {
    let ordinal = cuda_ordinal(device)?;
    Ok(Arc::new(ferroce::cuda::CudaMemory::alloc(ordinal, size)?))
}

#[cfg(not(feature = "cuda"))]
fn cuda_memory(device: &str, _size: usize) -> Result<Arc<dyn DeviceMemory>, Error> {
    cuda_ordinal(device)?;
    Err(Error::unsupported(format!(
        "device {device:?} needs ferroce built with the cuda feature (pip install with \
         MATURIN_PEP517_ARGS=\"--features cuda\"); or pass device_memory"
    )))
}

/// A frame where it landed: a zero-copy view of the ring page (or the device memory the
/// receiver delivers to). `numpy.asarray(frame)` and `numpy.from_dlpack(frame)` read host
/// frames in place; CuPy and PyTorch take CUDA frames by `__cuda_array_interface__` and
/// `__dlpack__`. The memory stays mapped while the frame (or an array made from it) lives,
/// but the page is the device's again once the ring wraps to it: `still_valid()` says
/// whether the bytes are still this frame's, and `copy_into(out)` is the checked copy.
#[pyclass(module = "ferroce.frames", frozen)]
pub(crate) struct Frame {
    info: Py<FrameInfo>,
    view: Result<FrameView, String>,
    receiver: rf::Receiver,
    len: usize,
}

impl Frame {
    fn new(py: Python<'_>, receiver: &rf::Receiver, info: rf::FrameInfo) -> PyResult<Self> {
        let view = receiver.frame_view(&info).map_err(|e| e.to_string());
        let len = view.as_ref().map_or_else(
            |_| (info.metadata.bytes_written as usize).min(receiver.frame_size()),
            FrameView::len,
        );
        Ok(Self {
            info: Py::new(py, FrameInfo { inner: info })?,
            view,
            receiver: receiver.clone(),
            len,
        })
    }

    fn view(&self) -> Result<&FrameView, Error> {
        self.view.as_ref().map_err(|why| {
            Error::unsupported(format!("this frame cannot be viewed in place: {why}"))
        })
    }

    fn place(&self) -> Result<Place, Error> {
        let view = self.view()?;
        match view.memory() {
            ViewMemory::Host => Ok(Place::Host),
            ViewMemory::Cuda { ordinal } => Ok(Place::Cuda(ordinal)),
            _ => Err(Error::unsupported(
                "the frame is in device memory that is neither host nor CUDA memory; use copy_into",
            )),
        }
    }
}

#[pymethods]
impl Frame {
    /// What the receiver knows of the frame.
    #[getter]
    fn info(&self, py: Python<'_>) -> Py<FrameInfo> {
        self.info.clone_ref(py)
    }

    /// The frame's page in the ring.
    #[getter]
    fn page(&self) -> u32 {
        self.info.get().inner.page
    }

    /// The frame's data bytes (the metadata's `bytes_written`, at most the frame size).
    fn __len__(&self) -> usize {
        self.len
    }

    /// Whether the frame is whole (no packet lost).
    #[getter]
    fn complete(&self) -> bool {
        self.info.get().inner.is_complete()
    }

    /// The address of the first byte (a host pointer, or a `CUdeviceptr`).
    #[getter]
    fn addr(&self) -> Result<u64, Error> {
        Ok(self.view()?.addr())
    }

    /// `"cpu"`, `"cuda:N"`, or `"device"` (other device memory).
    #[getter]
    fn device(&self) -> Result<String, Error> {
        Ok(match self.view()?.memory() {
            ViewMemory::Host => "cpu".to_owned(),
            ViewMemory::Cuda { ordinal } => format!("cuda:{ordinal}"),
            _ => "device".to_owned(),
        })
    }

    /// Whether the device has stayed off the frame's page since the frame ended: read the
    /// view, then ask; true means what was read was this frame's.
    fn still_valid(&self, py: Python<'_>) -> bool {
        match &self.view {
            Ok(v) => py.detach(|| v.is_current()),
            Err(_) => false,
        }
    }

    /// Copies the frame's first `len(out)` bytes into `out` (a `bytearray`, or a writable
    /// contiguous array such as a NumPy array), checking that the device stayed off the page
    /// throughout; raises `FrameOverwritten` when it did not (then `out` may hold a mix of
    /// frames). `out` may be longer than the frame: bytes beyond `len(frame)` come from the
    /// rest of the page.
    fn copy_into(&self, out: &Bound<'_, PyAny>) -> PyResult<()> {
        let result = memory::with_writable(out, |slice| match &self.view {
            Ok(v) => v.copy_into(slice),
            Err(_) => self.receiver.read_frame(&self.info.get().inner, slice),
        })?;
        result.map_err(|e| Error::from(e).into())
    }

    /// A checked copy of the frame's bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = vec![0u8; self.len];
        let result = py.detach(|| match &self.view {
            Ok(v) => v.copy_into(&mut out),
            Err(_) => self.receiver.read_frame(&self.info.get().inner, &mut out),
        });
        result.map_err(Error::from)?;
        Ok(PyBytes::new(py, &out))
    }

    /// NumPy's array interface (host frames): a read-only uint8 view, no copy.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.place()? {
            Place::Host => memory::array_interface(py, self.view()?.addr(), self.len, true),
            Place::Cuda(_) => Err(Error::unsupported(
                "the frame is in CUDA memory: use cupy.asarray(frame) or a DLPack consumer",
            )
            .into()),
        }
    }

    /// The CUDA array interface (CUDA frames).
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        match self.place() {
            Ok(Place::Cuda(_)) => {
                memory::cuda_array_interface(py, self.view()?.addr(), self.len, true)
            }
            _ => Err(pyo3::exceptions::PyAttributeError::new_err(
                "__cuda_array_interface__: the frame is not in CUDA memory",
            )),
        }
    }

    /// A DLPack capsule of the frame's bytes, keeping the ring memory alive until the
    /// consumer deletes it. No copy: `copy=True` and another device are refused.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = (stream, max_version);
        let place = self.place()?;
        if let Some(wanted) = dl_device {
            if wanted != place.dlpack_device() {
                return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                    "the frame is on DLPack device {:?}, not {wanted:?}; copy it yourself",
                    place.dlpack_device()
                )));
            }
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "a frame is exported without copying; use copy_into or to_bytes for a copy",
            ));
        }
        let view = self.view()?.clone();
        memory::dlpack_capsule(py, view.addr(), self.len, place, Box::new(view))
    }

    /// `(device_type, device_id)`: `(1, 0)` for host memory, `(2, N)` for CUDA device N.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        Ok(self.place()?.dlpack_device())
    }

    fn __repr__(&self) -> String {
        let info = &self.info.get().inner;
        format!(
            "<ferroce.frames.Frame page={} frame_number={} len={} complete={}>",
            info.page,
            info.frame_number,
            self.len,
            info.is_complete()
        )
    }
}

type MonitorHandle = JoinHandle<Result<(), MonitorError>>;

/// A sensor-frame receiver (Hololink's `RoceReceiverInterfaceV2`).
///
/// Frames arrive only while a monitor runs: `blocking_monitor()` on a thread of your own (it
/// returns after `close()`), or `run_monitor()`, which starts one on a Rust thread. The
/// frame-ready callback runs on that thread. `with Receiver() as rx:` closes on exit.
#[pyclass(module = "ferroce.frames", frozen)]
pub(crate) struct Receiver {
    inner: rf::Receiver,
    monitor: Mutex<Option<MonitorHandle>>,
}

fn spawn_monitor(
    rx: &rf::Receiver,
    done: Option<mpsc::SyncSender<()>>,
) -> Result<MonitorHandle, Error> {
    let rx = rx.clone();
    std::thread::Builder::new()
        .name("ferroce-monitor".into())
        .spawn(move || {
            let result = rx.blocking_monitor();
            if let Some(done) = done {
                let _ = done.send(());
            }
            result
        })
        .map_err(Error::from)
}

fn monitor_result(joined: std::thread::Result<Result<(), MonitorError>>) -> Result<(), Error> {
    match joined {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::new(
            Class::ReceivePathFailed,
            "Panic",
            "the receiver's monitor panicked",
        )),
    }
}

impl Receiver {
    /// Joins a finished or closing monitor thread, detached (never from the monitor itself).
    fn join_monitor(
        &self,
        py: Python<'_>,
    ) -> Option<std::thread::Result<Result<(), MonitorError>>> {
        let handle = lock(&self.monitor).take()?;
        if handle.thread().id() == std::thread::current().id() {
            return None;
        }
        Some(py.detach(move || handle.join()))
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // Garbage collection may run anywhere, with the GIL held: never join here (the
        // monitor may be waiting to attach for a callback). It ends by itself after close.
        self.inner.close();
        drop(lock(&self.monitor).take());
    }
}

#[pymethods]
impl Receiver {
    #[new]
    fn new() -> Self {
        Self {
            inner: rf::Receiver::new(),
            monitor: Mutex::new(None),
        }
    }

    /// Brings the receiver up on `nic` (Hololink's `start`); again after `close()` or a
    /// failed receive path, for a fresh run. The frame-ready callback is kept.
    fn start(
        &self,
        py: Python<'_>,
        nic: PyRef<'_, Nic>,
        config: PyRef<'_, ReceiverConfig>,
    ) -> PyResult<()> {
        let nic = nic.get()?;
        let config = config.to_rust(py)?;
        // A monitor left from an earlier run has ended, or ends now that `start` tears the
        // run down; reap it.
        let inner = &self.inner;
        py.detach(|| inner.start(&nic, config))
            .map_err(Error::from)?;
        if lock(&self.monitor)
            .as_ref()
            .is_some_and(JoinHandle::is_finished)
        {
            drop(self.join_monitor(py));
        }
        Ok(())
    }

    /// Brings the receiver up on the device called `ibv_name` (`"ferroce0"`: the soft NIC on
    /// the local address that routes to the peer); returns that NIC.
    fn start_named(
        &self,
        py: Python<'_>,
        ibv_name: &str,
        ibv_port: u8,
        config: PyRef<'_, ReceiverConfig>,
    ) -> PyResult<Nic> {
        let config = config.to_rust(py)?;
        let inner = &self.inner;
        let nic = py
            .detach(|| inner.start_named(ibv_name, ibv_port, config))
            .map_err(Error::from)?;
        Ok(Nic::wrap(nic))
    }

    /// Runs the receive path until `close()` (Hololink's `blocking_monitor`). The work
    /// happens on a Rust thread while this one waits without the GIL; Ctrl-C closes the
    /// receiver and raises `KeyboardInterrupt`. Raises `ReceivePathFailed` when a fatal event
    /// stopped the receive path, `NotStarted` before `start()`.
    fn blocking_monitor(&self, py: Python<'_>) -> PyResult<()> {
        let (tx, rx) = mpsc::sync_channel(1);
        let handle = spawn_monitor(&self.inner, Some(tx))?;
        let mut rx = rx;
        loop {
            let (got, back) = py.detach(move || (rx.recv_timeout(wait::SLICE), rx));
            rx = back;
            match got {
                Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let joined = py.detach(move || handle.join());
                    return Ok(monitor_result(joined)?);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(interrupt) = py.check_signals() {
                        self.inner.close();
                        let _ = py.detach(move || handle.join());
                        return Err(interrupt);
                    }
                }
            }
        }
    }

    /// Starts the monitor on a Rust thread of its own and returns; `close()` ends and joins
    /// it. `receive_path_failed()` and `failure()` report how a run ended.
    fn run_monitor(&self) -> Result<(), Error> {
        let mut slot = lock(&self.monitor);
        if slot.as_ref().is_some_and(|h| !h.is_finished()) {
            return Err(Error::invalid("the monitor is running already"));
        }
        if !self.inner.receive_path_failed() && self.inner.qp_number().is_err() {
            return Err(Error::from(rf::NotStarted));
        }
        *slot = Some(spawn_monitor(&self.inner, None)?);
        Ok(())
    }

    /// Ends the run, returning `blocking_monitor()` to its caller and joining a monitor
    /// `run_monitor()` started (Hololink's `close`). Any thread, any number of times.
    fn close(&self, py: Python<'_>) {
        self.inner.close();
        drop(self.join_monitor(py));
    }

    /// Takes the next completed frame, waiting up to `timeout` seconds (`None`: until one
    /// comes, the receiver closes or its path fails); `None` when none came. Without the GIL
    /// while it waits.
    #[pyo3(signature = (timeout=1.0))]
    fn next_frame(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Frame>> {
        let t = wait::timeout(timeout)?;
        let inner = &self.inner;
        let got = wait::sliced(py, t, |slice| {
            let started = Instant::now();
            match inner.next_frame(slice) {
                Err(e) => Some(Err(e)),
                Ok(Some(f)) => Some(Ok(Some(f))),
                // Back before the slice was over: the path failed or the run closed.
                Ok(None) if started.elapsed() + Duration::from_millis(1) < slice => Some(Ok(None)),
                Ok(None) => None,
            }
        })?;
        match got {
            None | Some(Ok(None)) => Ok(None),
            Some(Err(e)) => Err(Error::from(e).into()),
            Some(Ok(Some(info))) => Ok(Some(Frame::new(py, inner, info)?)),
        }
    }

    /// Whether `next_frame` would return at once (Hololink's `frames_ready`).
    fn frames_ready(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.frames_ready())
    }

    /// Sets the callable run on the monitor's thread each time a frame becomes available
    /// (Hololink's `set_frame_ready`); `None` removes it. An exception it raises goes to
    /// `sys.unraisablehook`, and the receiver goes on.
    fn set_frame_ready(&self, py: Python<'_>, callback: Option<Py<PyAny>>) -> PyResult<()> {
        let Some(callback) = callback else {
            py.detach(|| self.inner.set_frame_ready(None::<fn()>));
            return Ok(());
        };
        if !callback.bind(py).is_callable() {
            return Err(Error::invalid("the frame-ready callback must be callable or None").into());
        }
        let run = move || {
            // No ferroce lock is held here; during interpreter shutdown the call is skipped.
            let _ = Python::try_attach(|py| {
                if let Err(e) = callback.call0(py) {
                    e.write_unraisable(py, Some(callback.bind(py)));
                }
            });
        };
        py.detach(|| self.inner.set_frame_ready(Some(run)));
        Ok(())
    }

    /// Whether a fatal event has stopped the receive path (Hololink's
    /// `receive_path_failed`); `start()` again to recover.
    fn receive_path_failed(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.receive_path_failed())
    }

    /// What stopped the receive path, if it failed.
    fn failure(&self, py: Python<'_>) -> Option<String> {
        py.detach(|| self.inner.failure())
    }

    /// The queue pair the device sends to (Hololink's `get_qp_number`).
    fn qp_number(&self, py: Python<'_>) -> Result<u32, Error> {
        Ok(py.detach(|| self.inner.qp_number())?)
    }

    /// The key the device presents (Hololink's `get_rkey`).
    fn rkey(&self, py: Python<'_>) -> Result<u32, Error> {
        Ok(py.detach(|| self.inner.rkey())?)
    }

    /// Where page 0 begins in the device's view (Hololink's `external_frame_memory`).
    fn external_frame_memory(&self, py: Python<'_>) -> Result<u64, Error> {
        Ok(py.detach(|| self.inner.external_frame_memory())?)
    }

    fn frame_size(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.frame_size())
    }

    fn page_size(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.page_size())
    }

    fn pages(&self, py: Python<'_>) -> u32 {
        py.detach(|| self.inner.pages())
    }

    fn metadata_offset(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.metadata_offset())
    }

    /// The NIC address the device sends to, as `(host, port)`.
    fn local_addr(&self, py: Python<'_>) -> Result<(String, u16), Error> {
        Ok(util::addr_tuple(py.detach(|| self.inner.local_addr())?))
    }

    /// A checked copy of `length` bytes (default: the frame's) from the start of the frame's
    /// page.
    #[pyo3(signature = (info, length=None))]
    fn read_frame<'py>(
        &self,
        py: Python<'py>,
        info: PyRef<'_, FrameInfo>,
        length: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let info = info.inner.clone();
        let n = length
            .unwrap_or_else(|| (info.metadata.bytes_written as usize).min(self.inner.frame_size()));
        if n > self.inner.page_size() && self.inner.page_size() > 0 {
            return Err(Error::from(FrameReadError::OutOfPage {
                page: info.page,
                len: n,
                page_size: self.inner.page_size(),
            })
            .into());
        }
        let mut out = vec![0u8; n];
        py.detach(|| self.inner.read_frame(&info, &mut out))
            .map_err(Error::from)?;
        Ok(PyBytes::new(py, &out))
    }

    /// A zero-copy view of the frame `info` describes.
    fn frame_view(&self, py: Python<'_>, info: PyRef<'_, FrameInfo>) -> PyResult<Frame> {
        let rust = info.inner.clone();
        self.inner.frame_view(&rust).map_err(Error::from)?;
        Frame::new(py, &self.inner, rust)
    }

    /// A snapshot of the receiver's counters.
    fn counters(&self) -> FrameCounters {
        FrameCounters::from(self.inner.counters())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.close(py);
        false
    }
}

/// Where and how a `Sender` writes frames: what a device's data channel is programmed with.
#[pyclass(module = "ferroce.frames", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct Target {
    pub(crate) inner: rf::Target,
}

#[pymethods]
impl Target {
    #[new]
    #[pyo3(signature = (dest, qp, rkey, address, page_size, pages, frame_size, *, payload=4096, immediate="page12", fold_metadata=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        dest: &str,
        qp: u32,
        rkey: u32,
        address: u64,
        page_size: usize,
        pages: u32,
        frame_size: usize,
        payload: usize,
        immediate: &str,
        fold_metadata: bool,
    ) -> Result<Self, Error> {
        Ok(Self {
            inner: rf::Target {
                dest: crate::nic::roce_addr(dest)?,
                qp,
                rkey,
                address,
                page_size,
                pages,
                frame_size,
                payload,
                immediate: layout(immediate)?,
                fold_metadata,
            },
        })
    }

    /// The target a started `receiver` asks for: its NIC, queue pair, key and ring.
    #[staticmethod]
    #[pyo3(signature = (receiver, *, payload=4096, fold_metadata=false))]
    fn for_receiver(
        py: Python<'_>,
        receiver: PyRef<'_, Receiver>,
        payload: usize,
        fold_metadata: bool,
    ) -> Result<Self, Error> {
        let rx = &receiver.inner;
        let inner = py.detach(|| -> Result<rf::Target, rf::NotStarted> {
            Ok(rf::Target {
                dest: rx.local_addr()?,
                qp: rx.qp_number()?,
                rkey: rx.rkey()?,
                address: rx.external_frame_memory()?,
                page_size: rx.page_size(),
                pages: rx.pages(),
                frame_size: rx.frame_size(),
                payload,
                immediate: ImmediateLayout::Page12,
                fold_metadata,
            })
        })?;
        Ok(Self { inner })
    }

    /// The payload a bridge puts in each packet on a link of `link_mtu` bytes.
    #[staticmethod]
    fn payload_for_mtu(link_mtu: usize) -> usize {
        rf::Target::payload_for_mtu(link_mtu)
    }

    #[getter]
    fn dest(&self) -> (String, u16) {
        util::addr_tuple(self.inner.dest)
    }

    #[getter]
    fn qp(&self) -> u32 {
        self.inner.qp
    }

    #[getter]
    fn rkey(&self) -> u32 {
        self.inner.rkey
    }

    #[getter]
    fn address(&self) -> u64 {
        self.inner.address
    }

    #[getter]
    fn page_size(&self) -> usize {
        self.inner.page_size
    }

    #[getter]
    fn pages(&self) -> u32 {
        self.inner.pages
    }

    #[getter]
    fn frame_size(&self) -> usize {
        self.inner.frame_size
    }

    #[getter]
    fn payload(&self) -> usize {
        self.inner.payload
    }

    #[getter]
    fn immediate(&self) -> &'static str {
        layout_name(self.inner.immediate)
    }

    #[getter]
    fn fold_metadata(&self) -> bool {
        self.inner.fold_metadata
    }

    /// Where the metadata block goes in each page.
    fn metadata_offset(&self) -> usize {
        self.inner.metadata_offset()
    }

    fn __repr__(&self) -> String {
        format!("Target({:?})", self.inner)
    }
}

/// What `Sender.send_frame` sent.
#[pyclass(module = "ferroce.frames", frozen, get_all)]
pub(crate) struct FrameSent {
    page: u32,
    frame_number: u32,
    psn: u32,
    packets: u64,
    bytes: u64,
    crc32: u32,
}

#[pymethods]
impl FrameSent {
    fn __repr__(&self) -> String {
        format!(
            "FrameSent(page={}, frame_number={}, packets={}, bytes={})",
            self.page, self.frame_number, self.packets, self.bytes
        )
    }
}

/// A sensor bridge's data plane in software: UC RDMA WRITEs of frames into a receiver's
/// ring, as a device sends them (for tests, demos and emulation).
#[pyclass(module = "ferroce.frames", frozen)]
pub(crate) struct Sender {
    inner: Mutex<rf::Sender>,
}

#[pymethods]
impl Sender {
    /// A sender on `local` (`"ip"` takes any port; a bridge sends from port 12288).
    #[new]
    #[pyo3(signature = (local, target, *, gso=true))]
    fn new(py: Python<'_>, local: &str, target: Target, gso: bool) -> Result<Self, Error> {
        let local = util::socket_addr(local, 0)?;
        let sender = py.detach(|| rf::Sender::open(local, target.inner, gso))?;
        Ok(Self {
            inner: Mutex::new(sender),
        })
    }

    /// Whether frames leave by UDP GSO, and if not, why not.
    fn gso_status(&self, py: Python<'_>) -> String {
        py.detach(|| lock(&self.inner).gso_status().to_string())
    }

    /// The sender's own `(host, port)`.
    fn local_addr(&self, py: Python<'_>) -> (String, u16) {
        util::addr_tuple(py.detach(|| lock(&self.inner).local_addr()))
    }

    /// The target it writes to.
    fn target(&self, py: Python<'_>) -> Target {
        Target {
            inner: py.detach(|| *lock(&self.inner).target()),
        }
    }

    /// Points the sender at a new target; PSN and frame number run on.
    fn retarget(&self, py: Python<'_>, target: Target) -> Result<(), Error> {
        Ok(py.detach(|| lock(&self.inner).retarget(target.inner))?)
    }

    /// Packets sent so far.
    fn packets_sent(&self, py: Python<'_>) -> u64 {
        py.detach(|| lock(&self.inner).packets_sent())
    }

    /// Sets the next PSN.
    fn set_psn(&self, py: Python<'_>, psn: u32) {
        py.detach(|| lock(&self.inner).set_psn(psn));
    }

    /// Injects `faults` (a `Faults` or a specification such as `"loss=0.05,seed=7"`) into
    /// every packet sent from now on; `None` stops.
    fn set_faults(&self, py: Python<'_>, faults: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        let faults = crate::nic::faults_arg(faults)?;
        py.detach(|| lock(&self.inner).set_faults(faults));
        Ok(())
    }

    /// Keeps at most `packets` packets in flight ahead of what `receiver` has taken (on
    /// loopback the receiver's socket is the only buffer); `None` removes the bound.
    #[pyo3(signature = (packets, receiver=None))]
    fn set_window(
        &self,
        py: Python<'_>,
        packets: Option<u32>,
        receiver: Option<PyRef<'_, Receiver>>,
    ) -> Result<(), Error> {
        let window = match (packets, receiver) {
            (None, _) => None,
            (Some(p), Some(rx)) => {
                let rx = rx.inner.clone();
                let taken: rf::Taken = Arc::new(move || rx.counters().packets);
                Some((p, taken))
            }
            (Some(_), None) => {
                return Err(Error::invalid(
                    "a window needs the receiver whose progress bounds it",
                ))
            }
        };
        py.detach(|| lock(&self.inner).set_window(window));
        Ok(())
    }

    /// Writes every packet sent from now on to a pcap capture at `path`.
    fn set_pcap(&self, py: Python<'_>, path: std::path::PathBuf) -> Result<(), Error> {
        Ok(py.detach(|| lock(&self.inner).set_pcap(&path))?)
    }

    /// Sends what fault injection still holds back, and flushes the capture.
    fn flush(&self, py: Python<'_>) -> Result<(), Error> {
        Ok(py.detach(|| lock(&self.inner).flush())?)
    }

    /// Sends one frame of `data` (bytes-like or a host array) into the next page, its
    /// packets spread over `pace` seconds when given.
    #[pyo3(signature = (data, pace=None))]
    fn send_frame(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        pace: Option<f64>,
    ) -> PyResult<FrameSent> {
        let pace = pace.map(|p| util::seconds("pace", p)).transpose()?;
        let sent = if let Ok(b) = data.cast::<PyBytes>() {
            let bytes = b.as_bytes();
            py.detach(|| lock(&self.inner).send_frame(bytes, pace))
        } else {
            let bytes = memory::bytes_of(data)?;
            py.detach(|| lock(&self.inner).send_frame(&bytes, pace))
        }
        .map_err(Error::from)?;
        Ok(FrameSent {
            page: sent.page,
            frame_number: sent.frame_number,
            psn: sent.psn,
            packets: sent.packets,
            bytes: sent.bytes,
            crc32: sent.crc32,
        })
    }
}

/// What a host programs into a device's data channel for one receiver.
#[pyclass(module = "ferroce.frames", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct RoceChannel {
    inner: control::RoceChannel,
}

#[pymethods]
impl RoceChannel {
    #[new]
    #[pyo3(
        signature = (qp, rkey, address, frame_size, page_size, pages, payload, host_ip, *, host_mac=[0u8; 6], host_port=4791),
        text_signature = "(qp, rkey, address, frame_size, page_size, pages, payload, host_ip, *, host_mac=(0, 0, 0, 0, 0, 0), host_port=4791)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        qp: u32,
        rkey: u32,
        address: u64,
        frame_size: usize,
        page_size: usize,
        pages: u32,
        payload: usize,
        host_ip: &str,
        host_mac: [u8; 6],
        host_port: u16,
    ) -> Result<Self, Error> {
        let host_ip = match util::ip(host_ip)? {
            std::net::IpAddr::V4(v4) => v4,
            std::net::IpAddr::V6(_) => {
                return Err(Error::invalid(
                    "a bridge's data channel takes an IPv4 host address",
                ))
            }
        };
        Ok(Self {
            inner: control::RoceChannel {
                qp,
                rkey,
                address,
                frame_size,
                page_size,
                pages,
                payload,
                host_ip,
                host_mac,
                host_port,
            },
        })
    }

    /// The channel a started `receiver` asks for.
    #[staticmethod]
    #[pyo3(signature = (receiver, *, payload=4096))]
    fn for_receiver(
        py: Python<'_>,
        receiver: PyRef<'_, Receiver>,
        payload: usize,
    ) -> PyResult<Self> {
        let t = Target::for_receiver(py, receiver, payload, false)?.inner;
        let host_ip = match t.dest.ip() {
            std::net::IpAddr::V4(v4) => v4,
            std::net::IpAddr::V6(_) => {
                return Err(
                    Error::invalid("a bridge's data channel takes an IPv4 host address").into(),
                )
            }
        };
        Ok(Self {
            inner: control::RoceChannel {
                qp: t.qp,
                rkey: t.rkey,
                address: t.address,
                frame_size: t.frame_size,
                page_size: t.page_size,
                pages: t.pages,
                payload,
                host_ip,
                host_mac: [0; 6],
                host_port: t.dest.port(),
            },
        })
    }

    fn __repr__(&self) -> String {
        format!("RoceChannel({:?})", self.inner)
    }
}

/// The host's end of a device's control channel (UDP 8192), for one sensor's data channel.
#[pyclass(module = "ferroce.frames", frozen)]
pub(crate) struct DataChannel {
    inner: Mutex<control::DataChannel>,
}

#[pymethods]
impl DataChannel {
    /// A channel to the device at `device` (`"ip"` takes the control port 8192).
    #[new]
    fn new(device: &str) -> Result<Self, Error> {
        let device = util::socket_addr(device, control::CONTROL_PORT)?;
        Ok(Self {
            inner: Mutex::new(control::DataChannel::new(device)?),
        })
    }

    /// Writes a register.
    fn write(&self, py: Python<'_>, address: u32, value: u32) -> Result<(), Error> {
        Ok(py.detach(|| lock(&self.inner).write(address, value))?)
    }

    /// Reads a register.
    fn read(&self, py: Python<'_>, address: u32) -> Result<u32, Error> {
        Ok(py.detach(|| lock(&self.inner).read(address))?)
    }

    /// Programs the data channel for a receiver and enables the sensor.
    fn configure_roce(&self, py: Python<'_>, channel: RoceChannel) -> Result<(), Error> {
        Ok(py.detach(|| lock(&self.inner).configure_roce(&channel.inner))?)
    }

    /// Disables the sensor's data channel.
    fn unconfigure(&self, py: Python<'_>) -> Result<(), Error> {
        Ok(py.detach(|| lock(&self.inner).unconfigure())?)
    }
}

/// A device's register map, served on its control port by a thread: a stand-in device that
/// a `DataChannel` programs, and that describes the programmed channel as a `Target`.
#[pyclass(module = "ferroce.frames", frozen)]
pub(crate) struct DeviceRegisters {
    inner: control::DeviceRegisters,
}

#[pymethods]
impl DeviceRegisters {
    /// Serves a register map on `addr` (`"ip"` takes port 8192).
    #[staticmethod]
    fn serve(addr: &str) -> Result<Self, Error> {
        let addr: SocketAddr = util::socket_addr(addr, control::CONTROL_PORT)?;
        Ok(Self {
            inner: control::DeviceRegisters::serve(addr)?,
        })
    }

    /// The `(host, port)` served.
    fn addr(&self) -> (String, u16) {
        util::addr_tuple(self.inner.addr())
    }

    /// A register's value.
    fn get(&self, address: u32) -> u32 {
        self.inner.get(address)
    }

    /// The programmed channel as a `Target`, once a host has programmed it.
    fn target(&self) -> Option<Target> {
        self.inner.target().map(|inner| Target { inner })
    }

    /// Waits up to `timeout` seconds for a host to program the channel.
    #[pyo3(signature = (timeout=None))]
    fn wait_programmed(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Target>> {
        let t = wait::timeout(timeout)?;
        Ok(
            wait::sliced(py, t, |slice| self.inner.wait_programmed(slice))?
                .map(|inner| Target { inner }),
        )
    }

    /// Increments on every register write.
    fn generation(&self) -> u64 {
        self.inner.generation()
    }
}
