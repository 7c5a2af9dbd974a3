"""The running batch's KV cache as fixed slots, one a sequence (``HFStream`` on a CPU, with the
lean decode step and the C attention kernel): a row keeps its slot from the moment it joins
until it leaves, its keys and values start at time slot 0 of it, and a decode step's attention
reads each row's own length there (``cpu_attention.decode_attention_slots``).

    add(cache, mask_BT, src_B, room)  new rows at the batch's end: row i copies prefilled
                                      (left-padded) row src_B[i]'s keys and values into a free
                                      slot; buffers grow first if they lack slots or ``room``
    step_positions() -> pos_B1        before a decode step: each row's length, its new
                                      token's position (grows the buffers if a row is full)
    write(k_BK1D, v_BK1D, layer)      the step's keys and values at each row's length
    attend(q_BH1D, layer, scale)      each row over its slot and length, the new token included
    advance()                         after the step: every row one token longer
    keep(idx_B)                       the batch keeps these rows, in this order; the others'
                                      slots are freed (nothing is copied)

Why: a padded batch (``padded_kv.py``: one time axis, rows left-padded to the longest) copies
its whole cache whenever rows leave (a gather) or join (the new rows padded to the running
ones' length), and every row attends over the longest row's length. On a CPU, where a step
costs in proportion to what it reads, that made refilling a running batch cost more than
letting it drain (docs/results.md). Slots make leaving free and joining cost the new rows only.
"""

from __future__ import annotations

import torch

from dapo_async.engines.cpu_attention import decode_attention_slots

# Time slots added beyond what is asked when the buffers grow in time (a recomputed batch,
# a row restarted longer): growing copies every slot, so it should happen rarely.
GROW_T = 64


class SlotKV:
    """One stream's slot cache (see the module docstring for the call order)."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype=torch.float32):
        self.layers, self.kv_heads, self.head_dim, self.dtype = layers, kv_heads, head_dim, dtype
        self.keys: list[torch.Tensor] = []  # per layer [S, KV, T, D]
        self.values: list[torch.Tensor] = []
        self.free: list[int] = []  # slots no row holds
        self.slot_B = torch.zeros(0, dtype=torch.long)  # each row's slot, in batch order
        self.len_B = torch.zeros(0, dtype=torch.long)  # tokens in each row's slot
        self._attend_len_B = self.len_B

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def time(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def _reserve(self, slots: int, time: int) -> None:
        """Buffers of at least ``slots`` slots and ``time`` time slots, the held ones kept."""
        S, T = self.slots, self.time
        if slots <= S and time <= T:
            return
        new_S = max(slots, S)
        new_T = T if time <= T else time + (GROW_T if T else 0)  # the first: as asked
        shape = (new_S, self.kv_heads, new_T, self.head_dim)
        for bufs in (self.keys, self.values):
            for i in range(self.layers):
                grown = torch.zeros(shape, dtype=self.dtype)
                if bufs and S:
                    grown[:S, :, :T] = bufs[i]
                if len(bufs) == self.layers:
                    bufs[i] = grown
                else:
                    bufs.append(grown)
        self.free += range(S, new_S)

    def add(self, cache, mask_BT: torch.Tensor, src_B: list[int], room: int) -> None:
        """Append rows to the batch: row i takes a free slot and prefilled row ``src_B[i]`` of
        ``cache`` (a transformers cache, left-padded as ``mask_BT`` says); ``room``: the most
        tokens any of them may still add."""
        lens = mask_BT.sum(-1).tolist()
        width = mask_BT.shape[1]
        need_t = max(int(lens[r]) for r in src_B) + room
        self._reserve(self.slots + max(len(src_B) - len(self.free), 0), need_t)
        self.free.sort()  # the lowest slots first: the rows in use stay close together
        taken, self.free = self.free[: len(src_B)], self.free[len(src_B) :]
        by_row: dict[int, list[int]] = {}
        for r, s in zip(src_B, taken, strict=True):
            by_row.setdefault(r, []).append(s)
        for r, slots in by_row.items():
            n, idx = int(lens[r]), torch.tensor(slots)
            for i, layer in enumerate(cache.layers):
                self.keys[i][idx, :, :n] = layer.keys[r, :, width - n :]
                self.values[i][idx, :, :n] = layer.values[r, :, width - n :]
        self.slot_B = torch.cat([self.slot_B, torch.tensor(taken, dtype=torch.long)])
        new_len = torch.tensor([int(lens[r]) for r in src_B], dtype=torch.long)
        self.len_B = torch.cat([self.len_B, new_len])

    def keep(self, idx_B: list[int]) -> None:
        """The batch keeps rows ``idx_B`` (in that order); the other rows' slots are freed."""
        kept = set(idx_B)
        self.free += [s for b, s in enumerate(self.slot_B.tolist()) if b not in kept]
        idx = torch.tensor(idx_B, dtype=torch.long)
        self.slot_B, self.len_B = self.slot_B[idx], self.len_B[idx]

    def step_positions(self) -> torch.Tensor:
        """[B, 1]: each row's length, the position of the token it decodes now."""
        longest = int(self.len_B.max()) if len(self.len_B) else 0
        if longest + 1 > self.time:
            self._reserve(self.slots, longest + 1)
        self._attend_len_B = self.len_B + 1
        # where this step's key of row b, head h goes in a layer's buffer seen as [S·KV·T, D]:
        # one index_copy_ a tensor (indexing [slot, :, time] is a broadcasting index_put: 0.42 s
        # of a 4.6 s profile, docs/results.md)
        KV, T = self.kv_heads, self.time
        heads_K = torch.arange(KV, dtype=torch.long)
        self._at_BK = ((self.slot_B[:, None] * KV + heads_K) * T + self.len_B[:, None]).view(-1)
        return self.len_B[:, None]

    def write(self, k_BK1D: torch.Tensor, v_BK1D: torch.Tensor, layer: int) -> None:
        """This step's keys and values (after ``step_positions``) at each row's length."""
        for buf, x in ((self.keys[layer], k_BK1D), (self.values[layer], v_BK1D)):
            buf.view(-1, self.head_dim).index_copy_(0, self._at_BK, x.reshape(-1, self.head_dim))

    def attend(self, q_BH1D: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
        """[B, 1, H·D]: each row's query over its slot, its new token included."""
        k, v = self.keys[layer], self.values[layer]
        return decode_attention_slots(q_BH1D, k, v, self.slot_B, self._attend_len_B, scale)

    def advance(self) -> None:
        self.len_B = self._attend_len_B
