//! What the API and both backends speak: the attributes of NICs, queue pairs, regions and
//! verbs devices, as data (rdma-core's `verbs.h` structs, which every provider includes and
//! none defines). Nothing here does I/O or names a backend; the public modules re-export what
//! users see ([`crate::nic`], [`crate::qp`], [`crate::region`], [`crate::verbs`]).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

use ferroce_proto::memory::Access;
use ferroce_proto::qp::{ModifyError, Mtu};
use ferroce_proto::wire::{Qpn, RnrTimer, ROCE_PORT};
use ferroce_proto::Psn;

use crate::sys;
use crate::udp::tap::Faults;

/// The name of the soft NIC among device names (`-d ferroce0`).
pub const SOFT_DEVICE: &str = "ferroce0";

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
    /// Run the soft NIC's progress thread above the application's threads (nice −10) while
    /// the application leaves after each completion to wait elsewhere, where the process may
    /// raise a priority (root, `CAP_SYS_NICE`, or an `RLIMIT_NICE` that allows it), as a
    /// NIC's interrupt handling and kernel rxe's softirq run above applications. It matters
    /// where applications spin on every core waiting for memory a peer writes
    /// (`ib_write_lat`): the thread that must place those bytes then waits for a time slice
    /// (a millisecond) unless it outranks them. While the application polls for itself, or
    /// where the process may not raise it, the thread keeps the application's priority. On
    /// by default.
    pub progress_priority: bool,
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
            progress_priority: true,
        }
    }
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
    /// Every packet is seen by ferroce, so per-packet counters ([`Nic::counters`](crate::Nic::counters)) and the
    /// frame receiver's checks of each WRITE exist; a verbs device counts in hardware
    /// ([`Nic::statistics_line`](crate::Nic::statistics_line) reads them).
    pub per_packet_counters: bool,
    /// Faults can be injected (`--fault`).
    pub fault_injection: bool,
    /// Packets can be captured (`--pcap`).
    pub pcap: bool,
    /// Progress is made by ferroce's own threads and by polling (the soft engine); a verbs
    /// device progresses by itself.
    pub manual_progress: bool,
}

/// What a peer needs to reach a queue pair: its number, its first PSN and its NIC's address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpEndpoint {
    /// The queue pair number.
    pub qpn: Qpn,
    /// The first PSN its requester sends.
    pub psn: Psn,
    /// Its NIC's address and UDP port.
    pub addr: SocketAddr,
}

/// How to connect a queue pair; the defaults are those of `ibv_rc_pingpong` and perftest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Path MTU (1024, as rxe on a 1500-byte link).
    pub mtu: Mtu,
    /// What the peer may do through this queue pair.
    pub access: RegionAccess,
    /// ACK timeout exponent: 4.096 µs × 2^timeout (14: 67 ms).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs (7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (7: forever).
    pub rnr_retry: u8,
    /// The RNR timer asked of the peer (12: 0.64 ms).
    pub min_rnr_timer: u8,
    /// READs and atomics outstanding each way (16).
    pub max_rd_atomic: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            mtu: Mtu::M1024,
            access: RegionAccess::Remote,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
        }
    }
}

/// Everything INIT → RTR → RTS sets on a connected queue pair, settled: what
/// [`ConnectOptions`] and a peer's [`QpEndpoint`] give (`Qp::connect`), or what a CM exchange
/// settled for each side. The one input both backends take to connect a QP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectAttrs {
    pub(crate) peer: SocketAddr,
    pub(crate) dest_qpn: Qpn,
    pub(crate) sq_psn: Psn,
    pub(crate) rq_psn: Psn,
    pub(crate) mtu: Mtu,
    /// What peers may do through the QP (`qp_access_flags`).
    pub(crate) access: Access,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) min_rnr_timer: RnrTimer,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
}

impl ConnectAttrs {
    /// The attributes `Qp::connect` sets: `options` toward `peer`, our requester starting at
    /// `sq_psn`.
    pub(crate) fn new(
        peer: &QpEndpoint,
        sq_psn: Psn,
        options: &ConnectOptions,
    ) -> Result<Self, ModifyError> {
        Ok(Self {
            peer: peer.addr,
            dest_qpn: peer.qpn,
            sq_psn,
            rq_psn: peer.psn,
            mtu: options.mtu,
            access: options.access.qp_rights(),
            timeout: options.timeout,
            retry_cnt: options.retry_cnt,
            rnr_retry: options.rnr_retry,
            min_rnr_timer: rnr_timer(options.min_rnr_timer)?,
            max_rd_atomic: options.max_rd_atomic,
            max_dest_rd_atomic: options.max_rd_atomic,
        })
    }
}

/// What a backend creates a queue pair with, besides its CQs and SRQ: `ibv_qp_init_attr`'s
/// type, capacities and `sq_sig_all`, the first PSN ferroce chose, and whether it stays in
/// RESET (`ibv_create_qp`'s state) rather than moving to INIT at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpSetup {
    pub(crate) qp_type: ferroce_proto::qp::QpType,
    pub(crate) caps: ferroce_proto::qp::QpCaps,
    pub(crate) sq_sig_all: bool,
    pub(crate) psn: Psn,
    pub(crate) in_reset: bool,
}

/// The RNR timer code `value` (`min_rnr_timer`, 0 to 31), or the error that says so.
pub(crate) fn rnr_timer(value: u8) -> Result<RnrTimer, ModifyError> {
    RnrTimer::new(value).ok_or(ModifyError::InvalidValue {
        attr: "min_rnr_timer",
        value: value.into(),
        expected: "0 to 31",
    })
}

/// What peers may do to a region (Rig_mlx5's `Region.access`: `Local`, `Remote_write`,
/// `Remote`), and through a queue pair ([`crate::ConnectOptions::access`]): any set of the
/// three remote rights, each set its own variant, so that what is granted is exactly what was
/// asked for and never more.
///
/// The rights are also bit flags ([`RegionAccess::flags`], [`RegionAccess::from_flags`], `|`),
/// the form the Python `RegionAccess` (an `enum.Flag`) and C's `FERROCE_ACCESS_*` take.
///
/// ```
/// use ferroce::RegionAccess;
/// let rw = RegionAccess::RemoteWrite | RegionAccess::RemoteRead;
/// assert_eq!(rw, RegionAccess::RemoteWriteRead);
/// assert_eq!(RegionAccess::from_flags(rw.flags()), Ok(rw));
/// assert!(RegionAccess::from_flags(8).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionAccess {
    /// Peers neither read nor write (`Local`).
    Local,
    /// Peers write, and nothing else (`Remote_write`).
    RemoteWrite,
    /// Peers read, and nothing else.
    RemoteRead,
    /// Peers run atomics, and nothing else.
    RemoteAtomic,
    /// Peers write and read; no atomics.
    RemoteWriteRead,
    /// Peers write and run atomics; no READ.
    RemoteWriteAtomic,
    /// Peers read and run atomics; no WRITE.
    RemoteReadAtomic,
    /// Peers read, write and run atomics (`Remote`).
    Remote,
}

/// Flag bits that are not a remote right, given to [`RegionAccess::from_flags`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "access flags {bits:#x} include unknown bits {unknown:#x} (known: remote write 0x1, \
     remote read 0x2, remote atomic 0x4)"
)]
pub struct AccessFlagsError {
    /// The flags as given.
    pub bits: u32,
    /// The bits that are not a right.
    pub unknown: u32,
}

impl RegionAccess {
    /// Peers may RDMA WRITE (the flag bit; C's `FERROCE_ACCESS_REMOTE_WRITE`).
    pub const FLAG_REMOTE_WRITE: u32 = 1 << 0;
    /// Peers may RDMA READ (C's `FERROCE_ACCESS_REMOTE_READ`).
    pub const FLAG_REMOTE_READ: u32 = 1 << 1;
    /// Peers may run atomics (C's `FERROCE_ACCESS_REMOTE_ATOMIC`).
    pub const FLAG_REMOTE_ATOMIC: u32 = 1 << 2;
    /// Every right: what [`RegionAccess::Remote`] is.
    pub const FLAGS_ALL: u32 =
        Self::FLAG_REMOTE_WRITE | Self::FLAG_REMOTE_READ | Self::FLAG_REMOTE_ATOMIC;

    /// The rights as flag bits (0 for [`RegionAccess::Local`]).
    #[must_use]
    pub const fn flags(self) -> u32 {
        const W: u32 = RegionAccess::FLAG_REMOTE_WRITE;
        const R: u32 = RegionAccess::FLAG_REMOTE_READ;
        const A: u32 = RegionAccess::FLAG_REMOTE_ATOMIC;
        match self {
            Self::Local => 0,
            Self::RemoteWrite => W,
            Self::RemoteRead => R,
            Self::RemoteAtomic => A,
            Self::RemoteWriteRead => W | R,
            Self::RemoteWriteAtomic => W | A,
            Self::RemoteReadAtomic => R | A,
            Self::Remote => W | R | A,
        }
    }

    /// The rights the flag bits `bits` name, exactly; an error for any other bit.
    pub const fn from_flags(bits: u32) -> Result<Self, AccessFlagsError> {
        if bits & !Self::FLAGS_ALL != 0 {
            return Err(AccessFlagsError {
                bits,
                unknown: bits & !Self::FLAGS_ALL,
            });
        }
        const W: u32 = RegionAccess::FLAG_REMOTE_WRITE;
        const R: u32 = RegionAccess::FLAG_REMOTE_READ;
        const A: u32 = RegionAccess::FLAG_REMOTE_ATOMIC;
        Ok(match bits {
            0 => Self::Local,
            W => Self::RemoteWrite,
            R => Self::RemoteRead,
            A => Self::RemoteAtomic,
            0b011 => Self::RemoteWriteRead,
            0b101 => Self::RemoteWriteAtomic,
            0b110 => Self::RemoteReadAtomic,
            _ => Self::Remote,
        })
    }

    /// Whether every right of `other` is granted.
    #[must_use]
    pub const fn contains(self, other: Self) -> bool {
        self.flags() & other.flags() == other.flags()
    }

    /// A region's rights: local write always, and what peers may do.
    pub(crate) fn rights(self) -> Access {
        Access::LOCAL.with(self.qp_rights())
    }

    /// A queue pair's rights (`qp_access_flags`): only what peers may do through it.
    pub(crate) fn qp_rights(self) -> Access {
        let bits = self.flags();
        let mut access = Access::NONE;
        if bits & Self::FLAG_REMOTE_WRITE != 0 {
            access = access.with(Access::REMOTE_WRITE);
        }
        if bits & Self::FLAG_REMOTE_READ != 0 {
            access = access.with(Access::REMOTE_READ);
        }
        if bits & Self::FLAG_REMOTE_ATOMIC != 0 {
            access = access.with(Access::REMOTE_ATOMIC);
        }
        access
    }
}

impl std::ops::BitOr for RegionAccess {
    type Output = Self;

    /// The union of two sets of rights (exact: every union is a variant).
    fn bitor(self, other: Self) -> Self {
        match Self::from_flags(self.flags() | other.flags()) {
            Ok(access) => access,
            Err(_) => unreachable!("the union of two sets of rights is a set of rights"),
        }
    }
}

impl std::ops::BitOrAssign for RegionAccess {
    fn bitor_assign(&mut self, other: Self) {
        *self = *self | other;
    }
}

impl From<RegionAccess> for u32 {
    fn from(access: RegionAccess) -> Self {
        access.flags()
    }
}

impl TryFrom<u32> for RegionAccess {
    type Error = AccessFlagsError;

    fn try_from(bits: u32) -> Result<Self, AccessFlagsError> {
        Self::from_flags(bits)
    }
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
/// [`crate::Nic::active_mtu`] of a NIC on `ip`, before opening one: [`Mtu::for_link`] of the
/// MTU of the interface that holds `ip`, 1024 when it cannot be read.
#[must_use]
pub fn active_mtu_on(ip: IpAddr) -> Mtu {
    sys::interface_mtu(ip).map_or(Mtu::M1024, Mtu::for_link)
}

#[cfg(test)]
mod access_tests {
    use super::*;

    /// All eight sets of rights, as flags, and the `Access` each grants a region and a QP.
    #[test]
    fn every_combination_converts_exactly() {
        for bits in 0..8u32 {
            let access = RegionAccess::from_flags(bits).unwrap();
            assert_eq!(access.flags(), bits);
            assert_eq!(RegionAccess::try_from(bits), Ok(access));
            assert_eq!(u32::from(access), bits);
            let want = (if bits & 1 != 0 { 2 } else { 0 })
                | (if bits & 2 != 0 { 4 } else { 0 })
                | (if bits & 4 != 0 { 8 } else { 0 });
            assert_eq!(access.qp_rights().ibv_bits(), want, "{access:?}");
            assert_eq!(access.rights().ibv_bits(), want | 1, "{access:?}");
            for other in 0..8u32 {
                let union = access | RegionAccess::from_flags(other).unwrap();
                assert_eq!(union.flags(), bits | other);
                assert!(union.contains(access));
            }
        }
        assert_eq!(RegionAccess::Local.rights(), Access::LOCAL);
        assert_eq!(
            RegionAccess::RemoteWrite.rights(),
            Access::REMOTE_WRITE_ONLY
        );
        assert_eq!(RegionAccess::Remote.rights(), Access::REMOTE);
        assert_eq!(RegionAccess::Remote.flags(), RegionAccess::FLAGS_ALL);
        for bad in [8, 9, 0x10, 0x8000_0000, u32::MAX] {
            let e = RegionAccess::from_flags(bad).unwrap_err();
            assert_eq!(e.unknown, bad & !7);
        }
    }
}
