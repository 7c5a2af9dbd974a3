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
        None, ["data.prompt_format=raw", f"eval.temperature={temperature}",
               f"eval.k={k}", "reward.fn=boxed"],
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


def test_the_eval_section_sets_the_sampling_and_length():
    """eval.top_p and eval.max_tokens (0 = generator.max_tokens) reach the engine."""
    seen = []

    class Recording(ScriptedEngine):
        def generate(self, prompts, params):
            seen.append(params)
            return super().generate(prompts, params)

    for extra, want_tokens in ((["eval.max_tokens=7"], 7), ([], 24)):
        cfg = load_config(
            None, ["data.prompt_format=raw", "eval.temperature=1.0", "eval.top_p=0.7",
                   "eval.k=2", "reward.fn=boxed", *extra],
        )  # fmt: skip
        engine = Recording({"a": ["\\boxed{7}"]})
        engine.tokenizer = CharTokenizer()
        evaluate_engine(engine, engine.tokenizer, cfg, [_record("a")])
        assert (seen[-1].top_p, seen[-1].max_tokens, seen[-1].n) == (0.7, want_tokens, 2)


def test_old_eval_keys_and_a_too_long_eval_name_the_key():
    from dapo_async.config import ConfigError

    with pytest.raises(ConfigError, match=r"generator.eval_k.*moved to eval.k"):
        load_config(None, ["generator.eval_k=4"])
    with pytest.raises(ConfigError, match=r"eval.max_tokens.*generator.max_model_len"):
        load_config(None, ["eval.max_tokens=1000"])
    with pytest.raises(ConfigError, match=r"eval.engine"):
        load_config(None, ["eval.engine=sglang"])


def test_the_learners_evaluation_computes_in_the_generators_dtype(tiny_model):
    """Before/after evaluations run on the learner's fp32 master weights; they compute in
    generator.dtype (bfloat16 on a GPU by default), as the generators sample."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_async.data.datasets import load_heldout
    from dapo_async.evaluation import evaluate_records

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    dtypes = []
    model.lm_head.register_forward_hook(lambda m, i, out: dtypes.append(out.dtype))
    for dtype, want in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        cfg = load_config(None, [f"model.path={tiny_model}", "data.num_eval=2",
                                 f"generator.dtype={dtype}", "eval.max_tokens=4"])  # fmt: skip
        dtypes.clear()
        evaluate_records(model, tok, cfg, load_heldout(cfg.data, cfg.seed))
        assert dtypes and set(dtypes) == {want}
    assert next(model.parameters()).dtype == torch.float32  # the master weights untouched


def test_the_evaluators_vllm_must_fit_beside_generator_0():
    """The evaluator's vLLM shares generator 0's GPU: the two memory fractions must fit."""
    from dapo_async.config import ConfigError

    vllm_eval = ["generator.engine=vllm", "learner.eval_every=5"]
    with pytest.raises(ConfigError, match=r"eval\.gpu_memory_utilization.*eval\.engine=hf"):
        load_config(None, [*vllm_eval, "generator.gpu_memory_utilization=0.9"])
    load_config(None, [*vllm_eval, "generator.gpu_memory_utilization=0.7"])
    load_config(None, [*vllm_eval, "generator.gpu_memory_utilization=0.9", "eval.engine=hf"])
    for name in ("qwen2.5_math_7b_dapo", "qwen2.5_32b_dapo"):  # as shipped
        load_config(f"configs/{name}.yaml", [])
