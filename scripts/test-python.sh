#!/usr/bin/env bash
# Builds the ferroce Python package into a virtual environment under target/ and runs its
# tests (crates/ferroce-py/tests, which also run every script in examples/python).
#
#   scripts/test-python.sh [pytest arguments]
#
# Needs python3 (3.10 or later) with the venv module and pip, a Rust toolchain, and PyPI
# (pytest, pytest-timeout and numpy are installed into the environment, and pip fetches maturin
# to build the package). On a fresh Debian 12: apt-get install python3-venv (python3-dev is not
# needed by the module, which is built against the stable ABI). pytest's exit status 5 (no
# tests collected) counts as a failure.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/target/pyenv"

if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet 'pytest>=8' 'pytest-timeout>=2' numpy

# The package as README.md installs it: pip builds a release wheel with maturin (PEP 517) in
# cargo's target directory, so after scripts/test-c.sh's release build it compiles little.
"$venv/bin/python" -m pip install --quiet --force-reinstall --no-deps ./crates/ferroce-py
export VIRTUAL_ENV="$venv"
export PATH="$venv/bin:$PATH"

set +e
python -m pytest -q -p no:cacheprovider crates/ferroce-py/tests "$@"
status=$?
set -e
if [[ $status -eq 5 ]]; then
    echo "test-python: pytest collected no tests" >&2
    exit 1
fi
exit $status
