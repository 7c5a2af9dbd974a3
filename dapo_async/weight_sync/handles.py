"""Where a shared-memory weight-sync slot (``shm.py``) lives and how another process on the same
host opens it: one code path, two handle types.

    host   a file under /dev/shm that both sides map        {"kind": "host", "path", "size"}
    cuda   a buffer on the learner's GPU, exported with      {"kind": "cuda", "uuid", "size",
           CUDA IPC; a generator on that GPU opens it and     "ipc", "offset", "ref", "ref_offset",
           copies device to device                            "event", "event_sync"}

A handle is JSON (bytes as base64) stored in the run's authenticated store: nothing is pickled.
``create_slot`` gives the learner the slot as a flat uint8 tensor and its handle; ``open_slot``
gives a receiver the same memory. ``settle`` waits for the copies a process queued on the slot's
device, which the seqlock in ``shm.py`` needs before it reads the round counter again.

The CUDA fields are what ``UntypedStorage._share_cuda_`` returns (the allocation's IPC handle,
the storage's place in it, torch's inter-process reference counter that keeps the learner's
allocator from reusing the block while a receiver holds it, and the event the opener waits on);
the receiver finds the GPU by its UUID, since each process may number its visible GPUs apart.
"""

from __future__ import annotations

import base64
from pathlib import Path

import torch

from dapo_async.weight_sync.base import WeightSyncError

KINDS = ("host", "cuda")


def create_slot(kind: str, path: Path, size: int, device=None) -> tuple[torch.Tensor, dict]:
    """A new slot of ``size`` bytes (``path`` for host slots, ``device`` for cuda slots)."""
    if kind == "host":
        path.unlink(missing_ok=True)  # a restarted learner's old slot: start clean
        raw = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
        return raw, {"kind": "host", "path": str(path), "size": size}
    if kind == "cuda":
        raw = torch.zeros(size, dtype=torch.uint8, device=device)
        return raw, encode_cuda(raw.untyped_storage()._share_cuda_(), _uuid(raw.device), size)
    raise ValueError(f"slot kind {kind!r} is not one of {KINDS}")


def open_slot(handle: dict) -> torch.Tensor:
    """The slot behind ``handle`` as a flat uint8 tensor over the shared memory."""
    if handle["kind"] == "host":
        return torch.from_file(handle["path"], shared=True, size=handle["size"], dtype=torch.uint8)
    if handle["kind"] == "cuda":
        if not torch.cuda.is_available():
            raise WeightSyncError(
                "the learner shares its weights on its GPU (CUDA IPC) and this process has no "
                "GPU; set weight_sync.shm_slots=host"
            )
        device = _device_of(handle["uuid"])
        storage = torch.UntypedStorage._new_shared_cuda(device, *decode_cuda(handle))
        typed = torch.storage.TypedStorage(wrap_storage=storage, dtype=torch.uint8, _internal=True)
        return torch._utils._rebuild_tensor(typed, 0, (handle["size"],), (1,))
    raise WeightSyncError(f"unknown weight-sync slot kind {handle['kind']!r} (one of {KINDS})")


def settle(slot: torch.Tensor) -> None:
    """Wait until this process's queued copies from or into ``slot`` are done."""
    if slot.device.type == "cuda":
        torch.cuda.synchronize(slot.device)


def encode_cuda(shared: tuple, uuid: str, size: int) -> dict:
    """``_share_cuda_``'s tuple as a JSON-able handle."""
    _, ipc, storage_bytes, offset, ref, ref_offset, event, event_sync = shared
    assert storage_bytes >= size, (storage_bytes, size)
    return {
        "kind": "cuda",
        "uuid": uuid,
        "size": size,
        "storage_bytes": int(storage_bytes),
        "ipc": _b64(ipc),
        "offset": int(offset),
        "ref": _b64(ref),
        "ref_offset": int(ref_offset),
        "event": _b64(event),
        "event_sync": bool(event_sync),
    }


def decode_cuda(handle: dict) -> tuple:
    """The arguments after the device of ``UntypedStorage._new_shared_cuda``."""
    return (
        _unb64(handle["ipc"]),
        handle["storage_bytes"],
        handle["offset"],
        _unb64(handle["ref"]),
        handle["ref_offset"],
        _unb64(handle["event"]),
        handle["event_sync"],
    )


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(bytes(b)).decode()


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s)


def _uuid(device: torch.device) -> str:
    return str(torch.cuda.get_device_properties(device).uuid)


def _device_of(uuid: str) -> int:
    for i in range(torch.cuda.device_count()):
        if _uuid(torch.device("cuda", i)) == uuid:
            return i
    raise WeightSyncError(
        f"the learner's GPU {uuid} is not visible to this process (CUDA_VISIBLE_DEVICES); "
        "CUDA IPC needs the generator on the learner's GPU: set weight_sync.shm_slots=host"
    )
