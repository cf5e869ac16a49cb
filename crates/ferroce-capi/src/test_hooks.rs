//! Calls that exist only for the tests (the `test-hooks` feature): `ferroce_test_panic`
//! makes the library panic on purpose, so the C test can watch the fence catch it.
//!
//! Why a feature rather than an always-exported symbol left out of the header: a shipped
//! library then has no way at all to be told to panic, and a C program that declares the
//! hook itself fails to link against it instead of crashing a production process. The
//! header declares it under `#if defined(FERROCE_TEST_HOOKS)`, so only a test that defines
//! that sees it.

use crate::fence::{fence_result, Failure};
use crate::ferroce_result;

/// Panics inside the library when `panic` is true (`FERROCE_RESULT_PANIC` comes back, with
/// the panic's message as the last error); returns `FERROCE_RESULT_INVALID` with a message
/// otherwise. Only in a library built with the `test-hooks` feature.
#[no_mangle]
pub extern "C" fn ferroce_test_panic(panic: bool) -> ferroce_result {
    fence_result("ferroce_test_panic", || {
        if panic {
            panic!("ferroce_test_panic was asked to panic");
        }
        Err(Failure::invalid(
            "ferroce_test_panic was asked not to panic",
        ))
    })
}
