//! Finding verbs devices: loading libibverbs, listing and describing devices
//! (`ibv_devices`, `ibv_devinfo -v`), reading a port's GID table and choosing the RoCE v2 GID
//! of the local address.

use std::io;
use std::net::Ipv6Addr;
use std::sync::Arc;

use ferroce_proto::qp::Mtu;

use super::abi::*;
use super::ffi::{self, Context, Lib, Opened};
use crate::attr::{DeviceInfo, DeviceOptions, Gid, GidTable, GidType, PortInfo, SOFT_DEVICE};
use crate::error::VerbsError;

fn port_state_name(state: u32) -> &'static str {
    match state {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        IBV_PORT_ACTIVE => "PORT_ACTIVE",
        5 => "PORT_ACTIVE_DEFER",
        _ => "PORT_NOP",
    }
}

/// A failed call on `device`, with no hint.
pub(super) fn call_failed(device: &str, call: &'static str, source: io::Error) -> VerbsError {
    VerbsError::Call {
        device: device.to_owned(),
        call,
        source,
        hint: None,
    }
}

/// libibverbs, or the error that says why not.
fn library() -> Result<&'static Lib, VerbsError> {
    ffi::lib().map_err(|e| VerbsError::LibraryMissing {
        path: e.path,
        reason: e.reason,
    })
}

/// The error of a device list that could not be had.
fn list_failed(source: io::Error) -> VerbsError {
    if source.raw_os_error() == Some(libc::ENOSYS) {
        VerbsError::NoKernelSupport { source }
    } else {
        VerbsError::Call {
            device: "(all)".into(),
            call: "ibv_get_device_list",
            source,
            hint: None,
        }
    }
}

/// The libibverbs file in use (`libibverbs.so.1`, or `FERROCE_IBVERBS`'s).
///
/// # Errors
///
/// [`VerbsError::LibraryMissing`] when it cannot be loaded.
pub fn library_path() -> Result<String, VerbsError> {
    Ok(library()?.path.clone())
}

/// The names of this host's verbs devices (`ibv_devices`), without the soft NIC.
///
/// # Errors
///
/// [`VerbsError::LibraryMissing`] without libibverbs, [`VerbsError::NoKernelSupport`] when the
/// kernel has no RDMA.
pub fn devices() -> Result<Vec<String>, VerbsError> {
    library()?.device_names().map_err(list_failed)
}

pub(super) fn open_context(name: &str) -> Result<Arc<Context>, VerbsError> {
    match library()?.open(name).map_err(list_failed)? {
        Opened::Context(ctx) => Ok(Arc::new(ctx)),
        Opened::NotFound(names) => Err(VerbsError::NoSuchDevice {
            name: name.to_owned(),
            found: std::iter::once(SOFT_DEVICE.to_owned())
                .chain(names)
                .collect(),
        }),
        Opened::Refused(source) => Err(VerbsError::Call {
            device: name.to_owned(),
            call: "ibv_open_device",
            source,
            hint: Some("is /dev/infiniband/uverbs* readable by this user?"),
        }),
    }
}

/// The GID table of `port`, with types and interfaces (from the library, or from sysfs
/// where the library is older than rdma-core 32).
pub(super) fn gid_table(ctx: &Context, device: &str, port: u8, len: i32) -> GidTable {
    let mut table = Vec::new();
    for index in 0..u32::try_from(len).unwrap_or(0) {
        let Ok(Some(entry)) = ctx.query_gid(port, index) else {
            continue;
        };
        let gid = Ipv6Addr::from(entry.gid.raw);
        if gid.is_unspecified() {
            continue;
        }
        let sysfs = |what: &str| {
            std::fs::read_to_string(format!(
                "/sys/class/infiniband/{device}/ports/{port}/gid_attrs/{what}/{index}"
            ))
            .ok()
            .map(|s| s.trim().to_owned())
        };
        let kind = match entry.gid_type {
            IBV_GID_TYPE_IB => GidType::Ib,
            IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            _ => match sysfs("types").as_deref() {
                Some("RoCE v2") => GidType::RoceV2,
                Some("IB/RoCE v1") => GidType::RoceV1,
                _ => GidType::Unknown,
            },
        };
        table.push(Gid {
            index,
            gid,
            kind,
            netdev: sysfs("ndevs"),
        });
    }
    GidTable(table)
}

/// What `ibv_devinfo -v` shows of `name`: the device, its ports and their GID tables.
///
/// # Errors
///
/// The [`VerbsError`]s of opening the device, and [`VerbsError::Call`] when a query fails.
pub fn describe(name: &str) -> Result<DeviceInfo, VerbsError> {
    let ctx = open_context(name)?;
    let call = |call, source| call_failed(name, call, source);
    let attr = ctx
        .query_device()
        .map_err(|e| call("ibv_query_device", e))?;
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        let p = ctx
            .query_port(port)
            .map_err(|e| call("ibv_query_port", e))?;
        ports.push(PortInfo {
            port,
            state: port_state_name(p.state),
            max_mtu: Mtu::from_ibv_value(p.max_mtu.into()),
            active_mtu: Mtu::from_ibv_value(p.active_mtu.into()),
            link_layer: match p.link_layer {
                IBV_LINK_LAYER_INFINIBAND => "InfiniBand",
                IBV_LINK_LAYER_ETHERNET => "Ethernet",
                _ => "Unspecified",
            },
            gids: gid_table(&ctx, name, port, p.gid_tbl_len),
        });
    }
    let fw_end = attr.fw_ver.iter().position(|&b| b == 0).unwrap_or(64);
    // A __be64: its bytes in memory are the GUID in order.
    let g = attr.node_guid.to_ne_bytes();
    Ok(DeviceInfo {
        name: name.to_owned(),
        fw_ver: String::from_utf8_lossy(&attr.fw_ver.map(|c| c as u8)[..fw_end]).into_owned(),
        node_guid: format!(
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
        ),
        vendor_id: attr.vendor_id,
        vendor_part_id: attr.vendor_part_id,
        hw_ver: attr.hw_ver,
        max_qp: attr.max_qp,
        max_qp_wr: attr.max_qp_wr,
        max_sge: attr.max_sge,
        max_cq: attr.max_cq,
        max_cqe: attr.max_cqe,
        max_mr: attr.max_mr,
        max_qp_rd_atom: attr.max_qp_rd_atom,
        ports,
    })
}

/// Chooses the GID as [`DeviceOptions`] asks, from `table`.
pub(super) fn choose_gid(table: &GidTable, options: &DeviceOptions) -> Result<Gid, String> {
    let v2 = |g: &&Gid| matches!(g.kind, GidType::RoceV2 | GidType::Unknown);
    if let Some(index) = options.gid_index {
        let g = table
            .0
            .iter()
            .find(|g| g.index == index)
            .ok_or_else(|| format!("GID index {index} is empty"))?;
        if !v2(&g) {
            return Err(format!(
                "GID index {index} is {}; ferroce speaks RoCE v2 only",
                g.kind
            ));
        }
        if let Some(ip) = options.local {
            if g.ip() != ip {
                return Err(format!("GID index {index} is {}, not {ip}", g.gid));
            }
        }
        return Ok(g.clone());
    }
    if let Some(ip) = options.local {
        return table
            .0
            .iter()
            .filter(v2)
            .find(|g| g.ip() == ip)
            .cloned()
            .ok_or_else(|| format!("no RoCE v2 GID for {ip}"));
    }
    table
        .0
        .iter()
        .filter(v2)
        .find(|g| g.gid.to_ipv4_mapped().is_some())
        .or_else(|| {
            table
                .0
                .iter()
                .filter(v2)
                .find(|g| g.gid.segments()[0] & 0xffc0 != 0xfe80)
        })
        .cloned()
        .ok_or_else(|| "no RoCE v2 GID with a routable address".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rxe_table() -> GidTable {
        GidTable(vec![
            Gid {
                index: 0,
                gid: "fe80::5054:ff:fe00:11".parse().unwrap(),
                kind: GidType::RoceV2,
                netdev: Some("eth0".into()),
            },
            Gid {
                index: 1,
                gid: "::ffff:10.77.0.11".parse().unwrap(),
                kind: GidType::RoceV2,
                netdev: Some("eth0".into()),
            },
        ])
    }

    fn connectx_table() -> GidTable {
        let mut t = Vec::new();
        for (i, (gid, kind)) in [
            ("fe80::1", GidType::RoceV1),
            ("fe80::1", GidType::RoceV2),
            ("::ffff:10.0.0.5", GidType::RoceV1),
            ("::ffff:10.0.0.5", GidType::RoceV2),
        ]
        .into_iter()
        .enumerate()
        {
            t.push(Gid {
                index: i as u32,
                gid: gid.parse().unwrap(),
                kind,
                netdev: None,
            });
        }
        GidTable(t)
    }

    #[test]
    fn the_default_gid_is_the_first_ipv4_roce_v2_one() {
        let o = DeviceOptions::default();
        assert_eq!(choose_gid(&rxe_table(), &o).unwrap().index, 1);
        assert_eq!(choose_gid(&connectx_table(), &o).unwrap().index, 3);
    }

    #[test]
    fn a_local_address_picks_its_own_gid_and_a_wrong_one_is_refused() {
        let mut o = DeviceOptions {
            local: Some("10.77.0.11".parse().unwrap()),
            ..DeviceOptions::default()
        };
        assert_eq!(choose_gid(&rxe_table(), &o).unwrap().index, 1);
        o.local = Some("10.77.0.99".parse().unwrap());
        let e = choose_gid(&rxe_table(), &o).unwrap_err();
        assert!(e.contains("10.77.0.99"), "{e}");
    }

    #[test]
    fn an_index_is_taken_as_given_unless_it_is_empty_or_roce_v1() {
        let o = |i| DeviceOptions {
            gid_index: Some(i),
            ..DeviceOptions::default()
        };
        assert_eq!(choose_gid(&rxe_table(), &o(0)).unwrap().index, 0);
        assert!(choose_gid(&rxe_table(), &o(7))
            .unwrap_err()
            .contains("empty"));
        assert!(choose_gid(&connectx_table(), &o(2))
            .unwrap_err()
            .contains("RoCE v1"));
    }

    #[test]
    fn the_table_prints_one_entry_per_line() {
        let text = rxe_table().to_string();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains("::ffff:10.77.0.11, RoCE v2 (eth0)"), "{text}");
    }
}
