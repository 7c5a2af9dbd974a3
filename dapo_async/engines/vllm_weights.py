"""How new weights reach a vLLM engine: the whole path, engine side, in one module.

vLLM computes in worker processes, so weights are loaded *there*, by ``WorkerExtension``
(``engines/vllm_worker.py``, mixed into vLLM's worker class); this side calls its methods
through ``LLM.collective_rpc`` (control data only), naming them by reference (``_rpc``).
Two ways in, both ending in the worker's ``_dapo_reload`` (``Worker.reload_weights``):

  a file (disk weight sync, zmq/dist received in the generator, evaluation snapshots):
    update_weights(state, v) ─► safetensors in a private tmpfs folder ─► load_file(path, v)
      ─► every worker: dapo_reload_file(path) ─► _dapo_reload

  in the workers (``weight_sync.mode=dist``; ``worker_receiver`` → ``WorkersReceiver``):
    connect: every worker: dapo_wsync_connect ─► a DistWeightReceiver of its own
             (``weight_sync/dist_receiver.py``) joins the weight-sync group
    generator loop ─► ReconnectingReceiver.poll (``generator/weights.py``) ─► WorkersReceiver.poll
      ─► poll_weight_sync: worker 0: dapo_wsync_latest (the newest announced round, no transfer)
      ─► every worker: dapo_wsync_ready(that round) (its group formed, by the receiver's own
         thread, the moment the epoch was announced) ─► all ready? every worker:
         dapo_wsync_poll(that round) ─► receive, verify ─► _dapo_reload

After either, under a held scheduler in stream mode (``_paused``: no step runs half-way), the
prefix cache is reset (no KV of the old weights reused by a new request; with ``reset_running``
running requests recompute theirs) and the version label every new token carries is set.
"""

from __future__ import annotations

import contextlib
import os

from dapo_async.engines.vllm_worker import WorkerExtension
from dapo_async.weight_sync.base import WeightReceiver


class VLLMWeightPath:
    """The weight-loading half of ``VLLMEngine`` (``self.llm``: vLLM's ``LLM``; ``self._tmp``:
    the engine's private folder; ``self.streaming``, ``self.reset_running``, ``self.version``)."""

    def _rpc(self, method, *args) -> list:
        """Call ``WorkerExtension.method`` in every worker; one result per worker."""
        return self.llm.collective_rpc(method.__name__, args=args)

    def update_weights(self, state_dict: dict, version: int) -> None:
        """Hand full weights (HF names) to the workers through a file, then drop cached prefixes."""
        from safetensors.torch import save_file

        from dapo_async.weight_sync.disk import savable

        path = os.path.join(self._tmp, "weights.safetensors")
        save_file(savable(state_dict), path)
        self.load_file(path, version)

    def load_file(self, path: str, version: int) -> None:
        """Load a safetensors snapshot that already exists (the disk weight-sync mode)."""
        with self._paused():
            counts = self._rpc(WorkerExtension.dapo_reload_file, str(path))
            if not counts or min(counts) == 0:
                raise RuntimeError(f"vLLM workers loaded no tensors from {path}")
            self._reset_cache()
            self._set_version(version)

    def worker_receiver(
        self, endpoint: str, receiver_id: str, timeout_s: float, backend: str, keys_dir=None
    ) -> WorkersReceiver:
        return WorkersReceiver(self, endpoint, receiver_id, timeout_s, backend, keys_dir)

    def connect_weight_sync(
        self, endpoint: str, receiver_id: str, timeout_s: float, backend: str, digests=False,
        keys_dir=None,
    ) -> list[str]:  # fmt: skip
        """Make every worker a member of the weight-sync group (authenticated with
        ``keys_dir``); returns the receiver ids."""
        keys = str(keys_dir) if keys_dir else ""
        return self._rpc(
            WorkerExtension.dapo_wsync_connect,
            endpoint, receiver_id, timeout_s, backend, digests, keys,
        )  # fmt: skip

    def poll_weight_sync(self) -> dict | None:
        """Take part in an open round, if any; on success the engine runs the new version.
        Raises ``WeightSyncError`` when a worker rejected the update (previous weights kept).
        The round is read once, from the first worker, and every tensor-parallel worker is
        given that same round (each reading it on its own could pick different rounds)."""
        from dapo_async.weight_sync.base import WeightSyncError

        at = self._rpc(WorkerExtension.dapo_wsync_latest)[0]
        if tuple(at) <= self._wsync_last:
            return None  # (checked first so the scheduler is held only for a real round)
        if not all(self._rpc(WorkerExtension.dapo_wsync_ready, at)):
            return None  # a worker's group is still forming: no worker enters the round yet
        with self._paused():
            results = self._rpc(WorkerExtension.dapo_wsync_poll, at)
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
            self._rpc(WorkerExtension.dapo_wsync_close)
        except Exception:
            pass

    def param_checksum(self) -> float:
        return self._rpc(WorkerExtension.dapo_param_checksum)[0]

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

    def _reset_cache(self) -> None:
        """After an update: no cached prefix of the old weights is reused by a new request
        (and, with ``reset_running``, running requests recompute theirs)."""
        self.llm.reset_prefix_cache(reset_running_requests=self.reset_running)

    def _set_version(self, version: int) -> None:
        """Our version, and vLLM's label on every token computed from now on."""
        self.version = version
        self.llm.llm_engine.set_weight_version(str(version))


class WorkersReceiver(WeightReceiver):
    """A vLLM engine whose workers are the weight-sync members: ``poll`` lets them take part in
    an open round and returns None (the engine already runs the new version)."""

    def __init__(self, engine, endpoint, receiver_id, timeout_s, backend, keys_dir=None):
        self.engine = engine
        engine.connect_weight_sync(endpoint, receiver_id, timeout_s, backend, keys_dir=keys_dir)

    def poll(self):
        self.engine.poll_weight_sync()
        return None

    def close(self) -> None:
        self.engine.close_weight_sync()
