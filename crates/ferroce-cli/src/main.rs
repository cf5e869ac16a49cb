//! `ferroce`: the command-line face of ferroce.
//!
//! Thin by design: argument parsing, the tools' loops and printing; the protocol work happens
//! in the `ferroce` library. `decode` reads captures; `devinfo` is `ibv_devinfo`; `pingpong`
//! is `ibv_rc_pingpong` and `perf` is perftest's `ib_*` tools, over the soft NIC or a verbs
//! device (`-d`); `ud-pingpong` and `srq-pingpong` are `ibv_ud_pingpong` and
//! `ibv_srq_pingpong` on the soft NIC; `stream` sends and receives sensor frames, and `demo`
//! runs a stream on loopback.

#![forbid(unsafe_code)]

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod common;
mod devinfo;
mod perf;
mod pingpong;
mod rping;
mod srq_pingpong;
mod stream;
mod ucmatose;
mod ud_pingpong;
mod udaddy;
use ferroce::capture::CaptureReader;
use ferroce::decode::{decode_frame, IcrcStatus};

/// RoCEv2 (RDMA over UDP port 4791) in user space: rdma-core's, librdmacm's and perftest's
/// tools on the soft NIC or a verbs device, a capture decoder, and sensor-frame streams.
#[derive(Parser)]
#[command(
    name = "ferroce",
    version,
    propagate_version = true,
    after_help = "Run `ferroce help COMMAND` for a command's flags."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Each command's first paragraph is its one line in `ferroce --help` (keep it within 80
// columns there); the rest shows in its own `--help`.
#[derive(Subcommand)]
enum Command {
    /// Decode a pcap or pcapng capture's RoCEv2 packets, one line each.
    ///
    /// One line (or JSON object) per RoCEv2 packet, its ICRC checked.
    ///
    /// Exit status: 0 when every RoCE packet parsed and its ICRC is right, 1 when any ICRC is
    /// bad or any RoCE packet failed to parse, 2 when the file cannot be read.
    Decode {
        /// The capture file (pcap or pcapng; Ethernet, Linux cooked or raw-IP link types).
        file: PathBuf,
        /// The UDP destination port that marks RoCE traffic.
        #[arg(long, default_value_t = ferroce::proto::wire::ROCE_PORT)]
        port: u16,
        /// Print one JSON object per packet instead of text.
        #[arg(long)]
        json: bool,
    },
    /// RDMA devices, their ports and GIDs (rdma-core's `ibv_devinfo`).
    ///
    /// The soft NIC and this host's RDMA devices, their ports and GID tables, in the shape
    /// of rdma-core's `ibv_devinfo`.
    Devinfo(devinfo::DevinfoArgs),
    /// RC SEND/RECV ping-pong (rdma-core's `ibv_rc_pingpong`).
    ///
    /// A SEND/RECV ping-pong, flag- and wire-compatible with rdma-core's `ibv_rc_pingpong`,
    /// on the soft NIC or a verbs device.
    Pingpong(pingpong::PingpongArgs),
    /// UD SEND/RECV ping-pong (rdma-core's `ibv_ud_pingpong`).
    ///
    /// A UD SEND/RECV ping-pong, flag- and wire-compatible with rdma-core's
    /// `ibv_ud_pingpong` (the soft NIC only).
    UdPingpong(ud_pingpong::UdPingpongArgs),
    /// RC ping-pong on a shared receive queue (`ibv_srq_pingpong`).
    ///
    /// Many RC queue pairs ping-ponging over one shared receive queue, flag- and
    /// wire-compatible with rdma-core's `ibv_srq_pingpong` (the soft NIC only).
    SrqPingpong(srq_pingpong::SrqPingpongArgs),
    /// RDMA READ/WRITE ping over a CM connection (librdmacm's `rping`).
    ///
    /// RDMA READ and WRITE ping over a connection made by connection management,
    /// flag-, wire- and output-compatible with librdmacm's `rping` (the soft NIC only).
    Rping(rping::RpingArgs),
    /// RC connections by CM, SENDs both ways (librdmacm's `ucmatose`).
    ///
    /// RC connections over connection management with SENDs both ways, flag-, wire- and
    /// output-compatible with librdmacm's `ucmatose` (the soft NIC only).
    Ucmatose(ucmatose::UcmatoseArgs),
    /// UD endpoints by SIDR, datagrams both ways (librdmacm's `udaddy`).
    ///
    /// UD endpoints resolved by SIDR with datagrams both ways, flag-, wire- and
    /// output-compatible with librdmacm's `udaddy` (the soft NIC only).
    Udaddy(udaddy::UdaddyArgs),
    /// perftest's bandwidth and latency tests (`ib_write_bw`, …).
    ///
    /// perftest's bandwidth and latency tests (`ib_write_bw`, `ib_send_lat`, …), flag-,
    /// output- and wire-compatible with perftest 6.06.
    #[command(subcommand)]
    Perf(perf::PerfCommand),
    /// Sensor frames: receive them (`recv`) or be their device (`send`).
    ///
    /// Sensor frames over RoCEv2: `stream recv` takes them into a ring of pages (the Hololink
    /// receiver), `stream send` is the device that sends them.
    #[command(subcommand)]
    Stream(stream::StreamCommand),
    /// Stream 4K frames over loopback for 3 s, checking every one.
    ///
    /// The loopback demo: a device streams 4K RAW12 frames to a receiver for a few seconds;
    /// every frame's content is checked and a summary printed. No flags, no privileges.
    Demo {
        /// Print the summary as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode { file, port, json } => decode(&file, port, json),
        Command::Devinfo(args) => devinfo::run(&args),
        Command::Pingpong(args) => pingpong::run(&args),
        Command::UdPingpong(args) => ud_pingpong::run(&args),
        Command::SrqPingpong(args) => srq_pingpong::run(&args),
        Command::Rping(args) => rping::run(&args),
        Command::Ucmatose(args) => ucmatose::run(&args),
        Command::Udaddy(args) => udaddy::run(&args),
        Command::Perf(command) => perf::run(&command),
        Command::Stream(command) => stream::run(&command),
        Command::Demo { json } => stream::demo(json),
    }
}

/// Refuses `--fault` and `--pcap` on a device that cannot do them: a verbs device's packets
/// never pass through ferroce.
pub(crate) fn refuse_soft_only(nic: &ferroce::Nic, fault: bool, pcap: bool) -> Result<(), String> {
    let caps = nic.caps();
    let name = nic.device_name();
    if fault && !caps.fault_injection {
        return Err(format!(
            "--fault needs the soft NIC (-d ferroce0): {name}'s packets never pass through ferroce"
        ));
    }
    if pcap && !caps.pcap {
        return Err(format!(
            "--pcap needs the soft NIC (-d ferroce0): capture {name}'s traffic with tcpdump on its interface"
        ));
    }
    Ok(())
}

/// Exit status of `decode` when the file cannot be read.
const EXIT_UNREADABLE: u8 = 2;

fn decode(file: &PathBuf, port: u16, json: bool) -> ExitCode {
    let reader = match CaptureReader::open(file) {
        Ok(reader) => reader,
        Err(e) => {
            eprintln!("ferroce decode: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    };
    let mut out = BufWriter::new(io::stdout().lock());
    let (mut frames, mut packets, mut bad_icrc, mut errors) = (0u64, 0u64, 0u64, 0u64);
    let mut unreadable = None;
    for frame in reader {
        let frame = match frame {
            Ok(frame) => frame,
            Err(e) => {
                unreadable = Some(e);
                break;
            }
        };
        frames += 1;
        let Some(record) = decode_frame(&frame, port) else {
            continue;
        };
        packets += 1;
        bad_icrc += u64::from(record.icrc == Some(IcrcStatus::Bad));
        errors += u64::from(record.error.is_some());
        let written = if json {
            serde_json::to_writer(&mut out, &record)
                .map_err(io::Error::from)
                .and_then(|()| writeln!(out))
        } else {
            writeln!(out, "{record}")
        };
        if let Err(e) = written {
            // A closed pipe (`| head`) is a normal way to stop reading.
            if e.kind() == io::ErrorKind::BrokenPipe {
                return ExitCode::SUCCESS;
            }
            eprintln!("ferroce decode: cannot write output: {e}");
            return ExitCode::from(EXIT_UNREADABLE);
        }
    }
    if out.flush().is_err() {
        return ExitCode::from(EXIT_UNREADABLE);
    }
    eprintln!(
        "ferroce decode: {frames} frames, {packets} RoCE packets to UDP port {port}, \
         {bad_icrc} with a bad ICRC, {errors} that did not parse"
    );
    if let Some(e) = unreadable {
        eprintln!("ferroce decode: {e}");
        return ExitCode::from(EXIT_UNREADABLE);
    }
    if bad_icrc > 0 || errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// clap checks a command line's definition only when it parses one; this checks every
    /// subcommand's at once (rping's -V once clashed with clap's own --version).
    #[test]
    fn every_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }

    /// Issue 25: `ferroce --help` named 5 of its commands in its first line. It lists every
    /// command, each with one line of its own within 80 columns, and names none in its
    /// first line (which would go stale).
    #[test]
    fn help_lists_every_command_on_a_line_of_its_own() {
        let mut cli = super::Cli::command();
        let help = cli.render_long_help().to_string();
        let names: Vec<String> = cli
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        // Eleven commands and clap's `help`.
        assert_eq!(names.len(), 12, "{names:?}");
        let listed: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        // Every command, in order, one line each.
        assert_eq!(listed.len(), names.len(), "{help}");
        for (line, name) in listed.iter().zip(&names) {
            let about = line
                .trim_start()
                .strip_prefix(name.as_str())
                .unwrap_or_else(|| panic!("{name} not where expected: {line:?}"))
                .trim();
            assert!(about.len() > 20, "{name} has no description: {line:?}");
            assert!(
                line.chars().count() <= 80,
                "{name}'s line is long: {line:?}"
            );
        }
        let first = help.lines().next().unwrap();
        let named = names
            .iter()
            .filter(|n| *n != "help")
            .filter(|n| first.contains(&format!(" {n},")) || first.contains(&format!(" {n} ")))
            .count();
        assert_eq!(named, 0, "the first line lists commands: {first}");
        assert!(help.contains("ferroce help COMMAND"), "{help}");
    }
}
