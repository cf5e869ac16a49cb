//! 24-bit packet sequence numbers.
//!
//! PSNs count modulo 2^24 (IBTA Vol. 1 §9.7.1). Two PSNs are ordered only within half the
//! sequence space: `a` precedes `b` when `b` is between 1 and 2^23 − 1 steps ahead of `a`.
//! A requester never has more than 2^23 packets outstanding, so inside any live window this
//! order agrees with the order of transmission, across wrap-around included.

use core::fmt;

/// A 24-bit packet sequence number.
///
/// There is deliberately no `Ord`: PSN order is circular. Use [`Psn::precedes`] or
/// [`Psn::distance_to`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Psn(u32);

impl Psn {
    /// The number of distinct PSNs, 2^24.
    pub const MODULUS: u32 = 1 << 24;
    /// The largest PSN value.
    pub const MAX: Self = Self(Self::MODULUS - 1);
    /// Half the sequence space: the widest window in which PSNs are ordered.
    pub const HALF: u32 = 1 << 23;

    /// A PSN from its value, or `None` if `value` needs more than 24 bits.
    #[must_use]
    pub const fn new(value: u32) -> Option<Self> {
        if value < Self::MODULUS {
            Some(Self(value))
        } else {
            None
        }
    }

    /// A PSN from the low 24 bits of `value` (as the wire field is read).
    #[must_use]
    pub const fn from_low_bits(value: u32) -> Self {
        Self(value & (Self::MODULUS - 1))
    }

    /// The PSN's value, below 2^24.
    #[must_use]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// The PSN `n` steps after this one, wrapping at 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Self::from_low_bits(self.0.wrapping_add(n))
    }

    /// The PSN `n` steps before this one, wrapping at 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Self::from_low_bits(self.0.wrapping_sub(n))
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Self {
        self.add(1)
    }

    /// How many steps forward from `self` reach `later`, modulo 2^24 (0 ..= 2^24 − 1).
    #[must_use]
    pub const fn steps_to(self, later: Self) -> u32 {
        later.0.wrapping_sub(self.0) & (Self::MODULUS - 1)
    }

    /// The signed distance from `self` to `other` in −2^23 ..= 2^23 − 1: positive when `other`
    /// is ahead.
    #[must_use]
    pub const fn distance_to(self, other: Self) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back to sign-extend it.
        ((other.0.wrapping_sub(self.0) << 8) as i32) >> 8
    }

    /// Whether `self` comes strictly before `other` (within half the sequence space).
    #[must_use]
    pub const fn precedes(self, other: Self) -> bool {
        self.distance_to(other) > 0
    }

    /// Whether `self` lies in the window of `len` PSNs starting at `start`.
    #[must_use]
    pub const fn in_window(self, start: Self, len: u32) -> bool {
        start.steps_to(self) < len
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> Self {
        psn.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn psn() -> impl Strategy<Value = Psn> {
        (0..Psn::MODULUS).prop_map(Psn::from_low_bits)
    }

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::MAX.next(), Psn::new(0).unwrap());
        assert_eq!(Psn::new(0).unwrap().sub(1), Psn::MAX);
        assert!(Psn::MAX.precedes(Psn::new(5).unwrap()));
        assert!(!Psn::new(5).unwrap().precedes(Psn::MAX));
        assert_eq!(Psn::new(1 << 24), None);
        assert_eq!(Psn::MAX.distance_to(Psn::new(2).unwrap()), 3);
    }

    proptest! {
        #[test]
        fn add_then_sub_is_identity(p in psn(), n in any::<u32>()) {
            prop_assert_eq!(p.add(n).sub(n), p);
            prop_assert!(p.add(n).value() < Psn::MODULUS);
        }

        #[test]
        fn steps_and_distance_agree(p in psn(), n in 0..Psn::MODULUS) {
            let q = p.add(n);
            prop_assert_eq!(p.steps_to(q), n);
            let d = p.distance_to(q);
            if n < Psn::HALF {
                prop_assert_eq!(d, n as i32);
            } else {
                prop_assert_eq!(d, n as i32 - Psn::MODULUS as i32);
            }
            prop_assert_eq!(q.distance_to(p), if n == Psn::HALF { d } else { -d });
        }

        #[test]
        fn order_within_a_window_is_transmission_order(
            start in psn(), a in 0..Psn::HALF, b in 0..Psn::HALF,
        ) {
            // Any two PSNs of a window narrower than 2^23 compare as their offsets do,
            // whether or not the window straddles the wrap.
            let (pa, pb) = (start.add(a), start.add(b));
            prop_assert_eq!(pa.precedes(pb), a < b);
            prop_assert_eq!(pb.precedes(pa), b < a);
            prop_assert!(pa.in_window(start, Psn::HALF));
            prop_assert_eq!(pa.in_window(start, b), a < b);
        }
    }
}
