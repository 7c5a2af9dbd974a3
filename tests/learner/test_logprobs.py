"""Response log-probs from hidden states in chunks: the same values and gradients as the full
logits path at any chunk size, and a smaller memory peak (measured by ``bench logprobs`` in fresh
processes, on a large vocabulary)."""

import numpy as np
import pytest
import torch
from learner_helpers import synthetic_groups
from transformers import AutoModelForCausalLM

from dapo_async.algo.entropy import entropy_from_logits
from dapo_async.bench import logprobs_bench
from dapo_async.learner.batching import collate, groups_to_rows
from dapo_async.learner.logprobs import ResponseLogProbs, logprobs_from_full_logits


def _batch():
    rows = groups_to_rows(synthetic_groups(3, 3))
    return collate(rows, np.arange(len(rows)), pad_id=0)


@pytest.mark.parametrize("chunk", [0, 1, 5, 1024])
def test_chunked_logprobs_equal_the_full_logits_path(tiny_model, chunk):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    mb = _batch()
    t = mb.mask_BT.shape[1]
    temp = 0.7
    logits = model(input_ids=mb.input_ids_BL, attention_mask=mb.attention_BL).logits
    ref = logprobs_from_full_logits(
        logits, mb.input_ids_BL, mb.resp_start_B, mb.resp_len_B, t, temp
    )
    (ref * mb.mask_BT).sum().backward()
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()

    policy = ResponseLogProbs(model, chunk)
    logp, ent = policy(
        mb.input_ids_BL, mb.attention_BL, mb.resp_start_B, mb.resp_len_B, t, temp, "metric"
    )
    (logp * mb.mask_BT).sum().backward()
    assert torch.allclose(logp, ref, atol=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(p.grad, ref_grads[k], atol=1e-5, rtol=1e-4), k
    # entropy at the same positions, from the full logits
    pos = (mb.resp_start_B[:, None] - 1 + torch.arange(t)[None, :]).clamp(max=logits.shape[1] - 1)
    sel = logits.detach().gather(1, pos[..., None].expand(-1, -1, logits.shape[-1])) / temp
    assert torch.allclose(ent, entropy_from_logits(sel), atol=1e-4)
    assert not ent.requires_grad


def test_chunked_path_has_a_smaller_memory_peak():
    """2048 response tokens, vocabulary 16384, chunks of 256: the full-logits path holds several
    [L, V] fp32 copies at once (logits, log-softmax, their gradients), the chunked one about
    one chunk's."""
    got = {
        v: logprobs_bench.measure_in_subprocess(v, 2048, 16384, 256)
        for v in ("full_logits", "chunked")
    }
    assert got["chunked"]["peak_mib"] * 2 < got["full_logits"]["peak_mib"]
    assert got["chunked"]["logp_sum"] == pytest.approx(got["full_logits"]["logp_sum"], rel=1e-4)


def test_entropy_with_gradient_equals_the_metric(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    mb = _batch()
    t = mb.mask_BT.shape[1]
    policy = ResponseLogProbs(model, 4)
    args = (mb.input_ids_BL, mb.attention_BL, mb.resp_start_B, mb.resp_len_B, t, 1.0)
    _, ent_metric = policy(*args, "metric")
    _, ent_grad = policy(*args, "grad")
    assert ent_grad.requires_grad and torch.allclose(ent_grad, ent_metric, atol=1e-6)
    assert policy(*args, "none")[1] is None
