//! `ferroce perf session-lat` against itself: an echoing coprocessor server and a controller
//! client in two processes, the latency table of the other latency tests, `last_rtt_ns`
//! checked, and `--out_json`. Addresses 127.0.0.66 and up and TCP ports 19531 and up are this
//! file's own.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

fn session_lat(local: &str, port: u16, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.args([
        "perf",
        "session-lat",
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

fn wait(child: &mut Child, who: &str) -> ExitStatus {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the {who} ran for more than {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn output(child: &mut Child) -> (String, String) {
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut out).unwrap();
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut err).unwrap();
    }
    (out, err)
}

/// Starts a server on `addrs.0`, waits until it says it waits, runs a client on `addrs.1`.
fn pair(addrs: (&str, &str), port: u16, args: &[&str], client_args: &[&str]) -> (String, String) {
    let mut server = session_lat(addrs.0, port, args).spawn().unwrap();
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            if line.contains("Waiting for client to connect") {
                let _ = tx.send(());
            }
            text.push_str(&line);
            line.clear();
        }
        text
    });
    rx.recv_timeout(LIMIT)
        .expect("the server never said it waits");
    let mut all = args.to_vec();
    all.extend_from_slice(client_args);
    all.push(addrs.0);
    let mut client = session_lat(addrs.1, port, &all).spawn().unwrap();
    let client_status = wait(&mut client, "client");
    let server_status = wait(&mut server, "server");
    let (client_out, client_err) = output(&mut client);
    let (_, server_err) = output(&mut server);
    let server_out = reader.join().unwrap();
    assert!(
        client_status.success() && server_status.success(),
        "client {client_status}, server {server_status}\n--- client:\n{client_out}{client_err}\n--- server:\n{server_out}{server_err}"
    );
    (client_out, server_out)
}

fn row(text: &str) -> Vec<f64> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(" #bytes"));
    lines.next().expect("the column line");
    let row = lines.next().expect("a result line");
    row.split_whitespace().map(|v| v.parse().unwrap()).collect()
}

#[test]
fn session_lat_round_trips_with_a_consistent_last_rtt() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("session.json");
    let (client, server) = pair(
        ("127.0.0.66", "127.0.0.67"),
        19531,
        &["-s", "4096", "-n", "300"],
        &["--out_json", "--out_json_file", json.to_str().unwrap()],
    );
    assert!(
        client.contains("                    Session Latency Test\n"),
        "{client}"
    );
    assert!(client.contains(" Role            : controller"), "{client}");
    let values = row(&client);
    assert_eq!(values.len(), 9, "{client}");
    assert_eq!((values[0], values[1]), (4096.0, 300.0));
    assert!(values[2..].iter().all(|&v| v > 0.0), "{client}");
    assert!(
        client.contains("): consistent\n"),
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
fn bad_flags_and_missing_servers_are_named() {
    for (args, says) in [
        (&["-s", "0"][..], "Message size"),
        (&["-n", "2"][..], "at least 5"),
        (&["-m", "1000"][..], "Invalid MTU"),
        (&["--out_json"][..], "--out_json needs --out_json_file"),
    ] {
        let out = session_lat("127.0.0.68", 19532, args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // No server: the client dials for 10 s and says so.
    let started = Instant::now();
    let out = session_lat("127.0.0.68", 19533, &["127.0.0.69"])
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

/// Different sizes on the two sides: both refuse the channel, naming both descriptions.
#[test]
fn mismatched_sizes_are_refused() {
    let mut server = session_lat("127.0.0.70", 19534, &["-s", "64"])
        .spawn()
        .unwrap();
    let client = session_lat("127.0.0.71", 19534, &["-s", "128", "127.0.0.70"])
        .output()
        .unwrap();
    let status = wait(&mut server, "server");
    assert!(!client.status.success() && !status.success());
    let err = String::from_utf8_lossy(&client.stderr);
    assert!(
        err.contains("the peer established 1 slots of 64-byte requests"),
        "{err}"
    );
}
