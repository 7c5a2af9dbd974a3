"""CurveZMQ key pairs: one for the server (buffer, reward server) and one per client role.

Owns the layout of a keys directory and who is who in it:

    keys/                      mode 0700
      server.key, server.key_secret        the buffer's pair (secret mode 0600)
      learner.key, learner.key_secret      learner ranks
      generator.key, generator.key_secret  generators
      client.key, client.key_secret        operators and tools (every message kind)
      authorized_clients/*.key             public keys the server accepts

`dapo-async train` makes one such directory per run (``<run_dir>/keys``) unless
``launch.curve_keys_dir`` names one, so every link is authenticated by default, loopback
included. A server learns the role of each message's sender from the public key CurveZMQ
authenticated (ZeroMQ's ``User-Id`` property), see ``roles_by_key``.
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq.auth

SERVER_KEY = "server"
# Client roles; "client" is the operator's key (tools, hand-run roles, the reward server).
CLIENT_ROLES = ("client", "learner", "generator")
CLIENT_KEY = "client"
AUTHORIZED_DIR = "authorized_clients"
# The per-run directory `dapo-async train` creates inside the run directory.
RUN_KEYS_DIR = "keys"


class SecurityError(ValueError):
    """A bind or connect would be unsafe, or keys are missing."""


def generate_keys(out_dir: str | os.PathLike) -> dict[str, Path]:
    """Create the server pair and one pair per client role under ``out_dir``; every client's
    public key is placed in ``authorized_clients/``. Existing pairs are kept (idempotent)."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    auth = d / AUTHORIZED_DIR
    auth.mkdir(exist_ok=True)
    paths: dict[str, Path] = {}
    for name in (SERVER_KEY, *CLIENT_ROLES):
        public, secret = d / f"{name}.key", d / f"{name}.key_secret"
        if not (public.exists() and secret.exists()):
            public, secret = (Path(p) for p in zmq.auth.create_certificates(d, name))
        os.chmod(secret, 0o600)
        paths[name] = public
        paths[f"{name}_secret"] = secret
    for name in CLIENT_ROLES:
        copy = auth / f"{name}.key"
        data = (d / f"{name}.key").read_bytes()
        if not copy.exists() or copy.read_bytes() != data:
            copy.write_bytes(data)
    paths["authorized"] = auth
    return paths


def load_pair(keys_dir: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    """(public, secret or None) of key ``name``; SecurityError naming the file if missing."""
    path = keys_dir / (f"{name}.key_secret" if secret else f"{name}.key")
    if not path.exists():
        raise SecurityError(
            f"CurveZMQ key file missing: {path} (create keys with `dapo-async keys --out "
            f"{keys_dir}`, or copy the run's keys/ directory to this host)"
        )
    return zmq.auth.load_certificate(path)


def roles_by_key(keys_dir: Path) -> dict[str, str]:
    """z85 public key (as ZeroMQ reports it in ``User-Id``) → client role name."""
    out = {}
    for name in CLIENT_ROLES:
        path = keys_dir / f"{name}.key"
        if path.exists():
            public, _ = zmq.auth.load_certificate(path)
            out[public.decode()] = name
    return out


def run_keys_dir(launch_cfg, run_dir: Path) -> Path | None:
    """The keys every role of a run uses: ``launch.curve_keys_dir``, else ``<run_dir>/keys``
    (``launch.auth``, the default), else None (no authentication)."""
    if launch_cfg.curve_keys_dir:
        return Path(launch_cfg.curve_keys_dir)
    if launch_cfg.auth:
        return Path(run_dir) / RUN_KEYS_DIR
    return None
