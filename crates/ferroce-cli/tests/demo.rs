//! `ferroce demo`, the README's main job, as a newcomer runs it. It has a test binary of its
//! own so that no other test competes with its stream for the CPU.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

#[test]
fn the_demo_streams_and_checks_every_frame() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ferroce"))
        .args(["demo", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "frames",
        "fps",
        "gbps",
        "dropped",
        "packets_lost",
        "content_errors",
    ] {
        assert!(summary.get(key).is_some(), "{key} missing from {summary}");
    }
    assert_eq!(summary["content_errors"], 0);
    let frames = summary["frames"].as_u64().unwrap();
    let dropped = summary["dropped"].as_u64().unwrap();
    assert!(frames > 0);
    assert_eq!(frames + dropped, 72, "{summary}");
    assert!(started.elapsed() < Duration::from_secs(60));
}
