"""Turn scored groups into padded training tensors and token-balanced micro-batches.

One row per response: ``[prompt tokens | response tokens]`` right-padded to the longest row of
its micro-batch. Log-probs are needed for response positions only: for row i the response
token j sits at position ``prompt_len_i + j`` and is predicted from position ``prompt_len_i + j − 1``.

Advantages are computed per group (``algo.advantages``) before splitting, so they do not
depend on the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dapo_async.algo.advantages import group_advantages, group_index_from_sizes
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
    prompts, responses, logps, versions = [], [], [], []
    rewards, acc, truncated, sizes, group = [], [], [], [], []
    for gi, g in enumerate(groups):
        off = 0
        sizes.append(g.num_responses)
        for i, n in enumerate(g.response_lens.tolist()):
            prompts.append(np.asarray(g.prompt_tokens))
            responses.append(np.asarray(g.tokens[off : off + n]))
            logps.append(np.asarray(g.logprobs[off : off + n]))
            versions.append(np.asarray(g.versions[off : off + n]))
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
    )


def split_by_tokens(rows: Rows, max_tokens: int, num_parts: int = 1) -> list[np.ndarray]:
    """Indices of rows for micro-batches of at most ``max_tokens`` padded tokens (at least one
    row each), after splitting rows into ``num_parts`` contiguous mini-batches."""
    out: list[np.ndarray] = []
    for part in np.array_split(np.arange(len(rows)), num_parts):
        cur: list[int] = []
        width = 0
        for i in part.tolist():
            w = max(width, len(rows.prompts[i]) + len(rows.responses[i]))
            if cur and w * (len(cur) + 1) > max_tokens:
                out.append(np.asarray(cur))
                cur, w = [], len(rows.prompts[i]) + len(rows.responses[i])
            cur.append(i)
            width = w
        if cur:
            out.append(np.asarray(cur))
    return out


def collate(
    rows: Rows,
    idx: np.ndarray,
    pad_id: int,
    overlong_filter: bool = False,
    device: torch.device | str = "cpu",
) -> MicroBatch:
    """One micro-batch of rows ``idx``, filled on the host and moved to ``device`` (the model's:
    every tensor names its device, none relies on the default one)."""
    b = len(idx)
    lens = [len(rows.prompts[i]) + len(rows.responses[i]) for i in idx]
    L = max(lens)
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
    for k, i in enumerate(idx.tolist()):
        p, r = rows.prompts[i], rows.responses[i]
        n = len(r)
        ids[k, : len(p)] = torch.from_numpy(p.astype(np.int64))
        ids[k, len(p) : len(p) + n] = torch.from_numpy(r.astype(np.int64))
        attn[k, : len(p) + n] = 1
        start[k], rlen[k] = len(p), n
        behav[k, :n] = torch.from_numpy(rows.behav_logprobs[i].astype(np.float32))
        vers[k, :n] = torch.from_numpy(rows.versions[i].astype(np.int64))
        keep = 0.0 if (overlong_filter and rows.truncated[i]) else 1.0
        mask[k, :n] = keep
        adv[k, :n] = float(rows.adv[i])
    return MicroBatch(ids, attn, start, rlen, behav, adv, mask, vers, idx).to(torch.device(device))
