"""Semantic checks of a scored group at ingest, beyond what the protocol can check: a group that
decodes fine can still crash the learner (a token id outside the vocabulary) or train on
something that was never asked (a prompt other than the leased one, a response that sampled
more than ``generator.max_tokens`` tokens or holds more environment tokens than
``generator.max_env_tokens`` allows, more or fewer responses than ``generator.responses_per_prompt``). A
failing group is rejected with a reason, counted, acknowledged (so the generator drops it) and
its prompt is leased again; nothing of it is stored. Before any of that, a message larger than
the config allows (``max_message_bytes``) never arrives: ZeroMQ drops its sender's connection
when the frame's length is read, before allocating it."""

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


# Wire bytes of one response token: its id, log-prob and weights version (4 bytes each), with
# room to spare; and of one response's own columns (length, reward, accuracy, components, finish).
WIRE_BYTES_PER_TOKEN = 16
WIRE_BYTES_PER_RESPONSE = 256
# The msgpack header and every small message (leases, heartbeats, batch requests) fit in this.
MESSAGE_SLACK_BYTES = 1 << 20


def max_message_bytes(cfg) -> int:
    """The largest message the buffer accepts, from the run config: as many full-length groups
    as one generator may hold leases for (``buffer.max_leases_per_generator``), each of
    ``generator.responses_per_prompt`` responses of ``generator.max_tokens`` tokens after a
    ``data.max_prompt_len`` prompt. An honest message is far below it (tiny: ~1.2 MiB; the
    Qwen2.5-Math-7B config: ~50 MiB); a 239 MB frame is refused before it is read."""
    g = cfg.generator
    per_response = (g.max_tokens + env_token_limit(cfg)) * WIRE_BYTES_PER_TOKEN
    per_response += WIRE_BYTES_PER_RESPONSE
    per_group = g.responses_per_prompt * per_response + cfg.data.max_prompt_len * 8
    groups = max(1, cfg.buffer.max_leases_per_generator)
    return groups * per_group + MESSAGE_SLACK_BYTES


def env_token_limit(cfg) -> int:
    """Environment tokens a response may hold: ``generator.max_env_tokens`` with a rollout
    function (``generator.rollout``), none without."""
    return cfg.generator.max_env_tokens if cfg.generator.rollout else 0


@dataclass(frozen=True)
class GroupLimits:
    vocab_size: int  # token ids must be in [0, vocab_size); 0 = unknown (not checked)
    max_response_tokens: int  # generator.max_tokens: sampled tokens per response (episode)
    responses_per_group: int = 0  # generator.responses_per_prompt; 0 = not checked
    # the largest message decoded (``max_message_bytes``; ZeroMQ enforces it on the socket)
    max_message_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES
    max_env_tokens: int = 0  # environment tokens per response (``env_token_limit``)


def _sampled_lens(group: Group) -> np.ndarray:
    """Tokens the policy sampled in each response (the rest are an environment's)."""
    lens = group.response_lens.astype(np.int64)
    if group.sampled is None:
        return lens
    c = np.concatenate([[0], np.cumsum(group.sampled, dtype=np.int64)])
    ends = np.cumsum(lens)
    return c[ends] - c[ends - lens]


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
    if group.response_lens.size:
        sampled = _sampled_lens(group)
        env = group.response_lens - sampled
        if (
            int(sampled.max()) > limits.max_response_tokens
            or int(env.max()) > limits.max_env_tokens
        ):
            return "response_too_long"
    if leased_prompt is not None and not np.array_equal(
        group.prompt_tokens, np.asarray(leased_prompt, dtype=group.prompt_tokens.dtype)
    ):
        return "prompt_mismatch"
    return ""
