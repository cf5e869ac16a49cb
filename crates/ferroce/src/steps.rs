//! Marks along the soft NIC's path through a round trip, on the thread that takes it: where
//! a received buffer was handled, a packet built, a completion returned, a post made, the send
//! call entered and left. `scripts/bench-turn-steps.sh` reads them to say what each stretch of
//! a `perf write-lat` turn costs in nanoseconds, so that each microsecond of a round trip is
//! named before any is cut (callgrind counts instructions, these count time; BENCHMARKS.md,
//! the data path's twenty-eighth step).
//!
//! Compiled in only with the `turn-steps` feature: without it [`mark`] is an empty inline
//! function and [`take`] returns nothing, so the marks cost nothing in a normal build. With
//! it, each mark reads the monotonic clock (about 30 ns here: BENCHMARKS.md, the eighteenth
//! step) and appends to a list of the calling thread, up to [`MAX_MARKS`].

/// A point on the path. Per packet where a turn has several (`Handled`, `Built`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Step {
    /// A poll drives the engine (`Driver::progress_here`): one a look at the socket, unless a
    /// look just found it empty.
    Look,
    /// A receive took datagrams.
    Received,
    /// The engine handled one packet (its ICRC checked, its request or response acted on).
    Handled,
    /// A look's datagrams are handled, and what arrived ahead of sequence sorted.
    Drained,
    /// The engine built and sealed one packet to send.
    Built,
    /// A poll returns a completion to the application.
    Completed,
    /// The application asked for a request to be sent (`post_send`).
    Posting,
    /// The engine queued it.
    Posted,
    /// The send system call is entered.
    Sending,
    /// It returned.
    Sent,
    /// `post_send` returns to the application.
    Returned,
    /// The application saw what it waited for in memory (a tool's mark: `perf write-lat` sees
    /// its peer's WRITE).
    Seen,
}

impl Step {
    /// The name `bench-turn-steps.sh` prints.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Look => "look",
            Self::Received => "received",
            Self::Handled => "handled",
            Self::Drained => "drained",
            Self::Built => "built",
            Self::Completed => "completed",
            Self::Posting => "posting",
            Self::Posted => "posted",
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Returned => "returned",
            Self::Seen => "seen",
        }
    }
}

/// The most marks a thread keeps (about 24 a write-lat turn): later ones are dropped.
pub const MAX_MARKS: usize = 4_000_000;

/// Marks `step` on the calling thread (nothing without the `turn-steps` feature).
#[inline(always)]
pub fn mark(step: Step) {
    imp::mark(step);
}

/// The calling thread's marks so far, in order, each with its time in nanoseconds since the
/// thread's first; the list starts again empty. Empty without the `turn-steps` feature.
#[must_use]
pub fn take() -> Vec<(Step, u64)> {
    imp::take()
}

#[cfg(feature = "turn-steps")]
mod imp {
    use std::cell::RefCell;
    use std::time::Instant;

    use super::{Step, MAX_MARKS};

    struct Marks {
        epoch: Instant,
        list: Vec<(Step, Instant)>,
    }

    thread_local! {
        static MARKS: RefCell<Option<Marks>> = const { RefCell::new(None) };
    }

    pub(super) fn mark(step: Step) {
        let now = Instant::now();
        MARKS.with(|m| {
            let mut m = m.borrow_mut();
            let marks = m.get_or_insert_with(|| Marks {
                epoch: now,
                list: Vec::with_capacity(1 << 16),
            });
            if marks.list.len() < MAX_MARKS {
                marks.list.push((step, now));
            }
        });
    }

    pub(super) fn take() -> Vec<(Step, u64)> {
        MARKS.with(|m| {
            m.borrow_mut().take().map_or_else(Vec::new, |marks| {
                marks
                    .list
                    .into_iter()
                    .map(|(step, at)| (step, (at - marks.epoch).as_nanos() as u64))
                    .collect()
            })
        })
    }
}

#[cfg(not(feature = "turn-steps"))]
mod imp {
    use super::Step;

    #[inline(always)]
    pub(super) fn mark(_: Step) {}

    pub(super) fn take() -> Vec<(Step, u64)> {
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With the feature, marks come back in the order made, with times that do not go back,
    /// and the list starts again after a take; without it, nothing is kept.
    #[test]
    fn marks_come_back_in_order_once_and_only_with_the_feature() {
        mark(Step::Posting);
        mark(Step::Sending);
        mark(Step::Sent);
        let marks = take();
        if !cfg!(feature = "turn-steps") {
            assert!(marks.is_empty(), "{marks:?}");
            return;
        }
        let steps: Vec<Step> = marks.iter().map(|&(s, _)| s).collect();
        assert_eq!(steps, [Step::Posting, Step::Sending, Step::Sent]);
        assert!(marks.windows(2).all(|w| w[0].1 <= w[1].1), "{marks:?}");
        assert_eq!(marks[0].1, 0);
        assert!(take().is_empty());
    }
}
