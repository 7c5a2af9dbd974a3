"""The config tree: one dataclass per section (model, data, generator, reward, buffer, algo,
learner, eval, weight_sync, tracking, launch) under ``RunConfig``. Every field documents itself
(``metadata["doc"]``) and the values it accepts (``F(..., ge=1)``, checked by ``check_fields``); a
section's ``check`` holds only the rules that involve several fields. Errors name the key."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from dapo_async.config.fields import (
    BACKEND_CHOICES,
    DTYPE_CHOICES,
    Choice,
    F,
    S,
    _need,
    check_fields,
)
from dapo_async.config.launch import LaunchConfig
from dapo_async.config.learner import LearnerConfig
from dapo_async.config.rollout import EvalConfig, GeneratorConfig, RewardConfig, check_eval_fits
from dapo_async.config.tracking import TrackingConfig

__all__ = [
    "EvalConfig",
    "GeneratorConfig",
    "LaunchConfig",
    "LearnerConfig",
    "RewardConfig",
    "TrackingConfig",
]  # with the sections defined here


@dataclass
class ModelConfig:
    path: str = F(
        "",
        "The policy: an HF causal-LM directory or a Hub id (`org/name`, `org/name@revision`; "
        "through the HF cache, HF_HUB_OFFLINE honoured); empty = the built-in tiny model.",
    )
    tiny_dir: str = F(".cache/tiny", "Where `init-tiny` builds and caches the built-in tiny model.")
    tiny_seed: int = F(
        0,
        "Init seed of the built-in tiny model (weights and warm-start data), separate from the "
        "run's `seed`; a different value builds a different model (use its own tiny_dir).",
    )
    reference_path: str = F("", "Frozen reference model for KL; empty = the initial policy.")

    @property
    def source_dir(self) -> str:
        """The policy's HF directory: ``path``, or the built-in tiny model's ``tiny_dir``."""
        return self.path or self.tiny_dir


@dataclass
class DataConfig:
    source: str = F(
        "tiny:arith",
        "Training prompts: `tiny:<task>` (built-in synthetic task: arith | chain | calc, the "
        "last multi-turn with a calculator tool: `generator.rollout=dapo_async.tiny.calc:rollout`), a "
        ".parquet/.jsonl file in the DAPO-Math-17K schema, or a Hugging Face dataset id "
        "(`org/name`, `org/name@revision`, `org/name:file.parquet`; through the HF cache).",
        nonempty=True,
    )
    eval_source: str = F("", "Held-out prompts (same forms as `source`); empty = the task's split.")
    sources: dict = F(
        {},
        "Weighted training mixture {source: weight, …} (each source as in `source`); when set "
        "it replaces `source`, and each lease draws a source in proportion to its weight.",
    )
    dedupe: bool = F(
        False,
        "Train on each distinct (prompt, answer) of a data file once (DAPO-Math-17k repeats each "
        "of its prompts about 100 times; the buffer says so when it loads one).",
    )
    num_train: int = F(4096, "Number of generated training prompts (built-in tasks only).", gt=0)
    num_eval: int = F(256, "Number of generated held-out prompts (built-in tasks only).", gt=0)
    eval_seed: int = F(
        0,
        "Seed of a built-in task's held-out sample: fixed, so runs that differ in `seed` are "
        "scored on the same prompts; -1 = the run's `seed`.",
        ge=-1,
    )
    difficulty: int = F(
        2, "Built-in tasks: number of digits per operand (arith) or steps (chain).", ge=1, le=12
    )
    max_difficulty: int = F(
        0,
        "Built-in tasks: if above `difficulty`, each prompt's difficulty is drawn uniformly from "
        "[difficulty, max_difficulty] (mixed response lengths); 0 = `difficulty` only.",
    )
    prompt_format: str = Choice(
        "How a prompt's messages become tokens",
        "chat",
        chat="the tokenizer's own chat template",
        raw="message contents joined, no template: base models",
    )
    system_prompt: str = F("", "System message put before each prompt that has none; empty = none.")
    chat_template_kwargs: dict = F(
        {}, "Extra variables for the chat template (e.g. {enable_thinking: false})."
    )
    max_prompt_len: int = F(64, "Prompts longer than this many tokens are filtered out.", gt=0)
    shuffle_seed: int = F(0, "Seed of the deterministic per-epoch prompt shuffle.")

    def check(self, p: str) -> None:
        _need(
            self.max_difficulty == 0 or self.difficulty <= self.max_difficulty <= 12,
            f"{p}.max_difficulty",
            "must be 0 or in [difficulty, 12]",
        )
        for src, w in self.sources.items():
            _need(
                isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0,
                f"{p}.sources",
                f"the weight of {src!r} must be a number > 0",
            )


@dataclass
class BufferConfig:
    port: int = F(0, "Buffer ROUTER port; 0 = pick a free port (local runs).", ge=0, le=65535)
    groups_per_step: int = F(16, "Groups (prompts) in one learner step's global batch.", ge=1)
    max_staleness: int = F(
        1, "Tokens trained at version v come from weights >= v - max_staleness.", ge=0
    )
    dynamic_sampling: bool = F(True, "Drop groups whose filter metric has zero variance (DAPO).")
    filter_metric: str = Choice(
        "Metric of the dynamic-sampling filter", "acc", acc="accuracy", score="reward score"
    )
    min_group_acc: float = F(
        0.0, "Band-pass: keep groups with accuracy >= this (0 = off).", ge=0, le=1
    )
    max_group_acc: float = F(1.0, "Band-pass: keep groups with accuracy <= this (1 = off).")
    max_buffered_groups: int = F(
        4096, "Memory bound: generators are told to wait beyond this.", ge=1
    )
    admit_expected: bool = F(
        True,
        "Admission counts an outstanding lease as the share of the last groups_per_step groups "
        "that passed dynamic sampling, not as one: with most groups all-correct, counting each "
        "as one lets the generators start a few groups a step and the learner waits.",
    )
    wal: bool = F(
        True,
        "Keep a write-ahead log of accepted, not yet trained groups (a killed buffer restarts "
        "from it and loses nothing it acknowledged).",
    )
    lease_timeout_s: float = F(30.0, "Leases of a generator silent this long are re-issued.", gt=0)
    lease_deadline_s: float = F(
        900.0,
        "A lease not answered this long after its grant is re-issued even while its generator "
        "heartbeats (a stuck or hoarding generator); longer than the slowest group takes. "
        "0 = off.",
        ge=0,
    )
    max_leases_per_generator: int = F(
        0,
        "Outstanding leases one generator may hold; 0 = twice the prompts it keeps in flight "
        "(generator.prompts_per_batch, or max_inflight / responses_per_prompt).",
        ge=0,
    )
    stall_reissue_s: float = F(
        120.0,
        "Watchdog: when the learner has waited this long for a step, leases held this long "
        "are re-issued to other generators (counted in buffer/lease_stalled). 0 = off.",
        ge=0,
    )

    def check(self, p: str) -> None:
        _need(
            self.min_group_acc <= self.max_group_acc <= 1,
            f"{p}.max_group_acc",
            "must be in [min_group_acc, 1]",
        )


@dataclass
class AlgoConfig:
    objective: str = Choice(
        "The RL objective (docs/algorithms.md)", "dapo", ("dapo", "grpo", "ppo_kl", "dpo")
    )
    clip_low: float = F(0.2, "ε_low: lower clip of the ratio, 1 - ε_low.", ge=0, lt=1)
    clip_high: float = F(0.28, "ε_high: upper clip of the ratio, 1 + ε_high (clip-higher).", ge=0)
    dual_clip: float = F(0.0, "Dual-clip constant c (> 1) for negative advantages; 0 = off.")
    loss_agg: str = Choice(
        "Loss aggregation over tokens and sequences (docs/algorithms.md)",
        "token-mean",
        ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"),
    )
    adv_norm_std: bool = F(True, "Divide group advantages by the std (False = Dr. GRPO).")
    entropy_coef: float = F(
        0.0,
        "Entropy bonus: coef × token-mean policy entropy is subtracted from the loss (dapo, "
        "grpo, ppo_kl; DAPO uses none); 0 = off.",
        ge=0,
    )
    adv_eps: float = F(1e-6, "ε in (R - mean) / (std + ε).", gt=0)
    is_cap: float = F(
        2.0, "C: cap of the behaviour importance weight min(π_prox/π_behav, C).", gt=0
    )
    is_mask_low: float = F(
        0.0, "Mask tokens whose importance weight is below this (0 = off).", ge=0
    )
    is_mask_high: float = F(0.0, "Mask tokens whose importance weight is above this (0 = off).")
    seq_mask_low: float = F(
        0.0, "Sequence geometric-mean weight mask, lower bound (0 = off).", ge=0
    )
    seq_mask_high: float = F(0.0, "Sequence geometric-mean weight mask, upper bound (0 = off).")
    bypass: bool = F(
        False, "Bypass mode: proximal log-probs := behaviour log-probs (no recompute)."
    )
    overlong_filter: bool = F(False, "Mask the loss of truncated responses.")
    kl_coef: float = F(0.0, "KL-to-reference penalty coefficient (ppo_kl; 0 for DAPO).", ge=0)
    kl_estimator: str = Choice("KL estimator (Schulman's)", "k3", ("k1", "k2", "k3"))
    dpo_beta: float = F(0.1, "β of online DPO on the best/worst pair of each group.", gt=0)
    dpo_reference: str = Choice(
        "DPO reference log-probs",
        "behaviour",
        behaviour="the engine's, on-policy",
        model="frozen reference",
    )
    track_kl_ref: bool = F(
        False, "Load the reference model and report train/kl_ref even without a KL penalty."
    )
    norm_len: int = F(0, "Constant divisor of seq-mean-token-sum-norm; 0 = max_tokens.", ge=0)

    def check(self, p: str) -> None:
        _need(
            self.kl_coef == 0 or self.objective == "ppo_kl",
            f"{p}.kl_coef",
            f"a KL penalty is part of objective 'ppo_kl', not {self.objective!r} "
            "(set algo.track_kl_ref=true to only measure the KL)",
        )
        _need(self.dual_clip == 0 or self.dual_clip > 1, f"{p}.dual_clip", "must be 0 or > 1")
        _need(
            self.is_mask_high == 0 or self.is_mask_high > self.is_mask_low,
            f"{p}.is_mask_high",
            "must be 0 or > is_mask_low",
        )
        _need(
            self.seq_mask_high == 0 or self.seq_mask_high > self.seq_mask_low,
            f"{p}.seq_mask_high",
            "must be 0 or > seq_mask_low",
        )


@dataclass
class WeightSyncConfig:
    mode: str = Choice(
        "Transport",
        "auto",
        auto="shm when `dapo-async train` runs every role on one host and the generators have "
        "no GPU of their own (CPU, or one shared GPU), dist otherwise",
        dist="torch.distributed group (gloo; NCCL between GPUs)",
        shm="shared memory on one host: buckets in /dev/shm, one copy in, one copy out",
        disk="safetensors files",
    )
    shm_slots: str = Choice(
        "shm mode: where the two weight slots live",
        "auto",
        auto="cuda when `dapo-async train` puts the generators on the learner's GPU, else host",
        host="files in /dev/shm; the weights pass through host memory",
        cuda="on the learner's GPU, opened by the generators through CUDA IPC (device to "
        "device; they must see that GPU)",
    )
    endpoint: str = F(
        "",
        "host:port of learner rank 0's weight-sync store, for generators on other hosts; "
        "empty = read <run_dir>/endpoints/wsync.",
    )
    port: int = F(
        0,
        "Port of the weight-sync store learner rank 0 hosts on launch.host; 0 = a free port.",
        ge=0,
        le=65535,
    )
    allow_unauthenticated_network: bool = F(
        False,
        "Without CurveZMQ keys (launch.auth=false and no launch.curve_keys_dir), dist mode "
        "binds the weight-sync store beyond loopback only with this set (use a private "
        "network, or mode=disk). With keys the store is authenticated and needs no opt-in.",
    )
    backend: str = Choice(
        "dist mode's backend",
        "auto",
        BACKEND_CHOICES,
        auto="NCCL where the process has a GPU, else gloo",
    )
    wire_dtype: str = Choice(
        "dist mode: dtype the weights travel and are staged in",
        "auto",
        DTYPE_CHOICES,
        auto="= generator.dtype",
        bfloat16="half the bytes of float32",
    )
    bucket_mb: int = F(64, "Size of one flat transfer bucket in MiB.", ge=1)
    timeout_s: float = F(60.0, "Timeout of every weight-sync collective.", gt=0)
    form_timeout_s: float = F(
        10.0,
        "dist mode: how long forming a new group (every member connecting to every other) may "
        "take. Receivers form from a thread of their own the moment an epoch is announced, so "
        "this bounds what a member that died since costs the others (a few heartbeats), not "
        "how long a generator takes to reach its next poll.",
        gt=0,
    )


@dataclass
class RunConfig:
    name: str = F("tiny-dapo", "Run name; also the default Aim experiment.", nonempty=True)
    seed: int = F(0, "Global seed (model init, sampling, shuffles).")
    run_dir: str = F(
        "",
        "Run directory; empty = runs/<name>-<YYYYmmdd-HHMMSS> for `train` (a role started on "
        "its own uses runs/<name>).",
    )
    model: ModelConfig = S(ModelConfig, "The policy model.")
    data: DataConfig = S(DataConfig, "Prompt data.")
    generator: GeneratorConfig = S(GeneratorConfig, "Generators and their inference engine.")
    reward: RewardConfig = S(RewardConfig, "Reward functions.")
    buffer: BufferConfig = S(BufferConfig, "The replay buffer (data plane).")
    algo: AlgoConfig = S(AlgoConfig, "The RL objective.")
    learner: LearnerConfig = S(LearnerConfig, "The learner ranks and optimisation.")
    eval: EvalConfig = S(EvalConfig, "Held-out evaluation (when: learner.eval_every).")
    weight_sync: WeightSyncConfig = S(WeightSyncConfig, "Learner → generator weight transfer.")
    tracking: TrackingConfig = S(TrackingConfig, "Metrics and logging.")
    launch: LaunchConfig = S(LaunchConfig, "Processes, addresses and security.")

    def check(self) -> None:
        """Every field's declared rule (``F(..., ge=…)``), then each section's rules that
        involve several of its fields (its ``check``), then the rules across sections."""
        check_fields(self, "")
        for f in dataclasses.fields(self):
            sub = getattr(self, f.name)
            if dataclasses.is_dataclass(sub):
                check_fields(sub, f.name)
                if hasattr(sub, "check"):
                    sub.check(f.name)
        self._check_lengths()
        self._check_spares()

    def _check_spares(self) -> None:
        """Spare generators borrow the learner's core in-process threads cannot see otherwise."""
        lc = self.launch
        if not lc.spare_generators:
            return
        _need(
            self.generator.engine == "hf",
            "launch.spare_generators",
            "needs generator.engine=hf (a vLLM generator decodes in its own worker processes)",
        )
        _need(
            not lc.share_cores,
            "launch.spare_generators",
            "and launch.share_cores both lend the learner's core: pick one",
        )

    def _check_lengths(self) -> None:
        """Lengths that must agree across sections (after ``overlong_max_len`` is derived)."""
        g, r = self.generator, self.reward
        _need(
            not r.overlong_shaping or r.overlong_max_len == g.max_tokens,
            "reward.overlong_max_len",
            f"is {r.overlong_max_len} but generator.max_tokens is {g.max_tokens}: DAPO's L_max is "
            "the generation limit (a longer correct answer would be punished); set it equal, or "
            "0 to derive it",
        )
        total = self.data.max_prompt_len + g.max_tokens
        _need(
            total <= g.max_model_len,
            "generator.max_model_len",
            f"is {g.max_model_len} but data.max_prompt_len + generator.max_tokens = "
            f"{self.data.max_prompt_len} + {g.max_tokens} = {total} must fit in it",
        )
        check_eval_fits(self)

    @property
    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir or os.path.join("runs", self.name))
