//! Work queue entries: a request's gather or scatter list as (region, offset) segments, the
//! send and receive WQEs the queues hold, and the inbound message a responder is assembling.

use super::*;

/// A contiguous piece of a gather/scatter list, resolved against the region table: an [`Sge`]
/// whose lkey and address have become a region and an offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ResolvedSge {
    pub(super) region: RegionId,
    pub(super) offset: u64,
    pub(super) len: u32,
}

/// A resolved gather/scatter list. Most requests have one entry, which is kept inline: a
/// request then costs the engine no allocation of its own.
#[derive(Clone, Debug)]
pub(super) enum ResolvedSgeList {
    One(ResolvedSge),
    Many(Vec<ResolvedSge>),
}

impl ResolvedSgeList {
    /// Appends an entry; only a second one moves the list to the heap.
    pub(super) fn push(&mut self, seg: ResolvedSge) {
        match self {
            Self::Many(segs) if segs.is_empty() => *self = Self::One(seg),
            Self::One(first) => *self = Self::Many(vec![*first, seg]),
            Self::Many(segs) => segs.push(seg),
        }
    }
}

impl std::ops::Deref for ResolvedSgeList {
    type Target = [ResolvedSge];

    fn deref(&self) -> &[ResolvedSge] {
        match self {
            Self::One(seg) => std::slice::from_ref(seg),
            Self::Many(segs) => segs,
        }
    }
}

/// The pieces of `len` bytes starting `at` bytes into a gather/scatter list: for each, the
/// region, the offset in it, and the range of the caller's buffer it covers.
pub(super) fn pieces(
    segs: &[ResolvedSge],
    mut at: u64,
    len: usize,
) -> impl Iterator<Item = (RegionId, u64, std::ops::Range<usize>)> + '_ {
    let mut done = 0;
    segs.iter().filter_map(move |seg| {
        let seg_len = u64::from(seg.len);
        if done == len || at >= seg_len {
            at = at.saturating_sub(seg_len);
            return None;
        }
        let n = ((seg_len - at) as usize).min(len - done);
        let piece = (seg.region, seg.offset + at, done..done + n);
        done += n;
        at = 0;
        Some(piece)
    })
}

/// Copies `out.len()` bytes starting `at` bytes into the list.
pub(super) fn gather(segs: &[ResolvedSge], at: u64, out: &mut [u8], mem: &dyn Memory) {
    for (region, offset, range) in pieces(segs, at, out.len()) {
        mem.read(region, offset, &mut out[range]);
    }
}

/// Copies `data` into the list starting `at` bytes in.
pub(super) fn scatter(segs: &[ResolvedSge], at: u64, data: &[u8], mem: &mut dyn Memory) {
    for (region, offset, range) in pieces(segs, at, data.len()) {
        mem.write(region, offset, &data[range]);
    }
}

#[derive(Debug)]
pub(super) enum WqeData {
    Segs(ResolvedSgeList),
    Inline(Vec<u8>),
}

#[derive(Debug)]
pub(super) struct SendWqe {
    pub(super) wr_id: u64,
    pub(super) op: SendOp,
    pub(super) signaled: bool,
    pub(super) fence: bool,
    pub(super) solicited: bool,
    pub(super) data: WqeData,
    pub(super) len: u32,
    /// PSNs the message uses: its packets, or for a READ its response packets.
    pub(super) npkts: u32,
    /// PSNs per READ request. A READ of more than [`MAX_UNACKED_PSNS`] response packets is
    /// asked for in pieces of that many, so that a go-back-N (a timeout's) costs at most the
    /// rest of its piece rather than the rest of the message (a 1 MiB READ at MTU 1024 is 1024
    /// packets), and each piece is one responder resource that a part asked again is served
    /// from. Fixed when the request starts, so that a retry asks again for a part of a piece
    /// the responder holds. `npkts` otherwise. (Pieces sized to the adaptive window were
    /// tried: with few READs in flight allowed, they throttled 64 KiB READs.)
    pub(super) piece: u32,
    pub(super) first_psn: Psn,
    pub(super) started: bool,
    /// A local error found at post time, reported when the request reaches the front.
    pub(super) fault: Option<WcStatus>,
    /// Where a UD request goes.
    pub(super) dest: Option<UdDest>,
}

impl SendWqe {
    pub(super) fn last_psn(&self) -> Psn {
        self.first_psn.add(self.npkts - 1)
    }

    pub(super) fn contains(&self, psn: Psn) -> bool {
        self.started && psn.in_window(self.first_psn, self.npkts)
    }

    /// One past the last packet of the READ piece that holds packet `k`.
    pub(super) fn piece_end(&self, k: u32) -> u32 {
        ((k / self.piece + 1) * self.piece).min(self.npkts)
    }

    pub(super) fn wc_opcode(&self) -> WcOpcode {
        match self.op {
            SendOp::Send | SendOp::SendWithImm(_) => WcOpcode::Send,
            SendOp::Write(_) | SendOp::WriteWithImm(..) => WcOpcode::RdmaWrite,
            SendOp::Read(_) => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    pub(super) fn segs(&self) -> &[ResolvedSge] {
        match &self.data {
            WqeData::Segs(segs) => segs,
            WqeData::Inline(_) => &[],
        }
    }
}

#[derive(Debug)]
pub(super) struct RecvWqe {
    pub(super) wr_id: u64,
    pub(super) segs: ResolvedSgeList,
    pub(super) len: u64,
    pub(super) fault: Option<WcStatus>,
}

/// A multi-packet request the responder is in the middle of.
#[derive(Debug)]
pub(super) enum InMsg {
    Send {
        wqe: RecvWqe,
        offset: u64,
    },
    Write {
        target: Option<(RegionId, u64)>,
        /// The address of the message's first byte, as the RETH named it.
        va: u64,
        written: u32,
        total: u32,
    },
}
