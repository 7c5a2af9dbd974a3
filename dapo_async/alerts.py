"""Warnings a user watches a long run for, from the learner's own metrics (pure: a dict in,
flags and messages out). The learner logs each alert when it starts, keeps ``alert/<name>`` =
1.0 in its metrics while it lasts (the launcher's status line shows it), and 0.0 otherwise.

    entropy_collapse  train/entropy below ``alert_entropy_frac`` × its first step's value
    clip_runaway      train/pg_clip_frac_low + pg_clip_frac_high + dual_clip_frac above
                      ``alert_clip_frac``
    is_weight_tail    train/is_weight_p95 (raw π_prox/π_behav) above ``alert_is_weight_p95``
    heldout_drop      eval/accuracy more than ``alert_heldout_drop`` below its best so far
    sampled_drop      rollout/sampled_accuracy (all sampled responses, the buffer's; mean of
                      the last SAMPLED_WINDOW steps) more than ``alert_sampled_drop`` below
                      its best such mean: a collapse seen at once, not at the next evaluation

A threshold of 0 turns its alert off (``tracking.alert_*``).
"""

from __future__ import annotations

from collections import deque

NAMES = ("entropy_collapse", "clip_runaway", "is_weight_tail", "heldout_drop", "sampled_drop")

# Steps averaged before the sampled accuracy is compared: one step's figure is a few groups'
# worth (16 prompts × 8 responses in the main job) and moves by ±0.2 on its own; a collapse
# (0.77 → 0.02 in two steps, docs/results.md) shows within three.
SAMPLED_WINDOW = 3


class Alerts:
    def __init__(self, tracking):
        self.t = tracking
        self.entropy0: float | None = None
        self.best_heldout: float | None = None
        self.heldout_low = False  # the last evaluation's state (held between evaluations)
        self.last_heldout = 0.0
        self.active: set[str] = set()
        self.sampled: deque[float] = deque(maxlen=SAMPLED_WINDOW)
        self.best_sampled: float | None = None
        self.sampled_low = ""  # the message while the sampled accuracy is down

    def check(self, m: dict) -> tuple[dict[str, float], list[str]]:
        """(``alert/<name>`` flags for ``m``'s step, messages of alerts that start now)."""
        t, now = self.t, {}
        ent = m.get("train/entropy")
        if ent is not None:
            self.entropy0 = ent if self.entropy0 is None else self.entropy0
            if t.alert_entropy_frac > 0 and ent < t.alert_entropy_frac * self.entropy0:
                now["entropy_collapse"] = (
                    f"entropy collapsed: {ent:.4f}, below {t.alert_entropy_frac:g} × its first "
                    f"step's {self.entropy0:.4f}"
                )
        clip = sum(
            m.get(f"train/{k}", 0.0)
            for k in ("pg_clip_frac_low", "pg_clip_frac_high", "dual_clip_frac")
        )
        if t.alert_clip_frac > 0 and clip > t.alert_clip_frac:
            now["clip_runaway"] = f"clipped fraction {clip:.3f} above {t.alert_clip_frac:g}"
        p95 = m.get("train/is_weight_p95")
        if t.alert_is_weight_p95 > 0 and p95 is not None and p95 > t.alert_is_weight_p95:
            now["is_weight_tail"] = (
                f"importance-weight p95 {p95:.3f} above {t.alert_is_weight_p95:g} (stale data "
                "far from the policy)"
            )
        self._heldout(m.get("eval/accuracy"), now)
        self._sampled(m.get("rollout/sampled_accuracy"), now)
        started = [msg for name, msg in now.items() if name not in self.active]
        self.active = set(now)
        return {f"alert/{n}": float(n in now) for n in NAMES}, started

    def _heldout(self, acc: float | None, now: dict) -> None:
        drop = self.t.alert_heldout_drop
        if acc is not None:
            best = acc if self.best_heldout is None else max(self.best_heldout, acc)
            self.heldout_low = drop > 0 and acc < best - drop
            self.best_heldout = best
            self.last_heldout = acc
        if self.heldout_low:
            now["heldout_drop"] = (
                f"held-out accuracy fell to {self.last_heldout:.3f}, {drop:g}+ below its best "
                f"{self.best_heldout:.3f}"
            )

    def _sampled(self, acc: float | None, now: dict) -> None:
        drop = self.t.alert_sampled_drop
        if acc is not None and acc == acc:  # NaN: nothing sampled this step; keep the state
            self.sampled.append(acc)
            if len(self.sampled) == SAMPLED_WINDOW:
                mean = sum(self.sampled) / SAMPLED_WINDOW
                best = mean if self.best_sampled is None else max(self.best_sampled, mean)
                self.best_sampled = best
                self.sampled_low = (
                    f"sampled accuracy fell to {mean:.3f} (mean of the last {SAMPLED_WINDOW} "
                    f"steps), {drop:g}+ below its best {best:.3f}: the policy may have "
                    "collapsed (see samples/)"
                    if drop > 0 and mean < best - drop
                    else ""
                )
        if self.sampled_low:
            now["sampled_drop"] = self.sampled_low
