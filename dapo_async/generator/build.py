"""A generator's parts, built from the run config: its engine, sampling parameters, weight
receiver and buffer socket (its scorer: ``scoring.make_scorer``). ``generator/main.py``
assembles them into a loop; benches build the same parts (``bench generator``)."""

from __future__ import annotations

import time

import zmq

from dapo_async import transport
from dapo_async.devices import decode_matmul_dtype, on_gpu
from dapo_async.engines import make_engine
from dapo_async.engines.base import SamplingParams
from dapo_async.keys import run_keys_dir
from dapo_async.roles import read_endpoint
from dapo_async.weight_sync.base import WeightReceiver
from dapo_async.weight_sync.factory import backend, make_receiver, resolved_mode


def connect_buffer(ctx: zmq.Context, cfg, endpoint: str, gen_id: str) -> zmq.Socket:
    """The generator's socket to the buffer, with its id as routing id: a reconnect keeps the
    connection the buffer binds the id to (``buffer/identity.py``)."""
    keys = run_keys_dir(cfg.launch, cfg.resolved_run_dir)
    return transport.connect_client(
        ctx, zmq.DEALER, endpoint, keys_dir=keys, identity=gen_id.encode(), role="generator"
    )


def connect_weights(cfg, engine, gen_id: str, timeout_s: float) -> WeightReceiver:
    """This generator's end of weight sync: with ``weight_sync.mode=dist``, the engine's own
    workers where it has them (vLLM: ``Engine.worker_receiver``), else a receiver of the
    configured mode in this process."""
    run_dir = cfg.resolved_run_dir
    if resolved_mode(cfg) == "dist":
        endpoint = cfg.weight_sync.endpoint or read_endpoint(run_dir, "wsync", timeout_s=timeout_s)
        keys = run_keys_dir(cfg.launch, run_dir)
        in_workers = engine.worker_receiver(
            endpoint, gen_id, cfg.weight_sync.timeout_s, backend(cfg), keys
        )
        if in_workers is not None:
            return in_workers
    return make_receiver(cfg, run_dir, gen_id, connect_timeout_s=timeout_s)


# launch.spare_max_inflight's auto: a spare keeps this fraction of a generator's sequences.
SPARE_WIDTH_FRACTION = 0.25


def spare_width(cfg) -> int:
    """Sequences a spare generator keeps decoding (``launch.spare_max_inflight``), in whole
    prompts of ``generator.responses_per_prompt``, at least one."""
    g, want = cfg.generator, cfg.launch.spare_max_inflight
    if want == 0:
        return g.inflight_target
    if want < 0:
        want = int(g.inflight_target * SPARE_WIDTH_FRACTION)
    n = g.responses_per_prompt
    return max(1, min(want, g.inflight_target) // n) * n


def generator_width(cfg, spare: bool) -> tuple[int, int]:
    """(sequences a stream-mode loop keeps in flight, prompts a batch-mode lease asks for): a
    generator's, or a spare's (``spare_width``: it decodes only while the learner waits, and its
    groups must still finish within the staleness bound)."""
    g = cfg.generator
    if not spare:
        return g.inflight_target, g.prompts_per_batch
    width = spare_width(cfg)
    return width, width // g.responses_per_prompt


def refill_sequences(g, slotted: bool = False) -> int:
    """Sequences in flight at or below which a stream-mode generator leases more
    (``generator.refill_at`` of ``max_inflight``; auto: continuous on CUDA and where the
    stream keeps each sequence in its own KV slot (``slotted``: ``engines/slot_kv.py``, a
    refill costs only the new rows), else drain first)."""
    fraction = g.refill_at
    if fraction < 0:
        fraction = 1.0 if on_gpu() or slotted else 0.0
    return int(fraction * g.inflight_target)


def sampling_params(cfg):
    """The generator's sampling parameters from the config."""
    g = cfg.generator
    return SamplingParams(
        n=g.responses_per_prompt,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        max_tokens=g.max_tokens,
        logprobs_mode=g.logprobs_mode,
    )


def engine_for(cfg, path: str):
    """The configured engine (generator.engine) over ``path``; with ``generator.decode_delay_s``
    (benchmarks: a slower CPU), the hf model spins that long in each forward."""
    g = cfg.generator
    engine = make_engine(g.engine, path, g.dtype, vllm_cfg=cfg, seed=cfg.seed)
    if g.engine == "hf":
        engine.lean_decode = g.lean_decode
        engine.decode_matmul_dtype = decode_matmul_dtype(
            g.decode_matmul_dtype, engine.model.dtype, engine.device
        )
        engine.decode_attention_kernel = g.compiled_attention and engine.device.type == "cpu"
    if g.decode_delay_s > 0 and g.engine == "hf":
        delay = g.decode_delay_s
        engine.model.register_forward_pre_hook(lambda *_: spin(delay))
    return engine


def spin(seconds: float) -> None:
    """Keep this core busy for ``seconds`` (a sleep would free it, which a slower CPU does not:
    a spare generator or a lent thread would then get a core no real machine offers)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
