"""Small helpers every layer may use (no torch, no ZeroMQ): atomic file writes, free ports,
loopback checks, importing a callable by its ``package.module:function`` path."""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import socket
from pathlib import Path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a hidden temporary file beside ``path`` and rename it over ``path``:
    a reader sees the old file or the new one, never half of one (crash-safe on POSIX). Missing
    parent directories are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def atomic_write_json(path: str | os.PathLike, obj) -> Path:
    """``atomic_write_text`` of ``obj`` as indented JSON."""
    return atomic_write_text(path, json.dumps(obj, indent=2))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (another process may take it before it is used)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names the loopback interface (``localhost`` or a 127.0.0.0/8 / ::1
    address); any other name or address counts as a network."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one owned by another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def import_callable(path: str, what: str):
    """The callable ``package.module:function`` names; ValueError naming ``what`` (a config key
    or a role: "reward function") when it cannot be imported or is not callable."""
    mod_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"cannot import {what} {path!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"{what} {path!r} is not callable")
    return fn
