"""Disk fallback for weight sync: safetensors snapshots and an atomically replaced marker.

Publisher (learner rank 0): write ``v<version>.safetensors`` (tmp file, fsync, rename), then
``LATEST`` = ``{"version", "file", "sha256"}`` (tmp, rename). Receivers poll ``LATEST``, load the
named file, verify the checksum (a mismatch keeps the previous weights and raises
``WeightSyncError``) and acknowledge by writing ``acks/<receiver>`` with the version.
Works across hosts on a shared filesystem, with heterogeneous or elastic generator pools.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from dapo_async.utils import atomic_write_text
from dapo_async.weight_sync.base import WeightPublisher, WeightReceiver, WeightSyncError

LATEST = "LATEST"
# Snapshots kept on disk (a receiver may still be reading the previous one).
KEEP_SNAPSHOTS = 3


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def savable(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors safetensors accepts: tied weights (embeddings = LM head) share
    storage, and safetensors refuses aliases, so a second name of one storage gets a copy."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in state_dict.items():
        t = v.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out


class DiskWeightPublisher(WeightPublisher):
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def publish(self, state_dict: dict[str, torch.Tensor], version: int) -> Path:
        from safetensors.torch import save_file

        name = f"v{version:08d}.safetensors"
        tmp = self.dir / f".{name}.tmp"
        save_file(savable(state_dict), str(tmp), metadata={"version": str(version)})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        final = self.dir / name
        os.replace(tmp, final)
        atomic_write_text(
            self.dir / LATEST,
            json.dumps({"version": version, "file": name, "sha256": _sha256(final)}),
        )
        for old in sorted(self.dir.glob("v*.safetensors"))[:-KEEP_SNAPSHOTS]:
            old.unlink(missing_ok=True)
        return final

    def acked(self) -> dict[str, int]:
        d = self.dir / "acks"
        if not d.is_dir():
            return {}
        return {p.name: int(p.read_text() or -1) for p in d.iterdir() if not p.name.startswith(".")}


class DiskWeightReceiver(WeightReceiver):
    def __init__(self, directory: str | Path, receiver_id: str):
        self.dir = Path(directory)
        self.id = receiver_id
        self.version = -1

    def latest(self) -> dict | None:
        try:
            return json.loads((self.dir / LATEST).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def poll(self) -> tuple[dict[str, torch.Tensor], int] | None:
        """New weights if a newer version is published, else None."""
        meta = self.latest()
        if meta is None or meta["version"] <= self.version:
            return None
        from safetensors.torch import load_file

        path = self.dir / meta["file"]
        try:
            digest = _sha256(path)
        except FileNotFoundError:
            return None  # replaced meanwhile: the next poll sees the newer marker
        if digest != meta["sha256"]:
            raise WeightSyncError(
                f"checksum mismatch for {path} (version {meta['version']}); keeping v{self.version}"
            )
        state = load_file(str(path))
        self.version = int(meta["version"])
        acks = self.dir / "acks"
        acks.mkdir(exist_ok=True)
        atomic_write_text(acks / self.id, str(self.version))
        return state, self.version
