"""Fake generators and learner ranks that speak the real protocol over real sockets."""

import json
import random
import time
from pathlib import Path

import numpy as np
import zmq

from dapo_async import protocol as P
from dapo_async import transport as T

NAMES = ["correct", "overlong"]


def make_group(gen_id, seq, lease_id, prompt, version, correct) -> P.Group:
    """A group on a leased ``prompt``: one 3-token response per entry of ``correct``."""
    g = len(correct)
    acc = np.array(correct, np.float32)
    t = 3 * g
    return P.Group(
        gen_id,
        seq,
        lease_id,
        np.array(prompt, np.int32),  # the leased prompt (the buffer checks)
        np.full(g, 3, np.int32),
        np.arange(t, dtype=np.int32),
        np.full(t, -0.3, np.float32),
        np.full(t, version, np.int32),
        np.where(acc > 0, 1.0, -1.0).astype(np.float32),
        acc,
        np.zeros((g, 2), np.float32),
        np.zeros(g, np.uint8),
    )


def fake_generator(endpoint, gen_id, out_path, stop_path, seed, keys_dir=None):
    """Lease, make groups with random accuracy, send, resend until acked; log what was acked."""
    rng = random.Random(seed)
    ctx = zmq.Context()
    sock = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys_dir, role="generator")
    acked, outbox, seq, version = {}, {}, 0, 0
    T.send(sock, P.Hello(gen_id, 0, "fake"))
    last_send = 0.0
    while not Path(stop_path).exists():
        if outbox and time.monotonic() - last_send > 1.0:  # resend unacknowledged groups
            T.send(
                sock, P.ScoredGroups(batch=P.GroupBatch.from_groups(list(outbox.values()), NAMES))
            )
            last_send = time.monotonic()
        T.send(sock, P.LeaseRequest(gen_id, 2))
        grant = None
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                msg = T.recv(sock, timeout_s=0.2)
            except T.RecvTimeout:
                continue
            if isinstance(msg, P.Ack):
                for gid, st in zip(msg.group_ids, msg.statuses):
                    if st == "retry:hello":
                        T.send(sock, P.Hello(gen_id, 0, "fake"))
                        continue
                    if tuple(gid) in outbox:
                        acked[f"{gid[0]}:{gid[1]}"] = st
                        del outbox[tuple(gid)]
            elif isinstance(msg, P.LeaseGrant):
                grant = msg
                break
        if grant is None or not grant.prompt_ids:
            time.sleep(0.01)
            continue
        version = grant.version
        groups = []
        for lease_id, prompt in zip(grant.prompt_ids, grant.prompts):
            acc = [rng.random() < 0.5 for _ in range(4)]
            groups.append(make_group(gen_id, seq, lease_id, prompt, version, acc))
            outbox[(gen_id, seq)] = groups[-1]
            seq += 1
        T.send(sock, P.ScoredGroups(batch=P.GroupBatch.from_groups(groups, NAMES)))
        last_send = time.monotonic()
    Path(out_path).write_text(json.dumps({"acked": acked, "unacked": len(outbox)}))
    sock.close(linger=0)
    ctx.term()


def fake_learner(endpoint, rank, world, num_steps, out_path, start_step=0, keys_dir=None):
    """Request every step's shard; record the group ids received per step."""
    ctx = zmq.Context()
    sock = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys_dir, role="learner")
    got = {}
    for step in range(start_step, num_steps):
        while True:
            T.send(sock, P.BatchRequest(rank, world, step))
            try:
                msg = T.recv(sock, timeout_s=2)
            except T.RecvTimeout:
                continue  # buffer restarting: ask again
            if isinstance(msg, P.Batch) and msg.step == step and msg.ready:
                got[step] = [f"{g}:{s}" for g, s in msg.batch.group_ids()]
                assert msg.stats["buffer/produced"] >= len(got[step])  # stats reach the learner
                break
            time.sleep(0.005)
    Path(out_path).write_text(json.dumps(got))
    sock.close(linger=0)
    ctx.term()
