"""Held-out evaluation's arithmetic (``evaluation.py``) with a hand-written engine: repeated rows
are folded into one prompt sampled repeats × k times, avg@k weights prompts by their rows, pass@k
is the unbiased estimate from every sample, and greedy samples a repeated prompt once."""

import numpy as np
import pytest

from dapo_async.config import load_config
from dapo_async.data.tasks import PromptRecord
from dapo_async.engines.base import Completion
from dapo_async.evaluation import evaluate_engine, pass_at_k


class ScriptedEngine:
    """Answers prompt i with the texts of ``answers[i]`` (cycled), recording each call's n."""

    def __init__(self, answers: dict[str, list[str]]):
        self.answers = answers
        self.calls: list[tuple[int, int]] = []  # (prompts, n)

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params.n))
        out = []
        for ids in prompts:
            texts = self.answers[self.tokenizer.decode(ids)]
            out.append([self._c(texts[j % len(texts)]) for j in range(params.n)])
        return out

    @staticmethod
    def _c(text):
        return Completion(np.zeros(3, np.int32), np.zeros(3, np.float32), "stop", text=text)


class CharTokenizer:
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return type("T", (), {"input_ids": [ord(c) for c in text]})()

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _record(q: str, source: str = "s") -> PromptRecord:
    return PromptRecord(0, [{"role": "user", "content": q}], "7", source, {})


def _run(records, answers, temperature, k):
    cfg = load_config(
        None, ["data.prompt_format=raw", f"generator.eval_temperature={temperature}",
               f"generator.eval_k={k}", "reward.fn=boxed"],
    )  # fmt: skip
    engine = ScriptedEngine(answers)
    engine.tokenizer = CharTokenizer()
    return evaluate_engine(engine, engine.tokenizer, cfg, records), engine.calls


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 − C(3,2)/C(4,2)
    assert pass_at_k(4, 3, 2) == 1.0 and pass_at_k(128, 0, 4) == 0.0


def test_repeated_rows_are_folded_and_weighted():
    right, wrong = "\\boxed{7}", "\\boxed{1}"
    records = [_record("a")] * 3 + [_record("b", "t")]
    answers = {"a": [right, wrong, wrong, wrong], "b": [right]}
    res, calls = _run(records, answers, temperature=1.0, k=2)
    assert sorted(calls) == [(1, 2), (1, 6)]  # "a": 3 rows × k; "b": 1 row × k
    # a: 6 samples cycling r,w,w,w,r,w → 2/6 right; weight 3. b: all right; weight 1
    assert res["eval/accuracy"] == pytest.approx((3 * 2 / 6 + 1 * 1.0) / 4)
    assert res["eval/pass_at_k"] == pytest.approx((3 * pass_at_k(6, 2, 2) + 1.0) / 4)
    assert res["eval/num_prompts"] == 2 and res["eval/num_rows"] == 4 and res["eval/k"] == 2
    assert res["eval/t/accuracy"] == 1.0 and res["eval/s/pass_at_k"] == pass_at_k(6, 2, 2)


def test_greedy_samples_a_repeated_prompt_once():
    records = [_record("a")] * 32
    res, calls = _run(records, {"a": ["\\boxed{7}"]}, temperature=0.0, k=4)
    assert calls == [(1, 1)] and res["eval/k"] == 1
    assert res["eval/accuracy"] == 1.0 and res["eval/num_rows"] == 32
