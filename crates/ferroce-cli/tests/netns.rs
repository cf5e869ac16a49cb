//! The tools between two network namespaces joined by a veth pair that each test creates and
//! removes, a real link rather than loopback: `pingpong` over IPv4 and IPv6, every `perf` verb
//! under faults, `perf session-lat`, and a frame stream whose receiver loses its address. Needs
//! root and iproute2; without them the test says why it skips, and `scripts/test.sh` sets
//! `FERROCE_REQUIRE_NETNS=1` so CI fails instead of skipping.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::stats_counter as counter;

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
    fn new(tag: &str) -> Self {
        let pid = std::process::id();
        let link = Self {
            a: format!("ferroce-{tag}-{pid}-a"),
            b: format!("ferroce-{tag}-{pid}-b"),
        };
        must(&["netns", "add", &link.a]);
        must(&["netns", "add", &link.b]);
        must(&[
            "link",
            "add",
            "fr-veth-a",
            "netns",
            &link.a,
            "type",
            "veth",
            "peer",
            "name",
            "fr-veth-b",
            "netns",
            &link.b,
        ]);
        for (ns, dev, v4, v6) in [
            (&link.a, "fr-veth-a", "10.199.7.1/24", "fd00:199::1/64"),
            (&link.b, "fr-veth-b", "10.199.7.2/24", "fd00:199::2/64"),
        ] {
            must(&["-n", ns, "addr", "add", v4, "dev", dev]);
            must(&["-n", ns, "addr", "add", v6, "dev", dev, "nodad"]);
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

    /// Starts a tool as server in `server_ns`, gives it time to listen, runs its client in
    /// `client_ns` to the end, then waits for the server: (client's, server's) output.
    fn serve_then_run(
        &self,
        server_ns: &str,
        server: &[&str],
        client_ns: &str,
        client: &[&str],
    ) -> (Output, Output) {
        let server = self.ferroce(server_ns, server).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(300));
        let client = self.ferroce(client_ns, client).output().unwrap();
        (client, server.wait_with_output().unwrap())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and with it the pair.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// The standard output of a tool run that must have succeeded; a failure shows both of its
/// streams, under `who`.
fn stdout_of(who: &str, out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{who}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
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
        "SKIPPED this namespace test: it needs root and iproute2 to create network namespaces"
    );
    false
}

#[test]
fn pingpong_across_namespaces() {
    if !can_run() {
        return;
    }
    let link = Link::new("pp");
    for (server_ip, client_ip, size) in [
        ("10.199.7.1", "10.199.7.2", "4096"),
        ("fd00:199::1", "fd00:199::2", "3000"),
    ] {
        let (client, server) = link.serve_then_run(
            &link.a,
            &[
                "pingpong", "--local", server_ip, "-n", "300", "-s", size, "-c", "--stats",
            ],
            &link.b,
            &[
                "pingpong", "--local", client_ip, "-n", "300", "-s", size, "-c", "--stats",
                server_ip,
            ],
        );
        let (c, s) = (stdout_of("client", &client), stdout_of("server", &server));
        assert!(c.contains("300 iters in "), "{c}");
        assert!(
            c.contains(&format!(
                "GID {}",
                if server_ip.contains(':') {
                    server_ip.to_owned()
                } else {
                    format!("::ffff:{server_ip}")
                }
            )),
            "{c}"
        );
        for out in [&c, &s] {
            assert!(out.contains(" icrc_err 0 "), "{out}");
            // Each message's MIDDLEs and LAST left as one GSO send, over IPv4 and IPv6 alike,
            // and veth handed them to the peer's GRO socket whole.
            assert!(counter(out, "udp_gso_sends") >= 300, "{out}");
            assert!(counter(out, "udp_gro_buffers") >= 300, "{out}");
        }
    }
}

/// UDP GSO across a real link, under loss: WRITEs leave as GSO trains, which veth keeps whole
/// to a receiver with UDP GRO (each segment checked with the IPv4 ID of its index) and which
/// the kernel splits for a receiver without it (each ID recovered from the ICRC). Every byte
/// is checked, and every ICRC is good either way.
#[test]
fn gso_across_the_link_with_and_without_gro_under_loss() {
    if !can_run() {
        return;
    }
    let link = Link::new("gso");
    for gro in [true, false] {
        let mut server_args = vec![
            "perf",
            "write-bw",
            "--local",
            "10.199.7.1",
            "-s",
            "65536",
            "-n",
            "300",
            "--check",
            "--stats",
        ];
        if !gro {
            server_args.push("--no-gro");
        }
        let client_args = [
            "perf",
            "write-bw",
            "--local",
            "10.199.7.2",
            "-s",
            "65536",
            "-n",
            "300",
            "--check",
            "--stats",
            "--fault",
            "loss=0.02,seed=9",
            "10.199.7.1",
        ];
        let (client, server) = link.serve_then_run(&link.a, &server_args, &link.b, &client_args);
        let c = stdout_of(&format!("client, GRO {gro}"), &client);
        let s = stdout_of(&format!("server, GRO {gro}"), &server);
        assert!(counter(&c, "udp_gso_sends") > 100, "{c}");
        assert_eq!(counter(&c, "udp_gso_fallbacks"), 0, "{c}");
        assert!(
            counter(&c, "completer_retry_err") + counter(&c, "early_resends") > 0,
            "{c}"
        );
        assert_eq!(counter(&s, "icrc_err"), 0, "{s}");
        if gro {
            assert!(counter(&s, "udp_gro_buffers") > 100, "{s}");
        } else {
            assert_eq!(counter(&s, "udp_gro_buffers"), 0, "{s}");
            assert!(counter(&s, "icrc_id_recovered") > 1000, "{s}");
        }
    }
}

/// A frame stream across the link survives its receiver's address being removed: the
/// receive path fails, `stream recv` starts it again once the address is back, reprograms the
/// device, and frames flow again, every one checked.
#[test]
fn a_stream_recovers_when_its_address_comes_back() {
    use std::io::{BufRead, BufReader};

    if !can_run() {
        return;
    }
    let link = Link::new("st");
    // The device streams until killed: kill it (by PID) however the test ends.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _device = Kill(
        link.ferroce(
            &link.b,
            &["stream", "send", "--local", "10.199.7.2", "--fps", "50"],
        )
        .spawn()
        .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut recv = link
        .ferroce(
            &link.a,
            &[
                "stream",
                "recv",
                "--local",
                "10.199.7.1",
                "--device",
                "10.199.7.2",
                "--frame-size",
                "200000",
                "--frames",
                "60",
                "--idle",
                "20",
                "--json",
            ],
        )
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(recv.stdout.take().unwrap()).lines();
    let head = lines.next().unwrap().unwrap();
    assert!(head.contains("\"qp\""), "{head}");
    // Some frames, then the address goes away for a second.
    for _ in 0..10 {
        lines.next().unwrap().unwrap();
    }
    must(&[
        "-n",
        &link.a,
        "addr",
        "del",
        "10.199.7.1/24",
        "dev",
        "fr-veth-a",
    ]);
    std::thread::sleep(Duration::from_secs(1));
    must(&[
        "-n",
        &link.a,
        "addr",
        "add",
        "10.199.7.1/24",
        "dev",
        "fr-veth-a",
    ]);
    let rest: Vec<serde_json::Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let status = recv.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(recv.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("is no longer on this host"), "{stderr}");
    assert!(stderr.contains("restarted"), "{stderr}");
    let summary = rest.last().unwrap();
    // `--frames 60` counts the frames that arrived, checked or dropped (the receive path may
    // drop one while it starts again).
    let arrived = summary["frames"].as_u64().unwrap() + summary["dropped"].as_u64().unwrap();
    assert!(arrived >= 60, "{summary}");
    assert!(summary["restarts"].as_u64().unwrap() >= 1, "{summary}");
    assert_eq!(summary["content_errors"], 0, "{summary}");
}

/// Every verb across the link, both directions, with loss, duplication and reordering
/// injected on both sides: `ferroce perf`'s bandwidth tests with `--check`, so every byte that
/// arrived is verified (WRITE, READ, SEND, and fetch-and-add's results).
#[test]
fn every_verb_both_ways_across_namespaces_under_faults() {
    if !can_run() {
        return;
    }
    let link = Link::new("vb");
    let sides = [
        (&link.a, "10.199.7.1", &link.b, "10.199.7.2"),
        (&link.b, "10.199.7.2", &link.a, "10.199.7.1"),
    ];
    for (server_ns, server_ip, client_ns, client_ip) in sides {
        for (test, size) in [
            ("write-bw", "65536"),
            ("read-bw", "65536"),
            ("send-bw", "4096"),
            ("atomic-bw", "8"),
        ] {
            let common = |local: &str| {
                vec![
                    "perf".to_owned(),
                    test.to_owned(),
                    "--local".to_owned(),
                    local.to_owned(),
                    "-s".to_owned(),
                    size.to_owned(),
                    "-n".to_owned(),
                    "100".to_owned(),
                    "--check".to_owned(),
                    "--fault".to_owned(),
                    "loss=0.02,dup=0.01,reorder=0.02,delay=20,seed=5".to_owned(),
                ]
            };
            let server_args = common(server_ip);
            let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
            let mut client_args = common(client_ip);
            client_args.push(server_ip.to_owned());
            let client_args: Vec<&str> = client_args.iter().map(String::as_str).collect();
            let (client, server) =
                link.serve_then_run(server_ns, &server_args, client_ns, &client_args);
            let run = |who| format!("{test} {who} in {server_ns}->{client_ns}");
            let stdout = stdout_of(&run("client"), &client);
            stdout_of(&run("server"), &server);
            assert!(stdout.contains(&format!(" {size} ")), "{test}: {stdout}");
            // No -m: the veth's 1500 bytes carry 1024-byte RoCE packets, as rxe would use.
            assert!(
                stdout.contains(" Mtu             : 1024[B]"),
                "{test}: {stdout}"
            );
        }
    }
}

/// `perf session-lat` across the link: Catalyst's session over a real link, not loopback.
#[test]
fn session_lat_across_namespaces() {
    if !can_run() {
        return;
    }
    let link = Link::new("se");
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
    server_args.extend(["--local", "10.199.7.1"]);
    let server = link.ferroce(&link.a, &server_args).spawn().unwrap();
    // The client dials again and again until the server listens.
    std::thread::sleep(Duration::from_millis(100));
    let mut client_args = common.to_vec();
    client_args.extend(["--local", "10.199.7.2", "10.199.7.1"]);
    let client = link.ferroce(&link.b, &client_args).output().unwrap();
    let server = server.wait_with_output().unwrap();
    let (c, s) = (stdout_of("client", &client), stdout_of("server", &server));
    assert!(c.contains("\n 3000    300 "), "{c}");
    // Inside its round trip; how near the median depends on the host's load (as in perf.rs).
    assert!(
        c.contains("): consistent\n") || c.contains("): unusual\n"),
        "{c}"
    );
    assert!(s.contains(" Served 300 requests\n"), "{s}");
}

/// Waits for `child` up to `limit`; a child still running then is killed, and `None` says so.
fn output_within(mut child: std::process::Child, limit: Duration) -> Option<Output> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A firewall that drops empty RoCE datagrams cannot keep a NIC from closing. The NIC's
/// progress thread sleeps without a deadline when no timer is armed; it used to be woken by
/// a zero-length datagram to its own port, which such a rule (or a random-loss rule, as in
/// the interop suite's loss runs) drops, and the tool then hung on exit for good.
#[test]
fn nics_close_when_a_firewall_drops_empty_datagrams() {
    if !can_run() {
        return;
    }
    let has_nft = Command::new("nft").arg("--version").output().is_ok();
    if !has_nft {
        assert!(
            std::env::var_os("FERROCE_REQUIRE_NETNS").is_none(),
            "FERROCE_REQUIRE_NETNS is set but this test needs nft (nftables)"
        );
        eprintln!("SKIPPED the firewall test: it needs nft (nftables)");
        return;
    }
    let link = Link::new("fw");
    for ns in [&link.a, &link.b] {
        let rules = "table inet ferroce_fw { chain in { type filter hook input priority 0; \
                     udp dport 4791 udp length 8 counter drop; }; }";
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "nft", rules])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nft in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = link
        .ferroce(&link.a, &["pingpong", "--local", "10.199.7.1", "-n", "50"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let client = link
        .ferroce(
            &link.b,
            &[
                "pingpong",
                "--local",
                "10.199.7.2",
                "-n",
                "50",
                "10.199.7.1",
            ],
        )
        .spawn()
        .unwrap();
    let limit = Duration::from_secs(30);
    let client = output_within(client, limit);
    let server = output_within(server, limit);
    for (who, out) in [("client", client), ("server", server)] {
        let out = out.unwrap_or_else(|| panic!("the {who} did not exit within {limit:?}"));
        let stdout = stdout_of(who, &out);
        assert!(stdout.contains("50 iters in "), "{who}: {stdout}");
    }
}
