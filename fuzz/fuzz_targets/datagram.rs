//! The input is a whole IPv4 or IPv6 packet (IP header on).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ferroce_fuzz::check_datagram(data);
});
