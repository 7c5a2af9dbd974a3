"""Where shared-memory weight sync (``shm.py``) keeps its two slot files, in a module without
torch so the launcher can remove what a killed learner left behind."""

from __future__ import annotations

from pathlib import Path

# A RAM filesystem on Linux; elsewhere the slots go to the run directory.
SHM_ROOT = Path("/dev/shm")
FILE_PREFIX = "dapo-wsync-"


def shm_dir(run_dir: Path | None) -> Path:
    return SHM_ROOT if SHM_ROOT.is_dir() else Path(run_dir or ".") / "weights-shm"


def slot_files(run_dir: Path | None, tag: str) -> list[Path]:
    """The two slot files of one publisher (``tag``: the run's name and the store's port)."""
    return [shm_dir(run_dir) / f"{FILE_PREFIX}{tag}-{slot}" for slot in (0, 1)]


def remove_slot_files(run_dir: Path | None, run_name: str) -> int:
    """Delete every slot file of ``run_name`` (the launcher, after a run); how many."""
    n = 0
    for p in shm_dir(run_dir).glob(f"{FILE_PREFIX}{run_name}-*"):
        p.unlink(missing_ok=True)
        n += 1
    return n
