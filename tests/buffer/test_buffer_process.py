"""A real buffer process with fake generators and learner ranks over real sockets."""

import json
import multiprocessing as mp
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
import zmq
from fakes import fake_generator, fake_learner

from dapo_async import protocol as P
from dapo_async import transport as T
from dapo_async.samples import read_samples
from dapo_async.utils import free_port

SPAWN = mp.get_context("spawn")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from dapo_async.tiny.tokenizer import build_tokenizer

    d = tmp_path_factory.mktemp("tok")
    build_tokenizer(d)
    return d


def write_config(tmp_path, tokenizer_dir, **buffer):
    run = tmp_path / "run"
    cfg = {
        "name": "buftest",
        "run_dir": str(run),
        "model": {"path": str(tokenizer_dir)},
        "data": {"source": "tiny:arith", "num_train": 256, "difficulty": 2},
        "generator": {"responses_per_prompt": 4},  # the fakes' group size
        "buffer": {"groups_per_step": 4, "max_staleness": 1, **buffer},
        "tracking": {"aim": False},
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p, run


def start_buffer(cfg_path, repo, cli_env):
    log = open(Path(cfg_path).parent / "buffer.log", "ab")  # a file: a full pipe would block it
    return subprocess.Popen(
        [sys.executable, "-m", "dapo_async.cli", "buffer", str(cfg_path)],
        cwd=repo,
        env=cli_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def buffer_log(cfg_path):
    return (Path(cfg_path).parent / "buffer.log").read_text()


def wait_endpoint(run, proc, timeout=60):
    p = run / "endpoints" / "buffer"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if p.exists():
            return p.read_text()
        assert proc.poll() is None, "buffer exited at start"
        time.sleep(0.05)
    raise TimeoutError("buffer did not start")


def stop_buffer(proc):
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


def four_responses(seq, lease_id, prompt, tokens):
    """A scored group of generator "g" on ``lease_id``: 4 responses
    (generator.responses_per_prompt here) sharing ``tokens`` equally, rewards ±1."""
    import numpy as np

    n = len(tokens)
    return P.Group(
        "g", seq, lease_id, np.array(prompt, np.int32), np.full(4, n // 4, np.int32),
        np.asarray(tokens, np.int32), np.full(n, -0.5, np.float32), np.zeros(n, np.int32),
        np.array([1.0, -1.0, 1.0, -1.0], np.float32), np.array([1.0, 0.0, 1.0, 0.0], np.float32),
        np.zeros((4, 2), np.float32), np.zeros(4, np.uint8),
    )  # fmt: skip


def run_fakes(endpoint, tmp_path, num_gens, world, num_steps, start_step=0, during=None):
    """Fake generators and learner ranks with the run's keys (``<tmp_path>/run/keys``)."""
    keys = tmp_path / "run" / "keys"
    stop = tmp_path / "stop"
    stop.unlink(missing_ok=True)
    gens = [
        SPAWN.Process(
            target=fake_generator,
            args=(endpoint, f"fake{i}", tmp_path / f"gen{i}.json", stop, i, keys),
        )
        for i in range(num_gens)
    ]
    learners = [
        SPAWN.Process(
            target=fake_learner,
            args=(endpoint, r, world, num_steps, tmp_path / f"learner{r}.json", start_step, keys),
        )
        for r in range(world)
    ]
    for p in gens + learners:
        p.start()
    if during is not None:
        during()
    for p in learners:
        p.join(240)
        assert p.exitcode == 0
    stop.write_text("1")
    for p in gens:
        p.join(60)
        assert p.exitcode == 0
    acked = {}
    for i in range(num_gens):
        acked.update(json.loads((tmp_path / f"gen{i}.json").read_text())["acked"])
    trained = {}
    for r in range(world):
        for step, ids in json.loads((tmp_path / f"learner{r}.json").read_text()).items():
            trained.setdefault(int(step), []).extend(ids)
    return acked, trained


def test_200_steps_reconcile_exactly(tmp_path, tokenizer_dir, repo, cli_env):
    cfg_path, run = write_config(tmp_path, tokenizer_dir)
    buf = start_buffer(cfg_path, repo, cli_env)
    try:
        endpoint = wait_endpoint(run, buf)
        acked, trained = run_fakes(endpoint, tmp_path, num_gens=3, world=2, num_steps=200)
    finally:
        stop_buffer(buf)
    final = json.loads((run / "buffer_final.json").read_text())
    all_trained = [g for s in sorted(trained) for g in trained[s]]
    assert sorted(trained) == list(range(200))
    assert all(len(trained[s]) == 4 for s in trained)
    assert len(all_trained) == len(set(all_trained)), "a group was trained twice"
    stored = {g for g, st in acked.items() if st == "stored"}
    assert set(all_trained) <= stored
    c = final["counters"]
    # every produced group is trained once, dropped with a reason, or still waiting in the buffer
    dropped = sum(c["dropped"].values())
    waiting = final["ready"]  # qualified, never assigned to a step
    assert c["produced"] == len(stored)
    assert c["produced"] == len(all_trained) + dropped + waiting, (c, final, len(all_trained))
    # the last served step is trained by the learners but not yet confirmed to the buffer
    assert c["trained"] == len(all_trained) - final["untrained_assigned"]
    # a few dropped groups per step and reason are kept readable, never more than were dropped
    records = read_samples(run, "buffer")
    per_reason = Counter(r["reason"] for r in records)
    assert all(per_reason[why] <= c["dropped"].get(why, 0) for why in per_reason)
    per_step = Counter((r["step"], r["reason"]) for r in records)
    assert all(n <= 2 for n in per_step.values())  # tracking.samples_per_step
    assert (not c["dropped"]) or records


def test_sigkill_with_wal_loses_nothing(tmp_path, tokenizer_dir, repo, cli_env):
    port = free_port()
    cfg_path, run = write_config(tmp_path, tokenizer_dir, wal=True, port=port)
    holder = {"buf": start_buffer(cfg_path, repo, cli_env)}
    endpoint = wait_endpoint(run, holder["buf"])

    def kill_and_restart():
        time.sleep(3)  # mid-run
        holder["buf"].send_signal(signal.SIGKILL)
        holder["buf"].wait()
        (run / "endpoints" / "buffer").unlink()
        holder["buf"] = start_buffer(cfg_path, repo, cli_env)
        wait_endpoint(run, holder["buf"])

    try:
        acked, trained = run_fakes(
            endpoint, tmp_path, num_gens=2, world=1, num_steps=120, during=kill_and_restart
        )
    finally:
        stop_buffer(holder["buf"])
    final = json.loads((run / "buffer_final.json").read_text())
    all_trained = [g for s in sorted(trained) for g in trained[s]]
    assert sorted(trained) == list(range(120)), "served steps continue the sequence"
    assert len(all_trained) == len(set(all_trained)), "a group was trained twice"
    stored = {g for g, st in acked.items() if st == "stored"}
    c = final["counters"]
    dropped = sum(c["dropped"].values())
    waiting = final["ready"]
    # nothing acknowledged was lost across the SIGKILL
    assert c["produced"] == len(stored)
    assert c["produced"] == len(all_trained) + dropped + waiting


def test_fuzz_10k_malformed_messages(tmp_path, tokenizer_dir, repo, cli_env):
    import random

    cfg_path, run = write_config(tmp_path, tokenizer_dir)
    buf = start_buffer(cfg_path, repo, cli_env)
    try:
        endpoint = wait_endpoint(run, buf)
        ctx = zmq.Context()
        # an authenticated but broken peer: without the run's keys nothing would get through
        keys = run / "keys"
        bad = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys, role="generator")
        good = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys, role="generator")
        rng = random.Random(0)
        valid = [bytes(f) for f in P.encode(P.Hello("g", 1, "hf"))]
        sent_ok = 0
        for i in range(10_000):
            kind = i % 4
            if kind == 0:
                frames = [rng.randbytes(rng.randint(0, 64))]
            elif kind == 1:
                frames = [valid[0][: rng.randint(0, len(valid[0]) - 1)]]
            elif kind == 2:
                frames = [valid[0], b"extra"]
            else:
                frames = [bytes(b ^ 0xFF if j == 3 else b for j, b in enumerate(valid[0]))]
            bad.send_multipart(frames)
            if i % 100 == 0:  # valid traffic interleaved
                reply = T.request(good, P.Hello(f"good{i}", 1, "hf"), timeout_s=10)
                assert isinstance(reply, P.Ack)
                sent_ok += 1
        reply = T.request(good, P.LeaseRequest("good0", 1), timeout_s=10)
        assert isinstance(reply, P.LeaseGrant) and len(reply.prompt_ids) == 1
        bad.close(linger=0)
        good.close(linger=0)
        ctx.term()
        assert buf.poll() is None
    finally:
        stop_buffer(buf)
    final = json.loads((run / "buffer_final.json").read_text())
    assert sum(final["malformed"].values()) >= 10_000 - 2600  # kind 3 may stay valid msgpack
    assert sent_ok == 100


def test_poison_group_on_a_real_lease_is_rejected_and_the_buffer_serves_on(
    tmp_path, tokenizer_dir, repo, cli_env
):
    """A group that passes every protocol check but holds a token id far outside the model's
    vocabulary (it would crash the learner's embedding lookup) is refused with a reason on its
    real lease; the prompt is leased again and a good group on it is stored."""
    import numpy as np

    model = tmp_path / "model"
    model.mkdir()
    for f in Path(tokenizer_dir).iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    (model / "config.json").write_text(json.dumps({"vocab_size": 128}))
    cfg_path, run = write_config(tmp_path, model)
    buf = start_buffer(cfg_path, repo, cli_env)
    try:
        endpoint = wait_endpoint(run, buf)
        ctx = zmq.Context()
        sock = T.connect_client(ctx, zmq.DEALER, endpoint, run / "keys", role="generator")
        assert isinstance(T.request(sock, P.Hello("g", 1, "hf"), timeout_s=10), P.Ack)
        grant = T.request(sock, P.LeaseRequest("g", 1), timeout_s=10)
        (lease_id,), (prompt,) = grant.prompt_ids, grant.prompts

        def make(seq, lease, first_token):
            tokens = np.arange(8, dtype=np.int32) + 10
            tokens[0] = first_token
            return four_responses(seq, lease, prompt, tokens)

        names = ["correct", "overlong"]
        ack = T.request(
            sock, P.ScoredGroups(P.GroupBatch.from_groups([make(0, lease_id, 1_000_000)], names)),
            timeout_s=10,
        )  # fmt: skip
        assert ack.statuses == ["rejected:token_range"]
        again = T.request(sock, P.LeaseRequest("g", 1), timeout_s=10)
        assert again.prompts == [prompt]  # the poisoned prompt is handed out again
        ack = T.request(
            sock, P.ScoredGroups(P.GroupBatch.from_groups([make(1, again.prompt_ids[0], 10)], names)),
            timeout_s=10,
        )  # fmt: skip
        assert ack.statuses == ["stored"]
        sock.close(linger=0)
        ctx.term()
        assert buf.poll() is None
    finally:
        stop_buffer(buf)
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["counters"]["rejected"] == {"token_range": 1}
    assert final["counters"]["produced"] == 1 and final["stored"] == 1
    (dropped,) = read_samples(run, "buffer")  # readable: `dapo-async inspect --dropped`
    assert dropped["reason"] == "rejected:token_range" and dropped["prompt_tokens"] == prompt
    assert dropped["responses"][0]["tokens"][0] == 1_000_000


def test_buffer_authenticates_every_client_and_each_role_sends_only_its_messages(
    tmp_path, tokenizer_dir, repo, cli_env
):
    """By default the buffer makes the run's CurveZMQ keys (secrets 0600): a local client without
    them, or with keys of another run, gets no answer and changes nothing; a generator's key
    cannot send the learner's messages (a forged checkpoint notice would wedge the run); the
    learner's key can."""
    cfg_path, run = write_config(tmp_path, tokenizer_dir)
    buf = start_buffer(cfg_path, repo, cli_env)
    keys = run / "keys"
    other = tmp_path / "other-keys"
    ctx = zmq.Context()
    try:
        endpoint = wait_endpoint(run, buf)
        T.generate_keys(other)  # another run's keys; the intruder knows our server's public key
        (other / "server.key").write_bytes((keys / "server.key").read_bytes())
        assert (keys / "generator.key_secret").stat().st_mode & 0o777 == 0o600
        assert keys.stat().st_mode & 0o777 == 0o700
        for stranger in (
            T.connect_client(ctx, zmq.DEALER, endpoint),
            T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=other, role="generator"),
        ):
            with pytest.raises(T.RecvTimeout):
                T.request(stranger, P.Hello("intruder", 1, "hf"), timeout_s=2)
            stranger.close(linger=0)
        gen = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys, role="generator")
        assert isinstance(T.request(gen, P.Hello("g", 1, "hf"), timeout_s=10), P.Ack)
        T.send(gen, P.CheckpointNotice(10**9, "forged"))
        with pytest.raises(T.RecvTimeout):
            T.request(gen, P.BatchRequest(0, 1, 0), timeout_s=2)
        learner = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys, role="learner")
        reply = T.request(learner, P.BatchRequest(0, 1, 0), timeout_s=10)
        assert isinstance(reply, P.Batch) and reply.step == 0  # not refused as checkpointed
        for s in (gen, learner):
            s.close(linger=0)
    finally:
        ctx.term()
        stop_buffer(buf)
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["malformed"] == {"forbidden_checkpoint_notice": 1, "forbidden_batch_request": 1}
    assert "intruder" not in buffer_log(cfg_path)


# Reconnects a test client makes before it gives up on an ack (a generator never gives up).
RESENDS = 3


def test_a_frame_beyond_the_configs_bound_never_reaches_the_buffer(
    tmp_path, tokenizer_dir, repo, cli_env
):
    """A 239 MB group on a real lease (it used to be decoded and stored: RSS +1 GB, WAL +240 MB)
    is cut off by ZeroMQ when its length is read: the bound comes from the config
    (``buffer.checks.max_message_bytes``, ~1 MiB here). Nothing is counted, the lease stays
    its holder's, and a normal group on it is stored after the sender reconnects."""
    import numpy as np

    cfg_path, run = write_config(tmp_path, tokenizer_dir)
    buf = start_buffer(cfg_path, repo, cli_env)
    try:
        endpoint = wait_endpoint(run, buf)
        ctx = zmq.Context()

        def client():  # with its id as routing id, as a generator connects
            return T.connect_client(
                ctx, zmq.DEALER, endpoint, run / "keys", identity=b"g", role="generator"
            )

        sock = client()
        assert isinstance(T.request(sock, P.Hello("g", 1, "hf"), timeout_s=10), P.Ack)
        grant = T.request(sock, P.LeaseRequest("g", 1), timeout_s=10)
        (lease_id,), (prompt,) = grant.prompt_ids, grant.prompts

        def make(seq, per_response):
            return four_responses(seq, lease_id, prompt, np.full(4 * per_response, 10))

        names = ["correct", "overlong"]
        huge = P.ScoredGroups(P.GroupBatch.from_groups([make(0, 5_000_000)], names))
        assert sum(len(memoryview(f).cast("B")) for f in P.encode(huge)) > 239e6
        with pytest.raises(T.RecvTimeout):
            T.request(sock, huge, timeout_s=5)
        del huge
        sock.close(linger=0)
        normal = P.ScoredGroups(P.GroupBatch.from_groups([make(1, 2)], names))
        for attempt in range(RESENDS):  # the generator's reconnect, resending until acked
            sock = client()
            try:
                ack = T.request(sock, normal, timeout_s=10)
                break
            except T.RecvTimeout:
                # under load the buffer may not yet have dropped the cut-off connection that
                # holds the routing id "g", and refuses the new one carrying it: a generator
                # resends an unacked group (the buffer dedupes by (id, seq))
                sock.close(linger=0)
                assert attempt + 1 < RESENDS, "the normal group was never acked"
        assert ack.statuses == ["stored"]
        sock.close(linger=0)
        ctx.term()
        assert buf.poll() is None
    finally:
        stop_buffer(buf)
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["counters"]["rejected"] == {} and final["counters"]["produced"] == 1


def test_a_second_connection_cannot_act_for_a_live_generator(
    tmp_path, tokenizer_dir, repo, cli_env
):
    """The insider with the generators' key: a second connection claiming the first's id
    sends a group on its (guessable) lease. It used to be stored — the real generator's work
    refused, the impostor's trained. Now the id belongs to the connection that introduced it:
    the impostor gets no answer, the real group is stored, and the impostor is counted."""
    import numpy as np

    cfg_path, run = write_config(tmp_path, tokenizer_dir)
    buf = start_buffer(cfg_path, repo, cli_env)
    try:
        endpoint = wait_endpoint(run, buf)
        ctx = zmq.Context()
        real, impostor = (
            T.connect_client(ctx, zmq.DEALER, endpoint, run / "keys", role="generator")
            for _ in range(2)
        )
        assert isinstance(T.request(real, P.Hello("g", 1, "hf"), timeout_s=10), P.Ack)
        grant = T.request(real, P.LeaseRequest("g", 1), timeout_s=10)
        (lease_id,), (prompt,) = grant.prompt_ids, grant.prompts

        def make(seq, token):  # 4 responses of 2 tokens
            return four_responses(seq, lease_id, prompt, np.full(8, token))

        names = ["correct", "overlong"]
        forged = P.ScoredGroups(P.GroupBatch.from_groups([make(0, 11)], names))
        with pytest.raises(T.RecvTimeout):
            T.request(impostor, forged, timeout_s=3)
        with pytest.raises(T.RecvTimeout):  # nor can it lease in the real one's name
            T.request(impostor, P.LeaseRequest("g", 4), timeout_s=3)
        ack = T.request(
            real, P.ScoredGroups(P.GroupBatch.from_groups([make(0, 12)], names)), timeout_s=10
        )
        assert ack.statuses == ["stored"]
        for s in (real, impostor):
            s.close(linger=0)
        ctx.term()
    finally:
        stop_buffer(buf)
    final = json.loads((run / "buffer_final.json").read_text())
    assert final["counters"]["produced"] == 1 and final["counters"]["leased"] == 1
    assert final["malformed"]["impersonation"] == 2


def test_a_batch_request_is_held_until_its_step_is_ready(tmp_path, tokenizer_dir, repo, cli_env):
    """Long polling (buffer/held.py): a learner that asks for a step before its groups are in
    gets no "not ready" answer; its batch comes, without asking again, with the groups that
    complete the step; a step that stays empty is answered "not ready, ask again at once" once
    the request was held HOLD_S."""
    from fakes import NAMES, make_group

    from dapo_async.buffer.held import HOLD_S

    cfg_path, run = write_config(tmp_path, tokenizer_dir)
    buf = start_buffer(cfg_path, repo, cli_env)
    keys = run / "keys"
    ctx = zmq.Context()
    try:
        endpoint = wait_endpoint(run, buf)
        gen = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys, role="generator")
        learner = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys, role="learner")
        assert isinstance(T.request(gen, P.Hello("g", 0, "fake"), timeout_s=10), P.Ack)
        grant = T.request(gen, P.LeaseRequest("g", 4), timeout_s=10)
        assert len(grant.prompt_ids) == 4  # a step's worth (groups_per_step 4)
        T.send(learner, P.BatchRequest(0, 1, 0))
        with pytest.raises(T.RecvTimeout):  # held, not answered "not ready"
            T.recv(learner, timeout_s=HOLD_S / 2)
        leased = zip(grant.prompt_ids, grant.prompts)
        groups = [make_group("g", i, lid, p, 0, [1, 0, 1, 0]) for i, (lid, p) in enumerate(leased)]
        ack = T.request(gen, P.ScoredGroups(P.GroupBatch.from_groups(groups, NAMES)), timeout_s=10)
        assert ack.statuses == ["stored"] * 4
        reply = T.recv(learner, timeout_s=10)  # the held request's answer
        assert isinstance(reply, P.Batch) and reply.ready and reply.step == 0
        assert len(reply.batch) == 4
        t0 = time.monotonic()
        T.send(learner, P.BatchRequest(0, 1, 1))  # nothing for step 1
        reply = T.recv(learner, timeout_s=10)
        assert isinstance(reply, P.Batch) and not reply.ready and reply.step == 1
        assert reply.wait_s == 0.0 and time.monotonic() - t0 >= HOLD_S
        for s in (gen, learner):
            s.close(linger=0)
    finally:
        ctx.term()
        stop_buffer(buf)
