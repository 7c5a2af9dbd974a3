#!/usr/bin/env bash
# Source this in a Slurm task to give it one GPU of its node:
#   - the site already binds one GPU per task (CUDA_VISIBLE_DEVICES lists one): keep it;
#   - the task sees several (CUDA_VISIBLE_DEVICES lists them): take the SLURM_LOCALID-th of them
#     (an index into that list, not a physical id);
#   - nothing set: GPU number SLURM_LOCALID.
IFS=, read -ra _DAPO_VISIBLE <<<"${CUDA_VISIBLE_DEVICES:-}"
if ((${#_DAPO_VISIBLE[@]} > 1)); then
  if ((SLURM_LOCALID >= ${#_DAPO_VISIBLE[@]})); then
    echo "pick_gpu: task $SLURM_LOCALID but only ${#_DAPO_VISIBLE[@]} GPUs visible" >&2
    return 1 2>/dev/null || exit 1
  fi
  export CUDA_VISIBLE_DEVICES=${_DAPO_VISIBLE[$SLURM_LOCALID]}
elif ((${#_DAPO_VISIBLE[@]} == 0)); then
  export CUDA_VISIBLE_DEVICES=$SLURM_LOCALID
fi
unset _DAPO_VISIBLE
