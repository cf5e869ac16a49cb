//! Translations between the C values of the data path and ferroce's: access flags, QP states
//! and attributes, GIDs, completions. Pure functions, unit-tested here; `crate::entry` reads
//! and writes the C memory.

use std::ffi::{c_int, c_uint};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use ferroce::proto::memory::{Access, WriteOrder};
use ferroce::proto::qp::{Completion, Mtu, QpAttr, WcOpcode};
use ferroce::proto::wire::{Qpn, RnrTimer};
use ferroce::proto::Psn;
use ferroce::RegionAccess;

use crate::abi::*;

/// rdma-core's RoCE UDP port.
const ROCE_PORT: u16 = 4791;

/// The region rights for `ibv_reg_mr`'s `access`, and its write order.
///
/// A ferroce region always lets the local NIC write into it, so `IBV_ACCESS_LOCAL_WRITE` is
/// implied (a region registered without it is a superset of what was asked: receives and
/// READ responses may land in it). Remote rights map exactly, each set of them to its own
/// [`RegionAccess`] (`RegionAccess::from_flags`). `IBV_ACCESS_RELAXED_ORDERING` gives
/// [`WriteOrder::AnyOrder`]; the other optional flags are hints and are ignored.
///
/// # Errors
///
/// `EINVAL` for remote write or atomic rights without local write (IBTA o10-22, as
/// rdma-core's `ibv_reg_mr` refuses them).
pub(crate) fn region_access(access: c_uint) -> Result<(RegionAccess, WriteOrder), c_int> {
    let remote =
        access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    if access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && access & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    let flag = |ibv, ours| if remote & ibv != 0 { ours } else { 0 };
    let bits = flag(IBV_ACCESS_REMOTE_WRITE, RegionAccess::FLAG_REMOTE_WRITE)
        | flag(IBV_ACCESS_REMOTE_READ, RegionAccess::FLAG_REMOTE_READ)
        | flag(IBV_ACCESS_REMOTE_ATOMIC, RegionAccess::FLAG_REMOTE_ATOMIC);
    // Only the three known bits are set: every set of them is a right.
    let rights = RegionAccess::from_flags(bits).map_err(|_| libc::EINVAL)?;
    let order = if access & IBV_ACCESS_RELAXED_ORDERING != 0 {
        WriteOrder::AnyOrder
    } else {
        WriteOrder::InOrder
    };
    Ok((rights, order))
}

/// A queue pair's `qp_access_flags`: exactly the remote rights asked.
pub(crate) fn qp_access(flags: c_uint) -> Access {
    let mut access = Access::NONE;
    if flags & IBV_ACCESS_REMOTE_WRITE != 0 {
        access = access.with(Access::REMOTE_WRITE);
    }
    if flags & IBV_ACCESS_REMOTE_READ != 0 {
        access = access.with(Access::REMOTE_READ);
    }
    if flags & IBV_ACCESS_REMOTE_ATOMIC != 0 {
        access = access.with(Access::REMOTE_ATOMIC);
    }
    access
}

/// The `qp_access_flags` of a queue pair's remote rights: the inverse of [`qp_access`].
pub(crate) fn ibv_access(access: Access) -> c_uint {
    [
        (Access::REMOTE_WRITE, IBV_ACCESS_REMOTE_WRITE),
        (Access::REMOTE_READ, IBV_ACCESS_REMOTE_READ),
        (Access::REMOTE_ATOMIC, IBV_ACCESS_REMOTE_ATOMIC),
    ]
    .into_iter()
    .filter(|(right, _)| access.contains(*right))
    .fold(0, |flags, (_, bit)| flags | bit)
}

/// The address a GID names: the IPv4 address of an IPv4-mapped GID, else the IPv6 address.
pub(crate) fn gid_ip(gid: &ibv_gid) -> IpAddr {
    let v6 = Ipv6Addr::from(gid.raw);
    v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
}

/// The peer of an address vector: RoCE needs the GRH (its destination GID is the address);
/// `EINVAL` without one, as the kernel refuses a RoCE address without `IB_AH_GRH`.
pub(crate) fn ah_peer(ah: &ibv_ah_attr) -> Result<SocketAddr, c_int> {
    if ah.is_global == 0 {
        return Err(libc::EINVAL);
    }
    Ok(SocketAddr::new(gid_ip(&ah.grh.dgid), ROCE_PORT))
}

/// The address vector of a peer, as `ibv_query_qp` reports it (GRH with hop limit 1, as
/// rdma-core's tools set it; port 1).
pub(crate) fn ah_attr(peer: SocketAddr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: crate::attrs::gid(peer.ip()),
            hop_limit: 1,
            ..ibv_global_route::default()
        },
        is_global: 1,
        port_num: crate::attrs::PORT,
        ..ibv_ah_attr::default()
    }
}

/// The attributes that a transition from `from` to `to` requires on a QP of `qp_type`, as
/// the kernel's `ib_modify_qp_is_ok` table gives them; `None` for a transition it forbids.
/// Moves to RESET and ERR need nothing.
pub(crate) fn required_mask(qp_type: c_uint, from: c_uint, to: c_uint) -> Option<c_int> {
    let rc = qp_type == IBV_QPT_RC;
    let ud = qp_type == IBV_QPT_UD;
    Some(match (from, to) {
        (_, IBV_QPS_RESET | IBV_QPS_ERR) => 0,
        (IBV_QPS_RESET, IBV_QPS_INIT) if ud => IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
        (IBV_QPS_RESET, IBV_QPS_INIT) => IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        (IBV_QPS_INIT, IBV_QPS_INIT) => 0,
        (IBV_QPS_INIT, IBV_QPS_RTR) if ud => 0,
        (IBV_QPS_INIT, IBV_QPS_RTR) if rc => {
            IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        }
        (IBV_QPS_INIT, IBV_QPS_RTR) => {
            IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) if rc => {
            IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        (IBV_QPS_RTR, IBV_QPS_RTS) => IBV_QP_SQ_PSN,
        (IBV_QPS_RTS, IBV_QPS_RTS) => 0,
        _ => return None,
    })
}

/// ferroce's [`QpAttr`] for the fields of `attr` that `mask` selects (the state apart: the
/// caller decides it). `EINVAL` for a value out of range: a P_Key index other than 0, a port
/// other than 1, an unknown MTU, an RNR timer above 31, an address without GRH.
pub(crate) fn qp_attr(attr: &ibv_qp_attr, mask: c_int) -> Result<QpAttr, c_int> {
    let has = |bit: c_int| mask & bit != 0;
    let mut out = QpAttr::default();
    if has(IBV_QP_PKEY_INDEX) && attr.pkey_index != 0 {
        return Err(libc::EINVAL);
    }
    if has(IBV_QP_PORT) && attr.port_num != crate::attrs::PORT {
        return Err(libc::EINVAL);
    }
    if has(IBV_QP_ACCESS_FLAGS) {
        out.access = Some(qp_access(attr.qp_access_flags));
    }
    if has(IBV_QP_QKEY) {
        out.qkey = Some(attr.qkey);
    }
    if has(IBV_QP_AV) {
        out.peer = Some(ah_peer(&attr.ah_attr)?);
    }
    if has(IBV_QP_PATH_MTU) {
        out.path_mtu = Some(Mtu::from_ibv_value(attr.path_mtu.into()).ok_or(libc::EINVAL)?);
    }
    if has(IBV_QP_DEST_QPN) {
        out.dest_qpn = Some(Qpn::new(attr.dest_qp_num).ok_or(libc::EINVAL)?);
    }
    if has(IBV_QP_RQ_PSN) {
        out.rq_psn = Some(Psn::from_low_bits(attr.rq_psn));
    }
    if has(IBV_QP_SQ_PSN) {
        out.sq_psn = Some(Psn::from_low_bits(attr.sq_psn));
    }
    if has(IBV_QP_MAX_DEST_RD_ATOMIC) {
        out.max_dest_rd_atomic = Some(attr.max_dest_rd_atomic);
    }
    if has(IBV_QP_MAX_QP_RD_ATOMIC) {
        out.max_rd_atomic = Some(attr.max_rd_atomic);
    }
    if has(IBV_QP_MIN_RNR_TIMER) {
        out.min_rnr_timer = Some(RnrTimer::new(attr.min_rnr_timer).ok_or(libc::EINVAL)?);
    }
    if has(IBV_QP_TIMEOUT) {
        out.timeout = Some(attr.timeout);
    }
    if has(IBV_QP_RETRY_CNT) {
        out.retry_cnt = Some(attr.retry_cnt);
    }
    if has(IBV_QP_RNR_RETRY) {
        out.rnr_retry = Some(attr.rnr_retry);
    }
    Ok(out)
}

/// The `ibv_qp_attr` and mask of the fields of `q` that are set, the inverse of [`qp_attr`]
/// (`rdma_init_qp_attr`'s answer).
pub(crate) fn ibv_qp_attr_of(q: &QpAttr) -> (ibv_qp_attr, c_int) {
    let mut attr = ibv_qp_attr::default();
    let mut mask = 0;
    let mut set = |bit: c_int| mask |= bit;
    if let Some(state) = q.state {
        attr.qp_state = state.ibv_value();
        set(IBV_QP_STATE);
    }
    if let Some(access) = q.access {
        attr.qp_access_flags = ibv_access(access);
        set(IBV_QP_ACCESS_FLAGS);
    }
    if let Some(peer) = q.peer {
        attr.ah_attr = ah_attr(peer);
        set(IBV_QP_AV);
    }
    if let Some(mtu) = q.path_mtu {
        attr.path_mtu = mtu.ibv_value().into();
        set(IBV_QP_PATH_MTU);
    }
    if let Some(qpn) = q.dest_qpn {
        attr.dest_qp_num = qpn.value();
        set(IBV_QP_DEST_QPN);
    }
    if let Some(psn) = q.rq_psn {
        attr.rq_psn = psn.value();
        set(IBV_QP_RQ_PSN);
    }
    if let Some(psn) = q.sq_psn {
        attr.sq_psn = psn.value();
        set(IBV_QP_SQ_PSN);
    }
    if let Some(n) = q.max_dest_rd_atomic {
        attr.max_dest_rd_atomic = n;
        set(IBV_QP_MAX_DEST_RD_ATOMIC);
    }
    if let Some(n) = q.max_rd_atomic {
        attr.max_rd_atomic = n;
        set(IBV_QP_MAX_QP_RD_ATOMIC);
    }
    if let Some(t) = q.min_rnr_timer {
        attr.min_rnr_timer = t.code();
        set(IBV_QP_MIN_RNR_TIMER);
    }
    if let Some(t) = q.timeout {
        attr.timeout = t;
        set(IBV_QP_TIMEOUT);
    }
    if let Some(n) = q.retry_cnt {
        attr.retry_cnt = n;
        set(IBV_QP_RETRY_CNT);
    }
    if let Some(n) = q.rnr_retry {
        attr.rnr_retry = n;
        set(IBV_QP_RNR_RETRY);
    }
    (attr, mask)
}

/// The `ibv_wc` of a completion: `imm_data` in network order as `verbs.h` keeps it
/// (`__be32`), `IBV_WC_GRH` and `src_qp` for a UD receive, SLID zero (RoCE has no LIDs).
///
/// RoCE carries no service level either, so a UD receive's `sl` says what the GRH area
/// holds, as ConnectX reports it (the L3 header type of mlx5's CQE): [`SL_ROCE_IPV4`] or
/// [`SL_ROCE_IPV6`]. UCX 1.13's `ud_verbs` reads it to find the destination address in the
/// GRH area, and drops every datagram when it is zero (openucx/ucx#10209).
pub(crate) fn wc(c: &Completion) -> ibv_wc {
    let opcode = match c.opcode {
        WcOpcode::Send => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvRdmaWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    };
    let mut flags = 0;
    if c.imm.is_some() {
        flags |= IBV_WC_WITH_IMM;
    }
    if c.ud.is_some() {
        flags |= IBV_WC_GRH;
    }
    ibv_wc {
        wr_id: c.wr_id,
        status: c.status.ibv_value(),
        opcode,
        vendor_err: 0,
        byte_len: c.byte_len,
        imm_data: c.imm.unwrap_or(0).to_be(),
        qp_num: c.qpn.value(),
        src_qp: c.ud.map_or(0, |u| u.qpn.value()),
        wc_flags: flags,
        pkey_index: 0,
        slid: 0,
        sl: c.ud.map_or(0, |u| match u.ip {
            IpAddr::V4(_) => SL_ROCE_IPV4,
            IpAddr::V6(_) => SL_ROCE_IPV6,
        }),
        dlid_path_bits: 0,
    }
}

/// `ibv_wc.sl` of a UD receive that arrived over IPv4: the IPv4 header fills the GRH
/// area's last 20 bytes.
pub(crate) const SL_ROCE_IPV4: u8 = 2;
/// `ibv_wc.sl` of a UD receive that arrived over IPv6: the IPv6 header fills the GRH area.
pub(crate) const SL_ROCE_IPV6: u8 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use ferroce::proto::qp::{UdSource, WcStatus};
    use std::net::Ipv4Addr;

    #[test]
    fn region_rights_are_exact() {
        let lw = IBV_ACCESS_LOCAL_WRITE;
        assert_eq!(region_access(0).unwrap().0, RegionAccess::Local);
        assert_eq!(region_access(lw).unwrap().0, RegionAccess::Local);
        assert_eq!(
            region_access(lw | IBV_ACCESS_REMOTE_WRITE).unwrap().0,
            RegionAccess::RemoteWrite
        );
        assert_eq!(
            region_access(IBV_ACCESS_REMOTE_READ).unwrap().0,
            RegionAccess::RemoteRead
        );
        assert_eq!(
            region_access(lw | IBV_ACCESS_REMOTE_ATOMIC).unwrap().0,
            RegionAccess::RemoteAtomic
        );
        assert_eq!(
            region_access(lw | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ).unwrap(),
            (RegionAccess::RemoteWriteRead, WriteOrder::InOrder)
        );
        assert_eq!(
            region_access(lw | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)
                .unwrap()
                .0,
            RegionAccess::RemoteReadAtomic
        );
        assert_eq!(
            region_access(
                lw | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
            )
            .unwrap()
            .0,
            RegionAccess::Remote
        );
        assert_eq!(
            region_access(lw | IBV_ACCESS_RELAXED_ORDERING).unwrap().1,
            WriteOrder::AnyOrder
        );
        assert_eq!(region_access(IBV_ACCESS_REMOTE_WRITE), Err(libc::EINVAL));
        assert_eq!(region_access(IBV_ACCESS_REMOTE_ATOMIC), Err(libc::EINVAL));
    }

    #[test]
    fn gids_name_addresses_both_ways() {
        let ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 71));
        let ah = ah_attr(SocketAddr::new(ip, ROCE_PORT));
        assert_eq!(ah_peer(&ah).unwrap(), SocketAddr::new(ip, ROCE_PORT));
        let mut no_grh = ah;
        no_grh.is_global = 0;
        assert_eq!(ah_peer(&no_grh), Err(libc::EINVAL));
    }

    #[test]
    fn transitions_require_what_the_kernel_requires() {
        assert_eq!(
            required_mask(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT),
            Some(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
        );
        assert_eq!(
            required_mask(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT),
            Some(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)
        );
        assert_eq!(
            required_mask(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS),
            Some(IBV_QP_SQ_PSN)
        );
        assert_eq!(required_mask(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTS), None);
        assert_eq!(required_mask(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR), Some(0));
    }

    #[test]
    fn attributes_out_of_range_are_refused() {
        let attr = ibv_qp_attr {
            pkey_index: 1,
            ..ibv_qp_attr::default()
        };
        assert_eq!(qp_attr(&attr, IBV_QP_PKEY_INDEX), Err(libc::EINVAL));
        let attr = ibv_qp_attr {
            port_num: 2,
            ..ibv_qp_attr::default()
        };
        assert_eq!(qp_attr(&attr, IBV_QP_PORT), Err(libc::EINVAL));
        let attr = ibv_qp_attr {
            path_mtu: 9,
            ..ibv_qp_attr::default()
        };
        assert_eq!(qp_attr(&attr, IBV_QP_PATH_MTU), Err(libc::EINVAL));
        let attr = ibv_qp_attr {
            path_mtu: 5,
            min_rnr_timer: 12,
            qp_access_flags: IBV_ACCESS_REMOTE_READ,
            ..ibv_qp_attr::default()
        };
        let out = qp_attr(
            &attr,
            IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER | IBV_QP_ACCESS_FLAGS,
        )
        .unwrap();
        assert_eq!(out.path_mtu, Some(Mtu::M4096));
        assert_eq!(out.access, Some(Access::REMOTE_READ));
        assert_eq!(out.sq_psn, None, "unmasked fields stay unset");
    }

    #[test]
    fn completions_become_work_completions() {
        let c = Completion {
            wr_id: 7,
            status: WcStatus::LocProtErr,
            opcode: WcOpcode::Recv,
            byte_len: 44,
            imm: Some(0x0102_0304),
            qpn: Qpn::new(0x11).unwrap(),
            ud: Some(UdSource {
                qpn: Qpn::new(0x22).unwrap(),
                ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            }),
        };
        let w = wc(&c);
        assert_eq!(w.wr_id, 7);
        assert_eq!(w.status, 4);
        assert_eq!(w.opcode, IBV_WC_RECV);
        assert_eq!(
            w.imm_data.to_ne_bytes(),
            [1, 2, 3, 4],
            "big-endian in memory"
        );
        assert_eq!(w.wc_flags, IBV_WC_GRH | IBV_WC_WITH_IMM);
        assert_eq!((w.qp_num, w.src_qp), (0x11, 0x22));
        assert_eq!(w.sl, SL_ROCE_IPV4, "the GRH area holds an IPv4 header");
        let v6 = Completion {
            ud: Some(UdSource {
                qpn: Qpn::new(0x22).unwrap(),
                ip: IpAddr::V6(Ipv6Addr::LOCALHOST),
            }),
            ..c
        };
        assert_eq!(wc(&v6).sl, SL_ROCE_IPV6);
        let rc = Completion { ud: None, ..c };
        assert_eq!(wc(&rc).sl, 0, "an RC completion has no GRH to describe");
    }
}
