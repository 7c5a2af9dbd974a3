"""Weight snapshots handed from the learner to the evaluator role: ``<run_dir>/eval_snapshots/
v<version>.safetensors``, written to a temporary name and renamed (the evaluator never reads a
half-written file), deleted by the evaluator once evaluated.

    learner rank 0, at each learner.eval_every step:  write(full weights, version)   (~ms)
    evaluator, in its own process:                    pending() → evaluate → done(path)
    learner rank 0, at its start / end:               remove / write learner_summary.json
    evaluator, nothing pending:                       learner_finished()? exit : wait
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

SNAPSHOT_DIR = "eval_snapshots"
SUMMARY_FILE = "learner_summary.json"  # the learner's last word: the run's steps are done
# A summary older than the evaluator may be an earlier session's (a resumed run, a resubmitted
# Slurm job) that the new learner has not removed yet: trusted only after this long, well past
# a learner's start-up to its first line of code.
STALE_SUMMARY_GRACE_S = 300.0
_NAME = re.compile(r"^v(\d{8})\.safetensors$")


def snapshot_dir(run_dir) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR


def write(run_dir, state_dict: dict, version: int) -> Path:
    """Save the full weights of ``version`` for the evaluator (atomic)."""
    from safetensors.torch import save_file

    from dapo_async.weight_sync.disk import savable

    d = snapshot_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"v{version:08d}.safetensors"
    tmp = d / f".v{version:08d}.tmp"
    save_file(savable(state_dict), str(tmp))
    os.replace(tmp, final)
    return final


def pending(run_dir) -> list[tuple[int, Path]]:
    """Complete snapshots not yet evaluated, oldest first."""
    d = snapshot_dir(run_dir)
    if not d.is_dir():
        return []
    out = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(out)


def done(path: Path) -> None:
    path.unlink(missing_ok=True)


def learner_finished(run_dir, started_at: float, grace_s: float = STALE_SUMMARY_GRACE_S) -> bool:
    """Whether the learner of this session has finished: its summary was written after
    ``started_at`` (wall time), or is older and still there ``grace_s`` later (it finished
    before this evaluator started: a restarted evaluator)."""
    path = Path(run_dir) / SUMMARY_FILE
    try:
        written = path.stat().st_mtime
    except FileNotFoundError:
        return False
    now = time.time()
    return written >= started_at or now - started_at >= grace_s
