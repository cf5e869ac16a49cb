//! The C layouts and constants of libibverbs that ferroce passes across the boundary, written
//! by hand from `infiniband/verbs.h` (rdma-core v25 through v44 and HEAD have them
//! byte-identical on x86_64; `../shared/reference/verbs.md` §1.2). Structures the library
//! allocates (`ibv_context`, `ibv_qp`, `ibv_cq`, `ibv_mr`, `ibv_comp_channel`) are declared
//! only as far as the fields ferroce reads, so no `pthread_mutex_t` is ever declared; the ones
//! ferroce allocates or passes in arrays are declared whole. Every size and offset is checked
//! at compile time below and again by a unit test.

#![allow(non_camel_case_types, missing_docs, clippy::use_self)]

use std::ffi::{c_int, c_uint, c_void};
use std::mem::{align_of, offset_of, size_of};

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_sge {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
}

/// `struct ibv_send_wr`. The `wr` union is four words: `rdma` is `{remote_addr, rkey}` in
/// words 0 and 1; `atomic` is `{remote_addr, compare_add, swap, rkey}` in words 0 to 3.
/// The `qp_type` and `bind_mw`/`tso` unions after it are never used and stay zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_send_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_send_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
    pub(crate) opcode: c_uint,
    pub(crate) send_flags: c_uint,
    /// Big-endian on the wire: the bytes of `u32::to_be`.
    pub(crate) imm_data: u32,
    pub(crate) wr: [u64; 4],
    pub(crate) tail: [u64; 7],
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
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_recv_wr {
    pub(crate) wr_id: u64,
    pub(crate) next: *mut ibv_recv_wr,
    pub(crate) sg_list: *mut ibv_sge,
    pub(crate) num_sge: c_int,
}

impl Default for ibv_recv_wr {
    fn default() -> Self {
        Self {
            wr_id: 0,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        }
    }
}

/// `struct ibv_wc`: the array stride of `poll_cq`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_wc {
    pub(crate) wr_id: u64,
    pub(crate) status: c_uint,
    pub(crate) opcode: c_uint,
    pub(crate) vendor_err: u32,
    pub(crate) byte_len: u32,
    /// Big-endian, as `imm_data` in the send request.
    pub(crate) imm_data: u32,
    pub(crate) qp_num: u32,
    pub(crate) src_qp: u32,
    pub(crate) wc_flags: c_uint,
    pub(crate) pkey_index: u16,
    pub(crate) slid: u16,
    pub(crate) sl: u8,
    pub(crate) dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_qp_cap {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_qp_init_attr {
    pub(crate) qp_context: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) qp_type: c_uint,
    pub(crate) sq_sig_all: c_int,
}

/// `union ibv_gid`: 16 bytes, 8-aligned (its other member is two `__be64`s), which makes
/// `ibv_qp_attr` 144 bytes rather than 140.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ibv_gid {
    pub(crate) raw: [u8; 16],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_global_route {
    pub(crate) dgid: ibv_gid,
    pub(crate) flow_label: u32,
    pub(crate) sgid_index: u8,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_ah_attr {
    pub(crate) grh: ibv_global_route,
    pub(crate) dlid: u16,
    pub(crate) sl: u8,
    pub(crate) src_path_bits: u8,
    pub(crate) static_rate: u8,
    pub(crate) is_global: u8,
    pub(crate) port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_qp_attr {
    pub(crate) qp_state: c_uint,
    pub(crate) cur_qp_state: c_uint,
    pub(crate) path_mtu: c_uint,
    pub(crate) path_mig_state: c_uint,
    pub(crate) qkey: u32,
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) dest_qp_num: u32,
    pub(crate) qp_access_flags: c_uint,
    pub(crate) cap: ibv_qp_cap,
    pub(crate) ah_attr: ibv_ah_attr,
    pub(crate) alt_ah_attr: ibv_ah_attr,
    pub(crate) pkey_index: u16,
    pub(crate) alt_pkey_index: u16,
    pub(crate) en_sqd_async_notify: u8,
    pub(crate) sq_draining: u8,
    pub(crate) max_rd_atomic: u8,
    pub(crate) max_dest_rd_atomic: u8,
    pub(crate) min_rnr_timer: u8,
    pub(crate) port_num: u8,
    pub(crate) timeout: u8,
    pub(crate) retry_cnt: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) alt_port_num: u8,
    pub(crate) alt_timeout: u8,
    pub(crate) rate_limit: u32,
}

/// `struct ibv_port_attr` as rdma-core 44 has it (52 bytes), with room after it: HEAD appends
/// `active_speed_ex`, and the compat `ibv_query_port` export fills only the old prefix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_port_attr {
    pub(crate) state: c_uint,
    pub(crate) max_mtu: c_uint,
    pub(crate) active_mtu: c_uint,
    pub(crate) gid_tbl_len: c_int,
    pub(crate) port_cap_flags: u32,
    pub(crate) max_msg_sz: u32,
    pub(crate) bad_pkey_cntr: u32,
    pub(crate) qkey_viol_cntr: u32,
    pub(crate) pkey_tbl_len: u16,
    pub(crate) lid: u16,
    pub(crate) sm_lid: u16,
    pub(crate) lmc: u8,
    pub(crate) max_vl_num: u8,
    pub(crate) sm_sl: u8,
    pub(crate) subnet_timeout: u8,
    pub(crate) init_type_reply: u8,
    pub(crate) active_width: u8,
    pub(crate) active_speed: u8,
    pub(crate) phys_state: u8,
    pub(crate) link_layer: u8,
    pub(crate) flags: u8,
    pub(crate) port_cap_flags2: u16,
    pub(crate) spare: [u32; 8],
}

/// `struct ibv_gid_entry` (rdma-core ≥ 32).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ibv_gid_entry {
    pub(crate) gid: ibv_gid,
    pub(crate) gid_index: u32,
    pub(crate) port_num: u32,
    pub(crate) gid_type: u32,
    pub(crate) ndev_ifindex: u32,
}

/// `struct ibv_async_event`: `element` is a pointer (QP, CQ, SRQ) or, for port events, the
/// port number in its low 32 bits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_async_event {
    pub(crate) element: *mut c_void,
    pub(crate) event_type: c_uint,
}

impl Default for ibv_async_event {
    fn default() -> Self {
        Self {
            element: std::ptr::null_mut(),
            event_type: 0,
        }
    }
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct ibv_device_attr {
    pub(crate) fw_ver: [u8; 64],
    pub(crate) node_guid: u64,
    pub(crate) sys_image_guid: u64,
    pub(crate) max_mr_size: u64,
    pub(crate) page_size_cap: u64,
    pub(crate) vendor_id: u32,
    pub(crate) vendor_part_id: u32,
    pub(crate) hw_ver: u32,
    pub(crate) max_qp: c_int,
    pub(crate) max_qp_wr: c_int,
    pub(crate) device_cap_flags: c_uint,
    pub(crate) max_sge: c_int,
    pub(crate) max_sge_rd: c_int,
    pub(crate) max_cq: c_int,
    pub(crate) max_cqe: c_int,
    pub(crate) max_mr: c_int,
    pub(crate) max_pd: c_int,
    pub(crate) max_qp_rd_atom: c_int,
    pub(crate) max_ee_rd_atom: c_int,
    pub(crate) max_res_rd_atom: c_int,
    pub(crate) max_qp_init_rd_atom: c_int,
    pub(crate) max_ee_init_rd_atom: c_int,
    pub(crate) atomic_cap: c_uint,
    pub(crate) max_ee: c_int,
    pub(crate) max_rdd: c_int,
    pub(crate) max_mw: c_int,
    pub(crate) max_raw_ipv6_qp: c_int,
    pub(crate) max_raw_ethy_qp: c_int,
    pub(crate) max_mcast_grp: c_int,
    pub(crate) max_mcast_qp_attach: c_int,
    pub(crate) max_total_mcast_qp_attach: c_int,
    pub(crate) max_ah: c_int,
    pub(crate) max_fmr: c_int,
    pub(crate) max_map_per_fmr: c_int,
    pub(crate) max_srq: c_int,
    pub(crate) max_srq_wr: c_int,
    pub(crate) max_srq_sge: c_int,
    pub(crate) max_pkeys: u16,
    pub(crate) local_ca_ack_delay: u8,
    pub(crate) phys_port_cnt: u8,
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

/// The four hot-path operations of `struct ibv_context_ops` that `verbs.h` calls from inline
/// functions; the other 28 slots are never read.
#[repr(C)]
pub(crate) struct ibv_context_ops {
    pub(crate) before_poll: [usize; 11],
    pub(crate) poll_cq: Option<PollCq>,
    pub(crate) req_notify_cq: Option<ReqNotifyCq>,
    pub(crate) between: [usize; 12],
    pub(crate) post_send: Option<PostSend>,
    pub(crate) post_recv: Option<PostRecv>,
    pub(crate) after: [usize; 5],
}

/// `ops.poll_cq`.
pub(crate) type PollCq = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ops.req_notify_cq`.
pub(crate) type ReqNotifyCq = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ops.post_send`.
pub(crate) type PostSend =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ops.post_recv`.
pub(crate) type PostRecv =
    unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;

/// The prefix of `struct ibv_context` up to `async_fd`.
#[repr(C)]
pub(crate) struct ibv_context {
    pub(crate) device: *mut c_void,
    pub(crate) ops: ibv_context_ops,
    pub(crate) cmd_fd: c_int,
    pub(crate) async_fd: c_int,
    pub(crate) num_comp_vectors: c_int,
}

/// The prefix of `struct ibv_qp` up to `qp_num`.
#[repr(C)]
pub(crate) struct ibv_qp {
    pub(crate) context: *mut ibv_context,
    pub(crate) qp_context: *mut c_void,
    pub(crate) pd: *mut c_void,
    pub(crate) send_cq: *mut ibv_cq,
    pub(crate) recv_cq: *mut ibv_cq,
    pub(crate) srq: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) qp_num: u32,
}

/// The prefix of `struct ibv_cq` up to `cqe`.
#[repr(C)]
pub(crate) struct ibv_cq {
    pub(crate) context: *mut ibv_context,
    pub(crate) channel: *mut ibv_comp_channel,
    pub(crate) cq_context: *mut c_void,
    pub(crate) handle: u32,
    pub(crate) cqe: c_int,
}

/// The prefix of `struct ibv_mr` up to `rkey`.
#[repr(C)]
pub(crate) struct ibv_mr {
    pub(crate) context: *mut ibv_context,
    pub(crate) pd: *mut c_void,
    pub(crate) addr: *mut c_void,
    pub(crate) length: usize,
    pub(crate) handle: u32,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
}

/// The prefix of `struct ibv_comp_channel` up to `fd`.
#[repr(C)]
pub(crate) struct ibv_comp_channel {
    pub(crate) context: *mut ibv_context,
    pub(crate) fd: c_int,
}

// enum ibv_qp_type
pub(crate) const IBV_QPT_RC: c_uint = 2;
pub(crate) const IBV_QPT_UC: c_uint = 3;

// enum ibv_qp_state
pub(crate) const IBV_QPS_RESET: c_uint = 0;
pub(crate) const IBV_QPS_INIT: c_uint = 1;
pub(crate) const IBV_QPS_RTR: c_uint = 2;
pub(crate) const IBV_QPS_RTS: c_uint = 3;
pub(crate) const IBV_QPS_SQD: c_uint = 4;
pub(crate) const IBV_QPS_ERR: c_uint = 6;

// enum ibv_qp_attr_mask
pub(crate) const IBV_QP_STATE: c_int = 1;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_QKEY: c_int = 1 << 6;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

// enum ibv_access_flags
pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub(crate) const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;
pub(crate) const IBV_ACCESS_RELAXED_ORDERING: c_int = 1 << 20;

// enum ibv_wr_opcode
pub(crate) const IBV_WR_RDMA_WRITE: c_uint = 0;
pub(crate) const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
pub(crate) const IBV_WR_SEND: c_uint = 2;
pub(crate) const IBV_WR_SEND_WITH_IMM: c_uint = 3;
pub(crate) const IBV_WR_RDMA_READ: c_uint = 4;
pub(crate) const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
pub(crate) const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;

// enum ibv_send_flags
pub(crate) const IBV_SEND_FENCE: c_uint = 1;
pub(crate) const IBV_SEND_SIGNALED: c_uint = 1 << 1;
pub(crate) const IBV_SEND_SOLICITED: c_uint = 1 << 2;
pub(crate) const IBV_SEND_INLINE: c_uint = 1 << 3;

// enum ibv_wc_opcode
pub(crate) const IBV_WC_SEND: c_uint = 0;
pub(crate) const IBV_WC_RDMA_WRITE: c_uint = 1;
pub(crate) const IBV_WC_RDMA_READ: c_uint = 2;
pub(crate) const IBV_WC_COMP_SWAP: c_uint = 3;
pub(crate) const IBV_WC_FETCH_ADD: c_uint = 4;
pub(crate) const IBV_WC_RECV: c_uint = 128;
pub(crate) const IBV_WC_RECV_RDMA_WITH_IMM: c_uint = 129;

// enum ibv_wc_flags
pub(crate) const IBV_WC_WITH_IMM: c_uint = 1 << 1;

// enum ibv_port_state
pub(crate) const IBV_PORT_ACTIVE: c_uint = 4;

// link layers
pub(crate) const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// enum ibv_gid_type (of struct ibv_gid_entry)
pub(crate) const IBV_GID_TYPE_IB: u32 = 0;
pub(crate) const IBV_GID_TYPE_ROCE_V1: u32 = 1;
pub(crate) const IBV_GID_TYPE_ROCE_V2: u32 = 2;

// enum ibv_event_type
pub(crate) const IBV_EVENT_CQ_ERR: c_uint = 0;
pub(crate) const IBV_EVENT_QP_FATAL: c_uint = 1;
pub(crate) const IBV_EVENT_QP_REQ_ERR: c_uint = 2;
pub(crate) const IBV_EVENT_QP_ACCESS_ERR: c_uint = 3;
pub(crate) const IBV_EVENT_DEVICE_FATAL: c_uint = 8;
pub(crate) const IBV_EVENT_PORT_ERR: c_uint = 10;
pub(crate) const IBV_EVENT_GID_CHANGE: c_uint = 18;

// enum ibv_fork_status
pub(crate) const IBV_FORK_UNNEEDED: c_int = 2;

// ferroce's region and QP rights are handed to libibverbs as they are: their bits must be
// `IBV_ACCESS_*`'s.
const _: () = {
    use ferroce_proto::memory::Access;
    assert!(Access::LOCAL_WRITE.ibv_bits() as c_int == IBV_ACCESS_LOCAL_WRITE);
    assert!(Access::REMOTE_WRITE.ibv_bits() as c_int == IBV_ACCESS_REMOTE_WRITE);
    assert!(Access::REMOTE_READ.ibv_bits() as c_int == IBV_ACCESS_REMOTE_READ);
    assert!(Access::REMOTE_ATOMIC.ibv_bits() as c_int == IBV_ACCESS_REMOTE_ATOMIC);
};

const _: () = {
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, wr) == 40);
    assert!(offset_of!(ibv_send_wr, imm_data) == 36);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, imm_data) == 24);
    assert!(offset_of!(ibv_wc, qp_num) == 28);
    assert!(offset_of!(ibv_wc, wc_flags) == 36);
    assert!(size_of::<ibv_qp_cap>() == 20);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(size_of::<ibv_gid>() == 16);
    assert!(align_of::<ibv_gid>() == 8);
    assert!(size_of::<ibv_global_route>() == 24);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, max_rd_atomic) == 126);
    assert!(offset_of!(ibv_qp_attr, port_num) == 129);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(offset_of!(ibv_port_attr, port_cap_flags2) == 48);
    assert!(offset_of!(ibv_port_attr, spare) == 52);
    assert!(size_of::<ibv_gid_entry>() == 32);
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, max_qp_wr) == 112);
    assert!(offset_of!(ibv_device_attr, max_cqe) == 132);
    assert!(offset_of!(ibv_device_attr, phys_port_cnt) == 227);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(offset_of!(ibv_context, ops) == 8);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 8 + 88);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 8 + 96);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 8 + 200);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 8 + 208);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, async_fd) == 268);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_cq, cqe) == 28);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(offset_of!(ibv_mr, rkey) == 40);
    assert!(offset_of!(ibv_comp_channel, fd) == 8);
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The numbers of verbs.md §1.2, checked again at run time so a failure names the field.
    #[test]
    fn layouts_match_rdma_core_44_on_x86_64() {
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
