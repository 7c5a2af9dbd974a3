"""Log-probabilities (and entropy) of response tokens, without full-vocabulary logits for every
position.

A causal LM's own forward makes ``[B, L, V]`` logits for every position, prompt included: at
20k tokens and a 150k vocabulary that is tens of GB in fp32, before log-softmax and a gather
copy it again. ``ResponseLogProbs`` runs the decoder to its hidden states, keeps the response
positions only (row i's token j is predicted at ``resp_start_i + j − 1``), and applies the LM head
``chunk_tokens`` positions at a time. In training each chunk is checkpointed, so its logits are
recomputed in the backward pass instead of being kept: the peak holds one chunk's logits.

Where the entropy carries no gradient (a metric, or not wanted), the chunks go through
``HeadLogProbs``, one autograd function that owns its backward: forward keeps only each position's
log-normaliser; backward recomputes each chunk's logits once and writes the gradients of the
hidden states and the head weight from them (softmax minus the one-hot target), instead of
replaying the chunk's forward under a checkpoint and back-propagating through the float cast,
log-softmax, gather and entropy as separate passes over ``[chunk, V]``. An entropy bonus
(differentiable entropy) keeps the checkpointed path.

The wrapper is the module the learner trains (DDP wraps it; FSDP2 makes it the root, so the
embedding, final norm and LM head are gathered around its forward); the HF model inside keeps its
own parameter names for checkpoints and weight sync.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from dapo_async.algo.entropy import entropy_from_logits
from dapo_async.devices import active_compute_dtype


def response_positions(resp_start_B: torch.Tensor, num_positions: int, seq_len: int):
    """Positions predicting each response token ([B, T], clamped inside the sequence)."""
    ar_T = torch.arange(num_positions, device=resp_start_B.device)
    return (resp_start_B[:, None] - 1 + ar_T[None, :]).clamp(min=0, max=seq_len - 1)


def _chunk_logp(head, h_BtH, targets_Bt, temperature: float, entropy: str):
    logits_BtV = head(h_BtH).float()
    if temperature != 1.0:
        logits_BtV = logits_BtV / temperature
    logp_Bt = torch.log_softmax(logits_BtV, -1).gather(-1, targets_Bt[..., None]).squeeze(-1)
    if entropy == "grad":  # an entropy bonus in the loss: differentiable
        return logp_Bt, entropy_from_logits(logits_BtV)
    if entropy == "metric":
        with torch.no_grad():
            return logp_Bt, entropy_from_logits(logits_BtV.detach())
    return logp_Bt, None


class HeadLogProbs(torch.autograd.Function):
    """log π(target) of each position from hidden states ``h_NH`` and the LM head ``weight_VH``
    (no bias), ``chunk`` positions at a time, and the entropy there when ``with_entropy``
    (no gradient). The logits are computed in ``compute_dtype`` (the autocast dtype where one
    is active) and normalised in fp32; only ``h``, the targets and the fp32 log-normaliser per
    position are kept for backward."""

    @staticmethod
    def forward(ctx, h_NH, weight_VH, targets_N, temperature, chunk, with_entropy, compute_dtype):
        logp, ent, lse = [], [], []
        w_VH = weight_VH.to(compute_dtype)
        for lo in range(0, h_NH.shape[0], chunk):
            logits_nV = torch.nn.functional.linear(h_NH[lo : lo + chunk].to(compute_dtype), w_VH)
            logits_nV = logits_nV.float()
            if temperature != 1.0:
                logits_nV = logits_nV / temperature
            lse_n = torch.logsumexp(logits_nV, -1)
            logp.append(logits_nV.gather(-1, targets_N[lo : lo + chunk, None]).squeeze(-1) - lse_n)
            if with_entropy:  # H = lse − Σ p·z, from the logits already here
                p_nV = torch.exp(logits_nV - lse_n[:, None])
                ent.append(lse_n - (p_nV * logits_nV).sum(-1))
            lse.append(lse_n)
        ctx.save_for_backward(h_NH, weight_VH, targets_N, torch.cat(lse))
        ctx.temperature, ctx.chunk, ctx.compute_dtype = temperature, chunk, compute_dtype
        entropy_N = torch.cat(ent) if with_entropy else h_NH.new_zeros(0, dtype=torch.float32)
        ctx.mark_non_differentiable(entropy_N)
        return torch.cat(logp), entropy_N

    @staticmethod
    def backward(ctx, grad_logp_N, _grad_entropy):
        h_NH, weight_VH, targets_N, lse_N = ctx.saved_tensors
        temperature, chunk, cd = ctx.temperature, ctx.chunk, ctx.compute_dtype
        grad_h = torch.empty_like(h_NH) if ctx.needs_input_grad[0] else None
        grad_w = (
            torch.zeros_like(weight_VH, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        )
        with torch.autocast(h_NH.device.type, enabled=False):
            w_VH = weight_VH.to(cd)
            for lo in range(0, h_NH.shape[0], chunk):
                h_nH = h_NH[lo : lo + chunk].to(cd)
                logits_nV = torch.nn.functional.linear(h_nH, w_VH).float()
                if temperature != 1.0:
                    logits_nV = logits_nV / temperature
                g_n = grad_logp_N[lo : lo + chunk].float()
                # d logp / d z = onehot(target) − softmax(z), times the incoming gradient
                grad_z_nV = torch.exp(logits_nV - lse_N[lo : lo + chunk, None]).mul_(-g_n[:, None])
                grad_z_nV.scatter_add_(-1, targets_N[lo : lo + chunk, None], g_n[:, None])
                if temperature != 1.0:
                    grad_z_nV.div_(temperature)
                grad_z_nV = grad_z_nV.to(cd)
                if grad_h is not None:
                    grad_h[lo : lo + chunk] = grad_z_nV @ w_VH
                if grad_w is not None:  # the product in the compute dtype, summed in fp32
                    grad_w.add_((grad_z_nV.t() @ h_nH).float())
        grad_w = None if grad_w is None else grad_w.to(weight_VH.dtype)
        return grad_h, grad_w, None, None, None, None, None


def _plain_head(head) -> bool:
    """An ``nn.Linear`` without bias over a plain tensor: what ``HeadLogProbs`` computes."""
    return (
        type(head) is torch.nn.Linear
        and head.bias is None
        and type(head.weight) in (torch.nn.Parameter, torch.Tensor)
    )


class ResponseLogProbs(torch.nn.Module):
    """``forward(input_ids_BL, attention_BL, resp_start_B, resp_len_B, T)`` → log π of the
    response tokens ``[B, T]`` and the policy's entropy at those positions (both zero past each
    response's end): ``entropy`` = "none" (None), "metric" (no gradient) or "grad"
    (differentiable, for an entropy bonus)."""

    def __init__(self, lm: torch.nn.Module, chunk_tokens: int = 1024):
        super().__init__()
        self.lm = lm
        self.chunk_tokens = chunk_tokens

    def forward(
        self,
        input_ids_BL: torch.Tensor,
        attention_BL: torch.Tensor,
        resp_start_B: torch.Tensor,
        resp_len_B: torch.Tensor,
        num_positions: int,
        temperature: float = 1.0,
        entropy: str = "none",
        position_ids_BL: torch.Tensor | None = None,
        row_B: torch.Tensor | None = None,
        offset_B: torch.Tensor | None = None,
    ):
        """Packed inputs (``batching._pack``) pass their position ids, and for each response the
        row holding it and where it starts there; padded ones may leave them None."""
        out = self.lm.get_decoder()(
            input_ids=input_ids_BL, attention_mask=attention_BL, position_ids=position_ids_BL
        )
        hidden_BLH = out.last_hidden_state
        seq_len = input_ids_BL.shape[1]
        if row_B is None:
            row_B = torch.arange(resp_start_B.shape[0], device=resp_start_B.device)
        start_B = resp_start_B if offset_B is None else resp_start_B + offset_B
        pos_BT = response_positions(start_B, num_positions, seq_len)
        rows_BT = row_B[:, None].expand_as(pos_BT)
        targets_BT = input_ids_BL[rows_BT, (pos_BT + 1).clamp(max=seq_len - 1)]
        h_BTH = hidden_BLH[rows_BT, pos_BT]
        head = self.lm.get_output_embeddings()
        step = self.chunk_tokens if self.chunk_tokens > 0 else num_positions
        if step < num_positions and entropy != "grad" and _plain_head(head):
            return self._fused(h_BTH, head, targets_BT, resp_len_B, temperature, step, entropy)
        logps, ents = [], []
        for lo in range(0, num_positions, max(step, 1)):
            args = (head, h_BTH[:, lo : lo + step], targets_BT[:, lo : lo + step])
            if torch.is_grad_enabled() and step < num_positions:
                lp, ent = checkpoint(_chunk_logp, *args, temperature, entropy, use_reentrant=False)
            else:
                lp, ent = _chunk_logp(*args, temperature, entropy)
            logps.append(lp)
            ents.append(ent)
        logp_BT = torch.cat(logps, 1)
        valid_BT = torch.arange(num_positions, device=logp_BT.device)[None, :] < resp_len_B[:, None]
        logp_BT = torch.where(valid_BT, logp_BT, torch.zeros_like(logp_BT))
        ent_BT = None
        if entropy != "none":
            ent_BT = torch.cat(ents, 1)
            ent_BT = torch.where(valid_BT, ent_BT, torch.zeros_like(ent_BT))
        return logp_BT, ent_BT

    def _fused(self, h_BTH, head, targets_BT, resp_len_B, temperature, step, entropy):
        """The chunked head through ``HeadLogProbs`` (valid positions only, flattened)."""
        b, t = targets_BT.shape
        valid_BT = torch.arange(t, device=targets_BT.device)[None, :] < resp_len_B[:, None]
        idx_N = valid_BT.reshape(-1).nonzero().squeeze(-1)
        h_NH = h_BTH.reshape(b * t, -1).index_select(0, idx_N)
        targets_N = targets_BT.reshape(-1).index_select(0, idx_N)
        dtype = active_compute_dtype(h_NH.device.type, head.weight.dtype)
        logp_N, ent_N = HeadLogProbs.apply(
            h_NH, head.weight, targets_N, temperature, step, entropy == "metric", dtype
        )
        logp_BT = logp_N.new_zeros(b * t).index_copy(0, idx_N, logp_N).view(b, t)
        if entropy == "none":
            return logp_BT, None
        return logp_BT, ent_N.new_zeros(b * t).index_copy(0, idx_N, ent_N).view(b, t)


def logprobs_from_full_logits(
    logits_BLV: torch.Tensor,
    input_ids_BL: torch.Tensor,
    resp_start_B: torch.Tensor,
    resp_len_B: torch.Tensor,
    num_positions: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The same log-probs from a causal LM's full ``[B, L, V]`` logits: the reference the
    chunked path is tested against, and the baseline of ``bench logprobs``."""
    seq_len = input_ids_BL.shape[1]
    pos_BT = response_positions(resp_start_B, num_positions, seq_len)
    targets_BT = input_ids_BL.gather(1, (pos_BT + 1).clamp(max=seq_len - 1))
    logits_BTV = logits_BLV.gather(1, pos_BT[..., None].expand(-1, -1, logits_BLV.shape[-1]))
    logits_BTV = logits_BTV.float() / temperature
    logp_BT = torch.log_softmax(logits_BTV, -1).gather(-1, targets_BT[..., None]).squeeze(-1)
    valid_BT = torch.arange(num_positions, device=logp_BT.device)[None, :] < resp_len_B[:, None]
    return torch.where(valid_BT, logp_BT, torch.zeros_like(logp_BT))
