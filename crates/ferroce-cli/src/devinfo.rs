//! `ferroce devinfo`: the devices this host can use, in the shape of rdma-core's
//! `ibv_devinfo`: the soft NIC (`ferroce0`) first, then every verbs device, with their ports,
//! states, MTUs and GID tables.

use std::net::IpAddr;
use std::process::ExitCode;

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

fn print_soft(args: &DevinfoArgs) {
    let mtu = ferroce::nic::active_mtu_on(args.local);
    println!("hca_id:\t{SOFT_DEVICE}");
    println!("\ttransport:\t\t\tferroce soft RoCE v2 (UDP {})", args.local);
    println!("\tphys_port_cnt:\t\t\t1");
    if args.ib_port.is_some_and(|p| p != 1) {
        return;
    }
    println!("\t\tport:\t1");
    println!("\t\t\tstate:\t\t\tPORT_ACTIVE (4)");
    println!("\t\t\tmax_mtu:\t\t{}", mtu_text(Some(Mtu::M4096)));
    println!("\t\t\tactive_mtu:\t\t{}", mtu_text(Some(mtu)));
    println!("\t\t\tlink_layer:\t\tEthernet");
    let gid = match args.local {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    println!(
        "{}",
        indent(&GidTable(vec![verbs::Gid {
            index: 0,
            gid,
            kind: verbs::GidType::RoceV2,
            netdev: None,
        }]))
    );
    println!();
}

fn indent(table: &GidTable) -> String {
    table
        .to_string()
        .lines()
        .map(|l| format!("\t\t{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn print_device(d: &DeviceInfo, args: &DevinfoArgs) {
    println!("hca_id:\t{}", d.name);
    println!("\ttransport:\t\t\tInfiniBand (0)");
    println!("\tfw_ver:\t\t\t\t{}", d.fw_ver);
    println!("\tnode_guid:\t\t\t{}", d.node_guid);
    println!("\tvendor_id:\t\t\t{:#06x}", d.vendor_id);
    println!("\tvendor_part_id:\t\t\t{}", d.vendor_part_id);
    println!("\thw_ver:\t\t\t\t{:#x}", d.hw_ver);
    println!("\tphys_port_cnt:\t\t\t{}", d.ports.len());
    if args.verbose {
        println!("\tmax_qp:\t\t\t\t{}", d.max_qp);
        println!("\tmax_qp_wr:\t\t\t{}", d.max_qp_wr);
        println!("\tmax_sge:\t\t\t{}", d.max_sge);
        println!("\tmax_cq:\t\t\t\t{}", d.max_cq);
        println!("\tmax_cqe:\t\t\t{}", d.max_cqe);
        println!("\tmax_mr:\t\t\t\t{}", d.max_mr);
        println!("\tmax_qp_rd_atom:\t\t\t{}", d.max_qp_rd_atom);
    }
    for p in &d.ports {
        if args.ib_port.is_some_and(|want| want != p.port) {
            continue;
        }
        println!("\t\tport:\t{}", p.port);
        let state = match p.state {
            "PORT_DOWN" => 1,
            "PORT_INIT" => 2,
            "PORT_ARMED" => 3,
            "PORT_ACTIVE" => 4,
            "PORT_ACTIVE_DEFER" => 5,
            _ => 0,
        };
        println!("\t\t\tstate:\t\t\t{} ({state})", p.state);
        println!("\t\t\tmax_mtu:\t\t{}", mtu_text(p.max_mtu));
        println!("\t\t\tactive_mtu:\t\t{}", mtu_text(p.active_mtu));
        println!("\t\t\tlink_layer:\t\t{}", p.link_layer);
        println!("{}", indent(&p.gids));
    }
    println!();
}

pub(crate) fn run(args: &DevinfoArgs) -> ExitCode {
    let wanted = |name: &str| args.ib_dev.as_deref().is_none_or(|d| d == name);
    let verbs_devices = verbs::devices();
    if args.list {
        let mut names = vec![SOFT_DEVICE.to_owned()];
        if let Ok(found) = &verbs_devices {
            names.extend(found.iter().cloned());
        }
        println!("{} HCA{} found:", names.len(), if names.len() == 1 { "" } else { "s" });
        for n in names {
            println!("\t{n}");
        }
        return report_missing(&verbs_devices, false);
    }
    if wanted(SOFT_DEVICE) {
        print_soft(args);
    }
    if args.ib_dev.as_deref() == Some(SOFT_DEVICE) {
        return ExitCode::SUCCESS;
    }
    let names = match &verbs_devices {
        Ok(names) => names.clone(),
        Err(_) => return report_missing(&verbs_devices, args.ib_dev.is_some()),
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
            Ok(d) => print_device(&d, args),
            Err(e) => {
                eprintln!("ferroce devinfo: {e}");
                status = ExitCode::FAILURE;
            }
        }
    }
    status
}

/// Says why there are no verbs devices; fails only when one was asked for by name.
fn report_missing(found: &Result<Vec<String>, verbs::VerbsError>, asked: bool) -> ExitCode {
    match found {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferroce devinfo: no verbs devices: {e}");
            if asked {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
    }
}
