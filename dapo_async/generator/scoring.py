"""A generator's scorer: one call scores a batch of finished responses, each into its reward's
parts (``reward/compose.py``), with the verifier in the reward pool's isolated workers and, with
``reward.model_*``, a reward model scoring prompt + response (one batched request per call; a
failed request scores that part 0 and is counted in ``model.failures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from dapo_async.keys import run_keys_dir
from dapo_async.reward.compose import RewardComposer
from dapo_async.reward.model_client import RewardModelScorer
from dapo_async.reward.pool import RewardPool
from dapo_async.roles import read_endpoint


class ScoreItem(NamedTuple):
    """One finished response to score."""

    text: str  # the response (a rollout's whole episode: sampled and environment tokens)
    truth: str  # the prompt's ground truth
    num_sampled: int  # tokens the policy sampled (overlong shaping counts these)
    prompt: str  # the prompt as the model saw it
    extra: dict  # the prompt's extra_info
    rollout_reward: float | None = None  # the rollout function's own reward, if it gave one


@dataclass
class Scorer:
    composer: RewardComposer
    pool: RewardPool
    model: RewardModelScorer | None = None  # the reward model's client, when the run has one

    @property
    def component_names(self) -> tuple[str, ...]:
        """The reward's parts, in the order every scored response holds them."""
        return self.composer.component_names

    def __call__(self, items: list[ScoreItem]) -> list[dict]:
        """One combined verdict per item, in order."""
        verdicts = self.pool.score_batch([(i.text, i.truth, i.prompt, i.extra) for i in items])
        model_scores = (
            self.model.score([i.prompt + i.text for i in items])
            if self.model is not None
            else [None] * len(items)
        )
        return [
            self.composer.combine(v, i.num_sampled, v.get("tag", ""), m, i.rollout_reward)
            for v, i, m in zip(verdicts, items, model_scores)
        ]

    def close(self) -> None:
        self.pool.close()
        if self.model is not None:
            self.model.close()


def make_scorer(cfg, run_dir=None, stop=None) -> Scorer:
    """The run's scorer (``reward`` section); the caller closes it."""
    model = None
    if cfg.reward.uses_model:
        rc = cfg.reward
        endpoint = rc.model_endpoint or read_endpoint(run_dir, "reward", stop=stop)
        model = RewardModelScorer.from_config(rc, endpoint, run_keys_dir(cfg.launch, run_dir))
    pool = RewardPool(cfg.reward.fn, cfg.reward.num_workers, cfg.reward.timeout_s)
    return Scorer(RewardComposer(cfg.reward), pool, model)
