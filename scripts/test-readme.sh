#!/usr/bin/env bash
# Every shell snippet of the READMEs runs as written (issue 25). For each ```sh block of
# README.md, crates/ferroce-capi/README.md, crates/ferroce-py/README.md and interop/README.md,
# in the order they appear, this script
#   - runs the block's text in a fresh `bash` (errexit and pipefail on, stdin /dev/null) from
#     the repository root, in a process group of its own, under a time limit;
#   - waits, after the block's last command, for every job the block put in the background
#     (`server &`): each must exit 0 on its own within $FERROCE_README_BG_WAIT seconds of the
#     block's end (a server exits once its client is done); one still running is killed, by its
#     PID, and fails the block; so does any other process the block left in its group;
#   - on failure prints the block (file and line) and everything it printed, and exits 1.
# Unlabelled ``` blocks are sample output, not code: they are not run. ```python blocks are
# run by crates/ferroce-py/tests (test_readme.py), not here. A block labelled
# bash, shell or console fails this script: label shell snippets ```sh so that they are run.
#
# The blocks that cannot run as written on a CI host are handled below, in special_case(),
# matched by their text, each with its reason. Everything else runs exactly as written, with
# two things of the environment arranged first:
#   - the release build's directory is first on PATH, standing in for
#     `cargo install --path crates/ferroce-cli` (README.md, "On a real RDMA NIC"), so that a
#     block's `ferroce …` runs this checkout's binary; the workspace (with and without the
#     `cuda` feature) and the drop-in libibverbs are built once, up front, so that the blocks'
#     `cargo run --release` and scripts/build-dropin.sh only find them current;
#   - HOME is a scratch directory, so that what a block installs under ~ (the C library into
#     ~/.local, a Python virtual environment) goes away with it; cargo's, rustup's, pyenv's and
#     pip's own directories stay where they were.
# Files a block leaves in the work tree (a compiled example) are removed after it, and named.
#
# Each block's processes use the addresses the README gives (127.0.0.2 and up, 127.0.1.x,
# 127.0.2.x): all loopback, none shared with another test, since scripts/test.sh runs one
# step at a time. Nothing is sent beyond 127.0.0.0/8: the blocks that name another host
# (`-d mlx5_0 … 192.168.0.x`) fail at opening the device, before any traffic, and are run only
# where no mlx5_0 exists.
#
#   scripts/test-readme.sh            FERROCE_README_ONLY=REGEX runs only the blocks whose
#                                     "FILE:LINE" matches (e.g. 'README.md:89')
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# Once on PATH only: a PATH that changes between builds reruns PyO3's build script.
[ -x "$HOME/.cargo/bin/cargo" ] && [[ ":$PATH:" != *":$HOME/.cargo/bin:"* ]] && export PATH="$HOME/.cargo/bin:$PATH"
target="${CARGO_TARGET_DIR:-$root/target}"

readmes=(README.md crates/ferroce-capi/README.md crates/ferroce-py/README.md interop/README.md)
# Seconds a block may run in all, and that its background jobs get to end after it.
block_limit="${FERROCE_README_LIMIT:-240}"
bg_wait="${FERROCE_README_BG_WAIT:-30}"

fail() {
    echo "test-readme: FAIL: $*" >&2
    exit 1
}

work="$(mktemp -d "${TMPDIR:-/tmp}/ferroce-readme.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# ---------------------------------------------------------------------------------------------
# Extract the blocks: $work/blocks/NNN.sh holds the text, NNN.where "FILE:LINE" of its fence,
# and NNN.sample the sample output shown after it (the next fenced block, when unlabelled).
mkdir -p "$work/blocks"
n=0
for f in "${readmes[@]}"; do
    [ -f "$f" ] || fail "$f is missing"
    lineno=0
    in_block=""
    after_sh=""
    while IFS= read -r line || [ -n "$line" ]; do
        lineno=$((lineno + 1))
        if [ -z "$in_block" ]; then
            case "$line" in
            '```sh')
                n=$((n + 1))
                id="$(printf '%03d' "$n")"
                echo "$f:$lineno" >"$work/blocks/$id.where"
                : >"$work/blocks/$id.sh"
                in_block=sh
                ;;
            '```')
                # Sample output: kept when it follows a sh block, to be compared with what
                # the block printed.
                if [ -n "$after_sh" ]; then
                    : >"$work/blocks/$id.sample"
                    in_block=sample
                else
                    in_block=other
                fi
                ;;
            '```bash' | '```shell' | '```console' | '```sh '* | '```bash '* | '```shell-session')
                fail "$f:$lineno: a shell block labelled '${line#\`\`\`}': label it \`\`\`sh so that this script runs it"
                ;;
            '```'*)
                # Sample output (unlabelled), Python (crates/ferroce-py/tests), or another
                # language: not this script's.
                in_block=other
                ;;
            esac
        elif [ "$line" = '```' ]; then
            if [ "$in_block" = sh ]; then after_sh=1; else after_sh=""; fi
            in_block=""
        elif [ "$in_block" = sh ]; then
            printf '%s\n' "$line" >>"$work/blocks/$id.sh"
        elif [ "$in_block" = sample ]; then
            printf '%s\n' "$line" >>"$work/blocks/$id.sample"
        fi
    done <"$f"
    [ -z "$in_block" ] || fail "$f: a code block is not closed"
done
[ "$n" -gt 0 ] || fail "no \`\`\`sh blocks found"
echo "test-readme: $n sh blocks in ${readmes[*]}"

# ---------------------------------------------------------------------------------------------
# Build once, up front. The `cuda` build first and the plain one last, so that
# target/release/ferroce is the plain binary when the blocks start (cargo keeps both builds'
# artifacts, so a block switching between them only relinks).
echo "== building the workspace in release (with and without --features cuda) and the drop-in"
cargo build --release --locked --features cuda
cargo build --release --locked
scripts/build-dropin.sh >/dev/null
export PATH="$target/release:$PATH"
[ "$(command -v ferroce)" -ef "$target/release/ferroce" ] || fail "ferroce on PATH is not $target/release/ferroce"

# The scratch HOME, with the real home's tool directories kept.
real_home="$HOME"
export CARGO_HOME="${CARGO_HOME:-$real_home/.cargo}"
export RUSTUP_HOME="${RUSTUP_HOME:-$real_home/.rustup}"
[ -d "$real_home/.pyenv" ] && export PYENV_ROOT="${PYENV_ROOT:-$real_home/.pyenv}"
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$real_home/.cache/pip}"
export HOME="$work/home"
mkdir -p "$HOME"

# What this host lacks, for the blocks that need hardware.
have_mlx5=""
[ -e /sys/class/infiniband/mlx5_0 ] && have_mlx5=1
have_gpu=""
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    have_gpu=1
fi

# ---------------------------------------------------------------------------------------------
# The special cases. special_case TEXT sets
#   mode: run (the default) | skip
#   why: the reason, printed (and required for anything but a plain run)
#   script: the text to run (the block's own, unless said otherwise)
#   expect_fail: lines split out of the block, each run alone, which must fail quickly,
#     without a panic, with output matching $expect_pattern (hardware that is not here)
#   extra_env: assignments exported before the block's text
special_case() {
    local text="$1"
    mode=run why="" script="$text" expect_fail="" expect_pattern="" extra_env=""
    case "$text" in
    *'./scripts/bootstrap.sh && ./scripts/test.sh'*)
        # README.md's second set-up command is what CI runs (.ci/run), and scripts/test.sh
        # runs this script: running it here would recurse.
        mode=skip
        why="CI runs exactly this (.ci/run); scripts/test.sh runs this script, so it would recurse"
        ;;
    *'interop/run.sh'* | *'interop/suite.py'*)
        # The interop blocks boot QEMU guests: scripts/test.sh runs interop/run.sh right after
        # this script, the benchmark takes about 15 minutes, and suite.py and lab.py drive the
        # same guests (lab.py shell is interactive).
        mode=skip
        why="boots QEMU guests: interop/run.sh runs the suite in CI right after this script (scripts/test.sh); the benchmark and lab.py shell are by hand"
        ;;
    *'FERROCE_BLESS=1 cargo test -p ferroce-capi --test header'*)
        # A maintainer's command that rewrites the committed header. Without FERROCE_BLESS
        # the same test checks the header is current: it proves the command runs, and writes
        # nothing.
        why="run without FERROCE_BLESS=1 (blessing rewrites include/ferroce.h); the same test then checks the header is current"
        script="${text//FERROCE_BLESS=1 /}"
        ;;
    *'scripts/install-capi.sh /usr/local'* | *'/usr/local/lib/libferroce_capi.a'*)
        # crates/ferroce-capi/README.md installs into /usr/local. Install into a temporary
        # prefix instead, and let pkg-config search it as it searches /usr/local/lib/pkgconfig
        # by default on Debian (the static-link block relies on that).
        why="/usr/local replaced by the temporary prefix $work/prefix, which PKG_CONFIG_PATH names as pkg-config's default path names /usr/local/lib/pkgconfig"
        script="${text//\/usr\/local/$work/prefix}"
        extra_env="PKG_CONFIG_PATH=$work/prefix/lib/pkgconfig"
        ;;
    esac
    # The README's paths into the build (`LD_LIBRARY_PATH=target/release`, `-o target/…`)
    # assume cargo's default target directory; where CARGO_TARGET_DIR puts it elsewhere, they
    # are read as that directory.
    if [ "$target" != "$root/target" ]; then
        script="$(sed -E "s#(^|[ =])target/#\\1$target/#g" <<<"$script")"
    fi
    # Lines that open a ConnectX by name (`-d mlx5_0`): without one they must fail at once
    # and say which device is missing and why; where an mlx5_0 exists they need a peer, so
    # they are not run.
    if grep -q -- '-d mlx5_0' <<<"$text"; then
        local rest
        rest="$(grep -v -- '-d mlx5_0' <<<"$script" || true)"
        if [ -n "$have_mlx5" ]; then
            why="${why:+$why; }the -d mlx5_0 lines need a peer for this host's mlx5_0: not run"
        else
            expect_fail="$(grep -- '-d mlx5_0' <<<"$script")"
            expect_pattern='mlx5_0.*(no RDMA support|cannot load libibverbs)|no RDMA device called mlx5_0|no device mlx5_0'
            why="${why:+$why; }no mlx5_0 here: its lines must fail naming the device and why"
        fi
        script="$rest"
    fi
    # `--features cuda … --cuda 0` delivers frames into GPU memory: without a CUDA driver
    # and a GPU, that line must fail at once and say so; the rest of its block (the sender
    # that would serve it) is then not run, having no receiver.
    if grep -q -- '--cuda 0' <<<"$text" && [ -z "$have_gpu" ]; then
        expect_fail="$(grep -- '--cuda 0' <<<"$script")"
        if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
            expect_pattern='--cuda 0.*CUDA'
        else
            expect_pattern='--cuda 0.*no CUDA driver'
        fi
        why="${why:+$why; }no CUDA driver and GPU here: the --cuda 0 line must fail saying so; its sender is not run"
        script=""
    fi
    return 0
}

# ---------------------------------------------------------------------------------------------
# Running a block.

# The block as a script: errexit and pipefail, and each `cmd &` job's PID recorded, so that
# the EXIT trap waits for each and checks its status.
make_runner() {
    local text="$1" env="$2" out="$3"
    {
        cat <<'PRE'
set -eo pipefail
__bg=()
# A block may `wait` for its own jobs, as a user's shell would: their statuses are kept here
# for the EXIT trap, which could not wait for them again.
declare -A __st=()
wait() {
    local pid st=0
    if [ $# -eq 0 ]; then
        for pid in "${__bg[@]}"; do
            [ -n "${__st[$pid]:-}" ] && continue
            st=0
            builtin wait "$pid" 2>/dev/null || st=$?
            __st[$pid]=$st
        done
        return 0
    fi
    builtin wait "$@" || st=$?
    for pid in "$@"; do __st[$pid]=$st; done
    return "$st"
}
__reap() {
    local rc=$? pid st deadline
    deadline=$((SECONDS + __BG_WAIT))
    for pid in "${__bg[@]}"; do
        while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "test-readme: background job $pid still running ${__BG_WAIT}s after the block: killed" >&2
            kill "$pid" 2>/dev/null || true
            builtin wait "$pid" 2>/dev/null || true
            rc=1
        else
            st=0
            if [ -n "${__st[$pid]:-}" ]; then
                st=${__st[$pid]}
            else
                builtin wait "$pid" || st=$?
            fi
            if [ "$st" -ne 0 ]; then
                echo "test-readme: background job $pid exited $st" >&2
                rc=1
            fi
        fi
    done
    exit "$rc"
}
trap __reap EXIT
PRE
        [ -z "$env" ] || printf 'export %s\n' "$env"
        # A line ending in a single `&` (or `& sleep N`, before an optional comment) starts
        # a job.
        while IFS= read -r line; do
            printf '%s\n' "$line"
            if [[ "$line" =~ [^\&]\&([[:space:]]+sleep[[:space:]]+[0-9.]+)?[[:space:]]*(#.*)?$ ]]; then
                printf '__bg+=($!)\n'
            fi
        done <<<"$text"
    } >"$out"
}

# run_script NAME SCRIPT LOG: runs SCRIPT under the time limit in a process group of its own
# (timeout's), then kills, by that group's ID, anything the block left. Returns bash's status,
# or 1 when something was left.
run_script() {
    local script="$1" log="$2" rc=0 pgid
    __BG_WAIT="$bg_wait" timeout -k 10 "$block_limit" bash "$script" </dev/null >"$log" 2>&1 &
    pgid=$!
    wait "$pgid" || rc=$?
    if kill -0 -- "-$pgid" 2>/dev/null; then
        echo "test-readme: processes left in the block's group:" >>"$log"
        ps -o pid=,args= -g "$pgid" >>"$log" 2>&1 || true
        kill -KILL -- "-$pgid" 2>/dev/null || true
        [ "$rc" -ne 0 ] || rc=1
    fi
    return "$rc"
}

show_failure() {
    local where="$1" text="$2" log="$3" what="$4"
    {
        echo "test-readme: FAIL: the block at $where $what"
        echo "---- the block"
        printf '%s\n' "$text"
        echo "---- its output"
        cat "$log"
        echo "----"
    } >&2
}

# The work tree's untracked files (none outside a git checkout).
untracked() {
    { git ls-files --others --exclude-standard 2>/dev/null || true; } | sort
}

skipped=()
failed=0
for block in "$work"/blocks/*.sh; do
    id="$(basename "$block" .sh)"
    where="$(cat "$work/blocks/$id.where")"
    if [ -n "${FERROCE_README_ONLY:-}" ] && ! [[ "$where" =~ $FERROCE_README_ONLY ]]; then
        continue
    fi
    text="$(cat "$block")"
    special_case "$text"
    if [ "$mode" = skip ]; then
        echo "== $where: not run: $why"
        skipped+=("$where: $why")
        continue
    fi
    echo "== $where${why:+ ($why)}"
    sed 's/^/    /' <<<"$text"
    before="$(untracked)"
    start=$SECONDS
    # The block's `cargo run`s must find the build current, as they do on a machine where
    # nothing else builds, so that a server and its client start within the block's `sleep 1`
    # of each other; and `ferroce` on PATH must be this checkout's. With a target directory
    # shared with other checkouts the up-front build may be stale by now; where it is
    # current (CI) this takes a fraction of a second.
    if grep -q -- '--features cuda' <<<"$script"; then
        cargo build --release --locked --features cuda --quiet
    fi
    cargo build --release --locked --quiet

    # Lines for hardware that is not here: each alone, in a fresh bash, must fail.
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        log="$work/$id.fail.log"
        printf 'set -eo pipefail\n%s\n' "$line" >"$work/$id.fail.sh"
        rc=0
        run_script "$work/$id.fail.sh" "$log" || rc=$?
        if [ "$rc" -eq 0 ]; then
            show_failure "$where" "$line" "$log" "succeeded, but this host lacks what it needs"
            failed=1
        elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            show_failure "$where" "$line" "$log" "did not fail within ${block_limit}s"
            failed=1
        elif grep -q 'panicked' "$log" || ! grep -qE -- "$expect_pattern" "$log"; then
            show_failure "$where" "$line" "$log" "failed (exit $rc) without an error matching '$expect_pattern', or panicked"
            failed=1
        else
            echo "    -> refused as expected (exit $rc): $(grep -E -- "$expect_pattern" "$log" | head -1)"
        fi
    done <<<"$expect_fail"

    if [ -n "$(tr -d '[:space:]' <<<"$script")" ]; then
        make_runner "$script" "$extra_env" "$work/$id.run.sh"
        log="$work/$id.log"
        rc=0
        run_script "$work/$id.run.sh" "$log" || rc=$?
        if [ "$rc" -ne 0 ]; then
            case "$rc" in
            124 | 137) what="ran past ${block_limit}s" ;;
            *) what="failed (exit $rc)" ;;
            esac
            show_failure "$where" "$script" "$log" "$what"
            failed=1
        fi
        # The sample output shown after the block: each of its lines ("..." elides) must be
        # one the block printed, tabs and spaces aside. Not for a sample taken on another
        # host (`hca_id: rxe0`: kernel Soft-RoCE, which CI has not).
        sample="$work/blocks/$id.sample"
        if [ "$failed" -eq 0 ] && [ -s "$sample" ] && ! grep -qP '^hca_id:\s+(?!ferroce0)' "$sample"; then
            squash() { sed -E 's/[[:space:]]+/ /g; s/^ //; s/ $//'; }
            printed="$(squash <"$log")"
            missing=""
            while IFS= read -r want; do
                [ -n "$want" ] && [ "$want" != "..." ] || continue
                grep -qxF -- "$want" <<<"$printed" || missing+="$want"$'\n'
            done < <(squash <"$sample")
            if [ -n "$missing" ]; then
                show_failure "$where" "$script" "$log" "did not print the README's sample output: missing lines:"$'\n'"$missing"
                failed=1
            else
                echo "    (its output has every line of the README's sample)"
            fi
        elif [ -s "$sample" ]; then
            echo "    (its sample output is from another host: not compared)"
        fi
    fi

    # What the block built in the work tree (`cc … -o receive_frames`) goes.
    left="$(comm -13 <(printf '%s\n' "$before") <(untracked))"
    if [ -n "$left" ]; then
        echo "    (removing what the block left in the work tree: $(tr '\n' ' ' <<<"$left"))"
        while IFS= read -r p; do rm -f -- "$p"; done <<<"$left"
    fi
    [ "$failed" -eq 0 ] || break
    echo "    ok ($((SECONDS - start)) s)"
done

[ "$failed" -eq 0 ] || fail "a README block failed (above)"
if [ ${#skipped[@]} -gt 0 ]; then
    echo "test-readme: not run, and why:"
    printf '    %s\n' "${skipped[@]}"
fi
echo "test-readme: all passed"
