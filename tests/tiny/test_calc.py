"""The tiny:calc task: its rollout calls the calculator on a well-formed ``CALL`` and marks the
calculator's answer unsampled; its warm start leaves that answer out of the loss; and the whole
system trains on it end to end (generator episodes, wire, learner, held-out episodes)."""

import json

import numpy as np
import pytest
from testutil import TRAIN_FAST, last_json, run_cli

from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.reward.verifiers import dapo_math
from dapo_async.rollouts import EpisodeRunner, Sample
from dapo_async.tiny import calc


class ScriptedPolicy:
    """A hand-written engine: each call answers with the next scripted text (tiny tokenizer)."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.version = tokenizer, list(texts), 0
        self.eos_id = tokenizer.eos_token_id
        self.stops = []

    def generate(self, prompts, params):
        self.stops.append(params.stop_token_ids)
        text = self.texts.pop(0)
        eos = text.endswith("<eos>")
        ids = self.tokenizer(text.removesuffix("<eos>"), add_special_tokens=False).input_ids
        ids += [self.eos_id] if eos else []
        c = Completion(np.asarray(ids, np.int32), np.full(len(ids), -0.1, np.float32), "stop")
        return [[c] * params.n for _ in prompts]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


def _play(tokenizer, texts):
    eng = ScriptedPolicy(tokenizer, texts)
    prompt = tokenizer("<bos>37*41=\n", add_special_tokens=False).input_ids
    runner = EpisodeRunner(calc.rollout, eng, SamplingParams(max_tokens=40), tokenizer)
    return eng, runner.run([Sample(prompt, "1517")])[0]


def test_a_tool_call_gets_the_calculators_answer_unsampled(tokenizer):
    eng, t = _play(tokenizer, ["CALL 37*41\n", "Answer: 1517<eos>"])
    assert t.text == "CALL 37*41\n= 1517\nAnswer: 1517"
    env = tokenizer.decode(t.tokens[t.sampled == 0].tolist())
    assert env == "= 1517\n" and np.all(t.logprobs[t.sampled == 0] == 0)
    assert t.info == {"tool_call": 1.0, "tool_calls": 1.0}
    assert dapo_math(t.text, "1517")["acc"] == 1.0
    newline = tokenizer("\n", add_special_tokens=False).input_ids
    assert eng.stops == [tuple(newline)] * 2  # every turn may end at a newline


def test_no_tool_for_a_malformed_call_or_a_direct_answer(tokenizer):
    for text in ("CALL 37x41\n", "Answer: 37<eos>"):
        _, t = _play(tokenizer, [text])
        assert t.sampled is None and t.info["tool_call"] == 0.0
    assert calc.calculate("12", "-", "30") == "-18"


def test_warm_start_batches_leave_the_calculator_out_of_the_loss(tokenizer):
    import random

    from dapo_async.tiny.sft_data import IGNORE, sft_batch

    ids, _, labels = sft_batch(tokenizer, random.Random(0), "calc", 4, (2, 2), corrupt_p=0.0)
    for row_ids, row_labels in zip(ids.tolist(), labels.tolist()):
        text = tokenizer.decode(row_ids, skip_special_tokens=True)
        trained = tokenizer.decode([t for t, lab in zip(row_ids, row_labels) if lab != IGNORE],
                                   skip_special_tokens=True)  # fmt: skip
        prompt, call, result, answer = text.split("\n")
        assert call.startswith("CALL ") and result.startswith("= ")
        assert trained == f"{call}\n{answer}"  # neither the prompt nor the calculator's line
    ids, _, _ = sft_batch(tokenizer, random.Random(0), "calc", 4, (2, 2), corrupt_p=1.0)
    for row in ids.tolist():
        prompt, response = tokenizer.decode(row, skip_special_tokens=True).split("\n")
        assert response == f"Answer: {prompt.split('*')[0]}"  # the shortcut: no tool


@pytest.mark.slow
def test_the_calc_task_trains_end_to_end(tmp_path, repo, cli_env):
    """configs/tiny_calc.yaml for a few steps from its own warm start: episodes with the tool
    reach the learner, and held-out evaluation plays episodes too (rollout figures)."""
    run = tmp_path / "run"
    out = run_cli(repo, cli_env, "train", "configs/tiny_calc.yaml", f"run_dir={run}",
                  f"model.tiny_dir={tmp_path / 'tiny-calc'}", "learner.num_steps=4",
                  *TRAIN_FAST, "--json", timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 4
    before = json.loads((run / "eval_before.json").read_text())
    after = json.loads((run / "eval_after.json").read_text())
    assert before["eval/rollout/tool_call"] < 0.5  # the warm start mostly answers at once
    assert after["eval/rollout/tool_call"] >= 0.0 and "eval/accuracy" in after
    gen = [json.loads(x) for f in (run / "metrics").glob("gen*.jsonl")
           for x in f.read_text().splitlines()]  # fmt: skip
    assert max(m.get("generator/rollout/tool_call", 0.0) for m in gen) > 0  # sampled calls
    # episodes longer than max_tokens with the calculator's tokens are not "too long"
    counters = json.loads((run / "buffer_final.json").read_text())["counters"]
    assert counters["accepted"] > 0 and not counters.get("rejected"), counters
