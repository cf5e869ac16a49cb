//! `ferroce ucmatose` and `ferroce udaddy` against themselves in two processes, as librdmacm's
//! `ucmatose` and `udaddy` run, with their output lines and exit statuses. Each test has
//! addresses of its own (127.0.0.140 and up).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn tool(name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.arg(name)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs the client until the server listens (before, the server's NIC is not up, or its CM
/// refuses: REJ 8 for ucmatose, SIDR status 1 for udaddy) and returns both outputs.
fn pair(name: &str, server: &[&str], client: &[&str], not_yet: &str) -> (Output, Output) {
    let server = tool(name, server).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let deadline = Instant::now() + Duration::from_secs(20);
    let client = loop {
        let out = tool(name, client).output().unwrap();
        if !text(&out).contains(not_yet) || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    (server.wait_with_output().unwrap(), client)
}

fn lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn ucmatose_connects_exchanges_and_disconnects_four_connections() {
    let (server, client) = pair(
        "ucmatose",
        &["-b", "127.0.0.140", "-c", "4", "-p", "7480"],
        &[
            "-s",
            "127.0.0.140",
            "-b",
            "127.0.0.141",
            "-c",
            "4",
            "-p",
            "7480",
        ],
        "REJECTED, error: 8",
    );
    assert!(server.status.success(), "{}", text(&server));
    assert!(client.status.success(), "{}", text(&client));
    assert_eq!(
        lines(&server),
        [
            "cmatose: starting server",
            "initiating data transfers",
            "completing sends",
            "receiving data transfers",
            "data transfers complete",
            "cmatose: disconnecting",
            "disconnected",
            "test complete",
            "return status 0"
        ]
    );
    assert_eq!(
        lines(&client),
        [
            "cmatose: starting client",
            "cmatose: connecting",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0"
        ]
    );
}

#[test]
fn ucmatose_reports_a_refusal_with_its_status() {
    // A NIC on .142 with a listener on another port: the REQ gets REJ 8.
    let mut other = tool("ucmatose", &["-b", "127.0.0.142", "-p", "7481"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = tool(
        "ucmatose",
        &["-s", "127.0.0.142", "-b", "127.0.0.143", "-p", "7482"],
    )
    .output()
    .unwrap();
    let _ = other.kill();
    let _ = other.wait();
    assert_eq!(out.status.code(), Some(8), "{}", text(&out));
    let stdout = lines(&out);
    assert!(stdout.contains(&"cmatose: event: RDMA_CM_EVENT_REJECTED, error: 8".to_owned()));
    assert_eq!(stdout.last().map(String::as_str), Some("return status 8"));
}

#[test]
fn udaddy_resolves_by_sidr_and_answers_through_the_sender_s_address() {
    let (server, client) = pair(
        "udaddy",
        &["-b", "127.0.0.144", "-C", "20", "-S", "512"],
        &[
            "-s",
            "127.0.0.144",
            "-b",
            "127.0.0.145",
            "-C",
            "20",
            "-S",
            "512",
        ],
        "UNREACHABLE, error: 1",
    );
    assert!(server.status.success(), "{}", text(&server));
    assert!(client.status.success(), "{}", text(&client));
    assert_eq!(
        lines(&server),
        [
            "udaddy: starting server",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0"
        ]
    );
    assert_eq!(
        lines(&client),
        [
            "udaddy: starting client",
            "udaddy: connecting",
            "initiating data transfers",
            "receiving data transfers",
            "data transfers complete",
            "test complete",
            "return status 0"
        ]
    );
}

#[test]
fn udaddy_refuses_a_datagram_larger_than_the_mtu() {
    let out = tool("udaddy", &["-b", "127.0.0.146", "-S", "5000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(234), "{}", text(&out));
    assert!(lines(&out)
        .contains(&"udaddy: message_size 5000 is larger than active mtu 4096".to_owned()));
}
