#!/usr/bin/env bash
# The GPU checks, in one script, for a machine with an NVIDIA GPU:
#   bash tools/gpu_check.sh
# It installs the GPU flavour into .venv-gpu (vllm from PyPI, CUDA torch), then runs
#  1. the gpu-marked tests: NCCL weight sync (5 versions, bit-equal) and bench weights on NCCL;
#  2. the vLLM engine tests on CUDA (log-probs vs transformers, weight updates, weight sync into
#     a vLLM engine) — the same tests as on CPU; VLLMEngine picks the GPU when torch sees one;
#  3. `dapo-async bench weights --backend nccl --json` and `bench generator --engine vllm --json`,
#     whose last lines (JSON) are the figures to report.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
VENV=${DAPO_GPU_VENV:-.venv-gpu}
if [[ ! -x "$VENV/bin/python" ]]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[gpu,dev]'
fi
PY="$VENV/bin/python"
"$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no GPU"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
"$PY" -m pytest -q -m gpu tests
"$PY" -m pytest -q tests/generator/test_engines.py tests/weight_sync/test_vllm_sync.py
"$PY" -m dapo_async.cli bench weights --backend nccl --json
"$PY" -m dapo_async.cli bench generator --engine vllm --json
