#!/usr/bin/env bash
# The GPU checks, in one script, for a machine with NVIDIA GPUs:
#   bash tools/gpu_check.sh
# Offline: it installs nothing. It uses $DAPO_GPU_PYTHON, else .venv-gpu/bin/python, else
# python3 — whichever it is must hold the GPU flavour (CUDA torch, the project's dependencies,
# vLLM optional: without it the vLLM stages are skipped and the JSON says so); see
# docs/development.md for installing it, also on a machine without network. It builds the tiny
# policy itself. On 1 GPU the learner and a generator share it (weight sync through pinned host
# memory); on >= 2 GPUs they get one each (NCCL weight sync).
# The last line of stdout is one JSON object: learner steps/s, generator tokens/s, weight sync
# GB/s and its ratio to a flat NCCL broadcast, the main job's held-out accuracy before/after.
# Stages and what they run: dapo_async/tools/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L
PY=${DAPO_GPU_PYTHON:-}
if [[ -z "$PY" ]]; then
  if [[ -x .venv-gpu/bin/python ]]; then PY=.venv-gpu/bin/python; else PY=python3; fi
fi
if ! "$PY" -c 'import torch, zmq, omegaconf, transformers; assert torch.cuda.is_available()'; then
  echo "gpu_check: $PY lacks CUDA torch or the project's dependencies (docs/development.md)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m dapo_async.tools.gpu_check
