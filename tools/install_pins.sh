#!/usr/bin/env bash
# Install a lock file's exact pins into a Python environment, without dependencies (the lock is
# complete): `bash tools/install_pins.sh PYTHON LOCK`. The pinned torch is a +cpu build, which
# PyPI does not serve: where the machine's own package index lacks a pin, the install is retried
# with PyTorch's CPU wheel index as an extra index (DAPO_TORCH_INDEX names another). Used by
# tools/setup.sh; tests/tools/test_install_pins.py checks both passes with local indexes.
set -euo pipefail
PY=${1:?usage: install_pins.sh PYTHON LOCK}
LOCK=${2:?usage: install_pins.sh PYTHON LOCK}
TORCH_INDEX=${DAPO_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
if "$PY" -m pip install -q --no-deps -r "$LOCK"; then
  exit 0
fi
echo "[setup] a pin is not on this machine's package index (usually torch's +cpu build);" \
  "retrying with $TORCH_INDEX as an extra index"
if ! "$PY" -m pip install -q --no-deps -r "$LOCK" --extra-index-url "$TORCH_INDEX"; then
  echo "[setup] error: the pins of $LOCK could not be installed from this machine's index or" \
    "$TORCH_INDEX (pip's message above names the pin); set DAPO_TORCH_INDEX to an index that" \
    "serves it" >&2
  exit 1
fi
