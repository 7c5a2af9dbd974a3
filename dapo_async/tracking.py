"""Metrics of one role process: an Aim run (optional) plus a JSONL file in the run directory.

Every role opens one ``Tracker``. By default all runs of a project share one Aim repo, beside the
run directories (``<runs root>/aim``: ``runs/aim`` for ``runs/<name>-<time>``), so runs and tune
points can be compared in one UI. Each role is an Aim run named ``<run dir name>/<role>``, in the
experiment ``tracking.experiment`` (default: the config's name), with the resolved config as
``hparams``, ``run_id`` = the run directory's name, the role in the context, and
``tracking.tags`` (tune points tag their grid values). The JSONL file
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

# Histogram bins of an Aim Distribution (Aim's own limit is 512).
DIST_BINS = 64


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
        tags: list | tuple = (),
    ):
        self.role = role
        d = Path(run_dir) / "metrics"
        d.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(d / f"{role}.jsonl", "a", buffering=1)
        self._aim = None
        if use_aim:
            try:
                from aim import Run

                repo = aim_repo or default_repo(run_dir)
                Path(repo).mkdir(parents=True, exist_ok=True) if "://" not in repo else None
                self._aim = Run(repo=repo, experiment=experiment, system_tracking_interval=30)
                self._aim.name = f"{run_id}/{role}"
                self._aim["run_id"] = run_id
                self._aim["role"] = role
                if params:
                    self._aim["hparams"] = params
                for tag in (run_id, *tags):
                    self._aim.add_tag(str(tag))
            except Exception as e:  # metrics must never stop training
                log.warning("Aim tracking disabled for %s: %s", role, e)
                self._aim = None

    @classmethod
    def for_role(cls, cfg, role: str) -> Tracker:
        """The tracker of one role of the run described by ``cfg`` (a RunConfig)."""
        from dapo_async.config import to_dict

        t = cfg.tracking
        run_dir = cfg.resolved_run_dir
        return cls(
            run_dir,
            role,
            t.experiment or cfg.name,
            Path(run_dir).resolve().name,
            t.aim_repo,
            t.aim,
            params=to_dict(cfg),
            tags=t.tags,
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

    def text(self, name: str, text: str, step: int, index: int = 0) -> None:
        """One readable record (``samples.SampleLog``) as Aim ``Text`` beside the curves; the
        ``index``-th of its step (context ``sample``: Aim keeps one value per step)."""
        if self._aim is None:
            return
        try:
            from aim import Text

            ctx = {"role": self.role, "sample": index}
            self._aim.track(Text(text), name=name, step=step, context=ctx)
        except Exception as e:
            log.warning("Aim text failed: %s", e)

    def distribution(self, name: str, values, step: int) -> None:
        """A step's values (numpy) as an Aim ``Distribution`` (a histogram per step)."""
        if self._aim is None or len(values) == 0:
            return
        try:
            from aim import Distribution

            dist = Distribution(samples=values, bin_count=DIST_BINS)
            self._aim.track(dist, name=name, step=step, context={"role": self.role})
        except Exception as e:
            log.warning("Aim distribution failed: %s", e)

    def close(self) -> None:
        self._jsonl.close()
        if self._aim is not None:
            try:
                self._aim.close()
            except Exception as e:
                log.warning("Aim close failed: %s", e)
            self._aim = None


def default_repo(run_dir: str | Path) -> str:
    """The project's Aim repo: ``aim`` beside the run directories."""
    return str(Path(run_dir).resolve().parent / "aim")


def repo_of(tracking, run_dir: str | Path) -> str | None:
    """The Aim repo a run's roles write to (``tracking.aim_repo`` or the default); None when
    Aim is off."""
    if not tracking.aim:
        return None
    return tracking.aim_repo or default_repo(run_dir)


def index_aim_runs(repo: str) -> int:
    """Bring the repo's run index up to date (what ``aim storage reindex`` does, for the runs
    that changed only), so the SDK's ``Repo.iter_runs`` and the UI list a finished run's runs at
    once; how many were indexed. Aim indexes only from its UI server otherwise."""
    if "://" in repo or not (Path(repo) / ".aim").is_dir():
        return 0  # a remote repo indexes itself; no repo, nothing to index
    from aim import Repo
    from aim.sdk.index_manager import RepoIndexManager

    r = Repo.from_path(repo)
    manager = RepoIndexManager.get_index_manager(r)
    index = r._get_index_tree("meta", 0).view(())
    n = 0
    for run_hash in r._all_run_hashes():
        if manager._is_run_index_outdated(run_hash, index):
            manager.index(run_hash)
            n += 1
    return n


def read_metrics(run_dir: str | Path, role: str) -> list[dict]:
    return read_jsonl(Path(run_dir) / "metrics" / f"{role}.jsonl")


def read_jsonl(p: Path) -> list[dict]:
    """The records of a JSON-lines file ([] when it is missing; a line cut by a crash skipped)."""
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    return out
