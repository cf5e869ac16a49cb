//! The atomic extension headers: AtomicETH on requests, AtomicAckETH on their replies.

use super::{be_u32, be_u64, check_len, Error};

/// Atomic Extended Transport Header (IBTA Vol. 1 §9.3.4), 28 bytes, on COMPARE_SWAP and
/// FETCH_ADD requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicEth {
    /// Remote virtual address of the 8-byte, 8-aligned target.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// The value to swap in (COMPARE_SWAP) or to add (FETCH_ADD).
    pub swap_add: u64,
    /// The value to compare with (COMPARE_SWAP; ignored by FETCH_ADD).
    pub compare: u64,
}

impl AtomicEth {
    /// The header's length in bytes.
    pub const LEN: usize = 28;

    /// Parses the first 28 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 28 bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len("AtomicETH", bytes, Self::LEN)?;
        Ok(Self {
            va: be_u64(bytes, 0),
            rkey: be_u32(bytes, 8),
            swap_add: be_u64(bytes, 12),
            compare: be_u64(bytes, 20),
        })
    }

    pub(crate) fn emit(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.va.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..20].copy_from_slice(&self.swap_add.to_be_bytes());
        out[20..28].copy_from_slice(&self.compare.to_be_bytes());
    }
}

/// Atomic ACK Extended Transport Header (IBTA Vol. 1 §9.3.6), 8 bytes: the value the target
/// held before the atomic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtomicAckEth {
    /// The original value at the target address.
    pub orig: u64,
}

impl AtomicAckEth {
    /// The header's length in bytes.
    pub const LEN: usize = 8;

    /// Parses the first 8 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 8 bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len("AtomicAckETH", bytes, Self::LEN)?;
        Ok(Self {
            orig: be_u64(bytes, 0),
        })
    }

    pub(crate) fn emit(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.orig.to_be_bytes());
    }
}
