//! `ferroce ud-pingpong` and `ferroce srq-pingpong` against themselves in two processes, as
//! `ibv_ud_pingpong` and `ibv_srq_pingpong` run, and their refusals in the originals' words.
//! Each test has addresses and TCP ports of its own (127.0.0.90 and up, 19311 and up).

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::stats_counter as counter;

fn tool(name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.arg(name)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs a server on `.{server}` and a client on `.{client}` naming it; both must succeed.
/// The client starts once the server has printed its local address, which it does just
/// before it listens: a fixed sleep is not enough on a loaded machine.
fn run_pair(name: &str, server: u8, client: u8, args: &[&str]) -> (String, String) {
    let server_ip = format!("127.0.0.{server}");
    let client_ip = format!("127.0.0.{client}");
    let mut server_args = vec!["--local", &server_ip];
    server_args.extend_from_slice(args);
    let mut server = tool(name, &server_args).spawn().unwrap();
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("  local address:"), "server: {first}");
    let server_out = std::thread::spawn(move || {
        let mut rest = String::new();
        stdout.read_to_string(&mut rest).unwrap();
        first + &rest
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut client_args = vec!["--local", &client_ip, "--stats"];
    client_args.extend_from_slice(args);
    client_args.push(&server_ip);
    let client = tool(name, &client_args).output().unwrap();
    let server = server.wait_with_output().unwrap();
    let server_text = server_out.join().unwrap() + &String::from_utf8_lossy(&server.stderr);
    let client_text = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(client.status.success(), "client: {client_text}");
    assert!(server.status.success(), "server: {server_text}");
    (server_text, client_text)
}

fn check_results(text: &str, bytes: u64, iters: u64) {
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{bytes} bytes in ")) && l.ends_with(" Mbit/sec")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{iters} iters in ")) && l.ends_with(" usec/iter")),
        "{text}"
    );
}

#[test]
fn ud_pingpong_runs_as_ibv_ud_pingpong_does() {
    let (server, client) = run_pair(
        "ud-pingpong",
        90,
        91,
        &["-p", "19311", "-s", "1024", "-n", "300"],
    );
    for text in [&server, &client] {
        let first = text.lines().next().unwrap();
        // The original's local line has a colon before the GID, its remote line a comma.
        assert!(
            first.starts_with("  local address:  LID 0x0000, QPN 0x")
                && first.contains(": GID ::ffff:127.0.0.9"),
            "{text}"
        );
        assert!(
            text.contains("  remote address: LID 0x0000, QPN 0x"),
            "{text}"
        );
        assert!(text.contains(", GID ::ffff:127.0.0.9"), "{text}");
        check_results(text, 1024 * 300 * 2, 300);
    }
    let stats = client.lines().find(|l| l.starts_with("link ")).unwrap();
    assert_eq!(counter(stats, "sent_pkts"), 300, "one packet per datagram");
    assert_eq!(counter(stats, "rdma_recvs"), 300);
    assert_eq!(counter(stats, "ud_no_recv") + counter(stats, "qkey_err"), 0);
}

#[test]
fn ud_pingpong_refuses_a_datagram_larger_than_the_mtu() {
    let out = tool(
        "ud-pingpong",
        &["--local", "127.0.0.92", "-p", "19312", "-s", "4097"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Requested size larger than port MTU (4096)"
    );
}

#[test]
fn srq_pingpong_runs_many_qps_over_one_srq() {
    let (server, client) = run_pair(
        "srq-pingpong",
        93,
        94,
        &[
            "-p", "19313", "-q", "4", "-n", "400", "-s", "2000", "-r", "32",
        ],
    );
    for text in [&server, &client] {
        let locals = text
            .lines()
            .filter(|l| l.starts_with("  local address:  LID"))
            .count();
        let remotes = text
            .lines()
            .filter(|l| l.starts_with("  remote address: LID"))
            .count();
        assert_eq!((locals, remotes), (4, 4), "{text}");
        check_results(text, 2000 * 400 * 2, 400);
    }
    let stats = client.lines().find(|l| l.starts_with("link ")).unwrap();
    assert!(counter(stats, "rdma_recvs") >= 400);
    assert_eq!(counter(stats, "send_err"), 0);
}

#[test]
fn srq_pingpong_needs_a_receive_per_qp() {
    let out = tool(
        "srq-pingpong",
        &["--local", "127.0.0.95", "-p", "19314", "-q", "8", "-r", "4"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "rx_depth 4 is too small for 8 QPs -- must have at least one receive per QP."
    );
}
