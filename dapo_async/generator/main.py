"""`dapo-async generator CONFIG [overrides] [--id NAME]`: one generator process.

Parses the config, builds the engine (``generator.engine``), the reward pool and the weight
receiver, connects to the buffer (launch.buffer_endpoint, or ``<run_dir>/endpoints/buffer``) and
runs ``GeneratorLoop`` until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid

# After a weight-sync failure, try to reconnect this often, each try bounded (Ctrl-C stays quick).
RECONNECT_S = 5.0
RECONNECT_TIMEOUT_S = 2.0
# At start the learner may still be loading: wait this long for its weight-sync endpoint.
CONNECT_TIMEOUT_S = 30.0


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config
    from dapo_async.roles import StopFlag, read_endpoint, set_threads, setup_logging

    cfg = load_config(args.config, args.overrides)
    # Unique per process: a restarted generator must not reuse the group ids (id, seq) of its
    # previous incarnation, which the buffer would ack as duplicates.
    gen_id = f"{args.id or 'gen'}-{uuid.uuid4().hex[:8]}"
    log = setup_logging(gen_id)
    stop = StopFlag().install()
    set_threads(cfg.launch.torch_threads)

    import zmq

    from dapo_async import transport as T
    from dapo_async.generator.loop import GeneratorLoop
    from dapo_async.tracking import Tracker
    from dapo_async.weight_sync.factory import make_receiver

    run_dir = cfg.resolved_run_dir
    engine = engine_for(cfg, cfg.model.source_dir)
    score, pool = make_scorer(cfg)

    endpoint = cfg.launch.buffer_endpoint or read_endpoint(run_dir, "buffer", stop=stop)
    in_engine = cfg.generator.engine == "vllm" and cfg.weight_sync.mode == "dist"

    def connect(timeout_s: float):
        if in_engine:  # the vLLM workers join the group and receive straight into the engine
            return EngineWeightReceiver(engine, cfg, run_dir, gen_id, timeout_s)
        return make_receiver(cfg, run_dir, gen_id, connect_timeout_s=timeout_s)

    receiver = [connect(CONNECT_TIMEOUT_S)]
    broken_since = [0.0]

    def poll_weights() -> None:
        # A failed or unreachable weight sync never stops generation: keep the current
        # weights, log, and reconnect (the learner may be restarting) every RECONNECT_S.
        now = time.monotonic()
        if receiver[0] is None:
            if now - broken_since[0] < RECONNECT_S:
                return
            try:
                receiver[0] = connect(RECONNECT_TIMEOUT_S)
                log.info("weight sync reconnected")
            except Exception as e:
                broken_since[0] = now
                log.debug("weight sync still unreachable: %s", e)
                return
        try:
            got = receiver[0].poll()
        except Exception as e:
            log.warning(
                "weight sync failed (%s); keeping v%d", str(e).splitlines()[0][:200], engine.version
            )
            close = getattr(receiver[0], "close", None)
            if close:
                close()
            receiver[0] = None
            broken_since[0] = now
            return
        if got is not None:
            state, version = got
            engine.update_weights(state, version)
            log.debug("weights v%d applied", version)

    ctx = zmq.Context()
    sock = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=cfg.launch.curve_keys_dir or None)
    tracker = Tracker.for_role(cfg, gen_id)
    t0 = time.monotonic()
    g = cfg.generator
    loop = GeneratorLoop(
        gen_id,
        engine,
        score,
        sock,
        sampling_params(cfg),
        g.prompts_per_batch,
        g.heartbeat_s,
        poll_weights=poll_weights,
        on_metrics=lambda m: tracker.track(m, int((time.monotonic() - t0) * 10)),
        engine_name=g.engine,
    )
    log.info("generator %s (pid %d) connected to %s", gen_id, os.getpid(), endpoint)
    try:
        counters = loop.run(stop)
    finally:
        sock.close(linger=0)
        ctx.term()
        pool.close()
        receiver_close = getattr(receiver[0], "close", None)
        if receiver_close:
            receiver_close()
        tracker.close()
        engine.close()
    log.info("stopped: %s", counters)
    return 0


class EngineWeightReceiver:
    """The receiver interface over a vLLM engine whose workers are the weight-sync members:
    ``poll`` lets them take part in an open round and returns None (the engine already runs the
    new version)."""

    def __init__(self, engine, cfg, run_dir, gen_id: str, timeout_s: float):
        from dapo_async.roles import read_endpoint
        from dapo_async.weight_sync.factory import backend

        endpoint = cfg.weight_sync.endpoint or read_endpoint(run_dir, "wsync", timeout_s=timeout_s)
        self.engine = engine
        engine.connect_weight_sync(endpoint, gen_id, cfg.weight_sync.timeout_s, backend(cfg))

    def poll(self):
        self.engine.poll_weight_sync()
        return None

    def close(self) -> None:
        self.engine.close_weight_sync()


def sampling_params(cfg):
    """The generator's sampling parameters from the config."""
    from dapo_async.engines.base import SamplingParams

    g = cfg.generator
    return SamplingParams(
        n=g.responses_per_prompt,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_tokens=g.max_tokens,
        logprobs_mode=g.logprobs_mode,
    )


def make_scorer(cfg):
    """(score function, reward pool): the pool runs the reward functions in isolated workers;
    the caller closes it."""
    from dapo_async.reward.compose import RewardComposer
    from dapo_async.reward.pool import RewardPool

    composer = RewardComposer(cfg.reward)
    pool = RewardPool(cfg.reward.fn, cfg.reward.num_workers, cfg.reward.timeout_s)

    def score(items):
        verdicts = pool.score_batch([(text, truth) for text, truth, _ in items])
        return [composer.combine(v, n, v.get("tag", "")) for v, (_, _, n) in zip(verdicts, items)]

    return score, pool


def engine_for(cfg, path: str):
    """The configured engine (generator.engine) over ``path``."""
    from dapo_async.engines import make_engine

    return make_engine(cfg.generator.engine, path, cfg.model.dtype, vllm_cfg=cfg, seed=cfg.seed)


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace(config=sys.argv[1], overrides=sys.argv[2:], id="")))
