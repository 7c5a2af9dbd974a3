"""The base of every objective: the hooks the learner's trainer asks (``learner/trainer.py``).

per step:   trainer splits the shard into K mini-batches of loss units (``unit`` rows each:
            responses, or (chosen, rejected) pairs), micro-batches them (packed only when
            ``packable``), runs the no-grad passes the objective needs (proximal
            log-probs: ``needs_proximal``; reference log-probs: a reference model loaded
            when ``needs_reference``)
per mini-batch:    g = all-reduce(objective.counts(micro-batches))  — global denominators
per micro-batch:   loss = objective.loss(forward, mb, g, agg) → backward
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

# forward(mb, entropy) → (log-probs of the response tokens [B, T], entropy [B, T]) with the
# current weights and gradient; entropy: "none" | "metric" | "grad" (as ResponseLogProbs)
Forward = Callable[..., tuple[torch.Tensor, torch.Tensor]]
# metric name → (value, weight) pairs over micro-batches (the trainer averages them)
Agg = dict[str, list[tuple[float, float]]]


class Objective:
    """An RL objective. Subclasses set the class attributes and implement ``counts`` and
    ``loss``; ``algo``: the config's ``algo`` section; ``max_tokens``: the generation limit."""

    name = ""
    unit = 1  # rows per loss unit: 1 = a response, 2 = a (chosen, rejected) pair
    packable = True  # may several rows share one packed micro-batch row

    def __init__(self, algo, max_tokens: int):
        self.algo = algo
        self.max_tokens = max_tokens
        # set to a dict by the learner to read one micro-batch's per-token tensors: the next
        # ``loss`` call of an objective that supports it fills it (and resets this to None)
        self.tap: dict | None = None
        # a list to collect the step's raw importance weights into (the learner's distribution)
        self.weights: list | None = None

    @property
    def needs_reference(self) -> bool:
        """Whether the learner loads a frozen reference model (its log-probs reach ``loss`` as
        ``mb.ref_logp_BT``); the KL metric (``algo.track_kl_ref``) asks for one too."""
        return bool(self.algo.track_kl_ref)

    @property
    def needs_proximal(self) -> bool:
        """Whether ``loss`` needs the proximal log-probs (weights at step start,
        ``mb.prox_logp_BT``; the first mini-batch's may come from its own forward)."""
        return False

    def units(self, rewards: np.ndarray, group: np.ndarray) -> np.ndarray:
        """The loss units of a shard as row indices ``[U, unit]`` (``rewards`` and ``group``:
        each row's reward and group index): every response by itself."""
        return np.arange(len(rewards)).reshape(-1, 1)

    def counts(self, part: list) -> list[float]:
        """This rank's denominators of a mini-batch (its micro-batches), summed over ranks by
        the trainer and given back to ``loss`` as ``g``."""
        raise NotImplementedError

    def loss(self, forward: Forward, mb, g: list[float], agg: Agg) -> torch.Tensor:
        """The micro-batch's share of the mini-batch loss (global denominators ``g``); records
        its metrics in ``agg``."""
        raise NotImplementedError
