#!/usr/bin/env bash
# The long soak (issue 16, "long runs"): crates/ferroce/tests/soak.rs for tens of minutes,
# release build, its report printed and kept. CI runs the same test for 20 s in `cargo test`.
#
#   scripts/soak.sh [SECONDS]        # default 1800; nice -n 10 scripts/soak.sh on a shared box
#
# The log goes to target/soak-<UTC time>.log (FERROCE_SOAK_LOG to choose). Exits with the
# test's status. FERROCE_SOAK_ONLY=verbs,frames,sessions,cm runs only those workloads.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-${FERROCE_SOAK_SECS:-1800}}"
case "$secs" in
'' | *[!0-9]*)
    echo "soak.sh: SECONDS must be a whole number, not '$secs'" >&2
    exit 2
    ;;
esac
log="${FERROCE_SOAK_LOG:-target/soak-$(date -u +%Y%m%dT%H%M%SZ).log}"

cargo test --release -p ferroce --test soak --no-run
echo "soak: ${secs} s of traffic from $(date -u +%H:%M:%S) UTC, then the report; log in $log"
started=$(date +%s)
FERROCE_SOAK_SECS="$secs" cargo test --release -p ferroce --test soak -- --nocapture 2>&1 |
    tee "$log"
echo "soak: passed in $(($(date +%s) - started)) s wall time ($(uname -sr), $(nproc) cores)" |
    tee -a "$log"
