#!/usr/bin/env bash
# Installs what ferroce's build and tests need on a fresh Debian 12 machine: a C and C++
# toolchain (which also builds the verbs tests' stand-in libibverbs and the C bindings'
# examples), Python's venv and headers (the Python package), libibverbs itself, and what runs
# on the drop-in libibverbs (rdma-core's tools and headers, perftest, UCX, Open MPI), iproute2
# and nftables (the namespace tests), tshark (the tests compare `ferroce decode` with
# Wireshark's dissector), and Rust by rustup when cargo is missing; as root it also gives UCX
# the device node it looks for (below). Safe to run again: it installs only what is absent.
set -euo pipefail

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "bootstrap: run as root or install sudo" >&2; exit 1; }
    sudo="sudo"
fi

packages=()
command -v cc >/dev/null || packages+=(build-essential)
command -v curl >/dev/null || packages+=(curl ca-certificates)
command -v tshark >/dev/null || packages+=(tshark)
command -v pkg-config >/dev/null || packages+=(pkg-config)
command -v ip >/dev/null || packages+=(iproute2)
command -v nft >/dev/null || packages+=(nftables)
command -v readelf >/dev/null || packages+=(binutils)
# The verbs backend's tests load the real libibverbs too (no device is needed: on a kernel
# without RDMA it must say so).
[ -e /usr/lib/x86_64-linux-gnu/libibverbs.so.1 ] || packages+=(libibverbs1)
# The drop-in libibverbs (crates/ferroce-ibverbs) is tested under Debian's own programs:
# ibv_devices, ibv_devinfo and the pingpongs (ibverbs-utils), and perftest's ib_* tools.
command -v ibv_devinfo >/dev/null || packages+=(ibverbs-utils)
command -v ib_write_bw >/dev/null || packages+=(perftest)
# …and the drop-in librdmacm (the same file) under rping, ucmatose and udaddy (rdmacm-utils;
# scripts/test-rdmacm.sh).
command -v rping >/dev/null || packages+=(rdmacm-utils)
# …and libfabric's fi_info, whose verbs provider lists devices through rdma_get_devices.
command -v fi_info >/dev/null || packages+=(libfabric-bin)
[ -e /usr/include/rdma/rdma_cma.h ] || packages+=(librdmacm-dev)
# …and a C test built against rdma-core's headers, whose inline functions it must satisfy.
[ -e /usr/include/infiniband/verbs.h ] || packages+=(libibverbs-dev)
# UCX's tools and Open MPI (built with UCX), with mpicc for the MPI test program, run on the
# drop-in too (scripts/test-ucx.sh).
command -v ucx_perftest >/dev/null || packages+=(ucx-utils)
pkg-config --exists ucx 2>/dev/null || packages+=(libucx-dev)
command -v mpirun >/dev/null || packages+=(openmpi-bin)
command -v mpicc >/dev/null || packages+=(libopenmpi-dev)
# The Python package (crates/ferroce-py) builds in a virtual environment, and its Rust crate
# links libpython when cargo tests it; the C bindings' tests need a C++ compiler too.
command -v python3 >/dev/null || packages+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || packages+=(python3-venv)
command -v python3-config >/dev/null || packages+=(python3-dev)
command -v c++ >/dev/null || packages+=(g++)
checked="a C and C++ toolchain, curl, tshark, pkg-config, iproute2, nftables, binutils, libibverbs, rdma-core's tools (ibverbs-utils, rdmacm-utils), perftest, libfabric, UCX and its headers, Open MPI, Python 3 with venv and headers"
if [ ${#packages[@]} -eq 0 ]; then
    echo "bootstrap: checked $checked: all installed, nothing to do"
else
    echo "bootstrap: installing ${packages[*]}"
    $sudo apt-get update -qq
    # tshark's package asks whether non-root users may capture; answer no without a prompt.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | $sudo debconf-set-selections
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}"
fi

if command -v cargo >/dev/null; then
    echo "bootstrap: checked Rust: $(cargo --version) is on PATH"
else
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        echo "bootstrap: cargo is in ~/.cargo/bin; add it to PATH (source ~/.cargo/env)"
    else
        echo "bootstrap: installing Rust with rustup"
        curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c rustfmt,clippy
        echo "bootstrap: run 'source ~/.cargo/env' (or open a new shell) to put cargo on PATH"
    fi
fi

# UCX lists a verbs device only where /dev/infiniband/<its dev_name> is a character device it
# may read and write; it never opens it. The drop-in libibverbs is dev_name ferroce_verbs0:
# give UCX /dev/null under that name (README.md, "Run an existing RDMA program on ferroce").
node=/dev/infiniband/ferroce_verbs0
if [ -c "$node" ]; then
    echo "bootstrap: checked $node: present"
elif $sudo mkdir -p /dev/infiniband && $sudo ln -sfn /dev/null "$node"; then
    echo "bootstrap: linked $node to /dev/null, for UCX"
else
    # Not fatal: everything else still installs; scripts/test-ucx.sh says what is missing.
    echo "bootstrap: could not make $node (a read-only /dev?); UCX will not list ferroce0" >&2
fi
