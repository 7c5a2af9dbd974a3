"""One rank of a gloo learner world (RANK / WORLD_SIZE / MASTER_* from the environment): train
``NUM_STEPS`` Trainer steps on this rank's aligned shard of fixed synthetic batches and save the
full parameters (rank 0).

    python rank_worker.py MODEL_DIR OUT.pt NUM_STEPS [config overrides...]
"""

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learner_helpers import aligned_shard, build_trainer, make_config, synthetic_groups

from dapo_async.roles import leave_world_and_exit

GROUPS_PER_STEP = 8


def main() -> None:
    model_dir, out, num_steps, *overrides = sys.argv[1:]
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(1)
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    cfg = make_config(*overrides)
    # float64: summing in another order (micro-batches, ranks) then differs by ~1e-16, which
    # Adam's normalisation cannot blow up to the tolerance (in float32 it can, where a
    # parameter's gradient is itself at rounding level)
    trainer = build_trainer(
        model_dir, cfg, rank, world, ref=cfg.algo.objective == "ppo_kl", dtype=torch.float64
    )
    for step in range(int(num_steps)):
        groups = synthetic_groups(step, GROUPS_PER_STEP)
        trainer.step(aligned_shard(groups, rank, world, cfg.learner.num_minibatches))
    full = trainer.par.full_state()
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in full.items()}, out)
    if world > 1:
        # together, and past the interpreter's teardown, where a gloo rank was seen to abort
        leave_world_and_exit(0)


if __name__ == "__main__":
    main()
