"""The reward of one response: correctness from a verifier plus DAPO's soft overlong punishment.

``RewardComposer.score`` returns the total reward, the accuracy and the named components
(``correct``, ``overlong``) so each is reported on its own. Verifiers are looked up by name:
``dapo_math`` | ``dapo_math_lenient`` | ``boxed`` | ``code`` (sandboxed execution) |
``package.module:function`` (a custom function). A custom function takes
``(response, ground_truth)`` or ``(prompt, response, ground_truth, extra_info)`` (the prompt as
the model saw it, the record's ``extra_info`` dict) and returns a dict with ``score`` (and
optionally ``acc``, ``pred``) or a bare number; ``call_verifier`` tells the forms apart.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

from dapo_async.algo.overlong import overlong_penalty
from dapo_async.config import RewardConfig
from dapo_async.reward.verifiers import BUILTIN
from dapo_async.utils import import_callable

COMPONENT_NAMES = ("correct", "overlong")
MODEL_COMPONENT = "model"  # added when a reward model scores too
ROLLOUT_COMPONENT = "rollout"  # added with reward.rollout_weight: the rollout's own reward


class RewardError(ValueError):
    """A reward function is missing, or returned something unusable."""


def resolve(name: str) -> Callable[[str, str], dict]:
    if name in BUILTIN:
        return BUILTIN[name]
    if name == "code":
        from dapo_async.reward.sandbox import code_exec

        return code_exec
    if ":" not in name:
        raise RewardError(
            f"unknown reward function {name!r}: use one of {sorted([*BUILTIN, 'code'])} or "
            "'package.module:function'"
        )
    try:
        return import_callable(name, "reward function")
    except ValueError as e:
        raise RewardError(str(e)) from None


def takes_context(fn) -> bool:
    """Whether ``fn`` takes the four-argument form ``(prompt, response, ground_truth,
    extra_info)`` (four or more positional parameters, or ``*args``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: the two-argument form
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 4 or any(p.kind == p.VAR_POSITIONAL for p in params)


def call_verifier(
    fn, response: str, ground_truth: str, prompt: str = "", extra_info: dict | None = None
) -> dict:
    """Call a reward function in whichever form it takes; the normalised result."""
    if takes_context(fn):
        out = fn(prompt, response, ground_truth, dict(extra_info or {}))
    else:
        out = fn(response, ground_truth)
    return normalize_result(out)


def normalize_result(out) -> dict:
    """Accept a dict with 'score' (and optional 'acc') or a bare number; check finiteness."""
    if isinstance(out, dict):
        score = out.get("score")
        acc = out.get("acc", 1.0 if isinstance(score, (int, float)) and score > 0 else 0.0)
        res = dict(out)
    else:
        score, acc, res = out, (1.0 if isinstance(out, (int, float)) and out > 0 else 0.0), {}
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise RewardError(f"reward function returned a non-finite or non-numeric score: {score!r}")
    res["score"], res["acc"] = float(score), float(acc)
    return res


@dataclass
class Scored:
    reward: float
    acc: float
    components: tuple[float, ...]
    pred: str | None = None
    tag: str = ""


class RewardComposer:
    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self.fn = resolve(cfg.fn)
        self.component_names = (
            COMPONENT_NAMES
            + ((MODEL_COMPONENT,) if cfg.uses_model else ())
            + ((ROLLOUT_COMPONENT,) if cfg.rollout_weight > 0 else ())
        )

    def shaping(self, num_tokens: int) -> float:
        if not self.cfg.overlong_shaping:
            return 0.0
        return overlong_penalty(num_tokens, self.cfg.overlong_max_len, self.cfg.overlong_cache_len)

    def combine(
        self,
        verdict: dict,
        num_tokens: int,
        tag: str = "",
        model_score: float | None = None,
        rollout_reward: float | None = None,
    ) -> Scored:
        """total = verifier_weight · verifier + overlong (+ model_weight · model)
        (+ rollout_weight · the rollout's own reward); each part is reported as its own
        (unweighted) component."""
        over = self.shaping(num_tokens)
        total = self.cfg.verifier_weight * verdict["score"] + over
        parts: tuple[float, ...] = (verdict["score"], over)
        if self.cfg.uses_model:
            m = 0.0 if model_score is None else float(model_score)
            total += self.cfg.model_weight * m
            parts += (m,)
        if self.cfg.rollout_weight > 0:
            r = 0.0 if rollout_reward is None else float(rollout_reward)
            total += self.cfg.rollout_weight * r
            parts += (r,)
        return Scored(total, verdict["acc"], parts, verdict.get("pred"), tag)

    def score(
        self,
        response: str,
        ground_truth: str,
        num_tokens: int,
        prompt: str = "",
        extra_info: dict | None = None,
    ) -> Scored:
        verdict = call_verifier(self.fn, response, ground_truth, prompt, extra_info)
        return self.combine(verdict, num_tokens)
