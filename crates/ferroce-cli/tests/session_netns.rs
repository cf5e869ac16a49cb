//! `ferroce perf session-lat` between two network namespaces joined by a veth pair that the
//! test creates and removes: the session over a real link, not loopback. Needs root and
//! iproute2; without them the test says why it skips, and `scripts/test.sh` sets
//! `FERROCE_REQUIRE_NETNS=1` so CI fails instead of skipping.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Two namespaces and a veth pair, removed on drop whatever happens.
struct Link {
    a: String,
    b: String,
}

fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("run ip")
}

fn must(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Link {
    fn new() -> Self {
        let pid = std::process::id();
        let link = Self {
            a: format!("ferroce-sess-{pid}-a"),
            b: format!("ferroce-sess-{pid}-b"),
        };
        must(&["netns", "add", &link.a]);
        must(&["netns", "add", &link.b]);
        must(&[
            "link",
            "add",
            "fs-veth-a",
            "netns",
            &link.a,
            "type",
            "veth",
            "peer",
            "name",
            "fs-veth-b",
            "netns",
            &link.b,
        ]);
        for (ns, dev, v4) in [
            (&link.a, "fs-veth-a", "10.199.8.1/24"),
            (&link.b, "fs-veth-b", "10.199.8.2/24"),
        ] {
            must(&["-n", ns, "addr", "add", v4, "dev", dev]);
            must(&["-n", ns, "link", "set", dev, "up"]);
            must(&["-n", ns, "link", "set", "lo", "up"]);
        }
        link
    }

    fn ferroce(&self, ns: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_ferroce")])
            .args(args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

fn can_run() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let has_ip = Command::new("ip").arg("-V").output().is_ok();
    if root && has_ip {
        return true;
    }
    assert!(
        std::env::var_os("FERROCE_REQUIRE_NETNS").is_none(),
        "FERROCE_REQUIRE_NETNS is set but this test needs root and iproute2 (root: {root}, ip: {has_ip})"
    );
    eprintln!(
        "SKIPPED session_lat_across_namespaces: needs root and iproute2 to create network namespaces"
    );
    false
}

#[test]
fn session_lat_across_namespaces() {
    if !can_run() {
        return;
    }
    let link = Link::new();
    let common = [
        "perf",
        "session-lat",
        "-s",
        "3000",
        "-n",
        "300",
        "-p",
        "19535",
    ];
    let mut server_args = common.to_vec();
    server_args.extend(["--local", "10.199.8.1"]);
    let server = link.ferroce(&link.a, &server_args).spawn().unwrap();
    // The client dials again and again until the server listens.
    std::thread::sleep(Duration::from_millis(100));
    let mut client_args = common.to_vec();
    client_args.extend(["--local", "10.199.8.2", "10.199.8.1"]);
    let client = link.ferroce(&link.b, &client_args).output().unwrap();
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
    assert!(c.contains("\n 3000    300 "), "{c}");
    assert!(c.contains("): consistent\n"), "{c}");
    assert!(s.contains(" Served 300 requests\n"), "{s}");
}
