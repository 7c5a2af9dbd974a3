"""Isolated reward workers: verifiers run in child processes with a per-response timeout.

A hung verifier is killed when its timeout passes and scores as a tagged failure
(``tag="timeout"``); a crashing one (the process dies) scores ``tag="crash"``; a verifier that
raises scores ``tag="error"``; a non-finite or non-numeric score is rejected (``tag="non_finite"``).
In every case the pool replaces the worker and serves the next request.

Wire between parent and worker: JSON over a multiprocessing pipe (``send_bytes``), no pickle of
results. Call order: ``RewardPool(...)`` → ``score_batch(items)`` (any number of times) → ``close()``.

    parent ──json [idx, response, truth, prompt?, extra_info?]──► worker k (resolves fn once)
    parent ◄──json [idx, result]────────────
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import time
from multiprocessing.connection import Connection, wait

from dapo_async.reward.compose import RewardError, call_verifier, resolve

FAILURE = {"score": -1.0, "acc": 0.0, "pred": None}
# A worker that does not start within this many seconds is treated as dead.
WORKER_START_TIMEOUT_S = 60.0


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
        order."""
        results: list[dict | None] = [None] * len(items)
        todo = list(range(len(items)))[::-1]
        busy: dict[int, tuple[int, float]] = {}  # worker -> (item, deadline)

        def dispatch(k: int) -> None:
            if todo:
                i = todo.pop()
                try:
                    self.workers[k].conn.send_bytes(json.dumps([i, *items[i]]).encode())
                except OSError:  # the worker died between requests: replace it, retry once
                    self._replace(k)
                    self.workers[k].conn.send_bytes(json.dumps([i, *items[i]]).encode())
                busy[k] = (i, time.monotonic() + self.timeout_s)

        for k in range(len(self.workers)):
            dispatch(k)
        while busy:
            now = time.monotonic()
            next_deadline = min(d for _, d in busy.values())
            ready = wait(
                [self.workers[k].conn for k in busy], timeout=max(0.0, next_deadline - now)
            )
            for k in list(busy):
                w = self.workers[k]
                if w.conn in ready:
                    i, _ = busy.pop(k)
                    try:
                        _, res = json.loads(w.conn.recv_bytes())
                    except (EOFError, OSError):
                        res = {**FAILURE, "tag": "crash"}
                        self._replace(k)
                    results[i] = res
                    if res.get("tag") in self.counters:
                        self.counters[res["tag"]] += 1
                    dispatch(k)
                elif time.monotonic() >= busy[k][1]:
                    i, _ = busy.pop(k)
                    results[i] = {**FAILURE, "tag": "timeout"}
                    self.counters["timeout"] += 1
                    self._replace(k)
                    dispatch(k)
        return [r if r is not None else {**FAILURE, "tag": "error"} for r in results]

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
