"""Turn scored groups into padded (or packed) training tensors and token-balanced micro-batches.

One row per response: ``[prompt tokens | response tokens]`` right-padded to the longest row of
its micro-batch. Packed (``learner.pack_sequences``): a micro-batch's responses are laid end to
end in rows as long as its longest one (first fit, longest first), with position ids restarting
at each and a block-diagonal causal attention mask (``[B', 1, L, L]``), so no token attends
across responses and little padding is computed; row i starts at ``offset_B[i]`` of packed row
``row_B[i]``. Log-probs are needed for response positions only: for row i the response
token j sits at position ``prompt_len_i + j`` and is predicted from position ``prompt_len_i + j − 1``.

Advantages are computed per group (``algo.advantages``) before splitting, so they do not
depend on the split. ``split_pairs`` makes online DPO's micro-batches of whole (chosen, rejected)
pairs; ``empty_like`` the empty micro-batches that keep every rank's count equal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dapo_async.algo.advantages import group_advantages, group_index_from_sizes
from dapo_async.algo.filters import overlong_filter_mask
from dapo_async.protocol import FINISH_LENGTH, Group


@dataclass
class Rows:
    """All responses of a step's shard, unpadded (numpy), with their advantages."""

    prompts: list[np.ndarray]
    responses: list[np.ndarray]
    behav_logprobs: list[np.ndarray]
    versions: list[np.ndarray]
    adv: np.ndarray  # float32 [N]
    rewards: np.ndarray  # float32 [N]
    acc: np.ndarray  # float32 [N]
    truncated: np.ndarray  # bool [N]
    group: np.ndarray  # int64 [N]: index of the response's group within the shard
    # per response, uint8 [n]: 1 where the policy sampled the token, 0 for environment tokens
    # of a multi-turn episode (they stay in the input but leave the loss through mask_BT)
    sampled: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.responses)

    @property
    def num_tokens(self) -> int:
        return int(sum(len(r) for r in self.responses))


@dataclass
class MicroBatch:
    input_ids_BL: torch.Tensor  # long [B, L]
    attention_BL: torch.Tensor  # long [B, L]
    resp_start_B: torch.Tensor  # long [B]: index of the first response token
    resp_len_B: torch.Tensor  # long [B]
    behav_logp_BT: torch.Tensor  # float [B, T] (T = max response length)
    adv_BT: torch.Tensor  # float [B, T]
    mask_BT: torch.Tensor  # float [B, T]
    versions_BT: torch.Tensor  # long [B, T]
    rows: np.ndarray  # indices into Rows
    prox_logp_BT: torch.Tensor | None = None
    ref_logp_BT: torch.Tensor | None = None
    position_ids_BL: torch.Tensor | None = None  # long [B', L]: packed rows only
    row_B: torch.Tensor | None = None  # long [B]: the (packed) row holding row i
    offset_B: torch.Tensor | None = None  # long [B]: where row i starts in it

    def to(self, device: torch.device) -> MicroBatch:
        """Move every tensor to ``device`` (in place; returns self)."""
        if device.type == "cpu":
            return self
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                if device.type == "cuda":
                    value = value.pin_memory()  # so the copy below is truly asynchronous
                setattr(self, name, value.to(device, non_blocking=True))
        return self


def groups_to_rows(groups: list[Group], norm_std: bool = True, eps: float = 1e-6) -> Rows:
    prompts, responses, logps, versions, sampled = [], [], [], [], []
    rewards, acc, truncated, sizes, group = [], [], [], [], []
    for gi, g in enumerate(groups):
        off = 0
        sizes.append(g.num_responses)
        for i, n in enumerate(g.response_lens.tolist()):
            prompts.append(np.asarray(g.prompt_tokens))
            responses.append(np.asarray(g.tokens[off : off + n]))
            logps.append(np.asarray(g.logprobs[off : off + n]))
            versions.append(np.asarray(g.versions[off : off + n]))
            sampled.append(
                np.ones(n, np.uint8) if g.sampled is None else np.asarray(g.sampled[off : off + n])
            )
            off += n
            rewards.append(float(g.rewards[i]))
            acc.append(float(g.acc[i]))
            truncated.append(int(g.finish[i]) == FINISH_LENGTH)
            group.append(gi)
    r = torch.tensor(rewards, dtype=torch.float64, device="cpu")  # host-side, per group
    adv = (
        group_advantages(r, group_index_from_sizes(sizes), norm_std=norm_std, eps=eps)
        if rewards
        else r
    )
    return Rows(
        prompts,
        responses,
        logps,
        versions,
        adv.numpy().astype(np.float32),
        np.asarray(rewards, np.float32),
        np.asarray(acc, np.float32),
        np.asarray(truncated, bool),
        np.asarray(group, np.int64),
        sampled,
    )


def subset(rows: Rows, idx: np.ndarray) -> Rows:
    """The rows at ``idx`` (in that order)."""
    pick = np.asarray(idx, np.int64)
    items = pick.tolist()
    return Rows(
        [rows.prompts[i] for i in items],
        [rows.responses[i] for i in items],
        [rows.behav_logprobs[i] for i in items],
        [rows.versions[i] for i in items],
        rows.adv[pick],
        rows.rewards[pick],
        rows.acc[pick],
        rows.truncated[pick],
        rows.group[pick],
        None if rows.sampled is None else [rows.sampled[i] for i in items],
    )


def split_by_tokens(
    rows: Rows, max_tokens: int, num_parts: int = 1, packed: bool = False
) -> list[np.ndarray]:
    """Indices of rows for micro-batches of at most ``max_tokens`` tokens — padded (longest row
    × rows), or with ``packed`` the sum of the rows' lengths — at least one row each, after
    splitting rows into ``num_parts`` contiguous mini-batches."""
    out: list[np.ndarray] = []
    for part in np.array_split(np.arange(len(rows)), num_parts):
        cur: list[int] = []
        width = total = 0
        for i in part.tolist():
            n = len(rows.prompts[i]) + len(rows.responses[i])
            w = max(width, n)
            cost = total + n if packed else w * (len(cur) + 1)
            if cur and cost > max_tokens:
                out.append(np.asarray(cur))
                cur, w, total = [], n, 0
            cur.append(i)
            width = w
            total += n
        if cur:
            out.append(np.asarray(cur))
    return out


def collate(
    rows: Rows,
    idx: np.ndarray,
    pad_id: int,
    overlong_filter: bool = False,
    device: torch.device | str = "cpu",
    pack: bool = False,
) -> MicroBatch:
    """One micro-batch of rows ``idx``, filled on the host and moved to ``device`` (the model's:
    every tensor names its device, none relies on the default one); ``pack``: in one row."""
    mb = _padded(rows, idx, pad_id, overlong_filter, inputs=not pack)
    if pack:
        _pack(mb, rows, idx, pad_id)
    return mb.to(torch.device(device))


def _padded(
    rows: Rows, idx: np.ndarray, pad_id: int, overlong_filter: bool, inputs: bool = True
) -> MicroBatch:
    """The micro-batch with one row per response; without ``inputs`` the padded input ids and
    attention mask are left empty (``_pack`` builds packed ones in their place)."""
    b = len(idx)
    lens = [len(rows.prompts[i]) + len(rows.responses[i]) for i in idx]
    L = max(lens) if inputs else 0
    T = max(max(len(rows.responses[i]) for i in idx), 1)
    host = torch.device("cpu")
    ids = torch.full((b, L), pad_id, dtype=torch.long, device=host)
    attn = torch.zeros((b, L), dtype=torch.long, device=host)
    behav = torch.zeros((b, T), device=host)
    adv = torch.zeros((b, T), device=host)
    mask = torch.zeros((b, T), device=host)
    vers = torch.zeros((b, T), dtype=torch.long, device=host)
    start = torch.zeros(b, dtype=torch.long, device=host)
    rlen = torch.zeros(b, dtype=torch.long, device=host)
    # DAPO's overlong filter: a truncated response's tokens leave the loss (and its counts)
    keep_B = overlong_filter_mask(rows.truncated[idx]) if overlong_filter else np.ones(b)
    for k, i in enumerate(idx.tolist()):
        p, r = rows.prompts[i], rows.responses[i]
        n = len(r)
        if inputs:
            ids[k, : len(p)] = torch.from_numpy(p.astype(np.int64))
            ids[k, len(p) : len(p) + n] = torch.from_numpy(r.astype(np.int64))
            attn[k, : len(p) + n] = 1
        start[k], rlen[k] = len(p), n
        behav[k, :n] = torch.from_numpy(rows.behav_logprobs[i].astype(np.float32))
        vers[k, :n] = torch.from_numpy(rows.versions[i].astype(np.int64))
        mask[k, :n] = float(keep_B[k])
        if rows.sampled is not None:  # environment tokens: no loss, KL, entropy or count
            mask[k, :n] *= torch.from_numpy(rows.sampled[i].astype(np.float32))
        adv[k, :n] = float(rows.adv[i])
    arange_B = torch.arange(b, device=host)
    mb = MicroBatch(ids, attn, start, rlen, behav, adv, mask, vers, idx)
    mb.row_B, mb.offset_B = arange_B, torch.zeros(b, dtype=torch.long, device=host)
    return mb


def _pack(mb: MicroBatch, rows: Rows, idx: np.ndarray, pad_id: int) -> None:
    """Replace ``mb``'s padded inputs with packed rows (in place): the responses, longest
    first, each into the first row with room (rows as long as the longest response, so no
    row's attention costs more than a padded row's); what is left of a row is padding that
    attends only to itself."""
    host = torch.device("cpu")
    lens = [len(rows.prompts[i]) + len(rows.responses[i]) for i in idx.tolist()]
    cap = max(lens)
    fill: list[int] = []  # tokens used per packed row
    row_of, offset_of = [0] * len(lens), [0] * len(lens)
    for k in sorted(range(len(lens)), key=lambda k: -lens[k]):  # first fit, decreasing
        r = next((j for j, used in enumerate(fill) if used + lens[k] <= cap), len(fill))
        if r == len(fill):
            fill.append(0)
        row_of[k], offset_of[k] = r, fill[r]
        fill[r] += lens[k]
    n_rows = len(fill)
    ids = torch.full((n_rows, cap), pad_id, dtype=torch.long, device=host)
    pos = torch.zeros((n_rows, cap), dtype=torch.long, device=host)
    seg = torch.full((n_rows, cap), -1, dtype=torch.long, device=host)  # -1: padding
    for k, i in enumerate(idx.tolist()):
        r, o, n = row_of[k], offset_of[k], lens[k]
        ids[r, o : o + n] = torch.from_numpy(
            np.concatenate([rows.prompts[i], rows.responses[i]]).astype(np.int64)
        )
        pos[r, o : o + n] = torch.arange(n, dtype=torch.long, device=host)
        seg[r, o : o + n] = k
    ar = torch.arange(cap, device=host)
    causal = ar[:, None] >= ar[None, :]
    mb.input_ids_BL, mb.position_ids_BL = ids, pos
    mb.attention_BL = ((seg[:, :, None] == seg[:, None, :]) & causal)[:, None]  # [B', 1, L, L]
    mb.row_B = torch.tensor(row_of, dtype=torch.long, device=host)
    mb.offset_B = torch.tensor(offset_of, dtype=torch.long, device=host)


def split_pairs(rows: Rows, pairs: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """Row indices of micro-batches of whole (chosen, rejected) pairs within the token budget
    (at least one pair each)."""
    out: list[np.ndarray] = []
    cur: list[int] = []
    width = 0
    for c, r in pairs.tolist():
        need = max(len(rows.prompts[i]) + len(rows.responses[i]) for i in (c, r))
        w = max(width, need)
        if cur and w * (len(cur) + 2) > max_tokens:
            out.append(np.asarray(cur, np.int64))
            cur, w = [], need
        cur += [c, r]
        width = w
    if cur:
        out.append(np.asarray(cur, np.int64))
    return out


def empty_like(mb: MicroBatch) -> MicroBatch:
    """A micro-batch that contributes nothing (zero mask) but runs the same collectives."""
    mb.mask_BT = torch.zeros_like(mb.mask_BT)
    mb.adv_BT = torch.zeros_like(mb.adv_BT)
    mb.resp_len_B = torch.zeros_like(mb.resp_len_B)
    mb.rows = np.zeros(0, np.int64)
    return mb
