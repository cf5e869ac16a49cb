//! The pause of a loop that polls a CQ. On the soft NIC each empty [`Cq::poll`] is a look at
//! the NIC's socket, so a loop that polls back to back finds a message at the poll after it
//! lands; what else the loop checks (a deadline, the peer, another queue) and whether to give
//! the core away need not come at every poll. [`Spin`] counts a loop's empty polls, reads the
//! clock at every 32nd for the loop's other checks, and yields the core only while another
//! thread needs it.
//!
//! Measured with Catalyst's session (BENCHMARKS.md, the data path's fifteenth step):
//! yielding at every empty poll (a `sched_yield`) cost a spinning controller a fifth of its
//! time and found a reply that landed during a yield late; never yielding, a controller and a
//! coprocessor that the scheduler put on one core handed it to each other only at a periodic
//! yield, tens of microseconds a message. So a loop yields at every poll only while its thread
//! shares its core: while the scheduler keeps taking the core from it, which the thread's count
//! of involuntary context switches tells.
//!
//! [`Cq::poll`]: super::Cq::poll

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sys;

/// Empty polls between two looks at the clock, which are the caller's times for its other
/// checks. A poll on the soft NIC is a system call of about a microsecond, so these come a few
/// tens of microseconds apart; a verbs device's poll reads memory, and its 32 take a
/// microsecond or two.
const LOOK_EVERY: u32 = 32;

/// The least time between two checks of whether the core is shared (a system call and a yield
/// each), so that a verbs device's quick polls do not pay one every microsecond.
const SHARE_CHECK_EVERY: Duration = Duration::from_micros(20);

/// One polling thread's pause between empty polls: counts them, reads the clock at every 32nd,
/// and decides every 20 µs or so whether the thread shares its core.
///
/// ```no_run
/// # fn demo(cq: &ferroce::Cq) -> Result<ferroce::cq::Completion, &'static str> {
/// use std::time::{Duration, Instant};
/// use ferroce::cq::Spin;
///
/// let started = Instant::now();
/// let mut spin = Spin::new();
/// loop {
///     if let Some(wc) = cq.poll() {
///         return Ok(wc);
///     }
///     if let Some(now) = spin.empty_poll() {
///         // Every 32nd empty poll: a deadline, the peer, other queues.
///         if now - started > Duration::from_secs(1) {
///             return Err("no completion for a second");
///         }
///     }
/// }
/// # }
/// ```
///
/// A `Spin` counts for the thread that calls it: moved to another, its next check may find
/// the core shared once. Where the process may use one CPU only (a one-vCPU guest, an affinity
/// mask or a cgroup quota of one), every spin shares it with whatever else runs, and every
/// empty poll yields.
#[derive(Debug)]
pub struct Spin {
    idle: u32,
    /// The process may run on one CPU only: `shared` for good, and no checks.
    one_cpu: bool,
    /// Whether the scheduler took the core from this thread between the last two checks (or
    /// `one_cpu`): then every empty poll yields.
    shared: bool,
    /// The thread's involuntary context switches at the last check.
    switches: u64,
    /// When the last check was.
    checked: Instant,
}

impl Spin {
    /// A spin that starts with the core to itself, unless the process has one CPU.
    #[must_use]
    pub fn new() -> Self {
        Self::on_cpus(cpus())
    }

    /// A spin for a process that may run on `cpus` CPUs.
    fn on_cpus(cpus: usize) -> Self {
        let one_cpu = cpus == 1;
        Self {
            idle: 0,
            one_cpu,
            shared: one_cpu,
            switches: sys::involuntary_switches(),
            checked: Instant::now(),
        }
    }

    /// Counts a poll that found nothing and pauses for a moment: yields the core while the
    /// thread shares it, else hints the CPU that this is a spin. Returns the time once every
    /// 32 calls (the one clock read of the spin): then the caller makes its other checks.
    ///
    /// At most every 20 µs of those, it also checks whether the scheduler took the core from
    /// this thread since the last check (`getrusage`'s involuntary context switches: the
    /// scheduler's preemptions, and yields that handed the core to another thread) and yields
    /// once, so a thread waiting for this core gets it; the switch that causes counts at the
    /// next check.
    pub fn empty_poll(&mut self) -> Option<Instant> {
        self.idle = self.idle.wrapping_add(1);
        if self.idle % LOOK_EVERY != 0 {
            self.pause();
            return None;
        }
        let now = Instant::now();
        // On one CPU the core is shared for good: nothing to check.
        if !self.one_cpu && now.saturating_duration_since(self.checked) >= SHARE_CHECK_EVERY {
            self.checked = now;
            let switches = sys::involuntary_switches();
            self.shared = switches != self.switches;
            self.switches = switches;
            std::thread::yield_now();
        } else {
            self.pause();
        }
        Some(now)
    }

    /// Whether the last check found the core shared: the polls until the next check yield.
    #[cfg(test)]
    fn shared(&self) -> bool {
        self.shared
    }

    fn pause(&self) {
        if self.shared {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// How many CPUs this process may run on (`std::thread::available_parallelism`: its affinity
/// mask and cgroup quota), read once: it parses cgroup files, and a loop may make a `Spin` per
/// wait.
fn cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

impl Default for Spin {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn the_clock_is_read_every_look_every_polls() {
        let mut spin = Spin::new();
        let before = Instant::now();
        let looks: Vec<(u32, Instant)> = (1..=3 * LOOK_EVERY)
            .filter_map(|i| spin.empty_poll().map(|now| (i, now)))
            .collect();
        let after = Instant::now();
        let polls: Vec<u32> = looks.iter().map(|&(i, _)| i).collect();
        assert_eq!(polls, [LOOK_EVERY, 2 * LOOK_EVERY, 3 * LOOK_EVERY]);
        assert!(looks.windows(2).all(|w| w[0].1 <= w[1].1));
        assert!(looks.iter().all(|&(_, now)| before <= now && now <= after));
    }

    #[test]
    fn on_one_cpu_every_empty_poll_yields() {
        let mut spin = Spin::on_cpus(1);
        assert!(spin.shared(), "a spin on one CPU shares it from the start");
        // Looks that would check on more CPUs (20 µs apart) leave it shared. Counted in
        // polls, not time: a yield beside the other tests may take milliseconds.
        let mut looks = 0;
        for _ in 0..10 * LOOK_EVERY {
            if spin.empty_poll().is_some() {
                looks += 1;
                std::thread::sleep(SHARE_CHECK_EVERY);
            }
        }
        assert_eq!(looks, 10);
        assert!(spin.shared());
        assert!(!Spin::on_cpus(2).shared());
    }

    /// With more busy threads than cores the scheduler must take this thread's core now and
    /// then, and a look must notice.
    #[test]
    fn a_core_shared_with_busy_threads_is_noticed() {
        let cores = cpus();
        let stop = Arc::new(AtomicBool::new(false));
        let busy: Vec<_> = (0..cores)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let mut spin = Spin::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut noticed = false;
        while !noticed && Instant::now() < deadline {
            noticed = spin.empty_poll().is_some() && spin.shared();
        }
        stop.store(true, Ordering::Relaxed);
        for thread in busy {
            thread.join().unwrap();
        }
        assert!(
            noticed,
            "20 s beside {cores} busy threads and no look found the core shared"
        );
    }
}
