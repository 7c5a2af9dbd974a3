"""Isolated reward workers: verifiers run in child processes with a per-response timeout.

A hung verifier is killed when its timeout passes and scores as a tagged failure
(``tag="timeout"``); a crashing one (the process dies) scores ``tag="crash"``; a verifier that
raises scores ``tag="error"``; a non-finite or non-numeric score is rejected (``tag="non_finite"``).
In every case the pool replaces the worker and serves the next request.

Wire between parent and worker: JSON over a multiprocessing pipe (``send_bytes``), no pickle of
results. Call order: ``RewardPool(...)`` → ``score_batch(items)`` (any number of times) → ``close()``.

    parent ──json [idx, response, truth, prompt?, extra_info?] × up to PIPELINE_DEPTH──► worker k
    parent ◄──json [idx, result], in the order sent─────────────────  (resolves fn once)

A worker's items are queued ahead of its replies (one wake-up scores a group's responses); the
timeout of each runs from the reply before it, and a worker killed for one item (timeout,
crash) has the items queued behind it sent again.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import time
from collections import deque
from multiprocessing.connection import Connection, wait

from dapo_async.reward.compose import RewardError, call_verifier, resolve

FAILURE = {"score": -1.0, "acc": 0.0, "pred": None}
# A worker that does not start within this many seconds is treated as dead.
WORKER_START_TIMEOUT_S = 60.0
# Items sent to one worker ahead of its replies: it wakes once for a group's responses, not
# once each (one at a time, the generator waited ~8% of its time on these round trips at the
# long-tail workload on a loaded 2-core machine) ...
PIPELINE_DEPTH = 32
# ... and at most this many request bytes (beyond one item): under a pipe's buffer, so sending
# never blocks on a worker that is busy (or hung) with an earlier item.
PIPELINE_BYTES = 32 << 10


def _worker_main(fn_name: str, conn: Connection) -> None:
    # The parent owns this worker's life (close(), kill on timeout; EOF when it dies): a
    # Ctrl-C or SIGTERM sent to the whole process group must not kill it mid-request.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    fn = resolve(fn_name)
    conn.send_bytes(b'"ready"')
    while True:
        try:
            msg = json.loads(conn.recv_bytes())
        except EOFError:
            return
        if msg is None:
            return
        idx, response, truth, *context = msg  # context: [prompt, extra_info] when given
        try:
            res = call_verifier(fn, response, truth, *context)
            res.setdefault("tag", "ok")
        except RewardError as e:
            res = {**FAILURE, "tag": "non_finite", "error": str(e)[:200]}
        except Exception as e:  # the verifier's own bug: a tagged failure, never a dead pool
            res = {**FAILURE, "tag": "error", "error": f"{type(e).__name__}: {e}"[:200]}
        try:
            payload = json.dumps([idx, res], allow_nan=False, default=str)
        except ValueError:
            payload = json.dumps([idx, {**FAILURE, "tag": "non_finite"}])
        conn.send_bytes(payload.encode())


class _Worker:
    def __init__(self, ctx, fn_name: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(fn_name, child), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(WORKER_START_TIMEOUT_S):
            self.kill()
            raise RewardError(f"reward worker for {fn_name!r} did not start")
        try:
            self.conn.recv_bytes()
        except EOFError:
            self.kill()
            raise RewardError(
                f"reward worker for {fn_name!r} died at start (bad function?)"
            ) from None

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class RewardPool:
    def __init__(self, fn_name: str, num_workers: int = 1, timeout_s: float = 5.0):
        resolve(fn_name)  # fail fast in the parent with a clear error
        self.fn_name = fn_name
        self.timeout_s = timeout_s
        self._ctx = mp.get_context("spawn")
        self.workers = [_Worker(self._ctx, fn_name) for _ in range(num_workers)]
        self.counters = {"timeout": 0, "crash": 0, "error": 0, "non_finite": 0}

    def _replace(self, k: int) -> None:
        self.workers[k].kill()
        self.workers[k] = _Worker(self._ctx, self.fn_name)

    def score_batch(self, items: list[tuple]) -> list[dict]:
        """Score (response, ground truth[, prompt, extra_info]) items; one dict per item, in
        order (``_Scoring``)."""
        return _Scoring(self, items).run()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send_bytes(b"null")
            except (OSError, BrokenPipeError):
                pass
            w.proc.join(2)
            w.kill()
        self.workers = []

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Scoring:
    """One ``score_batch`` call. Each worker is sent up to its share of the items (at most
    PIPELINE_DEPTH, PIPELINE_BYTES) ahead of its replies and answers them in order, so an item's
    timeout runs from the moment its worker could start it: the reply before it (or its
    sending, with none before it)."""

    def __init__(self, pool: RewardPool, items: list[tuple]):
        self.pool, self.items = pool, items
        n = len(pool.workers)
        self.results: list[dict | None] = [None] * len(items)
        self.todo = deque(range(len(items)))
        self.queued: list[deque[int]] = [deque() for _ in range(n)]  # sent, unanswered
        self.deadline = [0.0] * n  # of each worker's first queued item
        self.sizes: dict[int, int] = {}  # request bytes of each item sent
        self.depth = min(PIPELINE_DEPTH, -(-len(items) // n))  # every worker gets some

    def run(self) -> list[dict]:
        pool = self.pool
        while True:
            for k in range(len(pool.workers)):
                self.dispatch(k)
            busy = [k for k, q in enumerate(self.queued) if q]
            if not busy:
                break
            left = min(self.deadline[k] for k in busy) - time.monotonic()
            ready = wait([pool.workers[k].conn for k in busy], timeout=max(0.0, left))
            for k in busy:
                if pool.workers[k].conn in ready:
                    self.read(k)
                elif time.monotonic() >= self.deadline[k]:
                    self.fail(k, "timeout")
        return [r if r is not None else {**FAILURE, "tag": "error"} for r in self.results]

    def dispatch(self, k: int) -> None:
        """Send worker k items until its queue holds its share or PIPELINE_BYTES."""
        queue, conn = self.queued[k], self.pool.workers[k].conn
        while self.todo and len(queue) < self.depth:
            i = self.todo[0]
            payload = json.dumps([i, *self.items[i]]).encode()
            queued_bytes = sum(self.sizes[j] for j in queue)
            if queue and queued_bytes + len(payload) > PIPELINE_BYTES:
                return
            try:
                conn.send_bytes(payload)
            except OSError:  # the worker died: its first queued item crashed it, or none did
                if queue:
                    return  # reading its replies finds the EOF and charges that item
                self.pool._replace(k)
                conn = self.pool.workers[k].conn
                conn.send_bytes(payload)
            self.todo.popleft()
            if not queue:
                self.deadline[k] = time.monotonic() + self.pool.timeout_s
            queue.append(i)
            self.sizes[i] = len(payload)

    def read(self, k: int) -> None:
        """Every reply worker k has ready (one wake-up for many), or its crash."""
        conn = self.pool.workers[k].conn
        try:
            while self.queued[k]:
                i, res = json.loads(conn.recv_bytes())
                self.settle(k, i, res)
                if not conn.poll():
                    break
        except (EOFError, OSError):
            self.fail(k, "crash")

    def settle(self, k: int, i: int, res: dict) -> None:
        assert self.queued[k][0] == i, "a reward worker answers its items in order"
        self.queued[k].popleft()
        self.results[i] = res
        if res.get("tag") in self.pool.counters:
            self.pool.counters[res["tag"]] += 1
        self.deadline[k] = time.monotonic() + self.pool.timeout_s  # the next item starts now

    def fail(self, k: int, tag: str) -> None:
        """Worker k's first queued item failed it: score that item ``tag`` and send the rest
        again (to its replacement or another worker)."""
        self.settle(k, self.queued[k][0], {**FAILURE, "tag": tag})
        self.todo.extendleft(reversed(self.queued[k]))
        self.queued[k].clear()
        self.pool._replace(k)
