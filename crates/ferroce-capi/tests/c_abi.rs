//! The C ABI from C and C++: builds the static library (with the `test-hooks` feature, for
//! `ferroce_test_panic`), compiles `tests/c/capi_test.c`, `tests/c/verbs_test.c` and the two examples against it and
//! `include/ferroce.h`, and runs each on loopback. The examples are built here so that they
//! cannot drift from the header.
//!
//! The library is built by a nested `cargo build` in the same target directory: `cargo test`
//! holds the build lock only while it compiles, not while tests run. The compilers are `$CC`
//! (default `cc`) and `$CXX` (default `c++`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The native libraries a Rust static library needs on Linux (`--print native-static-libs`).
const NATIVE_LIBS: &[&str] = &[
    "-lgcc_s",
    "-lutil",
    "-lrt",
    "-lpthread",
    "-lm",
    "-ldl",
    "-lc",
];

/// How long a compiled program may run: each waits at most seconds for any one thing.
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `target/<profile>`, where this test binary's `deps/` directory lives.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Builds `libferroce_capi.a` with the test hooks, once per test binary.
fn static_library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let profile = profile_dir();
        let target_dir = profile.parent().expect("target dir").to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args([
                "build",
                "-p",
                "ferroce-capi",
                "--features",
                "test-hooks",
                "--lib",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .current_dir(crate_dir());
        if profile.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "cargo build -p ferroce-capi failed");
        let lib = profile.join("libferroce_capi.a");
        assert!(lib.exists(), "{} was not built", lib.display());
        lib
    })
}

/// Compiles `source` with `compiler` and `flags` against the header and the library.
fn compile(compiler: &str, flags: &[&str], source: &Path, name: &str) -> PathBuf {
    let lib = static_library();
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let include = crate_dir().join("include");
    let status = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror", "-O1", "-g", "-pthread"])
        .arg("-I")
        .arg(&include)
        .arg(source)
        .arg("-o")
        .arg(&out)
        .arg(lib)
        .args(NATIVE_LIBS)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        status.success(),
        "{compiler} could not build {}",
        source.display()
    );
    out
}

/// Runs `program`, failing the test when it exits non-zero or runs past [`RUN_LIMIT`].
fn run(program: &Path, args: &[&str]) {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let deadline = Instant::now() + RUN_LIMIT;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "{} failed: {status}", program.display());
            return;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} still ran after {RUN_LIMIT:?}", program.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

fn examples() -> PathBuf {
    crate_dir().join("../../examples")
}

#[test]
fn the_c_test_receives_frames_and_survives_a_panic() {
    let program = compile(
        &cc(),
        &["-std=c11", "-DFERROCE_TEST_HOOKS"],
        &crate_dir().join("tests/c/capi_test.c"),
        "capi_test",
    );
    run(&program, &[]);
}

#[test]
fn the_c_verbs_test_posts_lists_connects_and_sends_datagrams() {
    let program = compile(
        &cc(),
        &["-std=c11"],
        &crate_dir().join("tests/c/verbs_test.c"),
        "verbs_test",
    );
    run(&program, &[]);
}

#[test]
fn the_c_example_receives_frames() {
    let program = compile(
        &cc(),
        &["-std=c11"],
        &examples().join("c/receive_frames.c"),
        "receive_frames",
    );
    run(&program, &["--frames", "20"]);
}

#[test]
fn the_cpp_example_runs_the_hololink_shaped_receiver() {
    let program = compile(
        &cxx(),
        &["-std=c++17"],
        &examples().join("cpp/hololink_receiver.cpp"),
        "hololink_receiver",
    );
    run(&program, &[]);
}

#[test]
fn the_header_compiles_as_c_and_as_cpp_without_warnings() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let source = dir.join("header_only.c");
    std::fs::write(
        &source,
        "#include \"ferroce.h\"\nint main(void) { return 0; }\n",
    )
    .unwrap();
    let include = crate_dir().join("include");
    for (compiler, std) in [(cc(), "-std=c99"), (cxx(), "-std=c++17")] {
        let mut cmd = Command::new(&compiler);
        if compiler == cxx() {
            cmd.args(["-x", "c++"]);
        }
        let status = cmd
            .args([
                std,
                "-Wall",
                "-Wextra",
                "-Wpedantic",
                "-Werror",
                "-fsyntax-only",
            ])
            .arg("-I")
            .arg(&include)
            .arg(&source)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
        assert!(
            status.success(),
            "ferroce.h does not compile with {compiler} {std}"
        );
    }
}
