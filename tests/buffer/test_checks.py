"""Semantic checks at ingest: a group that decodes fine but would crash or mislead the learner is
rejected with a reason, its prompt leased again, nothing stored."""

import json

import numpy as np
from helpers import group

from dapo_async.buffer.checks import GroupLimits, model_vocab_size, semantic_error
from dapo_async.buffer.state import BufferState
from dapo_async.config import BufferConfig

LIMITS = GroupLimits(vocab_size=128, max_response_tokens=8)


def test_each_reason():
    ok = group("g", 0, 0)  # prompt [1, 2], responses of 3 tokens, ids < 50
    assert semantic_error(ok, LIMITS, [1, 2]) == ""
    assert semantic_error(ok, LIMITS, None) == ""  # no lease to compare (unknown lease later)
    poison = group("g", 1, 0)
    poison.tokens[0] = 1_000_000
    assert semantic_error(poison, LIMITS, [1, 2]) == "token_range"
    negative = group("g", 2, 0)
    negative.prompt_tokens[0] = -1
    assert semantic_error(negative, LIMITS, [1, 2]) == "token_range"
    long = group("g", 3, 0, tokens_per_response=9)
    assert semantic_error(long, LIMITS, [1, 2]) == "response_too_long"
    assert semantic_error(ok, LIMITS, [1, 2, 3]) == "prompt_mismatch"
    assert semantic_error(ok, LIMITS, [2, 1]) == "prompt_mismatch"
    # a group of another size than generator.responses_per_prompt
    sized = GroupLimits(vocab_size=128, max_response_tokens=8, responses_per_group=2)
    assert semantic_error(ok, sized, [1, 2]) == ""
    assert semantic_error(group("g", 0, 0, acc=(1, 0) * 1024), sized, [1, 2]) == "group_size"
    assert semantic_error(group("g", 0, 0, acc=(1,)), sized, [1, 2]) == "group_size"
    # an unknown vocabulary size is not checked
    assert semantic_error(poison, GroupLimits(0, 8), [1, 2]) == ""


def test_rejected_group_frees_its_prompt_and_is_never_stored():
    s = BufferState(BufferConfig(groups_per_step=2), num_prompts=10, seed=0)
    s.hello("g")
    (lease,) = s.grant("g", 1)
    poison = group("g", 0, lease.lease_id)
    assert s.reject(poison, "token_range") == "rejected:token_range"
    assert not s.groups and not s.leases
    assert s.counters.rejected["token_range"] == 1 and s.counters.produced == 0
    # a resend is refused again: refused ids are not remembered (only stored groups are)
    assert s.reject(poison, "token_range") == "rejected:token_range"
    (again,) = s.grant("g", 1)
    assert again.prompt_index == lease.prompt_index  # the prompt is generated again


def test_vocab_size_comes_from_the_model_config(tmp_path):
    assert model_vocab_size(tmp_path) == 0
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 128}))
    assert model_vocab_size(tmp_path) == 128
    assert np.int32(127) < model_vocab_size(tmp_path)


def test_a_file_that_repeats_its_prompts_is_named_and_dedupe_trains_each_once():
    from dapo_async.buffer.main import _repeats_noted
    from dapo_async.data.tasks import PromptRecord

    said = []

    class Log:
        def info(self, msg, *args):
            said.append(msg % args)

    rows = [
        PromptRecord(i, [{"role": "user", "content": f"q{i % 2}"}], "1", "s", {}) for i in range(6)
    ]
    assert len(_repeats_noted("f.parquet", rows, False, Log())) == 6
    assert "6 rows hold 2 distinct prompts (3× each" in said[0] and "data.dedupe=true" in said[0]
    once = _repeats_noted("f.parquet", rows, True, Log())
    assert [r.messages[0]["content"] for r in once] == ["q0", "q1"]


def test_episode_lengths_count_sampled_and_environment_tokens_apart():
    """A multi-turn episode may hold generator.max_tokens sampled tokens and, beside them, up to
    generator.max_env_tokens of the environment's; either past its bound is rejected."""
    limits = GroupLimits(vocab_size=128, max_response_tokens=8, max_env_tokens=4)
    ep = group("g", 0, 0, tokens_per_response=12)  # 8 sampled + 4 environment tokens each
    ep.sampled = np.array(([1] * 5 + [0] * 4 + [1] * 3) * 2, np.uint8)
    assert semantic_error(ep, limits, [1, 2]) == ""
    assert semantic_error(ep, LIMITS, [1, 2]) == "response_too_long"  # no environment allowed
    more_env = group("g", 1, 0, tokens_per_response=12)
    more_env.sampled = np.array(([1] * 3 + [0] * 5 + [1] * 4) * 2, np.uint8)  # 5 > 4
    assert semantic_error(more_env, limits, [1, 2]) == "response_too_long"
    more_sampled = group("g", 2, 0, tokens_per_response=12)
    more_sampled.sampled = np.array(([1] * 9 + [0] * 3) * 2, np.uint8)  # 9 > 8
    assert semantic_error(more_sampled, limits, [1, 2]) == "response_too_long"
