"""The engine interface every inference backend implements (``hf``, ``vllm``).

An engine turns prompt token ids into ``n`` sampled responses each, with the per-token
log-probs of the sampled tokens under the sampling distribution (``processed``: after
temperature / top-k / top-p; ``raw``: the model's own distribution), in one call (``generate``)
or continuously (``stream``), and takes new weights: a state dict, a safetensors file, or (vLLM
with ``weight_sync.mode=dist``) a weight-sync round received by its own workers. Every engine
passes one interface test (``tests/generator/test_engine_interface.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

    from dapo_async.weight_sync.base import WeightReceiver


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 32
    stop: tuple[str, ...] = ()
    # token ids that end a response like EOS does (kept in it, finish "stop"): a multi-turn
    # rollout ends a turn at, say, the newline after a tool call
    stop_token_ids: tuple[int, ...] = ()
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
    # per token: 1 = sampled by the policy, 0 = appended by an environment (multi-turn
    # episodes, ``dapo_async.rollouts``); None = every token sampled
    sampled: np.ndarray | None = None
    # the reward a rollout function gave its episode itself (reward.rollout_weight), or None
    rollout_reward: float | None = None

    @property
    def num_sampled(self) -> int:
        """Tokens the policy sampled (what overlong shaping and length budgets count)."""
        return len(self.tokens) if self.sampled is None else int(self.sampled.sum())


class Stream(Protocol):
    """An engine's continuous-batching decoder (``Engine.stream``): requests join and leave a
    running batch, and new weights given to the engine between ``step`` calls apply from the
    next token on (every token keeps the version that computed it: ``Completion.versions``)."""

    @property
    def num_inflight(self) -> int:
        """Responses still decoding (a request of ``n`` responses counts ``n``)."""
        ...

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        """Start ``params.n`` responses to ``prompt``; ids must be unique among those in flight."""
        ...

    def step(self) -> list[tuple[str, list[Completion]]]:
        """Decode one chunk; the requests whose ``n`` responses all finished, with them."""
        ...

    def abort(self, request_id: str) -> None:
        """Between ``step`` calls: drop a request in flight (none of its responses comes back;
        its id may be added again). An id not in flight is ignored."""
        ...


class Engine(Protocol):
    """What the generator, evaluation and weight sync ask of an inference backend."""

    version: int  # the weights' version: 0 at start, then as given with each load
    tokenizer: Any  # the model's HF tokenizer (prompt text for rewards, decoding for eval)
    eos_id: int
    device: torch.device  # where it computes (a vLLM engine: its first worker's device)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        """``n`` completions for each prompt, in prompt order."""
        ...

    def stream(self, chunk_tokens: int, reset_kv: bool = False, seed: int = 0) -> Stream:
        """A continuous-batching decoder that decodes ``chunk_tokens`` tokens per ``step``; with
        ``reset_kv`` the KV cache of running requests is recomputed after a weight update."""
        ...

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Load full weights (names as in the HF model) and set the policy version."""
        ...

    def load_file(self, path: str, version: int) -> None:
        """Load the weights of a safetensors file (a snapshot, the disk weight-sync mode)."""
        ...

    def worker_receiver(
        self, endpoint: str, receiver_id: str, timeout_s: float, backend: str, keys_dir=None
    ) -> WeightReceiver | None:
        """For ``weight_sync.mode=dist``: a receiver whose group members are the engine's own
        worker processes, receiving straight into the engine (its ``poll`` returns None, the
        engine already runs the new version); None where the engine computes in the caller's
        process and takes weights through ``update_weights``."""
        ...

    def close(self) -> None: ...
