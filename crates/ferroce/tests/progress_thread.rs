//! How the soft NIC's progress thread is scheduled (`NicConfig::progress_priority`). A file
//! of its own: it finds the thread by name in `/proc/self/task`, where a thread's name is cut
//! to 15 bytes, so no other NIC may be open in the process meanwhile.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use ferroce::{Nic, NicConfig};

/// The nice values of the threads of this process whose names start with `prefix`, once
/// there is one (a new thread names itself, and sets its priority, as it starts).
fn nice_of_threads(prefix: &str) -> Vec<i64> {
    for _ in 0..200 {
        let found = nice_now(prefix);
        if !found.is_empty() {
            // One look more, after the thread has surely set its priority.
            std::thread::sleep(std::time::Duration::from_millis(50));
            return nice_now(prefix);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Vec::new()
}

fn nice_now(prefix: &str) -> Vec<i64> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.starts_with(prefix) {
            found.push(nice_in(
                &std::fs::read_to_string(task.path().join("stat")).unwrap(),
            ));
        }
    }
    found
}

/// The nice value in a `/proc/.../stat` line: field 19, the 17th after the name.
fn nice_in(stat: &str) -> i64 {
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    rest.split(' ').nth(16).unwrap().parse().unwrap()
}

/// Whether this process may raise a thread's priority: CAP_SYS_NICE (bit 23) in effect.
fn may_raise_priority() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    caps & (1 << 23) != 0
}

#[test]
fn the_progress_thread_outranks_the_application_where_the_process_may() {
    // Raised (nice -10) where the process may, as a NIC's interrupt work outranks the
    // applications; at the application's own otherwise, and when asked not to be raised.
    let own = nice_in(&std::fs::read_to_string("/proc/self/stat").unwrap());
    let open = |host: u8, raise: bool| {
        Nic::open(&NicConfig {
            addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, host)), 24802),
            progress_priority: raise,
            ..NicConfig::default()
        })
        .unwrap()
    };
    let raised = open(2, true);
    let expected = if may_raise_priority() { -10 } else { own };
    assert_eq!(nice_of_threads("ferroce 127.0.0"), [expected]);
    drop(raised);
    let _plain = open(3, false);
    assert_eq!(nice_of_threads("ferroce 127.0.0"), [own]);
}
