//! rdma-core's libibverbs, as C lays it out: the structures, function-pointer types and
//! constants of `infiniband/verbs.h` and `libibverbs/driver.h` (rdma-core v44, Debian 12; the
//! layouts are unchanged from v25 to HEAD on x86_64 and aarch64, except where a field says so).
//! Each item is the C one of the same name, and its fields are rdma-core's. Two crates stand on
//! it: ferroce's verbs backend, which calls a real libibverbs with these, and the drop-in
//! `libibverbs.so.1` (`ferroce-ibverbs`), which allocates them for programs. So every structure
//! is declared whole, with each slot named even where nobody fills it.
//!
//! Sizes and offsets are asserted at compile time (the numbers a C program built against
//! Debian's headers prints) and again by unit tests that name the field that moved. No
//! `unsafe` here: the function-pointer types are `unsafe extern "C"` so that C entry points
//! can be stored in the tables.

#![forbid(unsafe_code)]
// The items are verbs.h's own, documented there field by field; each type says which it is.
#![allow(non_camel_case_types, missing_docs, clippy::use_self)]

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};

/// A table slot ferroce leaves NULL: no signature is needed for a pointer never called.
pub type Unused = Option<unsafe extern "C" fn()>;

/// `IBV_SYSFS_NAME_MAX`.
pub const SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const SYSFS_PATH_MAX: usize = 256;

/// `struct _ibv_device_ops`: two compat slots no caller uses since rdma-core v13.
#[repr(C)]
pub struct ibv_device_ops {
    pub dummy1: Unused,
    pub dummy2: Unused,
}

/// `struct ibv_device`: what `ibv_get_device_list` hands out.
#[repr(C)]
pub struct ibv_device {
    pub ops: ibv_device_ops,
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; SYSFS_NAME_MAX],
    pub dev_name: [c_char; SYSFS_NAME_MAX],
    pub dev_path: [c_char; SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
}

/// `struct list_node` (ccan): two pointers.
#[repr(C)]
pub struct list_node {
    pub next: *mut list_node,
    pub prev: *mut list_node,
}

/// `struct verbs_device` (`driver.h`): every `ibv_device` of rdma-core sits at the start of
/// one. libmlx5's `mlx5dv_is_supported` and libefa's `is_efa_dev` compare `ops` with their
/// own table, so it must point somewhere that is neither: ferroce's [`verbs_device_ops`].
#[repr(C)]
pub struct verbs_device {
    pub device: ibv_device,
    pub ops: *const verbs_device_ops,
    pub refcount: c_int,
    pub entry: list_node,
    /// `struct verbs_sysfs_dev *`: NULL, the mark of a device no kernel driver backs.
    pub sysfs: *mut c_void,
    pub core_support: u64,
}

/// The head of `struct verbs_device_ops` (`driver.h`): a provider's name and the ABI range it
/// matches. Only its address and `name` are ever looked at for a ferroce device; the rest of
/// rdma-core's table (match table, alloc/uninit device, alloc/import context) stays NULL.
#[repr(C)]
pub struct verbs_device_ops {
    pub name: *const c_char,
    pub match_min_abi_version: c_int,
    pub match_max_abi_version: c_int,
    pub match_table: *const c_void,
    pub rest: [Unused; 5],
}

/// `ibv_context_ops.poll_cq`.
pub type PollCq = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ibv_context_ops.req_notify_cq`.
pub type ReqNotifyCq = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ibv_context_ops.post_send`: (queue pair, first request, where to put the one that failed).
pub type PostSend =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ibv_context_ops.post_recv`.
pub type PostRecv =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ibv_context_ops.post_srq_recv`.
pub type PostSrqRecv =
    unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// `struct ibv_context_ops`: the operations `verbs.h` calls inline, with no check that they
/// are set, so none may be NULL once the object they act on can exist. `alloc_mw` is checked
/// for NULL (`ibv_alloc_mw` then fails with `EOPNOTSUPP`), and so left NULL.
#[repr(C)]
pub struct ibv_context_ops {
    pub compat_query_device: Unused,
    pub compat_query_port: Unused,
    pub compat_alloc_pd: Unused,
    pub compat_dealloc_pd: Unused,
    pub compat_reg_mr: Unused,
    pub compat_rereg_mr: Unused,
    pub compat_dereg_mr: Unused,
    pub alloc_mw: Unused,
    pub bind_mw: Unused,
    pub dealloc_mw: Unused,
    pub compat_create_cq: Unused,
    pub poll_cq: Option<PollCq>,
    pub req_notify_cq: Option<ReqNotifyCq>,
    pub compat_cq_event: Unused,
    pub compat_resize_cq: Unused,
    pub compat_destroy_cq: Unused,
    pub compat_create_srq: Unused,
    pub compat_modify_srq: Unused,
    pub compat_query_srq: Unused,
    pub compat_destroy_srq: Unused,
    pub post_srq_recv: Option<PostSrqRecv>,
    pub compat_create_qp: Unused,
    pub compat_query_qp: Unused,
    pub compat_modify_qp: Unused,
    pub compat_destroy_qp: Unused,
    pub post_send: Option<PostSend>,
    pub post_recv: Option<PostRecv>,
    pub compat_create_ah: Unused,
    pub compat_destroy_ah: Unused,
    pub compat_attach_mcast: Unused,
    pub compat_detach_mcast: Unused,
    pub compat_async_event: Unused,
}

/// `__VERBS_ABI_IS_EXTENDED`: the `abi_compat` value that tells `verbs.h` a
/// [`verbs_context`] surrounds the `ibv_context`.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// `struct ibv_context`: what `ibv_open_device` returns, the last member of a
/// [`verbs_context`].
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    /// [`VERBS_ABI_IS_EXTENDED`].
    pub abi_compat: usize,
}

/// `verbs_context.query_port`: (context, port, attributes, the caller's `sizeof`).
pub type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut c_void, usize) -> c_int;

/// `struct verbs_context`: the extended operations, which grow downwards in memory from the
/// `ibv_context` at its end. `verbs.h` calls an operation only when `abi_compat` says the
/// context is extended, `sz` covers the slot and the slot is not NULL; otherwise it falls back
/// to the exported function (`query_port`, `query_device_ex`, `create_qp_ex` with only a PD,
/// `create_cq_ex` in UCX) or fails with `EOPNOTSUPP`. Stage 0 sets `query_port` only.
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPort>,
    pub advise_mr: Unused,
    pub alloc_null_mr: Unused,
    pub read_counters: Unused,
    pub attach_counters_point_flow: Unused,
    pub create_counters: Unused,
    pub destroy_counters: Unused,
    pub reg_dm_mr: Unused,
    pub alloc_dm: Unused,
    pub free_dm: Unused,
    pub modify_flow_action_esp: Unused,
    pub destroy_flow_action: Unused,
    pub create_flow_action_esp: Unused,
    pub modify_qp_rate_limit: Unused,
    pub alloc_parent_domain: Unused,
    pub dealloc_td: Unused,
    pub alloc_td: Unused,
    pub modify_cq: Unused,
    pub post_srq_ops: Unused,
    pub destroy_rwq_ind_table: Unused,
    pub create_rwq_ind_table: Unused,
    pub destroy_wq: Unused,
    pub modify_wq: Unused,
    pub create_wq: Unused,
    pub query_rt_values: Unused,
    pub create_cq_ex: Unused,
    /// `struct verbs_ex_private *`: rdma-core's own; NULL.
    pub priv_: *mut c_void,
    pub query_device_ex: Unused,
    pub ibv_destroy_flow: Unused,
    pub abi_placeholder2: Unused,
    pub ibv_create_flow: Unused,
    pub abi_placeholder1: Unused,
    pub open_qp: Unused,
    pub create_qp_ex: Unused,
    pub get_srq_num: Unused,
    pub create_srq_ex: Unused,
    pub open_xrcd: Unused,
    pub close_xrcd: Unused,
    pub abi_placeholder3: u64,
    /// `sizeof(struct verbs_context)`: every slot is present.
    pub sz: usize,
    pub context: ibv_context,
}

/// `union ibv_gid`: 16 bytes, 8-aligned (its other member is two `__be64`s).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_gid_entry` (rdma-core ≥ 32): what `_ibv_query_gid_ex` fills.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid_entry {
    pub gid: ibv_gid,
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_async_event`: `element` is a pointer (QP, CQ, SRQ, WQ) or, for port events,
/// the port number.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_uint,
}

/// `struct ibv_port_attr` of rdma-core v44 (52 bytes). rdma-core v50 appends
/// `active_speed_ex` (56 bytes): a caller whose size covers it gets it zeroed, which means
/// "see `active_speed`".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `sizeof(struct _compat_ibv_port_attr)`: what the exported `ibv_query_port` writes (the
/// fields up to `flags`, padded), for programs built before `verbs.h` called the extended
/// operation.
pub const COMPAT_PORT_ATTR_SIZE: usize = 48;

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    /// `__be64`.
    pub node_guid: u64,
    /// `__be64`.
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_uint,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

// enum ibv_node_type
pub const IBV_NODE_CA: c_int = 1;
// enum ibv_transport_type
pub const IBV_TRANSPORT_IB: c_int = 0;

// enum ibv_port_state
pub const IBV_PORT_ACTIVE: c_uint = 4;
/// `phys_state` 5: LinkUp (IBTA; rxe reports it too).
pub const PHYS_STATE_LINK_UP: u8 = 5;
// enum ibv_mtu: IBV_MTU_256 = 1 … IBV_MTU_4096 = 5
pub const IBV_MTU_4096: c_uint = 5;
// link layers
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
// enum ibv_port_cap_flags
pub const IBV_PORT_CM_SUP: u32 = 1 << 16;
pub const IBV_PORT_IP_BASED_GIDS: u32 = 1 << 26;
/// `IBV_QPF_GRH_REQUIRED` in `ibv_port_attr.flags`: every RoCE address carries a GRH.
pub const IBV_QPF_GRH_REQUIRED: u8 = 1;
/// `IBV_WIDTH_1X`.
pub const IBV_WIDTH_1X: u8 = 1;
/// `IBV_SPEED_EDR`: 25 Gb/s a lane.
pub const IBV_SPEED_EDR: u8 = 32;

// enum ibv_device_cap_flags
pub const IBV_DEVICE_SYS_IMAGE_GUID: c_uint = 1 << 11;
pub const IBV_DEVICE_RC_RNR_NAK_GEN: c_uint = 1 << 12;
// enum ibv_atomic_cap
pub const IBV_ATOMIC_HCA: c_uint = 1;

// enum ibv_gid_type (struct ibv_gid_entry)
pub const IBV_GID_TYPE_IB: u32 = 0;
pub const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
// enum ibv_gid_type_sysfs (driver.h; ibv_query_gid_type)
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;

// enum ibv_fork_status
pub const IBV_FORK_UNNEEDED: c_int = 2;

// enum ibv_rereg_mr_err_code
pub const IBV_REREG_MR_ERR_CMD: c_int = -4;

impl Default for ibv_async_event {
    fn default() -> Self {
        Self {
            element: std::ptr::null_mut(),
            event_type: 0,
        }
    }
}

impl Default for ibv_device_attr {
    fn default() -> Self {
        // Every field is an integer: all zeros is a valid value.
        Self {
            fw_ver: [0; 64],
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: 0,
            page_size_cap: 0,
            vendor_id: 0,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0,
            max_qp_wr: 0,
            device_cap_flags: 0,
            max_sge: 0,
            max_sge_rd: 0,
            max_cq: 0,
            max_cqe: 0,
            max_mr: 0,
            max_pd: 0,
            max_qp_rd_atom: 0,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 0,
            max_qp_init_rd_atom: 0,
            max_ee_init_rd_atom: 0,
            atomic_cap: 0,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 0,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 0,
            max_mcast_qp_attach: 0,
            max_total_mcast_qp_attach: 0,
            max_ah: 0,
            max_fmr: 0,
            max_map_per_fmr: 0,
            max_srq: 0,
            max_srq_wr: 0,
            max_srq_sge: 0,
            max_pkeys: 0,
            local_ca_ack_delay: 0,
            phys_port_cnt: 0,
        }
    }
}

// enum ibv_event_type: the events ferroce's verbs backend acts on.
pub const IBV_EVENT_CQ_ERR: c_uint = 0;
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
pub const IBV_EVENT_QP_REQ_ERR: c_uint = 2;
pub const IBV_EVENT_QP_ACCESS_ERR: c_uint = 3;
pub const IBV_EVENT_DEVICE_FATAL: c_uint = 8;
pub const IBV_EVENT_PORT_ERR: c_uint = 10;
pub const IBV_EVENT_GID_CHANGE: c_uint = 18;

// rdma-core x86_64 and aarch64 layouts; the numbers are what `sizeof`/`offsetof` print in a C
// program built against Debian 12's `infiniband/verbs.h` on x86_64.
#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(size_of::<ibv_device>() == 664);
    assert!(offset_of!(ibv_device, node_type) == 16);
    assert!(offset_of!(ibv_device, name) == 24);
    assert!(offset_of!(ibv_device, dev_name) == 88);
    assert!(offset_of!(ibv_device, dev_path) == 152);
    assert!(offset_of!(ibv_device, ibdev_path) == 408);
    assert!(offset_of!(verbs_device, ops) == 664);
    assert!(size_of::<verbs_device>() == 712);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(offset_of!(ibv_context_ops, alloc_mw) == 56);
    assert!(offset_of!(ibv_context_ops, poll_cq) == 88);
    assert!(offset_of!(ibv_context_ops, req_notify_cq) == 96);
    assert!(offset_of!(ibv_context_ops, post_srq_recv) == 160);
    assert!(offset_of!(ibv_context_ops, post_send) == 200);
    assert!(offset_of!(ibv_context_ops, post_recv) == 208);
    assert!(size_of::<ibv_context>() == 328);
    assert!(offset_of!(ibv_context, ops) == 8);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, async_fd) == 268);
    assert!(offset_of!(ibv_context, num_comp_vectors) == 272);
    assert!(offset_of!(ibv_context, mutex) == 280);
    assert!(offset_of!(ibv_context, abi_compat) == 320);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, create_cq_ex) == 200);
    assert!(offset_of!(verbs_context, priv_) == 208);
    assert!(offset_of!(verbs_context, query_device_ex) == 216);
    assert!(offset_of!(verbs_context, create_qp_ex) == 264);
    assert!(offset_of!(verbs_context, close_xrcd) == 296);
    assert!(offset_of!(verbs_context, sz) == 312);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(offset_of!(ibv_port_attr, flags) == 47);
    assert!(offset_of!(ibv_port_attr, port_cap_flags2) == 48);
    assert!(COMPAT_PORT_ATTR_SIZE == offset_of!(ibv_port_attr, port_cap_flags2));
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, max_qp_wr) == 112);
    assert!(offset_of!(ibv_device_attr, max_cqe) == 132);
    assert!(offset_of!(ibv_device_attr, phys_port_cnt) == 227);
    assert!(size_of::<ibv_pd>() == 16);
    assert!(size_of::<ibv_gid>() == 16);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(offset_of!(ibv_async_event, event_type) == 8);
};

// ---- The data path (stage 1): memory regions, completion channels and queues, queue pairs,
// shared receive queues, address handles, work requests and completions.

/// `pthread_mutex_t` and `pthread_cond_t` as rdma-core embeds them in CQs, QPs and SRQs
/// (initialised, never used by this library: rdma-core's own `ibv_ack_cq_events` and the
/// destroy functions use them, and this library replaces both).
pub type PthreadCond = libc::pthread_cond_t;

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub cond: PthreadCond,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: libc::pthread_mutex_t,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: libc::pthread_mutex_t,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr`, whole (128 bytes): programs hand it in by pointer, and the verbs
/// backend builds arrays of them. The `wr` union is read as its largest member's four words:
/// `rdma` {remote_addr, rkey}, `atomic` {remote_addr, compare_add, swap, rkey}, `ud` {ah,
/// remote_qpn, remote_qkey}; `tail` is the `qp_type` (XRC) and `bind_mw`/`tso` unions, which
/// nothing here reads and stay zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    /// `imm_data` (`__be32`, the bytes of `u32::to_be`) or `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: [u64; 4],
    pub tail: [u64; 7],
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
            opcode: 0,
            send_flags: 0,
            imm_data: 0,
            wr: [0; 4],
            tail: [0; 7],
        }
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (`__be32`, in memory order) or `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

// enum ibv_access_flags
pub const IBV_ACCESS_LOCAL_WRITE: c_uint = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_uint = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_uint = 1 << 2;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_uint = 1 << 3;
pub const IBV_ACCESS_RELAXED_ORDERING: c_uint = 1 << 20;

// enum ibv_qp_type
pub const IBV_QPT_RC: c_uint = 2;
pub const IBV_QPT_UC: c_uint = 3;
pub const IBV_QPT_UD: c_uint = 4;

// enum ibv_qp_state
pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_SQD: c_uint = 4;
pub const IBV_QPS_ERR: c_uint = 6;

// enum ibv_qp_attr_mask
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_wr_opcode
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub const IBV_WR_SEND: c_uint = 2;
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;

// enum ibv_send_flags
pub const IBV_SEND_FENCE: c_uint = 1;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub const IBV_SEND_INLINE: c_uint = 1 << 3;

// enum ibv_wc_opcode
pub const IBV_WC_SEND: c_uint = 0;
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
pub const IBV_WC_RDMA_READ: c_uint = 2;
pub const IBV_WC_COMP_SWAP: c_uint = 3;
pub const IBV_WC_FETCH_ADD: c_uint = 4;
pub const IBV_WC_RECV: c_uint = 1 << 7;
pub const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = (1 << 7) + 1;

// enum ibv_wc_flags
pub const IBV_WC_GRH: c_uint = 1;
pub const IBV_WC_WITH_IMM: c_uint = 1 << 1;

// enum ibv_srq_attr_mask
pub const IBV_SRQ_MAX_WR: c_int = 1;
pub const IBV_SRQ_LIMIT: c_int = 1 << 1;

#[cfg(target_arch = "x86_64")]
const _: () = {
    assert!(size_of::<ibv_mr>() == 48);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(size_of::<ibv_cq>() == 128);
    assert!(offset_of!(ibv_cq, mutex) == 32);
    assert!(offset_of!(ibv_cq, cond) == 72);
    assert!(offset_of!(ibv_cq, comp_events_completed) == 120);
    assert!(size_of::<ibv_srq>() == 128);
    assert!(offset_of!(ibv_srq, events_completed) == 120);
    assert!(size_of::<ibv_srq_attr>() == 12);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(offset_of!(ibv_qp, handle) == 48);
    assert!(offset_of!(ibv_qp, state) == 56);
    assert!(offset_of!(ibv_qp, mutex) == 64);
    assert!(offset_of!(ibv_qp, cond) == 104);
    assert!(offset_of!(ibv_qp, events_completed) == 152);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(offset_of!(ibv_qp_init_attr, cap) == 32);
    assert!(offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(offset_of!(ibv_qp_init_attr, sq_sig_all) == 56);
    assert!(size_of::<ibv_global_route>() == 24);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(offset_of!(ibv_ah_attr, dlid) == 24);
    assert!(offset_of!(ibv_ah_attr, is_global) == 29);
    assert!(offset_of!(ibv_ah_attr, port_num) == 30);
    // rdma-core's is 144: 4 bytes of tail padding after `rate_limit` that nobody reads
    // (the struct has a `__be64`-aligned member in `ah_attr.grh.dgid`). Ours is 8-aligned too.
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, qp_access_flags) == 32);
    assert!(offset_of!(ibv_qp_attr, cap) == 36);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, alt_ah_attr) == 88);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, max_rd_atomic) == 126);
    assert!(offset_of!(ibv_qp_attr, min_rnr_timer) == 128);
    assert!(offset_of!(ibv_qp_attr, port_num) == 129);
    assert!(offset_of!(ibv_qp_attr, timeout) == 130);
    assert!(offset_of!(ibv_qp_attr, rnr_retry) == 132);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_ah>() == 24);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(offset_of!(ibv_send_wr, num_sge) == 24);
    assert!(offset_of!(ibv_send_wr, opcode) == 28);
    assert!(offset_of!(ibv_send_wr, send_flags) == 32);
    assert!(offset_of!(ibv_send_wr, imm_data) == 36);
    assert!(offset_of!(ibv_send_wr, wr) == 40);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, imm_data) == 24);
    assert!(offset_of!(ibv_wc, qp_num) == 28);
    assert!(offset_of!(ibv_wc, wc_flags) == 36);
    assert!(offset_of!(ibv_wc, pkey_index) == 40);
    assert!(offset_of!(ibv_wc, sl) == 44);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers of the compile-time checks, again at run time so that a failure names
    /// the field.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn layouts_match_rdma_core_44_on_x86_64() {
        let checks = [
            ("sizeof(ibv_device)", size_of::<ibv_device>(), 664),
            ("sizeof(verbs_device)", size_of::<verbs_device>(), 712),
            ("verbs_device.ops", offset_of!(verbs_device, ops), 664),
            ("sizeof(ibv_context)", size_of::<ibv_context>(), 328),
            (
                "ibv_context.async_fd",
                offset_of!(ibv_context, async_fd),
                268,
            ),
            (
                "ibv_context.abi_compat",
                offset_of!(ibv_context, abi_compat),
                320,
            ),
            ("sizeof(verbs_context)", size_of::<verbs_context>(), 648),
            ("verbs_context.sz", offset_of!(verbs_context, sz), 312),
            (
                "verbs_context.context",
                offset_of!(verbs_context, context),
                320,
            ),
            (
                "ibv_context_ops.post_send",
                offset_of!(ibv_context_ops, post_send),
                200,
            ),
            ("sizeof(ibv_port_attr)", size_of::<ibv_port_attr>(), 52),
            (
                "ibv_port_attr.link_layer",
                offset_of!(ibv_port_attr, link_layer),
                46,
            ),
            ("sizeof(ibv_device_attr)", size_of::<ibv_device_attr>(), 232),
            (
                "ibv_device_attr.phys_port_cnt",
                offset_of!(ibv_device_attr, phys_port_cnt),
                227,
            ),
            ("sizeof(ibv_gid_entry)", size_of::<ibv_gid_entry>(), 32),
            ("sizeof(ibv_async_event)", size_of::<ibv_async_event>(), 16),
        ];
        for (what, got, want) in checks {
            assert_eq!(got, want, "{what}");
        }
    }

    /// `verbs.h`'s `verbs_get_ctx_op(ctx, query_port)` accepts the context only when `sz`
    /// reaches back to the slot: with every slot present it reaches all of them.
    #[test]
    fn sz_covers_every_extended_operation() {
        let sz = size_of::<verbs_context>();
        assert!(sz >= size_of::<verbs_context>() - offset_of!(verbs_context, query_port));
        assert_eq!(
            offset_of!(verbs_context, context) + size_of::<ibv_context>(),
            sz,
            "the ibv_context is the last member"
        );
    }

    /// The numbers of verbs.md §1.2, checked again at run time so a failure names the field.
    #[test]
    fn what_the_verbs_backend_passes_matches_rdma_core_44_on_x86_64() {
        let sizes = [
            ("ibv_wc", size_of::<ibv_wc>(), 48),
            ("ibv_send_wr", size_of::<ibv_send_wr>(), 128),
            ("ibv_recv_wr", size_of::<ibv_recv_wr>(), 32),
            ("ibv_sge", size_of::<ibv_sge>(), 16),
            ("ibv_qp_attr", size_of::<ibv_qp_attr>(), 144),
            ("ibv_ah_attr", size_of::<ibv_ah_attr>(), 32),
            ("ibv_global_route", size_of::<ibv_global_route>(), 24),
            ("ibv_qp_init_attr", size_of::<ibv_qp_init_attr>(), 64),
            ("ibv_gid_entry", size_of::<ibv_gid_entry>(), 32),
            ("ibv_async_event", size_of::<ibv_async_event>(), 16),
            ("ibv_device_attr", size_of::<ibv_device_attr>(), 232),
        ];
        for (name, got, want) in sizes {
            assert_eq!(got, want, "sizeof({name})");
        }
        let offsets = [
            ("ibv_wc.imm_data", offset_of!(ibv_wc, imm_data), 24),
            ("ibv_wc.qp_num", offset_of!(ibv_wc, qp_num), 28),
            ("ibv_send_wr.wr", offset_of!(ibv_send_wr, wr), 40),
            ("ibv_qp_attr.ah_attr", offset_of!(ibv_qp_attr, ah_attr), 56),
            ("ibv_context.cmd_fd", offset_of!(ibv_context, cmd_fd), 264),
            (
                "ibv_context.async_fd",
                offset_of!(ibv_context, async_fd),
                268,
            ),
            ("ibv_qp.qp_num", offset_of!(ibv_qp, qp_num), 52),
            ("ibv_mr.lkey", offset_of!(ibv_mr, lkey), 36),
            ("ibv_mr.rkey", offset_of!(ibv_mr, rkey), 40),
            ("ibv_comp_channel.fd", offset_of!(ibv_comp_channel, fd), 8),
            ("ibv_cq.cqe", offset_of!(ibv_cq, cqe), 28),
            (
                "ibv_port_attr.link_layer",
                offset_of!(ibv_port_attr, link_layer),
                46,
            ),
        ];
        for (name, got, want) in offsets {
            assert_eq!(got, want, "offsetof({name})");
        }
        let ops = offset_of!(ibv_context, ops);
        assert_eq!(ops + offset_of!(ibv_context_ops, poll_cq), 96);
        assert_eq!(ops + offset_of!(ibv_context_ops, req_notify_cq), 104);
        assert_eq!(ops + offset_of!(ibv_context_ops, post_send), 208);
        assert_eq!(ops + offset_of!(ibv_context_ops, post_recv), 216);
    }
}
