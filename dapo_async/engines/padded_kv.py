"""The running batch's KV cache as one time axis (``HFStream`` wherever the slot cache of
``slot_kv.py`` does not apply: transformers' forward, another device or dtype): rows
left-padded to the longest, the keys and values of each layer a transformers cache layer whose
appends write in place into a buffer with spare time slots.

    grow_in_place(cache)          a DynamicCache's layers append into preallocated buffers
    keep(cache, idx_B, start)     keep rows idx_B and the time slots from start (one gather)
    join(layer, other, width)     append other's rows, both right-aligned in width slots
"""

from __future__ import annotations

import torch

# Spare time slots allocated at once in a layer's KV buffer: appends write in place, and the
# buffer is copied only every this many decode steps (torch.cat copied it at every step).
KV_HEADROOM = 32


def fresh_buffers(layer, rows: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty key and value buffers shaped like ``layer``'s, for ``rows`` rows and ``t`` time
    slots plus KV_HEADROOM spare ones."""
    _, h, _, d = layer.keys.shape
    return tuple(x.new_empty((rows, h, t + KV_HEADROOM, d)) for x in (layer.keys, layer.values))


def grow_in_place(cache) -> None:
    """Make every layer of a transformers DynamicCache append into a preallocated buffer."""
    from transformers.cache_utils import DynamicLayer

    class BufferedLayer(DynamicLayer):
        in_place = True  # keep gathers into such a layer's buffer

        def update(self, key_states, value_states, cache_kwargs=None):
            if not self.is_initialized:
                return super().update(key_states, value_states, cache_kwargs)
            t, n = self.keys.shape[-2], key_states.shape[-2]
            buf = getattr(self, "_buf", None)
            fresh = (
                buf is None
                or buf[0].shape[:2] != self.keys.shape[:2]
                or buf[0].shape[-2] < t + n
                or buf[0].data_ptr() != self.keys.data_ptr()
            )
            if fresh:  # first append, rows changed, full, or keys replaced (merge/trim)
                kb, vb = fresh_buffers(self, self.keys.shape[0], t + n)
                kb[:, :, :t] = self.keys
                vb[:, :, :t] = self.values
                self._buf = buf = (kb, vb)
            buf[0][:, :, t : t + n] = key_states
            buf[1][:, :, t : t + n] = value_states
            self.keys, self.values = buf[0][:, :, : t + n], buf[1][:, :, : t + n]
            return self.keys, self.values

    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = BufferedLayer


@torch.no_grad()
def keep(cache, idx_B: torch.Tensor, start: int) -> None:
    """Keep the rows ``idx_B`` (in that order, repeats allowed) and the time slots from ``start``
    of every layer's keys and values: one gather per tensor, straight into a fresh buffer with
    KV_HEADROOM spare slots, where the next appends write in place (indexing, then trimming,
    then the first append's regrowth copied the cache three times)."""
    for layer in cache.layers:
        if not getattr(layer, "in_place", False):  # not a grow_in_place layer: plain indexing
            layer.keys = layer.keys[idx_B, :, start:]
            layer.values = layer.values[idx_B, :, start:]
            continue
        t = layer.keys.shape[-2] - start
        bufs = fresh_buffers(layer, len(idx_B), t)
        for old, buf in zip((layer.keys, layer.values), bufs, strict=True):
            torch.index_select(old[:, :, start:], 0, idx_B, out=buf[:, :, :t])
        layer._buf = bufs
        layer.keys, layer.values = bufs[0][:, :, :t], bufs[1][:, :, :t]


@torch.no_grad()
def join(layer, other, width: int) -> None:
    """Append ``other``'s rows to ``layer``'s keys and values, each right-aligned in ``width``
    time slots: one copy straight into a fresh buffer with KV_HEADROOM spare slots (where the
    next appends write in place), the padding slots zeroed (masked, but read by torch's
    attention: zeros keep its products finite)."""
    b, rows = layer.keys.shape[0], layer.keys.shape[0] + other.keys.shape[0]
    bufs = fresh_buffers(layer, rows, width)
    for name, buf in zip(("keys", "values"), bufs, strict=True):
        for part, at in (
            (getattr(layer, name), slice(0, b)),
            (getattr(other, name), slice(b, None)),
        ):
            t = part.shape[-2]
            buf[at, :, : width - t].zero_()
            buf[at, :, width - t : width] = part
    if getattr(layer, "in_place", False):
        layer._buf = bufs
    layer.keys, layer.values = bufs[0][:, :, :width], bufs[1][:, :, :width]
