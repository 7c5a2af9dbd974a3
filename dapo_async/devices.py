"""Device placement, dtypes and CUDA streams, in one place so a reader can check them.

- ``cuda_device_count()``: how many GPUs this process can see, *without* initialising CUDA
  (NVML), so a process that later lets vLLM fork its engine does not hold a CUDA context.
- ``learner_device(local_rank)``: the learner's device (``cuda:<local_rank>`` or CPU).
- ``resolve_dtype(name, device)``: ``auto`` → bfloat16 on CUDA, float32 on CPU.
  ``learner_compute_dtype(name, device)``: the same, except that ``auto`` is bfloat16 also on a
  CPU that multiplies bf16 matrices in hardware (``cpu_has_native_bf16``).
  ``active_compute_dtype(device_type, default)``: autocast's dtype where it is on, else default.
  The learner keeps parameters and AdamW state in ``learner.param_dtype`` (fp32 master weights)
  and computes in ``learner.compute_dtype`` (autocast; FSDP2 uses a MixedPrecisionPolicy);
  engines run in ``generator.dtype``; weights travel in ``weight_sync.wire_dtype``.
- ``plan_devices(...)``: which GPUs each local role sees (``CUDA_VISIBLE_DEVICES``), and whether
  the learner and the generators must share one (then weight sync cannot use NCCL: two NCCL ranks
  on one device are refused, so it falls back to gloo through host memory).
- ``side_stream(device)``: a CUDA stream of its own for the weight-sync sender, so its waits never
  land on the learner's compute stream; a no-op on CPU.

torch is imported inside the functions: the launcher plans devices without loading it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")


def cuda_device_count() -> int:
    """GPUs visible to this process, counted through NVML (no CUDA context is created, so vLLM
    can still fork its engine process); 0 on a CPU build."""
    import torch

    if not torch.backends.cuda.is_built():
        return 0
    count_nvml = getattr(torch.cuda, "_device_count_nvml", None)
    if count_nvml is not None:
        n = count_nvml()
        if n >= 0:
            return n
    # NVML unavailable: torch's own count (initialises the driver, not a context)
    return torch.cuda.device_count()


def on_gpu() -> bool:
    return cuda_device_count() > 0


def learner_device(local_rank: int) -> torch.device:
    """``cuda:<local_rank>`` where the process sees a GPU (made current), else the CPU."""
    import torch

    if on_gpu():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def engine_device() -> torch.device:
    """Where a generator's engine runs: its first visible GPU, else the CPU."""
    import torch

    return torch.device("cuda", 0) if on_gpu() else torch.device("cpu")


def resolve_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 on CPU (bf16 matmuls are slow on most CPUs)."""
    import torch

    if name == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r} (auto | {' | '.join(DTYPES)})")
    return getattr(torch, name)


# /proc/cpuinfo flags of x86 CPUs that multiply bf16 matrices in hardware: AVX512-BF16 (dot
# products of bf16 pairs; AMD Zen 4, Intel Cooper Lake and later) and AMX (Sapphire Rapids+).
# Elsewhere bf16 matmuls are emulated in fp32 or run a slow reference kernel.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU (or the given /proc/cpuinfo text) has a native bf16 matrix multiply.
    False where /proc/cpuinfo cannot be read (macOS, Windows): float32 is the safe choice."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return bool(NATIVE_BF16_FLAGS & set(line.partition(":")[2].split()))
    return False


def active_compute_dtype(device_type: str, default: torch.dtype) -> torch.dtype:
    """The dtype matrix products on ``device_type`` run in at this point: autocast's where it is
    on, else ``default`` (the inputs' or the weights' own)."""
    import torch

    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return default


def learner_compute_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """``learner.compute_dtype``: ``auto`` → bfloat16 on CUDA and on a CPU with native bf16
    matmuls (a learner step of the tiny policy 22% shorter on a 2-core AMD EPYC with
    AVX512-BF16, whose bf16 matmuls run 5× its fp32 ones; docs/results.md), else float32.
    Master weights and AdamW state stay in ``learner.param_dtype``; generators sample in
    ``generator.dtype``."""
    import torch

    if name == "auto" and torch.device(device).type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return resolve_dtype(name, device)


def decode_matmul_dtype(
    name: str, model_dtype: torch.dtype, device: torch.device | str
) -> torch.dtype | None:
    """``generator.decode_matmul_dtype`` for an hf engine whose model is in ``model_dtype``:
    None where the products run in the model's dtype. ``auto`` → bfloat16 for a float32 model
    on a CPU with native bf16 matmuls (``cpu_has_native_bf16``)."""
    import torch

    if name == "auto":
        native = torch.device(device).type == "cpu" and cpu_has_native_bf16()
        wanted = torch.bfloat16 if native and model_dtype == torch.float32 else model_dtype
    else:
        wanted = resolve_dtype(name, device)
    return None if wanted == model_dtype else wanted


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class DevicePlan:
    """GPUs per local role, as ``CUDA_VISIBLE_DEVICES`` strings (None: leave the variable as it
    is, the CPU case), and whether learners and generators share a device."""

    learner: str | None
    generators: list[str | None]
    shared: bool

    def wsync_backend(self, configured: str) -> str:
        """The weight-sync backend: ``auto`` is NCCL only when every GPU role has its own device."""
        if configured != "auto":
            return configured
        if self.learner is None:
            return "gloo"
        return "gloo" if self.shared else "nccl"

    def generators_see_learner_gpu(self) -> bool:
        """Whether every generator is given the GPU of learner rank 0 (where it publishes), so
        it can open that rank's CUDA IPC handles."""
        if self.learner is None or not self.shared or not self.generators:
            return False
        first = self.learner.split(",")[0]
        return all(g is not None and first in g.split(",") for g in self.generators)


def plan_devices(
    num_gpus: int, num_learner_ranks: int, num_generators: int, tensor_parallel: int = 1
) -> DevicePlan:
    """Give the learner ranks the first GPUs and each generator ``tensor_parallel`` of the rest;
    where there are too few, the generators share the learner's devices (``shared``)."""
    if num_gpus <= 0:
        return DevicePlan(None, [None] * num_generators, False)
    learner_gpus = list(range(min(num_learner_ranks, num_gpus)))
    rest = list(range(len(learner_gpus), num_gpus))
    need = num_generators * tensor_parallel
    gens: list[str | None] = []
    if len(rest) >= need:
        for i in range(num_generators):
            gens.append(_ids(rest[i * tensor_parallel : (i + 1) * tensor_parallel]))
        shared = False
    else:  # not enough devices: every generator runs on the learner's GPUs (round robin)
        for i in range(num_generators):
            start = (i * tensor_parallel) % num_gpus
            gens.append(_ids([(start + k) % num_gpus for k in range(tensor_parallel)]))
        shared = True
    return DevicePlan(_ids(learner_gpus), gens, shared)


def _ids(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)


def child_visible_devices(ids: str | None, parent: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a child given plan indices (``"0,1"``), which count within
    the parent's own visible set when it has one; None: inherit the parent's."""
    if ids is None:
        return parent
    if not parent:
        return ids
    listed = [d.strip() for d in parent.split(",") if d.strip()]
    return ",".join(listed[int(i)] for i in ids.split(","))


def role_env(base: dict, ids: str | None) -> dict:
    """``base`` with the role's ``CUDA_VISIBLE_DEVICES`` (unchanged on CPU machines)."""
    visible = child_visible_devices(ids, base.get("CUDA_VISIBLE_DEVICES"))
    return base if visible is None else {**base, "CUDA_VISIBLE_DEVICES": visible}


def side_stream(device: torch.device | str):
    """A new CUDA stream on ``device`` (None on CPU)."""
    import torch

    device = torch.device(device)
    return torch.cuda.Stream(device=device) if device.type == "cuda" else None


def use_stream(stream):
    """Context making ``stream`` current (no-op for None)."""
    import torch

    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


def record_event():
    """An event recorded on the current CUDA stream, None where CUDA is not in use: what the
    weight-sync sender waits for before sending what the learner's stream copied."""
    import torch

    if not torch.cuda.is_initialized():
        return None
    ev = torch.cuda.Event()
    ev.record()
    return ev


def wait_event(event, stream) -> None:
    """Make ``stream`` wait for ``event`` (on the device), or the host when there is no stream
    (CPU buckets filled by asynchronous copies from a GPU)."""
    if event is None:
        return
    if stream is not None:
        stream.wait_event(event)
    else:
        event.synchronize()


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))
