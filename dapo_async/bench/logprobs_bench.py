"""`dapo-async bench logprobs`: peak memory of the learner's log-prob path on one long response,
three ways, each in a fresh process (its peak resident memory, minus what the model and a warm-up
already took):

- ``full_logits``: the causal LM's own forward (``[B, L, V]`` fp32 logits for every position,
  prompt included), then log-softmax, gather and entropy — what the learner did before;
- ``unchunked``: ``ResponseLogProbs`` with every response position at once;
- ``chunked``: ``ResponseLogProbs`` with ``--chunk`` positions at a time (checkpointed).

Each runs forward and backward (the training path) with entropy, on a one-layer Llama with a large
vocabulary and random weights (built here, nothing downloaded). The log-probs of the three agree;
the JSON line has each peak in MiB and the ratios.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import torch

from dapo_async.bench.common import print_result

VARIANTS = ("full_logits", "unchunked", "chunked")
# The model: a large vocabulary (Qwen2.5's is 151,936; 32,768 keeps the full-logits variant
# inside a laptop's memory at 8k tokens) and a small body, so the head dominates as at scale.
HIDDEN = 256
PROMPT_TOKENS = 256
WARMUP_TOKENS = 8


def _model(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=PROMPT_TOKENS + (1 << 16),
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


def _run(model, variant: str, response_tokens: int, chunk: int) -> torch.Tensor:
    """Forward + backward of one row (prompt + response); returns the detached log-probs."""
    from dapo_async.algo.entropy import entropy_from_logits
    from dapo_async.learner.logprobs import ResponseLogProbs, logprobs_from_full_logits

    g = torch.Generator().manual_seed(1)
    ids_BL = torch.randint(
        0, model.config.vocab_size, (1, PROMPT_TOKENS + response_tokens), generator=g
    )
    attn_BL = torch.ones_like(ids_BL)
    start_B = torch.tensor([PROMPT_TOKENS])
    len_B = torch.tensor([response_tokens])
    if variant == "full_logits":
        logits_BLV = model(input_ids=ids_BL, attention_mask=attn_BL).logits.float()
        logp_BT = logprobs_from_full_logits(logits_BLV, ids_BL, start_B, len_B, response_tokens)
        with torch.no_grad():
            ent_BT = entropy_from_logits(logits_BLV[:, PROMPT_TOKENS - 1 : -1])
    else:
        policy = ResponseLogProbs(model, chunk if variant == "chunked" else 0)
        logp_BT, ent_BT = policy(ids_BL, attn_BL, start_B, len_B, response_tokens, 1.0, "metric")
    assert ent_BT is not None and ent_BT.shape == logp_BT.shape
    logp_BT.sum().backward()
    model.zero_grad(set_to_none=True)
    return logp_BT.detach()


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def measure(variant: str, response_tokens: int, vocab: int, chunk: int) -> dict:
    """In this process: the variant's peak memory above the model and a small warm-up."""
    torch.set_num_threads(1)
    model = _model(vocab)
    _run(model, variant, WARMUP_TOKENS, chunk)
    base = _peak_mib()
    logp = _run(model, variant, response_tokens, chunk)
    return {"peak_mib": _peak_mib() - base, "logp_sum": float(logp.double().sum())}


def measure_in_subprocess(variant: str, response_tokens: int, vocab: int, chunk: int) -> dict:
    cmd = [sys.executable, "-m", __name__, variant, str(response_tokens), str(vocab), str(chunk)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"bench logprobs {variant} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(args: argparse.Namespace) -> int:
    n, vocab, chunk = args.response_tokens, args.vocab, args.chunk
    got = {v: measure_in_subprocess(v, n, vocab, chunk) for v in VARIANTS}
    sums = [got[v]["logp_sum"] for v in VARIANTS]
    agree = max(sums) - min(sums) <= 1e-3 * max(1.0, abs(sums[0]))
    out = {
        "response_tokens": n,
        "vocab": vocab,
        "chunk": chunk,
        **{f"{v}_peak_mib": round(got[v]["peak_mib"], 1) for v in VARIANTS},
        "chunked_vs_full_logits": round(
            got["full_logits"]["peak_mib"] / max(got["chunked"]["peak_mib"], 1.0), 2
        ),
        "chunked_vs_unchunked": round(
            got["unchunked"]["peak_mib"] / max(got["chunked"]["peak_mib"], 1.0), 2
        ),
        "logprobs_agree": agree,
    }
    summary = (
        f"[bench logprobs] {n} response tokens, vocab {vocab}: peak "
        + ", ".join(f"{v} {out[f'{v}_peak_mib']:.0f} MiB" for v in VARIANTS)
        + f"; log-probs agree: {agree}"
    )
    return print_result(summary, out, args.json)


if __name__ == "__main__":
    variant, tokens, vocab, chunk = sys.argv[1], *map(int, sys.argv[2:5])
    print(json.dumps(measure(variant, tokens, vocab, chunk)))
