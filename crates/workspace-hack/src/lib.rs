//! No code. This package only asks for dependency features, so that every build of a ferroce
//! package resolves them as the whole workspace does (its Cargo.toml says why).

#![forbid(unsafe_code)]
