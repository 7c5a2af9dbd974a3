"""The rollout side of the config: how generators sample (batch or stream mode, engines) and
how responses are rewarded. Part of the tree ``schema.RunConfig`` roots."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_async.config.fields import DTYPE_CHOICES, Choice, F, _need


@dataclass
class GeneratorConfig:
    engine: str = Choice(
        "Inference engine", "hf", hf="transformers generate", vllm="GPU or CPU build"
    )
    num_generators: int = F(1, "Generator processes started by `dapo-async train`.", ge=1)
    responses_per_prompt: int = F(8, "G: responses sampled per prompt (one group).", ge=2)
    prompts_per_batch: int = F(
        8, "Prompts a generator leases and samples in one engine call.", ge=1
    )
    temperature: float = F(1.0, "Sampling temperature (DAPO trains at 1.0).", gt=0)
    top_p: float = F(1.0, "Nucleus sampling mass.", gt=0, le=1)
    top_k: int = F(-1, "Top-k sampling; -1 = off.")
    max_tokens: int = F(24, "Maximum response length in tokens.", ge=1)
    logprobs_mode: str = Choice(
        "Behaviour log-probs", "processed", processed="after temperature/top-p", raw=""
    )
    dtype: str = Choice(
        "Engine dtype", "auto", DTYPE_CHOICES, auto="bfloat16 on CUDA, float32 on CPU"
    )
    max_model_len: int = F(256, "vLLM: maximum sequence length.")
    cpu_kvcache_gib: int = F(1, "vLLM CPU build: KV-cache space in GiB (VLLM_CPU_KVCACHE_SPACE).")
    gpu_memory_utilization: float = F(0.5, "vLLM GPU build: fraction of GPU memory to use.")
    tensor_parallel_size: int = F(1, "vLLM: tensor-parallel degree.")
    heartbeat_s: float = F(2.0, "Seconds between heartbeats to the buffer.", gt=0)
    mode: str = Choice(
        "How a generator samples",
        "stream",
        batch="lease prompts_per_batch prompts, generate them all, send, repeat",
        stream="keep max_inflight sequences decoding, send each group the moment its G responses "
        "finish and lease a new prompt in its place: no batch barrier",
    )
    inflight_updates: bool = F(
        True,
        "stream: take new weights between decode chunks, mid-response (every token carries "
        "its version); false: only when nothing is in flight. batch with a multi-turn "
        "`rollout`: between the turns of an episode.",
    )
    rollout: str = F(
        "",
        "The rollout function, `package.module:function` (async or plain): one episode, token "
        "in and token out, environment tokens masked out of the loss (docs/rollouts.md). Empty "
        "= `dapo_async.rollouts:single_turn` (one sampled response per episode). Built in: "
        "`dapo_async.tiny.calc:rollout` (the tiny:calc calculator tool). Both modes play every "
        "episode through it; stream mode on the continuous-batching decoder (async functions "
        "only).",
    )
    max_env_tokens: int = F(
        256,
        "With a `rollout`: environment tokens (tool results, a user's turns) one episode may "
        "hold beside its `max_tokens` sampled ones; the buffer rejects longer episodes.",
        ge=0,
    )
    max_inflight: int = F(
        0, "stream: sequences kept in flight; 0 = prompts_per_batch × responses_per_prompt.", ge=0
    )
    reset_kv_on_update: bool = F(
        False,
        "stream: recompute the KV cache of sequences in flight after a weight update (exact "
        "per-version log-probs); false keeps the cache the old weights built (PipelineRL's "
        "finding: costs almost nothing).",
    )
    update_interval_tokens: int = F(
        16, "stream, hf engine: decode steps per chunk (new weights and new prompts between).", ge=1
    )

    lean_decode: bool = F(
        True,
        "stream, hf engine: decode steps of Llama-shaped models (Llama, Qwen2) run the lean step "
        "of engines/hf_decode.py (transformers' math without its module plumbing); false: "
        "transformers' forward.",
    )
    compiled_attention: bool = F(
        True,
        "stream, hf engine, lean decode, CPU: each decode step's float32 attention in a small C "
        "kernel (engines/decode_attention.c), built once per machine with the system's C "
        "compiler ($CC, default cc) and cached under ~/.cache/dapo_async/kernels, over a KV "
        "cache of one slot a sequence (engines/slot_kv.py: each row attends over its own "
        "length; rows join and leave without copying the others): the tiny policy's stream "
        "~1.3x faster than torch's batched products over the padded cache (`bench decoder`, "
        "docs/results.md). Without a compiler, or false, torch's products and the padded cache.",
    )
    decode_matmul_dtype: str = Choice(
        "stream, hf engine, lean decode: the dtype of the decode step's weight matrix products "
        "(norms, rotary, attention, the KV cache and the logits stay in generator.dtype; at "
        "fewer than 32 rows a step runs in generator.dtype, where a bf16 product's fixed cost "
        "outweighs it)",
        "auto",
        ("auto", "float32", "bfloat16"),
        auto="bfloat16 where the engine computes in float32 on a CPU with native bf16 matmuls "
        "(AVX512-BF16, AMX: `bench decoder` up to ~15% faster on a 2-core AMD EPYC, within "
        "its drift, never measured slower; docs/results.md), else generator.dtype",
    )
    decode_delay_s: float = F(
        0.0,
        "Benchmarks only: seconds the hf engine computes (spins) in each model forward (one "
        "per decode step) on top of the forward, standing in for a slower CPU (`bench async "
        "--decode-delay-ms`): the core stays busy, as on a slower CPU, not free. 0 = off.",
        ge=0,
    )
    refill_at: float = F(
        -1.0,
        "stream: start new prompts once the sequences in flight fall to this fraction of "
        "max_inflight. 1.0 refills continuously (best where a refill costs only its new rows: "
        "GPUs, and the hf engine on a CPU with its slot KV cache); 0.0 lets the running batch "
        "drain first (best where a refill copies the running rows' cache: the padded cache, "
        "elsewhere on a CPU); -1 = auto (1.0 with CUDA or the slot cache, else 0.0; "
        'docs/results.md, "Each sequence in its own slot"). The lease '
        "is asked for ahead, at a quarter of max_inflight or this, whichever is more. Either "
        "way each group is sent the moment it is done and weights land mid-response.",
    )

    @property
    def inflight_target(self) -> int:
        """Sequences a stream-mode generator keeps in flight."""
        return self.max_inflight or self.prompts_per_batch * self.responses_per_prompt

    def check(self, p: str) -> None:
        _need(
            self.refill_at == -1 or 0 <= self.refill_at <= 1,
            f"{p}.refill_at",
            "must be -1 (auto) or in [0, 1]",
        )
        _need(
            self.mode == "batch" or self.inflight_target >= self.responses_per_prompt,
            f"{p}.max_inflight",
            "must be 0 or >= responses_per_prompt (one whole group)",
        )
        _need(self.top_k == -1 or self.top_k >= 1, f"{p}.top_k", "must be -1 or >= 1")
        _need(
            not self.rollout or self.rollout.count(":") == 1,
            f"{p}.rollout",
            "must be 'package.module:function' (or empty)",
        )

        _need(
            self.decode_delay_s == 0 or self.engine == "hf",
            f"{p}.decode_delay_s",
            "is for the hf engine only (vLLM's forward runs in its own workers)",
        )


@dataclass
class EvalConfig:
    k: int = F(
        4,
        "Samples per held-out prompt when temperature > 0 (avg@k, unbiased pass@k; a prompt "
        "repeated r times in the file is sampled r·k times); greedy takes one.",
        ge=1,
    )
    temperature: float = F(0.0, "Sampling temperature; 0 = greedy.", ge=0)
    top_p: float = F(1.0, "Nucleus sampling mass.", gt=0, le=1)
    max_tokens: int = F(0, "Maximum response length; 0 = generator.max_tokens.", ge=0)
    engine: str = Choice(
        "Engine of the evaluator role and `dapo-async eval`",
        "auto",
        auto="the generators' (generator.engine), in generator.dtype on their kind of device",
        hf="transformers generate",
        vllm="GPU or CPU build",
    )
    gpu_memory_utilization: float = F(
        0.2,
        "vLLM GPU build, evaluator role: fraction of its GPU (on one machine it shares "
        "generator 0's GPU, so this plus generator.gpu_memory_utilization must fit).",
        gt=0,
        le=1,
    )

    def resolved_engine(self, generator: GeneratorConfig) -> str:
        return generator.engine if self.engine == "auto" else self.engine

    def resolved_max_tokens(self, generator: GeneratorConfig) -> int:
        return self.max_tokens or generator.max_tokens


# The evaluator's vLLM and generator 0's share one GPU: their memory fractions must leave CUDA's
# own context and activations room.
MAX_SHARED_GPU_FRACTION = 0.95


def check_eval_fits(run) -> None:
    """The ``eval`` section against the others: its vLLM beside generator 0's on one GPU, its
    responses within generator.max_model_len."""
    g = run.generator
    if run.learner.eval_every and run.learner.eval_process:
        share = g.gpu_memory_utilization + run.eval.gpu_memory_utilization
        _need(
            run.eval.resolved_engine(g) != "vllm" or share <= MAX_SHARED_GPU_FRACTION,
            "eval.gpu_memory_utilization",
            f"is {run.eval.gpu_memory_utilization} but the evaluator's vLLM shares generator "
            f"0's GPU: with generator.gpu_memory_utilization {g.gpu_memory_utilization} that "
            f"is {share:.2f} of it (at most {MAX_SHARED_GPU_FRACTION}); lower either, or set "
            "eval.engine=hf",
        )
    ev = run.eval.resolved_max_tokens(g)
    _need(
        run.data.max_prompt_len + ev <= g.max_model_len,
        "eval.max_tokens",
        f"is {ev}: data.max_prompt_len + eval.max_tokens = {run.data.max_prompt_len + ev} "
        f"must fit in generator.max_model_len ({g.max_model_len})",
    )


@dataclass
class RewardConfig:
    fn: str = F(
        "dapo_math",
        "Reward function: dapo_math (the DAPO reference verifier's rules) | dapo_math_lenient "
        "| boxed | code (sandboxed execution) | `package.module:function` (custom); "
        "docs/algorithms.md.",
        nonempty=True,
    )
    overlong_shaping: bool = F(True, "Add DAPO's soft overlong punishment to the reward.")
    overlong_max_len: int = F(
        0,
        "L_max of the overlong punishment (tokens): DAPO's is the generation limit, so it must "
        "equal generator.max_tokens; 0 = derive it from generator.max_tokens.",
        ge=0,
    )
    overlong_cache_len: int = F(6, "L_cache of the overlong punishment (tokens).")
    timeout_s: float = F(
        5.0, "Per-response verifier timeout; a timeout scores as a tagged failure.", gt=0
    )
    num_workers: int = F(1, "Isolated reward worker processes per generator.", ge=1)
    model_path: str = F(
        "",
        "Reward model (HF sequence-classification directory) that `dapo-async train` serves "
        "with its own `reward-server` role; generators score prompt + response with it.",
    )
    model_endpoint: str = F(
        "",
        "A reward model served elsewhere: tcp://host:port (`dapo-async reward-server`) or "
        "http(s)://URL (JSON {texts} → {scores}); empty = model_path's server, if any.",
    )
    model_weight: float = F(1.0, "Weight of the reward model's score in the total reward.")
    verifier_weight: float = F(1.0, "Weight of the verifier's score (`fn`) in the total reward.")
    rollout_weight: float = F(
        0.0,
        "Weight of the reward a rollout function gives its episode itself (`Trajectory.reward`, "
        "e.g. the sum of per-turn rewards; docs/rollouts.md), added as the reward part "
        "`rollout`; 0 = not used (no such part).",
        ge=0,
    )
    model_timeout_s: float = F(
        60.0,
        "Timeout of one batched reward-model request; a failure scores the model part 0.",
        gt=0,
    )

    @property
    def uses_model(self) -> bool:
        return bool(self.model_path or self.model_endpoint)

    def check(self, p: str) -> None:
        _need(
            not self.model_endpoint or self.model_endpoint.startswith(("tcp://", "http")),
            f"{p}.model_endpoint",
            "must be tcp://host:port or an http(s):// URL",
        )
        _need(
            0 < self.overlong_cache_len < self.overlong_max_len,
            f"{p}.overlong_cache_len",
            "must be in (0, overlong_max_len)",
        )
