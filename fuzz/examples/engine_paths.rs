//! Replays `engine` inputs through the target's harness (without libFuzzer) and reports which
//! protocol paths they reach: the engine's own counters and the harness's [`Tally`], summed
//! over the inputs, with how many inputs reached each.
//!
//! ```sh
//! cargo run --release --example engine_paths -- corpus/engine [more dirs or files]
//! ```
//!
//! With no argument it reads `corpus/engine`. It exits with status 1 when an input fails a
//! check of the harness (the file is named) or when the inputs miss one of the paths the
//! corpus must reach: retransmission (a request packet sent again, `completer_retry_err`),
//! RNR (an RNR NAK sent, one received), READ replay (a duplicate READ request answered again)
//! and errors (an error completion, an access and an invalid-request NAK, a retry count
//! exhausted).
//!
//! [`Tally`]: ferroce_fuzz::engine::Tally
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use ferroce_fuzz::engine;

/// The paths the corpus must reach: (name, what it shows).
const REQUIRED: [(&str, &str); 10] = [
    (
        "resent_packets",
        "retransmission: a request packet sent again",
    ),
    (
        "completer_retry_err",
        "retransmission: started by a timeout or a NAK",
    ),
    (
        "rnr_naks_sent",
        "RNR: a SEND with no receive posted answered with an RNR NAK",
    ),
    ("rcvd_rnr_err", "RNR: the requester received an RNR NAK"),
    (
        "read_replays",
        "READ replay: a duplicate READ request answered again",
    ),
    ("duplicate_request", "duplicates: a request with an old PSN"),
    (
        "error_completions",
        "errors: a work request completed with an error",
    ),
    ("access_naks_sent", "errors: a remote access error NAK sent"),
    ("invalid_naks_sent", "errors: an invalid request NAK sent"),
    ("retry_exceeded_err", "errors: a retry count exhausted"),
];

fn inputs(args: &[String]) -> Vec<PathBuf> {
    let roots: Vec<PathBuf> = if args.is_empty() {
        vec![PathBuf::from("corpus/engine")]
    } else {
        args.iter().map(PathBuf::from).collect()
    };
    let mut files = Vec::new();
    for root in roots {
        if root.is_dir() {
            let mut dir: Vec<PathBuf> = std::fs::read_dir(&root)
                .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            dir.sort();
            files.extend(dir);
        } else {
            files.push(root);
        }
    }
    files
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let files = inputs(&args);
    // name → (sum, inputs that reached it)
    let mut seen: BTreeMap<&'static str, (u64, u64)> = BTreeMap::new();
    let mut failed = false;
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let run = std::panic::catch_unwind(|| {
            let h = engine::run_harness(&data);
            let counters: Vec<_> = h.engine.counters().iter().collect();
            let tally: Vec<_> = h.tally.iter().collect();
            (counters, tally)
        });
        let Ok((counters, tally)) = run else {
            eprintln!("FAILED: {}", file.display());
            failed = true;
            continue;
        };
        for (name, v) in counters.into_iter().chain(tally) {
            let entry = seen.entry(name).or_default();
            entry.0 += v;
            entry.1 += u64::from(v > 0);
        }
    }
    println!("{} inputs", files.len());
    println!("{:<24} {:>12} {:>8}", "counter", "sum", "inputs");
    for (name, (sum, n)) in &seen {
        println!("{name:<24} {sum:>12} {n:>8}");
    }
    println!();
    let mut missed = false;
    for (name, what) in REQUIRED {
        let n = seen.get(name).map_or(0, |s| s.1);
        let mark = if n > 0 { "reached" } else { "MISSED " };
        missed |= n == 0;
        println!("{mark} {name:<22} {n:>6} inputs  {what}");
    }
    if failed || missed || files.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
