"""Rollout functions: one episode as the user writes it, token in and token out.

    rollout(ctx, sample) -> Trajectory          (``async def`` or plain ``def``)
    generator.rollout = "pkg.module:function"   (empty = ``single_turn``, the default)

Inside, ``await ctx.generate(token_ids)`` samples one turn from the policy: its tokens, their
behaviour log-probs and the weight version of every token. The function appends what an
environment says (a tool's result, a simulated user's turn) as tokens of its own
(``Episode.add_env``) and returns one token sequence with a mask saying which tokens the policy
sampled. Nothing is decoded and re-encoded between turns: the next turn is conditioned on exactly
the tokens sampled so far (``Episode.tokens``), so the behaviour log-probs stay the ones the
learner recomputes. Environment tokens carry log-prob 0 and the version of the sampled token
before them; they travel with ``sampled`` = 0 and leave the loss (``learner.batching``).

``EpisodeRunner.run`` plays every episode of a lease at once as asyncio tasks:

    episodes ─► each awaits ctx.generate ─► queue
    once every live episode waits (or BATCH_WAIT_S passed): one engine.generate for the queue
        (requests with the same tokens and settings merge into one with n = their count, so
        the single-turn default makes the very call the batch loop always made: P prompts × G)
    results ─► the waiting episodes go on ─► between_turns() (new weights may land here)

A plain ``def`` rollout runs its episodes one after another (``ctx.generate`` then returns the
turn itself). Stream mode plays episodes on the engine's continuous-batching decoder instead
(``episode_stream.EpisodeStream``, async rollouts only). Examples: ``examples/tool_rollout.py``, ``examples/dialogue_rollout.py``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.utils import import_callable

# How long the runner waits for every live episode to reach ctx.generate before it serves the
# turns queued so far (an episode may await something else: a tool's real I/O).
BATCH_WAIT_S = 0.05
# Event-loop turns given to episodes before the runner starts sleeping between checks (a turn
# of pure Python, the usual case, needs a few of these).
SPIN_TURNS = 8


class RolloutError(RuntimeError):
    """A rollout function is missing, malformed, or returned a bad trajectory."""


@dataclass
class Sample:
    """What an episode starts from: one leased prompt, the ``index``-th of its G episodes."""

    prompt_tokens: list[int]
    ground_truth: str = ""
    prompt_text: str = ""
    extra: dict = field(default_factory=dict)
    index: int = 0


@dataclass
class Turn:
    """One sampled turn: tokens, behaviour log-probs and versions, each [n]."""

    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32
    versions: np.ndarray  # int32
    finish: str  # "stop" | "length"
    text: str = ""


@dataclass
class Trajectory:
    """An episode's response part (everything after the prompt), each array [T]."""

    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float32 (0 at environment tokens)
    versions: np.ndarray  # int32
    sampled: np.ndarray | None  # uint8, 1 = sampled by the policy; None = all sampled
    finish: str
    text: str = ""  # what the reward reads; "" = the tokens decoded
    info: dict[str, float] = field(default_factory=dict)  # averaged into rollout/* metrics
    # a reward the rollout computed itself (e.g. the sum of per-turn rewards), added to the
    # reward function's with weight reward.rollout_weight (part "rollout"); None = 0
    reward: float | None = None

    def completion(self, tokenizer=None) -> Completion:
        text = self.text
        if not text and tokenizer is not None:
            text = tokenizer.decode(list(map(int, self.tokens)), skip_special_tokens=True)
        return Completion(
            tokens=self.tokens,
            logprobs=self.logprobs,
            finish=self.finish,
            text=text,
            extra=dict(self.info),
            versions=self.versions,
            sampled=self.sampled,
            rollout_reward=self.reward,
        )


class Episode:
    """Builds a trajectory turn by turn: ``add_turn`` what ``ctx.generate`` returned,
    ``add_env`` the environment's tokens; ``tokens`` is the prompt and everything so far."""

    def __init__(self, prompt_tokens: list[int]):
        self.prompt = [int(t) for t in prompt_tokens]
        self._tokens: list[int] = []
        self._logps: list[float] = []
        self._versions: list[int] = []
        self._sampled: list[int] = []
        self.finish = "stop"

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self._tokens

    @property
    def num_sampled(self) -> int:
        return sum(self._sampled)

    def add_turn(self, turn: Turn) -> None:
        self._tokens += turn.tokens.tolist()
        self._logps += turn.logprobs.tolist()
        self._versions += turn.versions.tolist()
        self._sampled += [1] * len(turn.tokens)
        self.finish = turn.finish

    def add_env(self, token_ids: list[int]) -> None:
        if not self._sampled:
            raise RolloutError("an episode must open with a sampled turn (put text before the "
                               "policy's first turn into the prompt)")  # fmt: skip
        version = self._versions[-1]  # the environment answered what this version sampled
        self._tokens += [int(t) for t in token_ids]
        self._logps += [0.0] * len(token_ids)
        self._versions += [version] * len(token_ids)
        self._sampled += [0] * len(token_ids)

    def trajectory(
        self, text: str = "", info: dict[str, float] | None = None, reward: float | None = None
    ) -> Trajectory:
        sampled = np.asarray(self._sampled, np.uint8)
        return Trajectory(
            tokens=np.asarray(self._tokens, np.int32),
            logprobs=np.asarray(self._logps, np.float32),
            versions=np.asarray(self._versions, np.int32),
            sampled=None if sampled.all() else sampled,
            finish=self.finish,
            text=text,
            info=dict(info or {}),
            reward=reward,
        )


class RolloutContext:
    """What a rollout function is given: the policy (``generate``), the tokenizer, the
    generator's sampling settings; one per episode (it keeps the episode's token budget)."""

    def __init__(self, runner: EpisodeRunner, params: SamplingParams):
        self._runner = runner
        self.params = params  # temperature, top-p, ...; max_tokens = the episode's budget
        self.tokenizer = runner.tokenizer
        self.eos_id = getattr(runner.engine, "eos_id", None)
        self.sampled_tokens = 0  # sampled so far in this episode

    def _request(self, max_tokens, stop_token_ids) -> SamplingParams | None:
        left = self.params.max_tokens - self.sampled_tokens
        n = left if max_tokens is None else min(max_tokens, left)
        if n <= 0:
            return None
        return replace(self.params, n=1, max_tokens=n, stop_token_ids=tuple(stop_token_ids))

    async def generate(self, token_ids, max_tokens: int | None = None, stop_token_ids=()) -> Turn:
        """Sample one turn conditioned on ``token_ids`` (a list of ints), at most ``max_tokens``
        and never past the episode's budget (``generator.max_tokens`` sampled tokens in all:
        an empty turn with finish "length" once it is spent); the turn ends at EOS or at one of
        ``stop_token_ids`` (kept in the turn)."""
        params = self._request(max_tokens, stop_token_ids)
        turn = _EMPTY if params is None else await self._runner.queue_turn(token_ids, params)
        self.sampled_tokens += len(turn.tokens)
        return turn

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as the tokenizer writes it, no special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(map(int, token_ids)), skip_special_tokens=True)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """A chat turn rendered with the tokenizer's own template, into tokens once."""
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return self.encode(text)


_EMPTY = Turn(np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(0, np.int32), "length")


async def single_turn(ctx: RolloutContext, sample: Sample) -> Trajectory:
    """The default rollout: one sampled response to the prompt."""
    turn = await ctx.generate(sample.prompt_tokens)
    return Trajectory(turn.tokens, turn.logprobs, turn.versions, None, turn.finish, turn.text)


def load_rollout(path: str) -> Callable:
    """The rollout function ``pkg.module:function`` names ('' = ``single_turn``)."""
    if not path:
        return single_turn
    mod_name, sep, attr = path.partition(":")
    if not sep or not mod_name or not attr:
        raise RolloutError(f"generator.rollout must be 'package.module:function', got {path!r}")
    try:
        return import_callable(path, "generator.rollout")
    except ValueError as e:
        raise RolloutError(str(e)) from None


class EpisodeRunner:
    """Plays a lease's episodes with ``fn`` on ``engine`` (see the module docstring)."""

    def __init__(
        self,
        fn: Callable,
        engine,
        params: SamplingParams,
        tokenizer=None,
        between_turns: Callable[[], None] | None = None,
    ):
        self.fn = fn
        self.engine = engine
        self.params = params
        # anything with ``generate(prompt ids, params)`` serves (evaluation takes any such)
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engine, "tokenizer", None)
        self.between_turns = between_turns
        self.is_async = inspect.iscoroutinefunction(fn)
        self._queue: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self._loop = asyncio.new_event_loop() if self.is_async else None
        self.engine_calls = 0

    def run(self, samples: list[Sample]) -> list[Trajectory]:
        """One trajectory per sample, in order."""
        if not self.is_async:
            return [
                check_trajectory(
                    self.fn(_SyncContext(self, self.params), s), self.fn, self.tokenizer
                )
                for s in samples
            ]
        return self._loop.run_until_complete(self._drive(samples))

    async def queue_turn(self, token_ids, params: SamplingParams) -> Turn:
        fut = self._loop.create_future()
        self._queue.append((list(map(int, token_ids)), params, fut))
        return await fut

    async def _drive(self, samples: list[Sample]) -> list[Trajectory]:
        tasks = [
            self._loop.create_task(self.fn(RolloutContext(self, self.params), s)) for s in samples
        ]
        try:
            while live := [t for t in tasks if not t.done()]:
                await self._settle(live)
                if self._queue:
                    batch, self._queue = self._queue, []
                    turns = self.serve([(ids, p) for ids, p, _ in batch])
                    for (_, _, fut), turn in zip(batch, turns):
                        fut.set_result(turn)
                    if self.between_turns is not None:
                        self.between_turns()
            for t, s in zip(tasks, samples):
                if t.exception() is not None:
                    raise episode_failed(self.fn, s, t.exception()) from t.exception()
            return [check_trajectory(t.result(), self.fn, self.tokenizer) for t in tasks]
        finally:
            for t in tasks:
                t.cancel()
            self._queue = []

    async def _settle(self, live: list) -> None:
        """Until every live episode waits on a turn (or BATCH_WAIT_S passed)."""
        deadline = time.monotonic() + BATCH_WAIT_S
        spins = 0
        while len(self._queue) < sum(not t.done() for t in live):
            if spins < SPIN_TURNS:
                spins += 1
                await asyncio.sleep(0)
            elif time.monotonic() >= deadline:
                return
            else:
                await asyncio.sleep(0.001)

    def serve(self, requests: list[tuple[list[int], SamplingParams]]) -> list[Turn]:
        """Sample every request (tokens, settings) in as few engine calls as possible: the same
        tokens with the same settings are one request with n = their count."""
        merged: dict[tuple, list[int]] = {}  # (settings, tokens) -> request indices
        for i, (ids, params) in enumerate(requests):
            merged.setdefault((params, tuple(ids)), []).append(i)
        calls: dict[tuple, list[tuple]] = {}  # (settings, n) -> merged keys, in first-seen order
        for key, idx in merged.items():
            calls.setdefault((key[0], len(idx)), []).append(key)
        out: list[Turn | None] = [None] * len(requests)
        for (params, n), keys in calls.items():
            version = getattr(self.engine, "version", 0)
            outs = self.engine.generate([list(k[1]) for k in keys], replace(params, n=n))
            self.engine_calls += 1
            for key, comps in zip(keys, outs):
                for i, c in zip(merged[key], comps):
                    out[i] = turn_of(c, version)
        return out  # type: ignore[return-value]


class _SyncContext(RolloutContext):
    """The context of a plain ``def`` rollout: ``generate`` returns the turn itself."""

    def generate(self, token_ids, max_tokens=None, stop_token_ids=()):  # type: ignore[override]
        """One engine call per turn (plain functions play their episodes one by one)."""
        params = self._request(max_tokens, stop_token_ids)
        turn = _EMPTY if params is None else self._runner.serve([(list(token_ids), params)])[0]
        self.sampled_tokens += len(turn.tokens)
        return turn


def check_trajectory(traj: Any, fn: Callable, tokenizer=None) -> Trajectory:
    """``traj`` if it is a well-formed Trajectory (its text decoded if empty), else
    RolloutError naming ``fn``."""
    if not isinstance(traj, Trajectory):
        raise RolloutError(
            f"the rollout function {_name(fn)} returned {type(traj).__name__}, not a "
            "Trajectory (build one with Episode.trajectory())"
        )
    n = len(traj.tokens)
    arrays = (traj.logprobs, traj.versions) + (() if traj.sampled is None else (traj.sampled,))
    if any(len(a) != n for a in arrays):
        raise RolloutError(f"{_name(fn)}: trajectory arrays differ in length")
    if n and traj.sampled is not None and traj.sampled[0] != 1:
        raise RolloutError(f"{_name(fn)}: a trajectory must start with a sampled token")
    if traj.reward is not None and not math.isfinite(float(traj.reward)):
        raise RolloutError(f"{_name(fn)}: the trajectory's reward is {traj.reward}")
    if not traj.text and tokenizer is not None:
        traj.text = tokenizer.decode(list(map(int, traj.tokens)), skip_special_tokens=True)
    return traj


def episode_failed(fn: Callable, sample: Sample, e: BaseException) -> RolloutError:
    return RolloutError(
        f"the rollout function {_name(fn)} failed on prompt tokens {sample.prompt_tokens[:16]}…: "
        f"{type(e).__name__}: {e}"
    )


def turn_of(c: Completion, version: int) -> Turn:
    versions = c.versions if c.versions is not None else np.full(len(c.tokens), version, np.int32)
    return Turn(
        np.asarray(c.tokens, np.int32),
        np.minimum(np.asarray(c.logprobs, np.float32), 0.0),
        np.asarray(versions, np.int32),
        c.finish,
        c.text,
    )


def _name(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"


def info_means(completions) -> dict[str, float]:
    """The mean of each ``Trajectory.info`` value over ``completions`` (their ``extra``)."""
    sums: dict[str, list[float]] = {}
    for c in completions:
        for key, value in c.extra.items():
            if isinstance(value, (int, float)):
                sums.setdefault(key, []).append(float(value))
    return {key: float(np.mean(v)) for key, v in sums.items()}
