//! `ferroce pingpong` against itself, in two processes on 127.0.0.2 and 127.0.0.3, as
//! `ibv_rc_pingpong` runs: a server, then a client naming it. Each test uses addresses of its
//! own (every NIC holds UDP port 4791 on its address), so the tests can run in parallel.

use std::process::{Command, Stdio};
use std::time::Duration;

fn pingpong(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.arg("pingpong")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

fn check_output(text: &str, size: u64, iters: u64) {
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("  local address:  LID 0x0000, QPN 0x"),
        "{text}"
    );
    assert!(lines[0].contains(", GID ::ffff:127.0.0."), "{text}");
    assert!(
        lines[1].starts_with("  remote address: LID 0x0000, QPN 0x"),
        "{text}"
    );
    assert!(
        lines[2].starts_with(&format!("{} bytes in ", size * iters * 2)),
        "{text}"
    );
    assert!(lines[2].ends_with(" Mbit/sec"), "{text}");
    assert!(
        lines[3].starts_with(&format!("{iters} iters in ")),
        "{text}"
    );
    assert!(lines[3].ends_with(" usec/iter"), "{text}");
}

#[test]
fn two_processes_ping_pong_with_checked_content() {
    for (port, extra, size) in [
        ("19101", "-e", "4096"),
        ("19102", "-c", "5000"),
        ("19103", "-c", "1"),
    ] {
        let server = pingpong(&[
            "--local",
            "127.0.0.2",
            "-p",
            port,
            "-n",
            "200",
            "-s",
            size,
            extra,
        ])
        .spawn()
        .unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let client = pingpong(&[
            "--local",
            "127.0.0.3",
            "-p",
            port,
            "-n",
            "200",
            "-s",
            size,
            extra,
            "--stats",
            "127.0.0.2",
        ])
        .output()
        .unwrap();
        let server = server.wait_with_output().unwrap();
        let (c, s) = (
            String::from_utf8_lossy(&client.stdout),
            String::from_utf8_lossy(&server.stdout),
        );
        assert!(
            client.status.success(),
            "client: {c}{}",
            String::from_utf8_lossy(&client.stderr)
        );
        assert!(
            server.status.success(),
            "server: {s}{}",
            String::from_utf8_lossy(&server.stderr)
        );
        let size: u64 = size.parse().unwrap();
        check_output(&c, size, 200);
        check_output(&s, size, 200);
        // --stats prints the counters in the shape of `rdma statistic show`.
        let stats = c.lines().last().unwrap();
        assert!(stats.starts_with("link ferroce0/1 sent_pkts "), "{stats}");
        assert!(stats.contains(" icrc_err 0 "), "{stats}");
    }
}

#[test]
fn a_missing_server_is_reported() {
    let out = pingpong(&["--local", "127.0.0.3", "-p", "19104", "127.0.0.2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Couldn't connect to 127.0.0.2:19104"), "{err}");
}

/// `--fault` in the real I/O path and `--pcap` on both sides: the run survives loss,
/// duplication and reordering byte-exact, and every captured packet decodes with a good ICRC.
#[test]
fn faults_and_captures() {
    let dir = tempfile::tempdir().unwrap();
    let (srv_pcap, cli_pcap) = (
        dir.path().join("server.pcap"),
        dir.path().join("client.pcap"),
    );
    let server = pingpong(&[
        "--local",
        "127.0.0.4",
        "-p",
        "19105",
        "-n",
        "100",
        "-c",
        "--fault",
        "loss=0.05,dup=0.02,reorder=0.05,seed=3",
        "--pcap",
        srv_pcap.to_str().unwrap(),
        "--stats",
    ])
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = pingpong(&[
        "--local",
        "127.0.0.5",
        "-p",
        "19105",
        "-n",
        "100",
        "-c",
        "--fault",
        "loss=0.05,seed=4",
        "--pcap",
        cli_pcap.to_str().unwrap(),
        "127.0.0.4",
    ])
    .output()
    .unwrap();
    let server = server.wait_with_output().unwrap();
    assert!(
        client.status.success(),
        "{}",
        String::from_utf8_lossy(&client.stderr)
    );
    assert!(
        server.status.success(),
        "{}",
        String::from_utf8_lossy(&server.stderr)
    );
    let stats = String::from_utf8_lossy(&server.stdout);
    let retries: u64 = stats
        .split_whitespace()
        .skip_while(|w| *w != "completer_retry_err")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("completer_retry_err in --stats");
    assert!(retries > 0, "the faults caused retransmissions: {stats}");
    for pcap in [&srv_pcap, &cli_pcap] {
        let decode = Command::new(env!("CARGO_BIN_EXE_ferroce"))
            .args(["decode", pcap.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            decode.status.success(),
            "{}",
            String::from_utf8_lossy(&decode.stderr)
        );
        let text = String::from_utf8_lossy(&decode.stdout);
        assert!(text.lines().count() > 500, "{}", text.lines().count());
        assert!(text.lines().all(|l| l.ends_with("icrc=ok")));
    }
}

/// A peer whose process is killed mid-run. If the survivor had a SEND outstanding, it exhausts
/// its retries (7 × 67 ms) and the tool reports the failed status as `ibv_rc_pingpong` does;
/// if it was only waiting for the peer's SEND, nothing can retry, and the tool says the peer
/// stopped answering after 10 s, where `ibv_rc_pingpong` would wait forever. Never a hang.
#[test]
fn a_killed_peer_ends_in_retry_exceeded() {
    let mut server = pingpong(&[
        "--local",
        "127.0.0.7",
        "-p",
        "19106",
        "-n",
        "1000000",
        "-s",
        "64",
    ])
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = pingpong(&[
        "--local",
        "127.0.0.8",
        "-p",
        "19106",
        "-n",
        "1000000",
        "-s",
        "64",
        "127.0.0.7",
    ])
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    server.kill().unwrap();
    server.wait().unwrap();
    let started = std::time::Instant::now();
    let out = client.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let retried = err.contains("Failed status transport retry counter exceeded (12) for wr_id 2");
    let silent = err.contains("No completion for 10 s: the peer stopped answering");
    assert!(retried || silent, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}
