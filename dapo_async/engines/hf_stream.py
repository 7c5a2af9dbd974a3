"""Continuous batching for the ``hf`` engine: sequences join and leave a running batch, and new
weights are taken between chunks of ``chunk_tokens`` decode steps.

    add_request(id, prompt, params) ─► pending (one sampler for all: requests differ only in n,
                                        max_tokens and stop_token_ids)
    step():  pending? prefill them (a prompt its n sequences share, once), add them to the
             batch's KV cache
             new weights and reset_kv? recompute the whole batch's KV with them
             decode chunk_tokens tokens for every sequence (one forward per token: the lean
             step of ``hf_decode.py`` for Llama-shaped models, else transformers' forward)
             finished sequences leave the batch;
             a request whose n sequences are all finished is returned
    abort(id) ─► its rows leave the batch between steps (cache rows dropped), nothing returned

The KV cache: on a CPU with the lean step and its C attention kernel, one slot a sequence
(``slot_kv.py``: a row joins by copying its prefill into a free slot, leaves by freeing it,
and attends over its own length), so refilling a running batch costs only the new rows;
elsewhere one padded batch (``padded_kv.py``: rows left-padded to the longest; a join copies
the whole cache once, and rows that leave are dropped with the columns only they used, one
gather into a buffer with headroom).

Every token carries the version of the weights whose logits it was sampled from, so one
response may span several versions (an update between chunks). With ``reset_kv`` the cache is
recomputed after an update (a token's log-prob is then exactly its version's); otherwise the
cache built by the old weights is kept, as vLLM's in-flight updates do.

Device: everything the decode loop touches (cache, mask, sampled tokens, the sampling
generator, row indices) lives on the engine's device. Sampled tokens are read back to the host
every ``host_check_every`` steps (1 on the CPU, where a read costs nothing; ``GPU_HOST_CHECK``
on an accelerator, where each read stalls the host until the device catches up): a row that
finished between two reads decodes a few wasted steps, never a wrong token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dapo_async.engines import cpu_attention, padded_kv
from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.engines.hf_decode import LeanDecode
from dapo_async.engines.sampling import sample
from dapo_async.engines.slot_kv import SlotKV

# Mid-chunk, finished rows leave the batch once they are 1/DROP_FINISHED_AT of it (each drop
# copies the cache once; computing finished rows until the chunk ends wastes more).
DROP_FINISHED_AT = 8
# On an accelerator, sampled tokens come back to the host every this many decode steps (one
# synchronisation each): a finished row then costs at most this many wasted steps.
GPU_HOST_CHECK = 8


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: str = ""
    logits_version: int = -1  # weights that computed this row's next-token logits
    max_tokens: int = 0  # this request's length limit
    stops: frozenset = frozenset()  # token ids that end it (EOS and its stop_token_ids)


def _distinct_rows(seqs: list[_Seq]) -> tuple[list[list[int]], list[int]]:
    """(the distinct rows of ``seqs``, prompt and tokens so far; each sequence's index among
    them): the n sequences of a new request share one row, prefilled once."""
    first: dict[tuple[int, ...], int] = {}
    index = [first.setdefault(tuple(s.prompt + s.tokens), len(first)) for s in seqs]
    return [list(r) for r in first], index


class HFStream:
    """The running batch over an ``HFEngine``'s model (see the module docstring)."""

    def __init__(
        self, engine, chunk_tokens: int, reset_kv: bool = False, seed: int = 0, lean: bool = True
    ):
        self.engine = engine
        # decode steps without transformers' plumbing where the architecture allows
        self.lean = (
            LeanDecode(
                engine.model,
                engine.decode_matmul_dtype,
                kernel=getattr(engine, "decode_attention_kernel", False),
            )
            if lean and LeanDecode.supports(engine.model)
            else None
        )
        self.chunk_tokens = chunk_tokens
        self.reset_kv = reset_kv
        self.device = torch.device(engine.device)
        # on the engine's device: torch.rand refuses a generator on another one
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.host_check_every = 1 if self.device.type == "cpu" else GPU_HOST_CHECK
        self.params: SamplingParams | None = None
        self.pending: list[_Seq] = []
        self.active: list[_Seq] = []
        self.requests: dict[str, list[_Seq]] = {}
        # each row in its own slot of a fixed cache (slot_kv.py), or one padded batch
        self.slots = self._slot_cache()
        self.cache = None
        self.mask_BT: torch.Tensor | None = None  # 1 for real slots of each row's cache
        self.logits_BV: torch.Tensor | None = None  # next-token logits of each active row
        self.stats = {"prefill_tokens": 0, "decode_steps": 0, "kv_recomputes": 0}

    def _slot_cache(self) -> SlotKV | None:
        """A slot cache where the lean step's attention runs in the C kernel (a float32 model on
        a CPU, the kernel built: ``generator.compiled_attention``), else None: a padded one."""
        e = self.engine
        if (
            self.lean is None
            or not getattr(e, "decode_attention_kernel", False)
            or self.device.type != "cpu"
            or e.model.dtype != torch.float32
            or cpu_attention.kernel("decode_attention_slots") is None
        ):
            return None
        return SlotKV(len(self.lean.base.layers), self.lean.kv_heads, self.lean.head_dim)

    @property
    def num_inflight(self) -> int:
        """Sequences admitted and not finished (pending ones included)."""
        return len(self.active) + len(self.pending)

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        # one sampler for the batch: requests may differ in n, length limit and stop tokens only
        shared = replace(params, n=1, max_tokens=1, stop_token_ids=())
        if self.params is None:
            self.params = shared
        elif shared != self.params:
            raise ValueError("all requests of one stream share its sampling parameters")
        if request_id in self.requests:
            raise ValueError(f"request {request_id!r} is already in flight")
        stops = frozenset([self.engine.eos_id, *params.stop_token_ids])
        seqs = [
            _Seq(request_id, list(map(int, prompt)), max_tokens=params.max_tokens, stops=stops)
            for _ in range(params.n)
        ]
        self.requests[request_id] = seqs
        self.pending.extend(seqs)

    def abort(self, request_id: str) -> None:
        """Forget a request in flight (its rows leave the batch now, nothing comes back for
        it); between ``step`` calls. Unknown ids are ignored (it may have just finished)."""
        seqs = self.requests.pop(request_id, None)
        if not seqs:
            return
        gone = {id(s) for s in seqs}
        self.pending = [s for s in self.pending if id(s) not in gone]
        for s in seqs:
            s.finish = s.finish or "abort"
        if self.active:
            self._drop_finished(None)

    # ------------------------------------------------------------------ cache

    def _prefill(self, seqs: list[_Seq]):
        """(cache, mask_BT, last logits) of ``seqs`` over their prompt and tokens so far. Rows
        alike (the n sequences of a new request share its prompt) are computed once and their
        cache rows copied: the prefill runs on the distinct rows only."""
        distinct, index = _distinct_rows(seqs)
        if len(distinct) < len(seqs):
            cache, mask_BT, logits_BV = self._prefill_rows(distinct)
            idx = torch.tensor(index, device=self.device)
            padded_kv.keep(cache, idx, 0)
            return cache, mask_BT[idx], logits_BV[idx]
        return self._prefill_rows(distinct)

    def _admit_to_slots(self, seqs: list[_Seq], fresh: bool) -> None:
        """Prefill ``seqs`` (distinct rows once) into slots of the slot cache, appended to the
        batch (``fresh``: the batch is only these)."""
        distinct, index = _distinct_rows(seqs)
        cache, mask_BT, logits_BV = self._prefill_rows(distinct)
        if fresh:
            self.slots.keep([])
        room = max(s.max_tokens - len(s.tokens) for s in seqs)
        self.slots.add(cache, mask_BT, index, room)
        logits_BV = logits_BV[torch.tensor(index)]
        self.logits_BV = logits_BV if fresh else torch.cat([self.logits_BV, logits_BV])

    def _prefill_rows(self, rows: list[list[int]]):
        width = max(len(r) for r in rows)
        ids_BT = torch.full((len(rows), width), self.engine.pad_id, dtype=torch.long)
        mask_BT = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding
            ids_BT[i, width - len(r) :] = torch.tensor(r)
            mask_BT[i, width - len(r) :] = 1
        self.stats["prefill_tokens"] += int(mask_BT.sum())
        mask_BT = mask_BT.to(self.device)
        pos_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0)
        out = self.engine.model(
            input_ids=ids_BT.to(self.device),
            attention_mask=mask_BT,
            position_ids=pos_BT,
            use_cache=True,
        )
        padded_kv.grow_in_place(out.past_key_values)
        return out.past_key_values, mask_BT, out.logits[:, -1].float()

    def _merge(self, cache, mask_BT, logits_BV) -> None:
        """Append a prefilled batch to the running one, left-padding the shorter in time."""
        old_T, new_T = self.mask_BT.shape[1], mask_BT.shape[1]
        width = max(old_T, new_T)
        for old_layer, new_layer in zip(self.cache.layers, cache.layers):
            padded_kv.join(old_layer, new_layer, width)
        self.mask_BT = torch.cat(
            [
                torch.nn.functional.pad(self.mask_BT, (width - old_T, 0)),
                torch.nn.functional.pad(mask_BT, (width - new_T, 0)),
            ]
        )
        self.logits_BV = torch.cat([self.logits_BV, logits_BV])

    def _admit(self) -> None:
        """Bring pending sequences into the batch; after an update with ``reset_kv``, recompute
        every row's cache with the new weights."""
        version = self.engine.version
        outdated = any(s.logits_version != version for s in self.active)
        if not self.active or (outdated and self.reset_kv):
            self.stats["kv_recomputes"] += int(bool(self.active))
            self.active += self.pending
            self.pending = []
            if self.slots is not None:
                self._admit_to_slots(self.active, fresh=True)
            else:
                self.cache, self.mask_BT, self.logits_BV = self._prefill(self.active)
            for s in self.active:
                s.logits_version = version
        elif self.pending:
            if self.slots is not None:
                self._admit_to_slots(self.pending, fresh=False)
            else:
                self._merge(*self._prefill(self.pending))
            for s in self.pending:
                s.logits_version = version
            self.active += self.pending
            self.pending = []

    # ------------------------------------------------------------------ decode

    @torch.no_grad()
    def step(self) -> list[tuple[str, list[Completion]]]:
        """Decode up to ``chunk_tokens`` tokens for every sequence; the requests finished."""
        if not self.active and not self.pending:
            return []
        self._admit()
        unread: list[tuple[torch.Tensor, torch.Tensor]] = []  # sampled, not yet on the host
        for i in range(self.chunk_tokens):
            token_B, logp_B = sample(self.logits_BV, self.params, self.generator)
            unread.append((token_B, logp_B))
            if (i + 1) % self.host_check_every == 0 or i + 1 == self.chunk_tokens:
                if not self._record(unread):
                    break
                unread = []
                done = sum(1 for s in self.active if s.finish)
                if done * DROP_FINISHED_AT >= len(self.active):
                    token_B = self._drop_finished(token_B)  # stop computing them mid-chunk
            self._forward(token_B)
        self._drop_finished(None)
        return self._collect()

    def _record(self, unread: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        """Read the tokens sampled since the last read (one host transfer) into the unfinished
        rows, up to each row's EOS or ``max_tokens``; whether any row is still decoding."""
        tokens_KB = torch.stack([t for t, _ in unread]).double()  # ids are exact in float64
        logps_KB = torch.stack([lp for _, lp in unread]).clamp(max=0.0).double()
        tokens_KB, logps_KB = torch.stack([tokens_KB, logps_KB]).tolist()
        version = self.engine.version
        live = False
        for b, s in enumerate(self.active):
            for tokens_B, logps_B in zip(tokens_KB, logps_KB):
                if s.finish:
                    break
                t = int(tokens_B[b])
                s.tokens.append(t)
                s.logprobs.append(logps_B[b])
                s.versions.append(s.logits_version)
                s.logits_version = version  # the next logits come from the current weights
                if t in s.stops:
                    s.finish = "stop"
                elif len(s.tokens) >= s.max_tokens:
                    s.finish = "length"
            live = live or not s.finish
        return live

    def _forward(self, token_B: torch.Tensor) -> None:
        if self.slots is not None:  # positions, writes and attention per slot
            self.stats["decode_steps"] += 1
            pos_B1 = self.slots.step_positions()
            self.logits_BV = self.lean(token_B, pos_B1, None, self.slots).float()
            self.slots.advance()
            return
        self.mask_BT = torch.cat([self.mask_BT, self.mask_BT.new_ones((len(token_B), 1))], dim=1)
        pos_B1 = self.mask_BT.sum(-1, keepdim=True) - 1
        self.stats["decode_steps"] += 1
        if self.lean is not None:
            self.logits_BV = self.lean(token_B, pos_B1, self._attention_bias(), self.cache).float()
            return
        out = self.engine.model(
            input_ids=token_B[:, None],
            attention_mask=self._attention_bias(),
            position_ids=pos_B1,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.logits_BV = out.logits[:, -1].float()

    def _attention_bias(self) -> torch.Tensor:
        """The decode step's mask as a [B, 1, 1, T] additive bias (0: attend; the dtype's
        lowest value: a padding slot). transformers uses a 4-D mask as given; from the 2-D mask
        it would first ask the host whether any row is padded, one synchronisation per token."""
        dtype = self.engine.model.dtype
        bias_BT = torch.zeros(self.mask_BT.shape, dtype=dtype, device=self.device)
        bias_BT.masked_fill_(self.mask_BT == 0, torch.finfo(dtype).min)
        return bias_BT[:, None, None, :]

    def _drop_finished(self, token_B: torch.Tensor | None) -> torch.Tensor | None:
        """Remove finished rows from the batch (cache, mask, logits; and ``token_B``)."""
        keep = [i for i, s in enumerate(self.active) if not s.finish]
        if len(keep) == len(self.active):
            return token_B
        if self.slots is not None:  # nothing copied: the rows that left free their slots
            self.slots.keep(keep)
            idx = torch.tensor(keep, dtype=torch.long)
            self.logits_BV = self.logits_BV[idx] if keep else None
            token_B = None if token_B is None or not keep else token_B[idx]
        elif keep:
            idx = torch.tensor(keep, device=self.device)
            self.mask_BT = self.mask_BT[idx]
            # columns now padding in every row (left by the rows that left) go too: without
            # this the cache only ever grows and each step attends over more of it
            used_T = self.mask_BT.any(0).nonzero()
            start = int(used_T[0]) if len(used_T) else 0
            self.mask_BT = self.mask_BT[:, start:]
            padded_kv.keep(self.cache, idx, start)
            self.logits_BV = self.logits_BV[idx]
            token_B = None if token_B is None else token_B[idx]
        else:
            self.cache = self.mask_BT = self.logits_BV = None
        self.active = [self.active[i] for i in keep]
        return token_B

    def _collect(self) -> list[tuple[str, list[Completion]]]:
        done = []
        for rid, seqs in list(self.requests.items()):
            if all(s.finish for s in seqs):
                del self.requests[rid]
                done.append((rid, [self._completion(s) for s in seqs]))
        return done

    def _completion(self, s: _Seq) -> Completion:
        toks = np.asarray(s.tokens, np.int32)
        return Completion(
            tokens=toks,
            logprobs=np.asarray(s.logprobs, np.float32),
            finish=s.finish,
            text=self.engine.tokenizer.decode(toks, skip_special_tokens=True),
            versions=np.asarray(s.versions, np.int32),
        )
