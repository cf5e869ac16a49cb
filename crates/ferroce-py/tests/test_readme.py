"""Every Python block of the repository's README.md and of this package's README
(crates/ferroce-py/README.md) runs as written, each in a fresh interpreter, on loopback: the
first Python a new user copies must work. The package README's blocks use 127.0.9.80-90."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
READMES = [ROOT / "README.md", ROOT / "crates" / "ferroce-py" / "README.md"]
BLOCKS = [
    (readme, code)
    for readme in READMES
    for code in re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
]


@pytest.mark.parametrize("readme", READMES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_readme_has_python_to_run(readme):
    assert any(r == readme for r, _ in BLOCKS), f"{readme} has no ```python block"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "readme,code",
    BLOCKS,
    ids=[f"{r.relative_to(ROOT)}-block{i}" for i, (r, _) in enumerate(BLOCKS)],
)
def test_readme_block_runs(readme, code):
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, (
        f"{readme} block failed:\n{code}\n{done.stdout}\n{done.stderr}"
    )
