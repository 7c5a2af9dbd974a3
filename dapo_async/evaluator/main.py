"""`dapo-async evaluator CONFIG [overrides]`: periodic held-out evaluation in its own process.

The learner (``learner.eval_process``) writes a weight snapshot at every ``learner.eval_every``
step and goes on training (and asks for the evaluations before and after training the same
way); this role loads each snapshot into its own inference engine —
``eval.engine``, by default the generators' (vLLM where the run samples with vLLM), in
``generator.dtype`` on its own device (``dapo-async train`` gives it generator 0's GPUs) — evaluates it (``dapo_async.evaluation``: avg@k / pass@k per data source) and records ``eval/*``
at the snapshot's version in ``metrics/evaluator.jsonl`` and Aim, so the learner's step time no
longer holds the evaluation. It exits on SIGINT/SIGTERM, or once the learner has finished
(``learner_summary.json``) and nothing is pending.

    loop: pending snapshots? → load (oldest first) → evaluate → track(version)
                                 [before/after: eval_before.json / eval_after.json] → delete
          none? → learner finished? exit : sleep POLL_S
"""

from __future__ import annotations

import argparse
import sys
import time

from dapo_async.config import load_config
from dapo_async.config.paths import check_model_dirs
from dapo_async.hub import resolve_paths
from dapo_async.roles import StopFlag, set_threads, setup_logging

# How often an idle evaluator looks for a new snapshot (evaluations take seconds).
POLL_S = 0.5


def main(args: argparse.Namespace) -> int:
    cfg = resolve_paths(load_config(args.config, args.overrides))  # Hub ids: local paths
    check_model_dirs(cfg)
    log = setup_logging("evaluator")
    stop = StopFlag().install()
    set_threads(cfg.launch.torch_threads)

    from transformers import AutoTokenizer  # torch, transformers, vLLM: after parsing

    from dapo_async import eval_snapshots
    from dapo_async.data.datasets import load_heldout
    from dapo_async.evaluation import eval_engine, evaluate_engine
    from dapo_async.tracking import Tracker
    from dapo_async.utils import atomic_write_json

    run_dir = cfg.resolved_run_dir
    records = load_heldout(cfg.data, cfg.seed)
    tok = AutoTokenizer.from_pretrained(cfg.model.source_dir)
    engine = eval_engine(cfg, cfg.model.source_dir, share_gpu=True)
    log.info("evaluating on %s", type(engine).__name__)
    tracker = Tracker.for_role(cfg, "evaluator")
    evaluated = 0
    started_at = time.time()
    try:
        while not stop:
            todo = eval_snapshots.pending(run_dir)
            if not todo:
                if eval_snapshots.learner_finished(run_dir, started_at):
                    break
                time.sleep(POLL_S)
                continue
            version, path, tag = todo[0]
            t0 = time.monotonic()
            if tag == eval_snapshots.BEFORE and evaluated:
                log.warning("skipping %s: the engine no longer holds the initial policy", path)
                eval_snapshots.done(path)
                continue
            if tag != eval_snapshots.BEFORE:  # before: the engine holds the initial policy
                engine.load_file(str(path), version)  # vLLM: its workers read it
            ev = evaluate_engine(engine, tok, cfg, records)
            ev["eval/seconds"] = time.monotonic() - t0
            tracker.track(ev, version)
            if tag:  # the run's summary reads these (`train`, the benches)
                atomic_write_json(run_dir / f"eval_{tag}.json", ev)
            log.info(
                "v%d held-out accuracy %s%.3f (%.1fs)",
                version,
                f"{tag} training: " if tag else "",
                ev["eval/accuracy"],
                ev["eval/seconds"],
            )
            eval_snapshots.done(path)
            evaluated += 1
    finally:
        tracker.close()
        engine.close()
    log.info("stopped after %d evaluations (%s)", evaluated, stop.reason or "learner finished")
    return 0


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace(config=sys.argv[1], overrides=sys.argv[2:])))
