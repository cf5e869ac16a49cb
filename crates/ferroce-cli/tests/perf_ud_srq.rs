//! `ferroce perf send-bw|send-lat` over UD (`-c UD`) and with a shared receive queue
//! (`--use-srq`), against itself in two processes, as perftest runs them: `--check` verifies
//! every message's bytes (on UD also its GRH and sender), `--stats` shows that every message
//! arrived, and the refusals use perftest's words. Each test has addresses (127.0.0.140 and
//! up) and a TCP port (19701 and up) of its own, so the tests run in parallel; the client
//! starts once the server printed its "Waiting for client" banner.

use std::process::{Command, Stdio};

mod common;

use common::{both_ok, check_row, result_rows, run_pair, stats_counter as counter, Side};

fn perf(test: &str, local: &str, port: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.args(["perf", test, "--local", local, "-p", &port.to_string()])
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

fn header_says(text: &str, connection: &str, srq: &str) {
    let line = format!(" Connection type : {connection}\t\tUsing SRQ      : {srq}\n");
    assert!(text.contains(&line), "{line:?} in:\n{text}");
}

#[test]
fn send_bw_over_ud_delivers_every_datagram() {
    let args = ["-c", "UD", "-n", "200", "-s", "2048", "--check", "--stats"];
    let (server, client) = pair(
        "send-bw",
        ("127.0.0.140", "127.0.0.141"),
        19701,
        &args,
        &args,
    );
    both_ok("send-bw -c UD", &server, &client);
    header_says(&client.out, "UD", "OFF");
    header_says(&server.out, "UD", "OFF");
    // UD keeps a receive posted for every message when -r is left alone.
    assert!(
        server.out.contains(" RX depth        : 200\n"),
        "{}",
        server.out
    );
    check_row(&client.out, 2048, 200, 5);
    check_row(&server.out, 2048, 200, 5);
    assert_eq!(counter(&server.out, "rdma_recvs"), 200, "{}", server.out);
    assert_eq!(counter(&server.out, "ud_no_recv"), 0, "{}", server.out);
    assert_eq!(counter(&client.out, "rdma_sends"), 200, "{}", client.out);
}

#[test]
fn send_lat_over_ud() {
    let args = ["-c", "UD", "-n", "200", "-s", "1024", "--check", "--stats"];
    let (server, client) = pair(
        "send-lat",
        ("127.0.0.142", "127.0.0.143"),
        19702,
        &args,
        &args,
    );
    both_ok("send-lat -c UD", &server, &client);
    header_says(&client.out, "UD", "OFF");
    check_row(&client.out, 1024, 200, 9);
    check_row(&server.out, 1024, 200, 9);
    for side in [&server, &client] {
        assert_eq!(counter(&side.out, "rdma_recvs"), 200, "{}", side.out);
        assert_eq!(counter(&side.out, "rdma_sends"), 200, "{}", side.out);
    }
}

/// `-a` on UD runs the sizes up to the MTU both sides agreed on (here the server's `-m
/// 1024`), saying so as perftest does.
#[test]
fn ud_sweeps_up_to_the_agreed_mtu() {
    let (server, client) = pair(
        "send-bw",
        ("127.0.0.144", "127.0.0.145"),
        19703,
        &["-c", "UD", "-a", "-n", "5", "-m", "1024", "--check"],
        &["-c", "UD", "-a", "-n", "5", "--check"],
    );
    both_ok("send-bw -c UD -a", &server, &client);
    for side in [&server, &client] {
        assert!(
            side.out.contains(" Mtu             : 1024[B]\n"),
            "{}",
            side.out
        );
        assert!(
            side.err
                .contains(" Max msg size in UD is MTU 1024\n Changing to this MTU\n"),
            "{}",
            side.err
        );
        let rows = result_rows(&side.out);
        let sizes: Vec<u64> = rows.iter().map(|r| r[0].parse().unwrap()).collect();
        assert_eq!(sizes, (1..=10).map(|e| 1u64 << e).collect::<Vec<_>>());
    }
}

/// A `-s` larger than the agreed MTU is refused on UD, by both sides, after the MTU
/// exchange (perftest's `check_mtu`).
#[test]
fn ud_larger_than_the_mtu_is_refused() {
    let args = ["-c", "UD", "-s", "8192"];
    let (server, client) = pair(
        "send-bw",
        ("127.0.0.146", "127.0.0.147"),
        19704,
        &args,
        &args,
    );
    for side in [&server, &client] {
        assert!(!side.ok, "{}{}", side.out, side.err);
        assert!(
            side.err.contains(
                " Max message size in UD cannot be greater than MTU \n Couldn't get context for the device"
            ),
            "{}",
            side.err
        );
    }
}

/// Two RC queue pairs on the server's one shared receive queue: each message is checked in
/// the buffer of the receive it took, whichever queue pair it came in on.
#[test]
fn send_bw_with_srq_and_two_queue_pairs() {
    let args = [
        "--use-srq",
        "-q",
        "2",
        "-n",
        "200",
        "-s",
        "4096",
        "--check",
        "--stats",
    ];
    let (server, client) = pair(
        "send-bw",
        ("127.0.0.148", "127.0.0.149"),
        19705,
        &args,
        &args,
    );
    both_ok("send-bw --use-srq -q 2", &server, &client);
    header_says(&client.out, "RC", "ON");
    header_says(&server.out, "RC", "ON");
    // Each side names the other's queue pairs in the order the other lists them.
    let qpns = |text: &str, side: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(&format!(" {side} address: LID 0000 QPN ")))
            .map(|rest| rest.split(' ').next().unwrap().to_owned())
            .collect()
    };
    assert_eq!(qpns(&server.out, "remote").len(), 2, "{}", server.out);
    assert_eq!(qpns(&server.out, "remote"), qpns(&client.out, "local"));
    assert_eq!(qpns(&client.out, "remote"), qpns(&server.out, "local"));
    // perftest counts the iterations of every queue pair.
    check_row(&client.out, 4096, 400, 5);
    check_row(&server.out, 4096, 400, 5);
    assert_eq!(counter(&server.out, "rdma_recvs"), 400, "{}", server.out);
}

#[test]
fn send_lat_with_srq() {
    let args = ["--use-srq", "-n", "200", "-s", "64", "--check"];
    let (server, client) = pair(
        "send-lat",
        ("127.0.0.150", "127.0.0.151"),
        19706,
        &args,
        &args,
    );
    both_ok("send-lat --use-srq", &server, &client);
    header_says(&client.out, "RC", "ON");
    check_row(&client.out, 64, 200, 9);
    check_row(&server.out, 64, 200, 9);
}

#[test]
fn ud_and_srq_are_refused_where_perftest_refuses_them() {
    for (test, args, says) in [
        (
            "write-bw",
            &["-c", "UD"][..],
            " UD connection only possible in SEND verb",
        ),
        (
            "read-lat",
            &["-c", "UD"][..],
            " UD connection only possible in SEND verb",
        ),
        (
            "write-bw",
            &["--use-srq"][..],
            " Using SRQ only avavilible in SEND tests.",
        ),
        (
            "send-bw",
            &["--use-srq", "-q", "4", "-r", "2"][..],
            " Using SRQ depth should be greater than number of QPs.",
        ),
        (
            "send-bw",
            &["-c", "XRC"][..],
            " Invalid Connection type. Please choose from {RC,UC,UD}",
        ),
    ] {
        let out = perf(test, "127.0.0.152", 19707, args).output().unwrap();
        assert!(!out.status.success(), "{test} {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{test} {args:?}: {err}");
    }
}
