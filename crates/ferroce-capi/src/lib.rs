//! The C ABI of ferroce: `include/ferroce.h`.
