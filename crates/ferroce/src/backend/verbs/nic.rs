//! The verbs backend's NIC: an open [`Device`], what it reports, and the CQs, QPs and regions
//! it creates.

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use ferroce_proto::memory::{RegionInfo, WriteOrder};
use ferroce_proto::qp::Mtu;
use ferroce_proto::wire::ROCE_PORT;

use super::cq::Cq;
use super::device::Device;
use super::qp::Qp;
use super::region::Region;
use crate::attr::{DeviceOptions, NicCaps, QpSetup, RegionAccess};
use crate::error::{RegionError, VerbsError};
use crate::memory::RegionMemory;

/// The verbs backend's NIC: an open device. Its event thread stops with the last handle, or
/// at `close`; the device itself closes when its last object is dropped.
pub(crate) struct Nic {
    device: Arc<Device>,
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.device.stop();
    }
}

impl Nic {
    /// Opens `name` as `options` asks.
    pub(crate) fn open(name: &str, options: &DeviceOptions) -> Result<Self, VerbsError> {
        Ok(Self {
            device: Device::open(name, options)?,
        })
    }

    pub(crate) fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.device, &other.device)
    }

    pub(crate) fn name(&self) -> &str {
        &self.device.name
    }

    pub(crate) fn gid_index(&self) -> u32 {
        self.device.gid_index()
    }

    pub(crate) fn caps(&self) -> NicCaps {
        let a = &self.device.attr;
        NicCaps {
            dmabuf: self.device.dmabuf_possible(),
            pageable_memory: false,
            // Probed at open (no query gives it): rxe grants 400 bytes.
            max_inline: self.device.max_inline,
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

    /// The GID's address, on port 4791.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.device.gid.ip(), ROCE_PORT)
    }

    /// The port's `active_mtu`, as `ibv_query_port` gave it at open.
    pub(crate) fn active_mtu(&self) -> Mtu {
        self.device.active_mtu
    }

    /// `link <dev>/<port>` and the port's `hw_counters` from sysfs.
    pub(crate) fn statistics_line(&self) -> String {
        let mut line = format!("link {}/{}", self.device.name, self.device.port);
        for (name, value) in self.device.hw_counters() {
            line.push_str(&format!(" {name} {value}"));
        }
        line
    }

    /// Why the device failed for good, if an async event said so.
    pub(crate) fn failure(&self) -> Option<String> {
        self.device.health.failure()
    }

    /// The async descriptor: readable once the event thread handled an event (its effect is
    /// in the `failure`s and `gid_gone`).
    pub(crate) fn async_fd(&self) -> BorrowedFd<'_> {
        self.device.health.signalled.as_fd()
    }

    /// Takes what the async descriptor counted: the events have been handled already.
    pub(crate) fn take_async(&self) {
        self.device.health.signalled.take();
    }

    /// Whether our GID is out of the device's table (its address removed).
    pub(crate) fn gid_gone(&self) -> bool {
        self.device.gid_gone()
    }

    pub(crate) fn close(&self) {
        self.device.stop();
    }

    pub(crate) fn create_cq(&self, depth: usize) -> Result<Arc<Cq>, VerbsError> {
        Cq::new(&self.device, depth).map(Arc::new)
    }

    pub(crate) fn create_qp(
        &self,
        setup: QpSetup,
        send_cq: &Arc<Cq>,
        recv_cq: &Arc<Cq>,
    ) -> Result<Qp, VerbsError> {
        Qp::new(&self.device, setup, send_cq, recv_cq)
    }

    pub(crate) fn register(
        &self,
        access: RegionAccess,
        order: WriteOrder,
        memory: RegionMemory,
        iova: Option<u64>,
    ) -> Result<(Region, RegionInfo), RegionError> {
        Region::register(&self.device, access, order, memory, iova)
    }

    /// The region registered here with local key `lkey`.
    pub(crate) fn region_of_lkey(&self, lkey: u32) -> Option<RegionInfo> {
        self.device
            .regions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&lkey)
            .copied()
    }
}
