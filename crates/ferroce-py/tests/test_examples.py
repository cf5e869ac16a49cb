"""Every script in examples/python runs, with no arguments, on loopback, within a minute."""

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples" / "python"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))


def test_the_examples_are_there():
    names = {p.name for p in SCRIPTS}
    assert {"receive_frames.py", "rdma_write.py", "session_roundtrip.py", "cache_flush.py"} <= names


@pytest.mark.timeout(90)
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_example_runs(script):
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{script.name} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{script.name} printed nothing"
