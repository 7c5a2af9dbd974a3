"""The two ends of weight sync and their one error. Learner rank 0 holds a ``WeightPublisher``;
every generator holds a ``WeightReceiver`` (or lets its vLLM workers receive straight into the
engine). Implementations: ``dist`` (a torch.distributed group: gloo on CPU, NCCL on GPU) and
``disk`` (safetensors snapshots on a shared filesystem).

    learner rank 0                                   generator
    publisher.publish(state, v)  ──  transfer  ──►   receiver.poll() → (state, v) | None
    publisher.publish_stream(shapes, items, v)        engine.update_weights(state, v)
    publisher.close()                                 receiver.close()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable


class WeightSyncError(RuntimeError):
    """A transfer failed, timed out or did not verify; the previous weights stay in place."""


class WeightPublisher(ABC):
    """Sends each new policy version to the receivers; never blocks training for long."""

    @abstractmethod
    def publish(self, state_dict: dict, version: int) -> None:
        """Make ``state_dict`` (name → tensor) the weights of ``version``."""

    def publish_stream(self, shapes: dict, items: Iterable, version: int) -> None:
        """Like ``publish`` from ``(name, tensor)`` pairs produced one at a time (FSDP2 gathers
        them); the default collects the stream on the CPU first."""
        self.publish({name: t.detach().cpu() for name, t in items}, version)

    def close(self) -> None:
        """Release sockets, groups and threads (default: nothing to release)."""
        return None


class WeightReceiver(ABC):
    """Polled by the generator between engine calls."""

    @abstractmethod
    def poll(self) -> tuple[dict, int] | None:
        """New weights and their version if a newer version arrived, else None. Raises
        ``WeightSyncError`` when a transfer failed (the caller keeps its weights)."""

    def close(self) -> None:
        """Release sockets, groups and threads (default: nothing to release)."""
        return None
