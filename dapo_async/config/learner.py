"""The learner section of the config tree: optimisation, schedule, precision, parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_async.config.fields import F, _choice, _need


@dataclass
class LearnerConfig:
    num_steps: int = F(40, "Learner steps (policy versions) to train.")
    num_ranks: int = F(1, "Learner ranks (torchrun nproc_per_node) for local runs.")
    num_minibatches: int = F(2, "Gradient updates per rollout step (DAPO: several).")
    micro_batch_tokens: int = F(4096, "Token budget of one forward/backward micro-batch.")
    lr: float = F(2e-4, "AdamW learning rate after warm-up.")
    weight_decay: float = F(0.0, "AdamW weight decay (DAPO: 0.1 at scale).")
    betas: list = F([0.9, 0.99], "AdamW betas.")
    grad_clip: float = F(1.0, "Global gradient-norm clip; 0 = off.")
    warmup_steps: int = F(2, "Linear learning-rate warm-up, in learner steps.")
    lr_schedule: str = F(
        "constant",
        "Learning rate after warm-up: constant | linear (decay to lr × lr_min_ratio at "
        "num_steps) | cosine (likewise, along a half cosine).",
    )
    lr_min_ratio: float = F(0.0, "Floor of the linear and cosine schedules, as a fraction of lr.")
    time_budget_s: float = F(
        0.0,
        "Stop after the step that ends this many seconds after training started (the final "
        "checkpoint and evaluation follow), even before num_steps; 0 = num_steps only. For "
        "comparisons at equal wall-clock (bench ladder --async).",
    )
    activation_checkpointing: bool = F(False, "Recompute activations in the backward pass.")
    checkpoint_every: int = F(0, "Save a checkpoint every N steps; 0 = only at the end.")
    keep_checkpoints: int = F(2, "Number of newest checkpoints kept.")
    eval_every: int = F(0, "Held-out evaluation every N steps; 0 = before and after only.")
    eval_process: bool = F(
        True,
        "Periodic evaluations (eval_every) run in an `evaluator` role (started by `train`) on "
        "weight snapshots the learner writes, off its critical path; false = on learner rank 0 "
        "between steps.",
    )
    backend: str = F("auto", "torch.distributed backend: auto | gloo | nccl.")
    collective_timeout_s: float = F(
        1800.0,
        "Timeout of the training world's collectives: long enough for the rank-0-only work "
        "between them (checkpoint writes, held-out evaluation), short enough that a dead rank "
        "ends the run.",
    )
    param_dtype: str = F(
        "float32", "Master weights and AdamW state: float32 (keeps small updates) | bfloat16."
    )
    compute_dtype: str = F(
        "auto",
        "Forward/backward dtype (autocast; FSDP2 mixed precision): auto (bfloat16 on "
        "CUDA, float32 on CPU) | float32 | bfloat16.",
    )
    pack_sequences: bool = F(
        False,
        "Pack each micro-batch's responses into one row (position ids restart per response, "
        "block-diagonal attention): no padding is computed; micro_batch_tokens then bounds "
        "the sum of the lengths. `bench packing` measures the gain.",
    )
    logprob_chunk_tokens: int = F(
        1024,
        "Response positions per chunk when computing log-probs and entropy from hidden states "
        "(full-vocabulary logits exist for one chunk at a time); 0 = all at once.",
    )
    lora_rank: int = F(
        0, "LoRA rank (peft): train low-rank adapters only; generators get merged weights. 0 = off."
    )
    lora_alpha: float = F(16.0, "LoRA alpha (the adapters' scale is alpha / rank).")
    lora_target_modules: list = F(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        "Module names that get LoRA adapters.",
    )
    fsdp: bool = F(
        False, "Shard parameters, gradients and optimizer state with FSDP2 instead of DDP."
    )

    def check(self, p: str) -> None:
        _need(self.num_steps >= 1, f"{p}.num_steps", "must be >= 1")
        _need(self.num_ranks >= 1, f"{p}.num_ranks", "must be >= 1")
        _need(self.num_minibatches >= 1, f"{p}.num_minibatches", "must be >= 1")
        _need(self.micro_batch_tokens >= 1, f"{p}.micro_batch_tokens", "must be >= 1")
        _need(self.lr > 0, f"{p}.lr", "must be > 0")
        _need(self.weight_decay >= 0, f"{p}.weight_decay", "must be >= 0")
        _need(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            f"{p}.betas",
            "must be two numbers in [0, 1)",
        )
        _need(self.grad_clip >= 0, f"{p}.grad_clip", "must be >= 0")
        _need(self.warmup_steps >= 0, f"{p}.warmup_steps", "must be >= 0")
        _choice(self.lr_schedule, ("constant", "linear", "cosine"), f"{p}.lr_schedule")
        _need(0 <= self.lr_min_ratio <= 1, f"{p}.lr_min_ratio", "must be in [0, 1]")
        _need(self.time_budget_s >= 0, f"{p}.time_budget_s", "must be >= 0 (0 = off)")
        _need(self.checkpoint_every >= 0, f"{p}.checkpoint_every", "must be >= 0")
        _need(self.keep_checkpoints >= 1, f"{p}.keep_checkpoints", "must be >= 1")
        _need(self.eval_every >= 0, f"{p}.eval_every", "must be >= 0")
        _choice(self.backend, ("auto", "gloo", "nccl"), f"{p}.backend")
        _need(self.collective_timeout_s > 0, f"{p}.collective_timeout_s", "must be > 0")
        _choice(self.param_dtype, ("float32", "bfloat16"), f"{p}.param_dtype")
        _choice(self.compute_dtype, ("auto", "float32", "bfloat16"), f"{p}.compute_dtype")
        _need(self.lora_rank >= 0, f"{p}.lora_rank", "must be >= 0 (0 = off)")
        _need(
            not (self.lora_rank and self.fsdp),
            f"{p}.lora_rank",
            "LoRA with learner.fsdp is not supported yet (use DDP: learner.fsdp=false)",
        )
        _need(
            not self.lora_rank or bool(self.lora_target_modules),
            f"{p}.lora_target_modules",
            "must name at least one module",
        )
        _need(self.logprob_chunk_tokens >= 0, f"{p}.logprob_chunk_tokens", "must be >= 0")
