//! READ responses taken past a gap: which PSNs after the oldest unanswered one have already
//! been answered and placed, so that a requester asks again only for the ones lost.
//!
//! A READ response carries its place in the request (the PSN fixes the offset), so one that
//! arrives after a lost one can land where it belongs at once. IBTA asks as much of a retry
//! (Vol. 1, chapter 9: it "may only reread those portions that were not successfully
//! responded to"), and rxe's responder serves any part of a READ it holds, as long as no part
//! asked for starts before the last one asked for (a replay moves the start of its record).
//! Go-back-N asked again for the rest of the piece and for every piece sent after it: under
//! 1 % random loss a 1 MiB READ moved twice its packets.

use crate::Psn;

/// How many PSNs from the oldest unanswered one are tracked: more than a requester ever has
/// outstanding (a window of at most [`super::WIDEST_UNACKED_PSNS`] plus one READ piece of at
/// most as many).
pub(super) const AHEAD_PSNS: u32 = 1024;

const WORDS: usize = (AHEAD_PSNS / 64) as usize;

/// The READ response PSNs taken past the oldest unanswered one, and how far READs have been
/// asked for again.
#[derive(Clone, Debug, Default)]
pub(super) struct ReadAhead {
    /// Bit `i` set: the response for `base + i` was taken. Bit 0 is never set: `base` is the
    /// oldest unanswered PSN, or was when the last one was taken.
    bits: [u64; WORDS],
    base: Psn,
    /// How many bits are set: none, and nothing here costs more than a test.
    taken: u32,
    /// READ requests sent again and not yet answered, oldest first: the responses they ask
    /// for are on their way, unless an answer to a later one shows them lost.
    asks: [Option<Ask>; ASKS],
    /// Every response before this PSN has been asked for again at least once: a request
    /// asked again may end (a LAST response) before its piece does.
    asked_upto: Option<Psn>,
}

/// How many READ requests sent again are remembered: no more are asked for lost responses
/// until one is answered (an early resend's or a timeout's go-back-N, which are not held back,
/// make room by forgetting the oldest).
const ASKS: usize = 8;

/// A READ request sent again: the response PSNs `from..end` it asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ask {
    from: Psn,
    end: Psn,
    /// It asked only for responses known lost (responses after them were taken) or held
    /// (whose copies are not taken), so an answer in its range is its own, not an original
    /// that was only slow.
    lost: bool,
}

/// What taking one response found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Taken {
    /// Taken: its PSN was not held before.
    New,
    /// Held already (a copy).
    Copy,
    /// Too far past the oldest unanswered PSN to be held.
    Beyond,
}

impl ReadAhead {
    /// Whether nothing is held past the oldest unanswered PSN.
    pub(super) fn is_empty(&self) -> bool {
        self.taken == 0
    }

    /// How many responses from `comp` (the oldest unanswered PSN) up to `end` are held: no
    /// longer in flight.
    pub(super) fn held_before(&mut self, comp: Psn, end: Psn) -> u32 {
        self.sync(comp);
        let n = comp.steps_to(end).min(AHEAD_PSNS);
        let (whole, rest) = ((n / 64) as usize, n % 64);
        let mut held: u32 = self.bits[..whole].iter().map(|w| w.count_ones()).sum();
        if rest > 0 {
            held += (self.bits[whole] & ((1 << rest) - 1)).count_ones();
        }
        held
    }

    /// Moves the base to `comp` (the oldest unanswered PSN now), letting go of the PSNs
    /// before it.
    fn sync(&mut self, comp: Psn) {
        if self.taken == 0 {
            self.base = comp;
            return;
        }
        let by = self.base.steps_to(comp);
        if by == 0 {
            return;
        }
        if by >= AHEAD_PSNS {
            *self = Self {
                asks: self.asks,
                asked_upto: self.asked_upto,
                ..Self::default()
            };
        } else {
            let (words, bits) = ((by / 64) as usize, by % 64);
            for i in 0..WORDS {
                let lo = self.bits.get(i + words).copied().unwrap_or(0);
                let hi = self.bits.get(i + words + 1).copied().unwrap_or(0);
                self.bits[i] = if bits == 0 {
                    lo
                } else {
                    (lo >> bits) | (hi << (64 - bits))
                };
            }
            self.taken = self.bits.iter().map(|w| w.count_ones()).sum();
        }
        self.base = comp;
    }

    fn bit(&self, i: u32) -> bool {
        i < AHEAD_PSNS && self.bits[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Takes the response for `psn`, `comp` being the oldest unanswered PSN (before `psn`).
    pub(super) fn take(&mut self, comp: Psn, psn: Psn) -> Taken {
        self.sync(comp);
        let i = comp.steps_to(psn);
        if i == 0 || i >= AHEAD_PSNS {
            return Taken::Beyond;
        }
        if self.bit(i) {
            return Taken::Copy;
        }
        self.bits[(i / 64) as usize] |= 1 << (i % 64);
        self.taken += 1;
        Taken::New
    }

    /// Whether the response for `psn` is held (`comp` being the oldest unanswered PSN).
    #[cfg(test)]
    fn holds(&mut self, comp: Psn, psn: Psn) -> bool {
        self.sync(comp);
        psn.precedes(comp.add(AHEAD_PSNS)) && !psn.precedes(comp) && self.bit(comp.steps_to(psn))
    }

    /// The oldest unanswered PSN has become `comp`: lets go of what is now behind it, and of
    /// the run of held PSNs from `comp` on, and returns how many that run held (the oldest
    /// unanswered PSN moves past them).
    pub(super) fn take_run(&mut self, comp: Psn) -> u32 {
        let run = if self.taken == 0 {
            self.base = comp;
            0
        } else {
            self.sync(comp);
            let run = self
                .bits
                .iter()
                .position(|&w| w != u64::MAX)
                .map_or(AHEAD_PSNS, |i| i as u32 * 64 + self.bits[i].trailing_ones());
            self.sync(comp.add(run));
            run
        };
        let end = comp.add(run);
        if self.asked_upto.is_some_and(|a| !end.precedes(a)) {
            self.asked_upto = None;
        }
        let mut answered = false;
        for slot in &mut self.asks {
            if slot.is_some_and(|ask| !end.precedes(ask.end)) {
                *slot = None;
                answered = true;
            }
        }
        if answered {
            self.pack_asks();
        }
        run
    }

    /// Moves the asks remembered to the front, in the order they were sent.
    fn pack_asks(&mut self) {
        let mut kept = 0;
        for i in 0..ASKS {
            if let Some(ask) = self.asks[i].take() {
                self.asks[kept] = Some(ask);
                kept += 1;
            }
        }
    }

    /// [`ReadAhead::sync`]s to `comp`, and returns the bit of `from`: how far past `comp` it
    /// is, 0 for a PSN before it.
    fn sync_from(&mut self, comp: Psn, from: Psn) -> u32 {
        self.sync(comp);
        if from.precedes(comp) {
            0
        } else {
            comp.steps_to(from)
        }
    }

    /// The first PSN at or after `from` (not before `comp`) whose response is held.
    pub(super) fn next_held(&mut self, comp: Psn, from: Psn) -> Option<Psn> {
        let start = self.sync_from(comp, from);
        (start..AHEAD_PSNS)
            .find(|&i| self.bit(i))
            .map(|i| comp.add(i))
    }

    /// The first PSN at or after `from` (not before `comp`) whose response is not held.
    pub(super) fn next_missing(&mut self, comp: Psn, from: Psn) -> Psn {
        let start = self.sync_from(comp, from);
        comp.add(
            (start..AHEAD_PSNS)
                .find(|&i| !self.bit(i))
                .unwrap_or(AHEAD_PSNS),
        )
    }

    /// The last PSN from `from` up to `end` (not before `comp`) whose response is not held.
    pub(super) fn last_missing(&mut self, comp: Psn, from: Psn, end: Psn) -> Option<Psn> {
        let start = self.sync_from(comp, from);
        (start..comp.steps_to(end))
            .rev()
            .find(|&i| !self.bit(i))
            .map(|i| comp.add(i))
    }

    /// Whether another request asked again may be remembered without forgetting one that
    /// is still to be answered (forgotten, its responses would be taken for unasked).
    pub(super) fn may_ask(&self) -> bool {
        self.asks[ASKS - 1].is_none()
    }

    /// A READ request sent again asks for the responses `from..end`; `lost` when all of
    /// them were known lost.
    pub(super) fn record_ask(&mut self, from: Psn, end: Psn, lost: bool) {
        if self.asked_upto.is_none_or(|a| a.precedes(end)) {
            self.asked_upto = Some(end);
        }
        // Kept packed, in the order they were sent: the oldest goes to make room.
        if self.asks[ASKS - 1].is_some() {
            self.asks.rotate_left(1);
            self.asks[ASKS - 1] = None;
        }
        let free = self
            .asks
            .iter()
            .position(Option::is_none)
            .unwrap_or(ASKS - 1);
        self.asks[free] = Some(Ask { from, end, lost });
    }

    /// The response for `psn` was taken. A responder answers in order, so the responses the
    /// last request asked again for before `psn` have had their answers, and any of them
    /// still missing was lost (again), and may be asked for once more. (From a request whose
    /// responses may still have been on their way, `psn` may be the original, and the copy of
    /// a lost one before it still to come: then it is asked for twice.) If that request asked
    /// only for lost responses, `psn` is its answer, and every request sent again before it
    /// has had its answers too.
    pub(super) fn answered(&mut self, psn: Psn) {
        let Some(j) = self
            .asks
            .iter()
            .rposition(|a| a.is_some_and(|a| psn.in_window(a.from, a.from.steps_to(a.end))))
        else {
            return;
        };
        let mut ask = self.asks[j].expect("found");
        ask.from = psn.next();
        self.asks[j] = (ask.from != ask.end).then_some(ask);
        if ask.lost {
            for slot in &mut self.asks[..j] {
                *slot = None;
            }
        }
        self.pack_asks();
    }

    /// The first response at or after `comp` (the oldest unanswered PSN) that is missing and
    /// not asked for by a request sent again that may still be answered.
    pub(super) fn first_unasked(&mut self, comp: Psn) -> Psn {
        let mut at = self.next_missing(comp, comp);
        while let Some(ask) = self
            .asks
            .iter()
            .flatten()
            .find(|a| at.in_window(a.from, a.from.steps_to(a.end)))
            .copied()
        {
            at = self.next_missing(comp, ask.end);
        }
        at
    }

    /// Whether a response at `psn` answers a request that asked again (it may end there).
    pub(super) fn may_end(&self, psn: Psn) -> bool {
        self.asked_upto.is_some_and(|a| psn.precedes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn psn(n: u32) -> Psn {
        Psn::from_low_bits(n)
    }

    #[test]
    fn held_psns_follow_the_oldest_unanswered_one() {
        let mut r = ReadAhead::default();
        let comp = psn(0xff_fff0); // the run crosses the PSN space's wrap
        assert!(r.is_empty());
        assert_eq!(r.take(comp, comp), Taken::Beyond, "the oldest is not held");
        assert_eq!(r.take(comp, comp.add(AHEAD_PSNS)), Taken::Beyond);
        for k in [2, 3, 5, 70, 200] {
            assert_eq!(r.take(comp, comp.add(k)), Taken::New);
        }
        assert_eq!(r.take(comp, comp.add(3)), Taken::Copy);
        assert_eq!(r.held_before(comp, comp.add(5)), 2);
        assert_eq!(r.held_before(comp, comp.add(71)), 4);
        assert_eq!(r.held_before(comp, comp.add(AHEAD_PSNS + 9)), 5);
        assert_eq!(r.next_held(comp, comp), Some(comp.add(2)));
        assert_eq!(r.next_missing(comp, comp.add(2)), comp.add(4));
        assert_eq!(r.next_held(comp, comp.add(6)), Some(comp.add(70)));
        assert_eq!(r.last_missing(comp, comp, comp.add(71)), Some(comp.add(69)));
        assert_eq!(r.last_missing(comp, comp.add(2), comp.add(4)), None);
        assert_eq!(
            r.last_missing(comp, comp.add(2), comp.add(6)),
            Some(comp.add(4))
        );
        // PSN comp and comp+1 answered: the run 2, 3 goes with them.
        assert_eq!(r.take_run(comp.add(2)), 2);
        assert!(!r.holds(comp.add(4), comp.add(3)));
        assert!(r.holds(comp.add(4), comp.add(5)));
        // Further on, across a 64-bit word, the base moves without a run.
        assert_eq!(r.take_run(comp.add(69)), 0);
        assert!(r.holds(comp.add(69), comp.add(70)));
        assert!(r.holds(comp.add(69), comp.add(200)));
        assert!(!r.holds(comp.add(69), comp.add(5)), "behind the oldest");
        assert_eq!(r.take_run(comp.add(70)), 1);
        assert_eq!(r.take_run(comp.add(200)), 1);
        assert!(r.is_empty());
    }

    #[test]
    fn a_full_run_and_a_jump_past_everything() {
        let mut r = ReadAhead::default();
        let comp = psn(10);
        for k in 1..AHEAD_PSNS {
            assert_eq!(r.take(comp, comp.add(k)), Taken::New);
        }
        assert_eq!(r.take_run(comp.add(1)), AHEAD_PSNS - 1);
        assert!(r.is_empty());
        r.take(comp, comp.add(9));
        assert_eq!(r.take_run(comp.add(5000)), 0);
        assert!(r.is_empty(), "let go of what is behind");
    }

    #[test]
    fn asking_again_is_remembered_until_answered_or_shown_lost() {
        let mut r = ReadAhead::default();
        let comp = psn(100);
        for k in [102, 103, 106, 110] {
            r.take(comp, psn(k));
        }
        assert_eq!(r.first_unasked(comp), comp);
        // 100..102 asked for again (known lost), then 104..106 and 107..110.
        r.record_ask(psn(100), psn(102), true);
        assert_eq!(r.first_unasked(comp), psn(104));
        r.record_ask(psn(104), psn(106), true);
        r.record_ask(psn(107), psn(110), true);
        assert!(
            r.may_end(psn(109)) && !r.may_end(psn(110)),
            "ends before 110"
        );
        assert_eq!(r.first_unasked(comp), psn(111));
        // 104's copy came: 100 and 101 were lost again; 105 is still on its way.
        r.take(comp, psn(104));
        r.answered(psn(104));
        assert_eq!(r.first_unasked(comp), comp);
        // 100..102 answered: the run to 107 goes, and 107..110 is still asked.
        assert_eq!(r.take_run(psn(101)), 0);
        assert_eq!(r.take_run(psn(102)), 3);
        assert_eq!(
            r.first_unasked(psn(105)),
            psn(111),
            "105, 107..110 still asked"
        );
        assert_eq!(r.take_run(psn(106)), 1);
        assert_eq!(r.first_unasked(psn(107)), psn(111));
        // An ask whose answers were not all known lost tells nothing of the older ones, only
        // of its own before the one taken.
        r.record_ask(psn(111), psn(115), false);
        r.take(psn(107), psn(112));
        r.answered(psn(112));
        assert_eq!(r.first_unasked(psn(107)), psn(111));
        r.take(psn(107), psn(111));
        assert_eq!(
            r.first_unasked(psn(107)),
            psn(115),
            "107..110, 113, 114 still asked"
        );
        assert_eq!(r.take_run(psn(115)), 0);
        assert!(r.asked_upto.is_none() && r.asks.iter().all(Option::is_none));
    }
}
