"""LoRA (``learner.lora_rank``): only the adapters train, the base weights stay as loaded, and
what leaves the learner — weight sync, checkpoints — is the merged model under the HF names
(loadable by transformers and vLLM as is)."""

import json

import torch
from learner_helpers import build_trainer, make_config, synthetic_groups
from testutil import TRAIN_FAST, last_json, max_generator_version, run_cli
from transformers import AutoModelForCausalLM

from dapo_async.learner.lora import ADAPTER_FILE, adapter_state, merged_state_dict


def test_only_adapters_train_and_the_merged_weights_carry_them(tiny_model):
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    trainer = build_trainer(tiny_model, make_config("learner.lora_rank=4", "learner.lr=1e-2"))
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)
    for step in range(2):
        trainer.step(synthetic_groups(step, 4))
    merged = trainer.par.full_state()
    assert set(merged) == set(base)  # the HF names, no adapter tensors
    changed = [k for k in base if not torch.equal(merged[k], base[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)
    # the base weights themselves are untouched (merging is out of place)
    for name, t in trainer.model.state_dict().items():
        if ".base_layer." in name:
            hf = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(t, base[hf])
    assert merged_state_dict(trainer.model).keys() == merged.keys()
    assert adapter_state(trainer.model)


def test_main_job_with_lora_syncs_and_checkpoints_merged_weights(
    tiny_model, tmp_path, repo, cli_env
):
    run = tmp_path / "run"
    out = run_cli(
        repo, cli_env, "train", "configs/tiny_cpu.yaml", f"model.path={tiny_model}",
        f"run_dir={run}", "learner.num_steps=3", *TRAIN_FAST, "learner.lora_rank=4",
        "learner.lr=5e-3", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert last_json(out)["steps"] == 3
    assert max_generator_version(run) >= 1
    ckpt = sorted((run / "checkpoints").glob("step-*"))[-1]
    assert (ckpt / ADAPTER_FILE).is_file()
    loaded = AutoModelForCausalLM.from_pretrained(str(ckpt)).state_dict()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model)).state_dict()
    assert loaded.keys() == base.keys()
    assert any(not torch.equal(loaded[k], base[k]) for k in base)  # the adapters, merged
    assert json.loads((ckpt / "meta.json").read_text())["version"] == 3


def test_a_resumed_learner_rebuilds_the_base_and_loads_the_adapters(tiny_model, tmp_path):
    import logging

    from dapo_async.learner import checkpoint
    from dapo_async.learner.role import Learner

    overrides = ("learner.lora_rank=4", "learner.lr=1e-2", f"model.path={tiny_model}")
    cfg = make_config(*overrides, f"run_dir={tmp_path / 'run'}")
    trainer = build_trainer(tiny_model, cfg)
    trainer.step(synthetic_groups(0, 4))
    merged = trainer.par.full_state()
    checkpoint.save(
        tmp_path / "run" / "checkpoints", 1, trainer.model.get_base_model(), tiny_model,
        trainer.state_dict(), state_dict=merged,
        tensors={ADAPTER_FILE: adapter_state(trainer.model)},
    )  # fmt: skip
    learner = Learner(cfg, 0, 1, True, logging.getLogger("test"), stop=False)
    learner.device = torch.device("cpu")
    model, _, _ = learner._load_models()
    resumed = merged_state_dict(model)
    assert resumed.keys() == merged.keys()
    assert all(torch.equal(resumed[k], merged[k]) for k in merged)
