"""The command line: each sub-command's own options, overrides anywhere after the config."""

import pytest

from dapo_async.cli import build_parser, main, parse_args


def test_a_bench_refuses_another_benchs_option(capsys):
    parser = build_parser()
    assert parser.parse_args(["bench", "ablation", "--stream"]).stream
    with pytest.raises(SystemExit):
        main(["bench", "transport", "--stream"])
    err = capsys.readouterr().err
    assert "dapo-async bench transport: error: unrecognized arguments: --stream" in err


def test_overrides_may_follow_options_and_other_words_are_refused(capsys):
    args = parse_args(["tune", "c.yaml", "a.b=1", "--steps", "3", "c.d=2", "--json", "e.f=x"])
    assert args.overrides == ["a.b=1", "c.d=2", "e.f=x"] and args.steps == 3 and args.json
    assert parse_args(["bench", "async", "--rounds", "2", "x.y=1"]).overrides == ["x.y=1"]
    with pytest.raises(SystemExit):
        parse_args(["train", "c.yaml", "--json", "stray"])
    assert "dapo-async train: error: unrecognized arguments: stray" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a command without overrides takes no k=v
        parse_args(["keys", "--out", "d", "a.b=1"])


# --------------------------------------------------------------------- one line per bad input


def _cli_lines(python, cli_env, *argv, stdin=""):
    import subprocess

    res = subprocess.run(
        [python, "-m", "dapo_async.cli", *argv],
        input=stdin, capture_output=True, text=True, env=cli_env, timeout=120,
    )  # fmt: skip
    return res.returncode, [line for line in res.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("role", ["learner", "generator", "evaluator", "buffer"])
def test_a_missing_model_is_one_line_from_every_role(python, cli_env, role):
    rc, err = _cli_lines(python, cli_env, role, "configs/tiny_cpu.yaml", "model.path=/nope/m")
    assert rc == 1 and len(err) == 1, err
    assert err[0] == f"dapo-async {role}: error: model.path: /nope/m does not exist"


def test_eval_with_a_missing_model_and_a_role_before_init_tiny(python, cli_env, tmp_path):
    rc, err = _cli_lines(python, cli_env, "eval", "--model", "/nope/m")
    assert rc == 1 and err == ["dapo-async eval: error: --model: /nope/m does not exist"]
    rc, err = _cli_lines(
        python, cli_env, "learner", "configs/tiny_cpu.yaml", f"model.tiny_dir={tmp_path}/t"
    )
    assert rc == 1 and len(err) == 1 and f"dapo-async init-tiny --out {tmp_path}/t" in err[0]


def test_config_mistakes_are_one_line_naming_what_was_wrong(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1, 2\nb: 3\n")
    cases = [
        (["config", "show", "configs/tiny_cpu.yaml", "learner=3"], "learner: is a section"),
        (["config", "show", str(bad)], f"{bad} is not valid YAML at line 2, column 2"),
        (["config", "show", str(tmp_path)], f"{tmp_path} is a directory, not a YAML"),
    ]
    for argv, want in cases:
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0], err


def test_reward_score_takes_every_documented_form(python, cli_env, repo):
    env = {**cli_env, "PYTHONPATH": f"{repo / 'tests' / 'reward'}:{cli_env['PYTHONPATH']}"}
    rc, _ = _cli_lines(
        python, env, "reward", "score", "--fn", "custom_rewards:four_float", "--ground-truth",
        "TRUTH", "--prompt", "say Q", "--extra-info", '{"question": "Q"}', stdin="ab",
    )  # fmt: skip
    assert rc == 0
    rc, err = _cli_lines(python, env, "reward", "score", "--fn", "nope", "--ground-truth", "1")
    assert rc == 1 and len(err) == 1 and "'code'" in err[0]
    rc, err = _cli_lines(
        python, env, "reward", "score", "--fn", "custom_rewards:four_float", "--ground-truth",
        "TRUTH", "--extra-info", "[1]",
    )  # fmt: skip
    assert rc == 1 and err == ["dapo-async reward: error: --extra-info must be a JSON object"]


def test_config_docs_explains_one_key_or_a_section(capsys):
    assert main(["config", "docs", "algo.clip_high"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("algo.clip_high = 0.28") and "clip" in out[1]
    assert main(["config", "docs", "weight_sync"]) == 0
    lines = capsys.readouterr().out.splitlines()
    keys = [line.split(" = ")[0] for line in lines if not line.startswith(" ")]
    assert "weight_sync.mode" in keys and all(k.startswith("weight_sync.") for k in keys)
    assert main(["config", "docs", "algo.clip_hihg"]) == 1
    assert "did you mean `clip_high`?" in capsys.readouterr().err


def test_python_api_overrides_train_errors_and_evaluate(tiny_model):
    import dapo_async
    from dapo_async.api import _overrides

    got = _overrides({"a.b": True}, {"algo__clip_high": 0.3, "data__sources": {"x": 1}})
    assert got == ["a.b=true", "algo.clip_high=0.3", 'data.sources={"x": 1}']
    with pytest.raises(RuntimeError, match="unknown key"):
        dapo_async.train("configs/tiny_cpu.yaml", algo__clip_hihg=0.3)
    res = dapo_async.evaluate(model=str(tiny_model), data__num_eval=4)
    assert res["k"] == 1 and res["num_prompts"] == 4 and 0.0 <= res["avg_at_k"] <= 1.0
