//! The input is a MAD as QP 1 receives it (256 bytes for a CM message); see `check_cm` in
//! `src/lib.rs` for the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_fuzz::check_cm(data);
});
