"""`dapo-async bench decoder`: the hf streaming decoder against its model's forward rate.

On the config's prompts (default: the long-tail workload), one process, ``launch.torch_threads``
threads, interleaved for ``--rounds`` rounds of ``--seconds`` each:

- ``stream_tokens_per_s_lean`` / ``_plain``: ``HFStream`` (drain-then-refill at
  ``generator.max_inflight``, the CPU default) with the lean decode step of
  ``engines/hf_decode.py`` and with transformers' forward; tokens sampled per second, prefills,
  sampling and bookkeeping included;
- ``forward_tokens_per_s_lean`` / ``_plain``: the ceiling — decode steps alone on a full batch
  of ``max_inflight`` rows over a KV cache of the prompts' length plus half of
  ``generator.max_tokens`` (rows × steps ÷ seconds; no sampling, no prefill, no row ever leaves),
  the lean one with the stream's ``generator.decode_matmul_dtype``;
- ``*_of_ceiling``: stream ÷ forward for each, and ``lean_speedup`` = lean ÷ plain stream;
- with ``generator.compiled_attention`` (on a CPU, the default), ``stream_tokens_per_s_torchattention``:
  the lean stream again with torch's attention over the padded cache (``engines/padded_kv.py``)
  instead of the C kernel over the slot cache (``engines/cpu_attention.py``,
  ``engines/slot_kv.py``), and ``attention_kernel_speedup`` = lean ÷ that.

A stream can beat its ceiling: rows leave the batch when they finish, so the tail of a drain
decodes fewer rows per step than the full batch the ceiling times.
"""

from __future__ import annotations

import argparse
import time

import torch

from dapo_async.bench.common import ensure_policy, print_result

DEFAULT_SECONDS = 4.0


def stream_rate(engine, prompts, params, width: int, seconds: float, lean: bool) -> float:
    """Tokens/s of an HFStream refilled to ``width`` sequences whenever it drains."""
    engine.lean_decode = lean
    s = engine.stream(16)
    i = tokens = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if s.num_inflight == 0:
            while s.num_inflight + params.n <= width:
                s.add_request(f"r{i}", prompts[i % len(prompts)], params)
                i += 1
        for _, comps in s.step():
            tokens += sum(len(c.tokens) for c in comps)
    return tokens / (time.monotonic() - t0)


@torch.no_grad()
def forward_rate(engine, width: int, context: int, seconds: float, lean: bool) -> float:
    """Rows × decode steps per second on a full batch, the cache ``context`` tokens long."""
    from dapo_async.engines.hf_decode import LeanDecode
    from dapo_async.engines.padded_kv import grow_in_place

    model = engine.model
    step = (
        LeanDecode(model, engine.decode_matmul_dtype, kernel=engine.decode_attention_kernel)
        if lean
        else None
    )
    ids_BT = torch.randint(3, model.config.vocab_size, (width, context), device=engine.device)
    steps, t_total = 0, 0.0
    while t_total < seconds:
        out = model(input_ids=ids_BT, use_cache=True)
        cache, mask_BT = out.past_key_values, torch.ones_like(ids_BT)
        grow_in_place(cache)
        token_B = ids_BT[:, -1]
        t0 = time.monotonic()
        for _ in range(32):
            mask_BT = torch.cat([mask_BT, mask_BT.new_ones((width, 1))], 1)
            pos_B1 = mask_BT.sum(-1, keepdim=True) - 1
            bias = torch.zeros(mask_BT.shape, dtype=model.dtype, device=engine.device)
            if step is not None:
                step(token_B, pos_B1, bias[:, None, None, :], cache)
            else:
                kw = dict(attention_mask=bias[:, None, None, :], position_ids=pos_B1)
                model(input_ids=token_B[:, None], past_key_values=cache, use_cache=True, **kw)
            steps += 1
        t_total += time.monotonic() - t0
    return steps * width / t_total


def run(cfg, seconds: float, rounds: int) -> dict:
    from dapo_async.bench.generator_bench import bench_prompts
    from dapo_async.generator.build import engine_for, sampling_params

    engine = engine_for(cfg, cfg.model.source_dir)
    prompts, _ = bench_prompts(cfg)
    params = sampling_params(cfg)
    width = cfg.generator.inflight_target
    context = sum(map(len, prompts)) // len(prompts) + params.max_tokens // 2
    kernel = engine.decode_attention_kernel
    sums = {k: 0.0 for k in ("stream_lean", "stream_plain", "forward_lean", "forward_plain")}
    if kernel:  # the lean step again with torch's attention: what the C kernel buys
        sums["stream_torchattention"] = 0.0
    for lean in (True, False):  # warm-up: first-call costs
        stream_rate(engine, prompts, params, width, 0.5, lean)
    for _ in range(rounds):
        for lean, name in ((True, "lean"), (False, "plain")):
            sums[f"stream_{name}"] += stream_rate(engine, prompts, params, width, seconds, lean)
            sums[f"forward_{name}"] += forward_rate(engine, width, context, seconds / 2, lean)
        if kernel:
            engine.decode_attention_kernel = False
            sums["stream_torchattention"] += stream_rate(
                engine, prompts, params, width, seconds, True
            )
            engine.decode_attention_kernel = True
    out = {f"{k.split('_')[0]}_tokens_per_s_{k.split('_')[1]}": v / rounds for k, v in sums.items()}
    if kernel:
        out["attention_kernel_speedup"] = (
            out["stream_tokens_per_s_lean"] / out["stream_tokens_per_s_torchattention"]
        )
    for name in ("lean", "plain"):
        out[f"stream_of_ceiling_{name}"] = (
            out[f"stream_tokens_per_s_{name}"] / out[f"forward_tokens_per_s_{name}"]
        )
    out["lean_speedup"] = out["stream_tokens_per_s_lean"] / out["stream_tokens_per_s_plain"]
    out.update(
        width=width, context=context, threads=torch.get_num_threads(), rounds=rounds,
        model=cfg.model.source_dir,
        matmul_dtype=str(engine.decode_matmul_dtype or engine.model.dtype),
    )  # fmt: skip
    return out


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config
    from dapo_async.roles import set_threads

    cfg = load_config(args.config, list(args.overrides))
    if cfg.generator.engine != "hf":
        raise SystemExit("bench decoder: measures the hf engine's decoder (generator.engine=hf)")
    set_threads(cfg.launch.torch_threads)
    ensure_policy(cfg)
    r = run(cfg, args.seconds or DEFAULT_SECONDS, args.rounds)
    return print_result(
        f"hf stream decoder ({r['threads']} thread(s), {r['width']} rows): lean "
        f"{r['stream_tokens_per_s_lean']:.0f} tok/s ({r['stream_of_ceiling_lean']:.2f} of its "
        f"forward's {r['forward_tokens_per_s_lean']:.0f}), transformers forward "
        f"{r['stream_tokens_per_s_plain']:.0f} tok/s ({r['stream_of_ceiling_plain']:.2f} of "
        f"{r['forward_tokens_per_s_plain']:.0f}); lean ×{r['lean_speedup']:.2f}"
        + (
            f"; its attention in C ×{r['attention_kernel_speedup']:.2f} (torch's products "
            f"{r['stream_tokens_per_s_torchattention']:.0f} tok/s)"
            if "attention_kernel_speedup" in r
            else ""
        ),
        r,
        args.json,
    )
