"""Which learner checkpoints exist and are complete: a torch-free view of the layout
``learner/checkpoint.py`` writes (``<root>/step-XXXXXXXX/`` with ``meta.json`` written last,
``.tmp`` while being written), shared by the learner (which resumes from the newest) and the
launcher (which refuses ``--resume`` when there is none)."""

from __future__ import annotations

from pathlib import Path

META = "meta.json"


def complete(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.glob("step-*")
        if p.is_dir() and not p.name.endswith(".tmp") and (p / META).is_file()
    )


def latest(root: str | Path) -> Path | None:
    done = complete(root)
    return done[-1] if done else None
