"""One learner rank's optimisation: proximal recompute, K mini-batch updates, version bump.

Call order per step (every rank):

    rows = groups_to_rows(shard)                       advantages per group
    prox = forward(no grad, weights at step start)    skipped in bypass mode
    for each of K mini-batches:
        all-reduce the mini-batch's token/sequence counts (global denominators)
        for each micro-batch: forward → loss (global token-mean) → backward (DDP syncs on the last)
        clip grad norm → AdamW step → LR schedule
    version += 1

With DDP the gradients are averaged over ranks, so each rank's loss is multiplied by the world
size: with global denominators the result is the gradient of the whole global batch.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import defaultdict

import numpy as np
import torch

from dapo_async.algo.entropy import entropy_from_logits
from dapo_async.algo.losses import PolicyLossConfig, policy_loss
from dapo_async.config import RunConfig
from dapo_async.learner.batching import (
    Rows,
    collate,
    groups_to_rows,
    response_logprobs,
    split_by_tokens,
)
from dapo_async.protocol import Group


def loss_config(cfg: RunConfig) -> PolicyLossConfig:
    a = cfg.algo
    if a.objective == "dpo":
        raise ValueError(
            "algo.objective: 'dpo' is available in dapo_async.algo.dpo but not yet wired into the learner"
        )
    return PolicyLossConfig(
        clip_low=a.clip_low,
        clip_high=a.clip_high if a.objective in ("dapo", "ppo_kl") else a.clip_low,
        dual_clip=a.dual_clip,
        is_cap=a.is_cap,
        is_mask_low=a.is_mask_low,
        is_mask_high=a.is_mask_high,
        seq_mask_low=a.seq_mask_low,
        seq_mask_high=a.seq_mask_high,
        bypass=a.bypass,
        loss_agg=a.loss_agg,
        norm_len=a.norm_len or cfg.generator.max_tokens,
        kl_coef=a.kl_coef if a.objective == "ppo_kl" else 0.0,
        kl_estimator=a.kl_estimator,
    )


class Trainer:
    """Owns the model (possibly DDP-wrapped), optimizer, schedule and the policy version."""

    def __init__(
        self,
        model: torch.nn.Module,
        cfg: RunConfig,
        pad_id: int,
        world_size: int = 1,
        ddp_model=None,
    ):
        self.cfg = cfg
        self.model = model
        self.train_model = ddp_model if ddp_model is not None else model
        self.pad_id = pad_id
        self.world_size = world_size
        self.loss_cfg = loss_config(cfg)
        lc = cfg.learner
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=lc.lr, betas=tuple(lc.betas), weight_decay=lc.weight_decay
        )
        warm = max(lc.warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0
        )
        self.version = 0
        self.temperature = cfg.generator.temperature

    # ------------------------------------------------------------------ helpers

    def _forward_logp(self, model, mb, with_entropy: bool = False):
        logits = model(input_ids=mb.input_ids_BL, attention_mask=mb.attention_BL).logits
        logp = response_logprobs(logits, mb, self.temperature)
        ent = None
        if with_entropy:
            with torch.no_grad():
                t = mb.mask_BT.shape[1]
                pos = (mb.resp_start_B[:, None] - 1 + torch.arange(t)[None, :]).clamp(
                    max=logits.shape[1] - 1
                )
                sel = (
                    logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))
                    / self.temperature
                )
                ent = entropy_from_logits(sel)
        return logp, ent

    def _global_counts(self, local: list[float]) -> list[float]:
        if self.world_size == 1:
            return local
        import torch.distributed as dist

        t = torch.tensor(local, dtype=torch.float64)
        dist.all_reduce(t)
        return t.tolist()

    # ------------------------------------------------------------------ step

    def step(self, groups: list[Group]) -> dict[str, float]:
        """One learner step on this rank's shard; returns metrics (this rank's view)."""
        lc = self.cfg.learner
        timings: dict[str, float] = {}
        rows = groups_to_rows(
            groups, norm_std=self.cfg.algo.adv_norm_std, eps=self.cfg.algo.adv_eps
        )
        parts = self._minibatches(rows, lc.num_minibatches)

        t0 = time.perf_counter()
        micro = [
            [collate(rows, idx, self.pad_id, self.cfg.algo.overlong_filter) for idx in part]
            for part in parts
        ]
        if not self.loss_cfg.bypass:
            self.model.eval()
            with torch.no_grad():
                for part in micro:
                    for mb in part:
                        mb.prox_logp_BT, _ = self._forward_logp(self.model, mb)
        timings["time/proximal_s"] = time.perf_counter() - t0

        agg: dict[str, list[float]] = defaultdict(list)
        self.model.train()
        t_fb = t_opt = 0.0
        for part in micro:
            local_tokens = float(sum(mb.mask_BT.sum().item() for mb in part))
            local_seqs = float(sum(mb.mask_BT.shape[0] for mb in part))
            g_tokens, g_seqs = self._global_counts([local_tokens, local_seqs])
            t1 = time.perf_counter()
            for j, mb in enumerate(part):
                last = j == len(part) - 1
                sync = (
                    contextlib.nullcontext()
                    if last or not hasattr(self.train_model, "no_sync")
                    else self.train_model.no_sync()
                )
                with sync:
                    logp, ent = self._forward_logp(self.train_model, mb, with_entropy=True)
                    loss, m = policy_loss(
                        logp,
                        mb.prox_logp_BT,
                        mb.behav_logp_BT,
                        mb.adv_BT,
                        mb.mask_BT,
                        self.loss_cfg,
                        global_num_tokens=max(g_tokens, 1.0),
                        global_num_seqs=max(g_seqs, 1.0),
                    )
                    (loss * self.world_size).backward()
                w = mb.mask_BT.sum().item()
                for k, v in m.items():
                    agg[k].append((v, w))
                agg["loss"].append((loss.item() * g_tokens / max(w, 1.0), w))
                if ent is not None:
                    agg["entropy"].append(((ent * mb.mask_BT).sum().item() / max(w, 1.0), w))
            t2 = time.perf_counter()
            grad_norm = (
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), lc.grad_clip).item()
                if lc.grad_clip > 0
                else math.sqrt(
                    sum(
                        float(p.grad.pow(2).sum())
                        for p in self.model.parameters()
                        if p.grad is not None
                    )
                )
            )
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            agg["grad_norm"].append((grad_norm, 1.0))
            t_opt += time.perf_counter() - t2
            t_fb += t2 - t1
        self.scheduler.step()
        self.version += 1
        timings["time/fwd_bwd_s"] = t_fb
        timings["time/optimizer_s"] = t_opt
        metrics = {f"train/{k}": _weighted(v) for k, v in agg.items() if k != "num_tokens"}
        metrics.update(timings)
        metrics.update(self._batch_stats(rows))
        metrics["train/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _minibatches(self, rows: Rows, k: int) -> list[list[np.ndarray]]:
        # Split the shard into k mini-batches (by response), each into micro-batches by tokens.
        k = max(1, min(k, len(rows)))
        parts = np.array_split(np.arange(len(rows)), k)
        out = []
        for p in parts:
            sub = split_by_tokens(_subset(rows, p), self.cfg.learner.micro_batch_tokens)
            out.append([p[idx] for idx in sub])
        return out

    def _batch_stats(self, rows: Rows) -> dict[str, float]:
        lens = np.array([len(r) for r in rows.responses], dtype=np.float64)
        stale = (
            np.concatenate([self.version - 1 - v for v in rows.versions])
            if len(rows)
            else np.zeros(1)
        )
        return {
            "rollout/reward_mean": float(rows.rewards.mean()) if len(rows) else 0.0,
            "rollout/reward_std": float(rows.rewards.std()) if len(rows) else 0.0,
            "rollout/accuracy": float(rows.acc.mean()) if len(rows) else 0.0,
            "rollout/response_len_mean": float(lens.mean()) if len(rows) else 0.0,
            "rollout/response_len_max": float(lens.max()) if len(rows) else 0.0,
            "rollout/clip_ratio": float(rows.truncated.mean()) if len(rows) else 0.0,
            "rollout/num_responses": float(len(rows)),
            "rollout/num_tokens": float(rows.num_tokens),
            "staleness/mean": float(stale.mean()),
            "staleness/max": float(stale.max()),
        }

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])


def _subset(rows: Rows, idx: np.ndarray) -> Rows:
    pick = idx.tolist()
    return Rows(
        [rows.prompts[i] for i in pick],
        [rows.responses[i] for i in pick],
        [rows.behav_logprobs[i] for i in pick],
        [rows.versions[i] for i in pick],
        rows.adv[idx],
        rows.rewards[idx],
        rows.acc[idx],
        rows.truncated[idx],
    )


def _weighted(pairs: list[tuple[float, float]]) -> float:
    tot = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / tot if tot else 0.0
