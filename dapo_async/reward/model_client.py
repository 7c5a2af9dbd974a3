"""Generators' side of a reward model: one batched request per scoring call to a
`dapo-async reward-server` (ZeroMQ, CurveZMQ with the run's keys) or an HTTP endpoint, with a
timeout; a failed request scores the model part 0 and is counted, never crashes the generator.

The text scored is the prompt as the policy saw it followed by the response.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class RewardModelScorer:
    def __init__(self, client, weight: float):
        self.client = client
        self.weight = weight
        self.failures = 0
        self.requests = 0

    @classmethod
    def from_config(cls, rc, endpoint: str, keys_dir) -> RewardModelScorer:
        """``endpoint``: tcp://… (our reward server) or http(s)://…"""
        if endpoint.startswith("http"):
            from dapo_async.reward.http_client import HTTPRewardClient

            client = HTTPRewardClient(endpoint, timeout_s=rc.model_timeout_s)
        else:
            from dapo_async.reward.server import RewardClient

            client = RewardClient(endpoint, keys_dir=keys_dir, timeout_s=rc.model_timeout_s)
        return cls(client, rc.model_weight)

    def score(self, texts: list[str]) -> list[float]:
        """Raw reward-model scores, or zeros when the request fails (counted)."""
        if not texts:
            return []
        self.requests += 1
        try:
            return [float(s) for s in self.client.score(texts)]
        except Exception as e:  # a dead or slow server, a bad reply: the model part is 0
            self.failures += 1
            log.warning("reward model request failed (%s); its part scores 0", str(e)[:200])
            return [0.0] * len(texts)

    def close(self) -> None:
        close = getattr(self.client, "close", None)
        if close is not None:
            close()
