//! The input is a capture file (pcap or pcapng); see `src/capture.rs` for the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_fuzz::capture::check_capture(data);
});
