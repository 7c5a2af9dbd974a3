"""`dapo-async eval [--config CONFIG] [k=v ...] [--model DIR] [--engine hf|vllm] [--k N]`:
avg@k and pass@k on held-out prompts, overall and per ``data_source``, with a progress bar on
stderr; ``--json`` ends with one JSON line. It uses the run config's data (``data.eval_source``,
else ``data.source``), prompt rendering, reward function and its ``eval`` section (k,
temperature, top-p, max tokens, engine: by default the generators', in their dtype, on a GPU
when one is visible); flags override them.
Without ``--config``: the built-in tiny chain task (difficulty 3, 40 tokens). Same code as the
learner's periodic evaluation (``dapo_async.evaluation``)."""

from __future__ import annotations

import argparse
import json
import sys

# Without --config: the built-in task the tiny policy is warm-started on.
TINY_DEFAULTS = ["data.source=tiny:chain", "data.difficulty=3", "generator.max_tokens=40"]


def eval_config(args: argparse.Namespace):
    """The run config with the command line's flags applied (flags beat the config)."""
    from dapo_async.config import load_config

    over = [] if args.config else list(TINY_DEFAULTS)
    over += list(args.overrides)
    if args.data:
        over += [f"data.eval_source={args.data}"]
    if args.max_tokens is not None:
        over += [f"eval.max_tokens={args.max_tokens}"]
    if args.k is not None:
        over += [f"eval.k={args.k}"]
    if args.temperature is not None:
        over += [f"eval.temperature={args.temperature}"]
    elif args.k is not None and args.k > 1:
        over += ["eval.temperature=1.0"]  # k samples of one prompt: sampled, not greedy
    if args.num_prompts is not None:
        over += [f"data.num_eval={args.num_prompts}"]
    if args.difficulty is not None:
        over += [f"data.difficulty={args.difficulty}"]
    if args.max_difficulty is not None:
        over += [f"data.max_difficulty={args.max_difficulty}"]
    if args.engine is not None:
        over += [f"eval.engine={args.engine}"]
    return load_config(args.config, over)


def main(args: argparse.Namespace) -> int:
    out = run_eval(args)
    print(
        f"avg@{out['k']} {out['avg_at_k']:.4f}  pass@{out['k']} {out['pass_at_k']:.4f}  on "
        f"{out['num_prompts']} prompts ({out['engine']})",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(out))
    return 0


def run_eval(args: argparse.Namespace) -> dict:
    """The evaluation the command prints, as a dict (``dapo_async.evaluate`` returns it)."""
    from dapo_async.config.paths import check_model_dirs
    from dapo_async.data.datasets import load_heldout
    from dapo_async.hub import resolve_model, resolve_paths
    from dapo_async.roles import set_threads

    cfg = resolve_paths(eval_config(args))
    args.model = resolve_model("--model", args.model or "")
    check_model_dirs(cfg, args.model)
    set_threads(cfg.launch.torch_threads)
    from transformers import AutoTokenizer

    from dapo_async.evaluation import eval_engine, evaluate_engine

    records = load_heldout(cfg.data, cfg.seed)
    model_dir = args.model or cfg.model.source_dir
    tok = AutoTokenizer.from_pretrained(model_dir)
    kind = cfg.eval.resolved_engine(cfg.generator)
    engine = eval_engine(cfg, model_dir, kind)

    def progress(done: int, total: int) -> None:
        bar = "#" * int(30 * done / max(total, 1))
        print(f"\r[eval] [{bar:<30}] {done}/{total}", end="", file=sys.stderr, flush=True)

    try:
        res = evaluate_engine(engine, tok, cfg, records, k=args.k, progress=progress)
    finally:
        if hasattr(engine, "close"):
            engine.close()
    print(file=sys.stderr)
    out = {
        "avg_at_k": res["eval/accuracy"],
        "pass_at_k": res["eval/pass_at_k"],
        "k": int(res["eval/k"]),
        "num_prompts": int(res["eval/num_prompts"]),
        "num_rows": int(res["eval/num_rows"]),  # rows of the file; repeats folded into prompts
        "temperature": cfg.eval.temperature,
        "response_len_mean": res["eval/response_len_mean"],
        "engine": kind,
        "data": cfg.data.eval_source or cfg.data.source,
        "per_source": _per_source(res),
    }
    return out


def _per_source(res: dict) -> dict:
    out: dict = {}
    for key, value in res.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[2] in ("accuracy", "pass_at_k"):
            name = "avg_at_k" if parts[2] == "accuracy" else "pass_at_k"
            out.setdefault(parts[1], {})[name] = value
    return out
