//! Loading libibverbs: `dlopen` on first use, each symbol by `dlvsym` at the version rdma-core
//! released it under, and the device list. The handles it opens are in `objects`.

#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::io;
use std::sync::OnceLock;

use super::super::abi::*;

/// Why libibverbs could not be loaded.
#[derive(Clone, Debug)]
pub(crate) struct LoadError {
    /// The file asked for.
    pub(crate) path: String,
    /// `dlerror()`'s text, or the symbol that was missing.
    pub(crate) reason: String,
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut ibv_context;
type CloseDevice = unsafe extern "C" fn(*mut ibv_context) -> c_int;
type QueryDevice = unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
type QueryPort = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
type QueryGid = unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
type QueryGidEx =
    unsafe extern "C" fn(*mut ibv_context, u32, u32, *mut ibv_gid_entry, u32, usize) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut ibv_context) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut ibv_mr;
type RegMrIova2 = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_uint) -> *mut ibv_mr;
type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut ibv_mr;
type DeregMr = unsafe extern "C" fn(*mut ibv_mr) -> c_int;
type CreateCompChannel = unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel;
type DestroyCompChannel = unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int;
type CreateCq = unsafe extern "C" fn(
    *mut ibv_context,
    c_int,
    *mut c_void,
    *mut ibv_comp_channel,
    c_int,
) -> *mut ibv_cq;
type ResizeCq = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
type DestroyCq = unsafe extern "C" fn(*mut ibv_cq) -> c_int;
type GetCqEvent =
    unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
type AckCqEvents = unsafe extern "C" fn(*mut ibv_cq, c_uint);
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut ibv_qp_init_attr) -> *mut ibv_qp;
type ModifyQp = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
type DestroyQp = unsafe extern "C" fn(*mut ibv_qp) -> c_int;
type GetAsyncEvent = unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
type AckAsyncEvent = unsafe extern "C" fn(*mut ibv_async_event);
type ForkInit = unsafe extern "C" fn() -> c_int;
type IsForkInitialized = unsafe extern "C" fn() -> c_int;

/// libibverbs, opened, with the functions ferroce calls.
pub(crate) struct Lib {
    pub(super) get_device_list: GetDeviceList,
    pub(super) free_device_list: FreeDeviceList,
    pub(super) get_device_name: GetDeviceName,
    pub(super) open_device: OpenDevice,
    pub(super) close_device: CloseDevice,
    pub(super) query_device: QueryDevice,
    pub(super) query_port: QueryPort,
    pub(super) query_gid: QueryGid,
    pub(super) alloc_pd: AllocPd,
    pub(super) dealloc_pd: DeallocPd,
    pub(super) reg_mr: RegMr,
    pub(super) dereg_mr: DeregMr,
    pub(super) create_comp_channel: CreateCompChannel,
    pub(super) destroy_comp_channel: DestroyCompChannel,
    pub(super) create_cq: CreateCq,
    pub(super) resize_cq: ResizeCq,
    pub(super) destroy_cq: DestroyCq,
    pub(super) get_cq_event: GetCqEvent,
    pub(super) ack_cq_events: AckCqEvents,
    pub(super) create_qp: CreateQp,
    pub(super) modify_qp: ModifyQp,
    pub(super) destroy_qp: DestroyQp,
    pub(super) get_async_event: GetAsyncEvent,
    pub(super) ack_async_event: AckAsyncEvent,
    pub(super) fork_init: ForkInit,
    // Optional: newer than some rdma-core releases still in use.
    pub(super) query_gid_ex: Option<QueryGidEx>,
    pub(super) reg_mr_iova2: Option<RegMrIova2>,
    pub(super) reg_dmabuf_mr: Option<RegDmabufMr>,
    pub(super) is_fork_initialized: Option<IsForkInitialized>,
    /// The file that was opened.
    pub(crate) path: String,
}

/// The library handle is never closed and every function in it is thread-safe (libibverbs
/// locks its own state; rdma-core documents its verbs as callable from any thread).
// SAFETY: `Lib` holds only function pointers into a library that stays loaded for the life
// of the process.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

static LIB: OnceLock<Result<Lib, LoadError>> = OnceLock::new();

/// The environment variable that names another libibverbs (or, for tests, a file that is not
/// one).
pub(crate) const LIBRARY_VAR: &str = "FERROCE_IBVERBS";

/// libibverbs, loaded on the first call; the same answer every call after.
pub(crate) fn lib() -> Result<&'static Lib, LoadError> {
    LIB.get_or_init(|| {
        let path = std::env::var(LIBRARY_VAR).unwrap_or_else(|_| "libibverbs.so.1".to_owned());
        load(&path)
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a pointer to a NUL-terminated string that stays valid
    // until the next dl call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        "unknown dlopen failure".to_owned()
    } else {
        // SAFETY: non-NULL and NUL-terminated, as above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn load(path: &str) -> Result<Lib, LoadError> {
    let fail = |reason: String| LoadError {
        path: path.to_owned(),
        reason,
    };
    let cpath = CString::new(path).map_err(|_| fail("the path holds a NUL byte".into()))?;
    // SAFETY: a NUL-terminated path; RTLD_LOCAL keeps the library's symbols out of the global
    // namespace. The handle is kept for the life of the process (never dlclosed).
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(fail(dlerror_text()));
    }
    let find = |name: &str, version: &str| -> Option<*mut c_void> {
        let n = CString::new(name).ok()?;
        let v = CString::new(version).ok()?;
        // SAFETY: a live handle and two NUL-terminated strings; dlvsym only looks up.
        let p = unsafe { libc::dlvsym(handle, n.as_ptr(), v.as_ptr()) };
        (!p.is_null()).then_some(p)
    };
    macro_rules! required {
        ($name:literal, $version:literal, $ty:ty) => {{
            let p = find($name, $version).ok_or_else(|| {
                fail(format!(
                    "{} has no {}@{} (is it rdma-core's libibverbs?)",
                    path, $name, $version
                ))
            })?;
            // SAFETY: the symbol is rdma-core's function of this name at this ABI version,
            // whose C prototype `$ty` transcribes (verbs.md §1.1).
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }};
    }
    macro_rules! optional {
        ($name:literal, $version:literal, $ty:ty) => {
            // SAFETY: as for `required!`.
            find($name, $version).map(|p| unsafe { std::mem::transmute::<*mut c_void, $ty>(p) })
        };
    }
    Ok(Lib {
        get_device_list: required!("ibv_get_device_list", "IBVERBS_1.1", GetDeviceList),
        free_device_list: required!("ibv_free_device_list", "IBVERBS_1.1", FreeDeviceList),
        get_device_name: required!("ibv_get_device_name", "IBVERBS_1.1", GetDeviceName),
        open_device: required!("ibv_open_device", "IBVERBS_1.1", OpenDevice),
        close_device: required!("ibv_close_device", "IBVERBS_1.1", CloseDevice),
        query_device: required!("ibv_query_device", "IBVERBS_1.1", QueryDevice),
        query_port: required!("ibv_query_port", "IBVERBS_1.1", QueryPort),
        query_gid: required!("ibv_query_gid", "IBVERBS_1.1", QueryGid),
        alloc_pd: required!("ibv_alloc_pd", "IBVERBS_1.1", AllocPd),
        dealloc_pd: required!("ibv_dealloc_pd", "IBVERBS_1.1", DeallocPd),
        reg_mr: required!("ibv_reg_mr", "IBVERBS_1.1", RegMr),
        dereg_mr: required!("ibv_dereg_mr", "IBVERBS_1.1", DeregMr),
        // Released in 1.0 and never re-versioned: a 1.1 lookup finds nothing.
        create_comp_channel: required!("ibv_create_comp_channel", "IBVERBS_1.0", CreateCompChannel),
        destroy_comp_channel: required!(
            "ibv_destroy_comp_channel",
            "IBVERBS_1.0",
            DestroyCompChannel
        ),
        create_cq: required!("ibv_create_cq", "IBVERBS_1.1", CreateCq),
        resize_cq: required!("ibv_resize_cq", "IBVERBS_1.1", ResizeCq),
        destroy_cq: required!("ibv_destroy_cq", "IBVERBS_1.1", DestroyCq),
        get_cq_event: required!("ibv_get_cq_event", "IBVERBS_1.1", GetCqEvent),
        ack_cq_events: required!("ibv_ack_cq_events", "IBVERBS_1.1", AckCqEvents),
        create_qp: required!("ibv_create_qp", "IBVERBS_1.1", CreateQp),
        modify_qp: required!("ibv_modify_qp", "IBVERBS_1.1", ModifyQp),
        destroy_qp: required!("ibv_destroy_qp", "IBVERBS_1.1", DestroyQp),
        get_async_event: required!("ibv_get_async_event", "IBVERBS_1.1", GetAsyncEvent),
        ack_async_event: required!("ibv_ack_async_event", "IBVERBS_1.1", AckAsyncEvent),
        fork_init: required!("ibv_fork_init", "IBVERBS_1.1", ForkInit),
        query_gid_ex: optional!("_ibv_query_gid_ex", "IBVERBS_1.11", QueryGidEx),
        reg_mr_iova2: optional!("ibv_reg_mr_iova2", "IBVERBS_1.8", RegMrIova2),
        reg_dmabuf_mr: optional!("ibv_reg_dmabuf_mr", "IBVERBS_1.12", RegDmabufMr),
        is_fork_initialized: optional!(
            "ibv_is_fork_initialized",
            "IBVERBS_1.13",
            IsForkInitialized
        ),
        path: path.to_owned(),
    })
}

pub(super) fn errno() -> io::Error {
    io::Error::last_os_error()
}

/// An errno a verbs call returned (rather than set).
pub(super) fn returned(rc: c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        rc if rc > 0 => Err(io::Error::from_raw_os_error(rc)),
        // Some providers return -errno.
        rc => Err(io::Error::from_raw_os_error(-rc)),
    }
}

impl Lib {
    /// Runs `f` over the device list, each device with its name, then frees the list (an
    /// unopened device dies with it).
    ///
    /// # Errors
    ///
    /// What `ibv_get_device_list` set errno to (ENOSYS: the kernel has no RDMA support).
    pub(super) fn with_devices<T>(
        &self,
        f: impl FnOnce(&[(*mut c_void, String)]) -> T,
    ) -> io::Result<T> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a live int the call writes the count into.
        let list = unsafe { (self.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(errno());
        }
        let devices: Vec<(*mut c_void, String)> = (0..usize::try_from(n).unwrap_or(0))
            .map(|i| {
                // SAFETY: the list holds `n` device pointers, then NULL.
                let dev = unsafe { *list.add(i) };
                // SAFETY: a device of the live list; its name is NUL-terminated and lives
                // in it, and is copied here.
                let name = unsafe { CStr::from_ptr((self.get_device_name)(dev)) };
                (dev, name.to_string_lossy().into_owned())
            })
            .collect();
        let result = f(&devices);
        // SAFETY: the list came from get_device_list and is freed once; `f` has returned,
        // and a context it opened outlives the list.
        unsafe { (self.free_device_list)(list) };
        Ok(result)
    }

    /// The names of the RDMA devices, in the library's order.
    ///
    /// # Errors
    ///
    /// As for the device list (ENOSYS: no RDMA in the kernel).
    pub(crate) fn device_names(&self) -> io::Result<Vec<String>> {
        self.with_devices(|devices| devices.iter().map(|(_, name)| name.clone()).collect())
    }

    /// Calls `ibv_fork_init` unless the kernel makes it needless (5.13 and later copy pinned
    /// pages on fork; `ibv_is_fork_initialized` says `UNNEEDED`). Returns whether it called.
    pub(crate) fn fork_init_if_needed(&self) -> bool {
        if let Some(is_init) = self.is_fork_initialized {
            // SAFETY: takes nothing, reads the library's state.
            if unsafe { is_init() } == IBV_FORK_UNNEEDED {
                return false;
            }
        }
        // SAFETY: takes nothing; called before the first registration of this process.
        unsafe { (self.fork_init)() };
        true
    }
}
