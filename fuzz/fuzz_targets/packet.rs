//! The input is a UDP payload (BTH through ICRC).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (ip, udp) = ferroce_fuzz::fixed_headers();
    ferroce_fuzz::check_packet(data, &ip, &udp);
});
