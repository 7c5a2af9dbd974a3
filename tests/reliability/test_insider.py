"""The insider run of issue #35, repeated: beside a real run (every role a real process), a peer
holding the run's generator key, on a connection of its own, for the whole run:

- acts for the real generators: heartbeats, lease requests and groups under their ids with
  their next sequence numbers (what once made the buffer ack their real groups as duplicates
  and hang the run);
- hoards leases under an id of its own, heartbeating, never returning a group;
- sends a 2,048-response group on one of its own leases (the config says 4).

The learner reaches its last step, every group the real generator sent is acknowledged and none
as a duplicate, nothing is trained twice and the buffer's books balance; the insider's messages
are refused and counted."""

import threading

import numpy as np
import pytest
import zmq
from faults import check_accounting, finish, learner_steps, start_run, wait_for

from dapo_async import protocol as P
from dapo_async import transport as T

NUM_STEPS = 8
NAMES = ["correct", "overlong"]
# The insider repeats its moves this often.
ROUND_S = 0.2


def group(gen_id, seq, lease_id, n_responses):
    """A scored group of ``n_responses`` two-token responses on ``lease_id``."""
    n = 2 * n_responses
    rewards = np.where(np.arange(n_responses) % 2, -1.0, 1.0).astype(np.float32)
    return P.Group(
        gen_id, seq, lease_id, np.array([1, 2, 3], np.int32),
        np.full(n_responses, 2, np.int32), np.full(n, 11, np.int32),
        np.full(n, -0.5, np.float32), np.zeros(n, np.int32), rewards, (rewards > 0) * 1.0,
        np.zeros((n_responses, 2), np.float32), np.zeros(n_responses, np.uint8),
    )  # fmt: skip


class Insider(threading.Thread):
    def __init__(self, run):
        super().__init__(daemon=True)
        self.run_dir = run
        self.stop = threading.Event()
        self.replies: dict[str, int] = {}
        self.sent_oversized = False
        self.error = None
        self.version = 0  # claims the newest weights the buffer announced

    def real_ids(self) -> list[str]:
        return [p.stem for p in (self.run_dir / "metrics").glob("gen*.jsonl")]

    def run(self):
        try:
            self._run()
        except Exception as e:  # reported by the test
            self.error = e

    def _run(self):
        endpoint = (self.run_dir / "endpoints" / "buffer").read_text().strip()
        ctx = zmq.Context()
        sock = T.connect_client(ctx, zmq.DEALER, endpoint, self.run_dir / "keys",
                                identity=b"insider", role="generator")  # fmt: skip
        T.send(sock, P.Hello("insider", 1, "hf"))
        seq = 0
        while not self.stop.wait(ROUND_S):
            for real in self.real_ids():  # acting for the real generators
                forged = [group(real, 10_000 + seq + k, seq + k, 4) for k in range(4)]
                for msg in (P.Heartbeat(real, 0, 0), P.LeaseRequest(real, 8, 0),
                            P.ScoredGroups(P.GroupBatch.from_groups(forged, NAMES))):  # fmt: skip
                    T.send(sock, msg, flags=zmq.NOBLOCK)
            seq += 4
            T.send(sock, P.Heartbeat("insider", self.version, 0), flags=zmq.NOBLOCK)
            T.send(sock, P.LeaseRequest("insider", 8, self.version), flags=zmq.NOBLOCK)  # hoards
            while sock.poll(0):
                self._on_reply(sock, T.recv(sock, timeout_s=0))
        sock.close(linger=0)
        ctx.term()

    def _on_reply(self, sock, msg):
        kind = type(msg).__name__
        if isinstance(msg, P.Ack):
            for status in msg.statuses:
                self.replies[status] = self.replies.get(status, 0) + 1
        self.replies[kind] = self.replies.get(kind, 0) + 1
        if isinstance(msg, P.LeaseGrant):
            self.version = max(self.version, msg.version)
        if isinstance(msg, P.LeaseGrant) and msg.prompt_ids and not self.sent_oversized:
            huge = group("insider", 0, msg.prompt_ids[0], 2048)
            T.send(sock, P.ScoredGroups(P.GroupBatch.from_groups([huge], NAMES)))
            self.sent_oversized = True


@pytest.mark.slow
def test_insider_with_the_generator_key_neither_stalls_nor_poisons_the_run(
    tiny_model, tmp_path, repo, cli_env
):
    import json

    run = tmp_path / "run"
    # max_staleness=12: room in admission beside the real generator, which would otherwise
    # fill every lease a tiny run admits with groups made ahead (the insider would get none to
    # abuse; at 4, a fast CPU's generator did: 10 grants, all empty)
    proc = start_run(
        repo, cli_env, tiny_model, run, f"learner.num_steps={NUM_STEPS}",
        "buffer.lease_deadline_s=20", "buffer.stall_reissue_s=10", "buffer.max_staleness=12",
    )  # fmt: skip
    insider = Insider(run)
    try:
        wait_for(lambda: bool(insider.real_ids()), 300, "a generator's metrics", proc)
        insider.start()
        wait_for(lambda: learner_steps(run) >= 1, 300, "the first step", proc)
        summary = finish(proc)
    finally:
        insider.stop.set()
        insider.join(10)
    assert insider.error is None, insider.error
    assert summary["steps"] == NUM_STEPS
    check_accounting(run, NUM_STEPS)
    final = json.loads((run / "buffer_final.json").read_text())
    c = final["counters"]
    assert c["rejected"].get("duplicate", 0) == 0, c
    assert final["malformed"]["impersonation"] > 0, final["malformed"]
    assert insider.sent_oversized and c["rejected"].get("group_size", 0) >= 1, (c, insider.replies)
    for f in (run / "generators").glob("gen*.json"):  # the real generators lost nothing
        counters = json.loads(f.read_text())
        assert counters["groups_sent"] == counters["groups_acked"] > 0, (f.name, counters)
    assert insider.replies.get("LeaseGrant", 0) > 0  # it did hold leases
