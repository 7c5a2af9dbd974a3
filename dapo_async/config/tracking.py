"""The ``tracking`` section: where metrics go (JSONL, Aim), the readable rollouts each role
records, and the thresholds of the learner's alerts."""

from __future__ import annotations

from dataclasses import dataclass

from dapo_async.config.fields import F


@dataclass
class TrackingConfig:
    aim: bool = F(True, "Write metrics to an Aim repo.")
    aim_repo: str = F(
        "",
        "Aim repo path or aim://host:port; empty = `aim` beside the run directories (runs/aim "
        "for runs/<name>-<time>): one repo for the project, where runs can be compared.",
    )
    tags: list = F([], "Aim tags of every role's run (tune tags its points with KEY=VALUE).")
    experiment: str = F("", "Aim experiment name; empty = the run name.")
    log_every: int = F(1, "Print a status line every N learner steps.", ge=1)
    samples_per_step: int = F(
        2,
        "Rollouts each role records per step for reading (`dapo-async inspect`, Aim Text): "
        "the generator's groups per weight version, the learner's trained responses, the "
        "buffer's dropped groups per reason; 0 = none.",
        ge=0,
    )
    alert_entropy_frac: float = F(
        0.05,
        "Warn when the policy's entropy falls below this fraction of its first step's "
        "(entropy collapse); 0 = off.",
        ge=0,
        lt=1,
    )
    alert_clip_frac: float = F(
        0.2,
        "Warn when the clipped share of tokens (low + high + dual) exceeds this; 0 = off.",
        ge=0,
    )
    alert_is_weight_p95: float = F(
        2.0,
        "Warn when the 95th percentile of the importance weights π_prox/π_behav exceeds this "
        "(stale data far from the policy); 0 = off.",
        ge=0,
    )
    alert_heldout_drop: float = F(
        0.1, "Warn when held-out accuracy falls this far below its best so far; 0 = off.", ge=0
    )
    alert_sampled_drop: float = F(
        0.3,
        "Warn when the accuracy of all sampled responses (mean of the last 3 steps) falls this "
        "far below its best 3-step mean so far: the policy collapsed between held-out "
        "evaluations (every response ends in one degenerate pattern); 0 = off.",
        ge=0,
        le=1,
    )
    samples_max_mb: float = F(
        8.0,
        "Cap of each role's samples file (<run_dir>/samples/<role>.jsonl); past half of it the "
        "file is rotated to .1 (the older .1 dropped), so a role keeps at most this much.",
        gt=0,
    )
