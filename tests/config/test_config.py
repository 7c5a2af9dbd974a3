import subprocess
import sys

import pytest
import yaml

from dapo_async import config as C


def test_default_yaml_loads_and_validates(repo):
    cfg = C.load_config(repo / "configs" / "tiny_cpu.yaml")
    assert cfg.algo.clip_low == 0.2 and cfg.algo.clip_high == 0.28
    assert cfg.generator.engine == "hf"
    assert cfg.launch.host == "127.0.0.1"


def test_dotted_override_sets_value_and_type(repo):
    cfg = C.load_config(
        repo / "configs" / "tiny_cpu.yaml", ["algo.clip_high=0.3", "learner.num_steps=7"]
    )
    assert cfg.algo.clip_high == 0.3
    assert cfg.learner.num_steps == 7 and isinstance(cfg.learner.num_steps, int)


def test_unknown_key_names_path_and_suggests(repo):
    with pytest.raises(C.ConfigError) as e:
        C.load_config(repo / "configs" / "tiny_cpu.yaml", ["algo.clip_hihg=0.3"])
    assert e.value.key == "algo.clip_hihg"
    assert "clip_high" in str(e.value)


def test_unknown_key_in_yaml_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("buffer:\n  max_stalenes: 2\n")
    with pytest.raises(C.ConfigError) as e:
        C.load_config(p)
    assert e.value.key == "buffer.max_stalenes" and "max_staleness" in str(e.value)


@pytest.mark.parametrize(
    "override,key",
    [
        ("algo.clip_low=1.0", "algo.clip_low"),
        ("algo.clip_low=1.5", "algo.clip_low"),
        ("buffer.max_staleness=-1", "buffer.max_staleness"),
        ("buffer.max_staleness=abc", "buffer.max_staleness"),
        ("generator.engine=tensorrt", "generator.engine"),
        ("generator.responses_per_prompt=1", "generator.responses_per_prompt"),
        ("algo.loss_agg=sum", "algo.loss_agg"),
        ("learner.lr=0", "learner.lr"),
        ("reward.overlong_cache_len=100", "reward.overlong_cache_len"),
        ("reward.overlong_max_len=100", "reward.overlong_max_len"),
    ],
)
def test_bad_values_fail_fast_with_key(repo, override, key):
    with pytest.raises(C.ConfigError) as e:
        C.load_config(repo / "configs" / "tiny_cpu.yaml", [override])
    assert e.value.key == key, str(e.value)


def test_bad_yaml_and_missing_file(tmp_path):
    with pytest.raises(C.ConfigError, match="not found"):
        C.load_config(tmp_path / "nope.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("algo: [1, 2\n")
    with pytest.raises(C.ConfigError, match="YAML"):
        C.load_config(p)
    p.write_text("- 1\n- 2\n")
    with pytest.raises(C.ConfigError, match="mapping"):
        C.load_config(p)


def test_resolved_config_round_trips(tmp_path, repo):
    cfg = C.load_config(repo / "configs" / "tiny_cpu.yaml", ["algo.clip_high=0.31"])
    out = C.save_resolved(cfg, tmp_path / "run")
    again = C.load_config(out)
    assert again == cfg
    assert yaml.safe_load(out.read_text())["algo"]["clip_high"] == 0.31
    assert C.from_dict(C.to_dict(cfg)) == cfg


def test_every_field_is_documented():
    rows = C.field_docs()
    assert len(rows) > 60
    missing = [k for k, doc, _, _ in rows if not doc]
    assert missing == []


def test_config_module_does_not_import_torch():
    code = "import sys, dapo_async.config, dapo_async.protocol; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_cli_config_show_and_typo(cli_env, repo):
    ok = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "config",
            "show",
            "configs/tiny_cpu.yaml",
            "algo.clip_high=0.3",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
    )
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout)["algo"]["clip_high"] == 0.3
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_async.cli",
            "config",
            "show",
            "configs/tiny_cpu.yaml",
            "algo.clip_hihg=0.3",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
    )
    assert bad.returncode != 0
    assert "algo.clip_hihg" in bad.stderr and "clip_high" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_cli_help_lists_subcommands(cli_env, repo):
    out = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "--help"],
        capture_output=True,
        text=True,
        cwd=repo,
        env=cli_env,
    )
    assert out.returncode == 0
    for name in (
        "train",
        "buffer",
        "learner",
        "generator",
        "eval",
        "bench",
        "init-tiny",
        "config",
        "keys",
    ):
        assert name in out.stdout


def test_config_docs_into_a_closed_pipe_is_quiet(repo, cli_env):
    """`dapo-async config docs | head -2`: the reader closes early; no traceback, exit 0."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "dapo_async.cli", "config", "docs"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=repo, env=cli_env,
    )  # fmt: skip
    proc.stdout.close()  # like `head` that already has its lines: the pipe closes early
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err, err.decode()[-2000:]


def test_configuration_doc_is_what_config_docs_prints(repo, cli_env):
    """docs/configuration.md's table is `dapo-async config docs` verbatim (regenerate it with
    that command after changing a field)."""
    out = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "config", "docs"],
        capture_output=True, text=True, cwd=repo, env=cli_env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = (repo / "docs" / "configuration.md").read_text()
    table = doc[doc.index("| key | default | accepts | description |") :]
    assert table == out.stdout


@pytest.mark.parametrize(
    "overrides,key,words",
    [
        # real lengths with the tiny overlong L_max: a 1000-token correct answer would score 0
        (["generator.max_tokens=20000", "reward.overlong_max_len=24"], "reward.overlong_max_len",
         "generator.max_tokens is 20000"),
        # max_tokens beyond the model length
        (["generator.max_tokens=300", "reward.overlong_max_len=0"], "generator.max_model_len",
         "32 + 300 = 332"),
        (["reward.overlong_max_len=30"], "reward.overlong_max_len", "is 30"),
    ],
)  # fmt: skip
def test_lengths_that_disagree_fail_in_one_line_naming_the_keys(repo, overrides, key, words):
    with pytest.raises(C.ConfigError) as e:
        C.load_config(repo / "configs" / "tiny_cpu.yaml", overrides)
    assert e.value.key == key and words in str(e.value) and "\n" not in str(e.value)


def test_overlong_max_len_is_derived_from_max_tokens(repo):
    cfg = C.load_config(
        repo / "configs" / "tiny_cpu.yaml",
        ["generator.max_tokens=100", "reward.overlong_max_len=0", "generator.max_model_len=256"],
    )
    assert cfg.reward.overlong_max_len == 100
    assert (
        C.load_config(None, []).reward.overlong_max_len
        == C.load_config(None, []).generator.max_tokens
    )


def test_every_shipped_config_loads(repo):
    for path in sorted((repo / "configs").glob("*.yaml")):
        C.load_config(path, [])


def test_config_show_accepts_the_real_model_example(repo, cli_env):
    out = subprocess.run(
        [sys.executable, "-m", "dapo_async.cli", "config", "show", "configs/qwen2.5_32b_dapo.yaml"],
        capture_output=True, text=True, cwd=repo, env=cli_env, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    cfg = yaml.safe_load(out.stdout)
    assert cfg["generator"]["max_tokens"] == 20480 and cfg["reward"]["overlong_max_len"] == 20480
    assert cfg["algo"]["clip_high"] == 0.28 and cfg["learner"]["compute_dtype"] == "bfloat16"
