//! Opening a NIC: the one place that chooses a backend and composes it with the services that
//! attach to it (quinn's `Endpoint::client` choosing its runtime; the kernel's
//! `ib_register_client`, through which the CM joins every device).
//!
//! A soft NIC gets QP 1 and the connection manager on it at once, as every RDMA device has
//! them: a REQ to a port nobody listens on is refused (REJ 8), not left unanswered. A verbs
//! device's connections are the kernel's rdma_cm's.

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::Arc;

use crate::attr::{DeviceOptions, NicConfig, SOFT_DEVICE};
use crate::backend::{self, soft, verbs};
use crate::error::NicError;
use crate::nic::Nic;
use crate::udp::tap::Faults;

impl Nic {
    /// The devices this host can open (`ibv_get_device_list`): the soft NIC,
    /// [`SOFT_DEVICE`], which is always there, then each verbs device libibverbs lists, for
    /// [`Nic::open_device`]. A host without libibverbs or without RDMA in its kernel lists
    /// the soft NIC alone; [`crate::verbs::devices`] says why.
    ///
    /// ```
    /// let names = ferroce::Nic::device_names();
    /// assert_eq!(names[0], ferroce::verbs::SOFT_DEVICE);
    /// ```
    #[must_use]
    pub fn device_names() -> Vec<String> {
        std::iter::once(SOFT_DEVICE.to_owned())
            .chain(verbs::devices().unwrap_or_default())
            .collect()
    }

    /// Opens the soft NIC on `config.addr` and starts its progress thread.
    ///
    /// # Errors
    ///
    /// [`NicError::AddressInUse`] and [`NicError::AddressNotAvailable`] name the address;
    /// [`NicError::Socket`] carries any other failure.
    pub fn open(config: &NicConfig) -> Result<Self, NicError> {
        Self::with_cm(soft::Nic::open(config)?)
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
        Self::with_cm(soft::Nic::adopt(socket, config)?)
    }

    /// The soft NIC `soft`, with the connection manager attached to it.
    fn with_cm(soft: soft::Nic) -> Result<Self, NicError> {
        let addr = soft.addr();
        let agent = crate::cm::Agent::start(&Self {
            backend: backend::Nic::Soft(soft.internal_handle()),
        })
        .map_err(|source| NicError::Socket { addr, source })?;
        soft.attach(Arc::new(agent));
        Ok(Self {
            backend: backend::Nic::Soft(soft),
        })
    }

    /// Opens the device called `name`: [`SOFT_DEVICE`] (`ferroce0`) is the soft NIC,
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
        if name == SOFT_DEVICE {
            return Self::open(soft);
        }
        let device = verbs::Nic::open(name, options)?;
        Ok(Self {
            backend: backend::Nic::Verbs(Arc::new(device)),
        })
    }

    /// The NIC a face's configuration names: `device` (`ferroce0` or a verbs device) with
    /// `addr`, which on a verbs device chooses the RoCE v2 GID (an unspecified address takes
    /// the first IPv4 one); on the soft NIC, with `faults` injected and a capture to `pcap`.
    pub(crate) fn open_for_face(
        device: &str,
        port: u8,
        addr: SocketAddr,
        faults: Option<Faults>,
        pcap: Option<&Path>,
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
                pcap: pcap.map(Path::to_path_buf),
                ..NicConfig::default()
            },
        )
    }
}
