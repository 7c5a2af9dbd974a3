"""The weight-sync store: the key-value rendezvous of the weight-sync group, served by learner
rank 0 over an authenticated ZeroMQ socket.

torch's ``TCPStore`` has no authentication (and binds every interface whatever host it is
given): whoever reaches its port can read the rendezvous, join the group and be sent the
weights, or wedge it. This store speaks ``protocol.StoreRequest``/``StoreReply`` through
``transport`` with the run's CurveZMQ keys, so only holders of one of the run's client keys get
an answer; torch.distributed builds its groups on it as on any ``Store`` (a Python subclass)::

    learner rank 0                                      generator (each vLLM worker too)
    StoreServer: thread ─ ROUTER (CurveZMQ) ◄────────── RemoteStore (DEALER): receiver, heartbeat
       └─ KeyValues ◄─ LocalStore (the publisher's own operations, no socket)

The weights themselves travel on the group's own connections (gloo TCP pairs, NCCL), whose
addresses are exchanged through this store; every bucket's digest is posted here too, so a
receiver rejects any bucket that did not come from the publisher (``dist_receiver``).
Values travel base64-encoded in the msgpack header; sizes are bounded (``MAX_VALUE_BYTES``,
``MAX_KEYS``). ``get`` and ``wait`` poll until the key exists or the store's timeout passes.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from datetime import timedelta

import torch.distributed as dist
import zmq
from zmq.utils.monitor import recv_monitor_message

from dapo_async import protocol, transport

log = logging.getLogger(__name__)

# Largest value one key may hold: a round's manifest lists every tensor (about 80 bytes each;
# a 70B model's is under 100 KB), far below this.
MAX_VALUE_BYTES = 16 << 20
# Request size limit at the socket: a value, base64-encoded (4/3), plus the header.
MAX_REQUEST_BYTES = MAX_VALUE_BYTES * 4 // 3 + (64 << 10)
# Keys the store holds at most (rendezvous entries, heartbeats, the last rounds' manifests).
MAX_KEYS = 100_000
# A waiting get polls at first every POLL_MIN_S, backing off to POLL_MAX_S (rendezvous keys
# appear within milliseconds; digests within a bucket transfer).
POLL_MIN_S = 0.001
POLL_MAX_S = 0.02
# A client waiting for a reply looks at its link this often (a dropped link fails at once).
LINK_POLL_S = 0.05
# Monitor events that mean the link is up: connected (plain) or CurveZMQ handshake done.
LINK_UP = zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
# The server thread checks its stop flag this often.
SERVER_POLL_MS = 100
# Timeout of store operations unless the caller sets another (local-network round trips).
DEFAULT_TIMEOUT_S = 30.0


class StoreError(RuntimeError):
    """A store operation failed: no answer within the timeout, or the store refused it."""


class KeyValues:
    """The store's data, shared by the server thread and the learner's own operations."""

    def __init__(self, max_keys: int = MAX_KEYS, max_value_bytes: int = MAX_VALUE_BYTES):
        self.max_keys = max_keys
        self.max_value_bytes = max_value_bytes
        self._data: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def apply(self, op: str, keys: list[str], value: bytes) -> tuple[bool, bytes]:
        """One operation (``protocol.STORE_OPS``) → (found, value); StoreError if refused."""
        with self._lock:
            if op == "get":
                got = self._data.get(keys[0])
                return got is not None, got or b""
            if op == "check":
                return all(k in self._data for k in keys), b""
            if op == "delete":
                return self._data.pop(keys[0], None) is not None, b""
            if op == "add":
                new = int(self._data.get(keys[0], b"0")) + int(value)
                value = str(new).encode()
            if len(value) > self.max_value_bytes:
                raise StoreError(f"value of {keys[0]!r} over {self.max_value_bytes} bytes")
            if keys[0] not in self._data and len(self._data) >= self.max_keys:
                raise StoreError(f"store full ({self.max_keys} keys)")
            self._data[keys[0]] = value
            return True, value if op == "add" else b""

    def __len__(self) -> int:
        return len(self._data)


def _as_bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class _KVStore(dist.Store):
    """A ``torch.distributed.Store`` over ``_apply``; waits poll (see the module doc)."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__()
        self.timeout_s = timeout_s

    def _apply(self, op: str, keys: list[str], value: bytes = b"") -> tuple[bool, bytes]:
        raise NotImplementedError

    def set_timeout(self, timeout: timedelta) -> None:
        self.timeout_s = timeout.total_seconds()

    def set(self, key: str, value) -> None:
        self._apply("set", [key], _as_bytes(value))

    def get(self, key: str) -> bytes:
        self._wait_for([key], self.timeout_s)
        value = self.peek(key)
        if value is None:  # deleted between the wait and the read
            raise StoreError(f"weight-sync store: key {key!r} vanished")
        return value

    def add(self, key: str, amount: int) -> int:
        return int(self._apply("add", [key], str(int(amount)).encode())[1])

    def check(self, keys: list[str]) -> bool:
        return self._apply("check", list(keys))[0]

    def peek(self, key: str) -> bytes | None:
        """``key``'s value, or None when it is not set: one request (``check`` then ``get``
        take two, and ``get`` waits for the key)."""
        found, value = self._apply("get", [key])
        return value if found else None

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._wait_for(list(keys), self.timeout_s if timeout is None else timeout.total_seconds())

    def delete_key(self, key: str) -> bool:
        return self._apply("delete", [key])[0]

    def compare_set(self, key: str, expected, desired) -> bytes:
        raise StoreError("the weight-sync store has no compare_set (nothing here needs it)")

    def _wait_for(self, keys: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        pause = POLL_MIN_S
        while not self._apply("check", keys)[0]:
            if time.monotonic() > deadline:
                raise StoreError(f"weight-sync store: {keys} not set within {timeout_s:g}s")
            time.sleep(pause)
            pause = min(pause * 2, POLL_MAX_S)


class LocalStore(_KVStore):
    """The server process's own view of its ``KeyValues`` (no socket)."""

    def __init__(self, kv: KeyValues, timeout_s: float = DEFAULT_TIMEOUT_S):
        super().__init__(timeout_s)
        self.kv = kv

    def _apply(self, op, keys, value=b""):
        return self.kv.apply(op, keys, value)


class RemoteStore(_KVStore):
    """A member's connection to the store at ``host:port``, authenticated with the key pair of
    ``role`` in ``keys_dir`` (plain ZeroMQ without keys: loopback or a trusted network).

    ZeroMQ hides a vanished peer (a DEALER queues and reconnects), so the socket's monitor is
    watched: once the store has been reached, a disconnect fails the pending and every later
    operation at once (until a reconnect), as a closed TCP connection would, instead of after
    the timeout: a generator whose learner stopped must not hang in a heartbeat."""

    def __init__(
        self,
        endpoint: str,
        keys_dir=None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        role: str = "generator",
    ):
        super().__init__(timeout_s)
        host, port = endpoint.rsplit(":", 1)
        addr = f"[{host}]" if ":" in host and not host.startswith("[") else host
        self.endpoint = f"tcp://{addr}:{port}"
        self._ctx = zmq.Context.instance()
        self._sock = transport.connect_client(
            self._ctx, zmq.DEALER, self.endpoint, keys_dir=keys_dir, role=role
        )
        self._monitor = self._sock.get_monitor_socket(LINK_UP | zmq.EVENT_DISCONNECTED)
        self._reached = False  # a reply came: the link (and its keys) worked
        self._gone = False  # the link's last event was a disconnect
        self._lock = threading.Lock()
        self._next_id = 0

    def _watch_link(self) -> None:
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)["event"]
            self._gone = event == zmq.EVENT_DISCONNECTED

    def _check_link(self, op: str) -> None:
        self._watch_link()
        if self._reached and self._gone:
            raise StoreError(f"the weight-sync store at {self.endpoint} went away ({op})")

    def _apply(self, op, keys, value=b""):
        with self._lock:
            self._check_link(op)
            self._next_id += 1
            req = protocol.StoreRequest(self._next_id, op, keys, base64.b64encode(value).decode())
            deadline = time.monotonic() + self.timeout_s
            reply = self._exchange(req, deadline)
        if reply.error:
            raise StoreError(f"weight-sync store refused {op} {keys[0]!r}: {reply.error}")
        return reply.found, base64.b64decode(reply.value)

    def _exchange(self, req: protocol.StoreRequest, deadline: float) -> protocol.StoreReply:
        """Send ``req`` and wait for its reply (a reply to an earlier request that timed out
        may still be queued: skipped), watching the link meanwhile."""
        while True:  # a DEALER without a connected peer refuses a non-blocking send
            try:
                transport.send(self._sock, req, flags=zmq.NOBLOCK)
                break
            except zmq.Again:
                self._wait_or_fail(req.op, deadline, zmq.POLLOUT)
        while True:
            if self._wait_or_fail(req.op, deadline, zmq.POLLIN):
                reply = transport.recv(self._sock, timeout_s=0)
                self._reached = True
                if isinstance(reply, protocol.StoreReply) and reply.request_id == req.request_id:
                    return reply

    def _wait_or_fail(self, op: str, deadline: float, want: int) -> bool:
        """Wait up to ``LINK_POLL_S`` for the socket to be ready for ``want``; StoreError when the
        link drops or the deadline passes."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise StoreError(
                f"no answer from the weight-sync store at {self.endpoint} within "
                f"{self.timeout_s:g}s (is learner rank 0 up, and are this host's keys the "
                "run's?)"
            )
        poller = zmq.Poller()
        poller.register(self._sock, want)
        poller.register(self._monitor, zmq.POLLIN)
        ready = dict(poller.poll(int(min(left, LINK_POLL_S) * 1000)))
        self._check_link(op)
        return bool(ready.get(self._sock, 0) & want)

    def close(self) -> None:
        with self._lock:
            self._sock.disable_monitor()
            self._monitor.close(linger=0)
            self._sock.close(linger=0)


class StoreServer:
    """Serves a ``KeyValues`` on ``host:port`` (port 0: a free one) from a thread of its own.
    With ``keys_dir`` only the run's client keys are answered (CurveZMQ); without, a
    non-loopback ``host`` needs ``allow_unauthenticated_network``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        keys_dir=None,
        allow_unauthenticated_network: bool = False,
    ):
        self.kv = KeyValues()
        self.keys_dir = keys_dir
        self.refused = 0  # requests from keys that are no client role of the run
        self.malformed = 0
        self._ctx = zmq.Context()
        self.server = transport.bind_server(
            self._ctx,
            zmq.ROUTER,
            host,
            port,
            keys_dir=keys_dir,
            insecure_allow_public_bind=allow_unauthenticated_network,
            max_message_bytes=MAX_REQUEST_BYTES,
        )
        self.port = int(self.server.endpoint.rsplit(":", 1)[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wsync-store", daemon=True)
        self._thread.start()

    def local(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> LocalStore:
        return LocalStore(self.kv, timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._serve_one()
            except zmq.ZMQError as e:  # a peer's reply could not be queued: serve the others
                if self._stop.is_set():
                    return
                log.warning("weight-sync store: %s", e)

    def _serve_one(self) -> None:
        sock = self.server.socket
        if not sock.poll(SERVER_POLL_MS, zmq.POLLIN):
            return
        identity, user, msg = transport.recv_routed_user(sock, timeout_s=None)
        if self.keys_dir and self.server.role_of(user) is None:
            self.refused += 1
            return
        if not isinstance(msg, protocol.StoreRequest):
            self.malformed += 1
            return
        transport.send_routed(sock, identity, self._reply(msg))

    def _reply(self, msg: protocol.StoreRequest) -> protocol.StoreReply:
        try:
            value = base64.b64decode(msg.value, validate=True)
            found, out = self.kv.apply(msg.op, msg.keys, value)
        except (StoreError, ValueError) as e:  # too large, store full, bad base64 or number
            return protocol.StoreReply(msg.request_id, False, error=str(e)[:200])
        return protocol.StoreReply(msg.request_id, found, base64.b64encode(out).decode())

    def close(self) -> None:
        """Stop serving and release the socket; a second call does nothing."""
        if self._ctx.closed:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        self.server.close()
        self._ctx.term()


# Store operations (get/set) are local-network round trips; give them a short timeout.
STORE_TIMEOUT_S = 30.0


def check_bind(host: str, ws, keys_dir) -> None:
    """Refuse to serve the store beyond loopback without keys, unless the config allows it."""
    from dapo_async.utils import is_loopback
    from dapo_async.weight_sync.base import WeightSyncError

    if not keys_dir and not is_loopback(host) and not ws.allow_unauthenticated_network:
        raise WeightSyncError(
            f"weight_sync.allow_unauthenticated_network: the weight-sync store would listen on "
            f"{host!r} without CurveZMQ keys. Give the run keys (launch.auth, or "
            "launch.curve_keys_dir), or on a private network set "
            "weight_sync.allow_unauthenticated_network=true, or use weight_sync.mode=disk on a "
            "shared filesystem."
        )


def connect_store(ws, run_dir, endpoint, keys_dir, connect_timeout_s: float, register=None):
    """(endpoint, store) of the learner's weight-sync store, for a receiver: ``endpoint``, else
    ``weight_sync.endpoint``, else the run's endpoint file. ``register(store)`` makes the first
    requests, waiting up to ``connect_timeout_s`` (the learner may still be starting); later
    requests wait STORE_TIMEOUT_S. On failure the store is closed (no socket left reconnecting)
    and the error raised: the caller retries."""
    from dapo_async.roles import read_endpoint

    ep = endpoint or ws.endpoint or read_endpoint(run_dir, "wsync", timeout_s=connect_timeout_s)
    store = RemoteStore(ep, keys_dir, timeout_s=connect_timeout_s)
    try:
        if register is not None:
            register(store)
        store.set_timeout(timedelta(seconds=STORE_TIMEOUT_S))
    except Exception:
        store.close()
        raise
    return ep, store
