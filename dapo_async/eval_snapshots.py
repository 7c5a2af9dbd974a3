"""Weight snapshots handed from the learner to the evaluator role: ``<run_dir>/eval_snapshots/
v<version>.safetensors``, written to a temporary name and renamed (the evaluator never reads a
half-written file), deleted by the evaluator once evaluated. With an evaluator role
(``uses_evaluator``) the evaluations before and after training go there too: ``v00000000.before``
(no weights: the evaluator's engine starts with the initial policy) and
``v<final>.after.safetensors``; the evaluator writes ``eval_before.json`` / ``eval_after.json``.

    learner rank 0, fresh run:                        request_before()
    learner rank 0, at each learner.eval_every step:  write(full weights, version)   (~ms)
    learner rank 0, after the last step:              write(full weights, version, "after")
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
_NAME = re.compile(r"^v(\d{8})(?:\.safetensors|\.(after)\.safetensors|\.(before))$")
BEFORE, AFTER = "before", "after"


def uses_evaluator(cfg) -> bool:
    """Whether the run's evaluations go to an evaluator role (`train` starts one then)."""
    return bool(cfg.learner.eval_every and cfg.learner.eval_process)


def snapshot_dir(run_dir) -> Path:
    return Path(run_dir) / SNAPSHOT_DIR


def write(run_dir, state_dict: dict, version: int, tag: str = "") -> Path:
    """Save the full weights of ``version`` for the evaluator (atomic); ``tag`` "after": the
    final evaluation, whose figures also go to eval_after.json."""
    from safetensors.torch import save_file

    from dapo_async.weight_sync.disk import savable

    d = snapshot_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"v{version:08d}{'.' + tag if tag else ''}.safetensors"
    tmp = d / f".v{version:08d}.tmp"
    save_file(savable(state_dict), str(tmp))
    os.replace(tmp, final)
    return final


def request_before(run_dir) -> Path:
    """Ask for the evaluation of the initial policy (the evaluator's engine starts with it)."""
    d = snapshot_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"v{0:08d}.{BEFORE}"
    path.touch()
    return path


def pending(run_dir) -> list[tuple[int, Path, str]]:
    """(version, path, tag) of the requests not yet evaluated, oldest first; tag is "before",
    "after" or ""."""
    d = snapshot_dir(run_dir)
    if not d.is_dir():
        return []
    out = [
        (int(m.group(1)), p, m.group(2) or m.group(3) or "")
        for p in d.iterdir()
        if (m := _NAME.match(p.name))
    ]
    return sorted(out, key=lambda t: (t[0], t[2] != BEFORE))


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
