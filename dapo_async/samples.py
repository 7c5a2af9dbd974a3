"""Rollouts a user can read: each role records a bounded sample of what it handled, as JSON lines
in ``<run_dir>/samples/<role>.jsonl`` and as Aim ``Text`` in the run's repo (beside the curves,
in context ``{role, kind}``); ``dapo-async inspect`` and ``report`` print them.

    generator  kind "group":   prompt, every response (text, token ids, reward and its parts,
                               accuracy, length, finish reason, the versions that sampled it)
    learner    kind "trained": a response as trained: advantage, and per token the importance
                               weight, the ratio and a clip mark (samples.CLIP_MARKS)
    buffer     kind "dropped": a group the buffer refused or filtered, and why

A role asks ``take(step, key)`` before building a record (cheap: a counter per step and key), so
recording costs one JSON line per kept record; ``tracking.samples_per_step`` bounds the records of
one step and key, ``tracking.samples_max_mb`` the bytes: past half of it the file is rotated to
``.1`` (dropping the older ``.1``). Recording never stops a role: a failed write is logged once.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from dapo_async.tracking import read_jsonl

log = logging.getLogger(__name__)

# Per-token marks of the learner's records: why a token's gradient was clipped.
CLIP_MARKS = {0: "", 1: "clipped low (ratio < 1 − ε_low, A < 0)", 2: "clipped high", 3: "dual"}
# The steps whose budget counters are kept (older ones are forgotten: a step never comes back).
KEEP_STEPS = 8


class SampleLog:
    """One role's sample records (module docstring); ``tracker`` (a ``tracking.Tracker``) gets
    each record's readable text as Aim Text, ``render`` turns a record into that text."""

    def __init__(
        self,
        run_dir: str | Path,
        role: str,
        per_step: int = 2,
        max_mb: float = 8.0,
        tracker=None,
        render=None,
    ):
        self.role = role
        self.per_step = per_step
        self.max_bytes = int(max_mb * (1 << 20))
        self.path = Path(run_dir) / "samples" / f"{role}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tracker = tracker
        self.render = render
        self.taken: dict[int, dict[str, int]] = {}
        self.written: dict[int, int] = {}  # step -> records sent to Aim
        self.records = 0
        self._failed = False

    @classmethod
    def for_role(cls, cfg, role: str, tracker=None, render=None) -> SampleLog:
        t = cfg.tracking
        return cls(
            cfg.resolved_run_dir, role, t.samples_per_step, t.samples_max_mb, tracker, render
        )

    def take(self, step: int, key: str = "") -> bool:
        """Whether to record one more ``key`` record at ``step`` (and count it if so)."""
        if self.per_step <= 0:
            return False
        counts = self.taken.setdefault(int(step), {})
        if counts.get(key, 0) >= self.per_step:
            return False
        counts[key] = counts.get(key, 0) + 1
        if len(self.taken) > KEEP_STEPS:
            old = min(self.taken)
            del self.taken[old]
            self.written.pop(old, None)
        return True

    def write(self, record: dict) -> None:
        """Append one record (``kind``, ``step`` and the role are added to it)."""
        record = {"role": self.role, **record}
        try:
            line = json.dumps(record, separators=(",", ":")) + "\n"
            if self.path.exists() and self.path.stat().st_size + len(line) > self.max_bytes // 2:
                self.path.replace(self.path.with_suffix(".jsonl.1"))
            with open(self.path, "a") as f:
                f.write(line)
            self.records += 1
            if self.tracker is not None and self.render is not None:
                step = int(record["step"])
                # Aim keeps one value per step and context: each record of a step its own
                index = self.written.get(step, 0)
                self.written[step] = index + 1
                self.tracker.text(f"samples/{record['kind']}", self.render(record), step, index)
        except Exception as e:  # recording must never stop training
            if not self._failed:
                log.warning("sample recording failed for %s: %s", self.role, e)
                self._failed = True


def read_samples(run_dir: str | Path, role: str | None = None) -> list[dict]:
    """Every record kept in ``run_dir`` (of one ``role``, or of all), oldest first."""
    d = Path(run_dir) / "samples"
    if not d.is_dir():
        return []
    files = sorted(d.glob(f"{role or '*'}.jsonl.1")) + sorted(d.glob(f"{role or '*'}.jsonl"))
    return [record for p in files for record in read_jsonl(p)]


def runs(values) -> list[list[int]]:
    """Run-length form of a per-token sequence (versions): [[value, count], ...]."""
    out: list[list[int]] = []
    for v in values:
        v = int(v)
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out
