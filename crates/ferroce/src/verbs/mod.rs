//! The verbs backend: rdma-core's libibverbs, loaded at run time, under the same [`Nic`],
//! [`Region`], [`Qp`] and [`Cq`] as the soft NIC.
//!
//! This module owns what is particular to a kernel RDMA device: finding it by name
//! ([`devices`], [`describe`]), choosing the RoCE v2 GID of the local address, reading the
//! device's asynchronous events on a thread of its own, and the translation between ferroce's
//! work requests and completions and libibverbs' (`queue`). The C layouts are in `abi`, and
//! every call across the boundary, with the only `unsafe` of the backend, is in `ffi`.
//!
//! [`Nic`]: crate::Nic
//! [`Region`]: crate::Region
//! [`Qp`]: crate::Qp
//! [`Cq`]: crate::Cq

mod abi;
mod ffi;
pub(crate) mod queue;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;

use ferroce_proto::qp::Mtu;

use abi::*;
pub(crate) use ffi::{Context, Lib, Mr, Opened, Pd, RawCq, RawQp};

/// The name of the soft NIC among device names (`-d ferroce0`).
pub const SOFT_DEVICE: &str = "ferroce0";

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

/// The kind of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet, no IP header).
    RoceV1,
    /// RoCE v2 (UDP port 4791): what ferroce speaks.
    RoceV2,
    /// The library could not say.
    Unknown,
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ib => "IB",
            Self::RoceV1 => "RoCE v1",
            Self::RoceV2 => "RoCE v2",
            Self::Unknown => "unknown",
        })
    }
}

/// One entry of a port's GID table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gid {
    /// Its index (`-g`, `-x`).
    pub index: u32,
    /// The GID: for RoCE, the IPv6 address or the IPv4-mapped one (`::ffff:a.b.c.d`).
    pub gid: Ipv6Addr,
    /// Its type.
    pub kind: GidType,
    /// The network interface it belongs to, where known.
    pub netdev: Option<String>,
}

impl Gid {
    /// The IP address this GID stands for (an IPv4-mapped GID is the IPv4 address).
    #[must_use]
    pub fn ip(&self) -> IpAddr {
        self.gid
            .to_ipv4_mapped()
            .map_or(IpAddr::V6(self.gid), IpAddr::V4)
    }
}

/// A port's GID table, printable one entry per line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GidTable(pub Vec<Gid>);

impl fmt::Display for GidTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("\t(empty)");
        }
        for (i, g) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "\tGID[{:>3}]:\t\t{}, {}", g.index, g.gid, g.kind)?;
            if let Some(dev) = &g.netdev {
                write!(f, " ({dev})")?;
            }
        }
        Ok(())
    }
}

/// What `ibv_query_port` says of a port, plus its GID table.
#[derive(Clone, Debug)]
pub struct PortInfo {
    /// The port number (from 1).
    pub port: u8,
    /// `PORT_ACTIVE`, `PORT_DOWN`, …
    pub state: &'static str,
    /// The largest path MTU.
    pub max_mtu: Option<Mtu>,
    /// The path MTU in use.
    pub active_mtu: Option<Mtu>,
    /// `Ethernet` or `InfiniBand`.
    pub link_layer: &'static str,
    /// The GID table.
    pub gids: GidTable,
}

/// What `ibv_query_device` says of a device, with its ports.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The device's name (`rxe0`, `mlx5_0`).
    pub name: String,
    /// Firmware version.
    pub fw_ver: String,
    /// The node GUID, as `ibv_devinfo` prints it.
    pub node_guid: String,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: i32,
    /// Most work requests per queue.
    pub max_qp_wr: i32,
    /// Most gather/scatter entries per request.
    pub max_sge: i32,
    /// Most CQs.
    pub max_cq: i32,
    /// Most entries per CQ.
    pub max_cqe: i32,
    /// Most memory regions.
    pub max_mr: i32,
    /// READs and atomics a QP may have outstanding as responder.
    pub max_qp_rd_atom: i32,
    /// The ports.
    pub ports: Vec<PortInfo>,
}

fn port_state_name(state: u32) -> &'static str {
    match state {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        IBV_PORT_ACTIVE => "PORT_ACTIVE",
        5 => "PORT_ACTIVE_DEFER",
        _ => "PORT_NOP",
    }
}

/// A failed call on `device`, with no hint.
fn call_failed(device: &str, call: &'static str, source: io::Error) -> VerbsError {
    VerbsError::Call {
        device: device.to_owned(),
        call,
        source,
        hint: None,
    }
}

/// libibverbs, or the error that says why not.
fn library() -> Result<&'static Lib, VerbsError> {
    ffi::lib().map_err(|e| VerbsError::LibraryMissing {
        path: e.path,
        reason: e.reason,
    })
}

/// The error of a device list that could not be had.
fn list_failed(source: io::Error) -> VerbsError {
    if source.raw_os_error() == Some(libc::ENOSYS) {
        VerbsError::NoKernelSupport { source }
    } else {
        VerbsError::Call {
            device: "(all)".into(),
            call: "ibv_get_device_list",
            source,
            hint: None,
        }
    }
}

/// The libibverbs file in use (`libibverbs.so.1`, or `FERROCE_IBVERBS`'s).
///
/// # Errors
///
/// [`VerbsError::LibraryMissing`] when it cannot be loaded.
pub fn library_path() -> Result<String, VerbsError> {
    Ok(library()?.path.clone())
}

/// The names of this host's verbs devices (`ibv_devices`), without the soft NIC.
///
/// # Errors
///
/// [`VerbsError::LibraryMissing`] without libibverbs, [`VerbsError::NoKernelSupport`] when the
/// kernel has no RDMA.
pub fn devices() -> Result<Vec<String>, VerbsError> {
    library()?.device_names().map_err(list_failed)
}

fn open_context(name: &str) -> Result<Arc<Context>, VerbsError> {
    match library()?.open(name).map_err(list_failed)? {
        Opened::Context(ctx) => Ok(Arc::new(ctx)),
        Opened::NotFound(names) => Err(VerbsError::NoSuchDevice {
            name: name.to_owned(),
            found: std::iter::once(SOFT_DEVICE.to_owned())
                .chain(names)
                .collect(),
        }),
        Opened::Refused(source) => Err(VerbsError::Call {
            device: name.to_owned(),
            call: "ibv_open_device",
            source,
            hint: Some("is /dev/infiniband/uverbs* readable by this user?"),
        }),
    }
}

/// The GID table of `port`, with types and interfaces (from the library, or from sysfs
/// where the library is older than rdma-core 32).
fn gid_table(ctx: &Context, device: &str, port: u8, len: i32) -> GidTable {
    let mut table = Vec::new();
    for index in 0..u32::try_from(len).unwrap_or(0) {
        let Ok(Some(entry)) = ctx.query_gid(port, index) else {
            continue;
        };
        let gid = Ipv6Addr::from(entry.gid.raw);
        if gid.is_unspecified() {
            continue;
        }
        let sysfs = |what: &str| {
            std::fs::read_to_string(format!(
                "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/{what}/{index}"
            ))
            .ok()
            .map(|s| s.trim().to_owned())
        };
        let kind = match entry.gid_type {
            IBV_GID_TYPE_IB => GidType::Ib,
            IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            _ => match sysfs("types").as_deref() {
                Some("RoCE v2") => GidType::RoceV2,
                Some("IB/RoCE v1") => GidType::RoceV1,
                _ => GidType::Unknown,
            },
        };
        table.push(Gid {
            index,
            gid,
            kind,
            netdev: sysfs("ndevs"),
        });
    }
    GidTable(table)
}

/// What `ibv_devinfo -v` shows of `name`: the device, its ports and their GID tables.
///
/// # Errors
///
/// The [`VerbsError`]s of opening the device, and [`VerbsError::Call`] when a query fails.
pub fn describe(name: &str) -> Result<DeviceInfo, VerbsError> {
    let ctx = open_context(name)?;
    let call = |call, source| call_failed(name, call, source);
    let attr = ctx
        .query_device()
        .map_err(|e| call("ibv_query_device", e))?;
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let p = ctx
            .query_port(port)
            .map_err(|e| call("ibv_query_port", e))?;
        ports.push(PortInfo {
            port,
            state: port_state_name(p.state),
            max_mtu: Mtu::from_ibv_value(p.max_mtu.into()),
            active_mtu: Mtu::from_ibv_value(p.active_mtu.into()),
            link_layer: match p.link_layer {
                IBV_LINK_LAYER_INFINIBAND => "InfiniBand",
                IBV_LINK_LAYER_ETHERNET => "Ethernet",
                _ => "Unspecified",
            },
            gids: gid_table(&ctx, name, port, p.gid_tbl_len),
        });
    }
    let fw_end = attr.fw_ver.iter().position(|&b| b == 0).unwrap_or(64);
    // A __be64: its bytes in memory are the GUID in order.
    let g = attr.node_guid.to_ne_bytes();
    Ok(DeviceInfo {
        name: name.to_owned(),
        fw_ver: String::from_utf8_lossy(&attr.fw_ver[..fw_end]).into_owned(),
        node_guid: format!(
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
        ),
        vendor_id: attr.vendor_id,
        vendor_part_id: attr.vendor_part_id,
        hw_ver: attr.hw_ver,
        max_qp: attr.max_qp,
        max_qp_wr: attr.max_qp_wr,
        max_sge: attr.max_sge,
        max_cq: attr.max_cq,
        max_cqe: attr.max_cqe,
        max_mr: attr.max_mr,
        max_qp_rd_atom: attr.max_qp_rd_atom,
        ports,
    })
}

/// How to open a verbs device: which port, and which GID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The port (`-i`; 1).
    pub port: u8,
    /// The GID index (`-g`, `-x`); `None` chooses the RoCE v2 GID of `local`.
    pub gid_index: Option<u32>,
    /// The local address whose RoCE v2 GID to use; `None` takes the first IPv4 one.
    pub local: Option<IpAddr>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            port: 1,
            gid_index: None,
            local: None,
        }
    }
}

/// Chooses the GID as [`DeviceOptions`] asks, from `table`.
fn choose_gid(table: &GidTable, options: &DeviceOptions) -> Result<Gid, String> {
    let v2 = |g: &&Gid| matches!(g.kind, GidType::RoceV2 | GidType::Unknown);
    if let Some(index) = options.gid_index {
        let g = table
            .0
            .iter()
            .find(|g| g.index == index)
            .ok_or_else(|| format!("GID index {index} is empty"))?;
        if !v2(&g) {
            return Err(format!(
                "GID index {index} is {}; ferroce speaks RoCE v2 only",
                g.kind
            ));
        }
        if let Some(ip) = options.local {
            if g.ip() != ip {
                return Err(format!("GID index {index} is {}, not {ip}", g.gid));
            }
        }
        return Ok(g.clone());
    }
    if let Some(ip) = options.local {
        return table
            .0
            .iter()
            .filter(v2)
            .find(|g| g.ip() == ip)
            .cloned()
            .ok_or_else(|| format!("no RoCE v2 GID for {ip}"));
    }
    table
        .0
        .iter()
        .filter(v2)
        .find(|g| g.gid.to_ipv4_mapped().is_some())
        .or_else(|| {
            table
                .0
                .iter()
                .filter(v2)
                .find(|g| g.gid.segments()[0] & 0xffc0 != 0xfe80)
        })
        .cloned()
        .ok_or_else(|| "no RoCE v2 GID with a routable address".to_owned())
}

/// The largest inline size an RC QP of the device takes: no verb reports it, so QPs asking
/// for less and less are created and dropped until one is granted (what libfabric and
/// perftest learn by trial too). 0 when none is.
fn probe_inline(ctx: &Arc<Context>, pd: &Arc<Pd>) -> u32 {
    let Ok(cq) = ctx.create_cq(4).map(Arc::new) else {
        return 0;
    };
    for ask in [1024, 512, 400, 256, 128, 64] {
        let mut caps = ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: ask,
        };
        if pd.create_qp(IBV_QPT_RC, &cq, &cq, &mut caps).is_ok() {
            return caps.max_inline_data;
        }
    }
    0
}

/// An open verbs device: the context, one PD, the port and GID in use, and the thread that
/// reads its asynchronous events.
pub(crate) struct Device {
    pub(crate) name: String,
    pub(crate) port: u8,
    /// The GID chosen at open. Its address is ours for good; its index may move when the
    /// table changes (an address removed and added again), and `gid_index` follows it.
    pub(crate) gid: Gid,
    gid_index: Arc<std::sync::atomic::AtomicU32>,
    pub(crate) active_mtu: Mtu,
    pub(crate) attr: ibv_device_attr,
    pub(crate) pd: Arc<Pd>,
    pub(crate) ctx: Arc<Context>,
    pub(crate) health: Arc<Health>,
    /// Whether `ibv_reg_dmabuf_mr` reaches a driver that has it.
    dmabuf: bool,
    /// The most inline bytes an RC QP is granted (no query says it; a probe at open does).
    pub(crate) max_inline: u32,
    events: Mutex<Option<EventThread>>,
}

/// What the async events said: the device's failure (for good: the device or its port
/// failed), whether our GID is out of the table (for now: until the address comes back), and
/// the QPs and CQs that failed.
#[derive(Default)]
pub(crate) struct Health {
    failure: Mutex<Option<String>>,
    gid_gone: std::sync::atomic::AtomicBool,
    /// QPs and CQs by their handle's address, to the flag of their own that an event sets.
    watched: Mutex<HashMap<usize, Weak<Mutex<Option<String>>>>>,
}

impl Health {
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn fail(&self, why: String) {
        let mut f = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
        if f.is_none() {
            *f = Some(why);
        }
    }

    /// Watches the object at `key`: an event that names it sets the returned flag.
    pub(crate) fn watch(&self, key: usize) -> Arc<Mutex<Option<String>>> {
        let flag = Arc::new(Mutex::new(None));
        let mut w = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        w.retain(|_, f| f.strong_count() > 0);
        w.insert(key, Arc::downgrade(&flag));
        flag
    }

    fn mark(&self, key: usize, why: String) -> bool {
        let w = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
        match w.get(&key).and_then(Weak::upgrade) {
            Some(flag) => {
                *flag.lock().unwrap_or_else(PoisonError::into_inner) = Some(why);
                true
            }
            None => false,
        }
    }
}

struct EventThread {
    stop: UnixDatagram,
    thread: JoinHandle<()>,
}

impl Device {
    /// Opens `name` as `options` asks and starts its event thread.
    pub(crate) fn open(name: &str, options: &DeviceOptions) -> Result<Arc<Self>, VerbsError> {
        let ctx = open_context(name)?;
        let call = |call, source| call_failed(name, call, source);
        let attr = ctx
            .query_device()
            .map_err(|e| call("ibv_query_device", e))?;
        if options.port == 0 || options.port > attr.phys_port_cnt {
            return Err(VerbsError::NoSuchPort {
                device: name.to_owned(),
                port: options.port,
                ports: attr.phys_port_cnt,
            });
        }
        let port = ctx
            .query_port(options.port)
            .map_err(|e| call("ibv_query_port", e))?;
        if port.link_layer == IBV_LINK_LAYER_INFINIBAND {
            return Err(VerbsError::NotRoce {
                device: name.to_owned(),
                port: options.port,
            });
        }
        let table = gid_table(&ctx, name, options.port, port.gid_tbl_len);
        let gid = choose_gid(&table, options).map_err(|wanted| VerbsError::NoGid {
            device: name.to_owned(),
            port: options.port,
            wanted,
            table: table.clone(),
        })?;
        // Before the first registration, as ibv_fork_init requires; skipped where the kernel
        // makes it needless.
        ffi::lib().map(Lib::fork_init_if_needed).ok();
        let pd = Arc::new(ctx.alloc_pd().map_err(|e| call("ibv_alloc_pd", e))?);
        // A registration of no descriptor: a driver with dma-buf support looks at the fd and
        // says EBADF; one without answers from libibverbs' stub, EOPNOTSUPP.
        let dmabuf = match pd.reg_dmabuf(-1, 0, 4096, 0, IBV_ACCESS_LOCAL_WRITE) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EPROTONOSUPPORT | libc::ENOSYS)
            ),
        };
        let max_inline = probe_inline(&ctx, &pd);
        let (stop, stop_rx) = UnixDatagram::pair().map_err(|e| call("socketpair", e))?;
        let health = Arc::new(Health::default());
        let gid_index = Arc::new(std::sync::atomic::AtomicU32::new(gid.index));
        let device = Arc::new(Self {
            name: name.to_owned(),
            port: options.port,
            gid,
            gid_index: Arc::clone(&gid_index),
            active_mtu: Mtu::from_ibv_value(port.active_mtu.into()).unwrap_or(Mtu::M1024),
            attr,
            pd,
            ctx: Arc::clone(&ctx),
            health: Arc::clone(&health),
            dmabuf,
            max_inline,
            events: Mutex::new(None),
        });
        let watcher = EventWatcher {
            ctx,
            health,
            device: name.to_owned(),
            port: options.port,
            gid: device.gid.clone(),
            gid_index,
            table_len: port.gid_tbl_len,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ferroce-{name}-events"))
            .spawn(move || watcher.run(&stop_rx))
            .map_err(|e| call("thread spawn", e))?;
        *device.events.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(EventThread { stop, thread });
        Ok(device)
    }

    /// The index of our GID now.
    pub(crate) fn gid_index(&self) -> u32 {
        self.gid_index.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether our GID has left the table (its address was removed) and not come back.
    pub(crate) fn gid_gone(&self) -> bool {
        self.health
            .gid_gone
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether regions can be registered from a dma-buf on this device.
    pub(crate) fn dmabuf_possible(&self) -> bool {
        self.dmabuf
    }

    /// Stops the event thread (idempotent).
    pub(crate) fn stop(&self) {
        let t = self
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = t {
            let _ = t.stop.send(&[1]);
            let _ = t.thread.join();
        }
    }

    /// The error of a failed verbs call on this device.
    pub(crate) fn error(
        &self,
        call: &'static str,
        source: io::Error,
        hint: Option<&'static str>,
    ) -> VerbsError {
        VerbsError::Call {
            device: self.name.clone(),
            call,
            source,
            hint,
        }
    }

    /// The sysfs counters of the port (`hw_counters`), by name, sorted.
    pub(crate) fn hw_counters(&self) -> Vec<(String, u64)> {
        let dir = format!(
            "/sys/class/infiniband/{}/ports/{}/hw_counters",
            self.name, self.port
        );
        let mut out: Vec<(String, u64)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let v = std::fs::read_to_string(e.path())
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                Some((name, v))
            })
            .collect();
        out.sort();
        out
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Reads the async fd until told to stop. Runs on its own thread so a QP that fails with no
/// traffic (no CQ wake-up) is still seen.
struct EventWatcher {
    ctx: Arc<Context>,
    health: Arc<Health>,
    device: String,
    port: u8,
    gid: Gid,
    gid_index: Arc<std::sync::atomic::AtomicU32>,
    table_len: i32,
}

impl EventWatcher {
    fn run(&self, stop: &UnixDatagram) {
        let fds = [self.ctx.async_fd(), stop.as_raw_fd()];
        loop {
            match crate::sys::poll_readable(fds, None) {
                Ok([_, true]) => return,
                Ok(_) => {}
                Err(e) => {
                    self.health.fail(format!(
                        "{}: cannot wait for async events: {e}",
                        self.device
                    ));
                    return;
                }
            }
            while let Some(ev) = self.ctx.next_event() {
                self.handle(ev);
            }
        }
    }

    fn handle(&self, ev: ffi::AsyncEvent) {
        let dev = &self.device;
        match ev.kind {
            IBV_EVENT_QP_FATAL | IBV_EVENT_QP_REQ_ERR | IBV_EVENT_QP_ACCESS_ERR => {
                let what = match ev.kind {
                    IBV_EVENT_QP_FATAL => "QP fatal error",
                    IBV_EVENT_QP_REQ_ERR => "invalid request at the responder",
                    _ => "access violation at the responder",
                };
                self.health.mark(ev.element, format!("{dev}: {what}"));
            }
            IBV_EVENT_CQ_ERR => {
                self.health.mark(
                    ev.element,
                    format!("{dev}: completion queue overrun: completions were lost"),
                );
            }
            IBV_EVENT_DEVICE_FATAL => self.health.fail(format!("{dev}: device fatal error")),
            IBV_EVENT_PORT_ERR if ev.element as u8 == self.port => self.health.fail(format!(
                "{dev} port {}: the port went down (PORT_ERR)",
                self.port
            )),
            IBV_EVENT_GID_CHANGE => {
                // Ours is gone when no entry of the table holds it any more; when it is back,
                // perhaps at another index, QPs connect through that one.
                let len = u32::try_from(self.table_len).unwrap_or(0).max(1);
                let found = (0..len).find(|&i| {
                    matches!(self.ctx.query_gid(self.port, i),
                        Ok(Some(e)) if Ipv6Addr::from(e.gid.raw) == self.gid.gid)
                });
                if let Some(i) = found {
                    self.gid_index
                        .store(i, std::sync::atomic::Ordering::Relaxed);
                }
                let ours = found.is_some();
                // Its absence ends when the address is added back, and then a fresh start
                // can receive again: `Nic::address_gone`, not a failure.
                self.health
                    .gid_gone
                    .store(!ours, std::sync::atomic::Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rxe_table() -> GidTable {
        GidTable(vec![
            Gid {
                index: 0,
                gid: "fe80::5054:ff:fe00:11".parse().unwrap(),
                kind: GidType::RoceV2,
                netdev: Some("eth0".into()),
            },
            Gid {
                index: 1,
                gid: "::ffff:10.77.0.11".parse().unwrap(),
                kind: GidType::RoceV2,
                netdev: Some("eth0".into()),
            },
        ])
    }

    fn connectx_table() -> GidTable {
        let mut t = Vec::new();
        for (i, (gid, kind)) in [
            ("fe80::1", GidType::RoceV1),
            ("fe80::1", GidType::RoceV2),
            ("::ffff:10.0.0.5", GidType::RoceV1),
            ("::ffff:10.0.0.5", GidType::RoceV2),
        ]
        .into_iter()
        .enumerate()
        {
            t.push(Gid {
                index: i as u32,
                gid: gid.parse().unwrap(),
                kind,
                netdev: None,
            });
        }
        GidTable(t)
    }

    #[test]
    fn the_default_gid_is_the_first_ipv4_roce_v2_one() {
        let o = DeviceOptions::default();
        assert_eq!(choose_gid(&rxe_table(), &o).unwrap().index, 1);
        assert_eq!(choose_gid(&connectx_table(), &o).unwrap().index, 3);
    }

    #[test]
    fn a_local_address_picks_its_own_gid_and_a_wrong_one_is_refused() {
        let mut o = DeviceOptions {
            local: Some("10.77.0.11".parse().unwrap()),
            ..DeviceOptions::default()
        };
        assert_eq!(choose_gid(&rxe_table(), &o).unwrap().index, 1);
        o.local = Some("10.77.0.99".parse().unwrap());
        let e = choose_gid(&rxe_table(), &o).unwrap_err();
        assert!(e.contains("10.77.0.99"), "{e}");
    }

    #[test]
    fn an_index_is_taken_as_given_unless_it_is_empty_or_roce_v1() {
        let o = |i| DeviceOptions {
            gid_index: Some(i),
            ..DeviceOptions::default()
        };
        assert_eq!(choose_gid(&rxe_table(), &o(0)).unwrap().index, 0);
        assert!(choose_gid(&rxe_table(), &o(7))
            .unwrap_err()
            .contains("empty"));
        assert!(choose_gid(&connectx_table(), &o(2))
            .unwrap_err()
            .contains("RoCE v1"));
    }

    #[test]
    fn the_table_prints_one_entry_per_line() {
        let text = rxe_table().to_string();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains("::ffff:10.77.0.11, RoCE v2 (eth0)"), "{text}");
    }
}
