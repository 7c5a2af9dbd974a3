"""`dapo-async bench generator`: what the generator loop costs on top of its engine.

Same engine, same prompts, same sampling parameters, measured in one run and interleaved
(engine, loop, engine, loop, … for ``--rounds`` rounds of ``--seconds`` each):

- ``engine_tokens_per_s``: bare ``engine.generate`` on batches of ``prompts_per_batch`` prompts;
- ``loop_tokens_per_s``: the full ``GeneratorLoop`` (lease over ZeroMQ, generate, score in the
  isolated reward pool, pack, send, acks) against an in-process buffer stand-in on a real
  ROUTER socket that grants and acknowledges at once;
- ``ratio`` = loop ÷ engine (1.0 = the loop adds nothing).

Defaults: the tiny CPU config (``configs/tiny_cpu.yaml``), its built-in tiny policy, ``hf``
engine (``--engine vllm`` for vLLM).
"""

from __future__ import annotations

import argparse
import threading
import time

import zmq

from dapo_async import protocol, transport
from dapo_async.bench.common import ensure_policy, print_result

# Seconds per measurement: engine batches vary in length (sampling), shorter windows are noisy.
DEFAULT_SECONDS = 3.0
# Upper bound of the loop's warm-up step (hello, first lease, first batch).
LOOP_WARMUP_S = 60.0
# How long the stand-in buffer waits for a message before checking whether to stop.
SERVER_POLL_S = 0.05


class InstantBuffer(threading.Thread):
    """Grants every lease request from a fixed prompt list and acks every group at once."""

    def __init__(self, ctx: zmq.Context, prompts: list[list[int]], truths: list[str]):
        super().__init__(daemon=True)
        self.server = transport.bind_server(ctx, zmq.ROUTER, "127.0.0.1", 0)
        self.prompts, self.truths = prompts, truths
        self.stop = False
        self.next = 0

    def run(self) -> None:
        sock = self.server.socket
        while not self.stop:
            try:
                ident, msg = transport.recv_routed(sock, timeout_s=SERVER_POLL_S)
            except transport.RecvTimeout:
                continue
            if isinstance(msg, protocol.Hello):
                transport.send_routed(sock, ident, protocol.Ack([], []))
            elif isinstance(msg, protocol.LeaseRequest):
                idx = [(self.next + i) % len(self.prompts) for i in range(msg.num_prompts)]
                self.next += msg.num_prompts
                transport.send_routed(
                    sock,
                    ident,
                    protocol.LeaseGrant(
                        list(range(self.next - len(idx), self.next)),
                        [self.prompts[i] for i in idx],
                        [self.truths[i] for i in idx],
                        ["bench"] * len(idx),
                        0,
                    ),
                )
            elif isinstance(msg, protocol.ScoredGroups):
                gids = [(str(g), int(s)) for g, s in msg.batch.group_ids()]
                transport.send_routed(sock, ident, protocol.Ack(gids, ["stored"] * len(gids)))
        self.server.close()


class _Deadline:
    """A stop flag that turns true at a deadline (the loop's ``run(stop)`` protocol)."""

    def __init__(self, seconds: float):
        self.t = time.monotonic() + seconds

    def __bool__(self) -> bool:
        return time.monotonic() >= self.t


def bench_prompts(cfg) -> tuple[list[list[int]], list[str]]:
    """256 training prompts of the config, tokenized, and their ground truths."""
    from dapo_async.data.datasets import load_source
    from dapo_async.data.prompts import PromptRenderer

    d = cfg.data
    records = load_source(d.source, "train", 256, d.difficulty, cfg.seed, d.max_difficulty)
    enc = PromptRenderer.for_model(cfg.model.source_dir, cfg.data)
    return [enc.encode(r.messages) for r in records], [r.ground_truth for r in records]


def run(cfg, engine_name: str, seconds: float, rounds: int) -> dict:
    from dapo_async.generator.build import engine_for, sampling_params
    from dapo_async.generator.loop import GeneratorLoop
    from dapo_async.generator.scoring import make_scorer

    engine = engine_for(cfg, cfg.model.source_dir)
    prompts, truths = bench_prompts(cfg)
    params = sampling_params(cfg)
    bsz = cfg.generator.prompts_per_batch
    scorer = make_scorer(cfg)
    ctx = zmq.Context()
    buf = InstantBuffer(ctx, prompts, truths)
    buf.start()
    sock = transport.connect_client(ctx, zmq.DEALER, buf.server.endpoint)
    loop = GeneratorLoop("bench", engine, scorer, sock, params, bsz, engine_name=engine_name)
    engine.generate(prompts[:bsz], params)  # warm-up (first-call costs)
    while not loop.step(_Deadline(LOOP_WARMUP_S)):  # hello acked, first batch through
        pass
    eng_tokens = eng_time = loop_tokens = loop_time = 0.0
    i = 0
    try:
        for _ in range(rounds):
            t0 = time.monotonic()
            while time.monotonic() - t0 < seconds:
                batch = [prompts[(i + k) % len(prompts)] for k in range(bsz)]
                i += bsz
                outs = engine.generate(batch, params)
                eng_tokens += sum(len(c.tokens) for per in outs for c in per)
            eng_time += time.monotonic() - t0
            before = loop.counters["tokens"]
            t0 = time.monotonic()
            stop = _Deadline(seconds)
            while not stop:
                loop.step(stop)
            loop_time += time.monotonic() - t0
            loop_tokens += loop.counters["tokens"] - before
        loop.flush()
    finally:
        buf.stop = True
        buf.join(5)
        sock.close(linger=0)
        ctx.term()
        scorer.close()
        engine.close()
    e = eng_tokens / max(eng_time, 1e-9)
    lp = loop_tokens / max(loop_time, 1e-9)
    return {
        "engine": engine_name,
        "prompts_per_batch": bsz,
        "responses_per_prompt": cfg.generator.responses_per_prompt,
        "engine_tokens_per_s": e,
        "loop_tokens_per_s": lp,
        "ratio": lp / max(e, 1e-9),
        "groups_acked": loop.counters["groups_acked"],
        "seconds": eng_time + loop_time,
    }


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config
    from dapo_async.roles import set_threads

    overrides = [f"generator.engine={args.engine}"] if args.engine else []
    cfg = load_config(args.config, overrides + list(args.overrides))
    set_threads(cfg.launch.torch_threads)
    ensure_policy(cfg)
    res = run(cfg, cfg.generator.engine, args.seconds or DEFAULT_SECONDS, args.rounds)
    return print_result(
        f"engine {res['engine']}: bare {res['engine_tokens_per_s']:.0f} tok/s, "
        f"loop {res['loop_tokens_per_s']:.0f} tok/s, ratio {res['ratio']:.3f}",
        res,
        args.json,
    )
