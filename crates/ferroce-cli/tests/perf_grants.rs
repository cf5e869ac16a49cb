//! Each `ferroce perf` test grants its peer what its perftest twin grants and no more: a
//! client running another test's requests against it is refused as perftest's peer refuses
//! them, with an invalid request NAK (addresses 127.0.0.180 and up).

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

fn perf(test: &str, ip: &str, port: &str, server: Option<&str>) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.args(["perf", test, "--local", ip, "-p", port, "-n", "20"])
        .args(server)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `server_test`'s server and `client_test`'s client against it; returns the client's
/// exit status and output.
fn mismatched(
    server_test: &str,
    client_test: &str,
    ips: (&str, &str),
    port: &str,
) -> (bool, String) {
    let mut server = perf(server_test, ips.0, port, None).spawn().unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap());
    let mut line = String::new();
    while lines.read_line(&mut line).unwrap() > 0 && !line.contains("Waiting for client") {
        line.clear();
    }
    let client = perf(client_test, ips.1, port, Some(ips.0))
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    let mut rest = String::new();
    let _ = lines.read_to_string(&mut rest);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&client.stdout),
        String::from_utf8_lossy(&client.stderr)
    );
    (client.status.success(), text)
}

#[test]
fn each_test_refuses_requests_its_perftest_twin_does_not_grant() {
    for (server, client, ips, port) in [
        (
            "write-bw",
            "read-bw",
            ("127.0.0.180", "127.0.0.181"),
            "19801",
        ),
        (
            "read-bw",
            "atomic-bw",
            ("127.0.0.182", "127.0.0.183"),
            "19802",
        ),
        (
            "send-bw",
            "write-bw",
            ("127.0.0.184", "127.0.0.185"),
            "19803",
        ),
    ] {
        let (ok, text) = mismatched(server, client, ips, port);
        assert!(!ok, "{client} against {server}: {text}");
        assert!(
            text.contains("(remote invalid request error)"),
            "{client} against {server}: {text}"
        );
    }
}
