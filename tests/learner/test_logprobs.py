"""Response log-probs from hidden states in chunks: the same values and gradients as the full
logits path at any chunk size, and a smaller memory peak (bytes of the tensors each path makes,
on a large vocabulary)."""

import numpy as np
import pytest
import torch
from learner_helpers import synthetic_groups
from transformers import AutoModelForCausalLM

from dapo_async.algo.entropy import entropy_from_logits
from dapo_async.bench import logprobs_bench
from dapo_async.bench.memory import peak_tensor_bytes
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
    valid = torch.arange(t)[None, :] < mb.resp_len_B[:, None]  # zeros past each response's end
    want_ent = torch.where(valid, entropy_from_logits(sel), torch.zeros(()))
    assert torch.allclose(ent, want_ent, atol=1e-4)
    assert not ent.requires_grad


def test_chunked_path_has_a_smaller_memory_peak():
    """2048 response tokens, vocabulary 16384, chunks of 256: the full-logits path holds several
    [L, V] fp32 copies at once (logits, log-softmax, their gradients: 576 MiB here), the
    chunked one about one chunk's (64 MiB). Counted in bytes of the tensors each path makes
    (torch's profiler), not the process's resident set: the same on every machine."""
    torch.manual_seed(0)
    model = logprobs_bench._model(16384)
    got = {}
    for v in ("full_logits", "chunked"):
        logp, peak = peak_tensor_bytes(lambda v=v: logprobs_bench._run(model, v, 2048, 256))
        got[v] = (float(logp.double().sum()), peak)
    assert got["chunked"][1] * 4 < got["full_logits"][1]
    assert got["chunked"][0] == pytest.approx(got["full_logits"][0], rel=1e-4)


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


def test_fused_chunks_under_bf16_autocast_match_the_unchunked_path(tiny_model):
    """Under autocast the fused head computes its logits in bf16 (as the unchunked head does)
    and its own backward in bf16 too: values and gradients agree to bf16's precision, and the
    weight's gradient keeps the parameter's fp32."""
    mb = _batch()
    t = mb.mask_BT.shape[1]
    got = {}
    for chunk in (0, 5):
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = ResponseLogProbs(model, chunk)(
                mb.input_ids_BL, mb.attention_BL, mb.resp_start_B, mb.resp_len_B, t, 1.0, "metric"
            )
        (logp * mb.mask_BT).sum().backward()
        head = model.get_output_embeddings().weight
        assert head.grad.dtype == torch.float32
        got[chunk] = (logp.detach(), head.grad.clone())
    assert torch.allclose(got[5][0], got[0][0], atol=2e-2)
    rel = (got[5][1] - got[0][1]).norm() / got[0][1].norm()
    assert rel < 2e-2, rel
