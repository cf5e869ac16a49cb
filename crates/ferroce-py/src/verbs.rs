//! The verbs objects: `Region`, `Cq`, `Qp` and the work requests and completions between
//! them, one to one with `ferroce::{Region, Cq, Qp}`.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

use ferroce::proto::wire::Qpn;
use ferroce::proto::Psn;
use ferroce::qp::{self as rqp, Mtu};
use ferroce::{ConnectOptions, RegionMemory};

use crate::enums::{Access, Order, QpType};
use crate::errors::Error;
use crate::memory;
use crate::nic::Nic;
use crate::util;
use crate::wait;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One entry of a gather or scatter list: `len` bytes at `addr` of the region with `lkey`.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct Sge {
    pub(crate) inner: rqp::Sge,
}

#[pymethods]
impl Sge {
    #[new]
    fn new(addr: u64, len: u32, lkey: u32) -> Self {
        Self {
            inner: rqp::Sge { addr, len, lkey },
        }
    }

    #[getter]
    fn addr(&self) -> u64 {
        self.inner.addr
    }

    #[getter]
    fn len(&self) -> u32 {
        self.inner.len
    }

    #[getter]
    fn lkey(&self) -> u32 {
        self.inner.lkey
    }

    fn __repr__(&self) -> String {
        format!(
            "Sge(addr={:#x}, len={}, lkey={:#x})",
            self.inner.addr, self.inner.len, self.inner.lkey
        )
    }
}

/// A peer's buffer: an address in its region and the key that grants it.
///
/// `bytes(remote)` (or `remote.to_bytes()`) is its fixed 16-byte form, all big-endian, for any
/// out-of-band channel: byte 0 the layout's version (1), bytes 1-3 zero, 4-7 the rkey, 8-15
/// the virtual address. `RemoteAddr.from_bytes` reads it back; `pickle` and `copy` keep it.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct RemoteAddr {
    pub(crate) inner: rqp::RemoteAddr,
}

/// The version byte that opens `RemoteAddr`'s and `QpEndpoint`'s bytes.
const WIRE_VERSION: u8 = 1;
/// The length of `bytes(RemoteAddr)`.
pub(crate) const REMOTE_ADDR_LEN: usize = 16;
/// The length of `bytes(QpEndpoint)`.
pub(crate) const QP_ENDPOINT_LEN: usize = 28;

/// Checks the length and version of `data`, the bytes of a `what` of `len` bytes.
fn check_wire(data: &[u8], len: usize, what: &str) -> Result<(), Error> {
    if data.len() != len {
        return Err(Error::invalid(format!(
            "a {what} is {len} bytes, not {}",
            data.len()
        )));
    }
    if data[0] != WIRE_VERSION {
        return Err(Error::invalid(format!(
            "{what} bytes of version {} (this ferroce reads version {WIRE_VERSION})",
            data[0]
        )));
    }
    Ok(())
}

fn be_u32(data: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&data[at..at + 4]);
    u32::from_be_bytes(b)
}

#[pymethods]
impl RemoteAddr {
    #[new]
    fn new(va: u64, rkey: u32) -> Self {
        Self {
            inner: rqp::RemoteAddr { va, rkey },
        }
    }

    #[getter]
    fn va(&self) -> u64 {
        self.inner.va
    }

    #[getter]
    fn rkey(&self) -> u32 {
        self.inner.rkey
    }

    /// The address `n` bytes further on.
    fn offset(&self, n: u64) -> Self {
        Self {
            inner: rqp::RemoteAddr {
                va: self.inner.va.wrapping_add(n),
                rkey: self.inner.rkey,
            },
        }
    }

    /// The 16 bytes of the class doc: version 1, three zero bytes, the rkey and the
    /// virtual address, big-endian.
    #[allow(clippy::wrong_self_convention)] // a Python method: pyo3 takes `&self`
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let mut out = [0u8; REMOTE_ADDR_LEN];
        out[0] = WIRE_VERSION;
        out[4..8].copy_from_slice(&self.inner.rkey.to_be_bytes());
        out[8..16].copy_from_slice(&self.inner.va.to_be_bytes());
        PyBytes::new(py, &out)
    }

    /// `to_bytes()`.
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.to_bytes(py)
    }

    /// The remote buffer `to_bytes()` wrote. Raises `InvalidArgument` (a `ValueError`) for
    /// a length other than 16 or a version other than 1.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> Result<Self, Error> {
        check_wire(data, REMOTE_ADDR_LEN, "RemoteAddr")?;
        let mut va = [0u8; 8];
        va.copy_from_slice(&data[8..16]);
        Ok(Self::new(u64::from_be_bytes(va), be_u32(data, 4)))
    }

    /// For `pickle` and `copy`: `RemoteAddr(va, rkey)`.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (u64, u32))> {
        let me = slf.get();
        Ok((slf.get_type().into_any(), (me.inner.va, me.inner.rkey)))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        self.inner.va ^ (u64::from(self.inner.rkey) << 17).rotate_left(23)
    }

    fn __repr__(&self) -> String {
        format!(
            "RemoteAddr(va={:#x}, rkey={:#x})",
            self.inner.va, self.inner.rkey
        )
    }
}

/// Registered memory (Rig_mlx5's `Region`).
///
/// `Region(nic, obj)` registers the caller's own memory where it can, as NIXL's and
/// Mooncake's `register_memory` do: a writable NumPy array (any object with a writable,
/// C-contiguous `__array_interface__`) is registered in place, kept alive by the region, and
/// what peers write lands in the array; `(address, length)` is registered in place too, and the
/// caller keeps that memory allocated while the region lives (it is checked to be mapped when
/// registered, never after). Given a size, the region is that many fresh zeroed bytes. Bytes,
/// `bytearray`s, read-only arrays and DLPack producers are copied into a fresh region instead
/// (bytes are immutable, a `bytearray` can be resized under the region, and a DLPack export
/// lends memory only until its deleter runs); so is everything with `copy=True`. Read a
/// copied region back with `read()`, or look at it in place through `numpy.asarray(region)` /
/// `numpy.from_dlpack(region)`, unless `pinned=True`. `Region.from_dmabuf` registers a
/// dma-buf or memfd the caller keeps.
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Region {
    inner: Mutex<Option<Arc<ferroce::Region>>>,
    /// The region's memory when it may be viewed in place; kept mapped as long as this
    /// object (and any DLPack export) lives, even after `deregister`.
    mapped: Option<ferroce::MappedMemory>,
}

impl Region {
    fn viewable(&self) -> Result<&ferroce::MappedMemory, Error> {
        self.mapped.as_ref().ok_or_else(|| {
            Error::unsupported(
                "this region's memory is not viewable in place (pinned host memory or a \
                 dma-buf); register it with pinned=False, or use read()",
            )
        })
    }

    pub(crate) fn get(&self) -> Result<Arc<ferroce::Region>, Error> {
        lock(&self.inner)
            .clone()
            .ok_or_else(|| Error::closed("the region was deregistered"))
    }

    fn register(
        py: Python<'_>,
        nic: &Nic,
        access: Access,
        order: Order,
        memory: RegionMemory,
    ) -> Result<Self, Error> {
        let nic = nic.get()?;
        let mapped = match &memory {
            RegionMemory::Mapped(m) => Some(m.clone()),
            _ => None,
        };
        let region = py.detach(|| ferroce::Region::register(&nic, access.0, order.0, memory))?;
        Ok(Self {
            inner: Mutex::new(Some(Arc::new(region))),
            mapped,
        })
    }
}

#[pymethods]
impl Region {
    /// Registers `memory` with `nic`: an `int` (that many zeroed bytes), the caller's own
    /// memory in place (a writable array, `(address, length)`), or a copy of an object's bytes
    /// (see the class doc). Fresh and copied bytes are mapped memory that can be viewed in
    /// place and needs no locked-memory allowance on the soft NIC; `pinned=True` takes host
    /// memory locked in RAM instead, which is never handed out (no views), and copies.
    #[new]
    #[pyo3(
        signature = (nic, memory, access=Access::REMOTE, order=Order::IN_ORDER, *, pinned=false, copy=false),
        text_signature = "(nic, memory, access='Remote', order='InOrder', *, pinned=False, copy=False)"
    )]
    fn new(
        py: Python<'_>,
        nic: PyRef<'_, Nic>,
        memory: &Bound<'_, PyAny>,
        access: Access,
        order: Order,
        pinned: bool,
        copy: bool,
    ) -> PyResult<Self> {
        if !pinned && !copy && memory.extract::<i64>().is_err() {
            if let Some(borrowed) = memory::borrow_of(memory)? {
                return Ok(Self::register(
                    py,
                    &nic,
                    access,
                    order,
                    RegionMemory::Mapped(borrowed),
                )?);
            }
        }
        let (size, bytes) = match memory.extract::<i64>() {
            Ok(n) if n <= 0 => {
                return Err(
                    Error::invalid(format!("a region needs at least one byte, not {n}")).into(),
                )
            }
            Ok(n) => (
                usize::try_from(n).map_err(|_| Error::invalid("size too large"))?,
                None,
            ),
            Err(_) => {
                let bytes = memory::bytes_of(memory)?;
                (bytes.len(), Some(bytes))
            }
        };
        if size == 0 {
            return Err(
                Error::invalid("a region needs at least one byte; the object has none").into(),
            );
        }
        let memory = if pinned {
            let mut v = Vec::new();
            v.try_reserve_exact(size).map_err(|_| {
                Error::new(
                    crate::errors::Class::RegionError,
                    "Allocation",
                    format!("cannot allocate {size} bytes"),
                )
            })?;
            match bytes {
                Some(b) => v.extend_from_slice(&b),
                None => v.resize(size, 0),
            }
            RegionMemory::Host(v)
        } else {
            let mapped = ferroce::MappedMemory::new(size).map_err(Error::from)?;
            if let Some(b) = &bytes {
                mapped.write(0, b).map_err(Error::from)?;
            }
            RegionMemory::Mapped(mapped)
        };
        Ok(Self::register(py, &nic, access, order, memory)?)
    }

    /// Registers `length` bytes at `offset` of the dma-buf (or any shared-mappable
    /// descriptor, such as a memfd) `fd`: the caller's own memory, not a copy. The
    /// descriptor may be closed once this returns.
    #[staticmethod]
    #[pyo3(
        signature = (nic, fd, offset, length, access=Access::REMOTE, order=Order::IN_ORDER),
        text_signature = "(nic, fd, offset, length, access='Remote', order='InOrder')"
    )]
    fn from_dmabuf(
        py: Python<'_>,
        nic: PyRef<'_, Nic>,
        fd: i32,
        offset: u64,
        length: u64,
        access: Access,
        order: Order,
    ) -> Result<Self, Error> {
        Self::register(
            py,
            &nic,
            access,
            order,
            RegionMemory::Dmabuf {
                fd,
                offset,
                bytes: length,
            },
        )
    }

    /// Its length in bytes.
    fn __len__(&self) -> Result<usize, Error> {
        Ok(self.get()?.len() as usize)
    }

    /// Its length in bytes.
    fn len(&self) -> Result<u64, Error> {
        Ok(self.get()?.len())
    }

    /// The key peers use (0 for a Local region).
    fn rkey(&self) -> Result<u32, Error> {
        Ok(self.get()?.rkey())
    }

    /// The address peers and work requests use for the first byte.
    fn va(&self) -> Result<u64, Error> {
        Ok(self.get()?.va())
    }

    /// The `n` bytes at `at`, as this process's work requests name them (Rig_mlx5's
    /// `Region.local`); `n` defaults to the rest of the region.
    #[pyo3(signature = (at=0, n=None))]
    fn local(&self, at: u64, n: Option<u32>) -> Result<Sge, Error> {
        let r = self.get()?;
        let n = match n {
            Some(n) => n,
            None => u32::try_from(r.len().saturating_sub(at)).unwrap_or(u32::MAX),
        };
        Ok(Sge {
            inner: r.local(at, n)?,
        })
    }

    /// Offset `at`, as a peer's work requests name it (Rig_mlx5's `Region.remote`).
    #[pyo3(signature = (at=0))]
    fn remote(&self, at: u64) -> Result<RemoteAddr, Error> {
        Ok(RemoteAddr {
            inner: self.get()?.remote(at)?,
        })
    }

    /// A copy of `n` bytes from offset `at` (`n` defaults to the rest of the region).
    #[pyo3(signature = (at=0, n=None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        at: u64,
        n: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let r = self.get()?;
        let n = n.unwrap_or_else(|| r.len().saturating_sub(at) as usize);
        if at.checked_add(n as u64).is_none_or(|end| end > r.len()) {
            return Err(Error::from(ferroce::RegionError::OutOfRange {
                at,
                len: n as u64,
                size: r.len(),
            })
            .into());
        }
        let mut out = vec![0u8; n];
        py.detach(|| r.read(at, &mut out)).map_err(Error::from)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Copies `data` (any bytes-like object or array in host memory) to offset `at`.
    #[pyo3(signature = (data, at=0))]
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>, at: u64) -> PyResult<()> {
        let r = self.get()?;
        let bytes = memory::bytes_of(data)?;
        py.detach(|| r.write(at, &bytes)).map_err(Error::from)?;
        Ok(())
    }

    /// Deregisters the region (Rig_mlx5's `Region.deregister`): the NIC touches it no more. Returns
    /// its final bytes for host memory, `None` for a dma-buf. Later calls raise `Closed`.
    fn deregister<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let Some(region) = lock(&self.inner).take() else {
            return Err(Error::closed("the region was deregistered").into());
        };
        let region = match Arc::try_unwrap(region) {
            Ok(r) => r,
            Err(shared) => {
                *lock(&self.inner) = Some(shared);
                return Err(Error::invalid(
                    "the region is still in use by a view or a pending call",
                )
                .into());
            }
        };
        let memory = py.detach(|| region.deregister()).map_err(Error::from)?;
        Ok(match memory {
            RegionMemory::Host(b) | RegionMemory::Pageable(b) => Some(PyBytes::new(py, &b)),
            RegionMemory::Mapped(m) => {
                let mut b = vec![0u8; m.len()];
                m.read(0, &mut b).map_err(Error::from)?;
                Some(PyBytes::new(py, &b))
            }
            _ => None,
        })
    }

    /// NumPy's array interface: a writable uint8 view of the region's bytes, no copy (for
    /// mapped memory). Peers' writes show through it as they land, as with any RDMA buffer:
    /// wait for the completion that says a transfer is done before reading.
    #[getter]
    fn __array_interface__<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let m = self.viewable()?;
        memory::array_interface(py, m.addr(), m.len(), false)
    }

    /// A DLPack capsule of the region's bytes (host memory), keeping them mapped until the
    /// consumer deletes it.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        let _ = (stream, max_version);
        let m = self.viewable()?.clone();
        if dl_device.is_some_and(|d| d != memory::Place::Host.dlpack_device()) || copy == Some(true)
        {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "a region is exported in place, in host memory; copy it yourself",
            ));
        }
        memory::dlpack_capsule(py, m.addr(), m.len(), memory::Place::Host, Box::new(m))
    }

    /// `(1, 0)`: host memory.
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        self.viewable()?;
        Ok(memory::Place::Host.dlpack_device())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> bool {
        if let Some(region) = lock(&self.inner).take() {
            py.detach(move || drop(region));
        }
        false
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(r) => format!(
                "<ferroce.Region {} bytes va={:#x} rkey={:#x}>",
                r.len(),
                r.va(),
                r.rkey()
            ),
            Err(_) => "<ferroce.Region deregistered>".to_owned(),
        }
    }
}

/// A work completion (`struct ibv_wc`). `status` and `opcode` are the Rust variants' names
/// (`"Success"`, `"RdmaWrite"`); `status_code` is `enum ibv_wc_status`'s value,
/// `status_message` rdma-core's text for it, and `hint` what most often causes a failure
/// whose text names only the symptom (`RemAccessErr`: the rkey, the range, the rights;
/// `RetryExcErr`: nobody answering), or `None`. For a UD receive, `src_qp` and `src_addr`
/// say who sent the datagram (`ibv_wc.src_qp` and the GRH's source address; `None`
/// otherwise), and `AddressHandle.from_completion` answers it.
#[pyclass(module = "ferroce", frozen, get_all)]
pub(crate) struct Completion {
    wr_id: u64,
    status: String,
    status_code: u32,
    status_message: String,
    hint: Option<&'static str>,
    opcode: String,
    byte_len: u32,
    imm: Option<u32>,
    qpn: u32,
    src_qp: Option<u32>,
    src_addr: Option<String>,
}

impl Completion {
    /// The sender's address, for a UD receive.
    pub(crate) fn src_ip(&self) -> Option<IpAddr> {
        self.src_addr.as_deref().and_then(|a| a.parse().ok())
    }
}

impl From<ferroce::cq::Completion> for Completion {
    fn from(c: ferroce::cq::Completion) -> Self {
        let status = match c.status {
            ferroce::cq::WcStatus::Other(_) => "Other".to_owned(),
            s => format!("{s:?}"),
        };
        Self {
            wr_id: c.wr_id,
            status,
            status_code: c.status.ibv_value(),
            status_message: c.status.to_string(),
            hint: c.status.hint(),
            opcode: format!("{:?}", c.opcode),
            byte_len: c.byte_len,
            imm: c.imm,
            qpn: c.qpn.value(),
            src_qp: c.ud.map(|u| u.qpn.value()),
            src_addr: c.ud.map(|u| u.ip.to_string()),
        }
    }
}

#[pymethods]
impl Completion {
    /// Whether it completed successfully.
    #[getter]
    fn ok(&self) -> bool {
        self.status_code == 0
    }

    fn __repr__(&self) -> String {
        format!(
            "Completion(wr_id={}, status={}, opcode={}, byte_len={}, imm={}, qpn={:#x})",
            self.wr_id,
            self.status,
            self.opcode,
            self.byte_len,
            self.imm
                .map_or_else(|| "None".to_owned(), |i| i.to_string()),
            self.qpn
        )
    }
}

/// A completion queue (`ibv_create_cq`).
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Cq {
    pub(crate) inner: ferroce::Cq,
}

#[pymethods]
impl Cq {
    #[new]
    #[pyo3(signature = (nic, depth=256))]
    fn new(py: Python<'_>, nic: PyRef<'_, Nic>, depth: usize) -> Result<Self, Error> {
        let nic = nic.get()?;
        let inner = py.detach(|| ferroce::Cq::new(&nic, depth))?;
        Ok(Self { inner })
    }

    /// The oldest completion, or `None` (drives the soft engine on this thread first).
    fn poll(&self, py: Python<'_>) -> Option<Completion> {
        py.detach(|| self.inner.poll()).map(Completion::from)
    }

    /// Up to `max` completions at once (`ibv_poll_cq` with an array).
    #[pyo3(signature = (max=16))]
    fn poll_into<'py>(&self, py: Python<'py>, max: usize) -> PyResult<Bound<'py, PyList>> {
        let max = max.min(4096);
        let got = py.detach(|| {
            let mut out = vec![empty_completion(); max];
            let n = self.inner.poll_into(&mut out);
            out.truncate(n);
            out
        });
        PyList::new(py, got.into_iter().map(Completion::from))
    }

    /// Waits up to `timeout` seconds (`None`: for ever) for a completion, driving the engine
    /// on this thread meanwhile.
    #[pyo3(signature = (timeout=None))]
    fn drive(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Completion>> {
        let t = wait::timeout(timeout)?;
        Ok(wait::sliced(py, t, |slice| self.inner.drive(slice))?.map(Completion::from))
    }

    /// Waits up to `timeout` seconds (`None`: for ever) for a completion, asleep.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Completion>> {
        let t = wait::timeout(timeout)?;
        Ok(wait::sliced(py, t, |slice| self.inner.wait(slice))?.map(Completion::from))
    }

    /// The completions it holds.
    fn depth(&self) -> usize {
        self.inner.depth()
    }

    /// Why it failed, if a verbs device said so.
    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    /// The completion channel's file descriptor (`ibv_comp_channel.fd`, non-blocking), for
    /// `select`, `selectors`, `epoll` or asyncio's `loop.add_reader`: readable once an event
    /// waits, after `req_notify()` armed the CQ. Read it only through `take_events()`. It
    /// belongs to the CQ: valid while the CQ lives, never to be closed by the caller.
    fn fileno(&self) -> i32 {
        use std::os::fd::{AsFd, AsRawFd};
        self.inner.as_fd().as_raw_fd()
    }

    /// Arms the completion channel (`ibv_req_notify_cq`): at the CQ's next completion (with
    /// `solicited_only`, its next receive the sender marked solicited, or its next failed
    /// one) the channel gets one event and `fileno()` turns readable. It fires once: after
    /// `take_events()`, arm again, then poll the CQ dry, since completions that came before
    /// arming raise nothing. Returns `None`; raises `FerroceError` (with `errno`) if a verbs
    /// device refuses.
    #[pyo3(signature = (solicited_only=false))]
    fn req_notify(&self, solicited_only: bool) -> Result<(), Error> {
        Ok(self.inner.req_notify(solicited_only)?)
    }

    /// Takes the channel's events (`ibv_get_cq_event`, acknowledged as `ibv_ack_cq_events`
    /// does): how many arrived since the last take, 0 when none did. Never blocks.
    fn take_events(&self) -> u64 {
        self.inner.take_events()
    }
}

fn empty_completion() -> ferroce::cq::Completion {
    ferroce::cq::Completion {
        wr_id: 0,
        status: ferroce::cq::WcStatus::Success,
        opcode: ferroce::cq::WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qpn: Qpn::from_low_bits(0),
        ud: None,
    }
}

/// What a peer needs to reach a queue pair: its number, its first PSN and its NIC's address.
///
/// `bytes(endpoint)` (or `endpoint.to_bytes()`) is its fixed 28-byte form, all big-endian,
/// for any out-of-band channel: byte 0 the layout's version (1), byte 1 zero, 2-3 the UDP
/// port, 4-7 the QPN, 8-11 the first PSN, 12-27 the NIC's IP address as a GID holds it (an
/// IPv4 address IPv4-mapped, `::ffff:a.b.c.d`). `QpEndpoint.from_bytes` reads it back;
/// `pickle` and `copy` keep it.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct QpEndpoint {
    pub(crate) inner: rqp::QpEndpoint,
}

impl QpEndpoint {
    fn build(qpn: u32, psn: u32, addr: SocketAddr) -> Result<Self, Error> {
        let qpn = Qpn::new(qpn)
            .ok_or_else(|| Error::invalid(format!("QPN {qpn:#x} needs more than 24 bits")))?;
        let psn = Psn::new(psn)
            .ok_or_else(|| Error::invalid(format!("PSN {psn:#x} needs more than 24 bits")))?;
        Ok(Self {
            inner: rqp::QpEndpoint { qpn, psn, addr },
        })
    }
}

#[pymethods]
impl QpEndpoint {
    /// `addr` is what `.addr` gives (`(host, port)`) or its text (`"ip"`, `"ip:port"`,
    /// `"[v6]:port"`; port 4791 when left out).
    #[new]
    fn new(qpn: u32, psn: u32, addr: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(Self::build(qpn, psn, util::addr_arg(addr)?)?)
    }

    #[getter]
    fn qpn(&self) -> u32 {
        self.inner.qpn.value()
    }

    #[getter]
    fn psn(&self) -> u32 {
        self.inner.psn.value()
    }

    /// The NIC's `(host, port)`.
    #[getter]
    fn addr(&self) -> (String, u16) {
        util::addr_tuple(self.inner.addr)
    }

    /// The 28 bytes of the class doc: version 1, a zero byte, the UDP port, the QPN, the
    /// PSN and the 16-byte address, big-endian.
    #[allow(clippy::wrong_self_convention)] // a Python method: pyo3 takes `&self`
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let e = &self.inner;
        let mut out = [0u8; QP_ENDPOINT_LEN];
        out[0] = WIRE_VERSION;
        out[2..4].copy_from_slice(&e.addr.port().to_be_bytes());
        out[4..8].copy_from_slice(&e.qpn.value().to_be_bytes());
        out[8..12].copy_from_slice(&e.psn.value().to_be_bytes());
        let ip = match e.addr.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        out[12..28].copy_from_slice(&ip.octets());
        PyBytes::new(py, &out)
    }

    /// `to_bytes()`.
    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        self.to_bytes(py)
    }

    /// The endpoint `to_bytes()` wrote. Raises `InvalidArgument` (a `ValueError`) for a
    /// length other than 28, a version other than 1, or a QPN or PSN over 24 bits.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> Result<Self, Error> {
        check_wire(data, QP_ENDPOINT_LEN, "QpEndpoint")?;
        let port = u16::from_be_bytes([data[2], data[3]]);
        let mut octets = [0u8; 16];
        octets.copy_from_slice(&data[12..28]);
        let v6 = Ipv6Addr::from(octets);
        let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
        Self::build(be_u32(data, 4), be_u32(data, 8), SocketAddr::new(ip, port))
    }

    /// For `pickle` and `copy`: `QpEndpoint(qpn, psn, (host, port))`.
    #[allow(clippy::type_complexity)]
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (u32, u32, (String, u16)))> {
        let e = slf.get().inner;
        Ok((
            slf.get_type().into_any(),
            (e.qpn.value(), e.psn.value(), util::addr_tuple(e.addr)),
        ))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Self>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        // A tuple hashes its fields in turn: the same hash as hashing each of them.
        let e = &self.inner;
        util::hash_of(&(e.qpn.value(), e.psn.value(), e.addr))
    }

    fn __repr__(&self) -> String {
        format!(
            "QpEndpoint(qpn={:#x}, psn={:#x}, addr={})",
            self.inner.qpn.value(),
            self.inner.psn.value(),
            self.inner.addr
        )
    }
}

/// The operation of a send work request; made by the static methods.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone, Copy)]
pub(crate) struct SendOp {
    inner: rqp::SendOp,
}

#[pymethods]
impl SendOp {
    /// SEND: takes a receive at the peer.
    #[staticmethod]
    fn send() -> Self {
        Self {
            inner: rqp::SendOp::Send,
        }
    }

    /// SEND with 4 bytes of immediate data.
    #[staticmethod]
    fn send_with_imm(imm: u32) -> Self {
        Self {
            inner: rqp::SendOp::SendWithImm(imm),
        }
    }

    /// RDMA WRITE into the peer's memory.
    #[staticmethod]
    fn write(remote: RemoteAddr) -> Self {
        Self {
            inner: rqp::SendOp::Write(remote.inner),
        }
    }

    /// RDMA WRITE, then immediate data that takes a receive at the peer.
    #[staticmethod]
    fn write_with_imm(remote: RemoteAddr, imm: u32) -> Self {
        Self {
            inner: rqp::SendOp::WriteWithImm(remote.inner, imm),
        }
    }

    /// RDMA READ from the peer's memory into the local scatter list (RC only).
    #[staticmethod]
    fn read(remote: RemoteAddr) -> Self {
        Self {
            inner: rqp::SendOp::Read(remote.inner),
        }
    }

    /// 8-byte compare-and-swap (RC only).
    #[staticmethod]
    fn compare_swap(remote: RemoteAddr, compare: u64, swap: u64) -> Self {
        Self {
            inner: rqp::SendOp::CompareSwap {
                remote: remote.inner,
                compare,
                swap,
            },
        }
    }

    /// 8-byte fetch-and-add (RC only).
    #[staticmethod]
    fn fetch_add(remote: RemoteAddr, add: u64) -> Self {
        Self {
            inner: rqp::SendOp::FetchAdd {
                remote: remote.inner,
                add,
            },
        }
    }

    fn __repr__(&self) -> String {
        format!("SendOp({:?})", self.inner)
    }
}

fn payload(local: &Bound<'_, PyAny>) -> PyResult<rqp::Payload> {
    if let Ok(sge) = local.cast::<Sge>() {
        return Ok(rqp::Payload::Sge(sge.get().inner));
    }
    if let Ok(list) = local.cast::<PyList>() {
        let sges = list
            .iter()
            .map(|item| {
                item.cast::<Sge>()
                    .map(|s| s.get().inner)
                    .map_err(|_| Error::invalid("a gather list holds Sge entries").into())
            })
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(rqp::Payload::Sges(sges));
    }
    if local.is_none() {
        return Ok(rqp::Payload::Sges(Vec::new()));
    }
    Ok(rqp::Payload::Inline(memory::bytes_of(local)?))
}

/// A send work request (`struct ibv_send_wr`): `local` is an `Sge`, a list of them, `None`,
/// or bytes to send inline (copied at post time).
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct SendWr {
    inner: rqp::SendWr,
}

#[pymethods]
impl SendWr {
    /// `dest` is where a UD queue pair sends it (`ibv_send_wr.wr.ud`: an
    /// `AddressHandle.dest(qpn, qkey)` or a `UdPeer` that `resolve_ud` found); required on
    /// UD, refused on RC and UC when posted.
    #[new]
    #[pyo3(signature = (wr_id, op, local=None, *, signaled=true, fence=false, solicited=false, dest=None))]
    fn new(
        wr_id: u64,
        op: SendOp,
        local: Option<&Bound<'_, PyAny>>,
        signaled: bool,
        fence: bool,
        solicited: bool,
        dest: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let local = match local {
            Some(l) => payload(l)?,
            None => rqp::Payload::Sges(Vec::new()),
        };
        let mut wr = rqp::SendWr::new(wr_id, op.inner, local);
        wr.signaled = signaled;
        wr.fence = fence;
        wr.solicited = solicited;
        wr.dest = match dest {
            Some(d) if !d.is_none() => Some(crate::ud::dest_arg(d)?),
            _ => None,
        };
        Ok(Self { inner: wr })
    }

    #[getter]
    fn wr_id(&self) -> u64 {
        self.inner.wr_id
    }

    fn __repr__(&self) -> String {
        format!("SendWr({:?})", self.inner)
    }
}

/// A receive work request (`struct ibv_recv_wr`).
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct RecvWr {
    pub(crate) inner: rqp::RecvWr,
}

#[pymethods]
impl RecvWr {
    #[new]
    #[pyo3(signature = (wr_id, sges=None))]
    fn new(wr_id: u64, sges: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let sges = match sges {
            None => Vec::new(),
            Some(s) => match payload(s)? {
                rqp::Payload::Sge(s) => vec![s],
                rqp::Payload::Sges(v) => v,
                rqp::Payload::Inline(_) => {
                    return Err(
                        Error::invalid("a receive scatters into Sge entries, not bytes").into(),
                    )
                }
            },
        };
        Ok(Self {
            inner: rqp::RecvWr { wr_id, sges },
        })
    }

    #[getter]
    fn wr_id(&self) -> u64 {
        self.inner.wr_id
    }
}

/// A queue pair (`ibv_create_qp`), in INIT until `connect` (RC, UC), `ready_ud` (UD) or a
/// connection manager's `accept`/`Connection.connect`. Created with `srq=`, it takes its
/// receives from that shared receive queue (`ibv_qp_init_attr.srq`).
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Qp {
    pub(crate) inner: Arc<ferroce::Qp>,
    /// Whether it takes its receives from a shared receive queue.
    pub(crate) on_srq: bool,
}

#[pymethods]
impl Qp {
    #[new]
    #[pyo3(signature = (nic, qp_type, send_cq, recv_cq, *, sq_depth=128, rq_depth=128, max_inline=400, srq=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        nic: PyRef<'_, Nic>,
        qp_type: QpType,
        send_cq: PyRef<'_, Cq>,
        recv_cq: PyRef<'_, Cq>,
        sq_depth: u32,
        rq_depth: u32,
        max_inline: u32,
        srq: Option<PyRef<'_, crate::srq::Srq>>,
    ) -> Result<Self, Error> {
        let nic = nic.get()?;
        let qp_type = qp_type.0;
        let caps = rqp::QpCaps {
            sq_depth,
            rq_depth,
            max_inline,
        };
        let (s, r) = (&send_cq.inner, &recv_cq.inner);
        let srq = srq.map(|q| q.inner.clone());
        let on_srq = srq.is_some();
        let inner = py.detach(|| match &srq {
            Some(q) => ferroce::Qp::with_srq(&nic, qp_type, s, r, q, caps),
            None => ferroce::Qp::new(&nic, qp_type, s, r, caps),
        })?;
        Ok(Self {
            inner: Arc::new(inner),
            on_srq,
        })
    }

    /// This queue pair's endpoint, for the peer.
    fn endpoint(&self) -> QpEndpoint {
        QpEndpoint {
            inner: self.inner.endpoint(),
        }
    }

    /// The queue pair number.
    fn qpn(&self) -> u32 {
        self.inner.qpn().value()
    }

    /// `(sq_depth, rq_depth, max_inline)`.
    fn caps(&self) -> (u32, u32, u32) {
        let c = self.inner.caps();
        (c.sq_depth, c.rq_depth, c.max_inline)
    }

    /// The state's name (`"Init"`, `"Rts"`, `"Err"`, …), or `None` once destroyed.
    fn state(&self, py: Python<'_>) -> Option<String> {
        py.detach(|| self.inner.state()).map(|s| format!("{s:?}"))
    }

    /// Why the QP failed, if a verbs device said so.
    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }

    /// Connects to `peer`: INIT → RTR → RTS.
    #[pyo3(
        signature = (peer, *, mtu=1024, access=Access::REMOTE, timeout=14, retry_cnt=7, rnr_retry=7, min_rnr_timer=12, max_rd_atomic=16),
        text_signature = "($self, peer, *, mtu=1024, access='Remote', timeout=14, retry_cnt=7, rnr_retry=7, min_rnr_timer=12, max_rd_atomic=16)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn connect(
        &self,
        py: Python<'_>,
        peer: QpEndpoint,
        mtu: u32,
        access: Access,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        min_rnr_timer: u8,
        max_rd_atomic: u8,
    ) -> Result<(), Error> {
        let mtu = Mtu::from_bytes(mtu).ok_or_else(|| {
            Error::invalid(format!("mtu {mtu} is not 256, 512, 1024, 2048 or 4096"))
        })?;
        let options = ConnectOptions {
            mtu,
            access: access.0,
            timeout,
            retry_cnt,
            rnr_retry,
            min_rnr_timer,
            max_rd_atomic,
        };
        py.detach(|| self.inner.connect(&peer.inner, &options))?;
        Ok(())
    }

    /// Brings a UD queue pair up to send and receive datagrams with Q_Key `qkey`: INIT →
    /// RTR → RTS (`ibv_modify_qp` three times, as `ibv_ud_pingpong` does). Its sends then
    /// name their destination (`SendWr(..., dest=...)`), and every receive buffer begins
    /// with the 40-byte GRH (`UD_GRH_LEN`) before the payload. Raises `ModifyError` when
    /// the queue pair is not a UD one in INIT.
    #[pyo3(
        signature = (qkey=ferroce::ud::RDMA_UDP_QKEY),
        text_signature = "($self, qkey=0x1234567)"
    )]
    fn ready_ud(&self, py: Python<'_>, qkey: u32) -> Result<(), Error> {
        py.detach(|| self.inner.ready_ud(qkey))?;
        Ok(())
    }

    /// Posts a send work request; its packets leave before this returns.
    fn post_send(&self, py: Python<'_>, wr: PyRef<'_, SendWr>) -> Result<(), Error> {
        let wr = wr.inner.clone();
        py.detach(|| self.inner.post_send(wr))?;
        Ok(())
    }

    /// Posts several send work requests at once; on a refusal, raises `PostError` naming the
    /// index of the first one not posted (those before it are posted).
    fn post_send_list(&self, py: Python<'_>, wrs: Vec<PyRef<'_, SendWr>>) -> Result<(), Error> {
        let wrs: Vec<rqp::SendWr> = wrs.iter().map(|w| w.inner.clone()).collect();
        py.detach(|| self.inner.post_send_list(wrs))
            .map_err(|(i, e)| {
                Error::new(
                    crate::errors::Class::PostError,
                    "PostError",
                    format!("work request {i} was not posted: {e}"),
                )
            })
    }

    /// Posts a receive work request.
    fn post_recv(&self, py: Python<'_>, wr: PyRef<'_, RecvWr>) -> Result<(), Error> {
        let wr = wr.inner.clone();
        py.detach(|| self.inner.post_recv(wr))?;
        Ok(())
    }

    /// Moves the queue pair to ERR: everything outstanding completes with a flush error.
    fn shutdown(&self, py: Python<'_>) {
        py.detach(|| self.inner.shutdown());
    }

    fn __repr__(&self) -> String {
        format!("<ferroce.Qp {:#x}>", self.inner.qpn().value())
    }
}
