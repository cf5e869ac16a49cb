//! `ferroce rping` against itself in two processes, as librdmacm's `rping` runs: pings
//! validated byte for byte over a connection made by connection management, and a refusal in
//! rping's words. Each test has addresses of its own (127.0.0.112 and up).

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn rping(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.arg("rping")
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

/// Runs the client until the server listens: a REQ that comes before the listener is refused
/// with REJ 8, as it is by the kernel, and the client tries again.
fn client_when_listening(args: &[&str]) -> Output {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = rping(args).output().unwrap();
        let refused = String::from_utf8_lossy(&out.stderr).contains("REJECTED, error 8");
        if !refused || Instant::now() > deadline {
            return out;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn pings_are_read_and_written_back_and_validated() {
    let server = rping(&["-s", "-a", "127.0.0.112", "-v", "-p", "7300", "-S", "100"])
        .spawn()
        .unwrap();
    let client = client_when_listening(&[
        "-c",
        "-a",
        "127.0.0.112",
        "-I",
        "127.0.0.113",
        "-p",
        "7300",
        "-C",
        "20",
        "-S",
        "100",
        "-V",
        "-v",
    ]);
    let server = server.wait_with_output().unwrap();
    let (client_text, server_text) = (text(&client), text(&server));
    assert!(client.status.success(), "client: {client_text}");
    assert!(server.status.success(), "server: {server_text}");
    let pings: Vec<_> = client_text
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .collect();
    assert_eq!(pings.len(), 20, "{client_text}");
    assert!(pings[0].starts_with("ping data: rdma-ping-0: ABCDEFG"));
    assert!(pings[19].starts_with("ping data: rdma-ping-19: TUVWXYZ"));
    // 100 bytes: the text is 99 characters and its NUL.
    assert_eq!(pings[0].len(), "ping data: ".len() + 99);
    let served = server_text
        .lines()
        .filter(|l| l.starts_with("server ping data: rdma-ping-"))
        .count();
    assert_eq!(served, 20, "{server_text}");
    assert!(server_text.contains("server DISCONNECT EVENT..."));
}

#[test]
fn a_port_nobody_listens_on_is_refused_with_rej_8() {
    // Someone else's NIC on .114, listening on another port.
    let _other = Server(
        rping(&["-s", "-a", "127.0.0.114", "-p", "7301"])
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let out = rping(&[
        "-c",
        "-a",
        "127.0.0.114",
        "-I",
        "127.0.0.115",
        "-p",
        "7302",
        "-C",
        "1",
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cma event RDMA_CM_EVENT_REJECTED, error 8"),
        "{stderr}"
    );
}

#[test]
fn a_size_outside_rpings_range_is_refused() {
    let out = rping(&["-c", "-a", "127.0.0.116", "-S", "10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(22));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Invalid size 10 (valid range is 26 to 65536)"
    );
}
