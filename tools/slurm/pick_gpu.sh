#!/usr/bin/env bash
# Source this in a Slurm task to give it its GPUs: DAPO_GPUS_PER_TASK of them (default 1; a
# generator with generator.tensor_parallel_size = T takes T), the SLURM_LOCALID-th group:
#   - the site already binds exactly that many per task (CUDA_VISIBLE_DEVICES lists them): keep;
#   - the task sees more (CUDA_VISIBLE_DEVICES lists them): take its group of that list
#     (indices into the list, not physical ids);
#   - nothing set: GPUs SLURM_LOCALID·n … SLURM_LOCALID·n + n − 1.
_DAPO_N=${DAPO_GPUS_PER_TASK:-1}
IFS=, read -ra _DAPO_VISIBLE <<<"${CUDA_VISIBLE_DEVICES:-}"
_DAPO_FIRST=$((SLURM_LOCALID * _DAPO_N))
if ((${#_DAPO_VISIBLE[@]} == 0)); then
  export CUDA_VISIBLE_DEVICES=$(seq -s, "$_DAPO_FIRST" $((_DAPO_FIRST + _DAPO_N - 1)))
elif ((${#_DAPO_VISIBLE[@]} != _DAPO_N)); then
  if ((_DAPO_FIRST + _DAPO_N > ${#_DAPO_VISIBLE[@]})); then
    echo "pick_gpu: task $SLURM_LOCALID needs GPUs $_DAPO_FIRST..$((_DAPO_FIRST + _DAPO_N - 1))" \
      "of the visible ones but only ${#_DAPO_VISIBLE[@]} GPUs visible" >&2
    unset _DAPO_N _DAPO_VISIBLE _DAPO_FIRST
    return 1 2>/dev/null || exit 1
  fi
  _DAPO_MINE=("${_DAPO_VISIBLE[@]:_DAPO_FIRST:_DAPO_N}")
  export CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${_DAPO_MINE[*]}")
  unset _DAPO_MINE
fi
unset _DAPO_N _DAPO_VISIBLE _DAPO_FIRST
