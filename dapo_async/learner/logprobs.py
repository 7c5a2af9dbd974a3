"""Log-probabilities (and entropy) of response tokens, without full-vocabulary logits for every
position.

A causal LM's own forward makes ``[B, L, V]`` logits for every position, prompt included: at
20k tokens and a 150k vocabulary that is tens of GB in fp32, before log-softmax and a gather
copy it again. ``ResponseLogProbs`` runs the decoder to its hidden states, keeps the response
positions only (row i's token j is predicted at ``resp_start_i + j − 1``), and applies the LM head
``chunk_tokens`` positions at a time. In training each chunk is checkpointed, so its logits are
recomputed in the backward pass instead of being kept: the peak holds one chunk's logits.

The wrapper is the module the learner trains (DDP wraps it; FSDP2 makes it the root, so the
embedding, final norm and LM head are gathered around its forward); the HF model inside keeps its
own parameter names for checkpoints and weight sync.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from dapo_async.algo.entropy import entropy_from_logits


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


class ResponseLogProbs(torch.nn.Module):
    """``forward(input_ids_BL, attention_BL, resp_start_B, resp_len_B, T)`` → log π of the
    response tokens ``[B, T]`` (zeros past each response's end) and the policy's entropy at
    those positions: ``entropy`` = "none" (None), "metric" (no gradient) or "grad"
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
        ent_BT = torch.cat(ents, 1) if entropy != "none" else None
        return logp_BT, ent_BT


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
