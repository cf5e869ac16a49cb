//! The addressing extension headers: RETH (RDMA), DETH (datagram) and FETH (flush).

use super::{be_u24, be_u32, be_u64, check_len, check_u24, put_u24, Error, Qpn};

/// RDMA Extended Transport Header (IBTA Vol. 1 §9.3.3), 16 bytes: the remote address, key and
/// length of an RDMA WRITE, READ, FLUSH or ATOMIC WRITE. It rides on the first packet of a
/// WRITE (FIRST or ONLY) and on READ requests; its length is the whole message's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length: the whole message, in bytes.
    pub len: u32,
}

impl Reth {
    /// The header's length in bytes.
    pub const LEN: usize = 16;

    /// Parses the first 16 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 16 bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len("RETH", bytes, Self::LEN)?;
        Ok(Self {
            va: be_u64(bytes, 0),
            rkey: be_u32(bytes, 8),
            len: be_u32(bytes, 12),
        })
    }

    /// Writes the header into the first 16 bytes of `out` (which must be long enough).
    pub(crate) fn emit(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.va.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..16].copy_from_slice(&self.len.to_be_bytes());
    }
}

/// Datagram Extended Transport Header (IBTA Vol. 1 §9.3.2), 8 bytes, on UD packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Deth {
    /// Queue key, checked against the receiving QP's.
    pub qkey: u32,
    /// The sending queue pair.
    pub src_qp: Qpn,
}

impl Deth {
    /// The header's length in bytes.
    pub const LEN: usize = 8;

    /// Parses the first 8 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 8 bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len("DETH", bytes, Self::LEN)?;
        Ok(Self {
            qkey: be_u32(bytes, 0),
            src_qp: Qpn::from_low_bits(be_u24(bytes, 5)),
        })
    }

    pub(crate) fn emit(&self, out: &mut [u8]) -> Result<(), Error> {
        check_u24("DETH source QP", self.src_qp.value())?;
        out[0..4].copy_from_slice(&self.qkey.to_be_bytes());
        out[4] = 0;
        put_u24(out, 5, self.src_qp.value());
        Ok(())
    }
}

/// Flush Extended Transport Header (IBTA Vol. 1 §9.3.9, added in release 1.5), 4 bytes, on
/// FLUSH requests. Reserved bits are ignored when parsing and sent as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Feth {
    /// Selectivity level (2 bits): 0 memory region range, 1 whole memory region.
    pub selectivity: u8,
    /// Placement type (4 bits): bit 0 global visibility, bit 1 persistence.
    pub placement: u8,
}

impl Feth {
    /// The header's length in bytes.
    pub const LEN: usize = 4;

    /// Parses the first 4 bytes of `bytes`.
    ///
    /// # Errors
    ///
    /// [`Error::Truncated`] for fewer than 4 bytes.
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<Self, Error> {
        check_len("FETH", bytes, Self::LEN)?;
        Ok(Self {
            selectivity: (bytes[3] >> 4) & 0x3,
            placement: bytes[3] & 0xf,
        })
    }

    pub(crate) fn emit(&self, out: &mut [u8]) -> Result<(), Error> {
        if self.selectivity > 3 || self.placement > 0xf {
            return Err(Error::FieldRange {
                field: "FETH selectivity/placement",
                value: (u64::from(self.selectivity) << 8) | u64::from(self.placement),
                bits: 6,
            });
        }
        out[0..3].fill(0);
        out[3] = (self.selectivity << 4) | self.placement;
        Ok(())
    }
}
