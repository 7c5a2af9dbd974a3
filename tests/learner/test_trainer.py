"""Trainer steps on one rank: activation checkpointing, online DPO, the KL penalty against a
frozen reference, checkpoints that load in transformers with the trained weights."""

import numpy as np
import pytest
import torch
from learner_helpers import build_trainer, make_config, max_rel_err, synthetic_groups

from dapo_async.algo.dpo import dpo_pairs
from dapo_async.learner import checkpoint as C
from dapo_async.learner.batching import collate, groups_to_rows
from dapo_async.learner.logprobs import logprobs_from_full_logits


def params(trainer) -> dict:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def test_activation_checkpointing_gives_the_same_update(tiny_model):
    runs = []
    for ac in (False, True):
        trainer = build_trainer(tiny_model, make_config(f"learner.activation_checkpointing={ac}"))
        for step in range(2):
            trainer.step(synthetic_groups(step, 4))
        runs.append(params(trainer))
    assert max_rel_err(runs[1], runs[0]) <= 1e-6


def seq_logps(model, groups):
    rows = groups_to_rows(groups)
    mb = collate(rows, np.arange(len(rows)), pad_id=0)
    with torch.no_grad():
        logits = model(input_ids=mb.input_ids_BL, attention_mask=mb.attention_BL).logits
        logp = logprobs_from_full_logits(
            logits, mb.input_ids_BL, mb.resp_start_B, mb.resp_len_B, mb.mask_BT.shape[1]
        )
        return (logp * mb.mask_BT).sum(1), rows


def test_dpo_raises_the_chosen_over_the_rejected(tiny_model):
    trainer = build_trainer(
        tiny_model, make_config("algo.objective=dpo", "algo.dpo_beta=0.5", "learner.lr=3e-3")
    )
    groups = synthetic_groups(7, 4)
    before, rows = seq_logps(trainer.model, groups)
    metrics = {}
    for _ in range(3):
        metrics = trainer.step(groups)
    after, _ = seq_logps(trainer.model, groups)
    chosen, rejected = dpo_pairs(torch.from_numpy(rows.rewards), torch.from_numpy(rows.group))
    assert len(chosen) == len(groups)
    margin_before = before[chosen] - before[rejected]
    margin_after = after[chosen] - after[rejected]
    assert (margin_after > margin_before).all()
    assert metrics["train/dpo_num_pairs"] > 0
    assert 0.0 <= metrics["train/dpo_pref_acc"] <= 1.0
    assert trainer.version == 3


def test_kl_penalty_keeps_the_policy_near_the_reference(tiny_model):
    drift = {}
    for coef in (0.0, 5.0):
        cfg = make_config("algo.objective=ppo_kl", f"algo.kl_coef={coef}", "algo.track_kl_ref=true")
        trainer = build_trainer(tiny_model, cfg, ref=True)
        for step in range(4):
            m = trainer.step(synthetic_groups(step, 4))
        assert "train/kl_ref" in m and m["train/kl_ref"] >= 0.0
        drift[coef] = m["train/kl_ref"]
    assert drift[5.0] < drift[0.0]


def test_checkpoint_round_trip_loads_in_transformers(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = build_trainer(tiny_model, make_config())
    trainer.step(synthetic_groups(0, 4))
    path = C.save(tmp_path / "ckpt", 1, trainer.model, tiny_model, trainer.state_dict())
    loaded = AutoModelForCausalLM.from_pretrained(str(path))
    assert max_rel_err(loaded.state_dict(), params(trainer)) == 0.0
    AutoTokenizer.from_pretrained(str(path))
    state = C.load_trainer_state(path)
    assert state["version"] == 1 and state["optimizer"]["state"]


def _first_gradient(tiny_model, cfg, groups) -> dict:
    """The gradient of the first update of one step (captured before the optimizer)."""
    trainer = build_trainer(tiny_model, cfg)
    grads = {}
    real_step = trainer._optimizer_step

    def capture():
        if not grads:
            for name, p in trainer.model.named_parameters():
                if p.grad is not None:
                    grads[name] = p.grad.detach().clone()
        return real_step()

    trainer._optimizer_step = capture
    trainer.step(groups)
    return grads


def test_overlong_filtered_responses_count_in_no_denominator(tiny_model):
    """With the overlong filter on, a truncated response is out of the loss: adding a group of
    truncated responses changes no gradient, in every aggregation mode (it used to stay in the
    sequence count of the seq-mean modes and shrink every other sequence's weight)."""
    from dapo_async.protocol import FINISH_LENGTH

    groups = synthetic_groups(0, 4)
    truncated = synthetic_groups(1, 1)[0]
    truncated.finish[:] = FINISH_LENGTH
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        cfg = make_config(
            "algo.overlong_filter=true",
            f"algo.loss_agg={agg}",
            "learner.num_minibatches=1",
            "learner.grad_clip=0",
        )
        base = _first_gradient(tiny_model, cfg, groups)
        more = _first_gradient(tiny_model, cfg, [*groups, truncated])
        assert max_rel_err(more, base) <= 1e-5, agg


class _RunsCode:
    """What a tampered trainer.pt could carry: unpickling it would call os.system."""

    def __reduce__(self):
        import os

        return (os.system, ("touch /tmp/dapo-pwned-by-checkpoint",))


def test_tampered_trainer_state_is_refused_not_run(tmp_path):
    from pathlib import Path

    import pytest

    marker = Path("/tmp/dapo-pwned-by-checkpoint")
    marker.unlink(missing_ok=True)
    torch.save({"version": 1, "evil": _RunsCode()}, tmp_path / C.TRAINER_STATE)
    with pytest.raises(C.CheckpointError, match="refusing to unpickle"):
        C.load_trainer_state(tmp_path)
    assert not marker.exists()
    # the real thing round-trips, RNG states included
    torch.save({"version": 2, "rng": C.rng_state()}, tmp_path / C.TRAINER_STATE)
    state = C.load_trainer_state(tmp_path)
    C.set_rng_state(state["rng"])
    a = np.random.rand(3)
    C.set_rng_state(state["rng"])
    assert np.array_equal(a, np.random.rand(3)) and state["version"] == 2


def test_entropy_bonus_raises_the_policy_entropy(tiny_model):
    ent = {}
    for coef in (0.0, 0.5):
        trainer = build_trainer(tiny_model, make_config(f"algo.entropy_coef={coef}"))
        for step in range(3):
            m = trainer.step(synthetic_groups(step, 4))
        ent[coef] = trainer.step(synthetic_groups(9, 4))["train/entropy"]
        assert m["train/entropy"] > 0
    assert ent[0.5] > ent[0.0]


def test_cosine_schedule_drives_the_optimizer(tiny_model):
    cfg = make_config(
        "learner.lr_schedule=cosine", "learner.lr_min_ratio=0.1", "learner.num_steps=4"
    )
    trainer = build_trainer(tiny_model, cfg)
    lrs = [trainer.step(synthetic_groups(s, 2))["train/lr"] for s in range(4)]
    assert lrs[-1] == pytest.approx(1e-3 * 0.1)  # at num_steps: the floor
    assert lrs == sorted(lrs, reverse=True)


def test_packed_micro_batches_give_the_padded_update(tiny_model):
    """Packing (one row per micro-batch, positions restarting per response, block-diagonal
    attention) computes exactly what padding does: the same parameters after two steps."""
    runs = []
    for pack in (False, True):
        cfg = make_config(f"learner.pack_sequences={pack}", "learner.micro_batch_tokens=200")
        trainer = build_trainer(tiny_model, cfg, dtype=torch.float64)
        for step in range(2):
            trainer.step(synthetic_groups(step, 4))
        runs.append(params(trainer))
    assert max_rel_err(runs[1], runs[0]) <= 1e-9


def test_first_minibatch_takes_its_proximal_logprobs_from_its_own_forward(tiny_model):
    """The first mini-batch trains on the step-start weights, so its proximal log-probs are
    its own forward's, detached: the same update (float64) with fewer no-grad forwards."""
    runs, no_grad_calls = [], []
    for shortcut in (False, True):
        trainer = build_trainer(tiny_model, make_config(), dtype=torch.float64)
        assert trainer.prox_from_forward  # the tiny policy has no dropout
        trainer.prox_from_forward = shortcut
        calls = [0]
        forward = trainer._forward_logp

        def counted(*args, _forward=forward, _calls=calls, **kwargs):
            _calls[0] += not torch.is_grad_enabled()
            return _forward(*args, **kwargs)

        trainer._forward_logp = counted
        for step in range(2):
            trainer.step(synthetic_groups(step, 4))
        runs.append(params(trainer))
        no_grad_calls.append(calls[0])
    assert max_rel_err(runs[1], runs[0]) <= 1e-9
    assert 0 < no_grad_calls[1] < no_grad_calls[0]  # mini-batch 2's forwards only


def test_dropout_keeps_the_separate_proximal_pass(tiny_model):
    from dapo_async.learner.trainer import has_dropout

    trainer = build_trainer(tiny_model, make_config())
    assert not has_dropout(trainer.model)
    trainer.model.config.attention_dropout = 0.1
    assert has_dropout(trainer.model)
    trainer.model.config.attention_dropout = 0.0
    trainer.model.extra = torch.nn.Dropout(0.1)
    assert has_dropout(trainer.model)
    bypass = build_trainer(tiny_model, make_config("algo.bypass=true"))
    assert not bypass.need_prox and not bypass.prox_from_forward
