"""Semantic checks of a scored group at ingest, beyond what the protocol can check: a group that
decodes fine can still crash the learner (a token id outside the vocabulary) or train on
something that was never asked (a prompt other than the leased one, a response longer than
``generator.max_tokens``, more or fewer responses than ``generator.responses_per_prompt``). A failing group is rejected with a reason, counted, acknowledged (so
the generator drops it) and its prompt is leased again; nothing of it is stored."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dapo_async import protocol
from dapo_async.protocol import Group

# Which message kinds each authenticated client role may send the buffer (keys.CLIENT_ROLES);
# the operator's "client" key may send every kind. Without CurveZMQ nobody is identified and
# every kind is accepted (launch.auth=false, loopback only).
ROLE_MESSAGES: dict[str, tuple[type, ...]] = {
    "generator": (protocol.GeneratorMessage, protocol.ScoredGroups),
    "learner": (protocol.BatchRequest, protocol.CheckpointNotice),
}


def forbidden(role: str | None, msg: protocol.Message, authenticated: bool) -> bool:
    """True when ``msg`` must not be accepted from a sender of ``role``."""
    if not authenticated or role == "client":
        return False
    allowed = ROLE_MESSAGES.get(role or "")
    return allowed is None or not isinstance(msg, allowed)


@dataclass(frozen=True)
class GroupLimits:
    vocab_size: int  # token ids must be in [0, vocab_size); 0 = unknown (not checked)
    max_response_tokens: int  # generator.max_tokens
    responses_per_group: int = 0  # generator.responses_per_prompt; 0 = not checked


def model_vocab_size(model_dir: str | Path) -> int:
    """``vocab_size`` from an HF model directory's config.json (the embedding's rows: a larger id
    would index past it in the learner); 0 when it cannot be read."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def semantic_error(group: Group, limits: GroupLimits, leased_prompt: list[int] | None) -> str:
    """The reason ``group`` must not be stored ("" when it may): ``group_size``,
    ``token_range``, ``response_too_long`` or ``prompt_mismatch``. ``leased_prompt`` None: no
    lease to compare."""
    if limits.responses_per_group and group.num_responses != limits.responses_per_group:
        return "group_size"  # a 2,048-response group would train as 256 normal ones
    if limits.vocab_size:
        for arr in (group.tokens, group.prompt_tokens):
            if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= limits.vocab_size):
                return "token_range"
    if group.response_lens.size and int(group.response_lens.max()) > limits.max_response_tokens:
        return "response_too_long"
    if leased_prompt is not None and not np.array_equal(
        group.prompt_tokens, np.asarray(leased_prompt, dtype=group.prompt_tokens.dtype)
    ):
        return "prompt_mismatch"
    return ""
