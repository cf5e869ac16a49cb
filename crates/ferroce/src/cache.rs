//! The registered-buffer cache (neuray's `IRDMA_context`): a [`Context`] bound to one
//! connected remote host hands out registered buffers and sends them there.
//!
//! Registering memory is costly (the pages are locked and entered in the NIC's table), so a
//! buffer is not deregistered when dropped: it goes back to the context's cache, keyed by size
//! class (the next power of two, at least 64 bytes) and device, and the next request of that
//! class takes it again. Registration is paid once per buffer, not per message.
//!
//! - [`Context::write_memory`] and [`Context::read_memory`] (neuray's `get_write_memory` and
//!   `get_read_memory`) hand out buffers of host memory, or of a GPU by device id: CUDA
//!   memory with the `cuda` feature, or what a [`DeviceAllocator`] given to
//!   [`Context::connect_with_allocator`] allocates. Without one, or where the device does
//!   not exist, a GPU id is [`CacheError::NotSupported`].
//! - A GPU buffer's bytes live in device memory ([`Buffer::device_memory`]); the soft NIC
//!   sends from and receives into registered host staging cached with it. `flush` copies
//!   the device's bytes to the staging before sending, `receive` copies what arrived to the
//!   device before returning; for a peer's one-sided READ or WRITE at [`Buffer::remote`],
//!   [`Buffer::sync_to_registered`] and [`Buffer::sync_from_registered`] do the same.
//! - [`Context::wrap_user_buffer`] registers the caller's own bytes (not cached; they come back
//!   with [`Buffer::into_user_buffer`]).
//! - [`Context::flush`] sends a buffer to the remote host as one SEND and waits until the remote
//!   NIC acknowledged it; the remote receives it in one of its read buffers with
//!   [`Context::receive`]. Each context keeps [`ContextConfig::receive_depth`] read buffers of
//!   [`ContextConfig::max_message`] bytes posted, and refuses to flush more than the remote's.
//!
//! neuray's return codes map to [`CacheError`]: 0 is `Ok`, -1 ("invalid parameters") is
//! [`CacheError::InvalidParameters`] and -2 ("not supported in this context") is
//! [`CacheError::NotSupported`] ([`CacheError::seed_code`] gives the number back); where the
//! seed returns NULL for an allocation failure, this returns [`CacheError::Allocation`].
//!
//! A context is `Clone + Send + Sync`: every clone is the same context, and any number of
//! threads may take buffers, flush and receive at once.

use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use ferroce_proto::memory::WriteOrder;
use ferroce_proto::qp::{
    ModifyError, Mtu, Payload, PostError, QpCaps, RecvWr, RemoteAddr, SendOp, SendWr, WcStatus,
};
use ferroce_proto::wire::ROCE_PORT;

use crate::device::{DeviceAllocator, DeviceError, DeviceMemory};
use crate::exchange::ExchangeError;
use crate::oob::{self, LineError, OpenWords, RcConnection, RcPlan};
use crate::{
    ConnectOptions, Cq, Nic, NicError, Qp, Region, RegionAccess, RegionError, RegionMemory,
};

/// The version of the context's hello; a peer with another is refused by name.
pub const CACHE_VERSION: u32 = 1;

/// The smallest size class.
pub const MIN_CLASS: usize = 64;

/// The largest buffer: 2 GiB, the largest message RoCE carries.
pub const MAX_BUFFER: usize = 1 << 31;

/// Where a buffer's memory lives (neuray's `gpu_id`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// Main memory (`gpu_id` -1).
    #[default]
    Host,
    /// The GPU with this id (CUDA's device ordinal with the `cuda` feature).
    Gpu(u32),
}

impl Device {
    /// The device of a seed `gpu_id`: -1 for main memory, 0 and up for a GPU.
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for ids below -1.
    pub fn from_seed_id(gpu_id: i32) -> Result<Self, CacheError> {
        match gpu_id {
            -1 => Ok(Self::Host),
            id if id >= 0 => Ok(Self::Gpu(id as u32)),
            id => Err(CacheError::InvalidParameters(format!(
                "gpu_id {id}: -1 is main memory, 0 and up a GPU"
            ))),
        }
    }
}

/// Why a context call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// neuray's -1: a parameter is invalid (a size of zero or beyond [`MAX_BUFFER`], a
    /// buffer of another context, a range outside a buffer).
    #[error("invalid parameters: {0}")]
    InvalidParameters(String),
    /// neuray's -2: not supported in this context (GPU memory without the `cuda` feature,
    /// without a driver, or on a device that does not exist).
    #[error("not supported in this context: {0}")]
    NotSupported(String),
    /// A GPU buffer's device memory refused a copy.
    #[error("device memory: {0}")]
    Device(#[from] DeviceError),
    /// Where neuray's API returns NULL: the memory could not be allocated or registered.
    #[error("cannot allocate a buffer of {size} bytes: {reason}")]
    Allocation {
        /// The size asked for.
        size: usize,
        /// Why (the memlock limit, most often).
        reason: String,
    },
    /// The buffer is larger than the remote host's read buffers.
    #[error(
        "a buffer of {size} bytes is larger than the remote host's read buffers ({max} bytes)"
    )]
    TooLargeForRemote {
        /// The buffer's length.
        size: usize,
        /// The remote's read-buffer size.
        max: usize,
    },
    /// The transport failed (the remote host stopped answering or refused).
    #[error("the transport failed: {0}")]
    Transport(WcStatus),
    /// Nothing came in time.
    #[error("timed out after {} ms {what}", after.as_millis())]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// The context was shut down after a failure.
    #[error("the context is closed: {0}")]
    Closed(String),
    /// The remote host speaks another version of the context's hello.
    #[error("the remote host speaks ferroce cache version {theirs}; this build speaks {ours}")]
    Version {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// The remote host said something unexpected.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The NIC could not be opened.
    #[error(transparent)]
    Nic(#[from] NicError),
    /// The endpoint exchange failed.
    #[error(transparent)]
    Exchange(#[from] ExchangeError),
    /// The queue pair could not be connected.
    #[error("cannot connect the queue pair: {0}")]
    Modify(#[from] ModifyError),
    /// A work request could not be posted.
    #[error("cannot post: {0}")]
    Post(#[from] PostError),
    /// The out-of-band connection failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
}

impl CacheError {
    /// neuray's return code for this error: -1 (invalid parameters) or -2 (not supported
    /// in this context); `None` for failures neuray's API has no code for.
    #[must_use]
    pub fn seed_code(&self) -> Option<i32> {
        match self {
            Self::InvalidParameters(_) => Some(-1),
            Self::NotSupported(_) => Some(-2),
            _ => None,
        }
    }
}

/// How to bind a context to its remote host.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ContextConfig {
    /// This side's soft NIC: a local address and UDP port (4791 for RoCEv2).
    pub nic: SocketAddr,
    /// The out-of-band TCP address: dialled, or listened on when `listen` is set.
    pub oob: SocketAddr,
    /// Whether this side listens on `oob` (one side listens, the other dials).
    pub listen: bool,
    /// The device: `ferroce0`, the soft NIC (the default), or a verbs device such as `rxe0`;
    /// on a verbs device `nic`'s address chooses its RoCE v2 GID.
    pub device: String,
    /// The verbs device's port (1).
    pub ib_port: u8,
    /// How long connecting and a blocked `flush` wait (10 s).
    pub timeout: Duration,
    /// The size of the read buffers this side keeps posted: the largest buffer the remote
    /// may flush here (1 MiB).
    pub max_message: usize,
    /// How many read buffers stay posted (16).
    pub receive_depth: u16,
    /// Where the read buffers live: a GPU's memory, or main memory (the default).
    pub receive_device: Device,
    /// Cached bytes beyond which returned buffers are deregistered instead (256 MiB).
    pub max_cached_bytes: usize,
    /// Path MTU to ask for; the smaller of both sides' wins. `None` (the default) asks for
    /// the NIC's [`active_mtu`](crate::Nic::active_mtu), as rxe would.
    pub mtu: Option<Mtu>,
}

impl ContextConfig {
    /// A NIC on `ip` (port 4791) and the out-of-band address `oob`, with the defaults.
    #[must_use]
    pub fn new(ip: std::net::IpAddr, oob: SocketAddr, listen: bool) -> Self {
        Self {
            nic: SocketAddr::new(ip, ROCE_PORT),
            oob,
            listen,
            device: crate::verbs::SOFT_DEVICE.to_owned(),
            ib_port: 1,
            timeout: Duration::from_secs(10),
            max_message: 1 << 20,
            receive_depth: 16,
            receive_device: Device::Host,
            max_cached_bytes: 256 << 20,
            mtu: None,
        }
    }

    /// The same with read buffers of `bytes`.
    #[must_use]
    pub fn with_max_message(mut self, bytes: usize) -> Self {
        self.max_message = bytes;
        self
    }

    /// The same on the device called `name` (`ferroce0` or a verbs device).
    #[must_use]
    pub fn on_device(mut self, name: &str) -> Self {
        name.clone_into(&mut self.device);
        self
    }

    /// The same with another timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same with read buffers on `device`.
    #[must_use]
    pub fn with_receive_device(mut self, device: Device) -> Self {
        self.receive_device = device;
        self
    }

    /// The same with another cache limit.
    #[must_use]
    pub fn with_max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }
}

/// What the cache has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Buffers registered (cache misses and wrapped user buffers).
    pub registrations: u64,
    /// Requests served from the cache.
    pub hits: u64,
    /// Requests that had to register a buffer.
    pub misses: u64,
    /// Returned buffers deregistered because the cache was full.
    pub evictions: u64,
    /// Buffers in the cache now.
    pub cached_buffers: u64,
    /// Their bytes.
    pub cached_bytes: u64,
}

/// The size class of `size`: the next power of two, at least [`MIN_CLASS`].
#[must_use]
pub fn size_class(size: usize) -> usize {
    size.max(MIN_CLASS).next_power_of_two()
}

/// The cache proper: registered regions by (size class, device).
#[derive(Debug)]
struct Pool {
    nic: Nic,
    context: u64,
    max_cached_bytes: usize,
    /// Where GPU buffers come from; `None` refuses them.
    allocator: Option<Arc<dyn DeviceAllocator>>,
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    regions: HashMap<(usize, Device), Vec<Cached>>,
    stats: CacheStats,
}

/// What a cached buffer keeps: its registered memory, and its device memory for a GPU.
#[derive(Debug)]
struct Cached {
    region: Region,
    memory: Option<Arc<dyn DeviceMemory>>,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A buffer of `size` bytes on `device`, from the cache or newly registered.
    fn take(self: &Arc<Self>, size: usize, device: Device) -> Result<Buffer, CacheError> {
        check_size(size)?;
        if let Device::Gpu(id) = device {
            self.allocator(id)?;
        }
        let class = size_class(size);
        let cached = {
            let mut free = self.lock();
            let region = free.regions.get_mut(&(class, device)).and_then(Vec::pop);
            if region.is_some() {
                free.stats.hits += 1;
                free.stats.cached_buffers -= 1;
                free.stats.cached_bytes -= class as u64;
            }
            region
        };
        let Cached { region, memory } = match cached {
            Some(cached) => cached,
            None => {
                let memory = match device {
                    Device::Host => None,
                    Device::Gpu(id) => Some(self.device_memory(id, class)?),
                };
                let region = register(&self.nic, vec![0; 0], class)?;
                // Counted once it worked: a request that failed registered nothing.
                let mut free = self.lock();
                free.stats.registrations += 1;
                free.stats.misses += 1;
                drop(free);
                Cached { region, memory }
            }
        };
        Ok(Buffer {
            region: Some(region),
            memory,
            len: size,
            class: Some(class),
            device,
            pool: Arc::clone(self),
        })
    }

    fn allocator(&self, id: u32) -> Result<&Arc<dyn DeviceAllocator>, CacheError> {
        self.allocator.as_ref().ok_or_else(|| {
            CacheError::NotSupported(format!(
                "GPU {id}: this build of ferroce has no `cuda` feature and the context no \
                 device allocator; use main memory (-1)"
            ))
        })
    }

    /// `size` bytes of GPU `id`'s memory.
    fn device_memory(&self, id: u32, size: usize) -> Result<Arc<dyn DeviceMemory>, CacheError> {
        self.allocator(id)?.alloc(id, size).map_err(|e| match e {
            DeviceError::Unavailable(why) => CacheError::NotSupported(format!("GPU {id}: {why}")),
            DeviceError::Allocation { reason, .. } => CacheError::Allocation { size, reason },
            e => CacheError::Device(e),
        })
    }

    /// Takes a buffer's memory back, or lets it go when the cache is full.
    fn give_back(&self, class: usize, device: Device, cached: Cached) {
        let mut free = self.lock();
        if free.stats.cached_bytes as usize + class > self.max_cached_bytes {
            free.stats.evictions += 1;
            drop(free);
            drop(cached);
            return;
        }
        free.stats.cached_buffers += 1;
        free.stats.cached_bytes += class as u64;
        free.regions
            .entry((class, device))
            .or_default()
            .push(cached);
    }
}

fn check_size(size: usize) -> Result<(), CacheError> {
    if size == 0 || size > MAX_BUFFER {
        return Err(CacheError::InvalidParameters(format!(
            "a buffer of {size} bytes: sizes are 1 to {MAX_BUFFER}"
        )));
    }
    Ok(())
}

/// Registers `bytes`, grown to `len` bytes, for local use and remote reads and writes.
fn register(nic: &Nic, mut bytes: Vec<u8>, len: usize) -> Result<Region, CacheError> {
    if bytes.len() < len {
        bytes
            .try_reserve_exact(len - bytes.len())
            .map_err(|_| CacheError::Allocation {
                size: len,
                reason: "out of memory".into(),
            })?;
        bytes.resize(len, 0);
    }
    Region::register(
        nic,
        RegionAccess::Remote,
        WriteOrder::InOrder,
        RegionMemory::Host(bytes),
    )
    .map_err(|e: RegionError| CacheError::Allocation {
        size: len,
        reason: e.to_string(),
    })
}

/// A registered buffer of a [`Context`] (neuray's `IRDMA_buffer`). Dropping a buffer from
/// the cache gives it back to the cache, still registered; a wrapped user buffer is
/// deregistered.
#[derive(Debug)]
pub struct Buffer {
    region: Option<Region>,
    /// Where a GPU buffer's bytes live; `region` is then its staging.
    memory: Option<Arc<dyn DeviceMemory>>,
    len: usize,
    /// The size class, for cached buffers; `None` for a wrapped user buffer.
    class: Option<usize>,
    device: Device,
    pool: Arc<Pool>,
}

impl Buffer {
    fn region(&self) -> Result<&Region, CacheError> {
        self.region
            .as_ref()
            .ok_or_else(|| CacheError::InvalidParameters("the buffer was given back".into()))
    }

    fn check(&self, at: usize, len: usize) -> Result<(), CacheError> {
        if at.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(CacheError::InvalidParameters(format!(
                "{len} bytes at {at} are outside a buffer of {} bytes",
                self.len
            )));
        }
        Ok(())
    }

    /// Its length in bytes: what was asked for, or what arrived in a read buffer.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (a received empty message).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The registered bytes behind it (its size class, for cached buffers).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.region.as_ref().map_or(0, |r| r.len() as usize)
    }

    /// Where its memory lives.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }

    /// Sets its length, up to its capacity (say how much of a write buffer to flush).
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] beyond the capacity.
    pub fn set_len(&mut self, len: usize) -> Result<(), CacheError> {
        if len > self.capacity() {
            return Err(CacheError::InvalidParameters(format!(
                "length {len} beyond the capacity {}",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// The device memory a GPU buffer's bytes live in: a kernel finds byte `i` at its
    /// [`DeviceMemory::address`] plus `i`.
    #[must_use]
    pub fn device_memory(&self) -> Option<&Arc<dyn DeviceMemory>> {
        self.memory.as_ref()
    }

    /// Copies `data` to offset `at` (of the device memory, for a GPU buffer).
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for a range outside the buffer;
    /// [`CacheError::Device`] when the device refused the copy.
    pub fn write(&self, at: usize, data: &[u8]) -> Result<(), CacheError> {
        self.check(at, data.len())?;
        if let Some(memory) = &self.memory {
            return Ok(memory.write(at as u64, data)?);
        }
        self.region()?
            .write(at as u64, data)
            .map_err(|e| CacheError::InvalidParameters(e.to_string()))
    }

    /// Copies `out.len()` bytes from offset `at` (of the device memory, for a GPU buffer).
    ///
    /// # Errors
    ///
    /// As [`Buffer::write`].
    pub fn read(&self, at: usize, out: &mut [u8]) -> Result<(), CacheError> {
        self.check(at, out.len())?;
        if let Some(memory) = &self.memory {
            return Ok(memory.read(at as u64, out)?);
        }
        self.region()?
            .read(at as u64, out)
            .map_err(|e| CacheError::InvalidParameters(e.to_string()))
    }

    /// For a GPU buffer, copies its `len()` bytes from the device to the registered staging
    /// the NIC reads (before a peer's RDMA READ at [`Buffer::remote`]; `flush` does it
    /// itself). Nothing to do for host memory.
    ///
    /// # Errors
    ///
    /// [`CacheError::Device`] when the device refused the copy.
    pub fn sync_to_registered(&self) -> Result<(), CacheError> {
        self.sync(true)
    }

    /// For a GPU buffer, copies its `len()` bytes from the registered staging the NIC
    /// writes to the device (after a peer's RDMA WRITE at [`Buffer::remote`]; `receive`
    /// does it itself). Nothing to do for host memory.
    ///
    /// # Errors
    ///
    /// [`CacheError::Device`] when the device refused the copy.
    pub fn sync_from_registered(&self) -> Result<(), CacheError> {
        self.sync(false)
    }

    fn sync(&self, to_registered: bool) -> Result<(), CacheError> {
        const STEP: usize = 1 << 20;
        let Some(memory) = &self.memory else {
            return Ok(());
        };
        let region = self.region()?;
        let mut piece = vec![0u8; self.len.min(STEP)];
        let mut at = 0;
        while at < self.len {
            let n = (self.len - at).min(STEP);
            let piece = &mut piece[..n];
            let staged = |e: RegionError| CacheError::InvalidParameters(e.to_string());
            if to_registered {
                memory.read(at as u64, piece)?;
                region.write(at as u64, piece).map_err(staged)?;
            } else {
                region.read(at as u64, piece).map_err(staged)?;
                memory.write(at as u64, piece)?;
            }
            at += n;
        }
        Ok(())
    }

    /// A copy of its `len()` bytes.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.len];
        if self.read(0, &mut out).is_err() {
            out.clear();
        }
        out
    }

    /// Where the remote host reads or writes it (for a peer's RDMA READ or WRITE).
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for an empty buffer.
    pub fn remote(&self) -> Result<RemoteAddr, CacheError> {
        self.region()?
            .remote(0)
            .map_err(|e| CacheError::InvalidParameters(e.to_string()))
    }

    /// A wrapped user buffer gives the user's bytes back (deregistered, with what was written
    /// into them); any other buffer is returned as it is.
    ///
    /// # Errors
    ///
    /// The buffer itself (boxed) when it is not a wrapped user buffer.
    pub fn into_user_buffer(mut self) -> Result<Vec<u8>, Box<Self>> {
        if self.class.is_some() || self.memory.is_some() {
            return Err(Box::new(self));
        }
        match self.region.take().map(Region::deregister) {
            Some(Ok(RegionMemory::Host(bytes))) => Ok(bytes),
            _ => Ok(Vec::new()),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let (Some(region), Some(class)) = (self.region.take(), self.class) {
            let memory = self.memory.take();
            self.pool
                .give_back(class, self.device, Cached { region, memory });
        }
    }
}

/// Sends in flight and their outcomes, shared by every flushing thread.
#[derive(Debug, Default)]
struct Sends {
    next: u64,
    done: HashMap<u64, WcStatus>,
}

/// The read buffers posted for the remote's flushes.
#[derive(Debug, Default)]
struct Receives {
    next: u64,
    posted: HashMap<u64, Buffer>,
}

/// What every clone of a [`Context`] shares: the buffer pool, the queue pair bound to the
/// remote host, what is in flight, and whether the context is closed.
#[derive(Debug)]
struct ContextShared {
    pool: Arc<Pool>,
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    config: ContextConfig,
    remote_max: usize,
    sends: Mutex<Sends>,
    sent: Condvar,
    receives: Mutex<Receives>,
    closed: AtomicBool,
    why_closed: Mutex<Option<String>>,
    /// The out-of-band connection, kept open for the context's life.
    _stream: TcpStream,
}

/// A context bound to one remote host (neuray's `IRDMA_context`). Cheap to clone; every
/// clone is the same context.
#[derive(Clone, Debug)]
pub struct Context {
    shared: Arc<ContextShared>,
}

static CONTEXTS: AtomicU64 = AtomicU64::new(1);

fn io_error(what: &'static str) -> impl FnOnce(io::Error) -> CacheError {
    move |source| CacheError::Io { what, source }
}

/// Reads a line of the remote host's; silence past `timeout` is a timeout.
fn read_line(stream: &mut TcpStream, timeout: Duration) -> Result<String, CacheError> {
    oob::read_line(stream).map_err(|e| match e {
        LineError::Closed => CacheError::Protocol("the remote host closed the connection".into()),
        LineError::Silent => CacheError::Timeout {
            what: "waiting for the remote host's hello",
            after: timeout,
        },
        LineError::TooLong => {
            CacheError::Protocol(format!("a line longer than {} bytes", oob::MAX_LINE))
        }
        LineError::Io(source) => CacheError::Io {
            what: "reading the remote host's hello",
            source,
        },
    })
}

/// How the context words the out-of-band steps' failures.
impl oob::FaceError for CacheError {
    const OPEN_WORDS: OpenWords = OpenWords {
        waiting: "connecting to the remote host",
        dialling: "connecting to the remote host",
        listening: "listening",
        accepting: "accepting",
        configuring: "configuring the connection",
    };

    fn timed_out(what: &'static str, after: Duration) -> Self {
        Self::Timeout { what, after }
    }

    fn io(what: &'static str, source: io::Error) -> Self {
        Self::Io { what, source }
    }
}

/// Says the context's hello (its version, read-buffer size and the MTU `ours`) and checks
/// the remote host's: returns the remote's MTU and read-buffer size.
fn hello(
    stream: &mut TcpStream,
    config: &ContextConfig,
    ours: Mtu,
) -> Result<(Mtu, usize), CacheError> {
    let hello = format!(
        "ferroce-cache/{CACHE_VERSION} max_message={} mtu={}",
        config.max_message,
        ours.bytes()
    );
    oob::write_line(stream, &hello).map_err(io_error("sending the hello"))?;
    let line = read_line(stream, config.timeout)?;
    let bad = || CacheError::Protocol(format!("malformed hello {line:?}"));
    let version = oob::version(&line, "ferroce-cache").ok_or_else(bad)?;
    if version != CACHE_VERSION {
        return Err(CacheError::Version {
            ours: CACHE_VERSION,
            theirs: version,
        });
    }
    let field = |key| oob::field(&line, key).and_then(|v| v.parse::<usize>().ok());
    let remote_max = field("max_message").ok_or_else(bad)?;
    let mtu = field("mtu")
        .and_then(|m| Mtu::from_bytes(m as u32))
        .ok_or_else(bad)?;
    Ok((mtu, remote_max))
}

impl Context {
    /// Binds a context to the remote host at `config.oob`: opens the NIC, exchanges hellos
    /// (version, read-buffer size, MTU) and queue pair endpoints, connects, and posts the
    /// read buffers.
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for a read-buffer size or depth of zero,
    /// [`CacheError::Timeout`] when no peer comes, [`CacheError::Version`], and the NIC's,
    /// exchange's and I/O errors.
    pub fn connect(config: &ContextConfig) -> Result<Self, CacheError> {
        Self::connect_with_allocator(config, default_allocator())
    }

    /// [`Context::connect`], taking GPU buffers from `allocator` (or refusing them, with
    /// `None`) rather than from CUDA.
    ///
    /// # Errors
    ///
    /// As [`Context::connect`].
    pub fn connect_with_allocator(
        config: &ContextConfig,
        allocator: Option<Arc<dyn DeviceAllocator>>,
    ) -> Result<Self, CacheError> {
        check_size(config.max_message)?;
        if config.receive_depth == 0 {
            return Err(CacheError::InvalidParameters(
                "receive_depth must be at least 1".into(),
            ));
        }
        let depth = usize::from(config.receive_depth);
        let plan = RcPlan {
            device: &config.device,
            ib_port: config.ib_port,
            local: config.nic,
            faults: None,
            pcap: None,
            listen: config.listen,
            oob: config.oob,
            timeout: config.timeout,
            mtu: config.mtu,
            send_cq: 1024,
            recv_cq: depth * 2 + 8,
            caps: QpCaps {
                sq_depth: 256,
                rq_depth: u32::from(config.receive_depth) + 1,
                max_inline: 0,
            },
            options: ConnectOptions::default(),
        };
        let (rc, remote_max) = oob::connect_rc(&plan, |stream, ours| hello(stream, config, ours))?;
        let RcConnection {
            nic,
            mut stream,
            send_cq,
            recv_cq,
            qp,
        } = rc;
        let pool = Arc::new(Pool {
            nic,
            context: CONTEXTS.fetch_add(1, Ordering::Relaxed),
            max_cached_bytes: config.max_cached_bytes,
            allocator,
            free: Mutex::new(Free::default()),
        });
        let context = Self {
            shared: Arc::new(ContextShared {
                pool,
                qp,
                send_cq,
                recv_cq,
                config: config.clone(),
                remote_max,
                sends: Mutex::new(Sends::default()),
                sent: Condvar::new(),
                receives: Mutex::new(Receives::default()),
                closed: AtomicBool::new(false),
                why_closed: Mutex::new(None),
                _stream: stream
                    .try_clone()
                    .map_err(io_error("keeping the connection"))?,
            }),
        };
        {
            let mut receives = context.lock_receives();
            for _ in 0..depth {
                context.post_read_buffer(&mut receives)?;
            }
        }
        // Both sides' read buffers are posted before either flushes.
        oob::write_line(&mut stream, "ready").map_err(io_error("sending ready"))?;
        if read_line(&mut stream, config.timeout)? != "ready" {
            return Err(CacheError::Protocol("the remote host is not ready".into()));
        }
        Ok(context)
    }

    fn lock_receives(&self) -> MutexGuard<'_, Receives> {
        self.shared
            .receives
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn post_read_buffer(&self, receives: &mut Receives) -> Result<(), CacheError> {
        let max = self.shared.config.max_message;
        let buffer = self
            .shared
            .pool
            .take(max, self.shared.config.receive_device)?;
        let sge = buffer
            .region()?
            .local(0, max as u32)
            .map_err(|e| CacheError::InvalidParameters(e.to_string()))?;
        let wr_id = receives.next;
        receives.next += 1;
        self.shared.qp.post_recv(RecvWr {
            wr_id,
            sges: vec![sge],
        })?;
        receives.posted.insert(wr_id, buffer);
        Ok(())
    }

    fn closed(&self) -> Result<(), CacheError> {
        if self.shared.closed.load(Ordering::Acquire) {
            let why = self
                .shared
                .why_closed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
                .unwrap_or_default();
            return Err(CacheError::Closed(why));
        }
        Ok(())
    }

    fn close(&self, why: String) {
        *self
            .shared
            .why_closed
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(why);
        self.shared.closed.store(true, Ordering::Release);
        self.shared.qp.shutdown();
    }

    /// neuray's `get_write_memory`: a buffer to write locally and for the remote host to
    /// read, of `size` bytes on `device`, from the cache when one of its size class is there.
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for a size of 0 or above [`MAX_BUFFER`],
    /// [`CacheError::NotSupported`] for a GPU, [`CacheError::TooLargeForRemote`] above the
    /// remote's read buffers (neuray's API returns NULL), [`CacheError::Allocation`] when the
    /// memory cannot be had.
    pub fn write_memory(&self, size: usize, device: Device) -> Result<Buffer, CacheError> {
        if size > self.shared.remote_max {
            return Err(CacheError::TooLargeForRemote {
                size,
                max: self.shared.remote_max,
            });
        }
        self.shared.pool.take(size, device)
    }

    /// neuray's `get_read_memory`: a buffer to read locally what the remote host wrote, of
    /// `size` bytes on `device`, from the cache when one of its size class is there.
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`], [`CacheError::NotSupported`] for a GPU,
    /// [`CacheError::Allocation`].
    pub fn read_memory(&self, size: usize, device: Device) -> Result<Buffer, CacheError> {
        self.shared.pool.take(size, device)
    }

    /// neuray's `wrap_user_buffer`: registers the caller's bytes as a buffer (not cached;
    /// [`Buffer::into_user_buffer`] gives them back).
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for no bytes, [`CacheError::NotSupported`] for a
    /// GPU, [`CacheError::Allocation`] when registration fails.
    pub fn wrap_user_buffer(&self, data: Vec<u8>, device: Device) -> Result<Buffer, CacheError> {
        check_size(data.len())?;
        if let Device::Gpu(id) = device {
            return Err(CacheError::NotSupported(format!(
                "GPU {id}: these are host bytes; wrap the GPU's memory with wrap_device_memory"
            )));
        }
        let len = data.len();
        let region = register(&self.shared.pool.nic, data, len)?;
        self.shared.pool.lock().stats.registrations += 1;
        Ok(Buffer {
            region: Some(region),
            memory: None,
            len,
            class: None,
            device,
            pool: Arc::clone(&self.shared.pool),
        })
    }

    /// neuray's `wrap_user_buffer` for GPU memory: registers staging for `memory`, the
    /// application's memory on GPU `gpu`, as a buffer of its whole length (not cached).
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] for no bytes or more than [`MAX_BUFFER`],
    /// [`CacheError::Allocation`] when the staging cannot be registered.
    pub fn wrap_device_memory(
        &self,
        memory: Arc<dyn DeviceMemory>,
        gpu: u32,
    ) -> Result<Buffer, CacheError> {
        let len = usize::try_from(memory.size()).unwrap_or(usize::MAX);
        check_size(len)?;
        let region = register(&self.shared.pool.nic, Vec::new(), len)?;
        self.shared.pool.lock().stats.registrations += 1;
        Ok(Buffer {
            region: Some(region),
            memory: Some(memory),
            len,
            class: None,
            device: Device::Gpu(gpu),
            pool: Arc::clone(&self.shared.pool),
        })
    }

    /// neuray's `flush`: sends the buffer's `len()` bytes to the remote host and waits
    /// until its NIC acknowledged them; the remote takes them with [`Context::receive`].
    /// Safe to call from several threads at once.
    ///
    /// # Errors
    ///
    /// [`CacheError::InvalidParameters`] (-1) for a buffer of another context,
    /// [`CacheError::TooLargeForRemote`], [`CacheError::Transport`] when the remote host
    /// does not answer, [`CacheError::Timeout`] when it answers but does not receive within
    /// the timeout (the context is then closed: [`CacheError::Closed`] afterwards).
    pub fn flush(&self, buffer: &Buffer) -> Result<(), CacheError> {
        self.closed()?;
        if buffer.pool.context != self.shared.pool.context {
            return Err(CacheError::InvalidParameters(
                "the buffer belongs to another context".into(),
            ));
        }
        if buffer.len > self.shared.remote_max {
            return Err(CacheError::TooLargeForRemote {
                size: buffer.len,
                max: self.shared.remote_max,
            });
        }
        buffer.sync_to_registered()?;
        let mut sges = Vec::new();
        if buffer.len > 0 {
            sges.push(
                buffer
                    .region()?
                    .local(0, buffer.len as u32)
                    .map_err(|e| CacheError::InvalidParameters(e.to_string()))?,
            );
        }
        let deadline = Instant::now() + self.shared.config.timeout;
        let wr_id = {
            let mut sends = self.lock_sends();
            let id = sends.next;
            sends.next += 1;
            id
        };
        let wr = SendWr::new(wr_id, SendOp::Send, Payload::Sges(sges));
        loop {
            match self.shared.qp.post_send(wr.clone()) {
                Ok(()) => break,
                Err(PostError::QueueFull(_)) => {
                    // Other threads' sends fill the queue: take completions and try again.
                    let sends = self.lock_sends();
                    let sends = self.reap(sends);
                    drop(
                        self.shared
                            .sent
                            .wait_timeout(sends, Duration::from_micros(200))
                            .unwrap_or_else(PoisonError::into_inner),
                    );
                    if Instant::now() >= deadline {
                        return Err(self.timed_out());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let mut sends = self.lock_sends();
        let started = Instant::now();
        loop {
            sends = self.reap(sends);
            if let Some(status) = sends.done.remove(&wr_id) {
                return match status {
                    WcStatus::Success => Ok(()),
                    status => Err(CacheError::Transport(status)),
                };
            }
            if Instant::now() >= deadline {
                drop(sends);
                return Err(self.timed_out());
            }
            // Poll for a little while, then sleep between polls; another thread's reap wakes
            // us when it took our completion.
            let nap = if started.elapsed() < Duration::from_millis(1) {
                Duration::from_micros(20)
            } else {
                Duration::from_millis(1)
            };
            sends = self
                .shared
                .sent
                .wait_timeout(sends, nap)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn timed_out(&self) -> CacheError {
        let after = self.shared.config.timeout;
        self.close(format!(
            "a flush was not received within {} ms",
            after.as_millis()
        ));
        CacheError::Timeout {
            what: "waiting for the remote host to receive a flush",
            after,
        }
    }

    fn lock_sends(&self) -> MutexGuard<'_, Sends> {
        self.shared
            .sends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the send completions that arrived and wakes the threads waiting for them.
    fn reap<'a>(&self, mut sends: MutexGuard<'a, Sends>) -> MutexGuard<'a, Sends> {
        let mut any = false;
        while let Some(wc) = self.shared.send_cq.poll() {
            sends.done.insert(wc.wr_id, wc.status);
            any = true;
        }
        if any {
            self.shared.sent.notify_all();
        }
        sends
    }

    /// Waits up to `timeout` for the next buffer the remote host flushed here, and posts a
    /// fresh read buffer in its place. Dropping the returned buffer recycles it.
    ///
    /// # Errors
    ///
    /// [`CacheError::Timeout`] when nothing came, [`CacheError::Transport`] when the
    /// connection failed, [`CacheError::Closed`].
    pub fn receive(&self, timeout: Duration) -> Result<Buffer, CacheError> {
        self.closed()?;
        let mut receives = self.lock_receives();
        let deadline = Instant::now() + timeout;
        let started = Instant::now();
        loop {
            let wc = if started.elapsed() < Duration::from_millis(1) {
                self.shared.recv_cq.poll()
            } else {
                let left = deadline.saturating_duration_since(Instant::now());
                self.shared.recv_cq.wait(left.min(Duration::from_millis(5)))
            };
            if let Some(wc) = wc {
                let mut buffer = receives.posted.remove(&wc.wr_id).ok_or_else(|| {
                    CacheError::Protocol(format!("a completion for unknown receive {}", wc.wr_id))
                })?;
                if wc.status != WcStatus::Success {
                    return Err(CacheError::Transport(wc.status));
                }
                buffer.len = wc.byte_len as usize;
                self.post_read_buffer(&mut receives)?;
                drop(receives);
                buffer.sync_from_registered()?;
                return Ok(buffer);
            }
            if Instant::now() >= deadline {
                return Err(CacheError::Timeout {
                    what: "waiting for the remote host to flush",
                    after: timeout,
                });
            }
        }
    }

    /// The largest buffer the remote host receives.
    #[must_use]
    pub fn remote_max_message(&self) -> usize {
        self.shared.remote_max
    }

    /// What the cache has done so far.
    #[must_use]
    pub fn stats(&self) -> CacheStats {
        self.shared.pool.lock().stats
    }
}

/// CUDA, when built with it.
fn default_allocator() -> Option<Arc<dyn DeviceAllocator>> {
    #[cfg(feature = "cuda")]
    {
        Some(Arc::new(crate::cuda::CudaAllocator))
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}
