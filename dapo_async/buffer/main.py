"""`dapo-async buffer CONFIG [overrides]`: run the replay-buffer service.

Parses the config, loads and encodes the prompts (tokenizer of the policy, no torch), binds
the ROUTER (launch.host / buffer.port; CurveZMQ with launch.curve_keys_dir), writes its endpoint
to ``<run_dir>/endpoints/buffer`` and serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import partial

import zmq

from dapo_async import transport
from dapo_async.buffer.checks import (
    GroupLimits,
    env_token_limit,
    max_message_bytes,
    model_vocab_size,
)
from dapo_async.buffer.service import WAL_NAME, BufferService
from dapo_async.config import load_config, save_resolved
from dapo_async.config.paths import check_model_dirs
from dapo_async.data.datasets import group_repeats, load_source
from dapo_async.data.prompts import encode_in_child
from dapo_async.hub import resolve_paths
from dapo_async.keys import generate_keys, run_keys_dir
from dapo_async.resources import ResourceMeter
from dapo_async.roles import StopFlag, setup_logging, write_endpoint
from dapo_async.sample_records import dropped_record, newest_version, render, token_decoder
from dapo_async.samples import SampleLog
from dapo_async.tracking import Tracker
from dapo_async.utils import atomic_write_json


def _repeats_noted(source: str, records: list, dedupe: bool, log) -> list:
    """``records``, once each with ``dedupe``; a file that repeats its prompts is named."""
    folded = group_repeats(records)
    if len(folded) < len(records):
        log.info(
            "%s: %d rows hold %d distinct prompts (%.0f× each on average); %s",
            source,
            len(records),
            len(folded),
            len(records) / len(folded),
            "data.dedupe: training on each once"
            if dedupe
            else "data.dedupe=true trains on each once",
        )
    return [r for r, _ in folded] if dedupe else records


def load_prompts(cfg, log) -> tuple[list, list[list[int]], tuple | None]:
    """The training prompts that fit data.max_prompt_len, their token ids, and for a weighted
    mixture (``data.sources``) each source's number of prompts and weight."""
    d = cfg.data
    sources = list(d.sources.items()) if d.sources else [(d.source, 1.0)]
    per_source = [
        _repeats_noted(
            src,
            load_source(src, "train", d.num_train, d.difficulty, cfg.seed, d.max_difficulty),
            d.dedupe,
            log,
        )
        for src, _ in sources
    ]
    records = [r for recs in per_source for r in recs]
    # rendered by the tokenizer's own chat template in a child process (transformers would
    # bring torch into the buffer), cached in the run directory for restarts
    try:
        all_ids = encode_in_child(
            cfg.model.source_dir, d, [r.messages for r in records], cfg.resolved_run_dir
        )
    except ValueError as e:
        raise SystemExit(f"buffer: {e}") from None
    tokens, kept, sizes, start = [], [], [], 0
    for (src, _), recs in zip(sources, per_source):
        n_before = len(kept)
        for r, ids in zip(recs, all_ids[start : start + len(recs)]):
            if len(ids) <= d.max_prompt_len:
                kept.append(r)
                tokens.append(ids)
        start += len(recs)
        sizes.append(len(kept) - n_before)
        if sizes[-1] == 0:
            raise SystemExit(
                f"buffer: no prompt of {src} fits data.max_prompt_len={d.max_prompt_len}"
            )
    log.info("%d prompts (%d filtered as too long)", len(kept), len(records) - len(kept))
    mixture = (sizes, [w for _, w in sources]) if d.sources else None
    return kept, tokens, mixture


def previous_port(run_dir) -> int:
    """The port of this run's buffer before a restart (its endpoint file), so connected
    generators and learners reconnect by themselves; 0 (any free port) for a new run."""
    path = run_dir / "endpoints" / "buffer"
    try:
        return int(path.read_text().strip().rsplit(":", 1)[1])
    except (OSError, ValueError, IndexError):
        return 0


def drop_recorder(samples: SampleLog):
    """``on_drop`` of the service: a few dropped groups per step and reason, readable."""

    def record(group, why: str) -> None:
        try:  # a refused group may be malformed in ways its record cannot show: skip it
            if samples.take(newest_version(group), why):
                samples.write(dropped_record(group, why))
        except Exception as e:
            logging.getLogger(__name__).debug("dropped group not recorded: %s", e)

    return record


def main(args: argparse.Namespace) -> int:
    cfg = resolve_paths(load_config(args.config, args.overrides))  # Hub ids: local paths
    check_model_dirs(cfg, weights=False)  # the buffer reads the tokenizer only
    log = setup_logging("buffer")
    stop = StopFlag().install()
    run_dir = cfg.resolved_run_dir
    save_resolved(cfg, run_dir)
    prompts, tokens, mixture = load_prompts(cfg, log)
    ctx = zmq.Context()
    keys_dir = run_keys_dir(cfg.launch, run_dir)
    if keys_dir is not None and not cfg.launch.curve_keys_dir:
        generate_keys(keys_dir)  # the run's own keys (idempotent: the launcher made them)
    server = transport.bind_server(
        ctx,
        zmq.ROUTER,
        cfg.launch.host,
        cfg.buffer.port or previous_port(run_dir),
        keys_dir=keys_dir,
        insecure_allow_public_bind=cfg.launch.insecure_allow_public_bind,
        max_message_bytes=max_message_bytes(cfg),
    )
    tracker = Tracker.for_role(cfg, "buffer")
    show = partial(render, decode=token_decoder(cfg.model.source_dir))
    samples = SampleLog.for_role(cfg, "buffer", tracker, show)
    meter = ResourceMeter()  # CPU, memory, bytes on its socket: resources/*
    svc = BufferService(
        cfg.buffer,
        cfg.data.shuffle_seed,
        GroupLimits(
            model_vocab_size(cfg.model.source_dir),
            cfg.generator.max_tokens,
            cfg.generator.responses_per_prompt,
            max_message_bytes(cfg),
            env_token_limit(cfg),
        ),
        prompts,
        tokens,
        server,
        wal_path=(run_dir / WAL_NAME) if cfg.buffer.wal else None,
        # step = the learner version the buffer has seen (wall time is each record's "time")
        on_stats=lambda s: tracker.track(s | meter.metrics(), svc.state.version),
        mixture=mixture,
        on_drop=drop_recorder(samples),
    )
    write_endpoint(run_dir, "buffer", server.endpoint)
    log.info("serving on %s (wal=%s)", server.endpoint, cfg.buffer.wal)
    try:
        while not stop:
            svc.run_once()
    finally:
        tracker.track(svc.stats() | meter.metrics(), svc.state.version)
        _write_final(run_dir, svc)
        svc.close()
        server.close()
        ctx.term()
        tracker.close()
    log.info("stopped (%s): %s", stop.reason or "done", svc.state.counters.to_dict())
    return 0


def _write_final(run_dir, svc) -> None:
    """Final counters for operators and tests (``buffer_final.json``)."""

    st = svc.state
    final = {
        "counters": st.counters.to_dict(),
        "ready": len(st.ready),
        "stored": len(st.groups),
        "version": st.version,
        "malformed": svc.malformed,
        "component_names": list(st.component_names),  # the reward's parts, as groups hold them
        # response length -> count, of qualified and of trained groups (bench async --workload)
        "response_len_hist": {
            k: {str(n): c for n, c in sorted(h.items())} for k, h in st.len_hist.items()
        },
        "untrained_assigned": sum(
            len(b.group_ids) for s, b in st.steps.items() if s not in st.counted_steps
        ),
    }
    atomic_write_json(run_dir / "buffer_final.json", final)


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace(config=sys.argv[1], overrides=sys.argv[2:])))
