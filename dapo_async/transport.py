"""ZeroMQ socket helpers shared by every role: safe binds, CurveZMQ, timeouts, heartbeats.

Owns: how sockets are created, bound, connected, secured and closed, and how protocol messages
are sent and received on them. Rules enforced here:

- servers bind to 127.0.0.1 by default; a non-loopback bind needs CurveZMQ keys (``dapo-async
  keys``) or the explicit ``insecure_allow_public_bind`` opt-out, which is logged loudly;
- every receive has a timeout; sockets have bounded queues (high-water marks), a message-size
  limit on servers (ZeroMQ disconnects senders of larger messages) and ZMTP heartbeats so a dead
  peer is noticed;
- messages are ``protocol`` frames: msgpack header + raw arrays. Nothing is pickled.

Call order of a server: ``bind_server`` → loop(``poll`` / ``recv_routed`` / ``send_routed``) →
``close``. A client: ``connect_client`` → ``send`` / ``recv`` (with timeout) → ``close``.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.auth.thread import ThreadAuthenticator

from dapo_async import protocol
from dapo_async.keys import (
    AUTHORIZED_DIR,
    CLIENT_KEY,
    SERVER_KEY,
    SecurityError,
    generate_keys,
    load_pair,
    roles_by_key,
)
from dapo_async.utils import is_loopback

__all__ = ["SecurityError", "generate_keys"]  # re-exported: callers name them by transport

log = logging.getLogger(__name__)

# Queue bound per peer: enough for a few seconds of groups; beyond it senders block (DEALER)
# or the application's own flow control (leases) takes over.
DEFAULT_HWM = 1000
# On close, give queued replies (acks) this long to leave, so a clean shutdown loses none.
DEFAULT_LINGER_MS = 500
# ZMTP heartbeat: ping every 2 s, declare the peer dead after 10 s of silence.
HEARTBEAT_IVL_MS = 2000
HEARTBEAT_TIMEOUT_MS = 10000
# Default receive timeout of request/reply helpers; callers pass their own for long waits.
DEFAULT_RECV_TIMEOUT_S = 10.0


class RecvTimeout(TimeoutError):
    """No message arrived within the timeout."""


@dataclass
class Server:
    """A bound server socket and, when CurveZMQ is on, its authenticator thread."""

    socket: zmq.Socket
    endpoint: str
    authenticator: ThreadAuthenticator | None = None
    # z85 public key → client role (``keys.roles_by_key``); empty without CurveZMQ
    roles: dict[str, str] | None = None

    def role_of(self, user_id: str | None) -> str | None:
        """The role of an authenticated sender (None without CurveZMQ or for an unknown key)."""
        return (self.roles or {}).get(user_id or "")

    def close(self) -> None:
        self.socket.close(linger=DEFAULT_LINGER_MS)
        if self.authenticator is not None:
            self.authenticator.stop()
            self.authenticator = None


def _common_options(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.SNDHWM, DEFAULT_HWM)
    sock.setsockopt(zmq.RCVHWM, DEFAULT_HWM)
    sock.setsockopt(zmq.LINGER, DEFAULT_LINGER_MS)
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)


def bind_server(
    ctx: zmq.Context,
    sock_type: int,
    host: str = "127.0.0.1",
    port: int = 0,
    keys_dir: str | os.PathLike | None = None,
    insecure_allow_public_bind: bool = False,
    max_message_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
) -> Server:
    """Bind a server socket on tcp://host:port (port 0 = a free port).

    Non-loopback hosts need ``keys_dir`` (CurveZMQ: only clients whose public key is in
    ``keys_dir/authorized_clients`` may connect) unless ``insecure_allow_public_bind``.
    """
    if not is_loopback(host) and not keys_dir:
        if not insecure_allow_public_bind:
            raise SecurityError(
                f"refusing to bind {host}: not a loopback address and no CurveZMQ keys. "
                "Create keys with `dapo-async keys --out DIR` and set launch.curve_keys_dir, "
                "or (unsafe) set launch.insecure_allow_public_bind=true"
            )
        log.warning(
            "!!! INSECURE: binding %s without CurveZMQ; anyone who reaches this port can send "
            "data to this run. Set launch.curve_keys_dir to fix. !!!",
            host,
        )
    sock = ctx.socket(sock_type)
    _common_options(sock)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    authenticator = None
    if keys_dir:
        kd = Path(keys_dir)
        public, secret = load_pair(kd, SERVER_KEY, secret=True)
        authorized = kd / AUTHORIZED_DIR
        if not authorized.is_dir():
            raise SecurityError(f"missing {authorized} (create keys with `dapo-async keys`)")
        authenticator = ThreadAuthenticator(ctx)
        authenticator.start()
        authenticator.configure_curve(domain="*", location=str(authorized))
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True
    addr = f"[{host}]" if ":" in host else host
    try:
        if port == 0:
            port = sock.bind_to_random_port(f"tcp://{addr}")
        else:
            sock.bind(f"tcp://{addr}:{port}")
    except zmq.ZMQError:
        sock.close(linger=0)
        if authenticator is not None:
            authenticator.stop()
        raise
    roles = roles_by_key(Path(keys_dir)) if keys_dir else None
    return Server(sock, f"tcp://{addr}:{port}", authenticator, roles)


def connect_client(
    ctx: zmq.Context,
    sock_type: int,
    endpoint: str,
    keys_dir: str | os.PathLike | None = None,
    identity: bytes | None = None,
    role: str = CLIENT_KEY,
) -> zmq.Socket:
    """Connect a client socket; with ``keys_dir`` it authenticates with the key pair of
    ``role`` (``keys.CLIENT_ROLES``) and verifies the server's public key."""
    sock = ctx.socket(sock_type)
    _common_options(sock)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if keys_dir:
        kd = Path(keys_dir)
        server_public, _ = load_pair(kd, SERVER_KEY, secret=False)
        public, secret = load_pair(kd, role, secret=True)
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_serverkey = server_public
    sock.connect(endpoint)
    return sock


# --------------------------------------------------------------------------- messages


# Bytes this process sent and received as messages on its sockets (``resources.py`` reports
# them per role).
TRAFFIC = {"sent": 0, "received": 0}


def _count(key: str, frames) -> None:
    TRAFFIC[key] += sum(f.buffer.nbytes if isinstance(f, zmq.Frame) else memoryview(f).nbytes
                        for f in frames)  # fmt: skip


def send(sock: zmq.Socket, msg: protocol.Message, flags: int = 0) -> None:
    frames = protocol.encode(msg)
    sock.send_multipart(frames, flags=flags, copy=False)
    _count("sent", frames)


def send_routed(sock: zmq.Socket, identity: bytes, msg: protocol.Message) -> None:
    """Send from a ROUTER to the peer ``identity`` (dropped by ZeroMQ if it is gone)."""
    frames = protocol.encode(msg)
    sock.send_multipart([identity, *frames], copy=False)
    _count("sent", frames)


def _wait(sock: zmq.Socket, timeout_s: float | None) -> None:
    if timeout_s is None:
        return
    if not sock.poll(int(timeout_s * 1000), zmq.POLLIN):
        raise RecvTimeout(f"no message within {timeout_s:.1f} s")


def recv(
    sock: zmq.Socket,
    timeout_s: float | None = DEFAULT_RECV_TIMEOUT_S,
    max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
) -> protocol.Message:
    """Receive and decode one message (RecvTimeout, or ProtocolError for a bad one)."""
    _wait(sock, timeout_s)
    frames = sock.recv_multipart(copy=False)
    _count("received", frames)
    return protocol.decode(frames, max_bytes=max_bytes)


def recv_routed(
    sock: zmq.Socket,
    timeout_s: float | None = DEFAULT_RECV_TIMEOUT_S,
    max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[bytes, protocol.Message | protocol.ProtocolError]:
    """Receive on a ROUTER: (peer identity, message or the ProtocolError it raised).

    A bad message is returned, not raised, so a server loop counts it and carries on."""
    identity, _, msg = recv_routed_user(sock, timeout_s, max_bytes)
    return identity, msg


def recv_routed_user(
    sock: zmq.Socket,
    timeout_s: float | None = DEFAULT_RECV_TIMEOUT_S,
    max_bytes: int = protocol.DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[bytes, str | None, protocol.Message | protocol.ProtocolError]:
    """``recv_routed`` plus the sender's authenticated public key (z85; None without
    CurveZMQ): what ``Server.role_of`` maps to a role."""
    _wait(sock, timeout_s)
    frames = sock.recv_multipart(copy=False)
    _count("received", frames[1:])
    identity = frames[0].bytes
    user = None
    if len(frames) > 1:
        try:
            user = frames[1].get("User-Id")
        except zmq.ZMQError:  # no CurveZMQ on this socket: no such property
            user = None
    try:
        return identity, user, protocol.decode(frames[1:], max_bytes=max_bytes)
    except protocol.ProtocolError as e:
        return identity, user, e


# How long ``request`` waits for room before trying a non-blocking send again.
SEND_RETRY_S = 0.05


def request(
    sock: zmq.Socket, msg: protocol.Message, timeout_s: float = DEFAULT_RECV_TIMEOUT_S
) -> protocol.Message:
    """Send on a DEALER and wait for one reply, ``timeout_s`` for each. A DEALER with no peer
    connection blocks on send — e.g. after a CurveZMQ handshake the server refused (wrong keys),
    until a reconnect that may never succeed — so the send waits for room within the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:  # a connection can vanish between a poll and the send: never block in send
        try:
            send(sock, msg, flags=zmq.NOBLOCK)
            break
        except zmq.Again:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RecvTimeout(
                    f"could not send within {timeout_s:.1f} s (no connection to the peer)"
                ) from None
            sock.poll(int(min(left, SEND_RETRY_S) * 1000), zmq.POLLOUT)
    return recv(sock, timeout_s)
