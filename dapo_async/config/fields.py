"""Building blocks of the config tree: documented fields (``F``, ``S``, and ``Choice`` for a field
taking one of a few named values) with their valid values declared beside the default
(``ge=1``, ``choices=(...)``), the check that enforces those
declarations (``check_fields``), the error that names the dotted key, and the helpers each
section's ``check`` uses for rules that involve more than one field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

# Accepted values that several fields share (each field's doc says what its ``auto`` means).
DTYPE_CHOICES = ("auto", "float32", "bfloat16")
BACKEND_CHOICES = ("auto", "gloo", "nccl")


class ConfigError(ValueError):
    """A config value or key is invalid; the message starts with the dotted key path."""

    def __init__(self, key: str, reason: str):
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Valid:
    """The values one field accepts: numeric bounds, a set of choices, or a non-empty string."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] = ()
    nonempty: bool = False

    def describe(self) -> str:
        """The rule in words, as the error and the generated docs state it."""
        if self.choices:
            return f"one of {list(self.choices)}"
        if self.nonempty:
            return "not empty"
        has_low = self.ge is not None or self.gt is not None
        has_high = self.le is not None or self.lt is not None
        if has_low and has_high:
            left = f"[{self.ge}" if self.ge is not None else f"({self.gt}"
            right = f"{self.le}]" if self.le is not None else f"{self.lt})"
            return f"in {left}, {right}"
        for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt)):
            if bound is not None:
                return f"{op} {bound}"
        return "any value"

    def accepts(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if self.nonempty:
            return value != ""
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )


def F(default: Any, doc: str, **valid: Any) -> Any:
    """A dataclass field with documentation and, optionally, its valid values (``Valid``'s
    keywords: ``ge``, ``gt``, ``le``, ``lt``, ``choices``, ``nonempty``); mutable defaults get a
    factory."""
    metadata = {"doc": doc}
    if valid:
        metadata["valid"] = Valid(**valid)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def Choice(title: str, default: str, values: tuple[str, ...] = (), **meanings: str) -> Any:
    """A field taking one of a few named values, each named once: ``values`` (or the keywords'
    order) are the valid set, a keyword gives a value its meaning, and the doc reads
    "title: a (meaning) | b | c." — so the doc and the check cannot disagree.

    ``Choice("Transport", "dist", dist="torch.distributed group", disk="safetensors files")``
    """
    values = values or tuple(meanings)
    unknown = set(meanings) - set(values)
    assert not unknown and default in values, (default, values, unknown)  # a declaration error
    listed = " | ".join(f"{v} ({meanings[v]})" if meanings.get(v) else v for v in values)
    return F(default, f"{title}: {listed}.", choices=values)


def S(cls: type, doc: str) -> Any:
    """A documented sub-section field."""
    return field(default_factory=cls, metadata={"doc": doc})


def check_fields(section: Any, prefix: str) -> None:
    """Enforce every field's declared ``Valid`` rule; the error names ``prefix.field``."""
    for f in dataclasses.fields(section):
        rule = f.metadata.get("valid")
        value = getattr(section, f.name)
        if rule is not None and not rule.accepts(value):
            key = f"{prefix}.{f.name}" if prefix else f.name
            got = f", got {value!r}" if rule.choices else ""
            raise ConfigError(key, f"must be {rule.describe()}{got}")


def _need(ok: bool, key: str, reason: str) -> None:
    if not ok:
        raise ConfigError(key, reason)
