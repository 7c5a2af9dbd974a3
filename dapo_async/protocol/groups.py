"""Scored groups: one ``Group`` (a prompt's G responses with per-token log-probs and policy
versions, rewards and components) and the columnar ``GroupBatch`` that travels on the wire and
sits in the buffer, laid out as one 8-byte-aligned buffer (``packed_layout``) so encoding sends it
without a copy and decoding yields views of the received frame."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dapo_async.protocol.checks import ProtocolError

# A behaviour log-prob is <= 0; engines round, so allow this much above zero.
LOGPROB_TOLERANCE = 1e-3

FINISH_STOP = 0
FINISH_LENGTH = 1
FINISH_ABORT = 2
FINISH_REASONS = {"stop": FINISH_STOP, "length": FINISH_LENGTH, "abort": FINISH_ABORT}

DTYPES = {
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "float32": np.dtype("<f4"),
    "uint8": np.dtype("|u1"),
}


GroupId = tuple[str, int]


@dataclass
class Group:
    """One prompt's G scored responses, with per-token behaviour log-probs and versions.

    Token arrays are flat over the G responses; ``response_lens`` splits them.
    """

    generator_id: str
    seq: int
    prompt_id: int
    prompt_tokens: np.ndarray  # int32 [P]
    response_lens: np.ndarray  # int32 [G]
    tokens: np.ndarray  # int32 [T] (T = sum response_lens)
    logprobs: np.ndarray  # float32 [T], behaviour log-probs of the sampled tokens
    versions: np.ndarray  # int32 [T], policy version that produced each token
    rewards: np.ndarray  # float32 [G], total reward
    acc: np.ndarray  # float32 [G], correctness in {0, 1}
    components: np.ndarray  # float32 [G, C], reward components (names on the batch)
    finish: np.ndarray  # uint8 [G], FINISH_* codes
    gen_time_s: float = 0.0
    # uint8 [T]: 1 where the policy sampled the token, 0 for tokens an environment appended
    # (a tool's result, a simulated user's turn: no loss, no KL, no entropy, no denominator);
    # None = every token sampled (a single-turn response)
    sampled: np.ndarray | None = None

    @property
    def group_id(self) -> GroupId:
        return (self.generator_id, self.seq)

    @property
    def num_responses(self) -> int:
        return int(self.response_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


# Array names of the columnar group layout, in frame order, with dtype and ndim.
GROUP_ARRAYS: dict[str, tuple[str, int]] = {
    "seqs": ("int64", 1),
    "prompt_ids": ("int64", 1),
    "gen_time_s": ("float32", 1),
    "prompt_lens": ("int32", 1),
    "prompt_tokens": ("int32", 1),
    "num_responses": ("int32", 1),
    "response_lens": ("int32", 1),
    "rewards": ("float32", 1),
    "acc": ("float32", 1),
    "components": ("float32", 2),
    "finish": ("uint8", 1),
    "tokens": ("int32", 1),
    "logprobs": ("float32", 1),
    "versions": ("int32", 1),
    "sampled": ("uint8", 1),
}


# Column offsets inside the data frame are multiples of this (aligned numpy views).
ALIGN = 8


def _alloc_packed(shapes: dict[str, tuple[int, ...]]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """One uint8 buffer holding every group column, and the typed views into it."""
    shapes = {name: shapes[name] for name in GROUP_ARRAYS}  # wire order
    offsets, total = {}, 0
    for name, shape in shapes.items():
        offsets[name] = total
        nbytes = math.prod(shape) * DTYPES[GROUP_ARRAYS[name][0]].itemsize
        total += -(-nbytes // ALIGN) * ALIGN
    buf = np.empty(total, dtype=np.uint8)
    cols = {}
    for name, shape in shapes.items():
        dt = DTYPES[GROUP_ARRAYS[name][0]]
        n = math.prod(shape)
        cols[name] = buf[offsets[name] : offsets[name] + n * dt.itemsize].view(dt).reshape(shape)
    return buf, cols


def packed_layout(batch: GroupBatch) -> tuple[Any, list[list]]:
    """(data buffer, specs [name, dtype, shape, byte offset]) of a batch, packing if needed."""
    if batch.buffer is None:
        batch = GroupBatch.from_groups(list(batch), batch.component_names)
    base = np.asarray(batch.buffer)
    start = base.__array_interface__["data"][0]
    specs, end = [], 0
    for name in GROUP_ARRAYS:
        arr = batch.cols[name]
        # An empty column's pointer is meaningless; place it where the previous one ended.
        off = arr.__array_interface__["data"][0] - start if arr.size else -(-end // ALIGN) * ALIGN
        specs.append([name, GROUP_ARRAYS[name][0], list(arr.shape), off])
        end = off + arr.nbytes
    return batch.buffer, specs


class GroupBatch:
    """K groups in columnar form: what travels on the wire and what the buffer stores.

    Per-group arrays have K rows, per-response arrays R = sum(num_responses) rows and per-token
    arrays T = sum(response_lens) rows. ``group(i)`` returns zero-copy views; offsets are
    computed once, lazily.
    """

    __slots__ = ("_offsets", "buffer", "cols", "component_names", "gen_ids")

    def __init__(
        self,
        gen_ids: list[str],
        cols: dict[str, np.ndarray],
        component_names: list[str],
        buffer: Any = None,
    ):
        self.gen_ids = gen_ids
        self.cols = cols
        self.component_names = component_names
        # The contiguous bytes every column is a view of (None: columns are separate arrays).
        self.buffer = buffer
        self._offsets: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @classmethod
    def from_groups(cls, groups: Sequence[Group], component_names: Sequence[str]) -> GroupBatch:
        """Concatenate groups into one contiguous buffer (the wire's data frame)."""
        c = len(component_names)
        r = sum(g.num_responses for g in groups)
        per_group = {
            "seqs": [g.seq for g in groups],
            "prompt_ids": [g.prompt_id for g in groups],
            "gen_time_s": [g.gen_time_s for g in groups],
            "prompt_lens": [len(g.prompt_tokens) for g in groups],
            "num_responses": [g.num_responses for g in groups],
        }
        parts = {
            "prompt_tokens": [g.prompt_tokens for g in groups],
            "response_lens": [g.response_lens for g in groups],
            "rewards": [g.rewards for g in groups],
            "acc": [g.acc for g in groups],
            "components": [np.asarray(g.components).reshape(g.num_responses, c) for g in groups],
            "finish": [g.finish for g in groups],
            "tokens": [g.tokens for g in groups],
            "logprobs": [g.logprobs for g in groups],
            "versions": [g.versions for g in groups],
            "sampled": [_sampled(g) for g in groups],
        }
        shapes = {name: (len(groups),) for name in per_group}
        shapes.update({name: (sum(len(x) for x in v),) for name, v in parts.items()})
        shapes["components"] = (r, c)
        buf, cols = _alloc_packed(shapes)
        for name, values in per_group.items():
            cols[name][:] = values
        for name, arrs in parts.items():
            if arrs and cols[name].size:
                np.concatenate(arrs, out=cols[name], casting="unsafe")
        return cls([g.generator_id for g in groups], cols, list(component_names), buf)

    @classmethod
    def empty(cls, component_names: Sequence[str] = ()) -> GroupBatch:
        return cls.from_groups([], component_names)

    def __len__(self) -> int:
        return len(self.gen_ids)

    def __iter__(self):
        return (self.group(i) for i in range(len(self)))

    @property
    def num_tokens(self) -> int:
        return int(self.cols["tokens"].shape[0])

    def offsets(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start offsets (length K+1) into prompt tokens, responses and response tokens."""
        if self._offsets is None:
            c = self.cols
            p = np.zeros(len(self) + 1, dtype=np.int64)
            np.cumsum(c["prompt_lens"], out=p[1:])
            r = np.zeros(len(self) + 1, dtype=np.int64)
            np.cumsum(c["num_responses"], out=r[1:])
            rt = np.zeros(c["response_lens"].shape[0] + 1, dtype=np.int64)
            np.cumsum(c["response_lens"], out=rt[1:])
            self._offsets = (p, r, rt[r])
        return self._offsets

    def group(self, i: int) -> Group:
        c = self.cols
        p, r, t = self.offsets()
        rs = slice(int(r[i]), int(r[i + 1]))
        ts = slice(int(t[i]), int(t[i + 1]))
        return Group(
            generator_id=self.gen_ids[i],
            seq=int(c["seqs"][i]),
            prompt_id=int(c["prompt_ids"][i]),
            prompt_tokens=c["prompt_tokens"][int(p[i]) : int(p[i + 1])],
            response_lens=c["response_lens"][rs],
            tokens=c["tokens"][ts],
            logprobs=c["logprobs"][ts],
            versions=c["versions"][ts],
            rewards=c["rewards"][rs],
            acc=c["acc"][rs],
            components=c["components"][rs],
            finish=c["finish"][rs],
            gen_time_s=float(c["gen_time_s"][i]),
            sampled=c["sampled"][ts],
        )

    def group_ids(self) -> list[GroupId]:
        return list(zip(self.gen_ids, self.cols["seqs"].tolist(), strict=False))

    def select(self, indices: Sequence[int]) -> GroupBatch:
        """A new batch holding the groups at ``indices`` (copies)."""
        return GroupBatch.from_groups([self.group(i) for i in indices], self.component_names)

    def validate(self) -> None:
        """Length consistency, ranges and finiteness; raises ProtocolError."""
        cols, k = self.cols, len(self)
        for name in ("seqs", "prompt_ids", "gen_time_s", "prompt_lens", "num_responses"):
            if cols[name].shape[0] != k:
                raise ProtocolError("length_mismatch", f"len({name}) != number of group ids")
        if k and (cols["prompt_lens"].min() < 1 or cols["num_responses"].min() < 1):
            raise ProtocolError("bad_value", "prompt_lens and num_responses must be >= 1")
        if k and (cols["seqs"].min() < 0 or cols["prompt_ids"].min() < 0):
            raise ProtocolError("bad_value", "seqs and prompt_ids must be >= 0")
        if int(cols["prompt_lens"].sum(dtype=np.int64)) != cols["prompt_tokens"].shape[0]:
            raise ProtocolError("length_mismatch", "sum(prompt_lens) != len(prompt_tokens)")
        r = int(cols["num_responses"].sum(dtype=np.int64))
        for name in ("response_lens", "rewards", "acc", "finish", "components"):
            if cols[name].shape[0] != r:
                raise ProtocolError("length_mismatch", f"len({name}) != sum(num_responses)")
        if cols["components"].shape[1] != len(self.component_names):
            raise ProtocolError("length_mismatch", "components columns != len(component_names)")
        if r and cols["response_lens"].min() < 0:
            raise ProtocolError("bad_value", "response_lens must be >= 0")
        t = int(cols["response_lens"].sum(dtype=np.int64))
        for name in ("tokens", "logprobs", "versions", "sampled"):
            if cols[name].shape[0] != t:
                raise ProtocolError("length_mismatch", f"len({name}) != sum(response_lens)")
        for name in ("prompt_tokens", "tokens", "versions"):
            if cols[name].size and cols[name].min() < 0:
                raise ProtocolError("bad_value", f"{name} must be >= 0")
        for name in ("rewards", "acc", "components", "gen_time_s"):
            if not np.isfinite(cols[name]).all():
                raise ProtocolError("non_finite", f"{name} holds NaN or inf")
        # max() is NaN when any element is NaN, so one reduction checks both conditions.
        if t and not (
            cols["logprobs"].max() <= LOGPROB_TOLERANCE and np.isfinite(cols["logprobs"].min())
        ):
            raise ProtocolError("non_finite", "logprobs must be finite and <= 0")
        if r and cols["finish"].max() > FINISH_ABORT:
            raise ProtocolError("bad_value", "unknown finish code")
        _check_sampled(cols["sampled"], cols["response_lens"])


def _sampled(g: Group) -> np.ndarray:
    """A group's sampled mask (all ones where it carries none)."""
    return np.ones(g.num_tokens, np.uint8) if g.sampled is None else g.sampled


def _check_sampled(sampled: np.ndarray, response_lens: np.ndarray) -> None:
    """0/1 values, and every non-empty response starts with a token the policy sampled (an
    episode opens with the policy's turn: environment tokens follow a prompt only as part of
    the prompt)."""
    if not sampled.size:
        return
    if sampled.max() > 1:
        raise ProtocolError("bad_value", "sampled must hold 0 or 1")
    starts = np.concatenate([[0], np.cumsum(response_lens[:-1], dtype=np.int64)])
    firsts = starts[response_lens > 0]
    if firsts.size and sampled[firsts].min() < 1:
        raise ProtocolError("bad_value", "a response must start with a sampled token")
