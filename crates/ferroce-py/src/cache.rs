//! The cache face (neuray's `IRDMA_context`): `Context`, `ContextConfig`, `Buffer`.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};

use ferroce::cache as rc;

use crate::errors::Error;
use crate::memory;
use crate::util;
use crate::verbs::RemoteAddr;
use crate::wait;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn device(gpu_id: i32) -> Result<rc::Device, Error> {
    Ok(rc::Device::from_seed_id(gpu_id)?)
}

fn gpu_id(d: rc::Device) -> i32 {
    match d {
        rc::Device::Gpu(id) => id as i32,
        rc::Device::Host => -1,
    }
}

/// How to bind a `Context` to its remote host: this side's NIC address, the out-of-band TCP
/// address (listened on when `listen`, else dialled), and the limits.
#[pyclass(module = "ferroce.cache", frozen)]
pub(crate) struct ContextConfig {
    inner: rc::ContextConfig,
}

#[pymethods]
impl ContextConfig {
    #[new]
    #[pyo3(
        signature = (nic, oob, listen, *, device="ferroce0", ib_port=1, timeout=10.0, max_message=1 << 20, receive_depth=16, receive_gpu_id=-1, max_cached_bytes=256 << 20, mtu=None),
        text_signature = "(nic, oob, listen, *, device='ferroce0', ib_port=1, timeout=10.0, max_message=1048576, receive_depth=16, receive_gpu_id=-1, max_cached_bytes=268435456, mtu=None)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        nic: &str,
        oob: &str,
        listen: bool,
        device: &str,
        ib_port: u8,
        timeout: f64,
        max_message: usize,
        receive_depth: u16,
        receive_gpu_id: i32,
        max_cached_bytes: usize,
        mtu: Option<u32>,
    ) -> Result<Self, Error> {
        let nic = crate::nic::roce_addr(nic)?;
        let oob = util::socket_addr(oob, 0)?;
        let mut inner = rc::ContextConfig::new(nic.ip(), oob, listen)
            .on_device(device)
            .with_timeout(util::seconds("timeout", timeout)?)
            .with_max_message(max_message)
            .with_receive_device(self::device(receive_gpu_id)?)
            .with_max_cached_bytes(max_cached_bytes);
        inner.nic = nic;
        inner.ib_port = ib_port;
        inner.receive_depth = receive_depth;
        inner.mtu = mtu
            .map(|m| {
                ferroce::qp::Mtu::from_bytes(m).ok_or_else(|| {
                    Error::invalid(format!("mtu {m} is not 256, 512, 1024, 2048 or 4096"))
                })
            })
            .transpose()?;
        Ok(Self { inner })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// A registered buffer of a `Context` (neuray's `IRDMA_buffer`). `release()` (or the end
/// of a `with` block, or garbage collection) gives it back to the cache, still registered.
#[pyclass(module = "ferroce.cache", frozen)]
pub(crate) struct Buffer {
    /// Shared with a `flush` that runs on a helper thread, so Ctrl-C can leave it running.
    inner: Arc<Mutex<Option<rc::Buffer>>>,
}

impl Buffer {
    fn wrap(b: rc::Buffer) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Some(b))),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut rc::Buffer) -> R) -> Result<R, Error> {
        let mut slot = lock(&self.inner);
        let b = slot
            .as_mut()
            .ok_or_else(|| Error::closed("the buffer was given back"))?;
        Ok(f(b))
    }
}

#[pymethods]
impl Buffer {
    /// Its length: what was asked for, or what arrived.
    fn __len__(&self) -> Result<usize, Error> {
        self.with(|b| b.len())
    }

    /// Its length: what was asked for, or what arrived.
    fn len(&self) -> Result<usize, Error> {
        self.with(|b| b.len())
    }

    /// The registered bytes behind it.
    fn capacity(&self) -> Result<usize, Error> {
        self.with(|b| b.capacity())
    }

    /// Where its memory lives: -1 for main memory, else the GPU's id.
    fn device(&self) -> Result<i32, Error> {
        self.with(|b| gpu_id(b.device()))
    }

    /// Sets its length, up to its capacity (how much of a write buffer to flush).
    fn set_len(&self, length: usize) -> Result<(), Error> {
        self.with(|b| b.set_len(length))??;
        Ok(())
    }

    /// Copies `data` (bytes-like or a host array) to offset `at`.
    #[pyo3(signature = (data, at=0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, at: usize) -> PyResult<()> {
        let bytes = memory::bytes_of(data)?;
        py.detach(|| self.with(|b| b.write(at, &bytes)))?
            .map_err(Error::from)?;
        Ok(())
    }

    /// A copy of `n` bytes from offset `at` (`n` defaults to the rest of `len()`).
    #[pyo3(signature = (at=0, n=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        at: usize,
        n: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let got = py
            .detach(|| {
                self.with(|b| {
                    let n = n.unwrap_or_else(|| b.len().saturating_sub(at));
                    let mut out = vec![0u8; n];
                    b.read(at, &mut out).map(|()| out)
                })
            })?
            .map_err(Error::from)?;
        Ok(PyBytes::new(py, &got))
    }

    /// A copy of its `len()` bytes.
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.read(py, 0, None)
    }

    /// Where the remote host reads or writes it (for a peer's RDMA READ or WRITE).
    fn remote(&self) -> Result<RemoteAddr, Error> {
        let inner = self.with(|b| b.remote())??;
        Ok(RemoteAddr { inner })
    }

    /// For a GPU buffer, copies its bytes to the registered staging the NIC reads.
    fn sync_to_registered(&self, py: Python<'_>) -> Result<(), Error> {
        py.detach(|| self.with(|b| b.sync_to_registered()))??;
        Ok(())
    }

    /// For a GPU buffer, copies the registered staging the NIC wrote to the device.
    fn sync_from_registered(&self, py: Python<'_>) -> Result<(), Error> {
        py.detach(|| self.with(|b| b.sync_from_registered()))??;
        Ok(())
    }

    /// A wrapped user buffer gives the user's bytes back (deregistered, with what was
    /// written into them); the buffer is then gone. Other buffers raise `InvalidArgument`.
    #[allow(clippy::wrong_self_convention)] // neuray's name; Python objects are shared
    fn into_user_buffer<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let Some(b) = lock(&self.inner).take() else {
            return Err(Error::closed("the buffer was given back").into());
        };
        match py.detach(|| b.into_user_buffer()) {
            Ok(bytes) => Ok(PyBytes::new(py, &bytes)),
            Err(b) => {
                *lock(&self.inner) = Some(*b);
                Err(Error::invalid("only a wrapped user buffer gives bytes back").into())
            }
        }
    }

    /// Gives the buffer back to its context's cache (a wrapped user buffer is deregistered).
    /// Later calls raise `Closed`.
    fn release(&self, py: Python<'_>) {
        if let Some(b) = lock(&self.inner).take() {
            py.detach(move || drop(b));
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        self.release(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.with(|b| (b.len(), b.capacity(), gpu_id(b.device()))) {
            Ok((len, cap, dev)) => {
                format!("<ferroce.cache.Buffer len={len} capacity={cap} device={dev}>")
            }
            Err(_) => "<ferroce.cache.Buffer given back>".to_owned(),
        }
    }
}

/// A cache of registered buffers bound to one remote host (neuray's `IRDMA_context`).
/// `Context.connect(config)`; one side listens, the other dials.
#[pyclass(module = "ferroce.cache", frozen)]
pub(crate) struct Context {
    inner: rc::Context,
}

#[pymethods]
impl Context {
    /// Binds a context to the remote host: opens the NIC, handshakes over the out-of-band
    /// connection, connects the queue pair and posts the read buffers. Waits (without the
    /// GIL) up to the config's timeout for the peer.
    #[staticmethod]
    fn connect(py: Python<'_>, config: PyRef<'_, ContextConfig>) -> PyResult<Self> {
        let config = config.inner.clone();
        let inner = wait::off_thread(py, "cache-connect", move || rc::Context::connect(&config))?
            .map_err(Error::from)?;
        Ok(Self { inner })
    }

    /// neuray's `get_write_memory`: a buffer to fill and flush, or for the remote to read.
    #[pyo3(signature = (size, gpu_id=-1), text_signature = "($self, size, gpu_id=-1)")]
    fn write_memory(&self, py: Python<'_>, size: usize, gpu_id: i32) -> Result<Buffer, Error> {
        let d = device(gpu_id)?;
        Ok(Buffer::wrap(
            py.detach(|| self.inner.write_memory(size, d))?,
        ))
    }

    /// neuray's `get_read_memory`: a buffer for what the remote host writes.
    #[pyo3(signature = (size, gpu_id=-1), text_signature = "($self, size, gpu_id=-1)")]
    fn read_memory(&self, py: Python<'_>, size: usize, gpu_id: i32) -> Result<Buffer, Error> {
        let d = device(gpu_id)?;
        Ok(Buffer::wrap(py.detach(|| self.inner.read_memory(size, d))?))
    }

    /// neuray's `wrap_user_buffer`. The Rust context takes ownership of the bytes it
    /// registers, so this registers a copy of `data`; `into_user_buffer()` gives the bytes
    /// back, with whatever was written into them.
    #[pyo3(signature = (data, gpu_id=-1), text_signature = "($self, data, gpu_id=-1)")]
    fn wrap_user_buffer(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        gpu_id: i32,
    ) -> PyResult<Buffer> {
        let d = device(gpu_id)?;
        let bytes = memory::bytes_of(data)?;
        Ok(Buffer::wrap(
            py.detach(|| self.inner.wrap_user_buffer(bytes, d))
                .map_err(Error::from)?,
        ))
    }

    /// neuray's `flush`: sends the buffer's `len()` bytes to the remote host and waits
    /// (without the GIL, at most the config's timeout) until its NIC acknowledged them.
    fn flush(&self, py: Python<'_>, buffer: PyRef<'_, Buffer>) -> PyResult<()> {
        let ctx = self.inner.clone();
        let slot = Arc::clone(&buffer.inner);
        // On a helper thread, so that Ctrl-C is seen while the remote host takes its time;
        // an interrupted flush goes on there (bounded by the context's timeout), holding the
        // buffer until it ends.
        wait::off_thread(py, "cache-flush", move || {
            let guard = lock(&slot);
            let b = guard
                .as_ref()
                .ok_or_else(|| Error::closed("the buffer was given back"))?;
            ctx.flush(b).map_err(Error::from)
        })?
        .map_err(PyErr::from)
    }

    /// Waits up to `timeout` seconds (`None`: for ever) for the next buffer the remote host
    /// flushed here; raises `Timeout` when none came.
    #[pyo3(signature = (timeout=None))]
    fn receive(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Buffer> {
        let t = wait::timeout(timeout)?;
        let ctx = &self.inner;
        let got = wait::sliced(py, t, |slice| match ctx.receive(slice) {
            Err(rc::CacheError::Timeout { .. }) => None,
            other => Some(other),
        })?;
        match got {
            Some(Ok(b)) => Ok(Buffer::wrap(b)),
            Some(Err(e)) => Err(Error::from(e).into()),
            None => Err(Error::from(rc::CacheError::Timeout {
                what: "waiting for the remote host to flush",
                after: t.unwrap_or_default(),
            })
            .into()),
        }
    }

    /// The largest buffer the remote host receives.
    fn remote_max_message(&self) -> usize {
        self.inner.remote_max_message()
    }

    /// What the cache has done so far, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.inner.stats());
        let d = PyDict::new(py);
        d.set_item("registrations", s.registrations)?;
        d.set_item("hits", s.hits)?;
        d.set_item("misses", s.misses)?;
        d.set_item("evictions", s.evictions)?;
        d.set_item("cached_buffers", s.cached_buffers)?;
        d.set_item("cached_bytes", s.cached_bytes)?;
        Ok(d)
    }
}

/// The size class of `size`: the next power of two, at least 64.
#[pyfunction]
pub(crate) fn size_class(size: usize) -> usize {
    rc::size_class(size)
}
