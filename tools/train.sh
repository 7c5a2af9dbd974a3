#!/usr/bin/env bash
# Set up .venv (idempotent) and run the main job: DAPO on the built-in tiny policy, CPU only.
# Extra arguments are dotted config overrides, e.g. `bash tools/train.sh learner.num_steps=10`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec .venv/bin/dapo-async train configs/tiny_cpu.yaml "$@"
