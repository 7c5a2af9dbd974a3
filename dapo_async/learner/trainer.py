"""One learner rank's optimisation: proximal recompute, K mini-batch updates, version bump.

Call order per step (every rank):

    rows = groups_to_rows(shard)                       advantages per group
    split rows into K mini-batches, each into token-bounded micro-batches; pad every mini-batch
        to the global maximum number of micro-batches with empty ones (FSDP2 forwards are collective)
    prox = forward(no grad, weights at step start)    mini-batches 2..K only; skipped in bypass
        mode. The first mini-batch's updates run on the step-start weights, so its proximal
        log-probs are its own forward's, detached (r_t = 1 exactly): one forward pass fewer
        per step (1/K of the batch), unless the model has dropout (train ≠ eval forward)
    ref  = reference forward (no grad)                 only when a reference model is loaded
    for each of K mini-batches:
        all-reduce the mini-batch's token/sequence counts (global denominators)
        for each micro-batch: forward → loss (global token-mean) → backward (gradients are
            reduced on the last micro-batch only)
        clip grad norm → AdamW step
    LR schedule step; version += 1

DDP and FSDP2 average gradients over ranks, so each rank's loss is multiplied by the world size:
with global denominators the result is the gradient of the whole global batch. The online-DPO
objective (``algo.objective=dpo``) takes the best and the worst response of every group as a
pair and follows the same mini-batch / micro-batch / padding structure with pairs as the unit.
What differs between objectives — the loss, its denominators, its unit, which passes it needs —
is the objective's (``algo/objectives/``); this loop only asks it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from functools import partial

import numpy as np
import torch

from dapo_async.algo.objectives import make_objective
from dapo_async.algo.schedules import lr_multiplier
from dapo_async.config import AlgoConfig, LearnerConfig
from dapo_async.learner.attention import attention_for
from dapo_async.learner.batching import (
    MicroBatch,
    Rows,
    collate,
    empty_like,
    groups_to_rows,
    split_by_tokens,
    split_pairs,
    subset,
)
from dapo_async.learner.logprobs import ResponseLogProbs
from dapo_async.learner.parallel import Parallel
from dapo_async.protocol import Group

# Staleness levels reported per step (staleness/frac_<k>: the share of trained tokens k versions
# old); the last level also counts anything older (bounds beyond 15 are not a useful setting).
STALENESS_BINS = 16


# Values per step a distribution keeps (importance weights: one per trained token otherwise).
DIST_SAMPLES = 10_000


class Trainer:
    """Owns the optimizer, schedule and policy version of one rank; the model lives in ``par``."""

    def __init__(
        self,
        par: Parallel,
        algo: AlgoConfig,
        learner: LearnerConfig,
        pad_id: int,
        *,
        temperature: float,
        max_tokens: int,
        ref_model: torch.nn.Module | None = None,
    ):
        """``algo`` and ``learner``: those config sections; ``temperature`` and ``max_tokens``:
        the generator's sampling temperature (log-probs are computed at it) and generation
        limit (the default length normaliser)."""
        self.algo = algo
        self.learner = learner
        self.par = par
        self.model = par.model
        self.train_model = par.train_model
        self.world_size = par.world_size
        self.pad_id = pad_id
        self.device = par.device
        lc = learner
        self.ref_model = None
        if ref_model is not None:
            ref_model.eval()
            ref_model.requires_grad_(False)
            attention_for(ref_model, next(ref_model.parameters()).dtype)
            self.ref_model = ResponseLogProbs(ref_model, lc.logprob_chunk_tokens)
        self.objective = make_objective(algo, max_tokens)
        # AdamW over the master weights (learner.param_dtype); fused kernels on GPUs
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # LoRA: the adapters
            lr=lc.lr,
            betas=tuple(lc.betas),
            weight_decay=lc.weight_decay,
            fused=self.device.type == "cuda" or None,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: lr_multiplier(
                s, lc.num_steps, lc.warmup_steps, lc.lr_schedule, lc.lr_min_ratio
            ),
        )
        self.version = 0
        self.temperature = temperature
        # packed micro-batches where the objective allows (DPO keeps its padded pairs)
        self._pack = lc.pack_sequences and self.objective.packable
        self.need_prox = self.objective.needs_proximal
        # the first mini-batch's proximal log-probs from its own forward (module docstring)
        self.prox_from_forward = self.need_prox and not has_dropout(self.model)
        # responses of each step kept for reading (tracking.samples_per_step): ``recorded``
        # holds the last step's, with per-token ratios, weights and clip marks
        self.record_rows = 0
        self.recorded: list[dict] = []
        self._tap: dict | None = None
        self.distributions: dict[str, np.ndarray] = {}  # the last step's (``_distributions``)

    # ------------------------------------------------------------------ helpers

    def _forward_logp(self, policy, mb: MicroBatch, entropy: str = "none"):
        """Response log-probs (and entropy: none | metric | grad) from ``policy`` (a
        ``ResponseLogProbs``, possibly DDP/FSDP2-wrapped) in the compute dtype."""
        with self.par.autocast():
            return policy(
                mb.input_ids_BL,
                mb.attention_BL,
                mb.resp_start_B,
                mb.resp_len_B,
                mb.mask_BT.shape[1],
                self.temperature,
                entropy,
                mb.position_ids_BL,
                mb.row_B,
                mb.offset_B,
            )

    def _micro_batches(self, rows: Rows, parts: list[list[np.ndarray]], unit: int = 1):
        """Collate each mini-batch's micro-batches (given as row-index arrays), padded with empty
        ones (``unit`` rows each) to the global maximum count, so every rank runs as many."""
        out = []
        for idx_list in parts:
            pack = self._pack
            mbs = [
                collate(rows, idx, self.pad_id, self.algo.overlong_filter, self.device, pack)
                for idx in idx_list
            ]
            for _ in range(self.par.max_int(len(mbs)) - len(mbs)):
                empty = collate(rows, np.zeros(unit, np.int64), self.pad_id, device=self.device)
                mbs.append(empty_like(empty))
            out.append(mbs)
        return out

    def _split(self, rows: Rows, part: np.ndarray) -> list[np.ndarray]:
        if not len(part):
            return []
        budget = self.learner.micro_batch_tokens
        return [part[i] for i in split_by_tokens(subset(rows, part), budget, packed=self._pack)]

    def _no_grad_passes(self, micro: list[list[MicroBatch]]) -> None:
        """Proximal log-probs (weights at step start; the first mini-batch's come from its own
        forward when ``prox_from_forward``) and reference log-probs, in place."""
        if not self.need_prox and self.ref_model is None:
            return
        self.model.eval()
        with torch.no_grad():
            for i, part in enumerate(micro):
                for mb in part:
                    if self.need_prox and not (i == 0 and self.prox_from_forward):
                        mb.prox_logp_BT, _ = self._forward_logp(self.train_model, mb)
                    if self.ref_model is not None:
                        mb.ref_logp_BT, _ = self._forward_logp(self.ref_model, mb)

    def _optimizer_step(self) -> float:
        lc = self.learner
        params = [p for p in self.model.parameters() if p.grad is not None]
        if lc.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, lc.grad_clip)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ step

    def step(self, groups: list[Group]) -> dict[str, float]:
        """One learner step on this rank's shard; returns metrics (this rank's view)."""
        t0 = time.perf_counter()
        rows = groups_to_rows(groups, norm_std=self.algo.adv_norm_std, eps=self.algo.adv_eps)
        forward = partial(self._forward_logp, self.train_model)
        loss = partial(self.objective.loss, forward)
        tap = self._tap = {} if self.record_rows else None
        self.objective.weights = [] if self.record_rows else None
        metrics = self._updates(self._plan(rows), t0, self.objective.counts, loss)
        self.objective.tap = None
        self.recorded = tapped_rows(rows, tap, self.record_rows) if tap else []
        self.distributions = self._distributions(rows) if self.record_rows else {}
        self.scheduler.step()
        self.version += 1
        metrics.update(self._batch_stats(rows))
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _updates(self, micro, t0: float, counts, micro_loss) -> dict[str, float]:
        """The K mini-batch updates shared by every objective: per mini-batch, all-reduce the
        global denominators (``counts(part)``), then forward/loss/backward each micro-batch
        (``micro_loss(mb, global_counts, agg)`` returns the loss and records its metrics in
        ``agg``) with gradients reduced on the last one, then one optimizer step."""
        self._no_grad_passes(micro)
        timings = {"time/proximal_s": time.perf_counter() - t0}
        agg: dict[str, list[tuple[float, float]]] = defaultdict(list)
        self.model.train()
        t_fb = t_opt = 0.0
        for i, part in enumerate(micro):
            if i == len(micro) - 1:  # recorded: the last mini-batch (the first one's ratios
                self.objective.tap = self._tap  # are 1 where its own forward is proximal)
            g = self.par.sum_floats(counts(part))
            t1 = time.perf_counter()
            for j, mb in enumerate(part):
                with self.par.grad_sync(j == len(part) - 1):
                    loss = micro_loss(mb, g, agg)
                    (loss * self.world_size).backward()
            t2 = time.perf_counter()
            agg["grad_norm"].append((self._optimizer_step(), 1.0))
            t_opt += time.perf_counter() - t2
            t_fb += t2 - t1
        # maxima stay maxima; everything else is a token-weighted mean over micro-batches
        metrics = {
            f"train/{key}": max(x for x, _ in v) if key.endswith("_max") else _weighted(v)
            for key, v in agg.items()
        }
        metrics.update(timings)
        metrics["time/fwd_bwd_s"] = t_fb
        metrics["time/optimizer_s"] = t_opt
        return metrics

    def _plan(self, rows: Rows) -> list[list[MicroBatch]]:
        """The step's K mini-batches of the objective's loss units (responses, or pairs kept
        whole), each as token-bounded micro-batches padded to the global count."""
        units = self.objective.units(rows.rewards, rows.group)
        parts = np.array_split(units, self.learner.num_minibatches)
        if self.objective.unit == 1:
            return self._micro_batches(rows, [self._split(rows, p.reshape(-1)) for p in parts])
        budget = self.learner.micro_batch_tokens
        split = [split_pairs(rows, p, budget) for p in parts]
        return self._micro_batches(rows, split, unit=self.objective.unit)

    def _distributions(self, rows: Rows) -> dict[str, np.ndarray]:
        """The step's per-token staleness and raw importance weights (at most DIST_SAMPLES of
        them, evenly spaced), for Aim ``Distribution``s."""
        out = {}
        if len(rows):
            out["staleness"] = np.concatenate([self.version - 1 - v for v in rows.versions])
        weights, self.objective.weights = self.objective.weights, None
        if weights:
            w_N = torch.cat([w.float() for w in weights])
            stride = max(1, w_N.numel() // DIST_SAMPLES)
            out["is_weight"] = w_N[::stride].cpu().numpy()
        return out

    def _batch_stats(self, rows: Rows) -> dict[str, float]:
        lens = np.array([len(r) for r in rows.responses], dtype=np.float64)
        stale = (
            np.concatenate([self.version - 1 - v for v in rows.versions])
            if len(rows)
            else np.zeros(1)
        )
        levels = np.minimum(np.maximum(stale, 0), STALENESS_BINS - 1).astype(np.int64)
        fractions = np.bincount(levels, minlength=1) / max(len(levels), 1)
        return {
            **{f"staleness/frac_{k}": float(f) for k, f in enumerate(fractions)},
            "rollout/reward_mean": float(rows.rewards.mean()) if len(rows) else 0.0,
            "rollout/reward_std": float(rows.rewards.std()) if len(rows) else 0.0,
            "rollout/trained_accuracy": float(rows.acc.mean()) if len(rows) else 0.0,
            "rollout/response_len_mean": float(lens.mean()) if len(rows) else 0.0,
            "rollout/response_len_max": float(lens.max()) if len(rows) else 0.0,
            "rollout/clip_ratio": float(rows.truncated.mean()) if len(rows) else 0.0,
            "rollout/num_responses": float(len(rows)),
            "rollout/num_tokens": float(rows.num_tokens),
            "staleness/mean": float(stale.mean()),
            "staleness/max": float(stale.max()),
        }

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict | None:
        """Optimizer, scheduler and version (on rank 0; collective under FSDP2)."""
        opt = self.par.optimizer_state(self.optimizer)
        if opt is None:
            return None
        return {
            "optimizer": opt,
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        self.par.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])


def tapped_rows(rows: Rows, tap: dict, k: int) -> list[dict]:
    """Up to ``k`` responses of the tapped micro-batch (``Objective.tap``), those with the most
    clipped tokens first, with their per-token tensors cut to their length."""
    picked = []
    for i, r in enumerate(tap["rows"]):
        n = len(rows.responses[r])
        per_token = {
            out: tap[f"{name}_BT"][i, :n].float().cpu().numpy()
            for name, out in (
                ("ratio", "ratio"),
                ("is_weight", "is_weight"),
                ("clip", "clip"),
                ("keep", "kept"),
            )
        }
        picked.append((int((per_token["clip"] > 0).sum()), i, r, per_token))
    picked.sort(key=lambda x: (-x[0], x[1]))
    return [
        {
            "prompt": rows.prompts[r],
            "tokens": rows.responses[r],
            "adv": float(rows.adv[r]),
            "reward": float(rows.rewards[r]),
            "acc": float(rows.acc[r]),
            "truncated": bool(rows.truncated[r]),
            "versions": rows.versions[r],
            **per_token,
        }
        for _, _, r, per_token in picked[:k]
    ]


def has_dropout(model: torch.nn.Module) -> bool:
    """Whether a training-mode forward of ``model`` differs from an evaluation-mode one: a
    dropout module or a non-zero ``*dropout*`` rate in its (HF) config."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = config.to_dict() if hasattr(config, "to_dict") else {}
    return any(
        "dropout" in key and isinstance(v, (int, float)) and v > 0 for key, v in rates.items()
    )


def _weighted(pairs: list[tuple[float, float]]) -> float:
    tot = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / tot if tot else 0.0
