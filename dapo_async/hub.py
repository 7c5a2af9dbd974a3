"""Hugging Face Hub ids for ``model.path``, ``model.reference_path``, ``data.source``,
``data.eval_source`` and ``data.sources``: ``Qwen/Qwen2.5-Math-7B``, ``org/name@revision``, and
for a dataset file ``org/name:path/in/repo.parquet``. Resolved through ``huggingface_hub`` to a
directory of its cache (``HF_HOME`` / ``HF_HUB_CACHE``; ``HF_HUB_OFFLINE=1`` reads the cache
only, never the network), once, by whoever starts the run: `dapo-async train` writes the local
paths into the run's config, so its roles read files; a role started by hand resolves its own.

A local path always wins: a directory or file that exists is used as it is.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from dapo_async.config.fields import ConfigError

_REPO = r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"
HUB_ID = re.compile(rf"^(?P<repo>{_REPO})(?:@(?P<rev>[\w./-]+))?(?::(?P<file>[\w./-]+))?$")
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")


def is_hub_id(value: str) -> bool:
    """``org/name`` (with an optional ``@revision`` or ``:file``) that is not a local path."""
    return bool(value) and not Path(value).exists() and HUB_ID.match(value) is not None


def _download(key: str, value: str, repo_type: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    m = HUB_ID.match(value)
    try:
        return Path(snapshot_download(m["repo"], repo_type=repo_type, revision=m["rev"] or None))
    except LocalEntryNotFoundError:
        raise ConfigError(
            key,
            f"{m['repo']} is not in the Hugging Face cache and the Hub cannot be reached "
            "(HF_HUB_OFFLINE, or no network): download it where there is one "
            f"(`hf download {m['repo']}{' --repo-type dataset' if repo_type == 'dataset' else ''}`"
            ") and point HF_HOME at that cache",
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        said = " ".join(str(e).split())[:200]
        raise ConfigError(
            key, f"{value}: the Hub refused it ({type(e).__name__}: {said})"
        ) from None


def resolve_model(key: str, value: str) -> str:
    """A local directory for a model path or Hub id (unchanged when local)."""
    return str(_download(key, value, "model")) if is_hub_id(value) else value


def resolve_data(key: str, value: str) -> str:
    """A local data file for a path, a ``tiny:`` task, or a Hub dataset id (its one data file,
    or the ``:file`` it names)."""
    if not is_hub_id(value):
        return value
    root = _download(key, value, "dataset")
    named = HUB_ID.match(value)["file"]
    if named:
        path = root / named
        if not path.is_file():
            raise ConfigError(key, f"{value}: the dataset has no file {named}")
        return str(path)
    files = sorted(p for p in root.rglob("*") if p.suffix in DATA_SUFFIXES and p.is_file())
    if len(files) != 1:
        listed = ", ".join(str(p.relative_to(root)) for p in files[:8]) or "none"
        raise ConfigError(
            key, f"{value} has {len(files)} data files ({listed}): name one as {value}:<file>"
        )
    return str(files[0])


def resolve_paths(cfg):
    """``cfg`` with every Hub id replaced by a local path (the config itself when none)."""
    m, d = cfg.model, cfg.data
    model = dataclasses.replace(
        m,
        path=resolve_model("model.path", m.path),
        reference_path=resolve_model("model.reference_path", m.reference_path),
    )
    data = dataclasses.replace(
        d,
        source=resolve_data("data.source", d.source),
        eval_source=resolve_data("data.eval_source", d.eval_source),
        sources={resolve_data(f"data.sources.{k}", k): w for k, w in (d.sources or {}).items()},
    )
    return dataclasses.replace(cfg, model=model, data=data)
