"""Loading and writing configs: YAML files plus dotted overrides merged by OmegaConf structured
configs (which also type-check), unknown keys reported with the nearest valid name, the resolved
config written atomically into the run directory, and the key reference for the docs."""

from __future__ import annotations

import dataclasses
import difflib
import os
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from dapo_async.config.fields import ConfigError
from dapo_async.config.schema import RunConfig
from dapo_async.utils import atomic_write_text

RESOLVED_CONFIG_NAME = "config.yaml"


def _field_type(cls: type, name: str) -> Any:
    """The resolved annotation of field ``name`` of dataclass ``cls``."""
    return typing.get_type_hints(cls)[name]


def _section_type(root: type, dotted: str) -> type | None:
    """The dataclass that holds the last component of ``dotted`` (None if the path is bad)."""
    cls: Any = root
    for part in dotted.split(".")[:-1]:
        names = {f.name for f in dataclasses.fields(cls)}
        if part not in names or not dataclasses.is_dataclass(_field_type(cls, part)):
            return None
        cls = _field_type(cls, part)
    return cls


# Keys that were replaced, with what to write instead.
RENAMED = {
    "model.dtype": "split into learner.param_dtype (master weights), learner.compute_dtype "
    "and generator.dtype (the engine)",
    "generator.eval_temperature": "moved to eval.temperature",
    "generator.eval_top_p": "moved to eval.top_p",
    "generator.eval_k": "moved to eval.k",
}


def unknown_key(full_key: str) -> ConfigError:
    """An unknown-key error with the nearest valid name."""
    if full_key in RENAMED:
        return ConfigError(full_key, f"no longer a key: {RENAMED[full_key]}")
    section = _section_type(RunConfig, full_key)
    leaf = full_key.split(".")[-1]
    if section is None:
        return ConfigError(full_key, "unknown key")
    names = [f.name for f in dataclasses.fields(section)]
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.5)
    hint = f"; did you mean `{close[0]}`?" if close else f"; valid keys: {', '.join(names)}"
    return ConfigError(full_key, f"unknown key{hint}")


def _is_section(dotted: str) -> bool:
    """Whether ``dotted`` names a whole section (``learner``, ``generator``), not a value."""
    holder = _section_type(RunConfig, dotted)
    leaf = dotted.split(".")[-1]
    if holder is None or leaf not in {f.name for f in dataclasses.fields(holder)}:
        return False
    return dataclasses.is_dataclass(_field_type(holder, leaf))


def _yaml_error(p: Path, e: yaml.YAMLError) -> ConfigError:
    """One line naming the file, the line and column, and what the parser expected."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return ConfigError("config", f"{p} is not valid YAML{where}: {problem}")


def _merge(base: Any, other: Any, what: str) -> Any:
    try:
        return OmegaConf.merge(base, other)
    except ConfigKeyError as e:
        raise unknown_key(str(e.full_key)) from None
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or what)
        msg = str(e).splitlines()[0]
        raise ConfigError(key, msg) from None


def load_config(
    path: str | os.PathLike | None = None, overrides: list[str] | None = None
) -> RunConfig:
    """Load YAML ``path`` (None = all defaults), apply ``key=value`` overrides and validate."""
    cfg = OmegaConf.structured(RunConfig)
    if path is not None:
        p = Path(path)
        if p.is_dir():
            raise ConfigError("config", f"{p} is a directory, not a YAML config file")
        if not p.is_file():
            raise ConfigError("config", f"file not found: {p}")
        try:
            data = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise _yaml_error(p, e) from None
        if not isinstance(data, dict):
            raise ConfigError("config", f"{p} must hold a mapping at the top level")
        cfg = _merge(cfg, OmegaConf.create(data), str(p))
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(item, "override must look like key.path=value")
        key, _, _ = item.partition("=")
        if _is_section(key):
            raise ConfigError(
                key,
                f"is a section, not a value: set its keys ({key}.<key>=...; "
                "`dapo-async config docs` lists them)",
            )
        try:
            dot = OmegaConf.from_dotlist([item])
        except OmegaConfBaseException as e:
            raise ConfigError(key, str(e).splitlines()[0]) from None
        cfg = _merge(cfg, dot, key)
    try:
        run: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(str(getattr(e, "full_key", "config")), str(e).splitlines()[0]) from None
    if run.reward.overlong_max_len == 0:  # derived: DAPO's L_max is the generation limit
        run.reward.overlong_max_len = run.generator.max_tokens
    if run.buffer.max_leases_per_generator == 0:  # derived: what one generator keeps in flight
        g = run.generator
        in_flight = max(g.prompts_per_batch, -(-g.max_inflight // g.responses_per_prompt))
        run.buffer.max_leases_per_generator = 2 * in_flight
    run.check()
    return run


def to_dict(cfg: RunConfig) -> dict:
    return dataclasses.asdict(cfg)


def to_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def from_dict(data: dict) -> RunConfig:
    """Rebuild a validated config from ``to_dict`` output (e.g. sent to another process)."""
    run: RunConfig = OmegaConf.to_object(_merge(OmegaConf.structured(RunConfig), data, "config"))  # type: ignore[assignment]
    run.check()
    return run


def save_resolved(cfg: RunConfig, run_dir: str | os.PathLike) -> Path:
    """Write the resolved config into ``run_dir`` atomically; returns its path. Without its
    ``run_dir``: the folder the file sits in is the run, and rerunning the file starts a new
    run instead of writing into this one (the launcher passes ``run_dir=`` to its roles)."""
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    out = d / RESOLVED_CONFIG_NAME
    return atomic_write_text(out, to_yaml(dataclasses.replace(cfg, run_dir="")))


def field_docs(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """(dotted key, doc, default, accepted values in words or "") for every leaf field, in
    declaration order."""
    rows: list[tuple[str, str, Any, str]] = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        sub = _field_type(cls, f.name)
        if dataclasses.is_dataclass(sub):
            rows.extend(field_docs(sub, key + "."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            valid = f.metadata.get("valid")
            accepts = valid.describe() if valid is not None else ""
            rows.append((key, f.metadata.get("doc", ""), default, accepts))
    return rows
