"""The example rollouts of docs/rollouts.md run: the tool example evaluates only arithmetic and
masks the tool's answer; the dialogue example renders the user's follow-up with the model's
template, plays it on the real hf engine, and its reward wants both answers right."""

import sys

import numpy as np
import pytest
from conftest import REPO

from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.rollouts import EpisodeRunner, Sample

sys.path.insert(0, str(REPO))  # `examples` is importable from the repo root, as in a run

from examples import dialogue_rollout, tool_rollout


class Scripted:
    """A hand-written engine answering each call with the next scripted text."""

    def __init__(self, tok, texts):
        self.tokenizer, self.texts, self.version, self.eos_id = (
            tok,
            list(texts),
            0,
            tok.eos_token_id,
        )

    def generate(self, prompts, params):
        ids = self.tokenizer(self.texts.pop(0), add_special_tokens=False).input_ids
        c = Completion(np.asarray(ids, np.int32), np.full(len(ids), -0.1, np.float32), "stop")
        return [[c] * params.n for _ in prompts]


@pytest.fixture(scope="module")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def test_the_tool_example_answers_calls_and_masks_them(tok):
    assert tool_rollout.evaluate("(3+4)*5") == "35"
    assert tool_rollout.evaluate("__import__('os')") == "error"
    eng = Scripted(tok, ["CALL 6*7\n", "Answer: 42"])
    (t,) = EpisodeRunner(tool_rollout.rollout, eng, SamplingParams(max_tokens=30), tok).run(
        [Sample([1, 20])]
    )
    assert t.text == "CALL 6*7\n= 42\nAnswer: 42"
    assert tok.decode(t.tokens[t.sampled == 0].tolist()) == "= 42\n" and t.info["tool_call"] == 1


def test_the_dialogue_example_plays_on_the_hf_engine(tiny_model, tok):
    from dapo_async.engines.hf import HFEngine

    eng = HFEngine(str(tiny_model))
    prompt = tok.apply_chat_template([{"role": "user", "content": "3+4="}],
                                     add_generation_prompt=True, tokenize=False)  # fmt: skip
    ids = tok(prompt, add_special_tokens=False).input_ids
    runner = EpisodeRunner(dialogue_rollout.rollout, eng, SamplingParams(max_tokens=40), tok)
    trajs = runner.run([Sample(ids, "7", index=i) for i in range(4)])
    for t in trajs:
        if t.info["follow_up"]:  # the user's turn: its template's tokens, unsampled
            assert tok.decode(t.tokens[t.sampled == 0].tolist(), skip_special_tokens=True).endswith(
                "*2=\n"
            )
        assert len(t.tokens) == len(t.logprobs) == len(t.versions)
    assert dialogue_rollout.reward("Answer: 7\n7*2=\nAnswer: 14", "7")["acc"] == 1.0
    assert dialogue_rollout.reward("Answer: 7\n7*2=\nAnswer: 15", "7")["acc"] == 0.0
