import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_async.data.cursor import PromptCursor
from dapo_async.data.datasets import DataError, group_repeats, load_file, load_source
from dapo_async.data.tasks import generate, make_example

DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{q}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def dapo_rows(n, repeat=1):
    rows = []
    for i in range(n):
        for _ in range(repeat):
            rows.append(
                {
                    "data_source": "math_dapo",
                    "prompt": [
                        {"role": "user", "content": DAPO_PROMPT.format(q=f"What is {i}+1?")}
                    ],
                    "ability": "MATH",
                    "reward_model": {"ground_truth": str(i + 1), "style": "rule-lighteval/MATH_v2"},
                    "extra_info": {"index": f"id-{i}"},
                }
            )
    return rows


def test_parquet_in_dapo_schema(tmp_path):
    p = tmp_path / "dapo.parquet"
    pq.write_table(pa.Table.from_pylist(dapo_rows(5)), p)
    recs = load_file(p)
    assert len(recs) == 5
    assert recs[2].ground_truth == "3" and recs[2].data_source == "math_dapo"
    assert (
        recs[2].messages[0]["role"] == "user" and "What is 2+1?" in recs[2].messages[0]["content"]
    )
    assert recs[2].extra["index"] == "id-2"


def test_jsonl_and_eval_repeats(tmp_path):
    p = tmp_path / "aime.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in dapo_rows(3, repeat=4)) + "\n")
    recs = load_file(p)
    assert len(recs) == 12
    folded = group_repeats(recs)
    assert [k for _, k in folded] == [4, 4, 4]
    assert [r.ground_truth for r, _ in folded] == ["1", "2", "3"]


def test_bad_files_raise_clear_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_file(tmp_path / "missing.parquet")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(DataError, match="ground_truth"):
        load_file(bad)
    bad.write_text("{not json\n")
    with pytest.raises(DataError, match="line 1"):
        load_file(bad)
    csv = tmp_path / "x.csv"
    csv.write_text("a")
    with pytest.raises(DataError, match="unsupported"):
        load_file(csv)


def test_builtin_tasks_are_deterministic_and_splits_disjoint():
    a = generate("chain", "train", 100, 3, seed=1)
    b = generate("chain", "train", 100, 3, seed=1)
    assert [r.messages for r in a] == [r.messages for r in b]
    train = {r.messages[0]["content"] for r in generate("chain", "train", 4096, 3, seed=1)}
    held = generate("chain", "eval", 256, 3, seed=1)
    assert len(held) == 256 and not train & {r.messages[0]["content"] for r in held}
    arith = generate("arith", "eval", 64, 2, seed=0)
    assert all(r.data_source == "tiny:arith" for r in arith)
    with pytest.raises(ValueError):
        load_source("tiny:nope", "train", 1, 1, 0)


def test_task_solutions_verify():
    import random

    from dapo_async.reward.verifiers import dapo_math

    rng = random.Random(0)
    for family in ("arith", "chain"):
        for d in (1, 2, 3):
            prompt, truth, solution = make_example(family, rng, d)
            assert dapo_math(solution, truth)["acc"] == 1.0
    # chain length grows with difficulty
    assert len(make_example("chain", rng, 5)[2]) > len(make_example("chain", rng, 1)[2])


def test_cursor_shuffles_per_epoch_and_resumes():
    c = PromptCursor(10, seed=3)
    first = [c.next() for _ in range(10)]
    assert sorted(first) == list(range(10))
    second = [c.next() for _ in range(4)]
    assert c.epoch == 1 and second != first[:4]
    state = json.loads(json.dumps(c.state()))
    c.requeue(first[0])
    c2 = PromptCursor.from_state(state)
    c2.requeue(first[0])
    assert [c.next() for _ in range(8)] == [c2.next() for _ in range(8)]
    with pytest.raises(ValueError):
        PromptCursor(0)


def test_mixed_difficulty_draws_each_prompt_in_range_and_keeps_fixed_streams():
    from dapo_async.data.tasks import steps_correct

    mixed = generate("chain", "train", 400, 2, seed=0, max_difficulty=8)
    steps = [
        r.messages[0]["content"].count("+") + r.messages[0]["content"].count("-") for r in mixed
    ]
    assert min(steps) == 2 and max(steps) == 8 and len(set(steps)) == 7
    # a fixed difficulty draws nothing extra: the streams are what they were
    assert [r.messages for r in generate("chain", "eval", 20, 3, 0, max_difficulty=3)] == [
        r.messages for r in generate("chain", "eval", 20, 3, 0)
    ]
    assert (
        load_source("tiny:chain", "eval", 30, 2, 0, 8)[0].messages
        == generate("chain", "eval", 30, 2, 0, 8)[0].messages
    )
    assert not steps_correct("chain", "1+2=", "Answer: 3")


def test_steps_correct_checks_every_step_whatever_the_answer():
    from dapo_async.data.tasks import steps_correct, worked_steps

    assert worked_steps("chain", "9-5+2+1=") == "9-5=4;4+2=6;6+1=7"
    assert steps_correct("chain", "9-5+2+1=", "9-5=4;4+2=6;6+1=7;Answer: 7")
    assert steps_correct("chain", "9-5+2+1=", "9-5=4;4+2=6;6+1=7;Answer: 9")  # the shortcut
    # an operand mis-copied, a step missing, no answer line
    assert not steps_correct("chain", "9-5+2+1=", "9-5=4;4+1=5;5+1=6;Answer: 9")
    assert not steps_correct("chain", "9-5+2+1=", "9-5=4;4+2=6;Answer: 7")
    assert not steps_correct("chain", "9-5+2+1=", "9-5=4;4+2=6;6+1=7")
    assert steps_correct("arith", "12+3=", "Answer: 15")
    for d in range(1, 9):
        prompt, _, solution = make_example("chain", __import__("random").Random(d), d)
        assert steps_correct("chain", prompt, solution)


def test_max_difficulty_is_validated():
    from dapo_async.config import ConfigError, load_config

    with pytest.raises((ConfigError, ValueError), match="max_difficulty"):
        load_config("configs/tiny_cpu.yaml", ["data.max_difficulty=2"])  # below difficulty 3


def test_the_heldout_sample_is_fixed_across_run_seeds_unless_asked():
    from dapo_async.config import DataConfig
    from dapo_async.data.datasets import load_heldout

    def prompts(data, run_seed):
        return [r.messages[0]["content"] for r in load_heldout(data, run_seed)]

    data = DataConfig(source="tiny:chain", difficulty=3, num_eval=64)
    assert prompts(data, 0) == prompts(data, 1)  # eval_seed 0: the same prompts for every run
    data.eval_seed = -1
    assert prompts(data, 0) != prompts(data, 1)  # the run's seed draws them
    assert prompts(data, 0) == prompts(
        DataConfig(source="tiny:chain", difficulty=3, num_eval=64), 5
    )
    data.eval_source = "tiny:arith"  # eval_source wins over source
    assert all(set(p) <= set("0123456789+-*=") for p in prompts(data, 0))
