#!/usr/bin/env bash
# What moving a timerfd deadline on costs on this host, without ferroce: re-arming one timer
# against arming a second and disarming the first (scripts/timer-rearm.c; the progress
# thread's nap, `sys::MovingTimer`). Needs a C compiler.
# Usage: scripts/bench-timer-rearm.sh [moves] [after-us] [gap-us] [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp)
trap 'rm -f "$bin"' EXIT
cc -O2 -Wall -o "$bin" scripts/timer-rearm.c
"$bin" "$@"
