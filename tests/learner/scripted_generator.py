"""A stand-in generator for learner tests: leases prompts from a real buffer and answers each
with groups that depend only on the prompt's tokens (so two runs see identical data in the same
order), resending until acked. It stops leasing after ``--max-groups`` until the file ``--go``
exists, and exits when ``--stop`` exists.

    python scripted_generator.py ENDPOINT --max-groups N --go FILE --stop FILE
"""

import argparse
import time
import zlib
from pathlib import Path

import numpy as np
import zmq

from dapo_async import protocol as P
from dapo_async import transport as T

NAMES = ["correct"]
G = 4
RESEND_S = 1.0
LEASE_BATCH = 2


def group_for(gen_id: str, seq: int, lease_id: int, prompt: list[int]) -> P.Group:
    rng = np.random.default_rng(zlib.crc32(np.asarray(prompt, np.int32).tobytes()))
    lens = rng.integers(3, 11, size=G).astype(np.int32)
    t = int(lens.sum())
    acc = rng.integers(0, 2, size=G).astype(np.float32)
    acc[0], acc[1] = 1.0, 0.0
    return P.Group(
        gen_id,
        seq,
        lease_id,
        np.asarray(prompt, np.int32),
        lens,
        rng.integers(10, 60, size=t).astype(np.int32),
        rng.uniform(-4.5, -3.5, size=t).astype(np.float32),
        np.zeros(t, np.int32),  # version 0: rollback on resume never drops these
        np.where(acc > 0, 1.0, -1.0).astype(np.float32),
        acc,
        acc[:, None].copy(),
        np.zeros(G, np.uint8),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("endpoint")
    ap.add_argument("--max-groups", type=int, required=True)
    ap.add_argument("--go", required=True)
    ap.add_argument("--stop", required=True)
    ap.add_argument("--keys", default=None, help="the run's CurveZMQ keys directory")
    a = ap.parse_args()
    gen_id = "scripted"
    ctx = zmq.Context()
    sock = T.connect_client(ctx, zmq.DEALER, a.endpoint, keys_dir=a.keys, role="generator")
    T.send(sock, P.Hello(gen_id, 0, "scripted"))
    outbox: dict[int, P.Group] = {}
    seq = 0
    last_send = 0.0
    while not Path(a.stop).exists():
        if outbox and time.monotonic() - last_send > RESEND_S:
            T.send(
                sock, P.ScoredGroups(batch=P.GroupBatch.from_groups(list(outbox.values()), NAMES))
            )
            last_send = time.monotonic()
        may_lease = seq < a.max_groups or Path(a.go).exists()
        if may_lease and not outbox:
            T.send(sock, P.LeaseRequest(gen_id, LEASE_BATCH))
        try:
            msg = T.recv(sock, timeout_s=0.2)
        except T.RecvTimeout:
            continue
        if isinstance(msg, P.Ack):
            for (_gid, s), st in zip(msg.group_ids, msg.statuses):
                if st == "retry:hello":
                    T.send(sock, P.Hello(gen_id, 0, "scripted"))
                else:
                    outbox.pop(int(s), None)
        elif isinstance(msg, P.LeaseGrant) and msg.prompt_ids:
            groups = []
            for lease_id, prompt in zip(msg.prompt_ids, msg.prompts):
                groups.append(group_for(gen_id, seq, lease_id, prompt))
                outbox[seq] = groups[-1]
                seq += 1
            T.send(sock, P.ScoredGroups(batch=P.GroupBatch.from_groups(groups, NAMES)))
            last_send = time.monotonic()
        elif isinstance(msg, P.LeaseGrant):
            time.sleep(max(msg.wait_s, 0.01))
    sock.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
