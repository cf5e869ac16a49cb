//! The session's data: its limits, roles and steps, how to connect, the memory and messages it
//! moves, and its error. The typestate objects in `mod.rs` and the serving machinery in
//! `checked`, `handshake` and `watchdog` all speak these; `mod.rs` re-exports them.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ferroce_proto::qp::{ModifyError, Mtu, PostError, WcStatus};
use ferroce_proto::wire::ROCE_PORT;

use crate::device::{DeviceError, DeviceMemory};
use crate::exchange::ExchangeError;
use crate::oob;
use crate::{NicError, Region, RegionError};

/// The most slots a channel may have.
pub const MAX_SLOTS: u16 = 1024;

/// The largest request or reply: 1 GiB.
pub const MAX_MESSAGE: u32 = 1 << 30;

/// The two roles of a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Submits requests and collects replies (Catalyst's `ControllerSession`).
    Controller,
    /// Turns each request into a reply with its function (Catalyst's `CoprocessorSession`).
    Coprocessor,
}

impl Role {
    /// `controller` or `coprocessor`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Controller => "controller",
            Self::Coprocessor => "coprocessor",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A step of the lifecycle, as errors name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Step {
    /// `connect`.
    Connect,
    /// `alloc_memory`.
    AllocMemory,
    /// `exchange_keys`.
    ExchangeKeys,
    /// `establish_channel`.
    EstablishChannel,
    /// `set_coprocessor_fn`.
    SetCoprocessorFn,
    /// `start`.
    Start,
    /// `submit`.
    Submit,
    /// `collect`.
    Collect,
}

impl Step {
    /// The call's name.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::AllocMemory => "alloc_memory",
            Self::ExchangeKeys => "exchange_keys",
            Self::EstablishChannel => "establish_channel",
            Self::SetCoprocessorFn => "set_coprocessor_fn",
            Self::Start => "start",
            Self::Submit => "submit",
            Self::Collect => "collect",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the peer is and how long to wait for it (Catalyst's `ConnectInfo`).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConnectInfo {
    /// This side's NIC: a local address and UDP port (4791 for RoCEv2). On a verbs device
    /// ([`ConnectInfo::device`]) the address chooses its RoCE v2 GID and the port is unused.
    pub nic: SocketAddr,
    /// The device: `ferroce0`, the soft NIC (the default), or a verbs device such as `rxe0`
    /// or `mlx5_0` (`ibv_devices`); a soft peer and a verbs peer speak the same protocol.
    pub device: String,
    /// The verbs device's port (1).
    pub ib_port: u8,
    /// The out-of-band TCP address: the controller dials it, the coprocessor listens on it.
    pub oob: SocketAddr,
    /// How long `connect` and the other handshake steps wait for the peer (10 s). The
    /// controller dials again and again within it, so the coprocessor may start later.
    pub timeout: Duration,
    /// How long the peer may stay silent once the channel is established before it counts as
    /// gone (3 s); heartbeats go every quarter of it, at most every 100 ms.
    pub peer_timeout: Duration,
    /// The path MTU to ask for; the smaller of both sides' wins. `None` (the default) asks
    /// for the NIC's [`active_mtu`](crate::Nic::active_mtu): 1024 on a 1500-byte link, 4096
    /// on loopback or jumbo links, as rxe.
    pub mtu: Option<Mtu>,
    /// ACK timeout exponent of the queue pair: 4.096 µs × 2^n (14: 67 ms).
    pub ack_timeout: u8,
    /// Retries after ACK timeouts before a request fails with
    /// [`WcStatus::RetryExcErr`] (7).
    pub retry_cnt: u8,
    /// Faults the soft NIC injects on what it sends (none): for testing a session under
    /// loss. Ignored on a verbs device.
    pub faults: Option<crate::Faults>,
    /// A pcap file the soft NIC writes every packet it sends and receives to (none), as
    /// [`NicConfig::pcap`](crate::NicConfig::pcap). Ignored on a verbs device (capture its
    /// interface with tcpdump).
    pub pcap: Option<PathBuf>,
}

impl ConnectInfo {
    /// A NIC on `ip` (UDP port 4791) and the out-of-band address `oob`, with the defaults.
    #[must_use]
    pub fn new(ip: IpAddr, oob: SocketAddr) -> Self {
        Self {
            nic: SocketAddr::new(ip, ROCE_PORT),
            device: crate::verbs::SOFT_DEVICE.to_owned(),
            ib_port: 1,
            oob,
            timeout: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(3),
            mtu: None,
            ack_timeout: 14,
            retry_cnt: 7,
            faults: None,
            pcap: None,
        }
    }

    /// The same with `faults` injected by the soft NIC on what it sends.
    #[must_use]
    pub fn with_faults(mut self, faults: crate::Faults) -> Self {
        self.faults = Some(faults);
        self
    }

    /// The same with the soft NIC's packets captured to the pcap file at `path`.
    #[must_use]
    pub fn with_pcap(mut self, path: impl Into<PathBuf>) -> Self {
        self.pcap = Some(path.into());
        self
    }

    /// The same on the device called `name` (`ferroce0` or a verbs device).
    #[must_use]
    pub fn on_device(mut self, name: &str) -> Self {
        name.clone_into(&mut self.device);
        self
    }

    /// The same with another handshake timeout.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same with another peer timeout.
    #[must_use]
    pub fn with_peer_timeout(mut self, peer_timeout: Duration) -> Self {
        self.peer_timeout = peer_timeout;
        self
    }

    /// The same with another path MTU.
    #[must_use]
    pub fn with_mtu(mut self, mtu: Mtu) -> Self {
        self.mtu = Some(mtu);
        self
    }

    /// The same with another UDP port for the NIC (tests run several NICs on one address).
    #[must_use]
    pub fn with_nic_port(mut self, port: u16) -> Self {
        self.nic.set_port(port);
        self
    }
}

/// The kind of memory `alloc_memory` allocates (Catalyst's `MemKind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Host memory, locked in RAM while registered.
    #[default]
    Host,
    /// Memory of a CUDA device (the `cuda` feature). The soft NIC stages it in registered
    /// host memory, and each message that lands in the region or leaves from it is copied
    /// to the same offset of the device memory ([`MemRegion::device_memory`]) before the
    /// coprocessor function or `collect` sees it. Without the feature, a driver or that
    /// device, `alloc_memory` answers [`SessionError::Unsupported`].
    Cuda {
        /// The CUDA device ordinal.
        device: u32,
    },
    /// Device memory the application supplied through `alloc_device_memory`, kept in step
    /// as CUDA memory is; `alloc_memory` cannot allocate it ([`SessionError::InvalidArgument`]).
    Device,
}

/// A registered region of a session (Catalyst's `MemRegion`), as `alloc_memory` returns it.
/// Cheap to clone; the session keeps the region alive while its channel uses it.
#[derive(Clone, Debug)]
pub struct MemRegion {
    pub(super) region: std::sync::Arc<Region>,
    pub(super) session: u64,
    pub(super) kind: MemoryKind,
    pub(super) device: Option<std::sync::Arc<dyn DeviceMemory>>,
}

impl MemRegion {
    /// Its length in bytes.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.region.len()
    }

    /// Always false: a region has at least one byte.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }

    /// The memory kind it was allocated as.
    #[must_use]
    pub fn kind(&self) -> MemoryKind {
        self.kind
    }

    /// The device memory the region is kept in step with, for CUDA and supplied device
    /// memory: a message at offset `o` of the region is at `address() + o` there.
    #[must_use]
    pub fn device_memory(&self) -> Option<&std::sync::Arc<dyn DeviceMemory>> {
        self.device.as_ref()
    }

    /// The address the peer uses for its first byte.
    #[must_use]
    pub fn va(&self) -> u64 {
        self.region.va()
    }

    /// The key the peer uses.
    #[must_use]
    pub fn rkey(&self) -> u32 {
        self.region.rkey()
    }
}

/// The peer's region as `exchange_keys` learnt it (Catalyst's `PeerRef`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerRef {
    /// The address of its first byte.
    pub va: u64,
    /// Its remote key.
    pub rkey: u32,
    /// Its length in bytes.
    pub len: u64,
}

/// What the channel carries (Catalyst's `ChannelDesc`). Both sides must establish the same
/// description.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChannelDesc {
    /// Requests in flight at once, 1 to [`MAX_SLOTS`].
    pub slots: u16,
    /// The largest request, in bytes (1 to [`MAX_MESSAGE`]).
    pub request_bytes: u32,
    /// The largest reply, in bytes (1 to [`MAX_MESSAGE`]).
    pub reply_bytes: u32,
}

impl ChannelDesc {
    /// `slots` slots of `request_bytes`-byte requests and `reply_bytes`-byte replies.
    #[must_use]
    pub const fn new(slots: u16, request_bytes: u32, reply_bytes: u32) -> Self {
        Self {
            slots,
            request_bytes,
            reply_bytes,
        }
    }

    /// The bytes each side's region needs: `slots × (request_bytes + reply_bytes)` (the slots
    /// the peer writes into and the staging slots this side sends from).
    #[must_use]
    pub fn region_bytes(&self) -> u64 {
        u64::from(self.slots) * (u64::from(self.request_bytes) + u64::from(self.reply_bytes))
    }

    /// The size of the slots the peer writes into, on `role`'s side.
    pub(super) fn inbound_bytes(&self, role: Role) -> u32 {
        match role {
            Role::Controller => self.reply_bytes,
            Role::Coprocessor => self.request_bytes,
        }
    }

    /// The size of the messages `role` sends.
    pub(super) fn outbound_bytes(&self, role: Role) -> u32 {
        match role {
            Role::Controller => self.request_bytes,
            Role::Coprocessor => self.reply_bytes,
        }
    }

    pub(super) fn validate(&self) -> Result<(), SessionError> {
        if self.slots == 0 || self.slots > MAX_SLOTS {
            return Err(SessionError::InvalidArgument(format!(
                "a channel has 1 to {MAX_SLOTS} slots, not {}",
                self.slots
            )));
        }
        for (what, bytes) in [("request", self.request_bytes), ("reply", self.reply_bytes)] {
            if bytes == 0 || bytes > MAX_MESSAGE {
                return Err(SessionError::InvalidArgument(format!(
                    "the {what} size must be 1 to {MAX_MESSAGE} bytes, not {bytes}"
                )));
            }
        }
        Ok(())
    }

    /// The line that describes this channel to the peer during `establish_channel`:
    /// `channel slots=<slots> request=<request_bytes> reply=<reply_bytes>`, without its `\n`.
    #[must_use]
    pub fn to_line(self) -> String {
        format!(
            "channel slots={} request={} reply={}",
            self.slots, self.request_bytes, self.reply_bytes
        )
    }

    /// Reads a peer's channel line (without its `\n`), as [`ChannelDesc::to_line`] writes it:
    /// returns the description it names, which may still be one `establish_channel` refuses
    /// (zero slots, say). Words other than `slots=`, `request=` and `reply=` are ignored.
    ///
    /// # Errors
    ///
    /// [`SessionError::Protocol`] when a field is missing or not a decimal number that fits
    /// (`u16` slots, `u32` sizes).
    pub fn parse_line(line: &str) -> Result<Self, SessionError> {
        let bad = || SessionError::Protocol(format!("malformed channel description {line:?}"));
        let number = |key| oob::field(line, key).and_then(|v| v.parse::<u64>().ok());
        let (Some(slots), Some(request), Some(reply)) =
            (number("slots"), number("request"), number("reply"))
        else {
            return Err(bad());
        };
        Ok(Self {
            slots: u16::try_from(slots).map_err(|_| bad())?,
            request_bytes: u32::try_from(request).map_err(|_| bad())?,
            reply_bytes: u32::try_from(reply).map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for ChannelDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} slots of {}-byte requests and {}-byte replies",
            self.slots, self.request_bytes, self.reply_bytes
        )
    }
}

/// A request's number, in the order the controller submitted them (on the coprocessor, in
/// the order they arrived).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.0)
    }
}

/// What `collect` delivered: which request, and how many bytes it wrote into the buffers
/// (Catalyst's `collect` return value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Collected {
    /// The request the reply answers.
    pub request: RequestId,
    /// The bytes written, from the first buffer on.
    pub bytes: usize,
}

/// The coprocessor's function (Catalyst's coprocessor function): gets a request and the
/// reply slot (`reply_bytes` long; its content is unspecified), writes the reply at its start
/// and returns its length. An `Err` (its message) or a panic becomes an error reply.
pub type CoprocessorFn = dyn FnMut(&[u8], &mut [u8]) -> Result<usize, String> + Send + 'static;

/// Where a request and its reply slot lie in the region's device memory, as a coprocessor
/// function set with `set_device_coprocessor_fn` sees them: the request is already there,
/// and the function leaves its reply at `reply_offset` (a kernel launched on the addresses,
/// say, finished before it returns) and returns the reply's length. The serving thread copies
/// the reply from the device and WRITEs it to the controller.
#[derive(Clone, Copy, Debug)]
pub struct DeviceCall<'a> {
    /// The region's device memory.
    pub memory: &'a dyn DeviceMemory,
    /// Where the request starts, from the device memory's first byte.
    pub request_offset: u64,
    /// The request's length in bytes.
    pub request_len: usize,
    /// Where the reply slot starts.
    pub reply_offset: u64,
    /// The slot's length: the longest reply.
    pub reply_capacity: usize,
}

impl DeviceCall<'_> {
    /// The device address of the request's first byte (a `CUdeviceptr` for CUDA).
    #[must_use]
    pub fn request_address(&self) -> u64 {
        self.memory.address() + self.request_offset
    }

    /// The device address of the reply slot's first byte.
    #[must_use]
    pub fn reply_address(&self) -> u64 {
        self.memory.address() + self.reply_offset
    }
}

/// A coprocessor function that works in the region's device memory (see [`DeviceCall`]).
/// An `Err` (its message) or a panic becomes an error reply, as for [`CoprocessorFn`].
pub type DeviceCoprocessorFn =
    dyn for<'a> FnMut(DeviceCall<'a>) -> Result<usize, String> + Send + 'static;

/// Why a session call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// A call came before a step it needs.
    #[error("{call} needs {missing} first")]
    OutOfOrder {
        /// The call made.
        call: Step,
        /// The first step missing.
        missing: Step,
    },
    /// A step that happens once was called again.
    #[error("{call} was already done")]
    AlreadyDone {
        /// The call made.
        call: Step,
    },
    /// A step that must come before another came after it.
    #[error("{call} must come before {after}")]
    TooLate {
        /// The call made.
        call: Step,
        /// The step already taken.
        after: Step,
    },
    /// The call belongs to the other role.
    #[error("{call} is not a {role}'s call")]
    WrongRole {
        /// The call made.
        call: Step,
        /// This session's role.
        role: Role,
    },
    /// The session was stopped.
    #[error("{call} after stop: the session is stopped")]
    Stopped {
        /// The call made.
        call: Step,
    },
    /// An argument is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The memory kind is not supported in this build or on this host.
    #[error("not supported here: {0}")]
    Unsupported(String),
    /// Device memory refused a copy (or could not be allocated).
    #[error("device memory: {0}")]
    Device(#[from] DeviceError),
    /// The memory could not be allocated.
    #[error("cannot allocate {size} bytes")]
    Allocation {
        /// The size asked for.
        size: usize,
    },
    /// A region of another session.
    #[error("the region belongs to another session")]
    ForeignRegion,
    /// A region too small for the channel.
    #[error("{whose} region has {len} bytes; the channel needs {needed}")]
    RegionTooSmall {
        /// `local` or `the peer's`.
        whose: &'static str,
        /// Its length.
        len: u64,
        /// What the channel needs ([`ChannelDesc::region_bytes`]).
        needed: u64,
    },
    /// The peer established another channel.
    #[error("the peer established {theirs}; this side {ours}")]
    ChannelMismatch {
        /// Ours.
        ours: ChannelDesc,
        /// Theirs.
        theirs: ChannelDesc,
    },
    /// The peer speaks another version of the session's hello.
    #[error("the peer speaks ferroce session version {theirs}; this build speaks {ours}")]
    Version {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// Both sides have the same role.
    #[error("both sides are a {role}: one must be the controller, the other the coprocessor")]
    RoleMismatch {
        /// The shared role.
        role: Role,
    },
    /// The peer said something the session does not expect.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The request is longer than a request slot.
    #[error("a request of {len} bytes does not fit the channel's {max}-byte slots")]
    RequestTooLarge {
        /// Its length.
        len: usize,
        /// The slot's size.
        max: u32,
    },
    /// Every slot holds a request: collect one first.
    #[error("all {slots} slots are in flight: collect a reply first")]
    NoFreeSlot {
        /// The channel's slots.
        slots: u16,
    },
    /// `collect` with nothing to wait for.
    #[error("no request is in flight: nothing to collect")]
    NothingInFlight,
    /// The reply does not fit the buffers; it stays for a later `collect` with more room.
    #[error("the reply to {request} has {len} bytes; the buffers hold {capacity}")]
    ReplyTooLarge {
        /// The request it answers.
        request: RequestId,
        /// Its length.
        len: usize,
        /// The buffers' total length.
        capacity: usize,
    },
    /// The coprocessor function returned an error.
    #[error("the coprocessor failed on {request}: {message}")]
    CoprocessorFailed {
        /// The request.
        request: RequestId,
        /// Its message (cut to the reply slot).
        message: String,
    },
    /// The coprocessor function panicked; the serving thread caught it and goes on.
    #[error("the coprocessor panicked on {request}: {message}")]
    CoprocessorPanicked {
        /// The request.
        request: RequestId,
        /// The panic's message (cut to the reply slot).
        message: String,
    },
    /// The peer is gone: it stopped, its connection closed, or it fell silent.
    #[error("the peer is gone: {reason}")]
    PeerGone {
        /// How the session noticed.
        reason: String,
    },
    /// Nothing came in time.
    #[error("timed out after {} ms {what}", after.as_millis())]
    Timeout {
        /// What was waited for.
        what: &'static str,
        /// How long.
        after: Duration,
    },
    /// A WRITE failed in the transport (the peer's NIC stopped answering, or refused it).
    #[error("{}the transport failed: {status}", request.map(|r| format!("{r}: ")).unwrap_or_default())]
    Transport {
        /// The request, when the failure is a request's.
        request: Option<RequestId>,
        /// The completion's status.
        status: WcStatus,
    },
    /// The coprocessor's serving thread (its engine, as the variant and message call it)
    /// stopped on an error.
    #[error("the coprocessor's engine stopped: {0}")]
    Engine(String),
    /// The NIC could not be opened.
    #[error(transparent)]
    Nic(#[from] NicError),
    /// The region could not be registered or used.
    #[error(transparent)]
    Region(#[from] RegionError),
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
        source: std::io::Error,
    },
}
