"""Reward-model server: an HF sequence-classification model served over ZeroMQ, with batching.

``dapo-async reward-server --model DIR [--port P]`` binds a ROUTER (127.0.0.1 by default; other
addresses need CurveZMQ keys). Requests (``RewardRequest``: texts) from any number of clients are
collected for up to ``batch_wait_s`` or until ``max_batch`` texts, scored in one forward pass, and
answered (``RewardReply``: one float per text, the logit of class 0 for single-label models).

Loop: poll → drain requests → forward(batch) → reply to each requester → repeat; a bad message
is counted and dropped; SIGINT/SIGTERM stop it.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import signal
import sys
import time

import zmq

from dapo_async import protocol, transport

log = logging.getLogger(__name__)

# Wait this long for more requests to join a batch (latency vs throughput).
DEFAULT_BATCH_WAIT_S = 0.005
DEFAULT_MAX_BATCH = 64
# Longest text the reward model sees, in tokens (longer inputs are truncated on the left side).
MAX_INPUT_TOKENS = 1024
POLL_MS = 100


class RewardModel:
    """In-process scorer; the server and tests use the same code."""

    def __init__(self, model_dir: str, device: str = "cpu"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.truncation_side = "left"
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir).to(device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device = device

    def score(self, texts: list[str]) -> list[float]:
        if not texts:
            return []
        enc = self.tokenizer(
            texts, return_tensors="pt", padding=True, truncation=True, max_length=MAX_INPUT_TOKENS
        ).to(self.device)
        with self.torch.no_grad():
            logits = self.model(**enc).logits.float()
        return logits[:, 0].tolist()


def serve(
    model: RewardModel,
    server: transport.Server,
    stop: list[bool],
    max_batch: int = DEFAULT_MAX_BATCH,
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S,
) -> dict:
    """Serve until ``stop[0]`` is set; returns counters."""
    counters = {"requests": 0, "texts": 0, "batches": 0, "bad_messages": 0}
    sock = server.socket
    while not stop[0]:
        if not sock.poll(POLL_MS):
            continue
        pending: list[tuple[bytes, protocol.RewardRequest]] = []
        deadline = time.monotonic() + batch_wait_s
        while sum(len(r.texts) for _, r in pending) < max_batch:
            if not sock.poll(max(0, int((deadline - time.monotonic()) * 1000))):
                break
            ident, msg = transport.recv_routed(sock, timeout_s=None)
            if isinstance(msg, protocol.RewardRequest):
                pending.append((ident, msg))
            else:
                counters["bad_messages"] += 1
        if not pending:
            continue
        texts = list(itertools.chain.from_iterable(r.texts for _, r in pending))
        try:
            scores = model.score(texts)
            error = ""
        except Exception as e:  # a failing model answers every requester with the error
            scores, error = [], f"{type(e).__name__}: {e}"[:500]
        off = 0
        for ident, req in pending:
            part = scores[off : off + len(req.texts)] if not error else []
            off += len(req.texts)
            transport.send_routed(sock, ident, protocol.RewardReply(req.request_id, part, error))
        counters["requests"] += len(pending)
        counters["texts"] += len(texts)
        counters["batches"] += 1
    return counters


class RewardClient:
    """Client of the reward server (one DEALER; requests answered in order)."""

    def __init__(self, endpoint: str, keys_dir: str | None = None, timeout_s: float = 60.0):
        self.ctx = zmq.Context()
        self.sock = transport.connect_client(self.ctx, zmq.DEALER, endpoint, keys_dir=keys_dir)
        self.timeout_s = timeout_s
        self._ids = itertools.count()

    def score(self, texts: list[str]) -> list[float]:
        rid = next(self._ids)
        transport.send(self.sock, protocol.RewardRequest(rid, list(texts)))
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = transport.recv(self.sock, timeout_s=max(0.01, deadline - time.monotonic()))
            if isinstance(reply, protocol.RewardReply) and reply.request_id == rid:
                if reply.error:
                    raise RuntimeError(f"reward server error: {reply.error}")
                if len(reply.scores) != len(texts):
                    raise RuntimeError("reward server returned the wrong number of scores")
                return reply.scores

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()


def main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s reward-server %(message)s")
    model = RewardModel(args.model)
    ctx = zmq.Context()
    server = transport.bind_server(
        ctx,
        zmq.ROUTER,
        args.host,
        args.port,
        keys_dir=args.keys or None,
        insecure_allow_public_bind=args.insecure_allow_public_bind,
    )
    stop = [False]

    def handler(signum, frame):
        stop[0] = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    print(f"reward-server listening on {server.endpoint}", flush=True)
    if args.endpoint_file:  # how `dapo-async train`'s generators find it
        from dapo_async.utils import atomic_write_text

        atomic_write_text(args.endpoint_file, server.endpoint)
    try:
        counters = serve(model, server, stop, args.max_batch, args.batch_wait_s)
    finally:
        server.close()
        ctx.term()
    print(f"reward-server stopped: {counters}", file=sys.stderr)
    return 0
