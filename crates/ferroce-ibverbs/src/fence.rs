//! The panic fence: every C entry point runs its body through one of these, so that a panic
//! never unwinds into C. A panic is reported by Rust's panic hook on standard error and the
//! call fails as rdma-core's would fail, with `EIO`: the errno returned, or set beside a NULL
//! or -1, per the function's contract. The helpers also turn a body's `Result` into that
//! contract, so each entry point states its convention by the helper it calls.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::sys::set_errno;

/// The errno of a call that panicked.
const PANICKED: c_int = libc::EIO;

/// Runs `body`; a panic gives `fallback()`.
pub(crate) fn value<R>(fallback: impl FnOnce() -> R, body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| fallback())
}

/// For functions that return 0 or an errno value (`ibv_dealloc_pd`, `_ibv_query_gid_ex`).
pub(crate) fn errno(body: impl FnOnce() -> Result<(), c_int>) -> c_int {
    value(|| PANICKED, || body().err().unwrap_or(0))
}

/// For functions that return a pointer, or NULL with errno set (`ibv_open_device`).
pub(crate) fn pointer<T>(body: impl FnOnce() -> Result<*mut T, c_int>) -> *mut T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            set_errno(e);
            std::ptr::null_mut()
        }
        Err(_) => {
            set_errno(PANICKED);
            std::ptr::null_mut()
        }
    }
}

/// For functions that return a non-negative value, or -1 with errno set (`ibv_query_gid`,
/// `ibv_get_async_event`).
pub(crate) fn minus_one(body: impl FnOnce() -> Result<c_int, c_int>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(PANICKED);
            -1
        }
    }
}

/// For functions that return nothing (`ibv_free_device_list`).
pub(crate) fn unit(body: impl FnOnce()) {
    value(|| (), body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quietly<R>(f: impl FnOnce() -> R) -> R {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let r = f();
        std::panic::set_hook(hook);
        r
    }

    #[test]
    fn a_panic_becomes_the_contract_s_failure() {
        quietly(|| {
            assert_eq!(errno(|| panic!("inside")), libc::EIO);
            assert!(pointer::<u8>(|| panic!("inside")).is_null());
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EIO)
            );
            assert_eq!(minus_one(|| panic!("inside")), -1);
            unit(|| panic!("inside"));
        });
    }

    #[test]
    fn results_become_the_contract() {
        assert_eq!(errno(|| Ok(())), 0);
        assert_eq!(errno(|| Err(libc::EINVAL)), libc::EINVAL);
        assert_eq!(minus_one(|| Ok(3)), 3);
        assert_eq!(minus_one(|| Err(libc::ENOENT)), -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOENT)
        );
        let mut x = 5u8;
        assert_eq!(pointer(|| Ok(&raw mut x)), &raw mut x);
    }
}
