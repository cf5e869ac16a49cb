//! Gives the shared library a SONAME, so that a program linked against it records which ABI
//! it needs (`libferroce_capi.so.0.1` for 0.1.x: before 1.0 a minor release may break the
//! ABI, after it only a major one) and the loader finds it through the symlink
//! `scripts/install-capi.sh` makes. Without one, programs record the path they were linked
//! with, and the library does not load from anywhere else.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return;
    }
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets the version");
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").expect("cargo sets the version");
    let abi = if major == "0" {
        format!("0.{minor}")
    } else {
        major
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libferroce_capi.so.{abi}");
}
