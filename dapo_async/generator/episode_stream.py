"""Stream mode for rollout functions: episodes are requests of the engine's continuous-batching
decoder, so one slow episode holds no other.

``EpisodeStream`` is a ``Stream`` (``engines.base``) to the stream loop: a request of n
responses is n episodes of the rollout function, and it comes back once all n returned.
Inside, every turn of every episode is a request (n = 1) of the engine's own stream:

    StreamLoop ── add_request(rid, prompt, params, sample) ─► n episode tasks (asyncio)
    step():  the episodes run until each waits on ctx.generate ─► their turns join the engine
             stream (each with its own length budget and stop tokens)
             engine stream.step() ─► finished turns wake their episodes, every token tagged
             with its version (weights may land inside a turn or between two)
             requests whose n episodes all returned come back: (rid, completions)
    abort(rid) ─► its episodes cancelled, the turns they awaited dropped from the engine stream

Turns of different episodes decode side by side, a new turn joins the running batch the moment
its episode asks for it, and an episode that finishes frees its place for the next prompt.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import replace

from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.rollouts import (
    RolloutContext,
    RolloutError,
    Sample,
    Turn,
    check_trajectory,
    episode_failed,
    turn_of,
)

# Event-loop turns given to the episodes per step, before and after the decode chunk (pure
# Python between two turns needs a few).
SPIN_TURNS = 8
# When no turn is decoding but episodes are alive (they await their own I/O), wait this long
# per step instead of spinning.
IO_WAIT_S = 0.001
# At close, how long cancelled episodes get to unwind (they only await this stream's turns).
CLOSE_WAIT_S = 1.0


class EpisodeStream:
    """The rollout function ``fn``'s episodes on ``inner`` (the engine's ``Stream``)."""

    def __init__(self, inner, fn: Callable, engine, tokenizer=None):
        if not inspect.iscoroutinefunction(fn):
            raise RolloutError(
                f"generator.mode=stream needs an `async def` rollout function; "
                f"{getattr(fn, '__qualname__', fn)} is a plain function (or use generator.mode=batch)"
            )
        self.inner = inner
        self.fn = fn
        self.engine = engine
        self.tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
        self.loop = asyncio.new_event_loop()
        self.episodes: dict[str, list[tuple[asyncio.Task, Sample]]] = {}
        self.turns: dict[str, asyncio.Future] = {}  # engine request id -> the waiting episode
        self.queued: list[tuple[str, list[int], SamplingParams]] = []
        self._turn_ids = 0

    @property
    def num_inflight(self) -> int:
        """Episodes still playing."""
        return sum(not t.done() for eps in self.episodes.values() for t, _ in eps)

    def add_request(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        sample: Sample | None = None,
    ) -> None:
        if request_id in self.episodes:
            raise ValueError(f"request {request_id!r} is already in flight")
        base = sample if sample is not None else Sample(list(map(int, prompt)))
        eps = []
        for i in range(params.n):
            s = replace(base, prompt_tokens=list(base.prompt_tokens), index=i)
            ctx = RolloutContext(self, replace(params, n=1))
            eps.append((self.loop.create_task(self.fn(ctx, s)), s))
        self.episodes[request_id] = eps

    async def queue_turn(self, token_ids, params: SamplingParams) -> Turn:
        """A turn asked for by an episode (``RolloutContext.generate``)."""
        fut = self.loop.create_future()
        rid = f"turn-{self._turn_ids}"
        self._turn_ids += 1
        self.queued.append((rid, list(map(int, token_ids)), params))
        self.turns[rid] = fut
        return await fut

    def step(self) -> list[tuple[str, list[Completion]]]:
        """Run the episodes, decode one chunk of their turns; the requests finished."""
        self._spin()
        for rid, ids, params in self.queued:
            self.inner.add_request(rid, ids, params)
        self.queued = []
        if self.inner.num_inflight:
            for rid, comps in self.inner.step():
                fut = self.turns.pop(rid)
                if not fut.done():  # (a turn of an episode cancelled on its own is dropped)
                    fut.set_result(turn_of(comps[0], self.engine.version))
            self._spin()
        elif self.num_inflight:
            self.loop.run_until_complete(asyncio.sleep(IO_WAIT_S))
        return self._finished()

    def abort(self, request_id: str) -> None:
        """Drop a request's episodes: cancel them, let them unwind (bounded, as at ``close``),
        then drop the turns they were waiting on from the engine's stream."""
        eps = self.episodes.pop(request_id, None)
        if not eps:
            return
        self._cancel([t for t, _ in eps])
        # a cancelled episode cancels the turn future it awaited (and its sub-tasks' ones)
        gone = {rid for rid, fut in self.turns.items() if fut.cancelled()}
        self.queued = [q for q in self.queued if q[0] not in gone]
        for rid in gone:
            del self.turns[rid]
            self.inner.abort(rid)

    def close(self) -> None:
        """The run ends: cancel the episodes still playing (bounded: a rollout function that
        ignores cancellation is left behind), then close the event loop — no 'Task was
        destroyed but it is pending' per in-flight episode at exit."""
        if self.loop.is_closed():
            return
        self._cancel([t for eps in self.episodes.values() for t, _ in eps])
        self.loop.close()

    def _cancel(self, tasks: list[asyncio.Task]) -> None:
        """Cancel the episodes not done and let them unwind, at most CLOSE_WAIT_S (a rollout
        function that ignores cancellation is left behind)."""
        tasks = [t for t in tasks if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.wait(tasks, timeout=CLOSE_WAIT_S))

    def _spin(self) -> None:
        async def turns():
            for _ in range(SPIN_TURNS):
                await asyncio.sleep(0)

        self.loop.run_until_complete(turns())

    def _finished(self) -> list[tuple[str, list[Completion]]]:
        out = []
        for rid, eps in list(self.episodes.items()):
            if not all(t.done() for t, _ in eps):
                continue
            del self.episodes[rid]
            for t, s in eps:
                if t.exception() is not None:
                    raise episode_failed(self.fn, s, t.exception()) from t.exception()
            trajs = [check_trajectory(t.result(), self.fn, self.tokenizer) for t, _ in eps]
            out.append((rid, [tr.completion() for tr in trajs]))
        return out
