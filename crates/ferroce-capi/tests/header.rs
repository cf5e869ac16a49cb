//! `include/ferroce.h` is what cbindgen generates from this crate, byte for byte, and its
//! version macros are the crate's: a change to the ABI that forgets the header fails here.

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let macros = config.after_includes.clone().unwrap_or_default();
    for (name, value) in [
        (
            "FERROCE_VERSION_MAJOR",
            env!("CARGO_PKG_VERSION_MAJOR").to_owned(),
        ),
        (
            "FERROCE_VERSION_MINOR",
            env!("CARGO_PKG_VERSION_MINOR").to_owned(),
        ),
        (
            "FERROCE_VERSION_PATCH",
            env!("CARGO_PKG_VERSION_PATCH").to_owned(),
        ),
        (
            "FERROCE_VERSION",
            format!("\"{}\"", env!("CARGO_PKG_VERSION")),
        ),
    ] {
        let line = format!("#define {name} {value}\n");
        assert!(
            macros.contains(&line),
            "cbindgen.toml's after_includes must say `{}` (the crate's version)",
            line.trim_end()
        );
    }
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let path = dir.join("include/ferroce.h");
    if std::env::var_os("FERROCE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/ferroce.h");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    if committed != generated {
        let old = String::from_utf8_lossy(&committed);
        let new = String::from_utf8_lossy(&generated);
        let first = old
            .lines()
            .zip(new.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| old.lines().count().min(new.lines().count()));
        panic!(
            "crates/ferroce-capi/include/ferroce.h is not what cbindgen generates from the \
             crate (first difference at line {}:\n  committed: {:?}\n  generated: {:?}).\n\
             Regenerate it with\n\n    FERROCE_BLESS=1 cargo test -p ferroce-capi --test header\n\n\
             and commit it with the change.",
            first + 1,
            old.lines().nth(first).unwrap_or("<end of file>"),
            new.lines().nth(first).unwrap_or("<end of file>"),
        );
    }
}
