"""`dapo-async generator CONFIG [overrides] [--id NAME] [--spare]`: one generator process.

Parses the config, builds the engine (``generator.engine``), the scorer (reward pool, reward
model client) and the weight receiver, connects to the buffer (launch.buffer_endpoint, or
``<run_dir>/endpoints/buffer``) and runs ``GeneratorLoop`` (batch) or ``StreamLoop`` until
SIGINT/SIGTERM. ``--spare`` (started by `dapo-async train` for ``launch.spare_generators``):
idle priority, decoding only on the cores waiting roles lend (``dapo_async.cores``).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import zmq

from dapo_async import cores
from dapo_async.config import load_config
from dapo_async.config.paths import check_model_dirs
from dapo_async.generator.build import (
    connect_buffer,
    connect_weights,
    engine_for,
    generator_width,
    refill_sequences,
    sampling_params,
)
from dapo_async.generator.episode_stream import EpisodeStream
from dapo_async.generator.loop import GeneratorLoop
from dapo_async.generator.scoring import make_scorer
from dapo_async.generator.stream import StreamLoop
from dapo_async.generator.weights import ReconnectingReceiver
from dapo_async.hub import resolve_paths
from dapo_async.resources import ResourceMeter
from dapo_async.roles import StopFlag, read_endpoint, set_threads, setup_logging
from dapo_async.rollouts import RolloutError, load_rollout
from dapo_async.sample_records import render
from dapo_async.samples import SampleLog
from dapo_async.tracking import Tracker
from dapo_async.utils import atomic_write_json


def main(args: argparse.Namespace) -> int:
    cfg = resolve_paths(load_config(args.config, args.overrides))  # Hub ids: local paths
    check_model_dirs(cfg)
    try:
        rollout = load_rollout(cfg.generator.rollout)  # before the model loads: fail fast
    except RolloutError as e:
        print(f"generator: {e}", file=sys.stderr)
        return 2
    # Unique per process: a restarted generator must not reuse the group ids (id, seq) of its
    # previous incarnation, which the buffer would ack as duplicates.
    gen_id = f"{args.id or 'gen'}-{uuid.uuid4().hex[:8]}"
    log = setup_logging(gen_id)
    stop = StopFlag().install()
    set_threads(cfg.launch.torch_threads)
    spare = getattr(args, "spare", False)
    run_dir = cfg.resolved_run_dir
    engine = engine_for(cfg, cfg.model.source_dir)
    scorer = make_scorer(cfg, run_dir, stop)
    endpoint = cfg.launch.buffer_endpoint or read_endpoint(run_dir, "buffer", stop=stop)
    weights = ReconnectingReceiver(lambda t: connect_weights(cfg, engine, gen_id, t), engine, log)

    sock = connect_buffer(ctx := zmq.Context(), cfg, endpoint, gen_id)
    tracker = Tracker.for_role(cfg, gen_id)
    meter = ResourceMeter(lambda: weights.bytes)  # CPU, memory, bytes moved: resources/*
    g = cfg.generator
    share = core_share(cfg, gen_id, engine, spare, stop)
    width, prompts = generator_width(cfg, spare)  # a spare's: launch.spare_max_inflight
    args = (gen_id, engine, scorer, sock, sampling_params(cfg), prompts, g.heartbeat_s)
    kwargs = dict(
        poll_weights=weights.poll,
        # step = the weights version the engine holds (wall time is each record's "time")
        on_metrics=lambda m: tracker.track(m | meter.metrics(), engine.version),
        engine_name=g.engine,
        cores=share,
        samples=SampleLog.for_role(cfg, gen_id, tracker, render),  # readable rollouts
        rollout=rollout,  # one episode (dapo_async.rollouts)
        turn_updates=g.inflight_updates,
    )
    loop = make_loop(cfg, engine, args, kwargs, width)
    if share is not None:  # a parked spare heartbeats and takes weight rounds
        share.keepalive = loop.on_parked
    if spare:  # start-up done at normal priority; every thread (torch, ZeroMQ) lowered now
        lowered = cores.lower_priority()
        log.info("spare generator: decodes on lent cores only (%s), %d sequences", lowered, width)
    log.info("generator %s (pid %d) connected to %s", gen_id, os.getpid(), endpoint)
    try:
        counters = loop.run(stop)
    finally:
        sock.close(linger=0)
        ctx.term()
        scorer.close()
        weights.close()
        tracker.close()
        engine.close()
        if share is not None:
            share.close()
    # final counters for operators and tests, one file per generator process
    atomic_write_json(run_dir / "generators" / f"{gen_id}.json", counters)
    log.info("stopped: %s", counters)
    return 0


if __name__ == "__main__":
    sys.exit(
        main(argparse.Namespace(config=sys.argv[1], overrides=sys.argv[2:], id="", spare=False))
    )


def core_share(cfg, gen_id: str, engine, spare: bool, stop):
    """This generator's place in its host's core ledger (``dapo_async.cores``), or None. A
    regular one re-checks it before every decode step (a lender that woke up takes its threads
    back); a spare parks in its loop's ``cores_working`` while no role lends."""
    kind = "spare" if spare else "generator"
    share = cores.for_role(cfg, gen_id, cfg.generator.engine, kind=kind, stop=lambda: bool(stop))
    if share is not None and not spare:
        share.watch([engine.model])
    return share


def make_loop(cfg, engine, args: tuple, kwargs: dict, width: int | None = None):
    """The generator's loop: streaming (``generator.mode=stream``: ``width`` sequences in
    flight, default ``generator.inflight_target``) or batch."""
    g = cfg.generator
    width = width or g.inflight_target
    if g.mode != "stream":
        return GeneratorLoop(*args, **kwargs)
    # the rollout function's episodes (single_turn by default), their turns on the engine's stream
    inner = engine.stream(g.update_interval_tokens, g.reset_kv_on_update, cfg.seed)
    slotted = getattr(inner, "slots", None) is not None  # hf on a CPU: engines/slot_kv.py
    return StreamLoop(
        *args,
        stream=EpisodeStream(inner, kwargs["rollout"], engine),
        inflight_target=width,
        inflight_updates=g.inflight_updates,
        refill_at=min(refill_sequences(g, slotted), width),
        **kwargs,
    )
