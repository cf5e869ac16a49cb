//! Empty: cargo resolves a package's build-dependencies only when it has a build script
//! (Cargo.toml says why this package has one).

fn main() {}
