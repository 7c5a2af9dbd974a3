"""The learner's device and dtype handling, proven on CPU: every tensor it makes names its
device (a run with the default device set to ``meta`` would fail on any that does not), fp32
master weights keep an update that bf16 parameters lose, the training world gets the configured
collective timeout, and a checkpoint's trainer state is loaded onto the host."""

import torch
from learner_helpers import build_trainer, make_config, synthetic_groups

from dapo_async.learner import checkpoint
from dapo_async.learner import role as learner_role


def test_every_trainer_tensor_names_its_device(tiny_model):
    """With the default device set to meta, a tensor made without ``device=`` lands on meta and
    the step fails (the model is on the CPU). The first step runs normally: AdamW creates its
    own state lazily, inside torch."""
    for extra, ref in (([], False), (["algo.objective=dpo"], False), (["algo.kl_coef=0.1"], True)):
        overrides = [*extra, "algo.objective=ppo_kl"] if ref else extra
        trainer = build_trainer(tiny_model, make_config(*overrides), ref=ref)
        trainer.step(synthetic_groups(0, 4))
        torch.set_default_device("meta")
        try:
            metrics = trainer.step(synthetic_groups(1, 4))
        finally:
            torch.set_default_device(None)
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))
        assert all(p.device.type == "cpu" for p in trainer.model.parameters())


def _fraction_changed(tiny_model, param_dtype: torch.dtype, compute: str) -> float:
    cfg = make_config("learner.lr=1e-6", "learner.grad_clip=0", f"learner.compute_dtype={compute}")
    trainer = build_trainer(tiny_model, cfg, dtype=param_dtype)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.step(synthetic_groups(0, 4))
    changed = total = 0
    for k, v in trainer.model.named_parameters():
        changed += int((v.detach() != before[k]).sum())
        total += v.numel()
    return changed / total


def test_fp32_master_weights_keep_a_small_update(tiny_model):
    """lr 1e-6: Adam moves each weight by about 1e-6, far below bf16's resolution at the
    weights' scale. bf16 compute over fp32 parameters keeps the update; bf16 parameters (what
    ``model.dtype=bfloat16`` gave the learner) lose almost all of it."""
    master = _fraction_changed(tiny_model, torch.float32, "bfloat16")
    bf16_params = _fraction_changed(tiny_model, torch.bfloat16, "bfloat16")
    assert master > 0.8
    assert bf16_params < 0.2


def test_bf16_compute_runs_under_autocast(tiny_model):
    trainer = build_trainer(tiny_model, make_config("learner.compute_dtype=bfloat16"))
    assert trainer.par.autocast_dtype == torch.bfloat16
    assert next(trainer.model.parameters()).dtype == torch.float32
    trainer_fp32 = build_trainer(tiny_model, make_config())  # auto on CPU: float32, no autocast
    assert trainer_fp32.par.autocast_dtype is None


def test_training_world_gets_the_collective_timeout(monkeypatch):
    got = {}

    def fake_init(backend, **kwargs):
        got.update(kwargs, backend=backend)

    monkeypatch.setattr(torch.distributed, "init_process_group", fake_init)
    cfg = make_config("learner.collective_timeout_s=123")
    learner_role.init_process_group(cfg, 2, torch.device("cpu"))
    assert got["backend"] == "gloo"
    assert got["timeout"].total_seconds() == 123
    assert got["device_id"] is None  # bound (eager NCCL init) on GPUs only


def test_trainer_state_is_loaded_onto_the_host(monkeypatch, tmp_path):
    """Without ``map_location`` every rank would restore its optimizer state onto the device it
    was saved from (cuda:0 for all of them)."""
    torch.save({"version": 3}, tmp_path / checkpoint.TRAINER_STATE)
    seen = {}
    real_load = torch.load

    def recording_load(path, **kwargs):
        seen.update(kwargs)
        return real_load(path, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    assert checkpoint.load_trainer_state(tmp_path)["version"] == 3
    assert seen["map_location"] == "cpu" and seen["weights_only"] is True


def test_rng_state_has_a_cuda_entry_that_round_trips():
    """Every generator in use comes back: python, numpy, torch, and each GPU's where CUDA is
    initialised (on a GPU machine an earlier test may have done so: the entry follows that)."""
    import random

    import numpy as np

    def draws():
        out = [random.random(), float(np.random.rand()), float(torch.rand(1))]
        if torch.cuda.is_initialized():
            out.append(float(torch.rand(1, device="cuda")))
        return out

    state = checkpoint.rng_state()
    want_cuda = torch.cuda.device_count() if torch.cuda.is_initialized() else 0
    assert len(state["cuda"]) == want_cuda
    first = draws()
    checkpoint.set_rng_state(state)
    assert draws() == first
