"""The RL objectives behind one base (``base.Objective``): what each needs from the learner (a
reference model, proximal log-probs, packable micro-batches, its loss unit) and its loss on one
micro-batch with the global denominators it declares. One module per objective; the learner's
trainer (``learner/trainer.py``) is a loop that asks the objective.

    dapo     decoupled clip, clip-higher (ε_low < ε_high), token-level loss  (dapo.py)
    grpo     the same surrogate with symmetric clipping                       (grpo.py)
    ppo_kl   the same with a KL penalty to a frozen reference                 (ppo_kl.py)
    dpo      online DPO on the best and worst response of each group          (dpo.py)
"""

from __future__ import annotations

from dapo_async.algo.objectives.base import Objective


def make_objective(algo, max_tokens: int) -> Objective:
    """The objective ``algo.objective`` names, with the ``algo`` section's settings;
    ``max_tokens``: the generation limit (the default length normaliser)."""
    from dapo_async.algo.objectives.dapo import DAPO
    from dapo_async.algo.objectives.dpo import OnlineDPO
    from dapo_async.algo.objectives.grpo import GRPO
    from dapo_async.algo.objectives.ppo_kl import PPOKL

    classes = {"dapo": DAPO, "grpo": GRPO, "ppo_kl": PPOKL, "dpo": OnlineDPO}
    if algo.objective not in classes:
        raise ValueError(f"algo.objective must be one of {sorted(classes)}, got {algo.objective!r}")
    return classes[algo.objective](algo, max_tokens)


__all__ = ["Objective", "make_objective"]
