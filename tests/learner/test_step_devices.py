"""The learner's step with its model on a simulated accelerator (tests/simdevice.py: ``meta``
computes like the CPU and fails like CUDA): every objective, the reference model, packed rows,
chunked log-probs and LoRA move their tensors to the model's device, and the update equals the
CPU's."""

import pytest
import torch
from learner_helpers import build_trainer, make_config, synthetic_groups
from simdevice import real, sim_device

CASES = {
    "dapo": [],
    "dapo-packed-chunked": ["learner.pack_sequences=true", "learner.logprob_chunk_tokens=16"],
    "grpo": ["algo.objective=grpo"],
    "ppo_kl-ref": ["algo.objective=ppo_kl", "algo.kl_coef=0.1"],
    "dpo": ["algo.objective=dpo"],
    "lora": ["learner.lora_rank=4"],
}


# AdamW's step is lr × m ÷ (√v + eps): where a gradient is at rounding level (~1e-7), the
# default eps (1e-8) turns the two devices' rounding differences into steps of up to lr, with
# either sign (9e-5 apart after two steps on one AMD EPYC). An eps well above rounding keeps
# the step proportional to the gradient there, so the two updates differ by rounding only.
ADAM_EPS = 1e-4


def _params(model) -> dict:
    return {k: real(v).detach().clone() for k, v in model.named_parameters()}


def _two_steps(tiny_model, overrides, device, init=None):
    """(initial parameters, parameters after two steps, metrics). ``init``: start from these
    (transformers draws random numbers while loading onto ``meta``, so LoRA's random adapters
    would differ)."""
    trainer = build_trainer(
        tiny_model, make_config(*overrides), ref="algo.kl_coef=0.1" in overrides, device=device
    )
    if init is not None:
        with torch.no_grad():
            for k, p in trainer.model.named_parameters():
                p.copy_(init[k])
    for group in trainer.optimizer.param_groups:  # see ADAM_EPS
        group["eps"] = ADAM_EPS
    start = _params(trainer.model)
    metrics = [trainer.step(synthetic_groups(s, 4)) for s in range(2)]
    return start, _params(trainer.model), metrics


@pytest.mark.parametrize("case", list(CASES))
def test_learner_step_on_the_models_device_equals_the_cpus(tiny_model, case):
    start, want, want_metrics = _two_steps(tiny_model, CASES[case], "cpu")
    with sim_device():
        _, got, got_metrics = _two_steps(tiny_model, CASES[case], "meta", init=start)
    assert got.keys() == want.keys()
    # the kernels differ (AdamW's per-tensor loop on a non-native device, not foreach), so
    # rounding does: about 1e-7 here (with ADAM_EPS), against about 1e-3 that one step at lr
    # 1e-3 moves a weight
    worst = max(float((got[k] - want[k]).abs().max()) for k in want)
    assert worst < 1e-5, worst
    assert got_metrics[-1]["train/loss"] == pytest.approx(want_metrics[-1]["train/loss"], abs=1e-5)
