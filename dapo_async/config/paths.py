"""Checks that a config's model directories exist before a role loads anything: a missing
policy is one line naming the key and what to do, not a traceback from deep inside
transformers (which reads a missing path as a malformed Hub repository id)."""

from __future__ import annotations

from pathlib import Path

from dapo_async.config.fields import ConfigError


def model_dir_problem(path: str, weights: bool = True) -> str:
    """What is wrong with ``path`` as an HF model directory ("" when nothing); ``weights``
    False: a directory is enough (the buffer needs only the tokenizer's files)."""
    p = Path(path)
    if not p.exists():
        return f"{path} does not exist"
    if not p.is_dir():
        return f"{path} is a file, not a model directory"
    if weights and not (p / "config.json").is_file():
        return f"{path} has no config.json (not a Hugging Face model directory)"
    return ""


def check_model_dirs(cfg, model_override: str = "", weights: bool = True) -> None:
    """Raise ``ConfigError`` for the first missing model directory the run needs: the policy
    (``model_override``, ``model.path``, or the built-in tiny model's ``model.tiny_dir``) and
    the reference model when one is set. ``weights`` False: the policy's directory need only
    exist (the buffer reads its tokenizer)."""
    m = cfg.model
    if model_override:
        problem = model_dir_problem(model_override)
        if problem:
            raise ConfigError("--model", problem)
    elif m.path:
        problem = model_dir_problem(m.path, weights)
        if problem:
            raise ConfigError("model.path", problem)
    elif model_dir_problem(m.tiny_dir):
        raise ConfigError(
            "model.tiny_dir",
            f"the built-in tiny model is not built in {m.tiny_dir}: run `dapo-async init-tiny "
            f"--out {m.tiny_dir}` (or `dapo-async train`, which builds it), or set model.path",
        )
    if m.reference_path and weights:
        problem = model_dir_problem(m.reference_path)
        if problem:
            raise ConfigError("model.reference_path", problem)
