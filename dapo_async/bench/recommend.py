"""`dapo-async tune --recommend`: the learner/generator split for a machine budget, predicted from
one measured run and verified by another.

Rates come from a finished run (the best point of the sweep, or a single probe run), over the
same steady-state window as `bench async` (after the first ``1 + max_staleness`` steps):

    learner capacity per rank   a = trained samples/s ÷ (1 − learner idle) ÷ learner ranks
    generator capacity each     g = qualified samples/s ÷ (1 − generator idle) ÷ generators

(qualified: groups that passed dynamic sampling, × responses per prompt — what a learner can
train). Each process runs one torch thread, so with P processes on C cores each gets
``share(P) = min(1, C / P)`` of a core, and capacities scale with it. For every split of at most
``budget`` processes (L learner ranks, G generators, each ≥ 1, the config accepting it):

    predicted(L, G) = min(L · a, G · g) · share(L + G) / share(L₀ + G₀)      (probe: L₀, G₀)

The best split (fewer processes on a tie within ``TIE_TOLERANCE``) is run once; the JSON holds
``predicted_samples_per_s`` and ``measured_samples_per_s`` side by side. The model assumes
linear scaling in ranks and generators (no collective overhead, no shared-memory bandwidth
limit): the measured/predicted ratio says how far that holds on a given machine.
"""

from __future__ import annotations

import os
from pathlib import Path

from dapo_async.bench.common import learner_window, window_rates
from dapo_async.tracking import read_metrics

# Splits whose predictions are within this fraction of the best count as tied; the one with
# fewer processes wins (the same throughput for less machine).
TIE_TOLERANCE = 0.02
# A role's busy share is floored here: a role measured as (almost) always idle says little
# about its capacity, and dividing by ~0 would predict an absurd rate.
MIN_BUSY = 0.05


def share(num_processes: int, cores: int) -> float:
    """The share of a core each of ``num_processes`` single-threaded processes gets."""
    return min(1.0, cores / max(1, num_processes))


def _generator_idle(run_dir: Path, t0: float, t1: float) -> float:
    """Mean idle share of the run's generators over wall time [t0, t1] (from ``idle_s``)."""
    shares = []
    for path in sorted((run_dir / "metrics").glob("gen*.jsonl")):
        recs = [r for r in read_metrics(run_dir, path.stem) if "generator/idle_s" in r]
        inside = [r for r in recs if t0 <= r["time"] <= t1]
        if len(inside) >= 2:
            a, b = inside[0], inside[-1]
            dt = b["time"] - a["time"]
            if dt > 0:
                shares.append((b["generator/idle_s"] - a["generator/idle_s"]) / dt)
                continue
        if recs:  # too few reports inside the window: the generator's whole-life share
            shares.append(recs[-1]["generator/idle_ratio"])
    return sum(shares) / len(shares) if shares else 0.0


def role_rates(run_dir: Path, skip: int, learners: int, generators: int, responses: int) -> dict:
    """Per-rank learner and per-generator capacities (samples/s when busy) of a finished run."""
    start, window = learner_window(run_dir, skip)
    rates = window_rates(start, window)
    trained, learner_idle = rates["samples_per_s"], rates["learner_idle"]
    elapsed = window[-1]["time"] - start["time"]
    qualified_groups = window[-1]["buffer/qualified"] - start["buffer/qualified"]
    qualified = qualified_groups * responses / elapsed
    gen_idle = _generator_idle(run_dir, start["time"], window[-1]["time"])
    return {
        "samples_per_s": trained,
        "learner_idle": learner_idle,
        "generator_idle": gen_idle,
        "qualified_samples_per_s": qualified,
        "learner_per_rank": trained / max(MIN_BUSY, 1 - learner_idle) / learners,
        "generator_each": qualified / max(MIN_BUSY, 1 - gen_idle) / generators,
    }


def predict(rates: dict, probe: tuple[int, int], budget: int, cores: int, valid=None) -> list:
    """Every split within ``budget`` (``valid(L, G)`` may reject some), best first:
    [{"learners", "generators", "predicted_samples_per_s", "bottleneck"}]."""
    base = share(sum(probe), cores)
    out = []
    for learners in range(1, budget):
        for generators in range(1, budget - learners + 1):
            if valid is not None and not valid(learners, generators):
                continue
            scale = share(learners + generators, cores) / base
            learn = learners * rates["learner_per_rank"] * scale
            gen = generators * rates["generator_each"] * scale
            out.append(
                {
                    "learners": learners,
                    "generators": generators,
                    "predicted_samples_per_s": min(learn, gen),
                    "bottleneck": "learner" if learn < gen else "generators",
                }
            )
    best = max((c["predicted_samples_per_s"] for c in out), default=0.0)
    # ties (within TIE_TOLERANCE of the best) go to the split with fewer processes
    out.sort(
        key=lambda c: (
            c["predicted_samples_per_s"] < best * (1 - TIE_TOLERANCE),
            c["learners"] + c["generators"],
            -c["predicted_samples_per_s"],
        )
    )
    return out


def recommend(args, base: list[str], best: dict, root: Path, run_job) -> dict:
    """Rates from the best measured point, the predicted best split, and one run there."""
    from dapo_async.config import ConfigError, load_config

    point = [f"{k}={v}" for k, v in best["point"].items()]
    cfg = load_config(args.config, [*base, *point])
    probe = (cfg.learner.num_ranks, cfg.generator.num_generators)
    skip = 1 + cfg.buffer.max_staleness
    rates = role_rates(Path(best["run_dir"]), skip, *probe, cfg.generator.responses_per_prompt)
    cores = args.cores or os.cpu_count() or 1
    budget = args.budget or cores

    def valid(learners: int, generators: int) -> bool:
        try:
            load_config(args.config, [*base, *point, *split_overrides(learners, generators)])
        except ConfigError:
            return False
        return True

    candidates = predict(rates, probe, budget, cores, valid)
    if not candidates:
        raise SystemExit(f"tune --recommend: no valid split within a budget of {budget}")
    pick = candidates[0]
    split = split_overrides(pick["learners"], pick["generators"])
    measured = run_job(args.config, [*base, *point, *split], root / f"{root.name}-verify", skip)
    predicted = pick["predicted_samples_per_s"]
    return {
        "budget": budget,
        "cores": cores,
        "split": {
            "learner.num_ranks": pick["learners"],
            "generator.num_generators": pick["generators"],
        },
        "bottleneck": pick["bottleneck"],
        "predicted_samples_per_s": predicted,
        "measured_samples_per_s": measured["samples_per_s"],
        "measured_over_predicted": measured["samples_per_s"] / predicted if predicted else None,
        "learner_idle_measured": measured["learner_idle"],
        "probe": {"learners": probe[0], "generators": probe[1], **rates},
        "candidates": candidates,
    }


def split_overrides(learners: int, generators: int) -> list[str]:
    return [f"learner.num_ranks={learners}", f"generator.num_generators={generators}"]


def describe(rec: dict) -> str:
    s = rec["split"]
    return (
        f"[tune] recommended for {rec['budget']} processes on {rec['cores']} cores: "
        f"{s['learner.num_ranks']} learner rank(s), {s['generator.num_generators']} "
        f"generator(s) ({rec['bottleneck']}-bound): predicted "
        f"{rec['predicted_samples_per_s']:.1f} samples/s, measured "
        f"{rec['measured_samples_per_s']:.1f} ({rec['measured_over_predicted']:.2f}x)"
    )
