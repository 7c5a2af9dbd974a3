"""Peak bytes of the tensors a function allocates, from torch's own accounting: the CUDA
allocator's peak on a GPU; on the CPU (which keeps no allocator statistics) the profiler's memory
events — each op's own allocations and frees, and the frees between ops — summed in time order.

Unlike a process's resident-set peak, this counts only tensors the code under test makes: it
does not depend on the allocator's caching, on what the process ran before, or on the machine,
so a test may compare two paths with it. (An op's temporaries that it frees before returning
are netted out: the figure is the peak between ops.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def peak_tensor_bytes(fn: Callable[[], Any], device="cpu") -> tuple[Any, int]:
    """(fn's result, the peak of bytes allocated above the start while it ran)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        out = fn()
        torch.cuda.synchronize(device)
        return out, torch.cuda.max_memory_allocated(device) - base
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    deltas = []
    for e in prof.events():
        if e.name == "[memory]":  # a free (or allocation) outside any op
            deltas.append((e.time_range.start, e.cpu_memory_usage))
        elif e.self_cpu_memory_usage:
            deltas.append((e.time_range.start, e.self_cpu_memory_usage))
    live = peak = 0
    for _, d in sorted(deltas, key=lambda x: x[0]):
        live += d
        peak = max(peak, live)
    return out, peak
