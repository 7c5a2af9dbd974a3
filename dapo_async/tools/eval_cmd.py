"""`dapo-async eval --model DIR --data FILE [--k N]`: avg@k and pass@k on held-out prompts, with
a progress bar on stderr; ``--json`` ends with one JSON line. Same code as the learner's
periodic evaluation (``dapo_async.evaluation``)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config
    from dapo_async.data.datasets import load_source
    from dapo_async.roles import set_threads

    set_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_async.evaluation import evaluate_records

    cfg = load_config(None)
    temp = args.temperature if args.temperature is not None else (0.0 if args.k == 1 else 1.0)
    cfg = replace(
        cfg, generator=replace(cfg.generator, eval_temperature=temp, max_tokens=args.max_tokens)
    )
    cfg = replace(
        cfg,
        reward=replace(
            cfg.reward,
            overlong_max_len=args.max_tokens,
            overlong_cache_len=max(1, args.max_tokens // 5),
        ),
    )
    records = load_source(
        args.data, "eval", args.num_prompts, args.difficulty, cfg.seed, args.max_difficulty
    )
    model = AutoModelForCausalLM.from_pretrained(args.model)
    tok = AutoTokenizer.from_pretrained(args.model)

    def progress(done: int, total: int) -> None:
        bar = "#" * int(30 * done / max(total, 1))
        print(f"\r[eval] [{bar:<30}] {done}/{total}", end="", file=sys.stderr, flush=True)

    res = evaluate_records(model, tok, cfg, records, k=args.k, progress=progress)
    print(file=sys.stderr)
    out = {
        "avg_at_k": res["eval/accuracy"],
        "pass_at_k": res["eval/pass_at_k"],
        "k": int(res["eval/k"]),
        "num_prompts": int(res["eval/num_prompts"]),
        "temperature": temp,
        "response_len_mean": res["eval/response_len_mean"],
    }
    print(
        f"avg@{out['k']} {out['avg_at_k']:.4f}  pass@{out['k']} {out['pass_at_k']:.4f}  on {out['num_prompts']} prompts",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps(out))
    return 0
