"""Shared fixtures for the ferroce Python tests.

Every test runs against the real engine on loopback. Each test module owns a block of
addresses in 127.0.1.1-127.0.1.120 (one NIC per address, port 4791), so no two tests share a
socket; test_cm_ud_srq.py and the package README's blocks use 127.0.9.1-127.0.9.90 instead.
Waits are bounded and no assertion depends on timing.
"""

import os
import shutil

import pytest


def pytest_collection_modifyitems(config, items):
    """GPU cases need a CUDA device and a build with the cuda feature; skip them, saying
    why, everywhere else, unless `FERROCE_REQUIRE_GPU=1` (scripts/gpu-check.sh) requires
    them to run."""
    have_gpu = shutil.which("nvidia-smi") is not None and os.environ.get("FERROCE_GPU") == "1"
    if have_gpu or os.environ.get("FERROCE_REQUIRE_GPU") == "1":
        return
    skip = pytest.mark.skip(
        reason="needs a CUDA GPU and ferroce built with --features cuda (set FERROCE_GPU=1)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def ip(host: int) -> str:
    """The test address 127.0.1.<host>."""
    assert 1 <= host <= 120, host
    return f"127.0.1.{host}"


class PyDevice:
    """Device memory written in Python (the device-memory methods of ferroce's Rust trait),
    backed by a bytearray; its writes fail after `fail_after` of them."""

    def __init__(self, size, fail_after=None):
        self.buf = bytearray(size)
        self.writes = 0
        self.fail_after = fail_after

    def size(self):
        return len(self.buf)

    def address(self):
        return 0x7F00_0000_0000

    def describe(self):
        return "a Python test device"

    def write(self, offset, data):
        self.writes += 1
        if self.fail_after is not None and self.writes > self.fail_after:
            raise RuntimeError("the test device was unplugged")
        self.buf[offset : offset + len(data)] = data

    def read(self, offset, length):
        return bytes(self.buf[offset : offset + length])
