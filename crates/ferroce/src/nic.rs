//! The NIC: where regions, completion queues and queue pairs live.
//!
//! [`Nic::open`] with the soft backend binds a UDP socket (port 4791 unless configured) on a
//! local IPv4 or IPv6 address and starts the engine's progress thread; no privileges and no
//! kernel module are needed. Dropping the last handle, or [`Nic::close`], stops it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Arc;

use ferroce_proto::memory::PdId;
use ferroce_proto::qp::Mtu;
use ferroce_proto::wire::ROCE_PORT;
use ferroce_proto::{Counters, Engine, EngineConfig};

use std::path::PathBuf;

use crate::soft::Shared;
use crate::sys;
pub use crate::udp::tap::{Faults, FaultsError};
pub use crate::udp::GsoStatus;
use crate::udp::{self, tap};

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
}

/// A RoCEv2 NIC: the soft backend over a UDP socket. Cheap to clone; every clone is the same
/// NIC.
#[derive(Clone)]
pub struct Nic {
    pub(crate) shared: Arc<Shared>,
    pub(crate) pd: PdId,
    _owner: Arc<Owner>,
}

/// Stops the progress thread when the last user handle goes.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.stop();
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
        // A READ response or a window of WRITEs arrives as a burst of up to hundreds of
        // packets; the default 208 KiB receive buffer drops the tail of it whenever the
        // progress thread is not scheduled at once. Ask for 8 MiB (granted in full to root;
        // capped by net.core.rmem_max otherwise).
        let options = udp::PortOptions {
            gso: config.gso,
            gro: config.gro,
            buffers: 8 << 20,
        };
        let port = udp::Port::open(addr, options).map_err(|source| match source.kind() {
            io::ErrorKind::AddrInUse => NicError::AddressInUse {
                addr,
                port: addr.port(),
            },
            io::ErrorKind::AddrNotAvailable => NicError::AddressNotAvailable(addr),
            _ => NicError::Socket { addr, source },
        })?;
        let local = port.local();
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()) << 32;
        let mut engine = Engine::new(EngineConfig {
            local_ip: local.ip(),
            seed,
        });
        engine.set_local_port(local.port());
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
        Ok(Self {
            _owner: Arc::new(Owner(Arc::clone(&shared))),
            shared,
            pd,
        })
    }

    /// The local address and port.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// The path MTU this NIC's link carries (`ibv_query_port`'s `active_mtu`), derived as
    /// rxe derives it from its network device: [`Mtu::for_link`] of the MTU of the interface
    /// that holds the NIC's address (1500 → 1024; 9000 and loopback → 4096). 1024 when
    /// that interface cannot be found or read. The socket sets don't-fragment, as rxe does,
    /// so a larger path MTU than this would not get its packets out.
    #[must_use]
    pub fn active_mtu(&self) -> Mtu {
        active_mtu_on(self.shared.local.ip())
    }

    /// A snapshot of the engine's counters (rxe's names where rxe has them).
    #[must_use]
    pub fn counters(&self) -> Counters {
        *self.shared.lock().engine.counters()
    }

    /// The counters as `rdma statistic show` prints them: `link <dev>/1 name value …`.
    #[must_use]
    pub fn statistics_line(&self, device: &str) -> String {
        let mut line = format!("link {device}/1");
        for (name, value) in self.counters().iter() {
            line.push_str(&format!(" {name} {value}"));
        }
        for (name, value) in self.shared.port.counters.iter() {
            line.push_str(&format!(" {name} {value}"));
        }
        line
    }

    /// Whether the NIC sends by UDP GSO, and if not, why not ([`NicConfig::gso`]).
    #[must_use]
    pub fn gso_status(&self) -> GsoStatus {
        self.shared.port.gso_status()
    }

    /// Why the receive path stopped, if it did (the socket failed).
    #[must_use]
    pub fn failure(&self) -> Option<String> {
        self.shared
            .failure
            .lock()
            .ok()?
            .as_ref()
            .map(ToString::to_string)
    }

    /// Asks for socket buffers of `bytes` (a frame receiver wants room for whole frames while
    /// its thread is not scheduled). Granted in full to root (`SO_RCVBUFFORCE`), capped by
    /// `net.core.rmem_max` otherwise. Returns the receive buffer the kernel granted.
    ///
    /// # Errors
    ///
    /// What the kernel said when it refused both options.
    pub fn grow_buffers(&self, bytes: usize) -> io::Result<usize> {
        sys::grow_buffers(self.shared.port.socket(), bytes)
    }

    /// Whether the NIC's address has gone from the host (an interface taken down, an
    /// address deleted): the socket stays open but nothing reaches it any more. Checked by
    /// binding a throw-away socket to the address, which costs a few microseconds.
    #[must_use]
    pub fn address_gone(&self) -> bool {
        let probe = SocketAddr::new(self.shared.local.ip(), 0);
        matches!(
            UdpSocket::bind(probe),
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable
        )
    }

    /// Wakes a thread that waits on the NIC's socket itself (a frame receiver's monitor).
    pub(crate) fn wake(&self) {
        self.shared.poke_socket();
    }

    /// Stops the progress thread and releases the socket once every handle is dropped.
    /// Idempotent; outstanding work requests never complete afterwards.
    pub fn close(&self) {
        self.shared.stop();
    }
}

impl std::fmt::Debug for Nic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nic")
            .field("addr", &self.shared.local)
            .finish_non_exhaustive()
    }
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
