"""The loss gradient does not depend on how the global batch is split: micro-batches and
data-parallel ranks (real gloo processes) give the full-batch gradient; with behaviour =
proximal = current it is the plain policy gradient; in bypass mode it is the DAPO objective."""

import multiprocessing as mp

import pytest
import torch

from dapo_async.algo.losses import PolicyLossConfig, policy_loss
from dapo_async.utils import free_port

B, T, V, D = 8, 6, 11, 5
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def make_data(seed=0):
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    lens = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lens[:, None]).double()
    adv = torch.randn(B, generator=g, dtype=torch.float64)[:, None] * mask
    W0 = torch.randn(D, V, generator=g, dtype=torch.float64) * 0.5
    behav = torch.log_softmax(
        feats @ (W0 + 0.3 * torch.randn(D, V, generator=g, dtype=torch.float64)), -1
    )
    behav = behav.gather(-1, tokens[..., None]).squeeze(-1)
    prox = torch.log_softmax(feats @ W0, -1).gather(-1, tokens[..., None]).squeeze(-1)
    return feats, tokens, mask, adv, W0, behav, prox


def logp_of(W, feats, tokens):
    return torch.log_softmax(feats @ W, -1).gather(-1, tokens[..., None]).squeeze(-1)


def grad_of(rows, mode, data, W_shift=0.2):
    feats, tokens, mask, adv, W0, behav, prox = data
    W = (W0 + W_shift).clone().requires_grad_(True)  # current != proximal: clipping is active
    cfg = PolicyLossConfig(loss_agg=mode, norm_len=T, is_cap=2.0)
    loss, _ = policy_loss(
        logp_of(W, feats[rows], tokens[rows]),
        prox[rows],
        behav[rows],
        adv[rows],
        mask[rows],
        cfg,
        global_num_tokens=mask.sum().item(),
        global_num_seqs=float(B),
    )
    loss.backward()
    return W.grad.clone()


def rel_err(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_match_full_batch(mode):
    data = make_data()
    full = grad_of(slice(0, B), mode, data)
    parts = sum(grad_of(slice(i, i + 2), mode, data) for i in range(0, B, 2))
    assert full.abs().sum() > 0
    assert rel_err(parts, full) <= 1e-6


def _rank_main(rank, port, mode, out):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        data = make_data()
        half = B // 2
        g = grad_of(slice(rank * half, (rank + 1) * half), mode, data)
        dist.all_reduce(g, op=dist.ReduceOp.SUM)
        out.put((rank, rel_err(g, grad_of(slice(0, B), mode, data))))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_two_gloo_ranks_match_full_batch(mode):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, mode, out)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert set(results) == {0, 1}
    assert all(err <= 1e-6 for err in results.values()), results


def test_on_policy_gradient_is_plain_policy_gradient():
    feats, tokens, mask, adv, W0, _, _ = make_data()
    W = W0.clone().requires_grad_(True)
    logp = logp_of(W, feats, tokens)
    same = logp.detach()
    loss, _ = policy_loss(logp, same, same, adv, mask, PolicyLossConfig())
    (g_loss,) = torch.autograd.grad(loss, W)
    W2 = W0.clone().requires_grad_(True)
    pg = -(adv * logp_of(W2, feats, tokens) * mask).sum() / mask.sum()
    (g_pg,) = torch.autograd.grad(pg, W2)
    assert rel_err(g_loss, g_pg) <= 1e-10


def test_bypass_without_truncation_is_dapo_objective():
    feats, tokens, mask, adv, W0, behav, prox = make_data()
    W = (W0 + 0.2).clone().requires_grad_(True)
    cfg = PolicyLossConfig(bypass=True, is_cap=1e9, clip_low=0.2, clip_high=0.28)
    loss, _ = policy_loss(logp_of(W, feats, tokens), prox, behav, adv, mask, cfg)
    (g_loss,) = torch.autograd.grad(loss, W)
    # The paper: maximise token-mean of min(r·A, clip(r, 1-0.2, 1+0.28)·A), r = π_θ / π_old.
    W2 = (W0 + 0.2).clone().requires_grad_(True)
    r = torch.exp(logp_of(W2, feats, tokens) - behav)
    objective = torch.minimum(r * adv, r.clamp(0.8, 1.28) * adv)
    paper = -(objective * mask).sum() / mask.sum()
    (g_paper,) = torch.autograd.grad(paper, W2)
    assert loss.item() == pytest.approx(paper.item(), rel=1e-10)
    assert rel_err(g_loss, g_paper) <= 1e-10
