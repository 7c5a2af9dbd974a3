"""Building blocks of the config tree: documented fields (``F``, ``S``), the error that names the
dotted key, and the check helpers each section's ``check`` uses."""

from __future__ import annotations

from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A config value or key is invalid; the message starts with the dotted key path."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


def F(default: Any, doc: str) -> Any:
    """A dataclass field with documentation (mutable defaults get a factory)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": doc})
    return field(default=default, metadata={"doc": doc})


def S(cls: type, doc: str) -> Any:
    """A documented sub-section field."""
    return field(default_factory=cls, metadata={"doc": doc})


def _need(ok: bool, key: str, reason: str) -> None:
    if not ok:
        raise ConfigError(key, reason)


def _choice(value: str, choices: tuple[str, ...], key: str) -> None:
    _need(value in choices, key, f"must be one of {list(choices)}, got {value!r}")
