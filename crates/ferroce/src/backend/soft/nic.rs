//! The soft NIC itself: opening it on a UDP port, the objects it creates, what it reports, and
//! the clients that attach to it (the connection manager), which it stops before itself.

use std::any::Any;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use ferroce_proto::memory::{Entropy, PdId, RegionInfo, WriteOrder};
use ferroce_proto::qp::{AsyncEvent, Mtu, QpAttr, QpCaps, QpInit, QpState, QpType};
use ferroce_proto::wire::Qpn;
use ferroce_proto::{Census, Counters, Engine, EngineConfig, Psn};

use super::cq::Cq;
use super::driver::Driver;
use super::qp::Qp;
use super::region::Region;
use super::srq::Srq;
use crate::attr::{active_mtu_on, NicCaps, NicConfig, QpSetup, RegionAccess};
use crate::error::{NicError, RegionError};
use crate::memory::RegionMemory;
use crate::sys;
use crate::udp::{self, tap, GsoStatus};

/// The soft NIC: the engine's driver and the protection domain every object is in. Clones are
/// handles of the same NIC; it stops with the last handle that owns it.
#[derive(Clone)]
pub(crate) struct Nic {
    pub(super) driver: Arc<Driver>,
    pub(super) pd: PdId,
    /// `None` for the handles its own clients hold (the CM's), which must not keep it open.
    owner: Option<Arc<Owner>>,
}

/// Stops the NIC's clients, then its progress thread, when the last owning handle goes.
struct Owner {
    driver: Arc<Driver>,
    /// What attached itself to this NIC (the kernel's `ib_register_client`): stopped, last
    /// attached first, before the driver.
    clients: Mutex<Vec<Arc<dyn Any + Send + Sync>>>,
}

impl Owner {
    fn stop_clients(&self) {
        let clients =
            std::mem::take(&mut *self.clients.lock().unwrap_or_else(PoisonError::into_inner));
        for client in clients.into_iter().rev() {
            drop(client);
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.stop_clients();
        self.driver.stop();
    }
}

impl Nic {
    /// Binds `config.addr` and starts the engine and its progress thread.
    pub(crate) fn open(config: &NicConfig) -> Result<Self, NicError> {
        let addr = config.addr;
        let port =
            udp::Port::open(addr, port_options(config)).map_err(|source| match source.kind() {
                io::ErrorKind::AddrInUse => NicError::AddressInUse {
                    addr,
                    port: addr.port(),
                },
                io::ErrorKind::AddrNotAvailable => NicError::AddressNotAvailable(addr),
                _ => NicError::Socket { addr, source },
            })?;
        Self::start(port, config)
    }

    /// Starts on a socket the caller bound (see `crate::Nic::from_udp_socket`).
    pub(crate) fn adopt(socket: UdpSocket, config: &NicConfig) -> Result<Self, NicError> {
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
        let port = udp::Port::adopt(socket, port_options(config))
            .map_err(|source| NicError::Socket { addr, source })?;
        Self::start(port, config)
    }

    /// Starts the engine and its progress thread on `port`.
    fn start(port: udp::Port, config: &NicConfig) -> Result<Self, NicError> {
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
        // The driver ends every receive batch with `end_batch` (driver.rs `drain`).
        engine.set_batch_holding(true);
        // Keys and QP numbers from the OS's CSPRNG, which is tried here once: a host where it
        // fails gets no NIC rather than guessable keys.
        sys::random_u64().map_err(|source| NicError::Socket { addr, source })?;
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
        let driver = Driver::new(port, engine, config.faults, pcap)
            .map_err(|source| NicError::Socket { addr, source })?;
        driver
            .start(config.progress_priority)
            .map_err(|source| NicError::Socket { addr, source })?;
        let owner = Arc::new(Owner {
            driver: Arc::clone(&driver),
            clients: Mutex::new(Vec::new()),
        });
        Ok(Self {
            driver,
            pd,
            owner: Some(owner),
        })
    }

    /// A handle that does not keep the NIC open: for its own clients.
    pub(crate) fn internal_handle(&self) -> Self {
        Self {
            driver: Arc::clone(&self.driver),
            pd: self.pd,
            owner: None,
        }
    }

    /// Attaches `client` to the NIC: it lives until the NIC closes, and is dropped (stopped)
    /// before the progress thread. Refused on an internal handle, which owns nothing.
    pub(crate) fn attach(&self, client: Arc<dyn Any + Send + Sync>) -> bool {
        let Some(owner) = &self.owner else {
            return false;
        };
        owner
            .clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(client);
        true
    }

    /// The attached client of type `T`, while the NIC is open (`ib_get_client_data`).
    pub(crate) fn client<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let owner = self.owner.as_ref()?;
        let clients = owner.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients
            .iter()
            .find_map(|c| Arc::clone(c).downcast::<T>().ok())
    }

    /// Whether `other` is a handle of this NIC.
    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.driver, &other.driver)
    }

    pub(crate) fn caps() -> NicCaps {
        NicCaps {
            dmabuf: true,
            pageable_memory: true,
            // The engine takes what a QP or CQ asks for: no limit of its own.
            max_inline: u32::MAX,
            max_qp_wr: u32::MAX,
            max_cqe: u32::MAX,
            // What rxe advertises (`max_qp_rd_atom`): tools that size their window by the
            // device, as perftest's `-o` does, keep as many READs and atomics in flight here
            // as on rxe. With 16, a guest's atomic-bw was bound by that window (BENCHMARKS.md,
            // the data path's seventh step).
            max_rd_atomic: 128,
            per_packet_counters: true,
            fault_injection: true,
            pcap: true,
            manual_progress: true,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.driver.local
    }

    pub(crate) fn active_mtu(&self) -> Mtu {
        active_mtu_on(self.driver.local.ip())
    }

    pub(crate) fn counters(&self) -> Counters {
        *self.driver.lock().engine.counters()
    }

    /// The next event; the async descriptor stops being readable with the last one.
    pub(crate) fn poll_event(&self) -> Option<AsyncEvent> {
        let mut state = self.driver.lock();
        let event = state.engine.poll_event();
        let pending = state.engine.pending_events();
        state.events_seen = pending;
        if pending == 0 {
            self.driver.async_events.take();
        }
        event
    }

    /// The async-event descriptor: readable while an event waits for `poll_event`.
    pub(crate) fn async_fd(&self) -> BorrowedFd<'_> {
        self.driver.async_events.as_fd()
    }

    pub(crate) fn census(&self) -> Census {
        self.driver.lock().engine.census()
    }

    /// `rdma statistic show`'s line: the engine's counters, then the datagram layer's, then
    /// the driver's.
    pub(crate) fn statistics_line(&self, device: &str) -> String {
        let mut line = format!("link {device}/1");
        for (name, value) in self.counters().iter() {
            line.push_str(&format!(" {name} {value}"));
        }
        for (name, value) in self.driver.port.counters.iter() {
            line.push_str(&format!(" {name} {value}"));
        }
        let progress = self.driver.progress_rcvd.load(Ordering::Relaxed);
        line.push_str(&format!(" progress_thread_rcvd {progress}"));
        let dry = self.driver.dry_polls.load(Ordering::Relaxed);
        line.push_str(&format!(" dry_polls {dry}"));
        let busy = self.driver.busy_looks.load(Ordering::Relaxed);
        line.push_str(&format!(" busy_looks {busy}"));
        line
    }

    pub(crate) fn gso_status(&self) -> GsoStatus {
        self.driver.port.gso_status()
    }

    /// Why the receive path died, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        self.driver
            .failure
            .lock()
            .ok()?
            .as_ref()
            .map(ToString::to_string)
    }

    pub(crate) fn grow_buffers(&self, bytes: usize) -> io::Result<usize> {
        sys::grow_buffers(self.driver.port.socket(), bytes)
    }

    /// Wakes a thread blocked on the socket itself (`Cq::drive`).
    pub(crate) fn wake(&self) {
        self.driver.poke_socket();
    }

    /// Stops the clients and the progress thread (idempotent).
    pub(crate) fn close(&self) {
        if let Some(owner) = &self.owner {
            owner.stop_clients();
        }
        self.driver.stop();
    }

    pub(crate) fn create_cq(&self, depth: usize) -> Result<Arc<Cq>, NicError> {
        Cq::new(&self.driver, depth).map(Arc::new)
    }

    /// A QP in INIT; refused when the engine does not know the SRQ.
    pub(crate) fn create_qp(
        &self,
        setup: QpSetup,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
        srq: Option<&Arc<Srq>>,
    ) -> Result<Qp, NicError> {
        let QpSetup {
            qp_type,
            caps,
            sq_sig_all,
            psn,
            in_reset,
        } = setup;
        let init = QpInit {
            qp_type,
            pd: self.pd,
            send_cq: send_cq.id(),
            recv_cq: recv_cq.id(),
            caps,
            sq_sig_all,
            srq: srq.map(|s| s.id()),
        };
        let mut state = self.driver.lock();
        let qpn = state
            .engine
            .create_qp(init)
            .map_err(|_| NicError::OtherNic("a shared receive queue"))?;
        // INIT at once unless asked for RESET, so receives can be posted before connecting
        // (as ibv_rc_pingpong does); the access peers get is set by `connect`, a UD QP's
        // Q_Key by `ready_ud`. RESET → INIT with an access and a Q_Key cannot fail.
        if !in_reset {
            let init = QpAttr {
                state: Some(QpState::Init),
                access: Some(ferroce_proto::memory::Access::NONE),
                qkey: (qp_type == QpType::Ud).then_some(0),
                ..QpAttr::default()
            };
            let _ = state.engine.modify_qp(qpn, &init);
        }
        drop(state);
        Ok(Qp::new(
            &self.driver,
            qpn,
            psn,
            caps,
            srq.cloned(),
            (Arc::clone(send_cq), Arc::clone(recv_cq)),
        ))
    }

    /// QP 1, the GSI, in RTS with its fixed Q_Key; one per NIC at a time.
    pub(crate) fn create_gsi(&self, cq: &Arc<Cq>, caps: QpCaps) -> Result<Qp, NicError> {
        let qpn = self
            .driver
            .lock()
            .engine
            .create_gsi_qp(QpInit {
                qp_type: QpType::Ud,
                pd: self.pd,
                send_cq: cq.id(),
                recv_cq: cq.id(),
                caps,
                sq_sig_all: false,
                srq: None,
            })
            .map_err(|_| NicError::SoftOnly("a second GSI on one NIC"))?;
        let qp = Qp::new(
            &self.driver,
            qpn,
            Psn::default(),
            caps,
            None,
            (Arc::clone(cq), Arc::clone(cq)),
        );
        qp.ready_ud(ferroce_proto::qp::GSI_QKEY)
            .map_err(|_| NicError::SoftOnly("a GSI that cannot be brought up"))?;
        Ok(qp)
    }

    pub(crate) fn create_srq(&self, max_wr: u32) -> Arc<Srq> {
        Arc::new(Srq::new(&self.driver, self.pd, max_wr))
    }

    pub(crate) fn register(
        &self,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: Option<u64>,
    ) -> Result<(Region, RegionInfo), RegionError> {
        Region::register(&self.driver, self.pd, access, order, memory, iova)
    }

    /// The region registered with local key `lkey`.
    pub(crate) fn region_of_lkey(&self, lkey: u32) -> Option<RegionInfo> {
        self.driver.lock().engine.regions().by_lkey(lkey).copied()
    }

    /// The PSN QP `qpn`'s responder expects next, and the one it sends next: how the CM sees
    /// a passive connection's first data where its RTU was lost.
    pub(crate) fn qp_psns(&self, qpn: Qpn) -> Option<(Psn, Psn)> {
        self.driver.lock().engine.qp_psns(qpn)
    }

    /// Moves QP `qpn` to ERR, as the kernel's CM does when the peer disconnects.
    pub(crate) fn qp_to_error(&self, qpn: Qpn) {
        let mut state = self.driver.lock();
        let _ = state.engine.modify_qp(
            qpn,
            &QpAttr {
                state: Some(QpState::Err),
                ..QpAttr::default()
            },
        );
        self.driver.after_command(state);
    }
}

/// How the NIC sets up its UDP port.
fn port_options(config: &NicConfig) -> udp::PortOptions {
    // A READ response or a window of WRITEs arrives as a burst of up to hundreds of packets;
    // the default 208 KiB receive buffer drops the tail of it whenever the progress thread is
    // not scheduled at once. Ask for 8 MiB (granted in full to root; capped by
    // net.core.rmem_max otherwise).
    udp::PortOptions {
        gso: config.gso,
        gro: config.gro,
        buffers: 8 << 20,
    }
}

/// The operating system's CSPRNG (`getrandom(2)`) as the engine's [`Entropy`].
struct OsEntropy;

impl Entropy for OsEntropy {
    fn next_u64(&mut self) -> u64 {
        // `Nic::open` tried it; on Linux getrandom(2) fails only before the kernel's pool is
        // initialised at boot, or with a seccomp filter that would have failed that try too.
        sys::random_u64().expect("the OS random source worked when the NIC opened")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce_proto::memory::{Access, MemoryTable, WriteOrder};
    use std::sync::mpsc;

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

    /// Rings from several threads while the progress thread answers, then a close, which must
    /// return: a ring lost to the doorbell's `rung` flag would leave the progress thread asleep
    /// for good. (Clearing the flag before emptying the doorbell hung here.)
    #[test]
    fn rings_are_never_lost_and_the_nic_closes() {
        for _ in 0..100 {
            let nic = Nic::open(&NicConfig {
                addr: "127.0.0.1:0".parse().unwrap(),
                ..NicConfig::default()
            })
            .unwrap();
            let ringers: Vec<_> = (0..2)
                .map(|_| {
                    let driver = Arc::clone(&nic.driver);
                    std::thread::spawn(move || {
                        for _ in 0..300 {
                            driver.ring();
                            std::hint::spin_loop();
                        }
                    })
                })
                .collect();
            for r in ringers {
                r.join().unwrap();
            }
            let (done, closed) = mpsc::channel();
            std::thread::spawn(move || {
                nic.close();
                let _ = done.send(());
            });
            assert!(
                closed
                    .recv_timeout(std::time::Duration::from_secs(5))
                    .is_ok(),
                "close hung: a ring was lost"
            );
        }
    }
}
