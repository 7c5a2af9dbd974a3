"""Code that runs inside vLLM's worker process (``LLM(worker_extension_cls=...)``).

vLLM mixes ``WorkerExtension`` into its worker class, so ``self`` is the worker. The engine calls
these methods through ``LLM.collective_rpc``, which carries control data only (tensors passed as
arguments arrive as lists in multiprocess mode): the weights travel through a safetensors file
that the worker reads directly into the model.

``Worker.reload_weights`` is used rather than ``model.load_weights``: on the CPU build the linear
layers repack their weights at start-up, and reload restores the original layout, loads, and
repacks (load_weights after start-up leaves empty parameters there).

This module must not import vLLM at top level: the generator imports it by name only.
"""

from __future__ import annotations


class WorkerExtension:
    def dapo_reload_file(self, path: str) -> int:
        """Load every tensor of the safetensors file ``path`` into the model; returns the count."""
        from safetensors import safe_open

        hf_config = self.model_runner.model_config.hf_config
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        with safe_open(path, framework="pt") as f:
            tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
        if tied:
            # The in-place reload keeps the LM head as its own parameter, so with tied embeddings
            # it must be given the embedding matrix explicitly (HF files omit it), or a snapshot
            # without lm_head.weight would leave the previous head in place.
            emb = [n for n in tensors if n.endswith("embed_tokens.weight")]
            if emb:
                tensors[emb[0].replace("model.embed_tokens", "lm_head")] = tensors[emb[0]]
        tensors = list(tensors.items())
        self.reload_weights(weights_iterator=iter(tensors), is_checkpoint_format=True)
        return len(tensors)

    def dapo_param_checksum(self) -> float:
        """Sum of all parameters (a cheap probe for tests that weights changed in the worker)."""
        model = self.model_runner.get_model()
        return float(sum(p.detach().double().sum().item() for p in model.parameters()))
