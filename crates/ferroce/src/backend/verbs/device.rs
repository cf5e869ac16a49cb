//! An open verbs device: the context, one PD, the port and GID in use, what a probe found
//! (inline size, dma-buf support), and the thread that reads its async events. Every verbs
//! object holds an `Arc` of it.

use std::collections::HashMap;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex, PoisonError};

use ferroce_proto::memory::RegionInfo;
use ferroce_proto::qp::Mtu;

use super::abi::*;
use super::discover::{call_failed, choose_gid, gid_table, open_context};
use super::events::{EventThread, EventWatcher, Health};
use super::ffi::{self, Context, Lib, Pd};
use crate::attr::{DeviceOptions, Gid};
use crate::error::VerbsError;

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
        if pd.create_qp(IBV_QPT_RC, &cq, &cq, false, &mut caps).is_ok() {
            return caps.max_inline_data;
        }
    }
    0
}

/// An open verbs device: the context, one PD, the port and GID in use, and the thread that
/// reads its asynchronous events.
pub(super) struct Device {
    pub(super) name: String,
    pub(super) port: u8,
    /// The GID chosen at open. Its address is ours for good; its index may move when the
    /// table changes (an address removed and added again), and `gid_index` follows it.
    pub(super) gid: Gid,
    gid_index: Arc<std::sync::atomic::AtomicU32>,
    pub(super) active_mtu: Mtu,
    pub(super) attr: ibv_device_attr,
    pub(super) pd: Arc<Pd>,
    pub(super) ctx: Arc<Context>,
    pub(super) health: Arc<Health>,
    /// Whether `ibv_reg_dmabuf_mr` reaches a driver that has it.
    dmabuf: bool,
    /// The most inline bytes an RC QP is granted (no query says it; a probe at open does).
    pub(super) max_inline: u32,
    events: Mutex<Option<EventThread>>,
    /// The regions registered on the device, by local key: what `Nic::region_of_lkey` finds
    /// (the keys themselves live in the kernel).
    pub(super) regions: Mutex<HashMap<u32, RegionInfo>>,
}

impl Device {
    /// Opens `name` as `options` asks and starts its event thread.
    pub(super) fn open(name: &str, options: &DeviceOptions) -> Result<Arc<Self>, VerbsError> {
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
        let health = Arc::new(Health::new().map_err(|e| call("eventfd", e))?);
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
            regions: Mutex::new(HashMap::new()),
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
    pub(super) fn gid_index(&self) -> u32 {
        self.gid_index.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether our GID has left the table (its address was removed) and not come back.
    pub(super) fn gid_gone(&self) -> bool {
        self.health
            .gid_gone
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether regions can be registered from a dma-buf on this device.
    pub(super) fn dmabuf_possible(&self) -> bool {
        self.dmabuf
    }

    /// Stops the event thread (idempotent).
    pub(super) fn stop(&self) {
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
    pub(super) fn error(
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
    pub(super) fn hw_counters(&self) -> Vec<(String, u64)> {
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
