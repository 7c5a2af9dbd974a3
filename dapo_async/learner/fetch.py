"""The learner's data intake: ask the buffer for this rank's shard of a step until it is ready,
and say why when a step starves (the buffer's counters, dynamic sampling named when it discards
almost everything).

    BatchRequest(rank, world, step) ──► buffer ──► Batch(ready=False, wait_s, stats) → wait, ask again
                                               └─► Batch(ready=True, groups, stats)  → the step's data
"""

from __future__ import annotations

import json
import time
import zlib

from dapo_async import protocol, transport

# Ask the buffer again after this long when it does not answer (it may be restarting).
BATCH_REQUEST_TIMEOUT_S = 10.0
# Warn (and repeat every so often) when one step has waited this long for its data.
STALL_WARN_S = 60.0


def fetch_batch(sock, step: int, rank: int, world: int, stop, log):
    """Block until the buffer serves this rank's shard of ``step`` (None on stop)."""
    t_start = time.monotonic()
    next_warning = t_start + STALL_WARN_S
    last_stats: dict = {}
    while not stop:
        if time.monotonic() >= next_warning:
            log.warning(stall_message(step, time.monotonic() - t_start, last_stats))
            next_warning += STALL_WARN_S
        transport.send(sock, protocol.BatchRequest(rank, world, step))
        deadline = time.monotonic() + BATCH_REQUEST_TIMEOUT_S
        reply = None
        while time.monotonic() < deadline and not stop:
            try:
                msg = transport.recv(sock, timeout_s=0.2)
            except transport.RecvTimeout:
                continue
            except protocol.ProtocolError as e:
                log.warning("bad message from buffer: %s", e)
                continue
            if isinstance(msg, protocol.Batch) and msg.step == step:
                reply = msg
                break
        if reply is None:
            log.warning("buffer did not answer the request for step %d; asking again", step)
            continue
        if reply.ready:
            return reply
        last_stats = reply.stats or last_stats
        time.sleep(reply.wait_s)
    return None


def stall_message(step: int, waited_s: float, stats: dict) -> str:
    """Why a step may be starving, from the buffer's counters."""
    produced = int(stats.get("buffer/produced", 0))
    filtered = int(stats.get("buffer/dropped_filtered", 0))
    stale = int(stats.get("buffer/dropped_stale", 0))
    msg = (
        f"step {step} has waited {waited_s:.0f}s for data: the buffer has {produced} groups "
        f"produced, {filtered} dropped by dynamic sampling, {stale} dropped as stale, "
        f"{int(stats.get('buffer/ready', 0))} ready"
    )
    if produced and filtered / produced > 0.8:
        msg += (
            ". Almost every group is all-correct or all-wrong (the policy may have collapsed or "
            "saturated): consider buffer.min_group_acc/max_group_acc, more responses per prompt, "
            "or harder/easier data"
        )
    elif not produced:
        msg += ". No generator has delivered anything: are generators running and connected?"
    return msg


def audit(f, step: int, groups) -> None:
    """One line per step received: the group ids and a checksum of each prompt (so runs can be
    compared prompt by prompt, and a group trained twice shows up)."""
    line = {
        "step": step,
        "groups": [f"{g.generator_id}:{g.seq}" for g in groups],
        "prompts": [zlib.crc32(g.prompt_tokens.tobytes()) for g in groups],
    }
    f.write(json.dumps(line) + "\n")
