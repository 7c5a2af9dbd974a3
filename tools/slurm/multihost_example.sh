#!/usr/bin/env bash
# The same layout without Slurm: run one block per host (see docs/cluster.md). Each role runs
# under `dapo-async supervise`, which restarts it when it dies (the learner with --resume).
# Hosts: 10.0.0.5 = buffer + learner, 10.0.0.7.. = generators; RUN_DIR on a shared filesystem.
set -euo pipefail
RUN_DIR=/shared/runs/demo
CFG=configs/tiny_cpu.yaml
COMMON=(run_dir=$RUN_DIR launch.curve_keys_dir=$RUN_DIR/keys
        launch.buffer_endpoint=tcp://10.0.0.5:5555 weight_sync.endpoint=10.0.0.5:29600)
case "${1:?usage: multihost_example.sh buffer|learner|generator}" in
  buffer)     # once, on 10.0.0.5 (after `dapo-async keys --out $RUN_DIR/keys`)
    dapo-async supervise --name buffer -- dapo-async buffer $CFG "${COMMON[@]}" launch.host=10.0.0.5 buffer.port=5555 buffer.wal=true ;;
  learner)    # on 10.0.0.5 (several learner hosts: --nnodes=N --node_rank=I --master_addr=10.0.0.5,
              # node_rank 0 here, so rank 0 hosts the store weight_sync.endpoint names)
    dapo-async supervise --name learner -- torchrun --nproc_per_node=1 -m dapo_async.cli \
      learner $CFG "${COMMON[@]}" launch.host=10.0.0.5 weight_sync.port=29600 --resume ;;
  generator)  # on any number of hosts, at any time
    dapo-async supervise --name generator -- \
      dapo-async generator $CFG "${COMMON[@]}" --id "gen-$(hostname)" ;;
esac
