"""Code that runs inside vLLM's worker process (``LLM(worker_extension_cls=...)``).

vLLM mixes ``WorkerExtension`` into its worker class, so ``self`` is the worker. The engine calls
these methods through ``LLM.collective_rpc``, which carries control data only (tensors passed as
arguments arrive as lists in multiprocess mode). Weights arrive two ways:

- ``dapo_wsync_connect`` / ``dapo_wsync_poll``: the worker itself joins the weight-sync group
  (``weight_sync.mode=dist``) and receives the broadcast buckets straight into its own process,
  verifies them and reloads the model from them — no copy through the generator process;
- ``dapo_reload_file``: from a safetensors file (the disk mode, tests, restoring a snapshot).

``Worker.reload_weights`` is used rather than ``model.load_weights``: on the CPU build the linear
layers repack their weights at start-up, and reload restores the original layout, loads, and
repacks (load_weights after start-up leaves empty parameters there).

This module must not import vLLM at top level: the generator imports it by name only.
"""

from __future__ import annotations


class WorkerExtension:
    def _dapo_reload(self, tensors: dict) -> int:
        hf_config = self.model_runner.model_config.hf_config
        if getattr(hf_config, "tie_word_embeddings", False):
            # The in-place reload keeps the LM head as its own parameter, so with tied embeddings
            # it must be given the embedding matrix explicitly (HF files omit it), or a snapshot
            # without lm_head.weight would leave the previous head in place.
            emb = [n for n in tensors if n.endswith("embed_tokens.weight")]
            if emb:
                tensors[emb[0].replace("model.embed_tokens", "lm_head")] = tensors[emb[0]]
        self.reload_weights(weights_iterator=iter(list(tensors.items())), is_checkpoint_format=True)
        return len(tensors)

    def dapo_reload_file(self, path: str) -> int:
        """Load every tensor of the safetensors file ``path`` into the model; returns the count."""
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
        return self._dapo_reload(tensors)

    def dapo_wsync_connect(
        self,
        endpoint: str,
        receiver_id: str,
        timeout_s: float,
        backend: str,
        digests: bool,
        keys_dir: str = "",
    ) -> str:
        """Join the weight-sync group as ``receiver_id`` (one receiver per worker), with the
        run's keys in ``keys_dir`` ("" for none)."""
        from dapo_async.config import WeightSyncConfig
        from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

        rid = f"{receiver_id}-w{getattr(self, 'rank', 0)}"
        ws = WeightSyncConfig(timeout_s=timeout_s)
        self._dapo_receiver = DistWeightReceiver(
            ws, None, rid, endpoint=endpoint, backend=backend, keys_dir=keys_dir or None
        )
        self._dapo_digests = digests
        return rid

    def dapo_wsync_latest(self) -> list[int]:
        """The newest announced (epoch, round) (no transfer)."""
        return list(self._dapo_receiver.latest())

    def dapo_wsync_ready(self, at: list[int]) -> bool:
        """Whether this worker can enter round ``at`` at once (False while its epoch's group
        is still forming in the receiver's own thread)."""
        return self._dapo_receiver.ready(tuple(at))

    def dapo_wsync_poll(self, at: list[int]) -> dict | None:
        """Take part in round ``at`` (read once by the generator and given to every
        tensor-parallel worker alike): receive, verify, reload. Returns
        {"version", "error"?, "digests"?} when a round was attempted, None otherwise."""
        from dapo_async.weight_sync.base import WeightSyncError

        try:
            got = self._dapo_receiver.poll(at=tuple(at))
        except WeightSyncError as e:
            return {"version": self._dapo_receiver.version, "error": str(e)}
        if got is None:
            return None
        state, version = got
        out: dict = {"version": version}
        if self._dapo_digests:
            from dapo_async.weight_sync.buckets import tensor_digest

            out["digests"] = {k: tensor_digest(v) for k, v in state.items()}
        self._dapo_reload(dict(state))
        return out

    def dapo_wsync_close(self) -> None:
        r = getattr(self, "_dapo_receiver", None)
        if r is not None:
            r.close()
            self._dapo_receiver = None

    def dapo_param_checksum(self) -> float:
        """Sum of all parameters (a cheap probe for tests that weights changed in the worker)."""
        model = self.model_runner.get_model()
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))
