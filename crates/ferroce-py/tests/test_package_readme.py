"""Every Python block of this package's README (crates/ferroce-py/README.md) runs as written,
each in a fresh interpreter, on loopback, as tests/test_readme.py does for the repository's
README. The blocks use addresses 127.0.9.80-127.0.9.90 only."""

import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_package_readme_has_python_to_run():
    assert BLOCKS, "crates/ferroce-py/README.md has no ```python block"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_package_readme_block_runs(code):
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"README block failed:\n{code}\n{done.stdout}\n{done.stderr}"
