//! How a session's waiting threads spin. The controller waiting for a reply and the
//! coprocessor's serving thread waiting for a request poll their receive CQ back to back; on
//! the soft NIC each poll is a look at its socket, so the message is found at the poll after it
//! lands. Everything else a wait checks (send completions, the peer's liveness, the clock) and
//! the question whether to give the core away come once every [`LOOK_EVERY`] empty polls.
//!
//! Giving the core away at every empty poll (a `sched_yield`) cost a spinning controller a
//! fifth of its time, and a reply that landed during a yield was found late; never giving it
//! away, a controller and a coprocessor that the scheduler put on one core handed it to each
//! other only at the periodic yield, tens of microseconds a message. So a wait yields at every
//! poll only while its thread shares its core: while the scheduler keeps taking the core from
//! it, which the thread's count of involuntary context switches tells.

use crate::sys;

/// Empty polls between two looks at everything else. A poll on the soft NIC is a system call
/// of about a microsecond, so the looks come a few tens of microseconds apart.
pub(super) const LOOK_EVERY: u32 = 32;

/// One waiting thread's spin: counts its empty polls and decides, at each look, whether it
/// shares its core.
#[derive(Debug)]
pub(super) struct Spin {
    idle: u32,
    /// Whether the scheduler took the core from this thread between the last two looks: then
    /// every empty poll yields.
    shared: bool,
    /// The thread's involuntary context switches at the last look.
    switches: u64,
}

impl Spin {
    pub(super) fn new() -> Self {
        Self {
            idle: 0,
            shared: false,
            switches: sys::involuntary_switches(),
        }
    }

    /// Counts a poll that found nothing and pauses for a moment: yields the core while the
    /// thread shares it, else hints the CPU that this is a spin. Returns `true` once every
    /// [`LOOK_EVERY`] calls: time for the caller's other checks. Then it also yields once, so a
    /// thread waiting for this core gets it; the switch that causes counts at the next look.
    pub(super) fn empty_poll(&mut self) -> bool {
        self.idle = self.idle.wrapping_add(1);
        if self.idle % LOOK_EVERY != 0 {
            if self.shared {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            return false;
        }
        let switches = sys::involuntary_switches();
        self.shared = switches != self.switches;
        std::thread::yield_now();
        // The yield's own switch, if it made one, counts for the next look.
        self.switches = switches;
        true
    }

    /// Whether the last look found the core shared.
    #[cfg(test)]
    fn shared(&self) -> bool {
        self.shared
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn the_other_checks_come_every_look_every_polls() {
        let mut spin = Spin::new();
        let looks: Vec<u32> = (1..=3 * LOOK_EVERY).filter(|_| spin.empty_poll()).collect();
        assert_eq!(looks, [LOOK_EVERY, 2 * LOOK_EVERY, 3 * LOOK_EVERY]);
    }

    /// With more busy threads than cores the scheduler must take this thread's core now and
    /// then, and a look must notice.
    #[test]
    fn a_core_shared_with_busy_threads_is_noticed() {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
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
            noticed = spin.empty_poll() && spin.shared();
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
