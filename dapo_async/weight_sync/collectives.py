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
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

# How often a host-side wait looks at its pending collectives: small against a bucket's
# transfer time (milliseconds) and against any timeout (seconds).
WAIT_POLL_S = 0.001
# How often a wait asks whether its round was abandoned (a store round trip each time): a
# receiver stuck in a round the sender gave up on leaves it this long after the next epoch is
# announced, not after the collective timeout.
ABANDON_POLL_S = 0.5


class CollectiveTimeout(RuntimeError):
    """Posted collectives did not complete within the timeout (a member is gone or stuck)."""


# gloo can take far longer than its timeout to give up on a member that died after posting its
# address (60 s seen on a loaded 2-core machine against a 10 s timeout): ``form_within`` waits
# this much beyond its bound for the formation to fail by itself, then abandons it.
FORM_SLACK_S = 2.0


class CollectiveAbandoned(RuntimeError):
    """The sender gave up on the round these collectives belong to (it announced another)."""


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


def form_within(build, bound_s: float, discard):
    """``build()`` (a group's formation) run in a thread of its own: its result within
    ``bound_s`` seconds, else ``CollectiveTimeout`` — and a formation that succeeds after that
    is handed to ``discard`` (closed), never used."""
    box: dict = {}
    lock, done = threading.Lock(), threading.Event()

    def run() -> None:
        try:
            got, err = build(), None
        except Exception as e:  # reported to the caller, if it still waits
            got, err = None, e
        with lock:
            box.update(result=got, error=err)
            late = box.get("abandoned", False)
        done.set()
        if late and got is not None:
            discard(got)

    threading.Thread(target=run, name="wsync-form", daemon=True).start()
    done.wait(bound_s)
    with lock:
        if "result" not in box:
            box["abandoned"] = True
            raise CollectiveTimeout(f"weight-sync group not formed within {bound_s:g}s")
    if box["error"] is not None:
        raise box["error"]
    return box["result"]


def wait_all(works, timeout_s: float, on_done=None, abandoned=None) -> None:
    """Wait on the host until every work completes (``on_done(i)`` after work i, e.g. to digest
    bucket i while the next ones arrive); raises the work's error, ``CollectiveTimeout`` after
    ``timeout_s`` in all, or ``CollectiveAbandoned`` once ``abandoned()`` (asked every
    ABANDON_POLL_S) says the round was given up."""
    now = time.monotonic()
    deadline, next_ask = now + timeout_s, now + ABANDON_POLL_S
    for i, work in enumerate(works):
        while not work.is_completed():
            now = time.monotonic()
            if now > deadline:
                raise CollectiveTimeout(
                    f"weight-sync collective {i + 1}/{len(works)} not done after {timeout_s:g}s"
                )
            if abandoned is not None and now > next_ask:
                if abandoned():
                    raise CollectiveAbandoned("the sender announced a newer epoch")
                next_ask = now + ABANDON_POLL_S
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
