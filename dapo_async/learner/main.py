"""`dapo-async learner CONFIG [overrides] [--resume]`: one learner rank (run it under torchrun
for several ranks; RANK / WORLD_SIZE come from the environment).

Parses the config, then builds the rank (``learner/role.py``: models, Parallel, Trainer, buffer
socket, weight publisher), evaluates the initial policy, and runs the steps until
``learner.num_steps``, the time budget, or SIGINT/SIGTERM. Heavy imports (torch, transformers)
come after parsing, so a bad config fails at once.
"""

from __future__ import annotations

import argparse
import os
import sys

from dapo_async.config import load_config
from dapo_async.config.paths import check_model_dirs
from dapo_async.hub import resolve_paths
from dapo_async.roles import StopFlag, leave_world_and_exit, set_threads, setup_logging


def _dist_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def main(args: argparse.Namespace) -> int:
    cfg = resolve_paths(load_config(args.config, args.overrides))  # Hub ids: local paths
    check_model_dirs(cfg)
    rank, world = _dist_env()
    log = setup_logging(f"learner{rank}")
    stop = StopFlag().install()
    set_threads(cfg.launch.torch_threads)

    from dapo_async.learner.role import Learner  # torch, transformers

    learner = Learner(cfg, rank, world, args.resume, log, stop)
    try:
        learner.build()
        learner.evaluate_before()
        learner.make_trainer()
        learner.publish_resumed()
        learner.run()
    finally:
        learner.close()
    version = learner.trainer.version if hasattr(learner, "trainer") else 0
    log.info("learner stopped at version %d (%s)", version, stop.reason or "done")
    code = 130 if stop else 0
    if world > 1:
        leave_world_and_exit(code)  # roles.py says why not through the interpreter's teardown
    return code


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace(config=sys.argv[1], overrides=sys.argv[2:], resume=False)))
