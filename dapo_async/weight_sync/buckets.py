"""Flat transfer buckets for weight sync: a model's tensors packed by dtype into persistent flat
buffers of at most ``bucket_bytes`` each (one broadcast per bucket), the manifest that lets a
receiver check names, shapes and dtypes, and the per-bucket 64-bit digest.

With a ``wire_dtype`` every floating-point tensor is cast into it as it is packed (fp32 master
weights travel as bf16 to bf16 engines: half the bytes on the wire and in the staging buffers);
the manifest then names the wire dtype, which is what the receiver gets."""

from __future__ import annotations

import torch

from dapo_async.weight_sync.base import WeightSyncError


class FlatBuckets:
    """Persistent flat buffers holding a model's tensors, grouped by dtype, ≤ bucket_bytes each."""

    def __init__(
        self,
        named_shapes: list[tuple[str, torch.Size, torch.dtype]],
        bucket_bytes: int,
        device="cpu",
        wire_dtype: torch.dtype | None = None,
    ):
        self.layout: list[
            tuple[str, int, int, tuple[int, ...], torch.dtype]
        ] = []  # name, bucket, offset, shape, dtype
        sizes: list[int] = []
        dtypes: list[torch.dtype] = []
        by_dtype: dict[torch.dtype, list] = {}
        for name, shape, dtype in named_shapes:
            if wire_dtype is not None and dtype.is_floating_point:
                dtype = wire_dtype
            by_dtype.setdefault(dtype, []).append((name, shape))
        for dtype, items in by_dtype.items():
            item = dtype.itemsize
            cur = None
            for name, shape in items:
                n = int(torch.Size(shape).numel())
                if cur is None or ((sizes[cur] + n) * item > bucket_bytes and sizes[cur] > 0):
                    sizes.append(0)
                    dtypes.append(dtype)
                    cur = len(sizes) - 1
                self.layout.append((name, cur, sizes[cur], tuple(shape), dtype))
                sizes[cur] += n
        # CPU staging buffers are pinned where a GPU exists: device-to-host copies into them are
        # then asynchronous (pageable memory makes every copy synchronous)
        pin = torch.device(device).type == "cpu" and torch.cuda.is_initialized()
        self.buffers = [
            torch.empty(n, dtype=dt, device=device, pin_memory=pin) for n, dt in zip(sizes, dtypes)
        ]

    @classmethod
    def from_manifest(cls, manifest: dict, device="cpu") -> FlatBuckets:
        fb = cls.__new__(cls)
        fb.layout = [
            (n, b, off, tuple(shape), getattr(torch, dt))
            for n, b, off, shape, dt in manifest["tensors"]
        ]
        fb.buffers = [
            torch.empty(int(n), dtype=getattr(torch, dt), device=device)
            for n, dt in manifest["buckets"]
        ]
        return fb

    def pack(self, state: dict[str, torch.Tensor]) -> None:
        self.pack_items((name, state[name]) for name, *_ in self.layout)

    def pack_items(self, items) -> None:
        """Copy (name, tensor) pairs in as they come (a stream of gathered tensors)."""
        where = {name: (b, off) for name, b, off, _, _ in self.layout}
        seen = 0
        with torch.no_grad():
            for name, t in items:
                if name not in where:
                    raise WeightSyncError(f"weight-sync stream has an unknown tensor {name!r}")
                b, off = where[name]
                dst = self.buffers[b][off : off + t.numel()]
                dst.copy_(t.reshape(-1), non_blocking=dst.is_pinned() or dst.is_cuda)
                seen += 1
        if seen != len(where):
            raise WeightSyncError(f"weight-sync stream gave {seen} of {len(where)} tensors")

    def views(self) -> dict[str, torch.Tensor]:
        return {
            name: self.buffers[b][off : off + int(torch.Size(shape).numel())].view(shape)
            for name, b, off, shape, _ in self.layout
        }

    def manifest(self, version: int) -> dict:
        return {
            "version": version,
            "tensors": [
                [n, b, off, list(shape), str(dt).removeprefix("torch.")]
                for n, b, off, shape, dt in self.layout
            ],
            "buckets": [
                [int(buf.numel()), str(buf.dtype).removeprefix("torch.")] for buf in self.buffers
            ],
        }


def tensor_digest(t: torch.Tensor) -> int:
    """xxh3-64 of a tensor's bytes, whatever its device or dtype (bf16 has no numpy dtype, so
    the bytes are read as uint8; a CUDA tensor is copied to the host first)."""
    import xxhash

    raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu()
    return xxhash.xxh3_64_intdigest(memoryview(raw.numpy()))


# Words per slice of the on-device digest: its int64 temporaries stay at a few times this many
# words (32 MiB each) instead of a few times the whole bucket.
DIGEST_SLICE_WORDS = 1 << 22


def digest(buf: torch.Tensor) -> int:
    """A 64-bit digest of a flat bucket: xxh3-64 of its bytes on CPU; on GPU a position-weighted
    wrapping sum of its 16-bit words computed on the device (no copy to the host)."""
    if buf.device.type == "cpu":
        import xxhash

        return xxhash.xxh3_64_intdigest(memoryview(buf.view(torch.uint8).numpy()))
    return word_digest(buf)


def word_digest(buf: torch.Tensor, slice_words: int = DIGEST_SLICE_WORDS) -> int:
    """Σ w_i·i and Σ w_i over the buffer's 16-bit words (bytes when odd), wrapping in int64,
    computed ``slice_words`` at a time; equal for any slice size (integer sums are exact)."""
    b = buf.view(torch.uint8)
    words = b.view(torch.int16) if b.numel() % 2 == 0 else b
    weighted = torch.zeros((), dtype=torch.int64, device=buf.device)
    total = torch.zeros((), dtype=torch.int64, device=buf.device)
    for lo in range(0, words.numel(), slice_words):
        w = words[lo : lo + slice_words].to(torch.int64)
        idx = torch.arange(lo + 1, lo + w.numel() + 1, device=buf.device, dtype=torch.int64)
        weighted += (w * idx).sum()
        total += w.sum()
    return int((weighted * 0x9E3779B1 + total).item()) & ((1 << 63) - 1)
