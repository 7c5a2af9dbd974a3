"""`dapo-async bench buffer`: the buffer's own cost per group (sockets excluded; see
`bench transport` for the wire).

- ingest: pre-encoded ScoredGroups messages (``--batch`` groups each) go through
  ``protocol.decode`` (full validation) and ``BufferService.handle`` (lease check, dedupe,
  dynamic sampling, storage) — groups/s;
- served: ``BatchRequest`` for consecutive steps from 2 learner ranks, including assembly,
  shard balancing and ``protocol.encode`` of each reply — groups/s;
- memory: resident-set growth per 10,000 stored groups (G responses of ``--response-len`` tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import psutil

from dapo_async import protocol
from dapo_async.buffer.checks import GroupLimits, model_vocab_size
from dapo_async.buffer.service import BufferService
from dapo_async.config import RunConfig
from dapo_async.data.tasks import PromptRecord

RESPONSES = 8
PROMPT_LEN = 64
# Token ids drawn below this: inside any real vocabulary (the buffer checks ids at ingest).
TOKEN_IDS = 100


def _groups(
    gen: str, start: int, n: int, leases: list[int], response_len: int, rng
) -> list[protocol.Group]:
    out = []
    for i in range(n):
        t = RESPONSES * response_len
        acc = np.zeros(RESPONSES, np.float32)
        acc[: 1 + i % (RESPONSES - 1)] = 1.0  # mixed: passes dynamic sampling
        out.append(
            protocol.Group(
                gen,
                start + i,
                leases[i],
                np.full(PROMPT_LEN, 1, np.int32),  # the leased prompt (checked at ingest)
                np.full(RESPONSES, response_len, np.int32),
                rng.integers(0, TOKEN_IDS, t, dtype=np.int32),
                -rng.random(t, dtype=np.float32),
                np.zeros(t, np.int32),
                acc * 2 - 1,
                acc,
                np.zeros((RESPONSES, 2), np.float32),
                np.zeros(RESPONSES, np.uint8),
            )
        )
    return out


def _service(cfg) -> BufferService:
    """A buffer service without a socket over 1000 one-token-repeated prompts."""
    records = [
        PromptRecord(i, [{"role": "user", "content": str(i)}], "0", "bench") for i in range(1000)
    ]
    limits = GroupLimits(model_vocab_size(cfg.model.source_dir), cfg.generator.max_tokens)
    return BufferService(
        cfg.buffer,
        cfg.data.shuffle_seed,
        limits,
        records,
        [[1] * PROMPT_LEN] * len(records),
        server=None,
    )


def run(
    num_groups: int = 10_000, batch: int = 32, response_len: int = 128, groups_per_step: int = 64
) -> dict:
    cfg = RunConfig()
    cfg.buffer.groups_per_step = groups_per_step
    cfg.buffer.max_staleness = 10**6  # the bench measures throughput, not admission
    cfg.buffer.max_buffered_groups = 10 * num_groups
    cfg.generator.max_tokens = response_len  # responses of response_len pass the ingest checks
    svc = _service(cfg)
    svc.handle(protocol.Hello("bench", 1, "hf"))
    rng = np.random.default_rng(0)
    proc = psutil.Process()
    rss0 = proc.memory_info().rss  # before the messages exist: stored groups are views of them
    msgs = []
    for start in range(0, num_groups, batch):
        n = min(batch, num_groups - start)
        leases = [ls.lease_id for ls in svc.state.grant("bench", n)]
        frames = protocol.encode(
            protocol.ScoredGroups(
                batch=protocol.GroupBatch.from_groups(
                    _groups("bench", start, n, leases, response_len, rng), ["correct", "overlong"]
                )
            )
        )
        msgs.append([bytes(memoryview(f).cast("B")) for f in frames])
    t0 = time.perf_counter()
    for frames in msgs:
        svc.handle(protocol.decode(frames))
    t_ingest = time.perf_counter() - t0
    del msgs
    rss1 = proc.memory_info().rss
    stored = len(svc.state.groups)
    served = 0
    t0 = time.perf_counter()
    step = 0
    while True:
        got = 0
        for rank in range(2):
            reply = svc.handle(protocol.BatchRequest(rank, 2, step))
            if not reply.ready:
                break
            protocol.encode(reply)
            got += len(reply.batch)
        if got == 0:
            break
        served += got
        step += 1
    t_served = time.perf_counter() - t0
    return {
        "groups": num_groups,
        "groups_per_message": batch,
        "responses_per_group": RESPONSES,
        "response_len": response_len,
        "groups_per_s_ingest": num_groups / t_ingest,
        "groups_per_s_served": served / max(t_served, 1e-9),
        "steps_served": step,
        "rss_mb_per_10k_groups": (rss1 - rss0) / 1e6 * 10_000 / max(stored, 1),
    }


def main(args: argparse.Namespace) -> int:
    res = run(batch=args.batch)
    print(
        f"buffer bench: {res['groups']} groups ({res['responses_per_group']}×{res['response_len']} tokens), "
        f"ingest {res['groups_per_s_ingest']:.0f} groups/s, served {res['groups_per_s_served']:.0f} groups/s, "
        f"{res['rss_mb_per_10k_groups']:.0f} MB RSS per 10k groups",
        file=sys.stderr,
    )
    if args.json:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}))
    return 0
