import logging
import multiprocessing as mp

import numpy as np
import pytest
import zmq

from dapo_async import protocol as P
from dapo_async import transport as T

SPAWN = mp.get_context("spawn")


def _client(endpoint, keys_dir, n_groups, result):
    """Child process: hello, then scored groups; expects one ack per message."""
    ctx = zmq.Context()
    sock = T.connect_client(ctx, zmq.DEALER, endpoint, keys_dir=keys_dir)
    try:
        reply = T.request(sock, P.Hello("gen-7", 1, "hf"), timeout_s=5)
        assert isinstance(reply, P.Ack)
        rng = np.random.default_rng(0)
        groups = []
        for seq in range(n_groups):
            lens = np.array([3, 2], np.int32)
            groups.append(
                P.Group(
                    "gen-7",
                    seq,
                    seq,
                    np.array([1, 2], np.int32),
                    lens,
                    rng.integers(0, 9, 5).astype(np.int32),
                    -rng.random(5).astype(np.float32),
                    np.zeros(5, np.int32),
                    np.array([1, -1], np.float32),
                    np.array([1, 0], np.float32),
                    np.zeros((2, 0), np.float32),
                    np.zeros(2, np.uint8),
                )
            )
        reply = T.request(
            sock, P.ScoredGroups(batch=P.GroupBatch.from_groups(groups, [])), timeout_s=5
        )
        result.put(("ok", reply.statuses))
    except Exception as e:  # report to the parent instead of dying silently
        result.put(("error", f"{type(e).__name__}: {e}"))
    finally:
        sock.close(linger=0)
        ctx.term()


def _serve(server, n_messages, timeout_s=10):
    got = []
    for _ in range(n_messages):
        ident, msg = T.recv_routed(server.socket, timeout_s=timeout_s)
        got.append(msg)
        if isinstance(msg, P.Hello):
            T.send_routed(server.socket, ident, P.Ack([], []))
        elif isinstance(msg, P.ScoredGroups):
            T.send_routed(
                server.socket, ident, P.Ack(msg.batch.group_ids(), ["stored"] * len(msg.batch))
            )
    return got


def _run_pair(keys_dir=None, client_keys=None):
    ctx = zmq.Context()
    server = T.bind_server(ctx, zmq.ROUTER, "127.0.0.1", 0, keys_dir=keys_dir)
    assert server.endpoint.startswith("tcp://127.0.0.1:")
    result = SPAWN.Queue()
    proc = SPAWN.Process(target=_client, args=(server.endpoint, client_keys or keys_dir, 4, result))
    proc.start()
    try:
        got = _serve(server, 2)
        status = result.get(timeout=20)
    finally:
        proc.join(20)
        server.close()
        ctx.term()
    return got, status


def test_two_processes_over_loopback():
    got, status = _run_pair()
    assert isinstance(got[0], P.Hello) and got[0].generator_id == "gen-7"
    assert isinstance(got[1], P.ScoredGroups) and len(got[1].batch) == 4
    assert status == ("ok", ["stored"] * 4)


def test_curve_pair_works(tmp_path):
    keys = tmp_path / "keys"
    T.generate_keys(keys)
    got, status = _run_pair(keys_dir=keys)
    assert status[0] == "ok" and len(got) == 2


def test_curve_client_with_wrong_key_is_refused(tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    T.generate_keys(good)
    T.generate_keys(bad)
    # the intruder knows the server's public key but holds an unauthorised client key
    (bad / "server.key").write_bytes((good / "server.key").read_bytes())
    ctx = zmq.Context()
    server = T.bind_server(ctx, zmq.ROUTER, "127.0.0.1", 0, keys_dir=good)
    result = SPAWN.Queue()
    proc = SPAWN.Process(target=_client, args=(server.endpoint, bad, 1, result))
    proc.start()
    try:
        with pytest.raises(T.RecvTimeout):
            T.recv_routed(server.socket, timeout_s=3)
        status = result.get(timeout=20)
    finally:
        proc.join(20)
        server.close()
        ctx.term()
    assert status[0] == "error" and "RecvTimeout" in status[1]


def test_public_bind_without_keys_is_refused():
    ctx = zmq.Context()
    with pytest.raises(T.SecurityError, match="curve_keys_dir"):
        T.bind_server(ctx, zmq.ROUTER, "0.0.0.0", 0)
    ctx.term()


def test_missing_keys_give_clear_error(tmp_path):
    ctx = zmq.Context()
    with pytest.raises(T.SecurityError, match="dapo-async keys"):
        T.bind_server(ctx, zmq.ROUTER, "127.0.0.1", 0, keys_dir=tmp_path)
    ctx.term()


def test_loopback_detection():
    assert T.is_loopback("127.0.0.1") and T.is_loopback("::1") and T.is_loopback("localhost")
    assert (
        not T.is_loopback("0.0.0.0")
        and not T.is_loopback("10.0.0.1")
        and not T.is_loopback("example.org")
    )


def test_bad_message_counted_not_fatal():
    ctx = zmq.Context()
    server = T.bind_server(ctx, zmq.ROUTER)
    client = T.connect_client(ctx, zmq.DEALER, server.endpoint)
    try:
        client.send_multipart([b"\x93garbage", b"x"])
        T.send(client, P.Heartbeat("gen-1", 0))
        _, first = T.recv_routed(server.socket, timeout_s=5)
        _, second = T.recv_routed(server.socket, timeout_s=5)
        assert isinstance(first, P.ProtocolError)
        assert isinstance(second, P.Heartbeat)
    finally:
        client.close(linger=0)
        server.close()
        ctx.term()


def test_oversized_message_disconnects_sender():
    ctx = zmq.Context()
    server = T.bind_server(ctx, zmq.ROUTER, max_message_bytes=1024)
    client = T.connect_client(ctx, zmq.DEALER, server.endpoint)
    try:
        client.send_multipart([b"x" * 4096])
        with pytest.raises(T.RecvTimeout):
            T.recv_routed(server.socket, timeout_s=1)
    finally:
        client.close(linger=0)
        server.close()
        ctx.term()


def test_insecure_opt_out_is_logged(caplog, monkeypatch):
    # Exercise the opt-out path without listening beyond loopback: the check runs before bind,
    # so a loopback address reported as non-loopback takes the same branch.
    monkeypatch.setattr(T, "is_loopback", lambda host: False)
    ctx = zmq.Context()
    with caplog.at_level(logging.WARNING):
        server = T.bind_server(ctx, zmq.ROUTER, "127.0.0.1", 0, insecure_allow_public_bind=True)
    server.close()
    ctx.term()
    assert "INSECURE" in caplog.text
