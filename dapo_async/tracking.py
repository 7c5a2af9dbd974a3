"""Metrics of one role process: an Aim run (optional) plus a JSONL file in the run directory.

Every role opens one ``Tracker``; all runs of a training job share the experiment name and the
``run_id`` param, with the role (and rank) as context, so the Aim UI groups them. The JSONL file
(``<run_dir>/metrics/<role>.jsonl``) is always written: `dapo-async report`, the launcher's
status line and tests read it without Aim.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

log = logging.getLogger(__name__)


class Tracker:
    def __init__(
        self,
        run_dir: str | Path,
        role: str,
        experiment: str,
        run_id: str,
        aim_repo: str = "",
        use_aim: bool = True,
        params: dict | None = None,
    ):
        self.role = role
        d = Path(run_dir) / "metrics"
        d.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(d / f"{role}.jsonl", "a", buffering=1)
        self._aim = None
        if use_aim:
            try:
                from aim import Run

                repo = aim_repo or str(Path(run_dir) / "aim")
                Path(repo).mkdir(parents=True, exist_ok=True) if "://" not in repo else None
                self._aim = Run(repo=repo, experiment=experiment, system_tracking_interval=30)
                self._aim["run_id"] = run_id
                self._aim["role"] = role
                if params:
                    self._aim["hparams"] = params
                self._aim.add_tag(run_id)
            except Exception as e:  # metrics must never stop training
                log.warning("Aim tracking disabled for %s: %s", role, e)
                self._aim = None

    @classmethod
    def for_role(cls, cfg, role: str) -> Tracker:
        """The tracker of one role of the run described by ``cfg`` (a RunConfig)."""
        t = cfg.tracking
        return cls(
            cfg.resolved_run_dir, role, t.experiment or cfg.name, cfg.name, t.aim_repo, t.aim
        )

    def track(self, values: dict[str, float], step: int) -> None:
        clean = {
            k: float(v)
            for k, v in values.items()
            if isinstance(v, (int, float)) and math.isfinite(v)
        }
        self._jsonl.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        if self._aim is not None:
            ctx = {"role": self.role}
            for k, v in clean.items():
                try:
                    self._aim.track(v, name=k, step=step, context=ctx)
                except Exception as e:
                    log.warning("Aim track failed: %s", e)
                    break

    def close(self) -> None:
        self._jsonl.close()
        if self._aim is not None:
            try:
                self._aim.close()
            except Exception as e:
                log.warning("Aim close failed: %s", e)
            self._aim = None


def read_metrics(run_dir: str | Path, role: str) -> list[dict]:
    p = Path(run_dir) / "metrics" / f"{role}.jsonl"
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return out
