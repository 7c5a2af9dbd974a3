"""Learner checkpoints: an HF model directory (safetensors + tokenizer, loadable by transformers
and vLLM as is) plus ``trainer.pt`` (optimizer, scheduler, policy version, RNG states) and
``meta.json`` (step, version, the buffer checkpoint id). ``trainer.pt`` holds only tensors and
plain values and is loaded with ``weights_only=True``: a checkpoint cannot carry code.

Written into ``step-XXXXXXXX.tmp`` and renamed when complete, so a crash mid-write leaves no
half checkpoint (``checkpoint_dirs.latest`` finds the newest complete one); the newest ``keep``
are kept.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from dapo_async.checkpoint_dirs import META, complete

TRAINER_STATE = "trainer.pt"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


def rng_state() -> dict:
    """Every RNG's state as tensors and plain values (loadable with ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        # every GPU's generator (dropout, sampling on the device), where CUDA is in use
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def save(
    root: str | Path,
    step: int,
    model,
    tokenizer_dir: str | Path,
    trainer_state: dict,
    keep: int = 2,
    extra: dict | None = None,
    state_dict: dict | None = None,
    tensors: dict[str, dict] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically; ``state_dict`` overrides the model's own weights
    (the gathered full weights of an FSDP2-sharded model, LoRA-merged weights); ``tensors``:
    more files of tensors (name → dict), loadable with ``weights_only=True``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f"step-{step:08d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # a copy: save_pretrained deletes tied names (the LM head) from the dict it is given, and
    # the caller's dict is also what it publishes and evaluates
    own = dict(state_dict) if state_dict is not None else None
    model.save_pretrained(tmp, safe_serialization=True, state_dict=own)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copy2(src, tmp / name)
    torch.save({**trainer_state, "rng": rng_state()}, tmp / TRAINER_STATE)
    for name, content in (tensors or {}).items():
        torch.save(content, tmp / name)
    meta = {
        "step": step,
        "version": trainer_state["version"],
        "checkpoint_id": final.name,
        **(extra or {}),
    }
    (tmp / META).write_text(json.dumps(meta, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    for old in complete(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


class CheckpointError(ValueError):
    """A checkpoint cannot be loaded safely; the message names the file."""


def load_trainer_state(ckpt: Path) -> dict:
    """``trainer.pt`` with ``weights_only=True``: tensors and plain values only, so a tampered
    checkpoint cannot run code when a run resumes."""
    path = Path(ckpt) / TRAINER_STATE
    try:
        # onto the host: without map_location every rank would put the saved optimizer state
        # on the device it was saved from (cuda:0); the optimizer moves it to its parameters'
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0][:200]
        raise CheckpointError(
            f"{path}: holds objects other than tensors and plain values; refusing to unpickle "
            f"it ({first})"
        ) from None
