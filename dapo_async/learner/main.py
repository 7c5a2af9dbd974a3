"""`dapo-async learner CONFIG [overrides] [--resume]`: one learner rank (run it under torchrun
for several ranks; RANK / WORLD_SIZE come from the environment).

Per step s: request this rank's shard of step s from the buffer (waiting counts as idle) →
``Trainer.step`` (proximal recompute, K mini-batch updates) → rank 0 publishes version s+1 to
the generators → metrics → checkpoint on schedule (then the buffer is told, so it compacts
its log and frees the step's groups). Rank 0 evaluates on held-out prompts before the first and
after the last step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from dapo_async.utils import atomic_write_json

# Ask the buffer again after this long when it does not answer (it may be restarting).
BATCH_REQUEST_TIMEOUT_S = 10.0
# Warn (and repeat every so often) when one step has waited this long for its data.
STALL_WARN_S = 60.0


def _dist_env() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def fetch_batch(sock, step: int, rank: int, world: int, stop, log):
    """Block until the buffer serves this rank's shard of ``step`` (None on stop)."""
    from dapo_async import protocol as P
    from dapo_async import transport as T

    t_start = time.monotonic()
    next_warning = t_start + STALL_WARN_S
    last_stats: dict = {}
    while not stop:
        if time.monotonic() >= next_warning:
            log.warning(stall_message(step, time.monotonic() - t_start, last_stats))
            next_warning += STALL_WARN_S
        T.send(sock, P.BatchRequest(rank, world, step))
        deadline = time.monotonic() + BATCH_REQUEST_TIMEOUT_S
        reply = None
        while time.monotonic() < deadline and not stop:
            try:
                msg = T.recv(sock, timeout_s=0.2)
            except T.RecvTimeout:
                continue
            except P.ProtocolError as e:
                log.warning("bad message from buffer: %s", e)
                continue
            if isinstance(msg, P.Batch) and msg.step == step:
                reply = msg
                break
        if reply is None:
            log.warning("buffer did not answer the request for step %d; asking again", step)
            continue
        if reply.ready:
            return reply
        last_stats = reply.stats or last_stats
        time.sleep(reply.wait_s)
    return None


def stall_message(step: int, waited_s: float, stats: dict) -> str:
    """Why a step may be starving, from the buffer's counters."""
    produced = int(stats.get("buffer/produced", 0))
    filtered = int(stats.get("buffer/dropped_filtered", 0))
    stale = int(stats.get("buffer/dropped_stale", 0))
    msg = (
        f"step {step} has waited {waited_s:.0f}s for data: the buffer has {produced} groups "
        f"produced, {filtered} dropped by dynamic sampling, {stale} dropped as stale, "
        f"{int(stats.get('buffer/ready', 0))} ready"
    )
    if produced and filtered / produced > 0.8:
        msg += (
            ". Almost every group is all-correct or all-wrong (the policy may have collapsed or "
            "saturated): consider buffer.min_group_acc/max_group_acc, more responses per prompt, "
            "or harder/easier data"
        )
    elif not produced:
        msg += ". No generator has delivered anything: are generators running and connected?"
    return msg


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config
    from dapo_async.roles import StopFlag, read_endpoint, set_threads, setup_logging

    cfg = load_config(args.config, args.overrides)
    rank, world = _dist_env()
    log = setup_logging(f"learner{rank}")
    stop = StopFlag().install()
    set_threads(cfg.launch.torch_threads)

    import torch
    import zmq
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_async import protocol as P
    from dapo_async import transport as T
    from dapo_async.data.datasets import load_source
    from dapo_async.evaluation import evaluate_records
    from dapo_async.learner import checkpoint as C
    from dapo_async.learner.parallel import Parallel
    from dapo_async.learner.trainer import Trainer, needs_reference
    from dapo_async.tracking import Tracker
    from dapo_async.weight_sync.factory import make_publisher

    run_dir = cfg.resolved_run_dir
    torch.manual_seed(cfg.seed + rank)
    if world > 1:
        import torch.distributed as dist

        backend = (
            cfg.learner.backend
            if cfg.learner.backend != "auto"
            else ("nccl" if torch.cuda.is_available() else "gloo")
        )
        dist.init_process_group(backend)
    src_dir = cfg.model.source_dir
    ckpt_root = run_dir / "checkpoints"
    resume_from = C.latest(ckpt_root) if args.resume else None
    load_dir = str(resume_from) if resume_from else src_dir
    dtype = getattr(torch, cfg.model.dtype)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    model = AutoModelForCausalLM.from_pretrained(load_dir, dtype=dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(src_dir)
    ref_model = None
    if needs_reference(cfg):
        ref_dir = cfg.model.reference_path or src_dir
        if not Path(ref_dir).is_dir():
            raise SystemExit(f"model.reference_path: no such directory: {ref_dir!r}")
        ref_model = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=dtype).to(device)
        log.info("frozen reference model from %s", ref_dir)
    endpoint = cfg.launch.buffer_endpoint or read_endpoint(run_dir, "buffer", stop=stop)
    ctx = zmq.Context()
    sock = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=cfg.launch.curve_keys_dir or None)
    tracker = publisher = None
    eval_records = []
    if rank == 0:
        tracker = Tracker.for_role(cfg, "learner")
        publisher = make_publisher(cfg, run_dir)
        eval_records = load_source(
            cfg.data.eval_source or cfg.data.source,
            "eval",
            cfg.data.num_eval,
            cfg.data.difficulty,
            cfg.seed,
            cfg.data.max_difficulty,
        )
        if resume_from is None:  # before sharding: the plain model evaluates on rank 0 alone
            ev = evaluate_records(model, tokenizer, cfg, eval_records)
            tracker.track(ev, 0)
            log.info("held-out accuracy before training: %.3f", ev["eval/accuracy"])
            atomic_write_json(run_dir / "eval_before.json", ev)
    par = Parallel(
        model,
        rank,
        world,
        fsdp=cfg.learner.fsdp,
        activation_checkpointing=cfg.learner.activation_checkpointing,
    )
    trainer = Trainer(par, cfg, tokenizer.pad_token_id, ref_model=ref_model)
    start = 0
    if resume_from is not None:
        state = C.load_trainer_state(resume_from)
        trainer.load_state_dict(state)
        C.set_rng_state(state["rng"])
        start = trainer.version
        log.info("resumed from %s at version %d", resume_from, start)

    t_start = time.monotonic()
    idle = 0.0
    samples_done = 0
    full = None  # rank 0: the full weights after the last step (gathered under FSDP2)
    (run_dir / "audit").mkdir(parents=True, exist_ok=True)
    audit = open(run_dir / "audit" / f"trained-rank{rank}.jsonl", "a", buffering=1)
    try:
        for step in range(start, cfg.learner.num_steps):
            t0 = time.monotonic()
            reply = fetch_batch(sock, step, rank, world, stop, log)
            if reply is None:
                break
            t_data = time.monotonic() - t0
            idle += t_data
            groups = list(reply.batch)
            _audit(audit, step, groups)
            metrics = trainer.step(groups)
            t_sync = time.monotonic()
            budget = cfg.learner.time_budget_s
            # every rank must agree on the last step (its checkpoint and gathers are collective)
            over = par.max_int(int(bool(budget) and time.monotonic() - t_start >= budget))
            last = step + 1 == cfg.learner.num_steps or bool(over)
            every = cfg.learner.checkpoint_every
            ckpt_now = bool(every and (step + 1) % every == 0) or last
            ev_every = cfg.learner.eval_every
            eval_now = bool(ev_every and (step + 1) % ev_every == 0) or last
            if par.fsdp:
                # every rank takes part in each gather; the weight sync streams them into its
                # buckets one tensor at a time, checkpoints and evaluation need the full dict
                items = par.iter_full_state()
                if publisher is not None:
                    publisher.publish_stream(par.full_shapes(), items, trainer.version)
                else:
                    for _ in items:
                        pass
                full = par.full_state() if (ckpt_now or eval_now) else None
            else:
                full = par.full_state()
                if publisher is not None:
                    publisher.publish(full, trainer.version)
            metrics["time/weight_sync_s"] = time.monotonic() - t_sync
            metrics["time/wait_data_s"] = t_data
            metrics["time/step_s"] = time.monotonic() - t0
            elapsed = time.monotonic() - t_start
            metrics["learner/idle_ratio"] = idle / max(elapsed, 1e-9)
            samples_done += _samples(reply)
            metrics["learner/samples_per_s"] = samples_done / max(elapsed, 1e-9)
            metrics["learner/version"] = float(trainer.version)
            metrics.update(reply.stats)  # the buffer's counters as of this step
            metrics["learner/tokens_trained"] = float(reply.global_num_tokens)
            if ckpt_now:
                tstate = trainer.state_dict()  # collective under FSDP2
                path = (
                    C.save(
                        ckpt_root,
                        step + 1,
                        model,
                        src_dir,
                        tstate,
                        cfg.learner.keep_checkpoints,
                        state_dict=full,
                    )
                    if rank == 0
                    else None
                )
                par.barrier()
                if rank == 0:
                    T.send(sock, P.CheckpointNotice(step, path.name))
            if rank == 0:
                if eval_now and not last:
                    metrics.update(
                        evaluate_records(_eval_model(par, full), tokenizer, cfg, eval_records)
                    )
                tracker.track(metrics, trainer.version)
                if (step + 1) % cfg.tracking.log_every == 0:
                    log.info(
                        "step %d/%d sampled-acc %.3f trained-acc %.3f trained-reward %.3f "
                        "len %.1f loss %.4f stale %.2f idle %.2f",
                        step + 1,
                        cfg.learner.num_steps,
                        metrics.get("rollout/sampled_accuracy", float("nan")),
                        metrics["rollout/trained_accuracy"],
                        metrics["rollout/reward_mean"],
                        metrics["rollout/response_len_mean"],
                        metrics.get("train/loss", 0.0),
                        metrics["staleness/mean"],
                        metrics["learner/idle_ratio"],
                    )
            if last:
                break  # the time budget ended the run before num_steps
        if rank == 0 and not stop and (full is not None or not par.fsdp):
            ev = evaluate_records(_eval_model(par, full), tokenizer, cfg, eval_records)
            tracker.track(ev, trainer.version)
            log.info("held-out accuracy after training: %.3f", ev["eval/accuracy"])
            atomic_write_json(run_dir / "eval_after.json", ev)
            atomic_write_json(
                run_dir / "learner_summary.json",
                {
                    "steps": trainer.version,
                    "seconds": time.monotonic() - t_start,
                    "idle_seconds": idle,
                    "idle_ratio": idle / max(time.monotonic() - t_start, 1e-9),
                },
            )
    finally:
        audit.close()
        sock.close(linger=0)
        ctx.term()
        if tracker is not None:
            tracker.close()
        if publisher is not None:
            publisher.close()
        if world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    log.info("learner stopped at version %d (%s)", trainer.version, stop.reason or "done")
    return 130 if stop else 0


def _eval_model(par, full):
    """The model rank 0 evaluates: the live one, or under FSDP2 an unsharded copy of ``full``."""
    if not par.fsdp:
        return par.model
    import copy

    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_config(copy.deepcopy(par.model.config))
    m.load_state_dict(full)
    return m


def _audit(f, step: int, groups) -> None:
    """One line per step received: the group ids and a checksum of each prompt (so runs can be
    compared prompt by prompt, and a group trained twice shows up)."""
    import zlib

    line = {
        "step": step,
        "groups": [f"{g.generator_id}:{g.seq}" for g in groups],
        "prompts": [zlib.crc32(g.prompt_tokens.tobytes()) for g in groups],
    }
    f.write(json.dumps(line) + "\n")


def _samples(reply) -> int:
    return sum(g.num_responses for g in reply.batch)


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace(config=sys.argv[1], overrides=sys.argv[2:], resume=False)))
