"""Hugging Face Hub ids (``hub.py``) resolved offline from a cache this test lays out as
huggingface_hub keeps one (``models--org--name/refs/main`` → ``snapshots/<commit>/``): a model id
and a dataset id run `config check` and `eval`; a revision picks its snapshot; an id missing from
the cache is one line that says what to do; a local path always wins."""

import json
import shutil

import pytest
from real_shaped import write_jsonl

from dapo_async.hub import HUB_ID, is_hub_id

COMMIT, OLD = "a" * 40, "b" * 40


def _lay_out(cache, kind: str, repo: str, files: dict, commit=COMMIT, ref="main"):
    root = cache / f"{kind}s--{repo.replace('/', '--')}"
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, snap / name)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def hub_env(tmp_path, tiny_model, cli_env):
    cache = tmp_path / "hub"
    model_files = {p.name: p for p in tiny_model.iterdir() if p.is_file()}
    _lay_out(cache, "model", "acme/tiny", model_files)
    data = write_jsonl(tmp_path / "train.jsonl", n=8)
    _lay_out(cache, "dataset", "acme/math", {"data/train.jsonl": data})
    return {**cli_env, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}, cache


def _cli(python, env, *argv):
    import subprocess

    return subprocess.run(
        [python, "-m", "dapo_async.cli", *argv], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip


def test_a_model_and_a_dataset_by_id_from_the_cache(python, repo, hub_env):
    env, _ = hub_env
    ok = _cli(python, env, "config", "check", str(repo / "configs" / "tiny_cpu.yaml"),
              "model.path=acme/tiny", "data.source=acme/math", "data.prompt_format=raw",
              "data.max_prompt_len=64")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    res = _cli(python, env, "eval", "--model", "acme/tiny", "--num-prompts", "4", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1])["num_prompts"] == 4


def test_a_revision_and_a_missing_id(python, repo, hub_env, tmp_path):
    from dapo_async.hub import resolve_model

    env, cache = hub_env
    old = _lay_out(cache, "model", "acme/tiny", {}, commit=OLD, ref="v1")
    monkey = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    code = (
        "from dapo_async.hub import resolve_model\n"
        "print(resolve_model('model.path', 'acme/tiny@v1'))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, **monkey}, timeout=120)  # fmt: skip
    assert out.stdout.strip() == str(old), out.stderr
    bad = _cli(python, env, "learner", str(repo / "configs" / "tiny_cpu.yaml"),
               "model.path=acme/absent")  # fmt: skip
    err = [line for line in bad.stderr.splitlines() if line.strip()]
    assert bad.returncode == 1 and len(err) == 1, err
    assert "acme/absent is not in the Hugging Face cache" in err[0] and "hf download" in err[0]
    assert resolve_model("model.path", str(tmp_path)) == str(tmp_path)  # local wins


def test_what_counts_as_a_hub_id(tmp_path):
    assert is_hub_id("Qwen/Qwen2.5-Math-7B") and is_hub_id("org/name@v1.0")
    assert is_hub_id("BytedTsinghua-SIA/DAPO-Math-17k:data/dapo-math-17k.parquet")
    assert HUB_ID.match("org/name:data/x.parquet")["file"] == "data/x.parquet"
    for local in ("/models/x", "./x/y", "tiny:chain", "a/b/c", str(tmp_path)):
        assert not is_hub_id(local), local
