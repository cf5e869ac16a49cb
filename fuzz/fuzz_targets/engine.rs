//! The input is a sequence of records, each a 6-byte header (source, destination QP and
//! rewrite flags, clock) and a datagram, fed to a protocol engine with live queue pairs and
//! regions; see `src/engine.rs` for the format and the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_fuzz::engine::run(data);
});
