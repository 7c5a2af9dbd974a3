"""Synthetic scored groups and a Trainer builder for learner tests (no buffer, no generator)."""

import numpy as np
import torch

from dapo_async import protocol as P
from dapo_async.config import load_config

# Token ids the synthetic groups draw from: printable characters of the tiny vocabulary.
TOKEN_RANGE = (10, 60)


def synthetic_groups(seed: int, num_groups: int, g: int = 4, max_len: int = 12) -> list[P.Group]:
    """Groups with random prompts/responses, mixed rewards and plausible behaviour log-probs."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num_groups):
        lens = rng.integers(3, max_len + 1, size=g).astype(np.int32)
        t = int(lens.sum())
        acc = rng.integers(0, 2, size=g).astype(np.float32)
        acc[0], acc[1] = 1.0, 0.0  # every group has a best and a worst response
        out.append(
            P.Group(
                generator_id="synthetic",
                seq=seed * 1000 + i,
                prompt_id=seed * 1000 + i,
                prompt_tokens=rng.integers(*TOKEN_RANGE, size=int(rng.integers(4, 9))).astype(
                    np.int32
                ),
                response_lens=lens,
                tokens=rng.integers(*TOKEN_RANGE, size=t).astype(np.int32),
                logprobs=rng.uniform(-4.5, -3.5, size=t).astype(np.float32),
                versions=np.zeros(t, np.int32),
                rewards=np.where(acc > 0, 1.0, -1.0).astype(np.float32),
                acc=acc,
                components=np.zeros((g, 1), np.float32),
                finish=np.zeros(g, np.uint8),
            )
        )
    return out


def aligned_shard(groups: list, rank: int, world: int, num_minibatches: int) -> list:
    """Rank ``rank``'s shard such that its k-th mini-batch holds its part of the full batch's
    k-th mini-batch (mini-batches are contiguous slices of each rank's shard)."""
    per_mb = len(groups) // num_minibatches
    per_rank = per_mb // world
    out = []
    for k in range(num_minibatches):
        base = k * per_mb + rank * per_rank
        out.extend(groups[base : base + per_rank])
    return out


def make_config(*overrides: str):
    return load_config(
        None,
        [
            "learner.lr=1e-3",
            "learner.warmup_steps=0",
            "learner.num_minibatches=2",
            "learner.micro_batch_tokens=160",
            "generator.max_tokens=12",
            "reward.overlong_shaping=false",
            *overrides,
        ],
    )


def build_trainer(model_dir, cfg, rank=0, world=1, ref=False, dtype=torch.float32, device="cpu"):
    from transformers import AutoModelForCausalLM

    from dapo_async.devices import resolve_dtype
    from dapo_async.learner.parallel import Parallel
    from dapo_async.learner.trainer import Trainer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    if cfg.learner.lora_rank:
        from dapo_async.learner.lora import apply_lora

        model = apply_lora(model, cfg.learner)
    model.to(device)
    ref_model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype) if ref else None
    if ref_model is not None:
        ref_model.to(device)
    par = Parallel(
        model,
        rank,
        world,
        fsdp=cfg.learner.fsdp,
        activation_checkpointing=cfg.learner.activation_checkpointing,
        compute_dtype=resolve_dtype(cfg.learner.compute_dtype, "cpu"),
        logprob_chunk_tokens=cfg.learner.logprob_chunk_tokens,
    )
    g = cfg.generator
    return Trainer(
        par,
        cfg.algo,
        cfg.learner,
        pad_id=0,
        temperature=g.temperature,
        max_tokens=g.max_tokens,
        ref_model=ref_model,
    )


def max_rel_err(a: dict, b: dict) -> float:
    """The largest per-tensor relative difference ‖a − b‖ / ‖b‖."""
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).norm() / b[k].norm().clamp(min=1e-12)).item() for k in a)
