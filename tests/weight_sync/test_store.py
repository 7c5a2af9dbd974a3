"""The weight-sync store over real ZeroMQ sockets: the operations torch.distributed needs,
CurveZMQ with the run's keys (a client without them, or with another run's, gets nothing),
bounded values, and a gloo weight-sync round whose rendezvous runs through it."""

import threading
from datetime import timedelta

import pytest
import torch

from dapo_async.config import load_config
from dapo_async.keys import generate_keys
from dapo_async.weight_sync.store import KeyValues, RemoteStore, StoreError, StoreServer

# Short: a refused client must fail fast, not wait out the production timeout.
REFUSED_TIMEOUT_S = 2.0


@pytest.fixture
def keyed_server(tmp_path):
    keys = tmp_path / "keys"
    generate_keys(keys)
    server = StoreServer("127.0.0.1", 0, keys_dir=keys)
    yield server, keys
    server.close()


def test_operations_through_an_authenticated_connection(keyed_server):
    server, keys = keyed_server
    store = RemoteStore(f"127.0.0.1:{server.port}", keys, timeout_s=5.0)
    try:
        store.set("a", b"\x00\x01\xff")
        assert store.get("a") == b"\x00\x01\xff"
        assert store.add("n", 2) == 2 and store.add("n", 3) == 5
        assert store.get("n") == b"5"
        assert store.check(["a", "n"]) and not store.check(["a", "missing"])
        assert store.delete_key("a") and not store.check(["a"])
        # peek: one request, None for a missing key (get would wait for it)
        sent = store._next_id
        assert store.peek("missing") is None and store.peek("n") == b"5"
        assert store._next_id - sent == 2
        # a get waits for the key; another client sets it meanwhile
        threading.Timer(0.3, lambda: server.local().set("late", "x")).start()
        assert store.get("late") == b"x"
        store.set_timeout(timedelta(seconds=0.3))
        with pytest.raises(StoreError, match="not set within"):
            store.get("never")
    finally:
        store.close()


@pytest.mark.parametrize("who", ["no keys", "another run's keys"])
def test_a_client_without_the_runs_keys_gets_nothing(keyed_server, tmp_path, who):
    server, _ = keyed_server
    server.local().set("latest", "[0, 0]")
    keys = None
    if who == "another run's keys":
        keys = tmp_path / "other"
        generate_keys(keys)
    store = RemoteStore(f"127.0.0.1:{server.port}", keys, timeout_s=REFUSED_TIMEOUT_S)
    try:
        with pytest.raises(StoreError, match="no answer"):
            store.check(["latest"])
        with pytest.raises(StoreError, match="no answer"):
            store.set("join/1", "intruder")
    finally:
        store.close()
    assert server.local().check(["latest"]) and not server.local().check(["join/1"])


def test_values_and_key_counts_are_bounded(keyed_server):
    server, keys = keyed_server
    server.kv.max_value_bytes = 100
    store = RemoteStore(f"127.0.0.1:{server.port}", keys, timeout_s=5.0)
    try:
        with pytest.raises(StoreError, match="over 100 bytes"):
            store.set("big", b"x" * 101)
        store.set("ok", b"x" * 100)  # the store still serves after a refusal
        assert store.get("ok") == b"x" * 100
    finally:
        store.close()
    kv = KeyValues(max_keys=2)
    kv.apply("set", ["a"], b"1")
    kv.apply("set", ["b"], b"1")
    kv.apply("set", ["a"], b"2")  # overwriting is not a new key
    with pytest.raises(StoreError, match="store full"):
        kv.apply("set", ["c"], b"1")


def test_a_plain_store_refuses_a_public_address():
    from dapo_async.keys import SecurityError

    with pytest.raises(SecurityError, match="refusing to bind"):
        StoreServer("0.0.0.0", 0, keys_dir=None)


def test_weight_sync_round_with_the_runs_keys(tmp_path):
    """Publisher and receiver with the run's keys: the group forms over the authenticated store
    and the weights arrive intact."""
    from dapo_async.weight_sync.dist import DistWeightPublisher
    from dapo_async.weight_sync.dist_receiver import DistWeightReceiver

    keys = tmp_path / "keys"
    generate_keys(keys)
    ws = load_config(None, ["weight_sync.timeout_s=20"]).weight_sync
    pub = DistWeightPublisher(ws, None, host="127.0.0.1", keys_dir=keys)
    state = {"w": torch.randn(64, 3), "b": torch.arange(7.0)}
    got = {}

    def receive():
        rec = DistWeightReceiver(ws, None, "g0", endpoint=pub.endpoint, keys_dir=keys)
        try:
            for _ in range(600):
                out = rec.poll()
                if out is not None:
                    got["state"] = {k: v.clone() for k, v in out[0].items()}
                    got["version"] = out[1]
                    return
                threading.Event().wait(0.05)
        finally:
            rec.close()

    t = threading.Thread(target=receive)
    t.start()
    try:
        while int(pub.store.get("joins")) < 1:
            threading.Event().wait(0.05)
        pub.publish(state, 3)
        t.join(timeout=60)
    finally:
        pub.close()
    assert got["version"] == 3
    assert all(torch.equal(got["state"][k], state[k]) for k in state)


def test_a_store_that_goes_away_fails_at_once_not_after_the_timeout(keyed_server):
    """A generator whose learner stopped must not hang in a heartbeat for the whole timeout."""
    import time

    server, keys = keyed_server
    store = RemoteStore(f"127.0.0.1:{server.port}", keys, timeout_s=20.0)
    try:
        store.set("alive/g0", "1")
        server.close()
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="went away"):
            for _ in range(100):  # the disconnect is noticed within a few polls
                store.set("alive/g0", "2")
                time.sleep(0.05)
        assert time.monotonic() - t0 < 10.0
    finally:
        store.close()


def test_bad_messages_are_counted_and_the_store_keeps_serving(keyed_server):
    import zmq

    from dapo_async import protocol, transport

    server, keys = keyed_server
    ctx = zmq.Context()
    sock = transport.connect_client(
        ctx, zmq.DEALER, f"tcp://127.0.0.1:{server.port}", keys_dir=keys, role="generator"
    )
    try:
        transport.send(sock, protocol.Hello("g0", 1, "hf"))  # a message kind the store ignores
        sock.send_multipart([b"\x00garbage"])  # not a protocol message at all
        # base64 that does not decode: refused with a reason, not a crash
        reply = transport.request(sock, protocol.StoreRequest(1, "set", ["k"], "@@@"), 5.0)
        assert isinstance(reply, protocol.StoreReply) and reply.error
    finally:
        sock.close(linger=0)
        ctx.term()
    assert server.malformed == 2
    store = RemoteStore(f"127.0.0.1:{server.port}", keys, timeout_s=5.0)
    try:
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        store.close()
