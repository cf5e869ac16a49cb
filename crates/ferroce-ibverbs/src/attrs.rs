//! What device `ferroce0` says of itself: its GUID, GID, `ibv_query_device` and
//! `ibv_query_port` attributes. Pure functions of the soft NIC's address, MTU and
//! capabilities ([`ferroce::NicCaps`]); `crate::entry::device` copies them out.
//!
//! The soft NIC has no limit of its own on queue depths, scatter lists or object counts (its
//! tables grow). A program that asks for "the most" must still get something it can
//! allocate, so the drop-in states its own limits here, large and documented, and will hold
//! create calls to them:
//!
//! | attribute | value | why |
//! |---|---|---|
//! | `max_qp_wr`, `max_srq_wr` | 2^20 | the engine takes any depth; a million requests a queue |
//! | `max_cqe` | 2^22 | four full queues per CQ |
//! | `max_sge`, `max_sge_rd`, `max_srq_sge` | 256 | scatter lists are vectors in the engine |
//! | `max_qp` | 2^24 − 2 | queue pair numbers are 24 bits; 0 and 1 are the special QPs |
//! | `max_cq`, `max_mr`, `max_pd`, `max_ah`, `max_srq` | 2^24 | as many as QPs |
//! | `max_qp_rd_atom`, `max_qp_init_rd_atom` | [`ferroce::NicCaps::max_rd_atomic`] (128) | rxe's; a QP's responder keeps up to its `max_dest_rd_atomic` READ and atomic results to replay duplicates from |
//! | `max_mr_size` | 2^64 − 1 | as rxe: any length the address space holds |
//! | `max_msg_sz` (port) | 2^31 | the engine's largest message (IBTA) |
//! | `max_mw`, `max_mcast_grp`, `max_ee`, `max_rdd`, `max_fmr` | 0 | not offered |
//!
//! `vendor_id` and `vendor_part_id` are 0: perftest, UCX and NCCL treat 0/0 as a generic HCA
//! (they special-case Mellanox, Chelsio, Intel, EFA and Broadcom numbers). The port reports
//! 1X EDR (25 Gb/s), a valid width and speed that no tool special-cases; the soft NIC's real
//! rate is what a core moves.

use std::ffi::{c_char, c_int};
use std::net::IpAddr;

use ferroce::proto::qp::Mtu;
use ferroce::NicCaps;

use crate::abi::*;

/// `ibv_device.name`: ferroce's device, [`ferroce::verbs::SOFT_DEVICE`].
pub(crate) const DEVICE_NAME: &str = ferroce::verbs::SOFT_DEVICE;
/// `ibv_device.dev_name`: the uverbs device name, which ferroce has none of; a name no
/// kernel device has.
pub(crate) const DEV_NAME: &str = "ferroce_verbs0";
/// `ibv_device.dev_path`.
pub(crate) const DEV_PATH: &str = "/sys/class/infiniband_verbs/ferroce_verbs0";
/// `ibv_device.ibdev_path`: where a sysfs view of the device would be (there is none; a
/// program reading it finds nothing, as it would for a device without the attribute).
pub(crate) const IBDEV_PATH: &str = "/sys/class/infiniband/ferroce0";

/// `max_qp_wr` and `max_srq_wr`.
pub(crate) const MAX_QP_WR: u32 = 1 << 20;
/// `max_cqe`.
pub(crate) const MAX_CQE: u32 = 1 << 22;
/// `max_sge`, `max_sge_rd`, `max_srq_sge`.
pub(crate) const MAX_SGE: c_int = 256;
/// `max_qp`: 24-bit QP numbers less QP 0 and QP 1.
pub(crate) const MAX_QP: c_int = (1 << 24) - 2;
/// `max_cq`, `max_mr`, `max_pd`, `max_ah`, `max_srq`.
pub(crate) const MAX_OBJECTS: c_int = 1 << 24;
/// The port's `gid_tbl_len`: the soft NIC has one address.
pub(crate) const GID_TABLE_LEN: c_int = 1;
/// The one P_Key, the default (full membership), at index 0.
pub(crate) const DEFAULT_PKEY: u16 = 0xffff;
/// The only port.
pub(crate) const PORT: u8 = 1;

/// The node GUID: `02:66:65:72` (a locally administered EUI-64 prefix, then "fer") and the
/// last four bytes of the address (the IPv4 address itself), so that two processes on two
/// addresses have two GUIDs. In memory order, as `__be64` is.
pub(crate) fn guid(ip: IpAddr) -> [u8; 8] {
    let tail = match ip {
        IpAddr::V4(v4) => v4.octets(),
        IpAddr::V6(v6) => {
            let o = v6.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x66, 0x65, 0x72, tail[0], tail[1], tail[2], tail[3]]
}

/// GID index 0: the RoCE v2 GID of the address, IPv4-mapped for IPv4.
pub(crate) fn gid(ip: IpAddr) -> ibv_gid {
    let v6 = match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    ibv_gid { raw: v6.octets() }
}

/// The GID table entry at index 0 (`_ibv_query_gid_ex`).
pub(crate) fn gid_entry(ip: IpAddr, ndev_ifindex: u32) -> ibv_gid_entry {
    ibv_gid_entry {
        gid: gid(ip),
        gid_index: 0,
        port_num: PORT.into(),
        gid_type: IBV_GID_TYPE_ROCE_V2,
        ndev_ifindex,
    }
}

/// A `c_int` field from a `u32` limit, saturating.
fn int(value: u32) -> c_int {
    c_int::try_from(value).unwrap_or(c_int::MAX)
}

/// `ibv_query_device`'s answer for a soft NIC with these capabilities on `ip`.
pub(crate) fn device_attr(ip: IpAddr, caps: &NicCaps) -> ibv_device_attr {
    let mut fw_ver = [0 as c_char; 64];
    for (d, s) in fw_ver.iter_mut().zip(env!("CARGO_PKG_VERSION").bytes()) {
        *d = s as c_char;
    }
    let guid = u64::from_ne_bytes(guid(ip));
    let rd_atom = c_int::from(caps.max_rd_atomic);
    ibv_device_attr {
        fw_ver,
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: u64::MAX,
        // Any page size from 4 KiB up.
        page_size_cap: !0xfff,
        vendor_id: 0,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: MAX_QP,
        max_qp_wr: int(caps.max_qp_wr.min(MAX_QP_WR)),
        device_cap_flags: IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_RC_RNR_NAK_GEN,
        max_sge: MAX_SGE,
        max_sge_rd: MAX_SGE,
        max_cq: MAX_OBJECTS,
        max_cqe: int(caps.max_cqe.min(MAX_CQE)),
        max_mr: MAX_OBJECTS,
        max_pd: MAX_OBJECTS,
        max_qp_rd_atom: rd_atom,
        max_ee_rd_atom: 0,
        max_res_rd_atom: rd_atom.saturating_mul(MAX_QP),
        max_qp_init_rd_atom: rd_atom,
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 0,
        max_mcast_qp_attach: 0,
        max_total_mcast_qp_attach: 0,
        max_ah: MAX_OBJECTS,
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: MAX_OBJECTS,
        max_srq_wr: int(caps.max_qp_wr.min(MAX_QP_WR)),
        max_srq_sge: MAX_SGE,
        max_pkeys: 1,
        // rxe's: 4.096 µs × 2^15, the most a responder may take to ACK.
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    }
}

/// `enum ibv_mtu` of an MTU (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5).
fn ibv_mtu(mtu: Mtu) -> u32 {
    match mtu {
        Mtu::M256 => 1,
        Mtu::M512 => 2,
        Mtu::M1024 => 3,
        Mtu::M2048 => 4,
        Mtu::M4096 => 5,
    }
}

/// `ibv_query_port`'s answer for port 1 of a soft NIC whose link carries `active_mtu`.
pub(crate) fn port_attr(active_mtu: Mtu) -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: ibv_mtu(active_mtu),
        gid_tbl_len: GID_TABLE_LEN,
        port_cap_flags: IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS,
        max_msg_sz: u32::try_from(ferroce::proto::engine::MAX_MESSAGE).unwrap_or(u32::MAX),
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        active_width: IBV_WIDTH_1X,
        active_speed: IBV_SPEED_EDR,
        phys_state: PHYS_STATE_LINK_UP,
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: IBV_QPF_GRH_REQUIRED,
        port_cap_flags2: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn soft_caps() -> NicCaps {
        // The soft NIC's own answer, from a NIC opened on loopback.
        let nic = ferroce::Nic::open(&ferroce::NicConfig::on(IpAddr::V4(Ipv4Addr::new(
            127, 0, 0, 91,
        ))))
        .expect("open a soft NIC on 127.0.0.91");
        let caps = nic.caps();
        nic.close();
        caps
    }

    #[test]
    fn gid_is_the_ipv4_mapped_address() {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5));
        let g = gid(ip);
        assert_eq!(
            std::net::Ipv6Addr::from(g.raw).to_string(),
            "::ffff:127.0.0.5"
        );
        let e = gid_entry(ip, 1);
        assert_eq!(e.gid_type, IBV_GID_TYPE_ROCE_V2);
        assert_eq!((e.gid_index, e.port_num, e.ndev_ifindex), (0, 1, 1));
    }

    #[test]
    fn guid_carries_the_address() {
        let g = guid(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
        assert_eq!(g, [0x02, 0x66, 0x65, 0x72, 10, 1, 2, 3]);
        // As ibv_devices prints it: be64toh of the __be64.
        assert_eq!(
            format!("{:016x}", u64::from_be_bytes(g)),
            "026665720a010203"
        );
    }

    #[test]
    fn device_limits_are_bounded_and_honest() {
        let caps = soft_caps();
        let a = device_attr(IpAddr::V4(Ipv4Addr::LOCALHOST), &caps);
        assert_eq!(a.max_qp_wr, 1 << 20);
        assert_eq!(a.max_cqe, 1 << 22);
        assert_eq!(a.max_qp_rd_atom, c_int::from(caps.max_rd_atomic));
        assert_eq!(a.phys_port_cnt, 1);
        assert_eq!((a.vendor_id, a.vendor_part_id), (0, 0));
        assert_eq!(a.node_guid, a.sys_image_guid);
        let fw: Vec<u8> = a
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        assert_eq!(fw, env!("CARGO_PKG_VERSION").as_bytes());
    }

    #[test]
    fn port_is_active_ethernet_with_the_link_s_mtu() {
        let p = port_attr(Mtu::M1024);
        assert_eq!(p.state, IBV_PORT_ACTIVE);
        assert_eq!(p.link_layer, IBV_LINK_LAYER_ETHERNET);
        assert_eq!(p.active_mtu, 3);
        assert_eq!(p.max_mtu, 5);
        assert_eq!(p.gid_tbl_len, 1);
        assert_eq!(p.max_msg_sz, 1 << 31);
        assert_eq!(port_attr(Mtu::M4096).active_mtu, 5);
    }
}
