"""What one role process uses, as metrics (``resources/*``), so a user sees which role is the
bottleneck and whether memory grows (docs/metrics.md):

    cpu_percent        CPU time over wall time since the last reading (100 = one core busy)
    rss_mb             resident memory
    gpu_allocated_mb   torch's CUDA memory: allocated now, reserved by its caching allocator,
    gpu_reserved_mb    and the peak allocated so far (only where this process uses a GPU)
    gpu_peak_mb
    sent_mb            bytes sent and received as messages on this process's sockets
    received_mb        (``transport.TRAFFIC``), cumulative
    wsync_mb           weights published (learner) or received (generator), cumulative

A role calls ``metrics()`` where it reports its other metrics; ``weight_sync_bytes`` is a callable
the role gives (its publisher's or receiver's count), or None.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import psutil

from dapo_async import transport

MB = float(1 << 20)


class ResourceMeter:
    def __init__(self, weight_sync_bytes: Callable[[], int] | None = None):
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # the first reading starts the interval
        self.weight_sync_bytes = weight_sync_bytes

    def metrics(self) -> dict[str, float]:
        out = {
            "resources/cpu_percent": self.proc.cpu_percent(None),
            "resources/rss_mb": self.proc.memory_info().rss / MB,
            "resources/sent_mb": transport.TRAFFIC["sent"] / MB,
            "resources/received_mb": transport.TRAFFIC["received"] / MB,
        }
        torch = sys.modules.get("torch")  # never import torch into a role that has none
        if torch is not None and torch.cuda.is_initialized():
            out["resources/gpu_allocated_mb"] = torch.cuda.memory_allocated() / MB
            out["resources/gpu_reserved_mb"] = torch.cuda.memory_reserved() / MB
            out["resources/gpu_peak_mb"] = torch.cuda.max_memory_allocated() / MB
        if self.weight_sync_bytes is not None:
            try:
                out["resources/wsync_mb"] = self.weight_sync_bytes() / MB
            except Exception:  # a receiver being replaced: no figure this time
                pass
        return out
