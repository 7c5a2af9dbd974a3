"""The engine interface every inference backend implements (``hf``, ``vllm``).

An engine turns prompt token ids into ``n`` sampled responses each, with the per-token
log-probs of the sampled tokens under the sampling distribution (``processed``: after
temperature / top-k / top-p; ``raw``: the model's own distribution), and takes new weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 32
    stop: tuple[str, ...] = ()
    logprobs_mode: str = "processed"
    seed: int | None = None


@dataclass
class Completion:
    tokens: np.ndarray  # int32 [L], includes the EOS token when finish == "stop"
    logprobs: np.ndarray  # float32 [L]
    finish: str  # "stop" | "length"
    text: str = ""
    extra: dict = field(default_factory=dict)
    # per token: the version of the weights it was sampled from (streaming engines, where an
    # update may land mid-response); None = the engine's version when the call started
    versions: np.ndarray | None = None


class Engine(Protocol):
    version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``n`` completions for each prompt, in prompt order."""
        ...

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Load full weights (names as in the HF model) and set the policy version."""
        ...

    def close(self) -> None: ...
