"""Custom reward functions in every documented form — a bare float or a dict; two arguments
``(response, ground_truth)`` or four ``(prompt, response, ground_truth, extra_info)`` — score
through the reward pool and through held-out evaluation, from a user's own JSONL file."""

import json
import random

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from dapo_async.config import load_config
from dapo_async.data.datasets import load_file
from dapo_async.data.tasks import make_example
from dapo_async.evaluation import evaluate_records
from dapo_async.reward.compose import call_verifier, takes_context
from dapo_async.reward.pool import RewardPool

FORMS = ["two_float", "two_dict", "four_float", "four_dict"]


def write_user_jsonl(path, n: int = 64) -> None:
    """Tiny-task prompts in the DAPO-Math schema, with the markers ``custom_rewards`` checks."""
    rng = random.Random(5)
    rows = []
    for i in range(n):
        prompt, truth, _ = make_example("chain", rng, 3)
        rows.append(
            {
                "data_source": "user",
                "prompt": [{"role": "user", "content": prompt}],
                "reward_model": {"ground_truth": "TRUTH"},
                "extra_info": {"index": i, "question": prompt, "answer": truth},
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_forms_are_told_apart():
    import custom_rewards as cr

    assert not takes_context(cr.two_float) and takes_context(cr.four_dict)
    for name in FORMS:
        fn = getattr(cr, name)
        got = call_verifier(fn, "xy", "TRUTH", "<q>1+2=</q>", {"question": "1+2="})
        assert got["score"] == 1.0 and got["acc"] == 1.0, name


@pytest.mark.parametrize("form", FORMS)
def test_each_form_scores_in_the_pool_and_in_evaluation(form, tiny_model, tmp_path):
    fn = f"custom_rewards:{form}"
    data = tmp_path / "user.jsonl"
    write_user_jsonl(data, 12)
    with RewardPool(fn, num_workers=1, timeout_s=10) as pool:
        res = pool.score_batch([("xy", "TRUTH", "<q>1+2=</q>", {"question": "1+2="})])
    assert res[0]["acc"] == 1.0 and res[0]["tag"] == "ok"
    cfg = load_config(None, [f"reward.fn={fn}", f"data.source={data}"])
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    ev = evaluate_records(model, tok, cfg, load_file(data))
    assert ev["eval/num_prompts"] == 12
    # a form whose arguments went astray (or a float that evaluation could not read) scores 0
    assert ev["eval/accuracy"] > 0
