//! What the perf tests of two processes share: waiting for a side with a time limit and
//! collecting what it printed, starting a server and waiting for its banner, and reading the
//! result table.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read};
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

/// Waits for a child at most `LIMIT` (killing it past that) and collects what it printed;
/// `out` is its stdout when a thread has been reading it.
pub fn finish(mut child: Child, who: &str, out: Option<std::thread::JoinHandle<String>>) -> Side {
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
    let out = match out {
        Some(reader) => reader.join().unwrap(),
        None => {
            let mut text = String::new();
            child
                .stdout
                .take()
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            text
        }
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    Side {
        ok: status.success(),
        out,
        err,
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
