//! The input is text: lines of a session's control protocol (hello, channel description); see
//! `src/control.rs` for the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_fuzz::control::check_control(data);
});
