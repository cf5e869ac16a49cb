//! Builds tests/fake-ibverbs/fake.c into a `libibverbs.so.1` under `out`, with the system C
//! compiler and the version script that gives each symbol its rdma-core version. Shared by
//! the library's and the CLI's tests (`#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The fake's path, built once per call site's target directory.
pub(crate) fn build_fake_ibverbs(out: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("ferroce")
        .join("tests")
        .join("fake-ibverbs");
    std::fs::create_dir_all(out).unwrap();
    let lib = out.join("libibverbs.so.1");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(src.join("fake.c"))
        .arg(format!(
            "-Wl,--version-script={}",
            src.join("libibverbs.map").display()
        ))
        .status()
        .expect("a C compiler (cc) builds the fake libibverbs; Rust's linker needs one too");
    assert!(status.success(), "building the fake libibverbs failed");
    lib
}
