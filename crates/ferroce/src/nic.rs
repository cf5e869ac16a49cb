//! The NIC: where regions, completion queues and queue pairs live.
//!
//! A NIC has one of two backends, chosen when it is opened and invisible afterwards:
//! - the soft NIC ([`Nic::open`]) binds a UDP socket (port 4791 unless configured) on a local
//!   IPv4 or IPv6 address and starts the engine's progress thread; no privileges and no
//!   kernel module are needed. Dropping the last handle, or [`Nic::close`], stops it.
//! - a verbs device ([`Nic::open_device`] with any name but `ferroce0`): a kernel RDMA device
//!   (a RoCE NIC, or kernel Soft-RoCE) through rdma-core's libibverbs, loaded at run time.
//!
//! [`Nic::caps`] says what the backend offers; the faces and tools ask it, never the name.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;

use ferroce_proto::memory::{Entropy, PdId};
use ferroce_proto::qp::Mtu;
use ferroce_proto::wire::ROCE_PORT;
use ferroce_proto::{Counters, Engine, EngineConfig};

use std::path::PathBuf;

use crate::soft::Shared;
use crate::sys;
pub use crate::udp::tap::{Faults, FaultsError};
pub use crate::udp::GsoStatus;
use crate::udp::{self, tap};
use crate::verbs::{self, Device, DeviceOptions, VerbsError};

/// How to open a NIC.
#[derive(Clone, Debug, PartialEq)]
pub struct NicConfig {
    /// The local address and UDP port; RoCEv2 peers send to port 4791.
    pub addr: SocketAddr,
    /// Faults to inject on every packet sent (`--fault`).
    pub faults: Option<Faults>,
    /// Where to write every packet sent and received as a pcap capture (`--pcap`).
    pub pcap: Option<PathBuf>,
    /// Send runs of equal-sized packets to one peer as one UDP GSO send, where the path
    /// segments in software (loopback, veth, bridges, tap) and a self-test at start-up
    /// passes; `false` (`--no-gso`) sends every packet as its own datagram. On by default.
    pub gso: bool,
    /// Receive with UDP GRO: a peer's GSO train arrives as one buffer. On by default.
    pub gro: bool,
}

impl Default for NicConfig {
    fn default() -> Self {
        Self::on(IpAddr::V4(Ipv4Addr::LOCALHOST))
    }
}

impl NicConfig {
    /// The RoCEv2 port on `ip`, no faults, no capture.
    #[must_use]
    pub fn on(ip: IpAddr) -> Self {
        Self {
            addr: SocketAddr::new(ip, ROCE_PORT),
            faults: None,
            pcap: None,
            gso: true,
            gro: true,
        }
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
    /// An object of one NIC was used with another (a CQ of one NIC for a QP of another).
    #[error("{0} belongs to another NIC")]
    OtherNic(&'static str),
    /// What was asked for runs on the soft NIC only so far (UD queue pairs and shared
    /// receive queues on a verbs device).
    #[error("{0} are not supported on a verbs device yet; use the soft NIC (`-d ferroce0`)")]
    SoftOnly(&'static str),
}

/// What a NIC's backend offers (`Nic::caps`), in the manner of `ibv_query_device` and
/// libfabric's `fi_info`: the faces and tools decide by these, never by the device's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NicCaps {
    /// Regions can be registered from a dma-buf file descriptor ([`RegionMemory::Dmabuf`]):
    /// the soft NIC maps it; a verbs device needs `ibv_reg_dmabuf_mr` (rdma-core 34) and a
    /// driver that has it (rxe has not).
    ///
    /// [`RegionMemory::Dmabuf`]: crate::RegionMemory::Dmabuf
    pub dmabuf: bool,
    /// [`RegionMemory::Pageable`] stays pageable; on a verbs device every region is pinned,
    /// so `RLIMIT_MEMLOCK` bounds it.
    ///
    /// [`RegionMemory::Pageable`]: crate::RegionMemory::Pageable
    pub pageable_memory: bool,
    /// The largest inline send a QP may ask for: on a verbs device, what a probe of RC QPs
    /// was granted at open (0 when none was); `u32::MAX` on the soft NIC, which copies inline
    /// bytes at post time whatever their number.
    pub max_inline: u32,
    /// The most work requests per queue (`u32::MAX` on the soft NIC: no limit of its own).
    pub max_qp_wr: u32,
    /// The most entries per CQ (`u32::MAX` on the soft NIC).
    pub max_cqe: u32,
    /// READs and atomics a QP may have outstanding, as requester and as responder (the
    /// smaller of `max_qp_init_rd_atom` and `max_qp_rd_atom` on a verbs device; perftest's
    /// default `-o`).
    pub max_rd_atomic: u8,
    /// Every packet is seen by ferroce, so per-packet counters ([`Nic::counters`]) and the
    /// frame receiver's checks of each WRITE exist; a verbs device counts in hardware
    /// ([`Nic::statistics_line`] reads them).
    pub per_packet_counters: bool,
    /// Faults can be injected (`--fault`).
    pub fault_injection: bool,
    /// Packets can be captured (`--pcap`).
    pub pcap: bool,
    /// Progress is made by ferroce's own threads and by polling (the soft engine); a verbs
    /// device progresses by itself.
    pub manual_progress: bool,
}

/// A RoCEv2 NIC: the soft backend over a UDP socket, or a verbs device. Cheap to clone;
/// every clone is the same NIC.
#[derive(Clone)]
pub struct Nic {
    pub(crate) backend: Backend,
}

/// The two backends behind [`Nic`].
#[derive(Clone)]
pub(crate) enum Backend {
    Soft(SoftNic),
    Verbs(Arc<VerbsNic>),
}

/// The soft NIC: the engine, its socket and its progress thread.
#[derive(Clone)]
pub(crate) struct SoftNic {
    pub(crate) shared: Arc<Shared>,
    pub(crate) pd: PdId,
    /// `None` for the NIC's own internal handles (its connection manager's), which must not
    /// keep it open.
    owner: Option<Arc<Owner>>,
}

/// An open verbs device; its event thread stops with the last handle or [`Nic::close`].
pub(crate) struct VerbsNic {
    pub(crate) device: Arc<Device>,
}

impl Drop for VerbsNic {
    fn drop(&mut self) {
        self.device.stop();
    }
}

/// Stops the connection manager, then the progress thread, when the last user handle goes.
struct Owner {
    shared: Arc<Shared>,
    cm: std::sync::Mutex<Option<Arc<crate::cm::Agent>>>,
}

impl Owner {
    fn stop_cm(&self) {
        let agent = self
            .cm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        drop(agent);
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop_cm();
        self.shared.stop();
    }
}

impl Nic {
    /// Opens the soft NIC on `config.addr` and starts its progress thread.
    ///
    /// # Errors
    ///
    /// [`NicError::AddressInUse`] and [`NicError::AddressNotAvailable`] name the address;
    /// [`NicError::Socket`] carries any other failure.
    pub fn open(config: &NicConfig) -> Result<Self, NicError> {
        let addr = config.addr;
        let port =
            udp::Port::open(addr, Self::port_options(config)).map_err(|source| {
                match source.kind() {
                    io::ErrorKind::AddrInUse => NicError::AddressInUse {
                        addr,
                        port: addr.port(),
                    },
                    io::ErrorKind::AddrNotAvailable => NicError::AddressNotAvailable(addr),
                    _ => NicError::Socket { addr, source },
                }
            })?;
        Self::start_soft(port, config)
    }

    /// Opens the soft NIC on a UDP socket the caller already bound, as Hololink's
    /// `LinuxReceiverInterfaceV1::start(data_socket, …)` is handed the socket its data
    /// channel configured. The NIC owns the socket from now on and closes it when the last
    /// handle goes; its address is the socket's own, so `config.addr` is not used. The socket
    /// may be blocking or not.
    ///
    /// # Errors
    ///
    /// [`NicError::Socket`] when the socket has no local address (it is not bound) or
    /// refuses an option the NIC needs (don't-fragment, the zero UDP checksum).
    pub fn from_udp_socket(socket: UdpSocket, config: &NicConfig) -> Result<Self, NicError> {
        let addr = socket.local_addr().map_err(|source| NicError::Socket {
            addr: config.addr,
            source,
        })?;
        if addr.port() == 0 {
            return Err(NicError::Socket {
                addr,
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the socket is not bound: bind it to an address and port first",
                ),
            });
        }
        let port = udp::Port::adopt(socket, Self::port_options(config))
            .map_err(|source| NicError::Socket { addr, source })?;
        Self::start_soft(port, config)
    }

    /// How the NIC sets up its UDP port.
    fn port_options(config: &NicConfig) -> udp::PortOptions {
        // A READ response or a window of WRITEs arrives as a burst of up to hundreds of
        // packets; the default 208 KiB receive buffer drops the tail of it whenever the
        // progress thread is not scheduled at once. Ask for 8 MiB (granted in full to root;
        // capped by net.core.rmem_max otherwise).
        udp::PortOptions {
            gso: config.gso,
            gro: config.gro,
            buffers: 8 << 20,
        }
    }

    /// Starts the engine, its progress thread and the connection manager on `port`.
    fn start_soft(port: udp::Port, config: &NicConfig) -> Result<Self, NicError> {
        let local = port.local();
        let addr = local;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32;
        let mut engine = Engine::new(EngineConfig {
            local_ip: local.ip(),
            seed,
        });
        engine.set_local_port(local.port());
        engine.set_port_mtu(active_mtu_on(local.ip()));
        // Keys and QP numbers from the OS's CSPRNG, which is tried here once: a host where it
        // fails gets no NIC rather than guessable keys.
        os_random().map_err(|source| NicError::Socket { addr, source })?;
        engine.set_entropy(Box::new(OsEntropy));
        let pd = engine.alloc_pd();
        let pcap = match &config.pcap {
            Some(path) => Some(
                tap::PcapWriter::create(path).map_err(|source| NicError::Pcap {
                    path: path.to_path_buf(),
                    source,
                })?,
            ),
            None => None,
        };
        let shared = Shared::new(port, engine, config.faults, pcap)
            .map_err(|source| NicError::Socket { addr, source })?;
        shared
            .start()
            .map_err(|source| NicError::Socket { addr, source })?;
        let owner = Arc::new(Owner {
            shared: Arc::clone(&shared),
            cm: std::sync::Mutex::new(None),
        });
        let nic = Self {
            backend: Backend::Soft(SoftNic {
                owner: Some(Arc::clone(&owner)),
                shared,
                pd,
            }),
        };
        // QP 1 and the connection manager on it, as every RDMA device has them: a REQ to a
        // port nobody listens on is refused (REJ 8), not left unanswered.
        let agent = crate::cm::Agent::start(&nic.internal_handle())
            .map_err(|source| NicError::Socket { addr, source })?;
        *owner
            .cm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(agent));
        Ok(nic)
    }

    /// Opens the device called `name`: [`verbs::SOFT_DEVICE`] (`ferroce0`) is the soft NIC,
    /// opened with `soft`; any other name is a verbs device, opened on `options.port` with
    /// the GID `options` chooses (by default the RoCE v2 GID of `options.local`, or the first
    /// IPv4 one). libibverbs is loaded on the first call that needs it.
    ///
    /// # Errors
    ///
    /// For the soft NIC, those of [`Nic::open`]. For a verbs device, [`NicError::Verbs`]: no
    /// library, no RDMA in the kernel, no such device (naming those there are), no such port,
    /// no fitting GID (printing the table), or the call that failed.
    pub fn open_device(
        name: &str,
        options: &DeviceOptions,
        soft: &NicConfig,
    ) -> Result<Self, NicError> {
        if name == verbs::SOFT_DEVICE {
            return Self::open(soft);
        }
        let device = Device::open(name, options)?;
        Ok(Self {
            backend: Backend::Verbs(Arc::new(VerbsNic { device })),
        })
    }

    /// The NIC a face's configuration names: `device` (`ferroce0` or a verbs device) with
    /// `addr`, which on a verbs device chooses the RoCE v2 GID (an unspecified address takes
    /// the first IPv4 one).
    pub(crate) fn open_for_face(
        device: &str,
        port: u8,
        addr: SocketAddr,
        faults: Option<Faults>,
    ) -> Result<Self, NicError> {
        let options = DeviceOptions {
            port,
            gid_index: None,
            local: (!addr.ip().is_unspecified()).then_some(addr.ip()),
        };
        Self::open_device(
            device,
            &options,
            &NicConfig {
                addr,
                faults,
                ..NicConfig::default()
            },
        )
    }

    /// The soft NIC's internals, or `None` on a verbs device.
    pub(crate) fn soft(&self) -> Option<&SoftNic> {
        match &self.backend {
            Backend::Soft(s) => Some(s),
            Backend::Verbs(_) => None,
        }
    }

    /// A handle of this soft NIC that does not keep it open: for what the NIC itself owns
    /// (its connection manager's QP 1), which would otherwise keep it alive for ever.
    pub(crate) fn internal_handle(&self) -> Self {
        match &self.backend {
            Backend::Soft(s) => Self {
                backend: Backend::Soft(SoftNic {
                    shared: Arc::clone(&s.shared),
                    pd: s.pd,
                    owner: None,
                }),
            },
            Backend::Verbs(_) => self.clone(),
        }
    }

    /// The soft NIC's connection manager, while it is open.
    pub(crate) fn cm_agent(&self) -> Option<Arc<crate::cm::Agent>> {
        let owner = self.soft()?.owner.as_ref()?;
        owner
            .cm
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The verbs device, or `None` on the soft NIC.
    pub(crate) fn verbs(&self) -> Option<&Arc<Device>> {
        match &self.backend {
            Backend::Soft(_) => None,
            Backend::Verbs(v) => Some(&v.device),
        }
    }

    /// Whether `other` is a handle of this same NIC.
    pub(crate) fn same(&self, other: &Self) -> bool {
        match (&self.backend, &other.backend) {
            (Backend::Soft(a), Backend::Soft(b)) => Arc::ptr_eq(&a.shared, &b.shared),
            (Backend::Verbs(a), Backend::Verbs(b)) => Arc::ptr_eq(&a.device, &b.device),
            _ => false,
        }
    }

    /// The device's name: `ferroce0` for the soft NIC.
    #[must_use]
    pub fn device_name(&self) -> &str {
        match &self.backend {
            Backend::Soft(_) => verbs::SOFT_DEVICE,
            Backend::Verbs(v) => &v.device.name,
        }
    }

    /// The GID index in use: 0 on the soft NIC, which has one address.
    #[must_use]
    pub fn gid_index(&self) -> u32 {
        self.verbs().map_or(0, |d| d.gid_index())
    }

    /// What the backend offers.
    #[must_use]
    pub fn caps(&self) -> NicCaps {
        match &self.backend {
            Backend::Soft(_) => NicCaps {
                dmabuf: true,
                pageable_memory: true,
                // The engine takes what a QP or CQ asks for: no limit of its own.
                max_inline: u32::MAX,
                max_qp_wr: u32::MAX,
                max_cqe: u32::MAX,
                max_rd_atomic: 16,
                per_packet_counters: true,
                fault_injection: true,
                pcap: true,
                manual_progress: true,
            },
            Backend::Verbs(v) => {
                let a = &v.device.attr;
                NicCaps {
                    dmabuf: v.device.dmabuf_possible(),
                    pageable_memory: false,
                    // Probed at open (no query gives it): rxe grants 400 bytes.
                    max_inline: v.device.max_inline,
                    max_qp_wr: u32::try_from(a.max_qp_wr).unwrap_or(0),
                    max_cqe: u32::try_from(a.max_cqe).unwrap_or(0),
                    max_rd_atomic: u8::try_from(a.max_qp_rd_atom.min(a.max_qp_init_rd_atom))
                        .unwrap_or(u8::MAX),
                    per_packet_counters: false,
                    fault_injection: false,
                    pcap: false,
                    manual_progress: false,
                }
            }
        }
    }

    /// The local address and port: the soft NIC's socket, or a verbs device's GID address
    /// on port 4791.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        match &self.backend {
            Backend::Soft(s) => s.shared.local,
            Backend::Verbs(v) => SocketAddr::new(v.device.gid.ip(), ROCE_PORT),
        }
    }

    /// The path MTU this NIC's link carries (`ibv_query_port`'s `active_mtu`), derived as
    /// rxe derives it from its network device: [`Mtu::for_link`] of the MTU of the interface
    /// that holds the NIC's address (1500 → 1024; 9000 and loopback → 4096). 1024 when
    /// that interface cannot be found or read. The socket sets don't-fragment, as rxe does,
    /// so a larger path MTU than this would not get its packets out.
    /// On a verbs device, the port's `active_mtu` as `ibv_query_port` gives it.
    #[must_use]
    pub fn active_mtu(&self) -> Mtu {
        match &self.backend {
            Backend::Soft(s) => active_mtu_on(s.shared.local.ip()),
            Backend::Verbs(v) => v.device.active_mtu,
        }
    }

    /// A snapshot of the soft engine's counters (rxe's names where rxe has them). A verbs
    /// device counts in hardware, not per packet here (`caps().per_packet_counters` is
    /// false): all zeros; [`Nic::statistics_line`] reads the device's own.
    #[must_use]
    pub fn counters(&self) -> Counters {
        match &self.backend {
            Backend::Soft(s) => *s.shared.lock().engine.counters(),
            Backend::Verbs(_) => Counters::default(),
        }
    }

    /// The next asynchronous event of the soft NIC (`ibv_get_async_event`): an SRQ below its
    /// armed limit, or a QP on an SRQ that has taken its last receive. `None` when none is
    /// waiting, and on a verbs device, whose events ferroce handles itself ([`Nic::failure`],
    /// [`crate::Qp::failure`]).
    #[must_use]
    pub fn poll_event(&self) -> Option<ferroce_proto::qp::AsyncEvent> {
        match &self.backend {
            Backend::Soft(s) => s.shared.lock().engine.poll_event(),
            Backend::Verbs(_) => None,
        }
    }

    /// What the soft NIC's engine holds now: queue pairs (QP 1 included), CQs, SRQs,
    /// regions, armed timers and unpolled completions, for checking that what was set up was
    /// torn down. `None` on a verbs device.
    #[must_use]
    pub fn census(&self) -> Option<ferroce_proto::Census> {
        match &self.backend {
            Backend::Soft(s) => Some(s.shared.lock().engine.census()),
            Backend::Verbs(_) => None,
        }
    }

    /// The counters as `rdma statistic show` prints them: `link <dev>/<port> name value …`;
    /// on a verbs device, its `hw_counters` from sysfs (rxe's or mlx5's own).
    #[must_use]
    pub fn statistics_line(&self, device: &str) -> String {
        match &self.backend {
            Backend::Soft(s) => {
                let mut line = format!("link {device}/1");
                for (name, value) in self.counters().iter() {
                    line.push_str(&format!(" {name} {value}"));
                }
                for (name, value) in s.shared.port.counters.iter() {
                    line.push_str(&format!(" {name} {value}"));
                }
                line
            }
            Backend::Verbs(v) => {
                let mut line = format!("link {}/{}", v.device.name, v.device.port);
                for (name, value) in v.device.hw_counters() {
                    line.push_str(&format!(" {name} {value}"));
                }
                line
            }
        }
    }

    /// Whether the NIC sends by UDP GSO, and if not, why not ([`NicConfig::gso`]); a verbs
    /// device segments in its own hardware or driver: [`GsoStatus::Hardware`] naming it.
    #[must_use]
    pub fn gso_status(&self) -> GsoStatus {
        match &self.backend {
            Backend::Soft(s) => s.shared.port.gso_status(),
            Backend::Verbs(v) => GsoStatus::Hardware(v.device.name.clone()),
        }
    }

    /// Why the NIC failed for good, if it did: the soft NIC's socket failed; or a verbs
    /// device's async events said the device failed or its port went down. Open it again to
    /// go on. (An address that went away, and may come back, is [`Nic::address_gone`].)
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        match &self.backend {
            Backend::Soft(s) => s
                .shared
                .failure
                .lock()
                .ok()?
                .as_ref()
                .map(ToString::to_string),
            Backend::Verbs(v) => v.device.health.failure(),
        }
    }

    /// Asks for socket buffers of `bytes` (a frame receiver wants room for whole frames while
    /// its thread is not scheduled). Granted in full to root (`SO_RCVBUFFORCE`), capped by
    /// `net.core.rmem_max` otherwise. Returns the receive buffer the kernel granted.
    ///
    /// # Errors
    ///
    /// What the kernel said when it refused both options.
    pub fn grow_buffers(&self, bytes: usize) -> io::Result<usize> {
        match &self.backend {
            Backend::Soft(s) => sys::grow_buffers(s.shared.port.socket(), bytes),
            // The device's queues are its buffers.
            Backend::Verbs(_) => Ok(bytes),
        }
    }

    /// Whether the NIC's address has gone from the host (an interface taken down, an address
    /// deleted): the socket stays open but nothing reaches it any more. Checked by binding a
    /// throw-away socket to the address, which costs a few microseconds. On a verbs device,
    /// also while its RoCE v2 GID is out of the device's table (rxe takes it out with the
    /// address and puts it back some time after the address returns).
    #[must_use]
    pub fn address_gone(&self) -> bool {
        // A verbs device: also while our GID is out of its table (rxe takes an address's GID
        // out when the address goes, and back some time after it returns).
        if self.verbs().is_some_and(|d| d.gid_gone()) {
            return true;
        }
        let probe = SocketAddr::new(self.addr().ip(), 0);
        matches!(
            UdpSocket::bind(probe),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable
        )
    }

    /// Wakes a thread that waits on the NIC's socket itself (a frame receiver's monitor).
    pub(crate) fn wake(&self) {
        if let Backend::Soft(s) = &self.backend {
            s.shared.poke_socket();
        }
    }

    /// Soft NIC: stops the progress thread and releases the socket once every handle is
    /// dropped; outstanding work requests never complete afterwards. Verbs device: stops the
    /// event thread; the device closes when its last object is dropped. Idempotent.
    pub fn close(&self) {
        match &self.backend {
            Backend::Soft(s) => {
                if let Some(owner) = &s.owner {
                    owner.stop_cm();
                }
                s.shared.stop();
            }
            Backend::Verbs(v) => v.device.stop(),
        }
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("device", &self.device_name())
            .field("addr", &self.addr())
            .finish_non_exhaustive()
    }
}

/// The operating system's CSPRNG (`getrandom(2)`) as the engine's [`Entropy`].
struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&mut self) -> u64 {
        // `Nic::open` tried it; on Linux getrandom(2) fails only before the kernel's pool is
        // initialised at boot, or with a seccomp filter that would have failed that try too.
        os_random().expect("the OS random source worked when the NIC opened")
    }
}

/// 64 bits from the operating system's CSPRNG.
pub(crate) fn os_random() -> io::Result<u64> {
    getrandom::u64().map_err(|e| io::Error::other(format!("getrandom: {e}")))
}

/// [`Nic::active_mtu`] of a NIC on `ip`, before opening one.
#[must_use]
pub fn active_mtu_on(ip: IpAddr) -> Mtu {
    link_mtu(ip).map_or(Mtu::M1024, Mtu::for_link)
}

/// The MTU of the interface that holds `ip`, from sysfs.
fn link_mtu(ip: IpAddr) -> Option<u32> {
    let name = sys::interface_of(ip)?;
    std::fs::read_to_string(format!("/sys/class/net/{name}/mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_proto::memory::{Access, MemoryTable, WriteOrder};

    /// Pearson's chi-square of `counts` against a uniform spread.
    fn chi_square(counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let expected = total as f64 / counts.len() as f64;
        counts
            .iter()
            .map(|&c| (c as f64 - expected).powi(2) / expected)
            .sum()
    }

    /// 100,000 registrations with the NIC's entropy: every byte of the lkeys and rkeys spread
    /// uniformly over its 256 values (chi-square with 255 degrees of freedom has mean 255 and
    /// standard deviation 22.6; the bound is 8 deviations above, which a uniform source
    /// exceeds with odds below one in a billion, and SplitMix64 with a constant seed would
    /// pass too: the test for the OS is the next), and no key twice.
    #[test]
    fn keys_from_the_os_are_uniform_and_distinct() {
        let mut table = MemoryTable::with_entropy(Box::new(OsEntropy));
        let mut bytes = vec![[0u64; 256]; 8];
        let mut seen = std::collections::HashSet::new();
        for i in 0..100_000u64 {
            let r = table
                .register(PdId(1), i << 12, 64, Access::REMOTE, WriteOrder::InOrder)
                .unwrap();
            for (k, key) in [r.lkey, r.rkey].into_iter().enumerate() {
                assert!(seen.insert(key), "key {key:#x} handed out twice");
                for (j, b) in key.to_be_bytes().into_iter().enumerate() {
                    bytes[k * 4 + j][usize::from(b)] += 1;
                }
            }
        }
        for (i, counts) in bytes.iter().enumerate() {
            let x2 = chi_square(counts);
            assert!(x2 < 255.0 + 8.0 * 22.6, "byte {i}: chi-square {x2}");
        }
    }

    /// Two engines given the OS's entropy at the same moment draw different keys and QP
    /// numbers: nothing seeds them from the clock or the process ID, which a peer could know.
    #[test]
    fn two_nics_opened_at_once_draw_different_identifiers() {
        let draw = || {
            let mut table = MemoryTable::new(42);
            table.set_entropy(Box::new(OsEntropy));
            table
                .register(PdId(1), 0, 64, Access::REMOTE, WriteOrder::InOrder)
                .unwrap()
        };
        let (a, b) = (draw(), draw());
        assert_ne!((a.lkey, a.rkey), (b.lkey, b.rkey));
        let seeded = |seed| {
            MemoryTable::new(seed)
                .register(PdId(1), 0, 64, Access::REMOTE, WriteOrder::InOrder)
                .unwrap()
        };
        assert_eq!(
            seeded(42).lkey,
            seeded(42).lkey,
            "the seeded source is reproducible"
        );
    }
}
