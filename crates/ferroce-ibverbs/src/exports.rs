//! The exported symbol table: every function and datum rdma-core v44's `libibverbs.so.1`
//! exports, under the same name and version node (`libibverbs.map`), bound to the entry
//! point that answers it. Debian's tools and its libmlx5, libefa and librdmacm are linked
//! BIND_NOW against those versions, so each must resolve at load even where ferroce only
//! fails the call (`crate::entry::stubs`).
//!
//! Each export is a small assembly trampoline (a jump to the Rust function) with a `.symver`
//! directive naming its version: rustc links a cdylib with its own anonymous version script
//! that lists its `#[no_mangle]` functions, which would leave them unversioned. The
//! trampolines' own names (`ferroce.<name>.<node>`) stay local (`local: *`), and the Rust
//! functions are not exported at all. A `compat` row is a non-default definition
//! (`name@NODE`, rdma-core's pre-2006 layouts, which nothing linked since binds), a
//! `default` row the one programs link to (`name@@NODE`).
//!
//! The unit test build (an executable with no version script) leaves the table out.

#![allow(unsafe_code)]

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("the drop-in libibverbs has trampolines for x86_64 and aarch64 only");

/// One exported symbol.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Export {
    /// rdma-core's name.
    pub(crate) name: &'static str,
    /// Its version node.
    pub(crate) node: &'static str,
    /// `name@@node` (the default, what programs bind) rather than `name@node`.
    pub(crate) default: bool,
}

/// The jump from a trampoline to its Rust function.
#[cfg(all(target_arch = "x86_64", not(test)))]
macro_rules! jump {
    () => {
        "jmp {f}@PLT"
    };
}
/// The jump from a trampoline to its Rust function.
#[cfg(all(target_arch = "aarch64", not(test)))]
macro_rules! jump {
    () => {
        "b {f}"
    };
}

/// `@@` for a default definition, `@` for a compat one.
#[cfg(not(test))]
macro_rules! at {
    (default) => {
        "@@"
    };
    (compat) => {
        "@"
    };
}

/// The trampoline for one export.
macro_rules! trampoline {
    ($kind:ident $name:literal $node:literal => $f:path) => {
        // SAFETY: the trampoline only jumps to `$f`, an `extern "C"` function whose
        // signature is the one rdma-core gives `$name` (or, for the stubs, one that reads no
        // arguments), so the caller's registers and stack reach it unchanged.
        #[cfg(not(test))]
        core::arch::global_asm!(
            ".pushsection .text.ferroce_exports,\"ax\",%progbits",
            concat!(".globl ferroce.", $name, ".", $node),
            concat!(".type ferroce.", $name, ".", $node, ",%function"),
            ".p2align 4",
            concat!("ferroce.", $name, ".", $node, ":"),
            jump!(),
            concat!(".size ferroce.", $name, ".", $node, ", . - ferroce.", $name, ".", $node),
            concat!(".symver ferroce.", $name, ".", $node, ", ", $name, at!($kind), $node),
            ".popsection",
            f = sym $f,
        );
        // The test build has no trampolines; this keeps `$f` referenced there too.
        #[cfg(test)]
        const _: () = {
            let _ = $f;
        };
    };
}

/// The table: a trampoline per row, and [`EXPORTS`] listing them for the tests.
macro_rules! exports {
    ($( $kind:ident $name:literal $node:literal => $f:path; )*) => {
        $( trampoline!($kind $name $node => $f); )*

        /// Every exported function, as `libibverbs.map` must list it.
        #[cfg_attr(not(test), allow(dead_code))]
        pub(crate) const EXPORTS: &[Export] = &[
            $( Export { name: $name, node: $node, default: matches!(stringify!($kind).as_bytes(), b"default") }, )*
        ];
    };
}

use crate::entry::{ah, cm, cq, device, misc, mr, qp, srq, stubs};

exports! {
    // IBVERBS_1.0
    default "ibv_copy_path_rec_from_kern" "IBVERBS_1.0" => stubs::ignore;
    default "ibv_copy_path_rec_to_kern" "IBVERBS_1.0" => stubs::ignore;
    default "ibv_copy_qp_attr_from_kern" "IBVERBS_1.0" => stubs::ignore;
    default "ibv_create_comp_channel" "IBVERBS_1.0" => cq::create_comp_channel;
    default "ibv_destroy_comp_channel" "IBVERBS_1.0" => cq::destroy_comp_channel;
    default "ibv_get_sysfs_path" "IBVERBS_1.0" => misc::get_sysfs_path;
    default "ibv_rate_to_mult" "IBVERBS_1.0" => misc::rate_to_mult;
    default "ibv_read_sysfs_file" "IBVERBS_1.0" => misc::read_sysfs_file;
    default "mult_to_ibv_rate" "IBVERBS_1.0" => misc::mult_to_rate;
    compat "ibv_ack_async_event" "IBVERBS_1.0" => stubs::ignore;
    compat "ibv_ack_cq_events" "IBVERBS_1.0" => stubs::ignore;
    compat "ibv_alloc_pd" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_attach_mcast" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_close_device" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_create_ah" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_create_cq" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_create_qp" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_create_srq" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_dealloc_pd" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_dereg_mr" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_destroy_ah" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_destroy_cq" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_destroy_qp" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_destroy_srq" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_detach_mcast" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_free_device_list" "IBVERBS_1.0" => stubs::ignore;
    compat "ibv_get_async_event" "IBVERBS_1.0" => stubs::fail_minus_one;
    compat "ibv_get_cq_event" "IBVERBS_1.0" => stubs::fail_minus_one;
    compat "ibv_get_device_guid" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_get_device_list" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_get_device_name" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_modify_qp" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_modify_srq" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_open_device" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_query_device" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_query_gid" "IBVERBS_1.0" => stubs::fail_minus_one;
    compat "ibv_query_pkey" "IBVERBS_1.0" => stubs::fail_minus_one;
    compat "ibv_query_port" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_query_qp" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_query_srq" "IBVERBS_1.0" => stubs::fail_errno;
    compat "ibv_reg_mr" "IBVERBS_1.0" => stubs::fail_null;
    compat "ibv_resize_cq" "IBVERBS_1.0" => stubs::fail_errno;
    // IBVERBS_1.1
    default "ibv_ack_async_event" "IBVERBS_1.1" => device::ack_async_event;
    default "ibv_ack_cq_events" "IBVERBS_1.1" => cq::ack_cq_events;
    default "ibv_alloc_pd" "IBVERBS_1.1" => device::alloc_pd;
    default "ibv_attach_mcast" "IBVERBS_1.1" => stubs::fail_errno;
    default "ibv_close_device" "IBVERBS_1.1" => device::close_device;
    default "ibv_copy_ah_attr_from_kern" "IBVERBS_1.1" => stubs::ignore;
    default "ibv_create_ah" "IBVERBS_1.1" => ah::create_ah;
    default "ibv_create_ah_from_wc" "IBVERBS_1.1" => ah::create_ah_from_wc;
    default "ibv_create_cq" "IBVERBS_1.1" => cq::create_cq;
    default "ibv_create_qp" "IBVERBS_1.1" => qp::create_qp;
    default "ibv_create_srq" "IBVERBS_1.1" => srq::create_srq;
    default "ibv_dealloc_pd" "IBVERBS_1.1" => device::dealloc_pd;
    default "ibv_dereg_mr" "IBVERBS_1.1" => mr::dereg_mr;
    default "ibv_destroy_ah" "IBVERBS_1.1" => ah::destroy_ah;
    default "ibv_destroy_cq" "IBVERBS_1.1" => cq::destroy_cq;
    default "ibv_destroy_qp" "IBVERBS_1.1" => qp::destroy_qp;
    default "ibv_destroy_srq" "IBVERBS_1.1" => srq::destroy_srq;
    default "ibv_detach_mcast" "IBVERBS_1.1" => stubs::fail_errno;
    default "ibv_dofork_range" "IBVERBS_1.1" => misc::fork_range;
    default "ibv_dontfork_range" "IBVERBS_1.1" => misc::fork_range;
    default "ibv_event_type_str" "IBVERBS_1.1" => misc::event_type_str;
    default "ibv_fork_init" "IBVERBS_1.1" => misc::fork_init;
    default "ibv_free_device_list" "IBVERBS_1.1" => device::free_device_list;
    default "ibv_get_async_event" "IBVERBS_1.1" => device::get_async_event;
    default "ibv_get_cq_event" "IBVERBS_1.1" => cq::get_cq_event;
    default "ibv_get_device_guid" "IBVERBS_1.1" => device::get_device_guid;
    default "ibv_get_device_list" "IBVERBS_1.1" => device::get_device_list;
    default "ibv_get_device_name" "IBVERBS_1.1" => device::get_device_name;
    default "ibv_init_ah_from_wc" "IBVERBS_1.1" => ah::init_ah_from_wc;
    default "ibv_modify_qp" "IBVERBS_1.1" => qp::modify_qp;
    default "ibv_modify_srq" "IBVERBS_1.1" => srq::modify_srq;
    default "ibv_node_type_str" "IBVERBS_1.1" => misc::node_type_str;
    default "ibv_open_device" "IBVERBS_1.1" => device::open_device;
    default "ibv_port_state_str" "IBVERBS_1.1" => misc::port_state_str;
    default "ibv_query_device" "IBVERBS_1.1" => device::query_device;
    default "ibv_query_gid" "IBVERBS_1.1" => device::query_gid;
    default "ibv_query_pkey" "IBVERBS_1.1" => device::query_pkey;
    default "ibv_query_port" "IBVERBS_1.1" => device::query_port;
    default "ibv_query_qp" "IBVERBS_1.1" => qp::query_qp;
    default "ibv_query_srq" "IBVERBS_1.1" => srq::query_srq;
    default "ibv_rate_to_mbps" "IBVERBS_1.1" => misc::rate_to_mbps;
    default "ibv_reg_mr" "IBVERBS_1.1" => mr::reg_mr;
    default "ibv_rereg_mr" "IBVERBS_1.1" => stubs::fail_rereg_mr;
    default "ibv_resize_cq" "IBVERBS_1.1" => cq::resize_cq;
    default "ibv_resolve_eth_l2_from_gid" "IBVERBS_1.1" => stubs::fail_errno;
    default "ibv_wc_status_str" "IBVERBS_1.1" => misc::wc_status_str;
    default "mbps_to_ibv_rate" "IBVERBS_1.1" => misc::mbps_to_rate;
    compat "ibv_register_driver" "IBVERBS_1.1" => misc::register_driver;
    // IBVERBS_1.5
    default "ibv_get_pkey_index" "IBVERBS_1.5" => device::get_pkey_index;
    // IBVERBS_1.6
    default "ibv_qp_to_qp_ex" "IBVERBS_1.6" => misc::qp_to_qp_ex;
    // IBVERBS_1.7
    default "ibv_reg_mr_iova" "IBVERBS_1.7" => mr::reg_mr_iova;
    // IBVERBS_1.8
    default "ibv_reg_mr_iova2" "IBVERBS_1.8" => mr::reg_mr_iova2;
    // IBVERBS_1.9
    default "ibv_get_device_index" "IBVERBS_1.9" => device::get_device_index;
    // IBVERBS_1.10
    default "ibv_import_device" "IBVERBS_1.10" => stubs::fail_null;
    default "ibv_import_mr" "IBVERBS_1.10" => stubs::fail_null;
    default "ibv_import_pd" "IBVERBS_1.10" => stubs::fail_null;
    default "ibv_query_ece" "IBVERBS_1.10" => stubs::fail_errno;
    default "ibv_set_ece" "IBVERBS_1.10" => stubs::fail_errno;
    default "ibv_unimport_mr" "IBVERBS_1.10" => stubs::ignore;
    default "ibv_unimport_pd" "IBVERBS_1.10" => stubs::ignore;
    // IBVERBS_1.11
    default "_ibv_query_gid_ex" "IBVERBS_1.11" => device::query_gid_ex;
    default "_ibv_query_gid_table" "IBVERBS_1.11" => device::query_gid_table;
    // IBVERBS_1.12
    default "ibv_reg_dmabuf_mr" "IBVERBS_1.12" => stubs::fail_null;
    // IBVERBS_1.13
    default "ibv_import_dm" "IBVERBS_1.13" => stubs::fail_null;
    default "ibv_is_fork_initialized" "IBVERBS_1.13" => misc::is_fork_initialized;
    default "ibv_unimport_dm" "IBVERBS_1.13" => stubs::ignore;
    // IBVERBS_1.14
    default "ibv_query_qp_data_in_order" "IBVERBS_1.14" => misc::query_qp_data_in_order;
    // IBVERBS_PRIVATE_34
    default "__ioctl_final_num_attrs" "IBVERBS_PRIVATE_34" => misc::ioctl_final_num_attrs;
    default "__verbs_log" "IBVERBS_PRIVATE_34" => stubs::ignore;
    default "_verbs_init_and_alloc_context" "IBVERBS_PRIVATE_34" => stubs::fail_null;
    default "execute_ioctl" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_advise_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_alloc_dm" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_alloc_mw" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_alloc_pd" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_attach_mcast" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_close_xrcd" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_ah" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_counters" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_cq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_cq_ex" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_flow" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_flow_action_esp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_qp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_qp_ex" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_qp_ex2" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_rwq_ind_table" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_srq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_srq_ex" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_create_wq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_dealloc_mw" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_dealloc_pd" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_dereg_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_ah" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_counters" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_cq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_flow" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_flow_action" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_qp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_rwq_ind_table" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_srq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_destroy_wq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_detach_mcast" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_free_dm" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_get_context" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_modify_cq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_modify_flow_action_esp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_modify_qp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_modify_qp_ex" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_modify_srq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_modify_wq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_open_qp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_open_xrcd" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_poll_cq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_post_recv" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_post_send" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_post_srq_recv" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_query_context" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_query_device_any" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_query_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_query_port" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_query_qp" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_query_srq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_read_counters" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_reg_dm_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_reg_dmabuf_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_reg_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_req_notify_cq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_rereg_mr" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_cmd_resize_cq" "IBVERBS_PRIVATE_34" => stubs::fail_errno;
    default "ibv_query_gid_type" "IBVERBS_PRIVATE_34" => device::query_gid_type;
    default "ibv_read_ibdev_sysfs_file" "IBVERBS_PRIVATE_34" => stubs::fail_minus_one;
    default "verbs_init_cq" "IBVERBS_PRIVATE_34" => stubs::ignore;
    default "verbs_open_device" "IBVERBS_PRIVATE_34" => stubs::fail_null;
    default "verbs_register_driver_34" "IBVERBS_PRIVATE_34" => misc::register_driver;
    default "verbs_set_ops" "IBVERBS_PRIVATE_34" => stubs::ignore;
    default "verbs_uninit_context" "IBVERBS_PRIVATE_34" => stubs::ignore;

    // librdmacm (RDMACM_1.0 … RDMACM_1.3): the same file is the drop-in librdmacm.so.1.
    default "raccept" "RDMACM_1.0" => cm::unsupported;
    default "rbind" "RDMACM_1.0" => cm::unsupported;
    default "rclose" "RDMACM_1.0" => cm::unsupported;
    default "rconnect" "RDMACM_1.0" => cm::unsupported;
    default "rdma_accept" "RDMACM_1.0" => cm::accept;
    default "rdma_ack_cm_event" "RDMACM_1.0" => cm::ack_cm_event;
    default "rdma_bind_addr" "RDMACM_1.0" => cm::bind_addr;
    default "rdma_connect" "RDMACM_1.0" => cm::connect;
    default "rdma_create_ep" "RDMACM_1.0" => cm::create_ep;
    default "rdma_create_event_channel" "RDMACM_1.0" => cm::create_event_channel;
    default "rdma_create_id" "RDMACM_1.0" => cm::create_id;
    default "rdma_create_qp" "RDMACM_1.0" => cm::create_qp;
    default "rdma_create_qp_ex" "RDMACM_1.0" => cm::create_qp_ex;
    default "rdma_create_srq" "RDMACM_1.0" => cm::unsupported;
    default "rdma_create_srq_ex" "RDMACM_1.0" => cm::unsupported;
    default "rdma_destroy_ep" "RDMACM_1.0" => cm::destroy_ep;
    default "rdma_destroy_event_channel" "RDMACM_1.0" => cm::destroy_event_channel;
    default "rdma_destroy_id" "RDMACM_1.0" => cm::destroy_id;
    default "rdma_destroy_qp" "RDMACM_1.0" => cm::destroy_qp;
    default "rdma_destroy_srq" "RDMACM_1.0" => stubs::ignore;
    default "rdma_disconnect" "RDMACM_1.0" => cm::disconnect;
    default "rdma_event_str" "RDMACM_1.0" => cm::event_str;
    default "rdma_free_devices" "RDMACM_1.0" => cm::free_devices;
    default "rdma_freeaddrinfo" "RDMACM_1.0" => cm::freeaddrinfo;
    default "rdma_get_cm_event" "RDMACM_1.0" => cm::get_cm_event;
    default "rdma_get_devices" "RDMACM_1.0" => cm::get_devices;
    default "rdma_get_dst_port" "RDMACM_1.0" => cm::get_dst_port;
    default "rdma_get_request" "RDMACM_1.0" => cm::get_request;
    default "rdma_get_src_port" "RDMACM_1.0" => cm::get_src_port;
    default "rdma_getaddrinfo" "RDMACM_1.0" => cm::getaddrinfo;
    default "rdma_join_multicast" "RDMACM_1.0" => cm::unsupported;
    default "rdma_leave_multicast" "RDMACM_1.0" => cm::unsupported;
    default "rdma_listen" "RDMACM_1.0" => cm::listen;
    default "rdma_migrate_id" "RDMACM_1.0" => cm::migrate_id;
    default "rdma_notify" "RDMACM_1.0" => cm::notify;
    default "rdma_reject" "RDMACM_1.0" => cm::reject;
    default "rdma_resolve_addr" "RDMACM_1.0" => cm::resolve_addr;
    default "rdma_resolve_route" "RDMACM_1.0" => cm::resolve_route;
    default "rdma_set_option" "RDMACM_1.0" => cm::set_option;
    default "rfcntl" "RDMACM_1.0" => cm::unsupported;
    default "rgetpeername" "RDMACM_1.0" => cm::unsupported;
    default "rgetsockname" "RDMACM_1.0" => cm::unsupported;
    default "rgetsockopt" "RDMACM_1.0" => cm::unsupported;
    default "riomap" "RDMACM_1.0" => cm::unsupported;
    default "riounmap" "RDMACM_1.0" => cm::unsupported;
    default "riowrite" "RDMACM_1.0" => cm::unsupported;
    default "rlisten" "RDMACM_1.0" => cm::unsupported;
    default "rpoll" "RDMACM_1.0" => cm::unsupported;
    default "rread" "RDMACM_1.0" => cm::unsupported;
    default "rreadv" "RDMACM_1.0" => cm::unsupported;
    default "rrecv" "RDMACM_1.0" => cm::unsupported;
    default "rrecvfrom" "RDMACM_1.0" => cm::unsupported;
    default "rrecvmsg" "RDMACM_1.0" => cm::unsupported;
    default "rselect" "RDMACM_1.0" => cm::unsupported;
    default "rsend" "RDMACM_1.0" => cm::unsupported;
    default "rsendmsg" "RDMACM_1.0" => cm::unsupported;
    default "rsendto" "RDMACM_1.0" => cm::unsupported;
    default "rsetsockopt" "RDMACM_1.0" => cm::unsupported;
    default "rshutdown" "RDMACM_1.0" => cm::unsupported;
    default "rsocket" "RDMACM_1.0" => cm::unsupported;
    default "rwrite" "RDMACM_1.0" => cm::unsupported;
    default "rwritev" "RDMACM_1.0" => cm::unsupported;
    default "rdma_join_multicast_ex" "RDMACM_1.1" => cm::unsupported;
    default "rdma_establish" "RDMACM_1.2" => cm::establish;
    default "rdma_init_qp_attr" "RDMACM_1.2" => cm::init_qp_attr;
    default "rdma_get_remote_ece" "RDMACM_1.3" => cm::unsupported;
    default "rdma_reject_ece" "RDMACM_1.3" => cm::unsupported;
    default "rdma_set_local_ece" "RDMACM_1.3" => cm::unsupported;
}

// `verbs_allow_disassociate_destroy` (IBVERBS_PRIVATE_34): rdma-core's `bool`, which
// providers read to decide whether a destroy may succeed after the device is gone. False, in
// .bss like rdma-core's; the library never reads it.
#[cfg(not(test))]
core::arch::global_asm!(
    ".pushsection .bss.ferroce_exports,\"aw\",%nobits",
    ".globl ferroce.verbs_allow_disassociate_destroy",
    ".type ferroce.verbs_allow_disassociate_destroy,%object",
    "ferroce.verbs_allow_disassociate_destroy:",
    ".zero 1",
    ".size ferroce.verbs_allow_disassociate_destroy, 1",
    ".symver ferroce.verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34",
    ".popsection",
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// (name, node) of every symbol `libibverbs.map` lists.
    fn map_entries() -> BTreeSet<(String, String)> {
        let map = include_str!("../libibverbs.map");
        let mut out = BTreeSet::new();
        let mut node = None;
        for line in map.lines().map(str::trim) {
            if let Some(n) = line.strip_suffix('{').map(str::trim) {
                node = Some(n.to_owned());
            } else if line.starts_with('}') {
                node = None;
            } else if let (Some(n), Some(sym)) = (&node, line.strip_suffix(';')) {
                if !sym.contains(':') && sym != "*" {
                    out.insert((sym.to_owned(), n.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn the_table_and_the_version_script_agree() {
        let mut table: BTreeSet<(String, String)> = EXPORTS
            .iter()
            .map(|e| (e.name.to_owned(), e.node.to_owned()))
            .collect();
        table.insert((
            "verbs_allow_disassociate_destroy".to_owned(),
            "IBVERBS_PRIVATE_34".to_owned(),
        ));
        let map = map_entries();
        assert_eq!(
            table.difference(&map).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "exported but not in libibverbs.map"
        );
        assert_eq!(
            map.difference(&table).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "in libibverbs.map but not exported"
        );
        let ibverbs = table
            .iter()
            .filter(|(_, n)| n.starts_with("IBVERBS"))
            .count();
        assert_eq!(
            ibverbs, 180,
            "rdma-core v44's libibverbs exports 180 symbols"
        );
        let rdmacm = table
            .iter()
            .filter(|(_, n)| n.starts_with("RDMACM"))
            .count();
        assert_eq!(rdmacm, 68, "rdma-core v44's librdmacm exports 68 symbols");
        assert_eq!(table.len(), ibverbs + rdmacm);
    }

    #[test]
    fn each_name_has_one_default_at_most() {
        let mut defaults = BTreeSet::new();
        for e in EXPORTS.iter().filter(|e| e.default) {
            assert!(defaults.insert(e.name), "{} has two defaults", e.name);
        }
        assert!(EXPORTS
            .iter()
            .any(|e| e.name == "ibv_get_device_list" && !e.default));
    }
}
