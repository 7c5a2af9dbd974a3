"""Choose the weight-sync publisher (learner rank 0) and receiver (generator) from the config."""

from __future__ import annotations

from pathlib import Path

from dapo_async.keys import run_keys_dir
from dapo_async.weight_sync.base import WeightPublisher, WeightReceiver


def weights_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "weights"


def resolved_mode(cfg) -> str:
    """``weight_sync.mode`` as the roles use it: ``auto`` is resolved by ``dapo-async train``
    (shm or dist); a role started on its own with ``auto`` uses dist."""
    return "dist" if cfg.weight_sync.mode == "auto" else cfg.weight_sync.mode


def make_publisher(cfg, run_dir: Path, device="cpu") -> WeightPublisher:
    """The publisher of learner rank 0, whose model lives on ``device``."""
    mode = resolved_mode(cfg)
    if mode == "disk":
        from dapo_async.weight_sync.disk import DiskWeightPublisher

        return DiskWeightPublisher(weights_dir(run_dir))
    if mode == "shm":
        from dapo_async.weight_sync.shm import ShmWeightPublisher

        return ShmWeightPublisher(
            cfg.weight_sync,
            run_dir,
            cfg.launch.host,
            wire_dtype=wire_dtype(cfg, device),
            keys_dir=run_keys_dir(cfg.launch, run_dir),
            run_name=Path(run_dir).name if run_dir else "run",
            slots=shm_slots(cfg, device),
            device=device,
        )
    from dapo_async.weight_sync.dist import DistWeightPublisher

    return DistWeightPublisher(
        cfg.weight_sync,
        run_dir,
        cfg.launch.host,
        backend=backend(cfg),
        wire_dtype=wire_dtype(cfg, device),
        keys_dir=run_keys_dir(cfg.launch, run_dir),
    )


def shm_slots(cfg, device) -> str:
    """``weight_sync.shm_slots`` as the learner uses it: ``auto`` is resolved by ``dapo-async
    train`` (cuda where the generators share the learner's GPU); a role started on its own with
    ``auto`` keeps its slots in host memory."""
    from dapo_async.config import ConfigError

    slots = "host" if cfg.weight_sync.shm_slots == "auto" else cfg.weight_sync.shm_slots
    if slots == "cuda" and torch_device_type(device) != "cuda":
        raise ConfigError(
            "weight_sync.shm_slots", f"is cuda but the learner's weights are on {device}"
        )
    return slots


def torch_device_type(device) -> str:
    import torch

    return torch.device(device).type


def wire_dtype(cfg, device):
    """``weight_sync.wire_dtype``; auto = the engines' dtype (``generator.dtype``, whose auto
    is bfloat16 where the learner has a GPU, float32 on CPUs)."""
    from dapo_async.devices import resolve_dtype

    name = cfg.weight_sync.wire_dtype
    return resolve_dtype(cfg.generator.dtype if name == "auto" else name, device)


def make_receiver(
    cfg, run_dir: Path, receiver_id: str, connect_timeout_s: float = 30.0
) -> WeightReceiver:
    mode = resolved_mode(cfg)
    if mode == "disk":
        from dapo_async.weight_sync.disk import DiskWeightReceiver

        return DiskWeightReceiver(weights_dir(run_dir), receiver_id)
    if mode == "shm":
        from dapo_async.weight_sync.shm import ShmWeightReceiver

        return ShmWeightReceiver(
            cfg.weight_sync,
            run_dir,
            receiver_id,
            connect_timeout_s=connect_timeout_s,
            keys_dir=run_keys_dir(cfg.launch, run_dir),
        )
    from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

    return DistWeightReceiver(
        cfg.weight_sync,
        run_dir,
        receiver_id,
        backend=backend(cfg),
        connect_timeout_s=connect_timeout_s,
        keys_dir=run_keys_dir(cfg.launch, run_dir),
    )


def backend(cfg) -> str:
    """``weight_sync.backend``, with auto = NCCL where this process has a GPU, else gloo."""
    if cfg.weight_sync.backend != "auto":
        return cfg.weight_sync.backend
    from dapo_async.weight_sync.dist import default_backend

    return default_backend()
