"""Held-out evaluation (``evaluation.py``, run by the learner and the evaluator role) with the
policy on a simulated accelerator (tests/simdevice.py): it evaluates where the model lives and
scores what the CPU scores, greedy and sampled."""

import pytest
from simdevice import sim_device
from transformers import AutoModelForCausalLM, AutoTokenizer

from dapo_async.config import load_config
from dapo_async.data.datasets import load_heldout
from dapo_async.evaluation import evaluate_records


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_evaluation_on_the_models_device_scores_what_the_cpu_scores(tiny_model, temperature):
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model}",
            "data.num_eval=8",
            f"eval.temperature={temperature}",
        ],
    )
    records = load_heldout(cfg.data, cfg.seed)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    want = evaluate_records(model, tok, cfg, records, k=2)
    with sim_device():
        got = evaluate_records(model.to("meta"), tok, cfg, records, k=2)
    assert next(model.parameters()).device.type == "meta"
    assert got == pytest.approx(want)
