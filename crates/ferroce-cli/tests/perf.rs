//! `ferroce perf` against itself: for each of perftest's eight tests a server and a client
//! in two processes, with `--check` (every byte that arrived is verified), as `ib_write_bw`
//! and friends are run, and `session-lat`, Catalyst's session in the same table. Every NIC holds
//! UDP port 4791 on its address, so each test has addresses (127.0.0.20 and up) and a TCP port of
//! its own and the tests can run in parallel.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    both_ok, check_row_from, decoded, finish, result_rows, run_pair, stats_counter as counter,
};

fn perf(test: &str, local: &str, port: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.args(["perf", test, "--local", local, "-p", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

struct Run {
    server: String,
    client: String,
}

/// Starts a server, waits until it listens, runs a client against it; both must succeed.
fn pair(
    test: &str,
    addrs: (&str, &str),
    port: u16,
    server_args: &[&str],
    client_args: &[&str],
) -> Run {
    let (srv_ip, cli_ip) = addrs;
    let mut client_args = client_args.to_vec();
    client_args.push(srv_ip);
    let (server, client) = run_pair(
        perf(test, srv_ip, port, server_args),
        perf(test, cli_ip, port, &client_args),
        test,
    );
    both_ok(test, &server, &client);
    Run {
        server: server.out,
        client: client.out,
    }
}

/// The one result line: the right size and iterations, and no number negative. A slow run of
/// 8-byte atomics may well show 0.00 MB/s, but its message rate (the last column of a
/// bandwidth line) and every latency is above zero.
fn check_row(text: &str, size: u64, iters: u64, columns: usize) {
    let positive_from = if columns == 5 { 2 } else { 0 };
    check_row_from(text, size, iters, columns, positive_from);
}

/// perftest's header block and address lines.
fn check_header(text: &str, title: &str) {
    assert!(
        text.contains(&format!("                    {title}\n")),
        "{title}:\n{text}"
    );
    assert!(
        text.contains(" Dual-port       : OFF\t\tDevice         : ferroce0\n"),
        "{text}"
    );
    assert!(text.contains(" local address: LID 0000 QPN 0x"), "{text}");
    assert!(text.contains(" remote address: LID 0000 QPN 0x"), "{text}");
    assert!(
        text.contains(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:127:00:00:"),
        "{text}"
    );
}

fn check_json(path: &Path, title: &str, size: u64, iters: u64, keys: &[&str]) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["test_info"]["test"], title.replace(' ', "_"), "{text}");
    assert_eq!(doc["test_info"]["Device"], "ferroce0", "{text}");
    let results = &doc["results"];
    assert_eq!(results["MsgSize"], size, "{text}");
    assert_eq!(results["n_iterations"], iters, "{text}");
    for key in keys {
        assert!(
            results[*key].as_f64().is_some_and(|v| v >= 0.0),
            "{key} in {text}"
        );
    }
}

const BW_KEYS: &[&str] = &["BW_peak", "BW_average", "MsgRate"];
const LAT_KEYS: &[&str] = &[
    "t_min",
    "t_max",
    "t_typical",
    "t_avg",
    "t_stdev",
    "percentile_99",
    "percentile_99.9",
];

/// One of the eight tests: `-n 200`, 4096-byte messages (atomics: 8), `--check` on both
/// sides, and the client's results as JSON.
fn run_test(test: &str, title: &str, addrs: (&str, &str), port: u16) {
    let size = if test.starts_with("atomic") { 8 } else { 4096 };
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("client.json");
    let size_arg = size.to_string();
    let common = ["-n", "200", "-s", &size_arg, "--check", "-F", "-x", "1"];
    let mut client_args = common.to_vec();
    client_args.extend(["--out_json", "--out_json_file", json.to_str().unwrap()]);
    let run = pair(test, addrs, port, &common, &client_args);
    check_header(&run.client, title);
    check_header(&run.server, title);
    assert!(
        run.client.contains(" GID index       : 1\n"),
        "{}",
        run.client
    );
    let bw = test.ends_with("-bw");
    let (columns, keys) = if bw { (5, BW_KEYS) } else { (9, LAT_KEYS) };
    check_row(&run.client, size, 200, columns);
    check_json(&json, title, size, 200, keys);
    // The bandwidth servers print the client's report (write, read, atomic) or their own
    // (send); the ping-pong servers measure too; the read and atomic latency servers only
    // wait.
    if bw || matches!(test, "write-lat" | "send-lat") {
        check_row(&run.server, size, 200, columns);
    } else {
        assert!(result_rows(&run.server).is_empty(), "{}", run.server);
    }
}

#[test]
fn write_bw() {
    run_test(
        "write-bw",
        "RDMA_Write BW Test",
        ("127.0.0.20", "127.0.0.21"),
        19401,
    );
}

#[test]
fn write_lat() {
    run_test(
        "write-lat",
        "RDMA_Write Latency Test",
        ("127.0.0.22", "127.0.0.23"),
        19402,
    );
}

#[test]
fn read_bw() {
    run_test(
        "read-bw",
        "RDMA_Read BW Test",
        ("127.0.0.24", "127.0.0.25"),
        19403,
    );
}

#[test]
fn read_lat() {
    run_test(
        "read-lat",
        "RDMA_Read Latency Test",
        ("127.0.0.26", "127.0.0.27"),
        19404,
    );
}

#[test]
fn send_bw() {
    run_test(
        "send-bw",
        "Send BW Test",
        ("127.0.0.28", "127.0.0.29"),
        19405,
    );
}

#[test]
fn send_lat() {
    run_test(
        "send-lat",
        "Send Latency Test",
        ("127.0.0.30", "127.0.0.31"),
        19406,
    );
}

#[test]
fn atomic_bw() {
    run_test(
        "atomic-bw",
        "Atomic FETCH_AND_ADD BW Test",
        ("127.0.0.32", "127.0.0.33"),
        19407,
    );
}

#[test]
fn atomic_lat() {
    run_test(
        "atomic-lat",
        "Atomic FETCH_AND_ADD Latency Test",
        ("127.0.0.34", "127.0.0.35"),
        19408,
    );
}

/// 2 % of the packets each side sends are lost: RC retransmits and every byte still checks.
#[test]
fn write_bw_survives_loss() {
    let args = [
        "-n",
        "200",
        "-s",
        "4096",
        "--check",
        "--fault",
        "loss=0.02,seed=1",
        "--stats",
    ];
    let run = pair(
        "write-bw",
        ("127.0.0.36", "127.0.0.37"),
        19409,
        &args,
        &args,
    );
    check_row(&run.client, 4096, 200, 5);
    check_row(&run.server, 4096, 200, 5);
    let stats = run.client.lines().last().unwrap();
    assert!(stats.starts_with("link ferroce0/1 sent_pkts "), "{stats}");
}

/// `-a`: every power of two from 2 bytes to 8 MiB, one line each (5 iterations each,
/// perftest's least, to stay quick).
#[test]
fn write_bw_all_sizes() {
    let args = ["-a", "-n", "5", "--check"];
    let run = pair(
        "write-bw",
        ("127.0.0.38", "127.0.0.39"),
        19410,
        &args,
        &args,
    );
    let rows = result_rows(&run.client);
    assert_eq!(rows.len(), 23, "{}", run.client);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[0].parse::<u64>().unwrap(), 2 << i, "{}", run.client);
        assert_eq!(row[1], "5");
    }
    // The server prints the client's last report.
    check_row(&run.server, 1 << 23, 5, 5);
}

/// Two queue pairs, Gb/s, and a UC connection.
#[test]
fn two_queue_pairs_in_gbits_over_uc() {
    let args = [
        "-q",
        "2",
        "-c",
        "UC",
        "-t",
        "16",
        "-n",
        "200",
        "-s",
        "2048",
        "--check",
        "--report_gbits",
    ];
    let run = pair("send-bw", ("127.0.0.40", "127.0.0.41"), 19411, &args, &args);
    assert!(run.client.contains("BW average[Gb/sec]"), "{}", run.client);
    assert!(
        run.client.contains(" Connection type : UC"),
        "{}",
        run.client
    );
    assert_eq!(run.client.matches(" local address: ").count(), 2);
    assert_eq!(run.client.matches(" remote address: ").count(), 2);
    // perftest counts the iterations of every queue pair.
    check_row(&run.client, 2048, 400, 5);
    check_row(&run.server, 2048, 400, 5);
}

/// A thousand RC queue pairs between two NICs, every one carrying its WRITEs, and every byte
/// read back and checked (`--check`). Addresses 127.0.0.72 and .73.
#[test]
fn a_thousand_queue_pairs_byte_exact() {
    let args = ["-q", "1000", "-n", "20", "-s", "4096", "--check"];
    let run = pair(
        "write-bw",
        ("127.0.0.72", "127.0.0.73"),
        19414,
        &args,
        &args,
    );
    assert_eq!(run.client.matches(" local address: ").count(), 1000);
    assert_eq!(run.client.matches(" remote address: ").count(), 1000);
    // Each QP's own line names its number: a thousand different ones.
    let qpns: std::collections::HashSet<&str> = run
        .client
        .lines()
        .filter(|l| l.contains(" local address: "))
        .filter_map(|l| l.split("QPN ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(qpns.len(), 1000, "{}", run.client);
    check_row(&run.client, 4096, 20_000, 5);
    check_row(&run.server, 4096, 20_000, 5);
}

#[test]
fn a_missing_server_is_named() {
    let out = perf("write-bw", "127.0.0.42", 19412, &["127.0.0.43"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Couldn't connect to 127.0.0.43:19412"),
        "{err}"
    );
}

#[test]
fn bad_flags_are_refused() {
    for (test, args, says) in [
        (
            "read-bw",
            &["-c", "UC"][..],
            "UC connection not possible in READ/ATOMIC verbs",
        ),
        ("atomic-bw", &["-a"][..], "-a (all sizes)"),
        (
            "write-lat",
            &["-q", "2"][..],
            "Latency tests use one queue pair",
        ),
        (
            "write-bw",
            &["--out_json"][..],
            "--out_json needs --out_json_file",
        ),
    ] {
        let out = perf(test, "127.0.0.44", 19413, args).output().unwrap();
        assert!(!out.status.success(), "{test} {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{test} {args:?}: {err}");
    }
}

// `perf session-lat`: an echoing coprocessor server and a controller client, the latency
// table of the other latency tests and `last_rtt_ns` checked. Addresses 127.0.0.66-71 and
// TCP ports 19531-19534.

#[test]
fn session_lat_round_trips_with_a_consistent_last_rtt() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("session.json");
    let Run { client, server } = pair(
        "session-lat",
        ("127.0.0.66", "127.0.0.67"),
        19531,
        &["-s", "4096", "-n", "300"],
        &[
            "-s",
            "4096",
            "-n",
            "300",
            "--out_json",
            "--out_json_file",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        client.contains("                    Session Latency Test\n"),
        "{client}"
    );
    assert!(client.contains(" Role            : controller"), "{client}");
    let rows = result_rows(&client);
    let values: Vec<f64> = rows[0].iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(values.len(), 9, "{client}");
    assert_eq!((values[0], values[1]), (4096.0, 300.0));
    assert!(values[2..].iter().all(|&v| v > 0.0), "{client}");
    // last_rtt_ns inside the round trip that encloses it ("INCONSISTENT" fails the tool);
    // near the median ("consistent") or not ("unusual") is the host's scheduling, which a
    // test must not time.
    assert!(
        client.contains("): consistent\n") || client.contains("): unusual\n"),
        "last_rtt_ns checked:\n{client}"
    );
    assert!(
        server.contains(" Role            : coprocessor"),
        "{server}"
    );
    assert!(server.contains(" Served 300 requests\n"), "{server}");

    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["test_info"]["test"], "Session_Latency_Test");
    assert_eq!(doc["results"]["MsgSize"], 4096);
    assert_eq!(doc["results"]["n_iterations"], 300);
    let last_rtt = doc["results"]["last_rtt_ns"].as_u64().unwrap();
    let t_max_ns = doc["results"]["t_max"].as_f64().unwrap() * 2000.0;
    assert!(
        last_rtt > 0 && (last_rtt as f64) <= t_max_ns + 1000.0,
        "{doc}"
    );
}

#[test]
fn session_lat_bad_flags_and_missing_servers_are_named() {
    for (args, says) in [
        (&["-s", "0"][..], "Message size"),
        (&["-n", "2"][..], "at least 5"),
        (&["-m", "1000"][..], "Invalid MTU"),
        (&["--out_json"][..], "--out_json needs --out_json_file"),
    ] {
        let out = perf("session-lat", "127.0.0.68", 19532, args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // No server: the client dials for 10 s and says so.
    let started = Instant::now();
    let out = perf("session-lat", "127.0.0.68", 19533, &["127.0.0.69"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Couldn't connect to 127.0.0.69:19533"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// The session under loss, reordering and duplication on both sides (`--fault`), the
/// polling mode's recovery: every reply comes back whole (the tool checks each one's bytes),
/// the counters (`--stats`) show resends, and the controller's capture (`--pcap`) holds the
/// requests it sent, some of them twice, each with a good ICRC. Addresses 127.0.0.45 and .46,
/// TCP port 19535.
#[test]
fn session_lat_recovers_under_faults_with_a_capture() {
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("controller.pcap");
    let common = [
        "-s",
        "4096",
        "--mtu",
        "1024",
        "-n",
        "300",
        "--fault",
        "loss=0.02,reorder=0.02,dup=0.01,seed=7",
        "--stats",
    ];
    let mut client_args = common.to_vec();
    client_args.extend(["--pcap", pcap.to_str().unwrap()]);
    let Run { client, server } = pair(
        "session-lat",
        ("127.0.0.45", "127.0.0.46"),
        19535,
        &common,
        &client_args,
    );
    assert!(server.contains(" Served 300 requests\n"), "{server}");
    for (side, out) in [("controller", &client), ("coprocessor", &server)] {
        let resent = counter(out, "completer_retry_err") + counter(out, "early_resends");
        assert!(
            resent > 0,
            "the {side} resent nothing under 2 % loss:\n{out}"
        );
        assert_eq!(counter(out, "retry_exceeded_err"), 0, "{out}");
    }
    let records = decoded(&pcap);
    assert!(records.iter().all(|r| r["icrc"] == "ok"));
    // Each 4 KiB request is four WRITE packets from the controller; a resend sends a PSN again.
    let mut sent: Vec<u64> = records
        .iter()
        .filter(|r| {
            r["src"] == "127.0.0.46" && r["opcode_name"].as_str().unwrap().contains("WRITE")
        })
        .map(|r| r["psn"].as_u64().unwrap())
        .collect();
    let all = sent.len();
    sent.sort_unstable();
    sent.dedup();
    assert!(
        sent.len() >= 300 * 4,
        "{} distinct request PSNs captured",
        sent.len()
    );
    assert!(all > sent.len(), "no request captured twice under loss");
}

/// Different sizes on the two sides: both refuse the channel, naming both descriptions.
#[test]
fn session_lat_mismatched_sizes_are_refused() {
    let server = perf("session-lat", "127.0.0.70", 19534, &["-s", "64"])
        .spawn()
        .unwrap();
    let client = perf(
        "session-lat",
        "127.0.0.71",
        19534,
        &["-s", "128", "127.0.0.70"],
    )
    .output()
    .unwrap();
    let server = finish(server, "server", None);
    assert!(!client.status.success() && !server.ok);
    let err = String::from_utf8_lossy(&client.stderr);
    assert!(
        err.contains("the peer established 1 slots of 64-byte requests"),
        "{err}"
    );
}
