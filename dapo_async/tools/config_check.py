"""`dapo-async config check CONFIG [k=v ...]`: the config against the model and data it names,
before anything is launched — one line per problem, exit status 1 when there is any. Also run by
`dapo-async train` before it starts a role.

Checked: the model directory (config.json, tokenizer), the context length the run needs
(``data.max_prompt_len + generator.max_tokens`` and ``generator.max_model_len`` against the
model's ``max_position_embeddings``, times a RoPE scaling factor where the config has one), the
tokenizer's vocabulary against the embedding's rows, a chat template where prompts are rendered
with one, every data file (it exists and each row follows the schema), and where this machine
sees GPUs, that the learner ranks and a generator's tensor-parallel group fit in them.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

from dapo_async.config.paths import model_dir_problem


def context_length(model_cfg: dict) -> tuple[int, str]:
    """The model's usable context and how it follows from its config (for messages)."""
    mpe = int(model_cfg.get("max_position_embeddings") or 0)
    scaling = model_cfg.get("rope_scaling") or {}
    factor = float(scaling.get("factor") or 1.0) if isinstance(scaling, dict) else 1.0
    if factor > 1.0:
        base = int(scaling.get("original_max_position_embeddings") or mpe)
        kind = scaling.get("rope_type") or scaling.get("type") or "scaled"
        return int(base * factor), f"max_position_embeddings {mpe}, {kind} RoPE ×{factor:g}"
    return mpe, f"max_position_embeddings {mpe}"


def _model_problems(cfg, model_dir: str, key: str) -> tuple[list[str], dict]:
    problem = model_dir_problem(model_dir)
    if problem:
        return [f"{key}: {problem}"], {}
    try:
        model_cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except ValueError as e:
        return [f"{key}: {model_dir}/config.json is not JSON ({e})"], {}
    out = []
    ctx, how = context_length(model_cfg)
    need = cfg.data.max_prompt_len + cfg.generator.max_tokens
    if ctx and need > ctx:
        out.append(
            f"generator.max_tokens: data.max_prompt_len + generator.max_tokens = "
            f"{cfg.data.max_prompt_len} + {cfg.generator.max_tokens} = {need} exceed the "
            f"model's context of {ctx} ({how}); lower them or use a longer-context model"
        )
    if ctx and cfg.generator.max_model_len > ctx:
        out.append(
            f"generator.max_model_len: {cfg.generator.max_model_len} exceeds the model's context "
            f"of {ctx} ({how})"
        )
    return out, model_cfg


def _tokenizer_problems(cfg, model_dir: str, key: str, model_cfg: dict) -> list[str]:
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
    except Exception as e:  # any loader failure is the user's to see, in one line
        said = " ".join(str(e).split())[:200]  # one line, whatever the loader raised
        return [f"{key}: the tokenizer does not load ({type(e).__name__}: {said})"]
    out = []
    vocab = int(model_cfg.get("vocab_size") or 0)
    if vocab and len(tok) > vocab:
        out.append(
            f"{key}: the tokenizer has {len(tok)} tokens but the model's embedding only "
            f"{vocab} rows (vocab_size): ids past it would index outside it"
        )
    if cfg.data.prompt_format == "chat" and not getattr(tok, "chat_template", None):
        out.append(
            "data.prompt_format: chat, but the tokenizer has no chat template "
            "(data.prompt_format=raw renders base-model prompts without one)"
        )
    return out


def _data_problems(cfg) -> list[str]:
    from dapo_async.data.datasets import DataError, load_file
    from dapo_async.data.tasks import parse_source

    sources = [("data.source", cfg.data.source), ("data.eval_source", cfg.data.eval_source)]
    sources += [(f"data.sources.{s}", s) for s in (cfg.data.sources or {})]
    out = []
    for key, source in sources:
        if not source or parse_source(source) is not None:
            continue  # empty, or a built-in task
        try:
            if not load_file(source):
                out.append(f"{key}: {source} has no rows")
        except DataError as e:
            out.append(f"{key}: {e}")
    return out


def _gpu_problems(cfg) -> list[str]:
    from dapo_async.devices import cuda_device_count

    gpus = cuda_device_count()
    if gpus == 0:
        return []
    out = []
    if cfg.learner.num_ranks > gpus:
        out.append(f"learner.num_ranks: {cfg.learner.num_ranks} ranks, {gpus} GPUs visible here")
    if cfg.generator.tensor_parallel_size > gpus:
        out.append(
            f"generator.tensor_parallel_size: {cfg.generator.tensor_parallel_size}, {gpus} GPUs "
            "visible here"
        )
    return out


def problems(cfg) -> list[str]:
    """Every problem found, one line each (empty: the config fits its model and data)."""
    key = "model.path" if cfg.model.path else "model.tiny_dir"
    out, model_cfg = _model_problems(cfg, cfg.model.source_dir, key)
    if model_cfg:
        out += _tokenizer_problems(cfg, cfg.model.source_dir, key, model_cfg)
    if cfg.model.reference_path:
        problem = model_dir_problem(cfg.model.reference_path)
        out += [f"model.reference_path: {problem}"] if problem else []
    return out + _data_problems(cfg) + _gpu_problems(cfg) + _rollout_problems(cfg)


def _rollout_problems(cfg) -> list[str]:
    """The rollout function imports, and stream mode gets an ``async def`` one."""
    from dapo_async.rollouts import RolloutError, load_rollout

    g = cfg.generator
    try:
        fn = load_rollout(g.rollout)
    except RolloutError as e:
        return [f"generator.rollout: {e}"]
    if g.rollout and g.mode == "stream" and not inspect.iscoroutinefunction(fn):
        return [f"generator.rollout: {g.rollout} is a plain function; stream mode needs an "
                "`async def` one (or set generator.mode=batch)"]  # fmt: skip
    return []


def main(args: argparse.Namespace) -> int:
    from dapo_async.config import load_config
    from dapo_async.hub import resolve_paths

    cfg = resolve_paths(load_config(args.config, args.overrides))
    found = problems(cfg)
    for line in found:
        print(f"dapo-async config check: {line}", file=sys.stderr)
    if found:
        return 1
    print(f"config check: {args.config} fits its model ({cfg.model.source_dir}) and data")
    return 0
