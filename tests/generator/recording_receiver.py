"""A stand-in buffer for the streaming test: grants leases from a fixed prompt list, records
every group id it receives (appended and fsynced before the ack, so a SIGKILL loses nothing it
acknowledged), acks it, and exits when the file STOP exists.

    python recording_receiver.py PORT PROMPTS.json RECORD.txt STOP KEYS_DIR
"""

import json
import os
import sys
from pathlib import Path

import zmq

from dapo_async import protocol as P
from dapo_async import transport as T


def main() -> None:
    port, prompts_file, record, stop, keys = sys.argv[1:6]
    prompts = json.loads(Path(prompts_file).read_text())  # [[tokens, ground truth], ...]
    ctx = zmq.Context()
    server = T.bind_server(ctx, zmq.ROUTER, "127.0.0.1", int(port), keys_dir=keys)
    sock = server.socket
    out = open(record, "a")
    next_prompt = 0
    while not Path(stop).exists():
        try:
            ident, msg = T.recv_routed(sock, timeout_s=0.2)
        except T.RecvTimeout:
            continue
        if isinstance(msg, P.Hello):
            T.send_routed(sock, ident, P.Ack([], []))
        elif isinstance(msg, P.LeaseRequest):
            ids, toks, truths = [], [], []
            for _ in range(msg.num_prompts):
                tokens, truth = prompts[next_prompt % len(prompts)]
                ids.append(next_prompt)
                toks.append(tokens)
                truths.append(truth)
                next_prompt += 1
            T.send_routed(sock, ident, P.LeaseGrant(ids, toks, truths, ["tiny"] * len(ids), 0))
        elif isinstance(msg, P.ScoredGroups):
            gids = [(str(g), int(s)) for g, s in msg.batch.group_ids()]
            out.write("".join(f"{g}:{s}\n" for g, s in gids))
            out.flush()
            os.fsync(out.fileno())
            T.send_routed(sock, ident, P.Ack(gids, ["stored"] * len(gids)))
    out.close()
    server.close()
    ctx.term()


if __name__ == "__main__":
    main()
