"""The protocol's one error and its runtime type checker: a decoded msgpack header value is
checked against the message field's annotation (int, float, str, bool, lists, tuples, maps,
unions), floats must be finite. Every failure is a ``ProtocolError`` with a short reason code."""

from __future__ import annotations

import math
import types
import typing
from collections.abc import Sequence
from typing import Any


class ProtocolError(ValueError):
    """A message failed validation. ``reason`` is a short code used in drop counters."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def check_value(value: Any, tp: Any, where: str) -> Any:
    """Validate a decoded header value against a type annotation; returns the value."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is typing.Union or origin is types.UnionType:
        for arg in typing.get_args(tp):
            try:
                return check_value(value, arg, where)
            except ProtocolError:
                continue
        raise ProtocolError("bad_field", f"{where}: unexpected {type(value).__name__}")
    if tp is type(None):
        if value is not None:
            raise ProtocolError("bad_field", f"{where}: expected None")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ProtocolError("bad_field", f"{where}: expected bool, got {type(value).__name__}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProtocolError("bad_field", f"{where}: expected int, got {type(value).__name__}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProtocolError("bad_field", f"{where}: expected float, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ProtocolError("non_finite", f"{where}: {value}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ProtocolError("bad_field", f"{where}: expected str, got {type(value).__name__}")
        return value
    if origin in (list, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ProtocolError("bad_field", f"{where}: expected list, got {type(value).__name__}")
        (arg,) = typing.get_args(tp) or (Any,)
        if arg in (str, int) and all(type(v) is arg for v in value):  # fast path, long id lists
            return list(value)
        return [check_value(v, arg, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ProtocolError("bad_field", f"{where}: expected a {len(args)}-tuple")
        return tuple(
            check_value(v, a, f"{where}[{i}]")
            for i, (v, a) in enumerate(zip(value, args, strict=False))
        )
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ProtocolError("bad_field", f"{where}: expected map, got {type(value).__name__}")
        return {
            check_value(k, kt, f"{where}.key"): check_value(v, vt, f"{where}[{k!r}]")
            for k, v in value.items()
        }
    raise AssertionError(f"unsupported annotation {tp!r} at {where}")  # internal invariant
