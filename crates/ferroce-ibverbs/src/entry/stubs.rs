//! What ferroce does not offer (yet): entry points that fail cleanly, as a device without the
//! feature fails. `crate::exports` lists which rdma-core function each answers; the later
//! stages replace the public ones (CQs, QPs, MRs, SRQs, AHs, completion channels) with real
//! ones.
//!
//! The generic stubs take no parameters: on x86_64 and aarch64 a callee may ignore the
//! arguments its caller passed (they are in registers or the caller's frame), so one function
//! answers every signature that shares a return convention:
//!
//! - [`fail_errno`]: returns `EOPNOTSUPP` (the `ibv_cmd_*` family, `ibv_destroy_*`,
//!   `ibv_modify_*`, `ibv_query_qp`, …, which return an errno);
//! - [`fail_null`]: NULL with errno `EOPNOTSUPP` (`ibv_create_*`, `ibv_reg_mr*`,
//!   `ibv_import_*`, …);
//! - [`fail_minus_one`]: -1 with errno `EOPNOTSUPP` (`ibv_get_cq_event`,
//!   `ibv_init_ah_from_wc`, `ibv_read_ibdev_sysfs_file`);
//! - [`fail_rereg_mr`]: `IBV_REREG_MR_ERR_CMD` with errno `EOPNOTSUPP`;
//! - [`ignore`]: returns nothing (`ibv_ack_cq_events`, `ibv_unimport_*`, the provider
//!   helpers `verbs_set_ops`, `verbs_init_cq`, `verbs_uninit_context`, and the
//!   `ibv_copy_*_kern` converters, which only run on a kernel's replies and so never here).
//!
//! The `@IBVERBS_1.0` compat definitions (rdma-core's pre-2006 layouts, which no program
//! linked since binds) use the same stubs: they exist so that the symbol table is rdma-core's.

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_context_ops, IBV_REREG_MR_ERR_CMD};
use crate::fence;
use crate::sys::set_errno;

/// The errno of everything not offered.
const NOT_OFFERED: c_int = libc::EOPNOTSUPP;

/// Fails with `EOPNOTSUPP`, returned.
pub(crate) unsafe extern "C" fn fail_errno() -> c_int {
    fence::errno(|| Err(NOT_OFFERED))
}

/// Fails with NULL and errno `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn fail_null() -> *mut c_void {
    fence::pointer(|| Err(NOT_OFFERED))
}

/// Fails with -1 and errno `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn fail_minus_one() -> c_int {
    fence::minus_one(|| Err(NOT_OFFERED))
}

/// `ibv_rereg_mr`: `IBV_REREG_MR_ERR_CMD` with errno `EOPNOTSUPP`.
pub(crate) unsafe extern "C" fn fail_rereg_mr() -> c_int {
    fence::value(
        || IBV_REREG_MR_ERR_CMD,
        || {
            set_errno(NOT_OFFERED);
            IBV_REREG_MR_ERR_CMD
        },
    )
}

/// Does nothing.
pub(crate) unsafe extern "C" fn ignore() {
    fence::unit(|| ());
}

/// The `ibv_context_ops` of a new context: the inline hot path (`ibv_poll_cq`,
/// `ibv_req_notify_cq`, `ibv_post_*`) calls these without checking for NULL, so each is set
/// (to the data path's entry points, `crate::entry::cq`, `qp` and `srq`);
/// the memory-window slots stay NULL, which `ibv_alloc_mw` answers with `EOPNOTSUPP`.
pub(crate) fn context_ops() -> ibv_context_ops {
    ibv_context_ops {
        compat_query_device: None,
        compat_query_port: None,
        compat_alloc_pd: None,
        compat_dealloc_pd: None,
        compat_reg_mr: None,
        compat_rereg_mr: None,
        compat_dereg_mr: None,
        alloc_mw: None,
        bind_mw: None,
        dealloc_mw: None,
        compat_create_cq: None,
        poll_cq: Some(super::cq::poll_cq),
        req_notify_cq: Some(super::cq::req_notify_cq),
        compat_cq_event: None,
        compat_resize_cq: None,
        compat_destroy_cq: None,
        compat_create_srq: None,
        compat_modify_srq: None,
        compat_query_srq: None,
        compat_destroy_srq: None,
        post_srq_recv: Some(super::srq::post_srq_recv),
        compat_create_qp: None,
        compat_query_qp: None,
        compat_modify_qp: None,
        compat_destroy_qp: None,
        post_send: Some(super::qp::post_send),
        post_recv: Some(super::qp::post_recv),
        compat_create_ah: None,
        compat_destroy_ah: None,
        compat_attach_mcast: None,
        compat_detach_mcast: None,
        compat_async_event: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errno() -> Option<i32> {
        std::io::Error::last_os_error().raw_os_error()
    }

    #[test]
    fn stubs_fail_with_eopnotsupp() {
        // SAFETY: the stubs read no arguments.
        unsafe {
            assert_eq!(fail_errno(), libc::EOPNOTSUPP);
            assert!(fail_null().is_null());
            assert_eq!(errno(), Some(libc::EOPNOTSUPP));
            set_errno(0);
            assert_eq!(fail_minus_one(), -1);
            assert_eq!(errno(), Some(libc::EOPNOTSUPP));
            assert_eq!(fail_rereg_mr(), IBV_REREG_MR_ERR_CMD);
            ignore();
        }
    }
}
