"""The typed configuration tree of a dapo_async run.

Owns: the dataclasses every role reads (``RunConfig`` → model, data, generator, reward, buffer,
algo, learner, eval, weight_sync, tracking, launch), loading them from YAML files in ``configs/`` with
dotted command-line overrides (OmegaConf structured configs do the merging and the type
checking), validation that names the key path and the reason, and writing the resolved config
into the run directory.

Every field carries its documentation in ``metadata["doc"]``; ``dapo-async config docs`` and
``docs/configuration.md`` are generated from it. This module must import without torch.
"""

from __future__ import annotations

from dapo_async.config.fields import ConfigError
from dapo_async.config.load import (
    RESOLVED_CONFIG_NAME,
    field_docs,
    from_dict,
    load_config,
    save_resolved,
    to_dict,
    to_yaml,
)
from dapo_async.config.schema import (
    AlgoConfig,
    BufferConfig,
    DataConfig,
    GeneratorConfig,
    LaunchConfig,
    LearnerConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    TrackingConfig,
    WeightSyncConfig,
)

__all__ = [
    "RESOLVED_CONFIG_NAME",
    "AlgoConfig",
    "BufferConfig",
    "ConfigError",
    "DataConfig",
    "GeneratorConfig",
    "LaunchConfig",
    "LearnerConfig",
    "ModelConfig",
    "RewardConfig",
    "RunConfig",
    "TrackingConfig",
    "WeightSyncConfig",
    "field_docs",
    "from_dict",
    "load_config",
    "save_resolved",
    "to_dict",
    "to_yaml",
]
