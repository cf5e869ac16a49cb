//! The input is a peer's endpoint message (pingpong's 52 bytes or ferroce's exchange lines);
//! see `src/exchange.rs` for the checks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_fuzz::exchange::check_exchange(data);
});
