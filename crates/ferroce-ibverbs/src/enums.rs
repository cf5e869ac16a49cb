//! rdma-core's tables of words and numbers for its enums (`libibverbs/enum_strs.c` and the
//! rate conversions of `libibverbs/verbs.c`, v44), which programs print and compute with:
//! the same strings and the same numbers, so that output compares equal. Pure functions; the
//! C entry points in `crate::entry::misc` hand them out.

use std::ffi::{c_int, CStr};

/// What rdma-core answers for a value outside an enum's range.
const UNKNOWN: &CStr = c"unknown";

/// `ibv_node_type_str`.
pub(crate) fn node_type_str(node_type: c_int) -> &'static CStr {
    match node_type {
        1 => c"InfiniBand channel adapter",
        2 => c"InfiniBand switch",
        3 => c"InfiniBand router",
        4 => c"iWARP NIC",
        5 => c"usNIC",
        6 => c"usNIC UDP",
        7 => c"unspecified",
        // IBV_NODE_UNKNOWN (-1) and anything else
        _ => UNKNOWN,
    }
}

/// `ibv_port_state_str`.
pub(crate) fn port_state_str(state: c_int) -> &'static CStr {
    match state {
        0 => c"no state change (NOP)",
        1 => c"down",
        2 => c"init",
        3 => c"armed",
        4 => c"active",
        5 => c"active defer",
        _ => UNKNOWN,
    }
}

/// `ibv_event_type_str`.
pub(crate) fn event_type_str(event: c_int) -> &'static CStr {
    const EVENTS: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    usize::try_from(event)
        .ok()
        .and_then(|i| EVENTS.get(i))
        .copied()
        .unwrap_or(UNKNOWN)
}

/// `ibv_wc_status_str`.
pub(crate) fn wc_status_str(status: c_int) -> &'static CStr {
    const STATUSES: [&CStr; 24] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| STATUSES.get(i))
        .copied()
        .unwrap_or(UNKNOWN)
}

/// `enum ibv_rate` with its multiple of 2.5 Gb/s (`ibv_rate_to_mult`) where it has one, and
/// its rate in Mb/s (`ibv_rate_to_mbps`): rdma-core's two tables side by side.
const RATES: [(c_int, Option<c_int>, c_int); 23] = [
    (2, Some(1), 2500),       // IBV_RATE_2_5_GBPS
    (5, Some(2), 5000),       // IBV_RATE_5_GBPS
    (3, Some(4), 10000),      // IBV_RATE_10_GBPS
    (6, Some(8), 20000),      // IBV_RATE_20_GBPS
    (4, Some(12), 30000),     // IBV_RATE_30_GBPS
    (7, Some(16), 40000),     // IBV_RATE_40_GBPS
    (8, Some(24), 60000),     // IBV_RATE_60_GBPS
    (9, Some(32), 80000),     // IBV_RATE_80_GBPS
    (10, Some(48), 120000),   // IBV_RATE_120_GBPS
    (11, None, 14062),        // IBV_RATE_14_GBPS
    (12, None, 56250),        // IBV_RATE_56_GBPS
    (13, None, 112500),       // IBV_RATE_112_GBPS
    (14, None, 168750),       // IBV_RATE_168_GBPS
    (15, None, 25781),        // IBV_RATE_25_GBPS
    (16, None, 103125),       // IBV_RATE_100_GBPS
    (17, None, 206250),       // IBV_RATE_200_GBPS
    (18, None, 309375),       // IBV_RATE_300_GBPS
    (19, Some(11), 28125),    // IBV_RATE_28_GBPS
    (20, Some(20), 53125),    // IBV_RATE_50_GBPS
    (21, Some(160), 425000),  // IBV_RATE_400_GBPS
    (22, Some(240), 637500),  // IBV_RATE_600_GBPS
    (23, Some(320), 850000),  // IBV_RATE_800_GBPS
    (24, Some(480), 1275000), // IBV_RATE_1200_GBPS
];

/// `IBV_RATE_MAX`: what the reverse conversions answer for a value with no rate.
const IBV_RATE_MAX: c_int = 0;

/// `ibv_rate_to_mult`: -1 for a rate that is no multiple of 2.5 Gb/s.
pub(crate) fn rate_to_mult(rate: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.0 == rate)
        .and_then(|r| r.1)
        .unwrap_or(-1)
}

/// `mult_to_ibv_rate`.
pub(crate) fn mult_to_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == Some(mult))
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps`: -1 for an unknown rate.
pub(crate) fn rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`.
pub(crate) fn mbps_to_rate(mbps: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.2 == mbps)
        .map_or(IBV_RATE_MAX, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_rdma_core_s() {
        assert_eq!(node_type_str(1), c"InfiniBand channel adapter");
        assert_eq!(node_type_str(-1), c"unknown");
        assert_eq!(node_type_str(8), c"unknown");
        assert_eq!(port_state_str(4), c"active");
        assert_eq!(port_state_str(6), c"unknown");
        assert_eq!(event_type_str(0), c"CQ error");
        assert_eq!(event_type_str(15), c"SRQ limit reached");
        assert_eq!(event_type_str(19), c"WQ fatal");
        assert_eq!(event_type_str(20), c"unknown");
        assert_eq!(event_type_str(-3), c"unknown");
        assert_eq!(wc_status_str(0), c"success");
        assert_eq!(wc_status_str(5), c"Work Request Flushed Error");
        assert_eq!(wc_status_str(10), c"remote access error");
        assert_eq!(wc_status_str(23), c"TM software rendezvous");
        assert_eq!(wc_status_str(24), c"unknown");
    }

    #[test]
    fn rates_round_trip_as_rdma_core_s() {
        assert_eq!(rate_to_mult(3), 4, "10 Gb/s is 4 × 2.5");
        assert_eq!(mult_to_rate(4), 3);
        assert_eq!(rate_to_mult(15), -1, "25 Gb/s has no multiple");
        assert_eq!(mult_to_rate(5), IBV_RATE_MAX);
        assert_eq!(rate_to_mbps(16), 103_125);
        assert_eq!(mbps_to_rate(103_125), 16);
        assert_eq!(rate_to_mbps(0), -1);
        assert_eq!(mbps_to_rate(1), IBV_RATE_MAX);
        for &(rate, mult, mbps) in &RATES {
            assert_eq!(mbps_to_rate(mbps), rate);
            if let Some(m) = mult {
                assert_eq!(mult_to_rate(m), rate);
            }
        }
    }
}
