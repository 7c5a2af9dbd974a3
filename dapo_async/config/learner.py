"""The learner section of the config tree: optimisation, schedule, precision, parallelism."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_async.config.fields import BACKEND_CHOICES, DTYPE_CHOICES, Choice, F, _need


@dataclass
class LearnerConfig:
    num_steps: int = F(40, "Learner steps (policy versions) to train.", ge=1)
    num_ranks: int = F(1, "Learner ranks (torchrun nproc_per_node) for local runs.", ge=1)
    num_minibatches: int = F(2, "Gradient updates per rollout step (DAPO: several).", ge=1)
    micro_batch_tokens: int = F(4096, "Token budget of one forward/backward micro-batch.", ge=1)
    lr: float = F(2e-4, "AdamW learning rate after warm-up.", gt=0)
    warmup_steps: int = F(2, "Linear learning-rate warm-up, in learner steps.", ge=0)
    lr_min_ratio: float = F(
        0.0, "Floor of the linear and cosine schedules, as a fraction of lr.", ge=0, le=1
    )
    lr_schedule: str = Choice(
        "Learning rate after warm-up",
        "constant",
        constant="",
        linear="decay to lr × lr_min_ratio at num_steps",
        cosine="likewise, along a half cosine",
    )
    weight_decay: float = F(0.0, "AdamW weight decay (DAPO: 0.1 at scale).", ge=0)
    betas: list = F([0.9, 0.99], "AdamW betas.")
    grad_clip: float = F(1.0, "Global gradient-norm clip; 0 = off.", ge=0)
    time_budget_s: float = F(
        0.0,
        "Stop after the step that ends this many seconds after training started (the final "
        "checkpoint and evaluation follow), even before num_steps; 0 = num_steps only. For "
        "comparisons at equal wall-clock (bench ladder --async).",
        ge=0,
    )
    activation_checkpointing: bool = F(False, "Recompute activations in the backward pass.")
    checkpoint_every: int = F(0, "Save a checkpoint every N steps; 0 = only at the end.", ge=0)
    keep_checkpoints: int = F(2, "Number of newest checkpoints kept.", ge=1)
    eval_every: int = F(0, "Held-out evaluation every N steps; 0 = before and after only.", ge=0)
    eval_process: bool = F(
        True,
        "With eval_every: evaluations (before, periodic, after) run in an `evaluator` role "
        "(started by `train`) on the generators' engine, on weight snapshots the learner "
        "writes, off its critical path; false = on learner rank 0 between steps.",
    )
    backend: str = Choice(
        "torch.distributed backend of the training world",
        "auto",
        BACKEND_CHOICES,
        auto="nccl on CUDA, else gloo",
    )
    collective_timeout_s: float = F(
        1800.0,
        "Timeout of the training world's collectives: long enough for the rank-0-only work "
        "between them (checkpoint writes, held-out evaluation), short enough that a dead rank "
        "ends the run.",
        gt=0,
    )
    param_dtype: str = Choice(
        "Master weights and AdamW state", "float32", float32="keeps small updates", bfloat16=""
    )
    compute_dtype: str = Choice(
        "Forward/backward dtype (autocast; FSDP2 mixed precision)",
        "auto",
        DTYPE_CHOICES,
        auto="bfloat16 on CUDA and on CPUs with native bf16 matmuls (AVX512-BF16, AMX), "
        "else float32",
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
        ge=0,
    )
    lora_rank: int = F(
        0,
        "LoRA rank (peft): train low-rank adapters only; generators get merged weights. 0 = off.",
        ge=0,
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
        _need(
            len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
            f"{p}.betas",
            "must be two numbers in [0, 1)",
        )
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
