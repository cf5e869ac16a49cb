//! What the CLI tests of two processes share: waiting for a side with a time limit and
//! collecting what it printed, starting a server and waiting for its banner, running a client
//! against it, reading and checking the result table, a counter of the `--stats` line, and a
//! capture read back by `ferroce decode --json`.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Longest a process may run before the test gives up on it.
pub const LIMIT: Duration = Duration::from_secs(60);

/// What one side did: exit status, stdout, stderr.
pub struct Side {
    pub ok: bool,
    pub out: String,
    pub err: String,
}

/// A thread reading `from` to its end.
fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = from.read_to_string(&mut text);
        text
    })
}

/// Waits for a child at most `LIMIT` (killing it past that) and collects what it printed;
/// `out` is its stdout when a thread has been reading it. Both streams are read while it runs:
/// a thousand queue pairs' address lines overflow a pipe.
pub fn finish(mut child: Child, who: &str, out: Option<std::thread::JoinHandle<String>>) -> Side {
    let out = out.unwrap_or_else(|| drain(child.stdout.take().unwrap()));
    let err = drain(child.stderr.take().unwrap());
    let deadline = Instant::now() + LIMIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the {who} ran for more than {LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Side {
        ok: status.success(),
        out: out.join().unwrap(),
        err: err.join().unwrap(),
    }
}

/// Starts the server `cmd` runs and waits for its banner; returns it and the thread reading
/// its stdout.
pub fn start_server(mut cmd: Command, test: &str) -> (Child, std::thread::JoinHandle<String>) {
    let mut server = cmd.spawn().unwrap();
    let stdout = server.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let mut lines = BufReader::new(stdout);
        let mut line = String::new();
        let mut told = false;
        while lines.read_line(&mut line).unwrap_or(0) > 0 {
            if !told && line.contains("Waiting for client to connect") {
                let _ = tx.send(());
                told = true;
            }
            out.push_str(&line);
            line.clear();
        }
        out
    });
    if rx.recv_timeout(LIMIT).is_err() {
        let _ = server.kill();
        let side = finish(server, "server", Some(reader));
        panic!("the {test} server never listened: {}{}", side.out, side.err);
    }
    (server, reader)
}

/// Starts the server `server` runs, waits for its banner, runs `client` against it; returns
/// both sides, server first.
pub fn run_pair(server: Command, mut client: Command, test: &str) -> (Side, Side) {
    let (server, reader) = start_server(server, test);
    let client = finish(client.spawn().unwrap(), "client", None);
    let server = finish(server, "server", Some(reader));
    (server, client)
}

/// Both sides succeeded.
pub fn both_ok(test: &str, server: &Side, client: &Side) {
    assert!(
        server.ok && client.ok,
        "{test}\n--- client:\n{}{}\n--- server:\n{}{}",
        client.out,
        client.err,
        server.out,
        server.err
    );
}

/// The result lines under the table's column line, split into fields.
pub fn result_rows(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut in_table = false;
    for line in text.lines() {
        if line.starts_with(" #bytes") {
            in_table = true;
            continue;
        }
        if in_table {
            if line.starts_with("---") {
                break;
            }
            rows.push(line.split_whitespace().map(str::to_owned).collect());
        }
    }
    rows
}

/// The one result line: `columns` numbers, the size and iterations asked for, none negative,
/// and those from `positive_from` on (counted after size and iterations) above zero.
pub fn check_row_from(text: &str, size: u64, iters: u64, columns: usize, positive_from: usize) {
    let rows = result_rows(text);
    assert_eq!(rows.len(), 1, "one result line expected:\n{text}");
    let row = &rows[0];
    assert_eq!(row.len(), columns, "{row:?}\n{text}");
    assert_eq!(row[0].parse::<u64>().unwrap(), size, "{text}");
    assert_eq!(row[1].parse::<u64>().unwrap(), iters, "{text}");
    let values: Vec<f64> = row[2..].iter().map(|v| v.parse().unwrap()).collect();
    assert!(values.iter().all(|&v| v >= 0.0), "{row:?}\n{text}");
    assert!(
        values[positive_from..].iter().all(|&v| v > 0.0),
        "{row:?}\n{text}"
    );
}

/// [`check_row_from`] with every rate and latency above zero but a bandwidth line's peak,
/// which may be 0 (the SEND server, as perftest's, reports none).
pub fn check_row(text: &str, size: u64, iters: u64, columns: usize) {
    check_row_from(text, size, iters, columns, usize::from(columns == 5));
}

/// Counter `name` of the `--stats` line in a tool's output (`link ferroce0/1 name value …`).
pub fn stats_counter(text: &str, name: &str) -> u64 {
    let stats = text
        .lines()
        .find(|l| l.starts_with("link ferroce0/1 "))
        .unwrap_or_else(|| panic!("no --stats line in:\n{text}"));
    stats
        .split_whitespace()
        .skip_while(|w| *w != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {stats}"))
}

/// The packets of a capture, each as `ferroce decode --json` gives its fields.
pub fn decoded(pcap: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["decode", "--json"])
        .arg(pcap)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
