"""Continuous batching on vLLM (GPU or CPU build): requests join vLLM's running batch at once
and new weights are loaded between engine steps, while requests are in flight.

    add_request(id, prompt, params) ─► LLMEngine.add_request (vLLM schedules it next step)
    step():  up to chunk_tokens × LLMEngine.step(), one token per running sequence each;
             finished requests are returned, every token tagged with the version vLLM
             labelled the step that computed it (``VLLMEngine._set_version``)

Weights are taken by the generator between ``step`` calls (``VLLMEngine.update_weights`` or the
workers' weight-sync poll): the running requests keep the KV cache the old weights built (the
in-flight update PipelineRL measured to cost almost nothing), only the prefix cache is reset,
so no new request reuses an old version's prefix; with ``reset_kv`` the running requests are
preempted instead and vLLM recomputes their KV with the new weights when it resumes them.
"""

from __future__ import annotations

from dapo_async.engines.base import Completion, SamplingParams


def _versions(c) -> list[int]:
    """Per-token versions from vLLM's weight-version spans (labels set at each update, while
    the scheduler is held, so every step's tokens carry the weights that computed them)."""
    spans = c.weight_versions or []
    out: list[int] = []
    for span in spans:
        out += [int(span.version)] * (span.end - span.start)
    if len(out) != len(c.token_ids):
        raise RuntimeError(f"vLLM labelled {len(out)} of {len(c.token_ids)} tokens with a version")
    return out


class VLLMStream:
    def __init__(self, engine, chunk_tokens: int):
        # (``engine.reset_running`` carries reset_kv: ``VLLMEngine.stream`` sets it)
        self.engine = engine
        self.core = engine.llm.llm_engine
        self.chunk_tokens = chunk_tokens
        self.inflight: dict[str, int] = {}  # request -> responses (n)

    @property
    def num_inflight(self) -> int:
        return sum(self.inflight.values())

    def add_request(self, request_id: str, prompt: list[int], params: SamplingParams) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from dapo_async.engines.vllm_convert import vllm_params

        if request_id in self.inflight:
            raise ValueError(f"request {request_id!r} is already in flight")
        sp = vllm_params(params)
        # one output per request, when all n responses are done, holding all n (the default,
        # cumulative, kind reports the responses one by one)
        sp.output_kind = RequestOutputKind.FINAL_ONLY
        self.core.add_request(request_id, TokensPrompt(prompt_token_ids=list(map(int, prompt))), sp)
        self.inflight[request_id] = params.n

    def abort(self, request_id: str) -> None:
        """Forget a request in flight (vLLM frees its sequences; nothing comes back for it)."""
        if self.inflight.pop(request_id, None) is not None:
            self.core.abort_request([request_id])

    def step(self) -> list[tuple[str, list[Completion]]]:
        from dapo_async.engines.vllm_convert import completion

        done = []
        for _ in range(self.chunk_tokens):
            if not self.core.has_unfinished_requests():
                break
            for out in self.core.step():
                if out.finished and out.request_id in self.inflight:
                    del self.inflight[out.request_id]
                    comps = sorted(out.outputs, key=lambda c: c.index)
                    done.append((out.request_id, [completion(c, _versions(c)) for c in comps]))
        return done
