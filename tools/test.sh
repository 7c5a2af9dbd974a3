#!/usr/bin/env bash
# Set up .venv (idempotent) and run the whole test suite. Extra arguments go to pytest,
# e.g. `bash tools/test.sh -m "not slow"` or `bash tools/test.sh tests/algo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
export OMP_NUM_THREADS=1
exec .venv/bin/python -m pytest "$@"
