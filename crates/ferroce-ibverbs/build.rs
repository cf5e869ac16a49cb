//! Links the cdylib as rdma-core's libibverbs.so.1: its SONAME, and its version nodes from
//! `libibverbs.map` (the `.symver` directives in `src/exports.rs` bind each symbol to its node).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = format!("{dir}/libibverbs.map");
    println!("cargo:rerun-if-changed=libibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map}");
}
