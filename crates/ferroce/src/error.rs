//! Why things fail: the errors of NICs, verbs devices and regions, and [`Unsupported`], the one
//! answer for what a backend does not do. Below the public modules and both backends, so each
//! can name them; messages say what to do about the failure.

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::path::PathBuf;

use ferroce_proto::qp::{ModifyError, PostError};

use crate::attr::GidTable;
use crate::sys;

/// What a backend does not do (rdma-core's `dummy_ops.c`, which answers `EOPNOTSUPP` for
/// every verb a provider leaves out). Made in one place, `crate::backend`, and carried by each
/// object's own error as the variant its callers already match: [`NicError::SoftOnly`],
/// [`ModifyError::Device`], [`PostError::Device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} are not supported on {backend} yet; use the soft NIC (`-d ferroce0`)")]
pub(crate) struct Unsupported {
    /// The backend, in words ("a verbs device").
    pub(crate) backend: &'static str,
    /// What was asked for, in the plural ("shared receive queues").
    pub(crate) what: &'static str,
}

impl From<Unsupported> for NicError {
    fn from(u: Unsupported) -> Self {
        Self::SoftOnly(u.what)
    }
}

impl From<Unsupported> for ModifyError {
    fn from(u: Unsupported) -> Self {
        Self::Device(u.to_string())
    }
}

impl From<Unsupported> for PostError {
    fn from(u: Unsupported) -> Self {
        Self::Device(u.to_string())
    }
}

/// Why a NIC could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NicError {
    /// Another socket (another NIC, kernel rxe in this network namespace, another program)
    /// holds the address and port.
    #[error("{addr} is already in use (another ferroce NIC, kernel rxe or another program holds UDP port {port} on that address)")]
    AddressInUse {
        /// The address asked for.
        addr: SocketAddr,
        /// Its port.
        port: u16,
    },
    /// The address is not one of this host's.
    #[error("{0} is not an address of this host (bind failed: address not available)")]
    AddressNotAvailable(SocketAddr),
    /// The capture file could not be created.
    #[error("cannot write the capture {}: {source}", path.display())]
    Pcap {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// Any other socket failure.
    #[error("cannot open a UDP socket on {addr}: {source}")]
    Socket {
        /// The address asked for.
        addr: SocketAddr,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// A verbs device could not be opened or refused a resource.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A descriptor the NIC needs (a completion channel's or the async events' eventfd)
    /// could not be had.
    #[error("cannot create {what}: {source} (is the open-file limit, `ulimit -n`, reached?)")]
    Descriptor {
        /// What it was for.
        what: &'static str,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// A CQ cannot shrink below the completions it holds now.
    #[error("a CQ of depth {depth} cannot hold the completions it holds now: poll them first")]
    CqTooSmall {
        /// The depth asked for.
        depth: usize,
    },
    /// An object of one NIC was used with another (a CQ of one NIC for a QP of another).
    #[error("{0} belongs to another NIC")]
    OtherNic(&'static str),
    /// What was asked for runs on the soft NIC only so far (UD queue pairs and shared
    /// receive queues on a verbs device).
    #[error("{0} are not supported on a verbs device yet; use the soft NIC (`-d ferroce0`)")]
    SoftOnly(&'static str),
}

/// Why a verbs device could not be used. Each says what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs is not installed, or the file named by `FERROCE_IBVERBS` is not it.
    #[error(
        "cannot load libibverbs ({path}: {reason}); install rdma-core's library and providers \
         (`apt install libibverbs1 ibverbs-providers`), or use the soft NIC (`-d ferroce0`)"
    )]
    LibraryMissing {
        /// The file that was asked for.
        path: String,
        /// What the dynamic loader said.
        reason: String,
    },
    /// libibverbs is there but the kernel has no RDMA support (`ibv_get_device_list` fails
    /// with ENOSYS).
    #[error(
        "this kernel has no RDMA support (libibverbs: {source}); load a driver (for Soft-RoCE: \
         `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0`), or use the soft NIC \
         (`-d ferroce0`), which needs none"
    )]
    NoKernelSupport {
        /// What libibverbs said.
        source: io::Error,
    },
    /// No device has that name.
    #[error(
        "no RDMA device called {name}; the devices here are: {}",
        list_or_none(found)
    )]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices that exist, the soft NIC first.
        found: Vec<String>,
    },
    /// The device has no such port.
    #[error("{device} has no port {port} (it has ports 1 to {ports})")]
    NoSuchPort {
        /// The device.
        device: String,
        /// The port asked for.
        port: u8,
        /// How many it has.
        ports: u8,
    },
    /// The port is not Ethernet: ferroce speaks RoCE v2.
    #[error("{device} port {port} is InfiniBand, not Ethernet; ferroce speaks RoCE v2 only")]
    NotRoce {
        /// The device.
        device: String,
        /// The port.
        port: u8,
    },
    /// No GID fits what was asked (an index, an address, or any RoCE v2 GID).
    #[error("{device} port {port}: {wanted}; its GID table:\n{table}")]
    NoGid {
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// What was looked for, in words.
        wanted: String,
        /// The table, one line per entry, as `ferroce devinfo -v` prints it.
        table: GidTable,
    },
    /// A verbs call failed.
    #[error("{call} on {device} failed: {source}{}", hint.map(|h| format!(" ({h})")).unwrap_or_default())]
    Call {
        /// The device.
        device: String,
        /// The verb.
        call: &'static str,
        /// What it returned.
        source: io::Error,
        /// What usually causes it, where that is known.
        hint: Option<&'static str>,
    },
}

fn list_or_none(found: &[String]) -> String {
    if found.is_empty() {
        "none".to_owned()
    } else {
        found.join(", ")
    }
}

/// Why a region could not be registered, used or deregistered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// The memory has no bytes (Rig_mlx5's `Region` refuses it).
    #[error("a region needs at least one byte")]
    Empty,
    /// The kernel refused to map memory for [`MappedMemory::new`](crate::MappedMemory::new).
    #[error(
        "cannot map {bytes} bytes of memory: {source} (the address space or vm.overcommit limits)"
    )]
    Map {
        /// The length asked for.
        bytes: usize,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// `mlock` refused: the process's locked-memory limit cannot hold the region.
    #[error(
        "cannot lock {bytes} bytes in memory: RLIMIT_MEMLOCK is {limit} ({reason}); raise it with \
         `ulimit -l unlimited`, a memlock line in /etc/security/limits.conf, or LimitMEMLOCK= in a \
         systemd unit"
    )]
    MemlockLimit {
        /// The region's size.
        bytes: usize,
        /// The limit, as text ("unlimited" or a byte count).
        limit: String,
        /// What the kernel said.
        reason: io::Error,
    },
    /// The device cannot register dma-bufs (rxe cannot; `Nic::caps().dmabuf` says so
    /// beforehand). Register host memory instead, staging through it.
    #[error("{device} cannot register dma-buf memory (no ibv_reg_dmabuf_mr in its driver or in this libibverbs); register host memory and stage through it")]
    DmabufUnsupported {
        /// The device.
        device: String,
    },
    /// A verbs device refused the registration.
    #[error("{device}: {call} refused {bytes} bytes: {source}")]
    Device {
        /// The device.
        device: String,
        /// The verb.
        call: &'static str,
        /// The region's size.
        bytes: u64,
        /// What it returned.
        source: io::Error,
    },
    /// The dma-buf cannot be used (the soft backend maps it; a verbs device registers it).
    #[error("cannot map dma-buf fd {fd} ({bytes} bytes at offset {offset}) for the soft backend: {reason}")]
    Dmabuf {
        /// The descriptor.
        fd: RawFd,
        /// The offset asked for.
        offset: u64,
        /// The length asked for.
        bytes: u64,
        /// Why.
        reason: String,
    },
    /// The engine refused the region.
    #[error("the NIC refused the region: {0}")]
    Refused(#[from] ferroce_proto::memory::RegisterError),
    /// A range outside the region.
    #[error("{len} bytes at offset {at} are outside the region of {size} bytes")]
    OutOfRange {
        /// The offset asked for.
        at: u64,
        /// The length asked for.
        len: u64,
        /// The region's size.
        size: u64,
    },
    /// A remote entry into a region that peers may not access.
    #[error("the region is Local: peers cannot address it")]
    NotRemote,
}

/// The error of an `mlock` (or a verbs registration that pins) refused for `bytes` bytes,
/// with the limit in force and how to raise it.
pub(crate) fn memlock_error(bytes: usize, reason: io::Error) -> RegionError {
    let limit =
        sys::memlock_limit().map_or_else(|| "unlimited".to_owned(), |l| format!("{l} bytes"));
    RegionError::MemlockLimit {
        bytes,
        limit,
        reason,
    }
}

/// The message a caught panic carried (`panic!` with a literal or a formatted string), if
/// any: how the faces report a callback, function or binding that panicked.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}
