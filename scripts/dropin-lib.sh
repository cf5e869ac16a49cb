# Helpers the drop-in tests share (scripts/test-dropin.sh, test-rdmacm.sh, test-ucx.sh).
# Sourced, not run: the caller sets `dir` (the folder scripts/build-dropin.sh left the drop-in
# libraries in) and defines `fail`.

# Runs a stock program on the drop-in, on its own loopback address: on ADDR CMD...
on() {
    local addr="$1"
    shift
    LD_LIBRARY_PATH="$dir" FERROCE_ADDR="$addr" "$@"
}

# `on` for a background job: the job's subshell becomes the command (exec), so that $! is the
# command itself (`timeout`, say) and killing it ends the program.
on_bg() {
    local addr="$1"
    shift
    LD_LIBRARY_PATH="$dir" FERROCE_ADDR="$addr" exec "$@"
}

# Fails unless TEXT has a line holding PATTERN (a fixed string): expect WHAT TEXT PATTERN
expect() {
    local what="$1" text="$2" pattern="$3"
    grep -qF -- "$pattern" <<<"$text" || {
        printf '%s\n' "$text" >&2
        fail "$what: no line with '$pattern'"
    }
}

# name@version or name@@version of every function and datum a library defines (not the
# version nodes' own absolute symbols, which ld.bfd emits and lld does not).
versions() {
    nm -D --with-symbol-versions --defined-only "$1" | awk '$2 != "A" { print $3 }' | sort
}

# The system's own copy of library NAME (libibverbs.so.1, say) for this machine's
# architecture, from ldconfig's cache; empty when there is none. awk reads to the end, so that
# ldconfig is not killed by SIGPIPE under pipefail.
installed() {
    ldconfig -p | awk -v name="$1" '$1 == name && /x86-64|aarch64|AArch64/ && !found { print $NF; found = 1 }'
}
