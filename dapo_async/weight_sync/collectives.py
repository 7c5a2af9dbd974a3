"""The weight-sync process group and its collectives, for both backends (gloo on CPUs, NCCL on
GPUs), with failure handling that works on either:

- ``make_group``: a group over ``PrefixStore("wsync/<epoch>", store)``. NCCL gets the configured
  timeout (its constructor takes none: without it NCCL keeps its own 10-minute default) and a
  non-blocking communicator (``config.blocking = 0``), so a member that never joins leaves
  the others waiting on the host, where ``wait_all`` times out, instead of inside NCCL's init.
- ``wait_all``: wait for posted collectives *on the host*, up to a deadline. On NCCL,
  ``work.wait()`` only makes the current CUDA stream wait and returns at once, so a dead member
  would never be noticed; polling ``is_completed`` works the same on both backends.
- ``close_group``: ``abort()`` for NCCL (``shutdown()`` would wait for the stuck broadcast),
  ``shutdown()`` for gloo (its pending receives fail at once).
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta

import torch
import torch.distributed as dist

# How often a host-side wait looks at its pending collectives: small against a bucket's
# transfer time (milliseconds) and against any timeout (seconds).
WAIT_POLL_S = 0.001


class CollectiveTimeout(RuntimeError):
    """Posted collectives did not complete within the timeout (a member is gone or stuck)."""


def group_device(backend: str) -> str:
    """NCCL moves CUDA tensors (this process's current device); gloo moves CPU tensors."""
    if backend == "nccl":
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


def nccl_options(timeout_s: float):
    """NCCL group options: ``weight_sync.timeout_s`` (set the way c10d's own group helper sets
    it) and a non-blocking communicator (so its initialisation can be waited on and aborted)."""
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timedelta(seconds=timeout_s)
    opts.config.blocking = 0
    return opts


def make_group(
    store, epoch: int, rank: int, size: int, timeout_s: float, backend: str, form_timeout_s=None
):
    """The group of ``epoch``. Gloo connects every pair while it is built, retrying a refused
    connection until its timeout: it is built with ``form_timeout_s`` (a member that died since
    the epoch was announced costs that, not ``timeout_s``), then given ``timeout_s`` for its
    collectives."""
    prefix = dist.PrefixStore(f"wsync/{epoch}", store)
    if backend == "nccl":
        return dist.ProcessGroupNCCL(prefix, rank, size, nccl_options(timeout_s)), prefix
    form_s = timeout_s if form_timeout_s is None else min(form_timeout_s, timeout_s)
    pg = dist.ProcessGroupGloo(prefix, rank, size, timedelta(seconds=form_s))
    pg.set_timeout(timedelta(seconds=timeout_s))
    return pg, prefix


def wait_all(works, timeout_s: float, on_done=None) -> None:
    """Wait on the host until every work completes (``on_done(i)`` after work i, e.g. to digest
    bucket i while the next ones arrive); raises the work's error, or ``CollectiveTimeout``
    after ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    for i, work in enumerate(works):
        while not work.is_completed():
            if time.monotonic() > deadline:
                raise CollectiveTimeout(
                    f"weight-sync collective {i + 1}/{len(works)} not done after {timeout_s:g}s"
                )
            time.sleep(WAIT_POLL_S)
        work.wait()  # raises the collective's error, if it failed
        if on_done is not None:
            on_done(i)


def close_group(pg, backend: str) -> None:
    """Tear a group down without waiting for collectives that will never complete."""
    if pg is None:
        return
    with contextlib.suppress(Exception):
        if backend == "nccl":
            pg.abort()
        else:
            pg.shutdown()
