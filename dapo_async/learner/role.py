"""One learner rank as a small class, one method per phase of the data path:

    build()                 models (policy, optional frozen reference), Parallel, Trainer, buffer
                            socket; rank 0 also the weight publisher, the tracker, held-out prompts
    evaluate_before()       rank 0, fresh runs: held-out accuracy of the initial policy (with an
                            evaluator role: a request to it)
    run() → per step s:
      fetch(s)              this rank's shard of step s from the buffer (waiting counts as idle)
      trainer.step(groups)  proximal recompute, K mini-batch updates → version s+1
      publish()             rank 0 sends version s+1 to the generators (FSDP2: streamed gathers)
      checkpoint(s)         on schedule and at the last step; then the buffer is told
      track(s)              rank 0: metrics, periodic held-out evaluation, the log line
    finish()                rank 0: final evaluation, eval_after.json (with an evaluator role:
                            its snapshot), learner_summary.json
    close()                 sockets, tracker, publisher, process group

The run ends after ``learner.num_steps`` steps, or after the step that crosses
``learner.time_budget_s`` seconds of training (held-out evaluations not counted), or on stop.
"""

from __future__ import annotations

import copy
import time
from datetime import timedelta
from pathlib import Path

import torch
import zmq
from transformers import AutoModelForCausalLM, AutoTokenizer

from dapo_async import checkpoint_dirs, cores, eval_snapshots, protocol, transport
from dapo_async.algo.objectives import make_objective
from dapo_async.data.datasets import load_heldout
from dapo_async.devices import learner_compute_dtype, learner_device, local_rank, resolve_dtype
from dapo_async.evaluation import evaluate_records
from dapo_async.keys import run_keys_dir
from dapo_async.learner import checkpoint
from dapo_async.learner.fetch import audit, fetch_batch
from dapo_async.learner.lora import (
    ADAPTER_FILE,
    adapter_state,
    apply_lora,
    is_lora,
    load_adapter_state,
)
from dapo_async.learner.parallel import Parallel
from dapo_async.learner.reporting import StepReport
from dapo_async.learner.trainer import Trainer
from dapo_async.roles import read_endpoint
from dapo_async.tracking import Tracker
from dapo_async.utils import atomic_write_json
from dapo_async.weight_sync.factory import make_publisher


def init_process_group(cfg, world: int, device: torch.device) -> None:
    """The training world (torchrun's environment), when there is more than one rank, with
    ``learner.collective_timeout_s`` (rank-0-only work between collectives — checkpoint writes,
    held-out evaluation — must fit in it) and, on GPUs, this rank's device bound up front
    (NCCL communicators are created eagerly instead of at the first collective)."""
    if world <= 1:
        return
    import torch.distributed as dist

    backend = cfg.learner.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        timeout=timedelta(seconds=cfg.learner.collective_timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


class Learner:
    def __init__(self, cfg, rank: int, world: int, resume: bool, log, stop):
        self.cfg, self.rank, self.world, self.log, self.stop = cfg, rank, world, log, stop
        self.run_dir = cfg.resolved_run_dir
        self.ckpt_root = self.run_dir / "checkpoints"
        # a resumed (or restarted) learner: from the latest checkpoint, or from the start when
        # it died before the first one; either way it publishes before its first step
        self.resume = resume
        self.resume_from = checkpoint_dirs.latest(self.ckpt_root) if resume else None
        if rank == 0:  # a summary left by an earlier session of this run is not this one's end
            (self.run_dir / eval_snapshots.SUMMARY_FILE).unlink(missing_ok=True)
        self.tracker = self.publisher = self.report = None
        self.eval_records: list = []
        self.full = None  # rank 0: the full weights after the last step (gathered under FSDP2)
        self.idle_s = self.eval_s = 0.0
        self.cores = None  # this host's core ledger (``dapo_async.cores``) when shared
        self.samples_done = 0
        self.t_start = time.monotonic()

    # ------------------------------------------------------------------ build

    def build(self) -> Learner:
        cfg = self.cfg
        torch.manual_seed(cfg.seed + self.rank)
        self.device = learner_device(local_rank())
        init_process_group(cfg, self.world, self.device)
        self.model, self.tokenizer, ref_model = self._load_models()
        endpoint = cfg.launch.buffer_endpoint or read_endpoint(
            self.run_dir, "buffer", stop=self.stop
        )
        self.ctx = zmq.Context()
        self.sock = transport.connect_client(
            self.ctx,
            zmq.DEALER,
            endpoint,
            keys_dir=run_keys_dir(cfg.launch, self.run_dir),
            role="learner",
        )
        self.cores = cores.for_role(cfg, f"learner{self.rank}")
        if self.cores is not None and cfg.launch.share_cores:  # borrows: at every layer's forward
            self.cores.watch(cores.decoder_layers(self.model))
        if self.rank == 0:
            self.tracker = Tracker.for_role(cfg, "learner")
            self.publisher = make_publisher(cfg, self.run_dir, self.device)
            sent = lambda: getattr(self.publisher, "stats", {}).get("bytes", 0)  # noqa: E731
            self.report = StepReport(cfg, self.tracker, self.tokenizer.decode, self.log, sent)
            self.eval_records = load_heldout(cfg.data, cfg.seed)
        return self

    def _load_models(self):
        cfg = self.cfg
        src_dir = cfg.model.source_dir
        device = self.device
        # master weights in learner.param_dtype; the frozen reference only computes
        dtype = resolve_dtype(cfg.learner.param_dtype, device)
        ref_dtype = learner_compute_dtype(cfg.learner.compute_dtype, device)
        lora = cfg.learner.lora_rank > 0  # then the base weights always come from model.path
        load_dir = str(self.resume_from) if self.resume_from and not lora else src_dir
        model = AutoModelForCausalLM.from_pretrained(load_dir, dtype=dtype).to(device)
        if lora:
            model = apply_lora(model, cfg.learner)
            if self.resume_from is not None:
                state = torch.load(self.resume_from / ADAPTER_FILE, weights_only=True)
                load_adapter_state(model, state)
        tokenizer = AutoTokenizer.from_pretrained(src_dir)
        ref_model = None
        if make_objective(cfg.algo, cfg.generator.max_tokens).needs_reference:
            ref_dir = cfg.model.reference_path or src_dir
            if not Path(ref_dir).is_dir():
                raise SystemExit(f"model.reference_path: no such directory: {ref_dir!r}")
            ref_model = AutoModelForCausalLM.from_pretrained(ref_dir, dtype=ref_dtype)
            ref_model.to(device)
            self.log.info("frozen reference model from %s", ref_dir)
        self._ref_model = ref_model
        return model, tokenizer, ref_model

    def evaluate_before(self) -> None:
        """Rank 0 of a fresh run, before sharding: the plain model evaluates alone (or the
        evaluator role, on the generators' engine, when the run has one)."""
        if self.rank != 0 or self.resume_from is not None:
            return
        if self.resume and (self.run_dir / "eval_before.json").exists():
            return  # restarted before its first checkpoint: the same initial policy
        if eval_snapshots.uses_evaluator(self.cfg):
            eval_snapshots.request_before(self.run_dir)
            return
        ev = evaluate_records(self.model, self.tokenizer, self.cfg, self.eval_records)
        self.tracker.track(ev, 0)
        self.log.info("held-out accuracy before training: %.3f", ev["eval/accuracy"])
        atomic_write_json(self.run_dir / "eval_before.json", ev)

    def make_trainer(self) -> None:
        lc = self.cfg.learner
        self.par = Parallel(
            self.model,
            self.rank,
            self.world,
            fsdp=lc.fsdp,
            activation_checkpointing=lc.activation_checkpointing,
            compute_dtype=learner_compute_dtype(lc.compute_dtype, self.device),
            logprob_chunk_tokens=lc.logprob_chunk_tokens,
        )
        self.trainer = Trainer(
            self.par,
            self.cfg.algo,
            lc,
            self.tokenizer.pad_token_id,
            temperature=self.cfg.generator.temperature,
            max_tokens=self.cfg.generator.max_tokens,
            ref_model=self._ref_model,
        )
        self.trainer.record_rows = self.cfg.tracking.samples_per_step if self.rank == 0 else 0
        if self.resume_from is not None:
            state = checkpoint.load_trainer_state(self.resume_from)
            self.trainer.load_state_dict(state)
            checkpoint.set_rng_state(state["rng"])
            self.log.info("resumed from %s at version %d", self.resume_from, self.trainer.version)

    def publish_resumed(self) -> None:
        """After a resume, send the checkpoint's weights before the first step: generators
        start from the initial weights (or still hold the weights of the learner that died,
        which the resumed run no longer has), and the buffer asks for recent versions."""
        if self.resume:
            self.publish(need_full=False)
            self.log.info("published the resumed weights (v%d)", self.trainer.version)

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        self.t_start = time.monotonic()
        (self.run_dir / "audit").mkdir(parents=True, exist_ok=True)
        audit_path = self.run_dir / "audit" / f"trained-rank{self.rank}.jsonl"
        with open(audit_path, "a", buffering=1) as self.audit:
            for step in range(self.trainer.version, self.cfg.learner.num_steps):
                if not self._step(step):
                    break
        if self.rank == 0 and not self.stop and (self.full is not None or not self.par.fsdp):
            self.finish()

    def train_seconds(self) -> float:
        """Seconds since training started, held-out evaluations excluded."""
        return time.monotonic() - self.t_start - self.eval_s

    def _step(self, step: int) -> bool:
        """One step; False when the run ends here (stop, the last step, the time budget)."""
        t0 = time.monotonic()
        if self.cores is not None:  # while the data is not there, generators may use our core
            self.cores.waiting()
        reply = fetch_batch(self.sock, step, self.rank, self.world, self.stop, self.log)
        if reply is None:
            return False
        t_data = time.monotonic() - t0
        self.idle_s += t_data
        groups = list(reply.batch)
        audit(self.audit, step, groups)
        if self.cores is not None:
            self.cores.working()
        metrics = self.trainer.step(groups)
        last = self._is_last(step)
        every, ev_every = self.cfg.learner.checkpoint_every, self.cfg.learner.eval_every
        ckpt_now = bool(every and (step + 1) % every == 0) or last
        eval_now = bool(ev_every and (step + 1) % ev_every == 0) or last
        t_sync = time.monotonic()
        self.publish(need_full=ckpt_now or eval_now)
        metrics["time/weight_sync_s"] = time.monotonic() - t_sync
        metrics["time/wait_data_s"] = t_data
        metrics["time/step_s"] = time.monotonic() - t0
        if self.cores is not None:
            self.cores.observe_idle(t_data / max(metrics["time/step_s"], 1e-9))
            metrics.update(self.cores.metrics())
        self._throughput(metrics, reply)
        if ckpt_now:
            self.checkpoint(step)
        if self.rank == 0:
            self.track(step, metrics, evaluate=eval_now and not last)
        return not last

    def _is_last(self, step: int) -> bool:
        if step + 1 == self.cfg.learner.num_steps:
            return True
        budget = self.cfg.learner.time_budget_s
        if not budget:
            return False  # no budget: no collective on every step
        # every rank must agree on the last step (its checkpoint and gathers are collective)
        return bool(self.par.max_int(int(self.train_seconds() >= budget)))

    def publish(self, need_full: bool) -> None:
        """Rank 0 sends the new version; ``self.full`` keeps the full weights when needed."""
        par, version = self.par, self.trainer.version
        if not par.fsdp:
            self.full = par.full_state()
            if self.publisher is not None:
                self.publisher.publish(self.full, version)
            return
        # every rank takes part in each gather; the weight sync streams them into its buckets
        # one tensor at a time, checkpoints and evaluation need the full dict
        items = par.iter_full_state()
        if self.publisher is not None:
            self.publisher.publish_stream(par.full_shapes(), items, version)
        else:
            for _ in items:
                pass
        self.full = par.full_state() if need_full else None

    def _throughput(self, metrics: dict, reply) -> None:
        elapsed = max(time.monotonic() - self.t_start, 1e-9)
        self.samples_done += sum(g.num_responses for g in reply.batch)
        metrics["learner/idle_ratio"] = self.idle_s / elapsed
        metrics["learner/samples_per_s"] = self.samples_done / elapsed
        metrics["learner/version"] = float(self.trainer.version)
        metrics["learner/train_seconds"] = self.train_seconds()
        metrics.update(reply.stats)  # the buffer's counters as of this step
        metrics["learner/tokens_trained"] = float(reply.global_num_tokens)

    def checkpoint(self, step: int) -> None:
        """Save step+1 (rank 0 writes; the trainer state is collective under FSDP2), then tell
        the buffer, which compacts its log and frees the step's groups."""
        tstate = self.trainer.state_dict()
        path = None
        if self.rank == 0:
            lora = is_lora(self.model)  # the merged HF model, plus the adapters to resume
            path = checkpoint.save(
                self.ckpt_root,
                step + 1,
                self.model.get_base_model() if lora else self.model,
                self.cfg.model.source_dir,
                tstate,
                self.cfg.learner.keep_checkpoints,
                state_dict=self.full,
                tensors={ADAPTER_FILE: adapter_state(self.model)} if lora else None,
            )
        self.par.barrier()
        if self.rank == 0:
            transport.send(self.sock, protocol.CheckpointNotice(step, path.name))

    def _evaluate(self) -> dict:
        t0 = time.monotonic()
        ev = evaluate_records(self._eval_model(), self.tokenizer, self.cfg, self.eval_records)
        self.eval_s += time.monotonic() - t0
        return ev

    def _eval_model(self):
        """The live model, or under FSDP2 an unsharded copy of the gathered weights."""
        if not self.par.fsdp:
            return self.par.model
        dtype = learner_compute_dtype(self.cfg.learner.compute_dtype, self.device)
        m = AutoModelForCausalLM.from_config(copy.deepcopy(self.par.model.config), dtype=dtype)
        m.load_state_dict(self.full)
        return m.to(self.device)

    def track(self, step: int, metrics: dict, evaluate: bool) -> None:
        if evaluate:
            t0 = time.monotonic()
            if eval_snapshots.uses_evaluator(self.cfg):  # the evaluator takes it from here
                eval_snapshots.write(self.run_dir, self.full, self.trainer.version)
            else:
                metrics.update(self._evaluate())
            metrics["time/eval_s"] = time.monotonic() - t0  # what the learner waited
        self.report.after_step(self.trainer, metrics)  # readable rows, distributions, alerts
        self.tracker.track(metrics, self.trainer.version)
        if (step + 1) % self.cfg.tracking.log_every == 0:
            self.log.info(
                "step %d/%d sampled-acc %.3f trained-acc %.3f trained-reward %.3f "
                "len %.1f loss %.4f stale %.2f idle %.2f",
                step + 1,
                self.cfg.learner.num_steps,
                metrics.get("rollout/sampled_accuracy", float("nan")),
                metrics["rollout/trained_accuracy"],
                metrics["rollout/reward_mean"],
                metrics["rollout/response_len_mean"],
                metrics.get("train/loss", 0.0),
                metrics["staleness/mean"],
                metrics["learner/idle_ratio"],
            )

    def finish(self) -> None:
        """Rank 0: the final held-out evaluation (here, or handed to the evaluator role) and
        the run's summary."""
        if eval_snapshots.uses_evaluator(self.cfg):
            eval_snapshots.write(
                self.run_dir, self.full, self.trainer.version, eval_snapshots.AFTER
            )
        else:
            ev = self._evaluate()
            self.tracker.track(ev, self.trainer.version)
            self.log.info("held-out accuracy after training: %.3f", ev["eval/accuracy"])
            atomic_write_json(self.run_dir / "eval_after.json", ev)
        seconds = time.monotonic() - self.t_start
        summary = {
            "steps": self.trainer.version,
            "seconds": seconds,
            "train_seconds": self.train_seconds(),
            "idle_seconds": self.idle_s,
            "idle_ratio": self.idle_s / max(seconds, 1e-9),
        }
        atomic_write_json(self.run_dir / eval_snapshots.SUMMARY_FILE, summary)

    def close(self) -> None:
        if hasattr(self, "sock"):
            self.sock.close(linger=0)
            self.ctx.term()
        if self.tracker is not None:
            self.tracker.close()
        if self.publisher is not None:
            self.publisher.close()
        if self.cores is not None:
            self.cores.close()
        if self.world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
