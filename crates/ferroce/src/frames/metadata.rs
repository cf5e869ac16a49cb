//! What a sensor bridge writes besides frame data: the 128-byte metadata block after each
//! frame, and the immediate value of the WRITE that ends the frame (hololink.md §1–§2).
//!
//! Both are big-endian on the wire, whatever the bridge's documentation says; the bridge's
//! host decoder, its RTL and its emulator all agree on that.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes of the metadata block; the bridge aligns frames and metadata to this as well.
pub const METADATA_SIZE: usize = 128;

/// The metadata block a sensor bridge writes at the metadata offset of each page, decoded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Bit 0: the frame ended early (TLAST before `frame_size` bytes); bit 1: the window
    /// ended by byte count only.
    pub flags: u32,
    /// The 24-bit PSN of the packet that carried this block.
    pub psn: u32,
    /// The frame's CRC as the bridge computes it (JAMCRC: CRC-32 without the final
    /// inversion, over the `bytes_written` data bytes); 0 when the device does not compute
    /// one (the upstream emulator).
    pub crc: u32,
    /// PTP seconds of the frame's first sensor data (48 bits used).
    pub timestamp_s: u64,
    /// Nanoseconds part of `timestamp_s`.
    pub timestamp_ns: u32,
    /// Valid data bytes in the frame.
    pub bytes_written: u64,
    /// The device's frame counter (16 bits on the FPGA, 32 bits from the emulator).
    pub frame_number: u32,
    /// PTP seconds when the metadata block was formed.
    pub metadata_s: u64,
    /// Nanoseconds part of `metadata_s`.
    pub metadata_ns: u32,
}

/// `flags` bit: the frame ended before `frame_size` bytes.
pub const FLAG_EARLY_END: u32 = 1;

fn be32(bytes: &[u8; METADATA_SIZE], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn be64(bytes: &[u8; METADATA_SIZE], at: usize) -> u64 {
    (u64::from(be32(bytes, at)) << 32) | u64::from(be32(bytes, at + 4))
}

impl Metadata {
    /// Decodes a block. Every bit pattern decodes; reserved bytes are ignored.
    #[must_use]
    pub fn parse(bytes: &[u8; METADATA_SIZE]) -> Self {
        Self {
            flags: be32(bytes, 0),
            psn: be32(bytes, 4) & 0x00ff_ffff,
            crc: be32(bytes, 8),
            timestamp_s: be64(bytes, 12),
            timestamp_ns: be32(bytes, 20),
            bytes_written: be64(bytes, 24),
            frame_number: be32(bytes, 32),
            metadata_s: be64(bytes, 36),
            metadata_ns: be32(bytes, 44),
        }
    }

    /// Encodes the block as a bridge writes it, reserved bytes zero.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; METADATA_SIZE] {
        let mut out = [0; METADATA_SIZE];
        out[0..4].copy_from_slice(&self.flags.to_be_bytes());
        out[4..8].copy_from_slice(&(self.psn & 0x00ff_ffff).to_be_bytes());
        out[8..12].copy_from_slice(&self.crc.to_be_bytes());
        out[12..20].copy_from_slice(&self.timestamp_s.to_be_bytes());
        out[20..24].copy_from_slice(&self.timestamp_ns.to_be_bytes());
        out[24..32].copy_from_slice(&self.bytes_written.to_be_bytes());
        out[32..36].copy_from_slice(&self.frame_number.to_be_bytes());
        out[36..44].copy_from_slice(&self.metadata_s.to_be_bytes());
        out[44..48].copy_from_slice(&self.metadata_ns.to_be_bytes());
        out
    }

    /// The frame's timestamp as a wall-clock time.
    #[must_use]
    pub fn timestamp(&self) -> SystemTime {
        UNIX_EPOCH + Duration::new(self.timestamp_s, self.timestamp_ns.min(999_999_999))
    }
}

/// How the immediate value of the frame-ending WRITE packs the page and the PSN.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ImmediateLayout {
    /// HSB IP 0x2603 and later: `psn[19:0] << 12 | page[11:0]`.
    #[default]
    Page12,
    /// Older bridges (HSB-Lite 2510): `psn[23:0] << 8 | buffer[7:0]`.
    Buffer8,
}

impl ImmediateLayout {
    /// The page an immediate names.
    #[must_use]
    pub const fn page(self, imm: u32) -> u32 {
        match self {
            Self::Page12 => imm & 0xfff,
            Self::Buffer8 => imm & 0xff,
        }
    }

    /// The PSN bits an immediate carries (20 or 24 of them).
    #[must_use]
    pub const fn psn(self, imm: u32) -> u32 {
        match self {
            Self::Page12 => imm >> 12,
            Self::Buffer8 => imm >> 8,
        }
    }

    /// The mask of the PSN bits an immediate carries.
    #[must_use]
    pub const fn psn_mask(self) -> u32 {
        match self {
            Self::Page12 => 0x000f_ffff,
            Self::Buffer8 => 0x00ff_ffff,
        }
    }

    /// The immediate for `page` ending with a packet of PSN `psn`.
    #[must_use]
    pub const fn immediate(self, page: u32, psn: u32) -> u32 {
        match self {
            Self::Page12 => (psn & 0x000f_ffff) << 12 | (page & 0xfff),
            Self::Buffer8 => (psn & 0x00ff_ffff) << 8 | (page & 0xff),
        }
    }

    /// The most pages the layout can name.
    #[must_use]
    pub const fn max_pages(self) -> u32 {
        match self {
            Self::Page12 => 4096,
            Self::Buffer8 => 256,
        }
    }
}

/// Rounds `n` up to a multiple of [`METADATA_SIZE`], as the bridge places metadata.
#[must_use]
pub const fn round_up(n: usize) -> usize {
    n.div_ceil(METADATA_SIZE) * METADATA_SIZE
}

/// Widens the device's 16-bit frame counter into a running count, as Hololink's host code
/// does: each new value moves the count on by the 16-bit difference from the last.
///
/// The difference is taken as a signed step of up to half the range (serial-number
/// arithmetic, RFC 1982) where Hololink takes every step as forward: a metadata block the
/// device overwrote before the receiver read it names a later frame, and the next one steps
/// back; read as a forward step, that added a whole wrap (65,536) to every later frame's
/// number. A forward step of 32,768 frames or more between two arrivals is not told apart.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ExtendedCounter {
    last: Option<(u16, u64)>,
}

impl ExtendedCounter {
    pub(crate) fn update(&mut self, value: u32) -> u64 {
        let low = value as u16;
        let next = match self.last {
            None => u64::from(value),
            Some((prev, count)) => {
                let step = low.wrapping_sub(prev) as i16;
                count.saturating_add_signed(i64::from(step))
            }
        };
        self.last = Some((low, next));
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_big_endian() {
        let md = Metadata {
            flags: FLAG_EARLY_END,
            psn: 0x12_3456,
            crc: 0xdead_beef,
            timestamp_s: 0x0000_1234_5678_9abc,
            timestamp_ns: 999_999_999,
            bytes_written: 12_441_600,
            frame_number: 70_000,
            metadata_s: 7,
            metadata_ns: 8,
        };
        let bytes = md.to_bytes();
        assert_eq!(&bytes[4..8], &[0, 0x12, 0x34, 0x56]);
        assert_eq!(&bytes[24..32], &12_441_600u64.to_be_bytes());
        assert!(bytes[48..].iter().all(|&b| b == 0));
        assert_eq!(Metadata::parse(&bytes), md);
    }

    #[test]
    fn immediates_pack_page_and_psn() {
        let imm = ImmediateLayout::Page12.immediate(3, 0xabc_def1);
        assert_eq!(imm, 0xcdef_1003);
        assert_eq!(ImmediateLayout::Page12.page(imm), 3);
        assert_eq!(ImmediateLayout::Page12.psn(imm), 0xc_def1);
        let imm = ImmediateLayout::Buffer8.immediate(2, 0x12_3456);
        assert_eq!(imm, 0x1234_5602);
        assert_eq!(ImmediateLayout::Buffer8.page(imm), 2);
        assert_eq!(ImmediateLayout::Buffer8.psn(imm), 0x12_3456);
    }

    #[test]
    fn the_frame_counter_widens_across_wraps() {
        let mut c = ExtendedCounter::default();
        assert_eq!(c.update(65_534), 65_534);
        assert_eq!(c.update(65_535), 65_535);
        assert_eq!(c.update(0), 65_536);
        assert_eq!(c.update(2), 65_538);
    }

    #[test]
    fn a_step_back_in_the_frame_counter_is_not_a_wrap() {
        // Frame 5's metadata was overwritten by frame 12's before it was read; frame 6's was
        // read in time. Every later frame keeps its own number.
        let mut c = ExtendedCounter::default();
        assert_eq!(c.update(4), 4);
        assert_eq!(c.update(12), 12);
        assert_eq!(c.update(6), 6);
        assert_eq!(c.update(7), 7);
        // The same across a wrap of the 16 bits.
        let mut c = ExtendedCounter::default();
        assert_eq!(c.update(65_530), 65_530);
        assert_eq!(c.update(3), 65_539);
        assert_eq!(c.update(65_535), 65_535);
        assert_eq!(c.update(0), 65_536);
        // Frames lost in between still count forward.
        assert_eq!(c.update(30_000), 95_536);
    }
}
