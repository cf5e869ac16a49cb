//! Entry points that need no device: the `*_str` helpers and rate conversions
//! (`crate::enums`), fork control, the sysfs helpers rdma-core exports (`librdmacm` and
//! `ibv_devinfo` call them), and the private entry points providers call when they load
//! (libmlx5 and libefa register their drivers from a constructor: accepted and ignored, since
//! no kernel device is ever matched to them).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString, OsStr};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::abi::IBV_FORK_UNNEEDED;
use crate::enums;
use crate::fence;

/// `ibv_node_type_str`.
pub(crate) unsafe extern "C" fn node_type_str(node_type: c_int) -> *const c_char {
    fence::value(
        || c"unknown".as_ptr(),
        || enums::node_type_str(node_type).as_ptr(),
    )
}

/// `ibv_port_state_str`.
pub(crate) unsafe extern "C" fn port_state_str(state: c_int) -> *const c_char {
    fence::value(
        || c"unknown".as_ptr(),
        || enums::port_state_str(state).as_ptr(),
    )
}

/// `ibv_event_type_str`.
pub(crate) unsafe extern "C" fn event_type_str(event: c_int) -> *const c_char {
    fence::value(
        || c"unknown".as_ptr(),
        || enums::event_type_str(event).as_ptr(),
    )
}

/// `ibv_wc_status_str`.
pub(crate) unsafe extern "C" fn wc_status_str(status: c_int) -> *const c_char {
    fence::value(
        || c"unknown".as_ptr(),
        || enums::wc_status_str(status).as_ptr(),
    )
}

/// `ibv_rate_to_mult`.
pub(crate) unsafe extern "C" fn rate_to_mult(rate: c_int) -> c_int {
    fence::value(|| -1, || enums::rate_to_mult(rate))
}

/// `mult_to_ibv_rate`.
pub(crate) unsafe extern "C" fn mult_to_rate(mult: c_int) -> c_int {
    fence::value(|| 0, || enums::mult_to_rate(mult))
}

/// `ibv_rate_to_mbps`.
pub(crate) unsafe extern "C" fn rate_to_mbps(rate: c_int) -> c_int {
    fence::value(|| -1, || enums::rate_to_mbps(rate))
}

/// `mbps_to_ibv_rate`.
pub(crate) unsafe extern "C" fn mbps_to_rate(mbps: c_int) -> c_int {
    fence::value(|| 0, || enums::mbps_to_rate(mbps))
}

/// `ibv_fork_init`: 0. The soft NIC pins no memory in a kernel, so a forked child cannot
/// corrupt a registration: there is nothing to prepare.
pub(crate) unsafe extern "C" fn fork_init() -> c_int {
    fence::errno(|| Ok(()))
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED`, for the same reason.
pub(crate) unsafe extern "C" fn is_fork_initialized() -> c_int {
    fence::value(|| IBV_FORK_UNNEEDED, || IBV_FORK_UNNEEDED)
}

/// `ibv_dontfork_range` and `ibv_dofork_range`: 0, nothing to mark.
pub(crate) unsafe extern "C" fn fork_range(_base: *mut c_void, _size: usize) -> c_int {
    fence::errno(|| Ok(()))
}

/// `ibv_get_sysfs_path`: `$SYSFS_PATH` without trailing slashes when set (and the process is
/// not setuid), else `/sys`, as rdma-core.
pub(crate) unsafe extern "C" fn get_sysfs_path() -> *const c_char {
    static PATH: OnceLock<CString> = OnceLock::new();
    fence::value(
        || c"/sys".as_ptr(),
        || {
            PATH.get_or_init(|| {
                // SAFETY: getuid and geteuid take no arguments and cannot fail.
                let setuid = unsafe { libc::getuid() != libc::geteuid() };
                let env = (!setuid)
                    .then(|| std::env::var_os("SYSFS_PATH"))
                    .flatten()
                    .map(|v| v.as_bytes().to_vec());
                let mut path = env.unwrap_or_else(|| b"/sys".to_vec());
                while path.len() > 1 && path.ends_with(b"/") {
                    path.pop();
                }
                CString::new(path).unwrap_or_else(|_| c"/sys".to_owned())
            })
            .as_ptr()
        },
    )
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` as rdma-core does (one read, a final
/// newline replaced by NUL, -1 when the contents do not fit with their NUL). Device
/// `ferroce0` has no sysfs directory, so for its paths this finds nothing (-1, `ENOENT`).
pub(crate) unsafe extern "C" fn read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    fence::minus_one(|| {
        if dir.is_null() || file.is_null() || buf.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes NUL-terminated strings.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let mut path = PathBuf::from(OsStr::from_bytes(dir.to_bytes()));
        path.push(OsStr::from_bytes(file.to_bytes()));
        // SAFETY: the caller passes `size` writable bytes at `buf`.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), size) };
        let os = |e: std::io::Error| e.raw_os_error().unwrap_or(libc::EIO);
        let mut f = std::fs::File::open(&path).map_err(os)?;
        let mut len = f.read(out).map_err(os)?;
        if len > 0 {
            if out[len - 1] == b'\n' {
                len -= 1;
                out[len] = 0;
            } else if len < size {
                out[len] = 0;
            } else {
                return Err(libc::EOVERFLOW);
            }
        }
        c_int::try_from(len).map_err(|_| libc::EOVERFLOW)
    })
}

/// `verbs_register_driver_34` (private), which a provider's constructor calls at load: no
/// kernel device will be matched to it here, so it is not kept.
pub(crate) unsafe extern "C" fn register_driver(_ops: *const c_void) {
    fence::unit(|| ());
}

/// `__ioctl_final_num_attrs` (private), a provider's command-buffer helper: the count it was
/// given (no command is ever executed).
pub(crate) unsafe extern "C" fn ioctl_final_num_attrs(
    num_attrs: c_uint,
    _link: *mut c_void,
) -> c_uint {
    fence::value(|| num_attrs, || num_attrs)
}

/// `ibv_qp_to_qp_ex`: NULL, no QP has the extended interface (`ibv_wr_*`).
pub(crate) unsafe extern "C" fn qp_to_qp_ex(_qp: *mut c_void) -> *mut c_void {
    fence::value(std::ptr::null_mut, std::ptr::null_mut)
}

/// `ibv_query_qp_data_in_order`: 0, no promise that data land in order.
pub(crate) unsafe extern "C" fn query_qp_data_in_order() -> c_int {
    fence::value(|| 0, || 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sysfs_files_as_rdma_core() {
        let dir = std::env::temp_dir().join(format!("ferroce-ibverbs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("board_id"), "FERROCE\n").unwrap();
        std::fs::write(dir.join("long"), "0123456789").unwrap();
        let d = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let mut buf = [0x55 as c_char; 16];
        // SAFETY: valid strings and a 16-byte buffer.
        let n = unsafe { read_sysfs_file(d.as_ptr(), c"board_id".as_ptr(), buf.as_mut_ptr(), 16) };
        assert_eq!(n, 7);
        // SAFETY: the buffer was NUL-terminated by the call.
        assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }, c"FERROCE");
        // SAFETY: as above, with a buffer too small for the contents and their NUL.
        let n = unsafe { read_sysfs_file(d.as_ptr(), c"long".as_ptr(), buf.as_mut_ptr(), 10) };
        assert_eq!(n, -1);
        // SAFETY: as above.
        let n = unsafe { read_sysfs_file(d.as_ptr(), c"absent".as_ptr(), buf.as_mut_ptr(), 16) };
        assert_eq!(n, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOENT)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn fork_needs_nothing() {
        // SAFETY: no arguments.
        unsafe {
            assert_eq!(fork_init(), 0);
            assert_eq!(is_fork_initialized(), IBV_FORK_UNNEEDED);
        }
    }
}
