//! `Nic` and `Faults`.

use std::net::SocketAddr;
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use ferroce::proto::wire::ROCE_PORT;
use ferroce::{DeviceOptions, NicConfig};

use crate::errors::Error;
use crate::util;

/// The devices this host can open (``ibv_get_device_list``), as names: ``"ferroce0"``, the soft
/// NIC, always first, then each RDMA device libibverbs lists (``Nic.open_device`` opens one).
/// A host without libibverbs or without RDMA in its kernel lists ``["ferroce0"]`` alone.
#[pyfunction]
pub(crate) fn devices() -> Vec<String> {
    ferroce::Nic::device_names()
}

/// Faults to inject into every packet sent (`--fault`): probabilities of loss, duplication,
/// reordering and corruption, a delay, and the generator's seed.
#[pyclass(module = "ferroce", frozen, from_py_object)]
#[derive(Clone)]
pub(crate) struct Faults {
    pub(crate) inner: ferroce::Faults,
}

#[pymethods]
impl Faults {
    /// Faults from `spec` (`"loss=0.1,dup=0.01,reorder=0,corrupt=0,delay=US,seed=N"`), then
    /// from the keyword arguments, which win.
    #[new]
    #[pyo3(signature = (spec=None, *, loss=None, dup=None, reorder=None, corrupt=None, delay=None, seed=None))]
    fn new(
        spec: Option<&str>,
        loss: Option<f64>,
        dup: Option<f64>,
        reorder: Option<f64>,
        corrupt: Option<f64>,
        delay: Option<f64>,
        seed: Option<u64>,
    ) -> Result<Self, Error> {
        let mut inner: ferroce::Faults = spec.unwrap_or("").parse()?;
        for (name, value, slot) in [
            ("loss", loss, &mut inner.loss),
            ("dup", dup, &mut inner.dup),
            ("reorder", reorder, &mut inner.reorder),
            ("corrupt", corrupt, &mut inner.corrupt),
        ] {
            if let Some(p) = value {
                if !(0.0..=1.0).contains(&p) {
                    return Err(Error::invalid(format!(
                        "{name}={p} is not a probability in 0..1"
                    )));
                }
                *slot = p;
            }
        }
        if let Some(d) = delay {
            inner.delay = util::seconds("delay", d)?;
        }
        if let Some(s) = seed {
            inner.seed = s;
        }
        Ok(Self { inner })
    }

    #[getter]
    fn loss(&self) -> f64 {
        self.inner.loss
    }

    #[getter]
    fn dup(&self) -> f64 {
        self.inner.dup
    }

    #[getter]
    fn reorder(&self) -> f64 {
        self.inner.reorder
    }

    #[getter]
    fn corrupt(&self) -> f64 {
        self.inner.corrupt
    }

    /// The delay, in seconds.
    #[getter]
    fn delay(&self) -> f64 {
        self.inner.delay.as_secs_f64()
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.inner.seed
    }

    fn __str__(&self) -> String {
        self.inner.to_string()
    }

    fn __repr__(&self) -> String {
        format!("Faults({:?})", self.inner.to_string())
    }
}

/// Faults from a `Faults`, a specification string, or `None`.
pub(crate) fn faults_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<ferroce::Faults>> {
    let Some(value) = value else {
        return Ok(None);
    };
    if value.is_none() {
        return Ok(None);
    }
    if let Ok(f) = value.cast::<Faults>() {
        return Ok(Some(f.get().inner));
    }
    if let Ok(spec) = value.extract::<String>() {
        return Ok(Some(spec.parse().map_err(Error::from)?));
    }
    Err(Error::invalid("faults must be a Faults, a specification string or None").into())
}

/// A RoCEv2 NIC: the soft NIC on a local address (`Nic("127.0.1.1")`), or a kernel RDMA
/// device (`Nic.open_device("rxe0")`). `close()` (or the end of a `with` block) stops it;
/// so does the last reference going.
#[pyclass(module = "ferroce", frozen)]
pub(crate) struct Nic {
    inner: Mutex<Option<ferroce::Nic>>,
}

impl Nic {
    pub(crate) fn wrap(nic: ferroce::Nic) -> Self {
        Self {
            inner: Mutex::new(Some(nic)),
        }
    }

    /// The Rust NIC, or `Closed` after `close()`.
    pub(crate) fn get(&self) -> Result<ferroce::Nic, Error> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or_else(|| Error::closed("the NIC is closed"))
    }
}

#[pymethods]
impl Nic {
    /// Opens the soft NIC on `addr` (`"ip"` or `"ip:port"`; port 4791 by default).
    #[new]
    #[pyo3(signature = (addr, *, faults=None, pcap=None, gso=true, gro=true))]
    fn new(
        py: Python<'_>,
        addr: &str,
        faults: Option<&Bound<'_, PyAny>>,
        pcap: Option<std::path::PathBuf>,
        gso: bool,
        gro: bool,
    ) -> PyResult<Self> {
        let config = NicConfig {
            addr: util::socket_addr(addr, ROCE_PORT)?,
            faults: faults_arg(faults)?,
            pcap,
            gso,
            gro,
            ..NicConfig::default()
        };
        let nic = py
            .detach(|| ferroce::Nic::open(&config))
            .map_err(Error::from)?;
        Ok(Self::wrap(nic))
    }

    /// Opens the device called `name`: `"ferroce0"` is the soft NIC on `local` (or
    /// 127.0.0.1), any other name a kernel RDMA device through libibverbs.
    #[staticmethod]
    #[pyo3(signature = (name, *, port=1, gid_index=None, local=None))]
    fn open_device(
        py: Python<'_>,
        name: &str,
        port: u8,
        gid_index: Option<u32>,
        local: Option<&str>,
    ) -> PyResult<Self> {
        let local = local.map(util::ip).transpose()?;
        let options = DeviceOptions {
            port,
            gid_index,
            local,
        };
        let soft = local.map_or_else(NicConfig::default, NicConfig::on);
        let nic = py
            .detach(|| ferroce::Nic::open_device(name, &options, &soft))
            .map_err(Error::from)?;
        Ok(Self::wrap(nic))
    }

    /// The soft NIC on a UDP socket the caller already bound (a `socket.socket` or its file
    /// descriptor), as Hololink's Linux receiver takes one: the NIC uses a duplicate of the
    /// descriptor, so the caller may close its own.
    #[staticmethod]
    #[pyo3(signature = (sock, *, faults=None, pcap=None, gso=true, gro=true))]
    fn from_udp_socket(
        py: Python<'_>,
        sock: &Bound<'_, PyAny>,
        faults: Option<&Bound<'_, PyAny>>,
        pcap: Option<std::path::PathBuf>,
        gso: bool,
        gro: bool,
    ) -> PyResult<Self> {
        let fd: i32 = match sock.extract::<i32>() {
            Ok(fd) => fd,
            Err(_) => {
                if let Ok(kind) = sock.getattr("type") {
                    let dgram = py.import("socket")?.getattr("SOCK_DGRAM")?;
                    if !kind.eq(dgram)? {
                        return Err(
                            Error::invalid("the socket is not a UDP (SOCK_DGRAM) socket").into(),
                        );
                    }
                }
                sock.call_method0("fileno")?.extract()?
            }
        };
        let dup: i32 = py.import("os")?.call_method1("dup", (fd,))?.extract()?;
        let socket = adopt(dup);
        let addr = socket.local_addr().map_err(Error::from)?;
        let config = NicConfig {
            addr,
            faults: faults_arg(faults)?,
            pcap,
            gso,
            gro,
            ..NicConfig::default()
        };
        let nic = py
            .detach(|| ferroce::Nic::from_udp_socket(socket, &config))
            .map_err(Error::from)?;
        Ok(Self::wrap(nic))
    }

    /// The device's name: `"ferroce0"` for the soft NIC.
    fn device_name(&self) -> Result<String, Error> {
        Ok(self.get()?.device_name().to_owned())
    }

    /// The local address and UDP port, as `(host, port)`.
    fn addr(&self) -> Result<(String, u16), Error> {
        Ok(util::addr_tuple(self.get()?.addr()))
    }

    /// The GID index in use (0 on the soft NIC).
    fn gid_index(&self) -> Result<u32, Error> {
        Ok(self.get()?.gid_index())
    }

    /// What the backend offers, as a dict.
    fn caps<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.get()?.caps();
        let d = PyDict::new(py);
        d.set_item("dmabuf", c.dmabuf)?;
        d.set_item("pageable_memory", c.pageable_memory)?;
        d.set_item("max_inline", c.max_inline)?;
        d.set_item("max_qp_wr", c.max_qp_wr)?;
        d.set_item("max_cqe", c.max_cqe)?;
        d.set_item("max_rd_atomic", c.max_rd_atomic)?;
        d.set_item("per_packet_counters", c.per_packet_counters)?;
        d.set_item("fault_injection", c.fault_injection)?;
        d.set_item("pcap", c.pcap)?;
        d.set_item("manual_progress", c.manual_progress)?;
        Ok(d)
    }

    /// The path MTU in bytes (256 to 4096).
    fn active_mtu(&self) -> Result<u32, Error> {
        Ok(self.get()?.active_mtu().bytes())
    }

    /// The engine's counters by name (all zero on a verbs device).
    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let nic = self.get()?;
        let counters = py.detach(|| nic.counters());
        let d = PyDict::new(py);
        for (name, value) in counters.iter() {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// What the soft engine holds now (queue pairs, CQs, regions, …), or `None` on a
    /// verbs device.
    fn census<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let nic = self.get()?;
        let Some(c) = py.detach(|| nic.census()) else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("qps", c.qps)?;
        d.set_item("cqs", c.cqs)?;
        d.set_item("srqs", c.srqs)?;
        d.set_item("regions", c.regions)?;
        d.set_item("armed_timers", c.armed_timers)?;
        d.set_item("queued_completions", c.queued_completions)?;
        Ok(Some(d))
    }

    /// The counters as `rdma statistic show` prints them.
    fn statistics_line(&self, py: Python<'_>, device: &str) -> Result<String, Error> {
        let nic = self.get()?;
        Ok(py.detach(|| nic.statistics_line(device)))
    }

    /// Whether sends go out by UDP GSO, and if not, why not.
    fn gso_status(&self) -> Result<String, Error> {
        Ok(self.get()?.gso_status().to_string())
    }

    /// Why the NIC failed for good, if it did.
    fn failure(&self) -> Result<Option<String>, Error> {
        Ok(self.get()?.failure())
    }

    /// Asks for socket buffers of `bytes`; returns what the kernel granted.
    fn grow_buffers(&self, bytes: usize) -> Result<usize, Error> {
        Ok(self.get()?.grow_buffers(bytes)?)
    }

    /// Whether the NIC's address has gone from the host.
    fn address_gone(&self) -> Result<bool, Error> {
        Ok(self.get()?.address_gone())
    }

    /// The async-event file descriptor (`ibv_context.async_fd`, non-blocking), for `select`,
    /// `selectors`, `epoll` or asyncio's `loop.add_reader`: readable while an event waits
    /// for `poll_event()`, which clears it with the last one. It belongs to the NIC: valid
    /// until `close()`, never to be closed by the caller. Raises `Closed` after `close()`.
    fn fileno(&self) -> Result<i32, Error> {
        use std::os::fd::AsRawFd;
        Ok(self.get()?.async_fd().as_raw_fd())
    }

    /// The same descriptor as `fileno()` (libibverbs' name for it).
    fn async_fd(&self) -> Result<i32, Error> {
        self.fileno()
    }

    /// The next asynchronous event (`ibv_get_async_event`, acknowledged at once): an
    /// `AsyncEvent` (an SRQ below its armed limit, a QP on an SRQ that took its last
    /// receive), or `None` when none waits; never blocks. A verbs device's own events are
    /// handled by ferroce and show in the `failure()`s: there this returns `None`, after
    /// clearing the descriptor. Raises `Closed` after `close()`.
    fn poll_event(&self, py: Python<'_>) -> Result<Option<crate::srq::AsyncEvent>, Error> {
        let nic = self.get()?;
        Ok(py.detach(|| nic.poll_event()).map(Into::into))
    }

    /// Stops the NIC (its progress thread and socket); idempotent. Objects made on it
    /// (regions, queue pairs, receivers) stay safe to use and to drop: their calls answer
    /// errors or nothing.
    fn close(&self, py: Python<'_>) {
        let nic = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(nic) = nic {
            py.detach(move || {
                nic.close();
                drop(nic);
            });
        }
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.get() {
            Ok(nic) => format!("<ferroce.Nic {} at {}>", nic.device_name(), nic.addr()),
            Err(_) => "<ferroce.Nic closed>".to_owned(),
        }
    }
}

/// Takes ownership of `fd`, a descriptor `os.dup` just returned.
#[allow(unsafe_code)]
fn adopt(fd: i32) -> std::net::UdpSocket {
    use std::os::fd::FromRawFd;
    // SAFETY: `os.dup` returned a fresh, open descriptor that nothing else owns or will
    // close; the socket takes it over and closes it when dropped.
    unsafe { std::net::UdpSocket::from_raw_fd(fd) }
}

/// The soft NIC's default address for an IP, for the faces that open their own.
pub(crate) fn roce_addr(ip: &str) -> Result<SocketAddr, Error> {
    util::socket_addr(ip, ROCE_PORT)
}
