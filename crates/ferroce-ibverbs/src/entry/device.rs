//! Device `ferroce0` and what a program does with it before any queue exists: list it, open
//! and close it, query it, its port, GID and P_Key tables, allocate PDs, read async events.
//!
//! Memory: the device is one `verbs_device`-shaped block allocated at the first
//! `ibv_get_device_list` and never freed (rdma-core's devices also outlive their lists).
//! A context is a boxed `verbs_context` whose last member, the `ibv_context`, is the pointer
//! the program holds; its Rust state is in `crate::context`'s registry under that address.
//! A PD is a boxed `ibv_pd`, registered likewise.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::{offset_of, size_of};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use crate::abi::*;
use crate::addr;
use crate::attrs;
use crate::context::{self, ContextState};
use crate::entry::stubs;
use crate::fence;
use crate::objects;
use crate::settings::Settings;

/// The device block: rdma-core's `verbs_device`, then what ferroce keeps of the device.
#[repr(C)]
struct DeviceBlock {
    vdev: verbs_device,
    /// The node GUID, in memory order (`__be64`).
    guid: [u8; 8],
}

/// The address of the one device block, once allocated.
static DEVICE: OnceLock<usize> = OnceLock::new();

/// Copies `s` into a C `char` array, NUL-terminated, truncating if it must.
fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (d, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *d = b as c_char;
    }
    out
}

/// The device block, allocated on first use.
fn device() -> *mut DeviceBlock {
    let addr = *DEVICE.get_or_init(|| {
        // The GUID shows the address the device will open on; an unusable FERROCE_ADDR gives
        // the unspecified address here and fails at `ibv_open_device`, which says why.
        let ip = addr::choose()
            .map_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |c| {
                c.ip
            });
        let ops = Box::leak(Box::new(verbs_device_ops {
            name: c"ferroce".as_ptr(),
            match_min_abi_version: 0,
            match_max_abi_version: 0,
            match_table: ptr::null(),
            rest: [None; 5],
        }));
        let block = Box::new(DeviceBlock {
            vdev: verbs_device {
                device: ibv_device {
                    ops: ibv_device_ops {
                        dummy1: None,
                        dummy2: None,
                    },
                    node_type: IBV_NODE_CA,
                    transport_type: IBV_TRANSPORT_IB,
                    name: c_array(attrs::DEVICE_NAME),
                    dev_name: c_array(attrs::DEV_NAME),
                    dev_path: c_array(attrs::DEV_PATH),
                    ibdev_path: c_array(attrs::IBDEV_PATH),
                },
                ops: ptr::from_ref(ops),
                refcount: 1,
                entry: list_node {
                    next: ptr::null_mut(),
                    prev: ptr::null_mut(),
                },
                sysfs: ptr::null_mut(),
                core_support: 0,
            },
            guid: attrs::guid(ip),
        });
        Box::into_raw(block) as usize
    });
    addr as *mut DeviceBlock
}

/// The device block behind `dev`, if `dev` is ferroce's device.
fn our_device(dev: *mut ibv_device) -> Option<*mut DeviceBlock> {
    let block = device();
    (!dev.is_null() && dev == block.cast::<ibv_device>()).then_some(block)
}

/// The state of the context at `ctx`, or `EINVAL`.
fn state(ctx: *mut ibv_context) -> Result<Arc<ContextState>, c_int> {
    context::context(ctx as usize).ok_or(libc::EINVAL)
}

/// The `verbs_context` whose last member is `ctx`.
fn verbs_context_of(ctx: *mut ibv_context) -> *mut verbs_context {
    ctx.cast::<u8>()
        .wrapping_sub(offset_of!(verbs_context, context))
        .cast()
}

/// `ibv_get_device_list`: a NULL-terminated array holding device `ferroce0`; `*num_devices`
/// (when given) is 1. Free it with `ibv_free_device_list`.
pub(crate) unsafe extern "C" fn get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device {
    fence::pointer(|| {
        let list: Box<[*mut ibv_device; 2]> =
            Box::new([device().cast::<ibv_device>(), ptr::null_mut()]);
        let list = Box::into_raw(list).cast::<*mut ibv_device>();
        context::add_device_list(list as usize);
        if !num_devices.is_null() {
            // SAFETY: the caller passes NULL or a pointer to an int it owns.
            unsafe { num_devices.write(1) };
        }
        Ok(list)
    })
}

/// `ibv_free_device_list`: frees an array `ibv_get_device_list` returned. Anything else,
/// and a second free, is ignored.
pub(crate) unsafe extern "C" fn free_device_list(list: *mut *mut ibv_device) {
    fence::unit(|| {
        if context::remove_device_list(list as usize) {
            // SAFETY: the registry says `list` came from `Box::into_raw` of this type in
            // `get_device_list` and has not been freed.
            drop(unsafe { Box::from_raw(list.cast::<[*mut ibv_device; 2]>()) });
        }
    });
}

/// `ibv_get_device_name`: `"ferroce0"`; NULL with `EINVAL` for a device not of this library.
pub(crate) unsafe extern "C" fn get_device_name(dev: *mut ibv_device) -> *const c_char {
    fence::pointer(|| {
        let block = our_device(dev).ok_or(libc::EINVAL)?;
        // SAFETY: `block` is the live device block; the name lives as long as it.
        Ok(unsafe { (&raw mut (*block).vdev.device.name).cast::<c_char>() })
    })
}

/// `ibv_get_device_guid`: the node GUID (`__be64`); 0 for a device not of this library.
pub(crate) unsafe extern "C" fn get_device_guid(dev: *mut ibv_device) -> u64 {
    fence::value(
        || 0,
        || match our_device(dev) {
            // SAFETY: `block` is the live device block.
            Some(block) => u64::from_ne_bytes(unsafe { (*block).guid }),
            None => {
                crate::sys::set_errno(libc::EINVAL);
                0
            }
        },
    )
}

/// `ibv_get_device_index`: 0, the only device; -1 for a device not of this library.
pub(crate) unsafe extern "C" fn get_device_index(dev: *mut ibv_device) -> c_int {
    fence::minus_one(|| our_device(dev).map(|_| 0).ok_or(libc::EINVAL))
}

/// `ibv_open_device`: opens the soft NIC (shared by every context of the process) on
/// `FERROCE_ADDR` or the default route's address. Fails with NULL and errno `EADDRINUSE`
/// (another process has the address), `EADDRNOTAVAIL` (not an address of this host) or
/// `EINVAL` (an unusable `FERROCE_ADDR`, `FERROCE_FAULT` or `FERROCE_STATS`; a foreign
/// device), or the capture's errno (`FERROCE_PCAP` cannot be written), saying which on
/// standard error.
pub(crate) unsafe extern "C" fn open_device(dev: *mut ibv_device) -> *mut ibv_context {
    fence::pointer(|| {
        let block = our_device(dev).ok_or(libc::EINVAL)?;
        let choice = addr::choose().map_err(|bad| {
            eprintln!("ferroce-ibverbs: {bad}");
            libc::EINVAL
        })?;
        let settings = Settings::from_env().map_err(|bad| {
            eprintln!("ferroce-ibverbs: {bad}");
            libc::EINVAL
        })?;
        let state = ContextState::open(&choice, &settings).map_err(|e| {
            eprintln!("ferroce-ibverbs: {}", e.message);
            e.errno
        })?;
        // Its SRQ and QP events reach the contexts' async fds through the objects' poller.
        objects::watch_async(&state.nic)?;
        let vctx = Box::new(verbs_context {
            query_port: Some(query_port_op),
            advise_mr: None,
            alloc_null_mr: None,
            read_counters: None,
            attach_counters_point_flow: None,
            create_counters: None,
            destroy_counters: None,
            reg_dm_mr: None,
            alloc_dm: None,
            free_dm: None,
            modify_flow_action_esp: None,
            destroy_flow_action: None,
            create_flow_action_esp: None,
            modify_qp_rate_limit: None,
            alloc_parent_domain: None,
            dealloc_td: None,
            alloc_td: None,
            modify_cq: None,
            post_srq_ops: None,
            destroy_rwq_ind_table: None,
            create_rwq_ind_table: None,
            destroy_wq: None,
            modify_wq: None,
            create_wq: None,
            query_rt_values: None,
            create_cq_ex: None,
            priv_: ptr::null_mut(),
            query_device_ex: None,
            ibv_destroy_flow: None,
            abi_placeholder2: None,
            ibv_create_flow: None,
            abi_placeholder1: None,
            open_qp: None,
            create_qp_ex: None,
            get_srq_num: None,
            create_srq_ex: None,
            open_xrcd: None,
            close_xrcd: None,
            abi_placeholder3: 0,
            sz: size_of::<verbs_context>(),
            context: ibv_context {
                device: block.cast(),
                ops: stubs::context_ops(),
                // No kernel command channel: nothing may write to it.
                cmd_fd: -1,
                async_fd: state.async_fd(),
                num_comp_vectors: 1,
                mutex: libc::PTHREAD_MUTEX_INITIALIZER,
                abi_compat: VERBS_ABI_IS_EXTENDED,
            },
        });
        let vctx = Box::into_raw(vctx);
        // SAFETY: `vctx` was just allocated; the field is in it.
        let ctx = unsafe { &raw mut (*vctx).context };
        context::add_context(ctx as usize, Arc::new(state));
        Ok(ctx)
    })
}

/// Frees what a program left in the context at `ctx` when it closes it (as the kernel
/// cleans up a closed device file): QPs, SRQs, address handles, CQs, channels, regions.
fn free_objects_of(ctx: usize) {
    use crate::objects::{AHS, CHANNELS, CQS, MRS, QPS, SRQS};
    for (at, _) in QPS.drain(|s| s.ctx == ctx) {
        // SAFETY: the table held `at` as a live `ibv_qp` from `Box::into_raw` in its
        // create function, and has just forgotten it.
        drop(unsafe { Box::from_raw(at as *mut ibv_qp) });
    }
    for (at, _) in SRQS.drain(|s| s.ctx == ctx) {
        // SAFETY: the table held `at` as a live `ibv_srq` from `Box::into_raw` in its
        // create function, and has just forgotten it.
        drop(unsafe { Box::from_raw(at as *mut ibv_srq) });
    }
    for (at, _) in AHS.drain(|s| s.ctx == ctx) {
        // SAFETY: the table held `at` as a live `ibv_ah` from `Box::into_raw` in its
        // create function, and has just forgotten it.
        drop(unsafe { Box::from_raw(at as *mut ibv_ah) });
    }
    for (at, _) in CQS.drain(|s| s.ctx == ctx) {
        // SAFETY: the table held `at` as a live `ibv_cq` from `Box::into_raw` in its
        // create function, and has just forgotten it.
        drop(unsafe { Box::from_raw(at as *mut ibv_cq) });
    }
    for (at, _) in CHANNELS.drain(|s| s.ctx == ctx) {
        // SAFETY: the table held `at` as a live `ibv_comp_channel` from `Box::into_raw` in its
        // create function, and has just forgotten it.
        drop(unsafe { Box::from_raw(at as *mut ibv_comp_channel) });
    }
    for (at, mr) in MRS.drain(|s| s.ctx == ctx) {
        if let Some(region) = mr.region.lock().map_or(None, |mut r| r.take()) {
            let _ = region.deregister();
        }
        // SAFETY: the table held `at` as a live `ibv_mr` from `Box::into_raw` in its
        // create function, and has just forgotten it.
        drop(unsafe { Box::from_raw(at as *mut ibv_mr) });
    }
}

/// `ibv_close_device`: frees the context (and the PDs and data-path objects left in it); the last context closes the
/// soft NIC. `EINVAL` for a pointer that is not an open context.
pub(crate) unsafe extern "C" fn close_device(ctx: *mut ibv_context) -> c_int {
    fence::errno(|| {
        let (state, pds) = context::remove_context(ctx as usize).ok_or(libc::EINVAL)?;
        free_objects_of(ctx as usize);
        for pd in pds {
            // SAFETY: the registry held `pd` as a live PD from `Box::into_raw` in `alloc_pd`
            // and has just forgotten it.
            drop(unsafe { Box::from_raw(pd as *mut ibv_pd) });
        }
        // SAFETY: `ctx` was a live context, the `context` member of a `verbs_context` boxed
        // in `open_device`, and the registry has just forgotten it.
        drop(unsafe { Box::from_raw(verbs_context_of(ctx)) });
        drop(state);
        Ok(())
    })
}

/// `ibv_query_device`: the soft NIC's attributes (`crate::attrs` says where each number
/// comes from).
pub(crate) unsafe extern "C" fn query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    fence::errno(|| {
        let state = state(ctx)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        let value = attrs::device_attr(state.ip, &state.nic.caps());
        // SAFETY: the caller passes a `struct ibv_device_attr` to fill.
        unsafe { attr.write_unaligned(value) };
        Ok(())
    })
}

/// Port 1's attributes, or `EINVAL` for another port.
fn port_attr(ctx: *mut ibv_context, port: u8) -> Result<ibv_port_attr, c_int> {
    let state = state(ctx)?;
    if port != attrs::PORT {
        return Err(libc::EINVAL);
    }
    Ok(attrs::port_attr(state.nic.active_mtu()))
}

/// Copies the first `len` bytes of `value` to `dst`.
///
/// # Safety
///
/// `dst` must be valid for `len` bytes of writes, and `len` at most `size_of::<T>()`.
unsafe fn copy_prefix<T>(value: &T, dst: *mut c_void, len: usize) {
    debug_assert!(len <= size_of::<T>());
    // SAFETY: `value` has `size_of::<T>()` ≥ `len` readable bytes; the caller vouches for
    // `dst`; a stack value and the caller's buffer cannot overlap.
    unsafe { ptr::copy_nonoverlapping(ptr::from_ref(value).cast::<u8>(), dst.cast(), len) };
}

/// `ibv_query_port` (the exported function): what programs built before rdma-core v17, or
/// calling it by `dlsym`, get — the fields up to `flags` (`struct _compat_ibv_port_attr`).
pub(crate) unsafe extern "C" fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut c_void,
) -> c_int {
    fence::errno(|| {
        let value = port_attr(ctx, port)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct _compat_ibv_port_attr` (48 bytes) to fill.
        unsafe { copy_prefix(&value, attr, COMPAT_PORT_ATTR_SIZE) };
        Ok(())
    })
}

/// `verbs_context.query_port`, which `verbs.h`'s `ibv_query_port` calls: zeroes the
/// caller's `len` bytes (its `sizeof(struct ibv_port_attr)`, larger in newer rdma-core)
/// and fills what this library's layout has of them.
pub(crate) unsafe extern "C" fn query_port_op(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut c_void,
    len: usize,
) -> c_int {
    fence::errno(|| {
        let value = port_attr(ctx, port)?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes `len` writable bytes (`sizeof` of its port attributes).
        unsafe {
            ptr::write_bytes(attr.cast::<u8>(), 0, len);
            copy_prefix(&value, attr, len.min(size_of::<ibv_port_attr>()));
        }
        Ok(())
    })
}

/// The GID table entry at (`port`, `index`): only (1, 0) exists.
fn gid_entry(ctx: *mut ibv_context, port: u32, index: u32) -> Result<ibv_gid_entry, c_int> {
    let state = state(ctx)?;
    if port != u32::from(attrs::PORT) || index != 0 {
        return Err(libc::EINVAL);
    }
    Ok(attrs::gid_entry(state.ip, state.ndev_ifindex))
}

/// `ibv_query_gid`: index 0 is the IPv4-mapped (or IPv6) address; -1 with `EINVAL` for any
/// other index or port.
pub(crate) unsafe extern "C" fn query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    fence::minus_one(|| {
        let index = u32::try_from(index).map_err(|_| libc::EINVAL)?;
        let entry = gid_entry(ctx, port.into(), index)?;
        if gid.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `union ibv_gid` to fill.
        unsafe { gid.write_unaligned(entry.gid) };
        Ok(0)
    })
}

/// `_ibv_query_gid_ex` (behind `verbs.h`'s `ibv_query_gid_ex`): the entry with its type,
/// RoCE v2, and the index of the interface holding the address. Returns an errno.
pub(crate) unsafe extern "C" fn query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    fence::errno(|| {
        let value = gid_entry(ctx, port, index)?;
        if entry.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `struct ibv_gid_entry` (at least `entry_size` bytes).
        unsafe { entry.write_unaligned(value) };
        Ok(())
    })
}

/// `_ibv_query_gid_table` (behind `ibv_query_gid_table`): the one entry; `-EINVAL` when
/// there is no room for it.
pub(crate) unsafe extern "C" fn query_gid_table(
    ctx: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    fence::value(
        || -(libc::EIO as isize),
        || {
            let value = match gid_entry(ctx, attrs::PORT.into(), 0) {
                Ok(v) => v,
                Err(e) => return -(e as isize),
            };
            if entries.is_null()
                || max_entries < 1
                || flags != 0
                || entry_size < size_of::<ibv_gid_entry>()
            {
                return -(libc::EINVAL as isize);
            }
            // SAFETY: the caller passes an array of `max_entries` ≥ 1 entries of
            // `entry_size` bytes; the first is a `struct ibv_gid_entry`.
            unsafe { entries.write_unaligned(value) };
            1
        },
    )
}

/// `ibv_query_gid_type` (rdma-core private, used by `ibv_devinfo`): `IBV_GID_TYPE_SYSFS_ROCE_V2`
/// at index 0; -1 with `EINVAL` elsewhere.
pub(crate) unsafe extern "C" fn query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: c_uint,
    gid_type: *mut c_int,
) -> c_int {
    fence::minus_one(|| {
        gid_entry(ctx, port.into(), index)?;
        if gid_type.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes an `enum ibv_gid_type_sysfs` to fill.
        unsafe { gid_type.write_unaligned(IBV_GID_TYPE_SYSFS_ROCE_V2) };
        Ok(0)
    })
}

/// `ibv_query_pkey`: 0xffff (big-endian) at index 0; -1 with `EINVAL` elsewhere.
pub(crate) unsafe extern "C" fn query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    fence::minus_one(|| {
        state(ctx)?;
        if port != attrs::PORT || index != 0 || pkey.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller passes a `__be16` to fill.
        unsafe { pkey.write_unaligned(attrs::DEFAULT_PKEY.to_be()) };
        Ok(0)
    })
}

/// `ibv_get_pkey_index`: 0 for the default P_Key (big-endian 0xffff); -1 for any other.
pub(crate) unsafe extern "C" fn get_pkey_index(
    ctx: *mut ibv_context,
    port: u8,
    pkey: u16,
) -> c_int {
    fence::minus_one(|| {
        state(ctx)?;
        if port != attrs::PORT || u16::from_be(pkey) != attrs::DEFAULT_PKEY {
            return Err(libc::EINVAL);
        }
        Ok(0)
    })
}

/// PD handles, as the kernel numbers them: from 0, per process.
static PD_HANDLES: AtomicU32 = AtomicU32::new(0);

/// `ibv_alloc_pd`: a new protection domain of the context.
pub(crate) unsafe extern "C" fn alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    fence::pointer(|| {
        state(ctx)?;
        let pd = Box::into_raw(Box::new(ibv_pd {
            context: ctx,
            handle: PD_HANDLES.fetch_add(1, Ordering::Relaxed),
        }));
        context::add_pd(pd as usize, ctx as usize);
        Ok(pd)
    })
}

/// `ibv_dealloc_pd`: frees the PD; `EBUSY` while a region, QP, SRQ or address handle of it
/// is live, `EINVAL` for a pointer that is not a live PD.
pub(crate) unsafe extern "C" fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    fence::errno(|| {
        if objects::pd_in_use(pd as usize) {
            return Err(libc::EBUSY);
        }
        if !context::remove_pd(pd as usize) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the registry held `pd` as a live PD from `Box::into_raw` in `alloc_pd` and
        // has just forgotten it.
        drop(unsafe { Box::from_raw(pd) });
        Ok(())
    })
}

/// `ibv_get_async_event`: waits for the context's next asynchronous event (an SRQ below its
/// armed limit, a QP's last WQE on an SRQ) and fills `event`. -1 with errno `EAGAIN` when
/// `async_fd` is non-blocking and none waits; `EINVAL` for a bad context.
pub(crate) unsafe extern "C" fn get_async_event(
    ctx: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    fence::minus_one(|| {
        let state = state(ctx)?;
        if event.is_null() {
            return Err(libc::EINVAL);
        }
        let e = state
            .next_event()
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        // SAFETY: the caller passes a `struct ibv_async_event` to fill.
        unsafe {
            event.write_unaligned(ibv_async_event {
                element: e.element as *mut c_void,
                event_type: e.event_type,
            });
        }
        Ok(0)
    })
}

/// `ibv_ack_async_event`: nothing to release yet (rdma-core counts acknowledgements so that
/// destroying a QP or CQ waits for its events; the later stages will).
pub(crate) unsafe extern "C" fn ack_async_event(_event: *mut ibv_async_event) {
    fence::unit(|| ());
}

/// Opens device `ferroce0` for the drop-in librdmacm (`crate::entry::cm`): what
/// `ibv_open_device` on the device list's one entry gives, NULL with errno set when it fails.
pub(crate) fn open_ferroce0() -> *mut ibv_context {
    // SAFETY: `device()` is this library's own device block, the pointer `ibv_open_device`
    // takes.
    unsafe { open_device(device().cast()) }
}
