//! Planning UDP GSO sends: which packets of a batch can leave as one send.
//!
//! One GSO send is one destination and one segment size; the kernel cuts its payload at every
//! multiple of that size, so every segment but the last must be exactly that long and the last
//! may be shorter (gso.md §2). A RoCE message therefore becomes its FIRST alone (a RETH or AETH
//! makes it longer) and its MIDDLE…LAST together. Segment *i* of a send carries IPv4 ID *i*
//! (gso.md §1), which the packet's ICRC must cover.

use std::net::SocketAddr;

/// The most segments one GSO send carries. Linux allows 128 since 6.9 (and in the stable
/// 5.15.y and 6.8.y), 64 before; 64 works everywhere.
pub(crate) const MAX_SEGMENTS: usize = 64;

/// The most payload bytes one GSO send carries: the largest IPv4 UDP payload.
pub(crate) const MAX_BYTES: usize = 65_507;

/// Packets `first..first + count` of a batch, to go as one send of `segment`-byte datagrams
/// (the last may be shorter). A group of one is a plain datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) first: usize,
    pub(crate) count: usize,
    pub(crate) segment: usize,
}

/// Cuts a batch of `n` packets, packet `i` going to `packet(i).0` and `packet(i).1` bytes
/// long, into GSO groups appended to `out`. Order is kept: a group is always a run of
/// consecutive packets. A shorter packet ends the run before it only when it does not begin a
/// run of its own (a message's LAST, not the next message's FIRST's successors).
pub(crate) fn plan(n: usize, packet: impl Fn(usize) -> (SocketAddr, usize), out: &mut Vec<Group>) {
    let mut i = 0;
    while i < n {
        let (dst, segment) = packet(i);
        let mut group = Group {
            first: i,
            count: 1,
            segment,
        };
        let mut bytes = segment;
        i += 1;
        while i < n && group.count < MAX_SEGMENTS {
            let (to, len) = packet(i);
            if to != dst || len > segment || bytes + len > MAX_BYTES {
                break;
            }
            if len < segment {
                // The last of this group, unless the packets after it are as long as it is.
                let starts_a_run = i + 1 < n && packet(i + 1) == (to, len);
                if !starts_a_run {
                    group.count += 1;
                    i += 1;
                }
                break;
            }
            group.count += 1;
            bytes += len;
            i += 1;
        }
        out.push(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(packets: &[(u8, usize)]) -> Vec<(usize, usize, usize)> {
        let addr = |host: u8| SocketAddr::from(([127, 0, 0, host], 4791));
        let mut out = Vec::new();
        plan(
            packets.len(),
            |i| (addr(packets[i].0), packets[i].1),
            &mut out,
        );
        out.iter().map(|g| (g.first, g.count, g.segment)).collect()
    }

    #[test]
    fn a_message_is_its_first_then_its_middles_and_last() {
        // WRITE FIRST (RETH: 4128 B), 14 MIDDLEs (4112 B), a shorter LAST.
        let mut packets = vec![(2, 4128)];
        packets.extend(std::iter::repeat_n((2, 4112), 14));
        packets.push((2, 1000));
        assert_eq!(plan_of(&packets), [(0, 1, 4128), (1, 15, 4112)]);
    }

    #[test]
    fn groups_end_at_a_new_destination_a_longer_packet_or_the_limits() {
        assert_eq!(
            plan_of(&[(2, 100), (2, 100), (3, 100), (3, 200), (3, 200)]),
            [(0, 2, 100), (2, 1, 100), (3, 2, 200)]
        );
        // A shorter packet ends a group; the next starts anew.
        assert_eq!(
            plan_of(&[(2, 100), (2, 50), (2, 100), (2, 100)]),
            [(0, 2, 100), (2, 2, 100)]
        );
        // A FIRST, then the MIDDLEs of a message: the FIRST goes alone.
        assert_eq!(
            plan_of(&[(2, 4128), (2, 4112), (2, 4112), (2, 4112)]),
            [(0, 1, 4128), (1, 3, 4112)]
        );
        // Two one-packet messages: the second, shorter, still ends the first's send.
        assert_eq!(plan_of(&[(2, 4128), (2, 100)]), [(0, 2, 4128)]);
        // 65507 bytes: fifteen 4112-byte segments fit, the sixteenth does not.
        let full: Vec<_> = std::iter::repeat_n((2, 4112), 17).collect();
        assert_eq!(plan_of(&full), [(0, 15, 4112), (15, 2, 4112)]);
        // 64 segments at most.
        let small: Vec<_> = std::iter::repeat_n((2, 60), 130).collect();
        assert_eq!(plan_of(&small), [(0, 64, 60), (64, 64, 60), (128, 2, 60)]);
        assert!(plan_of(&[]).is_empty());
    }
}
