//! `ferroce perf … -R`: perftest's rdma_cm mode against itself in two processes. The
//! exchange runs over an RC connection that ferroce's connection manager made on the test's
//! port, one SEND per step; the queue pairs connect on the same port (RC: REQ, REP, RTU; UD:
//! SIDR) between two empty key lines; the client closes the connections at the end. Every
//! test of perf runs, byte-checked with `--check`, and the client's capture shows the
//! exchange step by step. Each test has addresses (127.0.0.160 and up) and rdma_cm ports
//! (18701 and up) of its own, so the tests run in parallel; the client starts once the server
//! printed its "Waiting for client" banner.

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};

mod common;

use common::{
    both_ok, check_row, decoded, finish, result_rows, run_pair, start_server as start, Side,
};

/// Starts a server and waits for its banner; returns it and the thread reading its stdout.
fn start_server(
    test: &str,
    addr: &str,
    port: u16,
    args: &[&str],
) -> (Child, std::thread::JoinHandle<String>) {
    start(perf(test, addr, port, args), test)
}

fn perf(test: &str, local: &str, port: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.args([
        "perf",
        test,
        "-R",
        "--local",
        local,
        "-p",
        &port.to_string(),
    ])
    .args(args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    cmd
}

/// Starts a server, waits for its banner, runs a client against it; returns both sides.
fn pair(
    test: &str,
    addrs: (&str, &str),
    port: u16,
    server_args: &[&str],
    client_args: &[&str],
) -> (Side, Side) {
    let (srv_ip, cli_ip) = addrs;
    let mut client_args = client_args.to_vec();
    client_args.push(srv_ip);
    run_pair(
        perf(test, srv_ip, port, server_args),
        perf(test, cli_ip, port, &client_args),
        test,
    )
}

/// perftest's header says rdma_cm, and its server asks for the client's rdma_cm QP.
fn header_says_rdma_cm(side: &Side, server: bool) {
    let text = &side.out;
    assert!(text.contains(" rdma_cm QPs\t : ON\n"), "{text}");
    assert!(text.contains(" Data ex. method : rdma_cm\n"), "{text}");
    let waiting = " Waiting for client rdma_cm QP to connect\n Please run the same command with the IB/RoCE interface IP\n";
    assert_eq!(text.contains(waiting), server, "{text}");
}

/// Runs one test with `-R`, `--check` on both sides, and checks both tables: the bandwidth
/// servers print the client's report (write, read, atomic) or their own (send); the
/// ping-pong servers measure too; the read and atomic latency servers only wait.
fn run_test(test: &str, addrs: (&str, &str), port: u16, extra: &[&str]) {
    // perftest counts the iterations of every queue pair.
    let qps: u64 = extra
        .iter()
        .position(|&a| a == "-q")
        .map_or(1, |at| extra[at + 1].parse().unwrap());
    let size = if test.starts_with("atomic") { 8 } else { 4096 };
    let size_arg = size.to_string();
    let mut args = vec!["-n", "200", "-s", &size_arg, "--check"];
    args.extend_from_slice(extra);
    let (server, client) = pair(test, addrs, port, &args, &args);
    both_ok(&format!("{test} -R {extra:?}"), &server, &client);
    header_says_rdma_cm(&server, true);
    header_says_rdma_cm(&client, false);
    let bw = test.ends_with("-bw");
    let columns = if bw { 5 } else { 9 };
    check_row(&client.out, size, 200 * qps, columns);
    if bw || matches!(test, "write-lat" | "send-lat") {
        check_row(&server.out, size, 200 * qps, columns);
    } else {
        assert!(result_rows(&server.out).is_empty(), "{}", server.out);
    }
}

#[test]
fn bandwidth_tests_over_rdma_cm() {
    for (i, test) in ["write-bw", "read-bw", "send-bw", "atomic-bw"]
        .into_iter()
        .enumerate()
    {
        run_test(test, ("127.0.0.160", "127.0.0.161"), 18701 + i as u16, &[]);
    }
}

#[test]
fn latency_tests_over_rdma_cm() {
    for (i, test) in ["write-lat", "read-lat", "send-lat", "atomic-lat"]
        .into_iter()
        .enumerate()
    {
        run_test(test, ("127.0.0.162", "127.0.0.163"), 18711 + i as u16, &[]);
    }
}

/// UD by SIDR: each datagram checked for its bytes, its GRH and its sender; in the latency
/// test the server answers through the address of the client's first datagram. With
/// `--use-srq` that first datagram takes its receive from the shared receive queue.
#[test]
fn ud_send_tests_over_rdma_cm() {
    let addrs = ("127.0.0.164", "127.0.0.165");
    let ud = ["-c", "UD", "-s", "1024", "-n", "200", "--check", "--stats"];
    let (server, client) = pair("send-bw", addrs, 18721, &ud, &ud);
    both_ok("send-bw -R -c UD", &server, &client);
    header_says_rdma_cm(&server, true);
    check_row(&client.out, 1024, 200, 5);
    check_row(&server.out, 1024, 200, 5);
    // Every datagram found its receive (the control connection's SENDs count too).
    assert!(
        server.out.contains(" ud_no_recv 0 ") && server.out.contains(" qkey_err 0 "),
        "{}",
        server.out
    );
    let (server, client) = pair("send-lat", addrs, 18722, &ud, &ud);
    both_ok("send-lat -R -c UD", &server, &client);
    check_row(&client.out, 1024, 200, 9);
    check_row(&server.out, 1024, 200, 9);
    let srq = ["-c", "UD", "-s", "256", "-n", "100", "--check", "--use-srq"];
    let (server, client) = pair("send-lat", addrs, 18723, &srq, &srq);
    both_ok("send-lat -R -c UD --use-srq", &server, &client);
    check_row(&client.out, 256, 100, 9);
}

/// Several queue pairs, each with a connection of its own on the same port: writes checked
/// by reading the server's targets back (which -R grants only with --check), and SENDs onto
/// the server's shared receive queue; a timed run, whose server learns over the rdma_cm
/// exchange that the client has stopped.
#[test]
fn several_queue_pairs_and_timed_runs_over_rdma_cm() {
    let addrs = ("127.0.0.166", "127.0.0.167");
    run_test("write-bw", addrs, 18731, &["-q", "3"]);
    run_test("send-bw", addrs, 18732, &["-q", "2", "--use-srq"]);
    let timed = ["-D", "1", "-s", "4096"];
    let (server, client) = pair("send-bw", addrs, 18733, &timed, &timed);
    both_ok("send-bw -R -D 1", &server, &client);
    assert_eq!(result_rows(&client.out).len(), 1, "{}", client.out);
    assert_eq!(result_rows(&server.out).len(), 1, "{}", server.out);
}

/// The client's capture of read-bw -R: the control connection (REQ asking no READs),
/// the exchange one SEND per step each way, the data connection after the MTU and an empty
/// key line (its REQ asking `-o` READs each way, its REP granting them), and at the end the
/// data connection closed before the control one, by the client.
#[test]
fn the_exchange_step_by_step() {
    let (srv, cli) = ("127.0.0.168", "127.0.0.169");
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("client.pcap");
    let args = ["-n", "20", "-s", "1024", "-o", "4"];
    let mut client_args = args.to_vec();
    client_args.extend(["--pcap", pcap.to_str().unwrap()]);
    let (server, client) = pair("read-bw", (srv, cli), 18741, &args, &client_args);
    both_ok("read-bw -R", &server, &client);
    let packets = decoded(&pcap);
    // Retransmissions aside, in order: the CM's messages, and the control QP's SENDs by
    // sender.
    let mut seen = HashSet::new();
    let mut events: Vec<String> = Vec::new();
    for p in &packets {
        let key = (p["src"].clone(), p["dest_qp"].clone(), p["psn"].clone());
        if let Some(message) = p["cm"]["message"].as_str() {
            if seen.insert(key) {
                events.push(message.to_owned());
            }
        } else if p["opcode_name"] == "RC_SEND_ONLY" && seen.insert(key) {
            let who = if p["src"] == cli { "c" } else { "s" };
            events.push(format!("{who}{}", p["payload_len"]));
        }
    }
    let mut expected: Vec<String> = ["REQ", "REP", "RTU"].map(String::from).to_vec();
    // version, cycle buffer, cache line, MTU, the first empty key line: client first
    for len in [16, 4, 4, 2, 56] {
        expected.extend([format!("c{len}"), format!("s{len}")]);
    }
    expected.extend(["REQ", "REP", "RTU"].map(String::from));
    // the second empty key line, the key line, the remote address lines, "after RTR", the
    // sync before the report, the report (five 8-byte numbers), the closing key line
    for len in [56, 56, 56, 56, 56, 8, 8, 8, 8, 8, 56] {
        expected.extend([format!("c{len}"), format!("s{len}")]);
    }
    expected.extend(["DREQ", "DREP", "DREQ", "DREP"].map(String::from));
    assert_eq!(events, expected);
    let cm: Vec<&serde_json::Value> = packets
        .iter()
        .filter_map(|p| p["cm"].as_object().map(|_| &p["cm"]))
        .collect();
    let reqs: Vec<_> = cm.iter().filter(|m| m["message"] == "REQ").collect();
    assert_eq!(reqs[0]["responder_resources"], 0, "{:?}", reqs[0]);
    assert_eq!(reqs[0]["initiator_depth"], 0, "{:?}", reqs[0]);
    assert_eq!(reqs[1]["responder_resources"], 4, "{:?}", reqs[1]);
    assert_eq!(reqs[1]["initiator_depth"], 4, "{:?}", reqs[1]);
    // Both on the test's port in rdma_cm's TCP space.
    for req in &reqs {
        assert_eq!(req["service_id"], 0x0106_0000 | 18741, "{req:?}");
    }
    // The data connection closes first: its DREQ names the server's data QP (the second
    // REP's), then the control one.
    let reps: Vec<_> = cm.iter().filter(|m| m["message"] == "REP").collect();
    let dreqs: Vec<_> = cm.iter().filter(|m| m["message"] == "DREQ").collect();
    assert_eq!(dreqs[0]["remote_qpn"], reps[1]["qpn"], "{dreqs:?} {reps:?}");
    assert_eq!(dreqs[1]["remote_qpn"], reps[0]["qpn"], "{dreqs:?} {reps:?}");
}

/// UD: the queue pair is resolved by SIDR in rdma_cm's UDP space, the datagrams carry
/// rdma_cm's Q_Key, and the latency client's first datagram carries its QPN.
#[test]
fn ud_is_resolved_by_sidr() {
    let (srv, cli) = ("127.0.0.170", "127.0.0.171");
    let dir = tempfile::tempdir().unwrap();
    let pcap = dir.path().join("client.pcap");
    let args = ["-c", "UD", "-n", "20", "-s", "64"];
    let mut client_args = args.to_vec();
    client_args.extend(["--pcap", pcap.to_str().unwrap()]);
    let (server, client) = pair("send-lat", (srv, cli), 18751, &args, &client_args);
    both_ok("send-lat -R -c UD", &server, &client);
    let packets = decoded(&pcap);
    let sidr = packets
        .iter()
        .find(|p| p["cm"]["message"] == "SIDR_REQ")
        .expect("a SIDR request");
    assert_eq!(sidr["cm"]["service_id"], 0x0111_0000 | 18751, "{sidr}");
    let first = packets
        .iter()
        .find(|p| p["opcode_name"] == "UD_SEND_ONLY_WITH_IMMEDIATE")
        .expect("the client's QPN");
    assert_eq!(first["payload_len"], 4, "{first}");
    assert_eq!(first["imm"], first["deth"]["src_qp"], "{first}");
    assert_eq!(first["deth"]["qkey"], 0x0123_4567, "{first}");
    let datagrams: Vec<_> = packets
        .iter()
        .filter(|p| p["opcode_name"] == "UD_SEND_ONLY" && p["dest_qp"] != 1)
        .collect();
    assert_eq!(datagrams.len(), 40, "twenty each way");
    assert!(datagrams.iter().all(|p| p["deth"]["qkey"] == 0x0123_4567));
    // No connection for the UD QP: the only REQ is the control connection's.
    let reqs = packets
        .iter()
        .filter(|p| p["cm"]["message"] == "REQ")
        .count();
    assert_eq!(reqs, 1);
}

/// A client whose server does not listen on that port is refused (REJ 8) and says so as
/// perftest does; UC is refused as perftest refuses it with -R.
#[test]
fn refusals_in_perftests_words() {
    let (srv, cli) = ("127.0.0.172", "127.0.0.173");
    let (server, reader) = start_server("write-bw", srv, 18761, &["-n", "20"]);
    let refused = perf("write-bw", cli, 18762, &["-n", "20", srv])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{err}");
    assert!(
        err.contains("Event: RDMA_CM_EVENT_REJECTED; error: 8."),
        "{err}"
    );
    assert!(
        err.contains(" Unable to init the socket connection"),
        "{err}"
    );
    // The server still takes its client.
    let client = perf("write-bw", cli, 18761, &["-n", "20", srv])
        .spawn()
        .unwrap();
    let client = finish(client, "client", None);
    let server = finish(server, "server", Some(reader));
    both_ok("write-bw -R after a refusal", &server, &client);

    let out = perf("write-bw", srv, 18763, &["-c", "UC"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(" UC is not supported in librdmacm"), "{err}");
}
