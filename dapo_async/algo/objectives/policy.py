"""The decoupled-clip policy objectives' common part (DAPO, GRPO and PPO-KL differ only in their
settings): a token-level or sequence-level aggregate over the global batch of the clipped,
importance-weighted surrogate (``algo/losses.py``), with an optional entropy bonus."""

from __future__ import annotations

import dataclasses

import torch

from dapo_async.algo.losses import PolicyLossConfig, policy_loss
from dapo_async.algo.objectives.base import Agg, Forward, Objective


class PolicyObjective(Objective):
    """The clipped surrogate on responses; subclasses say how the ``algo`` settings map onto
    the loss (``loss_config``)."""

    asymmetric_clip = True  # clip-higher: ε_high from algo.clip_high (else ε_low both sides)
    kl_penalty = False  # algo.kl_coef in the loss (needs the reference model)

    def __init__(self, algo, max_tokens: int):
        super().__init__(algo, max_tokens)
        self.loss_cfg = self.loss_config()

    def loss_config(self) -> PolicyLossConfig:
        """The loss settings of ``algo`` (same-named keys), with what the objective implies:
        its clipping, its KL penalty, norm_len 0 = the generation limit."""
        a = self.algo
        same = {f.name: getattr(a, f.name) for f in dataclasses.fields(PolicyLossConfig)}
        return PolicyLossConfig(
            **same
            | {
                "clip_high": a.clip_high if self.asymmetric_clip else a.clip_low,
                "norm_len": a.norm_len or self.max_tokens,
                "kl_coef": a.kl_coef if self.kl_penalty else 0.0,
            }
        )

    @property
    def needs_reference(self) -> bool:
        return super().needs_reference or (self.kl_penalty and self.algo.kl_coef > 0)

    @property
    def needs_proximal(self) -> bool:
        return not self.loss_cfg.bypass  # bypass: the behaviour log-probs stand in

    def counts(self, part: list) -> list[float]:
        """Tokens and sequences in the loss (a filtered response is in neither)."""
        return [
            float(sum(mb.mask_BT.sum().item() for mb in part)),
            float(sum(int((mb.mask_BT.sum(1) > 0).sum()) for mb in part)),
        ]

    def loss(self, forward: Forward, mb, g: list[float], agg: Agg) -> torch.Tensor:
        g_tokens, g_seqs = g
        coef = self.algo.entropy_coef
        logp, ent = forward(mb, "grad" if coef else "metric")
        prox = mb.prox_logp_BT
        if prox is None and self.needs_proximal:  # the first mini-batch: weights at step start
            prox = logp.detach()
        tap, self.tap = self.tap, None
        if tap is not None:
            tap["rows"] = mb.rows
        loss, m = policy_loss(
            logp,
            prox,
            mb.behav_logp_BT,
            mb.adv_BT,
            mb.mask_BT,
            self.loss_cfg,
            global_num_tokens=max(g_tokens, 1.0),
            global_num_seqs=max(g_seqs, 1.0),
            ref_logp_BT=mb.ref_logp_BT,
            tap=tap,
            weights_out=self.weights,
        )
        w = mb.mask_BT.sum().item()
        for key, v in m.items():
            if key != "num_tokens":
                agg[key].append((v, w))
        agg["loss"].append((loss.item() * g_tokens / max(w, 1.0), w))
        ent_sum = (ent * mb.mask_BT).sum()
        agg["entropy"].append((ent_sum.item() / max(w, 1.0), w))
        if coef:  # entropy bonus, token-mean over the mini-batch's global token count
            loss = loss - coef * ent_sum / max(g_tokens, 1.0)
        return loss
