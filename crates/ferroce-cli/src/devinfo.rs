//! `ferroce devinfo`: the devices this host can use, in the shape of rdma-core's
//! `ibv_devinfo`: the soft NIC (`ferroce0`) first, then every verbs device, with their ports,
//! states, MTUs and GID tables.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::process::ExitCode;

/// Appends a line to the report, which is written at the end in one piece (a closed pipe,
/// as with `| head`, then ends the output quietly rather than with a panic).
macro_rules! out {
    ($buf:ident) => {{
        let _ = writeln!($buf);
    }};
    ($buf:ident, $($arg:tt)*) => {{
        let _ = writeln!($buf, $($arg)*);
    }};
}

use clap::Args;
use ferroce::proto::qp::Mtu;
use ferroce::verbs::{self, DeviceInfo, GidTable, SOFT_DEVICE};

/// `ibv_devinfo`'s flags.
#[derive(Args, Debug)]
pub(crate) struct DevinfoArgs {
    /// Only this device (`ferroce0`, `rxe0`, `mlx5_0`, …).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Only this port.
    #[arg(short = 'i', long = "ib-port")]
    ib_port: Option<u8>,
    /// Print the device's limits too.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// Print only the devices' names.
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// The soft NIC's address, whose interface gives its MTU (127.0.0.1).
    #[arg(long = "local", default_value = "127.0.0.1")]
    local: IpAddr,
}

fn mtu_text(mtu: Option<Mtu>) -> String {
    mtu.map_or_else(
        || "invalid".to_owned(),
        |m| format!("{} ({})", m.bytes(), m.ibv_value()),
    )
}

fn print_soft(o: &mut String, args: &DevinfoArgs) {
    let mtu = ferroce::nic::active_mtu_on(args.local);
    out!(o, "hca_id:\t{SOFT_DEVICE}");
    out!(
        o,
        "\ttransport:\t\t\tferroce soft RoCE v2 (UDP {})",
        args.local
    );
    out!(o, "\tphys_port_cnt:\t\t\t1");
    if args.ib_port.is_some_and(|p| p != 1) {
        return;
    }
    out!(o, "\t\tport:\t1");
    out!(o, "\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
    out!(o, "\t\t\tmax_mtu:\t\t{}", mtu_text(Some(Mtu::M4096)));
    out!(o, "\t\t\tactive_mtu:\t\t{}", mtu_text(Some(mtu)));
    out!(o, "\t\t\tlink_layer:\t\tEthernet");
    let gid = match args.local {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    out!(
        o,
        "{}",
        indent(&GidTable(vec![verbs::Gid {
            index: 0,
            gid,
            kind: verbs::GidType::RoceV2,
            netdev: None,
        }]))
    );
    out!(o);
}

fn indent(table: &GidTable) -> String {
    table
        .to_string()
        .lines()
        .map(|l| format!("\t\t{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn print_device(o: &mut String, d: &DeviceInfo, args: &DevinfoArgs) {
    out!(o, "hca_id:\t{}", d.name);
    out!(o, "\ttransport:\t\t\tInfiniBand (0)");
    out!(o, "\tfw_ver:\t\t\t\t{}", d.fw_ver);
    out!(o, "\tnode_guid:\t\t\t{}", d.node_guid);
    out!(o, "\tvendor_id:\t\t\t{:#06x}", d.vendor_id);
    out!(o, "\tvendor_part_id:\t\t\t{}", d.vendor_part_id);
    out!(o, "\thw_ver:\t\t\t\t{:#x}", d.hw_ver);
    out!(o, "\tphys_port_cnt:\t\t\t{}", d.ports.len());
    if args.verbose {
        out!(o, "\tmax_qp:\t\t\t\t{}", d.max_qp);
        out!(o, "\tmax_qp_wr:\t\t\t{}", d.max_qp_wr);
        out!(o, "\tmax_sge:\t\t\t{}", d.max_sge);
        out!(o, "\tmax_cq:\t\t\t\t{}", d.max_cq);
        out!(o, "\tmax_cqe:\t\t\t{}", d.max_cqe);
        out!(o, "\tmax_mr:\t\t\t\t{}", d.max_mr);
        out!(o, "\tmax_qp_rd_atom:\t\t\t{}", d.max_qp_rd_atom);
    }
    for p in &d.ports {
        if args.ib_port.is_some_and(|want| want != p.port) {
            continue;
        }
        out!(o, "\t\tport:\t{}", p.port);
        let state = match p.state {
            "PORT_DOWN" => 1,
            "PORT_INIT" => 2,
            "PORT_ARMED" => 3,
            "PORT_ACTIVE" => 4,
            "PORT_ACTIVE_DEFER" => 5,
            _ => 0,
        };
        out!(o, "\t\t\tstate:\t\t\t{} ({state})", p.state);
        out!(o, "\t\t\tmax_mtu:\t\t{}", mtu_text(p.max_mtu));
        out!(o, "\t\t\tactive_mtu:\t\t{}", mtu_text(p.active_mtu));
        out!(o, "\t\t\tlink_layer:\t\t{}", p.link_layer);
        out!(o, "{}", indent(&p.gids));
    }
    out!(o);
}

pub(crate) fn run(args: &DevinfoArgs) -> ExitCode {
    let mut o = String::new();
    let status = report(&mut o, args);
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(o.as_bytes()).and_then(|()| stdout.flush());
    status
}

fn report(o: &mut String, args: &DevinfoArgs) -> ExitCode {
    let wanted = |name: &str| args.ib_dev.as_deref().is_none_or(|d| d == name);
    let verbs_devices = verbs::devices();
    if args.list {
        let mut names = vec![SOFT_DEVICE.to_owned()];
        if let Ok(found) = &verbs_devices {
            names.extend(found.iter().cloned());
        }
        out!(
            o,
            "{} HCA{} found:",
            names.len(),
            if names.len() == 1 { "" } else { "s" }
        );
        for n in names {
            out!(o, "\t{n}");
        }
        return report_missing(&verbs_devices, None);
    }
    if wanted(SOFT_DEVICE) {
        print_soft(o, args);
    }
    if args.ib_dev.as_deref() == Some(SOFT_DEVICE) {
        return ExitCode::SUCCESS;
    }
    let names = match &verbs_devices {
        Ok(names) => names.clone(),
        Err(_) => return report_missing(&verbs_devices, args.ib_dev.as_deref()),
    };
    if let Some(want) = &args.ib_dev {
        if !names.contains(want) {
            eprintln!(
                "ferroce devinfo: no device {want}; the devices here are: {}",
                std::iter::once(SOFT_DEVICE.to_owned())
                    .chain(names)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return ExitCode::FAILURE;
        }
    }
    let mut status = ExitCode::SUCCESS;
    for name in names.iter().filter(|n| wanted(n)) {
        match verbs::describe(name) {
            Ok(d) => print_device(o, &d, args),
            Err(e) => {
                eprintln!("ferroce devinfo: {e}");
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

/// Says why there are no verbs devices; fails only when one was asked for by name, and then
/// names it.
fn report_missing(found: &Result<Vec<String>, verbs::VerbsError>, asked: Option<&str>) -> ExitCode {
    match (found, asked) {
        (Ok(_), _) => ExitCode::SUCCESS,
        (Err(e), None) => {
            eprintln!("ferroce devinfo: no verbs devices: {e}");
            ExitCode::SUCCESS
        }
        (Err(e), Some(name)) => {
            eprintln!("ferroce devinfo: no device {name}: {e}");
            ExitCode::FAILURE
        }
    }
}
