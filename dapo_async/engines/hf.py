"""The ``hf`` engine: transformers ``generate`` on CPU or GPU, small and dependency-light.

Behaviour log-probs come from the per-step scores ``generate`` returns: ``processed`` scores
are the logits after temperature / top-k / top-p (what was sampled from), ``raw`` the model's
logits. Sequences stop at EOS or a ``stop_token_ids`` token (kept in the response) or at
``max_tokens``.
"""

from __future__ import annotations

import numpy as np
import torch

from dapo_async.engines.base import Completion, SamplingParams


class HFEngine:
    """``engines.base.Engine`` on a transformers model in this process."""

    def __init__(
        self,
        model_dir: str,
        dtype: str = "float32",
        device: str = "cpu",
        model=None,
        tokenizer=None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = torch.device(device)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(model_dir)
        self.model = model or AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, dtype)
        )
        self.model.to(self.device).eval()
        self.eos_id = self.tokenizer.eos_token_id
        self.pad_id = (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        )
        self.version = 0
        # stream decode steps through engines/hf_decode.py where the architecture allows
        self.lean_decode = True
        # their weight products in this dtype (None: the model's; generator.decode_matmul_dtype)
        self.decode_matmul_dtype: torch.dtype | None = None
        # their attention in the C kernel of engines/cpu_attention.py (generator.compiled_attention)
        self.decode_attention_kernel = False

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from transformers import GenerationConfig

        if not prompts:
            return []
        expanded = [p for p in prompts for _ in range(params.n)]
        width = max(len(p) for p in expanded)
        ids = torch.full((len(expanded), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(expanded):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        greedy = params.temperature == 0
        gen_cfg = GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else params.temperature,
            top_p=None if greedy or params.top_p >= 1 else params.top_p,
            # sampling: 0 = off (None would mean HF's default of 50); greedy: unset (HF warns
            # about sampling flags given without sampling)
            top_k=None if greedy else (0 if params.top_k <= 0 else params.top_k),
            max_new_tokens=params.max_tokens,
            eos_token_id=[self.eos_id, *params.stop_token_ids],
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_scores=params.logprobs_mode == "processed",
            output_logits=params.logprobs_mode == "raw",
        )
        if params.seed is not None:
            torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            generation_config=gen_cfg,
        )
        new_BL = out.sequences[:, width:]
        steps = out.scores if params.logprobs_mode == "processed" else out.logits
        logits_BLV = torch.stack(steps, dim=1).float()
        logp_BL = torch.log_softmax(logits_BLV, -1).gather(-1, new_BL.unsqueeze(-1)).squeeze(-1)
        new_np = new_BL.cpu().numpy()
        logp_np = logp_BL.cpu().numpy()
        results: list[list[Completion]] = [[] for _ in prompts]
        stop_ids = np.asarray([self.eos_id, *params.stop_token_ids])
        for i in range(len(expanded)):
            row = new_np[i]
            eos_pos = np.nonzero(np.isin(row, stop_ids))[0]
            if eos_pos.size:
                n_tok, finish = int(eos_pos[0]) + 1, "stop"
            else:
                n_tok, finish = len(row), "length"
            toks = row[:n_tok].astype(np.int32)
            results[i // params.n].append(
                Completion(
                    tokens=toks,
                    logprobs=logp_np[i, :n_tok].astype(np.float32),
                    finish=finish,
                    text=self.tokenizer.decode(toks, skip_special_tokens=True),
                )
            )
        return results

    @torch.no_grad()
    def update_weights(self, state_dict: dict, version: int) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied embeddings
        if real_missing or unexpected:
            raise ValueError(
                f"weight update mismatch: missing {real_missing[:3]}, unexpected {unexpected[:3]}"
            )
        self.version = version

    def load_file(self, path: str, version: int) -> None:
        from safetensors.torch import load_file

        self.update_weights(load_file(str(path)), version)

    def worker_receiver(self, endpoint, receiver_id, timeout_s, backend, keys_dir=None) -> None:
        """None: this engine computes in the generator's process, which receives the weights
        and hands them to ``update_weights``."""
        return None

    def stream(self, chunk_tokens: int, reset_kv: bool = False, seed: int = 0):
        """A continuous-batching decoder over this engine's model (``engines/hf_stream.py``);
        weights given to ``update_weights`` reach it between chunks."""
        from dapo_async.engines.hf_stream import HFStream

        return HFStream(self, chunk_tokens, reset_kv=reset_kv, seed=seed, lean=self.lean_decode)

    def close(self) -> None:
        pass
