//! The tools on a host without an RDMA device, as CI is: the binary does not link
//! libibverbs, and each way of having no device is told apart, with what to do. The fake
//! libibverbs of the library's tests stands in where a device list is needed.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

#[path = "../../ferroce/tests/fake-ibverbs/build.rs"]
mod fake_build;

fn fake() -> &'static PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        fake_build::build_fake_ibverbs(&PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-fake"))
    })
}

fn ferroce(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferroce"));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run ferroce")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_binary_does_not_need_libibverbs() {
    let out = Command::new("readelf")
        .args(["-d", env!("CARGO_BIN_EXE_ferroce")])
        .output()
        .expect("readelf (binutils, installed with the C toolchain)");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("(NEEDED)"), "{text}");
    assert!(!text.contains("libibverbs"), "{text}");
    assert!(!text.contains("librdmacm"), "{text}");
}

#[test]
fn without_the_library_the_tool_says_to_install_it_and_the_soft_nic_still_runs() {
    let o = ferroce(
        &["pingpong", "-d", "rxe0"],
        &[("FERROCE_IBVERBS", "/nonexistent/libibverbs.so.1")],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("cannot load libibverbs"), "{e}");
    assert!(e.contains("apt install libibverbs1"), "{e}");
    assert!(e.contains("-d ferroce0"), "{e}");
    // devinfo still shows the soft NIC, and says why there is nothing else.
    let o = ferroce(
        &["devinfo"],
        &[("FERROCE_IBVERBS", "/nonexistent/libibverbs.so.1")],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("hca_id:\tferroce0"));
    assert!(stderr(&o).contains("cannot load libibverbs"));
}

#[test]
fn without_kernel_rdma_the_tool_says_so_and_how_to_load_a_driver() {
    let lib = fake().to_str().unwrap();
    let o = ferroce(
        &["perf", "write-bw", "-d", "rxe0"],
        &[("FERROCE_IBVERBS", lib), ("FAKE_IBVERBS_ENOSYS", "1")],
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("this kernel has no RDMA support"), "{e}");
    assert!(e.contains("rdma link add"), "{e}");
    // The real library on a kernel without RDMA (this machine, and CI's) says the same.
    let real = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    let no_rdma = !std::path::Path::new("/sys/class/infiniband").exists();
    if real.exists() && no_rdma {
        let o = ferroce(&["pingpong", "-d", "rxe0"], &[]);
        assert!(
            stderr(&o).contains("this kernel has no RDMA support"),
            "{}",
            stderr(&o)
        );
    } else {
        eprintln!(
            "note: the real libibverbs part ran only where it is installed and the kernel has \
             no RDMA (installed: {}, kernel RDMA: {})",
            real.exists(),
            !no_rdma
        );
    }
}

#[test]
fn a_device_asked_for_by_name_is_named_in_the_refusal() {
    // README.md's `ferroce devinfo -v -d mlx5_0` and `ferroce stream recv -d mlx5_0` on a
    // host without RDMA (scripts/test-readme.sh runs them): which device, and why not. The
    // stream's --device is TEST-NET-1's, never contacted: the device fails to open first.
    let lib = fake().to_str().unwrap();
    let env = [("FERROCE_IBVERBS", lib), ("FAKE_IBVERBS_ENOSYS", "1")];
    let o = ferroce(&["devinfo", "-v", "-d", "mlx5_0"], &env);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("ferroce devinfo: no device mlx5_0: this kernel has no RDMA support"),
        "{e}"
    );
    let o = ferroce(
        &["stream", "recv", "-d", "mlx5_0", "--device", "192.0.2.1"],
        &env,
    );
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("ferroce stream: cannot open device mlx5_0: this kernel has no RDMA support"),
        "{e}"
    );
}

#[test]
fn a_device_that_is_not_there_is_named_with_those_that_are() {
    let lib = fake().to_str().unwrap();
    let o = ferroce(&["pingpong", "-d", "mlx5_9"], &[("FERROCE_IBVERBS", lib)]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("no RDMA device called mlx5_9; the devices here are: ferroce0, fake0"),
        "{e}"
    );
}

#[test]
fn devinfo_shows_the_soft_nic_and_each_device_with_its_gids() {
    let lib = fake().to_str().unwrap();
    let o = ferroce(&["devinfo"], &[("FERROCE_IBVERBS", lib)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for want in [
        "hca_id:\tferroce0",
        "hca_id:\tfake0",
        "state:\t\t\tPORT_ACTIVE (4)",
        "active_mtu:\t\t1024 (3)",
        "GID[  1]:\t\t::ffff:127.0.0.7, RoCE v2",
    ] {
        assert!(text.contains(want), "{want:?} missing from:\n{text}");
    }
    let o = ferroce(&["devinfo", "-l"], &[("FERROCE_IBVERBS", lib)]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "2 HCAs found:\n\tferroce0\n\tfake0\n"
    );
}

#[test]
fn soft_only_flags_on_a_verbs_device_are_refused_with_the_reason() {
    let lib = fake().to_str().unwrap();
    let o = ferroce(
        &["pingpong", "-d", "fake0", "--fault", "loss=0.1"],
        &[("FERROCE_IBVERBS", lib)],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--fault needs the soft NIC"),
        "{}",
        stderr(&o)
    );
}
