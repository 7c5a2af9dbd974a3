"""Online DPO: the best and the worst response of every group form a (chosen, rejected) pair;
the loss is DPO's (``algo/dpo.py``) against the reference log-probs (a frozen model with
algo.dpo_reference = model, else the behaviour log-probs), averaged over the global pairs."""

from __future__ import annotations

import numpy as np
import torch

from dapo_async.algo.dpo import dpo_loss, dpo_pairs
from dapo_async.algo.objectives.base import Agg, Forward, Objective


class OnlineDPO(Objective):
    name = "dpo"
    unit = 2  # a micro-batch holds whole pairs: [chosen_0, rejected_0, chosen_1, ...]
    packable = False  # pairs stay padded rows side by side

    @property
    def needs_reference(self) -> bool:
        return super().needs_reference or self.algo.dpo_reference == "model"

    def units(self, rewards: np.ndarray, group: np.ndarray) -> np.ndarray:
        """(chosen, rejected) row pairs: the best and the worst response of each group."""
        chosen_P, rejected_P = dpo_pairs(
            torch.from_numpy(rewards.astype(np.float64)), torch.from_numpy(group)
        )
        return np.stack([chosen_P.numpy(), rejected_P.numpy()], 1).reshape(-1, 2)

    def counts(self, part: list) -> list[float]:
        """Pairs of the mini-batch (empty padding micro-batches have none)."""
        return [float(sum(int((mb.mask_BT.sum(1) > 0).sum()) // 2 for mb in part))]

    def loss(self, forward: Forward, mb, g: list[float], agg: Agg) -> torch.Tensor:
        (g_pairs,) = g
        logp, _ = forward(mb, "none")
        ref = mb.ref_logp_BT if mb.ref_logp_BT is not None else mb.behav_logp_BT
        seq_B = (logp * mb.mask_BT).sum(1)
        ref_B = (ref * mb.mask_BT).sum(1)
        live = (mb.mask_BT.sum(1) > 0)[0::2]
        loss, m = dpo_loss(
            seq_B[0::2][live],
            seq_B[1::2][live],
            ref_B[0::2][live],
            ref_B[1::2][live],
            self.algo.dpo_beta,
            global_num_pairs=max(g_pairs, 1.0),
        )
        n = float(live.sum())
        agg["loss"].append((loss.item() * g_pairs / max(n, 1.0), n))
        agg["dpo_margin_mean"].append((m["dpo_margin_mean"], n))
        agg["dpo_pref_acc"].append((m["dpo_pref_acc"], n))
        agg["dpo_num_pairs"].append((g_pairs, n))
        return loss
